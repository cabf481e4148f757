/*
 * py_parquet_write.c: vlafeed._native.parquet_write(), the Python entry to
 * the C Parquet writer (used by tests and tools to produce files from plain
 * Python values).
 *
 *   parquet_write(path, columns, *, codec="snappy", dictionary=True,
 *                 data_page_version=1, page_size=1 << 20,
 *                 row_group_sizes=None, kv=None, created_by=None)
 *
 * columns is a list of (name, type_string, values). Type strings: "bool",
 * "int8".."int64", "uint8".."uint64", "float16", "float32", "float64",
 * "string", "binary", "list<T>", "struct<name:T,...>". values is a sequence
 * of Python values (None = null; lists for list<>, dicts for struct<>).
 * row_group_sizes splits the rows into consecutive row groups.
 *
 *   parquet_writer_open(path, schema, *, codec=..., kv=..., ...) -> ParquetWriter
 *
 * the same writer kept open: schema is a list of (name, type_string);
 * write_row_group(columns) appends one row group (a value sequence per
 * column), close() writes the footer, abort() (or dropping the object
 * unclosed) removes the unfinished file. The recording API writes a data
 * file this way, one row group per episode.
 *
 * Each row group's columns are built into vf_pq_array trees owned by
 * "builders" (growable buffers), handed to vf_pq_writer_write_row_group and
 * freed. The GIL is released while the C writer encodes and writes.
 */
#include "settings.h"

#include "parquet/parquet.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- type strings ---- */

typedef struct ptype {
    vf_pq_type type;
    char *name;             /* struct member name (NULL elsewhere) */
    int num_children;
    struct ptype *children;
} ptype;

static void ptype_free(ptype *t)
{
    for (int i = 0; i < t->num_children; i++)
        ptype_free(&t->children[i]);
    free(t->children);
    free(t->name);
    memset(t, 0, sizeof *t);
}

/* The scalar type names (settings.h name lists), and the codec names (case-insensitive). */
static const vf_py_choice scalar_types[] = {
    {"bool", VF_PQ_T_BOOL},     {"int8", VF_PQ_T_INT8},       {"int16", VF_PQ_T_INT16},   {"int32", VF_PQ_T_INT32},
    {"int64", VF_PQ_T_INT64},   {"uint8", VF_PQ_T_UINT8},     {"uint16", VF_PQ_T_UINT16}, {"uint32", VF_PQ_T_UINT32},
    {"uint64", VF_PQ_T_UINT64}, {"float16", VF_PQ_T_FLOAT16}, {"float32", VF_PQ_T_FLOAT}, {"float64", VF_PQ_T_DOUBLE},
    {"float", VF_PQ_T_FLOAT},   {"double", VF_PQ_T_DOUBLE},   {"string", VF_PQ_T_STRING}, {"binary", VF_PQ_T_BINARY},
    {NULL, 0},
};
static const vf_py_choice codecs[] = {
    {"none", VF_PQ_UNCOMPRESSED}, {"uncompressed", VF_PQ_UNCOMPRESSED}, {"snappy", VF_PQ_SNAPPY}, {"gzip", VF_PQ_GZIP},
    {"zstd", VF_PQ_ZSTD},         {"lz4", VF_PQ_LZ4_RAW},               {"brotli", VF_PQ_BROTLI}, {"lzo", VF_PQ_LZO},
    {NULL, 0},
};

static const char *type_label(vf_pq_type t)
{
    const char *name = vf_py_choice_name(scalar_types, (int)t);
    return name ? name : "?";
}

static void skip_space(const char **p)
{
    while (**p == ' ')
        (*p)++;
}

