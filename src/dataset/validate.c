/*
 * validate.c: consistency checks of an opened dataset, recorded as
 * problems (the dataset stays usable).
 *
 * Scope (documented in include/vlafeed/dataset.h):
 *  - metadata checks run over ALL episodes: totals, lengths, global index
 *    contiguity, row order, task table, per-camera video spans;
 *  - file checks run over the SELECTED episodes' files only: existence of
 *    data and video files (settings.check_files) and, on request
 *    (settings.check_data_files), the data Parquet footers: row count,
 *    columns, and the row groups each selected episode maps to.
 *
 * A file is "missing" only when the file system says it is not there (a
 * local stat, or a remote 404/410). A remote server that could not say (an
 * outage outlasting the retries, a refusal) leaves the file unchecked
 * (exists -1, so its readers ask again) with an error problem saying so,
 * naming the URL and the last status.
 */
#include "dataset/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static const char *episodes_rel(const vf_dataset *d)
{
    return d->major == 3 ? "meta/episodes" : "meta/episodes.jsonl";
}

static int check_metadata(vf_dataset *d)
{
    const char *erel = episodes_rel(d);
    int r = 0;
    if ((int64_t)d->num_all_episodes != d->total_episodes)
        r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, -1, "total_episodes",
                          "the metadata lists %zu episodes, info.json total_episodes says %lld", d->num_all_episodes,
                          (long long)d->total_episodes);
    int64_t sum = 0;
    int in_place = 1; /* every row i holds episode i so far */
    for (size_t i = 0; i < d->num_all_episodes && r == 0; i++) {
        const vf_ds_episode *e = &d->episodes[i];
        int64_t ep = e->pub.episode_index;
        if (e->pub.length > 0 && sum <= INT64_MAX - e->pub.length)
            sum += e->pub.length;
        if (ep != (int64_t)i)
            in_place = 0;
        if (ep != (int64_t)i)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, "episode_index",
                              "row %zu holds episode %lld; LeRobot indexes episodes by row position", i,
                              (long long)ep);
        if (r == 0 && e->pub.length <= 0)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, "length", "episode length is %lld",
                              (long long)e->pub.length);
        if (r == 0 && e->pub.to_index - e->pub.from_index != e->pub.length)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, "dataset_to_index",
                              "dataset_to_index - dataset_from_index = %lld - %lld, but length is %lld",
                              (long long)e->pub.to_index, (long long)e->pub.from_index, (long long)e->pub.length);
        int64_t expected = i == 0 ? 0 : d->episodes[i - 1].pub.to_index;
        if (r == 0 && e->pub.from_index != expected)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, "dataset_from_index",
                              "global index not contiguous: episode starts at %lld, expected %lld",
                              (long long)e->pub.from_index, (long long)expected);
        if (r == 0 && (e->data_chunk < 0 || e->data_file < 0))
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, "data/file_index", "negative data chunk/file index");
        for (size_t c = 0; c < d->num_cameras && r == 0; c++) {
            const vf_ds_video_loc *v = &e->video[c];
            const vf_camera *cam = &d->cameras[c].pub;
            /* the column name is formatted only for a problem (1M
             * episodes x cameras of snprintf showed in the open's profile) */
            char column[1100];
            column[0] = 0;
            if (!isfinite(v->from_timestamp) || !isfinite(v->to_timestamp) || v->from_timestamp < 0 ||
                v->to_timestamp < v->from_timestamp || v->chunk_index < 0 || v->file_index < 0 ||
                fabs((v->to_timestamp - v->from_timestamp) * cam->fps - (double)e->pub.length) > 0.5)
                snprintf(column, sizeof column, "videos/%s/to_timestamp", cam->key);
            if (!isfinite(v->from_timestamp) || !isfinite(v->to_timestamp) || v->from_timestamp < 0 ||
                v->to_timestamp < v->from_timestamp) {
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, column, "bad video span [%g, %g)",
                                  v->from_timestamp, v->to_timestamp);
                continue;
            }
            /* to_timestamp is the end of the last frame (LeRobot's writer)
             * or the last frame's time (some converters): both are fine. */
            double frames = (v->to_timestamp - v->from_timestamp) * cam->fps;
            if (fabs(frames - (double)e->pub.length) > 0.5 && fabs(frames - (double)(e->pub.length - 1)) > 0.5)
                r = vf_ds_problem(d, VF_SEVERITY_WARNING, erel, ep, column,
                                  "video span (to - from) * fps = %.3f frames matches neither the episode length "
                                  "%lld (to = end) nor length - 1 (to = last frame)",
                                  frames, (long long)e->pub.length);
            if (r == 0 && (v->chunk_index < 0 || v->file_index < 0))
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, ep, column, "negative video chunk/file index");
        }
    }
    if (r == 0 && sum != d->total_frames)
        r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, -1, "total_frames",
                          "the episode lengths sum to %lld, info.json total_frames says %lld", (long long)sum,
                          (long long)d->total_frames);
    /* Duplicates (the selection is sorted, but covers only the subset):
     * check over all episodes with a sorted copy of the indices, unless
     * every row held its own index (then there are none). */
    if (r == 0 && d->num_all_episodes > 1 && !in_place) {
        int64_t *idx = vf_malloc_array(d->num_all_episodes, sizeof *idx);
        if (!idx)
            return VF_ENOMEM;
        for (size_t i = 0; i < d->num_all_episodes; i++)
            idx[i] = d->episodes[i].pub.episode_index;
        qsort(idx, d->num_all_episodes, sizeof *idx, cmp_i64);
        for (size_t i = 1; i < d->num_all_episodes && r == 0; i++)
            if (idx[i] == idx[i - 1] && (i < 2 || idx[i - 2] != idx[i]))
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, erel, idx[i], "episode_index", "episode listed more than once");
        free(idx);
    }
    const char *trel = d->major == 3 ? "meta/tasks.parquet" : "meta/tasks.jsonl";
    if (r == 0 && (int64_t)d->num_tasks != d->total_tasks)
        r = vf_ds_problem(d, VF_SEVERITY_ERROR, trel, -1, "total_tasks",
                          "the task table has %zu tasks, info.json total_tasks says %lld", d->num_tasks,
                          (long long)d->total_tasks);
    /* Episode task strings must be in the task table (warn once per task). */
    for (size_t i = 0; i < d->num_all_episodes && r == 0; i++) {
        const vf_ds_episode *e = &d->episodes[i];
        for (size_t t = 0; t < e->pub.num_tasks && r == 0; t++) {
            int found = 0;
            for (size_t k = 0; k < d->num_tasks && !found; k++)
                found = !strcmp(d->tasks[k], e->pub.tasks[t]);
            if (!found)
                r = vf_ds_problem(d, VF_SEVERITY_WARNING, erel, e->pub.episode_index, "tasks",
                                  "task \"%.200s\" is not in %s", e->pub.tasks[t], trel);
        }
        if (i > 1000)
            break; /* bounded cost on huge task tables */
    }
    static const char *const defaults[] = {"timestamp", "frame_index", "episode_index", "index", "task_index"};
    for (size_t i = 0; i < VF_ARRAY_LEN(defaults) && r == 0; i++)
        if (!vf_dataset_find_feature(d, defaults[i]))
            r = vf_ds_problem(d, VF_SEVERITY_WARNING, "meta/info.json", -1, defaults[i],
                              "default feature '%s' is not declared", defaults[i]);
    for (size_t c = 0; c < d->num_cameras && r == 0; c++)
        if (fabs(d->cameras[c].pub.fps - d->fps) > 1e-6)
            r = vf_ds_problem(d, VF_SEVERITY_WARNING, "meta/info.json", -1, d->cameras[c].pub.key,
                              "camera fps %g differs from dataset fps %g", d->cameras[c].pub.fps, d->fps);
    return r;
}

