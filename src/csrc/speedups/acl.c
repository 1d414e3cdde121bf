/* RocketMQ's request signature in one call (sluice/acl/signature.py; AclClientRPCHook.java, AclUtils.java):
 * the extField values sorted by key, then the body, through HMAC-SHA1 from precomputed pads, base64.
 * The hashing is done by the pads' own hashlib objects (OpenSSL), called from here: what this saves is the
 * dozen Python-level steps around them, paid on every signed request by client and server alike. */
#include "speedups.h"

#define MAX_FIELDS 64 /* more extFields than any request has: the Python twin handles it */

typedef struct {
    const char *key;
    Py_ssize_t klen;
    const char *val;
    Py_ssize_t vlen;
} Field;

static PyObject *s_copy, *s_update, *s_digest;

static int intern_names(void)
{
    if (s_copy != NULL)
        return 0;
    s_update = PyUnicode_InternFromString("update");
    s_digest = PyUnicode_InternFromString("digest");
    s_copy = PyUnicode_InternFromString("copy"); /* last: it marks the three as made */
    return s_copy == NULL || s_update == NULL || s_digest == NULL ? -1 : 0;
}

static int key_less(const Field *a, const Field *b)
{
    Py_ssize_t n = a->klen < b->klen ? a->klen : b->klen;
    int c = memcmp(a->key, b->key, (size_t)n);
    return c < 0 || (c == 0 && a->klen < b->klen);
}

/* The signed head (values of every extField but Signature and nulls, in key order) as new bytes;
 * Py_None (a new reference) when the Python twin must render it: a key not an ASCII str (Java orders
 * by UTF-16 code units), a value not a str (Java's String.valueOf), a value UTF-8 cannot encode. */
static PyObject *signed_head(PyObject *ext)
{
    Field fields[MAX_FIELDS];
    Py_ssize_t n = 0, pos = 0, total = 0;
    PyObject *k, *v;
    if (!PyDict_CheckExact(ext) || PyDict_GET_SIZE(ext) > MAX_FIELDS)
        Py_RETURN_NONE;
    while (PyDict_Next(ext, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k) || !PyUnicode_IS_ASCII(k))
            Py_RETURN_NONE;
        const char *key = (const char *)PyUnicode_1BYTE_DATA(k);
        Py_ssize_t klen = PyUnicode_GET_LENGTH(k);
        if (v == Py_None || (klen == 9 && memcmp(key, "Signature", 9) == 0))
            continue;
        if (!PyUnicode_CheckExact(v))
            Py_RETURN_NONE;
        Py_ssize_t vlen;
        const char *val = PyUnicode_AsUTF8AndSize(v, &vlen);
        if (val == NULL) { /* a lone surrogate: the twin raises encode's own error */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        Field f = {key, klen, val, vlen};
        Py_ssize_t i = n++;
        for (; i > 0 && key_less(&f, &fields[i - 1]); i--) /* insertion sort: a dozen fields */
            fields[i] = fields[i - 1];
        fields[i] = f;
        total += vlen;
    }
    PyObject *head = PyBytes_FromStringAndSize(NULL, total);
    if (head == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(head);
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(p, fields[i].val, (size_t)fields[i].vlen);
        p += fields[i].vlen;
    }
    return head;
}

/* hashlib releases the GIL for an update of this many bytes or more (HASHLIB_GIL_MINSIZE). The body is fed
 * in pieces just under it, so the broker's event loop keeps the GIL for the tens of microseconds a batch
 * takes, instead of handing it to a store thread and waiting up to a switch interval to get it back (the
 * reasoning of io.c's pwrite_all). */
#define KEEP_GIL_PIECE 2047

