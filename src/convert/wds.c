/*
 * wds.c: vf_wds_convert(), LeRobot v3.0 / v2.1 -> WebDataset shards in VLA
 * Foundry's robotics layout (include/vlafeed/convert.h; the layout is fixed
 * in the README section "Converting to WebDataset shards").
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
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "convert/convert.h"
#include "dataset/dataset.h"
#include "vlafeed/convert.h"

#define LOWDIM_UNIT_ROWS 65536
#define DECODE_BATCH 16
#define MAX_BUCKETS 256
#define STATE_DIR ".vlafeed-convert"

static const char *const META_COLUMNS[] = {"episode_index", "frame_index", "index", "timestamp", "task_index"};
#define NUM_META 5

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

typedef struct cv_episode {
    size_t pos;
    int64_t episode_index, length, base;
    const char *task;
} cv_episode;

typedef struct cv_field {
    const vf_feature *feature;
    const char *descr;
    size_t elem;          /* bytes per element in the npz */
    int64_t width;        /* values per row */
} cv_field;

typedef struct cv_camera {
    size_t index;         /* dataset camera index */
    const char *key;
    char *name;           /* key without "observation.images." */
    int src_width, src_height;
    int scaled_width, scaled_height; /* decode size (cover size when resizing) */
    int out_width, out_height;
    int crop_x, crop_y;
} cv_camera;

enum { UNIT_LOWDIM = 0, UNIT_VIDEO = 1 };

typedef struct cv_unit {
    int kind;
    size_t first, count;  /* lowdim: episodes [first, first+count) of j->eps */
    size_t cam, file;     /* video: j->cams[cam], file index in the camera's list */
    int64_t work;         /* progress weight: samples or frames */
    uint32_t done_run;    /* run in which it finished, 0 if not */
} cv_unit;

typedef struct cv_stats {
    /* per field: count[T], then mean, m2, min, max [T*width] */
    double **count, **mean, **m2, **min, **max;
} cv_stats;

typedef struct cv_job {
    const vf_wds_convert_settings *s;
    vf_dataset *d;
    const char *source;
    int T, past, future;
    int offsets[VF_WDS_MAX_OFFSETS];
    int num_offsets;
    int64_t sps;

    cv_episode *eps;
    size_t num_eps;
    uint64_t N;
    uint64_t num_shards, shards_per_bucket;
    size_t num_buckets;
    int half_bits;
    uint64_t round_keys[6];

    cv_camera *cams;
    size_t num_cams;
    cv_field *fields;
    size_t num_fields;
    const vf_feature *meta[NUM_META];
    size_t num_members;    /* images + 3 */

    cv_unit *units;
    size_t num_units, num_lowdim_units;

    char *shards_dir, *state_dir;
    uint32_t run;
    vf_cv_spill *spill;
    uint8_t *shard_done;
    uint64_t *shard_bytes;
    uint32_t *shard_crc;
    int journal_units_fd, journal_shards_fd, lock_fd;

    pthread_mutex_t lock;
    int err;
    char err_msg[1024];
    _Atomic int abort;
    int64_t progress_done, progress_total;

    _Atomic uint64_t units_finished, frames_needed, frames_decoded, jpegs, records, shards_written;
    uint64_t shards_kept, units_skipped, spill_bytes;
} cv_job;

static void job_fail(cv_job *j, int r)
{
    pthread_mutex_lock(&j->lock);
    if (!j->err) {
        j->err = r;
        snprintf(j->err_msg, sizeof j->err_msg, "%s", vf_last_error());
    }
    atomic_store(&j->abort, 1);
    pthread_mutex_unlock(&j->lock);
}

static void job_progress(cv_job *j, int64_t amount, const char *phase)
{
    if (!j->s->progress)
        return;
    pthread_mutex_lock(&j->lock);
    j->progress_done += amount;
    j->s->progress(j->s->progress_ctx, j->progress_done, j->progress_total, phase);
    pthread_mutex_unlock(&j->lock);
}

/* ---- the permutation and the keys --------------------------------------- */

static uint64_t feistel(const cv_job *j, uint64_t x)
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
static uint64_t sample_position(const cv_job *j, uint64_t g)
{
    uint64_t x = g;
    do
        x = feistel(j, x);
    while (x >= j->N);
    return x;
}

