/*
 * frames.c: the video side of the locator. For one camera file it builds the
 * frame index and maps EVERY episode stored in the file (selected or not:
 * frame ordinals are cumulative over all of them) to frame ordinals with
 * vf_video_map_episodes; on top of that, single-frame reads
 * (vf_dataset_read_frame, `vlafeed frame`) and the whole-dataset video check
 * (vf_dataset_decode_check, `vlafeed decode-check`).
 *
 * Depends on: dataset model (dataset.h), video layer, jansson.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"

/* ---- mapping one camera file ------------------------------------------- */

static int find_camera(const vf_dataset *d, const char *key, size_t *camera)
{
    for (size_t c = 0; c < d->num_cameras; c++)
        if (!strcmp(d->cameras[c].pub.key, key)) {
            *camera = c;
            return 0;
        }
    vf_buf names = {0};
    for (size_t c = 0; c < d->num_cameras; c++)
        vf_buf_printf(&names, "%s%s", c ? ", " : "", d->cameras[c].pub.key);
    int r = vf_error(VF_ENOENT, "%s: no camera '%s' (cameras: %s)", d->root, key,
                     names.len ? (char *)names.data : "none");
    vf_buf_free(&names);
    return r;
}

int vf_ds_video_map_build(const vf_dataset *d, size_t camera, size_t file, vf_ds_video_map *out)
{
    memset(out, 0, sizeof *out);
    if (camera >= d->num_cameras || file >= d->cameras[camera].num_files)
        return vf_error(VF_EINVAL, "%s: no video file %zu of camera %zu", d->root, file, camera);
    const vf_ds_camera *cam = &d->cameras[camera];
    const vf_ds_file *f = &cam->files[file];
    out->camera = camera;
    out->file = file;
    out->path = f->path;

    size_t count = 0;
    for (size_t i = 0; i < d->num_all_episodes; i++) {
        const vf_ds_video_loc *v = &d->episodes[i].video[camera];
        count += v->chunk_index == f->chunk_index && v->file_index == f->file_index;
    }
    out->episodes = vf_calloc(count ? count : 1, sizeof *out->episodes);
    if (!out->episodes)
        return VF_ENOMEM;
    for (size_t i = 0; i < d->num_all_episodes; i++) {
        const vf_ds_episode *e = &d->episodes[i];
        const vf_ds_video_loc *v = &e->video[camera];
        if (v->chunk_index != f->chunk_index || v->file_index != f->file_index)
            continue;
        vf_video_episode *ve = &out->episodes[out->num_episodes++];
        ve->episode_index = e->pub.episode_index;
        ve->from_timestamp = v->from_timestamp;
        ve->to_timestamp = v->to_timestamp;
        ve->length = e->pub.length;
    }
    vf_source *src = NULL;
    int r = vf_ds_open_path(d, f->path, &src); /* local file, or remote through the fs */
    if (r == 0) {
        r = vf_video_index_build(&out->index, src);
        vf_source_close(src);
    }
    if (r < 0) {
        vf_ds_video_map_free(out);
        return vf_error_context(r, "camera %s", cam->pub.key);
    }
    vf_video_map_settings ms = {d->fps, 0, cam->pub.key};
    r = vf_video_map_episodes_policy(out->index, out->episodes, out->num_episodes, &ms, d->video_mismatch,
                                     &out->map);
    if (r < 0) {
        vf_ds_video_map_free(out);
        return vf_error_context(r, "%s: camera %s", f->path, cam->pub.key);
    }
    return 0;
}

void vf_ds_video_map_free(vf_ds_video_map *m)
{
    if (m->episodes)
        vf_video_map_free(&m->map, m->episodes, m->num_episodes);
    free(m->episodes);
    vf_video_index_free(m->index);
    memset(m, 0, sizeof *m);
}

