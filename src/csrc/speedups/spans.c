/* Record boundaries of a pull body for the filter server and its worker (sluice/filtersrv/spans.py is the
 * Python twin and the reference): one walk, no per-record objects but the properties text when asked. */
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
            int32_t body_len = (int32_t)get_u32(r + POS_BODYLENGTH_V4);
            if (body_len < 0 || HEAD_V4 + (Py_ssize_t)body_len + 3 > total)
                goto unusual;
            Py_ssize_t tpos = HEAD_V4 + body_len, tlen = r[tpos];
            if (tpos + 1 + tlen + 2 > total)
                goto unusual;
            Py_ssize_t ppos = tpos + 1 + tlen, plen = get_u16(r + ppos);
            if (ppos + 2 + plen != total)
                goto unusual;
            PyObject *text = PyUnicode_DecodeUTF8((const char *)r + ppos + 2, plen, "strict");
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

PyMethodDef sluice_spans_methods[] = {
    {"record_spans", (PyCFunction)record_spans, METH_VARARGS, record_spans_doc},
    {NULL, NULL, 0, NULL},
};
