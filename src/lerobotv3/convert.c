/*
 * convert.c: LeRobot v2.1 -> v3.0 conversion (include/vlafeed/convert_v3.h).
 *
 * Order of work, all under OUT.partial (a marker file says it is ours):
 *  1. open the source through the dataset layer (v2.1 backend; local or
 *     URL); refuse v3.0 sources and sources with error problems;
 *  2. data: each episode's Parquet file read whole (every field, as typed)
 *     and written as one row group of the current output file; `index` and
 *     `episode_index` renumbered to the output positions (identity for a
 *     whole contiguous source);
 *  3. videos, per camera: episode MP4s joined by stream copy (join.c);
 *  4. verification of every written MP4 against the video layer's frame
 *     index and episode mapping (each episode at from_timestamp, frames on
 *     the 1/fps grid, counts equal to the lengths);
 *  5. metadata: meta/episodes (LeRobot's column order and types),
 *     meta/tasks.parquet, meta/stats.json (aggregated from the per-episode
 *     stats as LeRobot aggregates them), meta/info.json (the source's, with
 *     the converter's edits: lerobot-format.md §10.2);
 *  6. rename OUT.partial -> OUT (with force, the old OUT is moved aside
 *     first and deleted after).
 * On failure OUT.partial is deleted and OUT is untouched.
 *
 * Depends on: base, io, json (jansson), parquet (reader and writer),
 * dataset (the v2.1 backend and its file access), video (frame index,
 * episode mapping), lerobotv3 (join.c).
 */
#define _GNU_SOURCE
#include "vlafeed/convert_v3.h"

#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/dataset.h"
#include "lerobotv3/lerobotv3.h"
#include "parquet/parquet.h"
#include "video/video.h"

#define PARTIAL_MARKER ".vlafeed-convert-partial"
#define MAX_STAT_DIMS 6

void vf_convert_v3_defaults(vf_convert_v3_settings *s)
{
    memset(s, 0, sizeof *s);
    s->data_files_size_in_mb = 100;
    s->video_files_size_in_mb = 200;
    s->chunks_size = 1000;
    s->verify = 1;
}

/* ---- state ---------------------------------------------------------------- */

typedef struct ep_out {
    int64_t source_index;      /* episode_index in the source */
    int64_t length, from_index;
    int64_t data_chunk, data_file;
    int64_t *video_chunk, *video_file; /* per camera */
    double *from_ts, *to_ts;           /* per camera */
    json_t *stats;                     /* the episode's "stats" object (owned), NULL if none */
} ep_out;

/* Shared by the jobs (data, one per camera) running on the pool. */
typedef struct conv_shared {
    pthread_mutex_t lock;      /* guards steps and the progress callback */
    int64_t steps, total_steps;
    atomic_int stop;           /* set by the first job that fails: the others stop early */
} conv_shared;

/* Each job works on its own copy of the conv (its own report); everything
 * it writes in eps is its own column (data_* for the data job, [camera]
 * slots for a camera job). */
typedef struct conv {
    const vf_convert_v3_settings *s;
    vf_dataset *d;
    const char *root;          /* OUT.partial */
    size_t n, ncams;
    ep_out *eps;
    int64_t total_frames;
    int renumbered;            /* output episode/index numbering differs from the source's */
    int have_stats;            /* per-episode stats loaded (v2.1) */
    conv_shared *shared;
    vf_convert_v3_report *rep;
} conv;

static void step(conv *c, const char *what)
{
    pthread_mutex_lock(&c->shared->lock);
    c->shared->steps++;
    if (c->s->progress)
        c->s->progress(c->s->progress_ctx, c->shared->steps, c->shared->total_steps, what);
    pthread_mutex_unlock(&c->shared->lock);
}

/* Another job failed: stop early (the caller reports that job's error). */
static int stopped(conv *c)
{
    return atomic_load(&c->shared->stop) ? vf_error(VF_EAGAIN, "stopped after another job failed") : 0;
}

static void next_file(const conv *c, int64_t *chunk, int64_t *file)
{
    if (*file >= c->s->chunks_size - 1) {
        (*chunk)++;
        *file = 0;
    } else {
        (*file)++;
    }
}

static int ensure_parent(const char *path)
{
    char *dir = vf_strdup(path);
    if (!dir)
        return VF_ENOMEM;
    char *slash = strrchr(dir, '/');
    int r = 0;
    if (slash) {
        *slash = 0;
        r = vf_mkdirs(dir);
    }
    free(dir);
    return r;
}

