/*
 * py_parquet_read.c: Python test hooks over the C Parquet reader, so the
 * test suite can compare it value for value with pyarrow:
 *
 *   parquet_read(path, columns=None, row_group=None) -> dict[name, list]
 *       like {name: table.column(name).to_pylist()}: nested lists, None for
 *       nulls, bytes for binary, str for strings, float for float16,
 *       dicts for structs.
 *   parquet_info(path) -> dict
 *       num_rows, created_by, fields, leaves (name, path, physical, type,
 *       repetition, max_def, max_rep), row_groups (num_rows, columns with
 *       codec, num_values, null_count and integer min/max), kv.
 *   parquet_select_row_groups(path, column, lo, hi) -> list[int]
 *
 * The reads run without the GIL; conversion to Python objects holds it.
 */
#include <math.h>

#include "_native.h"
#include "io/io.h"
#include "parquet/parquet.h"

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

static PyObject *value_to_py(const vf_pq_array *a, int64_t i)
{
    if (a->valid && !a->valid[i])
        Py_RETURN_NONE;
    const void *v = a->values;
    switch (a->type) {
    case VF_PQ_T_BOOL: return PyBool_FromLong(((const uint8_t *)v)[i]);
    case VF_PQ_T_INT8: return PyLong_FromLong(((const int8_t *)v)[i]);
    case VF_PQ_T_INT16: return PyLong_FromLong(((const int16_t *)v)[i]);
    case VF_PQ_T_INT32: return PyLong_FromLong(((const int32_t *)v)[i]);
    case VF_PQ_T_INT64: return PyLong_FromLongLong(((const int64_t *)v)[i]);
    case VF_PQ_T_UINT8: return PyLong_FromUnsignedLong(((const uint8_t *)v)[i]);
    case VF_PQ_T_UINT16: return PyLong_FromUnsignedLong(((const uint16_t *)v)[i]);
    case VF_PQ_T_UINT32: return PyLong_FromUnsignedLong(((const uint32_t *)v)[i]);
    case VF_PQ_T_UINT64: return PyLong_FromUnsignedLongLong(((const uint64_t *)v)[i]);
    case VF_PQ_T_FLOAT16: return PyFloat_FromDouble(half_to_double(((const uint16_t *)v)[i]));
    case VF_PQ_T_FLOAT: return PyFloat_FromDouble(((const float *)v)[i]);
    case VF_PQ_T_DOUBLE: return PyFloat_FromDouble(((const double *)v)[i]);
    case VF_PQ_T_STRING:
        return PyUnicode_DecodeUTF8((const char *)a->data + a->offsets[i], (Py_ssize_t)(a->offsets[i + 1] - a->offsets[i]),
                                    "strict");
    case VF_PQ_T_BINARY:
        return PyBytes_FromStringAndSize((const char *)a->data + a->offsets[i],
                                         (Py_ssize_t)(a->offsets[i + 1] - a->offsets[i]));
    case VF_PQ_T_FIXED_BINARY:
        return PyBytes_FromStringAndSize((const char *)v + (size_t)i * (size_t)a->width, a->width);
    case VF_PQ_T_LIST: {
        int64_t start = a->offsets[i], end = a->offsets[i + 1];
        PyObject *list = PyList_New((Py_ssize_t)(end - start));
        if (!list)
            return NULL;
        for (int64_t k = start; k < end; k++) {
            PyObject *item = value_to_py(&a->children[0], k);
            if (!item) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)(k - start), item);
        }
        return list;
    }
    case VF_PQ_T_STRUCT: {
        PyObject *d = PyDict_New();
        if (!d)
            return NULL;
        for (int c = 0; c < a->num_children; c++) {
            PyObject *item = value_to_py(&a->children[c], i);
            if (!item || PyDict_SetItemString(d, a->children[c].name, item) < 0) {
                Py_XDECREF(item);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(item);
        }
        return d;
    }
    default: PyErr_SetString(PyExc_TypeError, "unsupported Parquet value type"); return NULL;
    }
}

