/* Commit-log records on append: StoreMessages encoded, offsets and times patched in, offset msg ids. */
#include "speedups.h"

/* ---------------------------------------------------------------------------------------- encode_batch */


typedef struct {
    PyObject *body;      /* borrowed from the message (kept alive by it) */
    Py_ssize_t props_at; /* where its encoded properties start in the scratch buffer */
    Py_ssize_t props_len;
    uint32_t crc;
    int32_t flag, sysflag, reconsume;
    int64_t born_ts, prepared;
    unsigned char born[8];
} Rec;

/* ``obj`` as a C integer within [lo, hi]; -1 with no error set when it is not an int or out of range. */
static int as_i64(PyObject *obj, int64_t lo, int64_t hi, int64_t *out)
{
    if (!PyLong_CheckExact(obj))
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Does a str hold \x01 or \x02 anywhere? -1 on error. */
static int has_separator(PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_KIND(s) == PyUnicode_1BYTE_KIND) {
        const unsigned char *p = PyUnicode_1BYTE_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++)
            if (p[i] == 1 || p[i] == 2)
                return 1;
        return 0;
    }
    Py_ssize_t a = PyUnicode_FindChar(s, 1, 0, n, 1);
    if (a == -2)
        return -1;
    if (a >= 0)
        return 1;
    a = PyUnicode_FindChar(s, 2, 0, n, 1);
    if (a == -2)
        return -1;
    return a >= 0;
}

/* Append ``name \x01 value \x02`` for every pair of ``props`` to ``scratch``: 1 done, 0 unusual (a name
 * or value that is not a str, an empty or transient name, a separator inside), -1 error. */
static int encode_props(PyObject *props, PyObject *transient, Buf *scratch)
{
    Py_ssize_t i = 0;
    PyObject *k, *v;
    while (PyDict_Next(props, &i, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v) || PyUnicode_GET_LENGTH(k) == 0)
            return 0;
        Py_ssize_t t = PyUnicode_Tailmatch(k, transient, 0, PY_SSIZE_T_MAX, -1);
        if (t != 0)
            return t < 0 ? -1 : 0;
        int sep = has_separator(k);
        if (sep != 0)
            return sep < 0 ? -1 : 0;
        sep = has_separator(v);
        if (sep != 0)
            return sep < 0 ? -1 : 0;
        Py_ssize_t kn, vn;
        const char *kb = PyUnicode_AsUTF8AndSize(k, &kn);
        if (kb == NULL) { /* a lone surrogate: str.encode would fail the same way on the Python path */
            PyErr_Clear();
            return 0;
        }
        const char *vb = PyUnicode_AsUTF8AndSize(v, &vn);
        if (vb == NULL) {
            PyErr_Clear();
            return 0;
        }
        if (buf_reserve(scratch, kn + vn + 2) < 0)
            return -1;
        unsigned char *p = scratch->data + scratch->len;
        memcpy(p, kb, (size_t)kn);
        p[kn] = 1;
        memcpy(p + kn + 1, vb, (size_t)vn);
        p[kn + 1 + vn] = 2;
        scratch->len += kn + vn + 2;
    }
    return 1;
}

static int append_get(PyObject *list, PyObject *props, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(props, name);
    if (v == NULL && PyErr_Occurred())
        return -1;
    return PyList_Append(list, v == NULL ? Py_None : v);
}

PyDoc_STRVAR(encode_batch_doc,
"encode_batch(msgs, topic, queue_id, topic_part, store_host, max_body, host_bytes, crc32, transient)\n"
"    -> (buf, sizes, sysflags, props, tags, keys, uniq) | None\n\n"
"sluice.store.encode.encode_batch's loop in C, for messages of one topic and queue with IPv4 hosts and no\n"
"transactional flag (and empty properties allowed). ``store_host`` is the 8-byte IPv4 store host,\n"
"``host_bytes(host)`` gives (bytes, is_v6) for a born host, ``crc32(body)`` the body CRC. None for\n"
"anything else, or anything invalid: encode_batch's loop then encodes or refuses it precisely.");

