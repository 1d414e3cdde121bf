/* The module: sluice._speedups, the functions of batches.c, records.c, index.c, reads.c, io.c, spans.c, props.c, ext.c,
 * acl.c and command.c, the Syncer type of syncer.c, and
 * what they were compiled with: FORMAT (speedups.h's layout constants, checked by sluice.speedups against
 * sluice.format.C_FORMAT) and MESSAGE_EXT_FIELDS (the MessageExt slots decode_messages sets). */
#include "speedups.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sluice._speedups",
    "C twins of Sluice's per-message hot loops; see sluice.speedups.", -1, NULL, NULL, NULL, NULL, NULL,
};

static int add_format(PyObject *m)
{
    static const struct { const char *name; long long value; } consts[] = {
#define C(name) {#name, (long long)(name)}
        C(MAGIC_V1), C(MAGIC_V2), C(BLANK_MAGIC), C(MIN_RECORD_SIZE), C(HEAD_V4), C(POS_BODYCRC), C(POS_QUEUEID),
        C(POS_FLAG), C(POS_QUEUEOFFSET), C(POS_PHYSICALOFFSET), C(POS_SYSFLAG), C(POS_BORNTIMESTAMP),
        C(POS_BORNHOST), C(POS_STORETIMESTAMP_V4), C(POS_STOREHOST_V4), C(POS_RECONSUMETIMES_V4),
        C(POS_BODYLENGTH_V4), C(HOST_V4_SIZE), C(HOST_V6_SIZE), C(FLAG_COMPRESSED), C(FLAG_BORNHOST_V6),
        C(FLAG_STOREHOST_V6), C(CQ_UNIT_SIZE),
#undef C
        {"TRANSACTION_MASK", TRAN_MASK}, {"FLAG_TRANSACTION_PREPARED", TRAN_PREPARED},
        {"FLAG_TRANSACTION_ROLLBACK", TRAN_ROLLBACK}, {"MAX_PROPERTIES_LENGTH", MAX_PROPS},
        {"CQ_PAD_SIZE", PAD_SIZE},
    };
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
        PyObject *v = PyLong_FromLongLong(consts[i].value);
        if (v == NULL || PyDict_SetItemString(d, consts[i].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    if (PyModule_AddObject(m, "FORMAT", d) < 0) {
        Py_DECREF(d);
        return -1;
    }
    PyObject *names = PyTuple_New(N_EXT_FIELDS);
    if (names == NULL)
        return -1;
    for (int i = 0; i < N_EXT_FIELDS; i++) {
        PyObject *s = PyUnicode_FromString(sluice_ext_fields[i]);
        if (s == NULL) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, i, s);
    }
    if (PyModule_AddObject(m, "MESSAGE_EXT_FIELDS", names) < 0) {
        Py_DECREF(names);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__speedups(void)
{
    if (sluice_intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, sluice_batches_methods) < 0 || PyModule_AddFunctions(m, sluice_records_methods) < 0
        || PyModule_AddFunctions(m, sluice_index_methods) < 0 || PyModule_AddFunctions(m, sluice_reads_methods) < 0
        || PyModule_AddFunctions(m, sluice_io_methods) < 0 || PyModule_AddFunctions(m, sluice_spans_methods) < 0
        || PyModule_AddFunctions(m, sluice_props_methods) < 0 || PyModule_AddFunctions(m, sluice_ext_methods) < 0
        || PyModule_AddFunctions(m, sluice_acl_methods) < 0 || PyModule_AddFunctions(m, sluice_command_methods) < 0
        || sluice_syncer_add(m) < 0 || add_format(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
