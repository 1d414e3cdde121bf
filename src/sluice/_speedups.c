/* sluice._speedups: C twins of the per-message loops on the broker's hot paths.
 *
 * Every function here has a pure-Python reference that states the behaviour
 * (named in its docstring); property tests hold the two equal, and
 * SLUICE_NO_EXTENSIONS=1 runs everything on the Python ones. Where input is
 * anything but the usual shape (a bad message, an IPv6 host, a transactional
 * flag, ...) an encoder or decoder answers None and the caller takes the Python
 * path, which raises the precise error: this file never decides what an error
 * message says.
 *
 * Python is slow per message and fast per batch; these are the places where a
 * batch still costs a Python-level step per message (see docs/architecture.md).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------------ helpers */

static inline void put_u16(unsigned char *p, uint32_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }

static inline void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put_u64(unsigned char *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static inline uint32_t get_u32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint64_t get_u64(const unsigned char *p) { return ((uint64_t)get_u32(p) << 32) | get_u32(p + 4); }

static inline uint16_t get_u16(const unsigned char *p) { return (uint16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* A growable byte buffer. */
typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    unsigned char *d = PyMem_Realloc(b->data, (size_t)cap);
    if (d == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline int buf_add(Buf *b, const void *src, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

/* Interned attribute and property names, made once at import. */
static PyObject *s_topic, *s_queue_id, *s_body, *s_properties, *s_flag, *s_sysflag, *s_born_timestamp,
    *s_born_host, *s_reconsume_times, *s_prepared_tx_offset, *s_TAGS, *s_KEYS, *s_UNIQ_KEY;

/* ----------------------------------------------------------------------------------- decode_properties */

/* Split ``name \x01 value \x02`` pairs of ``s`` into ``d``; a part shorter than 3 characters, or with no
 * \x01, an empty name or an empty value, is dropped (sluice.protocol.properties.decode_properties). */
static int props_into(PyObject *d, PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), pos = 0;
    while (pos < n) {
        Py_ssize_t end = PyUnicode_FindChar(s, 2, pos, n, 1);
        if (end == -2)
            return -1;
        if (end == -1)
            end = n;
        if (end - pos >= 3) {
            Py_ssize_t sep = PyUnicode_FindChar(s, 1, pos, end, 1);
            if (sep == -2)
                return -1;
            if (sep > pos && sep < end - 1) {
                PyObject *name = PyUnicode_Substring(s, pos, sep);
                if (name == NULL)
                    return -1;
                PyObject *value = PyUnicode_Substring(s, sep + 1, end);
                if (value == NULL) {
                    Py_DECREF(name);
                    return -1;
                }
                PyUnicode_InternInPlace(&name); /* a handful of names repeat on every message */
                int rc = PyDict_SetItem(d, name, value);
                Py_DECREF(name);
                Py_DECREF(value);
                if (rc < 0)
                    return -1;
            }
        }
        pos = end + 1;
    }
    return 0;
}

PyDoc_STRVAR(decode_properties_doc,
"decode_properties(text: str) -> dict[str, str]\n\n"
"sluice.protocol.properties.decode_properties in C.");

static PyObject *decode_properties(PyObject *self, PyObject *s)
{
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "decode_properties takes a str, not %.80s", Py_TYPE(s)->tp_name);
        return NULL;
    }
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    if (props_into(d, s) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ---------------------------------------------------------------------------------------- decode_batch */

PyDoc_STRVAR(decode_batch_doc,
"decode_batch(data: bytes, inherited: dict | None) -> (bodies, properties, flags) | None\n\n"
"A SEND_BATCH_MESSAGE body split into columns, each message's properties decoded into a new dict that\n"
"starts as a copy of ``inherited`` (sluice.protocol.batch.decode_batch_messages). None when the body\n"
"is malformed in any way: the Python path then says how.");

#define BATCH_FIXED 22 /* totalSize, magic, bodyCRC, flag, bodyLen (4 each), propsLen (2) */

static PyObject *decode_batch(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *inherited;
    if (!PyArg_ParseTuple(args, "y*O:decode_batch", &view, &inherited))
        return NULL;
    if (inherited != Py_None && !PyDict_Check(inherited)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "inherited must be a dict or None");
        return NULL;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *bodies = PyList_New(0), *props = PyList_New(0), *flags = PyList_New(0), *out = NULL;
    if (bodies == NULL || props == NULL || flags == NULL)
        goto done;
    while (pos < end) {
        if (end - pos < BATCH_FIXED)
            goto malformed;
        int32_t total = (int32_t)get_u32(data + pos);
        int32_t flag = (int32_t)get_u32(data + pos + 12);
        int32_t body_len = (int32_t)get_u32(data + pos + 16);
        if (total < BATCH_FIXED || total > end - pos)
            goto malformed;
        Py_ssize_t body_start = pos + 20, nxt = pos + total;
        if (body_len < 0 || body_len > nxt - body_start - 2)
            goto malformed;
        Py_ssize_t props_at = body_start + body_len;
        int16_t props_len = (int16_t)get_u16(data + props_at);
        if (props_len < 0 || props_at + 2 + props_len != nxt)
            goto malformed;
        PyObject *body = PyBytes_FromStringAndSize((const char *)data + body_start, body_len);
        if (body == NULL)
            goto done;
        int rc = PyList_Append(bodies, body);
        Py_DECREF(body);
        if (rc < 0)
            goto done;
        PyObject *text = PyUnicode_DecodeUTF8((const char *)data + props_at + 2, props_len, "strict");
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto done;
            PyErr_Clear();
            goto malformed;
        }
        PyObject *d = inherited == Py_None ? PyDict_New() : PyDict_Copy(inherited);
        if (d == NULL || props_into(d, text) < 0) {
            Py_XDECREF(d);
            Py_DECREF(text);
            goto done;
        }
        Py_DECREF(text);
        rc = PyList_Append(props, d);
        Py_DECREF(d);
        if (rc < 0)
            goto done;
        PyObject *f = PyLong_FromLong(flag);
        if (f == NULL)
            goto done;
        rc = PyList_Append(flags, f);
        Py_DECREF(f);
        if (rc < 0)
            goto done;
        pos = nxt;
    }
    out = PyTuple_Pack(3, bodies, props, flags);
    goto done;
malformed:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(bodies);
    Py_XDECREF(props);
    Py_XDECREF(flags);
    PyBuffer_Release(&view);
    return out;
}

/* ---------------------------------------------------------------------------------------- encode_batch */

#define MAGIC_V1 0xDAA320A7u
#define HEAD_V4 88 /* the record's fixed part with two IPv4 hosts, body length included */
#define MAX_PROPS 32767
#define TRAN_MASK 0xC
#define HOST_V6_BITS 0x30

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
"sluice.store.encode._encode_columns in C, for messages of one topic and queue with IPv4 hosts and no\n"
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
    if (PyBytes_GET_SIZE(store_b) != 8) {
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
                    || PyBytes_GET_SIZE(PyTuple_GET_ITEM(hb, 0)) != 8) { /* IPv6: 20 bytes */
                    Py_DECREF(hb);
                    goto unusual;
                }
                Py_XSETREF(born_obj, Py_NewRef(PyTuple_GET_ITEM(hb, 0)));
                Py_DECREF(hb);
            }
            Py_XSETREF(last_host, Py_NewRef(attr));
        }
        memcpy(r->born, PyBytes_AS_STRING(born_obj), 8);
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
        PyObject *c = PyObject_CallOneArg(crc32, r->body);
        if (c == NULL)
            goto done;
        r->crc = (uint32_t)(PyLong_AsUnsignedLongMask(c) & 0x7FFFFFFFu);
        Py_DECREF(c);
        if (r->crc == (uint32_t)-1 && PyErr_Occurred())
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
        put_u32(p, (uint32_t)size);
        put_u32(p + 4, MAGIC_V1);
        put_u32(p + 8, r->crc);
        put_u32(p + 12, (uint32_t)queue_id);
        put_u32(p + 16, (uint32_t)r->flag);
        memset(p + 20, 0, 16); /* queue offset and physical offset: patched in at append */
        put_u32(p + 36, (uint32_t)r->sysflag);
        put_u64(p + 40, (uint64_t)r->born_ts);
        memcpy(p + 48, r->born, 8);
        memset(p + 56, 0, 8); /* store timestamp: patched in at append */
        memcpy(p + 64, store, 8);
        put_u32(p + 72, (uint32_t)r->reconsume);
        put_u64(p + 76, (uint64_t)r->prepared);
        put_u32(p + 84, (uint32_t)blen);
        memcpy(p + HEAD_V4, PyBytes_AS_STRING(r->body), (size_t)blen);
        unsigned char *q = p + HEAD_V4 + blen;
        memcpy(q, tp, (size_t)tlen);
        q += tlen;
        put_u16(q, (uint32_t)r->props_len);
        if (r->props_len)
            memcpy(q + 2, scratch.data + r->props_at, (size_t)r->props_len);
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
        if ((sf & TRAN_MASK) == TRAN_MASK)
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
        put_u64(p + rel + 20, (uint64_t)(first_qoff + i));
        put_u64(p + rel + 28, (uint64_t)at);
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

/* ------------------------------------------------------------------------------------ gather_records */

#define MAGIC_V2 0xDAA320ABu

/* commitlog.verify_record_bytes's checks on a record at ``rec`` of ``size`` bytes claimed to sit at
 * commit-log offset ``at``: 1 fine, 0 not, -1 error (from crc32). */
static int record_ok(const unsigned char *rec, Py_ssize_t size, int64_t at, PyObject *crc32)
{
    if (size < 8)
        return 0;
    uint32_t total = get_u32(rec), magic = get_u32(rec + 4);
    if ((magic != MAGIC_V1 && magic != MAGIC_V2) || (Py_ssize_t)total != size || size < 36)
        return 0;
    if ((int64_t)get_u64(rec + 28) != at)
        return 0;
    if (size < 40)
        return 0;
    uint32_t sysflag = get_u32(rec + 36);
    Py_ssize_t p = 48 + ((sysflag & 0x10) ? 20 : 8) + 8 + ((sysflag & 0x20) ? 20 : 8) + 12;
    if (p + 4 > size)
        return 0;
    int32_t body_len = (int32_t)get_u32(rec + p);
    if (body_len < 0 || p + 4 + body_len > size)
        return 0;
    PyObject *mv = PyMemoryView_FromMemory((char *)rec + p + 4, body_len, PyBUF_READ);
    if (mv == NULL)
        return -1;
    PyObject *c = PyObject_CallOneArg(crc32, mv);
    Py_DECREF(mv);
    if (c == NULL)
        return -1;
    unsigned long v = PyLong_AsUnsignedLongMask(c);
    Py_DECREF(c);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    return ((uint32_t)v & 0x7FFFFFFFu) == (get_u32(rec + 8) & 0x7FFFFFFFu);
}

PyDoc_STRVAR(gather_records_doc,
"gather_records(mm, file_start, limit, phys, sizes, idx, max_msgs, max_bytes, total, have, verify, crc32)\n"
"    -> (data: bytes, taken: int, why: int)\n\n"
"MessageStore._collect's loop for records no filter needs to see, over one mapped commit-log file\n"
"``mm`` that starts at log offset ``file_start`` and holds data below ``limit``. ``phys`` and ``sizes``\n"
"are the consume-queue units' int64 columns, ``idx`` (int64) the units to take, in order. Records are\n"
"taken while the next one lies in this file, ``have`` (already taken) + taken < ``max_msgs``, and, once\n"
"anything is taken, ``total`` + its size <= ``max_bytes``; with ``verify`` each must pass\n"
"verify_record_bytes's checks. ``data`` is the taken records back to back; ``taken`` how many of ``idx``\n"
"they are; ``why`` what stopped it: 0 idx exhausted, 1 max_msgs, 2 max_bytes, 3 the next record is not\n"
"in this file, 4 the next record failed verification.");

static PyObject *gather_records(PyObject *self, PyObject *args)
{
    PyObject *mm, *crc32;
    Py_buffer pv, sv, iv;
    long long file_start, limit, max_msgs, max_bytes, total, have;
    int verify;
    if (!PyArg_ParseTuple(args, "OLLy*y*y*LLLLpO:gather_records", &mm, &file_start, &limit, &pv, &sv, &iv,
                          &max_msgs, &max_bytes, &total, &have, &verify, &crc32))
        return NULL;
    PyObject *out = NULL;
    Py_buffer mv;
    int have_mv = 0;
    if (pv.len % 8 || sv.len != pv.len || iv.len % 8) {
        PyErr_SetString(PyExc_ValueError, "gather_records: phys, sizes and idx must be int64 columns");
        goto done;
    }
    if (PyObject_GetBuffer(mm, &mv, PyBUF_SIMPLE) < 0)
        goto done;
    have_mv = 1;
    const int64_t *phys = pv.buf, *sizes = sv.buf, *idx = iv.buf;
    Py_ssize_t nunits = pv.len / 8, n = iv.len / 8, taken = 0, nbytes = 0;
    int why = 0;
    if (limit > file_start + mv.len)
        limit = file_start + mv.len;
    const unsigned char *base = mv.buf;
    for (; taken < n; taken++) {
        if (have + taken >= max_msgs) {
            why = 1;
            break;
        }
        int64_t u = idx[taken];
        if (u < 0 || u >= nunits) {
            PyErr_SetString(PyExc_IndexError, "gather_records: a unit index is out of range");
            goto done;
        }
        int64_t at = phys[u], size = sizes[u];
        if ((have + taken) > 0 && total + nbytes + size > max_bytes) {
            why = 2;
            break;
        }
        if (at < file_start || size <= 0 || at + size > limit) {
            why = 3;
            break;
        }
        if (verify) {
            int ok = record_ok(base + (at - file_start), (Py_ssize_t)size, at, crc32);
            if (ok < 0)
                goto done;
            if (!ok) {
                why = 4;
                break;
            }
        }
        nbytes += (Py_ssize_t)size;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, nbytes);
    if (data == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(data);
    for (Py_ssize_t k = 0; k < taken; k++) {
        int64_t u = idx[k];
        memcpy(w, base + (phys[u] - file_start), (size_t)sizes[u]);
        w += sizes[u];
    }
    out = Py_BuildValue("(Nni)", data, taken, why);
done:
    if (have_mv)
        PyBuffer_Release(&mv);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&iv);
    return out;
}

/* -------------------------------------------------------------------------------------- gather_units */

#define PAD_SIZE 0x7FFFFFFF

static int append_int(PyObject *list, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return -1;
    int rc = PyList_Append(list, o);
    Py_DECREF(o);
    return rc;
}

PyDoc_STRVAR(gather_units_doc,
"gather_units(units, first, mm, file_start, limit, max_msgs, max_bytes, total, have, verify, crc32,\n"
"             base_qoff, qoffs, phys, sizes) -> (data: bytes, stop: int, why: int)\n\n"
"gather_records for an unfiltered pull, straight from the consume-queue units: ``units`` holds 20-byte\n"
"big-endian units (offset, size, tag code); from unit ``first`` on, units that hold no message (size\n"
"<= 0, or the padding size) are passed over and the records of the others are taken while they lie in\n"
"this file, as gather_records does. The queue offset (``base_qoff`` + unit index), commit-log offset\n"
"and size of each record taken are appended to the lists ``qoffs``, ``phys`` and ``sizes``. ``stop`` is\n"
"the unit where it stopped (the number of units when they ran out), ``why`` as gather_records's.");

static PyObject *gather_units(PyObject *self, PyObject *args)
{
    PyObject *mm, *crc32, *qoffs, *physl, *sizesl;
    Py_buffer uv, mv;
    Py_ssize_t first;
    long long file_start, limit, max_msgs, max_bytes, total, have, base_qoff;
    int verify;
    if (!PyArg_ParseTuple(args, "y*nOLLLLLLpOLO!O!O!:gather_units", &uv, &first, &mm, &file_start, &limit,
                          &max_msgs, &max_bytes, &total, &have, &verify, &crc32, &base_qoff, &PyList_Type, &qoffs,
                          &PyList_Type, &physl, &PyList_Type, &sizesl))
        return NULL;
    PyObject *out = NULL;
    if (PyObject_GetBuffer(mm, &mv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&uv);
        return NULL;
    }
    Py_ssize_t nunits = uv.len / 20, u = first, nbytes = 0, taken = 0;
    const unsigned char *units = uv.buf, *base = mv.buf;
    int why = 0;
    if (limit > file_start + mv.len)
        limit = file_start + mv.len;
    Buf runs = {NULL, 0, 0}; /* (offset, size) of each record taken, for the copy */
    for (; u < nunits; u++) {
        const unsigned char *unit = units + u * 20;
        int64_t at = (int64_t)get_u64(unit);
        int32_t size = (int32_t)get_u32(unit + 8);
        if (size <= 0 || size == PAD_SIZE)
            continue;
        if (have + taken >= max_msgs) {
            why = 1;
            break;
        }
        if ((have + taken) > 0 && total + nbytes + size > max_bytes) {
            why = 2;
            break;
        }
        if (at < file_start || at + size > limit) {
            why = 3;
            break;
        }
        if (verify) {
            int ok = record_ok(base + (at - file_start), size, at, crc32);
            if (ok < 0)
                goto done;
            if (!ok) {
                why = 4;
                break;
            }
        }
        int64_t pair[2] = {at, size};
        if (buf_add(&runs, pair, sizeof pair) < 0 || append_int(qoffs, base_qoff + u) < 0
            || append_int(physl, at) < 0 || append_int(sizesl, size) < 0)
            goto done;
        nbytes += size;
        taken++;
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
    out = Py_BuildValue("(Nni)", data, u, why);
done:
    PyMem_Free(runs.data);
    PyBuffer_Release(&mv);
    PyBuffer_Release(&uv);
    return out;
}

/* --------------------------------------------------------------------------------- encode_wire_batch */

typedef struct {
    Py_ssize_t body_at, body_len, props_at, props_len, tags_at, tags_len, keys_at, keys_len, uniq_at, uniq_len;
    int32_t flag;
    uint32_t crc;
} WireRec;

static int name_is(const unsigned char *p, Py_ssize_t n, const char *lit)
{
    size_t k = strlen(lit);
    return (size_t)n == k && memcmp(p, lit, k) == 0;
}

/* Check one message's wire properties ``p[0:n]`` are exactly what re-encoding their decoded dict would
 * store (ordered ``name \x01 value \x02`` pairs, names unique and not transient, no name of ``inh``,
 * values non-empty without \x01) and hold no delay property; note TAGS, KEYS and UNIQ_KEY. 1 yes, 0 no. */
static int canonical_props(const unsigned char *p, Py_ssize_t n, PyObject *inh_names, WireRec *r)
{
    static const char *delay[] = {"DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_MS", "TIMER_DELAY_SEC"};
    static const char transient[] = "__RMQ.TRANSIENT.";
    Py_ssize_t names_at[64], names_len[64], count = 0, pos = 0;
    r->tags_at = r->keys_at = r->uniq_at = -1;
    if (n > 0 && p[n - 1] != 2)
        return 0;
    while (pos < n) {
        const unsigned char *end = memchr(p + pos, 2, (size_t)(n - pos));
        Py_ssize_t e = end - p;
        const unsigned char *sep = memchr(p + pos, 1, (size_t)(e - pos));
        if (sep == NULL)
            return 0;
        Py_ssize_t s = sep - p, nl = s - pos, vl = e - s - 1;
        if (nl < 1 || vl < 1 || memchr(sep + 1, 1, (size_t)vl) != NULL || count == 64)
            return 0;
        const unsigned char *name = p + pos;
        if (nl >= (Py_ssize_t)(sizeof transient - 1) && memcmp(name, transient, sizeof transient - 1) == 0)
            return 0;
        for (int k = 0; k < 4; k++)
            if (name_is(name, nl, delay[k]))
                return 0;
        for (Py_ssize_t k = 0; k < count; k++)
            if (names_len[k] == nl && memcmp(p + names_at[k], name, (size_t)nl) == 0)
                return 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inh_names); k++) {
            PyObject *o = PyTuple_GET_ITEM(inh_names, k);
            if (PyBytes_GET_SIZE(o) == nl && memcmp(PyBytes_AS_STRING(o), name, (size_t)nl) == 0)
                return 0;
        }
        names_at[count] = pos;
        names_len[count++] = nl;
        if (name_is(name, nl, "TAGS")) {
            r->tags_at = s + 1;
            r->tags_len = vl;
        } else if (name_is(name, nl, "KEYS")) {
            r->keys_at = s + 1;
            r->keys_len = vl;
        } else if (name_is(name, nl, "UNIQ_KEY")) {
            r->uniq_at = s + 1;
            r->uniq_len = vl;
        }
        pos = e + 1;
    }
    return 1;
}

