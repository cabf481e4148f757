/*
 * wds.c: vf_wds_convert(), LeRobot v3.0 / v2.1 -> WebDataset shards in VLA
 * Foundry's robotics layout (include/vlafeed/convert.h; the layout is fixed
 * in docs/wds.md, "Converting to WebDataset shards").
 *
 * The work is split in three files: this one plans the job and runs it,
 * wds_units.c holds the units of work that fill the spill, and
 * wds_output.c what is written to disk (state, shards, final files).
 *
 * How it works:
 *  1. Plan (from the metadata only). Sample g (episode position e, anchor
 *     frame t; g = base(e) + t) goes to global position perm(g), a keyed
 *     Feistel permutation of [0, N) (cycle walking) that is a pure function
 *     of the seed and needs no memory; shard = position / samples_per_shard,
 *     slot = position % samples_per_shard.
 *  2. Spill. Units of work run on a thread pool: a lowdim unit reads a
 *     slice of episodes' numeric columns (<= 65,536 rows) and writes each
 *     sample's lowdim.npz, metadata.json and language_instructions.json; a
 *     video unit is one camera file: it decodes forward, once, exactly the
 *     frames some sample uses (vf_video_read_frames over ascending ordinals),
 *     JPEG-encodes each once and writes a record for every (sample, image
 *     offset) that uses it (several at episode edges, where windows clip).
 *     Records land in the spill bucket of their shard.
 *  3. Assemble. One job per bucket: scan the headers, keep the records of
 *     finished units, sort each shard's records by (slot, member), check
 *     that every slot has every member, and stream them into the shard tar
 *     (temporary name, fsync, rename).
 *  4. Finish: manifest.jsonl, stats.json (merged per lowdim unit in unit
 *     order, so the numbers do not depend on thread timing),
 *     preprocessing_config.yaml, then processing_metadata.json last: its
 *     presence means the conversion is complete. The spill is removed.
 *
 * Resume: OUT/shards/.vlafeed-convert/ holds options.json, the run counter,
 * units.done ("unit run" lines), shards.done ("shard bytes crc32" lines) and
 * each finished lowdim unit's statistics. A new run gets a new run number,
 * skips finished units, keeps shards whose size and CRC-32 still match, and
 * ignores spill records of units that did not finish.
 *
 * Depends on: base, dataset (internal model, table reads, video locator),
 * video (decode), convert (npz, tar, spill), TurboJPEG, jansson.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "convert/wds_internal.h"

#define LOWDIM_UNIT_ROWS 65536
#define MAX_BUCKETS 256
#define STATE_DIR ".vlafeed-convert"

const char *const vf_cv_meta_columns[VF_CV_NUM_META] = {"episode_index", "frame_index", "index", "timestamp",
                                                         "task_index"};

void vf_wds_convert_defaults(vf_wds_convert_settings *s)
{
    memset(s, 0, sizeof *s);
    s->samples_per_shard = 100;
    s->past = 1;
    s->future = 14;
    s->image_offsets[0] = -1;
    s->image_offsets[1] = 0;
    s->num_image_offsets = 2;
    s->jpeg_quality = 95;
}

/* ---- the job ---------------------------------------------------------- */

void vf_cv_job_fail(vf_cv_job *j, int r)
{
    pthread_mutex_lock(&j->lock);
    if (!j->err) {
        j->err = r;
        snprintf(j->err_msg, sizeof j->err_msg, "%s", vf_last_error());
    }
    atomic_store(&j->abort, 1);
    pthread_mutex_unlock(&j->lock);
}

void vf_cv_job_progress(vf_cv_job *j, int64_t amount, const char *phase)
{
    if (!j->s->progress)
        return;
    pthread_mutex_lock(&j->lock);
    j->progress_done += amount;
    j->s->progress(j->s->progress_ctx, j->progress_done, j->progress_total, phase);
    pthread_mutex_unlock(&j->lock);
}

/* Test hook, for the resume tests: VF_CONVERT_KILL_AFTER="decode:N" or
 * "assemble:N" kills the process with SIGKILL (no clean-up of any kind)
 * right after the N-th unit of work or shard of this run has been
 * journaled, so a test can interrupt a conversion at an exact point. */
