/*
 * py_dataset.c: Python functions of the dataset area.
 *
 *   vlafeed._native.dataset_info(path, episodes=None, check_data=True, check_files=None, check_videos=True) -> dict
 *
 * returns the `vlafeed info --json` document (docs/info-json.md), parsed
 * with Python's json module so both always carry the same content. A
 * dataset that cannot be opened raises (FileNotFoundError for a missing
 * folder, file or episode; VlafeedError for corrupt or unsupported
 * metadata); problems found in an opened dataset are in the dict.
 *
 *   vlafeed._native.dataset_read_table(path, columns, episodes=None)
 *       -> (episode_start: list[int], {column: (bytes | list[str], dtype, width)})
 *
 * a test hook over the engine's table reader (vf_ds_read_table): the rows
 * of the selected episodes, in ascending episode order, with `index`
 * verified. dtype is "float32", "int64" or "str"; numeric columns come as
 * raw little-endian bytes of shape [rows, width] for numpy.frombuffer.
 */
#include "_native.h"

#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"
#include "vlafeed/dataset.h"


static PyObject *py_dataset_info(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path", "episodes", "check_data", "check_files", "check_videos", NULL};
    PyObject *path_obj, *episodes_obj = Py_None, *check_files_obj = Py_None;
    int check_data = 1, check_videos = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|OpOp:dataset_info", keywords, PyUnicode_FSConverter, &path_obj,
                                     &episodes_obj, &check_data, &check_files_obj, &check_videos))
        return NULL;
    /* None: at open up to VF_LAZY_FILE_CHECKS files, deferred above;
     * True: always at open; False: never. */
    int check_files = VF_CHECK_FILES_AUTO;
    if (check_files_obj != Py_None) {
        int truth = PyObject_IsTrue(check_files_obj);
        if (truth < 0) {
            Py_DECREF(path_obj);
            return NULL;
        }
        check_files = truth ? VF_CHECK_FILES_ALL : VF_CHECK_FILES_OFF;
    }
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    if (episodes_obj != Py_None &&
        vf_py_int64_list(episodes_obj, "episodes must be a sequence of integers", &episodes, &num_episodes) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = episodes_obj != Py_None ? episodes : NULL;
    s.num_episodes = num_episodes;
    s.check_data_files = check_data;
    s.check_files = check_files;
    s.check_videos = check_videos;
    vf_dataset *d = NULL;
    char *text = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_open(&d, PyBytes_AS_STRING(path_obj), &s);
    if (r == 0)
        r = vf_dataset_info_json(d, 0, &text);
    vf_dataset_close(d);
    Py_END_ALLOW_THREADS
    PyMem_Free(episodes);
    Py_DECREF(path_obj);
    if (r < 0)
        return vf_py_raise(r);
    PyObject *json = PyImport_ImportModule("json");
    PyObject *result = json ? PyObject_CallMethod(json, "loads", "s", text) : NULL;
    Py_XDECREF(json);
    free(text);
    return result;
}

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

static PyObject *column_to_python(const vf_ds_column *c)
{
    if (c->type == VF_DS_STRING) {
        PyObject *list = PyList_New((Py_ssize_t)c->rows);
        for (int64_t i = 0; list && i < c->rows; i++) {
            PyObject *s = PyUnicode_DecodeUTF8(c->data + c->offsets[i], (Py_ssize_t)(c->offsets[i + 1] - c->offsets[i]),
                                               "replace");
            if (!s) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, s);
        }
        return list ? Py_BuildValue("(Nsn)", list, "str", (Py_ssize_t)1) : NULL;
    }
    size_t elem = c->type == VF_DS_F32 ? sizeof(float) : sizeof(int64_t);
    PyObject *bytes = PyBytes_FromStringAndSize(c->values, (Py_ssize_t)((size_t)c->rows * (size_t)c->width * elem));
    if (!bytes)
        return NULL;
    return Py_BuildValue("(Nsn)", bytes, c->type == VF_DS_F32 ? "float32" : "int64", (Py_ssize_t)c->width);
}

