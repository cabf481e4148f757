/*
 * py_loader.c: the loader surface of vlafeed._native (the contract in
 * native-python-contract.md):
 *
 *   Dataset(root, episodes=None, on_metadata_error="raise", check_videos=1)
 *                                     an open dataset (vf_dataset)
 *   Loader(dataset, *, mode=..., ...) a loader over it (vf_loader), iterable
 *   Batch                             one batch; batch[name] is a zero-copy
 *                                     Column (buffer protocol) or list[str]
 *   plan(root, episodes=None, world_size=1, num_consumers=1) -> dict
 *
 * Lifetimes: a Column holds its Batch, a Batch its Loader and its vf_batch
 * reference, a Loader its Dataset. So a NumPy array or torch tensor viewing
 * a column keeps the batch memory (and everything it points into) alive;
 * the memory returns to the engine's pool when the last view is gone.
 *
 * The GIL is released around everything that waits or decodes: dataset
 * open, loader open/close, next, get_items, set_epoch.
 */
#include "_native.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "vlafeed/dataset.h"
#include "vlafeed/loader.h"

/* ---- helpers ------------------------------------------------------------------ */


static PyObject *json_loads(const char *text)
{
    PyObject *json = PyImport_ImportModule("json");
    PyObject *result = json ? PyObject_CallMethod(json, "loads", "s", text) : NULL;
    Py_XDECREF(json);
    return result;
}

static const char *kind_name(vf_feature_kind k)
{
    switch (k) {
    case VF_FEATURE_VECTOR: return "vector";
    case VF_FEATURE_SCALAR: return "scalar";
    case VF_FEATURE_STRING: return "string";
    case VF_FEATURE_VIDEO: return "video";
    case VF_FEATURE_IMAGE: return "image";
    case VF_FEATURE_LANGUAGE: return "language";
    }
    return "unknown";
}

/* Nested lists of values in row-major order with the given shape. */
static PyObject *nested(const double *values, const int64_t *shape, int ndim, size_t *k)
{
    if (ndim == 0)
        return PyFloat_FromDouble(values[(*k)++]);
    PyObject *list = PyList_New((Py_ssize_t)shape[0]);
    for (int64_t i = 0; list && i < shape[0]; i++) {
        PyObject *v = nested(values, shape + 1, ndim - 1, k);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

/* ======================================================================
 * Dataset
 * ==================================================================== */

typedef struct {
    PyObject_HEAD
    vf_dataset *d;
    PyObject *parent; /* a subset's source Dataset, kept open while the subset lives */
} DatasetObject;

static PyTypeObject Dataset_Type;

static void Dataset_dealloc(DatasetObject *self)
{
    if (self->d) {
        vf_dataset *d = self->d;
        self->d = NULL;
        vf_dataset_close(d);
    }
    Py_CLEAR(self->parent); /* after the subset that borrows from it */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Dataset_init(DatasetObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"root", "episodes", "on_metadata_error", "check_videos", "check_files", NULL};
    PyObject *path_obj, *episodes_obj = Py_None, *check_obj = Py_None;
    const char *on_metadata_error = "raise";
    int check_videos = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|OsiO:Dataset", keywords, PyUnicode_FSConverter, &path_obj,
                                     &episodes_obj, &on_metadata_error, &check_videos, &check_obj))
        return -1;
    if (strcmp(on_metadata_error, "raise") && strcmp(on_metadata_error, "warn")) {
        Py_DECREF(path_obj);
        PyErr_Format(PyExc_ValueError, "on_metadata_error must be \"raise\" or \"warn\", not \"%s\"",
                     on_metadata_error);
        return -1;
    }
    /* check_files: None (default: at open up to VF_LAZY_FILE_CHECKS files, else when first opened),
     * True (always at open), False (never at open). */
    int check_files = VF_CHECK_FILES_AUTO;
    if (check_obj != Py_None) {
        int truth = PyObject_IsTrue(check_obj);
        if (truth < 0) {
            Py_DECREF(path_obj);
            return -1;
        }
        check_files = truth ? VF_CHECK_FILES_ALL : VF_CHECK_FILES_OFF;
    }
    int64_t *episodes = NULL;
    size_t n = 0;
    if (episodes_obj != Py_None &&
        vf_py_int64_list(episodes_obj, "episodes must be a sequence of episode indices", &episodes, &n) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = episodes_obj != Py_None ? episodes : NULL;
    s.num_episodes = n;
    s.check_files = check_files;
    s.check_videos = check_videos; /* issue 10: 1 local roots (default), 2 remote too, 0 off */
    vf_dataset *d = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_open(&d, PyBytes_AS_STRING(path_obj), &s);
    Py_END_ALLOW_THREADS
    PyMem_Free(episodes);
    Py_DECREF(path_obj);
    if (r < 0) {
        vf_py_raise(r);
        return -1;
    }
    /* issue 10: metadata errors `vlafeed info` reports fail the open too. */
    if (vf_py_check_metadata(d, !strcmp(on_metadata_error, "warn")) < 0) {
        vf_dataset_close(d);
        return -1;
    }
    if (self->d)
        vf_dataset_close(self->d);
    Py_CLEAR(self->parent);
    self->d = d;
    return 0;
}

static int dataset_ready(DatasetObject *self)
{
    if (!self->d) {
        PyErr_SetString(PyExc_ValueError, "the dataset is not open");
        return 0;
    }
    return 1;
}

static PyObject *Dataset_info(DatasetObject *self, PyObject *unused)
{
    (void)unused;
    if (!dataset_ready(self))
        return NULL;
    char *text = NULL;
    int r = vf_dataset_info_json(self->d, 0, &text);
    if (r < 0)
        return vf_py_raise(r);
    PyObject *result = json_loads(text);
    free(text);
    return result;
}

static PyObject *Dataset_get_fps(DatasetObject *self, void *c)
{
    (void)c;
    return dataset_ready(self) ? PyFloat_FromDouble(vf_dataset_fps(self->d)) : NULL;
}

static PyObject *Dataset_get_root(DatasetObject *self, void *c)
{
    (void)c;
    return dataset_ready(self) ? PyUnicode_DecodeFSDefault(vf_dataset_root(self->d)) : NULL;
}

static PyObject *Dataset_get_num_frames(DatasetObject *self, void *c)
{
    (void)c;
    if (!dataset_ready(self))
        return NULL;
    long long n = 0;
    for (size_t i = 0; i < vf_dataset_num_episodes(self->d); i++)
        n += vf_dataset_episode(self->d, i)->length;
    return PyLong_FromLongLong(n);
}

static PyObject *Dataset_get_num_episodes(DatasetObject *self, void *c)
{
    (void)c;
    return dataset_ready(self) ? PyLong_FromSize_t(vf_dataset_num_episodes(self->d)) : NULL;
}

static PyObject *Dataset_get_total_frames(DatasetObject *self, void *c)
{
    (void)c;
    return dataset_ready(self) ? PyLong_FromLongLong(vf_dataset_total_frames(self->d)) : NULL;
}

static PyObject *Dataset_get_total_episodes(DatasetObject *self, void *c)
{
    (void)c;
    return dataset_ready(self) ? PyLong_FromLongLong(vf_dataset_total_episodes(self->d)) : NULL;
}

static PyObject *Dataset_get_fingerprint(DatasetObject *self, void *c)
{
    (void)c;
    return dataset_ready(self) ? PyLong_FromUnsignedLongLong(vf_dataset_fingerprint(self->d)) : NULL;
}

static PyObject *Dataset_get_camera_keys(DatasetObject *self, void *c)
{
    (void)c;
    if (!dataset_ready(self))
        return NULL;
    size_t n = vf_dataset_num_cameras(self->d);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *s = PyUnicode_FromString(vf_dataset_camera(self->d, i)->key);
        if (!s) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, s);
    }
    return list;
}

