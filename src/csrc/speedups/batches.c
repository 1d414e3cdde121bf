/* SEND_BATCH_MESSAGE bodies and message properties: split, decode, and encode straight to records. */
#include "speedups.h"

#define BATCH_FIXED 22 /* totalSize, magic, bodyCRC, flag, bodyLen (4 each), propsLen (2) */

PyDoc_STRVAR(decode_properties_doc,
"decode_properties(text: str) -> dict[str, str]\n\n"
"sluice.protocol.properties.decode_properties in C.");

static PyObject *decode_properties(PyObject *self, PyObject *s)
{
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "decode_properties takes a str, not %.80s", Py_TYPE(s)->tp_name);
        return NULL;
    }
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    if (props_into(d, s) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ---------------------------------------------------------------------------------------- decode_batch */

/* One message of a batch body at ``pos`` (sluice.protocol.batch.decode_batch_columns's checks): 1 and its
 * parts set, or 0 when the entry is malformed. */
typedef struct {
    Py_ssize_t body_at, body_len, props_at, props_len, next;
    int32_t flag;
} Entry;

static int batch_entry(const unsigned char *data, Py_ssize_t pos, Py_ssize_t end, Entry *e)
{
    if (end - pos < BATCH_FIXED)
        return 0;
    int32_t total = (int32_t)get_u32(data + pos);
    int32_t body_len = (int32_t)get_u32(data + pos + 16);
    if (total < BATCH_FIXED || total > end - pos)
        return 0;
    e->next = pos + total;
    e->body_at = pos + 20;
    if (body_len < 0 || body_len > e->next - e->body_at - 2)
        return 0;
    e->body_len = body_len;
    e->props_at = e->body_at + body_len + 2;
    int16_t props_len = (int16_t)get_u16(data + e->props_at - 2);
    if (props_len < 0 || e->props_at + props_len != e->next)
        return 0;
    e->props_len = props_len;
    e->flag = (int32_t)get_u32(data + pos + 12);
    return 1;
}

PyDoc_STRVAR(decode_batch_doc,
"decode_batch(data: bytes, inherited: dict | None) -> (bodies, properties, flags) | None\n\n"
"A SEND_BATCH_MESSAGE body split into columns, each message's properties decoded into a new dict that\n"
"starts as a copy of ``inherited`` (sluice.protocol.batch.decode_batch_messages). None when the body\n"
"is malformed in any way: the Python path then says how.");

static PyObject *decode_batch(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *inherited;
    if (!PyArg_ParseTuple(args, "y*O:decode_batch", &view, &inherited))
        return NULL;
    if (inherited != Py_None && !PyDict_Check(inherited)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "inherited must be a dict or None");
        return NULL;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *bodies = PyList_New(0), *props = PyList_New(0), *flags = PyList_New(0), *out = NULL;
    if (bodies == NULL || props == NULL || flags == NULL)
        goto done;
    while (pos < end) {
        Entry e;
        if (!batch_entry(data, pos, end, &e))
            goto malformed;
        if (append_new(bodies, PyBytes_FromStringAndSize((const char *)data + e.body_at, e.body_len)) < 0)
            goto done;
        PyObject *text = PyUnicode_DecodeUTF8((const char *)data + e.props_at, e.props_len, "strict");
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto done;
            PyErr_Clear();
            goto malformed;
        }
        PyObject *d = inherited == Py_None ? PyDict_New() : PyDict_Copy(inherited);
        if (d == NULL || props_into(d, text) < 0) {
            Py_XDECREF(d);
            Py_DECREF(text);
            goto done;
        }
        Py_DECREF(text);
        if (append_new(props, d) < 0 || append_new(flags, PyLong_FromLong(e.flag)) < 0)
            goto done;
        pos = e.next;
    }
    out = PyTuple_Pack(3, bodies, props, flags);
    goto done;
malformed:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(bodies);
    Py_XDECREF(props);
    Py_XDECREF(flags);
    PyBuffer_Release(&view);
    return out;
}