static char *out_path(const conv *c, const char *fmt, ...) VF_PRINTF(2, 3);
static char *out_path(const conv *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *rel = NULL;
    int n = vasprintf(&rel, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = vf_path_join(c->root, rel);
    free(rel);
    if (p && ensure_parent(p) < 0) {
        free(p);
        return NULL;
    }
    return p;
}

static int64_t file_bytes(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
}

/* Closes a data writer and counts the file's bytes. */
static int close_data_file(conv *c, vf_pq_writer *pw, char **path)
{
    int r = vf_pq_writer_close(pw);
    if (r == 0)
        c->rep->bytes_written += file_bytes(*path);
    free(*path);
    *path = NULL;
    return r;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static int remove_tree(const char *path)
{
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT)
        return vf_error(VF_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

static int path_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* ---- array builders --------------------------------------------------------- */

/* A LIST nested ndim deep with a fixed shape per row (shape[0] elements per
 * row at the outer level, ...), leaves of leaf_type; *leaf gets the leaf
 * values (rows * prod(shape) slots). */
static int array_nested(vf_pq_array *a, const char *name, const int64_t *shape, int ndim, int64_t rows,
                        vf_pq_type leaf_type, void **leaf)
{
    if (ndim == 0) {
        int r = vf_pq_array_init_scalar(a, name, leaf_type, rows);
        *leaf = a->values;
        return r;
    }
    memset(a, 0, sizeof *a);
    a->type = VF_PQ_T_LIST;
    a->length = rows;
    a->name = vf_strdup(name);
    a->offsets = vf_malloc_array((size_t)rows + 1, sizeof(int64_t));
    a->children = vf_calloc(1, sizeof(vf_pq_array));
    if (!a->name || !a->offsets || !a->children)
        return VF_ENOMEM;
    a->num_children = 1;
    for (int64_t i = 0; i <= rows; i++)
        a->offsets[i] = i * shape[0];
    return array_nested(&a->children[0], "element", shape + 1, ndim - 1, rows * shape[0], leaf_type, leaf);
}

/* ---- 1. source -------------------------------------------------------------- */

static int first_error(vf_dataset *d, const char *src)
{
    size_t errors = vf_dataset_num_errors(d);
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        if (p->severity != VF_SEVERITY_ERROR)
            continue;
        char ep[48] = "";
        if (p->episode >= 0)
            snprintf(ep, sizeof ep, "episode %lld: ", (long long)p->episode);
        return vf_error(VF_ECORRUPT, "%s: the source has %zu error problem(s), the first: %s%s%s%s%s%s "
                        "(see `vlafeed info %s`)",
                        src, errors, p->file, *p->file ? ": " : "", ep, p->column, *p->column ? ": " : "",
                        p->message, src);
    }
    return 0;
}

/* meta/episodes_stats.jsonl -> eps[pos].stats. */
static int load_episode_stats(conv *c)
{
    vf_dataset *d = c->d;
    uint8_t *text = NULL;
    size_t len = 0;
    const char *rel = "meta/episodes_stats.jsonl";
    int r = d->fs.read_all(d->fs.ctx, rel, &text, &len);
    if (r == VF_ENOENT)
        return 0; /* v2.0, or stats absent: no per-episode stats */
    if (r < 0)
        return r;
    size_t line = 0;
    char *p = (char *)text, *end = (char *)text + len;
    while (p < end && r == 0) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line++;
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r'))
            k++;
        if (k < n) {
            json_error_t err;
            json_t *row = json_loadb(p, n, 0, &err);
            json_t *ei = row ? json_object_get(row, "episode_index") : NULL;
            json_t *st = row ? json_object_get(row, "stats") : NULL;
            if (!row || !json_is_integer(ei) || !json_is_object(st)) {
                r = vf_error(VF_ECORRUPT, "%s/%s:%zu: expected {\"episode_index\": int, \"stats\": {...}}%s%s",
                             d->root, rel, line, row ? "" : ": ", row ? "" : err.text);
            } else {
                size_t pos;
                if (vf_dataset_find_episode(d, json_integer_value(ei), &pos) == 0 && !c->eps[pos].stats)
                    c->eps[pos].stats = json_incref(st);
            }
            json_decref(row);
        }
        p = nl ? nl + 1 : end;
    }
    free(text);
    if (r < 0)
        return r;
    for (size_t pos = 0; pos < c->n; pos++)
        if (!c->eps[pos].stats)
            return vf_error(VF_ECORRUPT, "%s/%s: no stats line for episode %lld", d->root, rel,
                            (long long)c->eps[pos].source_index);
    c->have_stats = 1;
    return 0;
}

/* With renumbering, episode_index and index stats follow the new numbers
 * (the values those columns now hold). */
static int renumber_stats(conv *c)
{
    if (!c->renumbered || !c->have_stats)
        return 0;
    for (size_t pos = 0; pos < c->n; pos++) {
        ep_out *e = &c->eps[pos];
        json_t *copy = json_deep_copy(e->stats);
        if (!copy)
            return VF_ENOMEM;
        json_decref(e->stats);
        e->stats = copy;
        double n = (double)e->length;
        int64_t lo[2] = {(int64_t)pos, e->from_index}, hi[2] = {(int64_t)pos, e->from_index + e->length - 1};
        double mean[2] = {(double)pos, (double)e->from_index + (n - 1) / 2};
        double sd[2] = {0.0, sqrt((n * n - 1) / 12.0)};
        const char *names[2] = {"episode_index", "index"};
        for (int k = 0; k < 2; k++) {
            if (!json_object_get(copy, names[k]))
                continue;
            json_object_set_new(copy, names[k],
                                json_pack("{s:[I],s:[I],s:[f],s:[f],s:[I]}", "min", (json_int_t)lo[k], "max",
                                          (json_int_t)hi[k], "mean", mean[k], "std", sd[k], "count",
                                          (json_int_t)e->length));
        }
    }
    return 0;
}

/* ---- 2. data ------------------------------------------------------------------ */

typedef struct data_schema {
    int num_fields;
    char **names;
    vf_pq_type *types;
} data_schema;

static void data_schema_free(data_schema *s)
{
    for (int i = 0; i < s->num_fields; i++)
        free(s->names[i]);
    free(s->names);
    free(s->types);
    memset(s, 0, sizeof *s);
}

static int check_schema(data_schema *s, const vf_pq_file *f, const char *file, int64_t episode)
{
    int nf = vf_pq_num_fields(f);
    if (!s->names) {
        s->names = vf_calloc((size_t)nf, sizeof *s->names);
        s->types = vf_calloc((size_t)nf, sizeof *s->types);
        if (!s->names || !s->types)
            return VF_ENOMEM;
        s->num_fields = nf;
        for (int i = 0; i < nf; i++) {
            if (!(s->names[i] = vf_strdup(vf_pq_field(f, i)->name)))
                return VF_ENOMEM;
            s->types[i] = vf_pq_field(f, i)->type;
        }
        return 0;
    }
    for (int i = 0; i < nf || i < s->num_fields; i++) {
        const vf_pq_node *n = i < nf ? vf_pq_field(f, i) : NULL;
        if (i >= s->num_fields || !n || strcmp(n->name, s->names[i]) || n->type != s->types[i])
            return vf_error(VF_ECORRUPT,
                            "%s: episode %lld: column %d is '%s' (%s) but earlier episodes have '%s' (%s); "
                            "all episodes of a v3.0 data file share one schema",
                            file, (long long)episode, i, n ? n->name : "(none)", n ? vf_pq_type_name(n->type) : "-",
                            i < s->num_fields ? s->names[i] : "(none)",
                            i < s->num_fields ? vf_pq_type_name(s->types[i]) : "-");
    }
    return 0;
}

/* Rewrites the scalar INT64 columns episode_index and index to the output
 * numbering; notes whether anything changed. */
static int renumber_rows(conv *c, size_t pos, vf_pq_array *fields, int nf, const char *file)
{
    const ep_out *e = &c->eps[pos];
    for (int i = 0; i < nf; i++) {
        vf_pq_array *a = &fields[i];
        int is_ep = !strcmp(a->name, "episode_index"), is_index = !strcmp(a->name, "index");
        if (!is_ep && !is_index)
            continue;
        if (a->type != VF_PQ_T_INT64 || a->null_count)
            return vf_error(VF_ECORRUPT, "%s: episode %lld: column '%s' is %s%s, expected int64 without nulls", file,
                            (long long)e->source_index, a->name, vf_pq_type_name(a->type),
                            a->null_count ? " with nulls" : "");
        int64_t *v = a->values;
        for (int64_t k = 0; k < a->length; k++) {
            int64_t want = is_ep ? (int64_t)pos : e->from_index + k;
            if (v[k] != want) {
                c->renumbered = 1;
                v[k] = want;
            }
        }
    }
    return 0;
}

static int write_data(conv *c)
{
    vf_dataset *d = c->d;
    data_schema schema = {0};
    vf_pq_writer_settings ps;
    vf_pq_writer_defaults(&ps);
    vf_pq_writer *pw = NULL;
    char *pw_path = NULL;
    int64_t chunk = 0, file = 0, in_file = 0;
    const double limit = c->s->data_files_size_in_mb * 1024 * 1024;
    int r = 0;
    for (size_t pos = 0; pos < c->n && r == 0; pos++) {
        ep_out *e = &c->eps[pos];
        vf_data_span span;
        vf_source *src = NULL;
        vf_pq_file *f = NULL;
        vf_pq_array *fields = NULL;
        int *idx = NULL;
        int nf = 0;
        if ((r = stopped(c)) < 0 || (r = vf_dataset_episode_data(d, pos, &span)) < 0 || (r = vf_ds_open_path(d, span.path, &src)) < 0)
            goto episode_done;
        int64_t src_bytes = (int64_t)vf_source_size(src);
        c->rep->bytes_read += src_bytes;
        r = vf_pq_open(&f, src);
        vf_source_close(src);
        if (r < 0 || (r = check_schema(&schema, f, span.path, e->source_index)) < 0)
            goto episode_done;
        nf = vf_pq_num_fields(f);
        fields = vf_calloc((size_t)nf, sizeof *fields);
        idx = vf_calloc((size_t)nf, sizeof *idx);
        if (!fields || !idx) {
            r = VF_ENOMEM;
            goto episode_done;
        }
        for (int i = 0; i < nf; i++)
            idx[i] = i;
        if ((r = vf_pq_read_fields_all(f, idx, nf, fields)) < 0)
            goto episode_done;
        if (span.row_offset != 0 || vf_pq_num_rows(f) != e->length) {
            r = vf_error(VF_ECORRUPT, "%s: episode %lld: holds %lld rows, but the episode's length is %lld",
                         span.path, (long long)e->source_index, (long long)vf_pq_num_rows(f), (long long)e->length);
            goto episode_done;
        }
        if ((r = renumber_rows(c, pos, fields, nf, span.path)) < 0)
            goto episode_done;
        if (pw && in_file > 0 && (double)(in_file + src_bytes) >= limit) {
            r = close_data_file(c, pw, &pw_path);
            pw = NULL;
            next_file(c, &chunk, &file);
            in_file = 0;
            if (r < 0)
                goto episode_done;
        }
        if (!pw) {
            pw_path = out_path(c, "data/chunk-%03lld/file-%03lld.parquet", (long long)chunk, (long long)file);
            r = pw_path ? vf_pq_writer_open(&pw, pw_path, &ps) : VF_ENOMEM;
            const char *hf = vf_pq_kv(f, "huggingface");
            if (r == 0 && hf)
                r = vf_pq_writer_add_kv(pw, "huggingface", hf);
            c->rep->data_files++;
            if (r < 0)
                goto episode_done;
        }
        e->data_chunk = chunk;
        e->data_file = file;
        r = vf_pq_writer_write_row_group(pw, fields, nf);
        in_file += src_bytes;
        step(c, "data");
    episode_done:
        if (fields)
            vf_pq_arrays_free(fields, nf);
        free(fields);
        free(idx);
        if (f)
            vf_pq_close(f);
        if (r < 0 && r != VF_ENOMEM && r != VF_EAGAIN)
            vf_error_context(r, "data of episode %lld", (long long)e->source_index);
    }
    if (pw) {
        if (r == 0)
            r = close_data_file(c, pw, &pw_path);
        else
            vf_pq_writer_abort(pw);
    }
    free(pw_path);
    data_schema_free(&schema);
    return r;
}

/* ---- 3. videos ----------------------------------------------------------------- */

static int open_join(conv *c, const char *key, int64_t chunk, int64_t file, vf_lr3_join **j)
{
    char *path = out_path(c, "videos/%s/chunk-%03lld/file-%03lld.mp4", key, (long long)chunk, (long long)file);
    int r = path ? vf_lr3_join_open(j, path) : VF_ENOMEM;
    free(path);
    if (r == 0)
        c->rep->video_files++;
    return r;
}

static int close_join(conv *c, vf_lr3_join *j, const char *key, int64_t chunk, int64_t file)
{
    c->rep->video_packets += vf_lr3_join_packets(j);
    int r = vf_lr3_join_close(j);
    char *path = vf_asprintf("%s/videos/%s/chunk-%03lld/file-%03lld.mp4", c->root, key, (long long)chunk,
                             (long long)file);
    if (r == 0 && path)
        c->rep->bytes_written += file_bytes(path);
    free(path);
    return r;
}

static int write_camera(conv *c, size_t cam)
{
    vf_dataset *d = c->d;
    const char *key = vf_dataset_camera(d, cam)->key;
    const double limit = c->s->video_files_size_in_mb * 1024 * 1024;
    vf_lr3_join *j = NULL;
    int64_t chunk = 0, file = 0;
    int r = 0;
    for (size_t pos = 0; pos < c->n && r == 0; pos++) {
        ep_out *e = &c->eps[pos];
        vf_video_span span;
        vf_source *src = NULL;
        if ((r = stopped(c)) < 0 || (r = vf_dataset_episode_video(d, pos, cam, &span)) < 0 || (r = vf_ds_open_path(d, span.path, &src)) < 0)
            goto episode_done;
        int64_t size = (int64_t)vf_source_size(src);
        if (j && vf_lr3_join_episodes(j) > 0 && (double)(vf_lr3_join_bytes(j) + size) >= limit) {
            r = close_join(c, j, key, chunk, file);
            j = NULL;
            next_file(c, &chunk, &file);
            if (r < 0)
                goto episode_done;
        }
        if (!j && (r = open_join(c, key, chunk, file, &j)) < 0)
            goto episode_done;
        vf_lr3_appended res;
        r = vf_lr3_join_append(j, src, e->length, &res);
        if (r == VF_LR3_INCOMPATIBLE) {
            /* codec parameters changed: this episode starts a new file */
            r = close_join(c, j, key, chunk, file);
            j = NULL;
            next_file(c, &chunk, &file);
            if (r == 0 && (r = open_join(c, key, chunk, file, &j)) == 0) {
                r = vf_lr3_join_append(j, src, e->length, &res);
                if (r == VF_LR3_INCOMPATIBLE)
                    r = vf_error(VF_EINVAL, "%s: cannot start a file", span.path);
            }
        }
        if (r < 0)
            goto episode_done;
        c->rep->bytes_read += res.bytes_read;
        e->video_chunk[cam] = chunk;
        e->video_file[cam] = file;
        e->from_ts[cam] = res.from_timestamp;
        e->to_ts[cam] = res.to_timestamp;
        step(c, key);
    episode_done:
        if (src)
            vf_source_close(src);
        if (r < 0 && r != VF_ENOMEM && r != VF_EAGAIN)
            vf_error_context(r, "episode %lld, camera %s", (long long)e->source_index, key);
    }
    if (j) {
        if (r == 0)
            r = close_join(c, j, key, chunk, file);
        else
            vf_lr3_join_abort(j);
    }
    return r;
}

/* ---- 4. verification ------------------------------------------------------------ */

/* Every written file of camera cam: its frame index, and each episode's
 * frames mapped by the video layer exactly where the metadata says. */
static int verify_camera(conv *c, size_t cam)
{
    const char *key = vf_dataset_camera(c->d, cam)->key;
    int r = 0;
    size_t first = 0;
    vf_video_episode *eps = vf_calloc(c->n, sizeof *eps);
    if (!eps)
        return VF_ENOMEM;
    while (first < c->n && r == 0) {
        size_t last = first;
        while (last < c->n && c->eps[last].video_chunk[cam] == c->eps[first].video_chunk[cam] &&
               c->eps[last].video_file[cam] == c->eps[first].video_file[cam])
            last++;
        char *path = vf_asprintf("%s/videos/%s/chunk-%03lld/file-%03lld.mp4", c->root, key,
                                 (long long)c->eps[first].video_chunk[cam], (long long)c->eps[first].video_file[cam]);
        vf_video_index *index = NULL;
        r = path ? vf_video_index_build_file(&index, path) : VF_ENOMEM;
        size_t count = last - first;
        int64_t frames = 0;
        for (size_t k = 0; k < count && r == 0; k++) {
            const ep_out *e = &c->eps[first + k];
            memset(&eps[k], 0, sizeof eps[k]);
            eps[k].episode_index = (int64_t)(first + k);
            eps[k].from_timestamp = e->from_ts[cam];
            eps[k].to_timestamp = e->to_ts[cam];
            eps[k].length = e->length;
            frames += e->length;
        }
        vf_video_map map;
        memset(&map, 0, sizeof map);
        if (r == 0 && index->frame_count != frames)
            r = vf_error(VF_ECORRUPT, "%s: written file holds %lld frames, its episodes %lld", path,
                         (long long)index->frame_count, (long long)frames);
        if (r == 0) {
            vf_video_map_settings ms = {vf_dataset_fps(c->d), 0, key};
            r = vf_video_map_episodes(index, eps, count, &ms, &map);
            int64_t expect_first = 0;
            for (size_t k = 0; k < count && r == 0; k++) {
                const vf_video_episode *ve = &eps[k];
                if (map.method != VF_VIDEO_MAP_BY_ORDINAL || ve->unmatched_frame >= 0 ||
                    ve->first_ordinal != expect_first || ve->frames_found != ve->length)
                    r = vf_error(VF_ECORRUPT,
                                 "%s: episode %lld (source episode %lld) is not where its metadata says "
                                 "(from_timestamp %.9f): %s",
                                 path, (long long)ve->episode_index, (long long)c->eps[first + k].source_index,
                                 ve->from_timestamp, ve->unmatched_frame >= 0 ? ve->unmatched_reason : "frames differ");
                expect_first += ve->length;
            }
            for (size_t p = 0; p < map.problem_count && r == 0; p++)
                if (map.problems[p].kind != VF_VIDEO_PROBLEM_DRIFT)
                    r = vf_error(VF_ECORRUPT, "%s: %s", path, map.problems[p].message);
            if (map.max_abs_drift_ms > c->rep->max_abs_drift_ms)
                c->rep->max_abs_drift_ms = map.max_abs_drift_ms;
            vf_video_map_free(&map, eps, count);
        }
        vf_video_index_free(index);
        free(path);
        first = last;
    }
    free(eps);
    return r;
}

/* ---- 5. metadata ----------------------------------------------------------------- */

/* Shape of a nested JSON list (numbers at the leaves); 0 dims for a number. */
static int json_shape(const json_t *v, int64_t *shape, int *ndim)
{
    *ndim = 0;
    while (json_is_array(v)) {
        if (*ndim == MAX_STAT_DIMS || json_array_size(v) == 0)
            return VF_ECORRUPT;
        shape[(*ndim)++] = (int64_t)json_array_size(v);
        v = json_array_get(v, 0);
    }
    return json_is_number(v) || json_is_null(v) ? 0 : VF_ECORRUPT;
}

/* Flattens v (which must have exactly the shape) into vals; clears *all_int
 * at a non-integer leaf. */
static int json_flatten(const json_t *v, const int64_t *shape, int ndim, double *vals, size_t *at, int *all_int)
{
    if (ndim == 0) {
        if (json_is_array(v))
            return VF_ECORRUPT;
        if (json_is_integer(v)) {
            vals[(*at)++] = (double)json_integer_value(v);
        } else if (json_is_real(v)) {
            vals[(*at)++] = json_real_value(v);
            *all_int = 0;
        } else if (json_is_null(v)) {
            vals[(*at)++] = NAN;
            *all_int = 0;
        } else {
            return VF_ECORRUPT;
        }
        return 0;
    }
    if (!json_is_array(v) || (int64_t)json_array_size(v) != shape[0])
        return VF_ECORRUPT;
    for (size_t i = 0; i < json_array_size(v); i++)
        if (json_flatten(json_array_get(v, i), shape + 1, ndim - 1, vals, at, all_int) < 0)
            return VF_ECORRUPT;
    return 0;
}

/* One (feature, stat) over every episode: flat values [n][size]. */
typedef struct stat_column {
    const char *feature, *stat;
    int64_t shape[MAX_STAT_DIMS];
    int ndim;
    size_t size;
    int all_int;
    double *vals;
} stat_column;

static int gather_stat(conv *c, const char *feature, const char *stat, stat_column *out)
{
    memset(out, 0, sizeof *out);
    out->feature = feature;
    out->stat = stat;
    out->all_int = 1;
    const json_t *v0 = json_object_get(json_object_get(c->eps[0].stats, feature), stat);
    if (json_shape(v0, out->shape, &out->ndim) < 0)
        return vf_error(VF_ECORRUPT, "%s/meta/episodes_stats.jsonl: episode %lld: stats/%s/%s is not a nested list of "
                        "numbers", c->d->root, (long long)c->eps[0].source_index, feature, stat);
    if (out->ndim == 0) { /* a bare number is stored as a list of one */
        out->ndim = 1;
        out->shape[0] = 1;
    }
    out->size = 1;
    for (int i = 0; i < out->ndim; i++)
        out->size *= (size_t)out->shape[i];
    out->vals = vf_malloc_array(c->n * out->size, sizeof(double));
    if (!out->vals)
        return VF_ENOMEM;
    for (size_t pos = 0; pos < c->n; pos++) {
        const json_t *v = json_object_get(json_object_get(c->eps[pos].stats, feature), stat);
        size_t at = pos * out->size;
        int r = VF_ECORRUPT;
        if (v && json_is_number(v) && out->size == 1 && out->ndim == 1) {
            json_t *wrap = json_pack("[O]", v);
            r = json_flatten(wrap, out->shape, out->ndim, out->vals, &at, &out->all_int);
            json_decref(wrap);
        } else if (v) {
            r = json_flatten(v, out->shape, out->ndim, out->vals, &at, &out->all_int);
        }
        if (r < 0)
            return vf_error(VF_ECORRUPT,
                            "%s/meta/episodes_stats.jsonl: episode %lld: stats/%s/%s is missing or has another shape "
                            "than episode %lld's",
                            c->d->root, (long long)c->eps[pos].source_index, feature, stat,
                            (long long)c->eps[0].source_index);
    }
    return 0;
}

/* The (feature, stat) pairs of the per-episode stats, features in info.json
 * order, stats in the order of the first episode's object. */
static int gather_stats(conv *c, stat_column **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    if (!c->have_stats || c->n == 0)
        return 0;
    size_t cap = 0;
    for (size_t fi = 0; fi < vf_dataset_num_features(c->d); fi++) {
        const char *feature = vf_dataset_feature(c->d, fi)->name;
        json_t *fs = json_object_get(c->eps[0].stats, feature);
        if (!json_is_object(fs))
            continue;
        const char *stat;
        json_t *v;
        json_object_foreach(fs, stat, v)
        {
            (void)v;
            if (*count == cap) {
                cap = cap ? cap * 2 : 32;
                stat_column *grown = vf_realloc(*out, cap * sizeof **out);
                if (!grown)
                    return VF_ENOMEM;
                *out = grown;
            }
            int r = gather_stat(c, feature, stat, &(*out)[*count]);
            (*count)++;
            if (r < 0)
                return r;
        }
    }
    return 0;
}

static void free_stats(stat_column *cols, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(cols[i].vals);
    free(cols);
}

static int write_episodes_meta(conv *c, const stat_column *stats, size_t num_stats)
{
    int64_t rows = (int64_t)c->n;
    size_t max_cols = 9 + 4 * c->ncams + num_stats + 2;
    vf_pq_array *cols = vf_calloc(max_cols, sizeof *cols);
    if (!cols)
        return VF_ENOMEM;
    int n = 0, r = 0;
#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        if ((r = (x)) < 0)                                                                                             \
            goto done;                                                                                                 \
    } while (0)
    TRY(vf_pq_array_init_scalar(&cols[n], "episode_index", VF_PQ_T_INT64, rows));
    for (int64_t e = 0; e < rows; e++)
        ((int64_t *)cols[n].values)[e] = e;
    n++;
    {
        size_t total = 0;
        for (size_t e = 0; e < c->n; e++)
            total += vf_dataset_episode(c->d, e)->num_tasks;
        const char **texts = vf_calloc(total ? total : 1, sizeof *texts);
        if (!texts) {
            r = VF_ENOMEM;
            goto done;
        }
        vf_pq_array *a = &cols[n++];
        a->type = VF_PQ_T_LIST;
        a->length = rows;
        a->name = vf_strdup("tasks");
        a->offsets = vf_malloc_array((size_t)rows + 1, sizeof(int64_t));
        a->children = vf_calloc(1, sizeof(vf_pq_array));
        a->num_children = a->children ? 1 : 0;
        if (!a->name || !a->offsets || !a->children) {
            free(texts);
            r = VF_ENOMEM;
            goto done;
        }
        size_t at = 0;
        a->offsets[0] = 0;
        for (size_t e = 0; e < c->n; e++) {
            const vf_episode *ep = vf_dataset_episode(c->d, e);
            for (size_t t = 0; t < ep->num_tasks; t++)
                texts[at++] = ep->tasks[t];
            a->offsets[e + 1] = (int64_t)at;
        }
        r = vf_pq_array_init_strings(&a->children[0], "element", texts, (int64_t)at);
        free(texts);
        if (r < 0)
            goto done;
    }
    const char *int_cols[] = {"length", "data/chunk_index", "data/file_index", "dataset_from_index",
                              "dataset_to_index"};
    for (int k = 0; k < 5; k++) {
        TRY(vf_pq_array_init_scalar(&cols[n], int_cols[k], VF_PQ_T_INT64, rows));
        for (int64_t e = 0; e < rows; e++) {
            const ep_out *ep = &c->eps[e];
            int64_t v = k == 0 ? ep->length : k == 1 ? ep->data_chunk : k == 2 ? ep->data_file
                                        : k == 3 ? ep->from_index : ep->from_index + ep->length;
            ((int64_t *)cols[n].values)[e] = v;
        }
        n++;
    }
    for (size_t cam = 0; cam < c->ncams; cam++) {
        const char *fields[] = {"chunk_index", "file_index", "from_timestamp", "to_timestamp"};
        for (int k = 0; k < 4; k++) {
            char *name = vf_asprintf("videos/%s/%s", vf_dataset_camera(c->d, cam)->key, fields[k]);
            r = name ? vf_pq_array_init_scalar(&cols[n], name, k < 2 ? VF_PQ_T_INT64 : VF_PQ_T_DOUBLE, rows) : VF_ENOMEM;
            free(name);
            if (r < 0)
                goto done;
            for (int64_t e = 0; e < rows; e++) {
                const ep_out *ep = &c->eps[e];
                if (k < 2)
                    ((int64_t *)cols[n].values)[e] = k == 0 ? ep->video_chunk[cam] : ep->video_file[cam];
                else
                    ((double *)cols[n].values)[e] = k == 2 ? ep->from_ts[cam] : ep->to_ts[cam];
            }
            n++;
        }
    }
    for (size_t i = 0; i < num_stats; i++) {
        const stat_column *s = &stats[i];
        char *name = vf_asprintf("stats/%s/%s", s->feature, s->stat);
        void *leaf = NULL;
        vf_pq_type t = s->all_int ? VF_PQ_T_INT64 : VF_PQ_T_DOUBLE;
        r = name ? array_nested(&cols[n], name, s->shape, s->ndim, rows, t, &leaf) : VF_ENOMEM;
        free(name);
        n++;
        if (r < 0)
            goto done;
        for (size_t k = 0; k < c->n * s->size; k++) {
            if (t == VF_PQ_T_INT64)
                ((int64_t *)leaf)[k] = (int64_t)s->vals[k];
            else
                ((double *)leaf)[k] = s->vals[k];
        }
    }
    TRY(vf_pq_array_init_scalar(&cols[n++], "meta/episodes/chunk_index", VF_PQ_T_INT64, rows));
    TRY(vf_pq_array_init_scalar(&cols[n++], "meta/episodes/file_index", VF_PQ_T_INT64, rows));
    {
        char *path = out_path(c, "meta/episodes/chunk-000/file-000.parquet");
        r = path ? vf_pq_write_file(path, cols, n, NULL, NULL) : VF_ENOMEM;
        free(path);
    }
done:
#undef TRY
    vf_pq_arrays_free(cols, (int)max_cols);
    free(cols);
    return r;
}