/* Parses one type at *p; returns 0 or -1 with ValueError set. */
static int parse_type(const char **p, ptype *out, const char *whole, int depth)
{
    memset(out, 0, sizeof *out);
    if (depth > 32) {
        PyErr_Format(PyExc_ValueError, "type '%s' is nested too deeply", whole);
        return -1;
    }
    skip_space(p);
    if (strncmp(*p, "list<", 5) == 0) {
        *p += 5;
        out->type = VF_PQ_T_LIST;
        out->children = calloc(1, sizeof *out->children);
        if (!out->children) {
            PyErr_NoMemory();
            return -1;
        }
        out->num_children = 1;
        if (parse_type(p, &out->children[0], whole, depth + 1) < 0)
            return -1;
        skip_space(p);
        if (**p != '>')
            goto bad;
        (*p)++;
        return 0;
    }
    if (strncmp(*p, "struct<", 7) == 0) {
        *p += 7;
        out->type = VF_PQ_T_STRUCT;
        for (;;) {
            skip_space(p);
            const char *name = *p;
            while (**p && **p != ':' && **p != ',' && **p != '<' && **p != '>')
                (*p)++;
            if (**p != ':' || *p == name)
                goto bad;
            ptype *c = realloc(out->children, (size_t)(out->num_children + 1) * sizeof *c);
            if (!c) {
                PyErr_NoMemory();
                return -1;
            }
            out->children = c;
            ptype *child = &out->children[out->num_children++];
            memset(child, 0, sizeof *child);
            size_t name_len = (size_t)(*p - name);
            while (name_len > 0 && name[name_len - 1] == ' ')
                name_len--;
            (*p)++;
            if (parse_type(p, child, whole, depth + 1) < 0)
                return -1;
            child->name = strndup(name, name_len);
            if (!child->name) {
                PyErr_NoMemory();
                return -1;
            }
            skip_space(p);
            if (**p == ',') {
                (*p)++;
                continue;
            }
            if (**p != '>')
                goto bad;
            (*p)++;
            return 0;
        }
    }
    for (const vf_py_choice *c = scalar_types; c->name; c++) {
        size_t n = strlen(c->name);
        if (strncmp(*p, c->name, n) == 0) {
            char next = (*p)[n];
            if (next == 0 || next == '>' || next == ',' || next == ' ') {
                out->type = (vf_pq_type)c->value;
                *p += n;
                return 0;
            }
        }
    }
bad:
    PyErr_Format(PyExc_ValueError, "cannot parse type '%s' near '%s'", whole, *p);
    return -1;
}

static int parse_type_string(const char *s, ptype *out)
{
    const char *p = s;
    if (parse_type(&p, out, s, 0) < 0) {
        ptype_free(out);
        return -1;
    }
    skip_space(&p);
    if (*p) {
        PyErr_Format(PyExc_ValueError, "cannot parse type '%s': trailing '%s'", s, p);
        ptype_free(out);
        return -1;
    }
    return 0;
}

/* ---- builders ---- */

typedef struct builder {
    const ptype *type;
    const char *column;      /* for messages */
    int64_t length;
    int64_t null_count;
    vf_buf valid;
    vf_buf values;
    vf_buf offsets;          /* int64, starts with 0 */
    vf_buf data;
    struct builder *children;
    int num_children;
} builder;

static void builder_free(builder *b)
{
    for (int i = 0; i < b->num_children; i++)
        builder_free(&b->children[i]);
    free(b->children);
    vf_buf_free(&b->valid);
    vf_buf_free(&b->values);
    vf_buf_free(&b->offsets);
    vf_buf_free(&b->data);
    memset(b, 0, sizeof *b);
}

static int nomem(void)
{
    PyErr_NoMemory();
    return -1;
}

static int builder_init(builder *b, const ptype *t, const char *column)
{
    memset(b, 0, sizeof *b);
    b->type = t;
    b->column = column;
    if (t->type == VF_PQ_T_LIST || t->type == VF_PQ_T_STRING || t->type == VF_PQ_T_BINARY) {
        int64_t zero = 0;
        if (vf_buf_append(&b->offsets, &zero, sizeof zero) < 0)
            return nomem();
    }
    if (t->num_children > 0) {
        b->children = calloc((size_t)t->num_children, sizeof *b->children);
        if (!b->children)
            return nomem();
        b->num_children = t->num_children;
        for (int i = 0; i < t->num_children; i++)
            if (builder_init(&b->children[i], &t->children[i], column) < 0)
                return -1;
    }
    return 0;
}

static int append_offset(builder *b, int64_t end)
{
    return vf_buf_append(&b->offsets, &end, sizeof end) < 0 ? nomem() : 0;
}

