/* RocketMQ's request signature in one call (sluice/acl/signature.py; AclClientRPCHook.java, AclUtils.java):
 * the extField values sorted by key, then the body, through HMAC-SHA1 from precomputed pads, base64.
 * The hashing is OpenSSL's: libcrypto's SHA1_* on the key's padded states when the extension is linked with
 * it (acl_pads), else the pads' own hashlib objects called from here. What this saves is the Python-level
 * steps around the hashing, paid on every signed request by client and server alike. */
#include "speedups.h"

#ifdef SLUICE_HAVE_LIBCRYPTO
/* OpenSSL's SHA1_* (deprecated in 3.0 for EVP, not removed): a SHA_CTX is a plain struct, so a key's padded
 * states are copied by assignment, where hashlib's copy() and digest() each duplicate an EVP context. The
 * same libcrypto (and its SHA extensions) as hashlib's; setup.py links it when its header is there. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#endif

#define MAX_FIELDS 64 /* more extFields than any request has: the Python twin handles it */

typedef struct {
    const char *key;
    Py_ssize_t klen;
    const char *val;
    Py_ssize_t vlen;
} Field;

static PyObject *s_copy, *s_update, *s_digest, *s_access_key, *s_signature;

static int intern_names(void)
{
    if (s_copy != NULL)
        return 0;
    s_update = PyUnicode_InternFromString("update");
    s_digest = PyUnicode_InternFromString("digest");
    s_access_key = PyUnicode_InternFromString("AccessKey");
    s_signature = PyUnicode_InternFromString("Signature");
    s_copy = PyUnicode_InternFromString("copy"); /* last: it marks the names as made */
    return s_copy == NULL || s_update == NULL || s_digest == NULL || s_access_key == NULL || s_signature == NULL
        ? -1 : 0;
}

