/*
 * _native.h: shared declarations of the vlafeed._native extension. Each
 * python/vlafeed/py_<area>.c adds its functions and types to the module in
 * its register function, called once from PyInit__native.
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

/* The strict-open rule: raises VlafeedError for the first metadata problem
 * of severity error (-1), or with lenient warns for each through Python's
 * warnings and returns how many were let through. */
struct vf_dataset;
int vf_py_check_metadata(const struct vf_dataset *d, int lenient);

int vf_py_register_parquet_read(PyObject *module);
int vf_py_register_parquet_write(PyObject *module);
int vf_py_register_dataset(PyObject *module);
int vf_py_register_video(PyObject *module);
int vf_py_register_loader(PyObject *module);
int vf_py_register_pack(PyObject *module);
int vf_py_register_wds(PyObject *module);

#endif
