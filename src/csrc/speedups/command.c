/* Received requests' headers in C, one call each instead of a few dozen Python steps. json_command: a remoting
 * command from its decoded JSON header, with the checks and the object protocol/command.py's
 * _decode_json_header makes for what real clients send (int code/version/opaque/flag, a str language, a str
 * or absent remark, extFields absent, null or an object of str values); anything else: None, and the Python
 * path (its lenient decode) runs. read_header: protocol/fields.py's generated readers of request headers
 * (extFields to a header dataclass), for the values clients send; anything else goes to the Python reader. */
#include "speedups.h"

/* RemotingCommand's fields, in the order json_command fills them: a slots dataclass, each field a member
 * descriptor (T_OBJECT_EX) at an offset, set directly (its frozen __init__ would refuse). */
#define N_CMD_FIELDS 9
static const char *cmd_fields[N_CMD_FIELDS] = {
    "code", "ext_fields", "body", "remark", "opaque", "flag", "language", "version", "serialize_type",
};
static PyTypeObject *cmd_type; /* borrowed identity only, compared by pointer */
static Py_ssize_t cmd_offsets[N_CMD_FIELDS];

static int cmd_layout(PyTypeObject *cls)
{
    if (cls == cmd_type)
        return 1;
    Py_ssize_t offs[N_CMD_FIELDS];
    if (!slot_layout(cls, cmd_fields, N_CMD_FIELDS, offs))
        return 0;
    memcpy(cmd_offsets, offs, sizeof offs);
    cmd_type = cls;
    return 1;
}

/* The header's names, interned once. */
enum { K_CODE, K_VERSION, K_OPAQUE, K_FLAG, K_LANGUAGE, K_REMARK, K_EXT, N_KEYS };
static const char *key_names[N_KEYS] = {"code", "version", "opaque", "flag", "language", "remark", "extFields"};
static PyObject *keys[N_KEYS];

static int intern_keys(void)
{
    if (keys[0] != NULL)
        return 0;
    for (int i = 0; i < N_KEYS; i++)
        if ((keys[i] = PyUnicode_InternFromString(key_names[i])) == NULL)
            return -1;
    return 0;
}

/* header[keys[k]], a borrowed reference; ``dflt`` when absent; NULL with an error set on failure. */
static PyObject *field(PyObject *header, int k, PyObject *dflt, int *failed)
{
    PyObject *v = PyDict_GetItemWithError(header, keys[k]);
    if (v == NULL && PyErr_Occurred())
        *failed = 1;
    return v != NULL ? v : dflt;
}

PyDoc_STRVAR(json_command_doc,
             "json_command(cls, header, body, serialize_type) -> cls instance | None\n\n"
             "The command _decode_json_header builds from the JSON header dict ``header`` when every field has "
             "the usual type; None otherwise (the lenient Python decode then runs).");

static PyObject *json_command(PyObject *self, PyObject *args)
{
    PyObject *cls, *header, *body, *stype;
    if (!PyArg_ParseTuple(args, "O!O!OO:json_command", &PyType_Type, &cls, &PyDict_Type, &header, &body, &stype))
        return NULL;
    if (!cmd_layout((PyTypeObject *)cls))
        Py_RETURN_NONE;
    if (intern_keys() < 0)
        return NULL;
    PyObject *zero = PyLong_FromLong(0); /* a cached small int; a new reference either way */
    if (zero == NULL)
        return NULL;
    int failed = 0;
    PyObject *code = field(header, K_CODE, NULL, &failed), *version = field(header, K_VERSION, zero, &failed),
             *opaque = field(header, K_OPAQUE, zero, &failed), *flag = field(header, K_FLAG, zero, &failed),
             *language = field(header, K_LANGUAGE, NULL, &failed), *remark = field(header, K_REMARK, Py_None, &failed),
             *ext = field(header, K_EXT, Py_None, &failed);
    if (failed) {
        Py_DECREF(zero);
        return NULL;
    }
    int usual = code != NULL && PyLong_CheckExact(code) && PyLong_CheckExact(version) && PyLong_CheckExact(opaque)
                && PyLong_CheckExact(flag) && language != NULL && PyUnicode_CheckExact(language)
                && (remark == Py_None || PyUnicode_CheckExact(remark)) && (ext == Py_None || PyDict_CheckExact(ext));
    if (usual && ext != Py_None) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(ext, &pos, &k, &v))
            if (!PyUnicode_CheckExact(v)) {
                usual = 0;
                break;
            }
    }
    if (!usual) {
        Py_DECREF(zero);
        Py_RETURN_NONE;
    }
    PyObject *ext_fields = ext == Py_None ? PyDict_New() : Py_NewRef(ext); /* Java leaves a null extFields out */
    PyObject *o = ext_fields == NULL ? NULL : ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    if (o == NULL) {
        Py_XDECREF(ext_fields);
        Py_DECREF(zero);
        return NULL;
    }
    PyObject *vals[N_CMD_FIELDS] = {code, ext_fields, body, remark, opaque, flag, language, version, stype};
    for (int i = 0; i < N_CMD_FIELDS; i++) /* new references move in (ext_fields' own one) */
        *(PyObject **)((char *)o + cmd_offsets[i]) = i == 1 ? vals[i] : Py_NewRef(vals[i]);
    Py_DECREF(zero);
    return o;
}


/* ---- request headers: protocol/fields.py's generated readers, as one C call ---------------------------- */

PyDoc_STRVAR(slot_offsets_doc,
             "slot_offsets(cls, names) -> tuple[int, ...] | None\n\n"
             "The instance offsets of ``cls``'s writable object slots ``names`` (a slots class without a __dict__); "
             "None for any other layout.");

