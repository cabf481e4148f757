/*
 * spec.c: builds a vf_sample_spec from the sample settings: which features
 * become which columns (LeRobot's order and shapes, §7.4 and §7.6), the
 * delta windows, normalization constants, the in-memory table of every
 * selected episode, and the camera files with their episode lists.
 *
 * Settings are checked up front so a bad key fails at open with a message
 * naming it, not in the middle of an epoch.
 */
#include "sample/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NORM_EPS 1e-8f /* LeRobot's normalization epsilon */

/* A short list of the features' names for "unknown key" messages. */
static void feature_list(const vf_dataset *d, char *buf, size_t cap)
{
    size_t n = vf_dataset_num_features(d), len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && len + 1 < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", vf_dataset_feature(d, i)->name);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    if (len >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
}

static int unknown_key(const vf_dataset *d, const char *what, const char *key)
{
    char names[512];
    feature_list(d, names, sizeof names);
    return vf_error(VF_EINVAL, "%s: unknown key '%s' (the dataset's features: %s)", what, key, names);
}

static int camera_index(const vf_dataset *d, const vf_feature *f)
{
    for (size_t c = 0; c < vf_dataset_num_cameras(d); c++)
        if (strcmp(vf_dataset_camera(d, c)->key, f->name) == 0)
            return (int)c;
    return -1;
}

void vf_sample_spec_note(vf_sample_spec *s, int global, char *text)
{
    if (!text)
        return;
    pthread_mutex_lock(&s->notes_lock);
    for (size_t i = 0; i < s->num_notes; i++)
        if (strcmp(s->notes[i].text, text) == 0) {
            pthread_mutex_unlock(&s->notes_lock);
            free(text);
            return;
        }
    vf_sample_note *grown = realloc(s->notes, (s->num_notes + 1) * sizeof *grown);
    if (grown) {
        s->notes = grown;
        s->notes[s->num_notes++] = (vf_sample_note){text, global};
    } else {
        free(text);
    }
    pthread_mutex_unlock(&s->notes_lock);
}

void vf_sample_spec_free(vf_sample_spec *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->num_columns; i++) {
        free(s->columns[i].name);
        free(s->columns[i].norm_shift);
        free(s->columns[i].norm_scale);
    }
    free(s->columns);
    for (size_t i = 0; i < s->num_windows; i++) {
        free(s->windows[i].key);
        free(s->windows[i].offsets);
    }
    free(s->windows);
    vf_sample_rows_free_all(s);
    vf_ds_pq_cache_close(s->data_files);
    for (size_t i = 0; s->rg_ends && i < s->num_data_files; i++)
        free(s->rg_ends[i]);
    free(s->rg_ends);
    free(s->rg_count);
    free(s->rg_known);
    for (size_t i = 0; s->tdisk_files && i < s->num_data_files; i++)
        if (s->tdisk_state[i] == 2)
            vf_ds_table_cache_close(&s->tdisk_files[i]);
    free(s->tdisk_files);
    free(s->tdisk_state);
    free(s->tdisk_checked);
    free(s->tdisk_types);
    free(s->tdisk_widths);
    if (s->tdisk && s->table_disk_builds > 0)
        vf_ds_meta_cache_prune(s->tdisk); /* a loader that wrote entries drops those of data files now gone */
    vf_ds_meta_cache_close(s->tdisk);
    pthread_mutex_destroy(&s->rows_lock);
    pthread_cond_destroy(&s->rows_cond);
    for (size_t i = 0; i < s->num_notes; i++)
        free(s->notes[i].text);
    free(s->notes);
    pthread_mutex_destroy(&s->notes_lock);
    free(s->table_names);
    free(s->episode_start);
    for (size_t c = 0; s->files && c < s->num_cameras; c++) {
        for (size_t i = 0; i < s->num_files[c]; i++) {
            vf_sample_video_file *f = &s->files[c][i];
            pthread_mutex_destroy(&f->lock);
            pthread_mutex_destroy(&f->reader_lock);
            if (f->episodes)
                vf_video_map_free(&f->map, f->episodes, f->num_episodes);
            free(f->episodes);
            free(f->error);
        }
        free(s->files[c]);
    }
    free(s->files);
    for (size_t c = 0; s->file_order && c < s->num_cameras; c++)
        free(s->file_order[c]);
    free(s->file_order);
    free(s->num_files);
    free(s->slots);
    free(s);
}