void vf_cv_maybe_kill_for_test(const char *phase, uint64_t done)
{
    const char *spec = getenv("VF_CONVERT_KILL_AFTER");
    size_t n = strlen(phase);
    if (spec && !strncmp(spec, phase, n) && spec[n] == ':' && strtoull(spec + n + 1, NULL, 10) == done)
        raise(SIGKILL);
}

/* ---- the permutation and the keys --------------------------------------- */

static uint64_t feistel(const vf_cv_job *j, uint64_t x)
{
    uint64_t mask = (UINT64_C(1) << j->half_bits) - 1;
    uint64_t left = x >> j->half_bits, right = x & mask;
    for (int round = 0; round < 6; round++) {
        uint64_t next = left ^ (vf_mix64(j->round_keys[round] ^ right) & mask);
        left = right;
        right = next;
    }
    return (left << j->half_bits) | right;
}

/* Global position of sample g: cycle walking keeps the result in [0, N). */
static uint64_t sample_position(const vf_cv_job *j, uint64_t g)
{
    uint64_t x = g;
    do
        x = feistel(j, x);
    while (x >= j->N);
    return x;
}

void vf_cv_sample_key(const vf_cv_job *j, int64_t episode_index, int64_t frame, char out[33])
{
    uint64_t a = vf_rng_derive(j->s->seed, 0x6b6579u, (uint64_t)episode_index, (uint64_t)frame, 0);
    uint64_t b = vf_rng_derive(j->s->seed, 0x6b6579u, (uint64_t)episode_index, (uint64_t)frame, 1);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

uint64_t vf_cv_shard_samples(const vf_cv_job *j, uint64_t shard)
{
    uint64_t first = shard * (uint64_t)j->sps;
    return VF_MIN((uint64_t)j->sps, j->N - first);
}

int vf_cv_put_record(vf_cv_job *j, uint32_t unit, const vf_cv_episode *e, int64_t t, int member, const void *data,
                     size_t len)
{
    uint64_t p = sample_position(j, (uint64_t)(e->base + t));
    uint64_t shard = p / (uint64_t)j->sps;
    if (j->shard_done[shard])
        return 0;
    if (len > UINT32_MAX)
        return vf_error(VF_ERANGE, "episode %lld frame %lld: member of %zu bytes is too large",
                        (long long)e->episode_index, (long long)t, len);
    vf_cv_record h = {VF_CV_RECORD_MAGIC, unit, j->run, (uint32_t)shard, (uint32_t)(p % (uint64_t)j->sps),
                      (uint16_t)member, 0, (uint32_t)len, e->episode_index, t};
    atomic_fetch_add(&j->records, 1);
    return vf_cv_spill_put(j->spill, (size_t)(shard / j->shards_per_bucket), &h, data);
}

/* ---- plan ---------------------------------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static const char *dtype_descr(vf_dtype t, size_t *elem)
{
    switch (t) {
    case VF_DTYPE_FLOAT16: case VF_DTYPE_FLOAT32: case VF_DTYPE_FLOAT64: *elem = 4; return "<f4";
    case VF_DTYPE_INT8: *elem = 1; return "|i1";
    case VF_DTYPE_UINT8: *elem = 1; return "|u1";
    case VF_DTYPE_INT16: *elem = 2; return "<i2";
    case VF_DTYPE_UINT16: *elem = 2; return "<u2";
    case VF_DTYPE_INT32: *elem = 4; return "<i4";
    case VF_DTYPE_UINT32: *elem = 4; return "<u4";
    case VF_DTYPE_INT64: *elem = 8; return "<i8";
    case VF_DTYPE_UINT64: *elem = 8; return "<u8";
    case VF_DTYPE_BOOL: *elem = 1; return "|b1";
    default: return NULL;
    }
}

/* A camera's short name: its key without "observation.images.". */
static const char *short_camera_name(const char *key)
{
    return strncmp(key, "observation.images.", 19) ? key : key + 19;
}

/* 1 when the settings ask for this camera (those named in s->cameras, by key
 * or short name; else every camera but depth maps), 0 when not, or an error
 * for a depth map named explicitly. */
static int camera_wanted(const vf_wds_convert_settings *s, const vf_camera *cam)
{
    if (!s->cameras)
        return !cam->is_depth;
    int wanted = 0;
    for (size_t i = 0; i < s->num_cameras; i++)
        wanted |= !strcmp(s->cameras[i], cam->key) || !strcmp(s->cameras[i], short_camera_name(cam->key));
    if (wanted && cam->is_depth)
        return vf_error(VF_EUNSUPPORTED, "camera %s is a depth map: depth images are not converted", cam->key);
    return wanted;
}

static int plan(vf_cv_job *j)
{
    const vf_wds_convert_settings *s = j->s;
    vf_dataset *d = j->d;
    if (s->samples_per_shard < 1 || s->samples_per_shard > 1000000)
        return vf_error(VF_EINVAL, "samples_per_shard %lld: must be 1..1000000", (long long)s->samples_per_shard);
    if (s->past < 0 || s->future < 0 || s->past + s->future > 10000)
        return vf_error(VF_EINVAL, "past %d / future %d: must be >= 0 and together <= 10000", s->past, s->future);
    if (s->jpeg_quality < 1 || s->jpeg_quality > 100)
        return vf_error(VF_EINVAL, "jpeg_quality %d: must be 1..100", s->jpeg_quality);
    if (s->num_image_offsets < 1 || s->num_image_offsets > VF_WDS_MAX_OFFSETS)
        return vf_error(VF_EINVAL, "image offsets: 1..%d needed", VF_WDS_MAX_OFFSETS);
    if ((s->resize_width > 0) != (s->resize_height > 0) || s->resize_width < 0 || s->resize_width > 16384 ||
        s->resize_height > 16384)
        return vf_error(VF_EINVAL, "resize %dx%d: both sides 1..16384, or neither", s->resize_width, s->resize_height);
    j->sps = s->samples_per_shard;
    j->past = s->past;
    j->future = s->future;
    j->T = s->past + 1 + s->future;
    memcpy(j->offsets, s->image_offsets, sizeof j->offsets);
    qsort(j->offsets, (size_t)s->num_image_offsets, sizeof(int), cmp_int);
    for (int i = 0; i < s->num_image_offsets; i++) {
        if (j->offsets[i] < -100000 || j->offsets[i] > 100000)
            return vf_error(VF_EINVAL, "image offset %d: out of range", j->offsets[i]);
        if (i == 0 || j->offsets[i] != j->offsets[j->num_offsets - 1])
            j->offsets[j->num_offsets++] = j->offsets[i];
    }

    /* episodes */
    j->num_eps = vf_dataset_num_episodes(d);
    if (j->num_eps == 0)
        return vf_error(VF_EINVAL, "%s: no episodes to convert", vf_dataset_root(d));
    j->eps = vf_calloc(j->num_eps, sizeof *j->eps);
    if (!j->eps)
        return VF_ENOMEM;
    for (size_t p = 0; p < j->num_eps; p++) {
        const vf_episode *e = vf_dataset_episode(d, p);
        j->eps[p].pos = p;
        j->eps[p].episode_index = e->episode_index;
        j->eps[p].length = e->length;
        j->eps[p].base = (int64_t)j->N;
        j->eps[p].task = e->num_tasks ? e->tasks[0] : NULL;
        if (e->length <= 0)
            return vf_error(VF_ECORRUPT, "%s: episode %lld has no frames", vf_dataset_root(d),
                            (long long)e->episode_index);
        j->N += (uint64_t)e->length;
    }
    j->num_shards = (j->N + (uint64_t)j->sps - 1) / (uint64_t)j->sps;
    j->shards_per_bucket = (j->num_shards + MAX_BUCKETS - 1) / MAX_BUCKETS;
    j->num_buckets = (size_t)((j->num_shards + j->shards_per_bucket - 1) / j->shards_per_bucket);
    j->half_bits = 1;
    while ((UINT64_C(1) << (2 * j->half_bits)) < j->N)
        j->half_bits++;
    for (int round = 0; round < 6; round++)
        j->round_keys[round] = vf_rng_derive(s->seed, 0x7065726du /* "perm" */, (uint64_t)round, 0, 0);

    /* the cameras and the lowdim fields a sample carries (room for every one of the dataset's) */
    size_t ncam_all = vf_dataset_num_cameras(d), nfeat = vf_dataset_num_features(d);
    j->cams = vf_calloc(ncam_all + 1, sizeof *j->cams);
    j->fields = vf_calloc(nfeat + 1, sizeof *j->fields);
    j->left_out = vf_calloc(nfeat + 1, sizeof *j->left_out);
    j->left_out_why = vf_calloc(nfeat + 1, sizeof *j->left_out_why);
    if (!j->cams || !j->fields || !j->left_out || !j->left_out_why)
        return VF_ENOMEM; /* the job's cleanup frees what was allocated */

    /* cameras */
    for (size_t c = 0; c < ncam_all; c++) {
        const vf_camera *cam = vf_dataset_camera(d, c);
        int wanted = camera_wanted(s, cam);
        if (wanted < 0)
            return wanted;
        if (!wanted)
            continue;
        vf_cv_camera *cc = &j->cams[j->num_cams++];
        cc->index = c;
        cc->key = cam->key;
        cc->name = vf_strdup(short_camera_name(cam->key));
        if (!cc->name)
            return VF_ENOMEM;
        cc->src_width = cam->width;
        cc->src_height = cam->height;
        if (cam->width <= 0 || cam->height <= 0)
            return vf_error(VF_ECORRUPT, "%s: camera %s has no width/height in info.json", vf_dataset_root(d),
                            cam->key);
        cc->scaled_width = cc->out_width = cam->width;
        cc->scaled_height = cc->out_height = cam->height;
        if (s->resize_width) {
            double scale = VF_MAX((double)s->resize_width / cam->width, (double)s->resize_height / cam->height);
            cc->scaled_width = VF_MAX(s->resize_width, (int)lround(cam->width * scale));
            cc->scaled_height = VF_MAX(s->resize_height, (int)lround(cam->height * scale));
            cc->out_width = s->resize_width;
            cc->out_height = s->resize_height;
            cc->crop_x = (cc->scaled_width - s->resize_width) / 2;
            cc->crop_y = (cc->scaled_height - s->resize_height) / 2;
        }
        for (size_t p = 0; p < j->num_eps; p++)
            if (d->episodes[d->selected[p]].video[c].file < 0)
                return vf_error(VF_ENOENT, "%s: episode %lld has no video for camera %s", vf_dataset_root(d),
                                (long long)j->eps[p].episode_index, cam->key);
    }
    for (size_t i = 0; s->cameras && i < s->num_cameras; i++) {
        int found = 0;
        for (size_t c = 0; c < j->num_cams; c++)
            found |= !strcmp(s->cameras[i], j->cams[c].key) || !strcmp(s->cameras[i], j->cams[c].name);
        if (!found) {
            vf_buf names = {0};
            for (size_t c = 0; c < ncam_all; c++)
                vf_buf_printf(&names, "%s%s", c ? ", " : "", vf_dataset_camera(d, c)->key);
            int r = vf_error(VF_ENOENT, "%s: no camera '%s' (cameras: %s)", vf_dataset_root(d), s->cameras[i],
                             names.len ? (char *)names.data : "none");
            vf_buf_free(&names);
            return r;
        }
    }
    for (size_t a = 0; a < j->num_cams; a++)
        for (size_t b = a + 1; b < j->num_cams; b++)
            if (!strcmp(j->cams[a].name, j->cams[b].name))
                return vf_error(VF_EINVAL, "cameras %s and %s have the same short name", j->cams[a].key, j->cams[b].key);
    j->num_members = (size_t)j->num_offsets * j->num_cams + 3;
    if (j->num_members > 65535)
        return vf_error(VF_EINVAL, "too many images per sample (%zu)", j->num_members);

    /* lowdim fields and the metadata columns */
    for (size_t i = 0; i < nfeat; i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        int meta = -1;
        for (int m = 0; m < VF_CV_NUM_META; m++)
            if (!strcmp(f->name, vf_cv_meta_columns[m]))
                meta = m;
        if (meta >= 0) {
            if (vf_ds_feature_value_type(f) == VF_DS_F32 || vf_ds_feature_value_type(f) == VF_DS_I64)
                j->meta[meta] = f;
            continue;
        }
        if (f->kind == VF_FEATURE_VIDEO)
            continue; /* cameras: chosen above */
        size_t elem = 0;
        const char *descr = dtype_descr(f->type, &elem);
        const char *why = f->kind == VF_FEATURE_STRING || f->kind == VF_FEATURE_LANGUAGE ? "text has no npz form"
                          : f->kind == VF_FEATURE_IMAGE                                   ? "images in Parquet are not converted"
                          : !descr                                                        ? "its dtype is not supported"
                          : f->ndim > 3                                                   ? "more than 3 dimensions"
                                                                                          : NULL;
        if (why) {
            /* Said and listed in the summary ("left_out"): never dropped silently. */
            vf_log(VF_LOG_WARN, "%s: feature '%s' (dtype %s) is left out of the shards: %s", vf_dataset_root(d),
                   f->name, f->dtype, why);
            j->left_out[j->num_left_out] = f;
            j->left_out_why[j->num_left_out++] = why;
            continue;
        }
        vf_cv_field *fd = &j->fields[j->num_fields++];
        fd->feature = f;
        fd->descr = descr;
        fd->elem = elem;
        fd->width = f->size;
    }

    /* units: lowdim slices, then one per camera file */
    size_t cap = j->num_eps + 1;
    for (size_t c = 0; c < j->num_cams; c++)
        cap += vf_dataset_num_video_files(d, j->cams[c].index);
    j->units = vf_calloc(cap, sizeof *j->units);
    if (!j->units)
        return VF_ENOMEM;
    for (size_t p = 0; p < j->num_eps;) {
        vf_cv_unit *u = &j->units[j->num_units++];
        u->kind = VF_CV_UNIT_LOWDIM;
        u->first = p;
        int64_t rows = 0;
        while (p < j->num_eps && (u->count == 0 || rows + j->eps[p].length <= LOWDIM_UNIT_ROWS)) {
            rows += j->eps[p].length;
            u->count++;
            p++;
        }
        u->work = rows;
    }
    j->num_lowdim_units = j->num_units;
    for (size_t c = 0; c < j->num_cams; c++) {
        size_t nfiles = vf_dataset_num_video_files(d, j->cams[c].index);
        for (size_t f = 0; f < nfiles; f++) {
            vf_cv_unit *u = &j->units[j->num_units++];
            u->kind = VF_CV_UNIT_VIDEO;
            u->cam = c;
            u->file = f;
            const vf_ds_file *file = &d->cameras[j->cams[c].index].files[f];
            for (size_t e = 0; e < file->num_episodes; e++)
                u->work += vf_dataset_episode(d, file->episodes[e])->length;
        }
    }
    if (j->num_units > UINT32_MAX)
        return vf_error(VF_ERANGE, "too many units of work");
    j->shard_done = vf_calloc(j->num_shards, 1);
    j->shard_bytes = vf_calloc(j->num_shards, sizeof *j->shard_bytes);
    j->shard_crc = vf_calloc(j->num_shards, sizeof *j->shard_crc);
    return j->shard_done && j->shard_bytes && j->shard_crc ? 0 : VF_ENOMEM;
}

static char *summary_json(vf_cv_job *j, double seconds, int already_complete)
{
    uint64_t out_bytes = 0;
    for (uint64_t s = 0; s < j->num_shards; s++)
        out_bytes += j->shard_bytes[s];
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_true());
    json_object_set_new(o, "out", json_string(j->shards_dir));
    json_object_set_new(o, "already_complete", json_boolean(already_complete));
    json_object_set_new(o, "samples", json_integer((json_int_t)j->N));
    json_object_set_new(o, "episodes", json_integer((json_int_t)j->num_eps));
    json_object_set_new(o, "shards", json_integer((json_int_t)j->num_shards));
    json_object_set_new(o, "shards_written", json_integer((json_int_t)atomic_load(&j->shards_written)));
    json_object_set_new(o, "shards_kept", json_integer((json_int_t)j->shards_kept));
    json_object_set_new(o, "units", json_integer((json_int_t)j->num_units));
    json_object_set_new(o, "units_resumed", json_integer((json_int_t)j->units_skipped));
    json_t *cams = json_array();
    for (size_t c = 0; c < j->num_cams; c++)
        json_array_append_new(cams, json_string(j->cams[c].name));
    json_object_set_new(o, "cameras", cams);
    json_t *fields = json_array();
    for (size_t f = 0; f < j->num_fields; f++)
        json_array_append_new(fields, json_string(j->fields[f].feature->name));
    json_object_set_new(o, "lowdim_keys", fields);
    json_t *left = json_array();
    for (size_t f = 0; f < j->num_left_out; f++)
        json_array_append_new(left, json_pack("{s:s, s:s, s:s}", "feature", j->left_out[f]->name, "dtype",
                                              j->left_out[f]->dtype, "why", j->left_out_why[f]));
    json_object_set_new(o, "left_out", left);
    json_object_set_new(o, "frames_needed", json_integer((json_int_t)atomic_load(&j->frames_needed)));
    json_object_set_new(o, "frames_decoded", json_integer((json_int_t)atomic_load(&j->frames_decoded)));
    json_object_set_new(o, "jpegs_encoded", json_integer((json_int_t)atomic_load(&j->jpegs)));
    json_object_set_new(o, "spill_records", json_integer((json_int_t)atomic_load(&j->records)));
    json_object_set_new(o, "spill_bytes", json_integer((json_int_t)j->spill_bytes));
    json_object_set_new(o, "output_bytes", json_integer((json_int_t)out_bytes));
    json_object_set_new(o, "seconds", json_real(seconds));
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}