/* ``obj``.update(``data``) in pieces of at most KEEP_GIL_PIECE bytes: 0, or -1 with the error set. */
static int update_keeping_gil(PyObject *obj, PyObject *data)
{
    if (PyBytes_CheckExact(data) && PyBytes_GET_SIZE(data) <= KEEP_GIL_PIECE) { /* the head, a small body */
        PyObject *r = PyObject_CallMethodOneArg(obj, s_update, data);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return -1;
    PyObject *update = PyObject_GetAttr(obj, s_update);
    int rc = update == NULL ? -1 : 0;
    for (Py_ssize_t at = 0; rc == 0 && at < view.len; at += KEEP_GIL_PIECE) {
        Py_ssize_t n = view.len - at < KEEP_GIL_PIECE ? view.len - at : KEEP_GIL_PIECE;
        PyObject *piece = PyMemoryView_FromMemory((char *)view.buf + at, n, PyBUF_READ);
        PyObject *r = piece == NULL ? NULL : PyObject_CallOneArg(update, piece);
        Py_XDECREF(piece);
        if (r == NULL)
            rc = -1;
        Py_XDECREF(r);
    }
    Py_XDECREF(update);
    PyBuffer_Release(&view);
    return rc;
}

/* ``pad``.copy() updated with ``a``, then ``b`` unless NULL; its digest(): new bytes, or NULL on error. */
static PyObject *hash_with(PyObject *pad, PyObject *a, PyObject *b)
{
    PyObject *h = PyObject_CallMethodNoArgs(pad, s_copy);
    if (h == NULL)
        return NULL;
    if (update_keeping_gil(h, a) < 0 || (b != NULL && update_keeping_gil(h, b) < 0)) {
        Py_DECREF(h);
        return NULL;
    }
    PyObject *d = PyObject_CallMethodNoArgs(h, s_digest);
    Py_DECREF(h);
    return d;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static PyObject *b64(const unsigned char *s, Py_ssize_t n)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n + 2) / 3 * 4);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *p++ = B64[v >> 18], *p++ = B64[(v >> 12) & 63], *p++ = B64[(v >> 6) & 63], *p++ = B64[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0);
        *p++ = B64[v >> 18], *p++ = B64[(v >> 12) & 63];
        *p++ = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        *p++ = '=';
    }
    return out;
}

PyDoc_STRVAR(acl_signature_doc,
"acl_signature(ext_fields, inner_pad, outer_pad, body) -> bytes | None\n\n"
"base64(HMAC-SHA1) over the values of ``ext_fields`` but Signature and nulls, sorted by key, then\n"
"``body`` (left out when empty or None): ``inner_pad`` and ``outer_pad`` are SHA-1 objects that have\n"
"absorbed the key's pads (RFC 2104), copied, never changed. None when the Python twin must render the\n"
"head (sluice.acl.signature).");

static PyObject *acl_signature(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "acl_signature takes ext_fields, inner_pad, outer_pad, body");
        return NULL;
    }
    if (intern_names() < 0)
        return NULL;
    PyObject *head = signed_head(args[0]);
    if (head == NULL || head == Py_None)
        return head;
    PyObject *body = args[3];
    int has_body = body == Py_None ? 0 : PyObject_IsTrue(body);
    if (has_body < 0) {
        Py_DECREF(head);
        return NULL;
    }
    PyObject *inner = hash_with(args[1], head, has_body ? body : NULL);
    Py_DECREF(head);
    if (inner == NULL)
        return NULL;
    PyObject *outer = hash_with(args[2], inner, NULL);
    Py_DECREF(inner);
    if (outer == NULL)
        return NULL;
    if (!PyBytes_Check(outer)) {
        Py_DECREF(outer);
        PyErr_SetString(PyExc_TypeError, "outer_pad.digest() did not return bytes");
        return NULL;
    }
    PyObject *sig = b64((const unsigned char *)PyBytes_AS_STRING(outer), PyBytes_GET_SIZE(outer));
    Py_DECREF(outer);
    return sig;
}

PyMethodDef sluice_acl_methods[] = {
    {"acl_signature", (PyCFunction)(void (*)(void))acl_signature, METH_FASTCALL, acl_signature_doc},
    {NULL, NULL, 0, NULL},
};