/* --------------------------------------------------------------------------------- encode_wire_batch */

typedef struct {
    Py_ssize_t body_at, body_len, props_at, props_len, tags_at, tags_len, keys_at, keys_len, uniq_at, uniq_len;
    int32_t flag;
    uint32_t crc;
} WireRec;

static int name_is(const unsigned char *p, Py_ssize_t n, const char *lit)
{
    size_t k = strlen(lit);
    return (size_t)n == k && memcmp(p, lit, k) == 0;
}

/* Check one message's wire properties ``p[0:n]`` are exactly what re-encoding their decoded dict would
 * store (ordered ``name \x01 value \x02`` pairs, names unique and not transient, no name of ``inh``,
 * values non-empty without \x01) and hold no delay property; note TAGS, KEYS and UNIQ_KEY. 1 yes, 0 no. */
static int canonical_props(const unsigned char *p, Py_ssize_t n, PyObject *inh_names, WireRec *r)
{
    static const char *delay[] = {"DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC"};
    static const char transient[] = "__RMQ.TRANSIENT.";
    Py_ssize_t names_at[64], names_len[64], count = 0, pos = 0;
    r->tags_at = r->keys_at = r->uniq_at = -1;
    if (n > 0 && p[n - 1] != 2)
        return 0;
    while (pos < n) {
        const unsigned char *end = memchr(p + pos, 2, (size_t)(n - pos));
        Py_ssize_t e = end - p;
        const unsigned char *sep = memchr(p + pos, 1, (size_t)(e - pos));
        if (sep == NULL)
            return 0;
        Py_ssize_t s = sep - p, nl = s - pos, vl = e - s - 1;
        if (nl < 1 || vl < 1 || memchr(sep + 1, 1, (size_t)vl) != NULL || count == 64)
            return 0;
        const unsigned char *name = p + pos;
        if (nl >= (Py_ssize_t)(sizeof transient - 1) && memcmp(name, transient, sizeof transient - 1) == 0)
            return 0;
        for (int k = 0; k < 4; k++)
            if (name_is(name, nl, delay[k]))
                return 0;
        for (Py_ssize_t k = 0; k < count; k++)
            if (names_len[k] == nl && memcmp(p + names_at[k], name, (size_t)nl) == 0)
                return 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inh_names); k++) {
            PyObject *o = PyTuple_GET_ITEM(inh_names, k);
            if (PyBytes_GET_SIZE(o) == nl && memcmp(PyBytes_AS_STRING(o), name, (size_t)nl) == 0)
                return 0;
        }
        names_at[count] = pos;
        names_len[count++] = nl;
        if (name_is(name, nl, "TAGS")) {
            r->tags_at = s + 1;
            r->tags_len = vl;
        } else if (name_is(name, nl, "KEYS")) {
            r->keys_at = s + 1;
            r->keys_len = vl;
        } else if (name_is(name, nl, "UNIQ_KEY")) {
            r->uniq_at = s + 1;
            r->uniq_len = vl;
        }
        pos = e + 1;
    }
    return 1;
}

/* The str of p[at:at+len] (valid UTF-8 by then), or None when at < 0; appended to ``list``. */
static int append_text(PyObject *list, const unsigned char *p, Py_ssize_t at, Py_ssize_t len)
{
    if (at < 0)
        return PyList_Append(list, Py_None);
    return append_new(list, PyUnicode_DecodeUTF8((const char *)p + at, len, "strict"));
}