int vf_ds_video_map_ordinal(const vf_ds_video_map *m, const vf_dataset *d, int64_t episode_index, int64_t k,
                            int64_t *ordinal)
{
    const char *camera = d->cameras[m->camera].pub.key;
    for (size_t i = 0; i < m->num_episodes; i++) {
        if (m->episodes[i].episode_index != episode_index)
            continue;
        int r = vf_video_episode_frame(&m->episodes[i], k, ordinal);
        return r < 0 ? vf_error_context(r, "%s: camera %s", m->path, camera) : 0;
    }
    return vf_error(VF_ENOENT, "%s: camera %s: episode %lld is not stored in this file", m->path, camera,
                    (long long)episode_index);
}

/* ---- one frame ------------------------------------------------------------ */

int vf_dataset_read_frame(const vf_dataset *d, int64_t episode_index, int64_t frame, const char *camera,
                          uint8_t **rgb, int *width, int *height)
{
    *rgb = NULL;
    *width = *height = 0;
    size_t cam = 0, pos = 0;
    int r = find_camera(d, camera, &cam);
    if (r < 0 || (r = vf_dataset_find_episode(d, episode_index, &pos)) < 0)
        return r;
    const vf_ds_episode *e = &d->episodes[d->selected[pos]];
    if (frame < 0 || frame >= e->pub.length)
        return vf_error(VF_ERANGE, "episode %lld has %lld frames; frame %lld is out of range",
                        (long long)episode_index, (long long)e->pub.length, (long long)frame);
    int file = e->video[cam].file;
    if (file < 0)
        return vf_error(VF_ENOENT, "episode %lld has no video for camera %s", (long long)episode_index, camera);
    const vf_ds_file *f = &d->cameras[cam].files[file];
    if (f->exists == 0)
        return vf_error(VF_ENOENT, "%s: video file missing (camera %s, episode %lld)", f->path, camera,
                        (long long)episode_index);
    vf_ds_video_map m;
    if ((r = vf_ds_video_map_build(d, cam, (size_t)file, &m)) < 0)
        return r;
    int64_t ordinal;
    if ((r = vf_ds_video_map_ordinal(&m, d, episode_index, frame, &ordinal)) < 0) {
        vf_ds_video_map_free(&m);
        return r;
    }
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = camera;
    vf_video_reader *reader = NULL;
    vf_video_format fmt;
    vf_video_format_defaults(&fmt);
    vf_source *src = NULL;
    r = vf_ds_open_path(d, f->path, &src);
    if (r == 0) {
        r = vf_video_open(&reader, src, &vs);
        vf_source_close(src);
    }
    if (r == 0) {
        const vf_video_index *ix = vf_video_reader_index(reader);
        size_t bytes = vf_video_format_bytes(&fmt, ix->width, ix->height);
        *rgb = vf_malloc(bytes);
        if (!*rgb)
            r = VF_ENOMEM;
        else if ((r = vf_video_read_frame(reader, ordinal, &fmt, *rgb)) < 0)
            vf_error_context(r, "episode %lld frame %lld", (long long)episode_index, (long long)frame);
        else {
            *width = ix->width;
            *height = ix->height;
        }
    }
    vf_video_close(reader);
    vf_ds_video_map_free(&m);
    if (r < 0) {
        free(*rgb);
        *rgb = NULL;
    }
    return r;
}

/* ---- decode check ----------------------------------------------------------- */

void vf_decode_check_defaults(vf_decode_check_settings *s)
{
    memset(s, 0, sizeof *s);
    s->decode = 1;
    s->decode_threads = 1;
}

static const char *problem_kind(vf_video_problem_kind k)
{
    switch (k) {
    case VF_VIDEO_PROBLEM_DRIFT: return "drift";
    case VF_VIDEO_PROBLEM_COUNT_MISMATCH: return "count_mismatch";
    case VF_VIDEO_PROBLEM_MISSING_FRAMES: return "missing_frames";
    case VF_VIDEO_PROBLEM_SPAN_MISMATCH: return "span_mismatch";
    case VF_VIDEO_PROBLEM_UNMATCHED: return "unmatched";
    case VF_VIDEO_PROBLEM_FILE_REFUSED: return "file_refused";
    case VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP: return "served_by_timestamp";
    }
    return "other";
}

