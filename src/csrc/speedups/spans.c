/* Record boundaries of a pull body for the filter server and its worker (sluice/filtersrv/spans.py is the
 * Python twin and the reference): one walk, no per-record objects but the properties text when asked; and
 * the worker's views built in that walk (sluice/filtersrv/view.py views is record_views's twin), or one at a
 * time while the class's match runs on each (filter_views; sluice/filtersrv/worker.py filter_batch). */
#include "speedups.h"

PyDoc_STRVAR(record_spans_doc,
"record_spans(body, with_properties: bool) -> (bytes, list[str] | None) | None\n\n"
"sluice.filtersrv.spans.record_spans in C: the stored records laid back to back in ``body`` as the\n"
"native uint32 offsets of their starts followed by len(body) (n + 1 values), and with_properties the\n"
"properties text of each record. None for anything unusual (a size that does not fit; with properties a\n"
"MAGIC_V2 record, an IPv6 host, fields that do not fill the record, text that is not UTF-8): the Python\n"
"twin then walks it or says exactly what is wrong.");

static PyObject *record_spans(PyObject *self, PyObject *args)
{
    Py_buffer bv;
    int with_props;
    if (!PyArg_ParseTuple(args, "y*p:record_spans", &bv, &with_props))
        return NULL;
    PyObject *offsets = NULL, *props = NULL, *out = NULL;
    const unsigned char *buf = bv.buf;
    Py_ssize_t end = bv.len, pos = 0, n = 0;
    if (end > (Py_ssize_t)UINT32_MAX)
        goto unusual;
    /* sizes first: the count sizes the offsets, and a body that does not split is refused before any object */
    while (pos < end) {
        if (end - pos < 4)
            goto unusual;
        int32_t total = (int32_t)get_u32(buf + pos);
        if (total < 4 || total > end - pos)
            goto unusual;
        pos += total;
        n++;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * (Py_ssize_t)sizeof(uint32_t));
    if (offsets == NULL)
        goto done;
    uint32_t *off = (uint32_t *)PyBytes_AS_STRING(offsets);
    if (with_props && (props = PyList_New(n)) == NULL)
        goto done;
    pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *r = buf + pos;
        Py_ssize_t total = (Py_ssize_t)get_u32(r);
        off[i] = (uint32_t)pos;
        if (with_props) {
            if (total < MIN_RECORD_SIZE || get_u32(r + 4) != MAGIC_V1 || (get_u32(r + POS_SYSFLAG) & HOST_V6_BITS))
                goto unusual;
            V4Tail tail;
            if (!v4_tail(r, total, &tail))
                goto unusual;
            /* the topic too must be UTF-8, as the Python twin's read_tail decodes it */
            PyObject *topic = PyUnicode_DecodeUTF8((const char *)r + tail.tpos + 1, tail.tlen, "strict");
            if (topic == NULL) {
                PyErr_Clear();
                goto unusual;
            }
            Py_DECREF(topic);
            PyObject *text = PyUnicode_DecodeUTF8((const char *)r + tail.ppos + 2, tail.plen, "strict");
            if (text == NULL) {
                PyErr_Clear();
                goto unusual;
            }
            PyList_SET_ITEM(props, i, text);
        }
        pos += total;
    }
    off[n] = (uint32_t)end;
    out = PyTuple_Pack(2, offsets, with_props ? props : Py_None);
    goto done;
unusual:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(props);
    PyBuffer_Release(&bv);
    return out;
}

/* ---------------------------------------------------------------------------------------- record_views */

/* The view class's slots record_views sets, in this order (sluice.filtersrv.view.MessageView). */
static const char *view_fields[] = {"_buf", "_at", "_ext", "properties"};
#define N_VIEW_FIELDS 4
static PyTypeObject *view_type; /* identity only, compared by pointer */
static Py_ssize_t view_offsets[N_VIEW_FIELDS];

static int view_layout(PyTypeObject *cls)
{
    if (cls == view_type)
        return 1;
    Py_ssize_t offs[N_VIEW_FIELDS];
    if (!slot_layout(cls, view_fields, N_VIEW_FIELDS, offs))
        return 0;
    memcpy(view_offsets, offs, sizeof offs);
    view_type = cls;
    return 1;
}

PyDoc_STRVAR(record_views_doc,
"record_views(body: bytes, cls) -> list | None\n\n"
"sluice.filtersrv.view.views in C: a ``cls`` (MessageView) per record of ``body``, its _buf the body, _at\n"
"its start, _ext None and properties the decoded properties, as MessageView(body, at, text) makes them.\n"
"None where record_spans(body, True) would be None, or for another class layout.");