PyDoc_STRVAR(encode_wire_batch_doc,
"encode_wire_batch(data, topic_part, queue_id, sysflag, born_ts, born_host, store_host, reconsume, max_body,\n"
"                  inherited, inherited_names, crc32) -> (buf, sizes, sysflags, props, tags, keys, uniq) | None\n\n"
"A SEND_BATCH_MESSAGE body straight to commit-log records: what encode_batch gives for the messages\n"
"decode_batch_messages makes of it (sluice.store.encode.encode_batch_body), without a dict or a\n"
"StoreMessage per message. Each message's stored properties are ``inherited`` (the header's, encoded)\n"
"followed by its own wire properties, which must already be in the form re-encoding would give\n"
"(``inherited_names``, as bytes, must not recur in them). None for anything else: an empty or oversized\n"
"body, a malformed entry, non-canonical or non-UTF-8 properties, a delayed message, an IPv6 host\n"
"(``born_host``/``store_host`` are 8-byte IPv4 hosts), a transactional sysflag.");

static PyObject *encode_wire_batch(PyObject *self, PyObject *args)
{
    Py_buffer dv;
    PyObject *topic_part, *born_b, *store_b, *inh, *inh_names, *crc32;
    long long queue_id, sysflag, born_ts, reconsume, max_body;
    if (!PyArg_ParseTuple(args, "y*O!LLLO!O!LLO!O!O:encode_wire_batch", &dv, &PyBytes_Type, &topic_part, &queue_id,
                          &sysflag, &born_ts, &PyBytes_Type, &born_b, &PyBytes_Type, &store_b, &reconsume,
                          &max_body, &PyBytes_Type, &inh, &PyTuple_Type, &inh_names, &crc32))
        return NULL;
    PyObject *out = NULL, *buf = NULL, *sizes = NULL, *sysflags = NULL, *props = NULL, *tags = NULL, *keys = NULL,
             *uniq = NULL, *sf = NULL;
    Buf recs = {NULL, 0, 0};
    const unsigned char *data = dv.buf;
    Py_ssize_t end = dv.len, pos = 0, total = 0, n = 0;
    const Py_ssize_t tlen = PyBytes_GET_SIZE(topic_part), ilen = PyBytes_GET_SIZE(inh);
    const unsigned char *ib = (const unsigned char *)PyBytes_AS_STRING(inh);
    if (PyBytes_GET_SIZE(born_b) != HOST_V4_SIZE || PyBytes_GET_SIZE(store_b) != HOST_V4_SIZE || (sysflag & TRAN_MASK)
        || sysflag < INT32_MIN || sysflag > INT32_MAX || queue_id < 0 || queue_id > INT32_MAX
        || reconsume < INT32_MIN || reconsume > INT32_MAX)
        goto unusual;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inh_names); k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(inh_names, k)))
            goto unusual;
    sysflag &= ~HOST_V6_BITS;
    while (pos < end) {
        WireRec r;
        Entry e;
        if (!batch_entry(data, pos, end, &e) || e.body_len == 0 || e.body_len > max_body
            || ilen + e.props_len > MAX_PROPS)
            goto unusual;
        r.flag = e.flag;
        r.body_at = e.body_at;
        r.body_len = e.body_len;
        r.props_at = e.props_at;
        r.props_len = e.props_len;
        if (!canonical_props(data + r.props_at, r.props_len, inh_names, &r))
            goto unusual;
        if (r.tags_at >= 0) r.tags_at += r.props_at;
        if (r.keys_at >= 0) r.keys_at += r.props_at;
        if (r.uniq_at >= 0) r.uniq_at += r.props_at;
        if (buf_add(&recs, &r, sizeof r) < 0)
            goto done;
        total += HEAD_V4 + r.body_len + tlen + 2 + ilen + r.props_len;
        n++;
        pos = e.next;
    }
    if (n == 0)
        goto unusual;
    WireRec *rs = (WireRec *)recs.data;
    props = PyList_New(n);
    if (props == NULL)
        goto done;
    Buf scratch = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) { /* UTF-8 check and the stored properties as str, first */
        scratch.len = 0;
        if (buf_add(&scratch, ib, ilen) < 0 || buf_add(&scratch, data + rs[i].props_at, rs[i].props_len) < 0) {
            PyMem_Free(scratch.data);
            goto done;
        }
        PyObject *t = PyUnicode_DecodeUTF8(scratch.len ? (const char *)scratch.data : "", scratch.len, "strict");
        if (t == NULL) {
            PyMem_Free(scratch.data);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto done;
            PyErr_Clear();
            goto unusual;
        }
        PyList_SET_ITEM(props, i, t);
    }
    PyMem_Free(scratch.data);
    for (Py_ssize_t i = 0; i < n; i++)
        if (body_crc(crc32, data + rs[i].body_at, rs[i].body_len, &rs[i].crc) < 0)
            goto done;
    buf = PyByteArray_FromStringAndSize(NULL, total);
    sizes = PyList_New(n);
    sysflags = PyList_New(n);
    tags = PyList_New(0);
    keys = PyList_New(0);
    uniq = PyList_New(0);
    sf = PyLong_FromLongLong(sysflag);
    if (buf == NULL || sizes == NULL || sysflags == NULL || tags == NULL || keys == NULL || uniq == NULL || sf == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(buf);
    const unsigned char *born = (const unsigned char *)PyBytes_AS_STRING(born_b);
    const unsigned char *store = (const unsigned char *)PyBytes_AS_STRING(store_b);
    const unsigned char *tp = (const unsigned char *)PyBytes_AS_STRING(topic_part);
    for (Py_ssize_t i = 0; i < n; i++) {
        const WireRec *r = &rs[i];
        Py_ssize_t size = HEAD_V4 + r->body_len + tlen + 2 + ilen + r->props_len;
        PyObject *sz = PyLong_FromSsize_t(size);
        if (sz == NULL)
            goto done;
        PyList_SET_ITEM(sizes, i, sz);
        PyList_SET_ITEM(sysflags, i, Py_NewRef(sf));
        if (append_text(tags, data, r->tags_at, r->tags_len) < 0 || append_text(keys, data, r->keys_at, r->keys_len) < 0
            || append_text(uniq, data, r->uniq_at, r->uniq_len) < 0)
            goto done;
        write_head(w, size, r->crc, queue_id, r->flag, (int32_t)sysflag, born_ts, born, store, (int32_t)reconsume, 0,
                   r->body_len);
        write_tail(w + HEAD_V4, data + r->body_at, r->body_len, tp, tlen, ib, ilen, data + r->props_at, r->props_len);
        w += size;
    }
    out = PyTuple_Pack(7, buf, sizes, sysflags, props, tags, keys, uniq);
    goto done;
unusual:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(buf);
    Py_XDECREF(sizes);
    Py_XDECREF(sysflags);
    Py_XDECREF(props);
    Py_XDECREF(tags);
    Py_XDECREF(keys);
    Py_XDECREF(uniq);
    Py_XDECREF(sf);
    PyMem_Free(recs.data);
    PyBuffer_Release(&dv);
    return out;
}

