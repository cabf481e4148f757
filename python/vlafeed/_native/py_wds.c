/*
 * py_wds.c: vlafeed._native.WdsLoader, the binding of the C shard loader
 * (include/vlafeed/wds.h) that vlafeed.ShardLoader (wds.py) wraps.
 *
 * A batch comes back as {"columns": [(name, suffix, kind, payload, descr,
 * shape), ...], "keys": [...], "shards": [...], "positions": [...]}: numeric
 * columns carry a WdsBuffer (buffer protocol over the column memory, moved
 * out of the C batch without a copy; numpy.frombuffer views it), bytes
 * columns a list of bytes (kind "bytes", or "npy" for .npy documents that
 * numpy decodes). Its keyword arguments are a settings table (settings.h);
 * its states are the ShardLoader form of py_state.c. The GIL is released
 * while the engine reads and decodes.
 */
#include "settings.h"

#include <stdlib.h>
#include <string.h>

#include "vlafeed/wds.h"

/* ---- WdsBuffer: owns one malloc'd column ------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t len;
} WdsBufferObject;

static void WdsBuffer_dealloc(WdsBufferObject *self)
{
    free(self->data);
    PyObject_Free(self);
}

static int WdsBuffer_getbuffer(WdsBufferObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 0, flags);
}

static PyBufferProcs WdsBuffer_buffer = {.bf_getbuffer = (getbufferproc)WdsBuffer_getbuffer};

PyTypeObject vf_py_wds_buffer_type = {
    VF_PY_TYPE("WdsBuffer", WdsBufferObject, WdsBuffer_dealloc,
               "Memory of one decoded shard-batch column (buffer protocol)."),
    .tp_as_buffer = &WdsBuffer_buffer,
};

/* ---- settings --------------------------------------------------------------------- */

typedef struct wds_args {
    vf_wds_loader_settings s;
    const char *manifest;
    vf_loader_state resume; /* s.resume points here once a state is given */
} wds_args;

static int parse_state(PyObject *obj, void *options)
{
    wds_args *a = options;
    return vf_py_resume_setting(obj, VF_PY_STATE_WDS, &a->resume, &a->s.resume);
}

static const vf_py_choice image_layouts[] = {
    {"uint8_hwc", 0}, {"uint8", 0}, {"float_chw", 1}, {"float32", 1}, {NULL, 0}};
static const vf_py_choice on_error_policies[] = {{"raise", VF_WDS_RAISE}, {"skip", VF_WDS_SKIP}, {NULL, 0}};

_Static_assert(offsetof(vf_wds_loader_settings, resize_height) ==
                   offsetof(vf_wds_loader_settings, resize_width) + sizeof(int),
               "resize is stored as two adjacent ints");

#define W wds_args