static void sample_key(const cv_job *j, int64_t episode_index, int64_t frame, char out[33])
{
    uint64_t a = vf_rng_derive(j->s->seed, 0x6b6579u, (uint64_t)episode_index, (uint64_t)frame, 0);
    uint64_t b = vf_rng_derive(j->s->seed, 0x6b6579u, (uint64_t)episode_index, (uint64_t)frame, 1);
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

static uint64_t shard_samples(const cv_job *j, uint64_t shard)
{
    uint64_t first = shard * (uint64_t)j->sps;
    return VF_MIN((uint64_t)j->sps, j->N - first);
}

static int put_record(cv_job *j, uint32_t unit, const cv_episode *e, int64_t t, int member, const void *data,
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

/* ---- lowdim units ------------------------------------------------------ */

/* numpy's str() of a float32 scalar: the shortest digits that read back to
 * the same float, positional for 1e-4 <= |v| < 1e16, else scientific. */
static void float32_str(float v, char *out, size_t size)
{
    if (isnan(v) || isinf(v)) {
        snprintf(out, size, "%s", isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
        return;
    }
    char sci[64];
    int p;
    for (p = 1; p < 9; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, (double)v);
        if (strtof(sci, NULL) == v)
            break;
    }
    snprintf(sci, sizeof sci, "%.*e", p - 1, (double)v);
    /* sci = [-]d.ddde[+-]XX */
    int negative = sci[0] == '-';
    char digits[32];
    size_t nd = 0;
    const char *c = sci + negative;
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9')
            digits[nd++] = *c;
    digits[nd] = 0;
    int exponent = atoi(c + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = 0;
    if (v == 0) {
        snprintf(out, size, "%s0.0", negative ? "-" : "");
        return;
    }
    vf_buf b = {0};
    if (negative)
        vf_buf_append_u8(&b, '-');
    if (exponent >= -4 && exponent < 16) {
        if (exponent < 0) {
            vf_buf_printf(&b, "0.");
            for (int i = -1; i > exponent; i--)
                vf_buf_append_u8(&b, '0');
            vf_buf_printf(&b, "%s", digits);
        } else {
            for (int i = 0; i <= exponent; i++)
                vf_buf_append_u8(&b, (size_t)i < nd ? (uint8_t)digits[i] : '0');
            vf_buf_append_u8(&b, '.');
            if ((size_t)exponent + 1 < nd)
                vf_buf_printf(&b, "%s", digits + exponent + 1);
            else
                vf_buf_append_u8(&b, '0');
        }
    } else {
        vf_buf_append_u8(&b, (uint8_t)digits[0]);
        if (nd > 1)
            vf_buf_printf(&b, ".%s", digits + 1);
        vf_buf_printf(&b, "e%c%02d", exponent < 0 ? '-' : '+', abs(exponent));
    }
    snprintf(out, size, "%.*s", (int)b.len, b.data ? (char *)b.data : "");
    vf_buf_free(&b);
}

static void store_value(const cv_field *f, const vf_ds_column *c, int64_t row, int64_t k, uint8_t *dest)
{
    if (c->type == VF_DS_F32) {
        float v = ((const float *)c->values)[row * c->width + k];
        memcpy(dest, &v, 4);
        return;
    }
    int64_t v = ((const int64_t *)c->values)[row * c->width + k];
    switch (f->feature->type) {
    case VF_DTYPE_BOOL: *dest = v != 0; break;
    case VF_DTYPE_INT8: case VF_DTYPE_UINT8: *dest = (uint8_t)v; break;
    case VF_DTYPE_INT16: case VF_DTYPE_UINT16: { uint16_t x = (uint16_t)v; memcpy(dest, &x, 2); break; }
    case VF_DTYPE_INT32: case VF_DTYPE_UINT32: { uint32_t x = (uint32_t)v; memcpy(dest, &x, 4); break; }
    default: memcpy(dest, &v, 8); break;
    }
}

static double column_double(const vf_ds_column *c, int64_t row, int64_t k)
{
    if (c->type == VF_DS_F32)
        return ((const float *)c->values)[row * c->width + k];
    return (double)((const int64_t *)c->values)[row * c->width + k];
}

static int stats_alloc(const cv_job *j, cv_stats *st)
{
    memset(st, 0, sizeof *st);
    double ***arrays[] = {&st->count, &st->mean, &st->m2, &st->min, &st->max};
    for (size_t a = 0; a < 5; a++) {
        *arrays[a] = vf_calloc(j->num_fields ? j->num_fields : 1, sizeof(double *));
        if (!*arrays[a])
            return VF_ENOMEM;
        for (size_t f = 0; f < j->num_fields; f++) {
            size_t n = (size_t)j->T * (a == 0 ? 1 : (size_t)j->fields[f].width);
            if (!((*arrays[a])[f] = vf_calloc(n, sizeof(double))))
                return VF_ENOMEM;
        }
    }
    return 0;
}

static void stats_free(const cv_job *j, cv_stats *st)
{
    double **arrays[] = {st->count, st->mean, st->m2, st->min, st->max};
    for (size_t a = 0; a < 5; a++) {
        for (size_t f = 0; arrays[a] && f < j->num_fields; f++)
            free(arrays[a][f]);
        free(arrays[a]);
    }
    memset(st, 0, sizeof *st);
}

/* Chan et al. merge of (nb, mb, m2b, minb, maxb) into cell i of field f. */
static void stats_merge_cell(cv_stats *st, size_t f, int t, int64_t width, int64_t k, double nb, double mb,
                             double m2b, double minb, double maxb)
{
    if (nb <= 0)
        return;
    double na = st->count[f][t];
    size_t i = (size_t)t * (size_t)width + (size_t)k;
    if (k == width - 1)
        st->count[f][t] = na + nb;
    if (na <= 0) {
        st->mean[f][i] = mb;
        st->m2[f][i] = m2b;
        st->min[f][i] = minb;
        st->max[f][i] = maxb;
        return;
    }
    double n = na + nb, delta = mb - st->mean[f][i];
    st->mean[f][i] += delta * nb / n;
    st->m2[f][i] += m2b + delta * delta * na * nb / n;
    st->min[f][i] = VF_MIN(st->min[f][i], minb);
    st->max[f][i] = VF_MAX(st->max[f][i], maxb);
}

static char *state_path(const cv_job *j, const char *fmt, ...) VF_PRINTF(2, 3);
static char *state_path(const cv_job *j, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return vf_path_join(j->state_dir, name);
}

/* Writes data to path through path.tmp + rename. */
static int write_atomic(const char *path, const void *data, size_t len)
{
    char *tmp = vf_asprintf("%s.tmp", path);
    if (!tmp)
        return VF_ENOMEM;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int r = 0;
    if (fd < 0)
        r = vf_error(VF_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    const uint8_t *p = data;
    while (r == 0 && len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            r = vf_error(VF_EIO, "%s: write: %s", tmp, strerror(errno));
        else {
            p += w;
            len -= (size_t)w;
        }
    }
    if (fd >= 0 && r == 0 && fsync(fd) < 0)
        r = vf_error(VF_EIO, "%s: fsync: %s", tmp, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (r == 0 && rename(tmp, path) < 0)
        r = vf_error(VF_EIO, "%s: rename: %s", path, strerror(errno));
    if (r < 0)
        unlink(tmp);
    free(tmp);
    return r;
}

static int journal_append(int fd, const char *line)
{
    size_t len = strlen(line);
    if (write(fd, line, len) != (ssize_t)len)
        return vf_error(VF_EIO, "convert journal: write: %s", strerror(errno));
    return 0;
}

static int run_lowdim_unit(cv_job *j, uint32_t unit_id)
{
    const cv_unit *u = &j->units[unit_id];
    size_t ncols = j->num_fields + NUM_META;
    const char **names = vf_calloc(ncols, sizeof *names);
    size_t *positions = vf_calloc(u->count, sizeof *positions);
    int meta_col[NUM_META];
    size_t n = 0;
    for (size_t f = 0; f < j->num_fields && names; f++)
        names[n++] = j->fields[f].feature->name;
    for (int m = 0; m < NUM_META && names; m++) {
        meta_col[m] = j->meta[m] ? (int)n : -1;
        if (j->meta[m])
            names[n++] = j->meta[m]->name;
    }
    for (size_t i = 0; i < u->count && positions; i++)
        positions[i] = j->eps[u->first + i].pos;
    vf_ds_table table;
    memset(&table, 0, sizeof table);
    cv_stats st;
    int r = names && positions ? 0 : VF_ENOMEM;
    if (r == 0)
        r = vf_ds_read_table(j->d, positions, u->count, names, n, VF_DS_VERIFY_INDEX, &table);
    if (r == 0)
        r = stats_alloc(j, &st);
    else
        memset(&st, 0, sizeof st);
    uint8_t **windows = vf_calloc(j->num_fields ? j->num_fields : 1, sizeof *windows);
    vf_cv_array *arrays = vf_calloc(j->num_fields + 2, sizeof *arrays);
    uint8_t *past_mask = vf_malloc((size_t)j->T), *future_mask = vf_malloc((size_t)j->T);
    if (r == 0 && (!windows || !arrays || !past_mask || !future_mask))
        r = VF_ENOMEM;
    for (size_t f = 0; f < j->num_fields && r == 0; f++)
        if (!(windows[f] = vf_malloc((size_t)j->T * (size_t)j->fields[f].width * j->fields[f].elem)))
            r = VF_ENOMEM;
    vf_buf npz = {0};
    size_t nimg = j->num_members - 3;
    for (size_t i = 0; i < u->count && r == 0 && !atomic_load(&j->abort); i++) {
        const cv_episode *e = &j->eps[u->first + i];
        int64_t row0 = table.episode_start[i], L = e->length;
        for (int64_t t = 0; t < L && r == 0; t++) {
            for (int w = 0; w < j->T; w++) {
                int64_t src = t - j->past + w;
                int padded = src < 0 || src >= L;
                past_mask[w] = w < j->past && !padded;
                future_mask[w] = w >= j->past && !padded;
            }
            for (size_t f = 0; f < j->num_fields; f++) {
                const cv_field *fd = &j->fields[f];
                const vf_ds_column *c = &table.columns[f];
                for (int w = 0; w < j->T; w++) {
                    int64_t src = VF_MAX(0, VF_MIN(L - 1, t - j->past + w));
                    for (int64_t k = 0; k < fd->width; k++)
                        store_value(fd, c, row0 + src, k,
                                    windows[f] + ((size_t)w * (size_t)fd->width + (size_t)k) * fd->elem);
                    if (!(past_mask[w] || future_mask[w]))
                        continue;
                    for (int64_t k = 0; k < fd->width; k++) { /* one valid entry: Welford step */
                        double x = column_double(c, row0 + src, k);
                        size_t cell = (size_t)w * (size_t)fd->width + (size_t)k;
                        double cnt = st.count[f][w] + 1;
                        if (cnt == 1) {
                            st.mean[f][cell] = x;
                            st.min[f][cell] = st.max[f][cell] = x;
                        } else {
                            double delta = x - st.mean[f][cell];
                            st.mean[f][cell] += delta / cnt;
                            st.m2[f][cell] += delta * (x - st.mean[f][cell]);
                            st.min[f][cell] = VF_MIN(st.min[f][cell], x);
                            st.max[f][cell] = VF_MAX(st.max[f][cell], x);
                        }
                    }
                    st.count[f][w] += 1;
                }
                vf_cv_array *a = &arrays[f];
                a->name = fd->feature->name;
                a->descr = fd->descr;
                a->ndim = 1 + fd->feature->ndim;
                a->shape[0] = j->T;
                for (int s = 0; s < fd->feature->ndim; s++)
                    a->shape[1 + s] = fd->feature->shape[s];
                a->data = windows[f];
                a->bytes = (size_t)j->T * (size_t)fd->width * fd->elem;
            }
            vf_cv_array masks[2] = {{"past_mask", "|b1", 1, {j->T}, past_mask, (size_t)j->T},
                                    {"future_mask", "|b1", 1, {j->T}, future_mask, (size_t)j->T}};
            arrays[j->num_fields] = masks[0];
            arrays[j->num_fields + 1] = masks[1];
            npz.len = 0;
            r = vf_cv_npz_write(arrays, j->num_fields + 2, &npz);
            if (r == 0)
                r = put_record(j, unit_id, e, t, (int)nimg, npz.data, npz.len);
            /* metadata.json */
            json_t *meta = json_object(), *names_json = json_array(), *sizes = json_object();
            for (size_t c = 0; c < j->num_cams; c++) {
                json_array_append_new(names_json, json_string(j->cams[c].name));
                json_object_set_new(sizes, j->cams[c].name,
                                    json_pack("[ii]", j->cams[c].src_width, j->cams[c].src_height));
            }
            json_object_set_new(meta, "camera_names", names_json);
            json_object_set_new(meta, "anchor_relative_idx", json_integer(j->past));
            for (int m = 0; m < NUM_META; m++) {
                if (meta_col[m] < 0)
                    continue;
                const vf_ds_column *c = &table.columns[meta_col[m]];
                char text[64];
                if (c->type == VF_DS_F32)
                    float32_str(((const float *)c->values)[(row0 + t) * c->width], text, sizeof text);
                else
                    snprintf(text, sizeof text, "%lld", (long long)((const int64_t *)c->values)[(row0 + t) * c->width]);
                json_object_set_new(meta, META_COLUMNS[m], json_string(text));
            }
            json_object_set_new(meta, "original_image_sizes", sizes);
            char *meta_text = json_dumps(meta, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            json_decref(meta);
            json_t *lang = json_pack("{ss}", "original", e->task ? e->task : "");
            char *lang_text = json_dumps(lang, JSON_PRESERVE_ORDER);
            json_decref(lang);
            if (r == 0 && (!meta_text || !lang_text))
                r = vf_error(VF_ENOMEM, "metadata json: out of memory");
            if (r == 0)
                r = put_record(j, unit_id, e, t, (int)nimg + 1, meta_text, strlen(meta_text));
            if (r == 0)
                r = put_record(j, unit_id, e, t, (int)nimg + 2, lang_text, strlen(lang_text));
            free(meta_text);
            free(lang_text);
        }
        job_progress(j, L, "decode");
    }
    /* the unit's statistics, then the journal line that makes it count */
    if (r == 0 && atomic_load(&j->abort))
        r = VF_EAGAIN;
    if (r == 0) {
        vf_buf blob = {0};
        for (size_t f = 0; f < j->num_fields && r == 0; f++) {
            size_t cells = (size_t)j->T * (size_t)j->fields[f].width;
            r = vf_buf_append(&blob, st.count[f], (size_t)j->T * sizeof(double));
            double *arrs[] = {st.mean[f], st.m2[f], st.min[f], st.max[f]};
            for (int a = 0; a < 4 && r == 0; a++)
                r = vf_buf_append(&blob, arrs[a], cells * sizeof(double));
        }
        char *path = state_path(j, "stats_%06u.bin", unit_id);
        if (r == 0)
            r = path ? write_atomic(path, blob.data ? blob.data : (uint8_t *)"", blob.len) : VF_ENOMEM;
        free(path);
        vf_buf_free(&blob);
    }
    vf_buf_free(&npz);
    for (size_t f = 0; windows && f < j->num_fields; f++)
        free(windows[f]);
    free(windows);
    free(arrays);
    free(past_mask);
    free(future_mask);
    stats_free(j, &st);
    vf_ds_table_free(&table);
    free(names);
    free(positions);
    return r;
}

/* ---- video units ------------------------------------------------------- */

/* Anchors t of an episode of length L whose image at offset off is frame k:
 * clip(t + off, 0, L - 1) == k. */
static int anchors_using(int64_t k, int off, int64_t L, int64_t *lo, int64_t *hi)
{
    *lo = k == 0 ? 0 : k - off;
    *hi = k == L - 1 ? L - 1 : k - off;
    *lo = VF_MAX(*lo, 0);
    *hi = VF_MIN(*hi, L - 1);
    return *lo <= *hi;
}

typedef struct video_ctx {
    cv_job *j;
    uint32_t unit_id;
    const cv_camera *cam;
    size_t cam_index;
    tjhandle tj;
    uint8_t *jpeg;
    unsigned long jpeg_cap;
    vf_video_format fmt;
    size_t frame_bytes;
    uint8_t *frames[DECODE_BATCH];
    vf_video_request req[DECODE_BATCH];
    int64_t req_k[DECODE_BATCH];
    size_t pending;
} video_ctx;

static int flush_batch(video_ctx *v, vf_video_reader *reader, const cv_episode *e)
{
    if (v->pending == 0)
        return 0;
    cv_job *j = v->j;
    int r = vf_video_read_frames(reader, v->req, v->pending, &v->fmt);
    if (r < 0)
        r = vf_error_context(r, "camera %s, episode %lld", v->cam->key, (long long)e->episode_index);
    for (size_t i = 0; i < v->pending && r == 0; i++) {
        int64_t k = v->req_k[i];
        const cv_camera *c = v->cam;
        size_t stride = (size_t)c->scaled_width * 3;
        const uint8_t *src = v->frames[i] + (size_t)c->crop_y * stride + (size_t)c->crop_x * 3;
        unsigned long size = v->jpeg_cap;
        if (tjCompress2(v->tj, src, c->out_width, (int)stride, c->out_height, TJPF_RGB, &v->jpeg, &size, TJSAMP_420,
                        j->s->jpeg_quality, TJFLAG_NOREALLOC) != 0) {
            r = vf_error(VF_EIO, "camera %s, episode %lld frame %lld: JPEG encode: %s", c->key,
                         (long long)e->episode_index, (long long)k, tjGetErrorStr2(v->tj));
            break;
        }
        atomic_fetch_add(&j->jpegs, 1);
        for (int o = 0; o < j->num_offsets && r == 0; o++) {
            int64_t lo, hi;
            if (!anchors_using(k, j->offsets[o], e->length, &lo, &hi))
                continue;
            int member = o * (int)j->num_cams + (int)v->cam_index;
            for (int64_t t = lo; t <= hi && r == 0; t++)
                r = put_record(j, v->unit_id, e, t, member, v->jpeg, size);
        }
    }
    job_progress(j, (int64_t)v->pending, "decode");
    v->pending = 0;
    return r;
}

static int run_video_unit(cv_job *j, uint32_t unit_id)
{
    const cv_unit *u = &j->units[unit_id];
    const cv_camera *cam = &j->cams[u->cam];
    const vf_ds_file *file = &j->d->cameras[cam->index].files[u->file];
    video_ctx v;
    memset(&v, 0, sizeof v);
    v.j = j;
    v.unit_id = unit_id;
    v.cam = cam;
    v.cam_index = u->cam;
    vf_video_format_defaults(&v.fmt);
    v.fmt.layout = VF_VIDEO_RGB_HWC_U8;
    v.fmt.width = cam->scaled_width;
    v.fmt.height = cam->scaled_height;
    v.fmt.scaler = VF_VIDEO_SCALE_BICUBIC;
    v.frame_bytes = (size_t)cam->scaled_width * (size_t)cam->scaled_height * 3;
    vf_ds_video_map map;
    memset(&map, 0, sizeof map);
    vf_video_reader *reader = NULL;
    vf_source *src = NULL;
    int r = vf_ds_video_map_build(j->d, cam->index, u->file, &map);
    if (r == 0 && (r = vf_ds_open_path(j->d, file->path, &src)) == 0) {
        vf_video_settings vs;
        vf_video_defaults(&vs);
        vs.camera = cam->key;
        r = vf_video_open(&reader, src, &vs);
        vf_source_close(src);
    }
    if (r == 0) {
        const vf_video_index *ix = vf_video_reader_index(reader);
        if (ix->width != cam->src_width || ix->height != cam->src_height)
            r = vf_error(VF_ECORRUPT, "%s: camera %s is %dx%d, but the dataset says %dx%d", file->path, cam->key,
                         ix->width, ix->height, cam->src_width, cam->src_height);
    }
    if (r == 0) {
        v.tj = tjInitCompress();
        v.jpeg_cap = tjBufSize(cam->out_width, cam->out_height, TJSAMP_420);
        v.jpeg = v.tj ? tjAlloc((int)v.jpeg_cap) : NULL;
        if (!v.tj || !v.jpeg)
            r = vf_error(VF_ENOMEM, "TurboJPEG: cannot start a compressor");
    }
    for (size_t i = 0; i < DECODE_BATCH && r == 0; i++)
        if (!(v.frames[i] = vf_malloc(v.frame_bytes)))
            r = VF_ENOMEM;
    for (size_t fe = 0; fe < file->num_episodes && r == 0 && !atomic_load(&j->abort); fe++) {
        size_t pos = file->episodes[fe];
        if (pos >= j->num_eps)
            continue;
        const cv_episode *e = &j->eps[pos]; /* eps are indexed by position */
        for (int64_t k = 0; k < e->length && r == 0; k++) {
            int used = 0;
            for (int o = 0; o < j->num_offsets && !used; o++) {
                int64_t lo, hi;
                used = anchors_using(k, j->offsets[o], e->length, &lo, &hi);
            }
            if (!used)
                continue;
            int64_t ordinal;
            r = vf_ds_video_map_ordinal(&map, j->d, e->episode_index, k, &ordinal);
            if (r < 0)
                break;
            vf_video_request *q = &v.req[v.pending];
            q->frame_ordinal = ordinal;
            q->dest = v.frames[v.pending];
            q->episode = e->episode_index;
            q->frame_in_episode = k;
            q->status = 0;
            v.req_k[v.pending++] = k;
            atomic_fetch_add(&j->frames_needed, 1);
            if (v.pending == DECODE_BATCH)
                r = flush_batch(&v, reader, e);
        }
        if (r == 0)
            r = flush_batch(&v, reader, e);
    }
    if (reader) {
        vf_video_stats vst;
        vf_video_get_stats(reader, &vst);
        atomic_fetch_add(&j->frames_decoded, vst.frames_decoded);
    }
    if (r == 0 && atomic_load(&j->abort))
        r = VF_EAGAIN;
    for (size_t i = 0; i < DECODE_BATCH; i++)
        free(v.frames[i]);
    if (v.jpeg)
        tjFree(v.jpeg);
    if (v.tj)
        tjDestroy(v.tj);
    vf_video_close(reader);
    vf_ds_video_map_free(&map);
    return r;
}

/* Test hook, for the resume tests: VF_CONVERT_KILL_AFTER="decode:N" or
 * "assemble:N" kills the process with SIGKILL (no clean-up of any kind)
 * right after the N-th unit of work or shard of this run has been
 * journaled, so a test can interrupt a conversion at an exact point. */
static void maybe_kill_for_test(const char *phase, uint64_t done)
{
    const char *spec = getenv("VF_CONVERT_KILL_AFTER");
    size_t n = strlen(phase);
    if (spec && !strncmp(spec, phase, n) && spec[n] == ':' && strtoull(spec + n + 1, NULL, 10) == done)
        raise(SIGKILL);
}

typedef struct unit_arg {
    cv_job *j;
    uint32_t unit;
} unit_arg;

static void unit_job(void *p)
{
    unit_arg *a = p;
    cv_job *j = a->j;
    if (atomic_load(&j->abort))
        return;
    cv_unit *u = &j->units[a->unit];
    int r = u->kind == UNIT_LOWDIM ? run_lowdim_unit(j, a->unit) : run_video_unit(j, a->unit);
    if (r == VF_EAGAIN && atomic_load(&j->abort))
        return; /* stopped because another unit failed */
    if (r == 0) {
        char line[64];
        snprintf(line, sizeof line, "%u %u\n", a->unit, j->run);
        r = journal_append(j->journal_units_fd, line);
        if (r == 0) {
            u->done_run = j->run;
            maybe_kill_for_test("decode", atomic_fetch_add(&j->units_finished, 1) + 1);
        }
    }
    if (r < 0)
        job_fail(j, r);
}

/* ---- assembly ---------------------------------------------------------- */

static int cmp_ref(const void *pa, const void *pb)
{
    const vf_cv_record_ref *a = pa, *b = pb;
    if (a->head.shard != b->head.shard)
        return a->head.shard < b->head.shard ? -1 : 1;
    if (a->head.pos != b->head.pos)
        return a->head.pos < b->head.pos ? -1 : 1;
    if (a->head.member != b->head.member)
        return a->head.member < b->head.member ? -1 : 1;
    return 0;
}

static void member_name(const cv_job *j, int member, char *out, size_t size)
{
    size_t nimg = j->num_members - 3;
    if ((size_t)member < nimg)
        snprintf(out, size, "%s_t%d.jpg", j->cams[(size_t)member % j->num_cams].name,
                 j->offsets[(size_t)member / j->num_cams]);
    else
        snprintf(out, size, "%s",
                 (size_t)member == nimg ? "lowdim.npz" : (size_t)member == nimg + 1 ? "metadata.json"
                                                                              : "language_instructions.json");
}

static char *shard_path(const cv_job *j, uint64_t shard, int tmp)
{
    return vf_asprintf("%s/shard_%06llu.tar%s", j->shards_dir, (unsigned long long)shard, tmp ? ".tmp" : "");
}

static int assemble_shard(cv_job *j, size_t bucket, uint64_t shard, const vf_cv_record_ref *refs, size_t count)
{
    uint64_t samples = shard_samples(j, shard);
    size_t M = j->num_members;
    char *tmp = shard_path(j, shard, 1), *final = shard_path(j, shard, 0);
    vf_cv_tar *tar = NULL;
    vf_buf payload = {0};
    int r = tmp && final ? 0 : VF_ENOMEM;
    /* every slot must have every member once */
    for (size_t i = 0, want = 0; r == 0 && want < samples * M; want++) {
        uint32_t pos = (uint32_t)(want / M);
        uint16_t member = (uint16_t)(want % M);
        char name[256];
        member_name(j, member, name, sizeof name);
        if (i >= count || refs[i].head.pos != pos || refs[i].head.member != member) {
            r = vf_error(VF_ECORRUPT, "shard_%06llu: slot %u has no %s in the spill (converter bug or damaged spill; "
                         "delete %s and convert again)", (unsigned long long)shard, pos, name, j->state_dir);
            break;
        }
        if (i + 1 < count && refs[i + 1].head.pos == pos && refs[i + 1].head.member == member) {
            r = vf_error(VF_ECORRUPT, "shard_%06llu: slot %u has %s twice in the spill", (unsigned long long)shard, pos,
                         name);
            break;
        }
        if (refs[i].head.episode_index != refs[i - (i % M)].head.episode_index ||
            refs[i].head.frame != refs[i - (i % M)].head.frame) {
            r = vf_error(VF_ECORRUPT, "shard_%06llu: slot %u mixes two samples in the spill", (unsigned long long)shard,
                         pos);
            break;
        }
        i++;
    }
    if (r == 0 && count != samples * M)
        r = vf_error(VF_ECORRUPT, "shard_%06llu: %zu records in the spill, expected %llu", (unsigned long long)shard,
                     count, (unsigned long long)(samples * M));
    if (r == 0)
        r = vf_cv_tar_open(&tar, tmp);
    for (size_t i = 0; i < count && r == 0; i++) {
        const vf_cv_record *h = &refs[i].head;
        payload.len = 0;
        if ((r = vf_buf_reserve(&payload, h->len ? h->len : 1)) < 0)
            break;
        if ((r = vf_cv_spill_read(j->spill, bucket, refs[i].offset, payload.data, h->len)) < 0)
            break;
        char key[33], suffix[256], name[320];
        sample_key(j, h->episode_index, h->frame, key);
        member_name(j, h->member, suffix, sizeof suffix);
        snprintf(name, sizeof name, "%s.%s", key, suffix);
        r = vf_cv_tar_add(tar, name, payload.data, h->len);
    }
    uint64_t bytes = 0;
    uint32_t crc = 0;
    if (tar) {
        if (r == 0)
            r = vf_cv_tar_finish(tar, &bytes, &crc);
        else
            vf_cv_tar_abort(tar);
    }
    if (r == 0 && rename(tmp, final) < 0)
        r = vf_error(VF_EIO, "%s: rename: %s", final, strerror(errno));
    if (r == 0) {
        char line[96];
        snprintf(line, sizeof line, "%llu %llu %u\n", (unsigned long long)shard, (unsigned long long)bytes, crc);
        r = journal_append(j->journal_shards_fd, line);
        j->shard_bytes[shard] = bytes;
        j->shard_crc[shard] = crc;
        j->shard_done[shard] = 1;
        maybe_kill_for_test("assemble", atomic_fetch_add(&j->shards_written, 1) + 1);
    } else if (tmp) {
        unlink(tmp);
    }
    vf_buf_free(&payload);
    free(tmp);
    free(final);
    return r;
}

typedef struct bucket_arg {
    cv_job *j;
    size_t bucket;
} bucket_arg;

static void bucket_job(void *p)
{
    bucket_arg *a = p;
    cv_job *j = a->j;
    if (atomic_load(&j->abort))
        return;
    uint64_t first = (uint64_t)a->bucket * j->shards_per_bucket;
    uint64_t last = VF_MIN(first + j->shards_per_bucket, j->num_shards);
    int todo = 0;
    for (uint64_t s = first; s < last; s++)
        todo |= !j->shard_done[s];
    if (!todo)
        return;
    vf_cv_record_ref *refs = NULL;
    size_t count = 0;
    int r = vf_cv_spill_scan(j->spill, a->bucket, &refs, &count);
    size_t kept = 0;
    for (size_t i = 0; i < count && r == 0; i++) {
        const vf_cv_record *h = &refs[i].head;
        if (h->unit >= j->num_units || j->units[h->unit].done_run != h->run)
            continue; /* left by a unit that did not finish */
        if (h->shard < first || h->shard >= last || h->member >= j->num_members) {
            r = vf_error(VF_ECORRUPT, "spill bucket %zu: record for shard %u member %u does not belong there", a->bucket,
                         h->shard, h->member);
            break;
        }
        refs[kept++] = refs[i];
    }
    if (r == 0)
        qsort(refs, kept, sizeof *refs, cmp_ref);
    size_t i = 0;
    for (uint64_t s = first; s < last && r == 0 && !atomic_load(&j->abort); s++) {
        size_t begin = i;
        while (i < kept && refs[i].head.shard == s)
            i++;
        if (j->shard_done[s])
            continue;
        r = assemble_shard(j, a->bucket, s, refs + begin, i - begin);
        job_progress(j, 1, "assemble");
    }
    free(refs);
    if (r < 0)
        job_fail(j, r);
}

/* ---- options, state and the final files -------------------------------- */

static json_t *options_json(const cv_job *j)
{
    const vf_wds_convert_settings *s = j->s;
    json_t *o = json_object();
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)vf_dataset_fingerprint(j->d));
    json_object_set_new(o, "dataset_fingerprint", json_string(fp));
    json_t *eps = json_array();
    for (size_t i = 0; i < j->num_eps; i++)
        json_array_append_new(eps, json_integer(j->eps[i].episode_index));
    json_object_set_new(o, "episodes", s->episodes ? eps : (json_decref(eps), json_null()));
    json_object_set_new(o, "samples_per_shard", json_integer(j->sps));
    json_object_set_new(o, "past", json_integer(j->past));
    json_object_set_new(o, "future", json_integer(j->future));
    json_t *offs = json_array();
    for (int i = 0; i < j->num_offsets; i++)
        json_array_append_new(offs, json_integer(j->offsets[i]));
    json_object_set_new(o, "image_offsets", offs);
    json_t *cams = json_array();
    for (size_t c = 0; c < j->num_cams; c++)
        json_array_append_new(cams, json_string(j->cams[c].key));
    json_object_set_new(o, "cameras", cams);
    json_object_set_new(o, "resize", s->resize_width ? json_pack("[ii]", s->resize_width, s->resize_height)
                                                     : json_null());
    json_object_set_new(o, "jpeg_quality", json_integer(s->jpeg_quality));
    json_object_set_new(o, "seed", json_integer((json_int_t)s->seed));
    return o;
}

/* VF_EINVAL naming the first option whose value differs. */
static int compare_options(const char *where, json_t *saved, json_t *now)
{
    if (!json_is_object(saved))
        return vf_error(VF_ECORRUPT, "%s: no options object", where);
    const char *k;
    json_t *v;
    json_object_foreach(now, k, v) {
        json_t *old = json_object_get(saved, k);
        if (!old || !json_equal(old, v)) {
            char *a = old ? json_dumps(old, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            char *b = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            int r = vf_error(VF_EINVAL,
                             "%s was made with different options: %s was %s, now %s; convert into another "
                             "directory or remove it",
                             where, k, a ? a : "(absent)", b ? b : "?");
            free(a);
            free(b);
            return r;
        }
    }
    return 0;
}

static int read_lines(const char *path, char ***lines, size_t *count)
{
    *lines = NULL;
    *count = 0;
    if (!vf_file_exists(path))
        return 0;
    uint8_t *data;
    size_t len;
    int r = vf_read_file(path, &data, &len);
    if (r < 0)
        return r;
    size_t cap = 0;
    char *save = NULL;
    for (char *line = strtok_r((char *)data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (*count == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = vf_realloc(*lines, cap * sizeof **lines);
            if (!grown) {
                r = VF_ENOMEM;
                break;
            }
            *lines = grown;
        }
        if (!((*lines)[(*count)++] = vf_strdup(line))) {
            r = VF_ENOMEM;
            break;
        }
    }
    free(data);
    return r;
}

static void free_lines(char **lines, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(lines[i]);
    free(lines);
}

/* Loads the resume state (units finished, shards verified) of an earlier run. */
static int load_state(cv_job *j)
{
    char *runs = state_path(j, "run"), *units = state_path(j, "units.done"), *shards = state_path(j, "shards.done");
    int r = runs && units && shards ? 0 : VF_ENOMEM;
    uint32_t last_run = 0;
    if (r == 0 && vf_file_exists(runs)) {
        uint8_t *data;
        size_t len;
        if ((r = vf_read_file(runs, &data, &len)) == 0) {
            last_run = (uint32_t)strtoul((char *)data, NULL, 10);
            free(data);
        }
    }
    j->run = last_run + 1;
    char text[32];
    snprintf(text, sizeof text, "%u\n", j->run);
    if (r == 0)
        r = write_atomic(runs, text, strlen(text));
    char **lines = NULL;
    size_t n = 0;
    if (r == 0)
        r = read_lines(units, &lines, &n);
    for (size_t i = 0; i < n && r == 0; i++) {
        unsigned unit, run;
        if (sscanf(lines[i], "%u %u", &unit, &run) == 2 && unit < j->num_units && run < j->run) {
            j->units[unit].done_run = run;
        }
    }
    free_lines(lines, n);
    if (r == 0)
        r = read_lines(shards, &lines, &n);
    for (size_t i = 0; i < n && r == 0; i++) {
        unsigned long long shard, bytes;
        unsigned crc;
        if (sscanf(lines[i], "%llu %llu %u", &shard, &bytes, &crc) != 3 || shard >= j->num_shards)
            continue;
        char *path = shard_path(j, shard, 0);
        uint64_t got_bytes = 0;
        uint32_t got_crc = 0;
        if (path && vf_file_exists(path) && vf_cv_file_crc(path, &got_bytes, &got_crc) == 0 && got_bytes == bytes &&
            got_crc == crc) {
            if (!j->shard_done[shard])
                j->shards_kept++;
            j->shard_done[shard] = 1;
            j->shard_bytes[shard] = bytes;
            j->shard_crc[shard] = crc;
        } else if (path) {
            j->shard_done[shard] = 0; /* damaged or gone since: made again */
            unlink(path);
        }
        free(path);
    }
    free_lines(lines, n);
    free(runs);
    free(units);
    free(shards);
    return r;
}

static int write_stats(cv_job *j, json_t **out)
{
    cv_stats total;
    int r = stats_alloc(j, &total);
    cv_stats part;
    memset(&part, 0, sizeof part);
    if (r == 0)
        r = stats_alloc(j, &part);
    for (size_t u = 0; u < j->num_lowdim_units && r == 0; u++) {
        char *path = state_path(j, "stats_%06zu.bin", u);
        uint8_t *data = NULL;
        size_t len = 0;
        r = path ? vf_read_file(path, &data, &len) : VF_ENOMEM;
        size_t off = 0;
        for (size_t f = 0; f < j->num_fields && r == 0; f++) {
            size_t cells = (size_t)j->T * (size_t)j->fields[f].width;
            double *dst[] = {part.count[f], part.mean[f], part.m2[f], part.min[f], part.max[f]};
            size_t sizes[] = {(size_t)j->T, cells, cells, cells, cells};
            for (int a = 0; a < 5 && r == 0; a++) {
                if (off + sizes[a] * sizeof(double) > len) {
                    r = vf_error(VF_ECORRUPT, "%s: truncated", path);
                    break;
                }
                memcpy(dst[a], data + off, sizes[a] * sizeof(double));
                off += sizes[a] * sizeof(double);
            }
            int64_t width = j->fields[f].width;
            for (int t = 0; t < j->T && r == 0; t++)
                for (int64_t k = 0; k < width; k++) {
                    size_t i = (size_t)t * (size_t)width + (size_t)k;
                    stats_merge_cell(&total, f, t, width, k, part.count[f][t], part.mean[f][i], part.m2[f][i],
                                     part.min[f][i], part.max[f][i]);
                }
        }
        free(data);
        free(path);
    }
    json_t *root = json_object();
    for (size_t f = 0; f < j->num_fields && r == 0; f++) {
        int64_t width = j->fields[f].width;
        json_t *o = json_object();
        json_t *mean = json_array(), *std = json_array(), *mn = json_array(), *mx = json_array();
        for (int64_t k = 0; k < width; k++) { /* all valid entries of a channel, pooled over offsets */
            double n = 0, m = 0, m2 = 0, lo = 0, hi = 0;
            for (int t = 0; t < j->T; t++) {
                double nb = total.count[f][t];
                size_t i = (size_t)t * (size_t)width + (size_t)k;
                if (nb <= 0)
                    continue;
                if (n <= 0) {
                    n = nb, m = total.mean[f][i], m2 = total.m2[f][i], lo = total.min[f][i], hi = total.max[f][i];
                    continue;
                }
                double nn = n + nb, delta = total.mean[f][i] - m;
                m += delta * nb / nn;
                m2 += total.m2[f][i] + delta * delta * n * nb / nn;
                lo = VF_MIN(lo, total.min[f][i]);
                hi = VF_MAX(hi, total.max[f][i]);
                n = nn;
            }
            json_array_append_new(mean, n > 0 ? json_real(m) : json_null());
            json_array_append_new(std, n > 0 ? json_real(sqrt(m2 / n)) : json_null());
            json_array_append_new(mn, n > 0 ? json_real(lo) : json_null());
            json_array_append_new(mx, n > 0 ? json_real(hi) : json_null());
        }
        json_object_set_new(o, "mean", mean);
        json_object_set_new(o, "std", std);
        json_object_set_new(o, "min", mn);
        json_object_set_new(o, "max", mx);
        const char *names[] = {"mean_per_timestep", "std_per_timestep", "min_per_timestep", "max_per_timestep"};
        for (int a = 0; a < 4; a++) {
            json_t *rows = json_array();
            for (int t = 0; t < j->T; t++) {
                json_t *row = json_array();
                double n = total.count[f][t];
                for (int64_t k = 0; k < width; k++) {
                    size_t i = (size_t)t * (size_t)width + (size_t)k;
                    double v = a == 0 ? total.mean[f][i] : a == 1 ? sqrt(total.m2[f][i] / (n > 0 ? n : 1))
                                                     : a == 2 ? total.min[f][i] : total.max[f][i];
                    json_array_append_new(row, n > 0 ? json_real(v) : json_null());
                }
                json_array_append_new(rows, row);
            }
            json_object_set_new(o, names[a], rows);
        }
        json_t *count = json_array();
        for (int t = 0; t < j->T; t++)
            json_array_append_new(count, json_integer((json_int_t)total.count[f][t]));
        json_object_set_new(o, "count", count);
        json_object_set_new(root, j->fields[f].feature->name, o);
    }
    stats_free(j, &total);
    stats_free(j, &part);
    if (r < 0) {
        json_decref(root);
        return r;
    }
    *out = root;
    return 0;
}

static int write_json_file(const char *dir, const char *name, json_t *value, size_t flags)
{
    char *path = vf_path_join(dir, name);
    char *text = json_dumps(value, flags);
    int r = path && text ? write_atomic(path, text, strlen(text)) : VF_ENOMEM;
    free(path);
    free(text);
    return r;
}

static void yaml_string_list(vf_buf *b, const char *key, const char *const *items, size_t n)
{
    vf_buf_printf(b, "%s: [", key);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_string(items[i]);
        char *q = json_dumps(s, JSON_ENCODE_ANY);
        vf_buf_printf(b, "%s%s", i ? ", " : "", q ? q : "\"\"");
        free(q);
        json_decref(s);
    }
    vf_buf_printf(b, "]\n");
}

static int write_final_files(cv_job *j, json_t *options)
{
    /* manifest.jsonl: lines joined by \n, no trailing newline (as VLA Foundry writes it) */
    vf_buf manifest = {0};
    for (uint64_t s = 0; s < j->num_shards; s++)
        vf_buf_printf(&manifest, "%s{\"shard\": \"shard_%06llu\", \"num_sequences\": %llu}", s ? "\n" : "",
                      (unsigned long long)s, (unsigned long long)shard_samples(j, s));
    char *path = vf_path_join(j->shards_dir, "manifest.jsonl");
    int r = path ? write_atomic(path, manifest.data ? manifest.data : (uint8_t *)"", manifest.len) : VF_ENOMEM;
    free(path);
    vf_buf_free(&manifest);

    json_t *stats = NULL;
    if (r == 0)
        r = write_stats(j, &stats);
    if (r == 0)
        r = write_json_file(j->shards_dir, "stats.json", stats, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(stats);

    vf_buf y = {0};
    vf_buf_printf(&y, "# written by vlafeed %s (vlafeed convert --to wds)\ntype: lerobot\n", vf_version());
    vf_buf_printf(&y, "past_lowdim_steps: %d\nfuture_lowdim_steps: %d\n", j->past, j->future);
    vf_buf_printf(&y, "image_indices: [");
    for (int i = 0; i < j->num_offsets; i++)
        vf_buf_printf(&y, "%s%d", i ? ", " : "", j->offsets[i]);
    vf_buf_printf(&y, "]\n");
    const char **names = vf_calloc(VF_MAX(j->num_cams, j->num_fields) + 1, sizeof *names);
    for (size_t c = 0; names && c < j->num_cams; c++)
        names[c] = j->cams[c].name;
    if (names)
        yaml_string_list(&y, "camera_names", names, j->num_cams);
    for (size_t f = 0; names && f < j->num_fields; f++)
        names[f] = j->fields[f].feature->name;
    if (names)
        yaml_string_list(&y, "lowdim_keys", names, j->num_fields);
    free(names);
    if (j->s->resize_width)
        vf_buf_printf(&y, "resize_images_size: [%d, %d]\nimage_resizing_method: center_crop\n", j->s->resize_width,
                      j->s->resize_height);
    else
        vf_buf_printf(&y, "resize_images_size: null\n");
    vf_buf_printf(&y, "jpeg_quality: %d\nsamples_per_shard: %lld\nstride: 1\npadding_strategy: copy\n",
                  j->s->jpeg_quality, (long long)j->sps);
    vf_buf_printf(&y, "max_padding_left: %d\nmax_padding_right: %d\nseed: %llu\n", j->past, j->future,
                  (unsigned long long)j->s->seed);
    path = vf_path_join(j->shards_dir, "preprocessing_config.yaml");
    if (r == 0)
        r = path ? write_atomic(path, y.data, y.len) : VF_ENOMEM;
    free(path);
    vf_buf_free(&y);

    if (r == 0) { /* last: its presence marks the conversion complete */
        json_t *pm = json_object();
        json_object_set_new(pm, "source", json_string(j->source));
        json_object_set_new(pm, "converter", json_string("vlafeed convert --to wds"));
        json_object_set_new(pm, "vlafeed_version", json_string(vf_version()));
        json_object_set_new(pm, "options", json_incref(options));
        json_object_set_new(pm, "seed", json_integer((json_int_t)j->s->seed));
        json_object_set_new(pm, "total_samples", json_integer((json_int_t)j->N));
        json_object_set_new(pm, "total_potential_samples", json_integer((json_int_t)j->N));
        json_object_set_new(pm, "padding_samples_filtered", json_integer(0));
        json_object_set_new(pm, "still_samples_filtered", json_integer(0));
        json_object_set_new(pm, "num_episodes", json_integer((json_int_t)j->num_eps));
        json_object_set_new(pm, "num_shards", json_integer((json_int_t)j->num_shards));
        json_t *shards = json_array();
        for (uint64_t s = 0; s < j->num_shards; s++) {
            char stem[32];
            snprintf(stem, sizeof stem, "shard_%06llu", (unsigned long long)s);
            json_array_append_new(shards, json_pack("{ss sI sI sI}", "shard", stem, "num_sequences",
                                                    (json_int_t)shard_samples(j, s), "bytes",
                                                    (json_int_t)j->shard_bytes[s], "crc32",
                                                    (json_int_t)j->shard_crc[s]));
        }
        json_object_set_new(pm, "shards", shards);
        r = write_json_file(j->shards_dir, "processing_metadata.json", pm, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(pm);
    }
    return r;
}

static void remove_state_dir(const char *dir)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return;
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *p = vf_path_join(dir, de->d_name);
        if (p)
            unlink(p);
        free(p);
    }
    closedir(dh);
    rmdir(dir);
}

/* Verifies the shards of a complete conversion against its metadata. */
static int verify_complete(cv_job *j, json_t *pm)
{
    json_t *shards = json_object_get(pm, "shards");
    if (!json_is_array(shards) || json_array_size(shards) != j->num_shards)
        return vf_error(VF_ECORRUPT, "%s/processing_metadata.json: shard list does not match the plan", j->shards_dir);
    size_t i;
    json_t *s;
    json_array_foreach(shards, i, s) {
        char *path = shard_path(j, i, 0);
        uint64_t bytes = 0;
        uint32_t crc = 0;
        int r = path ? vf_cv_file_crc(path, &bytes, &crc) : VF_ENOMEM;
        if (r == 0 && (bytes != (uint64_t)json_integer_value(json_object_get(s, "bytes")) ||
                       crc != (uint32_t)json_integer_value(json_object_get(s, "crc32"))))
            r = vf_error(VF_ECORRUPT, "%s: size or CRC-32 differs from processing_metadata.json (changed since the "
                         "conversion); remove %s and convert again", path, j->shards_dir);
        free(path);
        if (r < 0)
            return r;
        j->shard_bytes[i] = bytes;
    }
    return 0;
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

static int plan(cv_job *j)
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

    /* cameras */
    size_t ncam_all = vf_dataset_num_cameras(d);
    j->cams = vf_calloc(ncam_all + 1, sizeof *j->cams);
    if (!j->cams)
        return VF_ENOMEM;
    for (size_t c = 0; c < ncam_all; c++) {
        const vf_camera *cam = vf_dataset_camera(d, c);
        int wanted = 0;
        if (s->cameras) {
            for (size_t i = 0; i < s->num_cameras; i++) {
                const char *short_name = cam->key;
                if (!strncmp(short_name, "observation.images.", 19))
                    short_name += 19;
                wanted |= !strcmp(s->cameras[i], cam->key) || !strcmp(s->cameras[i], short_name);
            }
            if (wanted && cam->is_depth)
                return vf_error(VF_EUNSUPPORTED, "camera %s is a depth map: depth images are not converted", cam->key);
        } else {
            wanted = !cam->is_depth;
        }
        if (!wanted)
            continue;
        cv_camera *cc = &j->cams[j->num_cams++];
        cc->index = c;
        cc->key = cam->key;
        cc->name = vf_strdup(!strncmp(cam->key, "observation.images.", 19) ? cam->key + 19 : cam->key);
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
    size_t nfeat = vf_dataset_num_features(d);
    j->fields = vf_calloc(nfeat + 1, sizeof *j->fields);
    if (!j->fields)
        return VF_ENOMEM;
    for (size_t i = 0; i < nfeat; i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        int meta = -1;
        for (int m = 0; m < NUM_META; m++)
            if (!strcmp(f->name, META_COLUMNS[m]))
                meta = m;
        if (meta >= 0) {
            if (vf_ds_feature_value_type(f) == VF_DS_F32 || vf_ds_feature_value_type(f) == VF_DS_I64)
                j->meta[meta] = f;
            continue;
        }
        if (f->kind != VF_FEATURE_VECTOR && f->kind != VF_FEATURE_SCALAR)
            continue;
        size_t elem = 0;
        const char *descr = dtype_descr(f->type, &elem);
        if (!descr || f->ndim > 3)
            continue;
        cv_field *fd = &j->fields[j->num_fields++];
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
        cv_unit *u = &j->units[j->num_units++];
        u->kind = UNIT_LOWDIM;
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
            cv_unit *u = &j->units[j->num_units++];
            u->kind = UNIT_VIDEO;
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

static char *summary_json(cv_job *j, double seconds, int already_complete)
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

static int run_pool(cv_job *j, vf_thread_pool *pool, int assemble)
{
    size_t n = assemble ? j->num_buckets : j->num_units;
    void *args = assemble ? (void *)vf_calloc(n ? n : 1, sizeof(bucket_arg)) : (void *)vf_calloc(n ? n : 1, sizeof(unit_arg));
    if (!args)
        return VF_ENOMEM;
    int r = 0;
    /* video units first: they are the long ones */
    for (size_t pass = 0; pass < 2 && !assemble; pass++)
        for (size_t i = 0; i < n && r == 0; i++) {
            cv_unit *u = &j->units[i];
            if ((pass == 0) != (u->kind == UNIT_VIDEO) || u->done_run)
                continue;
            unit_arg *a = &((unit_arg *)args)[i];
            a->j = j;
            a->unit = (uint32_t)i;
            r = vf_thread_pool_submit(pool, unit_job, a);
        }
    for (size_t i = 0; i < n && r == 0 && assemble; i++) {
        bucket_arg *a = &((bucket_arg *)args)[i];
        a->j = j;
        a->bucket = i;
        r = vf_thread_pool_submit(pool, bucket_job, a);
    }
    if (r < 0)
        job_fail(j, r);
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
    cv_job job;
    memset(&job, 0, sizeof job);
    cv_job *j = &job;
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
        options = options_json(j);
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
            r = compare_options(j->shards_dir, json_object_get(pm, "options"), options);
        if (r == 0)
            r = verify_complete(j, pm);
        if (r == 0)
            already_complete = 1;
    } else if (r == 0 && vf_file_exists(opt_path)) {
        json_error_t jerr;
        json_t *saved = json_load_file(opt_path, 0, &jerr);
        if (!saved)
            r = vf_error(VF_ECORRUPT, "%s: %s", opt_path, jerr.text);
        if (r == 0)
            r = compare_options(j->shards_dir, saved, options);
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
            r = text ? write_atomic(opt_path, text, strlen(text)) : VF_ENOMEM;
            free(text);
        }
        if (r == 0) { /* one converter per output at a time */
            char *lock_path = state_path(j, "lock");
            j->lock_fd = lock_path ? open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
            if (j->lock_fd < 0)
                r = vf_error(VF_EIO, "%s: cannot create: %s", lock_path ? lock_path : j->state_dir, strerror(errno));
            else if (flock(j->lock_fd, LOCK_EX | LOCK_NB) < 0)
                r = vf_error(VF_EAGAIN, "%s: another vlafeed convert is writing this output now", j->shards_dir);
            free(lock_path);
        }
        if (r == 0)
            r = load_state(j);
        char *up = state_path(j, "units.done"), *sp = state_path(j, "shards.done");
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
            if (all_shards_done && j->units[u].kind == UNIT_VIDEO && !j->units[u].done_run)
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
            r = write_final_files(j, options);
        if (r == 0) {
            j->spill_bytes = vf_cv_spill_bytes_written(j->spill);
            vf_cv_spill_close(j->spill);
            j->spill = NULL;
            close(j->journal_units_fd);
            close(j->journal_shards_fd);
            j->journal_units_fd = j->journal_shards_fd = -1;
            remove_state_dir(j->state_dir);
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
