/*
 * py_loader_settings.c: the keyword arguments of Loader(), loader_state() /
 * resolve_state() and plan_report(), as settings tables (settings.h) over
 * vf_py_loader_args, and the parsers of the settings that are more than one
 * value: delta_timestamps, keys, renames, normalize, the resume state and
 * prefetch_cache_dir. Their messages are the binding's contract (tests
 * assert them): keep each text as it is.
 */
#include "py_loader.h"

#include <string.h>

void vf_py_loader_args_init(vf_py_loader_args *a)
{
    memset(a, 0, sizeof *a);
    vf_loader_defaults(&a->s);
}

void vf_py_loader_args_free(vf_py_loader_args *a)
{
    PyMem_Free((void *)a->s.sample.delta_timestamps);
    PyMem_Free(a->seconds);
    PyMem_Free((void *)a->s.sample.keys);
    PyMem_Free((void *)a->s.sample.renames);
    PyMem_Free((void *)a->s.sample.normalize);
    PyMem_Free((void *)a->s.decode_device_cameras);
    Py_CLEAR(a->keys_hold);
    Py_CLEAR(a->cache_dir);
    PyMem_Free((void *)a->s.cpus);
    a->s.cpus = NULL;
    vf_py_state_clear(&a->resume);
}

vf_dataset *vf_py_loader_args_parse(const vf_py_settings *spec, PyObject *args, PyObject *kwargs,
                                    vf_py_loader_args *a)
{
    if (vf_py_parse_settings(spec, args, kwargs, a) < 0)
        return NULL;
    return vf_py_dataset(a->dataset);
}

/* ---- the settings that are more than one value ---------------------------------------- */

/* delta_timestamps: {key: [seconds, ...]}. */
static int parse_deltas(PyObject *obj, void *options)
{
    vf_py_loader_args *a = options;
    if (!PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "delta_timestamps must be a dict {key: [seconds, ...]}");
        return -1;
    }
    Py_ssize_t n = PyDict_Size(obj), total = 0, pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        Py_ssize_t len = PySequence_Size(value);
        if (len < 0)
            return -1;
        total += len;
    }
    vf_delta_spec *deltas = PyMem_Calloc((size_t)(n ? n : 1), sizeof *deltas);
    a->s.sample.delta_timestamps = deltas;
    a->seconds = PyMem_Calloc((size_t)(total ? total : 1), sizeof *a->seconds);
    if (!deltas || !a->seconds) {
        PyErr_NoMemory();
        return -1;
    }
    pos = 0;
    Py_ssize_t i = 0, k = 0;
    while (PyDict_Next(obj, &pos, &key, &value)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!name) {
            PyErr_SetString(PyExc_TypeError, "delta_timestamps keys must be strings");
            return -1;
        }
        PyObject *seq = PySequence_Fast(value, "delta_timestamps values must be lists of seconds");
        if (!seq)
            return -1;
        Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
        if (k + len > total) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_RuntimeError, "delta_timestamps changed while being read");
            return -1;
        }
        deltas[i].key = name;
        deltas[i].seconds = a->seconds + k;
        deltas[i].count = (size_t)len;
        for (Py_ssize_t j = 0; j < len; j++) {
            double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, j));
            if (v == -1.0 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            a->seconds[k++] = v;
        }
        Py_DECREF(seq);
        a->s.sample.num_delta_timestamps = (size_t)++i;
    }
    return 0;
}

/* keys: the features to emit. */
static int parse_keys(PyObject *obj, void *options)
{
    vf_py_loader_args *a = options;
    PyObject *seq = PySequence_Fast(obj, "keys must be a list of feature names");
    if (!seq)
        return -1;
    a->keys_hold = seq;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char **keys = PyMem_Calloc((size_t)(n ? n : 1), sizeof *keys);
    if (!(a->s.sample.keys = keys)) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        keys[i] = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
        if (!keys[i]) {
            PyErr_SetString(PyExc_TypeError, "keys must be strings");
            return -1;
        }
    }
    a->s.sample.num_keys = (size_t)n;
    return 0;
}