/* ---------------------------------------------------------------------------------- encode_send_batch */

PyDoc_STRVAR(encode_send_batch_doc,
"encode_send_batch(msgs, cls, topic, ids, max_size, system_names) -> bytes | None\n\n"
"A producer's SEND_BATCH_MESSAGE body for a list of sluice.Message (MessageDecoder.encodeMessages), with\n"
"message i's UNIQ_KEY ``ids[i]``: what sluice.client.encoding._encode_batch_py gives. None for anything\n"
"but the common shape (then the Python twin runs and raises the precise error): every message a ``cls``\n"
"(exactly: a subclass may override validate or all_properties) of ``topic`` (checked by the caller),\n"
"a bytes body of 1 to ``max_size`` bytes, str user properties (a dict)\n"
"with no name in ``system_names`` or a transient one and no separator, tags None or a str, keys None or\n"
"one key, no delay, an int32 flag, properties within 32767 bytes and the whole body within ``max_size``.");

static PyObject *a_tags, *a_keys, *a_delay_level, *a_deliver_at, *a_delay;

#define TRANSIENT_PREFIX "__RMQ.TRANSIENT."

/* 1 when the UTF-8 text holds neither property separator (\x01, \x02). */
static inline int no_separator(const char *s, Py_ssize_t n)
{
    return memchr(s, 1, (size_t)n) == NULL && memchr(s, 2, (size_t)n) == NULL;
}

