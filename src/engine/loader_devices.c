/*
 * loader_devices.c: the loader's decode devices (decode_device,
 * decode_device_cameras): which device each camera asks for, the one CUDA
 * device its NVDEC decoders share, and where each camera's files were
 * actually opened (vf_loader_decode_device, stats()["decode_device"]).
 *
 * The decoder cache knows files, not cameras: device_for maps a file (the
 * cache key, a path from vf_dataset_video_file) to its camera through a
 * table sorted by path, and opened counts the reader the cache just opened
 * under its camera.
 *
 * Invariants: the CUDA device is opened at loader open when some camera
 * asks for NVDEC, once, and closed after the cache (readers hold their own
 * references anyway); a camera that requires CUDA on a machine without a
 * device fails the open, naming the camera and why. Counters and reasons
 * change under `lock` only.
 *
 * Depends on: video (vf_video_hwdevice, the cache's hooks), dataset.
 */
#include "engine/loader_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct file_camera {
    const char *path;          /* owned by the dataset */
    size_t camera;
} file_camera;

struct vf_engine_devices {
    pthread_mutex_t lock;
    vf_video_hwdevice *hwdevice; /* NULL when every camera decodes on the CPU */
    size_t num_cameras;
    vf_decode_device_report *reports; /* [num_cameras] */
    size_t num_files;
    file_camera *files;        /* sorted by path */
};

static int by_path(const void *a, const void *b)
{
    return strcmp(((const file_camera *)a)->path, ((const file_camera *)b)->path);
}

static const file_camera *find_file(const vf_engine_devices *v, const char *path)
{
    file_camera probe = {path, 0};
    return v->num_files ? bsearch(&probe, v->files, v->num_files, sizeof probe, by_path) : NULL;
}

/* The device each camera asks for: the loader's, or its own entry. */
static int resolve_cameras(vf_engine_devices *v, const vf_dataset *d, const vf_loader_settings *s)
{
    if ((unsigned)s->decode_device > VF_DECODE_DEVICE_CUDA)
        return vf_error(VF_EINVAL, "loader: unknown decode_device %d", (int)s->decode_device);
    for (size_t k = 0; k < v->num_cameras; k++) {
        v->reports[k].camera = vf_dataset_camera(d, k)->key;
        v->reports[k].requested = s->decode_device;
    }
    for (size_t i = 0; i < s->num_decode_device_cameras; i++) {
        const vf_decode_device_camera *entry = &s->decode_device_cameras[i];
        if ((unsigned)entry->device > VF_DECODE_DEVICE_CUDA)
            return vf_error(VF_EINVAL, "loader: decode_device_cameras: unknown device %d for camera %s",
                            (int)entry->device, entry->camera ? entry->camera : "(null)");
        size_t k = 0;
        while (k < v->num_cameras && (!entry->camera || strcmp(v->reports[k].camera, entry->camera)))
            k++;
        if (k == v->num_cameras)
            return vf_error(VF_EINVAL, "loader: decode_device_cameras names %s, which is not a camera of %s",
                            entry->camera ? entry->camera : "(null)", vf_dataset_root(d));
        v->reports[k].requested = entry->device;
    }
    for (size_t k = 0; k < v->num_cameras; k++)
        v->reports[k].requested = vf_video_decode_device_resolve(v->reports[k].requested);
    return 0;
}

/* Opens the shared CUDA device when a camera asks for NVDEC. Without one, a
 * camera that requires it fails the open; AUTO cameras keep the reason. */