static int write_tasks(conv *c)
{
    size_t nt = vf_dataset_num_tasks(c->d);
    const char **texts = vf_calloc(nt ? nt : 1, sizeof *texts);
    char *path = out_path(c, "meta/tasks.parquet");
    int r = texts && path ? 0 : VF_ENOMEM;
    for (size_t i = 0; r == 0 && i < nt; i++)
        texts[i] = vf_dataset_task(c->d, i);
    if (r == 0)
        r = vf_ds_write_tasks_parquet(path, texts, nt);
    free(path);
    free(texts);
    return r;
}

/* Nested JSON list of shape from flat values. */
static json_t *json_nest(const double *vals, const int64_t *shape, int ndim, int as_int, size_t *at)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < shape[0]; i++) {
        if (ndim == 1) {
            double v = vals[(*at)++];
            json_array_append_new(a, as_int ? json_integer((json_int_t)v)
                                     : isfinite(v) ? json_real(v) : json_null());
        } else {
            json_array_append_new(a, json_nest(vals, shape + 1, ndim - 1, as_int, at));
        }
    }
    return a;
}

static const stat_column *find_stat(const stat_column *cols, size_t n, const char *feature, const char *stat)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(cols[i].feature, feature) && !strcmp(cols[i].stat, stat))
            return &cols[i];
    return NULL;
}

