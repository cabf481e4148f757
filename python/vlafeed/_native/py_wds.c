/*
 * py_wds.c: vlafeed._native.WdsLoader, the binding of the C shard loader
 * (include/vlafeed/wds.h) that vlafeed.ShardLoader (wds.py) wraps.
 *
 * A batch comes back as {"columns": [(name, suffix, kind, payload, descr,
 * shape), ...], "keys": [...], "shards": [...], "positions": [...]}: numeric
 * columns carry a WdsBuffer (buffer protocol over the column memory, moved
 * out of the C batch without a copy; numpy.frombuffer views it), bytes
 * columns a list of bytes (kind "bytes", or "npy" for .npy documents that
 * numpy decodes). The GIL is released while the engine reads and decodes.
 */
#include "_native.h"

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

static PyTypeObject WdsBuffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.WdsBuffer",
    .tp_basicsize = sizeof(WdsBufferObject),
    .tp_dealloc = (destructor)WdsBuffer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Memory of one decoded shard-batch column (buffer protocol).",
    .tp_as_buffer = &WdsBuffer_buffer,
};

/* ---- WdsLoader ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    vf_wds_loader *loader;
} WdsLoaderObject;

/* st->ranges, when the state has any, is PyMem-allocated: PyMem_Free((void *)st->ranges). */
static int parse_state(PyObject *dict, vf_loader_state *st)
{
    memset(st, 0, sizeof *st);
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "state must be a dict from state_dict()");
        return -1;
    }
    PyObject *kind = PyDict_GetItemString(dict, "kind");
    if (!kind || !PyUnicode_Check(kind) || strcmp(PyUnicode_AsUTF8(kind), "wds") != 0) {
        PyErr_SetString(PyExc_ValueError, "state is not a ShardLoader state (kind != 'wds')");
        return -1;
    }
#define GET(key, field, type)                                                          \
    do {                                                                               \
        PyObject *v_ = PyDict_GetItemString(dict, key);                                \
        if (!v_) {                                                                     \
            PyErr_Format(PyExc_ValueError, "state lacks '%s'", key);                   \
            return -1;                                                                 \
        }                                                                              \
        unsigned long long u_ = PyLong_AsUnsignedLongLongMask(v_);                     \
        if (PyErr_Occurred())                                                          \
            return -1;                                                                 \
        st->field = (type)u_;                                                          \
    } while (0)
    GET("version", version, uint32_t);
    GET("fingerprint", fingerprint, uint64_t);
    GET("positions", positions, int64_t);
    GET("seed", seed, uint64_t);
    GET("epoch", epoch, int64_t);
    GET("samples_consumed", samples_consumed, int64_t);
    GET("batch_size", batch_size, int64_t);
    GET("world_size", world_size, int32_t);
    GET("consumers", consumers, int32_t);
    GET("shuffle", shuffle, int32_t);
    GET("drop_last", drop_last, int32_t);
    GET("shuffle_buffer", shuffle_buffer, int64_t);
#undef GET
    PyObject *ranges = PyDict_GetItemString(dict, "ranges");
    if (ranges && ranges != Py_None) {
        int64_t *values = NULL;
        size_t count = 0;
        if (vf_py_int64_list(ranges, "state['ranges'] must be a list of integers", &values, &count) < 0)
            return -1;
        if (count % 2) {
            PyMem_Free(values);
            PyErr_SetString(PyExc_ValueError, "state['ranges'] must hold [start, end) pairs");
            return -1;
        }
        st->ranges = values;
        st->num_ranges = count / 2;
    }
    st->mode = VF_MODE_STREAM;
    st->selection = st->fingerprint;
    st->partition = VF_PARTITION_EPISODE;
    return 0;
}