static int append_int(builder *b, PyObject *v)
{
    static const struct {
        vf_pq_type type;
        long long lo, hi;
    } ranges[] = {
        {VF_PQ_T_INT8, INT8_MIN, INT8_MAX},      {VF_PQ_T_INT16, INT16_MIN, INT16_MAX},
        {VF_PQ_T_INT32, INT32_MIN, INT32_MAX},   {VF_PQ_T_INT64, INT64_MIN, INT64_MAX},
        {VF_PQ_T_UINT8, 0, UINT8_MAX},           {VF_PQ_T_UINT16, 0, UINT16_MAX},
        {VF_PQ_T_UINT32, 0, UINT32_MAX},
    };
    vf_pq_type t = b->type->type;
    PyObject *index = PyNumber_Index(v);
    if (!index) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "column '%s': %s value expected, got %s", b->column,
                     t == VF_PQ_T_UINT64 ? "uint64" : "integer", Py_TYPE(v)->tp_name);
        return -1;
    }
    if (t == VF_PQ_T_UINT64) {
        unsigned long long u = PyLong_AsUnsignedLongLong(index);
        Py_DECREF(index);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "column '%s': value out of range for uint64", b->column);
            return -1;
        }
        uint64_t x = u;
        return vf_buf_append(&b->values, &x, 8) < 0 ? nomem() : 0;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (x == -1 && PyErr_Occurred())
        return -1;
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        if (ranges[i].type != t)
            continue;
        if (overflow || x < ranges[i].lo || x > ranges[i].hi) {
            PyObject *repr = PyObject_Repr(v);
            PyErr_Format(PyExc_ValueError, "column '%s': value %s out of range for %s", b->column,
                         repr ? PyUnicode_AsUTF8(repr) : "?", type_label(t));
            Py_XDECREF(repr);
            return -1;
        }
    }
    int rc;
    switch (t) {
    case VF_PQ_T_INT8: { int8_t y = (int8_t)x; rc = vf_buf_append(&b->values, &y, 1); break; }
    case VF_PQ_T_UINT8: { uint8_t y = (uint8_t)x; rc = vf_buf_append(&b->values, &y, 1); break; }
    case VF_PQ_T_INT16: { int16_t y = (int16_t)x; rc = vf_buf_append(&b->values, &y, 2); break; }
    case VF_PQ_T_UINT16: { uint16_t y = (uint16_t)x; rc = vf_buf_append(&b->values, &y, 2); break; }
    case VF_PQ_T_INT32: { int32_t y = (int32_t)x; rc = vf_buf_append(&b->values, &y, 4); break; }
    case VF_PQ_T_UINT32: { uint32_t y = (uint32_t)x; rc = vf_buf_append(&b->values, &y, 4); break; }
    default: { int64_t y = (int64_t)x; rc = vf_buf_append(&b->values, &y, 8); break; }
    }
    return rc < 0 ? nomem() : 0;
}

static int builder_append(builder *b, PyObject *v);

static int append_null(builder *b)
{
    b->null_count++;
    vf_pq_type t = b->type->type;
    size_t size = vf_pq_type_size(t);
    if (size) {
        uint8_t zero[8] = {0};
        if (vf_buf_append(&b->values, zero, size) < 0)
            return nomem();
    } else if (t == VF_PQ_T_LIST || t == VF_PQ_T_STRING || t == VF_PQ_T_BINARY) {
        int64_t last = t == VF_PQ_T_LIST ? b->children[0].length : (int64_t)b->data.len;
        if (append_offset(b, last) < 0)
            return -1;
    } else if (t == VF_PQ_T_STRUCT) {
        /* Children get a null too (their value is hidden by the struct's). */
        for (int i = 0; i < b->num_children; i++)
            if (builder_append(&b->children[i], Py_None) < 0)
                return -1;
    }
    return 0;
}

