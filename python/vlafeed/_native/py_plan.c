/*
 * py_plan.c: module functions over a dataset and the loader's settings that
 * need no loader: the states a loader would report (loader_state,
 * resolve_state, state_batches), the `vlafeed plan --json` report
 * (plan_report), and set_log_level. Their keyword arguments are settings
 * tables in py_loader_settings.c.
 */
#include "py_loader.h"

#include <stdlib.h>

#include "base/base.h"
#include "io/io.h"

static PyObject *loader_state_impl(PyObject *args, PyObject *kwargs, int want_resolve)
{
    vf_py_loader_args a;
    vf_py_loader_args_init(&a);
    vf_dataset *d = vf_py_loader_args_parse(&vf_py_loader_state_settings, args, kwargs, &a);
    PyObject *out = NULL;
    vf_loader_state st;
    int r;
    if (!d) {
        /* the error is set */
    } else if (!want_resolve) {
        r = vf_loader_state_at(d, &a.s, a.epoch, a.batches, &st);
        out = r < 0 ? vf_py_raise(r) : vf_py_state_to_dict(&st, VF_PY_STATE_LOADER);
    } else if (!a.s.resume) {
        PyErr_SetString(PyExc_TypeError, "resolve_state: a state (resume=) is required");
    } else {
        Py_BEGIN_ALLOW_THREADS
        r = vf_loader_state_resolve(d, &a.s, a.s.resume, &st);
        Py_END_ALLOW_THREADS
        out = r < 0 ? vf_py_raise(r) : vf_py_state_to_dict(&st, VF_PY_STATE_LOADER);
        if (r == 0) {
            free((void *)st.ranges);
            free((void *)st.generations);
        }
    }
    vf_py_loader_args_free(&a);
    return out;
}

static PyObject *py_loader_state(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    return loader_state_impl(args, kwargs, 0);
}

static PyObject *py_resolve_state(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    return loader_state_impl(args, kwargs, 1);
}

static PyObject *py_plan_report(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    vf_py_loader_args a;
    vf_py_loader_args_init(&a);
    a.s.mode = VF_MODE_STREAM;
    a.rank = a.worker = -1;
    a.video_files = 1;
    /* tasks: 0 none, 1 the partition's, 2 every consumer's pieces (rank -1) */
    vf_dataset *d = vf_py_loader_args_parse(&vf_py_plan_report_settings, args, kwargs, &a);
    PyObject *out = NULL;
    if (d && (a.rank >= 0) != (a.worker >= 0)) {
        PyErr_SetString(PyExc_ValueError, "plan: rank and worker go together");
    } else if (d) {
        char *doc = NULL;
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = vf_plan_report_json(d, &a.s, a.epoch, a.tasks, a.rank, a.worker, a.video_files ? 0 : VF_PLAN_NO_FILES,
                                &doc);
        Py_END_ALLOW_THREADS
        out = r < 0 ? vf_py_raise(r) : PyUnicode_FromString(doc);
        free(doc);
    }
    vf_py_loader_args_free(&a);
    return out;
}

static PyObject *py_state_batches(PyObject *self, PyObject *arg)
{
    (void)self;
    vf_loader_state st;
    if (vf_py_state_from_dict(arg, &st, VF_PY_STATE_LOADER) < 0)
        return NULL;
    int64_t k;
    int r = vf_loader_state_batches(&st, &k);
    vf_py_state_clear(&st);
    if (r < 0)
        return vf_py_raise(r);
    return PyLong_FromLongLong(k);
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

static PyObject *cache_counts(const vf_node_cache_stats *s)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "fetches", (unsigned long long)s->fetches,
                         "bytes_fetched", (unsigned long long)s->bytes_fetched, "hits", (unsigned long long)s->hits,
                         "bytes_reused", (unsigned long long)s->bytes_reused, "waits", (unsigned long long)s->waits,
                         "evictions", (unsigned long long)s->evictions, "bypassed",
                         (unsigned long long)s->bypassed);
}

/* The node cache's counters: this process's and the whole node's (<dir>/.stats). */
static PyObject *py_node_cache_stats(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    const char *dir = vf_node_cache_dir();
    if (!dir)
        Py_RETURN_NONE;
    vf_node_cache_stats mine, node;
    vf_node_cache_process_stats(&mine);
    if (vf_node_cache_node_stats(dir, &node) < 0)
        return vf_py_raise(VF_EIO);
    PyObject *process = cache_counts(&mine), *whole = process ? cache_counts(&node) : NULL;
    PyObject *out = whole ? Py_BuildValue("{s:s,s:K,s:O,s:O}", "dir", dir, "max_bytes",
                                          (unsigned long long)vf_node_cache_bound(), "process", process, "node", whole)
                          : NULL;
    Py_XDECREF(process);
    Py_XDECREF(whole);
    return out;
}

PyMethodDef vf_py_plan_functions[] = {
    {"node_cache_stats", (PyCFunction)py_node_cache_stats, METH_NOARGS,
     "node_cache_stats() -> dict or None: the node cache's counters (VF_NODE_CACHE_DIR; None when it is\n"
     "off): dir, max_bytes, and for this process and for the whole node (<dir>/.stats) fetches,\n"
     "bytes_fetched, hits, bytes_reused, waits, evictions, bypassed."},
    VF_PY_KW_FUNCTION("loader_state", py_loader_state,
     "loader_state(dataset, *, epoch, batches, mode, batch_size, seed, shuffle, drop_last, world_size,\n"
     "num_consumers, shuffle_buffer, partition, episode_pool_size, resume=None) -> dict\n\n"
     "The state a rank-level loader with these settings reports after `batches` batches of `epoch`\n"
     "(vf_loader_state_at): for a process that receives every worker's batches. resume: the resolved\n"
     "state the epoch started from (resolve_state), whose remaining ranges the batches count within."),
    VF_PY_KW_FUNCTION("resolve_state", py_resolve_state,
     "resolve_state(dataset, *, resume, mode, batch_size, seed, shuffle, drop_last, world_size, num_consumers,\n"
     "shuffle_buffer, partition, episode_pool_size) -> dict\n"
     "The state `resume` becomes for loaders with these settings (vf_loader_state_resolve): itself when the\n"
     "layout (world_size, consumers, batch_size) matches, else (elastic resume) the start of what remains of\n"
     "its epoch, as remaining ranges. Resolve once and hand the result to every worker."),
    VF_PY_KW_FUNCTION("plan_report", py_plan_report,
     "plan_report(dataset, *, mode='stream', partition='file_group', world_size=1, workers=1, batch_size=32,\n"
     "seed=0, epoch=0, shuffle=True, drop_last=False, shuffle_buffer=0, episode_pool_size=16, tasks=False,\n"
     "rank=-1, worker=-1, resume=None, video_files=True) -> str: the `vlafeed plan --json` document (vf_plan_report_json)."),
    {"state_batches", (PyCFunction)py_state_batches, METH_O,
     "state_batches(state) -> int: the rank-level batches a state stands for."},
    {"set_log_level", (PyCFunction)py_set_log_level, METH_VARARGS,
     "set_log_level(level=None): how much vlafeed and FFmpeg print (0 errors, 1 warnings, 2 info,\n"
     "3 debug); None: the VF_LOG environment variable's level (default warnings)."},
    {NULL, NULL, 0, NULL},
};
