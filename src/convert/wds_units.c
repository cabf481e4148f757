/*
 * wds_units.c: the units of work of vf_wds_convert, run on the job's
 * thread pool, each writing records into the spill bucket of their shards.
 *
 *  - A lowdim unit reads a slice of episodes' numeric columns (at most
 *    LOWDIM_UNIT_ROWS rows, whole episodes) and writes every sample's
 *    lowdim.npz (each field's window of past + 1 + future rows, edges
 *    clamped, with past/future masks), metadata.json and
 *    language_instructions.json; it also accumulates the fields' statistics
 *    over valid entries (Welford), saved per unit for wds_output.c to merge.
 *  - A video unit is one camera file: it decodes forward, once, exactly the
 *    frames some sample uses (vf_video_read_frames over ascending
 *    ordinals), JPEG-encodes each once and writes a record for every
 *    (sample, image offset) that uses it (several at episode edges, where
 *    windows clip).
 *
 * A unit counts as done only once its journal line is written; a unit that
 * stops early (another one failed) writes nothing to the journal, and its
 * spill records are ignored by the assembly.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "convert/wds_internal.h"

#define DECODE_BATCH 16

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

static void store_value(const vf_cv_field *f, const vf_ds_column *c, int64_t row, int64_t k, uint8_t *dest)
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

int vf_cv_stats_alloc(const vf_cv_job *j, vf_cv_stats *st)
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

void vf_cv_stats_free(const vf_cv_job *j, vf_cv_stats *st)
{
    double **arrays[] = {st->count, st->mean, st->m2, st->min, st->max};
    for (size_t a = 0; a < 5; a++) {
        for (size_t f = 0; arrays[a] && f < j->num_fields; f++)
            free(arrays[a][f]);
        free(arrays[a]);
    }
    memset(st, 0, sizeof *st);
}

static int run_lowdim_unit(vf_cv_job *j, uint32_t unit_id)
{
    const vf_cv_unit *u = &j->units[unit_id];
    size_t ncols = j->num_fields + VF_CV_NUM_META;
    const char **names = vf_calloc(ncols, sizeof *names);
    size_t *positions = vf_calloc(u->count, sizeof *positions);
    int meta_col[VF_CV_NUM_META];
    size_t n = 0;
    for (size_t f = 0; f < j->num_fields && names; f++)
        names[n++] = j->fields[f].feature->name;
    for (int m = 0; m < VF_CV_NUM_META && names; m++) {
        meta_col[m] = j->meta[m] ? (int)n : -1;
        if (j->meta[m])
            names[n++] = j->meta[m]->name;
    }
    for (size_t i = 0; i < u->count && positions; i++)
        positions[i] = j->eps[u->first + i].pos;
    vf_ds_table table;
    memset(&table, 0, sizeof table);
    vf_cv_stats st;
    int r = names && positions ? 0 : VF_ENOMEM;
    if (r == 0)
        r = vf_ds_read_table(j->d, positions, u->count, names, n, VF_DS_VERIFY_INDEX, &table);
    if (r == 0)
        r = vf_cv_stats_alloc(j, &st);
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
        const vf_cv_episode *e = &j->eps[u->first + i];
        int64_t row0 = table.episode_start[i], L = e->length;
        for (int64_t t = 0; t < L && r == 0; t++) {
            for (int w = 0; w < j->T; w++) {
                int64_t src = t - j->past + w;
                int padded = src < 0 || src >= L;
                past_mask[w] = w < j->past && !padded;
                future_mask[w] = w >= j->past && !padded;
            }
            for (size_t f = 0; f < j->num_fields; f++) {
                const vf_cv_field *fd = &j->fields[f];
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
                r = vf_cv_put_record(j, unit_id, e, t, (int)nimg, npz.data, npz.len);
            /* metadata.json */
            json_t *meta = json_object(), *names_json = json_array(), *sizes = json_object();
            for (size_t c = 0; c < j->num_cams; c++) {
                json_array_append_new(names_json, json_string(j->cams[c].name));
                json_object_set_new(sizes, j->cams[c].name,
                                    json_pack("[ii]", j->cams[c].src_width, j->cams[c].src_height));
            }
            json_object_set_new(meta, "camera_names", names_json);
            json_object_set_new(meta, "anchor_relative_idx", json_integer(j->past));
            for (int m = 0; m < VF_CV_NUM_META; m++) {
                if (meta_col[m] < 0)
                    continue;
                const vf_ds_column *c = &table.columns[meta_col[m]];
                char text[64];
                if (c->type == VF_DS_F32)
                    float32_str(((const float *)c->values)[(row0 + t) * c->width], text, sizeof text);
                else
                    snprintf(text, sizeof text, "%lld", (long long)((const int64_t *)c->values)[(row0 + t) * c->width]);
                json_object_set_new(meta, vf_cv_meta_columns[m], json_string(text));
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
                r = vf_cv_put_record(j, unit_id, e, t, (int)nimg + 1, meta_text, strlen(meta_text));
            if (r == 0)
                r = vf_cv_put_record(j, unit_id, e, t, (int)nimg + 2, lang_text, strlen(lang_text));
            free(meta_text);
            free(lang_text);
        }
        vf_cv_job_progress(j, L, "decode");
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
        char *path = vf_cv_state_path(j, "stats_%06u.bin", unit_id);
        if (r == 0)
            r = path ? vf_cv_write_atomic(path, blob.data ? blob.data : (uint8_t *)"", blob.len) : VF_ENOMEM;
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
    vf_cv_stats_free(j, &st);
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
    vf_cv_job *j;
    uint32_t unit_id;
    const vf_cv_camera *cam;
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