/* del ext["Signature"] if there: 0, or -1 with the error set. */
static int drop_signature(PyObject *ext)
{
    if (PyDict_DelItem(ext, s_signature) == 0)
        return 0;
    if (!PyErr_ExceptionMatches(PyExc_KeyError))
        return -1;
    PyErr_Clear();
    return 0;
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

/* hashlib releases the GIL for an update of this many bytes or more (HASHLIB_GIL_MINSIZE, 2048). The body
 * is fed in pieces under it, so the broker's event loop keeps the GIL for the tens of microseconds a batch
 * takes, instead of handing it to a store thread and waiting up to a switch interval to get it back (the
 * reasoning of io.c's pwrite_all). A whole number of SHA-1 blocks (64 bytes), so OpenSSL hashes each piece
 * in place instead of copying a partial block into its buffer between pieces. */
#define KEEP_GIL_PIECE 1984

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

/* base64 of ``n`` bytes into ``p`` ((n + 2) / 3 * 4 characters). */
static void b64_into(const unsigned char *s, Py_ssize_t n, char *p)
{
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
}

#ifdef SLUICE_HAVE_LIBCRYPTO
/* A key's padded state made by acl_pads: exactly one SHA_CTX that has absorbed whole blocks (num 0), so
 * SHA1_Update never trusts a partial-block count it did not write. NULL (no error) when ``obj`` is not one. */
static const SHA_CTX *native_state(PyObject *obj)
{
    if (!PyBytes_CheckExact(obj) || PyBytes_GET_SIZE(obj) != (Py_ssize_t)sizeof(SHA_CTX))
        return NULL;
    const SHA_CTX *ctx = (const SHA_CTX *)PyBytes_AS_STRING(obj);
    return ctx->num == 0 ? ctx : NULL;
}

/* The HMAC over head and body from native pad states, GIL held throughout (see KEEP_GIL_PIECE). */
static int native_hmac(const SHA_CTX *ipad, const SHA_CTX *opad, PyObject *head, PyObject *body,
                       unsigned char mac[20])
{
    SHA_CTX c = *ipad;
    SHA1_Update(&c, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head));
    if (body != NULL) {
        Py_buffer view;
        if (PyObject_GetBuffer(body, &view, PyBUF_SIMPLE) < 0)
            return -1;
        SHA1_Update(&c, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
    unsigned char inner[20];
    SHA1_Final(inner, &c);
    c = *opad;
    SHA1_Update(&c, inner, 20);
    SHA1_Final(mac, &c);
    return 0;
}
#endif

/* HMAC-SHA1 of the request, base64: 28 ASCII characters into ``out``. 1 when done, 0 when the Python twin
 * must render the head (nothing set), -1 on error. The pads are either acl_pads' native states or hashlib
 * SHA-1 objects (copied, never changed). */
static int signature_into(PyObject *ext, PyObject *inner_pad, PyObject *outer_pad, PyObject *body, char out[28])
{
    if (intern_names() < 0)
        return -1;
    PyObject *head = signed_head(ext);
    if (head == NULL)
        return -1;
    if (head == Py_None) {
        Py_DECREF(head);
        return 0;
    }
    int has_body = body == Py_None ? 0 : PyObject_IsTrue(body);
    if (has_body < 0) {
        Py_DECREF(head);
        return -1;
    }
#ifdef SLUICE_HAVE_LIBCRYPTO
    const SHA_CTX *ipad = native_state(inner_pad), *opad = native_state(outer_pad);
    if (ipad != NULL && opad != NULL) {
        unsigned char mac[20];
        int rc = native_hmac(ipad, opad, head, has_body ? body : NULL, mac);
        Py_DECREF(head);
        if (rc < 0)
            return -1;
        b64_into(mac, 20, out);
        return 1;
    }
#endif
    PyObject *inner = hash_with(inner_pad, head, has_body ? body : NULL);
    Py_DECREF(head);
    if (inner == NULL)
        return -1;
    PyObject *outer = hash_with(outer_pad, inner, NULL);
    Py_DECREF(inner);
    if (outer == NULL)
        return -1;
    if (!PyBytes_Check(outer) || PyBytes_GET_SIZE(outer) != 20) {
        Py_DECREF(outer);
        PyErr_SetString(PyExc_TypeError, "outer_pad.digest() did not return SHA-1's 20 bytes");
        return -1;
    }
    b64_into((const unsigned char *)PyBytes_AS_STRING(outer), 20, out);
    Py_DECREF(outer);
    return 1;
}

PyDoc_STRVAR(acl_pads_doc,
"acl_pads(key) -> (bytes, bytes) | None\n\n"
"HMAC-SHA1's inner and outer states for the secret ``key`` (bytes; hashed first when longer than a block,\n"
"RFC 2104), as OpenSSL SHA_CTX structs the other acl_ functions take in place of hashlib objects. None when\n"
"the extension was built without libcrypto (then the hashlib objects are used).");

static PyObject *acl_pads(PyObject *self, PyObject *key)
{
    if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "acl_pads takes the secret key as bytes");
        return NULL;
    }
#ifdef SLUICE_HAVE_LIBCRYPTO
    unsigned char block[64] = {0}, pad[64];
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    if (n > 64)
        SHA1((const unsigned char *)PyBytes_AS_STRING(key), (size_t)n, block);
    else
        memcpy(block, PyBytes_AS_STRING(key), (size_t)n);
    SHA_CTX ctx[2];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 64; i++)
            pad[i] = block[i] ^ (k == 0 ? 0x36 : 0x5C);
        SHA1_Init(&ctx[k]);
        SHA1_Update(&ctx[k], pad, 64);
    }
    return Py_BuildValue("(y#y#)", (const char *)&ctx[0], (Py_ssize_t)sizeof(SHA_CTX),
                         (const char *)&ctx[1], (Py_ssize_t)sizeof(SHA_CTX));
#else
    Py_RETURN_NONE;
#endif
}

PyDoc_STRVAR(acl_signature_doc,
"acl_signature(ext_fields, inner_pad, outer_pad, body) -> bytes | None\n\n"
"base64(HMAC-SHA1) over the values of ``ext_fields`` but Signature and nulls, sorted by key, then\n"
"``body`` (left out when empty or None): ``inner_pad`` and ``outer_pad`` are acl_pads' states, or SHA-1\n"
"objects that have absorbed the key's pads (RFC 2104), copied, never changed. None when the Python twin\n"
"must render the head (sluice.acl.signature).");