size_t vf_sample_episode_of(const vf_sample_spec *s, int64_t position)
{
    size_t lo = 0, hi = s->num_episodes; /* episode_start[lo] <= position < episode_start[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->episode_start[mid] <= position)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* ---- columns ----------------------------------------------------------------- */

typedef struct builder {
    vf_sample_spec *spec;
    const vf_dataset *d;
    const vf_sample_settings *set;
    size_t cap_columns;
    const char **table_names; /* columns to read */
    size_t num_table;
} builder;

static vf_sample_column *add_column(builder *b, const char *name, vf_sample_source source)
{
    vf_sample_spec *s = b->spec;
    if (s->num_columns == b->cap_columns) {
        size_t cap = b->cap_columns ? b->cap_columns * 2 : 16;
        vf_sample_column *n = vf_realloc(s->columns, cap * sizeof *n);
        if (!n)
            return NULL;
        s->columns = n;
        b->cap_columns = cap;
    }
    vf_sample_column *c = &s->columns[s->num_columns];
    memset(c, 0, sizeof *c);
    c->name = vf_strdup(name);
    if (!c->name)
        return NULL;
    s->num_columns++;
    c->source = source;
    c->camera = -1;
    c->table_column = -1;
    c->window = -1;
    return c;
}

static const char *output_name(const vf_sample_settings *set, const char *key)
{
    for (size_t i = 0; i < set->num_renames; i++)
        if (strcmp(set->renames[i].from, key) == 0)
            return set->renames[i].to;
    return key;
}

static int window_of(const vf_sample_spec *s, const char *key)
{
    for (size_t i = 0; i < s->num_windows; i++)
        if (strcmp(s->windows[i].key, key) == 0)
            return (int)i;
    return -1;
}

static int is_selected(const vf_sample_settings *set, const char *name)
{
    if (!set->keys)
        return 1;
    for (size_t i = 0; i < set->num_keys; i++)
        if (set->keys[i] && strcmp(set->keys[i], name) == 0)
            return 1;
    return 0;
}

static vf_normalization norm_of(const vf_sample_settings *set, const char *key)
{
    for (size_t i = 0; i < set->num_normalize; i++)
        if (strcmp(set->normalize[i].key, key) == 0)
            return set->normalize[i].mode;
    return VF_NORM_NONE;
}

static int table_column_of(builder *b, const char *name)
{
    for (size_t i = 0; i < b->num_table; i++)
        if (strcmp(b->table_names[i], name) == 0)
            return (int)i;
    b->table_names[b->num_table] = name;
    return (int)b->num_table++;
}

/* Fills shift/scale of a column from the dataset stats. width: number of
 * values (vector elements or image channels). */
static int set_normalization(builder *b, vf_sample_column *c, const char *key, vf_normalization mode, int64_t width)
{
    const char *a_name = mode == VF_NORM_MEAN_STD ? "mean" : "min";
    const char *b_name = mode == VF_NORM_MEAN_STD ? "std" : "max";
    const vf_stat *sa = vf_dataset_find_stat(b->d, key, a_name);
    const vf_stat *sb = vf_dataset_find_stat(b->d, key, b_name);
    if (!sa || !sb)
        return vf_error(VF_EINVAL, "normalize['%s']: the dataset has no '%s' and '%s' statistics for it (meta/stats.json)",
                        key, a_name, b_name);
    if (sa->size != (size_t)width || sb->size != (size_t)width)
        return vf_error(VF_ECORRUPT, "normalize['%s']: statistics %s/%s hold %zu/%zu values, expected %lld "
                        "(meta/stats.json)", key, a_name, b_name, sa->size, sb->size, (long long)width);
    c->norm = mode;
    long long degenerate = 0;
    c->norm_shift = vf_malloc_array((size_t)width, sizeof(float));
    c->norm_scale = vf_malloc_array((size_t)width, sizeof(float));
    if (!c->norm_shift || !c->norm_scale)
        return VF_ENOMEM;
    for (int64_t i = 0; i < width; i++) {
        double va = sa->values[i], vb = sb->values[i];
        if (!isfinite(va) || !isfinite(vb))
            return vf_error(VF_ECORRUPT, "normalize['%s']: statistic %s/%s[%lld] is not finite (meta/stats.json)", key,
                            a_name, b_name, (long long)i);
        c->norm_shift[i] = (float)va;
        /* As LeRobot computes in float32: (x - mean) / (std + eps), (x - min) / (max - min + eps). */
        c->norm_scale[i] = mode == VF_NORM_MEAN_STD ? (float)vb + NORM_EPS : ((float)vb - (float)va) + NORM_EPS;
        if (c->norm_scale[i] <= 1e-6f)
            degenerate++;
    }
    /* A constant element (std 0, or min == max) is divided by about 1e-8, as LeRobot does: any value off
     * the constant becomes ~1e8 times larger. Kept for parity, but said (once per process). */
    if (degenerate)
        vf_sample_spec_note(b->spec, 1,
                            vf_asprintf("normalize['%s']: %lld of its %lld %s values are 0 in meta/stats.json: those "
                                        "elements are divided by ~1e-8 as LeRobot does, so any value off the constant "
                                        "becomes huge",
                                        key, degenerate, (long long)width,
                                        mode == VF_NORM_MEAN_STD ? "std" : "max - min"));
    return 0;
}

static int check_settings(builder *b)
{
    const vf_dataset *d = b->d;
    const vf_sample_settings *set = b->set;
    if ((set->num_delta_timestamps && !set->delta_timestamps) || (set->num_keys && !set->keys) ||
        (set->num_renames && !set->renames) || (set->num_normalize && !set->normalize))
        return vf_error(VF_EINVAL, "sample settings: a list has a count but no entries");
    if ((unsigned)set->image_format > VF_IMAGE_UINT8_HWC)
        return vf_error(VF_EINVAL, "sample settings: unknown image format %d", (int)set->image_format);
    if (set->resize_width < 0 || set->resize_height < 0 || (set->resize_width == 0) != (set->resize_height == 0) ||
        set->resize_width > 16384 || set->resize_height > 16384)
        return vf_error(VF_EINVAL, "resize: %dx%d is not a valid size (both > 0, or both 0 for the stream's size)",
                        set->resize_width, set->resize_height);
    for (size_t i = 0; i < set->num_keys; i++) {
        if (!set->keys[i] || !vf_dataset_find_feature(d, set->keys[i]))
            return unknown_key(d, "keys", set->keys[i] ? set->keys[i] : "(null)");
        for (size_t j = 0; j < i; j++)
            if (strcmp(set->keys[i], set->keys[j]) == 0)
                return vf_error(VF_EINVAL, "keys: '%s' is listed twice", set->keys[i]);
    }
    for (size_t i = 0; i < set->num_renames; i++) {
        const vf_rename_spec *r = &set->renames[i];
        if (!r->from || !vf_dataset_find_feature(d, r->from))
            return unknown_key(d, "renames", r->from ? r->from : "(null)");
        if (!r->to || !r->to[0])
            return vf_error(VF_EINVAL, "renames['%s']: empty new name", r->from);
        for (size_t j = 0; j < i; j++)
            if (strcmp(set->renames[j].from, r->from) == 0)
                return vf_error(VF_EINVAL, "renames: '%s' is renamed twice", r->from);
    }
    for (size_t i = 0; i < set->num_normalize; i++) {
        const vf_norm_spec *n = &set->normalize[i];
        const vf_feature *f = n->key ? vf_dataset_find_feature(d, n->key) : NULL;
        if (!f)
            return unknown_key(d, "normalize", n->key ? n->key : "(null)");
        if ((unsigned)n->mode > VF_NORM_MIN_MAX)
            return vf_error(VF_EINVAL, "normalize['%s']: unknown mode %d", n->key, (int)n->mode);
        if (n->mode == VF_NORM_NONE)
            continue;
        int numeric_float = (f->kind == VF_FEATURE_VECTOR || f->kind == VF_FEATURE_SCALAR) &&
                            vf_ds_feature_value_type(f) == VF_DS_F32;
        if (f->kind == VF_FEATURE_VIDEO) {
            if (set->image_format != VF_IMAGE_FLOAT32_CHW)
                return vf_error(VF_EINVAL, "normalize['%s']: images can be normalized only in the float32 format",
                                n->key);
        } else if (!numeric_float) {
            return vf_error(VF_EINVAL, "normalize['%s']: only float vectors, scalars and videos can be normalized "
                                       "(this feature is %s %s)",
                            n->key, f->dtype, vf_feature_kind_name(f->kind));
        }
    }
    for (size_t i = 0; i < set->num_delta_timestamps; i++) {
        const vf_delta_spec *ds = &set->delta_timestamps[i];
        const vf_feature *f = ds->key ? vf_dataset_find_feature(d, ds->key) : NULL;
        if (!f)
            return unknown_key(d, "delta_timestamps", ds->key ? ds->key : "(null)");
        if (!is_selected(set, ds->key))
            return vf_error(VF_EINVAL, "delta_timestamps: key '%s' is not among the selected keys", ds->key);
        if (f->kind != VF_FEATURE_VIDEO && f->kind != VF_FEATURE_VECTOR && f->kind != VF_FEATURE_SCALAR)
            return vf_error(VF_EUNSUPPORTED, "delta_timestamps['%s']: windows over %s features are not supported",
                            ds->key, vf_feature_kind_name(f->kind));
        if (ds->count && !ds->seconds)
            return vf_error(VF_EINVAL, "delta_timestamps['%s']: a count but no values", ds->key);
        for (size_t j = 0; j < i; j++)
            if (strcmp(set->delta_timestamps[j].key, ds->key) == 0)
                return vf_error(VF_EINVAL, "delta_timestamps: '%s' is listed twice", ds->key);
    }
    return 0;
}

static int build_windows(builder *b)
{
    vf_sample_spec *s = b->spec;
    const vf_sample_settings *set = b->set;
    double tol = set->tolerance_s > 0 ? set->tolerance_s : VF_SAMPLE_DEFAULT_TOLERANCE_S;
    if (!set->num_delta_timestamps)
        return 0;
    s->windows = vf_calloc(set->num_delta_timestamps, sizeof *s->windows);
    if (!s->windows)
        return VF_ENOMEM;
    for (size_t i = 0; i < set->num_delta_timestamps; i++) {
        const vf_delta_spec *ds = &set->delta_timestamps[i];
        vf_sample_window_spec *w = &s->windows[i];
        s->num_windows = i + 1;
        w->key = vf_strdup(ds->key);
        w->offsets = vf_malloc_array(ds->count ? ds->count : 1, sizeof *w->offsets);
        if (!w->key || !w->offsets)
            return VF_ENOMEM;
        w->count = ds->count;
        int r = vf_sample_delta_offsets(ds->key, ds->seconds, ds->count, s->fps, tol, w->offsets);
        if (r < 0)
            return r;
    }
    return 0;
}

static int check_unique_names(const vf_sample_spec *s)
{
    for (size_t i = 0; i < s->num_columns; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(s->columns[i].name, s->columns[j].name) == 0)
                return vf_error(VF_EINVAL, "two output columns would be named '%s' (check renames)",
                                s->columns[i].name);
    return 0;
}

static int build_columns(builder *b)
{
    vf_sample_spec *s = b->spec;
    const vf_dataset *d = b->d;
    const vf_sample_settings *set = b->set;
    size_t nf = vf_dataset_num_features(d);
    b->table_names = vf_calloc(nf + 1, sizeof *b->table_names);
    if (!b->table_names)
        return VF_ENOMEM;

    /* 1. Video keys, in feature order. */
    for (size_t i = 0; i < nf; i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        if (f->kind != VF_FEATURE_VIDEO || !is_selected(set, f->name))
            continue;
        int cam = camera_index(d, f);
        if (cam < 0)
            return vf_error(VF_ECORRUPT, "video feature '%s' has no camera entry", f->name);
        const vf_camera *camera = vf_dataset_camera(d, (size_t)cam);
        if (camera->is_depth)
            return vf_error(VF_EUNSUPPORTED, "camera '%s' is a depth map; depth decoding is not supported yet "
                                             "(leave it out with keys=)",
                            f->name);
        int w = set->resize_width ? set->resize_width : camera->width;
        int h = set->resize_height ? set->resize_height : camera->height;
        if (w <= 0 || h <= 0 || w > 16384 || h > 16384)
            return vf_error(VF_ECORRUPT, "camera '%s': info.json gives no usable frame size (video.width/height %dx%d)",
                            f->name, camera->width, camera->height);
        vf_sample_column *c = add_column(b, output_name(set, f->name), VF_SAMPLE_SRC_VIDEO);
        if (!c)
            return VF_ENOMEM;
        vf_video_format_defaults(&c->format);
        c->format.layout = set->image_format == VF_IMAGE_FLOAT32_CHW ? VF_VIDEO_RGB_CHW_F32
                           : set->image_format == VF_IMAGE_UINT8_CHW ? VF_VIDEO_RGB_CHW_U8
                                                                     : VF_VIDEO_RGB_HWC_U8;
        c->format.width = w;
        c->format.height = h;
        c->feature = f;
        c->camera = cam;
        c->window = window_of(s, f->name);
        int64_t steps = c->window >= 0 ? (int64_t)s->windows[c->window].count : 1;
        int squeeze = c->window < 0 || (steps == 1 && set->lerobot_shapes);
        int nd = 0;
        if (!squeeze)
            c->shape[nd++] = steps;
        if (set->image_format == VF_IMAGE_UINT8_HWC) {
            c->shape[nd++] = h;
            c->shape[nd++] = w;
            c->shape[nd++] = 3;
        } else {
            c->shape[nd++] = 3;
            c->shape[nd++] = h;
            c->shape[nd++] = w;
        }
        c->ndim = nd;
        c->type = set->image_format == VF_IMAGE_FLOAT32_CHW ? VF_COL_FLOAT32 : VF_COL_UINT8;
        c->values_per_step = (int64_t)w * h * 3 * (c->type == VF_COL_FLOAT32 ? 4 : 1);
        c->sample_bytes = (size_t)(c->values_per_step * steps);
        vf_normalization norm = norm_of(set, f->name);
        if (norm != VF_NORM_NONE) {
            int r = set_normalization(b, c, f->name, norm, 3);
            if (r < 0)
                return r;
        }
        /* Batch memory is written once per batch and not read back by the
         * engine, unless it normalizes the frames in place afterwards: store
         * past the cache then (convert.c). */
        c->format.streaming = norm == VF_NORM_NONE;
    }
    /* 2. Data columns, in feature order. */
    for (size_t i = 0; i < nf; i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        if (f->kind == VF_FEATURE_VIDEO)
            continue;
        if (!is_selected(set, f->name))
            continue;
        if (f->kind == VF_FEATURE_LANGUAGE) {
            if (set->keys)
                return vf_error(VF_EUNSUPPORTED, "keys: '%s' is a language column, which is not supported", f->name);
            continue;
        }
        if (f->kind == VF_FEATURE_IMAGE) {
            if (set->keys)
                return vf_error(VF_EUNSUPPORTED, "keys: '%s' is an image feature (PNG in Parquet), which is not "
                                                 "supported yet",
                                f->name);
            vf_sample_spec_note(b->spec, 1,
                                vf_asprintf("image feature '%s' (PNG in Parquet) is not supported yet and is left "
                                            "out of every sample",
                                            f->name));
            continue;
        }
        int vt = vf_ds_feature_value_type(f);
        if (vt < 0) {
            if (set->keys)
                return vf_error(VF_EUNSUPPORTED, "keys: feature '%s' (dtype %s) has no supported values", f->name,
                                f->dtype);
            vf_sample_spec_note(b->spec, 1,
                                vf_asprintf("feature '%s' (dtype %s, info.json) has no supported values and is left "
                                            "out of every sample (keys= chooses the features explicitly)",
                                            f->name, f->dtype));
            continue;
        }
        vf_sample_column *c = add_column(b, output_name(set, f->name), VF_SAMPLE_SRC_TABLE);
        if (!c)
            return VF_ENOMEM;
        c->feature = f;
        c->table_column = table_column_of(b, f->name);
        c->window = window_of(s, f->name);
        int nd = 0;
        int64_t steps = 1;
        if (c->window >= 0) {
            steps = (int64_t)s->windows[c->window].count;
            c->shape[nd++] = steps; /* vectors keep [T, ...] even for T = 1 (LeRobot) */
        }
        if (f->kind == VF_FEATURE_VECTOR) {
            if (f->ndim + nd > 7)
                return vf_error(VF_EUNSUPPORTED, "feature '%s' has too many dimensions (%d)", f->name, f->ndim);
            for (int k = 0; k < f->ndim; k++)
                c->shape[nd++] = f->shape[k];
        }
        c->ndim = nd;
        c->values_per_step = vt == VF_DS_STRING ? 1 : f->size;
        if (vt == VF_DS_STRING) {
            if (c->window >= 0)
                return vf_error(VF_EUNSUPPORTED, "delta_timestamps['%s']: windows over strings are not supported",
                                f->name);
            c->type = VF_COL_STRING;
            c->sample_bytes = sizeof(char *);
        } else {
            c->type = vt == VF_DS_F32 ? VF_COL_FLOAT32 : f->type == VF_DTYPE_BOOL ? VF_COL_BOOL : VF_COL_INT64;
            size_t elem = c->type == VF_COL_FLOAT32 ? 4 : c->type == VF_COL_BOOL ? 1 : 8;
            c->sample_bytes = (size_t)(steps * c->values_per_step) * elem;
        }
        vf_normalization norm = norm_of(set, f->name);
        if (norm != VF_NORM_NONE) {
            int r = set_normalization(b, c, f->name, norm, f->size);
            if (r < 0)
                return r;
        }
    }
    /* 3. Pad masks, in delta_timestamps order. */
    for (size_t i = 0; i < s->num_windows; i++) {
        const char *base = output_name(set, s->windows[i].key);
        char *name = vf_asprintf("%s_is_pad", base);
        if (!name)
            return VF_ENOMEM;
        vf_sample_column *c = add_column(b, name, VF_SAMPLE_SRC_PAD);
        free(name);
        if (!c)
            return VF_ENOMEM;
        c->window = (int)i;
        c->type = VF_COL_BOOL;
        c->ndim = 1;
        c->shape[0] = (int64_t)s->windows[i].count;
        c->values_per_step = 1;
        c->sample_bytes = s->windows[i].count;
    }
    /* 4. The task string. */
    s->task_index_column = -1;
    if (set->include_task) {
        const vf_feature *ti = vf_dataset_find_feature(d, "task_index");
        if (ti && vf_ds_feature_value_type(ti) == VF_DS_I64 && vf_dataset_num_tasks(d) > 0) {
            vf_sample_column *c = add_column(b, "task", VF_SAMPLE_SRC_TASK);
            if (!c)
                return VF_ENOMEM;
            c->type = VF_COL_STRING;
            c->ndim = 0;
            c->sample_bytes = sizeof(char *);
            s->task_index_column = table_column_of(b, "task_index");
        }
    }
    return check_unique_names(s);
}

/* ---- table ---------------------------------------------------------------------- */

static int setup_table(builder *b)
{
    vf_sample_spec *s = b->spec;
    s->num_table = b->num_table;
    s->table_names = b->table_names;
    b->table_names = NULL;
    if (!(s->rows = vf_calloc(s->num_episodes ? s->num_episodes : 1, sizeof *s->rows)) ||
        !(s->loading = vf_calloc(s->num_episodes ? s->num_episodes : 1, 1)))
        return VF_ENOMEM;
    s->num_data_files = vf_dataset_num_data_files(b->d);
    if (!(s->rg_ends = vf_calloc(s->num_data_files ? s->num_data_files : 1, sizeof *s->rg_ends)) ||
        !(s->rg_count = vf_calloc(s->num_data_files ? s->num_data_files : 1, sizeof *s->rg_count)) ||
        !(s->rg_known = vf_calloc(s->num_data_files ? s->num_data_files : 1, 1)))
        return VF_ENOMEM;
    s->rows_max_bytes = VF_SAMPLE_DEFAULT_TABLE_CACHE_BYTES;
    s->tdisk_mode = -1;
    int r0 = s->num_table > 0 ? vf_ds_pq_cache_open(&s->data_files, b->d, 0, 0, s->table_names, (int)s->num_table)
                              : 0;
    if (r0 < 0)
        return r0;
    /* Every table column must exist with a readable type (checked here, from
     * info.json, so that a bad key fails at open rather than at a batch). */
    for (size_t i = 0; i < s->num_table; i++) {
        const vf_feature *f = vf_dataset_find_feature(b->d, s->table_names[i]);
        if (!f)
            return vf_error(VF_ENOENT, "%s: no feature named '%s' in meta/info.json", vf_dataset_root(b->d),
                            s->table_names[i]);
        if (vf_ds_feature_value_type(f) < 0)
            return vf_error(VF_EINVAL, "%s: feature '%s' (dtype %s) has no table values", vf_dataset_root(b->d),
                            f->name, f->dtype);
    }
    return 0;
}

/* ---- video files ------------------------------------------------------------------ */

typedef struct file_key {
    int64_t chunk, file;
    size_t id;
} file_key;

static int cmp_file_key(const void *pa, const void *pb)
{
    const file_key *a = pa, *b = pb;
    if (a->chunk != b->chunk)
        return a->chunk < b->chunk ? -1 : 1;
    return a->file < b->file ? -1 : a->file > b->file;
}

static int build_video(builder *b)
{
    vf_sample_spec *s = b->spec;
    const vf_dataset *d = b->d;
    s->num_cameras = d->num_cameras;
    if (!s->num_cameras)
        return 0;
    s->files = vf_calloc(s->num_cameras, sizeof *s->files);
    s->num_files = vf_calloc(s->num_cameras, sizeof *s->num_files);
    s->slots = vf_calloc(s->num_episodes ? s->num_episodes * s->num_cameras : 1, sizeof *s->slots);
    s->file_order = vf_calloc(s->num_cameras, sizeof *s->file_order);
    if (!s->files || !s->num_files || !s->slots || !s->file_order)
        return VF_ENOMEM;
    size_t next_id = 0;
    for (size_t cam = 0; cam < s->num_cameras; cam++) {
        const vf_ds_camera *dc = &d->cameras[cam];
        size_t nfiles = dc->num_files;
        s->files[cam] = vf_calloc(nfiles ? nfiles : 1, sizeof **s->files);
        if (!s->files[cam])
            return VF_ENOMEM;
        s->num_files[cam] = nfiles;
        double fps = dc->pub.fps > 0 ? dc->pub.fps : d->fps;
        (void)fps;
        for (size_t i = 0; i < nfiles; i++) {
            vf_sample_video_file *f = &s->files[cam][i];
            pthread_mutex_init(&f->lock, NULL);
            pthread_mutex_init(&f->reader_lock, NULL);
            f->path = dc->files[i].path;
            f->camera_key = dc->pub.key;
            f->camera = (int)cam;
            f->id = next_id++;
        }
        /* Every episode of the metadata stored in one of these files (the
         * exact ordinal mapping needs all of them, selected or not), as a
         * compact per-camera index sorted by file (stable: metadata order);
         * a file's vf_video_episode list is built when it is first mapped
         * (ensure_map), so memory follows the files a loader reads. */
        file_key *keys = vf_malloc_array(nfiles ? nfiles : 1, sizeof *keys);
        size_t na = d->num_all_episodes;
        int32_t *file_of = vf_malloc_array(na ? na : 1, sizeof *file_of);
        uint32_t *k_of = vf_malloc_array(na ? na : 1, sizeof *k_of);
        size_t *fill = vf_calloc(nfiles ? nfiles : 1, sizeof *fill);
        s->file_order[cam] = vf_malloc_array(na ? na : 1, sizeof **s->file_order);
        int r = keys && file_of && k_of && fill && s->file_order[cam] ? 0 : VF_ENOMEM;
        for (size_t i = 0; r == 0 && i < nfiles; i++) {
            keys[i].chunk = dc->files[i].chunk_index;
            keys[i].file = dc->files[i].file_index;
            keys[i].id = i;
        }
        if (r == 0 && nfiles > 1)
            qsort(keys, nfiles, sizeof *keys, cmp_file_key);
        const file_key *last = NULL; /* consecutive episodes mostly share a file */
        for (size_t e = 0; r == 0 && e < na; e++) {
            const vf_ds_video_loc *v = &d->episodes[e].video[cam];
            file_key want = {v->chunk_index, v->file_index, 0};
            const file_key *hit = last && last->chunk == want.chunk && last->file == want.file ? last
                                  : nfiles ? bsearch(&want, keys, nfiles, sizeof *keys, cmp_file_key)
                                           : NULL;
            if (hit)
                last = hit;
            file_of[e] = hit ? (int32_t)hit->id : -1;
            if (hit)
                s->files[cam][hit->id].list_count++;
        }
        size_t at = 0;
        for (size_t i = 0; r == 0 && i < nfiles; i++) {
            s->files[cam][i].list_start = at;
            at += s->files[cam][i].list_count;
        }
        for (size_t e = 0; r == 0 && e < na; e++) {
            if (file_of[e] < 0)
                continue;
            vf_sample_video_file *f = &s->files[cam][file_of[e]];
            k_of[e] = (uint32_t)fill[file_of[e]];
            s->file_order[cam][f->list_start + fill[file_of[e]]++] = (uint32_t)e;
        }
        /* Selected episode -> (file, slot). */
        for (size_t p = 0; r == 0 && p < s->num_episodes; p++) {
            size_t e = d->selected[p];
            int file = d->episodes[e].video[cam].file; /* the dataset's id of the episode's file */
            if (file < 0 || (size_t)file >= nfiles || file_of[e] != (int32_t)file) {
                r = vf_error(VF_ECORRUPT, "camera %s: episode %lld has no video file", dc->pub.key,
                             (long long)vf_dataset_episode(d, p)->episode_index);
                break;
            }
            s->slots[p * s->num_cameras + cam].file = (uint32_t)file;
            s->slots[p * s->num_cameras + cam].episode = k_of[e];
        }
        free(keys);
        free(file_of);
        free(k_of);
        free(fill);
        if (r < 0)
            return r;
    }
    return 0;
}

int vf_sample_spec_build(vf_sample_spec **out, const vf_dataset *d, const vf_sample_settings *set)
{
    *out = NULL;
    vf_sample_spec *s = vf_calloc(1, sizeof *s);
    if (!s)
        return VF_ENOMEM;
    builder b = {s, d, set, 0, NULL, 0};
    s->dataset = d;
    pthread_mutex_init(&s->rows_lock, NULL);
    pthread_cond_init(&s->rows_cond, NULL);
    pthread_mutex_init(&s->notes_lock, NULL);
    s->fps = vf_dataset_fps(d);
    s->task_index_column = -1;
    int r = check_settings(&b);
    if (r == 0)
        r = build_windows(&b);
    if (r == 0)
        r = build_columns(&b);
    if (r == 0) {
        s->num_episodes = vf_dataset_num_episodes(d);
        s->episode_start = vf_calloc(s->num_episodes + 1, sizeof *s->episode_start);
        if (!s->episode_start)
            r = VF_ENOMEM;
        for (size_t i = 0; r == 0 && i < s->num_episodes; i++) {
            const vf_episode *e = vf_dataset_episode(d, i);
            if (e->length <= 0)
                r = vf_error(VF_ECORRUPT, "%s: episode %lld has length %lld", vf_dataset_root(d),
                             (long long)e->episode_index, (long long)e->length);
            else
                s->episode_start[i + 1] = s->episode_start[i] + e->length;
        }
        s->num_positions = s->episode_start[s->num_episodes];
    }
    if (r == 0)
        r = setup_table(&b);
    if (r == 0)
        r = build_video(&b);
    free(b.table_names);
    if (r < 0) {
        vf_sample_spec_free(s);
        return r;
    }
    *out = s;
    return 0;
}