/* One item of renames: {dataset key: new name}. */
static int rename_entry(void *entry, PyObject *key, PyObject *value)
{
    vf_rename_spec *r = entry;
    r->from = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    r->to = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
    if (r->from && r->to)
        return 0;
    PyErr_SetString(PyExc_TypeError, "renames keys and values must be strings");
    return -1;
}

/* One item of normalize: {key: 'mean_std' | 'min_max'}. */
static int norm_entry(void *entry, PyObject *key, PyObject *value)
{
    static const vf_py_choice modes[] = {
        {"none", VF_NORM_NONE}, {"mean_std", VF_NORM_MEAN_STD}, {"min_max", VF_NORM_MIN_MAX}, {NULL, 0}};
    vf_norm_spec *norm = entry;
    int mode = VF_NORM_NONE;
    if (!(norm->key = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL)) {
        PyErr_SetString(PyExc_TypeError, "normalize keys must be strings");
        return -1;
    }
    if (vf_py_choose(value, "normalize mode", modes, &mode) < 0)
        return -1;
    norm->mode = (vf_normalization)mode;
    return 0;
}

/* state / resume: a state_dict() to start from. */
static int parse_state(PyObject *obj, void *options)
{
    vf_py_loader_args *a = options;
    return vf_py_resume_setting(obj, VF_PY_STATE_LOADER, &a->resume, &a->s.resume);
}

/* prefetch_cache_dir: a path (str, bytes or os.PathLike). */
static int parse_cache_dir(PyObject *obj, void *options)
{
    vf_py_loader_args *a = options;
    if (!PyUnicode_FSConverter(obj, &a->cache_dir))
        return -1;
    a->s.prefetch_cache_dir = PyBytes_AS_STRING(a->cache_dir);
    return 0;
}

static const vf_py_choice decode_devices[] = {
    {"auto", VF_DECODE_DEVICE_AUTO}, {"cpu", VF_DECODE_DEVICE_CPU}, {"cuda", VF_DECODE_DEVICE_CUDA}, {NULL, 0}};

/* One item of decode_device_cameras: {camera: 'auto' | 'cpu' | 'cuda'}. */
static int device_entry(void *entry, PyObject *key, PyObject *value)
{
    vf_decode_device_camera *c = entry;
    c->camera = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!c->camera) {
        PyErr_SetString(PyExc_TypeError, "decode_device_cameras keys must be camera names (str)");
        return -1;
    }
    int device = VF_DECODE_DEVICE_DEFAULT;
    if (vf_py_choose(value, "decode_device_cameras", decode_devices, &device) < 0)
        return -1;
    c->device = (vf_decode_device)device;
    return 0;
}

/* cpus: a sequence of CPU ids the engine threads are pinned to (the engine checks each; the
 * Python Loader resolves affinity="auto" | "none" | a list into this). */
static int parse_cpus(PyObject *obj, void *options)
{
    vf_py_loader_args *a = options;
    PyObject *seq = PySequence_Fast(obj, "cpus must be a sequence of CPU ids");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int *cpus = PyMem_Calloc((size_t)(n ? n : 1), sizeof *cpus);
    if (!cpus) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    a->s.cpus = cpus; /* freed by vf_py_loader_args_free, also after an error */
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        long cpu = PyLong_AsLongAndOverflow(PySequence_Fast_GET_ITEM(seq, i), &overflow);
        if (cpu == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (overflow || cpu < 0 || cpu > 65535) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "cpus: CPU id out of range (0..65535)");
            return -1;
        }
        cpus[i] = (int)cpu;
    }
    a->s.num_cpus = (size_t)n;
    Py_DECREF(seq);
    return 0;
}

/* ---- the tables ---------------------------------------------------------------------- */

