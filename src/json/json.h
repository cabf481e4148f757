/*
 * json.h: thin helpers over jansson for reading metadata documents
 * (info.json, stats.json, *.jsonl). This is the whole interface of
 * src/json/ to the layers above; it does not parse JSON itself.
 *
 * Depends on: base, jansson.
 *
 * Invariants:
 *  - Every error message names the document (the `file` string given by
 *    the caller, usually a path) and where in it the problem is: line and
 *    column for syntax errors ("meta/info.json:3:7: ..."), the key path for
 *    type errors ("meta/info.json: features.action.shape: expected a list of
 *    integers"), the line number for JSONL ("meta/episodes.jsonl:17: ...").
 *  - Key paths are dotted for messages only; feature names contain dots
 *    themselves, so they are never split.
 *  - Counts and sizes read from documents are bounded by the caller's
 *    limits before anything is allocated from them.
 *  - Loaded values are owned by the caller (json_decref).
 */
#ifndef VF_JSON_H
#define VF_JSON_H

#include <jansson.h>

#include "base/base.h"

/* Flags for loading. */
enum {
    /* Accept the non-standard tokens NaN, Infinity and -Infinity that
     * Python's json module writes for non-finite floats; they become JSON
     * null (read back as NaN by vf_json_number_list). */
    VF_JSON_ALLOW_NONFINITE = 1,
};

/* Parses a whole document from memory (need not be NUL-terminated).
 * Errors are "<file>:<line>:<column>: <jansson's reason>" (VF_ECORRUPT).
 * The top-level value may be of any type. */
int vf_json_parse(const char *file, const char *text, size_t len, int flags, json_t **out);
/* Reads and parses a local file; the file name in messages is `path`.
 * VF_ENOENT if the file does not exist. */
int vf_json_load_file(const char *path, int flags, json_t **out);

/* Member of an object, or NULL when obj is not an object or lacks key. */
json_t *vf_json_member(const json_t *obj, const char *key);

/* Flags for the typed getters. */
enum {
    VF_JSON_OPTIONAL = 1, /* absent key: leave *out at its default, return 0 */
    VF_JSON_NULLABLE = 2, /* JSON null: leave *out at its default, return 0 */
};

/* Typed getters. `file` names the document and `where` the dotted key path
 * of obj ("" for the top level); the message of a failure is
 * "<file>: <where>.<key>: expected <type>" (VF_ECORRUPT), or
 * "<file>: <where>: missing key '<key>'" (VF_ENOENT) for a required key.
 * obj that is not an object counts as having no keys. */
int vf_json_get_string(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       const char **out);
/* An integer; a real with an integral value (30.0) is accepted. */
int vf_json_get_int(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                    int64_t *out);
int vf_json_get_double(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       double *out);
int vf_json_get_bool(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                     int *out);
/* An object (returned borrowed). */
int vf_json_get_object(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                       json_t **out);
/* A list of at most max_count integers, each within [min_value, max_value].
 * *values is newly allocated (free()); *count may be 0. */
int vf_json_get_int_list(const char *file, const char *where, const json_t *obj, const char *key, int flags,
                         size_t max_count, int64_t min_value, int64_t max_value, int64_t **values,
                         size_t *count);
/* A list of strings (borrowed from obj; *values itself is newly
 * allocated), at most max_count. */
int vf_json_get_string_list(const char *file, const char *where, const json_t *obj, const char *key,
                            int flags, size_t max_count, const char ***values, size_t *count);

/* A number or a (possibly nested, rectangular) list of numbers, flattened
 * in row-major order. null leaves become NaN. A bare number has ndim 0.
 * At most max_ndim dimensions and max_values values. *values and *shape
 * are newly allocated (free()). `what` names the value in messages
 * ("<file>: <what>: ..."). */
int vf_json_number_array(const char *file, const char *what, const json_t *value, int max_ndim,
                         size_t max_values, double **values, int64_t **shape, int *ndim);

/* ---- JSON Lines ----------------------------------------------------- */

/* Iterates over the lines of a JSONL document; blank lines are skipped.
 * Each line must be one JSON value. The iterator borrows `text`. */
typedef struct vf_jsonl {
    const char *file;
    const char *text;
    size_t len;
    size_t pos;
    int64_t line;  /* 1-based number of the line last returned */
    int flags;
} vf_jsonl;

void vf_jsonl_init(vf_jsonl *it, const char *file, const char *text, size_t len, int flags);
/* Returns 1 with *out (owned by the caller) and it->line set, 0 at the
 * end, or a negative code whose message is "<file>:<line>:<column>: ...". */
int vf_jsonl_next(vf_jsonl *it, json_t **out);

/* ---- writing (used by the dataset report) ---------------------------- */

/* json_real() for finite values, JSON null for NaN and infinities (which
 * JSON cannot carry). Returns a new reference or NULL on ENOMEM. */
json_t *vf_json_real_or_null(double v);

#endif
