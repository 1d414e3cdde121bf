/* The key index: keys split and hashed as Java does, entries and slot chains written into the file. */
#include "speedups.h"

/* ------------------------------------------------------------------------------------------ key hashes */

/* h * 31**units + Java hash of s (UTF-16 code units, supplementary characters as surrogate pairs),
 * all mod 2**32: hash(prefix + s) given the prefix's hash. */
static uint32_t java_hash_from(uint32_t h, PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (kind == PyUnicode_1BYTE_KIND) {
        const unsigned char *p = data;
        for (Py_ssize_t i = 0; i < n; i++)
            h = h * 31u + p[i];
        return h;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = h * 31u + (0xD800u + (c >> 10));
            h = h * 31u + (0xDC00u + (c & 0x3FF));
        } else {
            h = h * 31u + c;
        }
    }
    return h;
}

/* abs() of the signed hash, Integer.MIN_VALUE mapping to 0 (IndexFile.indexKeyHashMethod). */
static inline int64_t finish_hash(uint32_t h)
{
    int32_t s = (int32_t)h;
    if (s == INT32_MIN)
        return 0;
    return s < 0 ? -(int64_t)s : (int64_t)s;
}

static int add_entry(Buf *hashes, Buf *phys, uint32_t prefix, PyObject *key, int64_t phy)
{
    int64_t h = finish_hash(java_hash_from(prefix, key));
    if (buf_add(hashes, &h, 8) < 0 || buf_add(phys, &phy, 8) < 0)
        return -1;
    return 0;
}

PyDoc_STRVAR(index_entries_doc,
"index_entries(prefix: int, uniq: list, keys: list, phys: list, sysflags: list) -> (hashes, phys)\n\n"
"The key-index entries of one put's records: for each record that is not a rolled-back transaction,\n"
"its UNIQ_KEY then each non-empty space-separated token of its KEYS, hashed as keyhash.key_hash with\n"
"``prefix`` = prefix_hash(topic). Both results are native-endian int64 bytes (numpy.frombuffer).");

static PyObject *index_entries(PyObject *self, PyObject *args)
{
    unsigned long prefix;
    PyObject *uniq, *keys, *phys, *sysflags;
    if (!PyArg_ParseTuple(args, "kO!O!O!O!:index_entries", &prefix, &PyList_Type, &uniq, &PyList_Type, &keys,
                          &PyList_Type, &phys, &PyList_Type, &sysflags))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(phys);
    if (PyList_GET_SIZE(uniq) != n || PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(sysflags) != n) {
        PyErr_SetString(PyExc_ValueError, "index_entries: the columns differ in length");
        return NULL;
    }
    Buf hb = {NULL, 0, 0}, pb = {NULL, 0, 0};
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        long sf = PyLong_AsLong(PyList_GET_ITEM(sysflags, i));
        if (sf == -1 && PyErr_Occurred())
            goto done;
        if ((sf & TRAN_MASK) == TRAN_ROLLBACK)
            continue; /* rolled back: never indexed */
        long long phy = PyLong_AsLongLong(PyList_GET_ITEM(phys, i));
        if (phy == -1 && PyErr_Occurred())
            goto done;
        PyObject *u = PyList_GET_ITEM(uniq, i), *k = PyList_GET_ITEM(keys, i);
        if (u != Py_None) {
            if (!PyUnicode_Check(u)) {
                PyErr_SetString(PyExc_TypeError, "index_entries: UNIQ_KEY must be a str or None");
                goto done;
            }
            if (PyUnicode_GET_LENGTH(u) && add_entry(&hb, &pb, (uint32_t)prefix, u, phy) < 0)
                goto done;
        }
        if (k == Py_None)
            continue;
        if (!PyUnicode_Check(k)) {
            PyErr_SetString(PyExc_TypeError, "index_entries: KEYS must be a str or None");
            goto done;
        }
        Py_ssize_t len = PyUnicode_GET_LENGTH(k), pos = 0;
        if (PyUnicode_FindChar(k, ' ', 0, len, 1) == -1) { /* one key: the usual case, no substring */
            if (len && add_entry(&hb, &pb, (uint32_t)prefix, k, phy) < 0)
                goto done;
            continue;
        }
        while (pos <= len) {
            Py_ssize_t sp = PyUnicode_FindChar(k, ' ', pos, len, 1);
            if (sp == -2)
                goto done;
            if (sp == -1)
                sp = len;
            if (sp > pos) {
                PyObject *tok = PyUnicode_Substring(k, pos, sp);
                if (tok == NULL)
                    goto done;
                int rc = add_entry(&hb, &pb, (uint32_t)prefix, tok, phy);
                Py_DECREF(tok);
                if (rc < 0)
                    goto done;
            }
            pos = sp + 1;
        }
    }
    out = Py_BuildValue("(y#y#)", hb.data ? (const char *)hb.data : "", hb.len,
                        pb.data ? (const char *)pb.data : "", pb.len);