/* WdsLoader(manifest, ...): in keyword order (all may come by position). */
static const vf_py_setting wds_list[] = {
    {"manifest", VF_PY_STR, VF_PY_FIELD(W, manifest)},
    {"batch_size", VF_PY_SSIZE, VF_PY_FIELD(W, s.batch_size), VF_PY_MIN(1)},
    {"seed", VF_PY_ULLONG, VF_PY_FIELD(W, s.seed)},
    {"shuffle", VF_PY_BOOL, VF_PY_FIELD(W, s.shuffle)},
    {"drop_last", VF_PY_BOOL, VF_PY_FIELD(W, s.drop_last)},
    {"epoch", VF_PY_LLONG, VF_PY_FIELD(W, s.epoch), VF_PY_MIN(0)},
    {"rank", VF_PY_INT, VF_PY_FIELD(W, s.rank)},
    {"world_size", VF_PY_INT, VF_PY_FIELD(W, s.world_size)},
    {"num_consumers", VF_PY_INT, VF_PY_FIELD(W, s.num_consumers)},
    {"consumer", VF_PY_INT, VF_PY_FIELD(W, s.consumer)},
    {"shuffle_buffer", VF_PY_SSIZE, VF_PY_FIELD(W, s.shuffle_buffer), VF_PY_MIN(0)},
    {"fields", VF_PY_STR_OR_NONE, VF_PY_FIELD(W, s.fields)},
    {"image_format", VF_PY_STR, VF_PY_FIELD(W, s.image_float_chw), .choices = image_layouts,
     .error = "image_format must be 'uint8_hwc' or 'float_chw', not '%s'"},
    {"resize", VF_PY_WIDTH_HEIGHT, VF_PY_FIELD(W, s.resize_width)},
    {"on_error", VF_PY_STR, VF_PY_FIELD(W, s.on_error), .choices = on_error_policies,
     .error = "on_error must be 'raise' or 'skip'"},
    {"threads", VF_PY_INT, VF_PY_FIELD(W, s.threads)},
    {"state", VF_PY_OBJECT, .parse = parse_state},
    {"prefetch", VF_PY_SSIZE, VF_PY_FIELD(W, s.prefetch), VF_PY_MIN(0)},
    {"allow_outside_base", VF_PY_BOOL, VF_PY_FIELD(W, s.allow_outside_base)},
    {"max_image_pixels", VF_PY_LLONG, VF_PY_FIELD(W, s.max_image_pixels)},
    {"max_member_bytes", VF_PY_LLONG, VF_PY_FIELD(W, s.max_member_bytes)},
    {"max_sample_bytes", VF_PY_LLONG, VF_PY_FIELD(W, s.max_sample_bytes)},
    {"max_batch_bytes", VF_PY_LLONG, VF_PY_FIELD(W, s.max_batch_bytes)},
    {"max_manifest_samples", VF_PY_LLONG, VF_PY_FIELD(W, s.max_manifest_samples)},
    {"max_buffer_bytes", VF_PY_LLONG, VF_PY_FIELD(W, s.max_buffer_bytes)},
};

static const vf_py_settings wds_settings = {NULL, wds_list, (int)(sizeof wds_list / sizeof wds_list[0]), 1,
                                            (int)(sizeof wds_list / sizeof wds_list[0]),
                                            "batch_size must be >= 1, shuffle_buffer, prefetch and epoch >= 0"};

/* ---- WdsLoader ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    vf_wds_loader *loader;
    /* Calls running with the GIL released (next_batch, set_epoch, set_state)
     * and a loader whose close() came from another thread meanwhile: the
     * last of those calls closes it when it returns, never under it. */
    int in_flight;
    vf_wds_loader *close_pending;
} WdsLoaderObject;

static void close_released(vf_wds_loader *l)
{
    Py_BEGIN_ALLOW_THREADS
    vf_wds_loader_close(l);
    Py_END_ALLOW_THREADS
}

static int WdsLoader_init(WdsLoaderObject *self, PyObject *args, PyObject *kwargs)
{
    wds_args a;
    memset(&a, 0, sizeof a);
    vf_wds_loader_defaults(&a.s);
    vf_wds_loader *l = NULL;
    int r = vf_py_parse_settings(&wds_settings, args, kwargs, &a);
    if (r == 0) {
        Py_BEGIN_ALLOW_THREADS
        r = vf_wds_loader_open(&l, a.manifest, &a.s);
        Py_END_ALLOW_THREADS
        if (r < 0)
            vf_py_raise(r);
    }
    vf_py_state_clear(&a.resume);
    if (r < 0)
        return -1;
    if (self->loader)
        close_released(self->loader);
    self->loader = l;
    return 0;
}

