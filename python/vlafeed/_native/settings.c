/*
 * settings.c: the loop behind every settings table (settings.h). The first
 * pass takes each setting from its position or keyword and converts it as
 * PyArg_ParseTupleAndKeywords would convert its format letter, with the
 * same errors (so the messages users and tests see are getargs' own); then
 * the minimums are checked (one message for the table, as the hand-written
 * checks had); last each value is checked and stored in the options struct:
 * the names among choices first, then the others (own parsers), each in
 * keyword order.
 */
#include "settings.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

typedef union converted {
    long long i;
    unsigned long long u;
    double d;
    const char *s;
} converted;

const vf_py_choice *vf_py_choice_find(const vf_py_choice *choices, const char *name)
{
    for (const vf_py_choice *c = choices; name && c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

const char *vf_py_choice_name(const vf_py_choice *choices, int value)
{
    for (const vf_py_choice *c = choices; c->name; c++)
        if (c->value == value)
            return c->name;
    return NULL;
}

int vf_py_choose(PyObject *obj, const char *what, const vf_py_choice *choices, int *out)
{
    if (!obj || obj == Py_None)
        return 0;
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!s) {
        PyErr_Format(PyExc_TypeError, "%s must be a string", what);
        return -1;
    }
    const vf_py_choice *c = vf_py_choice_find(choices, s);
    if (!c) {
        PyErr_Format(PyExc_ValueError, "%s: unknown value '%s'", what, s);
        return -1;
    }
    *out = c->value;
    return 0;
}

/* ---- pass 1: getargs' conversions ------------------------------------------------ */

/* getargs' "<fname>() argument <n> must be <expected>, not <type>". */
static int bad_type(const vf_py_settings *spec, int i, const char *expected, PyObject *arg)
{
    PyErr_Format(PyExc_TypeError, "%.200s%sargument %d must be %.50s, not %.50s", spec->fname ? spec->fname : "",
                 spec->fname ? "() " : "", i + 1, expected, arg == Py_None ? "None" : Py_TYPE(arg)->tp_name);
    return -1;
}

static int convert(const vf_py_settings *spec, int i, PyObject *arg, converted *v, void *options)
{
    const vf_py_setting *e = &spec->list[i];
    switch (e->kind) {
    case VF_PY_SSIZE: {
        PyObject *index = PyNumber_Index(arg);
        v->i = index ? PyLong_AsSsize_t(index) : -1;
        Py_XDECREF(index);
        return v->i == -1 && PyErr_Occurred() ? -1 : 0;
    }
    case VF_PY_INT: {
        long x = PyLong_AsLong(arg);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x > INT_MAX || x < INT_MIN) {
            PyErr_SetString(PyExc_OverflowError, x > INT_MAX ? "signed integer is greater than maximum"
                                                             : "signed integer is less than minimum");
            return -1;
        }
        v->i = x;
        return 0;
    }
    case VF_PY_LLONG:
        v->i = PyLong_AsLongLong(arg);
        return v->i == -1 && PyErr_Occurred() ? -1 : 0;
    case VF_PY_ULLONG:
        if (!PyLong_Check(arg))
            return bad_type(spec, i, "int", arg);
        v->u = PyLong_AsUnsignedLongLongMask(arg);
        return v->u == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
    case VF_PY_BOOL:
        v->i = PyObject_IsTrue(arg);
        return v->i < 0 ? -1 : 0;
    case VF_PY_DOUBLE:
        v->d = PyFloat_AsDouble(arg);
        return v->d == -1.0 && PyErr_Occurred() ? -1 : 0;
    case VF_PY_STR:
    case VF_PY_STR_OR_NONE: {
        v->s = NULL;
        if (arg == Py_None && e->kind == VF_PY_STR_OR_NONE)
            return 0;
        if (!PyUnicode_Check(arg))
            return bad_type(spec, i, e->kind == VF_PY_STR ? "str" : "str or None", arg);
        Py_ssize_t len;
        v->s = PyUnicode_AsUTF8AndSize(arg, &len);
        if (!v->s)
            return -1;
        if (strlen(v->s) != (size_t)len) {
            PyErr_SetString(PyExc_ValueError, "embedded null character");
            return -1;
        }
        return 0;
    }
    case VF_PY_OBJECT:
        return e->type && !PyObject_TypeCheck(arg, e->type) ? bad_type(spec, i, e->type->tp_name, arg) : 0;
    case VF_PY_WIDTH_HEIGHT:
    case VF_PY_ENTRIES:
        return 0;
    case VF_PY_PATH: {
        PyObject *bytes = NULL;
        if (!PyUnicode_FSConverter(arg, &bytes))
            return -1;
        memcpy((char *)options + e->offset, &bytes, sizeof bytes); /* owned by options from now on */
        return 0;
    }
    }
    return 0;
}

