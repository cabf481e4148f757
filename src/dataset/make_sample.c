/*
 * make_sample.c: the synthetic LeRobot v3.0 dataset writer behind
 * `vlafeed make-sample` (see include/vlafeed/make_sample.h for the ground
 * truth it encodes).
 *
 * Write path, mirroring LeRobot's recorder (lerobot-format.md §1, §3, §8.3):
 *  - data: one row group per episode; a new data file when the estimated file
 *    size plus the episode would pass max_data_mb;
 *  - video, per camera and independently: each episode is encoded into a
 *    temporary MP4; if the camera's current file plus the new one would pass
 *    max_video_mb the episode starts a new file (from_timestamp 0), otherwise
 *    it is appended by a packet-level concatenation, and from/to timestamps
 *    are the running float sum of stream durations (which reproduces the
 *    drift of LeRobot's concatenated files);
 *  - metadata: episodes parquet (record-test column order, real per-episode
 *    stats), tasks.parquet (current writer era: `task` column), stats.json
 *    (aggregated), info.json.
 * Depends on: base, parquet (writer), video (encoder, concat, identity), jansson.
 */
#define _GNU_SOURCE
#include "vlafeed/make_sample.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "parquet/parquet.h"
#include "video/video.h"

#define CHUNKS_SIZE 1000

static const char *const task_texts[] = {
    "Pick up the red cube and place it in the bin.",
    "Push the blue block to the left edge of the table.",
    "Open the top drawer.",
    "Stack the green cup on the yellow cup.",
    "Wipe the table with the sponge.",
    "Hand the bottle to the person.",
};