static PyObject *Dataset_get_features(DatasetObject *self, void *c)
{
    (void)c;
    if (!dataset_ready(self))
        return NULL;
    PyObject *dict = PyDict_New();
    for (size_t i = 0; dict && i < vf_dataset_num_features(self->d); i++) {
        const vf_feature *f = vf_dataset_feature(self->d, i);
        PyObject *shape = PyTuple_New(f->ndim);
        for (int k = 0; shape && k < f->ndim; k++)
            PyTuple_SET_ITEM(shape, k, PyLong_FromLongLong(f->shape[k]));
        PyObject *entry = shape ? Py_BuildValue("{s:s,s:N,s:s}", "dtype", f->dtype, "shape", shape, "kind",
                                                kind_name(f->kind))
                                : NULL;
        if (!entry || PyDict_SetItemString(dict, f->name, entry) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(entry);
    }
    return dict;
}

static PyObject *Dataset_get_tasks(DatasetObject *self, void *c)
{
    (void)c;
    if (!dataset_ready(self))
        return NULL;
    size_t n = vf_dataset_num_tasks(self->d);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const char *t = vf_dataset_task(self->d, i);
        PyObject *s = PyUnicode_DecodeUTF8(t ? t : "", (Py_ssize_t)strlen(t ? t : ""), "replace");
        if (!s) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, s);
    }
    return list;
}

static PyObject *Dataset_get_stats(DatasetObject *self, void *c)
{
    (void)c;
    if (!dataset_ready(self))
        return NULL;
    PyObject *dict = PyDict_New();
    for (size_t i = 0; dict && i < vf_dataset_num_stats(self->d); i++) {
        const vf_stat *st = vf_dataset_stat(self->d, i);
        PyObject *per = PyDict_GetItemString(dict, st->feature); /* borrowed */
        if (!per) {
            per = PyDict_New();
            if (!per || PyDict_SetItemString(dict, st->feature, per) < 0) {
                Py_XDECREF(per);
                Py_DECREF(dict);
                return NULL;
            }
            Py_DECREF(per);
        }
        size_t k = 0;
        int64_t flat = (int64_t)st->size;
        const int64_t *shape = st->ndim > 0 ? st->shape : &flat;
        int ndim = st->ndim > 0 ? st->ndim : 1;
        int64_t product = 1;
        for (int d = 0; d < ndim; d++)
            product *= shape[d];
        if (product != (int64_t)st->size) {
            shape = &flat;
            ndim = 1;
        }
        PyObject *v = nested(st->values, shape, ndim, &k);
        if (!v || PyDict_SetItemString(per, st->name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(v);
    }
    return dict;
}

static PyObject *Dataset_get_episodes(DatasetObject *self, void *c)
{
    (void)c;
    if (!dataset_ready(self))
        return NULL;
    size_t n = vf_dataset_num_episodes(self->d);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const vf_episode *e = vf_dataset_episode(self->d, i);
        PyObject *entry = Py_BuildValue("{s:L,s:L,s:L,s:L}", "episode_index", (long long)e->episode_index, "length",
                                        (long long)e->length, "from_index", (long long)e->from_index, "to_index",
                                        (long long)e->to_index);
        if (!entry) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, entry);
    }
    return list;
}

static PyObject *Dataset_subset(DatasetObject *self, PyObject *episodes_obj)
{
    if (!dataset_ready(self))
        return NULL;
    int64_t *episodes = NULL;
    size_t n = 0;
    if (vf_py_int64_list(episodes_obj, "episodes must be a sequence of episode indices", &episodes, &n) < 0)
        return NULL;
    vf_dataset *sub = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_subset(self->d, episodes, n, &sub);
    Py_END_ALLOW_THREADS
    PyMem_Free(episodes);
    if (r < 0) {
        vf_py_raise(r);
        return NULL;
    }
    DatasetObject *out = (DatasetObject *)Dataset_Type.tp_alloc(&Dataset_Type, 0);
    if (!out) {
        vf_dataset_close(sub);
        return NULL;
    }
    out->d = sub;
    Py_INCREF(self);
    out->parent = (PyObject *)self;
    return (PyObject *)out;
}

static PyMethodDef Dataset_methods[] = {
    {"info", (PyCFunction)Dataset_info, METH_NOARGS, "info() -> dict: the `vlafeed info --json` document."},
    {"subset", (PyCFunction)Dataset_subset, METH_O,
     "subset(episodes) -> Dataset: these episode indices, from this dataset's metadata without reading\n"
     "any metadata file again (cost in proportion to them and the episodes sharing their files).\n"
     "The subset keeps this dataset open."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Dataset_getset[] = {
    {"root", (getter)Dataset_get_root, NULL, "the dataset folder", NULL},
    {"fps", (getter)Dataset_get_fps, NULL, "frames per second", NULL},
    {"num_frames", (getter)Dataset_get_num_frames, NULL, "frames of the selected episodes", NULL},
    {"num_episodes", (getter)Dataset_get_num_episodes, NULL, "selected episodes", NULL},
    {"total_frames", (getter)Dataset_get_total_frames, NULL, "info.json total_frames", NULL},
    {"total_episodes", (getter)Dataset_get_total_episodes, NULL, "info.json total_episodes", NULL},
    {"fingerprint", (getter)Dataset_get_fingerprint, NULL, "64-bit identity of the dataset", NULL},
    {"camera_keys", (getter)Dataset_get_camera_keys, NULL, "video feature names", NULL},
    {"features", (getter)Dataset_get_features, NULL, "{name: {dtype, shape, kind}} in info.json order", NULL},
    {"tasks", (getter)Dataset_get_tasks, NULL, "task strings by task_index", NULL},
    {"stats", (getter)Dataset_get_stats, NULL, "{feature: {stat: nested list}}", NULL},
    {"episodes", (getter)Dataset_get_episodes, NULL, "selected episodes: episode_index, length, from/to_index",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Dataset_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.Dataset",
    .tp_basicsize = sizeof(DatasetObject),
    .tp_dealloc = (destructor)Dataset_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Dataset(root, episodes=None, on_metadata_error=\"raise\", check_videos=1): an open LeRobot "
              "dataset (v3.0, v2.1). Metadata errors raise unless on_metadata_error=\"warn\"; check_videos "
              "indexes the videos at open (1 local roots, 2 remote too, 0 off).",
    .tp_methods = Dataset_methods,
    .tp_getset = Dataset_getset,
    .tp_init = (initproc)Dataset_init,
    .tp_new = PyType_GenericNew,
};

/* ======================================================================
 * Loader
 * ==================================================================== */

typedef struct {
    PyObject_HEAD
    vf_loader *l;
    PyObject *dataset;
    size_t batch_size;
    /* Calls running with the GIL released (next, get_items, ...), and a
     * loader whose close() came from another thread meanwhile: it is closed
     * by the last of those calls when it returns, never under it. */
    int in_flight;
    vf_loader *close_pending;
} LoaderObject;

typedef struct {
    PyObject_HEAD
    vf_batch *b;
    PyObject *loader;
} BatchObject;

typedef struct {
    PyObject_HEAD
    BatchObject *batch;
    const vf_column *col;
    Py_ssize_t shape[8];
    Py_ssize_t strides[8];
} ColumnObject;

static PyTypeObject Loader_Type, Batch_Type, Column_Type;

static PyObject *make_batch(LoaderObject *loader, vf_batch *b)
{
    BatchObject *o = PyObject_New(BatchObject, &Batch_Type);
    if (!o) {
        vf_batch_release(b);
        return NULL;
    }
    o->b = b;
    o->loader = (PyObject *)loader;
    Py_INCREF(loader);
    return (PyObject *)o;
}

static void Loader_dealloc(LoaderObject *self)
{
    if (self->l) {
        vf_loader *l = self->l;
        self->l = NULL;
        Py_BEGIN_ALLOW_THREADS
        vf_loader_close(l);
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->dataset);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int parse_choice(PyObject *obj, const char *what, const char *const *names, int count, int *out)
{
    if (!obj || obj == Py_None)
        return 0;
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!s) {
        PyErr_Format(PyExc_TypeError, "%s must be a string", what);
        return -1;
    }
    for (int i = 0; i < count; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "%s: unknown value '%s'", what, s);
    return -1;
}

/* Everything a Loader's settings point to while vf_loader_open runs. */
typedef struct settings_memory {
    vf_delta_spec *deltas;
    double *seconds;
    const char **keys;
    vf_rename_spec *renames;
    vf_norm_spec *norms;
} settings_memory;

static void settings_memory_free(settings_memory *m)
{
    PyMem_Free(m->deltas);
    PyMem_Free(m->seconds);
    PyMem_Free(m->keys);
    PyMem_Free(m->renames);
    PyMem_Free(m->norms);
}

static int parse_deltas(PyObject *obj, vf_sample_settings *s, settings_memory *m)
{
    if (!obj || obj == Py_None)
        return 0;
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
    m->deltas = PyMem_Calloc((size_t)(n ? n : 1), sizeof *m->deltas);
    m->seconds = PyMem_Calloc((size_t)(total ? total : 1), sizeof *m->seconds);
    if (!m->deltas || !m->seconds) {
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
        m->deltas[i].key = name;
        m->deltas[i].seconds = m->seconds + k;
        m->deltas[i].count = (size_t)len;
        for (Py_ssize_t j = 0; j < len; j++) {
            double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, j));
            if (v == -1.0 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            m->seconds[k++] = v;
        }
        Py_DECREF(seq);
        i++;
    }
    s->delta_timestamps = m->deltas;
    s->num_delta_timestamps = (size_t)i;
    return 0;
}

static int parse_keys(PyObject *obj, vf_sample_settings *s, settings_memory *m, PyObject **hold)
{
    if (!obj || obj == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(obj, "keys must be a list of feature names");
    if (!seq)
        return -1;
    *hold = seq;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    m->keys = PyMem_Calloc((size_t)(n ? n : 1), sizeof *m->keys);
    if (!m->keys) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        m->keys[i] = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
        if (!m->keys[i]) {
            PyErr_SetString(PyExc_TypeError, "keys must be strings");
            return -1;
        }
    }
    s->keys = m->keys;
    s->num_keys = (size_t)n;
    return 0;
}

static int parse_renames(PyObject *obj, vf_sample_settings *s, settings_memory *m)
{
    if (!obj || obj == Py_None)
        return 0;
    if (!PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "renames must be a dict {dataset key: new name}");
        return -1;
    }
    Py_ssize_t n = PyDict_Size(obj), pos = 0, i = 0;
    m->renames = PyMem_Calloc((size_t)(n ? n : 1), sizeof *m->renames);
    if (!m->renames) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value) && i < n) {
        m->renames[i].from = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        m->renames[i].to = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
        if (!m->renames[i].from || !m->renames[i].to) {
            PyErr_SetString(PyExc_TypeError, "renames keys and values must be strings");
            return -1;
        }
        i++;
    }
    s->renames = m->renames;
    s->num_renames = (size_t)i;
    return 0;
}

