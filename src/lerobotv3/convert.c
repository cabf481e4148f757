/*
 * convert.c: LeRobot v2.1 -> v3.0 conversion (include/vlafeed/convert_v3.h).
 *
 * Order of work, all under OUT.partial (a marker file says it is ours):
 *  1. open the source through the dataset layer (v2.1 backend; local or
 *     URL); refuse v3.0 sources (unless re-encoding) and sources with
 *     error problems;
 *  2. data: each episode's Parquet file read whole (every field, as typed)
 *     and written as one row group of the current output file; `index` and
 *     `episode_index` renumbered to the output positions (identity for a
 *     whole contiguous source);
 *  3. videos, per camera: episode MP4s joined by stream copy (join.c);
 *     with re-encoding (--codec), each episode MP4 is first re-encoded
 *     into a scratch file under OUT.partial, frames at their own times,
 *     and that file is joined;
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
 * Re-encoding a v3.0 source (vf_lr3_convert, local folder only): the data
 * job copies every file but videos/ and meta/info.json; each camera job
 * re-encodes every MP4 the episodes use to the same relative path. The
 * invariant that keeps meta/episodes valid unchanged: every frame of the
 * output has exactly the source frame's presentation time (same time base,
 * pts passed through; checked per file against the source's frame index).
 * Depth cameras (gray12le) are copied, never re-encoded. Then info.json
 * (new codec and pixel format) and the rename as above.
 *
 * Depends on: base, io, json (jansson), parquet (reader and writer),
 * dataset (the v2.1 backend and its file access), video (frame index,
 * episode mapping), lerobotv3 (join.c).
 */
#define _GNU_SOURCE
#include "vlafeed/convert_v3.h"

#include <dirent.h>
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
    const vf_lr3_reencode *re; /* NULL: videos copied as they are */
    vf_lr3_reencode_report *rr; /* the job's own figures when re-encoding */
    int v3_source;             /* re-encode only: files copied, videos re-encoded in place */
    const char *frame_what;    /* v3 source: progress is counted per frame, under this name */
    int reencoding;            /* the camera job re-encodes (not a depth camera, which is copied) */
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

/* ---- 3b. re-encoding (--codec) ------------------------------------------------- */

/* Folds one file's (or one job's) quality figures into a sum. */
static void merge_quality(vf_video_transcode_report *sum, int64_t files_before, const vf_video_transcode_report *q)
{
    sum->measured = files_before == 0 ? q->measured : sum->measured && q->measured;
    sum->sum_sq_err += q->sum_sq_err;
    sum->sum_abs_err += q->sum_abs_err;
    sum->samples += q->samples;
    if (q->max_abs_diff > sum->max_abs_diff)
        sum->max_abs_diff = q->max_abs_diff;
    if (files_before == 0 || q->min_frame_psnr < sum->min_frame_psnr)
        sum->min_frame_psnr = q->min_frame_psnr;
}

/* The longest keyframe distance (in frames) of the camera's first source
 * file, at most 2 * fps: random access into the output costs no more than
 * it did into the source. */
static int source_gop(conv *c, size_t cam, int fps, int *gop)
{
    vf_source *src = NULL;
    vf_video_index *index = NULL;
    const char *path = vf_dataset_video_file(c->d, cam, 0);
    int r = path ? vf_ds_open_path(c->d, path, &src) : vf_error(VF_ENOENT, "camera %zu has no video file", cam);
    if (r == 0)
        r = vf_video_index_build(&index, src);
    if (src)
        vf_source_close(src);
    if (r < 0)
        return r;
    int64_t longest = 1, last_key = 0;
    for (int64_t k = 1; k <= index->frame_count; k++) {
        if (k == index->frame_count || index->keyframe[k]) {
            if (k - last_key > longest)
                longest = k - last_key;
            last_key = k;
        }
    }
    vf_video_index_free(index);
    *gop = (int)(longest < 2 * (int64_t)fps ? longest : 2 * (int64_t)fps);
    return 0;
}

