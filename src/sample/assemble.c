/*
 * assemble.c: builds samples into caller memory (the batch buffers).
 *
 * One call handles a whole batch so that frame requests can be pooled: every
 * (sample, camera, window step) becomes one request whose destination is its
 * slot in the batch column; requests are grouped per video file, and each
 * group is one reader checkout from the decoder cache plus one
 * vf_video_read_frames call, which sorts the ordinals and decodes each forward
 * run once (duplicates, e.g. padded steps repeating the boundary frame, are
 * copied, not decoded again). The pixel conversion writes into the batch
 * memory directly.
 *
 * Errors are deterministic: when several file groups fail, the message of
 * the first group in (camera, file) order is reported.
 */
#include "sample/sample.h"

#include <stdlib.h>
#include <string.h>

typedef struct frame_job {
    vf_sample_video_file *file;
    const vf_sample_column *column; /* the camera's output column (format) */
    size_t episode_slot;     /* into file->episodes */
    int64_t frame;           /* frame index within the episode */
    void *dest;
    int64_t episode_index;
} frame_job;

typedef struct group_result {
    int rc;
    char *message;
} group_result;

typedef struct assemble_ctx {
    vf_sample_spec *spec;
    vf_video_cache *cache;
    vf_sample_counters *counters;
    frame_job *jobs;
    size_t *group_start;     /* num_groups + 1 */
    size_t num_groups;
    group_result *results;
} assemble_ctx;

static int cmp_frame_job(const void *pa, const void *pb)
{
    const frame_job *a = pa, *b = pb;
    if (a->file->id != b->file->id)
        return a->file->id < b->file->id ? -1 : 1;
    if (a->episode_slot != b->episode_slot)
        return a->episode_slot < b->episode_slot ? -1 : 1;
    if (a->frame != b->frame)
        return a->frame < b->frame ? -1 : 1;
    /* Equal targets: keep a total order on the destination for determinism. */
    return (uintptr_t)a->dest < (uintptr_t)b->dest ? -1 : (uintptr_t)a->dest > (uintptr_t)b->dest;
}

/* Maps the file's episodes to frame ordinals once, from the reader's index. */
/* Whether the open already listed this problem (its file was checked then):
 * `vlafeed info` shows it and the Python open warned where it changes what
 * is served, so the loader does not say it again. */
static int listed_at_open(const vf_dataset *d, const char *message)
{
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++)
        if (!strcmp(vf_dataset_problem(d, i)->message, message))
            return 1;
    return 0;
}

static int ensure_map(vf_sample_spec *spec, vf_sample_video_file *f, vf_video_reader *reader)
{
    int state = atomic_load(&f->state);
    if (state == 1)
        return 0;
    pthread_mutex_lock(&f->lock);
    state = atomic_load(&f->state);
    if (state == 0 && !f->episodes && f->list_count > 0) {
        /* The file's episodes, from the camera's compact index. */
        const vf_dataset *d = spec->dataset;
        f->episodes = vf_calloc(f->list_count, sizeof *f->episodes);
        if (!f->episodes) {
            pthread_mutex_unlock(&f->lock);
            return VF_ENOMEM;
        }
        for (size_t i = 0; i < f->list_count; i++) {
            const vf_ds_episode *e = &d->episodes[spec->file_order[f->camera][f->list_start + i]];
            vf_video_episode *ve = &f->episodes[i];
            ve->episode_index = e->pub.episode_index;
            ve->from_timestamp = e->video[f->camera].from_timestamp;
            ve->to_timestamp = e->video[f->camera].to_timestamp;
            ve->length = e->pub.length;
            ve->first_ordinal = -1;
        }
        f->num_episodes = f->cap_episodes = f->list_count;
    }
    if (state == 0) {
        const vf_video_index *ix = vf_video_reader_index(reader);
        const vf_camera *cam = vf_dataset_camera(spec->dataset, (size_t)f->camera);
        if (cam->width > 0 && cam->height > 0 && (ix->width != cam->width || ix->height != cam->height))
            vf_sample_spec_note(spec, 0,
                                vf_asprintf("%s: camera %s: the stream is %dx%d but info.json declares %dx%d; frames "
                                            "are scaled to the declared size",
                                            f->path, f->camera_key, ix->width, ix->height, cam->width, cam->height));
        vf_video_map_settings ms = {spec->fps, 0.0, f->camera_key};
        int r = vf_video_map_episodes_policy(ix, f->episodes, f->num_episodes, &ms,
                                             vf_dataset_video_mismatch(spec->dataset), &f->map);
        if (r < 0) {
            f->error = vf_strdup(vf_last_error());
            state = r;
        } else {
            f->frame_count = ix->frame_count;
            for (size_t i = 0; i < f->map.problem_count; i++) {
                const vf_video_problem *p = &f->map.problems[i];
                /* Said once when the file is mapped (refused episodes too: every read of them raises,
                 * this says so before the first read reaches them). */
                if (p->kind != VF_VIDEO_PROBLEM_DRIFT && !listed_at_open(spec->dataset, p->message))
                    vf_sample_spec_note(spec, 0, vf_strdup(p->message));
            }
            state = 1;
        }
        atomic_store(&f->state, state);
    }
    int r = 0;
    if (state < 0)
        r = vf_error(state, "%s", f->error ? f->error : "episode mapping failed");
    pthread_mutex_unlock(&f->lock);
    return r;
}