static PyObject *array_to_list(const vf_pq_array *a)
{
    PyObject *list = PyList_New((Py_ssize_t)a->length);
    if (!list)
        return NULL;
    for (int64_t i = 0; i < a->length; i++) {
        PyObject *item = value_to_py(a, i);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* A local path, or an http(s):// / s3:// URL read through the engine's own
 * HTTP layer (range reads; S3 signed from the environment's credentials). */
static int open_any(const char *path, vf_pq_file **f)
{
    if (!vf_is_url(path))
        return vf_pq_open_path(f, path);
    vf_source *src;
    int r = vf_source_open_url(&src, path, NULL);
    if (r < 0)
        return r;
    r = vf_pq_open(f, src);
    vf_source_close(src);
    return r;
}

/* Opens the file named by path_obj (a PyUnicode_FSConverter result, whose
 * reference this takes); 0, or -1 with the exception set. */
static int open_file(PyObject *path_obj, vf_pq_file **f)
{
    const char *path = PyBytes_AS_STRING(path_obj);
    int r;
    Py_BEGIN_ALLOW_THREADS r = open_any(path, f);
    Py_END_ALLOW_THREADS Py_DECREF(path_obj);
    if (r < 0) {
        vf_py_raise(r);
        return -1;
    }
    return 0;
}

/* The index of a top-level column, or -1 with KeyError set. */
static int field_or_key_error(const vf_pq_file *f, const char *name)
{
    int i = vf_pq_field_index(f, name);
    if (i < 0)
        PyErr_Format(PyExc_KeyError, "%s: no column '%s'", vf_pq_name(f), name);
    return i;
}

static PyObject *read_one(vf_pq_file *f, int field, long row_group)
{
    vf_pq_array a;
    int r;
    Py_BEGIN_ALLOW_THREADS r = row_group < 0 ? vf_pq_read_field_all(f, field, &a) : vf_pq_read_field(f, (int)row_group, field, &a);
    Py_END_ALLOW_THREADS if (r < 0) return vf_py_raise(r);
    PyObject *list = array_to_list(&a);
    vf_pq_array_free(&a);
    return list;
}

static PyObject *py_parquet_read(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"path", "columns", "row_group", NULL};
    PyObject *path_obj, *columns = Py_None, *rg_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|OO", kwlist, PyUnicode_FSConverter, &path_obj, &columns, &rg_obj))
        return NULL;
    long row_group = -1;
    if (rg_obj != Py_None) {
        row_group = PyLong_AsLong(rg_obj);
        if (row_group == -1 && PyErr_Occurred()) {
            Py_DECREF(path_obj);
            return NULL;
        }
        if (row_group < 0) {
            Py_DECREF(path_obj);
            PyErr_SetString(PyExc_IndexError, "row_group must be >= 0");
            return NULL;
        }
    }
    vf_pq_file *f;
    int rc = open_file(path_obj, &f);
    if (rc < 0)
        return NULL;
    PyObject *result = PyDict_New(), *seq = NULL;
    if (!result)
        goto fail;
    if (columns == Py_None) {
        for (int i = 0; i < vf_pq_num_fields(f); i++) {
            PyObject *list = read_one(f, i, row_group);
            if (!list || PyDict_SetItemString(result, vf_pq_field(f, i)->name, list) < 0) {
                Py_XDECREF(list);
                goto fail;
            }
            Py_DECREF(list);
        }
    } else {
        seq = PySequence_Fast(columns, "columns must be a sequence of names");
        if (!seq)
            goto fail;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
            const char *name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, k));
            if (!name)
                goto fail;
            int i = field_or_key_error(f, name);
            if (i < 0)
                goto fail;
            PyObject *list = read_one(f, i, row_group);
            if (!list || PyDict_SetItemString(result, name, list) < 0) {
                Py_XDECREF(list);
                goto fail;
            }
            Py_DECREF(list);
        }
        Py_DECREF(seq);
    }
    vf_pq_close(f);
    return result;
fail:
    Py_XDECREF(seq);
    Py_XDECREF(result);
    vf_pq_close(f);
    return NULL;
}

static const char *codec_name(vf_pq_codec c)
{
    static const char *names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : "?";
}

