/* Pulls and consumers: runs of stored records copied (and checked) into a response, records decoded. */
#include "speedups.h"

/* -------------------------------------------------------------------------------------- gather_units */

/* commitlog.verify_record_bytes's checks but the body CRC, on a record at ``rec`` of ``size`` bytes claimed to
 * sit at commit-log offset ``at``: the body's position (> 0) when they pass, else 0; ``*body_len`` is set. */
Py_ssize_t record_shape_ok(const unsigned char *rec, Py_ssize_t size, int64_t at, int32_t *body_len)
{
    if (size < 8)
        return 0;
    uint32_t total = get_u32(rec), magic = get_u32(rec + 4);
    if ((magic != MAGIC_V1 && magic != MAGIC_V2) || (Py_ssize_t)total != size || size < POS_SYSFLAG)
        return 0;
    if ((int64_t)get_u64(rec + POS_PHYSICALOFFSET) != at)
        return 0;
    if (size < POS_BORNTIMESTAMP)
        return 0;
    uint32_t sysflag = get_u32(rec + POS_SYSFLAG);
    Py_ssize_t p = POS_BORNHOST + ((sysflag & FLAG_BORNHOST_V6) ? HOST_V6_SIZE : HOST_V4_SIZE) + 8
                   + ((sysflag & FLAG_STOREHOST_V6) ? HOST_V6_SIZE : HOST_V4_SIZE) + 12;
    if (p + 4 > size)
        return 0;
    *body_len = (int32_t)get_u32(rec + p);
    if (*body_len < 0 || p + 4 + *body_len > size)
        return 0;
    return p + 4;
}

/* The body CRC check of a record record_shape_ok passed (body at ``body``): 1 fine, 0 not, -1 error. */
int record_crc_ok(const unsigned char *rec, Py_ssize_t body, int32_t body_len, PyObject *crc32)
{
    uint32_t crc;
    if (body_crc(crc32, rec + body, body_len, &crc) < 0)
        return -1;
    return crc == (get_u32(rec + POS_BODYCRC) & 0x7FFFFFFFu);
}

/* commitlog.verify_record_bytes's checks on a record at ``rec`` of ``size`` bytes claimed to sit at
 * commit-log offset ``at``: 1 fine, 0 not, -1 error (from crc32). */
int record_ok(const unsigned char *rec, Py_ssize_t size, int64_t at, PyObject *crc32)
{
    int32_t body_len;
    Py_ssize_t body = record_shape_ok(rec, size, at, &body_len);
    return body ? record_crc_ok(rec, body, body_len, crc32) : 0;
}


PyDoc_STRVAR(gather_units_doc,
"gather_units(units, first, mm, file_start, limit, max_msgs, max_bytes, total, have, verify, crc32,\n"
"             base_qoff, qoffs, phys, sizes, mask) -> (data: bytes, stop: int, why: int)\n\n"
"sluice.store.pull_read's loop for records no filter needs to see, over one mapped commit-log file ``mm``\n"
"that starts at log offset ``file_start`` and holds data below ``limit``. ``units`` holds 20-byte\n"
"big-endian consume-queue units (offset, size, tag code); from unit ``first`` on, units that hold no\n"
"message (size <= 0, or the padding size) and, when ``mask`` (one byte per unit) is given, units whose\n"
"byte is 0 are passed over. Records are taken while the next one lies in this file, ``have`` (already\n"
"taken) + taken < ``max_msgs``, and, once anything is taken, ``total`` + its size <= ``max_bytes``; with\n"
"``verify`` each must pass verify_record_bytes's checks. The queue offset (``base_qoff`` + unit index),\n"
"commit-log offset and size of each record taken are appended to ``qoffs``, ``phys`` and ``sizes``;\n"
"``data`` is the records back to back; ``stop`` the unit where it stopped (the number of units when\n"
"they ran out); ``why`` what stopped it: 0 units exhausted, 1 max_msgs, 2 max_bytes, 3 the next record\n"
"is not in this file, 4 the next record failed verification.");

