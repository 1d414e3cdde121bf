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
"one length, columns of different lengths or not lists, a code or time that is not an int64, a bitmap\n"
"over 32747 bytes.");

static PyObject *ext_pack(PyObject *self, PyObject *args)
{
    PyObject *tags, *times, *bits;
    if (!PyArg_ParseTuple(args, "OOO:ext_pack", &tags, &times, &bits))
        return NULL;
    if (!PyList_CheckExact(tags) || !PyList_CheckExact(times) || !PyList_CheckExact(bits))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(bits);
    if (n == 0 || PyList_GET_SIZE(tags) != n || PyList_GET_SIZE(times) != n
        || !PyBytes_CheckExact(PyList_GET_ITEM(bits, 0)))
        Py_RETURN_NONE;
    Py_ssize_t blen = PyBytes_GET_SIZE(PyList_GET_ITEM(bits, 0));
    if (blen > 0x7FFF - EXT_MIN_UNIT)
        Py_RETURN_NONE;
    Py_ssize_t size = EXT_MIN_UNIT + blen;
    /* Packed while checked: the bytes are this call's own until it returns them, so a unit found unusual
     * half way only drops them. */
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * size);
    if (out == NULL)
        return NULL;
    unsigned char *u = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, u += size) {
        PyObject *b = PyList_GET_ITEM(bits, i), *t = PyList_GET_ITEM(tags, i), *st = PyList_GET_ITEM(times, i);
        if (!PyBytes_CheckExact(b) || PyBytes_GET_SIZE(b) != blen || !PyLong_CheckExact(t) || !PyLong_CheckExact(st))
            goto unusual;
        long long code = PyLong_AsLongLong(t);
        if (code == -1 && PyErr_Occurred())
            goto unusual;
        long long when = PyLong_AsLongLong(st);
        if (when == -1 && PyErr_Occurred())
            goto unusual;
        put_u16(u, 0);
        put_u64(u + 2, (uint64_t)code);
        put_u64(u + 10, (uint64_t)when);
        put_u16(u + 18, (uint32_t)blen);
        memcpy(u + EXT_MIN_UNIT, PyBytes_AS_STRING(b), (size_t)blen);
    }
    return out;
unusual:
    PyErr_Clear(); /* an int outside int64: the twin raises it */
    Py_DECREF(out);
    Py_RETURN_NONE;
}

PyMethodDef sluice_ext_methods[] = {
    {"ext_gather", ext_gather, METH_VARARGS, ext_gather_doc},
    {"ext_pack", ext_pack, METH_VARARGS, ext_pack_doc},
    {NULL, NULL, 0, NULL},
};