/* First selected episode using a file (for the problem's episode field). */
static int64_t first_user(const vf_dataset *d, const vf_ds_file *f)
{
    return f->num_episodes ? d->episodes[d->selected[f->episodes[0]]].pub.episode_index : -1;
}

/* Records a file that is not there as a regular file: missing, or (local
 * roots) something else in its place: a FIFO, a device, a directory. */
static int report_absent(vf_dataset *d, const vf_ds_file *f, const char *column, const char *what)
{
    struct stat st;
    if (!vf_is_url(d->root) && f->path && stat(f->path, &st) == 0 && !S_ISREG(st.st_mode))
        return vf_ds_problem(d, VF_SEVERITY_ERROR, f->rel, first_user(d, f), column, "%s is not a regular file (%s)",
                             what, vf_file_kind_name(st.st_mode));
    int r = vf_ds_missing_file(d, f->rel);
    return r < 0 ? r : vf_ds_problem(d, VF_SEVERITY_ERROR, f->rel, first_user(d, f), column, "%s missing", what);
}

/* One file's existence check: there (exists 1), absent (exists 0, a
 * missing file) or, from a remote fs, not known (exists stays -1): the
 * message of the fs says why ("unreachable: <url>: HTTP 503 ..." or
 * "refused: ..."). */