static int append_value(builder *b, PyObject *v)
{
    vf_pq_type t = b->type->type;
    switch (t) {
    case VF_PQ_T_BOOL: {
        int truth = PyObject_IsTrue(v);
        if (truth < 0)
            return -1;
        uint8_t x = (uint8_t)truth;
        return vf_buf_append(&b->values, &x, 1) < 0 ? nomem() : 0;
    }
    case VF_PQ_T_INT8:
    case VF_PQ_T_INT16:
    case VF_PQ_T_INT32:
    case VF_PQ_T_INT64:
    case VF_PQ_T_UINT8:
    case VF_PQ_T_UINT16:
    case VF_PQ_T_UINT32:
    case VF_PQ_T_UINT64:
        return append_int(b, v);
    case VF_PQ_T_FLOAT16:
    case VF_PQ_T_FLOAT:
    case VF_PQ_T_DOUBLE: {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "column '%s': float value expected, got %s", b->column,
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        if (t == VF_PQ_T_DOUBLE)
            return vf_buf_append(&b->values, &d, 8) < 0 ? nomem() : 0;
        if (t == VF_PQ_T_FLOAT) {
            float f = (float)d;
            return vf_buf_append(&b->values, &f, 4) < 0 ? nomem() : 0;
        }
        unsigned char half[2];
        if (PyFloat_Pack2(d, (char *)half, 1) < 0)
            return -1;
        return vf_buf_append(&b->values, half, 2) < 0 ? nomem() : 0;
    }
    case VF_PQ_T_STRING: {
        if (!PyUnicode_Check(v)) {
            PyErr_Format(PyExc_TypeError, "column '%s': str expected, got %s", b->column, Py_TYPE(v)->tp_name);
            return -1;
        }
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(v, &len);
        if (!s)
            return -1;
        if (vf_buf_append(&b->data, s, (size_t)len) < 0)
            return nomem();
        return append_offset(b, (int64_t)b->data.len);
    }
    case VF_PQ_T_BINARY: {
        Py_buffer view;
        if (PyUnicode_Check(v) || PyObject_GetBuffer(v, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "column '%s': bytes expected, got %s", b->column, Py_TYPE(v)->tp_name);
            return -1;
        }
        int rc = vf_buf_append(&b->data, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
        if (rc < 0)
            return nomem();
        return append_offset(b, (int64_t)b->data.len);
    }
    case VF_PQ_T_LIST: {
        if (PyUnicode_Check(v) || PyBytes_Check(v) || PyDict_Check(v)) {
            PyErr_Format(PyExc_TypeError, "column '%s': list expected, got %s", b->column, Py_TYPE(v)->tp_name);
            return -1;
        }
        PyObject *seq = PySequence_Fast(v, "list expected");
        if (!seq) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "column '%s': list expected, got %s", b->column, Py_TYPE(v)->tp_name);
            return -1;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (builder_append(&b->children[0], items[i]) < 0) {
                Py_DECREF(seq);
                return -1;
            }
        }
        Py_DECREF(seq);
        return append_offset(b, b->children[0].length);
    }
    case VF_PQ_T_STRUCT: {
        if (!PyDict_Check(v)) {
            PyErr_Format(PyExc_TypeError, "column '%s': dict expected for a struct, got %s", b->column,
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        Py_ssize_t matched = 0;
        for (int i = 0; i < b->num_children; i++) {
            PyObject *item = PyDict_GetItemString(v, b->type->children[i].name); /* borrowed */
            matched += item != NULL;
            if (builder_append(&b->children[i], item ? item : Py_None) < 0)
                return -1;
        }
        if (matched != PyDict_Size(v)) {
            PyErr_Format(PyExc_ValueError, "column '%s': struct value has keys that are not fields of the struct",
                         b->column);
            return -1;
        }
        return 0;
    }
    default:
        PyErr_Format(PyExc_ValueError, "column '%s': unsupported type", b->column);
        return -1;
    }
}

static int builder_append(builder *b, PyObject *v)
{
    uint8_t is_valid = v != Py_None;
    if (vf_buf_append(&b->valid, &is_valid, 1) < 0)
        return nomem();
    int rc = is_valid ? append_value(b, v) : append_null(b);
    if (rc < 0)
        return -1;
    b->length++;
    return 0;
}

/* Views the builder as a vf_pq_array (memory stays the builder's; free
 * the children arrays with array_view_free). */
static int builder_view(builder *b, const char *name, vf_pq_array *a)
{
    memset(a, 0, sizeof *a);
    a->type = b->type->type;
    a->name = (char *)name;
    a->length = b->length;
    a->null_count = b->null_count;
    a->valid = b->null_count ? b->valid.data : NULL;
    a->values = b->values.data;
    a->offsets = b->offsets.len ? (int64_t *)(void *)b->offsets.data : NULL;
    a->data = b->data.data;
    a->data_len = (int64_t)b->data.len;
    a->children = b->num_children > 0 ? calloc((size_t)b->num_children, sizeof *a->children) : NULL;
    a->num_children = a->children ? b->num_children : 0;
    int rc = a->num_children < b->num_children ? nomem() : 0;
    for (int i = 0; rc == 0 && i < a->num_children; i++)
        rc = builder_view(&b->children[i], b->type->children[i].name, &a->children[i]);
    return rc;
}

static void array_view_free(vf_pq_array *a)
{
    for (int i = 0; i < a->num_children; i++)
        array_view_free(&a->children[i]);
    free(a->children);
    memset(a, 0, sizeof *a);
}

/* ---- parquet_write ---- */

typedef struct column_spec {
    const char *name;
    ptype type;
    PyObject *values; /* PySequence_Fast result (owned) */
    Py_ssize_t length;
} column_spec;

static int parse_codec(const char *s, vf_pq_codec *out)
{
    for (const vf_py_choice *c = codecs; c->name; c++) {
        if (strcasecmp(s, c->name) == 0) {
            *out = (vf_pq_codec)c->value;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown codec '%s'", s);
    return -1;
}

static int write_row_group(vf_pq_writer *w, column_spec *cols, int ncols, Py_ssize_t start, Py_ssize_t count)
{
    builder *builders = calloc((size_t)ncols, sizeof *builders);
    vf_pq_array *arrays = calloc((size_t)ncols, sizeof *arrays);
    int rc = -1;
    if (!builders || !arrays) {
        nomem();
        goto done;
    }
    for (int c = 0; c < ncols; c++) {
        if (builder_init(&builders[c], &cols[c].type, cols[c].name) < 0)
            goto done;
        Py_ssize_t end = start + count;
        if (end > cols[c].length)
            end = cols[c].length;
        PyObject **items = PySequence_Fast_ITEMS(cols[c].values);
        for (Py_ssize_t i = start; i < end; i++)
            if (builder_append(&builders[c], items[i]) < 0)
                goto done;
        if (builder_view(&builders[c], cols[c].name, &arrays[c]) < 0)
            goto done;
    }
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_pq_writer_write_row_group(w, arrays, ncols);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        vf_py_raise(r);
        goto done;
    }
    rc = 0;
done:
    for (int c = 0; c < ncols; c++) {
        if (arrays)
            array_view_free(&arrays[c]);
        if (builders)
            builder_free(&builders[c]);
    }
    free(arrays);
    free(builders);
    return rc;
}

static PyObject *py_parquet_write(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"path", "columns", "codec", "dictionary", "data_page_version", "page_size",
                               "row_group_sizes", "kv", "created_by", NULL};
    PyObject *path_obj, *columns;
    const char *codec_name = "snappy";
    int dictionary = 1, page_version = 1;
    Py_ssize_t page_size = 1 << 20;
    PyObject *rg_sizes = Py_None, *kv = Py_None;
    const char *created_by = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|$spinOOz", keywords, PyUnicode_FSConverter, &path_obj,
                                     &columns, &codec_name, &dictionary, &page_version, &page_size, &rg_sizes, &kv,
                                     &created_by))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_obj);
    vf_pq_writer_settings settings;
    vf_pq_writer_defaults(&settings);
    settings.dictionary = dictionary ? 1 : 0;
    settings.data_page_version = page_version;
    if (page_size <= 0) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "page_size must be positive");
        return NULL;
    }
    settings.page_size = (size_t)page_size;
    settings.created_by = created_by;

    PyObject *result = NULL, *col_seq = NULL, *sizes_seq = NULL;
    column_spec *cols = NULL;
    int ncols = 0;
    vf_pq_writer *w = NULL;
    if (parse_codec(codec_name, &settings.codec) < 0)
        goto done;
    col_seq = PySequence_Fast(columns, "columns must be a list of (name, type, values)");
    if (!col_seq)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(col_seq);
    if (n > INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "too many columns");
        goto done;
    }
    cols = calloc((size_t)(n ? n : 1), sizeof *cols);
    if (!cols) {
        nomem();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(col_seq, i);
        PyObject *values;
        const char *type_string;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "ssO", &cols[i].name, &type_string, &values)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each column must be a (name, type, values) tuple");
            goto done;
        }
        ncols = (int)i + 1;
        if (parse_type_string(type_string, &cols[i].type) < 0)
            goto done;
        cols[i].values = PySequence_Fast(values, "column values must be a sequence");
        if (!cols[i].values)
            goto done;
        cols[i].length = PySequence_Fast_GET_SIZE(cols[i].values);
    }
    Py_ssize_t num_rows = ncols > 0 ? cols[0].length : 0;

    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_pq_writer_open(&w, path, &settings);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        vf_py_raise(rc);
        goto done;
    }
    if (kv != Py_None) {
        if (!PyDict_Check(kv)) {
            PyErr_SetString(PyExc_TypeError, "kv must be a dict of str to str");
            goto done;
        }
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kv, &pos, &key, &value)) {
            if (!PyUnicode_Check(key) || (value != Py_None && !PyUnicode_Check(value))) {
                PyErr_SetString(PyExc_TypeError, "kv must be a dict of str to str");
                goto done;
            }
            const char *k = PyUnicode_AsUTF8(key);
            const char *v = value == Py_None ? NULL : PyUnicode_AsUTF8(value);
            if (!k || (value != Py_None && !v))
                goto done;
            if ((rc = vf_pq_writer_add_kv(w, k, v)) < 0) {
                vf_py_raise(rc);
                goto done;
            }
        }
    }
    if (rg_sizes == Py_None) {
        /* One row group; the C writer checks that the lengths agree. */
        Py_ssize_t most = 0;
        for (int c = 0; c < ncols; c++)
            most = cols[c].length > most ? cols[c].length : most;
        if (write_row_group(w, cols, ncols, 0, most) < 0)
            goto done;
    } else {
        sizes_seq = PySequence_Fast(rg_sizes, "row_group_sizes must be a list of ints");
        if (!sizes_seq)
            goto done;
        Py_ssize_t total = 0, ngroups = PySequence_Fast_GET_SIZE(sizes_seq);
        for (Py_ssize_t g = 0; g < ngroups; g++) {
            Py_ssize_t size = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(sizes_seq, g));
            if (size == -1 && PyErr_Occurred())
                goto done;
            if (size < 0) {
                PyErr_SetString(PyExc_ValueError, "row_group_sizes must not be negative");
                goto done;
            }
            total += size;
        }
        for (int c = 0; c < ncols; c++) {
            if (cols[c].length != total) {
                PyErr_Format(PyExc_ValueError, "column '%s' has %zd rows but row_group_sizes add up to %zd",
                             cols[c].name, cols[c].length, total);
                goto done;
            }
        }
        Py_ssize_t start = 0;
        for (Py_ssize_t g = 0; g < ngroups; g++) {
            Py_ssize_t size = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(sizes_seq, g));
            if (write_row_group(w, cols, ncols, start, size) < 0)
                goto done;
            start += size;
        }
    }
    (void)num_rows;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_pq_writer_close(w);
    Py_END_ALLOW_THREADS
    w = NULL;
    if (rc < 0) {
        vf_py_raise(rc);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (w)
        vf_pq_writer_abort(w);
    for (int c = 0; c < ncols; c++) {
        ptype_free(&cols[c].type);
        Py_XDECREF(cols[c].values);
    }
    free(cols);
    Py_XDECREF(col_seq);
    Py_XDECREF(sizes_seq);
    Py_DECREF(path_obj);
    return result;
}