/* meta/stats.json: LeRobot's aggregate_stats over the episodes: min/max
 * element-wise, mean weighted by count, std from the pooled variance, count
 * summed, quantiles qNN by the element-wise min (NN <= 50) or max. */
static int write_stats(conv *c, const stat_column *cols, size_t ncols)
{
    char *path = out_path(c, "meta/stats.json");
    if (!path)
        return VF_ENOMEM;
    int r = 0;
    if (!c->have_stats) {
        /* v2.0: the source's global meta/stats.json, copied as is */
        uint8_t *text = NULL;
        size_t len = 0;
        r = c->d->fs.read_all(c->d->fs.ctx, "meta/stats.json", &text, &len);
        if (r == 0) {
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(text, 1, len, f) != len)
                r = vf_error(VF_EIO, "%s: cannot write", path);
            if (f && fclose(f) != 0 && r == 0)
                r = vf_error(VF_EIO, "%s: cannot write", path);
        } else if (r == VF_ENOENT) {
            r = 0; /* no stats anywhere: LeRobot accepts a missing stats.json */
        }
        free(text);
        free(path);
        return r;
    }
    json_t *root = json_object();
    double *agg = NULL;
    for (size_t i = 0; i < ncols && r == 0; i++) {
        const stat_column *s = &cols[i];
        const stat_column *count = find_stat(cols, ncols, s->feature, "count");
        const stat_column *mean = find_stat(cols, ncols, s->feature, "mean");
        free(agg);
        agg = vf_calloc(s->size, sizeof *agg);
        if (!agg) {
            r = VF_ENOMEM;
            break;
        }
        const char *st = s->stat;
        int quantile = st[0] == 'q' && st[1] >= '0' && st[1] <= '9';
        for (size_t k = 0; k < s->size; k++) {
            double total = 0, acc = 0, mn = INFINITY, mx = -INFINITY;
            for (size_t e = 0; e < c->n; e++) {
                double w = count ? count->vals[e * count->size] : 1.0;
                double v = s->vals[e * s->size + k];
                total += w;
                mn = fmin(mn, v);
                mx = fmax(mx, v);
                if (!strcmp(st, "mean") || !strcmp(st, "count"))
                    acc += !strcmp(st, "count") ? v : w * v;
            }
            if (!strcmp(st, "min") || (quantile && atoi(st + 1) <= 50)) {
                agg[k] = mn;
            } else if (!strcmp(st, "max") || quantile) {
                agg[k] = mx;
            } else if (!strcmp(st, "count")) {
                agg[k] = acc;
            } else if (!strcmp(st, "mean")) {
                agg[k] = total > 0 ? acc / total : NAN;
            } else if (!strcmp(st, "std") && mean && mean->size == s->size) {
                double m = 0;
                for (size_t e = 0; e < c->n; e++)
                    m += (count ? count->vals[e * count->size] : 1.0) * mean->vals[e * s->size + k];
                m = total > 0 ? m / total : NAN;
                double var = 0;
                for (size_t e = 0; e < c->n; e++) {
                    double w = count ? count->vals[e * count->size] : 1.0;
                    double sd = s->vals[e * s->size + k], dm = mean->vals[e * s->size + k] - m;
                    var += w * (sd * sd + dm * dm);
                }
                agg[k] = total > 0 ? sqrt(var / total) : NAN;
            } else {
                agg[k] = NAN; /* an unknown statistic: left out below */
            }
        }
        if (!strcmp(st, "std") && !(mean && mean->size == s->size))
            continue;
        if (strcmp(st, "min") && strcmp(st, "max") && strcmp(st, "mean") && strcmp(st, "std") &&
            strcmp(st, "count") && !quantile)
            continue;
        json_t *fobj = json_object_get(root, s->feature);
        if (!fobj) {
            fobj = json_object();
            json_object_set_new(root, s->feature, fobj);
        }
        int as_int = s->all_int && (!strcmp(st, "min") || !strcmp(st, "max") || !strcmp(st, "count"));
        size_t at = 0;
        json_object_set_new(fobj, st, json_nest(agg, s->shape, s->ndim, as_int, &at));
    }
    free(agg);
    if (r == 0 && json_dump_file(root, path, JSON_INDENT(4)) != 0)
        r = vf_error(VF_EIO, "%s: cannot write", path);
    json_decref(root);
    free(path);
    return r;
}