static void WdsLoader_dealloc(WdsLoaderObject *self)
{
    if (self->loader)
        close_released(self->loader);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_open(WdsLoaderObject *self)
{
    if (!self->loader) {
        PyErr_SetString(PyExc_ValueError, "the shard loader is closed");
        return -1;
    }
    return 0;
}

/* ---- batches -> Python -------------------------------------------------------------- */

static PyObject *shape_tuple(const vf_wds_column *c)
{
    PyObject *t = PyTuple_New(c->ndim);
    for (int k = 0; t && k < c->ndim; k++)
        PyTuple_SET_ITEM(t, k, PyLong_FromLongLong(c->shape[k]));
    return t;
}

static PyObject *string_item(const void *items, size_t i)
{
    const char *s = ((char *const *)items)[i];
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

static PyObject *bytes_item(const void *column, size_t i)
{
    const vf_wds_column *c = column;
    return PyBytes_FromStringAndSize((const char *)c->items[i], (Py_ssize_t)c->item_sizes[i]);
}

static PyObject *position_item(const void *positions, size_t i)
{
    return PyLong_FromLongLong(((const int64_t *)positions)[i]);
}

/* (name, suffix, kind, payload, descr, shape); an array column's memory moves into a WdsBuffer. */
static PyObject *column_to_tuple(vf_wds_column *c, size_t rows)
{
    PyObject *payload = NULL;
    const char *kind;
    if (c->type == VF_WDS_BYTES) {
        kind = c->npy ? "npy" : "bytes";
        payload = vf_py_list(rows, bytes_item, c);
    } else {
        kind = "array";
        WdsBufferObject *buf = PyObject_New(WdsBufferObject, &vf_py_wds_buffer_type);
        if (buf) {
            buf->data = c->data; /* moved: the batch no longer frees it */
            buf->len = (Py_ssize_t)c->nbytes;
            c->data = NULL;
        }
        payload = (PyObject *)buf;
    }
    PyObject *shape = payload ? shape_tuple(c) : NULL;
    if (!shape) {
        Py_XDECREF(payload);
        return NULL;
    }
    return Py_BuildValue("(ssNNsN)", c->name, c->suffix, PyUnicode_FromString(kind), payload, c->descr, shape);
}

static PyObject *batch_to_python(vf_wds_batch *b)
{
    PyObject *cols = PyList_New((Py_ssize_t)b->num_columns);
    for (size_t i = 0; cols && i < b->num_columns; i++) {
        PyObject *t = column_to_tuple(&b->columns[i], b->size);
        if (!t)
            Py_CLEAR(cols);
        else
            PyList_SET_ITEM(cols, (Py_ssize_t)i, t);
    }
    PyObject *positions = vf_py_list(b->size, position_item, b->positions);
    PyObject *keys = vf_py_list(b->size, string_item, b->keys), *shards = vf_py_list(b->size, string_item, b->shards);
    if (!cols || !positions || !keys || !shards) {
        Py_XDECREF(cols);
        Py_XDECREF(positions);
        Py_XDECREF(keys);
        Py_XDECREF(shards);
        return NULL;
    }
    return Py_BuildValue("{s:N,s:N,s:N,s:N,s:n}", "columns", cols, "keys", keys, "shards", shards, "positions",
                         positions, "size", (Py_ssize_t)b->size);
}

/* ---- calls into the engine without the GIL ------------------------------------------ */

/* One call's arguments (freed by run()), and the batch it makes (if any). */
typedef struct wds_call {
    int64_t epoch;
    vf_loader_state state;
    vf_wds_batch *batch;
} wds_call;

static int call_next(vf_wds_loader *l, wds_call *c) { return vf_wds_loader_next(l, &c->batch); }
static int call_set_epoch(vf_wds_loader *l, wds_call *c) { return vf_wds_loader_set_epoch(l, c->epoch); }
static int call_set_state(vf_wds_loader *l, wds_call *c) { return vf_wds_loader_set_state(l, &c->state); }

/* Runs fn with the GIL released, bracketed against close() from another
 * thread, and frees c's arguments: the batch it made (a dict), None (also at
 * the end of an epoch), or NULL with the error set, including ValueError
 * when the loader was closed meanwhile (its batch is dropped). */
static PyObject *run(WdsLoaderObject *self, int (*fn)(vf_wds_loader *, wds_call *), wds_call *c)
{
    vf_wds_loader *l = self->loader;
    int r;
    self->in_flight++;
    Py_BEGIN_ALLOW_THREADS
    r = fn(l, c);
    Py_END_ALLOW_THREADS
    vf_py_state_clear(&c->state);
    int closed = self->loader == NULL;
    if (closed) {
        PyErr_SetString(PyExc_ValueError, "the shard loader was closed (from another thread) during this call");
        if (r == 0 && c->batch)
            vf_wds_batch_free(c->batch);
    }
    if (--self->in_flight == 0 && self->close_pending) {
        vf_wds_loader *pending = self->close_pending;
        self->close_pending = NULL;
        close_released(pending);
    }
    if (closed)
        return NULL;
    if (r < 0 && r != VF_EOF)
        return vf_py_raise(r);
    if (r == VF_EOF || !c->batch)
        Py_RETURN_NONE;
    PyObject *out = batch_to_python(c->batch);
    vf_wds_batch_free(c->batch);
    return out;
}

static PyObject *WdsLoader_next_batch(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    wds_call c = {0};
    return check_open(self) < 0 ? NULL : run(self, call_next, &c);
}

static PyObject *WdsLoader_set_epoch(WdsLoaderObject *self, PyObject *arg)
{
    wds_call c = {0};
    if (check_open(self) < 0 || ((c.epoch = PyLong_AsLongLong(arg)) == -1 && PyErr_Occurred()))
        return NULL;
    return run(self, call_set_epoch, &c);
}

static PyObject *WdsLoader_set_state(WdsLoaderObject *self, PyObject *arg)
{
    wds_call c = {0};
    if (check_open(self) < 0 || vf_py_state_from_dict(arg, &c.state, VF_PY_STATE_WDS) < 0)
        return NULL;
    return run(self, call_set_state, &c);
}

static PyObject *WdsLoader_get_state(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    vf_loader_state st;
    int r = vf_wds_loader_get_state(self->loader, &st);
    return r < 0 ? vf_py_raise(r) : vf_py_state_to_dict(&st, VF_PY_STATE_WDS);
}

static PyObject *WdsLoader_state_at(WdsLoaderObject *self, PyObject *arg)
{
    if (check_open(self) < 0)
        return NULL;
    long long batches = PyLong_AsLongLong(arg);
    if (batches == -1 && PyErr_Occurred())
        return NULL;
    vf_loader_state st;
    int r = vf_wds_loader_state_at(self->loader, batches, &st);
    return r < 0 ? vf_py_raise(r) : vf_py_state_to_dict(&st, VF_PY_STATE_WDS);
}

static PyObject *skip_message(const void *loader, size_t i)
{
    return PyUnicode_FromString(vf_wds_loader_skip_message(loader, i));
}

static PyObject *WdsLoader_stats(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    vf_wds_stats st;
    vf_wds_loader_stats(self->loader, &st);
    PyObject *messages = vf_py_list(vf_wds_loader_num_skip_messages(self->loader), skip_message, self->loader);
    if (!messages)
        return NULL;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:N}", "samples", (unsigned long long)st.samples,
                         "batches", (unsigned long long)st.batches, "skipped_samples",
                         (unsigned long long)st.skipped_samples, "skipped_shards",
                         (unsigned long long)st.skipped_shards, "samples_read", (unsigned long long)st.samples_read,
                         "samples_passed", (unsigned long long)st.samples_passed, "shards_opened",
                         (unsigned long long)st.shards_opened, "bytes_read", (unsigned long long)st.bytes_read,
                         "images_decoded", (unsigned long long)st.images_decoded, "decode_seconds",
                         st.decode_seconds, "skip_messages", messages);
}