static int encode_settings(conv *c, size_t cam, vf_video_encode_settings *enc)
{
    const vf_lr3_reencode *re = c->re;
    vf_video_encode_defaults(enc);
    enc->codec = re->codec;
    enc->fps = (int)lround(vf_dataset_fps(c->d));
    if (enc->fps <= 0)
        enc->fps = 30;
    enc->crf = re->crf;
    /* the cameras run in parallel: the threads are shared among them */
    int threads = c->s->threads > 0 ? c->s->threads : vf_cpu_count();
    enc->threads = c->ncams > 1 ? threads / (int)c->ncams : threads;
    if (enc->threads < 1)
        enc->threads = 1;
    if (re->codec == VF_VIDEO_CODEC_AV1) {
        enc->preset = re->preset ? atoi(re->preset) : -1;
    } else {
        enc->x26x_preset = re->preset;
        enc->b_frames = 0; /* decode order = display order: no reordering delay, simpler random access */
    }
    enc->gop = re->gop;
    int r = 0;
    if (enc->gop <= 0 && (r = source_gop(c, cam, enc->fps, &enc->gop)) < 0)
        return vf_error_context(r, "camera %s: measuring the source's keyframe interval",
                                vf_dataset_camera(c->d, cam)->key);
    if (enc->gop > c->rr->gop)
        c->rr->gop = enc->gop;
    return 0;
}

/* Depth maps (gray12le, lossless HEVC) are not re-encoded: no NVDEC decodes
 * them, and a lossy codec would change the depth codes. They are copied. */
static int camera_is_depth(const conv *c, size_t cam)
{
    const vf_camera *camera = vf_dataset_camera(c->d, cam);
    return camera->is_depth || (camera->pix_fmt && !strcmp(camera->pix_fmt, "gray12le"));
}

/* Per re-encoded frame: a progress step for a v3.0 source (its files are
 * large), and a stop when another job failed. */
static int on_frame(void *ctx, int64_t frames_done)
{
    (void)frames_done;
    conv *c = ctx;
    if (c->frame_what)
        step(c, c->frame_what);
    return stopped(c);
}

/* Re-encodes one whole MP4 into path and counts it. */
static int reencode_file(conv *c, vf_source *src, const char *path, int64_t expected_frames,
                         const vf_video_encode_settings *enc)
{
    vf_video_transcode_report tr;
    double started = vf_now_seconds();
    int r = vf_video_transcode(src, path, enc, expected_frames, on_frame, c, &tr);
    c->rr->encode_seconds += vf_now_seconds() - started;
    if (r < 0)
        return r;
    vf_lr3_reencode_report *rr = c->rr;
    merge_quality(&rr->quality, rr->files, &tr);
    rr->files++;
    rr->frames += tr.frames;
    rr->bytes_before += tr.bytes_read;
    if (c->v3_source)
        rr->bytes_after += tr.bytes_written; /* v2.x: counted when the joined file closes */
    return 0;
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
    if (r == 0 && path) {
        c->rep->bytes_written += file_bytes(path);
        if (c->reencoding)
            c->rr->bytes_after += file_bytes(path);
    }
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
    vf_video_encode_settings enc;
    char *scratch = NULL; /* the re-encoded episode, joined then deleted */
    c->reencoding = c->re && !camera_is_depth(c, cam);
    if (c->reencoding && (!(scratch = vf_asprintf("%s/.vlafeed-reencode-%zu.mp4", c->root, cam)) ||
                  (r = encode_settings(c, cam, &enc)) < 0))
        r = r < 0 ? r : VF_ENOMEM;
    for (size_t pos = 0; pos < c->n && r == 0; pos++) {
        ep_out *e = &c->eps[pos];
        vf_video_span span;
        vf_source *src = NULL;
        if ((r = stopped(c)) < 0 || (r = vf_dataset_episode_video(d, pos, cam, &span)) < 0 || (r = vf_ds_open_path(d, span.path, &src)) < 0)
            goto episode_done;
        int64_t source_bytes = 0;
        if (c->reencoding) {
            /* re-encode the episode (frames keep their times), then join the result */
            if ((r = reencode_file(c, src, scratch, e->length, &enc)) < 0)
                goto episode_done;
            source_bytes = (int64_t)vf_source_size(src);
            vf_source_close(src);
            src = NULL;
            if ((r = vf_source_open_file(&src, scratch)) < 0)
                goto episode_done;
            unlink(scratch); /* the open source keeps it readable */
        }
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
        c->rep->bytes_read += c->reencoding ? source_bytes : res.bytes_read;
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
    if (scratch)
        unlink(scratch);
    free(scratch);
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

/* ---- 4b. a v3.0 source: copied, its videos re-encoded in place --------------------- */

/* The path of an absolute source file relative to the source root. */
static const char *relative_to_root(const conv *c, const char *path)
{
    const char *root = vf_dataset_root(c->d);
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    if (strncmp(path, root, n) || path[n] != '/')
        return NULL;
    return path + n + 1;
}

static int copy_file(const char *from, const char *to, int64_t *bytes)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        return vf_error(VF_EIO, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        int r = vf_error(VF_EIO, "%s: cannot create: %s", to, strerror(errno));
        fclose(in);
        return r;
    }
    char buf[1 << 16];
    size_t n;
    int r = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) {
            r = vf_error(VF_EIO, "%s: cannot write: %s", to, strerror(errno));
            break;
        }
        *bytes += (int64_t)n;
    }
    if (r == 0 && ferror(in))
        r = vf_error(VF_EIO, "%s: cannot read: %s", from, strerror(errno));
    fclose(in);
    if (fclose(out) != 0 && r == 0)
        r = vf_error(VF_EIO, "%s: cannot write: %s", to, strerror(errno));
    return r;
}