/* The str of p[at:at+len] (valid UTF-8 by then), or None when at < 0; appended to ``list``. */
static int append_text(PyObject *list, const unsigned char *p, Py_ssize_t at, Py_ssize_t len)
{
    if (at < 0)
        return PyList_Append(list, Py_None);
    PyObject *t = PyUnicode_DecodeUTF8((const char *)p + at, len, "strict");
    if (t == NULL)
        return -1;
    int rc = PyList_Append(list, t);
    Py_DECREF(t);
    return rc;
}

PyDoc_STRVAR(encode_wire_batch_doc,
"encode_wire_batch(data, topic_part, queue_id, sysflag, born_ts, born_host, store_host, reconsume, max_body,\n"
"                  inherited, inherited_names, crc32) -> (buf, sizes, sysflags, props, tags, keys, uniq) | None\n\n"
"A SEND_BATCH_MESSAGE body straight to commit-log records: what encode_batch gives for the messages\n"
"decode_batch_messages makes of it (sluice.store.encode.encode_batch_body), without a dict or a\n"
"StoreMessage per message. Each message's stored properties are ``inherited`` (the header's, encoded)\n"
"followed by its own wire properties, which must already be in the form re-encoding would give\n"
"(``inherited_names``, as bytes, must not recur in them). None for anything else: an empty or oversized\n"
"body, a malformed entry, non-canonical or non-UTF-8 properties, a delayed message, an IPv6 host\n"
"(``born_host``/``store_host`` are 8-byte IPv4 hosts), a transactional sysflag.");