static int check_file(vf_dataset *d, vf_ds_file *f, const char *column, const char *what)
{
    int there = d->fs.exists(d->fs.ctx, f->rel);
    if (there == VF_ENOMEM)
        return there;
    if (there < 0)
        return vf_ds_problem(d, VF_SEVERITY_ERROR, f->rel, first_user(d, f), column, "%s %s", what,
                             vf_last_error());
    f->exists = there;
    return there ? 0 : report_absent(d, f, column, what);
}

static int check_files(vf_dataset *d)
{
    int r = 0;
    for (size_t i = 0; i < d->num_data_files && r == 0; i++)
        r = check_file(d, &d->data_files[i], "", "data file");
    for (size_t c = 0; c < d->num_cameras && r == 0; c++) {
        vf_ds_camera *cam = &d->cameras[c];
        for (size_t i = 0; i < cam->num_files && r == 0; i++)
            r = check_file(d, &cam->files[i], cam->pub.key, "video file");
    }
    return r;
}

/* Opens each existing data file's footer: row count = Σ lengths of every
 * episode stored there, declared columns present, episodes locatable. */
static int check_data_files(vf_dataset *d)
{
    int r = 0;
    for (size_t i = 0; i < d->num_data_files && r == 0; i++) {
        vf_ds_file *df = &d->data_files[i];
        if (df->exists != 1)
            continue; /* missing or unreachable: a problem already */
        vf_pq_file *f = NULL;
        int o = vf_ds_open_parquet(d, df->rel, &f);
        if (o == VF_ENOMEM)
            return o;
        if (o < 0) {
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, df->rel, first_user(d, df), "", "unreadable: %s",
                              vf_last_error());
            continue;
        }
        int64_t expected = df->expected_rows;
        if (vf_pq_num_rows(f) != expected)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, df->rel, first_user(d, df), "",
                              "file has %lld rows, the episodes stored in it have %lld",
                              (long long)vf_pq_num_rows(f), (long long)expected);
        for (size_t k = 0; k < d->num_features && r == 0; k++) {
            const vf_feature *feat = &d->features[k];
            if (feat->kind == VF_FEATURE_VIDEO || feat->kind == VF_FEATURE_LANGUAGE)
                continue;
            if (vf_pq_field_index(f, feat->name) < 0)
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, df->rel, first_user(d, df), feat->name,
                                  "column declared in info.json is missing from the data file");
        }
        for (size_t k = 0; k < df->num_episodes && r == 0; k++) {
            size_t pos = df->episodes[k];
            const vf_ds_episode *e = &d->episodes[d->selected[pos]];
            vf_ds_rg_span *spans;
            int n;
            int l = vf_ds_locate_row_groups(d, pos, f, &spans, &n);
            if (l == VF_ENOMEM)
                r = l;
            else if (l < 0)
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, df->rel, e->pub.episode_index, "index", "%s",
                                  vf_last_error());
            else
                free(spans);
        }
        vf_pq_close(f);
    }
    return r;
}