/* Decodes one file group with the file's reader. held NULL: converts into
 * the destinations too; else keeps the decoded pictures in *held for the
 * caller to convert once the reader is given back (set even on failure). */
static int decode_group(assemble_ctx *x, size_t g, vf_video_request **reqs, vf_video_held **held)
{
    size_t lo = x->group_start[g], hi = x->group_start[g + 1];
    vf_sample_video_file *f = x->jobs[lo].file;
    size_t count = hi - lo;
    vf_video_reader *reader = NULL;
    int r = vf_video_cache_checkout(x->cache, f->path, &reader);
    if (r < 0)
        return vf_error_context(r, "camera %s: episode %lld", f->camera_key, (long long)x->jobs[lo].episode_index);
    r = ensure_map(x->spec, f, reader);
    if (r < 0) {
        vf_video_cache_return(x->cache, reader);
        return vf_error_context(r, "camera %s", f->camera_key);
    }
    vf_video_request *req = vf_malloc_array(count, sizeof *req);
    if (!req) {
        vf_video_cache_return(x->cache, reader);
        return VF_ENOMEM;
    }
    *reqs = req;
    for (size_t i = 0; i < count && r == 0; i++) {
        const frame_job *j = &x->jobs[lo + i];
        req[i].dest = j->dest;
        req[i].episode = j->episode_index;
        req[i].frame_in_episode = j->frame;
        req[i].status = 0;
        r = vf_video_episode_frame(&f->episodes[j->episode_slot], j->frame, &req[i].frame_ordinal);
        if (r < 0)
            r = vf_error_context(r, "%s: camera %s", f->path, f->camera_key);
    }
    if (r == 0) {
        vf_video_stats before, after;
        vf_video_get_stats(reader, &before);
        if (held)
            r = vf_video_read_frames_held(reader, req, count, &x->jobs[lo].column->format, held);
        else
            r = vf_video_read_frames(reader, req, count, &x->jobs[lo].column->format);
        vf_video_get_stats(reader, &after);
        atomic_fetch_add(&x->counters->frames_decoded, after.frames_decoded - before.frames_decoded);
        if (r < 0)
            r = vf_error_context(r, "camera %s", f->camera_key);
    }
    if (r < 0)
        vf_video_cache_discard(x->cache, reader); /* its decoder state is unknown after a failure */
    else
        vf_video_cache_return(x->cache, reader);
    return r;
}

/* Decodes one file group. With spec->share_readers (the default), one
 * reader per file serves every thread, in turn: the thread takes the
 * file's reader_lock before its checkout and lets go after giving the
 * reader back, so the decoder cache never opens a second reader of a file
 * because the first is busy, and a run opens each file once while the
 * cache holds it, at any thread count (what `vlafeed plan` counts). Only
 * the decode is done under the lock: the pictures are kept (references,
 * not copies) and converted into the batch after the lock is released, so
 * threads reading one file forward (stream mode: consecutive batches of a
 * file group) take turns on the decoder only, the conversion runs in
 * parallel. Without sharing, each thread checks out its own reader (a
 * second reader of a busy file is a second open). A thread holds at most
 * one file's lock and never waits for anything else while holding it.
 * `locked`: the caller already holds the file's lock (run_free_first). */
