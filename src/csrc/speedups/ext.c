/* Consume-queue ext units: read for a pull (ext_gather: the heads and bitmaps of a window's units, one pass in
 * C instead of some twenty numpy calls, store/consumequeue_ext.py get_many) and packed for dispatch's batch
 * write (ext_pack, put_many: one call instead of a structured array filled column by column). */
#include "speedups.h"

/* An ext unit: size (int16), tags code (int64), store time (int64), bitmap length (int16), the bitmap. */
#define EXT_MIN_UNIT 20

static int writable(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, Py_ssize_t n, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->len != itemsize * n) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, not %zd", what, b->len, itemsize * n);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(ext_gather_doc,
"ext_gather(mm, file_start, file_size, write_off, offs, tags, times, lengths, valid, bitmaps, width) -> int\n\n"
"ConsumeQueueExt.get_many over one ext file: ``mm`` is the file mapped, starting at ext offset ``file_start``,\n"
"``file_size`` bytes; units end at ext offset ``write_off``. ``offs`` holds the wanted units' ext offsets\n"
"(int64, undecorated; rows whose offset is not in this file are left alone). For each sound unit (the same\n"
"checks as get: bitmap length >= 0, size == 20 + length, inside the file and below write_off) its row of\n"
"``tags``/``times`` (int64), ``lengths`` (int32) and ``valid`` (bool) is set. With ``bitmaps`` (uint8, rows\n"
"of ``width``) given, each sound unit's bitmap is copied into its row (``width`` at least its length);\n"
"without, nothing is copied. Returns the longest bitmap length met (0 when none).");

static PyObject *ext_gather(PyObject *self, PyObject *args)
{
    Py_buffer mv, ov, tv = {0}, sv = {0}, lv = {0}, vv = {0}, bv = {0};
    long long file_start, file_size, write_off;
    Py_ssize_t width;
    PyObject *tags, *times, *lengths, *valid, *bitmaps;
    if (!PyArg_ParseTuple(args, "y*LLLy*OOOOOn:ext_gather", &mv, &file_start, &file_size, &write_off, &ov, &tags,
                          &times, &lengths, &valid, &bitmaps, &width))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = ov.len / 8;
    if (ov.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "offs must hold int64 values");
        goto done;
    }
    if (writable(tags, &tv, 8, n, "tags") < 0 || writable(times, &sv, 8, n, "times") < 0
        || writable(lengths, &lv, 4, n, "lengths") < 0 || writable(valid, &vv, 1, n, "valid") < 0)
        goto done;
    if (bitmaps != Py_None && (width < 0 || writable(bitmaps, &bv, 1, n * width, "bitmaps") < 0)) {
        if (width < 0)
            PyErr_SetString(PyExc_ValueError, "width must not be negative");
        goto done;
    }
    const unsigned char *mm = mv.buf;
    long long fs = file_size < (long long)mv.len ? file_size : (long long)mv.len;
    const int64_t *offs = ov.buf;
    int64_t *t = tv.buf, *st = sv.buf;
    int32_t *len = lv.buf;
    unsigned char *ok = vv.buf, *bm = bv.buf;
    long long longest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long off = offs[i];
        if (off < file_start || off >= file_start + fs)
            continue;
        long long pos = off - file_start;
        if (pos + EXT_MIN_UNIT > fs || off + EXT_MIN_UNIT > write_off)
            continue;
        const unsigned char *u = mm + pos;
        int16_t size = (int16_t)get_u16(u), blen = (int16_t)get_u16(u + 18);
        if (blen < 0 || size != EXT_MIN_UNIT + blen || pos + size > fs || off + size > write_off)
            continue;
        if (bm != NULL && blen > width) {
            PyErr_Format(PyExc_ValueError, "a bitmap of %d bytes does not fit rows of %zd", (int)blen, width);
            goto done;
        }
        t[i] = (int64_t)get_u64(u + 2);
        st[i] = (int64_t)get_u64(u + 10);
        len[i] = blen;
        ok[i] = 1;
        if (bm != NULL)
            memcpy(bm + i * width, u + EXT_MIN_UNIT, (size_t)blen);
        if (blen > longest)
            longest = blen;
    }
    result = PyLong_FromLongLong(longest);
