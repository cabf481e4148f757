/*
 * json.c: metadata-document helpers over jansson (see json.h).
 *
 * jansson does the parsing; this file adds what the dataset layer needs
 * around it: messages that name file, line, column and key path; typed
 * getters with bounds; JSON Lines iteration; and the rewrite of Python's
 * non-finite float tokens (NaN, Infinity) into null before parsing, since
 * LeRobot's stats files are written by Python's json module, which emits
 * them, and jansson (correctly) rejects them.
 */
#include "json/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ---------------------------------------------------------- */

static int is_ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

/* Copies text into a new buffer with NaN / Infinity / -Infinity outside
 * strings replaced by null. Only whole tokens are replaced. */
static int rewrite_nonfinite(const char *text, size_t len, vf_buf *out)
{
    static const char *const tokens[] = {"-Infinity", "Infinity", "NaN"};
    int in_string = 0;
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (in_string) {
            if (c == '\\' && i + 1 < len) {
                if (vf_buf_append(out, text + i, 2) < 0)
                    return VF_ENOMEM;
                i += 2;
                continue;
            }
            if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '-' || c == 'I' || c == 'N') {
            int replaced = 0;
            for (size_t t = 0; t < VF_ARRAY_LEN(tokens); t++) {
                size_t n = strlen(tokens[t]);
                if (len - i >= n && memcmp(text + i, tokens[t], n) == 0 && (i == 0 || !is_ident_char(text[i - 1])) &&
                    (i + n == len || !is_ident_char(text[i + n]))) {
                    if (vf_buf_append(out, "null", 4) < 0)
                        return VF_ENOMEM;
                    i += n;
                    replaced = 1;
                    break;
                }
            }
            if (replaced)
                continue;
        }
        if (vf_buf_append_u8(out, (uint8_t)c) < 0)
            return VF_ENOMEM;
        i++;
    }
    return 0;
}

/* Parses with the line number offset applied (for JSONL). */
static int parse_at(const char *file, int64_t line, const char *text, size_t len, int flags, json_t **out)
{
    *out = NULL;
    vf_buf rewritten = {0};
    if (flags & VF_JSON_ALLOW_NONFINITE) {
        if (rewrite_nonfinite(text, len, &rewritten) < 0) {
            vf_buf_free(&rewritten);
            return VF_ENOMEM;
        }
        text = rewritten.data ? (const char *)rewritten.data : "";
        len = rewritten.len;
    }
    json_error_t err;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY, &err);
    vf_buf_free(&rewritten);
    if (!v) {
        if (json_error_code(&err) == json_error_out_of_memory)
            return vf_error(VF_ENOMEM, "%s: out of memory parsing JSON", file);
        long long shown_line = line > 0 ? (long long)line : (long long)err.line;
        return vf_error(VF_ECORRUPT, "%s:%lld:%d: invalid JSON: %s", file, shown_line, err.column, err.text);
    }
    *out = v;
    return 0;
}

int vf_json_parse(const char *file, const char *text, size_t len, int flags, json_t **out)
{
    return parse_at(file, 0, text, len, flags, out);
}

int vf_json_load_file(const char *path, int flags, json_t **out)
{
    *out = NULL;
    uint8_t *data;
    size_t len;
    int r = vf_read_file(path, &data, &len);
    if (r < 0)
        return r;
    r = vf_json_parse(path, (const char *)data, len, flags, out);
    free(data);
    return r;
}

/* ---- typed getters ---------------------------------------------------- */

json_t *vf_json_member(const json_t *obj, const char *key)
{
    if (!obj || !json_is_object(obj))
        return NULL;
    return json_object_get(obj, key);
}

/* Looks up key; returns 1 when there is a non-null value to convert, 0
 * when the caller should keep its default, or a negative code. */
static int lookup(const char *file, const char *where, const json_t *obj, const char *key, int flags, json_t **v)
{
    *v = vf_json_member(obj, key);
    if (!*v) {
        if (flags & VF_JSON_OPTIONAL)
            return 0;
        if (where && *where)
            return vf_error(VF_ECORRUPT, "%s: %s: missing key '%s'", file, where, key);
        return vf_error(VF_ECORRUPT, "%s: missing key '%s'", file, key);
    }
    if (json_is_null(*v) && (flags & VF_JSON_NULLABLE))
        return 0;
    return 1;
}