/* Codec names as info.json writers spell them, to FFmpeg's names. */
static const char *canonical_codec(const char *name)
{
    static const char *const aliases[][2] = {
        {"h265", "hevc"}, {"hvc1", "hevc"}, {"hev1", "hevc"}, {"libx265", "hevc"}, {"avc1", "h264"},
        {"avc", "h264"},  {"libx264", "h264"}, {"av01", "av1"}, {"libdav1d", "av1"}, {"libsvtav1", "av1"},
        {"libaom-av1", "av1"}, {"mp4v", "mpeg4"}, {"vp09", "vp9"}, {"libvpx-vp9", "vp9"},
    };
    for (size_t i = 0; i < VF_ARRAY_LEN(aliases); i++)
        if (!strcmp(name, aliases[i][0]))
            return aliases[i][1];
    return name;
}

static int same_pix_fmt(const char *a, const char *b)
{
    /* yuvj420p is yuv420p with the full range flag: the same samples. */
    if (!strncmp(a, "yuvj", 4) && !strcmp(a + 4, b + 3) && !strncmp(b, "yuv", 3))
        return 1;
    if (!strncmp(b, "yuvj", 4) && !strcmp(b + 4, a + 3) && !strncmp(a, "yuv", 3))
        return 1;
    return !strcmp(a, b);
}

/* Sets a camera's size (and its feature's H and W) to the files' truth. */
static void use_file_size(vf_dataset *d, vf_ds_camera *cam, int width, int height)
{
    vf_feature *f = &d->features[cam->pub.feature];
    int64_t *shape = (int64_t *)f->shape;
    int64_t old_h = cam->pub.height, old_w = cam->pub.width;
    if (f->ndim == 3) {
        int at = shape[0] == old_h && shape[1] == old_w ? 0 : shape[1] == old_h && shape[2] == old_w ? 1 : -1;
        if (at >= 0) {
            shape[at] = height;
            shape[at + 1] = width;
            f->size = shape[0] * shape[1] * shape[2];
        }
    }
    cam->pub.width = width;
    cam->pub.height = height;
}