static PyObject *encode_wire_batch(PyObject *self, PyObject *args)
{
    Py_buffer dv;
    PyObject *topic_part, *born_b, *store_b, *inh, *inh_names, *crc32;
    long long queue_id, sysflag, born_ts, reconsume, max_body;
    if (!PyArg_ParseTuple(args, "y*O!LLLO!O!LLO!O!O:encode_wire_batch", &dv, &PyBytes_Type, &topic_part, &queue_id,
                          &sysflag, &born_ts, &PyBytes_Type, &born_b, &PyBytes_Type, &store_b, &reconsume,
                          &max_body, &PyBytes_Type, &inh, &PyTuple_Type, &inh_names, &crc32))
        return NULL;
    PyObject *out = NULL, *buf = NULL, *sizes = NULL, *sysflags = NULL, *props = NULL, *tags = NULL, *keys = NULL,
             *uniq = NULL, *sf = NULL;
    Buf recs = {NULL, 0, 0};
    const unsigned char *data = dv.buf;
    Py_ssize_t end = dv.len, pos = 0, total = 0, n = 0;
    const Py_ssize_t tlen = PyBytes_GET_SIZE(topic_part), ilen = PyBytes_GET_SIZE(inh);
    const unsigned char *ib = (const unsigned char *)PyBytes_AS_STRING(inh);
    if (PyBytes_GET_SIZE(born_b) != 8 || PyBytes_GET_SIZE(store_b) != 8 || (sysflag & TRAN_MASK)
        || sysflag < INT32_MIN || sysflag > INT32_MAX || queue_id < 0 || queue_id > INT32_MAX
        || reconsume < INT32_MIN || reconsume > INT32_MAX)
        goto unusual;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(inh_names); k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(inh_names, k)))
            goto unusual;
    sysflag &= ~HOST_V6_BITS;
    while (pos < end) {
        WireRec r;
        if (end - pos < BATCH_FIXED)
            goto unusual;
        int32_t tot = (int32_t)get_u32(data + pos);
        r.flag = (int32_t)get_u32(data + pos + 12);
        int32_t blen = (int32_t)get_u32(data + pos + 16);
        if (tot < BATCH_FIXED || tot > end - pos)
            goto unusual;
        Py_ssize_t nxt = pos + tot;
        r.body_at = pos + 20;
        if (blen <= 0 || blen > max_body || blen > nxt - r.body_at - 2)
            goto unusual;
        r.body_len = blen;
        r.props_at = r.body_at + blen + 2;
        int16_t plen = (int16_t)get_u16(data + r.props_at - 2);
        if (plen < 0 || r.props_at + plen != nxt || ilen + plen > MAX_PROPS)
            goto unusual;
        r.props_len = plen;
        if (!canonical_props(data + r.props_at, plen, inh_names, &r))
            goto unusual;
        if (r.tags_at >= 0) r.tags_at += r.props_at;
        if (r.keys_at >= 0) r.keys_at += r.props_at;
        if (r.uniq_at >= 0) r.uniq_at += r.props_at;
        if (buf_add(&recs, &r, sizeof r) < 0)
            goto done;
        total += HEAD_V4 + blen + tlen + 2 + ilen + plen;
        n++;
        pos = nxt;
    }
    if (n == 0)
        goto unusual;
    WireRec *rs = (WireRec *)recs.data;
    props = PyList_New(n);
    if (props == NULL)
        goto done;
    Buf scratch = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) { /* UTF-8 check and the stored properties as str, first */
        scratch.len = 0;
        if (buf_add(&scratch, ib, ilen) < 0 || buf_add(&scratch, data + rs[i].props_at, rs[i].props_len) < 0) {
            PyMem_Free(scratch.data);
            goto done;
        }
        PyObject *t = PyUnicode_DecodeUTF8(scratch.len ? (const char *)scratch.data : "", scratch.len, "strict");
        if (t == NULL) {
            PyMem_Free(scratch.data);
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                goto done;
            PyErr_Clear();
            goto unusual;
        }
        PyList_SET_ITEM(props, i, t);
    }
    PyMem_Free(scratch.data);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *mv = PyMemoryView_FromMemory((char *)data + rs[i].body_at, rs[i].body_len, PyBUF_READ);
        if (mv == NULL)
            goto done;
        PyObject *c = PyObject_CallOneArg(crc32, mv);
        Py_DECREF(mv);
        if (c == NULL)
            goto done;
        rs[i].crc = (uint32_t)(PyLong_AsUnsignedLongMask(c) & 0x7FFFFFFFu);
        Py_DECREF(c);
        if (PyErr_Occurred())
            goto done;
    }
    buf = PyByteArray_FromStringAndSize(NULL, total);
    sizes = PyList_New(n);
    sysflags = PyList_New(n);
    tags = PyList_New(0);
    keys = PyList_New(0);
    uniq = PyList_New(0);
    sf = PyLong_FromLongLong(sysflag);
    if (buf == NULL || sizes == NULL || sysflags == NULL || tags == NULL || keys == NULL || uniq == NULL || sf == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyByteArray_AS_STRING(buf);
    const unsigned char *born = (const unsigned char *)PyBytes_AS_STRING(born_b);
    const unsigned char *store = (const unsigned char *)PyBytes_AS_STRING(store_b);
    const unsigned char *tp = (const unsigned char *)PyBytes_AS_STRING(topic_part);
    for (Py_ssize_t i = 0; i < n; i++) {
        const WireRec *r = &rs[i];
        Py_ssize_t size = HEAD_V4 + r->body_len + tlen + 2 + ilen + r->props_len;
        PyObject *sz = PyLong_FromSsize_t(size);
        if (sz == NULL)
            goto done;
        PyList_SET_ITEM(sizes, i, sz);
        PyList_SET_ITEM(sysflags, i, Py_NewRef(sf));
        if (append_text(tags, data, r->tags_at, r->tags_len) < 0 || append_text(keys, data, r->keys_at, r->keys_len) < 0
            || append_text(uniq, data, r->uniq_at, r->uniq_len) < 0)
            goto done;
        put_u32(w, (uint32_t)size);
        put_u32(w + 4, MAGIC_V1);
        put_u32(w + 8, r->crc);
        put_u32(w + 12, (uint32_t)queue_id);
        put_u32(w + 16, (uint32_t)r->flag);
        memset(w + 20, 0, 16);
        put_u32(w + 36, (uint32_t)sysflag);
        put_u64(w + 40, (uint64_t)born_ts);
        memcpy(w + 48, born, 8);
        memset(w + 56, 0, 8);
        memcpy(w + 64, store, 8);
        put_u32(w + 72, (uint32_t)reconsume);
        memset(w + 76, 0, 8); /* prepared transaction offset */
        put_u32(w + 84, (uint32_t)r->body_len);
        memcpy(w + HEAD_V4, data + r->body_at, (size_t)r->body_len);
        unsigned char *q = w + HEAD_V4 + r->body_len;
        memcpy(q, tp, (size_t)tlen);
        q += tlen;
        put_u16(q, (uint32_t)(ilen + r->props_len));
        memcpy(q + 2, ib, (size_t)ilen);
        memcpy(q + 2 + ilen, data + r->props_at, (size_t)r->props_len);
        w += size;
    }
    out = PyTuple_Pack(7, buf, sizes, sysflags, props, tags, keys, uniq);
    goto done;
unusual:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(buf);
    Py_XDECREF(sizes);
    Py_XDECREF(sysflags);
    Py_XDECREF(props);
    Py_XDECREF(tags);
    Py_XDECREF(keys);
    Py_XDECREF(uniq);
    Py_XDECREF(sf);
    PyMem_Free(recs.data);
    PyBuffer_Release(&dv);
    return out;
}