/* After the table's own arguments: a keyword given twice or unknown (getargs' texts). */
static int extra_keywords(const vf_py_settings *spec, PyObject *kwargs, Py_ssize_t nargs)
{
    const char *fname = spec->fname ? spec->fname : "function", *parens = spec->fname ? "()" : "";
    for (Py_ssize_t i = 0; i < nargs && i < spec->count; i++)
        if (PyDict_GetItemString(kwargs, spec->list[i].name)) {
            PyErr_Format(PyExc_TypeError, "argument for %.200s%s given by name ('%s') and position (%d)", fname,
                         parens, spec->list[i].name, (int)i + 1);
            return -1;
        }
    Py_ssize_t pos = 0;
    PyObject *key;
    while (PyDict_Next(kwargs, &pos, &key, NULL)) {
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "keywords must be strings");
            return -1;
        }
        int known = 0;
        for (int i = 0; i < spec->count && !known; i++)
            known = PyUnicode_CompareWithASCIIString(key, spec->list[i].name) == 0;
        if (!known) {
            PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %.200s%s", key,
                         spec->fname ? spec->fname : "this function", parens);
            return -1;
        }
    }
    PyErr_Format(PyExc_TypeError, "invalid keyword argument for %.200s%s", fname, parens);
    return -1;
}

/* Pass 1: given[i] = setting i's argument (borrowed, NULL: not given), converted into values[i]. */
static int gather(const vf_py_settings *spec, PyObject *args, PyObject *kwargs, PyObject **given, converted *values,
                  void *options)
{
    const char *fname = spec->fname ? spec->fname : "function", *parens = spec->fname ? "()" : "";
    Py_ssize_t nargs = PyTuple_GET_SIZE(args), nkwargs = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    if (nargs + nkwargs > spec->count) {
        PyErr_Format(PyExc_TypeError, "%.200s%s takes at most %d %sargument%s (%zd given)", fname, parens, spec->count,
                     nargs == 0 ? "keyword " : "", spec->count == 1 ? "" : "s", nargs + nkwargs);
        return -1;
    }
    for (int i = 0; i < spec->count; i++) {
        if (i == spec->positional && nargs > i) {
            PyErr_Format(PyExc_TypeError, "%.200s%s takes %s %d positional argument%s (%zd given)", fname, parens,
                         spec->required <= spec->positional ? "at most" : "exactly", i, i == 1 ? "" : "s", nargs);
            return -1;
        }
        given[i] = i < nargs ? PyTuple_GET_ITEM(args, i)
                   : nkwargs ? PyDict_GetItemString(kwargs, spec->list[i].name)
                             : NULL;
        if (given[i] && i >= nargs)
            nkwargs--;
        if (given[i] && convert(spec, i, given[i], &values[i], options) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_SystemError, "settings: conversion failed without an error");
            return -1;
        }
        if (!given[i] && i < spec->required) {
            PyErr_Format(PyExc_TypeError, "%.200s%s missing required argument '%s' (pos %d)", fname, parens,
                         spec->list[i].name, i + 1);
            return -1;
        }
    }
    return nkwargs > 0 ? extra_keywords(spec, kwargs, nargs) : 0;
}

/* ---- pass 2: checks and stores ---------------------------------------------------- */

static void store_bits(char *field, size_t size, unsigned long long bits)
{
    if (size == sizeof(uint64_t)) {
        uint64_t v = bits;
        memcpy(field, &v, size);
    } else if (size == sizeof(uint32_t)) {
        uint32_t v = (uint32_t)bits;
        memcpy(field, &v, size);
    } else if (size == sizeof(uint16_t)) {
        uint16_t v = (uint16_t)bits;
        memcpy(field, &v, size);
    } else if (size == sizeof(uint8_t)) {
        uint8_t v = (uint8_t)bits;
        memcpy(field, &v, size);
    }
}

