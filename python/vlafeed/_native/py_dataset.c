/*
 * py_dataset.c: the dataset area of vlafeed._native.
 *
 *   Dataset(root, episodes=None, on_metadata_error="raise", check_videos=1, check_files=None,
 *           video_mismatch=None, meta_cache=True)
 *       an open dataset (vf_dataset): metadata getters, info(), subset()
 *   dataset_info(path, episodes=None, check_data=True, check_files=None, check_videos=True,
 *                meta_cache=True) -> dict
 *       the `vlafeed info --json` document (docs/info-json.md), parsed with
 *       Python's json module so both always carry the same content. A
 *       dataset that cannot be opened raises (FileNotFoundError for a
 *       missing folder, file or episode; VlafeedError for corrupt or
 *       unsupported metadata); problems found in an opened dataset are in
 *       the dict.
 *   plan(root, episodes=None, world_size=1, num_consumers=1) -> dict
 *       the `vlafeed plan --json` document
 *   dataset_read_table(path, columns, episodes=None)
 *       -> (episode_start: list[int], {column: (bytes | list[str], dtype, width)})
 *       a test hook over the engine's table reader (vf_ds_read_table): the
 *       rows of the selected episodes, in ascending episode order, with
 *       `index` verified. dtype is "float32", "int64" or "str"; numeric
 *       columns come as raw little-endian bytes of shape [rows, width] for
 *       numpy.frombuffer.
 *
 * The open settings of Dataset(), dataset_info() and plan() are settings
 * tables (settings.h). The GIL is released while a dataset opens.
 */
#include "settings.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "dataset/dataset.h"
#include "vlafeed/dataset.h"
#include "vlafeed/loader.h"

/* ======================================================================
 * Opening a dataset from a call's arguments
 * ==================================================================== */

typedef struct dataset_args {
    vf_dataset_settings s;
    PyObject *path;               /* bytes (owned) */
    int64_t *episodes;            /* s.episodes (PyMem) */
    int lenient;                  /* Dataset(): on_metadata_error="warn" */
    int world_size, num_consumers; /* plan() */
} dataset_args;

static void args_init(dataset_args *a)
{
    memset(a, 0, sizeof *a);
    vf_dataset_defaults(&a->s);
    a->world_size = a->num_consumers = 1;
}

static void args_free(dataset_args *a)
{
    Py_CLEAR(a->path);
    PyMem_Free(a->episodes);
    a->episodes = NULL;
}

static int episodes_into(PyObject *obj, dataset_args *a, const char *what)
{
    size_t n = 0;
    if (vf_py_int64_list(obj, what, &a->episodes, &n) < 0)
        return -1;
    a->s.episodes = a->episodes;
    a->s.num_episodes = n;
    return 0;
}

/* episodes: the episode indices to select (None: all). */
static int parse_episodes(PyObject *obj, void *options)
{
    return episodes_into(obj, options, "episodes must be a sequence of episode indices");
}

static int parse_episode_integers(PyObject *obj, void *options)
{
    return episodes_into(obj, options, "episodes must be a sequence of integers");
}

/* check_files: None (default: at open up to VF_LAZY_FILE_CHECKS files, else
 * when first opened), True (always at open), False (never at open). */
static int parse_check_files(PyObject *obj, void *options)
{
    int truth = PyObject_IsTrue(obj);
    if (truth < 0)
        return -1;
    ((dataset_args *)options)->s.check_files = truth ? VF_CHECK_FILES_ALL : VF_CHECK_FILES_OFF;
    return 0;
}

static const vf_py_choice metadata_policies[] = {{"raise", 0}, {"warn", 1}, {NULL, 0}};
static const vf_py_choice mismatch_policies[] = {
    {"refuse", VF_VIDEO_MISMATCH_REFUSE}, {"timestamp", VF_VIDEO_MISMATCH_TIMESTAMP}, {NULL, 0}};

#define D dataset_args
#define EPISODES(parser) {"episodes", VF_PY_OBJECT, .parse = parser}
#define CHECK_FILES {"check_files", VF_PY_OBJECT, .parse = parse_check_files}
#define TABLE(list) list, (int)(sizeof list / sizeof list[0])