static int parse_normalize(PyObject *obj, vf_sample_settings *s, settings_memory *m)
{
    if (!obj || obj == Py_None)
        return 0;
    if (!PyDict_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "normalize must be a dict {key: 'mean_std' | 'min_max'}");
        return -1;
    }
    Py_ssize_t n = PyDict_Size(obj), pos = 0, i = 0;
    m->norms = PyMem_Calloc((size_t)(n ? n : 1), sizeof *m->norms);
    if (!m->norms) {
        PyErr_NoMemory();
        return -1;
    }
    static const char *const modes[] = {"none", "mean_std", "min_max"};
    PyObject *key, *value;
    while (PyDict_Next(obj, &pos, &key, &value) && i < n) {
        m->norms[i].key = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!m->norms[i].key) {
            PyErr_SetString(PyExc_TypeError, "normalize keys must be strings");
            return -1;
        }
        int mode = 0;
        if (parse_choice(value, "normalize mode", modes, 3, &mode) < 0)
            return -1;
        m->norms[i].mode = (vf_normalization)mode;
        i++;
    }
    s->normalize = m->norms;
    s->num_normalize = (size_t)i;
    return 0;
}

/* ---- loader states <-> dicts ------------------------------------------------------- */

static const char *const mode_names[] = {"map", "stream", "pool"};
static const char *const partition_names[] = {"file_group", "episode", "sequential"};

/* The remaining ranges of an elastic resume as [[start, end], ...]. */
static PyObject *ranges_to_list(const vf_loader_state *st)
{
    PyObject *list = PyList_New((Py_ssize_t)st->num_ranges);
    for (size_t i = 0; list && i < st->num_ranges; i++) {
        PyObject *pair = Py_BuildValue("[LL]", (long long)st->ranges[2 * i], (long long)st->ranges[2 * i + 1]);
        if (!pair) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, pair);
    }
    return list;
}

static PyObject *state_to_dict(const vf_loader_state *st)
{
    const char *mode = st->mode < 3 ? mode_names[st->mode] : "unknown";
    PyObject *partition = st->mode == VF_MODE_STREAM && st->partition >= 0 && st->partition < 3
                              ? PyUnicode_FromString(partition_names[st->partition])
                              : Py_NewRef(Py_None);
    if (!partition)
        return NULL;
    PyObject *ranges = ranges_to_list(st);
    if (!ranges) {
        Py_DECREF(partition);
        return NULL;
    }
    return Py_BuildValue("{s:I,s:s,s:K,s:K,s:L,s:K,s:L,s:L,s:L,s:i,s:i,s:O,s:O,s:N,s:L,s:L,s:N,s:K}", "version",
                         (unsigned)st->version, "mode", mode, "fingerprint", (unsigned long long)st->fingerprint,
                         "selection", (unsigned long long)st->selection, "positions", (long long)st->positions, "seed",
                         (unsigned long long)st->seed, "epoch", (long long)st->epoch, "samples_consumed",
                         (long long)st->samples_consumed, "batch_size", (long long)st->batch_size, "world_size",
                         (int)st->world_size, "consumers", (int)st->consumers, "shuffle",
                         st->shuffle ? Py_True : Py_False, "drop_last", st->drop_last ? Py_True : Py_False,
                         "partition", partition, "shuffle_buffer", (long long)st->shuffle_buffer,
                         "episode_pool_size", (long long)st->episode_pool_size, "ranges", ranges, "settings_hash",
                         (unsigned long long)st->settings_hash);
}

/* The integer at key (missing or not an integer: TypeError / KeyError naming it). */
static int dict_int(PyObject *d, const char *key, int is_unsigned, long long *s_out, unsigned long long *u_out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (!v) {
        PyErr_Format(PyExc_KeyError, "loader state: missing key '%s'", key);
        return -1;
    }
    PyObject *ix = PyNumber_Index(v);
    if (!ix) {
        PyErr_Format(PyExc_TypeError, "loader state: '%s' must be an integer", key);
        return -1;
    }
    if (is_unsigned)
        *u_out = PyLong_AsUnsignedLongLong(ix);
    else
        *s_out = PyLong_AsLongLong(ix);
    Py_DECREF(ix);
    if (PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "loader state: '%s' is out of range", key);
        return -1;
    }
    return 0;
}