void vf_make_sample_defaults(vf_make_sample_settings *s)
{
    memset(s, 0, sizeof *s);
    s->num_episodes = 8;
    s->num_cameras = 2;
    s->fps = 30;
    s->width = 320;
    s->height = 240;
    s->codec = "av1";
    s->gop = 2;
    s->crf = 30;
    s->max_video_mb = 200;
    s->max_data_mb = 100;
    s->seed = 0;
    s->min_length = 40;
    s->max_length = 100;
    s->num_tasks = 3;
    s->state_dim = 6;
    s->encoder_threads = 1;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int vf_make_sample_episode_length(const vf_make_sample_settings *s, int episode)
{
    uint64_t span = (uint64_t)(s->max_length - s->min_length + 1);
    return s->min_length + (int)(splitmix64(s->seed * 1000003ull + (uint64_t)episode) % span);
}

float vf_make_sample_state(int episode, int frame, int dim)
{
    return (float)sin(0.05 * frame + 0.3 * dim + episode);
}

float vf_make_sample_action(int episode, int frame, int dim)
{
    return vf_make_sample_state(episode, frame + 1, dim);
}

/* ---- running statistics -------------------------------------------- */

/* min/max/mean/std/count of one vector feature, per element. */
typedef struct vec_stats {
    int dim;
    int64_t count;
    double *min, *max, *sum, *sumsq;
} vec_stats;

static int vec_stats_init(vec_stats *v, int dim)
{
    memset(v, 0, sizeof *v);
    v->dim = dim;
    v->min = vf_malloc_array((size_t)dim, sizeof(double));
    v->max = vf_malloc_array((size_t)dim, sizeof(double));
    v->sum = vf_calloc((size_t)dim, sizeof(double));
    v->sumsq = vf_calloc((size_t)dim, sizeof(double));
    if (!v->min || !v->max || !v->sum || !v->sumsq)
        return VF_ENOMEM;
    for (int i = 0; i < dim; i++) {
        v->min[i] = INFINITY;
        v->max[i] = -INFINITY;
    }
    return 0;
}

static void vec_stats_add(vec_stats *v, const double *x)
{
    for (int i = 0; i < v->dim; i++) {
        v->min[i] = fmin(v->min[i], x[i]);
        v->max[i] = fmax(v->max[i], x[i]);
        v->sum[i] += x[i];
        v->sumsq[i] += x[i] * x[i];
    }
    v->count++;
}

/* Adds pre-summed moments (used for pixel channels). */
static void vec_stats_merge(vec_stats *v, const vec_stats *o)
{
    for (int i = 0; i < v->dim; i++) {
        v->min[i] = fmin(v->min[i], o->min[i]);
        v->max[i] = fmax(v->max[i], o->max[i]);
        v->sum[i] += o->sum[i];
        v->sumsq[i] += o->sumsq[i];
    }
    v->count += o->count;
}

static double vec_mean(const vec_stats *v, int i) { return v->count ? v->sum[i] / (double)v->count : 0.0; }

static double vec_std(const vec_stats *v, int i)
{
    if (!v->count)
        return 0.0;
    double m = vec_mean(v, i);
    double var = v->sumsq[i] / (double)v->count - m * m;
    return var > 0 ? sqrt(var) : 0.0;
}

static void vec_stats_free(vec_stats *v)
{
    free(v->min);
    free(v->max);
    free(v->sum);
    free(v->sumsq);
    memset(v, 0, sizeof *v);
}

/* ---- array builders for the Parquet writer ------------------------- */

/* LIST of `child_type` with a fixed number of elements per row. */
static int array_fixed_list(vf_pq_array *a, const char *name, vf_pq_type child_type, int64_t length, int per_row)
{
    memset(a, 0, sizeof *a);
    a->type = VF_PQ_T_LIST;
    a->length = length;
    a->name = vf_strdup(name);
    a->offsets = vf_malloc_array((size_t)length + 1, sizeof(int64_t));
    a->children = vf_calloc(1, sizeof(vf_pq_array));
    if (!a->name || !a->offsets || !a->children)
        return VF_ENOMEM;
    a->num_children = 1;
    for (int64_t i = 0; i <= length; i++)
        a->offsets[i] = i * per_row;
    return vf_pq_array_init_scalar(&a->children[0], "element", child_type, length * per_row);
}

/* list<list<list<double>>> of shape (channels, 1, 1) per row: image stats. */
static int array_image_stat(vf_pq_array *a, const char *name, int64_t length, int channels, double **values_out)
{
    int r = array_fixed_list(a, name, VF_PQ_T_LIST, length, channels);
    if (r < 0)
        return r;
    vf_pq_array *mid = &a->children[0];
    free(mid->values);
    mid->values = NULL;
    mid->type = VF_PQ_T_LIST;
    mid->offsets = vf_malloc_array((size_t)mid->length + 1, sizeof(int64_t));
    mid->children = vf_calloc(1, sizeof(vf_pq_array));
    if (!mid->offsets || !mid->children)
        return VF_ENOMEM;
    mid->num_children = 1;
    for (int64_t i = 0; i <= mid->length; i++)
        mid->offsets[i] = i;
    r = array_fixed_list(&mid->children[0], "element", VF_PQ_T_DOUBLE, mid->length, 1);
    if (r < 0)
        return r;
    *values_out = mid->children[0].children[0].values;
    return 0;
}

/* ---- the writer state ---------------------------------------------- */

typedef struct camera_file {
    int chunk_index, file_index;
    char *path;            /* current file, NULL before the first episode */
    double end_timestamp;  /* to_timestamp of the last episode in it */
} camera_file;

typedef struct episode_row {
    int64_t length, from_index, to_index;
    int data_chunk, data_file;
    int *video_chunk, *video_file;   /* per camera */
    double *from_ts, *to_ts;         /* per camera */
    vec_stats state, action;
    vec_stats *pixels;               /* per camera, 3 channels in [0,1] */
} episode_row;

typedef struct writer {
    const vf_make_sample_settings *s;
    const char *root;
    char **camera_keys;
    episode_row *episodes;
    int64_t total_frames;
    int done_steps, total_steps;
} writer;

static void progress(writer *w, const char *what)
{
    w->done_steps++;
    if (w->s->progress)
        w->s->progress(w->s->progress_ctx, w->done_steps, w->total_steps, what);
}

static char *data_rel_path(int chunk, int file)
{
    return vf_asprintf("data/chunk-%03d/file-%03d.parquet", chunk, file);
}

static char *video_rel_path(const char *key, int chunk, int file)
{
    return vf_asprintf("videos/%s/chunk-%03d/file-%03d.mp4", key, chunk, file);
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

static void next_file(int *chunk, int *file)
{
    if (*file == CHUNKS_SIZE - 1) {
        (*chunk)++;
        *file = 0;
    } else {
        (*file)++;
    }
}

/* ---- data parquet ---------------------------------------------------- */

static int data_kv_features(const vf_make_sample_settings *s, char **out)
{
    json_t *features = json_object();
    const char *vectors[] = {"action", "observation.state"};
    for (int i = 0; i < 2; i++) {
        json_object_set_new(features, vectors[i],
                            json_pack("{s:{s:s,s:s},s:i,s:s}", "feature", "dtype", "float32", "_type", "Value",
                                      "length", s->state_dim, "_type", "List"));
    }
    json_object_set_new(features, "timestamp", json_pack("{s:s,s:s}", "dtype", "float32", "_type", "Value"));
    const char *ints[] = {"frame_index", "episode_index", "index", "task_index"};
    for (int i = 0; i < 4; i++)
        json_object_set_new(features, ints[i], json_pack("{s:s,s:s}", "dtype", "int64", "_type", "Value"));
    json_t *root = json_pack("{s:{s:o}}", "info", "features", features);
    *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return *out ? 0 : vf_error(VF_ENOMEM, "out of memory building huggingface metadata");
}

static int write_episode_rows(vf_pq_writer *pw, writer *w, int e)
{
    const vf_make_sample_settings *s = w->s;
    episode_row *ep = &w->episodes[e];
    int64_t n = ep->length;
    int dim = s->state_dim;
    vf_pq_array cols[7];
    memset(cols, 0, sizeof cols);
    int r = 0;
    if ((r = array_fixed_list(&cols[0], "action", VF_PQ_T_FLOAT, n, dim)) < 0 ||
        (r = array_fixed_list(&cols[1], "observation.state", VF_PQ_T_FLOAT, n, dim)) < 0 ||
        (r = vf_pq_array_init_scalar(&cols[2], "timestamp", VF_PQ_T_FLOAT, n)) < 0 ||
        (r = vf_pq_array_init_scalar(&cols[3], "frame_index", VF_PQ_T_INT64, n)) < 0 ||
        (r = vf_pq_array_init_scalar(&cols[4], "episode_index", VF_PQ_T_INT64, n)) < 0 ||
        (r = vf_pq_array_init_scalar(&cols[5], "index", VF_PQ_T_INT64, n)) < 0 ||
        (r = vf_pq_array_init_scalar(&cols[6], "task_index", VF_PQ_T_INT64, n)) < 0)
        goto done;
    float *action = cols[0].children[0].values, *state = cols[1].children[0].values;
    float *timestamp = cols[2].values;
    int64_t *frame_index = cols[3].values, *episode_index = cols[4].values, *index = cols[5].values,
            *task_index = cols[6].values;
    double *tmp = vf_malloc_array((size_t)dim * 2, sizeof(double));
    if (!tmp) {
        r = VF_ENOMEM;
        goto done;
    }
    for (int64_t k = 0; k < n; k++) {
        for (int d = 0; d < dim; d++) {
            action[k * dim + d] = vf_make_sample_action(e, (int)k, d);
            state[k * dim + d] = vf_make_sample_state(e, (int)k, d);
            tmp[d] = action[k * dim + d];
            tmp[dim + d] = state[k * dim + d];
        }
        vec_stats_add(&ep->action, tmp);
        vec_stats_add(&ep->state, tmp + dim);
        timestamp[k] = (float)((double)k / (double)s->fps);
        frame_index[k] = k;
        episode_index[k] = e;
        index[k] = ep->from_index + k;
        task_index[k] = e % s->num_tasks;
    }
    free(tmp);
    r = vf_pq_writer_write_row_group(pw, cols, 7);
done:
    vf_pq_arrays_free(cols, 7);
    return r;
}

static int write_data(writer *w)
{
    const vf_make_sample_settings *s = w->s;
    char *kv = NULL;
    int r = data_kv_features(s, &kv);
    if (r < 0)
        return r;
    vf_pq_writer_settings ps;
    vf_pq_writer_defaults(&ps);
    vf_pq_writer *pw = NULL;
    int chunk = 0, file = 0;
    double file_bytes = 0;
    const double bytes_per_row = 2.0 * s->state_dim * 4 + 4 + 4 * 8; /* uncompressed estimate */
    for (int e = 0; e < s->num_episodes && r == 0; e++) {
        double episode_bytes = bytes_per_row * (double)w->episodes[e].length;
        if (pw && file_bytes + episode_bytes >= s->max_data_mb * 1024 * 1024) {
            r = vf_pq_writer_close(pw);
            pw = NULL;
            next_file(&chunk, &file);
            file_bytes = 0;
            if (r < 0)
                break;
        }
        if (!pw) {
            char *rel = data_rel_path(chunk, file);
            char *path = rel ? vf_path_join(w->root, rel) : NULL;
            r = path ? ensure_parent(path) : VF_ENOMEM;
            if (r == 0)
                r = vf_pq_writer_open(&pw, path, &ps);
            if (r == 0)
                r = vf_pq_writer_add_kv(pw, "huggingface", kv);
            free(rel);
            free(path);
            if (r < 0)
                break;
        }
        w->episodes[e].data_chunk = chunk;
        w->episodes[e].data_file = file;
        r = write_episode_rows(pw, w, e);
        file_bytes += episode_bytes;
        progress(w, "data");
    }
    if (pw) {
        if (r == 0)
            r = vf_pq_writer_close(pw);
        else
            vf_pq_writer_abort(pw);
    }
    free(kv);
    return r;
}

/* ---- video ------------------------------------------------------------ */

typedef struct fill_ctx {
    const vf_make_sample_settings *s;
    int episode, camera;
    vec_stats *pixels; /* accumulates per-channel moments in [0,1] */
} fill_ctx;

/* Paints frame k: a smooth gradient that moves with k and differs per camera,
 * then the identity blocks. */
static int fill_frame(void *opaque, int64_t frame, uint8_t *rgb, size_t stride)
{
    fill_ctx *c = opaque;
    int w = c->s->width, h = c->s->height;
    int k = (int)frame;
    /* Scene: moving gradients plus low-amplitude texture, so the encoder
     * and decoder do work comparable to camera footage. */
    for (int y = 0; y < h; y++) {
        uint8_t *row = rgb + (size_t)y * stride;
        for (int x = 0; x < w; x++) {
            uint32_t noise = (uint32_t)vf_mix64(((uint64_t)x << 40) ^ ((uint64_t)y << 20) ^ (uint64_t)k) & 15;
            row[3 * x + 0] = (uint8_t)((x * 255 / (w > 1 ? w - 1 : 1) + 3 * k + (int)noise) & 0xff);
            row[3 * x + 1] = (uint8_t)((y * 255 / (h > 1 ? h - 1 : 1) + 40 * c->camera + (int)noise) & 0xff);
            row[3 * x + 2] = (uint8_t)((128 + 2 * k + 30 * c->episode + (int)noise) & 0xff);
        }
    }
    /* The identity fills the top half of frames at least 128 px high (the
     * whole frame below that, where it needs every pixel to survive). */
    int stamp_h = h >= 128 ? h / 2 : h;
    int r = vf_video_stamp_identity(rgb, w, stamp_h, stride, c->episode, k, c->camera);
    if (r < 0)
        return r;
    /* Pixel statistics over every 8th row and column (a sample, like LeRobot's). */
    vec_stats sampled;
    if (vec_stats_init(&sampled, 3) < 0) {
        vec_stats_free(&sampled);
        return VF_ENOMEM;
    }
    for (int y = 0; y < h; y += 8) {
        const uint8_t *row = rgb + (size_t)y * (size_t)stride;
        for (int x = 0; x < w; x += 8) {
            double px[3] = {row[3 * x] / 255.0, row[3 * x + 1] / 255.0, row[3 * x + 2] / 255.0};
            vec_stats_add(&sampled, px);
        }
    }
    vec_stats_merge(c->pixels, &sampled);
    vec_stats_free(&sampled);
    return 0;
}

static int64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
}

static int write_camera(writer *w, int camera)
{
    const vf_make_sample_settings *s = w->s;
    const char *key = w->camera_keys[camera];
    camera_file cf = {0, 0, NULL, 0.0};
    char *tmp_dir = vf_path_join(w->root, ".vlafeed-tmp");
    char *episode_mp4 = tmp_dir ? vf_asprintf("%s/%s-episode.mp4", tmp_dir, key) : NULL;
    int r = episode_mp4 ? vf_mkdirs(tmp_dir) : VF_ENOMEM;

    vf_video_encode_settings es;
    vf_video_encode_defaults(&es);
    es.codec = !strcmp(s->codec, "h264") ? VF_VIDEO_CODEC_H264
               : !strcmp(s->codec, "hevc") ? VF_VIDEO_CODEC_HEVC
                                           : VF_VIDEO_CODEC_AV1;
    es.fps = s->fps;
    es.width = s->width;
    es.height = s->height;
    es.gop = s->gop;
    es.crf = s->crf;
    es.threads = s->encoder_threads;

    for (int e = 0; e < s->num_episodes && r == 0; e++) {
        episode_row *ep = &w->episodes[e];
        fill_ctx fc = {s, e, camera, &ep->pixels[camera]};
        r = vf_video_write_episode(episode_mp4, &es, ep->length, fill_frame, &fc);
        if (r < 0) {
            r = vf_error_context(r, "make-sample: camera %s, episode %d", key, e);
            break;
        }
        double duration = 0;
        if ((r = vf_video_stream_duration(episode_mp4, &duration)) < 0)
            break;
        int64_t new_size = file_size(episode_mp4);
        int rollover = cf.path && (double)(file_size(cf.path) + new_size) >= s->max_video_mb * 1024 * 1024;
        if (!cf.path || rollover) {
            if (cf.path)
                next_file(&cf.chunk_index, &cf.file_index);
            free(cf.path);
            char *rel = video_rel_path(key, cf.chunk_index, cf.file_index);
            cf.path = rel ? vf_path_join(w->root, rel) : NULL;
            free(rel);
            if (!cf.path || (r = ensure_parent(cf.path)) < 0) {
                r = r < 0 ? r : VF_ENOMEM;
                break;
            }
            if (rename(episode_mp4, cf.path) < 0) {
                r = vf_error(VF_EIO, "%s: cannot move episode video into place", cf.path);
                break;
            }
            cf.end_timestamp = 0.0;
        } else {
            /* LeRobot's concatenate_video_files([current, new], current) */
            const char *inputs[2] = {cf.path, episode_mp4};
            if ((r = vf_video_concat(inputs, 2, cf.path)) < 0)
                break;
            unlink(episode_mp4);
        }
        ep->video_chunk[camera] = cf.chunk_index;
        ep->video_file[camera] = cf.file_index;
        ep->from_ts[camera] = cf.end_timestamp;
        ep->to_ts[camera] = cf.end_timestamp + duration;
        cf.end_timestamp = ep->to_ts[camera];
        progress(w, key);
    }
    if (tmp_dir) {
        if (episode_mp4)
            unlink(episode_mp4);
        rmdir(tmp_dir);
    }
    free(cf.path);
    free(episode_mp4);
    free(tmp_dir);
    return r;
}

/* ---- metadata --------------------------------------------------------- */

static const char *const default_int_features[] = {"frame_index", "episode_index", "index", "task_index"};

/* stats/<feature>/{min,max,mean,std,count} columns for one vector feature. */
static int add_vector_stat_columns(vf_pq_array *cols, int *n, const char *feature, int dim, int64_t rows,
                                   const vec_stats *const *per_episode, int integer_minmax)
{
    static const char *const names[] = {"min", "max", "mean", "std"};
    for (int k = 0; k < 4; k++) {
        char *name = vf_asprintf("stats/%s/%s", feature, names[k]);
        vf_pq_type t = (integer_minmax && k < 2) ? VF_PQ_T_INT64 : VF_PQ_T_DOUBLE;
        int r = name ? array_fixed_list(&cols[*n], name, t, rows, dim) : VF_ENOMEM;
        free(name);
        if (r < 0)
            return r;
        for (int64_t e = 0; e < rows; e++) {
            const vec_stats *v = per_episode[e];
            for (int d = 0; d < dim; d++) {
                double x = k == 0 ? v->min[d] : k == 1 ? v->max[d] : k == 2 ? vec_mean(v, d) : vec_std(v, d);
                if (t == VF_PQ_T_INT64)
                    ((int64_t *)cols[*n].children[0].values)[e * dim + d] = (int64_t)x;
                else
                    ((double *)cols[*n].children[0].values)[e * dim + d] = x;
            }
        }
        (*n)++;
    }
    char *name = vf_asprintf("stats/%s/count", feature);
    int r = name ? array_fixed_list(&cols[*n], name, VF_PQ_T_INT64, rows, 1) : VF_ENOMEM;
    free(name);
    if (r < 0)
        return r;
    for (int64_t e = 0; e < rows; e++)
        ((int64_t *)cols[*n].children[0].values)[e] = per_episode[e]->count;
    (*n)++;
    return 0;
}

static int scalar_episode_stats(const writer *w, int which, vec_stats *out)
{
    const vf_make_sample_settings *s = w->s;
    for (int e = 0; e < s->num_episodes; e++) {
        if (vec_stats_init(&out[e], 1) < 0)
            return VF_ENOMEM;
        const episode_row *ep = &w->episodes[e];
        for (int64_t k = 0; k < ep->length; k++) {
            double x = which == 0   ? (double)(float)((double)k / s->fps)
                       : which == 1 ? (double)k
                       : which == 2 ? (double)e
                       : which == 3 ? (double)(ep->from_index + k)
                                    : (double)(e % s->num_tasks);
            vec_stats_add(&out[e], &x);
        }
    }
    return 0;
}

static int write_episodes_meta(writer *w)
{
    const vf_make_sample_settings *s = w->s;
    int64_t rows = s->num_episodes;
    int ncams = s->num_cameras;
    int max_cols = 9 + 4 * ncams + 5 * (2 + 5) + 5 * ncams + 2;
    vf_pq_array *cols = vf_calloc((size_t)max_cols, sizeof *cols);
    vec_stats *scalars = vf_calloc((size_t)rows * 5, sizeof *scalars);
    const vec_stats **per_episode = vf_calloc((size_t)rows, sizeof *per_episode);
    if (!cols || !scalars || !per_episode) {
        free(cols);
        free(scalars);
        free(per_episode);
        return VF_ENOMEM;
    }
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
    /* tasks: list<string> with the one task of the episode */
    {
        const char **texts = vf_calloc((size_t)rows, sizeof *texts);
        if (!texts) {
            r = VF_ENOMEM;
            goto done;
        }
        for (int64_t e = 0; e < rows; e++)
            texts[e] = task_texts[e % s->num_tasks];
        cols[n].type = VF_PQ_T_LIST;
        cols[n].length = rows;
        cols[n].name = vf_strdup("tasks");
        cols[n].offsets = vf_malloc_array((size_t)rows + 1, sizeof(int64_t));
        cols[n].children = vf_calloc(1, sizeof(vf_pq_array));
        cols[n].num_children = 1;
        if (!cols[n].name || !cols[n].offsets || !cols[n].children) {
            free(texts);
            r = VF_ENOMEM;
            goto done;
        }
        for (int64_t e = 0; e <= rows; e++)
            cols[n].offsets[e] = e;
        r = vf_pq_array_init_strings(&cols[n].children[0], "element", texts, rows);
        free(texts);
        if (r < 0)
            goto done;
        n++;
    }
    const char *int_cols[] = {"length", "data/chunk_index", "data/file_index", "dataset_from_index",
                              "dataset_to_index"};
    for (int c = 0; c < 5; c++) {
        TRY(vf_pq_array_init_scalar(&cols[n], int_cols[c], VF_PQ_T_INT64, rows));
        for (int64_t e = 0; e < rows; e++) {
            const episode_row *ep = &w->episodes[e];
            int64_t v = c == 0 ? ep->length : c == 1 ? ep->data_chunk : c == 2 ? ep->data_file
                                          : c == 3 ? ep->from_index : ep->to_index;
            ((int64_t *)cols[n].values)[e] = v;
        }
        n++;
    }
    for (int cam = 0; cam < ncams; cam++) {
        const char *fields[] = {"chunk_index", "file_index", "from_timestamp", "to_timestamp"};
        for (int k = 0; k < 4; k++) {
            char *name = vf_asprintf("videos/%s/%s", w->camera_keys[cam], fields[k]);
            r = name ? vf_pq_array_init_scalar(&cols[n], name, k < 2 ? VF_PQ_T_INT64 : VF_PQ_T_DOUBLE, rows) : VF_ENOMEM;
            free(name);
            if (r < 0)
                goto done;
            for (int64_t e = 0; e < rows; e++) {
                const episode_row *ep = &w->episodes[e];
                if (k == 0)
                    ((int64_t *)cols[n].values)[e] = ep->video_chunk[cam];
                else if (k == 1)
                    ((int64_t *)cols[n].values)[e] = ep->video_file[cam];
                else
                    ((double *)cols[n].values)[e] = k == 2 ? ep->from_ts[cam] : ep->to_ts[cam];
            }
            n++;
        }
    }
    for (int64_t e = 0; e < rows; e++)
        per_episode[e] = &w->episodes[e].action;
    TRY(add_vector_stat_columns(cols, &n, "action", s->state_dim, rows, per_episode, 0));
    for (int64_t e = 0; e < rows; e++)
        per_episode[e] = &w->episodes[e].state;
    TRY(add_vector_stat_columns(cols, &n, "observation.state", s->state_dim, rows, per_episode, 0));
    for (int cam = 0; cam < ncams; cam++) {
        static const char *const names[] = {"min", "max", "mean", "std"};
        for (int k = 0; k < 4; k++) {
            char *name = vf_asprintf("stats/%s/%s", w->camera_keys[cam], names[k]);
            double *vals = NULL;
            r = name ? array_image_stat(&cols[n], name, rows, 3, &vals) : VF_ENOMEM;
            free(name);
            if (r < 0)
                goto done;
            for (int64_t e = 0; e < rows; e++) {
                const vec_stats *v = &w->episodes[e].pixels[cam];
                for (int ch = 0; ch < 3; ch++)
                    vals[e * 3 + ch] = k == 0 ? v->min[ch] : k == 1 ? v->max[ch]
                                     : k == 2 ? vec_mean(v, ch) : vec_std(v, ch);
            }
            n++;
        }
        char *name = vf_asprintf("stats/%s/count", w->camera_keys[cam]);
        r = name ? array_fixed_list(&cols[n], name, VF_PQ_T_INT64, rows, 1) : VF_ENOMEM;
        free(name);
        if (r < 0)
            goto done;
        for (int64_t e = 0; e < rows; e++)
            ((int64_t *)cols[n].children[0].values)[e] = w->episodes[e].length;
        n++;
    }
    const char *scalar_names[] = {"timestamp", "frame_index", "episode_index", "index", "task_index"};
    for (int which = 0; which < 5; which++) {
        vec_stats *per = scalars + (size_t)which * (size_t)rows;
        TRY(scalar_episode_stats(w, which, per));
        for (int64_t e = 0; e < rows; e++)
            per_episode[e] = &per[e];
        TRY(add_vector_stat_columns(cols, &n, scalar_names[which], 1, rows, per_episode, which > 0));
    }
    TRY(vf_pq_array_init_scalar(&cols[n], "meta/episodes/chunk_index", VF_PQ_T_INT64, rows));
    n++;
    TRY(vf_pq_array_init_scalar(&cols[n], "meta/episodes/file_index", VF_PQ_T_INT64, rows));
    n++;

    {
        char *path = vf_path_join(w->root, "meta/episodes/chunk-000/file-000.parquet");
        r = path ? ensure_parent(path) : VF_ENOMEM;
        if (r == 0)
            r = vf_pq_write_file(path, cols, n, NULL, NULL);
        free(path);
    }
done:
#undef TRY
    vf_pq_arrays_free(cols, n + 1 < max_cols ? n + 1 : max_cols);
    free(cols);
    for (int64_t i = 0; i < rows * 5; i++)
        vec_stats_free(&scalars[i]);
    free(scalars);
    free(per_episode);
    return r;
}

int vf_ds_write_tasks_parquet(const char *path, const char *const *tasks, size_t n)
{
    vf_pq_array cols[2];
    memset(cols, 0, sizeof cols);
    int r = vf_pq_array_init_scalar(&cols[0], "task_index", VF_PQ_T_INT64, (int64_t)n);
    if (r == 0)
        r = vf_pq_array_init_strings(&cols[1], "task", tasks, (int64_t)n);
    for (size_t i = 0; r == 0 && i < n; i++)
        ((int64_t *)cols[0].values)[i] = (int64_t)i;
    /* LeRobot writes tasks through pandas with the task string as the
     * index (named "task"); the pandas metadata says so. */
    const char *pandas =
        "{\"index_columns\": [\"task\"], \"column_indexes\": [{\"name\": null, \"field_name\": null, "
        "\"pandas_type\": \"unicode\", \"numpy_type\": \"object\", \"metadata\": {\"encoding\": "
        "\"UTF-8\"}}], \"columns\": [{\"name\": \"task_index\", \"field_name\": \"task_index\", "
        "\"pandas_type\": \"int64\", \"numpy_type\": \"int64\", \"metadata\": null}, {\"name\": "
        "\"task\", \"field_name\": \"task\", \"pandas_type\": \"unicode\", \"numpy_type\": "
        "\"object\", \"metadata\": null}], \"creator\": {\"library\": \"vlafeed\", \"version\": "
        "\"" VF_VERSION_STRING "\"}, \"pandas_version\": \"2.2.3\"}";
    if (r == 0)
        r = vf_pq_write_file(path, cols, 2, "pandas", pandas);
    vf_pq_arrays_free(cols, 2);
    return r;
}

static int write_tasks(writer *w)
{
    char *path = vf_path_join(w->root, "meta/tasks.parquet");
    int r = path ? vf_ds_write_tasks_parquet(path, task_texts, (size_t)w->s->num_tasks)
                 : VF_ENOMEM;
    free(path);
    return r;
}

/* JSON list of a vector's values, nested to (C,1,1) when image is set. */
static json_t *json_values(const double *v, int dim, int image)
{
    json_t *a = json_array();
    for (int i = 0; i < dim; i++)
        json_array_append_new(a, image ? json_pack("[[f]]", v[i]) : json_real(v[i]));
    return a;
}

static json_t *json_stats(const vec_stats *v, int image, int integer)
{
    double *buf = vf_malloc_array((size_t)v->dim * 4, sizeof(double));
    if (!buf)
        return NULL;
    for (int i = 0; i < v->dim; i++) {
        buf[i] = vec_mean(v, i);
        buf[v->dim + i] = vec_std(v, i);
    }
    json_t *o = json_object();
    json_t *mn = json_array(), *mx = json_array();
    for (int i = 0; i < v->dim; i++) {
        json_t *a = integer ? json_integer((json_int_t)v->min[i]) : json_real(v->min[i]);
        json_t *b = integer ? json_integer((json_int_t)v->max[i]) : json_real(v->max[i]);
        json_array_append_new(mn, image ? json_pack("[[o]]", a) : a);
        json_array_append_new(mx, image ? json_pack("[[o]]", b) : b);
    }
    json_object_set_new(o, "min", mn);
    json_object_set_new(o, "max", mx);
    json_object_set_new(o, "mean", json_values(buf, v->dim, image));
    json_object_set_new(o, "std", json_values(buf + v->dim, v->dim, image));
    json_object_set_new(o, "count", json_pack("[I]", (json_int_t)v->count));
    free(buf);
    return o;
}

static int write_stats(writer *w)
{
    const vf_make_sample_settings *s = w->s;
    json_t *root = json_object();
    vec_stats agg;
    int r = 0;
    const char *vectors[] = {"action", "observation.state"};
    for (int f = 0; f < 2 && r == 0; f++) {
        if ((r = vec_stats_init(&agg, s->state_dim)) == 0) {
            for (int e = 0; e < s->num_episodes; e++)
                vec_stats_merge(&agg, f == 0 ? &w->episodes[e].action : &w->episodes[e].state);
            json_object_set_new(root, vectors[f], json_stats(&agg, 0, 0));
        }
        vec_stats_free(&agg);
    }
    for (int cam = 0; cam < s->num_cameras && r == 0; cam++) {
        if ((r = vec_stats_init(&agg, 3)) == 0) {
            for (int e = 0; e < s->num_episodes; e++)
                vec_stats_merge(&agg, &w->episodes[e].pixels[cam]);
            json_object_set_new(root, w->camera_keys[cam], json_stats(&agg, 1, 0));
        }
        vec_stats_free(&agg);
    }
    const char *scalar_names[] = {"timestamp", "frame_index", "episode_index", "index", "task_index"};
    vec_stats *per = vf_calloc((size_t)s->num_episodes, sizeof *per);
    for (int which = 0; which < 5 && r == 0 && per; which++) {
        r = scalar_episode_stats(w, which, per);
        if (r == 0 && (r = vec_stats_init(&agg, 1)) == 0) {
            for (int e = 0; e < s->num_episodes; e++)
                vec_stats_merge(&agg, &per[e]);
            json_object_set_new(root, scalar_names[which], json_stats(&agg, 0, which > 0));
        }
        vec_stats_free(&agg);
        for (int e = 0; e < s->num_episodes; e++)
            vec_stats_free(&per[e]);
    }
    if (!per)
        r = VF_ENOMEM;
    free(per);
    char *path = vf_path_join(w->root, "meta/stats.json");
    if (r == 0 && (!path || json_dump_file(root, path, JSON_INDENT(4)) != 0))
        r = vf_error(VF_EIO, "%s: cannot write", path ? path : "meta/stats.json");
    free(path);
    json_decref(root);
    return r;
}

static json_t *names_list(const char *prefix, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%d", prefix, i);
        json_array_append_new(a, json_string(name));
    }
    return a;
}