static const vf_py_setting dataset_list[] = {
    {"root", VF_PY_PATH, VF_PY_FIELD(D, path)},
    EPISODES(parse_episodes),
    {"on_metadata_error", VF_PY_STR, VF_PY_FIELD(D, lenient), .choices = metadata_policies,
     .error = "on_metadata_error must be \"raise\" or \"warn\", not \"%s\""},
    {"check_videos", VF_PY_INT, VF_PY_FIELD(D, s.check_videos)}, /* 1 local roots (default), 2 remote too, 0 off */
    CHECK_FILES,
    /* not given: VF_VIDEO_MISMATCH in the environment, else "refuse" */
    {"video_mismatch", VF_PY_STR, VF_PY_FIELD(D, s.video_mismatch), .choices = mismatch_policies,
     .error = "video_mismatch must be \"refuse\" or \"timestamp\", not \"%s\""},
    {"meta_cache", VF_PY_BOOL, VF_PY_FIELD(D, s.meta_cache)}, /* the persistent metadata cache (default on) */
};
static const vf_py_setting info_list[] = {
    {"path", VF_PY_PATH, VF_PY_FIELD(D, path)},
    EPISODES(parse_episode_integers),
    {"check_data", VF_PY_BOOL, VF_PY_FIELD(D, s.check_data_files)},
    CHECK_FILES,
    {"check_videos", VF_PY_BOOL, VF_PY_FIELD(D, s.check_videos)},
    {"meta_cache", VF_PY_BOOL, VF_PY_FIELD(D, s.meta_cache)},
};
static const vf_py_setting plan_list[] = {
    {"root", VF_PY_PATH, VF_PY_FIELD(D, path)},
    EPISODES(parse_episodes),
    {"world_size", VF_PY_INT, VF_PY_FIELD(D, world_size)},
    {"num_consumers", VF_PY_INT, VF_PY_FIELD(D, num_consumers)},
};
#undef D
static const vf_py_settings dataset_settings = {"Dataset", TABLE(dataset_list), 1, 5, NULL};
static const vf_py_settings info_settings = {"dataset_info", TABLE(info_list), 1, 5, NULL};
static const vf_py_settings plan_settings = {"plan", TABLE(plan_list), 1, 4, NULL};

/* Opens a->path with a->s, the GIL released: 0 with *out, or -1 with the error raised. */
static int open_dataset(const dataset_args *a, vf_dataset **out)
{
    int r;
    *out = NULL;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_open(out, PyBytes_AS_STRING(a->path), &a->s);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        vf_dataset_close(*out);
        *out = NULL;
        vf_py_raise(r);
        return -1;
    }
    return 0;
}

/* Parses a call's arguments by spec into a (initialised) and opens the dataset:
 * 0 with *out, or -1 with an exception set. */
static int open_from_args(const vf_py_settings *spec, PyObject *args, PyObject *kwargs, dataset_args *a,
                          vf_dataset **out)
{
    *out = NULL;
    return vf_py_parse_settings(spec, args, kwargs, a) < 0 ? -1 : open_dataset(a, out);
}

/* The info (plan: the plan) JSON document of d, made without the GIL and
 * parsed; d is closed. */
static PyObject *document(vf_dataset *d, const dataset_args *plan)
{
    char *text = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = plan ? vf_plan_json(d, plan->world_size, plan->num_consumers, 0, &text) : vf_dataset_info_json(d, 0, &text);
    vf_dataset_close(d);
    Py_END_ALLOW_THREADS
    PyObject *result = r < 0 ? vf_py_raise(r) : vf_py_json_loads(text);
    free(text);
    return result;
}

/* ======================================================================
 * Dataset
 * ==================================================================== */

typedef struct {
    PyObject_HEAD
    vf_dataset *d;
    PyObject *parent; /* a subset's source Dataset, kept open while the subset lives */
} DatasetObject;

vf_dataset *vf_py_dataset(PyObject *dataset)
{
    vf_dataset *d = dataset ? ((DatasetObject *)dataset)->d : NULL;
    if (!d)
        PyErr_SetString(PyExc_ValueError, "the dataset is not open");
    return d;
}

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
    dataset_args a;
    args_init(&a);
    vf_dataset *d = NULL;
    int r = open_from_args(&dataset_settings, args, kwargs, &a, &d);
    args_free(&a);
    if (r < 0)
        return -1;
    /* issue 10: metadata errors `vlafeed info` reports fail the open too. */
    if (vf_py_check_metadata(d, a.lenient) < 0) {
        vf_dataset_close(d);
        return -1;
    }
    if (self->d)
        vf_dataset_close(self->d);
    Py_CLEAR(self->parent);
    self->d = d;
    return 0;
}

