/*
 * py_state.c: vf_loader_state <-> dict, in the two forms Python sees: a
 * Loader's state_dict() (mode and partition by name, shuffle / drop_last as
 * bools, ranges as [start, end] pairs, read strictly: KeyError / TypeError /
 * ValueError naming the key; the elastic generations as a list of dicts)
 * and a ShardLoader's (kind 'wds', ints, ranges as one flat list). One table lists the fields, in dict order, with the
 * forms each belongs to. Also the mode and partition names.
 */
#include "py_loader.h"

#include <string.h>

const vf_py_choice vf_py_modes[] = {
    {"map", VF_MODE_MAP}, {"stream", VF_MODE_STREAM}, {"pool", VF_MODE_POOL}, {NULL, 0}};
const vf_py_choice vf_py_partitions[] = {{"file_group", VF_PARTITION_FILE_GROUP},
                                         {"episode", VF_PARTITION_EPISODE},
                                         {"sequential", VF_PARTITION_SEQUENTIAL},
                                         {NULL, 0}};

typedef enum field_kind {
    F_KIND,      /* "wds", the ShardLoader form's tag */
    F_SIGNED,    /* an integer field */
    F_UNSIGNED,
    F_FLAG,      /* a bool in the Loader form, an int in the ShardLoader form */
    F_MODE,      /* by name */
    F_PARTITION, /* by name, None outside stream mode */
    F_RANGES,
    F_GENERATIONS, /* the Loader form's earlier layouts of the epoch */
} field_kind;

#define LOADER (1 << VF_PY_STATE_LOADER)
#define WDS (1 << VF_PY_STATE_WDS)

static const struct state_field {
    const char *key;
    field_kind kind;
    size_t offset, size;
    int forms;
} fields[] = {
    {"kind", F_KIND, 0, 0, WDS},
    {"version", F_UNSIGNED, VF_PY_FIELD(vf_loader_state, version), LOADER | WDS},
    {"mode", F_MODE, VF_PY_FIELD(vf_loader_state, mode), LOADER},
    {"fingerprint", F_UNSIGNED, VF_PY_FIELD(vf_loader_state, fingerprint), LOADER | WDS},
    {"selection", F_UNSIGNED, VF_PY_FIELD(vf_loader_state, selection), LOADER},
    {"positions", F_SIGNED, VF_PY_FIELD(vf_loader_state, positions), LOADER | WDS},
    {"seed", F_UNSIGNED, VF_PY_FIELD(vf_loader_state, seed), LOADER | WDS},
    {"epoch", F_SIGNED, VF_PY_FIELD(vf_loader_state, epoch), LOADER | WDS},
    {"samples_consumed", F_SIGNED, VF_PY_FIELD(vf_loader_state, samples_consumed), LOADER | WDS},
    {"batch_size", F_SIGNED, VF_PY_FIELD(vf_loader_state, batch_size), LOADER | WDS},
    {"world_size", F_SIGNED, VF_PY_FIELD(vf_loader_state, world_size), LOADER | WDS},
    {"consumers", F_SIGNED, VF_PY_FIELD(vf_loader_state, consumers), LOADER | WDS},
    {"shuffle", F_FLAG, VF_PY_FIELD(vf_loader_state, shuffle), LOADER | WDS},
    {"drop_last", F_FLAG, VF_PY_FIELD(vf_loader_state, drop_last), LOADER | WDS},
    {"partition", F_PARTITION, VF_PY_FIELD(vf_loader_state, partition), LOADER},
    {"shuffle_buffer", F_SIGNED, VF_PY_FIELD(vf_loader_state, shuffle_buffer), LOADER | WDS},
    {"episode_pool_size", F_SIGNED, VF_PY_FIELD(vf_loader_state, episode_pool_size), LOADER},
    {"ranges", F_RANGES, 0, 0, LOADER | WDS},
    {"generations", F_GENERATIONS, 0, 0, LOADER},
    {"settings_hash", F_UNSIGNED, VF_PY_FIELD(vf_loader_state, settings_hash), LOADER},
};
#define NUM_FIELDS (sizeof fields / sizeof fields[0])