static PyObject *state_to_dict(const vf_loader_state *st)
{
    PyObject *ranges = PyList_New((Py_ssize_t)(2 * st->num_ranges));
    for (size_t i = 0; ranges && i < 2 * st->num_ranges; i++)
        PyList_SET_ITEM(ranges, (Py_ssize_t)i, PyLong_FromLongLong(st->ranges[i]));
    if (!ranges)
        return NULL;
    return Py_BuildValue("{s:s,s:I,s:K,s:L,s:K,s:L,s:L,s:L,s:i,s:i,s:i,s:i,s:L,s:N}", "kind", "wds", "version",
                         (unsigned)st->version, "fingerprint", (unsigned long long)st->fingerprint, "positions",
                         (long long)st->positions, "seed", (unsigned long long)st->seed, "epoch",
                         (long long)st->epoch, "samples_consumed", (long long)st->samples_consumed, "batch_size",
                         (long long)st->batch_size, "world_size", (int)st->world_size, "consumers",
                         (int)st->consumers, "shuffle", (int)st->shuffle, "drop_last", (int)st->drop_last,
                         "shuffle_buffer", (long long)st->shuffle_buffer, "ranges", ranges);
}

static int WdsLoader_init(WdsLoaderObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"manifest", "batch_size", "seed", "shuffle", "drop_last", "epoch", "rank",
                             "world_size", "num_consumers", "consumer", "shuffle_buffer", "fields",
                             "image_format", "resize", "on_error", "threads", "state", "prefetch", NULL};
    const char *manifest = NULL, *fields = NULL, *image_format = "uint8_hwc", *on_error = "raise";
    Py_ssize_t batch_size = 32, shuffle_buffer = 1000, prefetch = 2;
    unsigned long long seed = 0;
    int shuffle = 1, drop_last = 0, rank = 0, world_size = 1, num_consumers = 1, consumer = -1, threads = 0;
    long long epoch = 0;
    PyObject *resize = Py_None, *state = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|nKppLiiiinzsOsiOn", kwlist, &manifest, &batch_size, &seed,
                                     &shuffle, &drop_last, &epoch, &rank, &world_size, &num_consumers, &consumer,
                                     &shuffle_buffer, &fields, &image_format, &resize, &on_error, &threads, &state,
                                     &prefetch))
        return -1;
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    if (batch_size < 1 || shuffle_buffer < 0 || epoch < 0 || prefetch < 0) {
        PyErr_SetString(PyExc_ValueError, "batch_size must be >= 1, shuffle_buffer, prefetch and epoch >= 0");
        return -1;
    }
    s.batch_size = (size_t)batch_size;
    s.seed = seed;
    s.shuffle = shuffle;
    s.drop_last = drop_last;
    s.epoch = epoch;
    s.rank = rank;
    s.world_size = world_size;
    s.num_consumers = num_consumers;
    s.consumer = consumer;
    s.shuffle_buffer = (size_t)shuffle_buffer;
    s.fields = fields;
    s.threads = threads;
    s.prefetch = (size_t)prefetch;
    if (!strcmp(image_format, "uint8_hwc") || !strcmp(image_format, "uint8")) {
        s.image_float_chw = 0;
    } else if (!strcmp(image_format, "float_chw") || !strcmp(image_format, "float32")) {
        s.image_float_chw = 1;
    } else {
        PyErr_Format(PyExc_ValueError, "image_format must be 'uint8_hwc' or 'float_chw', not '%s'", image_format);
        return -1;
    }
    if (!strcmp(on_error, "skip")) {
        s.on_error = VF_WDS_SKIP;
    } else if (strcmp(on_error, "raise") != 0) {
        PyErr_SetString(PyExc_ValueError, "on_error must be 'raise' or 'skip'");
        return -1;
    }
    if (resize != Py_None && !PyArg_ParseTuple(resize, "ii;resize must be (width, height)", &s.resize_width,
                                               &s.resize_height))
        return -1;
    vf_loader_state st;
    if (state != Py_None) {
        if (parse_state(state, &st) < 0)
            return -1;
        s.resume = &st;
    }
    vf_wds_loader *l = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_wds_loader_open(&l, manifest, &s);
    Py_END_ALLOW_THREADS
    if (s.resume)
        PyMem_Free((void *)st.ranges);
    if (r < 0) {
        vf_py_raise(r);
        return -1;
    }
    vf_wds_loader_close(self->loader);
    self->loader = l;
    return 0;
}