static PyObject *encode_batch(PyObject *self, PyObject *args)
{
    PyObject *msgs, *topic, *topic_part, *store_b, *host_bytes, *crc32, *transient;
    long long queue_id, max_body;
    if (!PyArg_ParseTuple(args, "O!ULO!O!LOOU:encode_batch", &PyList_Type, &msgs, &topic, &queue_id,
                          &PyBytes_Type, &topic_part, &PyBytes_Type, &store_b, &max_body, &host_bytes, &crc32,
                          &transient))
        return NULL;
    if (PyBytes_GET_SIZE(store_b) != HOST_V4_SIZE) {
        PyErr_SetString(PyExc_ValueError, "store_host must be the 8 bytes of an IPv4 host and port");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs);
    Rec *recs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Rec));
    if (recs == NULL)
        return PyErr_NoMemory();
    Buf scratch = {NULL, 0, 0};
    PyObject *props_l = PyList_New(n), *tags = PyList_New(0), *keys = PyList_New(0), *uniq = PyList_New(0);
    PyObject *sizes = PyList_New(n), *sysflags = PyList_New(n), *out = NULL, *buf = NULL;
    PyObject *last_host = NULL, *born_obj = NULL; /* born_obj: the bytes of last_host, owned */
    PyObject *attr = NULL;
    const Py_ssize_t tlen = PyBytes_GET_SIZE(topic_part);
    const Py_ssize_t fixed = HEAD_V4 + tlen + 2;
    Py_ssize_t total = 0;
    if (props_l == NULL || tags == NULL || keys == NULL || uniq == NULL || sizes == NULL || sysflags == NULL)
        goto done;

    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        Rec *r = &recs[i];
        int64_t v;
        int cmp;
#define GET(name) do { Py_XDECREF(attr); attr = PyObject_GetAttr(m, name); if (attr == NULL) goto unusual; } while (0)
        GET(s_topic);
        cmp = attr == topic ? 1 : (PyUnicode_CheckExact(attr) ? PyUnicode_Compare(attr, topic) == 0 : 0);
        if (!cmp)
            goto unusual;
        GET(s_queue_id);
        if (as_i64(attr, queue_id, queue_id, &v) < 0)
            goto unusual;
        GET(s_body);
        if (!PyBytes_CheckExact(attr) || PyBytes_GET_SIZE(attr) > max_body)
            goto unusual;
        r->body = attr; /* the message keeps it alive */
        GET(s_flag);
        if (as_i64(attr, INT32_MIN, INT32_MAX, &v) < 0)
            goto unusual;
        r->flag = (int32_t)v;
        GET(s_sysflag);
        if (as_i64(attr, INT32_MIN, INT32_MAX, &v) < 0 || (v & TRAN_MASK))
            goto unusual;
        r->sysflag = (int32_t)(v & ~HOST_V6_BITS);
        GET(s_born_timestamp);
        if (as_i64(attr, INT64_MIN, INT64_MAX, &r->born_ts) < 0)
            goto unusual;
        GET(s_reconsume_times);
        if (as_i64(attr, INT32_MIN, INT32_MAX, &v) < 0)
            goto unusual;
        r->reconsume = (int32_t)v;
        GET(s_prepared_tx_offset);
        if (as_i64(attr, INT64_MIN, INT64_MAX, &r->prepared) < 0)
            goto unusual;
        GET(s_born_host);
        if (attr != last_host) {
            int same = 0;
            if (last_host != NULL) {
                same = PyObject_RichCompareBool(attr, last_host, Py_EQ);
                if (same < 0)
                    goto unusual;
            }
            if (!same) {
                PyObject *hb = PyObject_CallOneArg(host_bytes, attr);
                if (hb == NULL)
                    goto unusual;
                if (!PyTuple_Check(hb) || PyTuple_GET_SIZE(hb) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(hb, 0))
                    || PyBytes_GET_SIZE(PyTuple_GET_ITEM(hb, 0)) != HOST_V4_SIZE) { /* IPv6: HOST_V6_SIZE */
                    Py_DECREF(hb);
                    goto unusual;
                }
                Py_XSETREF(born_obj, Py_NewRef(PyTuple_GET_ITEM(hb, 0)));
                Py_DECREF(hb);
            }
            Py_XSETREF(last_host, Py_NewRef(attr));
        }
        memcpy(r->born, PyBytes_AS_STRING(born_obj), HOST_V4_SIZE);
        GET(s_properties);
        if (!PyDict_CheckExact(attr))
            goto unusual;
        r->props_at = scratch.len;
        int rc = encode_props(attr, transient, &scratch);
        if (rc <= 0) {
            if (rc < 0)
                goto done;
            goto unusual;
        }
        r->props_len = scratch.len - r->props_at;
        if (r->props_len > MAX_PROPS)
            goto unusual;
        if (append_get(tags, attr, s_TAGS) < 0 || append_get(keys, attr, s_KEYS) < 0
            || append_get(uniq, attr, s_UNIQ_KEY) < 0)
            goto done;
        PyObject *text = PyUnicode_DecodeUTF8((const char *)scratch.data + r->props_at, r->props_len, "strict");
        if (text == NULL)
            goto done;
        PyList_SET_ITEM(props_l, i, text);
        if (body_crc(crc32, (const unsigned char *)PyBytes_AS_STRING(r->body), PyBytes_GET_SIZE(r->body), &r->crc) < 0)
            goto done;
        Py_ssize_t size = fixed + PyBytes_GET_SIZE(r->body) + r->props_len;
        if (size > INT32_MAX)
            goto unusual;
        PyObject *sz = PyLong_FromSsize_t(size), *sf = PyLong_FromLong(r->sysflag);
        if (sz == NULL || sf == NULL) {
            Py_XDECREF(sz);
            Py_XDECREF(sf);
            goto done;
        }
        PyList_SET_ITEM(sizes, i, sz);
        PyList_SET_ITEM(sysflags, i, sf);
        total += size;
