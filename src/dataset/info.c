/*
 * info.c: meta/info.json -> the dataset description (version gate, fps,
 * totals, path templates, features in order, cameras).
 *
 * Every failure here is fatal for the open: without a readable info.json
 * nothing else can be interpreted. Messages name the file and the key path
 * (features.<name>.shape ...). Unknown keys are ignored, as LeRobot does.
 *
 * Limits (hostile input): at most 4096 features, 8 dimensions per shape,
 * each dimension in [1, 2^24], at most 2^31 elements per row; totals in
 * [0, 2^40]; fps in (0, 100000].
 */
#include "dataset/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FEATURES 4096
#define MAX_NDIM 8
#define MAX_DIM (INT64_C(1) << 24)
#define MAX_ROW_ELEMENTS (INT64_C(1) << 31)
#define MAX_TOTAL (INT64_C(1) << 40)

static const struct {
    const char *name;
    vf_dtype type;
} numeric_dtypes[] = {
    {"float16", VF_DTYPE_FLOAT16}, {"float32", VF_DTYPE_FLOAT32}, {"float64", VF_DTYPE_FLOAT64},
    {"int8", VF_DTYPE_INT8},       {"int16", VF_DTYPE_INT16},     {"int32", VF_DTYPE_INT32},
    {"int64", VF_DTYPE_INT64},     {"uint8", VF_DTYPE_UINT8},     {"uint16", VF_DTYPE_UINT16},
    {"uint32", VF_DTYPE_UINT32},   {"uint64", VF_DTYPE_UINT64},   {"bool", VF_DTYPE_BOOL},
    {"float", VF_DTYPE_FLOAT32},   {"double", VF_DTYPE_FLOAT64},
};

/* Parses "v3.0" / "3.0" into major and minor. */
static int parse_version(const char *s, int *major, int *minor)
{
    if (*s == 'v' || *s == 'V')
        s++;
    char *end;
    long ma = strtol(s, &end, 10);
    if (end == s || *end != '.' || ma < 0 || ma > 1000)
        return -1;
    const char *m = end + 1;
    long mi = strtol(m, &end, 10);
    if (end == m || *end != 0 || mi < 0 || mi > 1000)
        return -1;
    *major = (int)ma;
    *minor = (int)mi;
    return 0;
}

/* ORs an optional boolean key of obj (absent or null: false) into *flags. */
static int or_flag(const char *file, const char *where, const json_t *obj, const char *key, int *flags)
{
    int flag = 0;
    int r = vf_json_get_bool(file, where, obj, key, VF_JSON_OPTIONAL | VF_JSON_NULLABLE, &flag);
    *flags |= flag;
    return r;
}

/* The camera fields from a video feature's "info" (and legacy
 * "video_info") objects. */
static int load_camera(vf_dataset *d, const char *file, const char *fname, const json_t *fobj, vf_ds_camera *cam)
{
    char *fwhere = vf_ds_printf(d, "features.%s", fname);
    char *where = vf_ds_printf(d, "features.%s.info", fname);
    if (!fwhere || !where)
        return VF_ENOMEM;
    json_t *info = NULL;
    int r = vf_json_get_object(file, fwhere, fobj, "info", VF_JSON_OPTIONAL | VF_JSON_NULLABLE, &info);
    if (r < 0)
        return r;
    const char *codec = "", *pix_fmt = "";
    int64_t width = 0, height = 0, channels = 0;
    double fps = 0;
    int depth = 0;
    const int opt = VF_JSON_OPTIONAL | VF_JSON_NULLABLE;
    if (info) {
        if ((r = vf_json_get_string(file, where, info, "video.codec", opt, &codec)) < 0 ||
            (r = vf_json_get_string(file, where, info, "video.pix_fmt", opt, &pix_fmt)) < 0 ||
            (r = vf_json_get_int(file, where, info, "video.width", opt, &width)) < 0 ||
            (r = vf_json_get_int(file, where, info, "video.height", opt, &height)) < 0 ||
            (r = vf_json_get_int(file, where, info, "video.channels", opt, &channels)) < 0 ||
            (r = vf_json_get_double(file, where, info, "video.fps", opt, &fps)) < 0)
            return r;
        /* The depth flag: canonical is_depth_map, older video.is_depth_map. */
        if ((r = or_flag(file, where, info, "is_depth_map", &depth)) < 0 ||
            (r = or_flag(file, where, info, "video.is_depth_map", &depth)) < 0)
            return r;
    }
    json_t *legacy = vf_json_member(fobj, "video_info");
    if (legacy && json_is_object(legacy)) {
        char *lwhere = vf_ds_printf(d, "features.%s.video_info", fname);
        if (!lwhere)
            return VF_ENOMEM;
        if ((r = or_flag(file, lwhere, legacy, "video.is_depth_map", &depth)) < 0 ||
            (r = or_flag(file, lwhere, legacy, "is_depth_map", &depth)) < 0)
            return r;
    }
    if (width < 0 || width > 65536 || height < 0 || height > 65536 || channels < 0 || channels > 64)
        return vf_error(VF_ECORRUPT, "%s: %s: video size %lldx%lld (%lld channels) out of range", file, where,
                        (long long)width, (long long)height, (long long)channels);
    if (!isfinite(fps) || fps < 0 || fps > 100000)
        return vf_error(VF_ECORRUPT, "%s: %s.video.fps: out of range (%g)", file, where, fps);
    cam->pub.codec = vf_ds_strdup(d, codec);
    cam->pub.pix_fmt = vf_ds_strdup(d, pix_fmt);
    if (!cam->pub.codec || !cam->pub.pix_fmt)
        return VF_ENOMEM;
    cam->pub.width = (int)width;
    cam->pub.height = (int)height;
    cam->pub.channels = (int)channels;
    cam->pub.fps = fps > 0 ? fps : d->fps;
    cam->pub.is_depth = depth;
    if (!info)
        return vf_ds_problem(d, VF_SEVERITY_WARNING, "meta/info.json", -1, fname,
                             "video feature has no 'info' object (codec and size unknown)");
    return 0;
}