static int type_error(const char *file, const char *where, const char *key, const char *expected)
{
    if (where && *where)
        return vf_error(VF_ECORRUPT, "%s: %s.%s: expected %s", file, where, key, expected);
    return vf_error(VF_ECORRUPT, "%s: %s: expected %s", file, key, expected);
}

/* An integer value, or a real with an integral value in int64 range. */
static int as_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (isfinite(d) && d == floor(d) && d >= -9.2e18 && d <= 9.2e18) {
            *out = (int64_t)d;
            return 1;
        }
    }
    return 0;
}

/* The scalar getters: what each stores through its `out` and the type a
 * refusal names. */
typedef enum scalar_kind { GET_STRING, GET_INT, GET_DOUBLE, GET_BOOL, GET_OBJECT } scalar_kind;

static int get_scalar(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                      scalar_kind kind, void *out)
{
    static const char *const expected[] = {"a string", "an integer", "a number", "true or false", "an object"};
    json_t *v;
    int r = lookup(file, where, obj, key, flags, &v);
    if (r <= 0)
        return r;
    int ok = 0;
    switch (kind) {
    case GET_STRING:
        if ((ok = json_is_string(v)))
            *(const char **)out = json_string_value(v);
        break;
    case GET_INT: ok = as_int(v, out); break;
    case GET_DOUBLE:
        if ((ok = json_is_number(v)))
            *(double *)out = json_number_value(v);
        break;
    case GET_BOOL:
        if ((ok = json_is_boolean(v)))
            *(int *)out = json_is_true(v);
        break;
    case GET_OBJECT:
        if ((ok = json_is_object(v)))
            *(json_t **)out = v;
        break;
    }
    return ok ? 0 : type_error(file, where, key, expected[kind]);
}

int vf_json_get_string(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       const char **out)
{
    return get_scalar(file, where, obj, key, flags, GET_STRING, out);
}

int vf_json_get_int(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                    int64_t *out)
{
    return get_scalar(file, where, obj, key, flags, GET_INT, out);
}

int vf_json_get_double(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       double *out)
{
    return get_scalar(file, where, obj, key, flags, GET_DOUBLE, out);
}

int vf_json_get_bool(const char *file, const char *where, const json_t *obj, const char *key, int flags, int *out)
{
    return get_scalar(file, where, obj, key, flags, GET_BOOL, out);
}

int vf_json_get_object(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       json_t **out)
{
    return get_scalar(file, where, obj, key, flags, GET_OBJECT, out);
}

/* lookup() for a list of at most max_count `items` ("integers", "strings"
 * in messages): 1 with *v the list and *n its length, 0 when the caller
 * keeps its default, or a negative code. */
static int lookup_list(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       size_t max_count, const char *items, json_t **v, size_t *n)
{
    int r = lookup(file, where, obj, key, flags, v);
    if (r <= 0)
        return r;
    char what[96];
    if (!json_is_array(*v)) {
        snprintf(what, sizeof what, "a list of %s", items);
        return type_error(file, where, key, what);
    }
    *n = json_array_size(*v);
    if (*n > max_count) {
        snprintf(what, sizeof what, "at most %zu %s (got %zu)", max_count, items, *n);
        return type_error(file, where, key, what);
    }
    return 1;
}

int vf_json_get_int_list(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                         size_t max_count, int64_t min_value, int64_t max_value, int64_t **values, size_t *count)
{
    json_t *v;
    size_t n;
    int r = lookup_list(file, where, obj, key, flags, max_count, "integers", &v, &n);
    if (r <= 0)
        return r;
    int64_t *vals = vf_malloc_array(n ? n : 1, sizeof *vals);
    if (!vals)
        return VF_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!as_int(json_array_get(v, i), &vals[i])) {
            free(vals);
            return type_error(file, where, key, "a list of integers");
        }
        if (vals[i] < min_value || vals[i] > max_value) {
            char what[96];
            snprintf(what, sizeof what, "integers in [%lld, %lld] (item %zu is %lld)", (long long)min_value,
                     (long long)max_value, i, (long long)vals[i]);
            free(vals);
            return type_error(file, where, key, what);
        }
    }
    *values = vals;
    *count = n;
    return 0;
}

