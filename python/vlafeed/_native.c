/*
 * _native.c: the CPython extension over the vlafeed C engine.
 * Module-level state: the VlafeedError exception type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "vlafeed/vlafeed.h"

static PyObject *VlafeedError;

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "vlafeed._native", "vlafeed C engine", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&native_module);
    if (!m)
        return NULL;
    VlafeedError = PyErr_NewException("vlafeed.VlafeedError", PyExc_RuntimeError, NULL);
    if (!VlafeedError || PyModule_AddObject(m, "VlafeedError", VlafeedError) < 0 ||
        PyModule_AddStringConstant(m, "__version__", vf_version()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