static PyObject *record_views(PyObject *self, PyObject *args)
{
    PyObject *body, *cls;
    if (!PyArg_ParseTuple(args, "OO:record_views", &body, &cls))
        return NULL;
    if (!PyBytes_CheckExact(body) || !PyType_Check(cls) || !view_layout((PyTypeObject *)cls))
        Py_RETURN_NONE;
    PyObject *args2 = Py_BuildValue("(Oi)", body, 1);
    if (args2 == NULL)
        return NULL;
    PyObject *spans = record_spans(self, args2);
    Py_DECREF(args2);
    if (spans == NULL || spans == Py_None)
        return spans;
    const uint32_t *off = (const uint32_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(spans, 0));
    PyObject *texts = PyTuple_GET_ITEM(spans, 1);
    Py_ssize_t n = PyList_GET_SIZE(texts);
    PyObject *list = PyList_New(n);
    if (list == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f[N_VIEW_FIELDS] = {Py_NewRef(body), PyLong_FromUnsignedLong(off[i]), Py_NewRef(Py_None),
                                      PyDict_New()};
        PyObject *o = NULL;
        if (f[1] != NULL && f[3] != NULL && props_into(f[3], PyList_GET_ITEM(texts, i)) == 0)
            o = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
        if (o == NULL) {
            for (int k = 0; k < N_VIEW_FIELDS; k++)
                Py_XDECREF(f[k]);
            goto fail;
        }
        for (int k = 0; k < N_VIEW_FIELDS; k++)
            *(PyObject **)((char *)o + view_offsets[k]) = f[k]; /* the new references move in */
        PyList_SET_ITEM(list, i, o);
    }
    Py_DECREF(spans);
    return list;
fail:
    Py_XDECREF(list);
    Py_DECREF(spans);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- filter_views */

static int all_ascii(const unsigned char *p, Py_ssize_t n)
{
    uint64_t any = 0, w;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) { /* eight bytes a step */
        memcpy(&w, p + i, 8);
        any |= w;
    }
    for (; i < n; i++)
        any |= p[i];
    return (any & 0x8080808080808080ULL) == 0;
}

/* Valid UTF-8 (as record_spans's decoding checks it), without an object for the common ASCII text. */
static int utf8_ok(const unsigned char *p, Py_ssize_t n)
{
    if (all_ascii(p, n))
        return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(s);
    return 1;
}

static PyObject *ascii_str(const unsigned char *p, Py_ssize_t n)
{
    if (n == 1)
        return PyUnicode_FromStringAndSize((const char *)p, 1); /* CPython's shared one-character string */
    PyObject *s = PyUnicode_New(n, 127);
    if (s != NULL)
        memcpy(PyUnicode_1BYTE_DATA(s), p, (size_t)n);
    return s;
}

/* Property names seen in one batch (the same handful on every record), each with the value it last had:
 * a name is made once per batch, and a value equal to the previous record's is shared (str is immutable). */
typedef struct {
    PyObject *name, *value;
    Py_ssize_t len;
} NameSlot;
#define NAME_SLOTS 16

/* props_into over ASCII properties bytes (characters are bytes, so its rules apply as they are). */
static int props_ascii_into(PyObject *d, const unsigned char *p, Py_ssize_t n, NameSlot *slots, int *nslots)
{
    Py_ssize_t pos = 0;
    while (pos < n) {
        const unsigned char *e = memchr(p + pos, 2, (size_t)(n - pos));
        Py_ssize_t end = e != NULL ? e - p : n;
        if (end - pos >= 3) {
            const unsigned char *s = memchr(p + pos, 1, (size_t)(end - pos));
            Py_ssize_t sep = s != NULL ? s - p : -1;
            if (sep > pos && sep < end - 1) {
                const unsigned char *np = p + pos, *vp = p + sep + 1;
                Py_ssize_t nl = sep - pos, vl = end - sep - 1;
                NameSlot *slot = NULL;
                for (int i = 0; i < *nslots; i++)
                    if (slots[i].len == nl && memcmp(PyUnicode_1BYTE_DATA(slots[i].name), np, (size_t)nl) == 0) {
                        slot = &slots[i];
                        break;
                    }
                PyObject *name;
                if (slot != NULL)
                    name = Py_NewRef(slot->name);
                else {
                    if ((name = ascii_str(np, nl)) == NULL)
                        return -1;
                    PyUnicode_InternInPlace(&name);
                    if (*nslots < NAME_SLOTS) {
                        slot = &slots[(*nslots)++];
                        slot->name = Py_NewRef(name);
                        slot->value = NULL;
                        slot->len = nl;
                    }
                }
                PyObject *value;
                if (slot != NULL && slot->value != NULL && PyUnicode_GET_LENGTH(slot->value) == vl
                    && memcmp(PyUnicode_1BYTE_DATA(slot->value), vp, (size_t)vl) == 0)
                    value = Py_NewRef(slot->value);
                else {
                    if ((value = ascii_str(vp, vl)) == NULL) {
                        Py_DECREF(name);
                        return -1;
                    }
                    if (slot != NULL)
                        Py_XSETREF(slot->value, Py_NewRef(value));
                }
                int rc = PyDict_SetItem(d, name, value);
                Py_DECREF(name);
                Py_DECREF(value);
                if (rc < 0)
                    return -1;
            }
        }
        pos = end + 1;
    }
    return 0;
}