/* ---- integers of any width ------------------------------------------------------ */

/* A state field's bits (fields are 32 or 64 bits wide), sign-extended when signed. */
static unsigned long long load_bits(const char *p, size_t size, int is_signed)
{
    uint64_t v64;
    uint32_t v32;
    if (size == sizeof v64) {
        memcpy(&v64, p, sizeof v64);
        return v64;
    }
    memcpy(&v32, p, sizeof v32);
    return is_signed ? (unsigned long long)(long long)(int32_t)v32 : v32;
}

static void put_bits(char *p, size_t size, unsigned long long bits)
{
    uint64_t v64 = bits;
    uint32_t v32 = (uint32_t)bits;
    if (size == sizeof v64)
        memcpy(p, &v64, size);
    else
        memcpy(p, &v32, sizeof v32);
}

/* ---- to a dict ---------------------------------------------------------------------- */

static PyObject *range_pair(const void *ranges, size_t i)
{
    const int64_t *r = ranges;
    return Py_BuildValue("[LL]", (long long)r[2 * i], (long long)r[2 * i + 1]);
}

static PyObject *range_bound(const void *ranges, size_t i)
{
    return PyLong_FromLongLong(((const int64_t *)ranges)[i]);
}

/* The keys of one generation's dict, in the order of vf_loader_generation's fields. */
static const char *const generation_keys[5] = {"world_size", "consumers", "batch_size", "batches", "remaining"};

static PyObject *generation_dict(const void *gens, size_t i)
{
    const vf_loader_generation *g = (const vf_loader_generation *)gens + i;
    const int64_t v[5] = {g->world_size, g->consumers, g->batch_size, g->batches, g->remaining};
    PyObject *d = PyDict_New();
    for (int k = 0; d && k < 5; k++) {
        PyObject *x = PyLong_FromLongLong((long long)v[k]);
        if (!x || PyDict_SetItemString(d, generation_keys[k], x) < 0)
            Py_CLEAR(d);
        Py_XDECREF(x);
    }
    return d;
}

static PyObject *field_value(const vf_loader_state *st, const struct state_field *f, vf_py_state_form form)
{
    const char *p = (const char *)st + f->offset;
    const char *name;
    switch (f->kind) {
    case F_KIND:
        return PyUnicode_FromString("wds");
    case F_SIGNED:
        return PyLong_FromLongLong((long long)load_bits(p, f->size, 1));
    case F_UNSIGNED:
        return PyLong_FromUnsignedLongLong(load_bits(p, f->size, 0));
    case F_FLAG:
        return form == VF_PY_STATE_LOADER ? PyBool_FromLong(load_bits(p, f->size, 1) != 0)
                                          : PyLong_FromLongLong((long long)load_bits(p, f->size, 1));
    case F_MODE:
        name = vf_py_choice_name(vf_py_modes, (int)st->mode);
        return PyUnicode_FromString(name ? name : "unknown");
    case F_PARTITION:
        name = st->mode == VF_MODE_STREAM ? vf_py_choice_name(vf_py_partitions, st->partition) : NULL;
        return name ? PyUnicode_FromString(name) : Py_NewRef(Py_None);
    case F_RANGES:
        return form == VF_PY_STATE_LOADER ? vf_py_list(st->num_ranges, range_pair, st->ranges)
                                          : vf_py_list(2 * st->num_ranges, range_bound, st->ranges);
    case F_GENERATIONS:
        return vf_py_list(st->num_generations, generation_dict, st->generations);
    }
    return NULL;
}