static PyObject *WdsLoader_close(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    vf_wds_loader *l = self->loader;
    self->loader = NULL;
    if (l) {
        if (self->in_flight) {
            /* Another thread is inside the loader: it closes it on return, which the cancel
             * makes prompt (a remote shard read riding out an outage fails now). */
            self->close_pending = l;
            vf_wds_loader_cancel(l);
        } else
            close_released(l);
    }
    Py_RETURN_NONE;
}

/* ---- getters ---------------------------------------------------------------------- */

enum wds_count { GET_NUM_SAMPLES, GET_NUM_BATCHES, GET_DELIVERED };

/* The counts, told by the closure which. */
static PyObject *WdsLoader_get(WdsLoaderObject *self, void *which)
{
    if (check_open(self) < 0)
        return NULL;
    switch ((enum wds_count)(intptr_t)which) {
    case GET_NUM_SAMPLES: return PyLong_FromLongLong(vf_wds_loader_num_samples(self->loader));
    case GET_NUM_BATCHES: return PyLong_FromSize_t(vf_wds_loader_num_batches(self->loader));
    case GET_DELIVERED: return PyLong_FromSize_t(vf_wds_loader_batches_delivered(self->loader));
    }
    Py_RETURN_NONE;
}

static PyObject *shard_entry(const void *manifest, size_t i)
{
    const vf_wds_manifest *m = manifest;
    return Py_BuildValue("(ssL)", vf_wds_manifest_shard_name(m, i), vf_wds_manifest_shard_url(m, i),
                         (long long)vf_wds_manifest_shard_samples(m, i));
}