static int dict_to_state(PyObject *d, vf_loader_state *st)
{
    memset(st, 0, sizeof *st);
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "a loader state is a dict (from state_dict())");
        return -1;
    }
    long long v = 0;
    unsigned long long u = 0;
    PyObject *mode = PyDict_GetItemString(d, "mode"), *partition = PyDict_GetItemString(d, "partition");
    if (!mode || !PyUnicode_Check(mode)) {
        PyErr_SetString(PyExc_KeyError, "loader state: missing key 'mode' (a mode name)");
        return -1;
    }
    const char *m = PyUnicode_AsUTF8(mode);
    st->mode = 99;
    for (uint32_t i = 0; m && i < 3; i++)
        if (strcmp(m, mode_names[i]) == 0)
            st->mode = i;
    if (st->mode == 99) {
        PyErr_Format(PyExc_ValueError, "loader state: unknown mode '%s'", m ? m : "?");
        return -1;
    }
    st->partition = 0;
    if (partition && partition != Py_None) {
        const char *p = PyUnicode_Check(partition) ? PyUnicode_AsUTF8(partition) : NULL;
        int found = -1;
        for (int i = 0; p && i < 3; i++)
            if (strcmp(p, partition_names[i]) == 0)
                found = i;
        if (found < 0) {
            PyErr_SetString(PyExc_ValueError, "loader state: 'partition' must be a partition name or None");
            return -1;
        }
        st->partition = found;
    }
#define GET_S(key, field, type)                                                                                      \
    do {                                                                                                             \
        if (dict_int(d, key, 0, &v, &u) < 0)                                                                         \
            return -1;                                                                                               \
        st->field = (type)v;                                                                                         \
    } while (0)
#define GET_U(key, field, type)                                                                                      \
    do {                                                                                                             \
        if (dict_int(d, key, 1, &v, &u) < 0)                                                                         \
            return -1;                                                                                               \
        st->field = (type)u;                                                                                         \
    } while (0)
    GET_U("version", version, uint32_t);
    GET_U("fingerprint", fingerprint, uint64_t);
    GET_U("selection", selection, uint64_t);
    GET_S("positions", positions, int64_t);
    GET_U("seed", seed, uint64_t);
    GET_S("epoch", epoch, int64_t);
    GET_S("samples_consumed", samples_consumed, int64_t);
    GET_S("batch_size", batch_size, int64_t);
    GET_S("world_size", world_size, int32_t);
    GET_S("consumers", consumers, int32_t);
    GET_S("shuffle", shuffle, int32_t);
    GET_S("drop_last", drop_last, int32_t);
    GET_S("shuffle_buffer", shuffle_buffer, int64_t);
    GET_S("episode_pool_size", episode_pool_size, int64_t);
    GET_U("settings_hash", settings_hash, uint64_t);
#undef GET_S
#undef GET_U
    /* Optional (version 1 states have none): the ranges, into a per-thread
     * buffer that lives until this thread's next state conversion (every
     * caller uses the state before converting another). */
    static _Thread_local int64_t *buf;
    static _Thread_local size_t cap;
    PyObject *ranges = PyDict_GetItemString(d, "ranges"); /* borrowed */
    if (ranges && ranges != Py_None) {
        PyObject *seq = PySequence_Fast(ranges, "loader state: 'ranges' must be a list of [start, end] pairs");
        if (!seq)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if ((size_t)n * 2 > cap) {
            int64_t *nb = realloc(buf, (size_t)n * 2 * sizeof *nb + 1);
            if (!nb) {
                Py_DECREF(seq);
                PyErr_NoMemory();
                return -1;
            }
            buf = nb;
            cap = (size_t)n * 2;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
            long long a = 0, b = 0;
            PyObject *t = PySequence_Check(pair) ? PySequence_Tuple(pair) : NULL;
            int ok = t && PyArg_ParseTuple(t, "LL", &a, &b);
            Py_XDECREF(t);
            if (!ok) {
                PyErr_Clear();
                Py_DECREF(seq);
                PyErr_Format(PyExc_ValueError, "loader state: ranges[%zd] is not a [start, end] pair of integers", i);
                return -1;
            }
            buf[2 * i] = a;
            buf[2 * i + 1] = b;
        }
        Py_DECREF(seq);
        st->num_ranges = (size_t)n;
        st->ranges = n > 0 ? buf : NULL;
    }
    return 0;
}

static int Loader_init(LoaderObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"dataset", "mode", "batch_size", "seed", "shuffle", "drop_last", "epoch", "rank",
                               "world_size", "num_consumers", "consumer", "threads", "decode_threads", "prefetch",
                               "shuffle_buffer", "partition", "episode_pool_size", "delta_timestamps", "keys",
                               "renames", "image_format", "resize", "normalize", "lerobot_shapes", "include_task",
                               "tolerance_s", "decoder_cache_entries", "state", "prefetch_cache_dir",
                               "prefetch_cache_bytes", "table_cache_bytes", "on_error", NULL};
    PyObject *on_error = NULL;
    PyObject *dataset = NULL, *mode = NULL, *partition = NULL, *deltas = NULL, *keys = NULL, *renames = NULL,
             *image_format = NULL, *resize = NULL, *normalize = NULL, *state = NULL, *prefetch_dir = NULL;
    unsigned long long prefetch_bytes = 0, table_cache_bytes = 0;
    Py_ssize_t batch_size = 32, prefetch = 4, shuffle_buffer = 0, pool_size = 16, cache_entries = 0;
    unsigned long long seed = 0;
    long long epoch = 0;
    int shuffle = 1, drop_last = 0, rank = 0, world_size = 1, num_consumers = 1, consumer = -1, threads = 0,
        decode_threads = 1, lerobot_shapes = 1, include_task = 1;
    double tolerance_s = 1e-4;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|$OnKppLiiiiiinnOnOOOOOOppdnOOKKO:Loader", keywords,
                                     &Dataset_Type, &dataset, &mode, &batch_size, &seed, &shuffle, &drop_last, &epoch,
                                     &rank, &world_size, &num_consumers, &consumer, &threads, &decode_threads,
                                     &prefetch, &shuffle_buffer, &partition, &pool_size, &deltas, &keys, &renames,
                                     &image_format, &resize, &normalize, &lerobot_shapes, &include_task, &tolerance_s,
                                     &cache_entries, &state, &prefetch_dir, &prefetch_bytes, &table_cache_bytes,
                                     &on_error))
        return -1;
    vf_loader_state resume;
    if (state && state != Py_None && dict_to_state(state, &resume) < 0)
        return -1;
    if (!((DatasetObject *)dataset)->d) {
        PyErr_SetString(PyExc_ValueError, "the dataset is not open");
        return -1;
    }
    if (batch_size < 1 || prefetch < 0 || shuffle_buffer < 0 || pool_size < 0 || cache_entries < 0) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be >= 1; prefetch, shuffle_buffer, episode_pool_size and "
                                          "decoder_cache_entries >= 0");
        return -1;
    }
    vf_loader_settings s;
    vf_loader_defaults(&s);
    static const char *const modes[] = {"map", "stream", "pool"};
    static const char *const partitions[] = {"file_group", "episode", "sequential"};
    static const char *const formats[] = {"float32", "uint8", "uint8_hwc"};
    static const char *const policies[] = {"raise", "skip"};
    int mode_i = 0, part_i = 0, fmt_i = 0, policy_i = 0;
    settings_memory mem = {0};
    PyObject *keys_hold = NULL;
    int ok = parse_choice(mode, "mode", modes, 3, &mode_i) == 0 &&
             parse_choice(partition, "partition", partitions, 3, &part_i) == 0 &&
             parse_choice(image_format, "image_format", formats, 3, &fmt_i) == 0 &&
             parse_choice(on_error, "on_error", policies, 2, &policy_i) == 0 &&
             parse_deltas(deltas, &s.sample, &mem) == 0 && parse_keys(keys, &s.sample, &mem, &keys_hold) == 0 &&
             parse_renames(renames, &s.sample, &mem) == 0 && parse_normalize(normalize, &s.sample, &mem) == 0;
    if (ok && resize && resize != Py_None) {
        int w = 0, h = 0;
        if (!PyArg_ParseTuple(resize, "ii;resize must be (width, height)", &w, &h))
            ok = 0;
        s.sample.resize_width = w;
        s.sample.resize_height = h;
    }
    if (!ok) {
        settings_memory_free(&mem);
        Py_XDECREF(keys_hold);
        return -1;
    }
    s.mode = (vf_mode)mode_i;
    s.partition = (vf_partition)part_i;
    s.sample.image_format = (vf_image_format)fmt_i;
    s.batch_size = (size_t)batch_size;
    s.seed = seed;
    s.shuffle = shuffle;
    s.drop_last = drop_last;
    s.epoch = epoch;
    s.rank = rank;
    s.world_size = world_size;
    s.num_consumers = num_consumers;
    s.consumer = consumer;
    s.threads = threads;
    s.decode_threads = decode_threads;
    s.prefetch_batches = (size_t)prefetch;
    s.shuffle_buffer = (size_t)shuffle_buffer;
    s.episode_pool_size = (size_t)pool_size;
    s.decoder_cache_entries = (size_t)cache_entries;
    s.table_cache_bytes = (size_t)table_cache_bytes;
    s.on_error = (vf_on_error)policy_i;
    s.sample.lerobot_shapes = lerobot_shapes;
    s.sample.include_task = include_task;
    s.sample.tolerance_s = tolerance_s;
    s.resume = state && state != Py_None ? &resume : NULL;
    PyObject *prefetch_path = NULL; /* bytes, owned */
    if (prefetch_dir && prefetch_dir != Py_None && !PyUnicode_FSConverter(prefetch_dir, &prefetch_path)) {
        settings_memory_free(&mem);
        Py_XDECREF(keys_hold);
        return -1;
    }
    s.prefetch_cache_dir = prefetch_path ? PyBytes_AS_STRING(prefetch_path) : NULL;
    s.prefetch_cache_bytes = prefetch_bytes;
    vf_dataset *d = ((DatasetObject *)dataset)->d;
    vf_loader *l = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_loader_open(&l, d, &s);
    Py_END_ALLOW_THREADS
    settings_memory_free(&mem);
    Py_XDECREF(keys_hold);
    Py_XDECREF(prefetch_path);
    if (r < 0) {
        vf_py_raise(r);
        return -1;
    }
    if (self->l) {
        vf_loader *old = self->l;
        Py_BEGIN_ALLOW_THREADS
        vf_loader_close(old);
        Py_END_ALLOW_THREADS
    }
    self->l = l;
    self->batch_size = (size_t)batch_size;
    Py_XSETREF(self->dataset, Py_NewRef(dataset));
    return 0;
}