static int write_info(writer *w)
{
    const vf_make_sample_settings *s = w->s;
    json_t *features = json_object();
    json_object_set_new(features, "action",
                        json_pack("{s:s,s:[i],s:o}", "dtype", "float32", "shape", s->state_dim, "names",
                                  names_list("joint_", s->state_dim)));
    json_object_set_new(features, "observation.state",
                        json_pack("{s:s,s:[i],s:o}", "dtype", "float32", "shape", s->state_dim, "names",
                                  names_list("joint_", s->state_dim)));
    const char *codec_name = !strcmp(s->codec, "h264") ? "h264" : !strcmp(s->codec, "hevc") ? "hevc" : "av1";
    for (int cam = 0; cam < s->num_cameras; cam++) {
        json_t *info = json_pack("{s:i,s:i,s:s,s:s,s:b,s:i,s:i,s:b,s:i,s:i}", "video.height", s->height,
                                 "video.width", s->width, "video.codec", codec_name, "video.pix_fmt", "yuv420p",
                                 "video.is_depth_map", 0, "video.fps", s->fps, "video.channels", 3, "has_audio", 0,
                                 "video.g", s->gop, "video.crf", s->crf);
        json_object_set_new(features, w->camera_keys[cam],
                            json_pack("{s:s,s:[i,i,i],s:[s,s,s],s:o}", "dtype", "video", "shape", s->height,
                                      s->width, 3, "names", "height", "width", "channels", "info", info));
    }
    json_object_set_new(features, "timestamp", json_pack("{s:s,s:[i],s:n}", "dtype", "float32", "shape", 1, "names"));
    for (int i = 0; i < 4; i++)
        json_object_set_new(features, default_int_features[i],
                            json_pack("{s:s,s:[i],s:n}", "dtype", "int64", "shape", 1, "names"));
    char split[64];
    snprintf(split, sizeof split, "0:%d", s->num_episodes);
    json_t *root = json_pack(
        "{s:s,s:s,s:i,s:I,s:i,s:i,s:i,s:i,s:i,s:s,s:s,s:{s:s},s:o}", "codebase_version", "v3.0", "robot_type",
        "vlafeed_synthetic", "total_episodes", s->num_episodes, "total_frames", (json_int_t)w->total_frames,
        "total_tasks", s->num_tasks, "chunks_size", CHUNKS_SIZE, "data_files_size_in_mb",
        (int)ceil(s->max_data_mb), "video_files_size_in_mb", (int)ceil(s->max_video_mb), "fps", s->fps,
        "data_path", "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "video_path",
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4", "splits", "train", split,
        "features", features);
    char *path = vf_path_join(w->root, "meta/info.json");
    int r = 0;
    if (!root || !path || json_dump_file(root, path, JSON_INDENT(4)) != 0)
        r = vf_error(VF_EIO, "%s: cannot write", path ? path : "meta/info.json");
    free(path);
    json_decref(root);
    return r;
}