static void WdsLoader_dealloc(WdsLoaderObject *self)
{
    vf_wds_loader_close(self->loader);
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

static PyObject *shape_tuple(const vf_wds_column *c)
{
    PyObject *t = PyTuple_New(c->ndim);
    for (int k = 0; t && k < c->ndim; k++)
        PyTuple_SET_ITEM(t, k, PyLong_FromLongLong(c->shape[k]));
    return t;
}

static PyObject *string_list(char **items, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(items[i], (Py_ssize_t)strlen(items[i]), "surrogateescape");
        if (!s) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, s);
    }
    return list;
}

static PyObject *column_to_tuple(vf_wds_column *c, size_t rows)
{
    PyObject *payload = NULL;
    const char *kind;
    if (c->type == VF_WDS_BYTES) {
        kind = c->npy ? "npy" : "bytes";
        payload = PyList_New((Py_ssize_t)rows);
        for (size_t i = 0; payload && i < rows; i++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)c->items[i], (Py_ssize_t)c->item_sizes[i]);
            if (!b) {
                Py_CLEAR(payload);
                break;
            }
            PyList_SET_ITEM(payload, (Py_ssize_t)i, b);
        }
    } else {
        kind = "array";
        WdsBufferObject *buf = PyObject_New(WdsBufferObject, &WdsBuffer_Type);
        if (buf) {
            buf->data = c->data; /* moved: the batch no longer frees it */
            buf->len = (Py_ssize_t)c->nbytes;
            c->data = NULL;
        }
        payload = (PyObject *)buf;
    }
    if (!payload)
        return NULL;
    PyObject *shape = shape_tuple(c);
    if (!shape) {
        Py_DECREF(payload);
        return NULL;
    }
    return Py_BuildValue("(ssNNsN)", c->name, c->suffix, PyUnicode_FromString(kind), payload, c->descr, shape);
}

static PyObject *batch_to_python(vf_wds_batch *b)
{
    PyObject *cols = PyList_New((Py_ssize_t)b->num_columns);
    for (size_t i = 0; cols && i < b->num_columns; i++) {
        PyObject *t = column_to_tuple(&b->columns[i], b->size);
        if (!t) {
            Py_CLEAR(cols);
            break;
        }
        PyList_SET_ITEM(cols, (Py_ssize_t)i, t);
    }
    if (!cols)
        return NULL;
    PyObject *positions = PyList_New((Py_ssize_t)b->size);
    for (size_t i = 0; positions && i < b->size; i++)
        PyList_SET_ITEM(positions, (Py_ssize_t)i, PyLong_FromLongLong(b->positions[i]));
    PyObject *keys = string_list(b->keys, b->size), *shards = string_list(b->shards, b->size);
    if (!positions || !keys || !shards) {
        Py_DECREF(cols);
        Py_XDECREF(positions);
        Py_XDECREF(keys);
        Py_XDECREF(shards);
        return NULL;
    }
    return Py_BuildValue("{s:N,s:N,s:N,s:N,s:n}", "columns", cols, "keys", keys, "shards", shards, "positions",
                         positions, "size", (Py_ssize_t)b->size);
}

static PyObject *WdsLoader_next_batch(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    vf_wds_batch *b = NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_wds_loader_next(self->loader, &b);
    Py_END_ALLOW_THREADS
    if (r == VF_EOF)
        Py_RETURN_NONE;
    if (r < 0)
        return vf_py_raise(r);
    PyObject *out = batch_to_python(b);
    vf_wds_batch_free(b);
    return out;
}

static PyObject *WdsLoader_set_epoch(WdsLoaderObject *self, PyObject *arg)
{
    if (check_open(self) < 0)
        return NULL;
    long long epoch = PyLong_AsLongLong(arg);
    if (epoch == -1 && PyErr_Occurred())
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_wds_loader_set_epoch(self->loader, epoch);
    Py_END_ALLOW_THREADS
    if (r < 0)
        return vf_py_raise(r);
    Py_RETURN_NONE;
}

static PyObject *WdsLoader_get_state(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    vf_loader_state st;
    int r = vf_wds_loader_get_state(self->loader, &st);
    if (r < 0)
        return vf_py_raise(r);
    return state_to_dict(&st);
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
    if (r < 0)
        return vf_py_raise(r);
    return state_to_dict(&st);
}