static PyObject *WdsLoader_get_shards(WdsLoaderObject *self, void *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    const vf_wds_manifest *m = vf_wds_loader_manifest(self->loader);
    return vf_py_list(vf_wds_manifest_num_shards(m), shard_entry, m);
}

static PyMethodDef WdsLoader_methods[] = {
    {"next_batch", (PyCFunction)WdsLoader_next_batch, METH_NOARGS, "The next batch (dict) or None at the epoch's end."},
    {"set_epoch", (PyCFunction)WdsLoader_set_epoch, METH_O, "Starts epoch e."},
    {"get_state", (PyCFunction)WdsLoader_get_state, METH_NOARGS, "The resume state (dict)."},
    {"set_state", (PyCFunction)WdsLoader_set_state, METH_O, "Continues from a state dict."},
    {"state_at", (PyCFunction)WdsLoader_state_at, METH_O, "The state after k rank-level batches of this epoch."},
    {"stats", (PyCFunction)WdsLoader_stats, METH_NOARGS, "Counters (dict)."},
    {"close", (PyCFunction)WdsLoader_close, METH_NOARGS, "Frees the loader."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef WdsLoader_getset[] = {
    {"num_samples", (getter)WdsLoader_get, NULL, "samples per epoch of this loader", VF_PY_WHICH(GET_NUM_SAMPLES)},
    {"num_batches", (getter)WdsLoader_get, NULL, "batches per epoch of this loader", VF_PY_WHICH(GET_NUM_BATCHES)},
    {"batches_delivered", (getter)WdsLoader_get, NULL, "batches of the epoch so far", VF_PY_WHICH(GET_DELIVERED)},
    {"shards", (getter)WdsLoader_get_shards, NULL, "[(name, url, num_sequences)] from the manifest", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject vf_py_wds_loader_type = {
    VF_PY_CLASS("WdsLoader", WdsLoaderObject, WdsLoader_dealloc,
                "WdsLoader(manifest, batch_size=32, seed=0, shuffle=True, drop_last=False, epoch=0, rank=0, "
                "world_size=1, num_consumers=1, consumer=-1, shuffle_buffer=1000, fields=None, "
                "image_format='uint8_hwc', resize=None, on_error='raise', threads=0, state=None, prefetch=2)",
                WdsLoader_init, WdsLoader_methods, WdsLoader_getset),
};