static int load_feature(vf_dataset *d, const char *file, const char *name, const json_t *fobj, vf_feature *f)
{
    char *where = vf_ds_printf(d, "features.%s", name);
    if (!where)
        return VF_ENOMEM;
    if (!json_is_object(fobj))
        return vf_error(VF_ECORRUPT, "%s: %s: expected an object", file, where);
    const char *dtype;
    int r = vf_json_get_string(file, where, fobj, "dtype", 0, &dtype);
    if (r < 0)
        return r;
    int64_t *shape = NULL;
    size_t ndim = 0;
    r = vf_json_get_int_list(file, where, fobj, "shape", 0, MAX_NDIM, 1, MAX_DIM, &shape, &ndim);
    if (r < 0)
        return r;
    if (ndim == 0) {
        free(shape);
        return vf_error(VF_ECORRUPT, "%s: %s.shape: expected a non-empty list of integers", file, where);
    }
    int64_t size = 1;
    for (size_t i = 0; i < ndim; i++) {
        if (size > MAX_ROW_ELEMENTS / shape[i]) {
            free(shape);
            return vf_error(VF_ECORRUPT, "%s: %s.shape: more than %lld elements per row", file, where,
                            (long long)MAX_ROW_ELEMENTS);
        }
        size *= shape[i];
    }
    f->name = vf_ds_strdup(d, name);
    f->dtype = vf_ds_strdup(d, dtype);
    int64_t *shp = vf_ds_alloc(d, ndim, sizeof *shp);
    if (!f->name || !f->dtype || !shp) {
        free(shape);
        return VF_ENOMEM;
    }
    memcpy(shp, shape, ndim * sizeof *shp);
    free(shape);
    f->shape = shp;
    f->ndim = (int)ndim;
    f->size = size;
    f->camera = -1;
    f->type = VF_DTYPE_OTHER;
    if (!strcmp(dtype, "video"))
        f->kind = VF_FEATURE_VIDEO;
    else if (!strcmp(dtype, "image"))
        f->kind = VF_FEATURE_IMAGE;
    else if (!strcmp(dtype, "string"))
        f->kind = VF_FEATURE_STRING;
    else if (!strcmp(dtype, "language"))
        f->kind = VF_FEATURE_LANGUAGE;
    else {
        for (size_t i = 0; i < VF_ARRAY_LEN(numeric_dtypes); i++)
            if (!strcmp(dtype, numeric_dtypes[i].name))
                f->type = numeric_dtypes[i].type;
        f->kind = (ndim == 1 && shp[0] == 1) ? VF_FEATURE_SCALAR : VF_FEATURE_VECTOR;
        if (f->type == VF_DTYPE_OTHER)
            return vf_ds_problem(d, VF_SEVERITY_WARNING, "meta/info.json", -1, name,
                                 "unknown dtype '%s': the column cannot be read", dtype);
    }
    return 0;
}

static int check_template(vf_dataset *d, const char *file, const char *key, const char *templ, int video)
{
    vf_ds_template_vars vars = {.video_key = video ? "key" : NULL};
    char *out;
    int r = vf_ds_format_template(templ, &vars, &out);
    if (r < 0)
        return vf_error_context(r, "%s: %s", file, key);
    free(out);
    (void)d;
    return 0;
}