#undef GET
    }

    buf = PyByteArray_FromStringAndSize(NULL, total);
    if (buf == NULL)
        goto done;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(buf);
    const unsigned char *store = (const unsigned char *)PyBytes_AS_STRING(store_b);
    const unsigned char *tp = (const unsigned char *)PyBytes_AS_STRING(topic_part);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Rec *r = &recs[i];
        Py_ssize_t blen = PyBytes_GET_SIZE(r->body);
        Py_ssize_t size = fixed + blen + r->props_len;
        write_head(p, size, r->crc, queue_id, r->flag, r->sysflag, r->born_ts, r->born, store, r->reconsume,
                   r->prepared, blen);
        write_tail(p + HEAD_V4, (const unsigned char *)PyBytes_AS_STRING(r->body), blen, tp, tlen, NULL, 0,
                   r->props_len ? scratch.data + r->props_at : NULL, r->props_len); /* data is NULL while empty */
        p += size;
    }
    out = PyTuple_Pack(7, buf, sizes, sysflags, props_l, tags, keys, uniq);
    goto done;
unusual:
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            goto done; /* KeyboardInterrupt and the like go on up */
        PyErr_Clear();
    }
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(attr);
    Py_XDECREF(last_host);
    Py_XDECREF(born_obj);
    Py_XDECREF(buf);
    Py_XDECREF(props_l);
    Py_XDECREF(tags);
    Py_XDECREF(keys);
    Py_XDECREF(uniq);
    Py_XDECREF(sizes);
    Py_XDECREF(sysflags);
    PyMem_Free(scratch.data);
    PyMem_Free(recs);
    return out;
}

/* ------------------------------------------------------------------------------------- patch_records */

PyDoc_STRVAR(patch_records_doc,
"patch_records(buf: bytearray, sizes: list, ts_positions: list, first_qoff: int, wpos: int, now: int)\n"
"    -> list[int]\n\n"
"What CommitLog.append writes into encoded records before copying them into the log: each record's\n"
"queue offset (first_qoff, first_qoff + 1, ...), its commit-log offset (wpos plus the sizes before it)\n"
"and the store timestamp ``now`` at its ``ts_positions`` entry. Returns the commit-log offsets.");

