/*
 * py_dataset.c: Python functions of the dataset area.
 *
 *   vlafeed._native.dataset_info(path, episodes=None, check_data=True) -> dict
 *
 * returns the `vlafeed info --json` document (docs/info-json.md), parsed
 * with Python's json module so both always carry the same content. A
 * dataset that cannot be opened raises (FileNotFoundError for a missing
 * folder, file or episode; VlafeedError for corrupt or unsupported
 * metadata); problems found in an opened dataset are in the dict.
 */
#include "_native.h"

#include <stdlib.h>

#include "vlafeed/dataset.h"

/* Converts an iterable of ints to a newly allocated array. */
static int episodes_from_python(PyObject *obj, int64_t **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    PyObject *seq = PySequence_Fast(obj, "episodes must be a sequence of integers");
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
        long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
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

static PyObject *py_dataset_info(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path", "episodes", "check_data", NULL};
    PyObject *path_obj, *episodes_obj = Py_None;
    int check_data = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|Op:dataset_info", keywords, PyUnicode_FSConverter, &path_obj,
                                     &episodes_obj, &check_data))
        return NULL;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    if (episodes_obj != Py_None && episodes_from_python(episodes_obj, &episodes, &num_episodes) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = episodes_obj != Py_None ? episodes : NULL;
    s.num_episodes = num_episodes;
    s.check_data_files = check_data;
    vf_dataset *d = NULL;
    char *text = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_open(&d, PyBytes_AS_STRING(path_obj), &s);
    if (r == 0)
        r = vf_dataset_info_json(d, 0, &text);
    vf_dataset_close(d);
    Py_END_ALLOW_THREADS
    PyMem_Free(episodes);
    Py_DECREF(path_obj);
    if (r < 0)
        return vf_py_raise(r);
    PyObject *json = PyImport_ImportModule("json");
    PyObject *result = json ? PyObject_CallMethod(json, "loads", "s", text) : NULL;
    Py_XDECREF(json);
    free(text);
    return result;
}

static PyMethodDef dataset_methods[] = {
    {"dataset_info", (PyCFunction)(void (*)(void))py_dataset_info, METH_VARARGS | METH_KEYWORDS,
     "dataset_info(path, episodes=None, check_data=True) -> dict\n\n"
     "Opens the LeRobot dataset at path and returns the `vlafeed info --json`\n"
     "report (docs/info-json.md) as a dict. episodes selects episode indices;\n"
     "check_data=False skips opening the data Parquet footers."},
    {NULL, NULL, 0, NULL},
};

int vf_py_register_dataset(PyObject *module)
{
    return PyModule_AddFunctions(module, dataset_methods);
}