/* ---------------------------------------------------------------------------------- decode_messages */

/* MessageExt's fields, in the order decode_messages fills them. The class is a slots dataclass: each
 * field is a member descriptor (T_OBJECT_EX) at an offset in the instance, which C sets directly (a
 * dataclass __init__ of 17 fields is Python code, ~2 us). Any other layout: the Python path. */
static const char *ext_fields[] = {
    "topic", "body", "properties", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "offset_msg_id",
    "sysflag", "flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "body_crc", "store_size",
};
#define N_EXT_FIELDS 17
static PyTypeObject *ext_type; /* borrowed identity only, compared by pointer */
static Py_ssize_t ext_offsets[N_EXT_FIELDS];

static int ext_layout(PyTypeObject *cls)
{
    if (cls == ext_type)
        return 1;
    if (cls->tp_dictoffset != 0 || !PyType_HasFeature(cls, Py_TPFLAGS_HAVE_GC))
        return 0;
    Py_ssize_t offs[N_EXT_FIELDS];
    for (int i = 0; i < N_EXT_FIELDS; i++) {
        PyObject *d = PyDict_GetItemString(cls->tp_dict, ext_fields[i]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
            return 0;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY))
            return 0;
        offs[i] = m->offset;
    }
    memcpy(ext_offsets, offs, sizeof offs);
    ext_type = cls;
    return 1;
}

