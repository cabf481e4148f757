/*
 * _native.h: shared declarations of the vlafeed._native extension (built as
 * vlafeed._native._core). Each area's file (py_<area>.c) exports the
 * functions and types it adds to the module; _native.c adds them all from
 * one table in PyInit__core.
 */
#ifndef VF_PY_NATIVE_H
#define VF_PY_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

/* The vlafeed.VlafeedError exception type (a RuntimeError). */
extern PyObject *vf_py_error_type;

/* Raises VlafeedError (or IndexError/KeyError/ValueError/FileNotFoundError
 * by code) with vf_last_error(); returns NULL for `return vf_py_raise(r);`. */
PyObject *vf_py_raise(int code);

/* Converts a sequence of ints to a newly allocated int64 array
 * (PyMem_Free() it); `what` is the TypeError message for a non-sequence.
 * Returns 0, or -1 with a Python exception set. */
int vf_py_int64_list(PyObject *obj, const char *what, int64_t **out, size_t *count);

/* A list of n items, item i made by item(ctx, i) (a new reference, or NULL
 * with an exception set: the list is dropped and NULL returned). */
PyObject *vf_py_list(size_t n, PyObject *(*item)(const void *ctx, size_t i), const void *ctx);

/* json.loads(text), or NULL with an exception set. */
PyObject *vf_py_json_loads(const char *text);

/* ---- the Dataset type (py_dataset.c) ---- */

struct vf_dataset;
extern PyTypeObject vf_py_dataset_type;

/* The open dataset of a vf_py_dataset_type object, or NULL with ValueError
 * "the dataset is not open". */
struct vf_dataset *vf_py_dataset(PyObject *dataset);

/* The strict-open rule: raises VlafeedError for the first metadata problem
 * of severity error (-1), or with lenient warns for each through Python's
 * warnings and returns how many were let through. */
int vf_py_check_metadata(const struct vf_dataset *d, int lenient);

/* ---- loader states <-> dicts (py_state.c) ---- */

struct vf_loader_state;

/* The two dict forms of a vf_loader_state: a Loader's state_dict() and a
 * ShardLoader's (kind 'wds'). */
typedef enum vf_py_state_form { VF_PY_STATE_LOADER, VF_PY_STATE_WDS } vf_py_state_form;

PyObject *vf_py_state_to_dict(const struct vf_loader_state *st, vf_py_state_form form);

/* Fills st from a dict of that form (TypeError / KeyError / ValueError
 * naming the key); st->ranges is then PyMem-allocated: vf_py_state_clear()
 * frees it. 0, or -1 with an exception set (nothing to free). */
int vf_py_state_from_dict(PyObject *d, struct vf_loader_state *st, vf_py_state_form form);
void vf_py_state_clear(struct vf_loader_state *st);

/* The `state` setting of a loader: fills *st from the dict and points *resume at it. 0, or -1. */
int vf_py_resume_setting(PyObject *d, vf_py_state_form form, struct vf_loader_state *st,
                         const struct vf_loader_state **resume);

/* ---- the extension's types ---- */

/* The common part of a static type vlafeed._native.<name> whose objects are `object` structs. */
#define VF_PY_TYPE(name, object, dealloc, doc)                                                                    \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native." name, .tp_basicsize = sizeof(object),          \
    .tp_dealloc = (destructor)(dealloc), .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = doc

/* ... of a type Python code makes objects of: Name(...) runs init. */
#define VF_PY_CLASS(name, object, dealloc, doc, init, methods, getset)                                            \
    VF_PY_TYPE(name, object, dealloc, doc), .tp_init = (initproc)(init), .tp_new = PyType_GenericNew,          \
    .tp_methods = methods, .tp_getset = getset

/* A module function taking keyword arguments: fn(self, args, kwargs). */
#define VF_PY_KW_FUNCTION(name, fn, doc) {name, (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS, doc}

/* The closure of a getter that serves several attributes: which one (an enum value). */
#define VF_PY_WHICH(which) ((void *)(intptr_t)(which))

/* ---- what each area adds to the module (PyInit__core adds them in order) ---- */

extern PyMethodDef vf_py_parquet_read_functions[], vf_py_parquet_write_functions[], vf_py_dataset_functions[],
    vf_py_video_functions[], vf_py_plan_functions[], vf_py_pack_functions[];
extern PyTypeObject vf_py_loader_type, vf_py_batch_type, vf_py_column_type, vf_py_wds_loader_type,
    vf_py_wds_buffer_type;

#endif
