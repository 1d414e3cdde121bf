/* Filtered pulls that must evaluate a selector on each record: the records' property values, judged once per
 * distinct combination, instead of a Python step (read, decode every property, evaluate) per record. */
#include "speedups.h"

/* 1 when p[0:n] is valid UTF-8 as Python's strict decoder sees it (ASCII checked here, anything else by it),
 * 0 when not, -1 on a memory error. */
static int utf8_ok(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) { /* ASCII, the usual case, eight bytes at a time */
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ULL)
            break;
    }
    for (; i < n; i++) {
        if (p[i] & 0x80) {
            PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
            if (s != NULL) {
                Py_DECREF(s);
                return 1;
            }
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return -1;
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

#define MAX_KEYS 64 /* names a selector may read for the C path; more: the filter's own Python step */

/* The key of a record's values of ``names`` (per name: 0xFF for absent, else a 4-byte length and the bytes)
 * into ``key``, from the properties text p[0:n] as decode_properties reads it: parts split on 0x02, name
 * and value split on the part's first 0x01, both non-empty; a later part of the same name wins (0x01 and
 * 0x02 never occur inside a multi-byte UTF-8 character, so bytes split as characters do). 0, or -1. */
static int values_key(Buf *key, const unsigned char *p, Py_ssize_t n, PyObject *names)
{
    Py_ssize_t nk = PyTuple_GET_SIZE(names), vpos[MAX_KEYS], vlen[MAX_KEYS];
    for (Py_ssize_t k = 0; k < nk; k++)
        vpos[k] = -1;
    Py_ssize_t pos = 0;
    while (pos < n) {
        const unsigned char *e = memchr(p + pos, 2, (size_t)(n - pos));
        Py_ssize_t end = e ? e - p : n;
        const unsigned char *sep = memchr(p + pos, 1, (size_t)(end - pos));
        if (sep != NULL && sep > p + pos && sep < p + end - 1) {
            Py_ssize_t nlen = sep - (p + pos);
            for (Py_ssize_t k = 0; k < nk; k++) {
                PyObject *nm = PyTuple_GET_ITEM(names, k);
                if (PyBytes_GET_SIZE(nm) == nlen && memcmp(PyBytes_AS_STRING(nm), p + pos, (size_t)nlen) == 0) {
                    vpos[k] = nlen + 1 + pos;
                    vlen[k] = end - vpos[k];
                }
            }
        }
        pos = end + 1;
    }
    Py_ssize_t need = 0; /* the key's size, reserved once */
    for (Py_ssize_t k = 0; k < nk; k++)
        need += vpos[k] < 0 ? 1 : 5 + vlen[k];
    key->len = 0;
    if (buf_reserve(key, need) < 0)
        return -1;
    unsigned char *w = key->data;
    for (Py_ssize_t k = 0; k < nk; k++) {
        if (vpos[k] < 0) {
            *w++ = 0xFF;
            continue;
        }
        w[0] = 0;
        put_u32(w + 1, (uint32_t)vlen[k]);
        memcpy(w + 5, p + vpos[k], (size_t)vlen[k]);
        w += 5 + vlen[k];
    }
    key->len = need;
    return 0;
}

/* The values a key holds, as a tuple of str (None for absent): what ``judge`` is asked about. */
static PyObject *key_values(const unsigned char *k, Py_ssize_t n, Py_ssize_t nk)
{
    PyObject *t = PyTuple_New(nk);
    if (t == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *v;
        if (k[pos] == 0xFF) {
            v = Py_NewRef(Py_None);
            pos += 1;
        } else {
            Py_ssize_t len = get_u32(k + pos + 1);
            v = PyUnicode_DecodeUTF8((const char *)k + pos + 5, len, "strict");
            pos += 5 + len;
        }
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* ------------------------------------------------------------------------------------- verdict_cache */

/* Verdicts by values key, kept across pulls (a capsule the filter holds): open addressing on a 64-bit
 * hash (bytes_hash), keys in one arena. Emptied when it holds ``max`` keys: a verdict depends on the values alone, so a
 * dropped one is only judged again. */
typedef struct {
    uint64_t *hash; /* 0: empty slot */
    int32_t *verdict;
    Py_ssize_t *koff, *klen;
    Py_ssize_t cap, used, max;
    Buf keys;
} Verdicts;

static const char VERDICTS[] = "sluice.verdict_cache";

static void verdicts_free(PyObject *cap)
{
    Verdicts *v = PyCapsule_GetPointer(cap, VERDICTS);
    if (v == NULL)
        return;
    PyMem_Free(v->hash);
    PyMem_Free(v->verdict);
    PyMem_Free(v->koff);
    PyMem_Free(v->klen);
    PyMem_Free(v->keys.data);
    PyMem_Free(v);
}

/* The slot of ``key`` (its verdict set) or of the empty slot where it would go. */
static Py_ssize_t verdicts_slot(const Verdicts *v, const unsigned char *key, Py_ssize_t n, uint64_t h)
{
    Py_ssize_t mask = v->cap - 1, i = (Py_ssize_t)(h & (uint64_t)mask);
    while (v->hash[i] != 0) {
        if (v->hash[i] == h && v->klen[i] == n && memcmp(v->keys.data + v->koff[i], key, (size_t)n) == 0)
            return i;
        i = (i + 1) & mask;
    }
    return i;
}

/* ``v`` rehashed into ``cap`` slots (a power of two): 0, or -1 on a memory error. */
static int verdicts_resize(Verdicts *v, Py_ssize_t cap)
{
    Verdicts n = *v;
    n.cap = cap;
    n.hash = PyMem_Calloc((size_t)cap, sizeof(uint64_t));
    n.verdict = PyMem_Malloc((size_t)cap * sizeof(int32_t));
    n.koff = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    n.klen = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    if (!n.hash || !n.verdict || !n.koff || !n.klen) {
        PyMem_Free(n.hash);
        PyMem_Free(n.verdict);
        PyMem_Free(n.koff);
        PyMem_Free(n.klen);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < v->cap; i++) {
        if (v->hash[i] == 0)
            continue;
        Py_ssize_t j = verdicts_slot(&n, v->keys.data + v->koff[i], v->klen[i], v->hash[i]);
        n.hash[j] = v->hash[i];
        n.verdict[j] = v->verdict[i];
        n.koff[j] = v->koff[i];
        n.klen[j] = v->klen[i];
    }
    PyMem_Free(v->hash);
    PyMem_Free(v->verdict);
    PyMem_Free(v->koff);
    PyMem_Free(v->klen);
    *v = n;
    return 0;
}

/* Add ``key`` → ``verdict``: 0, or -1 on a memory error. (Another thread may have added it while judge ran.) */
static int verdicts_add(Verdicts *v, const unsigned char *key, Py_ssize_t n, uint64_t h, int32_t verdict)
{
    if (v->cap) {
        Py_ssize_t i = verdicts_slot(v, key, n, h);
        if (v->hash[i] != 0) {
            v->verdict[i] = verdict;
            return 0;
        }
    }
    if (v->used >= v->max) { /* full: start afresh */
        memset(v->hash, 0, (size_t)v->cap * sizeof(uint64_t));
        v->used = 0;
        v->keys.len = 0;
    }
    if (v->cap == 0 || (v->used + 1) * 2 > v->cap) {
        if (verdicts_resize(v, v->cap ? v->cap * 2 : 64) < 0)
            return -1;
    }
    Py_ssize_t off = v->keys.len;
    if (buf_add(&v->keys, key, n) < 0)
        return -1;
    Py_ssize_t i = verdicts_slot(v, key, n, h);
    v->hash[i] = h;
    v->verdict[i] = verdict;
    v->koff[i] = off;
    v->klen[i] = n;
    v->used++;
    return 0;
}

/* The verdict on the values ``key`` holds (of ``nk`` names): the cached one, or ``judge(values)``, kept once
 * it lies in lo..hi (with ``rows``, hi is the last index of that list as judge left it; out of range: an
 * ``exc`` naming ``fn``, nothing kept). 0 with ``*code`` set, or -1 with an exception. */
static int verdict_of(Verdicts *cache, const Buf *key, Py_ssize_t nk, PyObject *judge, long lo, long hi,
                      PyObject *rows, PyObject *exc, const char *fn, long *code)
{
    uint64_t h = bytes_hash(key->data, key->len);
    Py_ssize_t slot = cache->cap ? verdicts_slot(cache, key->data, key->len, h) : -1;
    if (slot >= 0 && cache->hash[slot] != 0) {
        *code = cache->verdict[slot];
        return 0;
    }
    PyObject *vals = key_values(key->data, key->len, nk);
    PyObject *got = vals ? PyObject_CallOneArg(judge, vals) : NULL;
    Py_XDECREF(vals);
    if (got == NULL)
        return -1;
    long c = PyLong_AsLong(got);
    Py_DECREF(got);
    if (c == -1 && PyErr_Occurred())
        return -1;
    if (rows != NULL && PyList_GET_SIZE(rows) - 1 < hi)
        hi = (long)(PyList_GET_SIZE(rows) - 1);
    if (c < lo || c > hi) {
        PyErr_Format(exc, "%s: judge gave %ld, outside %ld..%ld", fn, c, lo, hi);
        return -1;
    }
    if (verdicts_add(cache, key->data, key->len, h, (int32_t)c) < 0)
        return -1;
    *code = c;
    return 0;
}

PyDoc_STRVAR(verdict_cache_doc,
"verdict_cache(max: int) -> capsule\n\n"
"An empty cache of scan_records' verdicts by the values of a record's selected properties, holding at most\n"
"``max`` (then emptied and refilled: verdicts depend on the values alone).");

static PyObject *verdict_cache(PyObject *self, PyObject *arg)
{
    Py_ssize_t max = PyLong_AsSsize_t(arg);
    if (max == -1 && PyErr_Occurred())
        return NULL;
    if (max < 1) {
        PyErr_SetString(PyExc_ValueError, "verdict_cache: max must be at least 1");
        return NULL;
    }
    Verdicts *v = PyMem_Calloc(1, sizeof(Verdicts));
    if (v == NULL)
        return PyErr_NoMemory();
    v->max = max;
    PyObject *cap = PyCapsule_New(v, VERDICTS, verdicts_free);
    if (cap == NULL)
        PyMem_Free(v);
    return cap;
}

PyDoc_STRVAR(verdict_cache_len_doc, "verdict_cache_len(cache) -> int: the verdicts a verdict_cache holds.");

static PyObject *verdict_cache_len(PyObject *self, PyObject *arg)
{
    Verdicts *v = PyCapsule_GetPointer(arg, VERDICTS);
    return v == NULL ? NULL : PyLong_FromSsize_t(v->used);
}

PyDoc_STRVAR(scan_records_doc,
"scan_records(units, first, wanted, check, mm, file_start, limit, clog_min, max_msgs, max_bytes, have, total,\n"
"             left, verify, crc32, base_qoff, qoffs, phys, sizes, names, verdicts, judge, ev_idx, ev_code)\n"
"  -> (data: bytes, stop: int, why: int, left: int, filtered: bool, n_ev: int, n_read: int, bytes_read: int)\n\n"
"sluice.store.pull_read.PullReader._read_each's loop over one mapped commit-log file ``mm`` (log offset\n"
"``file_start``, data below ``limit``), from unit ``first`` of ``units`` (20-byte big-endian consume-queue\n"
"units) over the units whose ``wanted`` byte is set. A unit whose ``check`` byte is set is evaluated: the\n"
"values of the properties ``names`` (a tuple of at most 64 names, UTF-8 bytes) are read from its record and\n"
"looked up in ``verdicts`` (a verdict_cache; on a miss ``judge(values)``, values a tuple of str or None,\n"
"gives the verdict, an int kept there): 1 passes, anything else does not. Each evaluated unit's index and\n"
"verdict go to ``ev_idx`` and ``ev_code`` (int32 buffers, one slot per unit). ``have``/``total`` are the\n"
"records and bytes already taken, ``left`` the evaluations left (-1: no bound). Taken records are listed in ``qoffs``/``phys``/``sizes`` and\n"
"returned back to back in ``data``. ``why``: 0 units exhausted (stop = their number), 1 max_msgs (stop is\n"
"the unit after the last taken), 2 max_bytes, 6 out of evaluations (stop: the unit not looked at), or the\n"
"unit ``stop`` is for the Python step, left untouched: 3 its record is not in this file (or below\n"
"``clog_min``), 4 it failed verification, 5 it is of an unusual shape (not an IPv4 MAGIC_V1 record whose\n"
"topic and properties decode).");

static PyObject *scan_records(PyObject *self, PyObject *args)
{
    PyObject *mm, *crc32, *qoffs, *physl, *sizesl, *names, *verdicts, *judge, *wanted_o, *check_o, *eidx_o, *ecode_o;
    Py_buffer uv, wv = {0}, cv = {0}, mv = {0}, iv = {0}, ev = {0};
    Py_ssize_t first;
    long long file_start, limit, clog_min, max_msgs, max_bytes, have, total, left, base_qoff;
    int verify;
    if (!PyArg_ParseTuple(args, "y*nOOOLLLLLLLLpOLO!O!O!O!OOOO:scan_records", &uv, &first, &wanted_o, &check_o, &mm,
                          &file_start, &limit, &clog_min, &max_msgs, &max_bytes, &have, &total, &left, &verify,
                          &crc32, &base_qoff, &PyList_Type, &qoffs, &PyList_Type, &physl, &PyList_Type, &sizesl,
                          &PyTuple_Type, &names, &verdicts, &judge, &eidx_o, &ecode_o))
        return NULL;
    Verdicts *cache = PyCapsule_GetPointer(verdicts, VERDICTS);
    if (cache == NULL) {
        PyBuffer_Release(&uv);
        return NULL;
    }
    PyObject *out = NULL;
    Buf runs = {NULL, 0, 0}, key = {NULL, 0, 0};
    Py_ssize_t nunits = uv.len / CQ_UNIT_SIZE, u = first, nbytes = 0, taken = 0, n_ev = 0, n_read = 0;
    long long bytes_read = 0;
    int why = 0, filtered = 0;
    if (PyObject_GetBuffer(wanted_o, &wv, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(check_o, &cv, PyBUF_SIMPLE) < 0
        || PyObject_GetBuffer(eidx_o, &iv, PyBUF_WRITABLE) < 0 || PyObject_GetBuffer(ecode_o, &ev, PyBUF_WRITABLE) < 0)
        goto done;
    if (wv.len != nunits || cv.len != nunits || iv.len < nunits * 4 || ev.len < nunits * 4) {
        PyErr_SetString(PyExc_ValueError, "scan_records: wanted and check need a byte per unit, ev_idx and "
                                          "ev_code an int32 per unit");
        goto done;
    }
    if (PyTuple_GET_SIZE(names) > MAX_KEYS) {
        PyErr_Format(PyExc_ValueError, "scan_records: at most %d names", MAX_KEYS);
        goto done;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, k))) {
            PyErr_SetString(PyExc_TypeError, "scan_records: names must be bytes");
            goto done;
        }
    if (PyObject_GetBuffer(mm, &mv, PyBUF_SIMPLE) < 0)
        goto done;
    const unsigned char *units = uv.buf, *base = mv.buf, *wanted = wv.buf, *check = cv.buf;
    int32_t *ev_idx = iv.buf, *ev_code = ev.buf;
    if (limit > file_start + mv.len)
        limit = file_start + mv.len;
    /* A unit to evaluate needs its head and properties; its body only if it passes (the CRC, the copy). */
    Py_ssize_t pf = first;
    for (int k = 0; k < PREFETCH_AHEAD; k++)
        pf = prefetch_next(units, wanted, check, verify, pf, nunits, base, file_start, limit);
    for (; u < nunits; u++) {
        if (!wanted[u])
            continue;
        pf = prefetch_next(units, wanted, check, verify, pf, nunits, base, file_start, limit);
        const unsigned char *unit = units + u * CQ_UNIT_SIZE;
        int64_t at = (int64_t)get_u64(unit);
        int32_t size = (int32_t)get_u32(unit + 8);
        if (have + taken > 0 && total + nbytes + size > max_bytes) {
            why = 2;
            break;
        }
        if (left == 0 && check[u]) {
            why = 6;
            break;
        }
        if (size <= 0 || at < clog_min || at < file_start || at + size > limit) {
            why = 3;
            break;
        }
        const unsigned char *r = base + (at - file_start);
        int32_t body_len = 0;
        Py_ssize_t body = 0;
        if (verify) {
            body = record_shape_ok(r, size, at, &body_len);
            int ok = body ? (check[u] ? 1 : record_crc_ok(r, body, body_len, crc32)) : 0;
            if (ok < 0)
                goto done;
            if (!ok) {
                why = 4;
                break;
            }
        }
        long code = 1; /* the verdict: a unit not to be evaluated is taken as it is */
        if (check[u]) {
            V4Tail tail;
            if (size < MIN_RECORD_SIZE || get_u32(r) != (uint32_t)size || get_u32(r + 4) != MAGIC_V1
                || (get_u32(r + POS_SYSFLAG) & HOST_V6_BITS) || !v4_tail(r, size, &tail)) {
                why = 5;
                break;
            }
            int ok = utf8_ok(r + tail.tpos + 1, tail.tlen);
            if (ok > 0)
                ok = utf8_ok(r + tail.ppos + 2, tail.plen);
            if (ok < 0)
                goto done;
            if (!ok) {
                why = 5;
                break;
            }
            if (values_key(&key, r + tail.ppos + 2, tail.plen, names) < 0)
                goto done;
            if (verdict_of(cache, &key, PyTuple_GET_SIZE(names), judge, INT32_MIN, INT32_MAX, NULL,
                           PyExc_OverflowError, "scan_records", &code) < 0)
                goto done;
            /* To be served: only now the body CRC. A record turned down is never served, and the CRC does
             * not cover the properties judged. A bad one goes to the Python step unjudged, which says why. */
            if (code == 1 && verify) {
                ok = record_crc_ok(r, body, body_len, crc32);
                if (ok < 0)
                    goto done;
                if (!ok) {
                    why = 4;
                    break;
                }
            }
            if (left > 0)
                left--;
            ev_idx[n_ev] = (int32_t)u;
            ev_code[n_ev++] = (int32_t)code;
        }
        n_read++;
        bytes_read += size;
        if (code != 1) {
            filtered = 1;
            continue;
        }
        int64_t pair[2] = {at, size};
        if (buf_add(&runs, pair, sizeof pair) < 0 || append_int(qoffs, base_qoff + u) < 0
            || append_int(physl, at) < 0 || append_int(sizesl, size) < 0)
            goto done;
        nbytes += size;
        taken++;
        if (have + taken >= max_msgs) {
            why = 1;
            u++;
            break;
        }
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, nbytes);
    if (data == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(data);
    const int64_t *pairs = (const int64_t *)runs.data;
    for (Py_ssize_t k = 0; k < taken; k++) {
        memcpy(w, base + (pairs[2 * k] - file_start), (size_t)pairs[2 * k + 1]);
        w += pairs[2 * k + 1];
    }
    out = Py_BuildValue("(NniLNnnL)", data, u, why, left, PyBool_FromLong(filtered), n_ev, n_read, bytes_read);
done:
    PyMem_Free(runs.data);
    PyMem_Free(key.data);
    if (mv.obj)
        PyBuffer_Release(&mv);
    if (ev.obj)
        PyBuffer_Release(&ev);
    if (iv.obj)
        PyBuffer_Release(&iv);
    if (cv.obj)
        PyBuffer_Release(&cv);
    if (wv.obj)
        PyBuffer_Release(&wv);
    PyBuffer_Release(&uv);
    return out;
}

PyDoc_STRVAR(props_rows_doc,
"props_rows(props, names, verdicts, judge, rows) -> list\n\n"
"Dispatch's bitmaps (broker/bitmap.py): for each encoded properties text of the list ``props`` (str), the\n"
"values of ``names`` (as scan_records reads them) looked up in ``verdicts`` (a verdict_cache; on a miss\n"
"``judge(values)`` gives an index into the list ``rows``, kept there), and the item of ``rows`` it names.");

static PyObject *props_rows(PyObject *self, PyObject *args)
{
    PyObject *props, *names, *verdicts, *judge, *rows;
    if (!PyArg_ParseTuple(args, "O!O!OOO!:props_rows", &PyList_Type, &props, &PyTuple_Type, &names, &verdicts,
                          &judge, &PyList_Type, &rows))
        return NULL;
    if (PyTuple_GET_SIZE(names) > MAX_KEYS) {
        PyErr_Format(PyExc_ValueError, "props_rows: at most %d names", MAX_KEYS);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, k))) {
            PyErr_SetString(PyExc_TypeError, "props_rows: names must be bytes");
            return NULL;
        }
    }
    Verdicts *cache = PyCapsule_GetPointer(verdicts, VERDICTS);
    if (cache == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(props);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    Buf key = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(props)) { /* judge cut the list short */
            PyErr_SetString(PyExc_RuntimeError, "props_rows: props changed size during the call");
            goto fail;
        }
        PyObject *s = PyList_GET_ITEM(props, i);
        if (!PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "props_rows: props must be str");
            goto fail;
        }
        Py_ssize_t plen;
        const char *p = PyUnicode_AsUTF8AndSize(s, &plen);
        if (p == NULL || values_key(&key, (const unsigned char *)p, plen, names) < 0)
            goto fail;
        long code;
        if (verdict_of(cache, &key, PyTuple_GET_SIZE(names), judge, 0, INT32_MAX, rows, PyExc_IndexError,
                       "props_rows", &code) < 0)
            goto fail;
        if (code >= PyList_GET_SIZE(rows)) { /* a cached index, rows since cut short */
            PyErr_SetString(PyExc_IndexError, "props_rows: a cached verdict is not an index of rows");
            goto fail;
        }
        PyList_SET_ITEM(out, i, Py_NewRef(PyList_GET_ITEM(rows, code)));
    }
    PyMem_Free(key.data);
    return out;
fail:
    PyMem_Free(key.data);
    Py_DECREF(out);
    return NULL;
}

PyMethodDef sluice_props_methods[] = {
    {"props_rows", (PyCFunction)props_rows, METH_VARARGS, props_rows_doc},
    {"scan_records", (PyCFunction)scan_records, METH_VARARGS, scan_records_doc},
    {"verdict_cache", (PyCFunction)verdict_cache, METH_O, verdict_cache_doc},
    {"verdict_cache_len", (PyCFunction)verdict_cache_len, METH_O, verdict_cache_len_doc},
    {NULL, NULL, 0, NULL},
};
