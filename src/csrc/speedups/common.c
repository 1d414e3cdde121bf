/* Helpers the other files share: buffers, list appends, the body CRC, the record head, properties. */
#include "speedups.h"
#include <structmember.h>

PyObject *s_topic, *s_queue_id, *s_body, *s_properties, *s_flag, *s_sysflag, *s_born_timestamp, *s_born_host,
    *s_reconsume_times, *s_prepared_tx_offset, *s_TAGS, *s_KEYS, *s_UNIQ_KEY;

int sluice_intern_names(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1
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
    return 0;
}

int buf_reserve(Buf *b, Py_ssize_t more)
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

/* Append ``o`` (a new reference, or NULL after an error) to ``list`` and drop it: 0, or -1 on error. */
int append_new(PyObject *list, PyObject *o)
{
    if (o == NULL)
        return -1;
    int rc = PyList_Append(list, o);
    Py_DECREF(o);
    return rc;
}

int append_int(PyObject *list, long long v) { return append_new(list, PyLong_FromLongLong(v)); }

/* RocketMQ's body CRC (CRC32 & 0x7FFFFFFF) of p[0:n] through ``crc32`` (ISA-L's, or zlib's): 0 and
 * ``*out`` set, or -1 with the callable's error. */
int body_crc(PyObject *crc32, const unsigned char *p, Py_ssize_t n, uint32_t *out)
{
    PyObject *mv = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
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
    *out = (uint32_t)v & 0x7FFFFFFFu;
    return 0;
}

/* The HEAD_V4 bytes before the body of a record with IPv4 hosts (sluice.format's layout); queue
 * offset, physical offset and store timestamp are zero: CommitLog.append patches them in. */
void write_head(unsigned char *p, Py_ssize_t size, uint32_t crc, int64_t queue_id, int32_t flag,
                       int32_t sysflag, int64_t born_ts, const unsigned char *born, const unsigned char *store,
                int32_t reconsume, int64_t prepared, Py_ssize_t body_len)
{
    put_u32(p, (uint32_t)size);
    put_u32(p + 4, MAGIC_V1);
    put_u32(p + POS_BODYCRC, crc);
    put_u32(p + POS_QUEUEID, (uint32_t)queue_id);
    put_u32(p + POS_FLAG, (uint32_t)flag);
    memset(p + POS_QUEUEOFFSET, 0, 16); /* queue offset, physical offset */
    put_u32(p + POS_SYSFLAG, (uint32_t)sysflag);
    put_u64(p + POS_BORNTIMESTAMP, (uint64_t)born_ts);
    memcpy(p + POS_BORNHOST, born, HOST_V4_SIZE);
    memset(p + POS_STORETIMESTAMP_V4, 0, 8);
    memcpy(p + POS_STOREHOST_V4, store, HOST_V4_SIZE);
    put_u32(p + POS_RECONSUMETIMES_V4, (uint32_t)reconsume);
    put_u64(p + POS_RECONSUMETIMES_V4 + 4, (uint64_t)prepared);
    put_u32(p + POS_BODYLENGTH_V4, (uint32_t)body_len);
}

/* The bytes after write_head's: the body, ``topic_part`` (the topic with its length byte), the 2-byte
 * properties length and the properties, given in two parts (a batch's inherited ones, then the
 * message's own; either may be empty). */
void write_tail(unsigned char *p, const unsigned char *body, Py_ssize_t body_len, const unsigned char *topic_part,
                Py_ssize_t topic_part_len, const unsigned char *props_a, Py_ssize_t len_a,
                const unsigned char *props_b, Py_ssize_t len_b)
{
    memcpy(p, body, (size_t)body_len);
    p += body_len;
    memcpy(p, topic_part, (size_t)topic_part_len);
    p += topic_part_len;
    put_u16(p, (uint32_t)(len_a + len_b));
    if (len_a)
        memcpy(p + 2, props_a, (size_t)len_a);
    if (len_b)
        memcpy(p + 2 + len_a, props_b, (size_t)len_b);
}

/* A hash of ``n`` bytes: eight bytes a step (a multiply and shifts per word, as in splitmix64's finaliser),
 * never 0. */
uint64_t bytes_hash(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, p + i, (size_t)(n - i));
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
    }
    h = (h ^ (h >> 30)) * 0x94D049BB133111EBULL;
    h ^= h >> 31;
    return h ? h : 1;
}

/* Property strings seen lately, by content: every message of a pull or a batch carries the same few names
 * (TAGS, UNIQ_KEY, the application's own) and mostly the same short values (a tag, a region, "true"), so a
 * hit hands out the str made before instead of allocating one (and, for a name, looking it up in the
 * interpreter's interned table). Direct-mapped, only for ASCII text; a slot holds one strong reference, and
 * the GIL, held by every caller, guards the table. A cached str is shared by the dicts that use it, which
 * is safe: str is immutable. */