static const vf_py_choice image_formats[] = {
    {"float32", VF_IMAGE_FLOAT32_CHW}, {"uint8", VF_IMAGE_UINT8_CHW}, {"uint8_hwc", VF_IMAGE_UINT8_HWC}, {NULL, 0}};
static const vf_py_choice on_error_policies[] = {
    {"raise", VF_ON_ERROR_RAISE}, {"skip", VF_ON_ERROR_SKIP}, {NULL, 0}};

_Static_assert(offsetof(vf_loader_settings, sample.resize_height) ==
                   offsetof(vf_loader_settings, sample.resize_width) + sizeof(int),
               "resize is stored as two adjacent ints");
_Static_assert(offsetof(vf_loader_settings, num_decode_device_cameras) ==
                   offsetof(vf_loader_settings, decode_device_cameras) + sizeof(void *),
               "decode_device_cameras are stored as (array, count)");
_Static_assert(offsetof(vf_sample_settings, num_renames) == offsetof(vf_sample_settings, renames) + sizeof(void *),
               "renames are stored as (array, count)");
_Static_assert(offsetof(vf_sample_settings, num_normalize) == offsetof(vf_sample_settings, normalize) + sizeof(void *),
               "normalize is stored as (array, count)");

#define A vf_py_loader_args
#define INTEGER(name, member) {name, VF_PY_INT, VF_PY_FIELD(A, member)}
#define INT64(name, member) {name, VF_PY_LLONG, VF_PY_FIELD(A, member)}
#define UINT64(name, member) {name, VF_PY_ULLONG, VF_PY_FIELD(A, member)}
#define FLAG(name, member) {name, VF_PY_BOOL, VF_PY_FIELD(A, member)}
#define COUNT(name, member, least) {name, VF_PY_SSIZE, VF_PY_FIELD(A, member), VF_PY_MIN(least)}
#define CHOICE(name, member, names) {name, VF_PY_OBJECT, VF_PY_FIELD(A, member), .choices = names}
#define PARSED(name, parser) {name, VF_PY_OBJECT, .parse = parser}
#define ENTRIES(name, member, fill, not_dict)                                                                          \
    {name, VF_PY_ENTRIES, VF_PY_FIELD(A, member), .entry = fill, .entry_size = sizeof *((A *)0)->member,              \
     .error = not_dict}

/* The settings the three functions share, each defined once. */
#define DATASET {"dataset", VF_PY_OBJECT, VF_PY_FIELD(A, dataset), .type = &vf_py_dataset_type}
#define MODE CHOICE("mode", s.mode, vf_py_modes)
#define PARTITION CHOICE("partition", s.partition, vf_py_partitions)
#define BATCH_SIZE COUNT("batch_size", s.batch_size, 1)
#define SEED UINT64("seed", s.seed)
#define SHUFFLE FLAG("shuffle", s.shuffle)
#define DROP_LAST FLAG("drop_last", s.drop_last)
#define SHUFFLE_BUFFER COUNT("shuffle_buffer", s.shuffle_buffer, 0)