static PyObject *slot_offsets(PyObject *self, PyObject *args)
{
    PyObject *cls, *names;
    if (!PyArg_ParseTuple(args, "O!O!:slot_offsets", &PyType_Type, &cls, &PyTuple_Type, &names))
        return NULL;
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (tp->tp_dictoffset != 0 || !PyType_HasFeature(tp, Py_TPFLAGS_HAVE_GC))
        Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        Py_ssize_t off = PyUnicode_Check(name) ? slot_offset(tp, name) : -1;
        if (off < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyObject *o = PyLong_FromSsize_t(off);
        if (o == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, o);
    }
    return out;
}

enum { KIND_STR, KIND_INT, KIND_BOOL };
enum { MISSING_FALLBACK, MISSING_NONE, MISSING_DEFAULT };
#define MAX_HEADER_FIELDS 64

PyDoc_STRVAR(read_header_doc,
             "read_header(spec, ext) -> header\n\n"
             "fields.py's generated reader for one header class, for what clients send: ``spec`` is (cls, "
             "fallback, fields), each field (ext key, kind 0 str / 1 int / 2 bool, when missing 0 fallback / 1 None "
             "/ 2 the default, default, slot offset). A str value, an int as 1-18 ASCII digits, a bool as "
             "'true'/'false'; anything else (a missing required field, another type or spelling) returns "
             "fallback(ext), the Python reader, which converts it or raises its precise error.");

static PyObject *read_header(PyObject *self, PyObject *args)
{
    PyObject *spec, *ext;
    if (!PyArg_ParseTuple(args, "O!O:read_header", &PyTuple_Type, &spec, &ext))
        return NULL;
    if (PyTuple_GET_SIZE(spec) != 3 || !PyType_Check(PyTuple_GET_ITEM(spec, 0))
        || !PyTuple_Check(PyTuple_GET_ITEM(spec, 2))) {
        PyErr_SetString(PyExc_TypeError, "read_header: spec must be (cls, fallback, fields)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(spec, 0);
    PyObject *fallback = PyTuple_GET_ITEM(spec, 1), *fields = PyTuple_GET_ITEM(spec, 2);
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    if (n > MAX_HEADER_FIELDS || !PyDict_CheckExact(ext))
        return PyObject_CallOneArg(fallback, ext);
    PyObject *vals[MAX_HEADER_FIELDS];
    Py_ssize_t offs[MAX_HEADER_FIELDS];
    Py_ssize_t got = 0;
    for (; got < n; got++) {
        PyObject *f = PyTuple_GET_ITEM(fields, got);
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 5)
            goto unusual;
        PyObject *key = PyTuple_GET_ITEM(f, 0);
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(f, 1)), missing = PyLong_AsLong(PyTuple_GET_ITEM(f, 2));
        Py_ssize_t off = PyLong_AsSsize_t(PyTuple_GET_ITEM(f, 4));
        if (PyErr_Occurred())
            goto error;
        if (off < (Py_ssize_t)sizeof(PyObject) || off + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize)
            goto unusual; /* not a slot of this class: never written */
        offs[got] = off;
        PyObject *v = PyDict_GetItemWithError(ext, key);
        if (v == NULL) {
            if (PyErr_Occurred())
                goto error;
            if (missing == MISSING_NONE)
                vals[got] = Py_NewRef(Py_None);
            else if (missing == MISSING_DEFAULT)
                vals[got] = Py_NewRef(PyTuple_GET_ITEM(f, 3));
            else
                goto unusual;
            continue;
        }
        if (!PyUnicode_CheckExact(v))
            goto unusual;
        if (kind == KIND_STR) {
            vals[got] = Py_NewRef(v);
        } else if (kind == KIND_INT) {
            Py_ssize_t len = PyUnicode_GET_LENGTH(v);
            if (!PyUnicode_IS_ASCII(v) || len < 1 || len > 18)
                goto unusual;
            const char *s = (const char *)PyUnicode_DATA(v);
            long long x = 0;
            for (Py_ssize_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                    goto unusual;
                x = x * 10 + (s[i] - '0');
            }
            if ((vals[got] = PyLong_FromLongLong(x)) == NULL)
                goto error;
        } else if (kind == KIND_BOOL) {
            if (PyUnicode_CompareWithASCIIString(v, "true") == 0)
                vals[got] = Py_NewRef(Py_True);
            else if (PyUnicode_CompareWithASCIIString(v, "false") == 0)
                vals[got] = Py_NewRef(Py_False);
            else
                goto unusual;
        } else {
            goto unusual;
        }
    }
    PyObject *o = cls->tp_alloc(cls, 0);
    if (o == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) { /* the new references move in */
        PyObject **slot = (PyObject **)((char *)o + offs[i]);
        Py_XSETREF(*slot, vals[i]);
    }
    return o;
unusual:
    for (Py_ssize_t i = 0; i < got; i++)
        Py_DECREF(vals[i]);
    return PyObject_CallOneArg(fallback, ext);
error:
    for (Py_ssize_t i = 0; i < got; i++)
        Py_DECREF(vals[i]);
    return NULL;
}

PyMethodDef sluice_command_methods[] = {
    {"json_command", (PyCFunction)json_command, METH_VARARGS, json_command_doc},
    {"slot_offsets", (PyCFunction)slot_offsets, METH_VARARGS, slot_offsets_doc},
    {"read_header", (PyCFunction)read_header, METH_VARARGS, read_header_doc},
    {NULL, NULL, 0, NULL},
};