int vf_json_get_string_list(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                            size_t max_count, const char ***values, size_t *count)
{
    json_t *v;
    size_t n;
    int r = lookup_list(file, where, obj, key, flags, max_count, "strings", &v, &n);
    if (r <= 0)
        return r;
    const char **vals = vf_malloc_array(n ? n : 1, sizeof *vals);
    if (!vals)
        return VF_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) {
            free(vals);
            return type_error(file, where, key, "a list of strings");
        }
        vals[i] = json_string_value(s);
    }
    *values = vals;
    *count = n;
    return 0;
}

/* ---- number arrays ---------------------------------------------------- */

/* Fills values[*pos..] from a value whose shape must be shape[depth..]. */
static int flatten(const char *file, const char *what, const json_t *v, const int64_t *shape, int ndim, int depth,
                   double *values, size_t *pos)
{
    if (depth == ndim) {
        if (json_is_null(v))
            values[(*pos)++] = NAN;
        else if (json_is_number(v))
            values[(*pos)++] = json_number_value(v);
        else
            return vf_error(VF_ECORRUPT, "%s: %s: expected a number or a list of numbers", file, what);
        return 0;
    }
    if (!json_is_array(v) || (int64_t)json_array_size(v) != shape[depth])
        return vf_error(VF_ECORRUPT, "%s: %s: nested lists are not rectangular (level %d should hold %lld items)",
                        file, what, depth, (long long)shape[depth]);
    for (size_t i = 0; i < json_array_size(v); i++) {
        int r = flatten(file, what, json_array_get(v, i), shape, ndim, depth + 1, values, pos);
        if (r < 0)
            return r;
    }
    return 0;
}

int vf_json_number_array(const char *file, const char *what, const json_t *value, int max_ndim, size_t max_values,
                         double **values, int64_t **shape, int *ndim)
{
    *values = NULL;
    *shape = NULL;
    *ndim = 0;
    /* The shape is read along the first items; flatten() checks the rest. */
    int n = 0;
    size_t total = 1;
    for (const json_t *v = value; json_is_array(v); v = json_array_get(v, 0)) {
        if (n >= max_ndim)
            return vf_error(VF_ECORRUPT, "%s: %s: more than %d levels of nested lists", file, what, max_ndim);
        size_t len = json_array_size(v);
        if (len && total > max_values / len)
            return vf_error(VF_ECORRUPT, "%s: %s: more than %zu values", file, what, max_values);
        total *= len;
        n++;
        if (len == 0)
            break;
    }
    int64_t *shp = vf_malloc_array(n ? (size_t)n : 1, sizeof *shp);
    if (!shp)
        return VF_ENOMEM;
    const json_t *v = value;
    for (int d = 0; d < n; d++) {
        shp[d] = (int64_t)json_array_size(v);
        v = json_array_get(v, 0);
    }
    if (total > max_values) {
        free(shp);
        return vf_error(VF_ECORRUPT, "%s: %s: more than %zu values", file, what, max_values);
    }
    double *vals = vf_malloc_array(total ? total : 1, sizeof *vals);
    if (!vals) {
        free(shp);
        return VF_ENOMEM;
    }
    size_t pos = 0;
    int r = flatten(file, what, value, shp, n, 0, vals, &pos);
    if (r < 0) {
        free(vals);
        free(shp);
        return r;
    }
    *values = vals;
    *shape = shp;
    *ndim = n;
    return 0;
}

/* ---- JSON Lines ------------------------------------------------------- */

void vf_jsonl_init(vf_jsonl *it, const char *file, const char *text, size_t len, int flags)
{
    it->file = file;
    it->text = text ? text : "";
    it->len = text ? len : 0;
    it->pos = 0;
    it->line = 0;
    it->flags = flags;
}

int vf_jsonl_next(vf_jsonl *it, json_t **out)
{
    *out = NULL;
    while (it->pos < it->len) {
        const char *start = it->text + it->pos;
        const char *nl = memchr(start, '\n', it->len - it->pos);
        size_t n = nl ? (size_t)(nl - start) : it->len - it->pos;
        it->pos += n + (nl ? 1 : 0);
        it->line++;
        size_t blank = 0;
        while (blank < n && (start[blank] == ' ' || start[blank] == '\t' || start[blank] == '\r'))
            blank++;
        if (blank == n)
            continue;
        int r = parse_at(it->file, it->line, start, n, it->flags, out);
        return r < 0 ? r : 1;
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------ */

json_t *vf_json_real_or_null(double v)
{
    json_t *j = isfinite(v) ? json_real(v) : json_null();
    if (!j)
        vf_error(VF_ENOMEM, "out of memory building JSON");
    return j;
}