int vf_ds_load_info(vf_dataset *d, const char *text, size_t len)
{
    const char *file = vf_ds_abs(d, "meta/info.json");
    if (!file)
        return VF_ENOMEM;
    json_t *root;
    int r = vf_json_parse(file, text, len, 0, &root);
    if (r < 0)
        return r;
    if (!json_is_object(root)) {
        json_decref(root);
        return vf_error(VF_ECORRUPT, "%s: expected a JSON object at the top level", file);
    }
    const char *version, *robot = NULL, *data_path, *video_path = NULL;
    const int opt = VF_JSON_OPTIONAL | VF_JSON_NULLABLE;
    json_t *features = NULL;
    if ((r = vf_json_get_string(file, "", root, "codebase_version", 0, &version)) < 0)
        goto done;
    if (parse_version(version, &d->major, &d->minor) < 0 || (d->major != 2 && d->major != 3) ||
        (d->major == 2 && d->minor > 1)) {
        r = vf_error(VF_EUNSUPPORTED, "%s: codebase_version: unsupported version '%s' (vlafeed reads v2.0, v2.1 and v3.0)",
                     file, version);
        goto done;
    }
    if (!(d->version = vf_ds_strdup(d, version))) {
        r = VF_ENOMEM;
        goto done;
    }
    if (d->major == 3 && d->minor > 0 &&
        (r = vf_ds_problem(d, VF_SEVERITY_WARNING, "meta/info.json", -1, "codebase_version",
                           "version %s is newer than v3.0; read as v3.0", version)) < 0)
        goto done;
    if ((r = vf_json_get_string(file, "", root, "robot_type", opt, &robot)) < 0)
        goto done;
    if (robot && !(d->robot_type = vf_ds_strdup(d, robot))) {
        r = VF_ENOMEM;
        goto done;
    }
    if ((r = vf_json_get_double(file, "", root, "fps", 0, &d->fps)) < 0)
        goto done;
    if (!isfinite(d->fps) || d->fps <= 0 || d->fps > 100000) {
        r = vf_error(VF_ECORRUPT, "%s: fps: must be a number in (0, 100000] (got %g)", file, d->fps);
        goto done;
    }
    static const char *const totals[] = {"total_episodes", "total_frames", "total_tasks"};
    int64_t *dest[] = {&d->total_episodes, &d->total_frames, &d->total_tasks};
    for (size_t i = 0; i < 3; i++) {
        if ((r = vf_json_get_int(file, "", root, totals[i], 0, dest[i])) < 0)
            goto done;
        if (*dest[i] < 0 || *dest[i] > MAX_TOTAL) {
            r = vf_error(VF_ECORRUPT, "%s: %s: out of range (%lld)", file, totals[i], (long long)*dest[i]);
            goto done;
        }
    }
    d->chunks_size = 1000;
    if ((r = vf_json_get_int(file, "", root, "chunks_size", d->major == 2 ? 0 : VF_JSON_OPTIONAL, &d->chunks_size)) < 0)
        goto done;
    if (d->chunks_size <= 0 || d->chunks_size > MAX_TOTAL) {
        r = vf_error(VF_ECORRUPT, "%s: chunks_size: must be positive (got %lld)", file, (long long)d->chunks_size);
        goto done;
    }
    if ((r = vf_json_get_string(file, "", root, "data_path", 0, &data_path)) < 0 ||
        (r = vf_json_get_string(file, "", root, "video_path", opt, &video_path)) < 0)
        goto done;
    if ((r = check_template(d, file, "data_path", data_path, 0)) < 0 ||
        (video_path && (r = check_template(d, file, "video_path", video_path, 1)) < 0))
        goto done;
    d->data_path = vf_ds_strdup(d, data_path);
    d->video_path = video_path ? vf_ds_strdup(d, video_path) : NULL;
    if (!d->data_path || (video_path && !d->video_path)) {
        r = VF_ENOMEM;
        goto done;
    }
    if ((r = vf_json_get_object(file, "", root, "features", 0, &features)) < 0)
        goto done;
    size_t nf = json_object_size(features);
    if (nf == 0 || nf > MAX_FEATURES) {
        r = vf_error(VF_ECORRUPT, "%s: features: expected 1 to %d features (got %zu)", file, MAX_FEATURES, nf);
        goto done;
    }
    d->features = vf_ds_alloc(d, nf, sizeof *d->features);
    d->cameras = vf_ds_alloc(d, nf, sizeof *d->cameras);
    if (!d->features || !d->cameras) {
        r = VF_ENOMEM;
        goto done;
    }
    const char *name;
    json_t *fobj;
    /* jansson keeps object keys in document order. */
    json_object_foreach(features, name, fobj)
    {
        vf_feature *f = &d->features[d->num_features];
        if ((r = load_feature(d, file, name, fobj, f)) < 0)
            goto done;
        d->num_features++;
        if (f->kind != VF_FEATURE_VIDEO)
            continue;
        if (!d->video_path) {
            r = vf_error(VF_ECORRUPT, "%s: video_path: missing or null, but feature '%s' is a video", file, name);
            goto done;
        }
        vf_ds_camera *cam = &d->cameras[d->num_cameras];
        cam->pub.key = f->name;
        cam->pub.feature = (int)(d->num_features - 1);
        if ((r = load_camera(d, file, name, fobj, cam)) < 0)
            goto done;
        f->camera = (int)d->num_cameras++;
    }
done:
    json_decref(root);
    return r;
}