done:
    PyMem_Free(hb.data);
    PyMem_Free(pb.data);
    return out;
}

PyDoc_STRVAR(key_hash_doc,
"key_hash(prefix: int, key: str) -> int\n\n"
"keyhash.key_hash with ``prefix`` = prefix_hash(topic).");

static PyObject *key_hash(PyObject *self, PyObject *args)
{
    unsigned long prefix;
    PyObject *key;
    if (!PyArg_ParseTuple(args, "kU:key_hash", &prefix, &key))
        return NULL;
    return PyLong_FromLongLong(finish_hash(java_hash_from((uint32_t)prefix, key)));
}

/* ------------------------------------------------------------------------------------------- index_put */

PyDoc_STRVAR(index_put_doc,
"index_put(mm, entries_at: int, slot_num: int, count: int, begin_ts: int, hashes, phys, ts)\n"
"    -> (count, new_slots)\n\n"
"IndexFile.put_many's writes in C: append one 20-byte entry per hash to the mapped index file ``mm``\n"
"(chained to its slot's previous head, a head outside 1..count-1 counting as empty) and point the\n"
"slot at it. ``hashes``, ``phys`` and ``ts`` are native int64 buffers of one length. Returns the new\n"
"entry count and how many slots were empty before. The caller writes the header.");

static PyObject *index_put(PyObject *self, PyObject *args)
{
    Py_buffer mm, hv, pv, tv;
    Py_ssize_t entries_at, slot_num, count;
    long long begin_ts;
    if (!PyArg_ParseTuple(args, "w*nnnLy*y*y*:index_put", &mm, &entries_at, &slot_num, &count, &begin_ts, &hv,
                          &pv, &tv))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = hv.len / 8;
    if (hv.len % 8 || pv.len != hv.len || tv.len != hv.len || slot_num <= 0 || count < 1
        || entries_at != 40 + slot_num * 4 || entries_at + (count + n) * 20 > mm.len) {
        PyErr_SetString(PyExc_ValueError, "index_put: entries do not fit the index file");
        goto done;
    }
    const int64_t *hs = hv.buf, *ps = pv.buf, *ts = tv.buf;
    unsigned char *base = mm.buf;
    Py_ssize_t new_slots = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (hs[i] < 0 || hs[i] > INT32_MAX) { /* checked before anything is written */
            PyErr_SetString(PyExc_ValueError, "index_put: a key hash is outside 0..2**31-1");
            goto done;
        }
    }
    /* A head outside 1..count-1 at the start is garbage (a torn write) or empty: zero it first, so in the
     * loop below a non-zero head is either a valid older entry or one of this batch. */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *slot = base + 40 + (hs[i] % slot_num) * 4;
        int32_t head = (int32_t)get_u32(slot);
        if (head <= 0 || head >= count)
            put_u32(slot, 0);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t h = hs[i];
        unsigned char *slot = base + 40 + (h % slot_num) * 4;
        int32_t prev = (int32_t)get_u32(slot);
        if (prev == 0)
            new_slots++;
        int64_t diff = ts[i] - begin_ts;
        diff = diff < 0 ? 0 : diff / 1000;
        if (diff > INT32_MAX)
            diff = INT32_MAX;
        unsigned char *e = base + entries_at + count * 20;
        put_u32(e, (uint32_t)h);
        put_u64(e + 4, (uint64_t)ps[i]);
        put_u32(e + 12, (uint32_t)diff);
        put_u32(e + 16, (uint32_t)prev);
        put_u32(slot, (uint32_t)count);
        count++;
    }
    out = Py_BuildValue("(nn)", count, new_slots);
done:
    PyBuffer_Release(&mm);
    PyBuffer_Release(&hv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&tv);
    return out;
}

PyMethodDef sluice_index_methods[] = {
    {"index_entries", (PyCFunction)index_entries, METH_VARARGS, index_entries_doc},
    {"key_hash", (PyCFunction)key_hash, METH_VARARGS, key_hash_doc},
    {"index_put", (PyCFunction)index_put, METH_VARARGS, index_put_doc},
    {NULL, NULL, 0, NULL},
};