/* Append ``name\x01value\x02``: 1, 0 for unusual text (not a str, a separator, not encodable), -1 on error. */
static int add_prop(Buf *b, PyObject *name, PyObject *value)
{
    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(value))
        return 0;
    Py_ssize_t nl, vl;
    const char *n = PyUnicode_AsUTF8AndSize(name, &nl);
    const char *v = n == NULL ? NULL : PyUnicode_AsUTF8AndSize(value, &vl);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (nl == 0 || !no_separator(n, nl) || !no_separator(v, vl))
        return 0;
    if (buf_reserve(b, nl + vl + 2) < 0)
        return -1;
    memcpy(b->data + b->len, n, (size_t)nl);
    b->data[b->len + nl] = 1;
    memcpy(b->data + b->len + nl + 1, v, (size_t)vl);
    b->data[b->len + nl + 1 + vl] = 2;
    b->len += nl + vl + 2;
    return 1;
}

/* One message appended to ``b``: 1, 0 when unusual, -1 on error. */
static int send_entry(Buf *b, PyObject *m, PyObject *topic, PyObject *uid, long long max_size, PyObject *system)
{
    PyObject *v[8] = {NULL};
    PyObject *names[8] = {s_topic, s_body, s_properties, s_flag, a_tags, a_keys, a_delay_level, a_deliver_at};
    int rc = -1;
    for (int k = 0; k < 8; k++)
        if ((v[k] = PyObject_GetAttr(m, names[k])) == NULL)
            goto done;
    PyObject *delay = PyObject_GetAttr(m, a_delay);
    if (delay == NULL)
        goto done;
    int no_delay = delay == Py_None;
    Py_DECREF(delay);
    PyObject *mt = v[0], *body = v[1], *props = v[2], *flag = v[3], *tags = v[4], *keys = v[5];
    rc = 0;
    if (!no_delay || v[7] != Py_None || !PyLong_CheckExact(v[6]) || !PyLong_CheckExact(flag)
        || !PyBytes_CheckExact(body) || !PyDict_CheckExact(props) || !PyUnicode_CheckExact(mt)
        || !PyUnicode_CheckExact(uid))
        goto done;
    int eq = PyUnicode_Compare(mt, topic);
    if (eq != 0) {
        if (eq == -1 && PyErr_Occurred())
            rc = -1;
        goto done;
    }
    int overflow;
    long long dl = PyLong_AsLongLongAndOverflow(v[6], &overflow);
    if (overflow || dl != 0)
        goto done;
    long long fl = PyLong_AsLongLongAndOverflow(flag, &overflow);
    if (overflow || fl < INT32_MIN || fl > INT32_MAX)
        goto done;
    Py_ssize_t body_len = PyBytes_GET_SIZE(body);
    if (body_len == 0 || body_len > max_size)
        goto done;
    Py_ssize_t start = b->len;
    unsigned char head[20];
    if (buf_add(b, head, 20) < 0 || buf_add(b, PyBytes_AS_STRING(body), body_len) < 0 || buf_add(b, head, 2) < 0) {
        rc = -1;
        goto done;
    }
    Py_ssize_t props_at = b->len, pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(props, &pos, &name, &value)) {
        if (!PyUnicode_CheckExact(name))
            goto done;
        int sys = PySet_Contains(system, name);
        if (sys != 0) {
            rc = sys < 0 ? -1 : 0;
            goto done;
        }
        Py_ssize_t nl;
        const char *n = PyUnicode_AsUTF8AndSize(name, &nl);
        if (n == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                PyErr_Clear();
                rc = 0;
            } else
                rc = -1;
            goto done;
        }
        if (nl >= (Py_ssize_t)strlen(TRANSIENT_PREFIX) && memcmp(n, TRANSIENT_PREFIX, strlen(TRANSIENT_PREFIX)) == 0)
            goto done;
        if ((rc = add_prop(b, name, value)) <= 0)
            goto done;
        rc = 0;
    }
    if (tags != Py_None) {
        if (!PyUnicode_CheckExact(tags))
            goto done;
        if (PyUnicode_GET_LENGTH(tags) > 0 && (rc = add_prop(b, s_TAGS, tags)) <= 0)
            goto done;
        rc = 0;
    }
    if (keys != Py_None) {
        /* one key only: several (a list, or a str with spaces) take the Python path */
        if (!PyUnicode_CheckExact(keys) || PyUnicode_FindChar(keys, ' ', 0, PyUnicode_GET_LENGTH(keys), 1) != -1)
            goto done;
        if (PyUnicode_GET_LENGTH(keys) > 0 && (rc = add_prop(b, s_KEYS, keys)) <= 0)
            goto done;
        rc = 0;
    }
    if ((rc = add_prop(b, s_UNIQ_KEY, uid)) <= 0)
        goto done;
    rc = 0;
    Py_ssize_t props_len = b->len - props_at, total = b->len - start;
    if (props_len > MAX_PROPS)
        goto done;
    unsigned char *w = b->data + start;
    put_u32(w, (uint32_t)total);
    put_u32(w + 4, 0); /* magic and bodyCRC: 0, as the Java client writes them */
    put_u32(w + 8, 0);
    put_u32(w + 12, (uint32_t)(int32_t)fl);
    put_u32(w + 16, (uint32_t)body_len);
    put_u16(b->data + props_at - 2, (uint32_t)props_len);
    rc = 1;