static PyObject *WdsLoader_set_state(WdsLoaderObject *self, PyObject *arg)
{
    if (check_open(self) < 0)
        return NULL;
    vf_loader_state st;
    if (parse_state(arg, &st) < 0)
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = vf_wds_loader_set_state(self->loader, &st);
    Py_END_ALLOW_THREADS
    PyMem_Free((void *)st.ranges);
    if (r < 0)
        return vf_py_raise(r);
    Py_RETURN_NONE;
}

static PyObject *WdsLoader_stats(WdsLoaderObject *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    vf_wds_stats st;
    vf_wds_loader_stats(self->loader, &st);
    size_t n = vf_wds_loader_num_skip_messages(self->loader);
    PyObject *messages = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; messages && i < n; i++)
        PyList_SET_ITEM(messages, (Py_ssize_t)i, PyUnicode_FromString(vf_wds_loader_skip_message(self->loader, i)));
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
    vf_wds_loader_close(self->loader);
    self->loader = NULL;
    Py_RETURN_NONE;
}

static PyObject *WdsLoader_get_num_samples(WdsLoaderObject *self, void *c)
{
    (void)c;
    return check_open(self) < 0 ? NULL : PyLong_FromLongLong(vf_wds_loader_num_samples(self->loader));
}

static PyObject *WdsLoader_get_num_batches(WdsLoaderObject *self, void *c)
{
    (void)c;
    return check_open(self) < 0 ? NULL : PyLong_FromSize_t(vf_wds_loader_num_batches(self->loader));
}

static PyObject *WdsLoader_get_batches_delivered(WdsLoaderObject *self, void *c)
{
    (void)c;
    return check_open(self) < 0 ? NULL : PyLong_FromSize_t(vf_wds_loader_batches_delivered(self->loader));
}

static PyObject *WdsLoader_get_shards(WdsLoaderObject *self, void *c)
{
    (void)c;
    if (check_open(self) < 0)
        return NULL;
    const vf_wds_manifest *m = vf_wds_loader_manifest(self->loader);
    size_t n = vf_wds_manifest_num_shards(m);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(ssL)", vf_wds_manifest_shard_name(m, i), vf_wds_manifest_shard_url(m, i),
                                    (long long)vf_wds_manifest_shard_samples(m, i));
        if (!t) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
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
    {"num_samples", (getter)WdsLoader_get_num_samples, NULL, "samples per epoch of this loader", NULL},
    {"num_batches", (getter)WdsLoader_get_num_batches, NULL, "batches per epoch of this loader", NULL},
    {"batches_delivered", (getter)WdsLoader_get_batches_delivered, NULL, "batches of the epoch so far", NULL},
    {"shards", (getter)WdsLoader_get_shards, NULL, "[(name, url, num_sequences)] from the manifest", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WdsLoader_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "vlafeed._native.WdsLoader",
    .tp_basicsize = sizeof(WdsLoaderObject),
    .tp_dealloc = (destructor)WdsLoader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WdsLoader(manifest, batch_size=32, seed=0, shuffle=True, drop_last=False, epoch=0, rank=0, "
              "world_size=1, num_consumers=1, consumer=-1, shuffle_buffer=1000, fields=None, "
              "image_format='uint8_hwc', resize=None, on_error='raise', threads=0, state=None, prefetch=2)",
    .tp_methods = WdsLoader_methods,
    .tp_getset = WdsLoader_getset,
    .tp_init = (initproc)WdsLoader_init,
    .tp_new = PyType_GenericNew,
};

int vf_py_register_wds(PyObject *module)
{
    if (PyType_Ready(&WdsBuffer_Type) < 0 || PyType_Ready(&WdsLoader_Type) < 0)
        return -1;
    Py_INCREF(&WdsLoader_Type);
    if (PyModule_AddObject(module, "WdsLoader", (PyObject *)&WdsLoader_Type) < 0) {
        Py_DECREF(&WdsLoader_Type);
        return -1;
    }
    return 0;
}