static const char *physical_name(vf_pq_physical p)
{
    static const char *names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
                                  "FIXED_LEN_BYTE_ARRAY"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

/* Sets d[key] = value and drops the reference; -1 on error. */
static int set_item(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

static PyObject *leaf_info(const vf_pq_node *leaf)
{
    PyObject *d = PyDict_New(), *path = PyList_New(0);
    if (!d || !path)
        goto fail;
    for (const vf_pq_node *x = leaf; x && x->parent; x = x->parent) {
        PyObject *s = PyUnicode_FromString(x->name);
        if (!s || PyList_Insert(path, 0, s) < 0) {
            Py_XDECREF(s);
            goto fail;
        }
        Py_DECREF(s);
    }
    static const char *reps[] = {"required", "optional", "repeated"};
    if (set_item(d, "name", PyUnicode_FromString(leaf->name)) < 0 || PyDict_SetItemString(d, "path", path) < 0 ||
        set_item(d, "physical", PyUnicode_FromString(physical_name(leaf->physical))) < 0 ||
        set_item(d, "type", PyUnicode_FromString(vf_pq_type_name(leaf->type))) < 0 ||
        set_item(d, "repetition", PyUnicode_FromString(reps[leaf->repetition])) < 0 ||
        set_item(d, "max_def", PyLong_FromLong(leaf->max_def)) < 0 ||
        set_item(d, "max_rep", PyLong_FromLong(leaf->max_rep)) < 0 ||
        set_item(d, "type_length", PyLong_FromLong(leaf->type_length)) < 0)
        goto fail;
    Py_DECREF(path);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(path);
    return NULL;
}

static PyObject *chunk_info(const vf_pq_file *f, int g, int l)
{
    vf_pq_chunk_info ci;
    if (vf_pq_column_chunk(f, g, l, &ci) < 0)
        return vf_py_raise(VF_ERANGE);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (set_item(d, "codec", PyUnicode_FromString(codec_name(ci.codec))) < 0 ||
        set_item(d, "num_values", PyLong_FromLongLong(ci.num_values)) < 0 ||
        set_item(d, "compressed_size", PyLong_FromLongLong(ci.compressed_size)) < 0 ||
        set_item(d, "null_count", ci.null_count < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(ci.null_count)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    int64_t mn, mx;
    int r = vf_pq_stats_i64(f, g, l, &mn, &mx);
    if (r == 0 && (set_item(d, "min", PyLong_FromLongLong(mn)) < 0 || set_item(d, "max", PyLong_FromLongLong(mx)) < 0)) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *py_parquet_info(PyObject *self, PyObject *args)
{
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &path_obj))
        return NULL;
    vf_pq_file *f;
    int rc = open_file(path_obj, &f);
    if (rc < 0)
        return NULL;
    PyObject *d = PyDict_New(), *fields = PyList_New(0), *leaves = PyList_New(0), *groups = PyList_New(0),
             *kv = PyDict_New();
    if (!d || !fields || !leaves || !groups || !kv)
        goto fail;
    for (int i = 0; i < vf_pq_num_fields(f); i++) {
        PyObject *s = PyUnicode_FromString(vf_pq_field(f, i)->name);
        if (!s || PyList_Append(fields, s) < 0) {
            Py_XDECREF(s);
            goto fail;
        }
        Py_DECREF(s);
    }
    for (int i = 0; i < vf_pq_num_leaves(f); i++) {
        PyObject *x = leaf_info(vf_pq_leaf(f, i));
        if (!x || PyList_Append(leaves, x) < 0) {
            Py_XDECREF(x);
            goto fail;
        }
        Py_DECREF(x);
    }
    for (int g = 0; g < vf_pq_num_row_groups(f); g++) {
        PyObject *rg = PyDict_New(), *cols = PyList_New(0);
        if (!rg || !cols) {
            Py_XDECREF(rg);
            Py_XDECREF(cols);
            goto fail;
        }
        int bad = set_item(rg, "num_rows", PyLong_FromLongLong(vf_pq_row_group_rows(f, g))) < 0;
        for (int l = 0; !bad && l < vf_pq_num_leaves(f); l++) {
            PyObject *c = chunk_info(f, g, l);
            bad = !c || PyList_Append(cols, c) < 0;
            Py_XDECREF(c);
        }
        bad = bad || PyDict_SetItemString(rg, "columns", cols) < 0 || PyList_Append(groups, rg) < 0;
        Py_DECREF(cols);
        Py_DECREF(rg);
        if (bad)
            goto fail;
    }
    for (int i = 0; i < vf_pq_num_kv(f); i++) {
        const char *k, *v;
        vf_pq_kv_at(f, i, &k, &v);
        if (set_item(kv, k, PyUnicode_DecodeUTF8(v, (Py_ssize_t)strlen(v), "replace")) < 0)
            goto fail;
    }
    if (set_item(d, "num_rows", PyLong_FromLongLong(vf_pq_num_rows(f))) < 0 ||
        set_item(d, "created_by", PyUnicode_DecodeUTF8(vf_pq_created_by(f), (Py_ssize_t)strlen(vf_pq_created_by(f)),
                                                       "replace")) < 0 ||
        PyDict_SetItemString(d, "fields", fields) < 0 || PyDict_SetItemString(d, "leaves", leaves) < 0 ||
        PyDict_SetItemString(d, "row_groups", groups) < 0 || PyDict_SetItemString(d, "kv", kv) < 0)
        goto fail;
    Py_DECREF(fields);
    Py_DECREF(leaves);
    Py_DECREF(groups);
    Py_DECREF(kv);
    vf_pq_close(f);
    return d;
fail:
    Py_XDECREF(d);
    Py_XDECREF(fields);
    Py_XDECREF(leaves);
    Py_XDECREF(groups);
    Py_XDECREF(kv);
    vf_pq_close(f);
    return NULL;
}

static PyObject *py_parquet_select_row_groups(PyObject *self, PyObject *args)
{
    PyObject *path_obj;
    const char *column;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "O&sLL", PyUnicode_FSConverter, &path_obj, &column, &lo, &hi))
        return NULL;
    vf_pq_file *f;
    int rc = open_file(path_obj, &f);
    if (rc < 0)
        return NULL;
    int *groups, count;
    int r = vf_pq_select_row_groups(f, column, lo, hi, &groups, &count);
    vf_pq_close(f);
    if (r < 0)
        return vf_py_raise(r);
    PyObject *list = PyList_New(count);
    for (int i = 0; list && i < count; i++) {
        PyObject *x = PyLong_FromLong(groups[i]);
        if (!x) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, x);
    }
    free(groups);
    return list;
}