/* (ip, port) of an 8-byte IPv4 host, reusing ``*last`` when the bytes are those of the previous one. */
static PyObject *host_tuple(const unsigned char *p, unsigned char *last_bytes, PyObject **last)
{
    if (*last != NULL && memcmp(p, last_bytes, 8) == 0)
        return Py_NewRef(*last);
    PyObject *t = Py_BuildValue("(Ni)", PyUnicode_FromFormat("%u.%u.%u.%u", p[0], p[1], p[2], p[3]),
                                (int)get_u32(p + 4));
    if (t == NULL)
        return NULL;
    memcpy(last_bytes, p, 8);
    Py_XSETREF(*last, Py_NewRef(t));
    return t;
}

PyDoc_STRVAR(decode_messages_doc,
"decode_messages(body, check_crc: bool, crc32, cls, inflate) -> list | None\n\n"
"sluice.client.api.decode_messages in C: the stored records of a pull (or view, or query) body to\n"
"``cls`` (MessageExt) instances, bodies with the COMPRESSED bit passed through ``inflate``. None for\n"
"anything unusual (a record that does not decode or fails its CRC, an IPv6 host, a MAGIC_V2 record,\n"
"another class layout): the Python decoder then decodes it or says exactly what is wrong.");

static PyObject *decode_messages(PyObject *self, PyObject *args)
{
    Py_buffer bv;
    int check_crc;
    PyObject *crc32, *cls, *inflate;
    if (!PyArg_ParseTuple(args, "y*pOOO:decode_messages", &bv, &check_crc, &crc32, &cls, &inflate))
        return NULL;
    PyObject *out = NULL, *list = NULL, *last_topic = NULL, *last_born = NULL, *last_store = NULL;
    unsigned char born_bytes[8], store_bytes[8];
    Py_ssize_t last_tlen = -1;
    const unsigned char *last_tp = NULL;
    if (!PyType_Check(cls) || !ext_layout((PyTypeObject *)cls))
        goto unusual;
    list = PyList_New(0);
    if (list == NULL)
        goto done;
    const unsigned char *buf = bv.buf;
    Py_ssize_t end = bv.len, pos = 0;
    static const char hex[] = "0123456789ABCDEF";
    while (pos < end) {
        const unsigned char *r = buf + pos;
        if (end - pos < 91)
            goto unusual;
        int32_t total = (int32_t)get_u32(r);
        uint32_t magic = get_u32(r + 4), sysflag = get_u32(r + 36);
        if (magic != MAGIC_V1 || total < 91 || total > end - pos || (sysflag & HOST_V6_BITS))
            goto unusual;
        int32_t body_len = (int32_t)get_u32(r + 84);
        if (body_len < 0 || 88 + (Py_ssize_t)body_len + 3 > total)
            goto unusual;
        Py_ssize_t tpos = 88 + body_len, tlen = r[tpos];
        if (tpos + 1 + tlen + 2 > total)
            goto unusual;
        Py_ssize_t ppos = tpos + 1 + tlen, plen = get_u16(r + ppos);
        if (ppos + 2 + plen != total)
            goto unusual;
        uint32_t crc = get_u32(r + 8);
        if (check_crc) {
            PyObject *mv = PyMemoryView_FromMemory((char *)r + 88, body_len, PyBUF_READ);
            if (mv == NULL)
                goto done;
            PyObject *c = PyObject_CallOneArg(crc32, mv);
            Py_DECREF(mv);
            if (c == NULL)
                goto done;
            unsigned long v = PyLong_AsUnsignedLongMask(c);
            Py_DECREF(c);
            if (PyErr_Occurred())
                goto done;
            if (((uint32_t)v & 0x7FFFFFFFu) != crc)
                goto unusual;
        }
        PyObject *f[N_EXT_FIELDS] = {NULL};
        /* topic: the same few topics come back in every pull */
        if (last_topic == NULL || tlen != last_tlen || memcmp(last_tp, r + tpos + 1, (size_t)tlen) != 0) {
            PyObject *t = PyUnicode_DecodeUTF8((const char *)r + tpos + 1, tlen, "strict");
            if (t == NULL) {
                PyErr_Clear();
                goto unusual;
            }
            Py_XSETREF(last_topic, t);
            last_tlen = tlen;
            last_tp = r + tpos + 1;
        }
        f[0] = Py_NewRef(last_topic);
        f[1] = PyBytes_FromStringAndSize((const char *)r + 88, body_len);
        if (f[1] != NULL && (sysflag & 0x1)) { /* COMPRESSED: inflated as the producer gave it */
            PyObject *raw = f[1];
            f[1] = PyObject_CallOneArg(inflate, raw);
            Py_DECREF(raw);
        }
        PyObject *ptext = PyUnicode_DecodeUTF8((const char *)r + ppos + 2, plen, "strict");
        int bad = 0;
        if (ptext == NULL) {
            PyErr_Clear();
            bad = 1;
        } else {
            f[2] = PyDict_New();
            if (f[2] != NULL && props_into(f[2], ptext) < 0)
                Py_CLEAR(f[2]);
            Py_DECREF(ptext);
        }
        char id[32];
        for (int k = 0; k < 8; k++) { /* offset msg id: store host (ip, port) then commit-log offset */
            id[2 * k] = hex[r[64 + k] >> 4];
            id[2 * k + 1] = hex[r[64 + k] & 0xF];
            id[16 + 2 * k] = hex[r[28 + k] >> 4];
            id[16 + 2 * k + 1] = hex[r[28 + k] & 0xF];
        }
        f[7] = PyUnicode_FromStringAndSize(id, 32);
        f[3] = PyLong_FromLong((int32_t)get_u32(r + 12));
        f[4] = PyLong_FromLongLong((int64_t)get_u64(r + 20));
        f[5] = PyLong_FromLongLong((int64_t)get_u64(r + 28));
        f[8] = PyLong_FromLong((int32_t)sysflag);
        f[9] = PyLong_FromLong((int32_t)get_u32(r + 16));
        f[10] = PyLong_FromLongLong((int64_t)get_u64(r + 40));
        f[11] = host_tuple(r + 48, born_bytes, &last_born);
        f[12] = PyLong_FromLongLong((int64_t)get_u64(r + 56));
        f[13] = host_tuple(r + 64, store_bytes, &last_store);
        f[14] = PyLong_FromLong((int32_t)get_u32(r + 72));
        f[15] = PyLong_FromLong((int32_t)crc);
        f[16] = PyLong_FromLong(total);
        if (!bad && f[2] != NULL) {
            PyObject *uniq = PyDict_GetItemWithError(f[2], s_UNIQ_KEY);
            f[6] = uniq != NULL ? Py_NewRef(uniq) : (PyErr_Occurred() ? NULL : Py_NewRef(f[7]));
        }
        int missing = bad;
        for (int i = 0; i < N_EXT_FIELDS; i++)
            if (f[i] == NULL)
                missing = 1;
        PyObject *o = missing ? NULL : ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
        if (o == NULL) {
            for (int i = 0; i < N_EXT_FIELDS; i++)
                Py_XDECREF(f[i]);
            if (bad || !PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)) {
                /* a value that does not decode, or inflate failing: the Python path explains it */
                PyErr_Clear();
                goto unusual;
            }
            goto done;
        }
        for (int i = 0; i < N_EXT_FIELDS; i++)
            *(PyObject **)((char *)o + ext_offsets[i]) = f[i]; /* the new references move in */
        int rc = PyList_Append(list, o);
        Py_DECREF(o);
        if (rc < 0)
            goto done;
        pos += total;
    }
    out = Py_NewRef(list);
    goto done;