done:
    PyBuffer_Release(&mv);
    PyBuffer_Release(&ov);
    if (tv.obj) PyBuffer_Release(&tv);
    if (sv.obj) PyBuffer_Release(&sv);
    if (lv.obj) PyBuffer_Release(&lv);
    if (vv.obj) PyBuffer_Release(&vv);
    if (bv.obj) PyBuffer_Release(&bv);
    return result;
}

PyDoc_STRVAR(ext_pack_doc,
"ext_pack(tags_codes, msg_store_times, bitmaps) -> bytes | None\n\n"
"ConsumeQueueExt.put_many's units, packed back to back with their size fields left zero (put_many writes\n"
"those last): tags code and store time (int64), the bitmap length (int16) and the bitmap, big-endian. None,\n"
"for the Python twin to run and say what is wrong, when the input is not the usual: bitmaps not all bytes of\n"
"one length, columns of different lengths, a code or time that is not an int64, a bitmap over 32747 bytes.");

static PyObject *ext_pack(PyObject *self, PyObject *args)
{
    PyObject *tags_o, *times_o, *bits_o;
    if (!PyArg_ParseTuple(args, "OOO:ext_pack", &tags_o, &times_o, &bits_o))
        return NULL;
    PyObject *tags = PySequence_Fast(tags_o, "tags_codes must be a sequence");
    PyObject *times = tags ? PySequence_Fast(times_o, "msg_store_times must be a sequence") : NULL;
    PyObject *bits = times ? PySequence_Fast(bits_o, "bitmaps must be a sequence") : NULL;
    PyObject *result = NULL;
    int64_t *cols = NULL;
    if (bits == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bits);
    if (PySequence_Fast_GET_SIZE(tags) != n || PySequence_Fast_GET_SIZE(times) != n)
        goto unusual;
    PyObject **b = PySequence_Fast_ITEMS(bits), **t = PySequence_Fast_ITEMS(tags), **st = PySequence_Fast_ITEMS(times);
    Py_ssize_t blen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(b[i]) || (i > 0 && PyBytes_GET_SIZE(b[i]) != blen))
            goto unusual;
        blen = PyBytes_GET_SIZE(b[i]);
    }
    if (blen > 0x7FFF - EXT_MIN_UNIT)
        goto unusual;
    cols = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(int64_t));
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long a = PyLong_CheckExact(t[i]) ? PyLong_AsLongLong(t[i]) : -1;
        long long c = PyLong_CheckExact(st[i]) ? PyLong_AsLongLong(st[i]) : -1;
        if (!PyLong_CheckExact(t[i]) || !PyLong_CheckExact(st[i]) || PyErr_Occurred()) {
            PyErr_Clear();
            goto unusual;
        }
        cols[2 * i] = a;
        cols[2 * i + 1] = c;
    }
    Py_ssize_t size = EXT_MIN_UNIT + blen;
    result = PyBytes_FromStringAndSize(NULL, n * size);
    if (result == NULL)
        goto done;
    unsigned char *u = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++, u += size) {
        put_u16(u, 0);
        put_u64(u + 2, (uint64_t)cols[2 * i]);
        put_u64(u + 10, (uint64_t)cols[2 * i + 1]);
        put_u16(u + 18, (uint32_t)blen);
        memcpy(u + EXT_MIN_UNIT, PyBytes_AS_STRING(b[i]), (size_t)blen);
    }
    goto done;
unusual:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(cols);
    Py_XDECREF(tags);
    Py_XDECREF(times);
    Py_XDECREF(bits);
    return result;
}

PyMethodDef sluice_ext_methods[] = {
    {"ext_gather", ext_gather, METH_VARARGS, ext_gather_doc},
    {"ext_pack", ext_pack, METH_VARARGS, ext_pack_doc},
    {NULL, NULL, 0, NULL},
};