/* signature_into over the FASTCALL arguments (ext_fields, inner_pad, outer_pad, body) of ``name``; -1 with
 * TypeError when they are not four. */
static int signature_of_args(const char *name, PyObject *const *args, Py_ssize_t nargs, char out[28])
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s takes ext_fields, inner_pad, outer_pad, body", name);
        return -1;
    }
    return signature_into(args[0], args[1], args[2], args[3], out);
}

static PyObject *acl_signature(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    char sig[28];
    int rc = signature_of_args("acl_signature", args, nargs, sig);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(sig, 28);
}

PyDoc_STRVAR(acl_sign_doc,
"acl_sign(ext_fields, access_key, inner_pad, outer_pad, body) -> bool\n\n"
"AclClientRPCHook.doBeforeRequest in one call: drops ``Signature`` from the dict ``ext_fields``, sets\n"
"``AccessKey`` to ``access_key`` and then ``Signature`` to acl_signature's answer (as str). False when\n"
"the Python twin must sign (sluice.acl.signature.sign_fields; AccessKey set, no Signature yet).");

static PyObject *acl_sign(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "acl_sign takes ext_fields, access_key, inner_pad, outer_pad, body");
        return NULL;
    }
    PyObject *ext = args[0];
    if (!PyDict_CheckExact(ext))
        Py_RETURN_FALSE;
    if (intern_names() < 0)
        return NULL;
    if (drop_signature(ext) < 0 || PyDict_SetItem(ext, s_access_key, args[1]) < 0)
        return NULL;
    char sig[28];
    int rc = signature_into(ext, args[2], args[3], args[4], sig);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_FALSE;
    PyObject *text = PyUnicode_New(28, 127);
    if (text == NULL)
        return NULL;
    memcpy(PyUnicode_1BYTE_DATA(text), sig, 28);
    rc = PyDict_SetItem(ext, s_signature, text);
    Py_DECREF(text);
    if (rc < 0)
        return NULL;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(acl_verify_doc,
"acl_verify(ext_fields, inner_pad, outer_pad, body) -> bool | None\n\n"
"Whether ``ext_fields['Signature']`` is acl_signature's answer for this key (compared in time that depends\n"
"on the lengths only, as hmac.compare_digest); False when it is missing or not a str. None when the\n"
"Python twin must render the head.");

static PyObject *acl_verify(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    char sig[28];
    int rc = signature_of_args("acl_verify", args, nargs, sig);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        Py_RETURN_NONE;
    PyObject *given = PyDict_GetItemWithError(args[0], s_signature); /* borrowed; ext is a dict here */
    if (given == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE;
    }
    if (!PyUnicode_Check(given))
        Py_RETURN_FALSE;
    if (!PyUnicode_CheckExact(given)) /* a str subclass: the twin compares it */
        Py_RETURN_NONE;
    /* A str that is not ASCII can never equal base64; the Python twin's compare gives False for it too. */
    if (!PyUnicode_IS_ASCII(given) || PyUnicode_GET_LENGTH(given) != 28)
        Py_RETURN_FALSE;
    const unsigned char *g = PyUnicode_1BYTE_DATA(given);
    unsigned char diff = 0;
    for (int i = 0; i < 28; i++)
        diff |= (unsigned char)(g[i] ^ (unsigned char)sig[i]);
    if (diff == 0)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

PyMethodDef sluice_acl_methods[] = {
    {"acl_pads", (PyCFunction)acl_pads, METH_O, acl_pads_doc},
    {"acl_signature", (PyCFunction)(void (*)(void))acl_signature, METH_FASTCALL, acl_signature_doc},
    {"acl_sign", (PyCFunction)(void (*)(void))acl_sign, METH_FASTCALL, acl_sign_doc},
    {"acl_verify", (PyCFunction)(void (*)(void))acl_verify, METH_FASTCALL, acl_verify_doc},
    {NULL, NULL, 0, NULL},
};
