/*
 * report.c: the dataset report, the JSON document printed by
 * `vlafeed info --json` and returned (parsed) by
 * vlafeed._native.dataset_info(). Its shape is documented in
 * docs/info-json.md and must stay stable: keys are only ever added.
 *
 * Summaries: statistics arrays are flattened row-major and cut to the first
 * VF_INFO_STAT_VALUES values (the stat's full "shape" and a "truncated"
 * flag say so). NaN and infinities, which JSON cannot hold, become null.
 */
#include "dataset/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VF_INFO_STAT_VALUES 32

const char *vf_feature_kind_name(vf_feature_kind k)
{
    switch (k) {
    case VF_FEATURE_VECTOR: return "vector";
    case VF_FEATURE_SCALAR: return "scalar";
    case VF_FEATURE_STRING: return "string";
    case VF_FEATURE_VIDEO: return "video";
    case VF_FEATURE_IMAGE: return "image";
    case VF_FEATURE_LANGUAGE: return "language";
    }
    return "unknown";
}

/* A JSON string; bytes that are not valid UTF-8 (Parquet strings are not
 * checked, messages may cut a sequence) become '?'. */
static json_t *str(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j)
        return j;
    size_t n = strlen(s);
    char *copy = vf_malloc(n + 1);
    if (!copy)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        size_t len = p[i] < 0x80 ? 1 : (p[i] >> 5) == 6 ? 2 : (p[i] >> 4) == 14 ? 3 : (p[i] >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = (p[i + k] & 0xc0) == 0x80;
        if (ok && len > 1) {
            /* Let jansson judge overlong forms and surrogates. */
            json_t *t = json_stringn((const char *)p + i, len);
            ok = t != NULL;
            json_decref(t);
        }
        if (!ok) {
            copy[o++] = '?';
            i++;
            continue;
        }
        memcpy(copy + o, p + i, len);
        o += len;
        i += len;
    }
    j = json_stringn(copy, o);
    free(copy);
    return j;
}

/* A number as an integer when it is one (fps 30 -> 30, not 30.0). */
static json_t *number(double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9e15)
        return json_integer((json_int_t)v);
    return vf_json_real_or_null(v);
}

/* Adds key -> value to obj, stealing value; a NULL value (ENOMEM) fails. */
static int put(json_t *obj, const char *key, json_t *value)
{
    if (!value || json_object_set_new(obj, key, value) < 0)
        return vf_error(VF_ENOMEM, "out of memory building the report");
    return 0;
}

static int append(json_t *arr, json_t *value)
{
    if (!value || json_array_append_new(arr, value) < 0)
        return vf_error(VF_ENOMEM, "out of memory building the report");
    return 0;
}

