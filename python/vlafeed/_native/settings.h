/*
 * settings.h: keyword arguments -> an options struct, driven by a table.
 *
 * A binding function that takes settings (Loader, WdsLoader, loader_state,
 * plan_report) describes them once, as a table of vf_py_setting rows in
 * keyword order, and parses them with vf_py_parse_settings(): one loop
 * reads every argument the way PyArg_ParseTupleAndKeywords reads its format
 * letter (same conversions, same TypeError / OverflowError texts, argument
 * numbers and function name included), checks the minimums, then checks
 * each value and stores it at its offset in the options struct (names
 * among choices first, then the rest, each in keyword order). A setting
 * that is not given keeps what the struct held (the engine's defaults).
 * Adding a setting is one row.
 */
#ifndef VF_PY_SETTINGS_H
#define VF_PY_SETTINGS_H

#include "_native.h"

/* A name a string setting may take, and the value stored for it; a list
 * of them ends with {NULL, 0}. */
typedef struct vf_py_choice {
    const char *name;
    int value;
} vf_py_choice;

/* How a value is read (the PyArg_ParseTupleAndKeywords letter) and stored. */
typedef enum vf_py_kind {
    VF_PY_SSIZE,        /* 'n': an index-able integer, stored as a size_t (give it a VF_PY_MIN) */
    VF_PY_INT,          /* 'i': a C int */
    VF_PY_LLONG,        /* 'L': a long long */
    VF_PY_ULLONG,       /* 'K': an int, masked to unsigned long long (no overflow check) */
    VF_PY_BOOL,         /* 'p': any object's truth, stored as 0 / 1 */
    VF_PY_DOUBLE,       /* 'd': a float */
    VF_PY_STR,          /* 's': a str without NUL, stored as const char * (or, with choices, as its value) */
    VF_PY_STR_OR_NONE,  /* 'z': as 's', None stored as NULL */
    VF_PY_OBJECT,       /* 'O' ('O!' with .type): None counts as not given; stored as a borrowed
                         * PyObject *, or the value of its name among .choices, or by .parse */
    VF_PY_WIDTH_HEIGHT, /* a (width, height) tuple of ints, stored in two adjacent ints */
    VF_PY_PATH,         /* 'O&' with PyUnicode_FSConverter: str, bytes or os.PathLike, stored at once as
                         * a new reference to bytes in a PyObject * field (the caller releases it) */
    VF_PY_ENTRIES,      /* a dict (None: not given), one array entry per item made by .entry; stored as
                         * a PyMem array in a pointer field followed by its size_t count (the caller
                         * frees the array, also after an error) */
} vf_py_kind;

typedef struct vf_py_setting {
    const char *name;            /* the keyword */
    vf_py_kind kind;
    size_t offset, size;         /* the field: VF_PY_FIELD(options type, member) */
    int has_min;                 /* VF_PY_MIN(n) (SSIZE, INT, LLONG): a value under n raises the
                                  * table's range_error */
    long long min;
    const vf_py_choice *choices; /* STR or OBJECT: the value names one of these */
    const char *error;           /* with choices: ValueError format for a name not among them ("%s": the
                                  * name; NULL: "<keyword>: unknown value '<name>'"); ENTRIES: TypeError
                                  * text for a value that is not a dict */
    PyTypeObject *type;          /* OBJECT: the value must be an instance ('O!') */
    /* OBJECT: converts the value (never None) into the options struct;
     * 0, or -1 with an exception set. */
    int (*parse)(PyObject *value, void *options);
    /* ENTRIES: fills the zeroed entry (entry_size bytes) from one item; 0, or -1. */
    int (*entry)(void *entry, PyObject *key, PyObject *value);
    size_t entry_size;
} vf_py_setting;

#define VF_PY_FIELD(type, member) .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define VF_PY_MIN(n) .has_min = 1, .min = (n)

typedef struct vf_py_settings {
    const char *fname;           /* as after ':' in a getargs format ("Loader"); NULL: none */
    const vf_py_setting *list;   /* in keyword order: argument numbers in messages follow it */
    int count;
    int required;                /* the first `required` settings must be given */
    int positional;              /* the first `positional` may come by position, the rest by keyword */
    const char *range_error;     /* the ValueError for a value under its VF_PY_MIN */
} vf_py_settings;

#define VF_PY_SETTINGS_MAX 48 /* settings one table may hold */

/* Parses args / kwargs by the table into options (which holds the defaults).
 * 0, or -1 with an exception set (options may then be partly filled: free
 * what its parsers attached). */
int vf_py_parse_settings(const vf_py_settings *spec, PyObject *args, PyObject *kwargs, void *options);

/* The value of obj's name among choices: None leaves *out as it is; a
 * non-str raises TypeError "<what> must be a string", another name
 * ValueError "<what>: unknown value '<name>'". 0, or -1. */
int vf_py_choose(PyObject *obj, const char *what, const vf_py_choice *choices, int *out);

/* The choice named name, or NULL. */
const vf_py_choice *vf_py_choice_find(const vf_py_choice *choices, const char *name);

/* The name of value among choices, or NULL. */
const char *vf_py_choice_name(const vf_py_choice *choices, int value);

#endif
