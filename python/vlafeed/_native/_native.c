/*
 * _native.c: module initialisation of the CPython extension over the C
 * engine (built as vlafeed._native._core; the package's __init__.py
 * re-exports its names as vlafeed._native), and the error mapping shared by
 * every py_*.c file, and the small helpers they share.
 */
#include "_native.h"

#include "vlafeed/vlafeed.h"

PyObject *vf_py_error_type;

PyObject *vf_py_raise(int code)
{
    PyObject *type = vf_py_error_type;
    if (code == VF_ENOMEM) {
        /* What could not be allocated, when the engine said (a bare MemoryError names nothing). */
        const char *said = vf_last_error_code() == VF_ENOMEM ? vf_last_error() : "";
        PyErr_Format(PyExc_MemoryError, "vlafeed: %s", said[0] ? said : "out of memory");
        return NULL;
    }
    if (code == VF_ERANGE)
        type = PyExc_IndexError;
    else if (code == VF_EINVAL)
        type = PyExc_ValueError;
    else if (code == VF_ENOENT)
        type = PyExc_FileNotFoundError;
    PyErr_SetString(type, vf_last_error()[0] ? vf_last_error() : "vlafeed error");
    return NULL;
}

int vf_py_int64_list(PyObject *obj, const char *what, int64_t **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    PyObject *seq = PySequence_Fast(obj, what);
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *v = PyMem_Malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *index = PyNumber_Index(item);
        long long x = index ? PyLong_AsLongLong(index) : -1;
        Py_XDECREF(index);
        if (x == -1 && PyErr_Occurred()) {
            PyMem_Free(v);
            Py_DECREF(seq);
            return -1;
        }
        v[i] = x;
    }
    Py_DECREF(seq);
    *out = v;
    *count = (size_t)n;
    return 0;
}

PyObject *vf_py_list(size_t n, PyObject *(*item)(const void *ctx, size_t i), const void *ctx)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = item(ctx, i);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

PyObject *vf_py_json_loads(const char *text)
{
    PyObject *json = PyImport_ImportModule("json");
    PyObject *result = json ? PyObject_CallMethod(json, "loads", "s", text) : NULL;
    Py_XDECREF(json);
    return result;
}

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "vlafeed._native._core", "vlafeed C engine", -1, NULL, NULL, NULL, NULL, NULL,
};

/* Adds every area's functions and types (a type without a name is readied, not added). */
static int add_areas(PyObject *m)
{
    PyMethodDef *functions[] = {vf_py_parquet_read_functions, vf_py_parquet_write_functions, vf_py_dataset_functions,
                                vf_py_video_functions,        vf_py_plan_functions,          vf_py_pack_functions};
    static const struct {
        const char *name;
        PyTypeObject *type;
    } types[] = {
        {"Dataset", &vf_py_dataset_type}, {"Loader", &vf_py_loader_type},         {"Batch", &vf_py_batch_type},
        {"Column", &vf_py_column_type},   {"WdsLoader", &vf_py_wds_loader_type}, {NULL, &vf_py_wds_buffer_type},
    };
    for (size_t i = 0; i < sizeof functions / sizeof functions[0]; i++)
        if (PyModule_AddFunctions(m, functions[i]) < 0)
            return -1;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (PyType_Ready(types[i].type) < 0)
            return -1;
        if (types[i].name && PyModule_AddObjectRef(m, types[i].name, (PyObject *)types[i].type) < 0)
            return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *m = PyModule_Create(&native_module);
    if (!m)
        return NULL;
    vf_py_error_type = PyErr_NewException("vlafeed.VlafeedError", PyExc_RuntimeError, NULL);
    Py_XINCREF(vf_py_error_type);
    if (!vf_py_error_type || PyModule_AddObject(m, "VlafeedError", vf_py_error_type) < 0 ||
        PyModule_AddStringConstant(m, "__version__", vf_version()) < 0 || add_areas(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
