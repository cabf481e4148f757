/*
 * py_pack.c: vlafeed._native.pack_plan(lengths, max_tokens, window=0), the
 * binding of src/pack/ (first-fit-decreasing sequence packing). Returns a
 * dict of int lists: sample_row, sample_offset, order, cu_seqlens,
 * row_first, row_tokens, position_ids (see src/pack/pack.h); errors raise
 * ValueError with the engine's message naming the sample.
 */
#include "_native.h"

#include <stdlib.h>

#include "base/base.h"
#include "pack/pack.h"

static PyObject *int32_list(const int32_t *values, size_t count)
{
    PyObject *list = PyList_New((Py_ssize_t)count);
    if (!list)
        return NULL;
    for (size_t i = 0; i < count; i++) {
        PyObject *v = PyLong_FromLong(values[i]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static int add_list(PyObject *dict, const char *key, const int32_t *values, size_t count)
{
    PyObject *list = int32_list(values, count);
    if (!list)
        return -1;
    int r = PyDict_SetItemString(dict, key, list);
    Py_DECREF(list);
    return r;
}

static PyObject *py_pack_plan(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"lengths", "max_tokens", "window", NULL};
    PyObject *lengths_obj;
    int max_tokens;
    Py_ssize_t window = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oi|n", kwlist, &lengths_obj, &max_tokens, &window))
        return NULL;
    if (window < 0) {
        PyErr_SetString(PyExc_ValueError, "pack_plan: window must be >= 0");
        return NULL;
    }
    int64_t *wide;
    size_t count;
    if (vf_py_int64_list(lengths_obj, "pack_plan: lengths must be a sequence of ints", &wide, &count) < 0)
        return NULL;
    int32_t *lengths = malloc((count ? count : 1) * sizeof(int32_t));
    if (!lengths) {
        PyMem_Free(wide);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < count; i++) {
        if (wide[i] < INT32_MIN || wide[i] > INT32_MAX) { /* the engine checks the int32 range itself */
            PyErr_Format(PyExc_ValueError, "pack: sample %zu has %lld tokens; a sample needs 1 to max_tokens (%d)",
                         i, (long long)wide[i], max_tokens);
            free(lengths);
            PyMem_Free(wide);
            return NULL;
        }
        lengths[i] = (int32_t)wide[i];
    }
    PyMem_Free(wide);
    vf_pack_settings settings;
    vf_pack_defaults(&settings);
    settings.max_tokens = max_tokens;
    settings.window = (size_t)window;
    vf_pack_plan plan;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_pack_build(&plan, lengths, count, &settings);
    Py_END_ALLOW_THREADS
    free(lengths);
    if (r < 0) {
        PyErr_SetString(r == VF_EINVAL || r == VF_ERANGE ? PyExc_ValueError : vf_py_error_type, vf_last_error());
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (!out || add_list(out, "sample_row", plan.sample_row, plan.sample_count) < 0 ||
        add_list(out, "sample_offset", plan.sample_offset, plan.sample_count) < 0 ||
        add_list(out, "order", plan.order, plan.sample_count) < 0 ||
        add_list(out, "cu_seqlens", plan.cu_seqlens, plan.sample_count + 1) < 0 ||
        add_list(out, "row_first", plan.row_first, plan.row_count + 1) < 0 ||
        add_list(out, "row_tokens", plan.row_tokens, plan.row_count) < 0 ||
        add_list(out, "position_ids", plan.position_ids, plan.token_count) < 0) {
        Py_XDECREF(out);
        vf_pack_free(&plan);
        return NULL;
    }
    vf_pack_free(&plan);
    return out;
}

PyMethodDef vf_py_pack_functions[] = {
    VF_PY_KW_FUNCTION("pack_plan", py_pack_plan,
     "pack_plan(lengths, max_tokens, window=0) -> dict: first-fit-decreasing packing of samples into rows"),
    {NULL, NULL, 0, NULL},
};