static PyObject *py_dataset_read_table(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *keywords[] = {"path", "columns", "episodes", NULL};
    PyObject *path_obj, *columns_obj, *episodes_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&O|O:dataset_read_table", keywords, PyUnicode_FSConverter,
                                     &path_obj, &columns_obj, &episodes_obj))
        return NULL;
    PyObject *result = NULL;
    int64_t *episodes = NULL;
    size_t num_episodes = 0;
    const char **columns = NULL;
    PyObject *colseq = PySequence_Fast(columns_obj, "columns must be a sequence of str");
    if (!colseq || (episodes_obj != Py_None && vf_py_int64_list(episodes_obj, "episodes must be a sequence of integers",
                                                                &episodes, &num_episodes) < 0))
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
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.episodes = episodes_obj != Py_None ? episodes : NULL;
    s.num_episodes = num_episodes;
    vf_dataset *d = NULL;
    vf_ds_table t;
    memset(&t, 0, sizeof t);
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_dataset_open(&d, PyBytes_AS_STRING(path_obj), &s);
    size_t n = d ? vf_dataset_num_episodes(d) : 0;
    size_t *positions = r == 0 ? malloc((n ? n : 1) * sizeof *positions) : NULL;
    if (r == 0 && !positions)
        r = VF_ENOMEM;
    for (size_t i = 0; r == 0 && i < n; i++)
        positions[i] = i;
    if (r == 0)
        r = vf_ds_read_table(d, positions, n, columns, (size_t)ncols, VF_DS_VERIFY_INDEX, &t);
    free(positions);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        vf_dataset_close(d);
        vf_py_raise(r);
        goto done;
    }
    PyObject *starts = PyList_New((Py_ssize_t)t.num_episodes + 1);
    PyObject *cols = PyDict_New();
    int ok = starts && cols;
    for (size_t i = 0; ok && i <= t.num_episodes; i++) {
        PyObject *v = PyLong_FromLongLong(t.episode_start[i]);
        ok = v != NULL;
        if (ok)
            PyList_SET_ITEM(starts, (Py_ssize_t)i, v);
    }
    for (size_t i = 0; ok && i < t.num_columns; i++) {
        PyObject *v = column_to_python(&t.columns[i]);
        ok = v && PyDict_SetItemString(cols, t.columns[i].feature->name, v) == 0;
        Py_XDECREF(v);
    }
    vf_ds_table_free(&t);
    vf_dataset_close(d);
    if (ok)
        result = Py_BuildValue("(OO)", starts, cols);
    Py_XDECREF(starts);
    Py_XDECREF(cols);
done:
    PyMem_Free(columns);
    PyMem_Free(episodes);
    Py_XDECREF(colseq);
    Py_DECREF(path_obj);
    return result;
}

static PyMethodDef dataset_methods[] = {
    {"dataset_info", (PyCFunction)(void (*)(void))py_dataset_info, METH_VARARGS | METH_KEYWORDS,
     "dataset_info(path, episodes=None, check_data=True, check_files=None, check_videos=True) -> dict\n\n"
     "Opens the LeRobot dataset at path and returns the `vlafeed info --json`\n"
     "report (docs/info-json.md) as a dict. episodes selects episode indices;\n"
     "check_data=False skips opening the data Parquet footers. check_files: None\n"
     "(default) checks that data and video files exist at open up to 10,000 files and\n"
     "defers the checks to first use above; True always checks at open; False never.\n"
     "check_videos=False skips indexing the local video files (codec, size, every\n"
     "episode's frames)."},
    {"dataset_read_table", (PyCFunction)(void (*)(void))py_dataset_read_table, METH_VARARGS | METH_KEYWORDS,
     "dataset_read_table(path, columns, episodes=None) -> (episode_start, {column: (data, dtype, width)})\n\n"
     "Test hook: reads the named columns of the selected episodes through the\n"
     "engine's table reader (index verified). Numeric data is raw bytes."},
    {NULL, NULL, 0, NULL},
};

int vf_py_register_dataset(PyObject *module)
{
    return PyModule_AddFunctions(module, dataset_methods);
}