static PyObject *gather_units(PyObject *self, PyObject *args)
{
    PyObject *mm, *crc32, *qoffs, *physl, *sizesl, *mask;
    Py_buffer uv, mv, kv = {0};
    Py_ssize_t first;
    long long file_start, limit, max_msgs, max_bytes, total, have, base_qoff;
    int verify;
    if (!PyArg_ParseTuple(args, "y*nOLLLLLLpOLO!O!O!O:gather_units", &uv, &first, &mm, &file_start, &limit,
                          &max_msgs, &max_bytes, &total, &have, &verify, &crc32, &base_qoff, &PyList_Type, &qoffs,
                          &PyList_Type, &physl, &PyList_Type, &sizesl, &mask))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t nunits = uv.len / CQ_UNIT_SIZE, u = first, nbytes = 0, taken = 0;
    if (mask != Py_None) {
        if (PyObject_GetBuffer(mask, &kv, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&uv);
            return NULL;
        }
        if (kv.len != nunits) {
            PyBuffer_Release(&kv);
            PyBuffer_Release(&uv);
            PyErr_SetString(PyExc_ValueError, "gather_units: the mask needs one byte per unit");
            return NULL;
        }
    }
    const unsigned char *wanted = mask != Py_None ? kv.buf : NULL;
    if (PyObject_GetBuffer(mm, &mv, PyBUF_SIMPLE) < 0) {
        if (wanted)
            PyBuffer_Release(&kv);
        PyBuffer_Release(&uv);
        return NULL;
    }
    const unsigned char *units = uv.buf, *base = mv.buf;
    int why = 0;
    if (limit > file_start + mv.len)
        limit = file_start + mv.len;
    Buf runs = {NULL, 0, 0}; /* (offset, size) of each record taken, for the copy */
    Py_ssize_t pf = first; /* the CRC or the copy reads all of a record taken: prefetched whole */
    for (int k = 0; k < PREFETCH_AHEAD; k++)
        pf = prefetch_next(units, wanted, NULL, 1, pf, nunits, base, file_start, limit);
    for (; u < nunits; u++) {
        if (wanted && !wanted[u])
            continue;
        pf = prefetch_next(units, wanted, NULL, 1, pf, nunits, base, file_start, limit);
        const unsigned char *unit = units + u * CQ_UNIT_SIZE;
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
    if (wanted)
        PyBuffer_Release(&kv);
    PyBuffer_Release(&uv);
    return out;
}

/* ---------------------------------------------------------------------------------- decode_messages */

/* MessageExt's fields, in the order decode_messages fills them. The class is a slots dataclass: each
 * field is a member descriptor (T_OBJECT_EX) at an offset in the instance, which C sets directly (a
 * dataclass __init__ of 17 fields is Python code). Any other layout: the Python path, which is why
 * sluice.speedups.check_message_ext holds these names against MessageExt's slots (and a test does). */
const char *sluice_ext_fields[] = {
    "topic", "body", "properties", "queue_id", "queue_offset", "commitlog_offset", "msg_id", "offset_msg_id",
    "sysflag", "flag", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "body_crc", "store_size",
};
static PyTypeObject *ext_type; /* borrowed identity only, compared by pointer */
static Py_ssize_t ext_offsets[N_EXT_FIELDS];

static int ext_layout(PyTypeObject *cls)
{
    if (cls == ext_type)
        return 1;
    Py_ssize_t offs[N_EXT_FIELDS];
    if (!slot_layout(cls, sluice_ext_fields, N_EXT_FIELDS, offs))
        return 0;
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

/* A new reference to the int ``v``: the previous record's object when it held the same value. A pull
 * answer's records share store timestamps (appended together), often born timestamps (sent together) and
 * sizes, so most of these ints need not be made for one message and freed with it. */
static PyObject *same_long(long long v, long long *last_v, PyObject **last)
{
    if (*last != NULL && *last_v == v)
        return Py_NewRef(*last);
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return NULL;
    *last_v = v;
    Py_XSETREF(*last, Py_NewRef(o));
    return o;
}

PyDoc_STRVAR(decode_messages_doc,
"decode_messages(body, check_crc: bool, crc32, cls, inflate, extra=None) -> list | None\n\n"
"sluice.client.broker_api.decode_messages in C: the stored records of a pull (or view, or query) body to\n"
"``cls`` (MessageExt) instances, bodies with the COMPRESSED bit passed through ``inflate``, and ``extra``'s\n"
"items (a dict: a pull's MIN_OFFSET and MAX_OFFSET) set in every message's properties. None for\n"
"anything unusual (a record that does not decode or fails its CRC, an IPv6 host, a MAGIC_V2 record,\n"
"another class layout): the Python decoder then decodes it or says exactly what is wrong.");

static PyObject *decode_messages(PyObject *self, PyObject *args)
{
    Py_buffer bv;
    int check_crc;
    PyObject *crc32, *cls, *inflate, *extra = Py_None;
    if (!PyArg_ParseTuple(args, "y*pOOO|O:decode_messages", &bv, &check_crc, &crc32, &cls, &inflate, &extra))
        return NULL;
    PyObject *out = NULL, *list = NULL, *last_topic = NULL, *last_born = NULL, *last_store = NULL;
    PyObject *last_bts = NULL, *last_sts = NULL, *last_size = NULL;
    long long bts_v = 0, sts_v = 0, size_v = 0;
    unsigned char born_bytes[8], store_bytes[8];
    Py_ssize_t last_tlen = -1;
    const unsigned char *last_tp = NULL;
    if (extra != Py_None && !PyDict_Check(extra)) {
        PyErr_SetString(PyExc_TypeError, "decode_messages: extra must be a dict or None");
        PyBuffer_Release(&bv);
        return NULL;
    }
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
        if (end - pos < MIN_RECORD_SIZE)
            goto unusual;
        int32_t total = (int32_t)get_u32(r);
        uint32_t magic = get_u32(r + 4), sysflag = get_u32(r + POS_SYSFLAG);
        if (magic != MAGIC_V1 || total < MIN_RECORD_SIZE || total > end - pos || (sysflag & HOST_V6_BITS))
            goto unusual;
        V4Tail tail;
        if (!v4_tail(r, total, &tail))
            goto unusual;
        Py_ssize_t body_len = tail.body_len, tpos = tail.tpos, tlen = tail.tlen, ppos = tail.ppos, plen = tail.plen;
        uint32_t crc = get_u32(r + POS_BODYCRC);
        if (check_crc) {
            uint32_t actual;
            if (body_crc(crc32, r + HEAD_V4, body_len, &actual) < 0)
                goto done;
            if (actual != crc)
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
        f[1] = PyBytes_FromStringAndSize((const char *)r + HEAD_V4, body_len);
        if (f[1] != NULL && (sysflag & FLAG_COMPRESSED)) { /* COMPRESSED: inflated as the producer gave it */
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
            if (f[2] != NULL && (props_into(f[2], ptext) < 0 || (extra != Py_None && PyDict_Update(f[2], extra) < 0)))
                Py_CLEAR(f[2]);
            Py_DECREF(ptext);
        }
        char id[32];
        for (int k = 0; k < 8; k++) { /* offset msg id: store host (ip, port) then commit-log offset */
            id[2 * k] = hex[r[POS_STOREHOST_V4 + k] >> 4];
            id[2 * k + 1] = hex[r[POS_STOREHOST_V4 + k] & 0xF];
            id[16 + 2 * k] = hex[r[POS_PHYSICALOFFSET + k] >> 4];
            id[16 + 2 * k + 1] = hex[r[POS_PHYSICALOFFSET + k] & 0xF];
        }
        f[7] = PyUnicode_FromStringAndSize(id, 32);
        f[3] = PyLong_FromLong((int32_t)get_u32(r + POS_QUEUEID));
        f[4] = PyLong_FromLongLong((int64_t)get_u64(r + POS_QUEUEOFFSET));
        f[5] = PyLong_FromLongLong((int64_t)get_u64(r + POS_PHYSICALOFFSET));
        f[8] = PyLong_FromLong((int32_t)sysflag);
        f[9] = PyLong_FromLong((int32_t)get_u32(r + POS_FLAG));
        f[10] = same_long((int64_t)get_u64(r + POS_BORNTIMESTAMP), &bts_v, &last_bts);
        f[11] = host_tuple(r + POS_BORNHOST, born_bytes, &last_born);
        f[12] = same_long((int64_t)get_u64(r + POS_STORETIMESTAMP_V4), &sts_v, &last_sts);
        f[13] = host_tuple(r + POS_STOREHOST_V4, store_bytes, &last_store);
        f[14] = PyLong_FromLong((int32_t)get_u32(r + POS_RECONSUMETIMES_V4));
        f[15] = PyLong_FromLong((int32_t)crc);
        f[16] = same_long(total, &size_v, &last_size);
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
    Py_XDECREF(last_bts);
    Py_XDECREF(last_sts);
    Py_XDECREF(last_size);
    PyBuffer_Release(&bv);
    return out;
}

PyMethodDef sluice_reads_methods[] = {
    {"gather_units", (PyCFunction)gather_units, METH_VARARGS, gather_units_doc},
    {"decode_messages", (PyCFunction)decode_messages, METH_VARARGS, decode_messages_doc},
    {NULL, NULL, 0, NULL},
};