/* meta/info.json: the source's, edited as LeRobot's converter edits it. */
static int write_info(conv *c)
{
    vf_dataset *d = c->d;
    uint8_t *text = NULL;
    size_t len = 0;
    int r = d->fs.read_all(d->fs.ctx, "meta/info.json", &text, &len);
    if (r < 0)
        return r;
    json_error_t err;
    json_t *info = json_loadb((const char *)text, len, 0, &err);
    free(text);
    if (!json_is_object(info)) {
        json_decref(info);
        return vf_error(VF_ECORRUPT, "%s/meta/info.json: not a JSON object", d->root);
    }
    int fps = (int)lround(vf_dataset_fps(d));
    json_object_set_new(info, "codebase_version", json_string("v3.0"));
    json_object_del(info, "total_chunks");
    json_object_del(info, "total_videos");
    json_object_set_new(info, "total_episodes", json_integer((json_int_t)c->n));
    json_object_set_new(info, "total_frames", json_integer((json_int_t)c->total_frames));
    json_object_set_new(info, "total_tasks", json_integer((json_int_t)vf_dataset_num_tasks(d)));
    json_object_set_new(info, "chunks_size", json_integer(c->s->chunks_size));
    json_object_set_new(info, "data_files_size_in_mb", json_integer((json_int_t)ceil(c->s->data_files_size_in_mb)));
    json_object_set_new(info, "video_files_size_in_mb",
                        json_integer((json_int_t)ceil(c->s->video_files_size_in_mb)));
    json_object_set_new(info, "fps", json_integer(fps));
    json_object_set_new(info, "data_path", json_string("data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"));
    json_object_set_new(info, "video_path",
                        c->ncams ? json_string("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
                                 : json_null());
    char split[64];
    snprintf(split, sizeof split, "0:%zu", c->n);
    json_object_set_new(info, "splits", json_pack("{s:s}", "train", split));
    json_t *features = json_object_get(info, "features");
    const char *name;
    json_t *feat;
    json_object_foreach(features, name, feat)
    {
        json_t *dtype = json_object_get(feat, "dtype");
        if (json_is_object(feat) && !(json_is_string(dtype) && !strcmp(json_string_value(dtype), "video")))
            json_object_set_new(feat, "fps", json_integer(fps));
    }
    char *path = out_path(c, "meta/info.json");
    if (!path || json_dump_file(info, path, JSON_INDENT(4)) != 0)
        r = vf_error(VF_EIO, "%s: cannot write", path ? path : "meta/info.json");
    free(path);
    json_decref(info);
    return r;
}

/* ---- the jobs: data, and one per camera (write + verify) ------------------------------ */

typedef struct conv_job {
    conv c;                    /* a copy with its own report */
    vf_convert_v3_report rep;
    long camera;               /* -1: the data job */
    int result;
    char message[2048];
} conv_job;

static void run_job(void *arg)
{
    conv_job *job = arg;
    conv *c = &job->c;
    c->rep = &job->rep;
    int r;
    if (job->camera < 0) {
        r = write_data(c);
    } else {
        r = write_camera(c, (size_t)job->camera);
        if (r == 0 && c->s->verify)
            r = verify_camera(c, (size_t)job->camera);
    }
    job->result = r;
    if (r < 0) {
        snprintf(job->message, sizeof job->message, "%s", vf_last_error());
        if (r != VF_EAGAIN)
            atomic_store(&c->shared->stop, 1);
    }
}

/* Runs the data job and the camera jobs, on up to `threads` threads (1:
 * in order on the caller's thread). Sums the reports into c->rep; on
 * failure reports the first failed job in order (data, camera 0, ...) that
 * did not merely stop because another one failed. */
static int run_jobs(conv *c, int threads)
{
    size_t njobs = 1 + c->ncams;
    conv_job *jobs = vf_calloc(njobs, sizeof *jobs);
    if (!jobs)
        return VF_ENOMEM;
    for (size_t i = 0; i < njobs; i++) {
        jobs[i].c = *c;
        jobs[i].camera = (long)i - 1;
    }
    vf_thread_pool *pool = NULL;
    int r = 0;
    if (threads > 1 && njobs > 1 && vf_thread_pool_create(&pool, threads < (int)njobs ? threads : (int)njobs) < 0)
        pool = NULL; /* fall back to the caller's thread */
    for (size_t i = 0; i < njobs; i++) {
        if (!pool || vf_thread_pool_submit(pool, run_job, &jobs[i]) < 0)
            run_job(&jobs[i]);
    }
    if (pool) {
        vf_thread_pool_wait(pool);
        vf_thread_pool_destroy(pool);
    }
    const conv_job *failed = NULL;
    for (size_t i = 0; i < njobs; i++) {
        const vf_convert_v3_report *j = &jobs[i].rep;
        c->rep->bytes_read += j->bytes_read;
        c->rep->bytes_written += j->bytes_written;
        c->rep->data_files += j->data_files;
        c->rep->video_files += j->video_files;
        c->rep->video_packets += j->video_packets;
        if (j->max_abs_drift_ms > c->rep->max_abs_drift_ms)
            c->rep->max_abs_drift_ms = j->max_abs_drift_ms;
        if (jobs[i].result < 0 && (!failed || (failed->result == VF_EAGAIN && jobs[i].result != VF_EAGAIN)))
            failed = &jobs[i];
    }
    c->renumbered = jobs[0].c.renumbered;
    if (failed)
        r = vf_error(failed->result, "%s", failed->message);
    free(jobs);
    return r;
}

/* ---- entry point -------------------------------------------------------------------- */

static int check_settings(const vf_convert_v3_settings *s)
{
    if (!(s->data_files_size_in_mb > 0) || !(s->video_files_size_in_mb > 0))
        return vf_error(VF_EINVAL, "convert: file size limits must be > 0 MB");
    if (s->chunks_size < 1)
        return vf_error(VF_EINVAL, "convert: chunks_size must be >= 1");
    return 0;
}

static int prepare_partial(const char *out, const char *partial, int force)
{
    if (path_exists(out) && !force)
        return vf_error(VF_EINVAL, "%s: already exists (use --force to replace it)", out);
    if (path_exists(partial)) {
        char *marker = vf_path_join(partial, PARTIAL_MARKER);
        int ours = marker && vf_file_exists(marker);
        free(marker);
        if (!ours)
            return vf_error(VF_EINVAL, "%s: exists and is not a vlafeed partial output; remove it or choose another OUT",
                            partial);
        int r = remove_tree(partial); /* a previous run that stopped: start over */
        if (r < 0)
            return r;
    }
    int r = vf_mkdirs(partial);
    if (r < 0)
        return r;
    char *marker = vf_path_join(partial, PARTIAL_MARKER);
    FILE *f = marker ? fopen(marker, "w") : NULL;
    free(marker);
    if (!f)
        return vf_error(VF_EIO, "%s: cannot create: %s", partial, strerror(errno));
    fclose(f);
    return 0;
}

static int finish(const char *out, const char *partial, int force)
{
    char *marker = vf_path_join(partial, PARTIAL_MARKER);
    if (!marker)
        return VF_ENOMEM;
    unlink(marker);
    free(marker);
    char *old = NULL;
    if (path_exists(out)) {
        if (!force)
            return vf_error(VF_EINVAL, "%s: appeared while converting; the result is left in %s", out, partial);
        old = vf_asprintf("%s.old-%ld", out, (long)getpid());
        if (!old)
            return VF_ENOMEM;
        if (rename(out, old) < 0) {
            int r = vf_error(VF_EIO, "%s: cannot move aside: %s", out, strerror(errno));
            free(old);
            return r;
        }
    }
    int r = 0;
    if (rename(partial, out) < 0) {
        r = vf_error(VF_EIO, "%s: cannot rename to %s: %s", partial, out, strerror(errno));
        if (old)
            rename(old, out);
    } else if (old) {
        r = remove_tree(old);
    }
    free(old);
    return r;
}

int vf_convert_v3(const char *src, const char *out, const vf_convert_v3_settings *settings,
                  vf_convert_v3_report *report)
{
    vf_convert_v3_settings defaults;
    if (!settings) {
        vf_convert_v3_defaults(&defaults);
        settings = &defaults;
    }
    vf_convert_v3_report local_report;
    if (!report)
        report = &local_report;
    memset(report, 0, sizeof *report);
    double started = vf_now_seconds();
    if (!src || !out || !*out)
        return vf_error(VF_EINVAL, "convert: source and output are required");
    int r = check_settings(settings);
    if (r < 0)
        return r;
    if (vf_is_url(out))
        return vf_error(VF_EINVAL, "%s: the output must be a local folder", out);
    if (!vf_is_url(src)) {
        /* OUT == SRC with --force would delete the source once converted */
        char *a = realpath(src, NULL), *b = realpath(out, NULL);
        int same = a && b && !strcmp(a, b);
        free(a);
        free(b);
        if (same)
            return vf_error(VF_EINVAL, "%s: the output is the source folder; choose another OUT", out);
    }

    conv c;
    memset(&c, 0, sizeof c);
    c.s = settings;
    c.rep = report;
    conv_shared shared;
    memset(&shared, 0, sizeof shared);
    pthread_mutex_init(&shared.lock, NULL);
    atomic_init(&shared.stop, 0);
    c.shared = &shared;
    char *partial = NULL;
    int partial_made = 0;
    stat_column *stats = NULL;
    size_t num_stats = 0;

    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    ds.episodes = settings->episodes;
    ds.num_episodes = settings->num_episodes;
    ds.check_videos = 0; /* every video is read whole below */
    if ((r = vf_dataset_open(&c.d, src, &ds)) < 0)
        goto done;
    if (c.d->major != 2) {
        r = vf_error(VF_EINVAL, "%s: is a LeRobot %s dataset; --to lerobot-v3 converts v2.1 (or v2.0) datasets", src,
                     vf_dataset_format_version(c.d));
        goto done;
    }
    if ((r = first_error(c.d, src)) < 0)
        goto done;
    c.n = vf_dataset_num_episodes(c.d);
    c.ncams = vf_dataset_num_cameras(c.d);
    if (c.n == 0) {
        r = vf_error(VF_EINVAL, "%s: no episodes to convert", src);
        goto done;
    }
    c.eps = vf_calloc(c.n, sizeof *c.eps);
    if (!c.eps) {
        r = VF_ENOMEM;
        goto done;
    }
    for (size_t pos = 0; pos < c.n; pos++) {
        const vf_episode *ep = vf_dataset_episode(c.d, pos);
        ep_out *e = &c.eps[pos];
        e->source_index = ep->episode_index;
        e->length = ep->length;
        e->from_index = c.total_frames;
        if (ep->episode_index != (int64_t)pos || ep->from_index != c.total_frames)
            c.renumbered = 1;
        c.total_frames += ep->length;
        size_t nc = c.ncams ? c.ncams : 1;
        e->video_chunk = vf_calloc(nc, sizeof(int64_t));
        e->video_file = vf_calloc(nc, sizeof(int64_t));
        e->from_ts = vf_calloc(nc, sizeof(double));
        e->to_ts = vf_calloc(nc, sizeof(double));
        if (!e->video_chunk || !e->video_file || !e->from_ts || !e->to_ts) {
            r = VF_ENOMEM;
            goto done;
        }
    }
    shared.total_steps = (int64_t)(c.n * (1 + c.ncams));
    report->episodes = (int64_t)c.n;
    report->frames = c.total_frames;
    report->cameras = (int64_t)c.ncams;

    if (!(partial = vf_asprintf("%s.partial", out))) {
        r = VF_ENOMEM;
        goto done;
    }
    if ((r = prepare_partial(out, partial, settings->force)) < 0)
        goto done;
    partial_made = 1;
    c.root = partial;

    int threads = settings->threads > 0 ? settings->threads : vf_cpu_count();
    if ((r = load_episode_stats(&c)) < 0 || (r = run_jobs(&c, threads)) < 0 || (r = renumber_stats(&c)) < 0)
        goto done;
    r = gather_stats(&c, &stats, &num_stats);
    if (r == 0)
        r = write_episodes_meta(&c, stats, num_stats);
    if (r == 0)
        r = write_tasks(&c);
    if (r == 0)
        r = write_stats(&c, stats, num_stats);
    if (r < 0 || (r = write_info(&c)) < 0)
        goto done;
    if ((r = finish(out, partial, settings->force)) < 0)
        goto done;
    partial_made = 0;
done:
    if (r < 0 && partial_made) {
        int saved = r;
        char *msg = vf_strdup(vf_last_error());
        remove_tree(partial);
        vf_error(saved, "%s", msg ? msg : "out of memory");
        free(msg);
    }
    if (c.eps) {
        for (size_t pos = 0; pos < c.n; pos++) {
            free(c.eps[pos].video_chunk);
            free(c.eps[pos].video_file);
            free(c.eps[pos].from_ts);
            free(c.eps[pos].to_ts);
            json_decref(c.eps[pos].stats);
        }
        free(c.eps);
    }
    free_stats(stats, num_stats);
    pthread_mutex_destroy(&shared.lock);
    vf_dataset_close(c.d);
    free(partial);
    report->seconds = vf_now_seconds() - started;
    if (r < 0)
        vf_error_context(r, "convert %s -> %s", src, out);
    return r;
}