static int loader_ready(LoaderObject *self)
{
    if (!self->l) {
        PyErr_SetString(PyExc_ValueError, "the loader is closed");
        return 0;
    }
    return 1;
}

/* Brackets a call that releases the GIL while using the loader (issue 10:
 * close() from another thread must not free it under that call). */
static vf_loader *loader_enter(LoaderObject *self)
{
    if (!loader_ready(self))
        return NULL;
    self->in_flight++;
    return self->l;
}

static void loader_leave(LoaderObject *self)
{
    if (--self->in_flight == 0 && self->close_pending) {
        vf_loader *l = self->close_pending;
        self->close_pending = NULL;
        Py_BEGIN_ALLOW_THREADS
        vf_loader_close(l);
        Py_END_ALLOW_THREADS
    }
}

/* After a call: was the loader closed by another thread meanwhile? */
static int closed_meanwhile(LoaderObject *self)
{
    if (self->l)
        return 0;
    PyErr_SetString(PyExc_ValueError, "the loader was closed (from another thread) during this call");
    return 1;
}

static PyObject *Loader_iter(LoaderObject *self) { return Py_NewRef(self); }

static PyObject *Loader_next(LoaderObject *self)
{
    if (!loader_ready(self))
        return NULL;
    vf_batch *b = NULL;
    int r;
    vf_loader *l = loader_enter(self);
    Py_BEGIN_ALLOW_THREADS
    r = vf_loader_next(l, &b);
    Py_END_ALLOW_THREADS
    if (closed_meanwhile(self)) {
        if (r == 0)
            vf_batch_release(b);
        loader_leave(self);
        return NULL;
    }
    loader_leave(self);
    if (r == VF_EOF)
        return NULL; /* StopIteration */
    if (r < 0)
        return vf_py_raise(r);
    return make_batch(self, b);
}

static PyObject *Loader_set_epoch(LoaderObject *self, PyObject *arg)
{
    if (!loader_ready(self))
        return NULL;
    long long epoch = PyLong_AsLongLong(arg);
    if (epoch == -1 && PyErr_Occurred())
        return NULL;
    int r;
    vf_loader *l = loader_enter(self);
    Py_BEGIN_ALLOW_THREADS
    r = vf_loader_set_epoch(l, epoch);
    Py_END_ALLOW_THREADS
    int closed = closed_meanwhile(self);
    loader_leave(self);
    if (closed)
        return NULL;
    if (r < 0)
        return vf_py_raise(r);
    Py_RETURN_NONE;
}

static PyObject *Loader_get_items(LoaderObject *self, PyObject *arg)
{
    if (!loader_ready(self))
        return NULL;
    int64_t *positions;
    size_t n;
    if (vf_py_int64_list(arg, "get_items takes a list of positions", &positions, &n) < 0)
        return NULL;
    vf_batch *b = NULL;
    int r;
    vf_loader *l = loader_enter(self);
    Py_BEGIN_ALLOW_THREADS
    r = vf_loader_get_items(l, positions, n, &b);
    Py_END_ALLOW_THREADS
    PyMem_Free(positions);
    if (closed_meanwhile(self)) {
        if (r == 0)
            vf_batch_release(b);
        loader_leave(self);
        return NULL;
    }
    loader_leave(self);
    if (r < 0)
        return vf_py_raise(r);
    return make_batch(self, b);
}

static PyObject *Loader_get_state(LoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (!loader_ready(self))
        return NULL;
    vf_loader_state st;
    int r = vf_loader_get_state(self->l, &st);
    if (r < 0)
        return vf_py_raise(r);
    return state_to_dict(&st);
}

static PyObject *Loader_set_state(LoaderObject *self, PyObject *arg)
{
    if (!loader_ready(self))
        return NULL;
    vf_loader_state st;
    if (dict_to_state(arg, &st) < 0)
        return NULL;
    int r;
    vf_loader *l = loader_enter(self);
    Py_BEGIN_ALLOW_THREADS
    r = vf_loader_set_state(l, &st);
    Py_END_ALLOW_THREADS
    int closed = closed_meanwhile(self);
    loader_leave(self);
    if (closed)
        return NULL;
    if (r < 0)
        return vf_py_raise(r);
    Py_RETURN_NONE;
}

static PyObject *Loader_get_warnings(LoaderObject *self, void *c)
{
    (void)c;
    if (!loader_ready(self))
        return NULL;
    size_t n = vf_loader_num_warnings(self->l);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *w = PyUnicode_FromString(vf_loader_warning(self->l, i));
        if (!w) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, w);
    }
    return list;
}

static PyObject *Loader_get_skips(LoaderObject *self, void *c)
{
    (void)c;
    if (!loader_ready(self))
        return NULL;
    size_t n = vf_loader_num_skips(self->l);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        const vf_loader_skip *k = vf_loader_get_skip(self->l, i);
        PyObject *d = Py_BuildValue("{sLsLszszss}", "position", (long long)k->position, "episode_index",
                                    (long long)k->episode_index, "file", k->file, "column", k->column, "message",
                                    k->message);
        if (!d) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    return list;
}

static PyObject *Loader_get_batches_delivered(LoaderObject *self, void *c)
{
    (void)c;
    return loader_ready(self) ? PyLong_FromSize_t(vf_loader_batches_delivered(self->l)) : NULL;
}