/* ---- ParquetWriter: one file written a row group at a time ---- */

typedef struct py_pq_writer {
    PyObject_HEAD
    vf_pq_writer *writer;  /* NULL once closed or aborted */
    int ncols;
    char **names;          /* owned */
    ptype *types;          /* owned */
    long long rows;        /* rows written so far */
} py_pq_writer;

static void pq_writer_free_schema(py_pq_writer *self)
{
    for (int c = 0; c < self->ncols; c++) {
        free(self->names[c]);
        ptype_free(&self->types[c]);
    }
    free(self->names);
    free(self->types);
    self->names = NULL;
    self->types = NULL;
    self->ncols = 0;
}

static void pq_writer_dealloc(PyObject *obj)
{
    py_pq_writer *self = (py_pq_writer *)obj;
    if (self->writer)
        vf_pq_writer_abort(self->writer); /* never closed: the partial file is removed */
    pq_writer_free_schema(self);
    Py_TYPE(obj)->tp_free(obj);
}

static int pq_writer_check_open(py_pq_writer *self)
{
    if (!self->writer) {
        PyErr_SetString(PyExc_ValueError, "the Parquet writer is closed");
        return -1;
    }
    return 0;
}

/* write_row_group(columns): one value sequence per schema column, all of one length. */
static PyObject *pq_writer_write_row_group(PyObject *obj, PyObject *columns)
{
    py_pq_writer *self = (py_pq_writer *)obj;
    if (pq_writer_check_open(self) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(columns, "write_row_group takes a list of column value sequences");
    if (!seq)
        return NULL;
    PyObject *result = NULL;
    column_spec *cols = NULL;
    int filled = 0;
    if (PySequence_Fast_GET_SIZE(seq) != self->ncols) {
        PyErr_Format(PyExc_ValueError, "write_row_group got %zd columns for a schema of %d",
                     PySequence_Fast_GET_SIZE(seq), self->ncols);
        goto done;
    }
    cols = calloc((size_t)(self->ncols ? self->ncols : 1), sizeof *cols);
    if (!cols) {
        nomem();
        goto done;
    }
    for (int c = 0; c < self->ncols; c++) {
        cols[c].name = self->names[c];
        cols[c].type = self->types[c]; /* borrowed: not freed here */
        cols[c].values = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, c), "column values must be a sequence");
        if (!cols[c].values)
            goto done;
        filled = c + 1;
        cols[c].length = PySequence_Fast_GET_SIZE(cols[c].values);
        if (cols[c].length != cols[0].length) {
            PyErr_Format(PyExc_ValueError, "column '%s' has %zd rows, column '%s' %zd", cols[c].name, cols[c].length,
                         cols[0].name, cols[0].length);
            goto done;
        }
    }
    Py_ssize_t count = self->ncols > 0 ? cols[0].length : 0;
    if (write_row_group(self->writer, cols, self->ncols, 0, count) < 0)
        goto done;
    self->rows += count;
    result = Py_NewRef(Py_None);