/* ---- entry point ----------------------------------------------------------- */

static int run_pool(vf_cv_job *j, vf_thread_pool *pool, int assemble)
{
    size_t n = assemble ? j->num_buckets : j->num_units;
    vf_cv_work *args = vf_calloc(n ? n : 1, sizeof *args);
    if (!args)
        return VF_ENOMEM;
    int r = 0;
    /* video units first: they are the long ones */
    for (size_t pass = 0; pass < 2 && !assemble; pass++)
        for (size_t i = 0; i < n && r == 0; i++) {
            vf_cv_unit *u = &j->units[i];
            if ((pass == 0) != (u->kind == VF_CV_UNIT_VIDEO) || u->done_run)
                continue;
            args[i] = (vf_cv_work){j, i};
            r = vf_thread_pool_submit(pool, vf_cv_unit_job, &args[i]);
        }
    for (size_t i = 0; i < n && r == 0 && assemble; i++) {
        args[i] = (vf_cv_work){j, i};
        r = vf_thread_pool_submit(pool, vf_cv_bucket_job, &args[i]);
    }
    if (r < 0)
        vf_cv_job_fail(j, r);
    vf_thread_pool_wait(pool);
    free(args);
    return j->err;
}

int vf_wds_convert(const char *source, const char *out_dir, const vf_wds_convert_settings *settings, char **summary)
{
    if (summary)
        *summary = NULL;
    vf_wds_convert_settings defaults;
    if (!settings) {
        vf_wds_convert_defaults(&defaults);
        settings = &defaults;
    }
    if (!source || !out_dir)
        return vf_error(VF_EINVAL, "convert: source and output directory are required");
    double started = vf_now_seconds();
    vf_cv_job job;
    memset(&job, 0, sizeof job);
    vf_cv_job *j = &job;
    j->s = settings;
    j->source = source;
    j->journal_units_fd = j->journal_shards_fd = j->lock_fd = -1;
    pthread_mutex_init(&j->lock, NULL);
    json_t *options = NULL, *pm = NULL;
    vf_thread_pool *pool = NULL;
    int already_complete = 0;

    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    ds.episodes = settings->episodes;
    ds.num_episodes = settings->num_episodes;
    ds.check_videos = 0; /* each camera file is mapped (and checked) by its unit */
    int r = vf_dataset_open(&j->d, source, &ds);
    if (r == 0 && vf_dataset_num_errors(j->d) > 0) {
        for (size_t i = 0; i < vf_dataset_num_problems(j->d); i++) {
            const vf_problem *p = vf_dataset_problem(j->d, i);
            if (p->severity != VF_SEVERITY_ERROR)
                continue;
            r = vf_error(VF_ECORRUPT, "%s: %zu error(s) found at open; first: %s%s%s%s%s (vlafeed info lists them all)",
                         source, vf_dataset_num_errors(j->d), p->file, *p->file ? ": " : "",
                         p->column && *p->column ? p->column : "", p->column && *p->column ? ": " : "", p->message);
            break;
        }
    }
    if (r == 0)
        r = plan(j);
    if (r == 0) {
        j->shards_dir = vf_path_join(out_dir, "shards");
        j->state_dir = j->shards_dir ? vf_path_join(j->shards_dir, STATE_DIR) : NULL;
        r = j->state_dir ? 0 : VF_ENOMEM;
    }
    if (r == 0)
        options = vf_cv_options_json(j);
    /* what is already there: a complete conversion, an interrupted one, or something else */
    char *pm_path = j->shards_dir ? vf_path_join(j->shards_dir, "processing_metadata.json") : NULL;
    char *opt_path = j->state_dir ? vf_path_join(j->state_dir, "options.json") : NULL;
    if (r == 0 && (!pm_path || !opt_path))
        r = VF_ENOMEM;
    if (r == 0 && vf_file_exists(out_dir) && !vf_dir_exists(out_dir))
        r = vf_error(VF_EINVAL, "%s: exists and is not a directory", out_dir);
    if (r == 0 && vf_file_exists(pm_path)) {
        json_error_t jerr;
        pm = json_load_file(pm_path, 0, &jerr);
        if (!pm)
            r = vf_error(VF_ECORRUPT, "%s: %s", pm_path, jerr.text);
        if (r == 0)
            r = vf_cv_compare_options(j->shards_dir, json_object_get(pm, "options"), options);
        if (r == 0)
            r = vf_cv_verify_complete(j, pm);
        if (r == 0)
            already_complete = 1;
    } else if (r == 0 && vf_file_exists(opt_path)) {
        json_error_t jerr;
        json_t *saved = json_load_file(opt_path, 0, &jerr);
        if (!saved)
            r = vf_error(VF_ECORRUPT, "%s: %s", opt_path, jerr.text);
        if (r == 0)
            r = vf_cv_compare_options(j->shards_dir, saved, options);
        json_decref(saved);
    } else if (r == 0 && vf_dir_exists(j->shards_dir)) {
        DIR *dh = opendir(j->shards_dir);
        struct dirent *de;
        while (dh && (de = readdir(dh)) && r == 0)
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, STATE_DIR))
                r = vf_error(VF_EINVAL, "%s: not empty and not a vlafeed conversion (found %s); convert into an empty "
                             "or new directory", j->shards_dir, de->d_name);
        if (dh)
            closedir(dh);
    }
    if (r == 0 && !already_complete) {
        r = vf_mkdirs(j->state_dir);
        if (r == 0 && !vf_file_exists(opt_path)) {
            char *text = json_dumps(options, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            r = text ? vf_cv_write_atomic(opt_path, text, strlen(text)) : VF_ENOMEM;
            free(text);
        }
        if (r == 0) { /* one converter per output at a time */
            char *lock_path = vf_cv_state_path(j, "lock");
            j->lock_fd = lock_path ? open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
            if (j->lock_fd < 0)
                r = vf_error(VF_EIO, "%s: cannot create: %s", lock_path ? lock_path : j->state_dir, strerror(errno));
            else if (flock(j->lock_fd, LOCK_EX | LOCK_NB) < 0)
                r = vf_error(VF_EAGAIN, "%s: another vlafeed convert is writing this output now", j->shards_dir);
            free(lock_path);
        }
        if (r == 0)
            r = vf_cv_load_state(j);
        char *up = vf_cv_state_path(j, "units.done"), *sp = vf_cv_state_path(j, "shards.done");
        if (r == 0 && up && sp) {
            j->journal_units_fd = open(up, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            j->journal_shards_fd = open(sp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            if (j->journal_units_fd < 0 || j->journal_shards_fd < 0)
                r = vf_error(VF_EIO, "%s: cannot open the journals: %s", j->state_dir, strerror(errno));
        } else if (r == 0) {
            r = VF_ENOMEM;
        }
        free(up);
        free(sp);
        if (r == 0)
            r = vf_cv_spill_open(&j->spill, j->state_dir, j->num_buckets);
        if (r == 0)
            r = vf_thread_pool_create(&pool, settings->threads);
        int all_shards_done = 1;
        for (uint64_t s = 0; s < j->num_shards; s++)
            all_shards_done &= j->shard_done[s];
        for (size_t u = 0; u < j->num_units; u++) {
            /* with every shard in place no record is needed; the statistics still are */
            if (all_shards_done && j->units[u].kind == VF_CV_UNIT_VIDEO && !j->units[u].done_run)
                j->units[u].done_run = j->run;
            if (j->units[u].done_run)
                j->units_skipped++;
            else
                j->progress_total += j->units[u].work;
        }
        for (uint64_t s = 0; s < j->num_shards; s++)
            j->progress_total += !j->shard_done[s];
        if (r == 0)
            r = run_pool(j, pool, 0);
        if (r == 0)
            r = run_pool(j, pool, 1);
        if (r < 0 && j->err)
            vf_error(j->err, "%s", j->err_msg);
        if (r == 0)
            for (uint64_t s = 0; s < j->num_shards && r == 0; s++)
                if (!j->shard_done[s])
                    r = vf_error(VF_ECORRUPT, "shard_%06llu was not written (converter bug)", (unsigned long long)s);
        if (r == 0)
            r = vf_cv_write_final_files(j, options);
        if (r == 0) {
            j->spill_bytes = vf_cv_spill_bytes_written(j->spill);
            vf_cv_spill_close(j->spill);
            j->spill = NULL;
            close(j->journal_units_fd);
            close(j->journal_shards_fd);
            j->journal_units_fd = j->journal_shards_fd = -1;
            vf_cv_remove_state_dir(j->state_dir);
        }
    }
    if (r == 0 && settings->progress)
        settings->progress(settings->progress_ctx, j->progress_total, j->progress_total, "done");
    if (r == 0 && summary) {
        *summary = summary_json(j, vf_now_seconds() - started, already_complete);
        if (!*summary)
            r = vf_error(VF_ENOMEM, "summary: out of memory");
    }
    int saved = r;
    char msg[1024];
    if (r < 0)
        snprintf(msg, sizeof msg, "%s", vf_last_error());
    if (pool)
        vf_thread_pool_destroy(pool);
    vf_cv_spill_close(j->spill);
    if (j->journal_units_fd >= 0)
        close(j->journal_units_fd);
    if (j->journal_shards_fd >= 0)
        close(j->journal_shards_fd);
    if (j->lock_fd >= 0)
        close(j->lock_fd);
    json_decref(options);
    json_decref(pm);
    free(pm_path);
    free(opt_path);
    for (size_t c = 0; j->cams && c < j->num_cams; c++)
        free(j->cams[c].name);
    free(j->cams);
    free(j->fields);
    free(j->left_out);
    free(j->left_out_why);
    free(j->eps);
    free(j->units);
    free(j->shard_done);
    free(j->shard_bytes);
    free(j->shard_crc);
    free(j->shards_dir);
    free(j->state_dir);
    vf_dataset_close(j->d);
    pthread_mutex_destroy(&j->lock);
    if (saved < 0)
        vf_error(saved, "%s", msg);
    return saved;
}