static PyObject *Loader_stats(LoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (!loader_ready(self))
        return NULL;
    vf_loader_stats st;
    vf_loader_get_stats(self->l, &st);
    PyObject *more = Py_BuildValue(
        "{s:L,s:L,s:i,s:n,s:n,s:K,s:K,s:n,s:K,s:K,s:K,s:K,s:K,s:n,s:K,s:K}", "padded_samples", (long long)st.padded_samples,
        "dropped_samples", (long long)st.dropped_samples, "empty_consumers", st.empty_consumers, "warnings",
        (Py_ssize_t)st.warnings, "pool_segments", (Py_ssize_t)st.pool_segments, "pool_admitted",
        (unsigned long long)st.pool_admitted, "pool_evicted", (unsigned long long)st.pool_evicted, "cache_capacity",
        (Py_ssize_t)st.cache_capacity, "table_reads", (unsigned long long)st.table_reads, "table_row_groups",
        (unsigned long long)st.table_row_groups, "table_rows", (unsigned long long)st.table_rows, "table_episodes",
        (unsigned long long)st.table_episodes, "table_evictions", (unsigned long long)st.table_evictions,
        "table_cache_bytes", (Py_ssize_t)st.table_cache_bytes, "table_pages_decoded",
        (unsigned long long)st.table_pages_decoded, "table_pages_skipped", (unsigned long long)st.table_pages_skipped);
    if (!more)
        return NULL;
    PyObject *out = Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:n,s:d,s:d,s:d,s:d,s:d,s:K,s:n,s:n,s:K}", "samples",
        (unsigned long long)st.samples, "batches", (unsigned long long)st.batches, "frames_delivered",
        (unsigned long long)st.frames_delivered, "frames_decoded", (unsigned long long)st.frames_decoded,
        "video_opens", (unsigned long long)st.video_opens, "cache_hits", (unsigned long long)st.cache_hits,
        "cache_misses", (unsigned long long)st.cache_misses, "cache_evictions",
        (unsigned long long)st.cache_evictions, "cache_entries", (Py_ssize_t)st.cache_entries, "wait_seconds",
        st.wait_seconds, "first_batch_seconds", st.first_batch_seconds, "p50_sample_ms", st.p50_sample_ms,
        "p95_sample_ms", st.p95_sample_ms, "p99_sample_ms", st.p99_sample_ms, "skipped",
        (unsigned long long)st.skipped, "batch_buffers", (Py_ssize_t)st.batch_buffers, "window",
        (Py_ssize_t)st.window, "samples_assembled", (unsigned long long)st.samples_assembled);
    if (out && PyDict_Update(out, more) < 0)
        Py_CLEAR(out);
    Py_DECREF(more);
    return out;
}

static PyObject *Loader_close(LoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (self->l) {
        vf_loader *l = self->l;
        self->l = NULL;
        if (self->in_flight) {
            /* Another thread is inside the loader: it closes it on return. */
            self->close_pending = l;
            Py_RETURN_NONE;
        }
        Py_BEGIN_ALLOW_THREADS
        vf_loader_close(l);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *Loader_get_num_samples(LoaderObject *self, void *c)
{
    (void)c;
    return loader_ready(self) ? PyLong_FromLongLong(vf_loader_num_samples(self->l)) : NULL;
}

static PyObject *Loader_get_num_positions(LoaderObject *self, void *c)
{
    (void)c;
    return loader_ready(self) ? PyLong_FromLongLong(vf_loader_num_positions(self->l)) : NULL;
}

static PyObject *Loader_get_num_batches(LoaderObject *self, void *c)
{
    (void)c;
    return loader_ready(self) ? PyLong_FromSize_t(vf_loader_num_batches(self->l)) : NULL;
}

static PyObject *Loader_get_dataset(LoaderObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->dataset ? self->dataset : Py_None);
}

static PyMethodDef Loader_methods[] = {
    {"set_epoch", (PyCFunction)Loader_set_epoch, METH_O, "set_epoch(e): start epoch e (drops what is queued)."},
    {"get_items", (PyCFunction)Loader_get_items, METH_O,
     "get_items(positions) -> Batch: the samples at these positions, in order."},
    {"stats", (PyCFunction)Loader_stats, METH_NOARGS, "stats() -> dict of the vf_loader_stats fields."},
    {"get_state", (PyCFunction)Loader_get_state, METH_NOARGS,
     "get_state() -> dict: the loader's position (vf_loader_state: version, mode, fingerprint, selection,\n"
     "positions, seed, epoch, samples_consumed, batch_size, world_size, consumers, shuffle, drop_last,\n"
     "partition, shuffle_buffer, episode_pool_size, settings_hash)."},
    {"set_state", (PyCFunction)Loader_set_state, METH_O,
     "set_state(state): continue where the state's callers stopped (ValueError naming what differs)."},
    {"close", (PyCFunction)Loader_close, METH_NOARGS, "close(): stop the engine threads now."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Loader_getset[] = {
    {"num_samples", (getter)Loader_get_num_samples, NULL, "samples this loader yields per epoch", NULL},
    {"num_positions", (getter)Loader_get_num_positions, NULL, "frames of the selected episodes", NULL},
    {"num_batches", (getter)Loader_get_num_batches, NULL, "batches this loader yields per epoch", NULL},
    {"dataset", (getter)Loader_get_dataset, NULL, "the Dataset", NULL},
    {"warnings", (getter)Loader_get_warnings, NULL, "warnings the loader logged (uneven splits, empty consumers)",
     NULL},
    {"skips", (getter)Loader_get_skips, NULL,
     "on_error='skip': the samples left out of delivered batches, as dicts (position, episode_index, file,\n"
     "column or None, message); at most 65,536 (stats()['skipped'] counts all)", NULL},
    {"batches_delivered", (getter)Loader_get_batches_delivered, NULL,
     "batches of the current epoch delivered (a restored loader counts the skipped ones)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Loader_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.Loader",
    .tp_basicsize = sizeof(LoaderObject),
    .tp_dealloc = (destructor)Loader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Loader(dataset, *, mode='map'|'stream', batch_size=32, seed=0, ...): batches of samples.",
    .tp_iter = (getiterfunc)Loader_iter,
    .tp_iternext = (iternextfunc)Loader_next,
    .tp_methods = Loader_methods,
    .tp_getset = Loader_getset,
    .tp_init = (initproc)Loader_init,
    .tp_new = PyType_GenericNew,
};

/* ======================================================================
 * Batch and Column
 * ==================================================================== */

static void Batch_dealloc(BatchObject *self)
{
    vf_batch_release(self->b);
    Py_XDECREF(self->loader);
    PyObject_Free(self);
}

static Py_ssize_t Batch_len(BatchObject *self) { return (Py_ssize_t)vf_batch_size(self->b); }

static PyObject *Batch_keys(BatchObject *self, PyObject *unused)
{
    (void)unused;
    size_t n = vf_batch_num_columns(self->b);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *s = PyUnicode_FromString(vf_batch_column(self->b, i)->name);
        if (!s) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, s);
    }
    return list;
}

static const char *column_format(vf_column_type t, Py_ssize_t *itemsize)
{
    switch (t) {
    case VF_COL_FLOAT32: *itemsize = 4; return "f";
    case VF_COL_FLOAT64: *itemsize = 8; return "d";
    case VF_COL_INT64: *itemsize = 8; return "q";
    case VF_COL_INT32: *itemsize = 4; return "i";
    case VF_COL_UINT8: *itemsize = 1; return "B";
    case VF_COL_BOOL: *itemsize = 1; return "?";
    case VF_COL_STRING: break;
    }
    *itemsize = 0;
    return NULL;
}

static PyObject *Batch_getitem(BatchObject *self, PyObject *key)
{
    const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!name) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "batch columns are looked up by name");
        return NULL;
    }
    const vf_column *c = vf_batch_find(self->b, name);
    if (!c) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    if (c->type == VF_COL_STRING) {
        PyObject *list = PyList_New((Py_ssize_t)c->shape[0]);
        for (int64_t i = 0; list && i < c->shape[0]; i++) {
            const char *s = c->strings[i] ? c->strings[i] : "";
            PyObject *v = PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
            if (!v) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, v);
        }
        return list;
    }
    ColumnObject *o = PyObject_New(ColumnObject, &Column_Type);
    if (!o)
        return NULL;
    o->batch = self;
    Py_INCREF(self);
    o->col = c;
    Py_ssize_t itemsize;
    column_format(c->type, &itemsize);
    Py_ssize_t stride = itemsize;
    for (int k = c->ndim - 1; k >= 0; k--) {
        o->shape[k] = (Py_ssize_t)c->shape[k];
        o->strides[k] = stride;
        stride *= o->shape[k];
    }
    return (PyObject *)o;
}