done:
    for (int c = 0; c < filled; c++)
        Py_XDECREF(cols[c].values);
    free(cols);
    Py_DECREF(seq);
    return result;
}

/* close(): writes the footer; the file is complete. */
static PyObject *pq_writer_close(PyObject *obj, PyObject *unused)
{
    (void)unused;
    py_pq_writer *self = (py_pq_writer *)obj;
    if (!self->writer)
        Py_RETURN_NONE; /* idempotent */
    vf_pq_writer *w = self->writer;
    self->writer = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = vf_pq_writer_close(w);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return vf_py_raise(rc);
    Py_RETURN_NONE;
}

/* abort(): drops the file being written. */
static PyObject *pq_writer_abort(PyObject *obj, PyObject *unused)
{
    (void)unused;
    py_pq_writer *self = (py_pq_writer *)obj;
    if (self->writer) {
        vf_pq_writer_abort(self->writer);
        self->writer = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *pq_writer_rows(PyObject *obj, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(((py_pq_writer *)obj)->rows);
}

static PyObject *pq_writer_bytes(PyObject *obj, void *closure)
{
    (void)closure;
    py_pq_writer *self = (py_pq_writer *)obj;
    if (pq_writer_check_open(self) < 0)
        return NULL;
    return PyLong_FromLongLong((long long)vf_pq_writer_bytes(self->writer));
}

static PyObject *pq_writer_is_open(PyObject *obj, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((py_pq_writer *)obj)->writer != NULL);
}

static PyMethodDef pq_writer_methods[] = {
    {"write_row_group", pq_writer_write_row_group, METH_O,
     "write_row_group(columns): one row group; columns holds a value sequence per schema column"},
    {"close", pq_writer_close, METH_NOARGS, "close(): writes the footer (idempotent)"},
    {"abort", pq_writer_abort, METH_NOARGS, "abort(): removes the unfinished file"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pq_writer_getset[] = {
    {"rows", pq_writer_rows, NULL, "rows written so far", NULL},
    {"bytes", pq_writer_bytes, NULL, "bytes of the file so far, footer not included (the file is under a "
     "temporary name until close())", NULL},
    {"is_open", pq_writer_is_open, NULL, "False after close() or abort()", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject py_pq_writer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.ParquetWriter",
    .tp_basicsize = sizeof(py_pq_writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A Parquet file written one row group at a time (parquet_writer_open); the footer is written by "
              "close(), and a writer dropped unclosed removes its file.",
    .tp_dealloc = pq_writer_dealloc,
    .tp_methods = pq_writer_methods,
    .tp_getset = pq_writer_getset,
};

static PyObject *py_parquet_writer_open(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path", "schema", "codec", "dictionary", "data_page_version", "page_size",
                               "kv", "created_by", NULL};
    PyObject *path_obj, *schema, *kv = Py_None;
    const char *codec_name = "snappy", *created_by = NULL;
    int dictionary = 1, page_version = 1;
    Py_ssize_t page_size = 1 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|$spinOz", keywords, PyUnicode_FSConverter, &path_obj,
                                     &schema, &codec_name, &dictionary, &page_version, &page_size, &kv, &created_by))
        return NULL;
    if (PyType_Ready(&py_pq_writer_type) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    vf_pq_writer_settings settings;
    vf_pq_writer_defaults(&settings);
    settings.dictionary = dictionary ? 1 : 0;
    settings.data_page_version = page_version;
    settings.created_by = created_by;
    py_pq_writer *obj = NULL;
    PyObject *seq = NULL;
    if (page_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "page_size must be positive");
        goto fail;
    }
    settings.page_size = (size_t)page_size;
    if (parse_codec(codec_name, &settings.codec) < 0)
        goto fail;
    if (kv != Py_None && !PyDict_Check(kv)) {
        PyErr_SetString(PyExc_TypeError, "kv must be a dict of str to str");
        goto fail;
    }
    seq = PySequence_Fast(schema, "schema must be a list of (name, type) pairs");
    if (!seq)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "too many columns");
        goto fail;
    }
    obj = PyObject_New(py_pq_writer, &py_pq_writer_type);
    if (!obj)
        goto fail;
    obj->writer = NULL;
    obj->ncols = 0;
    obj->rows = 0;
    obj->names = calloc((size_t)(n ? n : 1), sizeof *obj->names);
    obj->types = calloc((size_t)(n ? n : 1), sizeof *obj->types);
    if (!obj->names || !obj->types) {
        nomem();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *name, *type_string;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "ss", &name, &type_string)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each schema entry must be a (name, type) tuple");
            goto fail;
        }
        obj->ncols = (int)i + 1;
        obj->names[i] = strdup(name);
        if (!obj->names[i]) {
            nomem();
            goto fail;
        }
        if (parse_type_string(type_string, &obj->types[i]) < 0)
            goto fail;
    }
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    rc = vf_pq_writer_open(&obj->writer, path, &settings);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        obj->writer = NULL;
        vf_py_raise(rc);
        goto fail;
    }
    if (kv != Py_None) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kv, &pos, &key, &value)) {
            if (!PyUnicode_Check(key) || (value != Py_None && !PyUnicode_Check(value))) {
                PyErr_SetString(PyExc_TypeError, "kv must be a dict of str to str");
                goto fail;
            }
            const char *k = PyUnicode_AsUTF8(key);
            const char *v = value == Py_None ? NULL : PyUnicode_AsUTF8(value);
            if (!k || (value != Py_None && !v))
                goto fail;
            if ((rc = vf_pq_writer_add_kv(obj->writer, k, v)) < 0) {
                vf_py_raise(rc);
                goto fail;
            }
        }
    }
    Py_DECREF(seq);
    Py_DECREF(path_obj);
    return (PyObject *)obj;
fail:
    Py_XDECREF(seq);
    Py_XDECREF(obj); /* dealloc aborts an opened writer */
    Py_DECREF(path_obj);
    return NULL;
}

PyMethodDef vf_py_parquet_write_functions[] = {
    VF_PY_KW_FUNCTION("parquet_writer_open", py_parquet_writer_open,
     "parquet_writer_open(path, schema, *, codec='snappy', dictionary=True, data_page_version=1, page_size=1<<20, "
     "kv=None, created_by=None) -> ParquetWriter\n\nschema is a list of (name, type_string); write row groups with "
     "write_row_group(columns), finish with close()."),
    VF_PY_KW_FUNCTION("parquet_write", py_parquet_write,
     "parquet_write(path, columns, *, codec='snappy', dictionary=True, data_page_version=1, page_size=1<<20, "
     "row_group_sizes=None, kv=None, created_by=None)\n\nWrites a Parquet file with the C writer. columns is a "
     "list of (name, type_string, values)."),
    {NULL, NULL, 0, NULL},
};
