/* Filtered pulls that must evaluate a selector on each record: the records' property values, judged once per
 * distinct combination, instead of a Python step (read, decode every property, evaluate) per record. */
#include "speedups.h"

/* 1 when p[0:n] is valid UTF-8 as Python's strict decoder sees it (ASCII checked here, anything else by it),
 * 0 when not, -1 on a memory error. */
static int utf8_ok(const unsigned char *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
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

/* The value of property ``name`` (``nlen`` bytes) in the properties text p[0:n], as decode_properties reads
 * it: parts split on 0x02, name and value split on the part's first 0x01, both non-empty; a later part of
 * the same name wins (0x01 and 0x02 never occur inside a multi-byte UTF-8 character, so bytes split as
 * characters do). 1 with ``*v``/``*vlen`` set, or 0 when absent. */
static int prop_value(const unsigned char *p, Py_ssize_t n, const char *name, Py_ssize_t nlen,
                      const unsigned char **v, Py_ssize_t *vlen)
{
    int found = 0;
    Py_ssize_t pos = 0;
    while (pos < n) {
        const unsigned char *e = memchr(p + pos, 2, (size_t)(n - pos));
        Py_ssize_t end = e ? e - p : n;
        if (end - pos > nlen + 1 && p[pos + nlen] == 1 && memcmp(p + pos, name, (size_t)nlen) == 0
            && memchr(p + pos, 1, (size_t)nlen) == NULL) {
            *v = p + pos + nlen + 1;
            *vlen = end - pos - nlen - 1;
            found = 1;
        }
        pos = end + 1;
    }
    return found;
}

/* The key of a record's values (per name: 0xFF for absent, else a 4-byte length and the bytes) into ``key``;
 * 0, or -1 on a memory error. */
static int values_key(Buf *key, const unsigned char *props, Py_ssize_t plen, PyObject *names)
{
    key->len = 0;
    Py_ssize_t nk = PyTuple_GET_SIZE(names);
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject *nm = PyTuple_GET_ITEM(names, k);
        const unsigned char *v;
        Py_ssize_t vlen;
        if (!prop_value(props, plen, PyBytes_AS_STRING(nm), PyBytes_GET_SIZE(nm), &v, &vlen)) {
            unsigned char absent = 0xFF;
            if (buf_add(key, &absent, 1) < 0)
                return -1;
            continue;
        }
        unsigned char len[5] = {0};
        put_u32(len + 1, (uint32_t)vlen);
        if (buf_add(key, len, 5) < 0 || buf_add(key, v, vlen) < 0)
            return -1;
    }
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

PyDoc_STRVAR(scan_records_doc,
"scan_records(units, first, wanted, check, mm, file_start, limit, clog_min, max_msgs, max_bytes, have, total,\n"
"             left, verify, crc32, base_qoff, qoffs, phys, sizes, names, verdicts, judge, ev_idx, ev_code)\n"
"  -> (data: bytes, stop: int, why: int, left: int, filtered: bool, n_ev: int, n_read: int, bytes_read: int)\n\n"
"sluice.store.pull_read.PullReader._read_each's loop over one mapped commit-log file ``mm`` (log offset\n"
"``file_start``, data below ``limit``), from unit ``first`` of ``units`` (20-byte big-endian consume-queue\n"
"units) over the units whose ``wanted`` byte is set. A unit whose ``check`` byte is set is evaluated: the\n"
"values of the properties ``names`` (a tuple of UTF-8 bytes) are read from its record and looked up in\n"
"``verdicts`` (a dict; on a miss ``judge(values)`` (a tuple of str or None) gives the verdict, stored\n"
"there): 1 passes, anything else does not. Each evaluated unit's index and verdict go to ``ev_idx`` and\n"
"``ev_code`` (int32 buffers, one slot per unit). ``have``/``total`` are the records and bytes already taken,\n"
"``left`` the evaluations left (-1: no bound). Taken records are listed in ``qoffs``/``phys``/``sizes`` and\n"
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
    if (!PyArg_ParseTuple(args, "y*nOOOLLLLLLLLpOLO!O!O!O!O!OOO:scan_records", &uv, &first, &wanted_o, &check_o, &mm,
                          &file_start, &limit, &clog_min, &max_msgs, &max_bytes, &have, &total, &left, &verify,
                          &crc32, &base_qoff, &PyList_Type, &qoffs, &PyList_Type, &physl, &PyList_Type, &sizesl,
                          &PyTuple_Type, &names, &PyDict_Type, &verdicts, &judge, &eidx_o, &ecode_o))
        return NULL;
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
    for (; u < nunits; u++) {
        if (!wanted[u])
            continue;
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
        if (verify) {
            int ok = record_ok(r, size, at, crc32);
            if (ok < 0)
                goto done;
            if (!ok) {
                why = 4;
                break;
            }
        }
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
            PyObject *kb = PyBytes_FromStringAndSize((const char *)key.data, key.len);
            if (kb == NULL)
                goto done;
            PyObject *verdict = PyDict_GetItemWithError(verdicts, kb); /* borrowed */
            if (verdict == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(kb);
                    goto done;
                }
                PyObject *vals = key_values(key.data, key.len, PyTuple_GET_SIZE(names));
                PyObject *got = vals ? PyObject_CallOneArg(judge, vals) : NULL;
                Py_XDECREF(vals);
                if (got == NULL || PyDict_SetItem(verdicts, kb, got) < 0) {
                    Py_XDECREF(got);
                    Py_DECREF(kb);
                    goto done;
                }
                verdict = got;
                Py_DECREF(got); /* the dict holds it */
            }
            Py_DECREF(kb);
            long code = PyLong_AsLong(verdict);
            if (code == -1 && PyErr_Occurred())
                goto done;
            n_read++;
            bytes_read += size;
            if (left > 0)
                left--;
            ev_idx[n_ev] = (int32_t)u;
            ev_code[n_ev] = (int32_t)code;
            n_ev++;
            if (code != 1) {
                filtered = 1;
                continue;
            }
        } else {
            n_read++;
            bytes_read += size;
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

PyMethodDef sluice_props_methods[] = {
    {"scan_records", (PyCFunction)scan_records, METH_VARARGS, scan_records_doc},
    {NULL, NULL, 0, NULL},
};