static int Batch_contains(BatchObject *self, PyObject *key)
{
    const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!name) {
        PyErr_Clear();
        return 0;
    }
    return vf_batch_find(self->b, name) != NULL;
}

static PyObject *Batch_get_positions(BatchObject *self, void *c)
{
    (void)c;
    size_t n = vf_batch_size(self->b);
    const int64_t *p = vf_batch_positions(self->b);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(p[i]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

static PyMappingMethods Batch_mapping = {
    .mp_length = (lenfunc)Batch_len,
    .mp_subscript = (binaryfunc)Batch_getitem,
};

static PySequenceMethods Batch_sequence = {
    .sq_contains = (objobjproc)Batch_contains,
};

static PyMethodDef Batch_methods[] = {
    {"keys", (PyCFunction)Batch_keys, METH_NOARGS, "keys() -> column names in order"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Batch_getset[] = {
    {"positions", (getter)Batch_get_positions, NULL, "positions of the samples (rows of the selected frames)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Batch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch: batch[name] is a zero-copy Column (buffer protocol) or a list of str.",
    .tp_as_mapping = &Batch_mapping,
    .tp_as_sequence = &Batch_sequence,
    .tp_methods = Batch_methods,
    .tp_getset = Batch_getset,
};

static void Column_dealloc(ColumnObject *self)
{
    Py_XDECREF(self->batch);
    PyObject_Free(self);
}

static int Column_getbuffer(ColumnObject *self, Py_buffer *view, int flags)
{
    const vf_column *c = self->col;
    Py_ssize_t itemsize;
    const char *format = column_format(c->type, &itemsize);
    if (!format) {
        PyErr_SetString(PyExc_BufferError, "string columns have no buffer");
        view->obj = NULL;
        return -1;
    }
    view->buf = c->data;
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->len = (Py_ssize_t)c->nbytes;
    view->readonly = 0;
    view->itemsize = itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)format : NULL;
    view->ndim = c->ndim;
    view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyBufferProcs Column_buffer = {
    .bf_getbuffer = (getbufferproc)Column_getbuffer,
};

static PyObject *Column_get_shape(ColumnObject *self, void *c)
{
    (void)c;
    PyObject *t = PyTuple_New(self->col->ndim);
    for (int k = 0; t && k < self->col->ndim; k++)
        PyTuple_SET_ITEM(t, k, PyLong_FromSsize_t(self->shape[k]));
    return t;
}

static PyObject *Column_get_dtype(ColumnObject *self, void *c)
{
    (void)c;
    static const char *names[] = {"float32", "float64", "int64", "int32", "uint8", "bool", "str"};
    return PyUnicode_FromString(names[self->col->type]);
}

static PyObject *Column_get_name(ColumnObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(self->col->name);
}

static PyObject *Column_get_address(ColumnObject *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(self->col->data);
}

static PyObject *Column_get_nbytes(ColumnObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(self->col->nbytes);
}

static PyGetSetDef Column_getset[] = {
    {"shape", (getter)Column_get_shape, NULL, "shape, batch dimension first", NULL},
    {"dtype", (getter)Column_get_dtype, NULL, "element type name (numpy spelling)", NULL},
    {"name", (getter)Column_get_name, NULL, "column name", NULL},
    {"address", (getter)Column_get_address, NULL, "address of the first element (engine memory)", NULL},
    {"nbytes", (getter)Column_get_nbytes, NULL, "bytes of the column", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Column_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.Column",
    .tp_basicsize = sizeof(ColumnObject),
    .tp_dealloc = (destructor)Column_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A zero-copy view of one batch column (buffer protocol); keeps the batch alive.",
    .tp_as_buffer = &Column_buffer,
    .tp_getset = Column_getset,
};

/* ======================================================================
 * plan()
 * ==================================================================== */

static PyObject *py_plan(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"root", "episodes", "world_size", "num_consumers", NULL};
    PyObject *path_obj, *episodes_obj = Py_None;
    int world_size = 1, num_consumers = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|Oii:plan", keywords, PyUnicode_FSConverter, &path_obj,
                                     &episodes_obj, &world_size, &num_consumers))
        return NULL;
    int64_t *episodes = NULL;
    size_t n = 0;
    if (episodes_obj != Py_None &&
        vf_py_int64_list(episodes_obj, "episodes must be a sequence of episode indices", &episodes, &n) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = episodes_obj != Py_None ? episodes : NULL;
    s.num_episodes = n;
    s.check_files = 0;
    vf_dataset *d = NULL;
    char *text = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_open(&d, PyBytes_AS_STRING(path_obj), &s);
    if (r == 0)
        r = vf_plan_json(d, world_size, num_consumers, 0, &text);
    vf_dataset_close(d);
    Py_END_ALLOW_THREADS
    PyMem_Free(episodes);
    Py_DECREF(path_obj);
    if (r < 0)
        return vf_py_raise(r);
    PyObject *result = json_loads(text);
    free(text);
    return result;
}

static PyObject *py_set_log_level(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *level_obj = Py_None;
    if (!PyArg_ParseTuple(args, "|O:set_log_level", &level_obj))
        return NULL;
    int level;
    if (level_obj == Py_None) {
        level = vf_log_level(); /* the VF_LOG environment variable, default warnings */
    } else {
        level = (int)PyLong_AsLong(level_obj);
        if (level == -1 && PyErr_Occurred())
            return NULL;
        if (level < 0 || level > 3) {
            PyErr_SetString(PyExc_ValueError, "log level must be 0 (errors), 1 (warnings), 2 (info) or 3 (debug)");
            return NULL;
        }
    }
    vf_set_log_level(level);
    Py_RETURN_NONE;
}

static PyObject *loader_state_impl(PyObject *self, PyObject *args, PyObject *kwargs, int want_resolve)
{
    (void)self;
    static char *keywords[] = {"dataset", "epoch", "batches", "mode", "batch_size", "seed", "shuffle", "drop_last",
                               "world_size", "num_consumers", "shuffle_buffer", "partition", "episode_pool_size",
                               "resume", NULL};
    PyObject *dataset = NULL, *mode = NULL, *partition = NULL, *resume = NULL;
    long long epoch = 0, batches = 0;
    Py_ssize_t batch_size = 32, shuffle_buffer = 0, pool_size = 16;
    unsigned long long seed = 0;
    int shuffle = 1, drop_last = 0, world_size = 1, num_consumers = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|$LLOnKppiinOnO:loader_state", keywords, &Dataset_Type,
                                     &dataset, &epoch, &batches, &mode, &batch_size, &seed, &shuffle, &drop_last,
                                     &world_size, &num_consumers, &shuffle_buffer, &partition, &pool_size, &resume))
        return NULL;
    vf_loader_state resumed;
    if (resume && resume != Py_None && dict_to_state(resume, &resumed) < 0)
        return NULL;
    if (!((DatasetObject *)dataset)->d) {
        PyErr_SetString(PyExc_ValueError, "the dataset is not open");
        return NULL;
    }
    if (batch_size < 1 || shuffle_buffer < 0 || pool_size < 0) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be >= 1; shuffle_buffer and episode_pool_size >= 0");
        return NULL;
    }
    int mode_i = 0, part_i = 0;
    if (parse_choice(mode, "mode", mode_names, 3, &mode_i) < 0 ||
        parse_choice(partition, "partition", partition_names, 3, &part_i) < 0)
        return NULL;
    vf_loader_settings s;
    vf_loader_defaults(&s);
    s.mode = (vf_mode)mode_i;
    s.partition = (vf_partition)part_i;
    s.batch_size = (size_t)batch_size;
    s.seed = seed;
    s.shuffle = shuffle;
    s.drop_last = drop_last;
    s.world_size = world_size;
    s.num_consumers = num_consumers;
    s.shuffle_buffer = (size_t)shuffle_buffer;
    s.episode_pool_size = (size_t)pool_size;
    s.resume = resume && resume != Py_None ? &resumed : NULL;
    vf_loader_state st;
    int r;
    vf_dataset *d = ((DatasetObject *)dataset)->d;
    if (want_resolve) {
        if (!s.resume) {
            PyErr_SetString(PyExc_TypeError, "resolve_state: a state (resume=) is required");
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        r = vf_loader_state_resolve(d, &s, s.resume, &st);
        Py_END_ALLOW_THREADS
        if (r < 0)
            return vf_py_raise(r);
        PyObject *out = state_to_dict(&st);
        free((void *)st.ranges);
        return out;
    }
    r = vf_loader_state_at(d, &s, epoch, batches, &st);
    if (r < 0)
        return vf_py_raise(r);
    return state_to_dict(&st);
}

static PyObject *py_loader_state(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return loader_state_impl(self, args, kwargs, 0);
}

static PyObject *py_resolve_state(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return loader_state_impl(self, args, kwargs, 1);
}

static PyObject *py_plan_report(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"dataset", "mode", "partition", "world_size", "workers", "batch_size", "seed",
                               "epoch", "shuffle", "drop_last", "shuffle_buffer", "episode_pool_size", "tasks",
                               "rank", "worker", "resume", "video_files", NULL};
    PyObject *dataset = NULL, *mode = NULL, *partition = NULL, *resume = NULL;
    int world_size = 1, workers = 1, shuffle = 1, drop_last = 0, tasks = 0, rank = -1, worker = -1, files = 1;
    /* tasks: 0 none, 1 the partition's, 2 every consumer's pieces (rank -1) */
    Py_ssize_t batch_size = 32, shuffle_buffer = 0, pool_size = 16;
    unsigned long long seed = 0;
    long long epoch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|$OOiinKLppnniiiOp:plan_report", keywords, &Dataset_Type,
                                     &dataset, &mode, &partition, &world_size, &workers, &batch_size, &seed, &epoch,
                                     &shuffle, &drop_last, &shuffle_buffer, &pool_size, &tasks, &rank, &worker,
                                     &resume, &files))
        return NULL;
    if (!((DatasetObject *)dataset)->d) {
        PyErr_SetString(PyExc_ValueError, "the dataset is not open");
        return NULL;
    }
    if (batch_size < 1 || shuffle_buffer < 0 || pool_size < 1 || world_size < 1 || workers < 1 || epoch < 0) {
        PyErr_SetString(PyExc_ValueError, "plan: world_size, workers, batch_size and episode_pool_size must be >= 1; "
                                          "shuffle_buffer and epoch >= 0");
        return NULL;
    }
    if ((rank >= 0) != (worker >= 0)) {
        PyErr_SetString(PyExc_ValueError, "plan: rank and worker go together");
        return NULL;
    }
    int mode_i = 1, part_i = 0;
    if (parse_choice(mode, "mode", mode_names, 3, &mode_i) < 0 ||
        parse_choice(partition, "partition", partition_names, 3, &part_i) < 0)
        return NULL;
    vf_loader_state resumed;
    if (resume && resume != Py_None && dict_to_state(resume, &resumed) < 0)
        return NULL;
    vf_loader_settings s;
    vf_loader_defaults(&s);
    s.mode = (vf_mode)mode_i;
    s.partition = (vf_partition)part_i;
    s.world_size = world_size;
    s.num_consumers = workers;
    s.batch_size = (size_t)batch_size;
    s.seed = seed;
    s.shuffle = shuffle;
    s.drop_last = drop_last;
    s.shuffle_buffer = (size_t)shuffle_buffer;
    s.episode_pool_size = (size_t)pool_size;
    s.resume = resume && resume != Py_None ? &resumed : NULL;
    char *doc = NULL;
    int r;
    vf_dataset *d = ((DatasetObject *)dataset)->d;
    Py_BEGIN_ALLOW_THREADS
    r = vf_plan_report_json(d, &s, epoch, tasks, rank, worker, files ? 0 : VF_PLAN_NO_FILES, &doc);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return vf_py_raise(r);
    PyObject *out = PyUnicode_FromString(doc);
    free(doc);
    return out;
}

