/*
 * writer.c: the Parquet writer API of parquet.h (vf_pq_writer_*): settings,
 * the schema derived from the first row group's arrays, input validation,
 * file output through a temporary name, and the footer.
 *
 * Invariants:
 *  - Bytes go to "<path>.tmp-<pid>-<n>" (created O_EXCL, so two writers
 *    never share one); close() writes the footer, fsyncs and renames it to
 *    path, abort() and every failed close() unlink it. A crash therefore
 *    never leaves a partial file under the final name.
 *  - A row group is fully validated (array structure, lengths, schema
 *    match) before any of its bytes are written; such errors leave the
 *    writer usable. A failure after bytes were written (I/O, memory) marks
 *    the writer failed: later calls return an error and close() deletes
 *    the file.
 *  - The schema is pyarrow's: every field OPTIONAL, LIST as
 *    `optional group <name> (LIST) { repeated group list { optional <elem>
 *    element } }`, STRUCT as an optional group, small integers as INT32 with
 *    an INTEGER logical type, FLOAT16 as FIXED_LEN_BYTE_ARRAY(2).
 *  - Writer output buffering is private to the handle; no global state.
 */
#define _GNU_SOURCE
#include "parquet/writer_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUT_BUFFER_SIZE (1 << 20)

typedef struct rg_meta {
    vf_pq_w_chunk *chunks; /* num_leaves */
    int64_t num_rows;
    int64_t file_offset;
    int64_t total_byte_size;
    int64_t total_compressed_size;
} rg_meta;

struct vf_pq_writer {
    char *path;
    char *tmp_path;
    int fd;
    vf_pq_writer_settings settings;
    char *created_by;
    vf_buf out;           /* pending output */
    int64_t offset;       /* file position after `out` is flushed */
    int failed;           /* error code of a failure after bytes were written */
    /* schema (fixed by the first row group) */
    int have_schema;
    int num_fields;
    char **field_names;
    char **field_sigs;
    vf_pq_tw_schema_element *schema;
    char **schema_names;  /* the owned copies of schema[i].name */
    int num_schema;
    size_t schema_cap, schema_names_cap;
    vf_pq_w_leaf *leaves;
    int num_leaves;
    size_t leaves_cap;
    /* row groups */
    rg_meta *row_groups;
    int num_row_groups;
    size_t row_groups_cap;
    int64_t num_rows;
    /* key-value metadata */
    char **kv_keys;
    char **kv_values;
    int num_kv;
    size_t kv_keys_cap, kv_values_cap;
    /* scratch for chunk encoding */
    vf_buf dict_page, data_pages;
};

/* ---- names ---- */

const char *vf_pq_w_type_name(vf_pq_type t)
{
    switch (t) {
    case VF_PQ_T_NULL: return "null";
    case VF_PQ_T_BOOL: return "bool";
    case VF_PQ_T_INT8: return "int8";
    case VF_PQ_T_INT16: return "int16";
    case VF_PQ_T_INT32: return "int32";
    case VF_PQ_T_INT64: return "int64";
    case VF_PQ_T_UINT8: return "uint8";
    case VF_PQ_T_UINT16: return "uint16";
    case VF_PQ_T_UINT32: return "uint32";
    case VF_PQ_T_UINT64: return "uint64";
    case VF_PQ_T_FLOAT16: return "float16";
    case VF_PQ_T_FLOAT: return "float32";
    case VF_PQ_T_DOUBLE: return "float64";
    case VF_PQ_T_STRING: return "string";
    case VF_PQ_T_BINARY: return "binary";
    case VF_PQ_T_FIXED_BINARY: return "fixed_binary";
    case VF_PQ_T_LIST: return "list";
    case VF_PQ_T_STRUCT: return "struct";
    }
    return "unknown";
}

/* ---- settings ---- */

void vf_pq_writer_defaults(vf_pq_writer_settings *s)
{
    memset(s, 0, sizeof *s);
    s->codec = VF_PQ_SNAPPY;
    s->dictionary = 1;
    s->data_page_version = 1;
    s->page_size = 1 << 20;
    s->created_by = NULL; /* "vlafeed version X" */
}

static int check_settings(const char *path, const vf_pq_writer_settings *s)
{
    switch (s->codec) {
    case VF_PQ_UNCOMPRESSED:
    case VF_PQ_SNAPPY:
    case VF_PQ_GZIP:
    case VF_PQ_ZSTD:
        break;
    default:
        if ((int)s->codec >= 0 && (int)s->codec <= VF_PQ_LZ4_RAW)
            return vf_error(VF_EUNSUPPORTED, "%s: codec %s is not supported by the writer (use UNCOMPRESSED, "
                            "SNAPPY, GZIP or ZSTD)", path, vf_pq_w_codec_name(s->codec));
        return vf_error(VF_EINVAL, "%s: invalid codec %d", path, (int)s->codec);
    }
    if (s->data_page_version != 1 && s->data_page_version != 2)
        return vf_error(VF_EINVAL, "%s: data_page_version must be 1 or 2, not %d", path, s->data_page_version);
    if (s->page_size == 0)
        return vf_error(VF_EINVAL, "%s: page_size must be positive", path);
    if (s->dictionary != 0 && s->dictionary != 1)
        return vf_error(VF_EINVAL, "%s: dictionary must be 0 or 1, not %d", path, s->dictionary);
    return 0;
}