PyObject *vf_py_state_to_dict(const vf_loader_state *st, vf_py_state_form form)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < NUM_FIELDS; i++) {
        if (!(fields[i].forms & (1 << form)))
            continue;
        PyObject *v = field_value(st, &fields[i], form);
        if (!v || PyDict_SetItemString(d, fields[i].key, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* ---- from a dict ------------------------------------------------------------------- */

/* The integer at f->key, in the range of its field (a 32-bit field takes
 * a 32-bit value: nothing wraps or is cut). Missing, not an integer or out
 * of range: an error naming the key, in each form's words (the Loader
 * form's KeyError / TypeError / ValueError "loader state: ...", the
 * ShardLoader form's ValueError "state lacks ..." for a missing key). */
static int state_int(PyObject *d, const struct state_field *f, vf_py_state_form form, unsigned long long *bits)
{
    const char *who = form == VF_PY_STATE_LOADER ? "loader state" : "shard loader state";
    PyObject *v = PyDict_GetItemString(d, f->key); /* borrowed */
    if (!v) {
        if (form == VF_PY_STATE_LOADER)
            PyErr_Format(PyExc_KeyError, "loader state: missing key '%s'", f->key);
        else
            PyErr_Format(PyExc_ValueError, "state lacks '%s'", f->key);
        return -1;
    }
    PyObject *ix = PyBool_Check(v) && f->kind != F_FLAG ? NULL : PyNumber_Index(v);
    if (!ix) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: '%s' must be an integer", who, f->key);
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(ix, &overflow);
    unsigned long long u = 0;
    int bad;
    if (f->kind == F_UNSIGNED) {
        u = PyLong_AsUnsignedLongLong(ix); /* fails for negatives and values of 2^64 and more */
        bad = PyErr_Occurred() != NULL || (f->size < 8 && u > 0xffffffffull);
        *bits = u;
    } else {
        bad = overflow != 0 || PyErr_Occurred() != NULL ||
              (f->size < 8 && (value < INT32_MIN || value > INT32_MAX)) || (f->kind == F_FLAG && (value < 0 || value > 1));
        *bits = (unsigned long long)value;
    }
    Py_DECREF(ix);
    if (bad) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: '%s' is out of range", who, f->key);
        return -1;
    }
    return 0;
}

/* The Loader form's mode and partition, by name. */
static int loader_names(PyObject *d, vf_loader_state *st)
{
    PyObject *mode = PyDict_GetItemString(d, "mode"), *partition = PyDict_GetItemString(d, "partition");
    if (!mode || !PyUnicode_Check(mode)) {
        PyErr_SetString(PyExc_KeyError, "loader state: missing key 'mode' (a mode name)");
        return -1;
    }
    const char *m = PyUnicode_AsUTF8(mode);
    const vf_py_choice *c = vf_py_choice_find(vf_py_modes, m);
    if (!c) {
        PyErr_Format(PyExc_ValueError, "loader state: unknown mode '%s'", m ? m : "?");
        return -1;
    }
    st->mode = (uint32_t)c->value;
    if (partition && partition != Py_None) {
        c = vf_py_choice_find(vf_py_partitions, PyUnicode_Check(partition) ? PyUnicode_AsUTF8(partition) : NULL);
        if (!c) {
            PyErr_SetString(PyExc_ValueError, "loader state: 'partition' must be a partition name or None");
            return -1;
        }
        st->partition = c->value;
    } else if (st->mode == VF_MODE_STREAM) { /* state_dict() names a stream loader's partition */
        PyErr_SetString(PyExc_ValueError, "loader state: 'partition' is missing or None, but a stream-mode state "
                                          "names its partition");
        return -1;
    }
    return 0;
}

/* The [start, end] of one remaining range into bounds: 1, or 0 (no exception set). */
static int range_bounds(PyObject *pair, int64_t *bounds)
{
    long long start = 0, end = 0;
    PyObject *t = PySequence_Check(pair) ? PySequence_Tuple(pair) : NULL;
    int ok = t && PyArg_ParseTuple(t, "LL", &start, &end);
    Py_XDECREF(t);
    PyErr_Clear();
    bounds[0] = start;
    bounds[1] = end;
    return ok;
}

/* A state without 'ranges': only version 1 states have none (from version
 * 2 on an elastic resume's remainder lives there: dropping it would deliver
 * what was delivered). */
static int no_ranges(const vf_loader_state *st, const char *what)
{
    if (st->version < 2)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: 'ranges' is missing or None (a version %u state has a list, [] for a whole "
                 "epoch)", what, (unsigned)st->version);
    return -1;
}

/* The Loader form's ranges: [[start, end], ...] (optional: version 1 states have none). */
static int loader_ranges(PyObject *d, vf_loader_state *st)
{
    PyObject *ranges = PyDict_GetItemString(d, "ranges"); /* borrowed */
    if (!ranges || ranges == Py_None)
        return no_ranges(st, "loader state");
    PyObject *seq = PySequence_Fast(ranges, "loader state: 'ranges' must be a list of [start, end] pairs");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = 0;
    int64_t *bounds = PyMem_New(int64_t, 2 * (size_t)n + 1);
    int nomem = !bounds;
    while (bounds && i < n && range_bounds(PySequence_Fast_GET_ITEM(seq, i), bounds + 2 * i))
        i++;
    Py_DECREF(seq);
    if (nomem || i < n || n == 0)
        PyMem_Free(bounds);
    if (nomem || i < n) {
        if (nomem)
            PyErr_NoMemory();
        else
            PyErr_Format(PyExc_ValueError, "loader state: ranges[%zd] is not a [start, end] pair of integers", i);
        return -1;
    }
    st->num_ranges = (size_t)n;
    st->ranges = n > 0 ? bounds : NULL;
    return 0;
}

/* The Loader form's generations: [{"world_size": .., "consumers": .., "batch_size": .., "batches": ..,
 * "remaining": ..}, ...], required from version 3 on (dropping them would deliver again what the earlier
 * runs delivered), absent before. Values are checked by the engine (vf_loader_state_batches). */
static int loader_generations(PyObject *d, vf_loader_state *st)
{
    PyObject *gens = PyDict_GetItemString(d, "generations"); /* borrowed */
    if (!gens || gens == Py_None) {
        if (st->version < 3)
            return 0;
        PyErr_Format(PyExc_ValueError, "loader state: 'generations' is missing or None (a version %u state has a "
                     "list, [] when the epoch was not resumed elastically)", (unsigned)st->version);
        return -1;
    }
    if (!PyList_Check(gens) && !PyTuple_Check(gens)) {
        PyErr_Format(PyExc_TypeError, "loader state: 'generations' must be a list of dicts, got %s",
                     Py_TYPE(gens)->tp_name);
        return -1;
    }
    Py_ssize_t n = PySequence_Size(gens);
    if (n > VF_LOADER_MAX_GENERATIONS) {
        PyErr_Format(PyExc_ValueError, "loader state: %zd generations; at most %d", n, VF_LOADER_MAX_GENERATIONS);
        return -1;
    }
    vf_loader_generation *v = n > 0 ? PyMem_New(vf_loader_generation, (size_t)n) : NULL;
    if (n > 0 && !v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *g = PySequence_GetItem(gens, i);
        int64_t vals[5];
        int ok = g && PyDict_Check(g);
        if (!ok)
            PyErr_Format(PyExc_TypeError, "loader state: generations[%zd] must be a dict", i);
        for (int k = 0; ok && k < 5; k++) {
            PyObject *x = PyDict_GetItemString(g, generation_keys[k]);
            if (!x) {
                PyErr_Format(PyExc_KeyError, "loader state: generations[%zd] lacks '%s'", i, generation_keys[k]);
                ok = 0;
            } else if (!PyLong_Check(x) || PyBool_Check(x)) {
                PyErr_Format(PyExc_TypeError, "loader state: generations[%zd]['%s'] must be an integer", i,
                             generation_keys[k]);
                ok = 0;
            } else {
                int overflow = 0;
                vals[k] = PyLong_AsLongLongAndOverflow(x, &overflow);
                if (overflow || PyErr_Occurred()) {
                    PyErr_Clear();
                    PyErr_Format(PyExc_ValueError, "loader state: generations[%zd]['%s'] is out of range", i,
                                 generation_keys[k]);
                    ok = 0;
                }
            }
        }
        Py_XDECREF(g);
        if (!ok) {
            PyMem_Free(v);
            return -1;
        }
        v[i] = (vf_loader_generation){vals[0], vals[1], vals[2], vals[3], vals[4]};
    }
    st->num_generations = (size_t)n;
    st->generations = v;
    return 0;
}

/* The ShardLoader form's ranges: one flat list of [start, end) bounds. */
static int wds_ranges(PyObject *d, vf_loader_state *st)
{
    PyObject *ranges = PyDict_GetItemString(d, "ranges");
    if (!ranges || ranges == Py_None)
        return no_ranges(st, "shard loader state");
    if (!PyList_Check(ranges) && !PyTuple_Check(ranges)) {
        PyErr_Format(PyExc_TypeError, "state['ranges'] must be a list of integers, got %s", Py_TYPE(ranges)->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PySequence_Size(ranges); i++) {
        PyObject *item = PySequence_GetItem(ranges, i);
        int ok = item && PyLong_Check(item) && !PyBool_Check(item);
        Py_XDECREF(item);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "state['ranges'][%zd] must be an integer", i);
            return -1;
        }
    }
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
    return 0;
}

/* The dict's own checks before the fields: its type, and the form's tag or names. */
static int check_form(PyObject *d, vf_loader_state *st, vf_py_state_form form)
{
    if (form == VF_PY_STATE_LOADER) {
        if (!PyDict_Check(d)) {
            PyErr_SetString(PyExc_TypeError, "a loader state is a dict (from state_dict())");
            return -1;
        }
        return loader_names(d, st);
    }
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "state must be a dict from state_dict()");
        return -1;
    }
    PyObject *kind = PyDict_GetItemString(d, "kind");
    const char *k = kind && PyUnicode_Check(kind) ? PyUnicode_AsUTF8(kind) : NULL;
    if (!k || strcmp(k, "wds") != 0) {
        PyErr_SetString(PyExc_ValueError, "state is not a ShardLoader state (kind != 'wds')");
        return -1;
    }
    return 0;
}

