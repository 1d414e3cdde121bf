/* sluice._speedups: C twins of the per-message loops on the broker's hot paths (shared declarations).
 *
 * Every function of the module has a pure-Python reference that states the behaviour (named in its
 * docstring); property tests hold the two equal, and SLUICE_NO_EXTENSIONS=1 runs everything on the
 * Python ones. Where input is anything but the usual shape (a bad message, an IPv6 host, a
 * transactional flag, ...) an encoder or decoder answers None and the caller takes the Python path,
 * which raises the precise error: this code never decides what an error message says.
 *
 * Python is slow per message and fast per batch; these are the places where a batch still cost a
 * Python-level step per message (see docs/architecture.md). One file per job:
 *   batches.c  SEND_BATCH_MESSAGE bodies and message properties
 *   records.c  commit-log records on append (encoding, patching, offset message ids)
 *   index.c    key-index hashes and entries
 *   reads.c    pulls and consumers: runs of stored records, records to MessageExt
 *   props.c    filtered pulls: records' property values judged once per distinct combination
 *   syncer.c   synchronous flush: a thread that fdatasyncs without the GIL and signals an eventfd
 */
#ifndef SLUICE_SPEEDUPS_H
#define SLUICE_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The stored formats, as sluice/format.py (their owner) documents them. Every constant here is also
 * in the module's FORMAT dict (module.c), which sluice.speedups compares with sluice.format.C_FORMAT at
 * import: an extension built against another layout is refused, loudly. */
#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define BLANK_MAGIC 0xCBD43194u
#define MIN_RECORD_SIZE 91 /* IPv4 hosts, empty body, topic and properties */
#define HEAD_V4 88         /* a record's fixed part with two IPv4 hosts, body length included */
#define POS_BODYCRC 8
#define POS_QUEUEID 12
#define POS_FLAG 16
#define POS_QUEUEOFFSET 20
#define POS_PHYSICALOFFSET 28
#define POS_SYSFLAG 36
#define POS_BORNTIMESTAMP 40
#define POS_BORNHOST 48
#define POS_STORETIMESTAMP_V4 56 /* positions after the born host hold for IPv4 hosts only */
#define POS_STOREHOST_V4 64
#define POS_RECONSUMETIMES_V4 72
#define POS_BODYLENGTH_V4 84
#define HOST_V4_SIZE 8  /* address, port */
#define HOST_V6_SIZE 20
#define FLAG_COMPRESSED 0x1
#define FLAG_BORNHOST_V6 0x10
#define FLAG_STOREHOST_V6 0x20
#define HOST_V6_BITS (FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)
#define TRAN_MASK 0xC
#define TRAN_PREPARED 0x4
#define TRAN_ROLLBACK 0xC
#define MAX_PROPS 32767          /* properties length is a signed short */
#define CQ_UNIT_SIZE 20          /* consume-queue unit: offset int64, size int32, tag code int64 */
#define PAD_SIZE 0x7FFFFFFF      /* a consume-queue unit that pads a file holds no message */

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

/* The variable tail of an IPv4 MAGIC_V1 record ``r`` of ``total`` bytes (total >= MIN_RECORD_SIZE): body,
 * topic and properties, which must fill the record exactly. 1 with ``t`` set, or 0 when they do not. */
typedef struct {
    Py_ssize_t body_len, tpos, tlen, ppos, plen; /* topic length byte at tpos, properties length at ppos */
} V4Tail;

static inline int v4_tail(const unsigned char *r, Py_ssize_t total, V4Tail *t)
{
    int32_t body_len = (int32_t)get_u32(r + POS_BODYLENGTH_V4);
    if (body_len < 0 || HEAD_V4 + (Py_ssize_t)body_len + 3 > total)
        return 0;
    Py_ssize_t tpos = HEAD_V4 + body_len, tlen = r[tpos];
    if (tpos + 1 + tlen + 2 > total)
        return 0;
    Py_ssize_t ppos = tpos + 1 + tlen, plen = get_u16(r + ppos);
    if (ppos + 2 + plen != total)
        return 0;
    t->body_len = body_len;
    t->tpos = tpos;
    t->tlen = tlen;
    t->ppos = ppos;
    t->plen = plen;
    return 1;
}

/* A growable byte buffer (PyMem-allocated; free ``data`` when done). */
typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
} Buf;

int buf_reserve(Buf *b, Py_ssize_t more);