done:
    for (int k = 0; k < 8; k++)
        Py_XDECREF(v[k]);
    return rc;
}

static PyObject *encode_send_batch(PyObject *self, PyObject *args)
{
    PyObject *msgs, *cls, *topic, *ids, *system;
    long long max_size;
    if (!PyArg_ParseTuple(args, "O!O!UO!LO!:encode_send_batch", &PyList_Type, &msgs, &PyType_Type, &cls, &topic,
                          &PyList_Type, &ids, &max_size, &PyFrozenSet_Type, &system))
        return NULL;
    if (a_tags == NULL) {
        if ((a_tags = PyUnicode_InternFromString("tags")) == NULL
            || (a_keys = PyUnicode_InternFromString("keys")) == NULL
            || (a_delay_level = PyUnicode_InternFromString("delay_level")) == NULL
            || (a_deliver_at = PyUnicode_InternFromString("deliver_at")) == NULL
            || (a_delay = PyUnicode_InternFromString("delay")) == NULL)
            return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    if (n == 0 || PyList_GET_SIZE(ids) != n)
        Py_RETURN_NONE;
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((PyObject *)Py_TYPE(PyList_GET_ITEM(msgs, i)) != cls) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        int rc = send_entry(&b, PyList_GET_ITEM(msgs, i), topic, PyList_GET_ITEM(ids, i), max_size, system);
        if (rc < 0)
            goto done;
        if (rc == 0 || b.len > max_size) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize((const char *)b.data, b.len);
done:
    PyMem_Free(b.data);
    return out;
}

PyMethodDef sluice_batches_methods[] = {
    {"decode_properties", (PyCFunction)decode_properties, METH_O, decode_properties_doc},
    {"decode_batch", (PyCFunction)decode_batch, METH_VARARGS, decode_batch_doc},
    {"encode_wire_batch", (PyCFunction)encode_wire_batch, METH_VARARGS, encode_wire_batch_doc},
    {"encode_send_batch", (PyCFunction)encode_send_batch, METH_VARARGS, encode_send_batch_doc},
    {NULL, NULL, 0, NULL},
};