unusual:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(list);
    Py_XDECREF(last_topic);
    Py_XDECREF(last_born);
    Py_XDECREF(last_store);
    PyBuffer_Release(&bv);
    return out;
}

/* --------------------------------------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"decode_properties", decode_properties, METH_O, decode_properties_doc},
    {"decode_batch", decode_batch, METH_VARARGS, decode_batch_doc},
    {"encode_batch", encode_batch, METH_VARARGS, encode_batch_doc},
    {"index_entries", index_entries, METH_VARARGS, index_entries_doc},
    {"key_hash", key_hash, METH_VARARGS, key_hash_doc},
    {"index_put", index_put, METH_VARARGS, index_put_doc},
    {"patch_records", patch_records, METH_VARARGS, patch_records_doc},
    {"offset_msg_ids", offset_msg_ids, METH_VARARGS, offset_msg_ids_doc},
    {"gather_records", gather_records, METH_VARARGS, gather_records_doc},
    {"gather_units", gather_units, METH_VARARGS, gather_units_doc},
    {"encode_wire_batch", encode_wire_batch, METH_VARARGS, encode_wire_batch_doc},
    {"decode_messages", decode_messages, METH_VARARGS, decode_messages_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sluice._speedups",
    "C twins of Sluice's per-message hot loops; see sluice.speedups.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_topic, "topic");
    INTERN(s_queue_id, "queue_id");
    INTERN(s_body, "body");
    INTERN(s_properties, "properties");
    INTERN(s_flag, "flag");
    INTERN(s_sysflag, "sysflag");
    INTERN(s_born_timestamp, "born_timestamp");
    INTERN(s_born_host, "born_host");
    INTERN(s_reconsume_times, "reconsume_times");
    INTERN(s_prepared_tx_offset, "prepared_tx_offset");
    INTERN(s_TAGS, "TAGS");
    INTERN(s_KEYS, "KEYS");
    INTERN(s_UNIQ_KEY, "UNIQ_KEY");
#undef INTERN
    return PyModule_Create(&module);
}