static json_t *json_finite(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Decodes every frame of the file in order; returns frames decoded. */
static int decode_all(const vf_dataset *d, const vf_ds_file *f, const char *camera, int threads, int64_t *decoded,
                      double *seconds)
{
    vf_video_settings vs;
    vf_video_defaults(&vs);
    vs.camera = camera;
    vs.decode_threads = threads;
    vf_video_reader *reader = NULL;
    vf_source *src = NULL;
    int r = vf_ds_open_path(d, f->path, &src);
    if (r == 0) {
        r = vf_video_open(&reader, src, &vs);
        vf_source_close(src);
    }
    if (r < 0)
        return r;
    const vf_video_index *ix = vf_video_reader_index(reader);
    vf_video_format fmt;
    vf_video_format_defaults(&fmt);
    uint8_t *scratch = vf_malloc(vf_video_format_bytes(&fmt, ix->width, ix->height));
    double t0 = vf_now_seconds();
    *decoded = 0;
    for (int64_t i = 0; scratch && i < ix->frame_count; i++) {
        if ((r = vf_video_read_frame(reader, i, &fmt, scratch)) < 0)
            break;
        (*decoded)++;
    }
    *seconds = vf_now_seconds() - t0;
    if (!scratch)
        r = VF_ENOMEM;
    free(scratch);
    vf_video_close(reader);
    return r;
}

static void add_error(json_t *list, size_t *errors, const char *file, const char *camera, int64_t episode,
                      const char *kind, const char *message)
{
    json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:I,s:s,s:s}", "severity", "error", "file", file,
                                          "camera", camera, "episode", (json_int_t)episode, "kind", kind,
                                          "message", message));
    (*errors)++;
}

/* --thorough: the open's error problems (video errors aside: the per-file
 * loop below reports those itself) and every data page of the selected
 * episodes read through the engine's own table reader. */
static int thorough_checks(const vf_dataset *d, json_t *problems, size_t *errors)
{
    for (size_t i = 0; i < d->num_problems; i++) {
        const vf_problem *p = &d->problems[i];
        if (p->severity != VF_SEVERITY_ERROR || !strncmp(p->file, "videos/", 7))
            continue;
        add_error(problems, errors, p->file, p->column, p->episode, "dataset", p->message);
    }
    const char **columns = vf_malloc_array(d->num_features ? d->num_features : 1, sizeof *columns);
    size_t *positions = vf_malloc_array(d->num_selected ? d->num_selected : 1, sizeof *positions);
    if (!columns || !positions) {
        free(columns);
        free(positions);
        return VF_ENOMEM;
    }
    size_t ncols = 0;
    for (size_t k = 0; k < d->num_features; k++) {
        const vf_feature *f = &d->features[k];
        /* A feature whose dtype cannot be read is left out by the loaders (and said so: an
         * info.json warning with changes_samples), so it is not read here either. */
        if ((f->kind == VF_FEATURE_VECTOR || f->kind == VF_FEATURE_SCALAR || f->kind == VF_FEATURE_STRING) &&
            vf_ds_feature_value_type(f) >= 0)
            columns[ncols++] = f->name;
    }
    int r = 0;
    /* Episode by episode, so that an error names the first bad episode. */
    for (size_t i = 0; i < d->num_selected && r != VF_ENOMEM; i++) {
        positions[0] = i;
        vf_ds_table t;
        memset(&t, 0, sizeof t);
        r = vf_ds_read_table(d, positions, 1, columns, ncols, VF_DS_VERIFY_INDEX, &t);
        vf_ds_table_free(&t);
        if (r < 0 && r != VF_ENOMEM) {
            vf_data_span span;
            const char *file = vf_dataset_episode_data(d, i, &span) == 0 && span.file < d->num_data_files
                                   ? d->data_files[span.file].rel
                                   : "";
            add_error(problems, errors, file, "", d->episodes[d->selected[i]].pub.episode_index, "data",
                      vf_last_error());
        }
    }
    free(columns);
    free(positions);
    return r == VF_ENOMEM ? r : 0;
}