static PyObject *patch_records(PyObject *self, PyObject *args)
{
    PyObject *buf, *sizes, *tspos;
    long long first_qoff, wpos, now;
    if (!PyArg_ParseTuple(args, "O!O!O!LLL:patch_records", &PyByteArray_Type, &buf, &PyList_Type, &sizes,
                          &PyList_Type, &tspos, &first_qoff, &wpos, &now))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(sizes);
    if (PyList_GET_SIZE(tspos) != n) {
        PyErr_SetString(PyExc_ValueError, "patch_records: sizes and ts_positions differ in length");
        return NULL;
    }
    Py_ssize_t len = PyByteArray_GET_SIZE(buf), rel = 0;
    if ((n && first_qoff > INT64_MAX - (n - 1)) || wpos > INT64_MAX - len) {
        PyErr_SetString(PyExc_ValueError, "patch_records: an offset would pass 2**63-1");
        return NULL;
    }
    /* Check every size and position first: nothing is patched unless all of it fits. */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
        Py_ssize_t t = PyLong_AsSsize_t(PyList_GET_ITEM(tspos, i));
        if ((size == -1 || t == -1) && PyErr_Occurred())
            return NULL;
        if (size < 44 || t < 44 || t + 8 > size || rel + size > len) {
            PyErr_SetString(PyExc_ValueError, "patch_records: the sizes do not describe the buffer");
            return NULL;
        }
        rel += size;
    }
    if (rel != len) {
        PyErr_SetString(PyExc_ValueError, "patch_records: the sizes do not add up to the buffer");
        return NULL;
    }
    PyObject *phys = PyList_New(n);
    if (phys == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(buf);
    rel = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = PyLong_AsSsize_t(PyList_GET_ITEM(sizes, i));
        Py_ssize_t t = PyLong_AsSsize_t(PyList_GET_ITEM(tspos, i));
        long long at = wpos + rel;
        PyObject *o = PyLong_FromLongLong(at);
        if (o == NULL) {
            Py_DECREF(phys);
            return NULL;
        }
        PyList_SET_ITEM(phys, i, o);
        put_u64(p + rel + POS_QUEUEOFFSET, (uint64_t)(first_qoff + i));
        put_u64(p + rel + POS_PHYSICALOFFSET, (uint64_t)at);
        put_u64(p + rel + t, (uint64_t)now);
        rel += size;
    }
    return phys;
}

/* ------------------------------------------------------------------------------------ offset_msg_ids */

PyDoc_STRVAR(offset_msg_ids_doc,
"offset_msg_ids(prefix: str, offsets: list[int]) -> list[str]\n\n"
"``prefix + '%016X' % offset`` for each offset (the offset message ids of a broker whose host and port\n"
"give the uppercase hex ``prefix``).");

static PyObject *offset_msg_ids(PyObject *self, PyObject *args)
{
    static const char hex[] = "0123456789ABCDEF";
    PyObject *prefix, *offsets;
    if (!PyArg_ParseTuple(args, "UO!:offset_msg_ids", &prefix, &PyList_Type, &offsets))
        return NULL;
    Py_ssize_t plen;
    const char *pb = PyUnicode_AsUTF8AndSize(prefix, &plen);
    if (pb == NULL)
        return NULL;
    if (plen > 64 || !PyUnicode_IS_ASCII(prefix)) {
        PyErr_SetString(PyExc_ValueError, "offset_msg_ids: the prefix is at most 64 ASCII characters");
        return NULL;
    }
    char text[64 + 16];
    memcpy(text, pb, (size_t)plen);
    Py_ssize_t n = PyList_GET_SIZE(offsets);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long off = PyLong_AsLongLong(PyList_GET_ITEM(offsets, i));
        if (off == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (off < 0) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "offset_msg_ids: a negative offset");
            return NULL;
        }
        uint64_t v = (uint64_t)off;
        for (int k = 15; k >= 0; k--) {
            text[plen + k] = hex[v & 0xF];
            v >>= 4;
        }
        PyObject *s = PyUnicode_FromStringAndSize(text, plen + 16);
        if (s == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, s);
    }
    return out;
}

PyMethodDef sluice_records_methods[] = {
    {"encode_batch", (PyCFunction)encode_batch, METH_VARARGS, encode_batch_doc},
    {"patch_records", (PyCFunction)patch_records, METH_VARARGS, patch_records_doc},
    {"offset_msg_ids", (PyCFunction)offset_msg_ids, METH_VARARGS, offset_msg_ids_doc},
    {NULL, NULL, 0, NULL},
};