int vf_py_state_from_dict(PyObject *d, vf_loader_state *st, vf_py_state_form form)
{
    memset(st, 0, sizeof *st);
    if (check_form(d, st, form) < 0)
        return -1;
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        const struct state_field *f = &fields[i];
        unsigned long long bits = 0;
        if (!(f->forms & (1 << form)) || (f->kind != F_SIGNED && f->kind != F_UNSIGNED && f->kind != F_FLAG))
            continue;
        if (state_int(d, f, form, &bits) < 0)
            return -1;
        put_bits((char *)st + f->offset, f->size, bits);
    }
    if (form == VF_PY_STATE_WDS && (st->version < 1 || st->version > VF_LOADER_STATE_VERSION)) {
        PyErr_Format(PyExc_ValueError, "shard loader state: version %u is not one this build reads (1 to %d)",
                     (unsigned)st->version, VF_LOADER_STATE_VERSION);
        return -1;
    }
    if ((form == VF_PY_STATE_LOADER ? loader_ranges(d, st) : wds_ranges(d, st)) < 0)
        return -1;
    if (form == VF_PY_STATE_LOADER && loader_generations(d, st) < 0) {
        vf_py_state_clear(st);
        return -1;
    }
    if (form == VF_PY_STATE_WDS) { /* what a shard loader's state always holds */
        st->mode = VF_MODE_STREAM;
        st->selection = st->fingerprint;
        st->partition = VF_PARTITION_EPISODE;
    }
    return 0;
}

void vf_py_state_clear(vf_loader_state *st)
{
    PyMem_Free((void *)st->ranges);
    st->ranges = NULL;
    st->num_ranges = 0;
    PyMem_Free((void *)st->generations);
    st->generations = NULL;
    st->num_generations = 0;
}

int vf_py_resume_setting(PyObject *d, vf_py_state_form form, vf_loader_state *st, const vf_loader_state **resume)
{
    if (vf_py_state_from_dict(d, st, form) < 0)
        return -1;
    *resume = st;
    return 0;
}