static int flush_batch(video_ctx *v, vf_video_reader *reader, const vf_cv_episode *e)
{
    if (v->pending == 0)
        return 0;
    vf_cv_job *j = v->j;
    int r = vf_video_read_frames(reader, v->req, v->pending, &v->fmt);
    if (r < 0)
        r = vf_error_context(r, "camera %s, episode %lld", v->cam->key, (long long)e->episode_index);
    for (size_t i = 0; i < v->pending && r == 0; i++) {
        int64_t k = v->req_k[i];
        const vf_cv_camera *c = v->cam;
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
                r = vf_cv_put_record(j, v->unit_id, e, t, member, v->jpeg, size);
        }
    }
    vf_cv_job_progress(j, (int64_t)v->pending, "decode");
    v->pending = 0;
    return r;
}

static int run_video_unit(vf_cv_job *j, uint32_t unit_id)
{
    const vf_cv_unit *u = &j->units[unit_id];
    const vf_cv_camera *cam = &j->cams[u->cam];
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
        const vf_cv_episode *e = &j->eps[pos]; /* eps are indexed by position */
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

void vf_cv_unit_job(void *p)
{
    vf_cv_work *a = p;
    const uint32_t unit = (uint32_t)a->index;
    vf_cv_job *j = a->j;
    if (atomic_load(&j->abort))
        return;
    vf_cv_unit *u = &j->units[unit];
    int r = u->kind == VF_CV_UNIT_LOWDIM ? run_lowdim_unit(j, unit) : run_video_unit(j, unit);
    if (r == VF_EAGAIN && atomic_load(&j->abort))
        return; /* stopped because another unit failed */
    if (r == 0) {
        char line[64];
        snprintf(line, sizeof line, "%u %u\n", unit, j->run);
        r = vf_cv_journal_append(j->journal_units_fd, line);
        if (r == 0) {
            u->done_run = j->run;
            vf_cv_maybe_kill_for_test("decode", atomic_fetch_add(&j->units_finished, 1) + 1);
        }
    }
    if (r < 0)
        vf_cv_job_fail(j, r);
}