/* Copies the source tree under rel ("" for the root) into OUT.partial,
 * except videos/ (re-encoded by the camera jobs), meta/info.json (rewritten)
 * and OUT.partial itself should it lie inside the source. */
static int copy_tree(conv *c, const char *rel, const struct stat *partial_st)
{
    const char *root = vf_dataset_root(c->d);
    char *dir = *rel ? vf_path_join(root, rel) : vf_strdup(root);
    DIR *dh = dir ? opendir(dir) : NULL;
    int r = 0;
    if (!dh) {
        r = dir ? vf_error(VF_EIO, "%s: cannot list: %s", dir, strerror(errno)) : VF_ENOMEM;
        free(dir);
        return r;
    }
    struct dirent *ent;
    while (r == 0 && (ent = readdir(dh))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, ".."))
            continue;
        char *sub = *rel ? vf_asprintf("%s/%s", rel, ent->d_name) : vf_strdup(ent->d_name);
        char *from = sub ? vf_path_join(root, sub) : NULL;
        struct stat st;
        if (!from) {
            r = VF_ENOMEM;
        } else if (stat(from, &st) < 0) {
            r = vf_error(VF_EIO, "%s: %s", from, strerror(errno));
        } else if (!strcmp(sub, "videos") || !strcmp(sub, "meta/info.json") ||
                   (st.st_dev == partial_st->st_dev && st.st_ino == partial_st->st_ino)) {
            /* written by the camera jobs / write_info, or our own output */
        } else if (S_ISDIR(st.st_mode)) {
            char *to = vf_path_join(c->root, sub);
            r = to ? vf_mkdirs(to) : VF_ENOMEM;
            free(to);
            if (r == 0)
                r = copy_tree(c, sub, partial_st);
        } else if (S_ISREG(st.st_mode)) {
            char *to = out_path(c, "%s", sub);
            r = to ? copy_file(from, to, &c->rep->bytes_written) : VF_ENOMEM;
            c->rep->bytes_read += (int64_t)st.st_size;
            if (r == 0 && !strncmp(sub, "data/", 5) && strstr(sub, ".parquet"))
                c->rep->data_files++;
            free(to);
        }
        free(from);
        free(sub);
    }
    closedir(dh);
    free(dir);
    return r;
}

static int copy_source(conv *c)
{
    struct stat partial_st;
    if (stat(c->root, &partial_st) < 0)
        return vf_error(VF_EIO, "%s: %s", c->root, strerror(errno));
    int r = copy_tree(c, "", &partial_st);
    if (r == 0)
        step(c, "copy");
    return r;
}