static inline int buf_add(Buf *b, const void *src, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

/* common.c */
int append_new(PyObject *list, PyObject *o);
int body_crc(PyObject *crc32, const unsigned char *p, Py_ssize_t n, uint32_t *out);
void write_head(unsigned char *p, Py_ssize_t size, uint32_t crc, int64_t queue_id, int32_t flag, int32_t sysflag,
                int64_t born_ts, const unsigned char *born, const unsigned char *store, int32_t reconsume,
                int64_t prepared, Py_ssize_t body_len);
void write_tail(unsigned char *p, const unsigned char *body, Py_ssize_t body_len, const unsigned char *topic_part,
                Py_ssize_t topic_part_len, const unsigned char *props_a, Py_ssize_t len_a,
                const unsigned char *props_b, Py_ssize_t len_b);
uint64_t bytes_hash(const unsigned char *p, Py_ssize_t n);
int props_into(PyObject *d, PyObject *s);
int append_int(PyObject *list, long long v);
int sluice_intern_names(void);
Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name);
int slot_layout(PyTypeObject *cls, const char *const *names, int n, Py_ssize_t *out);

/* Interned attribute and property names, made once at import (common.c). */
extern PyObject *s_topic, *s_queue_id, *s_body, *s_properties, *s_flag, *s_sysflag, *s_born_timestamp,
    *s_born_host, *s_reconsume_times, *s_prepared_tx_offset, *s_TAGS, *s_KEYS, *s_UNIQ_KEY;

/* Hint the lines of the record a consume-queue unit names into the cache when it lies in [file_start, limit):
 * all of them when ``whole`` (the CRC will read the body), else the head and the tail (topic and properties
 * follow the body). A queue's records lie apart in the log, between other queues', so the hardware's stream
 * prefetch does not see them coming. Prefetches never fault; the bounds keep the hint to records read. */
static inline void prefetch_record(const unsigned char *unit, const unsigned char *base, long long file_start,
                                   long long limit, int whole)
{
    int64_t at = (int64_t)get_u64(unit);
    int32_t size = (int32_t)get_u32(unit + 8);
    if (size <= 0 || at < file_start || at + size > limit)
        return;
    const unsigned char *r = base + (at - file_start);
    if (whole) {
        for (int32_t off = 0; off < size; off += 64)
            __builtin_prefetch(r + off, 0, 3);
    } else {
        __builtin_prefetch(r, 0, 3);
        __builtin_prefetch(r + 64, 0, 3);
        for (int32_t off = size > 256 ? size - 256 : 128; off < size; off += 64)
            __builtin_prefetch(r + off, 0, 3);
    }
    __builtin_prefetch(r + size - 1, 0, 3);
}
/* Records ahead of the one being read whose lines are prefetched (prefetch_record). */
#define PREFETCH_AHEAD 4

/* The prefetch cursor of a loop over ``units`` (``n`` of them) that reads only those whose ``wanted`` byte is
 * set (all when NULL): prefetches the first such unit at or after ``k`` and returns the index after it (``n``
 * when none is left). Called once per record read, it keeps PREFETCH_AHEAD wanted records on the way however
 * sparse the mask is, and never fetches a record the loop passes over (a tag filter wanting one record in
 * ten fetched all ten, whole). ``whole`` as prefetch_record: 1 when ``check`` is NULL, else ``verify`` and the
 * unit's ``check`` byte unset (an evaluated record needs only its head and tail until it passes). */
static inline Py_ssize_t prefetch_next(const unsigned char *units, const unsigned char *wanted,
                                       const unsigned char *check, int verify, Py_ssize_t k, Py_ssize_t n,
                                       const unsigned char *base, long long file_start, long long limit)
{
    if (wanted != NULL)
        while (k < n && !wanted[k])
            k++;
    if (k >= n)
        return n;
    prefetch_record(units + k * CQ_UNIT_SIZE, base, file_start, limit, check == NULL || (verify && !check[k]));
    return k + 1;
}

/* reads.c: verify_record_bytes's checks (1 fine, 0 not, -1 error from crc32), and its two halves: all but
 * the body CRC (the body's position, 0 when one fails), and the CRC */
int record_ok(const unsigned char *rec, Py_ssize_t size, int64_t at, PyObject *crc32);
Py_ssize_t record_shape_ok(const unsigned char *rec, Py_ssize_t size, int64_t at, int32_t *body_len);
int record_crc_ok(const unsigned char *rec, Py_ssize_t body, int32_t body_len, PyObject *crc32);

/* reads.c: the MessageExt fields decode_messages sets, exported as MESSAGE_EXT_FIELDS (module.c) */
extern const char *sluice_ext_fields[];
#define N_EXT_FIELDS 17

/* The functions of each file, added to the module by module.c. */
extern PyMethodDef sluice_batches_methods[], sluice_records_methods[], sluice_index_methods[],
    sluice_reads_methods[], sluice_io_methods[], sluice_spans_methods[], sluice_props_methods[],
    sluice_ext_methods[], sluice_acl_methods[], sluice_command_methods[];
/* syncer.c: adds the Syncer type */
int sluice_syncer_add(PyObject *m);

#endif