/* parquet_read_rows(path, column, row_group, first_row, num_rows) -> (list, pages decoded, skipped):
 * the page-level read (vf_pq_read_field_rows). */
static PyObject *py_parquet_read_rows(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path_obj;
    const char *column;
    int row_group;
    long long first, count;
    if (!PyArg_ParseTuple(args, "O&siLL", PyUnicode_FSConverter, &path_obj, &column, &row_group, &first, &count))
        return NULL;
    vf_pq_file *f;
    int rc = open_file(path_obj, &f);
    if (rc < 0)
        return NULL;
    int field = field_or_key_error(f, column);
    if (field < 0) {
        vf_pq_close(f);
        return NULL;
    }
    vf_pq_array a;
    vf_pq_page_counts pages = {0, 0};
    int r;
    Py_BEGIN_ALLOW_THREADS r = vf_pq_read_field_rows(f, row_group, field, first, count, &a, &pages);
    Py_END_ALLOW_THREADS vf_pq_close(f);
    if (r < 0)
        return vf_py_raise(r);
    PyObject *list = array_to_list(&a);
    vf_pq_array_free(&a);
    if (!list)
        return NULL;
    return Py_BuildValue("(NLL)", list, (long long)pages.decoded, (long long)pages.skipped);
}

PyMethodDef vf_py_parquet_read_functions[] = {
    VF_PY_KW_FUNCTION("parquet_read", py_parquet_read,
     "parquet_read(path, columns=None, row_group=None) -> dict[name, list] (C reader, pyarrow-like values)"),
    {"parquet_read_rows", py_parquet_read_rows, METH_VARARGS,
     "parquet_read_rows(path, column, row_group, first_row, num_rows) -> (list, pages_decoded, pages_skipped): rows of one row "
     "group, decoding only the pages that hold them where the page headers allow"},
    {"parquet_info", py_parquet_info, METH_VARARGS, "parquet_info(path) -> dict (schema, row groups, kv metadata)"},
    {"parquet_select_row_groups", py_parquet_select_row_groups, METH_VARARGS,
     "parquet_select_row_groups(path, column, lo, hi) -> row groups whose statistics overlap [lo, hi]"},
    {NULL, NULL, 0, NULL},
};
