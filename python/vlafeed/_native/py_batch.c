/*
 * py_batch.c: the batch objects a Loader yields.
 *
 *   Batch    one batch (a vf_batch reference); batch[name] is a zero-copy
 *            Column, or a list[str] for a string column
 *   Column   one column's memory through the buffer protocol
 *
 * Lifetimes: a Column holds its Batch, a Batch its Loader and its vf_batch
 * reference. So a NumPy array or torch tensor viewing a column keeps the
 * batch memory (and everything it points into) alive; the memory returns
 * to the engine's pool when the last view is gone.
 */
#include "py_loader.h"

#include <string.h>

typedef struct {
    PyObject_HEAD
    vf_batch *b;
    PyObject *loader;
} BatchObject;

typedef struct {
    PyObject_HEAD
    BatchObject *batch;
    const vf_column *col;
    Py_ssize_t shape[8];
    Py_ssize_t strides[8];
} ColumnObject;

PyObject *vf_py_make_batch(PyObject *loader, vf_batch *b)
{
    BatchObject *o = PyObject_New(BatchObject, &vf_py_batch_type);
    if (!o) {
        vf_batch_release(b);
        return NULL;
    }
    o->b = b;
    o->loader = Py_NewRef(loader);
    return (PyObject *)o;
}

/* ======================================================================
 * Batch
 * ==================================================================== */

static void Batch_dealloc(BatchObject *self)
{
    vf_batch_release(self->b);
    Py_XDECREF(self->loader);
    PyObject_Free(self);
}

static Py_ssize_t Batch_len(BatchObject *self) { return (Py_ssize_t)vf_batch_size(self->b); }

static PyObject *column_name(const void *b, size_t i)
{
    return PyUnicode_FromString(vf_batch_column(b, i)->name);
}

static PyObject *Batch_keys(BatchObject *self, PyObject *unused)
{
    (void)unused;
    return vf_py_list(vf_batch_num_columns(self->b), column_name, self->b);
}

static const char *column_format(vf_column_type t, Py_ssize_t *itemsize)
{
    switch (t) {
    case VF_COL_FLOAT32: *itemsize = 4; return "f";
    case VF_COL_FLOAT64: *itemsize = 8; return "d";
    case VF_COL_INT64: *itemsize = 8; return "q";
    case VF_COL_INT32: *itemsize = 4; return "i";
    case VF_COL_UINT8: *itemsize = 1; return "B";
    case VF_COL_BOOL: *itemsize = 1; return "?";
    case VF_COL_STRING: break;
    }
    *itemsize = 0;
    return NULL;
}

static PyObject *string_value(const void *column, size_t i)
{
    const vf_column *c = column;
    const char *s = c->strings[i] ? c->strings[i] : "";
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static PyObject *Batch_getitem(BatchObject *self, PyObject *key)
{
    const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!name) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "batch columns are looked up by name");
        return NULL;
    }
    const vf_column *c = vf_batch_find(self->b, name);
    if (!c) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    if (c->type == VF_COL_STRING)
        return vf_py_list((size_t)c->shape[0], string_value, c);
    ColumnObject *o = PyObject_New(ColumnObject, &vf_py_column_type);
    if (!o)
        return NULL;
    o->batch = (BatchObject *)Py_NewRef(self);
    o->col = c;
    Py_ssize_t itemsize;
    column_format(c->type, &itemsize);
    Py_ssize_t stride = itemsize;
    for (int k = c->ndim - 1; k >= 0; k--) {
        o->shape[k] = (Py_ssize_t)c->shape[k];
        o->strides[k] = stride;
        stride *= o->shape[k];
    }
    return (PyObject *)o;
}

static int Batch_contains(BatchObject *self, PyObject *key)
{
    const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!name) {
        PyErr_Clear();
        return 0;
    }
    return vf_batch_find(self->b, name) != NULL;
}

static PyObject *position(const void *positions, size_t i)
{
    return PyLong_FromLongLong(((const int64_t *)positions)[i]);
}

