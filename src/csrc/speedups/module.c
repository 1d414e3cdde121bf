/* The module: sluice._speedups, the functions of batches.c, records.c, index.c, reads.c and io.c. */
#include "speedups.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sluice._speedups",
    "C twins of Sluice's per-message hot loops; see sluice.speedups.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    if (sluice_intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, sluice_batches_methods) < 0 || PyModule_AddFunctions(m, sluice_records_methods) < 0
        || PyModule_AddFunctions(m, sluice_index_methods) < 0 || PyModule_AddFunctions(m, sluice_reads_methods) < 0
        || PyModule_AddFunctions(m, sluice_io_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