#define PCACHE_SLOTS 512
#define PCACHE_NAME_MAX 32  /* longer names are made and interned as before */
#define PCACHE_VALUE_MAX 16 /* longer values (ids, keys, times) rarely repeat: made every time */
static PyObject *pcache[PCACHE_SLOTS];

/* ``s[start:end]`` of an ASCII str ``s``, from the cache when an equal one is there; a name is interned. */
static PyObject *cached_ascii(PyObject *s, Py_ssize_t start, Py_ssize_t end, int name)
{
    const unsigned char *p = (const unsigned char *)PyUnicode_DATA(s) + start;
    Py_ssize_t len = end - start;
    /* + name: a name and an equal value take different slots (a name must be the interned one) */
    PyObject **slot = &pcache[(bytes_hash(p, len) + (uint64_t)name) & (PCACHE_SLOTS - 1)];
    PyObject *c = *slot;
    if (c != NULL && PyUnicode_GET_LENGTH(c) == len && memcmp(PyUnicode_DATA(c), p, (size_t)len) == 0
        && (!name || PyUnicode_CHECK_INTERNED(c)))
        return Py_NewRef(c);
    PyObject *o = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, p, len);
    if (o == NULL)
        return NULL;
    if (name)
        PyUnicode_InternInPlace(&o);
    Py_XSETREF(*slot, Py_NewRef(o));
    return o;
}

/* Split ``name \x01 value \x02`` pairs of ``s`` into ``d``; a part shorter than 3 characters, or with no
 * \x01, an empty name or an empty value, is dropped (sluice.protocol.properties.decode_properties). */
int props_into(PyObject *d, PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), pos = 0;
    /* ASCII text: memchr finds the separators, and the strings come from the cache */
    const char *a = PyUnicode_IS_ASCII(s) ? (const char *)PyUnicode_DATA(s) : NULL;
    while (pos < n) {
        Py_ssize_t end, sep;
        if (a != NULL) {
            const char *e = memchr(a + pos, 2, (size_t)(n - pos));
            end = e != NULL ? e - a : n;
        } else {
            end = PyUnicode_FindChar(s, 2, pos, n, 1);
            if (end == -2)
                return -1;
            if (end == -1)
                end = n;
        }
        if (end - pos >= 3) {
            if (a != NULL) {
                const char *e = memchr(a + pos, 1, (size_t)(end - pos));
                sep = e != NULL ? e - a : -1;
            } else {
                sep = PyUnicode_FindChar(s, 1, pos, end, 1);
                if (sep == -2)
                    return -1;
            }
            if (sep > pos && sep < end - 1) {
                PyObject *name;
                if (a != NULL && sep - pos <= PCACHE_NAME_MAX)
                    name = cached_ascii(s, pos, sep, 1); /* interned */
                else if ((name = PyUnicode_Substring(s, pos, sep)) != NULL)
                    PyUnicode_InternInPlace(&name); /* a handful of names repeat on every message */
                if (name == NULL)
                    return -1;
                PyObject *value = a != NULL && end - sep - 1 <= PCACHE_VALUE_MAX ? cached_ascii(s, sep + 1, end, 0)
                                                                                 : PyUnicode_Substring(s, sep + 1, end);
                if (value == NULL) {
                    Py_DECREF(name);
                    return -1;
                }
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

/* The instance offset of ``cls``'s writable object slot ``name`` (the member descriptor __slots__ makes), found
 * as attribute lookup finds it (the MRO's first); -1 for anything else. The functions that fill a slots class's
 * fields directly (a frozen dataclass's __init__ would refuse) find them here. No error is set. */
Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *d = _PyType_Lookup(cls, name); /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY))
        return -1;
    return m->offset;
}

/* slot_offset of each of ``names`` into ``out``, for a GC'd class without a __dict__: 1, or 0 for any other
 * layout (no error set). */
int slot_layout(PyTypeObject *cls, const char *const *names, int n, Py_ssize_t *out)
{
    if (cls->tp_dictoffset != 0 || !PyType_HasFeature(cls, Py_TPFLAGS_HAVE_GC))
        return 0;
    for (int i = 0; i < n; i++) {
        PyObject *name = PyUnicode_InternFromString(names[i]);
        if (name == NULL) {
            PyErr_Clear();
            return 0;
        }
        out[i] = slot_offset(cls, name);
        Py_DECREF(name);
        if (out[i] < 0)
            return 0;
    }
    return 1;
}