static PyObject *Batch_get_positions(BatchObject *self, void *c)
{
    (void)c;
    return vf_py_list(vf_batch_size(self->b), position, vf_batch_positions(self->b));
}

static PyMappingMethods Batch_mapping = {
    .mp_length = (lenfunc)Batch_len,
    .mp_subscript = (binaryfunc)Batch_getitem,
};

static PySequenceMethods Batch_sequence = {
    .sq_contains = (objobjproc)Batch_contains,
};

static PyMethodDef Batch_methods[] = {
    {"keys", (PyCFunction)Batch_keys, METH_NOARGS, "keys() -> column names in order"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Batch_getset[] = {
    {"positions", (getter)Batch_get_positions, NULL, "positions of the samples (rows of the selected frames)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject vf_py_batch_type = {
    VF_PY_TYPE("Batch", BatchObject, Batch_dealloc,
               "A batch: batch[name] is a zero-copy Column (buffer protocol) or a list of str."),
    .tp_as_mapping = &Batch_mapping,
    .tp_as_sequence = &Batch_sequence,
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

/* ======================================================================
 * Column
 * ==================================================================== */

static void Column_dealloc(ColumnObject *self)
{
    Py_XDECREF(self->batch);
    PyObject_Free(self);
}

static int Column_getbuffer(ColumnObject *self, Py_buffer *view, int flags)
{
    const vf_column *c = self->col;
    Py_ssize_t itemsize;
    const char *format = column_format(c->type, &itemsize);
    if (!format) {
        PyErr_SetString(PyExc_BufferError, "string columns have no buffer");
        view->obj = NULL;
        return -1;
    }
    view->buf = c->data;
    view->obj = Py_NewRef(self);
    view->len = (Py_ssize_t)c->nbytes;
    view->readonly = 0;
    view->itemsize = itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)format : NULL;
    view->ndim = c->ndim;
    view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyBufferProcs Column_buffer = {
    .bf_getbuffer = (getbufferproc)Column_getbuffer,
};

static PyObject *Column_get_shape(ColumnObject *self, void *unused)
{
    (void)unused;
    PyObject *shape = PyTuple_New(self->col->ndim);
    for (int k = 0; shape && k < self->col->ndim; k++)
        PyTuple_SET_ITEM(shape, k, PyLong_FromSsize_t(self->shape[k]));
    return shape;
}

enum column_getter { GET_DTYPE, GET_NAME, GET_ADDRESS, GET_NBYTES };

/* The column's own fields, told by the closure which. */
static PyObject *Column_get(ColumnObject *self, void *which)
{
    static const char *dtypes[] = {"float32", "float64", "int64", "int32", "uint8", "bool", "str"};
    const vf_column *c = self->col;
    switch ((enum column_getter)(intptr_t)which) {
    case GET_DTYPE: return PyUnicode_FromString(dtypes[c->type]);
    case GET_NAME: return PyUnicode_FromString(c->name);
    case GET_ADDRESS: return PyLong_FromVoidPtr(c->data);
    case GET_NBYTES: return PyLong_FromSize_t(c->nbytes);
    }
    Py_RETURN_NONE;
}

static PyGetSetDef Column_getset[] = {
    {"shape", (getter)Column_get_shape, NULL, "shape, batch dimension first", NULL},
    {"dtype", (getter)Column_get, NULL, "element type name (numpy spelling)", VF_PY_WHICH(GET_DTYPE)},
    {"name", (getter)Column_get, NULL, "column name", VF_PY_WHICH(GET_NAME)},
    {"address", (getter)Column_get, NULL, "address of the first element (engine memory)", VF_PY_WHICH(GET_ADDRESS)},
    {"nbytes", (getter)Column_get, NULL, "bytes of the column", VF_PY_WHICH(GET_NBYTES)},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject vf_py_column_type = {
    VF_PY_TYPE("Column", ColumnObject, Column_dealloc,
               "A zero-copy view of one batch column (buffer protocol); keeps the batch alive."),
    .tp_as_buffer = &Column_buffer,
    .tp_getset = Column_getset,
};