int vf_dataset_decode_check(const vf_dataset *d, const vf_decode_check_settings *settings, char **json_out,
                            size_t *num_errors)
{
    vf_decode_check_settings defaults;
    if (!settings) {
        vf_decode_check_defaults(&defaults);
        settings = &defaults;
    }
    *json_out = NULL;
    *num_errors = 0;
    size_t errors = 0;
    int64_t total_files = 0, done_files = 0;
    for (size_t c = 0; c < d->num_cameras; c++)
        total_files += (int64_t)d->cameras[c].num_files;

    json_t *root = json_object();
    json_t *cameras = json_array();
    json_t *problems = json_array();
    char *caps = vf_video_capabilities_json();
    json_t *decoders = caps ? json_loads(caps, 0, NULL) : NULL;
    free(caps);
    int64_t all_frames = 0, all_decoded = 0;
    double all_seconds = 0;
    if (settings->thorough && thorough_checks(d, problems, &errors) == VF_ENOMEM) {
        json_decref(root);
        json_decref(cameras);
        json_decref(problems);
        json_decref(decoders);
        return VF_ENOMEM;
    }

    for (size_t c = 0; c < d->num_cameras; c++) {
        const vf_ds_camera *cam = &d->cameras[c];
        json_t *files = json_array();
        for (size_t i = 0; i < cam->num_files; i++) {
            const vf_ds_file *f = &cam->files[i];
            json_t *jf = json_pack("{s:s}", "file", f->rel);
            json_array_append_new(files, jf);
            if (settings->progress)
                settings->progress(settings->progress_ctx, done_files, total_files, f->rel);
            done_files++;
            if (f->exists == 0) {
                json_object_set_new(jf, "error", json_string("file missing"));
                add_error(problems, &errors, f->rel, cam->pub.key, -1, "missing_file", "video file missing");
                continue;
            }
            vf_ds_video_map m;
            int r = vf_ds_video_map_build(d, c, i, &m);
            if (r < 0) {
                json_object_set_new(jf, "error", json_string(vf_last_error()));
                add_error(problems, &errors, f->rel, cam->pub.key, -1, "unreadable", vf_last_error());
                continue;
            }
            const vf_video_index *ix = m.index;
            int64_t expected = 0;
            for (size_t e = 0; e < m.num_episodes; e++)
                expected += m.episodes[e].length;
            int64_t max_gap = 0, last_key = -1, gaps = 0, gap_sum = 0;
            for (int64_t k = 0; k < ix->frame_count; k++) {
                if (!ix->keyframe[k])
                    continue;
                if (last_key >= 0) {
                    max_gap = VF_MAX(max_gap, k - last_key);
                    gap_sum += k - last_key;
                    gaps++;
                }
                last_key = k;
            }
            json_object_set_new(jf, "codec", json_string(ix->codec_name));
            json_object_set_new(jf, "pix_fmt", json_string(ix->pixfmt_name));
            json_object_set_new(jf, "width", json_integer(ix->width));
            json_object_set_new(jf, "height", json_integer(ix->height));
            json_object_set_new(jf, "frames", json_integer(ix->frame_count));
            json_object_set_new(jf, "frames_expected", json_integer(expected));
            json_object_set_new(jf, "keyframes", json_integer(ix->keyframe_count));
            json_object_set_new(jf, "max_keyframe_interval", json_integer(max_gap));
            json_object_set_new(jf, "mean_keyframe_interval", gaps ? json_real((double)gap_sum / (double)gaps)
                                                                    : json_null());
            json_object_set_new(jf, "mapping", json_string(m.map.method == VF_VIDEO_MAP_BY_ORDINAL    ? "ordinal"
                                                           : m.map.method == VF_VIDEO_MAP_REFUSED ? "refused"
                                                                                                  : "timestamp"));
            json_object_set_new(jf, "max_abs_drift_ms", json_finite(m.map.max_abs_drift_ms));
            json_t *eps = json_array();
            for (size_t e = 0; e < m.num_episodes; e++) {
                const vf_video_episode *ve = &m.episodes[e];
                json_array_append_new(eps, json_pack("{s:I,s:I,s:I,s:I,s:o,s:f,s:f}", "episode",
                                                     (json_int_t)ve->episode_index, "length",
                                                     (json_int_t)ve->length, "first_ordinal",
                                                     (json_int_t)ve->first_ordinal, "frames_found",
                                                     (json_int_t)ve->frames_found, "drift_ms",
                                                     json_finite(ve->drift_ms), "from_timestamp",
                                                     ve->from_timestamp, "to_timestamp", ve->to_timestamp));
            }
            json_object_set_new(jf, "episodes", eps);
            /* A refused file's own record says the same, and which episodes it costs. */
            if (ix->frame_count < expected && m.map.method != VF_VIDEO_MAP_REFUSED) {
                char msg[200];
                snprintf(msg, sizeof msg, "file has %lld frames but its episodes need %lld",
                         (long long)ix->frame_count, (long long)expected);
                add_error(problems, &errors, f->rel, cam->pub.key, -1, "frame_count", msg);
            }
            for (size_t p = 0; p < m.map.problem_count; p++) {
                const vf_video_problem *vp = &m.map.problems[p];
                int is_error = vp->kind == VF_VIDEO_PROBLEM_MISSING_FRAMES || vp->kind == VF_VIDEO_PROBLEM_UNMATCHED ||
                               vp->kind == VF_VIDEO_PROBLEM_FILE_REFUSED;
                const char *severity = is_error ? "error"
                                       : vp->kind == VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP ? "warning"
                                                                                        : "info";
                json_array_append_new(problems,
                                      json_pack("{s:s,s:s,s:s,s:I,s:s,s:s}", "severity", severity,
                                                "file", f->rel, "camera", cam->pub.key, "episode",
                                                (json_int_t)vp->episode_index, "kind", problem_kind(vp->kind),
                                                "message", vp->message));
                errors += (size_t)is_error;
            }
            all_frames += ix->frame_count;
            if (settings->decode) {
                int64_t decoded = 0;
                double seconds = 0;
                r = decode_all(d, f, cam->pub.key, settings->decode_threads, &decoded, &seconds);
                json_object_set_new(jf, "frames_decoded", json_integer(decoded));
                json_object_set_new(jf, "decode_seconds", json_real(seconds));
                json_object_set_new(jf, "decode_fps", seconds > 0 ? json_real((double)decoded / seconds)
                                                                  : json_null());
                all_decoded += decoded;
                all_seconds += seconds;
                if (r < 0)
                    add_error(problems, &errors, f->rel, cam->pub.key, -1, "decode", vf_last_error());
            }
            vf_ds_video_map_free(&m);
        }
        json_array_append_new(cameras, json_pack("{s:s,s:s,s:i,s:i,s:o}", "key", cam->pub.key, "codec",
                                                 cam->pub.codec, "width", cam->pub.width, "height",
                                                 cam->pub.height, "files", files));
    }
    if (settings->progress)
        settings->progress(settings->progress_ctx, done_files, total_files, "done");
    json_object_set_new(root, "path", json_string(d->root));
    json_object_set_new(root, "decoders", decoders ? decoders : json_null());
    json_object_set_new(root, "cameras", cameras);
    json_object_set_new(root, "frames", json_integer(all_frames));
    json_object_set_new(root, "frames_decoded", json_integer(all_decoded));
    json_object_set_new(root, "decode_seconds", json_real(all_seconds));
    json_object_set_new(root, "decode_fps", all_seconds > 0 ? json_real((double)all_decoded / all_seconds)
                                                            : json_null());
    json_object_set_new(root, "errors", json_integer((json_int_t)errors));
    json_object_set_new(root, "problems", problems);
    *json_out = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    *num_errors = errors;
    return *json_out ? 0 : vf_error(VF_ENOMEM, "out of memory writing the decode-check report");
}