static int store_choice(const vf_py_setting *e, const char *name, char *field)
{
    const vf_py_choice *c = vf_py_choice_find(e->choices, name);
    if (!c) {
        if (e->error)
            PyErr_Format(PyExc_ValueError, e->error, name);
        else
            PyErr_Format(PyExc_ValueError, "%s: unknown value '%s'", e->name, name);
        return -1;
    }
    store_bits(field, e->size, (unsigned long long)(long long)c->value);
    return 0;
}

/* A dict's items as an array of entries, stored with their count (pointer, size_t). */
static int store_entries(const vf_py_setting *e, PyObject *dict, char *field)
{
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, e->error);
        return -1;
    }
    Py_ssize_t n = PyDict_Size(dict), pos = 0;
    char *entries = PyMem_Calloc((size_t)(n ? n : 1), e->entry_size);
    if (!entries) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(field, &entries, sizeof entries);
    size_t count = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value) && (Py_ssize_t)count < n) {
        if (e->entry(entries + count * e->entry_size, key, value) < 0)
            return -1;
        count++;
        memcpy(field + sizeof entries, &count, sizeof count);
    }
    return 0;
}

static int store(const vf_py_setting *e, PyObject *arg, const converted *v, void *options)
{
    char *field = (char *)options + e->offset;
    switch (e->kind) {
    case VF_PY_SSIZE:
    case VF_PY_INT:
    case VF_PY_LLONG:
    case VF_PY_BOOL:
        store_bits(field, e->size, (unsigned long long)v->i);
        return 0;
    case VF_PY_ULLONG:
        store_bits(field, e->size, v->u);
        return 0;
    case VF_PY_DOUBLE:
        if (e->size == sizeof v->d)
            memcpy(field, &v->d, sizeof v->d);
        return 0;
    case VF_PY_STR:
    case VF_PY_STR_OR_NONE:
        if (e->choices && v->s)
            return store_choice(e, v->s, field);
        if (e->size == sizeof v->s)
            memcpy(field, &v->s, sizeof v->s);
        return 0;
    case VF_PY_OBJECT: {
        if (arg == Py_None)
            return 0;
        if (e->parse)
            return e->parse(arg, options);
        int chosen = 0;
        if (e->choices) {
            if (vf_py_choose(arg, e->name, e->choices, &chosen) < 0)
                return -1;
            store_bits(field, e->size, (unsigned long long)(long long)chosen);
        } else if (e->size == sizeof arg) {
            memcpy(field, &arg, sizeof arg);
        }
        return 0;
    }
    case VF_PY_PATH:
        return 0; /* stored by convert() */
    case VF_PY_ENTRIES:
        return arg == Py_None ? 0 : store_entries(e, arg, field);
    case VF_PY_WIDTH_HEIGHT: {
        if (arg == Py_None)
            return 0;
        char format[128];
        snprintf(format, sizeof format, "ii;%s must be (width, height)", e->name);
        int wh[2] = {0, 0};
        if (!PyArg_ParseTuple(arg, format, &wh[0], &wh[1]))
            return -1;
        if (e->size == sizeof wh[0])
            memcpy(field, wh, sizeof wh);
        return 0;
    }
    }
    return 0;
}

int vf_py_parse_settings(const vf_py_settings *spec, PyObject *args, PyObject *kwargs, void *options)
{
    PyObject *given[VF_PY_SETTINGS_MAX];
    converted values[VF_PY_SETTINGS_MAX];
    if (spec->count > VF_PY_SETTINGS_MAX) {
        PyErr_Format(PyExc_SystemError, "%s: more than %d settings", spec->fname ? spec->fname : "settings",
                     VF_PY_SETTINGS_MAX);
        return -1;
    }
    if (gather(spec, args, kwargs, given, values, options) < 0)
        return -1;
    /* The minimums first, as one check with one message for all. */
    for (int i = 0; i < spec->count; i++)
        if (given[i] && spec->list[i].has_min && values[i].i < spec->list[i].min) {
            PyErr_SetString(PyExc_ValueError, spec->range_error);
            return -1;
        }
    /* Then each value is checked and stored: names among choices first, then the rest, each in keyword order
     * (the order the hand-written checks had). */
    for (int names = 1; names >= 0; names--)
        for (int i = 0; i < spec->count; i++) {
            const vf_py_setting *e = &spec->list[i];
            if (given[i] && !e->choices == !names && store(e, given[i], &values[i], options) < 0)
                return -1;
        }
    return 0;
}