/* ---- output ---- */

static int write_all(vf_pq_writer *w, const uint8_t *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(w->fd, data, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return vf_error(VF_EIO, "%s: write failed: %s", w->path, strerror(errno));
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static int out_flush(vf_pq_writer *w)
{
    int rc = write_all(w, w->out.data, w->out.len);
    w->out.len = 0;
    return rc;
}

static int out_write(vf_pq_writer *w, const void *data, size_t len)
{
    int rc;
    if (w->out.len + len > OUT_BUFFER_SIZE) {
        if ((rc = out_flush(w)) < 0)
            return rc;
        if (len >= OUT_BUFFER_SIZE) {
            if ((rc = write_all(w, data, len)) < 0)
                return rc;
            w->offset += (int64_t)len;
            return 0;
        }
    }
    if ((rc = vf_buf_append(&w->out, data, len)) < 0)
        return rc;
    w->offset += (int64_t)len;
    return 0;
}

int64_t vf_pq_writer_bytes(const vf_pq_writer *w)
{
    return w->offset;
}

/* ---- open / kv ---- */

static void free_schema(vf_pq_writer *w)
{
    for (int i = 0; i < w->num_fields; i++) {
        free(w->field_names ? w->field_names[i] : NULL);
        free(w->field_sigs ? w->field_sigs[i] : NULL);
    }
    free(w->field_names);
    free(w->field_sigs);
    w->field_names = w->field_sigs = NULL;
    w->num_fields = 0;
    for (int i = 0; i < w->num_schema; i++)
        free(w->schema_names[i]);
    free(w->schema_names);
    free(w->schema);
    w->schema_names = NULL;
    w->schema = NULL;
    w->num_schema = 0;
    w->schema_cap = w->schema_names_cap = 0;
    for (int i = 0; i < w->num_leaves; i++) {
        for (int j = 0; j < w->leaves[i].path_len; j++)
            free(w->leaves[i].path[j]);
        free(w->leaves[i].path);
        free(w->leaves[i].dotted);
    }
    free(w->leaves);
    w->leaves = NULL;
    w->num_leaves = 0;
    w->leaves_cap = 0;
    w->have_schema = 0;
}

static void free_writer(vf_pq_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->num_row_groups; i++) {
        for (int j = 0; j < w->num_leaves; j++)
            vf_pq_w_chunk_free(&w->row_groups[i].chunks[j]);
        free(w->row_groups[i].chunks);
    }
    free(w->row_groups);
    free_schema(w);
    for (int i = 0; i < w->num_kv; i++) {
        free(w->kv_keys[i]);
        free(w->kv_values[i]);
    }
    free(w->kv_keys);
    free(w->kv_values);
    vf_buf_free(&w->out);
    vf_buf_free(&w->dict_page);
    vf_buf_free(&w->data_pages);
    free(w->created_by);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

static int create_temp(vf_pq_writer *w)
{
    for (int attempt = 0; attempt < 1000; attempt++) {
        free(w->tmp_path);
        w->tmp_path = vf_asprintf("%s.tmp-%ld-%d", w->path, (long)getpid(), attempt);
        if (!w->tmp_path)
            return VF_ENOMEM;
        w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0)
            return 0;
        if (errno != EEXIST) {
            int code = errno == ENOENT ? VF_ENOENT : VF_EIO;
            return vf_error(code, "%s: cannot create %s: %s", w->path, w->tmp_path, strerror(errno));
        }
    }
    return vf_error(VF_EIO, "%s: cannot create a temporary file next to it", w->path);
}

int vf_pq_writer_open(vf_pq_writer **out, const char *path, const vf_pq_writer_settings *s)
{
    *out = NULL;
    if (!path || !*path)
        return vf_error(VF_EINVAL, "parquet writer: empty path");
    vf_pq_writer_settings defaults;
    if (!s) {
        vf_pq_writer_defaults(&defaults);
        s = &defaults;
    }
    int rc = check_settings(path, s);
    if (rc < 0)
        return rc;
    if (vf_dir_exists(path))
        return vf_error(VF_EINVAL, "%s: is a directory", path);
    vf_pq_writer *w = vf_calloc(1, sizeof *w);
    if (!w)
        return VF_ENOMEM;
    w->fd = -1;
    w->settings = *s;
    w->path = vf_strdup(path);
    w->created_by = s->created_by ? vf_strdup(s->created_by) : vf_strdup("vlafeed version " VF_VERSION_STRING);
    w->settings.created_by = w->created_by;
    if (!w->path || !w->created_by) {
        free_writer(w);
        return VF_ENOMEM;
    }
    if ((rc = create_temp(w)) < 0 || (rc = out_write(w, "PAR1", 4)) < 0) {
        if (w->fd >= 0) {
            close(w->fd);
            unlink(w->tmp_path);
        }
        free_writer(w);
        return rc;
    }
    *out = w;
    return 0;
}

int vf_pq_writer_add_kv(vf_pq_writer *w, const char *key, const char *value)
{
    if (!key)
        return vf_error(VF_EINVAL, "%s: key-value metadata needs a key", w->path);
    for (int i = 0; i < w->num_kv; i++) {
        if (strcmp(w->kv_keys[i], key) == 0) {
            char *v = value ? vf_strdup(value) : NULL;
            if (value && !v)
                return VF_ENOMEM;
            free(w->kv_values[i]);
            w->kv_values[i] = v;
            return 0;
        }
    }
    size_t n = (size_t)w->num_kv;
    if (vf_grow_array(&w->kv_keys, n, &w->kv_keys_cap, 8, sizeof *w->kv_keys) < 0 ||
        vf_grow_array(&w->kv_values, n, &w->kv_values_cap, 8, sizeof *w->kv_values) < 0)
        return VF_ENOMEM;
    char *k = vf_strdup(key);
    char *v = value ? vf_strdup(value) : NULL;
    if (!k || (value && !v)) {
        free(k);
        free(v);
        return VF_ENOMEM;
    }
    w->kv_keys[w->num_kv] = k;
    w->kv_values[w->num_kv++] = v;
    return 0;
}

/* ---- validation ---- */

static int check_offsets(const vf_pq_writer *w, const char *what, const vf_pq_array *a, int64_t limit,
                         const char *limit_name, int check_value_len)
{
    if (!a->offsets)
        return vf_error(VF_EINVAL, "%s: field '%s': %s array without offsets", w->path, what,
                        vf_pq_w_type_name(a->type));
    if (a->offsets[0] < 0)
        return vf_error(VF_EINVAL, "%s: field '%s': negative first offset", w->path, what);
    for (int64_t i = 0; i < a->length; i++) {
        int64_t len = a->offsets[i + 1] - a->offsets[i];
        if (len < 0)
            return vf_error(VF_EINVAL, "%s: field '%s': offsets decrease at element %lld", w->path, what,
                            (long long)i);
        if (check_value_len && len > INT32_MAX)
            return vf_error(VF_ERANGE, "%s: field '%s': element %lld is %lld bytes (at most 2^31-1)", w->path,
                            what, (long long)i, (long long)len);
    }
    if (a->offsets[a->length] > limit)
        return vf_error(VF_EINVAL, "%s: field '%s': last offset %lld is past the %s (%lld)", w->path, what,
                        (long long)a->offsets[a->length], limit_name, (long long)limit);
    return 0;
}

/* Checks that the arrays can be read without going out of bounds. `what`
 * is the dotted field path for messages. */
static int validate_array(const vf_pq_writer *w, const vf_pq_array *a, const char *what, int depth)
{
    int rc;
    if (depth >= VF_PQ_W_MAX_DEPTH)
        return vf_error(VF_EUNSUPPORTED, "%s: field '%s': nested more than %d levels", w->path, what,
                        VF_PQ_W_MAX_DEPTH);
    if (a->length < 0)
        return vf_error(VF_EINVAL, "%s: field '%s': negative length", w->path, what);
    switch (a->type) {
    case VF_PQ_T_BOOL:
    case VF_PQ_T_INT8:
    case VF_PQ_T_INT16:
    case VF_PQ_T_INT32:
    case VF_PQ_T_INT64:
    case VF_PQ_T_UINT8:
    case VF_PQ_T_UINT16:
    case VF_PQ_T_UINT32:
    case VF_PQ_T_UINT64:
    case VF_PQ_T_FLOAT16:
    case VF_PQ_T_FLOAT:
    case VF_PQ_T_DOUBLE:
    case VF_PQ_T_FIXED_BINARY:
        if (a->type == VF_PQ_T_FIXED_BINARY && a->width <= 0)
            return vf_error(VF_EINVAL, "%s: field '%s': fixed_binary width %d", w->path, what, a->width);
        if (a->length > 0 && !a->values)
            return vf_error(VF_EINVAL, "%s: field '%s': %s array without values", w->path, what,
                            vf_pq_w_type_name(a->type));
        return 0;
    case VF_PQ_T_STRING:
    case VF_PQ_T_BINARY:
        if ((rc = check_offsets(w, what, a, a->data_len, "data length", 1)) < 0)
            return rc;
        if (a->data_len > 0 && !a->data)
            return vf_error(VF_EINVAL, "%s: field '%s': %s array without data", w->path, what,
                            vf_pq_w_type_name(a->type));
        return 0;
    case VF_PQ_T_LIST: {
        if (a->num_children != 1 || !a->children)
            return vf_error(VF_EINVAL, "%s: field '%s': a list needs exactly one child array", w->path, what);
        if ((rc = check_offsets(w, what, a, a->children[0].length, "child length", 0)) < 0)
            return rc;
        char *sub = vf_asprintf("%s.list.element", what);
        if (!sub)
            return VF_ENOMEM;
        rc = validate_array(w, &a->children[0], sub, depth + 1);
        free(sub);
        return rc;
    }
    case VF_PQ_T_STRUCT:
        if (a->num_children < 1 || !a->children)
            return vf_error(VF_EUNSUPPORTED, "%s: field '%s': a struct needs at least one child (Parquet has no "
                            "empty groups)", w->path, what);
        for (int i = 0; i < a->num_children; i++) {
            const vf_pq_array *c = &a->children[i];
            if (!c->name || !*c->name)
                return vf_error(VF_EINVAL, "%s: field '%s': struct child %d has no name", w->path, what, i);
            char *sub = vf_asprintf("%s.%s", what, c->name);
            if (!sub)
                return VF_ENOMEM;
            if (c->length != a->length)
                rc = vf_error(VF_EINVAL, "%s: field '%s': struct child has %lld elements, the struct %lld",
                              w->path, sub, (long long)c->length, (long long)a->length);
            else
                rc = validate_array(w, c, sub, depth + 1);
            free(sub);
            if (rc < 0)
                return rc;
        }
        return 0;
    default:
        return vf_error(VF_EUNSUPPORTED, "%s: field '%s': type %s cannot be written", w->path, what,
                        vf_pq_w_type_name(a->type));
    }
}

/* The type of an array tree as text ("list<float32>", "struct<a:int8>"),
 * used to detect schema changes between row groups. */
static int type_signature(vf_buf *b, const vf_pq_array *a)
{
    int rc;
    switch (a->type) {
    case VF_PQ_T_LIST:
        if ((rc = vf_buf_printf(b, "list<")) < 0 || (rc = type_signature(b, &a->children[0])) < 0)
            return rc;
        return vf_buf_printf(b, ">");
    case VF_PQ_T_STRUCT:
        if ((rc = vf_buf_printf(b, "struct<")) < 0)
            return rc;
        for (int i = 0; i < a->num_children; i++) {
            if ((rc = vf_buf_printf(b, "%s%s:", i ? "," : "", a->children[i].name)) < 0 ||
                (rc = type_signature(b, &a->children[i])) < 0)
                return rc;
        }
        return vf_buf_printf(b, ">");
    case VF_PQ_T_FIXED_BINARY:
        return vf_buf_printf(b, "fixed_binary[%d]", a->width);
    default:
        return vf_buf_printf(b, "%s", vf_pq_w_type_name(a->type));
    }
}

/* ---- schema ---- */

static int add_schema_element(vf_pq_writer *w, const vf_pq_tw_schema_element *e)
{
    size_t n = (size_t)w->num_schema;
    if (vf_grow_array(&w->schema, n, &w->schema_cap, 32, sizeof *w->schema) < 0 ||
        vf_grow_array(&w->schema_names, n, &w->schema_names_cap, 32, sizeof *w->schema_names) < 0)
        return VF_ENOMEM;
    char *name = vf_strdup(e->name);
    if (!name)
        return VF_ENOMEM;
    w->schema[w->num_schema] = *e;
    w->schema[w->num_schema].name = name;
    w->schema_names[w->num_schema++] = name;
    return 0;
}

/* How each leaf type is stored: physical type, bytes per gathered value,
 * FIXED_LEN_BYTE_ARRAY width, and the logical / converted annotations
 * pyarrow writes (LT_NONE and -1: none). FIXED_BINARY's width is the
 * array's, set by add_leaf. */
static const struct leaf_storage {
    vf_pq_physical physical;
    size_t value_size;
    int32_t type_length;
    int logical_type;
    int32_t converted_type;
    int8_t int_bit_width;
    int int_signed;
} storage_by_type[] = {
    [VF_PQ_T_BOOL] = {VF_PQ_BOOLEAN, 1, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
    [VF_PQ_T_INT8] = {VF_PQ_INT32, 4, 0, VF_PQ_W_LT_INTEGER, VF_PQ_W_CT_INT_8, 8, 1},
    [VF_PQ_T_INT16] = {VF_PQ_INT32, 4, 0, VF_PQ_W_LT_INTEGER, VF_PQ_W_CT_INT_16, 16, 1},
    [VF_PQ_T_INT32] = {VF_PQ_INT32, 4, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
    [VF_PQ_T_INT64] = {VF_PQ_INT64, 8, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
    [VF_PQ_T_UINT8] = {VF_PQ_INT32, 4, 0, VF_PQ_W_LT_INTEGER, VF_PQ_W_CT_UINT_8, 8, 0},
    [VF_PQ_T_UINT16] = {VF_PQ_INT32, 4, 0, VF_PQ_W_LT_INTEGER, VF_PQ_W_CT_UINT_16, 16, 0},
    [VF_PQ_T_UINT32] = {VF_PQ_INT32, 4, 0, VF_PQ_W_LT_INTEGER, VF_PQ_W_CT_UINT_32, 32, 0},
    [VF_PQ_T_UINT64] = {VF_PQ_INT64, 8, 0, VF_PQ_W_LT_INTEGER, VF_PQ_W_CT_UINT_64, 64, 0},
    [VF_PQ_T_FLOAT16] = {VF_PQ_FIXED_LEN_BYTE_ARRAY, 2, 2, VF_PQ_W_LT_FLOAT16, -1, 0, 0},
    [VF_PQ_T_FLOAT] = {VF_PQ_FLOAT, 4, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
    [VF_PQ_T_DOUBLE] = {VF_PQ_DOUBLE, 8, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
    [VF_PQ_T_STRING] = {VF_PQ_BYTE_ARRAY, 0, 0, VF_PQ_W_LT_STRING, VF_PQ_W_CT_UTF8, 0, 0},
    [VF_PQ_T_BINARY] = {VF_PQ_BYTE_ARRAY, 0, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
    [VF_PQ_T_FIXED_BINARY] = {VF_PQ_FIXED_LEN_BYTE_ARRAY, 0, 0, VF_PQ_W_LT_NONE, -1, 0, 0},
};

static void leaf_annotation(vf_pq_type t, vf_pq_tw_schema_element *e, vf_pq_w_leaf *lf)
{
    /* Validation let only leaf types through; anything else would be stored
     * like FIXED_BINARY. */
    const struct leaf_storage *st =
        &storage_by_type[t > VF_PQ_T_NULL && t <= VF_PQ_T_FIXED_BINARY ? t : VF_PQ_T_FIXED_BINARY];
    lf->physical = st->physical;
    lf->value_size = st->value_size;
    lf->type_length = st->type_length;
    e->logical_type = st->logical_type;
    e->converted_type = st->converted_type;
    if (st->logical_type == VF_PQ_W_LT_INTEGER) {
        e->int_bit_width = st->int_bit_width;
        e->int_signed = st->int_signed;
    }
}

/* A schema element without a type or annotations yet. repetition -1: none
 * (the root); num_children -1: a leaf. */
static vf_pq_tw_schema_element schema_element(const char *name, int repetition, int32_t num_children)
{
    vf_pq_tw_schema_element e;
    memset(&e, 0, sizeof e);
    e.name = name;
    e.has_repetition = repetition >= 0;
    e.repetition = repetition >= 0 ? repetition : 0;
    e.num_children = num_children;
    e.converted_type = -1;
    return e;
}

typedef struct path_state {
    const char *names[2 * VF_PQ_W_MAX_DEPTH + 2];
    int len;
    int steps[VF_PQ_W_MAX_DEPTH];
    int num_steps;
    int16_t def, rep;
} path_state;

static int add_leaf(vf_pq_writer *w, const vf_pq_array *a, int field_index, const path_state *ps,
                    vf_pq_tw_schema_element *e)
{
    if (vf_grow_array(&w->leaves, (size_t)w->num_leaves, &w->leaves_cap, 16, sizeof *w->leaves) < 0)
        return VF_ENOMEM;
    vf_pq_w_leaf *lf = &w->leaves[w->num_leaves];
    memset(lf, 0, sizeof *lf);
    lf->path = vf_calloc((size_t)ps->len, sizeof *lf->path);
    if (!lf->path)
        return VF_ENOMEM;
    w->num_leaves++; /* owned from here on, freed by free_schema */
    vf_buf dotted = {0};
    for (int i = 0; i < ps->len; i++) {
        lf->path[i] = vf_strdup(ps->names[i]);
        lf->path_len = i + 1;
        if (!lf->path[i] || vf_buf_printf(&dotted, "%s%s", i ? "." : "", ps->names[i]) < 0) {
            vf_buf_free(&dotted);
            return VF_ENOMEM;
        }
    }
    lf->dotted = vf_buf_take_string(&dotted);
    if (!lf->dotted)
        return VF_ENOMEM;
    lf->field_index = field_index;
    lf->num_steps = ps->num_steps;
    memcpy(lf->steps, ps->steps, sizeof lf->steps);
    lf->type = a->type;
    lf->max_def = ps->def;
    lf->max_rep = ps->rep;
    leaf_annotation(a->type, e, lf);
    if (a->type == VF_PQ_T_FIXED_BINARY) {
        lf->type_length = a->width;
        lf->value_size = (size_t)a->width;
    }
    e->has_type = 1;
    e->type = lf->physical;
    e->type_length = lf->type_length;
    return 0;
}

/* Adds the schema elements and leaves of array `a` named `name`. */
static int build_node(vf_pq_writer *w, const vf_pq_array *a, const char *name, int field_index, path_state *ps)
{
    vf_pq_tw_schema_element e = schema_element(name, VF_PQ_OPTIONAL, -1);
    ps->names[ps->len++] = name;
    ps->def++;
    int rc = 0;
    if (a->type == VF_PQ_T_LIST) {
        e.num_children = 1;
        e.converted_type = VF_PQ_W_CT_LIST;
        e.logical_type = VF_PQ_W_LT_LIST;
        vf_pq_tw_schema_element rep = schema_element("list", VF_PQ_REPEATED, 1);
        if ((rc = add_schema_element(w, &e)) < 0 || (rc = add_schema_element(w, &rep)) < 0)
            return rc;
        ps->names[ps->len++] = "list";
        ps->def++;
        ps->rep++;
        ps->steps[ps->num_steps++] = 0;
        rc = build_node(w, &a->children[0], "element", field_index, ps);
        ps->num_steps--;
        ps->rep--;
        ps->def--;
        ps->len--;
    } else if (a->type == VF_PQ_T_STRUCT) {
        e.num_children = a->num_children;
        if ((rc = add_schema_element(w, &e)) < 0)
            return rc;
        for (int i = 0; i < a->num_children && rc == 0; i++) {
            ps->steps[ps->num_steps++] = i;
            rc = build_node(w, &a->children[i], a->children[i].name, field_index, ps);
            ps->num_steps--;
        }
    } else {
        if ((rc = add_leaf(w, a, field_index, ps, &e)) < 0 || (rc = add_schema_element(w, &e)) < 0)
            return rc;
    }
    ps->def--;
    ps->len--;
    return rc;
}

static int build_schema(vf_pq_writer *w, const vf_pq_array *fields, int num_fields, char **sigs)
{
    vf_pq_tw_schema_element root = schema_element("schema", -1, num_fields);
    int rc = add_schema_element(w, &root);
    w->field_names = vf_calloc((size_t)num_fields, sizeof *w->field_names);
    w->field_sigs = vf_calloc((size_t)num_fields, sizeof *w->field_sigs);
    if (rc < 0 || !w->field_names || !w->field_sigs)
        goto fail;
    w->num_fields = num_fields;
    for (int i = 0; i < num_fields; i++) {
        path_state ps;
        memset(&ps, 0, sizeof ps);
        if ((rc = build_node(w, &fields[i], fields[i].name, i, &ps)) < 0)
            goto fail;
        w->field_names[i] = vf_strdup(fields[i].name);
        w->field_sigs[i] = sigs[i];
        sigs[i] = NULL;
        if (!w->field_names[i]) {
            rc = VF_ENOMEM;
            goto fail;
        }
    }
    w->have_schema = 1;
    return 0;
fail:
    free_schema(w);
    return rc < 0 ? rc : VF_ENOMEM;
}

static int check_fields(vf_pq_writer *w, const vf_pq_array *fields, int num_fields, char **sigs)
{
    int rg = w->num_row_groups;
    if (!fields || num_fields < 1)
        return vf_error(VF_EINVAL, "%s: row group %d: no fields given", w->path, rg);
    for (int i = 0; i < num_fields; i++) {
        const char *name = fields[i].name;
        if (!name || !*name)
            return vf_error(VF_EINVAL, "%s: row group %d: field %d has no name", w->path, rg, i);
        for (int j = 0; j < i; j++)
            if (strcmp(fields[j].name, name) == 0)
                return vf_error(VF_EINVAL, "%s: row group %d: field '%s' given twice", w->path, rg, name);
        int rc = validate_array(w, &fields[i], name, 0);
        if (rc < 0)
            return vf_error_context(rc, "row group %d", rg);
        if (fields[i].length != fields[0].length)
            return vf_error(VF_EINVAL, "%s: row group %d: field '%s' has %lld rows but field '%s' has %lld", w->path,
                            rg, name, (long long)fields[i].length, fields[0].name, (long long)fields[0].length);
        vf_buf b = {0};
        if ((rc = type_signature(&b, &fields[i])) < 0) {
            vf_buf_free(&b);
            return rc;
        }
        sigs[i] = vf_buf_take_string(&b);
        if (!sigs[i])
            return VF_ENOMEM;
    }
    if (!w->have_schema)
        return 0;
    if (num_fields != w->num_fields)
        return vf_error(VF_EINVAL, "%s: row group %d: %d fields, but the schema (from row group 0) has %d", w->path,
                        rg, num_fields, w->num_fields);
    for (int i = 0; i < num_fields; i++) {
        if (strcmp(fields[i].name, w->field_names[i]) != 0)
            return vf_error(VF_EINVAL, "%s: row group %d: field %d is '%s', but the schema has '%s' there", w->path,
                            rg, i, fields[i].name, w->field_names[i]);
        if (strcmp(sigs[i], w->field_sigs[i]) != 0)
            return vf_error(VF_EINVAL, "%s: row group %d: field '%s' changed type from %s to %s", w->path, rg,
                            fields[i].name, w->field_sigs[i], sigs[i]);
    }
    return 0;
}

/* ---- row groups ---- */

static int write_chunks(vf_pq_writer *w, const vf_pq_array *fields, rg_meta *rg)
{
    int rc = 0;
    for (int i = 0; i < w->num_leaves && rc == 0; i++) {
        const vf_pq_w_leaf *lf = &w->leaves[i];
        vf_pq_w_column col;
        if ((rc = vf_pq_w_shred(&fields[lf->field_index], lf, &col)) < 0)
            break;
        w->dict_page.len = w->data_pages.len = 0;
        vf_pq_w_chunk *c = &rg->chunks[i];
        rc = vf_pq_w_encode_chunk(&w->settings, lf, &col, &w->dict_page, &w->data_pages, c);
        vf_pq_w_column_free(&col);
        if (rc < 0)
            break;
        int64_t start = w->offset;
        if (i == 0)
            rg->file_offset = start;
        c->dictionary_page_offset += start;
        c->data_page_offset += start;
        rg->total_byte_size += c->total_uncompressed_size;
        rg->total_compressed_size += c->total_compressed_size;
        if ((rc = out_write(w, w->dict_page.data, w->dict_page.len)) < 0 ||
            (rc = out_write(w, w->data_pages.data, w->data_pages.len)) < 0)
            break;
    }
    /* Large chunk buffers are not kept between row groups. */
    if (w->dict_page.cap > 4 * OUT_BUFFER_SIZE)
        vf_buf_free(&w->dict_page);
    if (w->data_pages.cap > 4 * OUT_BUFFER_SIZE)
        vf_buf_free(&w->data_pages);
    return rc;
}

int vf_pq_writer_write_row_group(vf_pq_writer *w, const vf_pq_array *fields, int num_fields)
{
    if (w->failed)
        return vf_error(w->failed, "%s: the writer failed earlier; the file will not be written", w->path);
    if (num_fields < 0 || num_fields > (1 << 20))
        return vf_error(VF_EINVAL, "%s: bad field count %d", w->path, num_fields);
    char **sigs = vf_calloc((size_t)(num_fields > 0 ? num_fields : 1), sizeof *sigs);
    if (!sigs)
        return VF_ENOMEM;
    int rc = check_fields(w, fields, num_fields, sigs);
    if (rc == 0 && !w->have_schema)
        rc = build_schema(w, fields, num_fields, sigs);
    for (int i = 0; i < num_fields; i++)
        free(sigs[i]);
    free(sigs);
    if (rc < 0)
        return rc;

    if (vf_grow_array(&w->row_groups, (size_t)w->num_row_groups, &w->row_groups_cap, 8, sizeof *w->row_groups) < 0)
        return VF_ENOMEM;
    rg_meta *rg = &w->row_groups[w->num_row_groups];
    memset(rg, 0, sizeof *rg);
    rg->num_rows = fields[0].length;
    rg->file_offset = w->offset;
    rg->chunks = vf_calloc((size_t)(w->num_leaves ? w->num_leaves : 1), sizeof *rg->chunks);
    if (!rg->chunks)
        return VF_ENOMEM;
    rc = write_chunks(w, fields, rg);
    if (rc < 0) {
        for (int i = 0; i < w->num_leaves; i++)
            vf_pq_w_chunk_free(&rg->chunks[i]);
        free(rg->chunks);
        w->failed = rc;
        return vf_error_context(rc, "%s: row group %d", w->path, w->num_row_groups);
    }
    w->num_row_groups++;
    w->num_rows += rg->num_rows;
    return 0;
}

/* ---- footer ---- */

static int write_footer(vf_pq_writer *w)
{
    int nrg = w->num_row_groups, nleaves = w->num_leaves;
    vf_pq_tw_row_group *rgs = vf_calloc((size_t)(nrg ? nrg : 1), sizeof *rgs);
    vf_pq_tw_column_meta *cols = vf_calloc((size_t)nrg * (size_t)nleaves + 1, sizeof *cols);
    vf_pq_tw_key_value *kv = vf_calloc((size_t)(w->num_kv ? w->num_kv : 1), sizeof *kv);
    vf_buf footer = {0};
    int rc = 0;
    if (!rgs || !cols || !kv) {
        rc = VF_ENOMEM;
        goto done;
    }
    for (int r = 0; r < nrg; r++) {
        const rg_meta *m = &w->row_groups[r];
        for (int c = 0; c < nleaves; c++) {
            const vf_pq_w_chunk *ch = &m->chunks[c];
            const vf_pq_w_leaf *lf = &w->leaves[c];
            vf_pq_tw_column_meta *cm = &cols[r * nleaves + c];
            cm->type = lf->physical;
            cm->encodings = ch->encodings;
            cm->num_encodings = ch->num_encodings;
            cm->path = (const char *const *)lf->path;
            cm->path_len = lf->path_len;
            cm->codec = w->settings.codec;
            cm->num_values = ch->num_values;
            cm->total_uncompressed_size = ch->total_uncompressed_size;
            cm->total_compressed_size = ch->total_compressed_size;
            cm->data_page_offset = ch->data_page_offset;
            cm->has_dictionary_page_offset = ch->has_dictionary_page;
            cm->dictionary_page_offset = ch->dictionary_page_offset;
            cm->statistics = ch->has_stats ? &ch->stats : NULL;
            cm->encoding_stats = ch->encoding_stats;
            cm->num_encoding_stats = ch->num_encoding_stats;
        }
        rgs[r].columns = &cols[r * nleaves];
        rgs[r].num_columns = nleaves;
        rgs[r].total_byte_size = m->total_byte_size;
        rgs[r].num_rows = m->num_rows;
        rgs[r].file_offset = m->file_offset;
        rgs[r].total_compressed_size = m->total_compressed_size;
        rgs[r].ordinal = r <= INT16_MAX ? r : -1;
    }
    for (int i = 0; i < w->num_kv; i++) {
        kv[i].key = w->kv_keys[i];
        kv[i].value = w->kv_values[i];
    }
    vf_pq_tw_schema_element empty_root = schema_element("schema", -1, 0);
    vf_pq_tw_file_metadata fm;
    memset(&fm, 0, sizeof fm);
    fm.version = 2;
    fm.schema = w->have_schema ? w->schema : &empty_root;
    fm.num_schema = w->have_schema ? w->num_schema : 1;
    fm.num_leaves = nleaves;
    fm.num_rows = w->num_rows;
    fm.row_groups = rgs;
    fm.num_row_groups = nrg;
    fm.kv = kv;
    fm.num_kv = w->num_kv;
    fm.created_by = w->created_by;
    if ((rc = vf_pq_tw_write_file_metadata(&footer, &fm)) < 0)
        goto done;
    if (footer.len > UINT32_MAX) {
        rc = vf_error(VF_ERANGE, "%s: footer of %zu bytes is too large", w->path, footer.len);
        goto done;
    }
    uint8_t tail[8] = {(uint8_t)footer.len, (uint8_t)(footer.len >> 8), (uint8_t)(footer.len >> 16),
                       (uint8_t)(footer.len >> 24), 'P', 'A', 'R', '1'};
    if ((rc = out_write(w, footer.data, footer.len)) < 0 || (rc = out_write(w, tail, 8)) < 0)
        goto done;
    rc = out_flush(w);
done:
    vf_buf_free(&footer);
    free(rgs);
    free(cols);
    free(kv);
    return rc;
}

int vf_pq_writer_close(vf_pq_writer *w)
{
    if (!w)
        return 0;
    int rc = w->failed ? vf_error(w->failed, "%s: not written: the writer failed earlier", w->path) : 0;
    if (rc == 0)
        rc = write_footer(w);
    if (rc == 0 && fsync(w->fd) < 0)
        rc = vf_error(VF_EIO, "%s: fsync failed: %s", w->path, strerror(errno));
    if (close(w->fd) < 0 && rc == 0)
        rc = vf_error(VF_EIO, "%s: close failed: %s", w->path, strerror(errno));
    w->fd = -1;
    if (rc == 0 && rename(w->tmp_path, w->path) < 0)
        rc = vf_error(VF_EIO, "%s: cannot rename %s into place: %s", w->path, w->tmp_path, strerror(errno));
    if (rc < 0)
        unlink(w->tmp_path);
    free_writer(w);
    return rc;
}

void vf_pq_writer_abort(vf_pq_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp_path);
    free_writer(w);
}

int vf_pq_write_file(const char *path, const vf_pq_array *fields, int num_fields, const char *kv_key,
                     const char *kv_value)
{
    vf_pq_writer_settings ps;
    vf_pq_writer_defaults(&ps);
    vf_pq_writer *pw = NULL;
    int r = vf_pq_writer_open(&pw, path, &ps);
    if (r < 0)
        return r;
    if (kv_key)
        r = vf_pq_writer_add_kv(pw, kv_key, kv_value);
    if (r == 0)
        r = vf_pq_writer_write_row_group(pw, fields, num_fields);
    if (r == 0)
        return vf_pq_writer_close(pw);
    vf_pq_writer_abort(pw);
    return r;
}
