/* A remoting command from its decoded JSON header: the checks and the object protocol/command.py's
 * _decode_json_header makes for what real clients send (int code/version/opaque/flag, a str language, a
 * str or absent remark, extFields absent, null or an object of str values), one C call per frame instead of
 * a dozen Python steps. Anything else: None, and the Python path (its lenient decode) runs. */
#include "speedups.h"
#include <structmember.h>

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
    if (cls->tp_dictoffset != 0 || !PyType_HasFeature(cls, Py_TPFLAGS_HAVE_GC))
        return 0;
    Py_ssize_t offs[N_CMD_FIELDS];
    for (int i = 0; i < N_CMD_FIELDS; i++) {
        PyObject *d = PyDict_GetItemString(cls->tp_dict, cmd_fields[i]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
            return 0;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY))
            return 0;
        offs[i] = m->offset;
    }
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

PyMethodDef sluice_command_methods[] = {
    {"json_command", (PyCFunction)json_command, METH_VARARGS, json_command_doc},
    {NULL, NULL, 0, NULL},
};