/* Loader(dataset, *, ...): in keyword order (argument numbers in getargs' messages follow it). */
static const vf_py_setting loader_list[] = {
    DATASET,
    MODE,
    BATCH_SIZE,
    SEED,
    SHUFFLE,
    DROP_LAST,
    INT64("epoch", s.epoch),
    INTEGER("rank", s.rank),
    INTEGER("world_size", s.world_size),
    INTEGER("num_consumers", s.num_consumers),
    INTEGER("consumer", s.consumer),
    INTEGER("threads", s.threads),
    INTEGER("decode_threads", s.decode_threads),
    COUNT("prefetch", s.prefetch_batches, 0),
    SHUFFLE_BUFFER,
    PARTITION,
    COUNT("episode_pool_size", s.episode_pool_size, 0),
    PARSED("delta_timestamps", parse_deltas),
    PARSED("keys", parse_keys),
    ENTRIES("renames", s.sample.renames, rename_entry, "renames must be a dict {dataset key: new name}"),
    CHOICE("image_format", s.sample.image_format, image_formats),
    {"resize", VF_PY_WIDTH_HEIGHT, VF_PY_FIELD(A, s.sample.resize_width)},
    ENTRIES("normalize", s.sample.normalize, norm_entry, "normalize must be a dict {key: 'mean_std' | 'min_max'}"),
    FLAG("lerobot_shapes", s.sample.lerobot_shapes),
    FLAG("include_task", s.sample.include_task),
    {"tolerance_s", VF_PY_DOUBLE, VF_PY_FIELD(A, s.sample.tolerance_s)},
    COUNT("decoder_cache_entries", s.decoder_cache_entries, 0),
    {"share_video_readers", VF_PY_INT, VF_PY_FIELD(A, s.share_video_readers), VF_PY_MIN(-1)},
    PARSED("state", parse_state),
    PARSED("prefetch_cache_dir", parse_cache_dir),
    UINT64("prefetch_cache_bytes", s.prefetch_cache_bytes),
    UINT64("table_cache_bytes", s.table_cache_bytes),
    {"table_disk_cache", VF_PY_INT, VF_PY_FIELD(A, s.table_disk_cache), VF_PY_MIN(-1)},
    CHOICE("on_error", s.on_error, on_error_policies),
    FLAG("log_warnings", s.log_warnings),
    CHOICE("decode_device", s.decode_device, decode_devices),
    ENTRIES("decode_device_cameras", s.decode_device_cameras, device_entry,
            "decode_device_cameras must be a dict {camera: 'auto' | 'cpu' | 'cuda'}"),
    PARSED("cpus", parse_cpus),
};

/* loader_state(dataset, *, ...) and resolve_state(): the settings a state depends on, and where in the epoch. */
static const vf_py_setting loader_state_list[] = {
    DATASET, INT64("epoch", epoch), INT64("batches", batches), MODE, BATCH_SIZE, SEED, SHUFFLE, DROP_LAST,
    INTEGER("world_size", s.world_size), INTEGER("num_consumers", s.num_consumers), SHUFFLE_BUFFER, PARTITION,
    COUNT("episode_pool_size", s.episode_pool_size, 0), PARSED("resume", parse_state),
};

/* plan_report(dataset, *, ...): workers are the consumers per rank; tasks, rank, worker and video_files
 * choose what the report shows. */
static const vf_py_setting plan_report_list[] = {
    DATASET, MODE, PARTITION,
    {"world_size", VF_PY_INT, VF_PY_FIELD(A, s.world_size), VF_PY_MIN(1)},
    {"workers", VF_PY_INT, VF_PY_FIELD(A, s.num_consumers), VF_PY_MIN(1)},
    BATCH_SIZE, SEED, {"epoch", VF_PY_LLONG, VF_PY_FIELD(A, epoch), VF_PY_MIN(0)}, SHUFFLE, DROP_LAST, SHUFFLE_BUFFER,
    COUNT("episode_pool_size", s.episode_pool_size, 1), INTEGER("tasks", tasks), INTEGER("rank", rank), INTEGER("worker", worker),
    PARSED("resume", parse_state), FLAG("video_files", video_files),
};

#define TABLE(list) list, (int)(sizeof list / sizeof list[0])

const vf_py_settings vf_py_loader_settings = {
    "Loader", TABLE(loader_list), 1, 1,
    "batch_size must be >= 1; prefetch, shuffle_buffer, episode_pool_size and decoder_cache_entries >= 0"};
const vf_py_settings vf_py_loader_state_settings = {
    "loader_state", TABLE(loader_state_list), 1, 1,
    "batch_size must be >= 1; shuffle_buffer and episode_pool_size >= 0"};
const vf_py_settings vf_py_plan_report_settings = {
    "plan_report", TABLE(plan_report_list), 1, 1,
    "plan: world_size, workers, batch_size and episode_pool_size must be >= 1; shuffle_buffer and epoch >= 0"};