static PyObject *Dataset_info(DatasetObject *self, PyObject *unused)
{
    (void)unused;
    vf_dataset *d = vf_py_dataset((PyObject *)self);
    if (!d)
        return NULL;
    char *text = NULL;
    int r = vf_dataset_info_json(d, 0, &text);
    PyObject *result = r < 0 ? vf_py_raise(r) : vf_py_json_loads(text);
    free(text);
    return result;
}

static PyObject *Dataset_subset(DatasetObject *self, PyObject *episodes_obj)
{
    if (!vf_py_dataset((PyObject *)self))
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
    if (r < 0)
        return vf_py_raise(r);
    DatasetObject *out = (DatasetObject *)vf_py_dataset_type.tp_alloc(&vf_py_dataset_type, 0);
    if (out) {
        out->d = sub;
        out->parent = Py_NewRef(self); /* the subset borrows its source's metadata */
    } else {
        vf_dataset_close(sub);
    }
    return (PyObject *)out;
}

/* ---- metadata getters ---- */

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

static PyObject *features(const vf_dataset *d)
{
    PyObject *dict = PyDict_New();
    for (size_t i = 0; dict && i < vf_dataset_num_features(d); i++) {
        const vf_feature *f = vf_dataset_feature(d, i);
        PyObject *shape = PyTuple_New(f->ndim);
        for (int k = 0; shape && k < f->ndim; k++)
            PyTuple_SET_ITEM(shape, k, PyLong_FromLongLong(f->shape[k]));
        PyObject *entry = shape ? Py_BuildValue("{s:s,s:N,s:s}", "dtype", f->dtype, "shape", shape, "kind",
                                                vf_feature_kind_name(f->kind))
                                : NULL;
        if (!entry || PyDict_SetItemString(dict, f->name, entry) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(entry);
    }
    return dict;
}

/* {feature: {stat: nested list}}, each stat in its shape (flat when the shape does not match its size). */
static PyObject *stats(const vf_dataset *d)
{
    PyObject *dict = PyDict_New();
    for (size_t i = 0; dict && i < vf_dataset_num_stats(d); i++) {
        const vf_stat *st = vf_dataset_stat(d, i);
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
        for (int j = 0; j < ndim; j++)
            product *= shape[j];
        if (product != (int64_t)st->size) {
            shape = &flat;
            ndim = 1;
        }
        PyObject *v = nested(st->values, shape, ndim, &k);
        if (!v || PyDict_SetItemString(per, st->name, v) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(v);
    }
    return dict;
}

static PyObject *camera_key(const void *d, size_t i)
{
    return PyUnicode_FromString(vf_dataset_camera(d, i)->key);
}

static PyObject *task_string(const void *d, size_t i)
{
    const char *t = vf_dataset_task(d, i);
    return PyUnicode_DecodeUTF8(t ? t : "", (Py_ssize_t)strlen(t ? t : ""), "replace");
}

static PyObject *episode_entry(const void *d, size_t i)
{
    const vf_episode *e = vf_dataset_episode(d, i);
    return Py_BuildValue("{s:L,s:L,s:L,s:L}", "episode_index", (long long)e->episode_index, "length",
                         (long long)e->length, "from_index", (long long)e->from_index, "to_index",
                         (long long)e->to_index);
}

static PyObject *problem_entry(const void *d, size_t i)
{
    const vf_problem *p = vf_dataset_problem(d, i);
    return Py_BuildValue("{s:s,s:s,s:L,s:s,s:s,s:O}", "severity",
                         p->severity == VF_SEVERITY_ERROR ? "error" : "warning", "file", p->file, "episode",
                         (long long)p->episode, "column", p->column, "message", p->message, "changes_samples",
                         p->changes_samples ? Py_True : Py_False);
}

enum dataset_getter {
    GET_ROOT, GET_FPS, GET_NUM_EPISODES, GET_TOTAL_FRAMES, GET_TOTAL_EPISODES, GET_FINGERPRINT, GET_CAMERA_KEYS,
    GET_FEATURES, GET_TASKS, GET_STATS, GET_EPISODES, GET_PROBLEMS,
};

/* The metadata the engine hands out as is. */
static PyObject *Dataset_get(DatasetObject *self, void *which)
{
    const vf_dataset *d = vf_py_dataset((PyObject *)self);
    if (!d)
        return NULL;
    switch ((enum dataset_getter)(intptr_t)which) {
    case GET_ROOT: return PyUnicode_DecodeFSDefault(vf_dataset_root(d));
    case GET_FPS: return PyFloat_FromDouble(vf_dataset_fps(d));
    case GET_NUM_EPISODES: return PyLong_FromSize_t(vf_dataset_num_episodes(d));
    case GET_TOTAL_FRAMES: return PyLong_FromLongLong(vf_dataset_total_frames(d));
    case GET_TOTAL_EPISODES: return PyLong_FromLongLong(vf_dataset_total_episodes(d));
    case GET_FINGERPRINT: return PyLong_FromUnsignedLongLong(vf_dataset_fingerprint(d));
    case GET_CAMERA_KEYS: return vf_py_list(vf_dataset_num_cameras(d), camera_key, d);
    case GET_FEATURES: return features(d);
    case GET_TASKS: return vf_py_list(vf_dataset_num_tasks(d), task_string, d);
    case GET_STATS: return stats(d);
    case GET_EPISODES: return vf_py_list(vf_dataset_num_episodes(d), episode_entry, d);
    case GET_PROBLEMS: return vf_py_list(vf_dataset_num_problems(d), problem_entry, d);
    }
    Py_RETURN_NONE;
}

static PyObject *Dataset_get_num_frames(DatasetObject *self, void *unused)
{
    (void)unused;
    const vf_dataset *d = vf_py_dataset((PyObject *)self);
    long long frames = 0;
    for (size_t i = 0; d && i < vf_dataset_num_episodes(d); i++)
        frames += vf_dataset_episode(d, i)->length;
    return d ? PyLong_FromLongLong(frames) : NULL;
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
    {"root", (getter)Dataset_get, NULL, "the dataset folder", VF_PY_WHICH(GET_ROOT)},
    {"fps", (getter)Dataset_get, NULL, "frames per second", VF_PY_WHICH(GET_FPS)},
    {"num_frames", (getter)Dataset_get_num_frames, NULL, "frames of the selected episodes", NULL},
    {"num_episodes", (getter)Dataset_get, NULL, "selected episodes", VF_PY_WHICH(GET_NUM_EPISODES)},
    {"total_frames", (getter)Dataset_get, NULL, "info.json total_frames", VF_PY_WHICH(GET_TOTAL_FRAMES)},
    {"total_episodes", (getter)Dataset_get, NULL, "info.json total_episodes", VF_PY_WHICH(GET_TOTAL_EPISODES)},
    {"fingerprint", (getter)Dataset_get, NULL, "64-bit identity of the dataset", VF_PY_WHICH(GET_FINGERPRINT)},
    {"camera_keys", (getter)Dataset_get, NULL, "video feature names", VF_PY_WHICH(GET_CAMERA_KEYS)},
    {"features", (getter)Dataset_get, NULL, "{name: {dtype, shape, kind}} in info.json order",
     VF_PY_WHICH(GET_FEATURES)},
    {"tasks", (getter)Dataset_get, NULL, "task strings by task_index", VF_PY_WHICH(GET_TASKS)},
    {"stats", (getter)Dataset_get, NULL, "{feature: {stat: nested list}}", VF_PY_WHICH(GET_STATS)},
    {"episodes", (getter)Dataset_get, NULL, "selected episodes: episode_index, length, from/to_index",
     VF_PY_WHICH(GET_EPISODES)},
    {"problems", (getter)Dataset_get, NULL,
     "the problems found at open: dicts of severity, file, episode (-1: none), column, message (without\n"
     "building the whole info() document)",
     VF_PY_WHICH(GET_PROBLEMS)},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject vf_py_dataset_type = {
    VF_PY_CLASS("Dataset", DatasetObject, Dataset_dealloc,
                "Dataset(root, episodes=None, on_metadata_error=\"raise\", check_videos=1, check_files=None): an "
                "open LeRobot dataset (v3.0, v2.1). Metadata errors raise unless on_metadata_error=\"warn\"; "
                "check_videos indexes the videos at open (1 local roots, 2 remote too, 0 off); check_files: None "
                "checks the files exist at open up to 10,000 files, True always, False never; meta_cache=False "
                "neither reads nor writes the persistent metadata cache (VF_CACHE_DIR, VF_META_CACHE=0).",
                Dataset_init, Dataset_methods, Dataset_getset),
};

/* ======================================================================
 * dataset_info(), plan()
 * ==================================================================== */

/* dataset_info() and plan(): opens the dataset the call names, returns its document. */
static PyObject *open_document(const vf_py_settings *spec, PyObject *args, PyObject *kwargs)
{
    int plan = spec == &plan_settings;
    dataset_args a;
    args_init(&a);
    if (plan)
        a.s.check_files = VF_CHECK_FILES_OFF;
    else
        a.s.check_data_files = 1; /* check_data=True */
    vf_dataset *d = NULL;
    int r = open_from_args(spec, args, kwargs, &a, &d);
    args_free(&a);
    return r < 0 ? NULL : document(d, plan ? &a : NULL);
}

static PyObject *py_dataset_info(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    return open_document(&info_settings, args, kwargs);
}

static PyObject *py_plan(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    return open_document(&plan_settings, args, kwargs);
}

/* ======================================================================
 * The strict-open rule
 * ==================================================================== */

/* Metadata problems that make a dataset unfit to load as described: every
 * error-severity problem found in meta/ (duplicate, missing or overlapping
 * episodes, totals that disagree, a broken task table), statistics aside
 * (they are ignored when bad, and never change which samples are served). */
static int is_blocking_problem(const vf_problem *p)
{
    return p->severity == VF_SEVERITY_ERROR && !strncmp(p->file, "meta/", 5) && !strstr(p->file, "stats");
}

static char *format_problem(const vf_dataset *d, const vf_problem *p)
{
    char episode[48] = "", column[300] = "";
    if (p->episode >= 0)
        snprintf(episode, sizeof episode, " [episode %lld]", (long long)p->episode);
    if (p->column[0])
        snprintf(column, sizeof column, " [%.280s]", p->column);
    return vf_asprintf("%s/%s%s%s: %s", vf_dataset_root(d), p->file, episode, column, p->message);
}

int vf_py_check_metadata(const vf_dataset *d, int lenient)
{
    size_t blocking = 0;
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        if (!is_blocking_problem(p))
            continue;
        char *text = format_problem(d, p);
        if (!text) {
            PyErr_NoMemory();
            return -1;
        }
        if (!lenient) {
            PyErr_Format(vf_py_error_type,
                         "%s (inconsistent dataset metadata; `vlafeed info` reports it too; pass "
                         "on_metadata_error=\"warn\" to load anyway)",
                         text);
            free(text);
            return -1;
        }
        int w = PyErr_WarnFormat(PyExc_UserWarning, 2, "vlafeed: %s (loaded anyway: on_metadata_error=\"warn\")",
                                 text);
        free(text);
        if (w < 0)
            return -1;
        blocking++;
    }
    return (int)VF_MIN(blocking, (size_t)INT32_MAX);
}

/* ======================================================================
 * dataset_read_table() (test hook)
 * ==================================================================== */

static PyObject *string_cell(const void *column, size_t i)
{
    const vf_ds_column *c = column;
    return PyUnicode_DecodeUTF8(c->data + c->offsets[i], (Py_ssize_t)(c->offsets[i + 1] - c->offsets[i]), "replace");
}

static PyObject *column_to_python(const vf_ds_column *c)
{
    if (c->type == VF_DS_STRING) {
        PyObject *list = vf_py_list((size_t)c->rows, string_cell, c);
        return list ? Py_BuildValue("(Nsn)", list, "str", (Py_ssize_t)1) : NULL;
    }
    size_t elem = c->type == VF_DS_F32 ? sizeof(float) : sizeof(int64_t);
    PyObject *bytes = PyBytes_FromStringAndSize(c->values, (Py_ssize_t)((size_t)c->rows * (size_t)c->width * elem));
    if (!bytes)
        return NULL;
    return Py_BuildValue("(Nsn)", bytes, c->type == VF_DS_F32 ? "float32" : "int64", (Py_ssize_t)c->width);
}

static PyObject *episode_start(const void *table, size_t i)
{
    return PyLong_FromLongLong(((const vf_ds_table *)table)->episode_start[i]);
}

/* (episode_start, {column: ...}) of a table read. */
static PyObject *table_to_python(const vf_ds_table *t)
{
    PyObject *starts = vf_py_list(t->num_episodes + 1, episode_start, t);
    PyObject *cols = PyDict_New();
    int ok = starts && cols;
    for (size_t i = 0; ok && i < t->num_columns; i++) {
        PyObject *v = column_to_python(&t->columns[i]);
        ok = v && PyDict_SetItemString(cols, t->columns[i].feature->name, v) == 0;
        Py_XDECREF(v);
    }
    PyObject *result = ok ? Py_BuildValue("(OO)", starts, cols) : NULL;
    Py_XDECREF(starts);
    Py_XDECREF(cols);
    return result;
}

static PyObject *py_dataset_read_table(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path", "columns", "episodes", NULL};
    PyObject *columns_obj, *episodes_obj = Py_None;
    dataset_args a;
    args_init(&a);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|O:dataset_read_table", keywords, PyUnicode_FSConverter,
                                     &a.path, &columns_obj, &episodes_obj))
        return NULL;
    PyObject *result = NULL;
    const char **columns = NULL;
    vf_dataset *d = NULL;
    PyObject *colseq = PySequence_Fast(columns_obj, "columns must be a sequence of str");
    if (!colseq || (episodes_obj != Py_None && parse_episode_integers(episodes_obj, &a) < 0))
        goto done;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(colseq);
    columns = PyMem_Malloc((size_t)(ncols ? ncols : 1) * sizeof *columns);
    if (!columns) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ncols; i++)
        if (!(columns[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(colseq, i))))
            goto done;
    if (open_dataset(&a, &d) < 0)
        goto done;
    vf_ds_table t;
    memset(&t, 0, sizeof t);
    int r;
    Py_BEGIN_ALLOW_THREADS
    size_t n = vf_dataset_num_episodes(d);
    size_t *positions = malloc((n ? n : 1) * sizeof *positions);
    r = positions ? 0 : VF_ENOMEM;
    for (size_t i = 0; r == 0 && i < n; i++)
        positions[i] = i;
    if (r == 0)
        r = vf_ds_read_table(d, positions, n, columns, (size_t)ncols, VF_DS_VERIFY_INDEX, &t);
    free(positions);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        vf_py_raise(r);
        goto done;
    }
    result = table_to_python(&t);
    vf_ds_table_free(&t);