/* The re-encoded file holds the source's frames at the source's times:
 * same count, same presentation times to the tick (both in seconds). */
static int verify_same_times(conv *c, vf_source *src, const char *out_path_abs, const char *key)
{
    vf_video_index *a = NULL, *b = NULL;
    int r = vf_video_index_build(&a, src);
    if (r == 0)
        r = vf_video_index_build_file(&b, out_path_abs);
    if (r == 0 && a->frame_count != b->frame_count)
        r = vf_error(VF_ECORRUPT, "%s: camera %s: %lld frames after re-encoding, the source has %lld", out_path_abs,
                     key, (long long)b->frame_count, (long long)a->frame_count);
    for (int64_t k = 0; r == 0 && k < a->frame_count; k++) {
        /* exact rational comparison: pts_a * num_a / den_a == pts_b * num_b / den_b */
        __int128 lhs = (__int128)a->pts[k] * a->time_base_num * b->time_base_den;
        __int128 rhs = (__int128)b->pts[k] * b->time_base_num * a->time_base_den;
        if (lhs != rhs)
            r = vf_error(VF_ECORRUPT, "%s: camera %s: frame %lld is at %.9f s after re-encoding, %.9f s in the source",
                         out_path_abs, key, (long long)k,
                         (double)b->pts[k] * b->time_base_num / b->time_base_den,
                         (double)a->pts[k] * a->time_base_num / a->time_base_den);
    }
    vf_video_index_free(a);
    vf_video_index_free(b);
    return r;
}

