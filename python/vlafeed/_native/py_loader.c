/*
 * py_loader.c: vlafeed._native.Loader, the binding of vf_loader (the
 * contract in native-python-contract.md).
 *
 *   Loader(dataset, *, mode=..., ...)  a loader over a Dataset, iterable:
 *                                      each item is a Batch (py_batch.c)
 *
 * Its keyword arguments are the table vf_py_loader_settings
 * (py_loader_settings.c). A Loader holds its Dataset; a Batch holds its
 * Loader. The GIL is released around everything that waits or decodes:
 * loader open/close, next, get_items, set_epoch, set_state; such a call is
 * bracketed so that close() from another thread meanwhile never frees the
 * loader under it (issue 10).
 */
#include "py_loader.h"

typedef struct {
    PyObject_HEAD
    vf_loader *l;
    PyObject *dataset;
    /* Calls running with the GIL released (next, get_items, ...), and a
     * loader whose close() came from another thread meanwhile: it is closed
     * by the last of those calls when it returns, never under it. */
    int in_flight;
    vf_loader *close_pending;
} LoaderObject;

static void close_released(vf_loader *l)
{
    Py_BEGIN_ALLOW_THREADS
    vf_loader_close(l);
    Py_END_ALLOW_THREADS
}

static void Loader_dealloc(LoaderObject *self)
{
    if (self->l) {
        vf_loader *l = self->l;
        self->l = NULL;
        close_released(l);
    }
    Py_XDECREF(self->dataset);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Loader_init(LoaderObject *self, PyObject *args, PyObject *kwargs)
{
    vf_py_loader_args a;
    vf_py_loader_args_init(&a);
    vf_dataset *d = vf_py_loader_args_parse(&vf_py_loader_settings, args, kwargs, &a);
    vf_loader *l = NULL;
    int r = -1;
    if (d) {
        Py_BEGIN_ALLOW_THREADS
        r = vf_loader_open(&l, d, &a.s);
        Py_END_ALLOW_THREADS
        if (r < 0)
            vf_py_raise(r);
    }
    PyObject *dataset = a.dataset;
    vf_py_loader_args_free(&a);
    if (r < 0)
        return -1;
    if (self->l)
        close_released(self->l);
    self->l = l;
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

/* ---- calls into the engine without the GIL ------------------------------------------ */

/* One call's arguments (freed by run()), and the batch it makes (if any). */
typedef struct engine_call {
    int64_t epoch;
    int64_t *positions; /* PyMem */
    size_t count;
    vf_loader_state state;
    vf_batch *batch;
} engine_call;

static int call_next(vf_loader *l, engine_call *c) { return vf_loader_next(l, &c->batch); }
static int call_get_items(vf_loader *l, engine_call *c)
{
    return vf_loader_get_items(l, c->positions, c->count, &c->batch);
}
static int call_set_epoch(vf_loader *l, engine_call *c) { return vf_loader_set_epoch(l, c->epoch); }
static int call_set_state(vf_loader *l, engine_call *c) { return vf_loader_set_state(l, &c->state); }

/* Runs fn with the GIL released, bracketed against close() from another
 * thread, and frees c's arguments. Returns the batch it made (a Batch),
 * None, or NULL: at the end of an epoch (StopIteration, no exception), or
 * with the error set, including ValueError when the loader was closed
 * meanwhile (its batch is dropped). */
static PyObject *run(LoaderObject *self, int (*fn)(vf_loader *, engine_call *), engine_call *c)
{
    vf_loader *l = self->l;
    int r;
    self->in_flight++;
    Py_BEGIN_ALLOW_THREADS
    r = fn(l, c);
    Py_END_ALLOW_THREADS
    PyMem_Free(c->positions);
    vf_py_state_clear(&c->state);
    int closed = self->l == NULL;
    if (closed) {
        PyErr_SetString(PyExc_ValueError, "the loader was closed (from another thread) during this call");
        if (r == 0 && c->batch)
            vf_batch_release(c->batch);
    }
    if (--self->in_flight == 0 && self->close_pending) {
        vf_loader *pending = self->close_pending;
        self->close_pending = NULL;
        close_released(pending);
    }
    if (closed || r == VF_EOF)
        return NULL;
    if (r < 0)
        return vf_py_raise(r);
    return c->batch ? vf_py_make_batch((PyObject *)self, c->batch) : Py_NewRef(Py_None);
}

static PyObject *Loader_iter(LoaderObject *self) { return Py_NewRef(self); }

static PyObject *Loader_next(LoaderObject *self)
{
    engine_call c = {0};
    return loader_ready(self) ? run(self, call_next, &c) : NULL;
}

static PyObject *Loader_set_epoch(LoaderObject *self, PyObject *arg)
{
    engine_call c = {0};
    if (!loader_ready(self) || ((c.epoch = PyLong_AsLongLong(arg)) == -1 && PyErr_Occurred()))
        return NULL;
    return run(self, call_set_epoch, &c);
}

static PyObject *Loader_get_items(LoaderObject *self, PyObject *arg)
{
    engine_call c = {0};
    if (!loader_ready(self) || vf_py_int64_list(arg, "get_items takes a list of positions", &c.positions, &c.count) < 0)
        return NULL;
    return run(self, call_get_items, &c);
}

static PyObject *Loader_set_state(LoaderObject *self, PyObject *arg)
{
    engine_call c = {0};
    if (!loader_ready(self) || vf_py_state_from_dict(arg, &c.state, VF_PY_STATE_LOADER) < 0)
        return NULL;
    return run(self, call_set_state, &c);
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
    return vf_py_state_to_dict(&st, VF_PY_STATE_LOADER);
}

static PyObject *Loader_close(LoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (self->l) {
        vf_loader *l = self->l;
        self->l = NULL;
        if (self->in_flight) {
            /* Another thread is inside the loader: it closes it on return,
             * which the cancel makes prompt (a remote read waiting out an
             * outage fails now instead of at the end of its retry budget). */
            self->close_pending = l;
            vf_loader_cancel(l);
            Py_RETURN_NONE;
        }
        close_released(l);
    }
    Py_RETURN_NONE;
}

/* stats()["decode_device"]: {camera: {"requested", "device", "reason",
 * "files_cpu", "files_cuda"}}. device: "cuda" or "cpu" when every file
 * opened so far decodes there, "mixed" when both, None before any. */
static PyObject *decode_devices(const vf_loader *l)
{
    PyObject *all = PyDict_New();
    vf_decode_device_report rep;
    for (size_t k = 0; all && vf_loader_decode_device(l, k, &rep) == 0; k++) {
        const char *device = rep.files_cuda && rep.files_cpu ? "mixed"
                             : rep.files_cuda               ? "cuda"
                             : rep.files_cpu                ? "cpu"
                                                            : NULL;
        PyObject *one = Py_BuildValue("{s:s,s:z,s:z,s:K,s:K}", "requested", vf_decode_device_name(rep.requested),
                                      "device", device, "reason", rep.reason[0] ? rep.reason : NULL, "files_cpu",
                                      (unsigned long long)rep.files_cpu, "files_cuda",
                                      (unsigned long long)rep.files_cuda);
        if (!one || PyDict_SetItemString(all, rep.camera, one) < 0)
            Py_CLEAR(all);
        Py_XDECREF(one);
    }
    return all;
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
    PyObject *placement = Py_BuildValue(
        "{s:n,s:i,s:i,s:d,s:d,s:K,s:K,s:K,s:n,s:n}", "pinned_cpus", (Py_ssize_t)st.pinned_cpus, "engine_threads",
        st.engine_threads, "decode_threads", st.decode_threads, "handout_seconds", st.handout_seconds,
        "wait_after_first_seconds", st.wait_after_first_seconds, "table_files_opened",
        (unsigned long long)st.table_files_opened, "table_file_evictions", (unsigned long long)st.table_file_evictions,
        "table_file_trims", (unsigned long long)st.table_file_trims,
        "table_files_open", (Py_ssize_t)st.table_files_open, "table_files_bytes", (Py_ssize_t)st.table_files_bytes);
    if (!placement || PyDict_Update(more, placement) < 0) {
        Py_XDECREF(placement);
        Py_DECREF(more);
        return NULL;
    }
    Py_DECREF(placement);
    PyObject *disk = Py_BuildValue("{s:K,s:K,s:K,s:n}", "table_disk_episodes", (unsigned long long)st.table_disk_episodes,
                                   "table_disk_builds", (unsigned long long)st.table_disk_builds, "table_disk_files",
                                   (unsigned long long)st.table_disk_files, "table_disk_bytes",
                                   (Py_ssize_t)st.table_disk_bytes);
    if (!disk || PyDict_Update(more, disk) < 0) {
        Py_XDECREF(disk);
        Py_DECREF(more);
        return NULL;
    }
    Py_DECREF(disk);
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
    PyObject *devices = out ? decode_devices(self->l) : NULL;
    if (devices && PyDict_SetItemString(out, "decode_device", devices) < 0)
        Py_CLEAR(out);
    if (!devices)
        Py_CLEAR(out);
    Py_XDECREF(devices);
    return out;
}

/* ---- getters: one getter, told by its closure which ---------------------------------- */

static PyObject *warning_text(const void *l, size_t i)
{
    return PyUnicode_FromString(vf_loader_warning(l, i));
}

static PyObject *warning_is_global(const void *l, size_t i) { return PyBool_FromLong(vf_loader_warning_is_global(l, i)); }

static PyObject *skip_entry(const void *l, size_t i)
{
    const vf_loader_skip *k = vf_loader_get_skip(l, i);
    return Py_BuildValue("{sLsLszszss}", "position", (long long)k->position, "episode_index",
                         (long long)k->episode_index, "file", k->file, "column", k->column, "message", k->message);
}

enum loader_getter { GET_NUM_SAMPLES, GET_NUM_POSITIONS, GET_NUM_BATCHES, GET_WARNINGS, GET_WARNINGS_GLOBAL, GET_SKIPS,
                     GET_DELIVERED, GET_NUM_WARNINGS };

static PyObject *Loader_get(LoaderObject *self, void *which)
{
    if (!loader_ready(self))
        return NULL;
    const vf_loader *l = self->l;
    switch ((enum loader_getter)(intptr_t)which) {
    case GET_NUM_SAMPLES: return PyLong_FromLongLong(vf_loader_num_samples(l));
    case GET_NUM_POSITIONS: return PyLong_FromLongLong(vf_loader_num_positions(l));
    case GET_NUM_BATCHES: return PyLong_FromSize_t(vf_loader_num_batches(l));
    case GET_NUM_WARNINGS: return PyLong_FromSize_t(vf_loader_num_warnings(l));
    case GET_WARNINGS: return vf_py_list(vf_loader_num_warnings(l), warning_text, l);
    case GET_WARNINGS_GLOBAL: return vf_py_list(vf_loader_num_warnings(l), warning_is_global, l);
    case GET_SKIPS: return vf_py_list(vf_loader_num_skips(l), skip_entry, l);
    case GET_DELIVERED: return PyLong_FromSize_t(vf_loader_batches_delivered(l));
    }
    Py_RETURN_NONE;
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
    {"dataset", (getter)Loader_get_dataset, NULL, "the Dataset", NULL},
    {"num_samples", (getter)Loader_get, NULL, "samples this loader yields per epoch", VF_PY_WHICH(GET_NUM_SAMPLES)},
    {"num_positions", (getter)Loader_get, NULL, "frames of the selected episodes", VF_PY_WHICH(GET_NUM_POSITIONS)},
    {"num_batches", (getter)Loader_get, NULL, "batches this loader yields per epoch", VF_PY_WHICH(GET_NUM_BATCHES)},
    {"warnings", (getter)Loader_get, NULL,
     "warnings the loader kept, each once (uneven splits, empty consumers, features left out, frames\n"
     "whose size differs from info.json, normalization by a zero std, ...)",
     VF_PY_WHICH(GET_WARNINGS)},
    {"num_warnings", (getter)Loader_get, NULL, "len(warnings), without building the list",
     VF_PY_WHICH(GET_NUM_WARNINGS)},
    {"warnings_global", (getter)Loader_get, NULL,
     "per warning: True when its text is the same on every rank (report it from rank 0 only)",
     VF_PY_WHICH(GET_WARNINGS_GLOBAL)},
    {"skips", (getter)Loader_get, NULL,
     "on_error='skip': the samples left out of delivered batches, as dicts (position, episode_index, file,\n"
     "column or None, message); at most 65,536 (stats()['skipped'] counts all)",
     VF_PY_WHICH(GET_SKIPS)},
    {"batches_delivered", (getter)Loader_get, NULL,
     "batches of the current epoch delivered (a restored loader counts the skipped ones)", VF_PY_WHICH(GET_DELIVERED)},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject vf_py_loader_type = {
    VF_PY_CLASS("Loader", LoaderObject, Loader_dealloc,
                "Loader(dataset, *, mode='map'|'stream', batch_size=32, seed=0, ...): batches of samples.",
                Loader_init, Loader_methods, Loader_getset),
    .tp_iter = (getiterfunc)Loader_iter,
    .tp_iternext = (iternextfunc)Loader_next,
};