done:
    vf_dataset_close(d);
    PyMem_Free(columns);
    Py_XDECREF(colseq);
    args_free(&a);
    return result;
}

PyMethodDef vf_py_dataset_functions[] = {
    VF_PY_KW_FUNCTION("dataset_info", py_dataset_info,
     "dataset_info(path, episodes=None, check_data=True, check_files=None, check_videos=True,\n"
     "             meta_cache=True) -> dict\n\n"
     "Opens the LeRobot dataset at path and returns the `vlafeed info --json`\n"
     "report (docs/info-json.md) as a dict. episodes selects episode indices;\n"
     "check_data=False skips opening the data Parquet footers. check_files: None\n"
     "(default) checks that data and video files exist at open up to 10,000 files and\n"
     "defers the checks to first use above; True always checks at open; False never.\n"
     "check_videos=False skips indexing the local video files (codec, size, every\n"
     "episode's frames). meta_cache=False decodes meta/episodes from Parquet without\n"
     "reading or writing the persistent metadata cache (the report's meta_cache says\n"
     "how the metadata was read)."),
    VF_PY_KW_FUNCTION("plan", py_plan,
     "plan(root, episodes=None, world_size=1, num_consumers=1) -> dict\n\n"
     "The `vlafeed plan --json` document: tasks and MP4 opens per partition strategy."),
    VF_PY_KW_FUNCTION("dataset_read_table", py_dataset_read_table,
     "dataset_read_table(path, columns, episodes=None) -> (episode_start, {column: (data, dtype, width)})\n\n"
     "Test hook: reads the named columns of the selected episodes through the\n"
     "engine's table reader (index verified). Numeric data is raw bytes."),
    {NULL, NULL, 0, NULL},
};
