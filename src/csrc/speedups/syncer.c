/* A thread that fdatasyncs files when asked and signals an eventfd when done, never taking the GIL
 * (store/background_flush.py, whose PySyncer is the reference).
 *
 * The broker appends on its event loop and must not wait for the disk there. A Python thread that
 * fsyncs for it needs the GIL to start each fsync and again to report it, and the loop holds the GIL
 * while it works: the fsync started only once the loop's iteration ended, and its report waited for
 * the loop again. This thread needs neither: request() wakes it at once, and its report is a write to
 * an eventfd the loop watches. */
#include "speedups.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 8 /* files one request may name: a round spans one or two commit-log segments */

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int running;  /* the thread was started and not joined yet */
    int stopping; /* close() asked the thread to end once what was asked is synced */
    int idle;     /* the thread waits for a request: only then is a signal needed */
    int notify_fd;
    long long want;  /* the highest offset asked for */
    long long taken; /* the highest offset a round started for */
    long long done;  /* the highest offset a successful round covered */
    long long failed_upto; /* the offset of the last failed round not yet taken by take_error(), or -1 */
    int failed_errno;
    int fds[MAX_FDS]; /* duplicates of the files of the newest request not yet taken (owned) */
    int nfds;
    unsigned long long rounds;
    unsigned long long sync_ns; /* time spent in fdatasync, all rounds */
} Syncer;

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void *run(void *arg)
{
    Syncer *s = arg;
    int fds[MAX_FDS];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->want <= s->taken && !s->stopping) {
            s->idle = 1;
            pthread_cond_wait(&s->cv, &s->mu);
            s->idle = 0;
        }
        if (s->want <= s->taken)
            break; /* stopping, and everything asked for had its round */
        long long w = s->want;
        int n = s->nfds;
        memcpy(fds, s->fds, sizeof(int) * (size_t)n);
        s->nfds = 0;
        s->taken = w;
        pthread_mutex_unlock(&s->mu);
        int err = 0;
        unsigned long long t0 = now_ns();
        for (int i = 0; i < n; i++) {
            int rc;
            while ((rc = fdatasync(fds[i])) < 0 && errno == EINTR)
                ;
            if (rc < 0 && err == 0)
                err = errno;
            close(fds[i]);
        }
        unsigned long long spent = now_ns() - t0;
        pthread_mutex_lock(&s->mu);
        s->sync_ns += spent;
        if (err) {
            s->failed_upto = w;
            s->failed_errno = err;
        } else if (w > s->done) {
            s->done = w;
        }
        s->rounds++;
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        while (write(s->notify_fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int Syncer_init(Syncer *s, PyObject *args, PyObject *kw)
{
    static char *names[] = {"notify_fd", NULL};
    int fd;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i:Syncer", names, &fd))
        return -1;
    if (s->running) {
        PyErr_SetString(PyExc_RuntimeError, "Syncer is initialised already");
        return -1;
    }
    s->notify_fd = fd;
    s->want = s->taken = s->done = 0;
    s->failed_upto = -1;
    s->failed_errno = 0;
    s->nfds = 0;
    s->rounds = 0;
    s->sync_ns = 0;
    s->stopping = 0;
    s->idle = 0;
    /* The thread blocks every signal (it inherits the mask it is created with): signals go to the
     * interpreter's threads, and none interrupts an fdatasync. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&s->thread, NULL, run, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
#ifdef __linux__
    pthread_setname_np(s->thread, "sluice-fsync"); /* what top and py-spy show */
#endif
    s->running = 1;
    return 0;
}

static PyObject *Syncer_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Syncer *s = (Syncer *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->running = 0;
    s->nfds = 0;
    s->failed_upto = -1;
    return (PyObject *)s;
}

static void stop(Syncer *s)
{
    if (!s->running)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(s->thread, NULL);
    Py_END_ALLOW_THREADS
    s->running = 0;
    close_fds(s->fds, s->nfds); /* none are left (the thread took every request), unless init failed */
    s->nfds = 0;
}

static void Syncer_dealloc(Syncer *s)
{
    stop(s);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

PyDoc_STRVAR(request_doc,
"request(want, fds) -> None\n\n"
"Ask that the files ``fds`` (a tuple of descriptors, duplicated here) be fdatasynced for offset ``want``.\n"
"A request not above the highest one is ignored; one not yet started is replaced by a higher one (whose\n"
"files must cover the replaced one's). Each round ends with a write of 1 to ``notify_fd``.");

static PyObject *Syncer_request(Syncer *s, PyObject *args)
{
    long long want;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "LO!:request", &want, &PyTuple_Type, &seq))
        return NULL;
    if (!s->running || s->stopping) {
        PyErr_SetString(PyExc_ValueError, "the syncer is closed");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n > MAX_FDS) {
        PyErr_Format(PyExc_ValueError, "at most %d files per request, not %zd", MAX_FDS, n);
        return NULL;
    }
    int fds[MAX_FDS];
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            close_fds(fds, (int)i);
            return NULL;
        }
        int fd = v < 0 || v > INT32_MAX ? -1 : (int)v;
        fds[i] = -1;
        if (fd < 0 || (fds[i] = dup(fd)) < 0) {
            if (fd < 0)
                errno = EBADF;
            PyErr_SetFromErrno(PyExc_OSError);
            close_fds(fds, (int)i);
            return NULL;
        }
    }
    int old[MAX_FDS], nold = 0;
    pthread_mutex_lock(&s->mu);
    if (want > s->want) {
        nold = s->nfds;
        memcpy(old, s->fds, sizeof(int) * (size_t)nold);
        memcpy(s->fds, fds, sizeof(int) * (size_t)n);
        s->nfds = (int)n;
        s->want = want;
        if (s->idle)
            pthread_cond_signal(&s->cv);
        n = 0; /* the syncer owns them now */
    }
    pthread_mutex_unlock(&s->mu);
    close_fds(old, nold);
    close_fds(fds, (int)n);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(take_error_doc,
"take_error() -> (upto, errno) | None\n\n"
"The last failed round (the offset it was for and fdatasync's errno) since the last call, or None.");