/* Every video file of camera cam re-encoded to the same relative path. */
static int reencode_camera_v3(conv *c, size_t cam)
{
    const char *key = vf_dataset_camera(c->d, cam)->key;
    vf_video_encode_settings enc;
    c->reencoding = !camera_is_depth(c, cam);
    int r = c->reencoding ? encode_settings(c, cam, &enc) : 0;
    c->frame_what = key;
    size_t files = vf_dataset_num_video_files(c->d, cam);
    for (size_t i = 0; i < files && r == 0; i++) {
        const char *path = vf_dataset_video_file(c->d, cam, i);
        const char *rel = relative_to_root(c, path);
        if (!rel) {
            r = vf_error(VF_EINVAL, "%s: camera %s: the video file is outside the dataset folder", path, key);
            break;
        }
        vf_source *src = NULL;
        char *to = out_path(c, "%s", rel);
        if (!to)
            r = VF_ENOMEM;
        if (r == 0 && !c->reencoding) {
            if ((r = stopped(c)) == 0 && (r = copy_file(path, to, &c->rep->bytes_written)) == 0) {
                c->rep->video_files++;
                c->rep->bytes_read += file_bytes(path);
                step(c, key);
            }
        } else if (r == 0 && (r = stopped(c)) == 0 && (r = vf_ds_open_path(c->d, path, &src)) == 0) {
            int64_t before = c->rr->bytes_after;
            r = reencode_file(c, src, to, 0, &enc);
            if (r == 0 && c->s->verify)
                r = verify_same_times(c, src, to, key);
            if (r == 0) {
                c->rep->video_files++;
                c->rep->bytes_read += (int64_t)vf_source_size(src);
                c->rep->bytes_written += c->rr->bytes_after - before;
            }
        }
        if (src)
            vf_source_close(src);
        if (r < 0 && r != VF_ENOMEM && r != VF_EAGAIN)
            vf_error_context(r, "camera %s, file %s", key, rel);
        free(to);
    }
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

static const char *codec_name(vf_video_codec codec)
{
    return codec == VF_VIDEO_CODEC_AV1 ? "av1" : codec == VF_VIDEO_CODEC_H264 ? "h264" : "hevc";
}

/* After a re-encode, each camera's "info" describes the new stream: codec
 * and pixel format always, the encoder settings where the source recorded
 * them (LeRobot's video.g / video.crf / video.preset). */
static void set_video_info(conv *c, json_t *info)
{
    json_t *features = json_object_get(info, "features");
    for (size_t cam = 0; cam < c->ncams; cam++) {
        const vf_camera *camera = vf_dataset_camera(c->d, cam);
        json_t *vinfo = json_object_get(json_object_get(features, camera->key), "info");
        if (!json_is_object(vinfo) || camera_is_depth(c, cam))
            continue; /* depth videos are copied as they are */
        json_object_set_new(vinfo, "video.codec", json_string(codec_name(c->re->codec)));
        json_object_set_new(vinfo, "video.pix_fmt", json_string("yuv420p"));
        if (json_object_get(vinfo, "video.g"))
            json_object_set_new(vinfo, "video.g", json_integer(c->rr->gop));
        if (json_object_get(vinfo, "video.crf"))
            json_object_set_new(vinfo, "video.crf", json_integer(c->re->crf));
        if (json_object_get(vinfo, "video.preset"))
            json_object_set_new(vinfo, "video.preset", c->re->codec == VF_VIDEO_CODEC_AV1
                                                           ? json_integer(atoi(c->re->preset))
                                                           : json_string(c->re->preset));
    }
}

/* The source's meta/info.json as a JSON object (*out, the caller's). */
static int read_source_info(conv *c, json_t **out)
{
    vf_dataset *d = c->d;
    uint8_t *text = NULL;
    size_t len = 0;
    *out = NULL;
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
    *out = info;
    return 0;
}

/* Writes info as OUT's meta/info.json and releases it. */
static int write_out_info(conv *c, json_t *info)
{
    int r = 0;
    char *path = out_path(c, "meta/info.json");
    if (!path || json_dump_file(info, path, JSON_INDENT(4)) != 0)
        r = vf_error(VF_EIO, "%s: cannot write", path ? path : "meta/info.json");
    free(path);
    json_decref(info);
    return r;
}

/* meta/info.json of a v3.0 source, re-encoded: the source's with the new
 * video info. */
static int write_info_v3(conv *c)
{
    json_t *info;
    int r = read_source_info(c, &info);
    if (r < 0)
        return r;
    set_video_info(c, info);
    return write_out_info(c, info);
}

/* meta/info.json: the source's, edited as LeRobot's converter edits it. */
static int write_info(conv *c)
{
    vf_dataset *d = c->d;
    json_t *info;
    int r = read_source_info(c, &info);
    if (r < 0)
        return r;
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
    if (c->re)
        set_video_info(c, info);
    return write_out_info(c, info);
}

/* ---- the jobs: data, and one per camera (write + verify) ------------------------------ */

typedef struct conv_job {
    conv c;                    /* a copy with its own report */
    vf_convert_v3_report rep;
    vf_lr3_reencode_report rr;
    long camera;               /* -1: the data job */
    int result;
    char message[2048];
} conv_job;

static void run_job(void *arg)
{
    conv_job *job = arg;
    conv *c = &job->c;
    c->rep = &job->rep;
    c->rr = &job->rr;
    int r;
    if (job->camera < 0) {
        r = c->v3_source ? copy_source(c) : write_data(c);
    } else if (c->v3_source) {
        r = reencode_camera_v3(c, (size_t)job->camera);
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
        const vf_lr3_reencode_report *jr = &jobs[i].rr;
        if (c->rr && jr->files > 0) {
            merge_quality(&c->rr->quality, c->rr->files, &jr->quality);
            c->rr->files += jr->files;
            c->rr->frames += jr->frames;
            c->rr->bytes_before += jr->bytes_before;
            c->rr->encode_seconds += jr->encode_seconds;
            if (jr->gop > c->rr->gop)
                c->rr->gop = jr->gop;
        }
        if (c->rr)
            c->rr->bytes_after += jr->bytes_after;
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
    return vf_lr3_convert(src, out, settings, NULL, report, NULL);
}

int vf_lr3_reencode_resolve(vf_lr3_reencode *re)
{
    static const char *const x26x_presets[] = {"ultrafast", "superfast", "veryfast", "faster", "fast",
                                               "medium",    "slow",      "slower",   "veryslow", "placebo"};
    int av1 = re->codec == VF_VIDEO_CODEC_AV1;
    if (!av1 && re->codec != VF_VIDEO_CODEC_H264 && re->codec != VF_VIDEO_CODEC_HEVC)
        return vf_error(VF_EINVAL, "--codec: expected h264, hevc or av1");
    if (re->crf < 0)
        re->crf = av1 ? 24 : re->codec == VF_VIDEO_CODEC_H264 ? 18 : 20;
    if (re->crf > (av1 ? 63 : 51))
        return vf_error(VF_EINVAL, "--crf %d: out of range for %s (0..%d)", re->crf, codec_name(re->codec),
                        av1 ? 63 : 51);
    if (!re->preset)
        re->preset = av1 ? "8" : "medium";
    if (av1) {
        char *end;
        long p = strtol(re->preset, &end, 10);
        if (!*re->preset || *end || p < -2 || p > 13)
            return vf_error(VF_EINVAL, "--preset %s: libsvtav1 takes a number from -2 (slowest) to 13 (fastest)",
                            re->preset);
    } else {
        size_t k = 0, n = sizeof x26x_presets / sizeof *x26x_presets;
        while (k < n && strcmp(re->preset, x26x_presets[k]))
            k++;
        if (k == n)
            return vf_error(VF_EINVAL, "--preset %s: %s takes ultrafast, superfast, veryfast, faster, fast, medium, "
                            "slow, slower, veryslow or placebo", re->preset, vf_video_encoder_name(re->codec));
    }
    if (re->gop < 0)
        return vf_error(VF_EINVAL, "--gop %d: must be >= 1", re->gop);
    return 0;
}

int vf_lr3_convert(const char *src, const char *out, const vf_convert_v3_settings *settings,
                   const vf_lr3_reencode *reencode, vf_convert_v3_report *report, vf_lr3_reencode_report *rrep)
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
    vf_lr3_reencode re;
    vf_lr3_reencode_report local_rrep;
    if (!rrep)
        rrep = &local_rrep;
    memset(rrep, 0, sizeof *rrep);
    if (reencode) {
        /* the options and the encoder first, before anything is read */
        re = *reencode;
        if ((r = vf_lr3_reencode_resolve(&re)) < 0 || (r = vf_video_encoder_check(re.codec)) < 0)
            return vf_error_context(r, "convert %s -> %s", src, out);
        rrep->crf = re.crf;
        snprintf(rrep->preset, sizeof rrep->preset, "%s", re.preset);
    }
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
    c.re = reencode ? &re : NULL;
    c.rr = rrep;
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
    if (c.d->major == 3 && c.re) {
        c.v3_source = 1; /* re-encode only */
        if (vf_is_url(src)) {
            r = vf_error(VF_EINVAL, "%s: re-encoding a v3.0 dataset needs it in a local folder (download it first)",
                         src);
            goto done;
        }
        if (settings->episodes) {
            r = vf_error(VF_EINVAL, "%s: --episodes is for v2.x sources; a v3.0 dataset is re-encoded whole", src);
            goto done;
        }
    } else if (c.d->major != 2) {
        r = vf_error(VF_EINVAL, "%s: is a LeRobot %s dataset; --to lerobot-v3 converts v2.1 (or v2.0) datasets%s", src,
                     vf_dataset_format_version(c.d),
                     c.d->major == 3 ? " (or re-encodes a v3.0 dataset's videos with --codec)" : "");
        goto done;
    }
    if (c.re && vf_dataset_num_cameras(c.d) == 0) {
        r = vf_error(VF_EINVAL, "%s: has no video features to re-encode", src);
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
    if (c.v3_source) {
        shared.total_steps = 1; /* the copy, then per re-encoded frame, per copied depth file */
        for (size_t cam = 0; cam < c.ncams; cam++)
            shared.total_steps += camera_is_depth(&c, cam) ? (int64_t)vf_dataset_num_video_files(c.d, cam)
                                                            : c.total_frames;
    }
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
    if (c.v3_source) {
        if ((r = run_jobs(&c, threads)) < 0 || (r = write_info_v3(&c)) < 0 ||
            (r = finish(out, partial, settings->force)) < 0)
            goto done;
        partial_made = 0;
        goto done;
    }
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
