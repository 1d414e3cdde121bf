/* Writing records into a commit-log file with pwrite, keeping the GIL (store/mapped.py, FdWrittenFile). */
#include "speedups.h"

#include <errno.h>
#include <unistd.h>

PyDoc_STRVAR(pwrite_all_doc,
"pwrite_all(fd, data, offset) -> None\n\n"
"Write all of ``data`` at ``offset`` of file ``fd`` (a short write is continued), without releasing\n"
"the GIL: the write is a copy into the page cache of a few KiB, like a copy into a mapping, and\n"
"with dozens of threads waiting for the GIL, taking it back after the call costs far more than the\n"
"call. OSError on failure.");

static PyObject *pwrite_all(PyObject *self, PyObject *args)
{
    int fd;
    Py_buffer data;
    long long offset;
    if (!PyArg_ParseTuple(args, "iy*L:pwrite_all", &fd, &data, &offset))
        return NULL;
    if (offset < 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "negative offset");
        return NULL;
    }
    const char *p = data.buf;
    Py_ssize_t left = data.len;
    while (left > 0) {
        ssize_t n = pwrite(fd, p, (size_t)left, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR) {
                if (PyErr_CheckSignals() < 0)
                    goto fail;
                continue;
            }
            PyErr_SetFromErrno(PyExc_OSError);
            goto fail;
        }
        if (n == 0) {
            PyErr_SetString(PyExc_OSError, "pwrite wrote nothing");
            goto fail;
        }
        p += n;
        left -= n;
        offset += n;
    }
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&data);
    return NULL;
}

PyMethodDef sluice_io_methods[] = {
    {"pwrite_all", (PyCFunction)pwrite_all, METH_VARARGS, pwrite_all_doc},
    {NULL, NULL, 0, NULL},
};