static PyObject *Syncer_take_error(Syncer *s, PyObject *unused)
{
    pthread_mutex_lock(&s->mu);
    long long upto = s->failed_upto;
    int err = s->failed_errno;
    s->failed_upto = -1;
    pthread_mutex_unlock(&s->mu);
    if (upto < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(Li)", upto, err);
}

PyDoc_STRVAR(close_doc,
"close() -> None\n\n"
"Let the thread finish the rounds asked for, then end it (the GIL is released while joining).");

static PyObject *Syncer_close(Syncer *s, PyObject *unused)
{
    stop(s);
    Py_RETURN_NONE;
}

static PyObject *Syncer_get(Syncer *s, void *which)
{
    pthread_mutex_lock(&s->mu);
    long long v = which == (void *)0 ? s->done : which == (void *)1 ? (long long)s->rounds : (long long)s->sync_ns;
    pthread_mutex_unlock(&s->mu);
    return PyLong_FromLongLong(v);
}

static PyMethodDef Syncer_methods[] = {
    {"request", (PyCFunction)Syncer_request, METH_VARARGS, request_doc},
    {"take_error", (PyCFunction)Syncer_take_error, METH_NOARGS, take_error_doc},
    {"close", (PyCFunction)Syncer_close, METH_NOARGS, close_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Syncer_getset[] = {
    {"done", (getter)Syncer_get, NULL, "the highest offset a successful round covered", (void *)0},
    {"rounds", (getter)Syncer_get, NULL, "rounds run (successful or not)", (void *)1},
    {"sync_ns", (getter)Syncer_get, NULL, "nanoseconds spent in fdatasync over all rounds", (void *)2},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SyncerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._speedups.Syncer",
    .tp_basicsize = sizeof(Syncer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Syncer(notify_fd): fdatasyncs requested files on a thread without the GIL; see the module.",
    .tp_new = Syncer_new,
    .tp_init = (initproc)Syncer_init,
    .tp_dealloc = (destructor)Syncer_dealloc,
    .tp_methods = Syncer_methods,
    .tp_getset = Syncer_getset,
};

int sluice_syncer_add(PyObject *m)
{
    if (PyType_Ready(&SyncerType) < 0)
        return -1;
    Py_INCREF(&SyncerType);
    if (PyModule_AddObject(m, "Syncer", (PyObject *)&SyncerType) < 0) {
        Py_DECREF(&SyncerType);
        return -1;
    }
    return 0;
}