/* The open-time video check (vf_dataset_settings.check_videos). */
static int check_videos(vf_dataset *d)
{
    int r = 0;
    for (size_t c = 0; c < d->num_cameras && r == 0; c++) {
        vf_ds_camera *cam = &d->cameras[c];
        const char *key = cam->pub.key;
        int file_w = 0, file_h = 0, sizes_agree = 1;
        for (size_t i = 0; i < cam->num_files && r == 0; i++) {
            vf_ds_file *f = &cam->files[i];
            if (f->exists != 1 || f->num_episodes == 0)
                continue; /* missing files are problems already; unchecked ones are not opened */
            vf_ds_video_map m;
            int b = vf_ds_video_map_build(d, c, i, &m);
            if (b == VF_ENOMEM)
                return b;
            if (b < 0) {
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, f->rel, first_user(d, f), key, "unreadable video: %s",
                                  vf_last_error());
                continue;
            }
            const vf_video_index *ix = m.index;
            const char *declared = cam->pub.codec && cam->pub.codec[0] ? cam->pub.codec : NULL;
            if (declared && strcmp(canonical_codec(declared), ix->codec_name)) {
                r = vf_ds_problem(d, VF_SEVERITY_WARNING, f->rel, -1, key,
                                  "codec is %s in the file, info.json says %s (the file's codec is used)",
                                  ix->codec_name, declared);
                const char *truth = vf_ds_strdup(d, ix->codec_name);
                if (truth)
                    cam->pub.codec = truth; /* what `info` and the reports show from now on */
            }
            if (r == 0 && cam->pub.pix_fmt && cam->pub.pix_fmt[0] && strcmp(ix->pixfmt_name, "unknown") &&
                !same_pix_fmt(ix->pixfmt_name, cam->pub.pix_fmt)) {
                r = vf_ds_problem(d, VF_SEVERITY_WARNING, f->rel, -1, key,
                                  "pixel format is %s in the file, info.json says %s (the file's is used)",
                                  ix->pixfmt_name, cam->pub.pix_fmt);
                const char *truth = vf_ds_strdup(d, ix->pixfmt_name);
                if (truth)
                    cam->pub.pix_fmt = truth;
            }
            if (r == 0 && cam->pub.width > 0 && (ix->width != cam->pub.width || ix->height != cam->pub.height))
                r = vf_ds_problem(d, VF_SEVERITY_WARNING, f->rel, -1, key,
                                  "frames are %dx%d in the file, info.json says %dx%d", ix->width, ix->height,
                                  cam->pub.width, cam->pub.height);
            if (file_w == 0) {
                file_w = ix->width;
                file_h = ix->height;
            } else if (file_w != ix->width || file_h != ix->height) {
                sizes_agree = 0;
            }
            for (size_t p = 0; p < m.map.problem_count && r == 0; p++) {
                const vf_video_problem *vp = &m.map.problems[p];
                /* A refused file: its own error (episode -1, the file and both
                 * counts) first, then one per episode in it. */
                if (vp->kind == VF_VIDEO_PROBLEM_UNMATCHED || vp->kind == VF_VIDEO_PROBLEM_FILE_REFUSED)
                    r = vf_ds_problem(d, VF_SEVERITY_ERROR, f->rel, vp->episode_index, key, "%s", vp->message);
                else if (vp->kind == VF_VIDEO_PROBLEM_COUNT_MISMATCH || vp->kind == VF_VIDEO_PROBLEM_SPAN_MISMATCH ||
                         vp->kind == VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP) {
                    r = vf_ds_problem(d, VF_SEVERITY_WARNING, f->rel, vp->episode_index, key, "%s", vp->message);
                    vf_problem *added = d->num_problems ? &d->problems[d->num_problems - 1] : NULL;
                    if (r == 0 && vp->kind == VF_VIDEO_PROBLEM_FILE_BY_TIMESTAMP && added &&
                        !strcmp(added->message, vp->message)) /* (not when the list is full) */
                        added->changes_samples = 1;
                }
            }
            vf_ds_video_map_free(&m);
        }
        /* The file's truth: frames come out at the size they are stored at
         * when every checked file of the camera agrees on it. */
        if (r == 0 && sizes_agree && file_w > 0 && (file_w != cam->pub.width || file_h != cam->pub.height)) {
            r = vf_ds_problem(d, VF_SEVERITY_WARNING, "meta/info.json", -1, key,
                              "camera %s: using the files' frame size %dx%d instead of info.json's %dx%d", key,
                              file_w, file_h, cam->pub.width, cam->pub.height);
            use_file_size(d, cam, file_w, file_h);
        }
    }
    return r;
}

int vf_ds_validate(vf_dataset *d, const vf_dataset_settings *s)
{
    int r = check_metadata(d);
    if (r == 0 && s->check_files)
        r = check_files(d);
    if (r == 0 && s->check_data_files)
        r = check_data_files(d);
    if (r == 0 && (s->check_videos >= 2 || (s->check_videos == 1 && !vf_is_url(d->root)))) {
        /* Default: eager only while it is cheap. Each rank opens the
         * dataset, so indexing thousands of MP4s at open would cost every
         * rank the whole dataset's headers; above the bound each file is
         * checked when a loader first maps it (the same frame matching: an
         * episode whose frames cannot be matched fails the batch that needs
         * it, naming file and episode; never a wrong frame). */
        size_t files = 0;
        for (size_t c = 0; c < d->num_cameras; c++)
            files += d->cameras[c].num_files;
        if (s->check_videos >= 2 || files <= VF_EAGER_VIDEO_CHECKS)
            r = check_videos(d);
        else
            vf_log(VF_LOG_INFO,
                   "%s: %zu video files: their frame indexes are checked when first read, not at open (more than "
                   "%d; check_videos=2 checks them all at open)",
                   d->root, files, VF_EAGER_VIDEO_CHECKS);
    }
    return r;
}