static PyObject *py_state_batches(PyObject *self, PyObject *arg)
{
    (void)self;
    vf_loader_state st;
    if (dict_to_state(arg, &st) < 0)
        return NULL;
    int64_t k;
    int r = vf_loader_state_batches(&st, &k);
    if (r < 0)
        return vf_py_raise(r);
    return PyLong_FromLongLong(k);
}

static PyMethodDef loader_functions[] = {
    {"loader_state", (PyCFunction)(void (*)(void))py_loader_state, METH_VARARGS | METH_KEYWORDS,
     "loader_state(dataset, *, epoch, batches, mode, batch_size, seed, shuffle, drop_last, world_size,\n"
     "num_consumers, shuffle_buffer, partition, episode_pool_size, resume=None) -> dict\n\n"
     "The state a rank-level loader with these settings reports after `batches` batches of `epoch`\n"
     "(vf_loader_state_at): for a process that receives every worker's batches. resume: the resolved\n"
     "state the epoch started from (resolve_state), whose remaining ranges the batches count within."},
    {"resolve_state", (PyCFunction)(void (*)(void))py_resolve_state, METH_VARARGS | METH_KEYWORDS,
     "resolve_state(dataset, *, resume, mode, batch_size, seed, shuffle, drop_last, world_size, num_consumers,\n"
     "shuffle_buffer, partition, episode_pool_size) -> dict\n"
     "The state `resume` becomes for loaders with these settings (vf_loader_state_resolve): itself when the\n"
     "layout (world_size, consumers, batch_size) matches, else (elastic resume) the start of what remains of\n"
     "its epoch, as remaining ranges. Resolve once and hand the result to every worker."},
    {"plan_report", (PyCFunction)(void (*)(void))py_plan_report, METH_VARARGS | METH_KEYWORDS,
     "plan_report(dataset, *, mode='stream', partition='file_group', world_size=1, workers=1, batch_size=32,\n"
     "seed=0, epoch=0, shuffle=True, drop_last=False, shuffle_buffer=0, episode_pool_size=16, tasks=False,\n"
     "rank=-1, worker=-1, resume=None, video_files=True) -> str: the `vlafeed plan --json` document (vf_plan_report_json)."},
    {"state_batches", (PyCFunction)py_state_batches, METH_O,
     "state_batches(state) -> int: the rank-level batches a state stands for."},
    {"set_log_level", (PyCFunction)py_set_log_level, METH_VARARGS,
     "set_log_level(level=None): how much vlafeed and FFmpeg print (0 errors, 1 warnings, 2 info,\n"
     "3 debug); None: the VF_LOG environment variable's level (default warnings)."},
    {"plan", (PyCFunction)(void (*)(void))py_plan, METH_VARARGS | METH_KEYWORDS,
     "plan(root, episodes=None, world_size=1, num_consumers=1) -> dict\n\n"
     "The `vlafeed plan --json` document: tasks and MP4 opens per partition strategy."},
    {NULL, NULL, 0, NULL},
};

int vf_py_register_loader(PyObject *module)
{
    PyTypeObject *types[] = {&Dataset_Type, &Loader_Type, &Batch_Type, &Column_Type};
    const char *names[] = {"Dataset", "Loader", "Batch", "Column"};
    for (size_t i = 0; i < 4; i++) {
        if (PyType_Ready(types[i]) < 0)
            return -1;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(module, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            return -1;
        }
    }
    return PyModule_AddFunctions(module, loader_functions);
}