static int run_group(assemble_ctx *x, size_t g, int locked)
{
    size_t lo = x->group_start[g];
    vf_sample_video_file *f = x->jobs[lo].file;
    vf_video_request *req = NULL;
    int r;
    if (!x->spec->share_readers) {
        r = decode_group(x, g, &req, NULL);
    } else {
        vf_video_held *held = NULL;
        if (!locked)
            pthread_mutex_lock(&f->reader_lock);
        r = decode_group(x, g, &req, &held);
        pthread_mutex_unlock(&f->reader_lock);
        int c = vf_video_cache_convert(x->cache, held);
        vf_video_held_free(held);
        if (r == 0 && c < 0)
            r = vf_error_context(c, "camera %s", f->camera_key);
    }
    free(req);
    if (r == 0)
        atomic_fetch_add(&x->counters->frames_delivered, (uint64_t)(x->group_start[g + 1] - lo));
    return r;
}

static void record(assemble_ctx *x, size_t g, int r)
{
    x->results[g].rc = r;
    if (r < 0)
        x->results[g].message = vf_strdup(vf_last_error());
}

/* One thread runs a batch's file groups, shared readers: first those
 * whose reader no other thread is using (try-lock, in file order), and
 * waits only when every remaining file is busy (then for the first). Two
 * threads assembling batches of the same files (stream mode's consecutive
 * batches, a pool's neighbouring episodes) thus fall into step on
 * different files instead of queueing behind one another on the first. */
static void run_free_first(assemble_ctx *x)
{
    uint8_t *done = vf_calloc(x->num_groups, 1);
    if (!done) {
        for (size_t g = 0; g < x->num_groups; g++)
            record(x, g, run_group(x, g, 0));
        return;
    }
    for (size_t left = x->num_groups; left > 0;) {
        size_t ran = 0, first = SIZE_MAX;
        for (size_t g = 0; g < x->num_groups; g++) {
            if (done[g])
                continue;
            if (first == SIZE_MAX)
                first = g;
            if (pthread_mutex_trylock(&x->jobs[x->group_start[g]].file->reader_lock) == 0) {
                record(x, g, run_group(x, g, 1));
                done[g] = 1;
                left--;
                ran++;
            }
        }
        if (ran == 0) {
            record(x, first, run_group(x, first, 0));
            done[first] = 1;
            left--;
        }
    }
    free(done);
}

static void group_task(void *arg, size_t g)
{
    assemble_ctx *x = arg;
    record(x, g, run_group(x, g, 0));
}

/* ---- tabular gather ------------------------------------------------------------ */

static void copy_table_step(const vf_sample_rows *t, const vf_sample_column *c, int64_t row, void *out)
{
    const vf_ds_column *tc = &t->t.columns[c->table_column];
    int64_t w = tc->width;
    if (tc->type == VF_DS_F32) {
        const float *src = (const float *)tc->values + row * w;
        float *dst = out;
        if (c->norm == VF_NORM_NONE) {
            memcpy(dst, src, (size_t)w * sizeof(float));
        } else {
            for (int64_t k = 0; k < w; k++) {
                float y = (src[k] - c->norm_shift[k]) / c->norm_scale[k];
                dst[k] = c->norm == VF_NORM_MIN_MAX ? y * 2.0f - 1.0f : y;
            }
        }
    } else {
        const int64_t *src = (const int64_t *)tc->values + row * w;
        if (c->type == VF_COL_BOOL) {
            uint8_t *dst = out;
            for (int64_t k = 0; k < w; k++)
                dst[k] = src[k] != 0;
        } else {
            memcpy(out, src, (size_t)w * sizeof(int64_t));
        }
    }
}

static void normalize_frame(const vf_sample_column *c, float *pixels)
{
    size_t plane = (size_t)(c->values_per_step / 4 / 3);
    for (int ch = 0; ch < 3; ch++) {
        float shift = c->norm_shift[ch], scale = c->norm_scale[ch];
        float *p = pixels + (size_t)ch * plane;
        if (c->norm == VF_NORM_MIN_MAX)
            for (size_t i = 0; i < plane; i++)
                p[i] = (p[i] - shift) / scale * 2.0f - 1.0f;
        else
            for (size_t i = 0; i < plane; i++)
                p[i] = (p[i] - shift) / scale;
    }
}