/* A ``cls`` view of the record at ``at`` (as record_views makes it), or NULL with an exception. */
static PyObject *make_view(PyObject *body, PyTypeObject *cls, const unsigned char *buf, Py_ssize_t at,
                           NameSlot *slots, int *nslots)
{
    const unsigned char *r = buf + at;
    V4Tail tail;
    if (!v4_tail(r, (Py_ssize_t)get_u32(r), &tail)) { /* never: filter_views's first walk checked it */
        PyErr_SetString(PyExc_ValueError, "filter_views: a record changed between its walks");
        return NULL;
    }
    const unsigned char *pp = r + tail.ppos + 2;
    PyObject *f[N_VIEW_FIELDS] = {Py_NewRef(body), PyLong_FromSsize_t(at), Py_NewRef(Py_None), PyDict_New()};
    PyObject *o = NULL;
    if (f[1] != NULL && f[3] != NULL) {
        int rc;
        if (all_ascii(pp, tail.plen))
            rc = props_ascii_into(f[3], pp, tail.plen, slots, nslots);
        else {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)pp, tail.plen, "strict");
            rc = text != NULL ? props_into(f[3], text) : -1;
            Py_XDECREF(text);
        }
        if (rc == 0)
            o = cls->tp_alloc(cls, 0);
    }
    if (o == NULL) {
        for (int k = 0; k < N_VIEW_FIELDS; k++)
            Py_XDECREF(f[k]);
        return NULL;
    }
    for (int k = 0; k < N_VIEW_FIELDS; k++)
        *(PyObject **)((char *)o + view_offsets[k]) = f[k]; /* the new references move in */
    return o;
}

PyDoc_STRVAR(filter_views_doc,
"filter_views(body: bytes, cls, match) -> bytes | None\n\n"
"sluice.filtersrv.worker.filter_batch in C: one byte per record of ``body``, 1 where ``match(view)`` is\n"
"true, the views made as record_views makes them, each just before its call (so one lives at a time\n"
"unless the class keeps it). Every record is checked before the first call: None, with no call made,\n"
"where record_views would be None. An exception from ``match`` (or its truth value) propagates.");

static PyObject *filter_views(PyObject *self, PyObject *args)
{
    PyObject *body, *cls, *match;
    if (!PyArg_ParseTuple(args, "OOO:filter_views", &body, &cls, &match))
        return NULL;
    if (!PyBytes_CheckExact(body) || !PyType_Check(cls) || !view_layout((PyTypeObject *)cls))
        Py_RETURN_NONE;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t end = PyBytes_GET_SIZE(body), pos = 0, n = 0;
    if (end > (Py_ssize_t)UINT32_MAX)
        Py_RETURN_NONE;
    /* every record checked first, as record_spans(body, True) checks them */
    while (pos < end) {
        if (end - pos < 4)
            Py_RETURN_NONE;
        int32_t total = (int32_t)get_u32(buf + pos);
        if (total < 4 || total > end - pos)
            Py_RETURN_NONE;
        const unsigned char *r = buf + pos;
        V4Tail tail;
        if (total < MIN_RECORD_SIZE || get_u32(r + 4) != MAGIC_V1 || (get_u32(r + POS_SYSFLAG) & HOST_V6_BITS)
            || !v4_tail(r, total, &tail) || !utf8_ok(r + tail.tpos + 1, tail.tlen)
            || !utf8_ok(r + tail.ppos + 2, tail.plen))
            Py_RETURN_NONE;
        pos += total;
        n++;
    }
    PyObject *mask = PyBytes_FromStringAndSize(NULL, n);
    if (mask == NULL)
        return NULL;
    unsigned char *m = (unsigned char *)PyBytes_AS_STRING(mask);
    NameSlot slots[NAME_SLOTS];
    int nslots = 0;
    pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *view = make_view(body, (PyTypeObject *)cls, buf, pos, slots, &nslots);
        if (view == NULL)
            goto fail;
        PyObject *got = PyObject_CallOneArg(match, view);
        Py_DECREF(view);
        if (got == NULL)
            goto fail;
        int truth = PyObject_IsTrue(got);
        Py_DECREF(got);
        if (truth < 0)
            goto fail;
        m[i] = (unsigned char)truth;
        pos += (Py_ssize_t)get_u32(buf + pos);
    }
    for (int k = 0; k < nslots; k++) {
        Py_DECREF(slots[k].name);
        Py_XDECREF(slots[k].value);
    }
    return mask;
fail:
    for (int k = 0; k < nslots; k++) {
        Py_DECREF(slots[k].name);
        Py_XDECREF(slots[k].value);
    }
    Py_DECREF(mask);
    return NULL;
}

PyMethodDef sluice_spans_methods[] = {
    {"record_spans", (PyCFunction)record_spans, METH_VARARGS, record_spans_doc},
    {"record_views", (PyCFunction)record_views, METH_VARARGS, record_views_doc},
    {"filter_views", (PyCFunction)filter_views, METH_VARARGS, filter_views_doc},
    {NULL, NULL, 0, NULL},
};