/* ---- entry point ------------------------------------------------------ */

static int check_settings(const vf_make_sample_settings *s)
{
    if (s->num_episodes < 1 || s->num_episodes > 1000000)
        return vf_error(VF_EINVAL, "make-sample: --episodes must be 1..1000000 (got %d)", s->num_episodes);
    if (s->num_cameras < 0 || s->num_cameras > 16)
        return vf_error(VF_EINVAL, "make-sample: --cameras must be 0..16 (got %d)", s->num_cameras);
    if (s->fps < 1 || s->fps > 1000)
        return vf_error(VF_EINVAL, "make-sample: --fps must be 1..1000 (got %d)", s->fps);
    if (s->width < 16 || s->height < 16 || s->width > 8192 || s->height > 8192 || (s->width & 1) || (s->height & 1))
        return vf_error(VF_EINVAL, "make-sample: --size must be even and 16..8192 per side (got %dx%d)", s->width,
                        s->height);
    if (!s->codec || (strcmp(s->codec, "av1") && strcmp(s->codec, "h264") && strcmp(s->codec, "hevc")))
        return vf_error(VF_EINVAL, "make-sample: --codec must be av1, h264 or hevc (got %s)",
                        s->codec ? s->codec : "(null)");
    if (!strcmp(s->codec, "av1") && s->height < 64)
        return vf_error(VF_EINVAL, "make-sample: SVT-AV1 refuses frames under 64 px high (got %d)", s->height);
    if (s->min_length < 1 || s->max_length < s->min_length || s->max_length > 1000000)
        return vf_error(VF_EINVAL, "make-sample: episode lengths must satisfy 1 <= min <= max (got %d..%d)",
                        s->min_length, s->max_length);
    if (s->num_tasks < 1 || s->num_tasks > (int)VF_ARRAY_LEN(task_texts))
        return vf_error(VF_EINVAL, "make-sample: tasks must be 1..%d", (int)VF_ARRAY_LEN(task_texts));
    if (s->state_dim < 1 || s->state_dim > 4096)
        return vf_error(VF_EINVAL, "make-sample: state dimension must be 1..4096");
    if (s->gop < 1 || s->crf < 0 || s->crf > 63 || !(s->max_video_mb > 0) || !(s->max_data_mb > 0))
        return vf_error(VF_EINVAL, "make-sample: --gop must be >= 1, --crf 0..63, file sizes > 0");
    return 0;
}