static int cmp_sz(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static int assemble(vf_sample_spec *s, vf_video_cache *cache, vf_sample_counters *counters, const int64_t *positions,
                    size_t n, const vf_sample_dest *dest, const vf_sample_parallel *parallel, const size_t *eps,
                    vf_sample_rows *const *ep_rows, size_t num_eps, vf_sample_failure *failure);

int vf_sample_assemble(vf_sample_spec *s, vf_video_cache *cache, vf_sample_counters *counters,
                       const int64_t *positions, size_t n, const vf_sample_dest *dest,
                       const vf_sample_parallel *parallel)
{
    return vf_sample_assemble_ex(s, cache, counters, positions, n, dest, parallel, NULL);
}

/* The data file holding a selected episode's rows (a copy), or NULL. */
static char *episode_data_file(const vf_sample_spec *s, size_t ep)
{
    vf_data_span span;
    if (vf_dataset_episode_data(s->dataset, ep, &span) < 0)
        return NULL;
    const char *path = vf_dataset_data_file(s->dataset, span.file);
    return path ? vf_strdup(path) : NULL;
}

int vf_sample_assemble_ex(vf_sample_spec *s, vf_video_cache *cache, vf_sample_counters *counters,
                          const int64_t *positions, size_t n, const vf_sample_dest *dest,
                          const vf_sample_parallel *parallel, vf_sample_failure *failure)
{
    if (failure)
        failure->file = failure->column = NULL;
    for (size_t i = 0; i < n; i++)
        if (positions[i] < 0 || positions[i] >= s->num_positions)
            return vf_error(VF_ERANGE, "position %lld is out of range (the selected episodes hold %lld frames)",
                            (long long)positions[i], (long long)s->num_positions);
    /* The batch's episodes and their table rows (read if missing). */
    size_t *eps = vf_malloc_array(n ? n : 1, sizeof *eps);
    vf_sample_rows **rows = vf_calloc(n ? n : 1, sizeof *rows);
    if (!eps || !rows) {
        free(eps);
        free(rows);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        eps[i] = vf_sample_episode_of(s, positions[i]);
    qsort(eps, n, sizeof *eps, cmp_sz);
    size_t ne = 0;
    for (size_t i = 0; i < n; i++)
        if (ne == 0 || eps[ne - 1] != eps[i])
            eps[ne++] = eps[i];
    int r = vf_sample_rows_acquire(s, eps, ne, rows);
    if (r < 0 && failure && ne == 1) {
        char *keep = vf_strdup(vf_last_error()); /* vf_dataset calls may not touch it, but be safe */
        failure->file = episode_data_file(s, eps[0]);
        if (keep) {
            vf_error(r, "%s", keep);
            free(keep);
        }
    }
    if (r == 0)
        r = assemble(s, cache, counters, positions, n, dest, parallel, eps, rows, ne, failure);
    vf_sample_rows_release(s, rows, ne);
    free(eps);
    free(rows);
    return r;
}

static int assemble(vf_sample_spec *s, vf_video_cache *cache, vf_sample_counters *counters, const int64_t *positions,
                    size_t n, const vf_sample_dest *dest, const vf_sample_parallel *parallel, const size_t *eps,
                    vf_sample_rows *const *ep_rows, size_t num_eps, vf_sample_failure *failure)
{
    /* Count frame requests. */
    size_t max_steps = 1;
    for (size_t w = 0; w < s->num_windows; w++)
        max_steps = VF_MAX(max_steps, s->windows[w].count);
    size_t num_jobs = 0;
    for (size_t ci = 0; ci < s->num_columns; ci++) {
        const vf_sample_column *c = &s->columns[ci];
        if (c->source == VF_SAMPLE_SRC_VIDEO)
            num_jobs += n * (c->window >= 0 ? s->windows[c->window].count : 1);
    }
    int64_t *rows = vf_malloc_array(max_steps, sizeof *rows);
    uint8_t *pad = vf_malloc(max_steps);
    frame_job *jobs = num_jobs ? vf_malloc_array(num_jobs, sizeof *jobs) : NULL;
    if (!rows || !pad || (num_jobs && !jobs)) {
        free(rows);
        free(pad);
        free(jobs);
        return VF_ENOMEM;
    }
    size_t nj = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t a = positions[i];
        size_t ep = vf_sample_episode_of(s, a);
        int64_t first = s->episode_start[ep], end = s->episode_start[ep + 1];
        size_t out = dest->first + i;
        const vf_sample_rows *er = NULL;
        if (s->num_table) { /* the batch's episodes are sorted and distinct, ep among them */
            const size_t *hit = bsearch(&ep, eps, num_eps, sizeof *eps, cmp_sz);
            er = ep_rows[hit - eps];
        }
        for (size_t ci = 0; ci < s->num_columns; ci++) {
            const vf_sample_column *c = &s->columns[ci];
            size_t steps = 1;
            if (c->window >= 0) {
                const vf_sample_window_spec *w = &s->windows[c->window];
                steps = w->count;
                vf_sample_window(a, first, end, w->offsets, steps, rows, pad);
            } else {
                rows[0] = a;
                pad[0] = 0;
            }
            uint8_t *base = dest->data[ci] ? (uint8_t *)dest->data[ci] + out * c->sample_bytes : NULL;
            switch (c->source) {
            case VF_SAMPLE_SRC_TABLE:
                if (c->type == VF_COL_STRING) {
                    const vf_ds_column *tc = &er->t.columns[c->table_column];
                    dest->strings[ci][out] = er->strings[c->table_column] + tc->offsets[a - first] + (a - first);
                    break;
                }
                for (size_t k = 0; k < steps; k++)
                    copy_table_step(er, c, rows[k] - first, base + k * (c->sample_bytes / steps));
                break;
            case VF_SAMPLE_SRC_PAD:
                memcpy(base, pad, steps);
                break;
            case VF_SAMPLE_SRC_TASK: {
                const int64_t *ti = er->t.columns[s->task_index_column].values;
                dest->strings[ci][out] = vf_dataset_task(s->dataset, (size_t)ti[a - first]);
                break;
            }
            case VF_SAMPLE_SRC_VIDEO: {
                const vf_sample_video_slot *slot = &s->slots[ep * s->num_cameras + (size_t)c->camera];
                int64_t episode_index = vf_dataset_episode(s->dataset, ep)->episode_index;
                for (size_t k = 0; k < steps; k++) {
                    frame_job *j = &jobs[nj++];
                    j->file = &s->files[c->camera][slot->file];
                    j->column = c;
                    j->episode_slot = slot->episode;
                    j->frame = rows[k] - first;
                    j->dest = base + k * (size_t)c->values_per_step;
                    j->episode_index = episode_index;
                }
                break;
            }
            }
        }
    }
    free(rows);
    free(pad);

    int r = 0;
    if (nj) {
        qsort(jobs, nj, sizeof *jobs, cmp_frame_job);
        assemble_ctx x = {s, cache, counters, jobs, NULL, 0, NULL};
        x.group_start = vf_malloc_array(nj + 1, sizeof *x.group_start);
        if (!x.group_start) {
            free(jobs);
            return VF_ENOMEM;
        }
        for (size_t i = 0; i < nj; i++)
            if (i == 0 || jobs[i].file != jobs[i - 1].file)
                x.group_start[x.num_groups++] = i;
        x.group_start[x.num_groups] = nj;
        x.results = vf_calloc(x.num_groups, sizeof *x.results);
        if (!x.results) {
            free(x.group_start);
            free(jobs);
            return VF_ENOMEM;
        }
        if (parallel && parallel->run && x.num_groups > 1)
            parallel->run(parallel->pool_ctx, x.num_groups, group_task, &x);
        else if (s->share_readers && x.num_groups > 1)
            run_free_first(&x);
        else
            for (size_t g = 0; g < x.num_groups; g++)
                group_task(&x, g);
        for (size_t g = 0; g < x.num_groups; g++) {
            if (x.results[g].rc < 0 && r == 0) {
                r = vf_error(x.results[g].rc, "%s", x.results[g].message ? x.results[g].message : "decode failed");
                if (failure) {
                    const frame_job *j = &jobs[x.group_start[g]];
                    failure->file = vf_strdup(j->file->path);
                    failure->column = vf_strdup(j->column->name);
                }
            }
            free(x.results[g].message);
        }
        free(x.results);
        free(x.group_start);
    }
    free(jobs);
    if (r < 0)
        return r;

    /* Image normalization, after the frames are in place. */
    for (size_t ci = 0; ci < s->num_columns; ci++) {
        const vf_sample_column *c = &s->columns[ci];
        if (c->source != VF_SAMPLE_SRC_VIDEO || c->norm == VF_NORM_NONE)
            continue;
        size_t steps = c->window >= 0 ? s->windows[c->window].count : 1;
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < steps; k++)
                normalize_frame(c, (float *)((uint8_t *)dest->data[ci] + (dest->first + i) * c->sample_bytes +
                                             k * (size_t)c->values_per_step));
    }
    atomic_fetch_add(&counters->samples, (uint64_t)n);
    return 0;
}