static int open_device(vf_engine_devices *v)
{
    size_t wanting = 0;
    for (size_t k = 0; k < v->num_cameras; k++)
        wanting += v->reports[k].requested != VF_DECODE_DEVICE_CPU;
    if (!wanting)
        return 0;
    if (vf_video_hwdevice_open(&v->hwdevice) < 0)
        return VF_ENOMEM;
    const char *unavailable = vf_video_hwdevice_unavailable(v->hwdevice);
    if (!unavailable)
        return 0;
    for (size_t k = 0; k < v->num_cameras; k++) {
        vf_decode_device_report *rep = &v->reports[k];
        if (rep->requested == VF_DECODE_DEVICE_CUDA)
            return vf_error(VF_EUNSUPPORTED, "loader: camera %s: decode_device cuda: cannot decode on NVDEC: %s",
                            rep->camera, unavailable);
        if (rep->requested == VF_DECODE_DEVICE_AUTO)
            snprintf(rep->reason, sizeof rep->reason, "%s", unavailable);
    }
    vf_log(VF_LOG_WARN, "decode_device auto: %s; decoding on the CPU instead", unavailable);
    return 0;
}

int vf_engine_devices_open(vf_engine_devices **out, const vf_dataset *d, const vf_loader_settings *s)
{
    *out = NULL;
    vf_engine_devices *v = vf_calloc(1, sizeof *v);
    if (!v)
        return VF_ENOMEM;
    pthread_mutex_init(&v->lock, NULL);
    v->num_cameras = vf_dataset_num_cameras(d);
    for (size_t k = 0; k < v->num_cameras; k++)
        v->num_files += vf_dataset_num_video_files(d, k);
    v->reports = vf_calloc(v->num_cameras ? v->num_cameras : 1, sizeof *v->reports);
    v->files = vf_calloc(v->num_files ? v->num_files : 1, sizeof *v->files);
    int r = v->reports && v->files ? 0 : VF_ENOMEM;
    for (size_t k = 0, n = 0; r == 0 && k < v->num_cameras; k++)
        for (size_t i = 0; i < vf_dataset_num_video_files(d, k); i++)
            v->files[n++] = (file_camera){vf_dataset_video_file(d, k, i), k};
    if (r == 0) {
        qsort(v->files, v->num_files, sizeof *v->files, by_path);
        r = resolve_cameras(v, d, s);
    }
    if (r == 0)
        r = open_device(v);
    if (r < 0) {
        vf_engine_devices_close(v);
        return r;
    }
    *out = v;
    return 0;
}

void vf_engine_devices_close(vf_engine_devices *v)
{
    if (!v)
        return;
    vf_video_hwdevice_close(v->hwdevice);
    free(v->reports);
    free(v->files);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

static vf_decode_device device_for(void *ctx, const char *key)
{
    const vf_engine_devices *v = ctx;
    const file_camera *f = find_file(v, key);
    /* (Every key the loader decodes is a file of one of its cameras.) */
    return f ? v->reports[f->camera].requested : VF_DECODE_DEVICE_CPU;
}

static void opened(void *ctx, const char *key, const vf_video_reader *reader)
{
    vf_engine_devices *v = ctx;
    const file_camera *f = find_file(v, key);
    if (!f)
        return;
    const char *reason;
    vf_decode_device device = vf_video_reader_device(reader, &reason);
    pthread_mutex_lock(&v->lock);
    vf_decode_device_report *rep = &v->reports[f->camera];
    if (device == VF_DECODE_DEVICE_CUDA) {
        rep->files_cuda++;
    } else {
        rep->files_cpu++;
        if (reason && *reason)
            snprintf(rep->reason, sizeof rep->reason, "%s", reason);
    }
    pthread_mutex_unlock(&v->lock);
}

void vf_engine_devices_configure(vf_engine_devices *v, vf_video_cache_settings *cs)
{
    cs->video.hwdevice = v->hwdevice;
    cs->device_for = device_for;
    cs->opened = opened;
    cs->hooks_ctx = v;
}

int vf_loader_decode_device(const vf_loader *l, size_t camera, vf_decode_device_report *report)
{
    vf_engine_devices *v = l->devices;
    if (!v || camera >= v->num_cameras)
        return vf_error(VF_ERANGE, "loader: camera %zu out of range (%zu cameras)", camera, v ? v->num_cameras : 0);
    pthread_mutex_lock(&v->lock);
    *report = v->reports[camera];
    pthread_mutex_unlock(&v->lock);
    return 0;
}