static json_t *int_list(const int64_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (append(a, json_integer((json_int_t)v[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Fills the report object of item i of one of the dataset's lists. */
typedef int (*fill_object_fn)(json_t *o, const vf_dataset *d, size_t i);

/* Puts key -> a list of n objects into root, object i filled by fill. */
static int put_object_list(json_t *root, const char *key, size_t n, const vf_dataset *d, fill_object_fn fill)
{
    json_t *arr = json_array();
    int r = put(root, key, arr);
    for (size_t i = 0; i < n && r == 0; i++) {
        json_t *o = json_object();
        if ((r = append(arr, o)) == 0)
            r = fill(o, d, i);
    }
    return r;
}

static int feature_object(json_t *o, const vf_dataset *d, size_t i)
{
    const vf_feature *f = &d->features[i];
    int r;
    if ((r = put(o, "name", str(f->name))) < 0 || (r = put(o, "dtype", str(f->dtype))) < 0 ||
        (r = put(o, "shape", int_list(f->shape, (size_t)f->ndim))) < 0)
        return r;
    return put(o, "kind", str(vf_feature_kind_name(f->kind)));
}

static int camera_object(json_t *o, const vf_dataset *d, size_t i)
{
    const vf_camera *c = &d->cameras[i].pub;
    int r;
    if ((r = put(o, "key", str(c->key))) < 0 || (r = put(o, "codec", str(c->codec))) < 0 ||
        (r = put(o, "width", json_integer(c->width))) < 0 || (r = put(o, "height", json_integer(c->height))) < 0 ||
        (r = put(o, "pix_fmt", str(c->pix_fmt))) < 0 || (r = put(o, "fps", number(c->fps))) < 0 ||
        (r = put(o, "is_depth", json_boolean(c->is_depth))) < 0)
        return r;
    return put(o, "files", json_integer((json_int_t)c->num_files));
}

static int add_stats(const vf_dataset *d, json_t *root)
{
    json_t *stats = json_object();
    int r = put(root, "stats", stats);
    static const char *const shown[] = {"mean", "std", "min", "max"};
    for (size_t i = 0; i < d->num_stats && r == 0; i++) {
        const vf_stat *s = &d->stats[i];
        int wanted = 0;
        for (size_t k = 0; k < VF_ARRAY_LEN(shown); k++)
            wanted |= !strcmp(s->name, shown[k]);
        if (!wanted)
            continue;
        json_t *fo = json_object_get(stats, s->feature);
        if (!fo) {
            fo = json_object();
            if ((r = put(stats, s->feature, fo)) < 0)
                break;
            if ((r = put(fo, "shape", int_list(s->shape, (size_t)s->ndim))) < 0 ||
                (r = put(fo, "truncated", json_boolean(s->size > VF_INFO_STAT_VALUES))) < 0)
                break;
        }
        json_t *vals = json_array();
        if ((r = put(fo, s->name, vals)) < 0)
            break;
        for (size_t k = 0; k < s->size && k < VF_INFO_STAT_VALUES && r == 0; k++)
            r = append(vals, vf_json_real_or_null(s->values[k]));
    }
    return r;
}

static int problem_object(json_t *o, const vf_dataset *d, size_t i)
{
    const vf_problem *p = &d->problems[i];
    int r;
    if ((r = put(o, "severity", str(p->severity == VF_SEVERITY_ERROR ? "error" : "warning"))) < 0 ||
        (r = put(o, "file", str(p->file))) < 0 ||
        (r = put(o, "episode", p->episode >= 0 ? json_integer((json_int_t)p->episode) : json_null())) < 0 ||
        (r = put(o, "column", str(p->column))) < 0 ||
        (r = put(o, "changes_samples", json_boolean(p->changes_samples))) < 0)
        return r;
    return put(o, "message", str(p->message));
}

static int add_problems(const vf_dataset *d, json_t *root)
{
    int r = put_object_list(root, "problems", d->num_problems, d, problem_object);
    json_t *missing = json_array();
    if (r == 0)
        r = put(root, "missing_files", missing);
    else
        json_decref(missing);
    for (size_t i = 0; i < d->num_missing && r == 0; i++)
        r = append(missing, str(d->missing[i]));
    return r;
}

/* How the episodes metadata was read: "meta_cache": {enabled, dir, hits, misses, written}. */
static int add_meta_cache(const vf_dataset *d, json_t *root)
{
    const vf_meta_cache_stats *m = &d->meta_cache;
    json_t *o = json_object();
    int r = put(root, "meta_cache", o);
    if (r == 0)
        r = put(o, "enabled", json_boolean(m->enabled));
    if (r == 0)
        r = put(o, "dir", m->dir ? str(m->dir) : json_null());
    if (r == 0)
        r = put(o, "hits", json_integer((json_int_t)m->hits));
    if (r == 0)
        r = put(o, "misses", json_integer((json_int_t)m->misses));
    if (r == 0)
        r = put(o, "written", json_integer((json_int_t)m->written));
    return r;
}

int vf_dataset_info_json(const vf_dataset *d, int flags, char **out)
{
    *out = NULL;
    json_t *root = json_object();
    if (!root)
        return vf_error(VF_ENOMEM, "out of memory building the report");
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)vf_dataset_fingerprint(d));
    int r;
    if ((r = put(root, "path", str(d->root))) < 0 ||
        (r = put(root, "format_version", str(d->version))) < 0 ||
        (r = put(root, "robot_type", d->robot_type ? str(d->robot_type) : json_null())) < 0 ||
        (r = put(root, "fps", number(d->fps))) < 0 ||
        (r = put(root, "total_episodes", json_integer((json_int_t)d->total_episodes))) < 0 ||
        (r = put(root, "total_frames", json_integer((json_int_t)d->total_frames))) < 0 ||
        (r = put(root, "total_tasks", json_integer((json_int_t)d->total_tasks))) < 0 ||
        (r = put_object_list(root, "features", d->num_features, d, feature_object)) < 0 ||
        (r = put_object_list(root, "cameras", d->num_cameras, d, camera_object)) < 0 ||
        (r = put(root, "data_files", json_integer((json_int_t)d->num_data_files))) < 0 ||
        (r = put(root, "file_checks", str(d->file_checks == VF_FILES_CHECKED    ? "at_open"
                                          : d->file_checks == VF_FILES_DEFERRED ? "deferred"
                                                                                : "skipped"))) < 0)
        goto done;
    json_t *tasks = json_array();
    if ((r = put(root, "tasks", tasks)) < 0)
        goto done;
    for (size_t i = 0; i < d->num_tasks && r == 0; i++)
        r = append(tasks, str(d->tasks[i]));
    if (r == 0)
        r = add_meta_cache(d, root);
    if (r < 0 || (r = add_stats(d, root)) < 0 ||
        (r = put(root, "episodes_selected", json_integer((json_int_t)d->num_selected))) < 0 ||
        (r = add_problems(d, root)) < 0 || (r = put(root, "fingerprint", str(fp))) < 0)
        goto done;
    char *text = json_dumps(root, (flags & VF_INFO_PRETTY) ? JSON_INDENT(2) : JSON_COMPACT);
    if (!text) {
        r = vf_error(VF_ENOMEM, "out of memory writing the report");
        goto done;
    }
    /* json_dumps allocates with jansson's allocator (malloc by default);
     * copy so the caller can free() it whatever jansson was set to use. */
    *out = vf_strdup(text);
    free(text);
    if (!*out)
        r = VF_ENOMEM;
done:
    json_decref(root);
    return r;
}