int vf_make_sample(const char *out_dir, const vf_make_sample_settings *s)
{
    int r = check_settings(s);
    if (r < 0)
        return r;
    char *info_path = vf_path_join(out_dir, "meta/info.json");
    if (!info_path)
        return VF_ENOMEM;
    int exists = vf_file_exists(info_path);
    free(info_path);
    if (exists)
        return vf_error(VF_EINVAL, "%s: already holds a dataset (meta/info.json exists); choose a new folder",
                        out_dir);
    if ((r = vf_mkdirs(out_dir)) < 0)
        return r;

    writer w = {0};
    w.s = s;
    w.root = out_dir;
    w.total_steps = s->num_episodes * (1 + s->num_cameras);
    w.camera_keys = vf_calloc((size_t)(s->num_cameras ? s->num_cameras : 1), sizeof(char *));
    w.episodes = vf_calloc((size_t)s->num_episodes, sizeof(episode_row));
    if (!w.camera_keys || !w.episodes) {
        r = VF_ENOMEM;
        goto done;
    }
    for (int c = 0; c < s->num_cameras; c++)
        if (!(w.camera_keys[c] = vf_asprintf("observation.images.cam%d", c))) {
            r = VF_ENOMEM;
            goto done;
        }
    int64_t index = 0;
    for (int e = 0; e < s->num_episodes; e++) {
        episode_row *ep = &w.episodes[e];
        ep->length = vf_make_sample_episode_length(s, e);
        ep->from_index = index;
        index += ep->length;
        ep->to_index = index;
        size_t nc = (size_t)(s->num_cameras ? s->num_cameras : 1);
        ep->video_chunk = vf_calloc(nc, sizeof(int));
        ep->video_file = vf_calloc(nc, sizeof(int));
        ep->from_ts = vf_calloc(nc, sizeof(double));
        ep->to_ts = vf_calloc(nc, sizeof(double));
        ep->pixels = vf_calloc(nc, sizeof(vec_stats));
        if (!ep->video_chunk || !ep->video_file || !ep->from_ts || !ep->to_ts || !ep->pixels ||
            vec_stats_init(&ep->state, s->state_dim) < 0 || vec_stats_init(&ep->action, s->state_dim) < 0) {
            r = VF_ENOMEM;
            goto done;
        }
        for (int c = 0; c < s->num_cameras; c++)
            if (vec_stats_init(&ep->pixels[c], 3) < 0) {
                r = VF_ENOMEM;
                goto done;
            }
    }
    w.total_frames = index;

    if ((r = write_data(&w)) < 0)
        goto done;
    for (int c = 0; c < s->num_cameras; c++)
        if ((r = write_camera(&w, c)) < 0)
            goto done;
    if ((r = write_episodes_meta(&w)) < 0 || (r = write_tasks(&w)) < 0 || (r = write_stats(&w)) < 0 ||
        (r = write_info(&w)) < 0)
        goto done;
done:
    if (w.episodes) {
        for (int e = 0; e < s->num_episodes; e++) {
            episode_row *ep = &w.episodes[e];
            free(ep->video_chunk);
            free(ep->video_file);
            free(ep->from_ts);
            free(ep->to_ts);
            vec_stats_free(&ep->state);
            vec_stats_free(&ep->action);
            if (ep->pixels)
                for (int c = 0; c < s->num_cameras; c++)
                    vec_stats_free(&ep->pixels[c]);
            free(ep->pixels);
        }
    }
    if (w.camera_keys)
        for (int c = 0; c < s->num_cameras; c++)
            free(w.camera_keys[c]);
    free(w.camera_keys);
    free(w.episodes);
    if (r < 0)
        vf_error_context(r, "make-sample %s", out_dir);
    return r;
}
