/*
 * py_loader.h: what the files of the loader area share.
 *
 *   py_loader_settings.c  the settings of Loader(), loader_state() /
 *                         resolve_state() and plan_report(): their tables
 *                         and the parsers of the structured ones
 *   py_loader.c           the Loader type
 *   py_batch.c            the Batch and Column types
 *   py_plan.c             module functions over plans and states
 *   py_state.c            loader states <-> dicts (Loader and ShardLoader forms)
 */
#ifndef VF_PY_LOADER_H
#define VF_PY_LOADER_H

#include "settings.h"

#include "vlafeed/dataset.h"
#include "vlafeed/loader.h"

/* Mode and partition names (state dicts and settings). */
extern const vf_py_choice vf_py_modes[], vf_py_partitions[];

/* What one call's loader settings parse into: the engine's settings, the
 * call's other arguments, and the memory the settings point into until the
 * call is done (vf_py_loader_args_free). */
typedef struct vf_py_loader_args {
    vf_loader_settings s;
    PyObject *dataset;            /* the Dataset (borrowed) */
    vf_loader_state resume;       /* s.resume points here once a state is given */
    long long epoch, batches;     /* loader_state(), plan_report(): the position asked about */
    int tasks, rank, worker;      /* plan_report() */
    int video_files;
    /* s.sample's arrays (delta_timestamps, keys, renames, normalize) are PyMem-allocated, and: */
    double *seconds;              /* what s.sample.delta_timestamps point into */
    PyObject *keys_hold;          /* the sequence the keys' strings belong to */
    PyObject *cache_dir;          /* bytes behind s.prefetch_cache_dir */
} vf_py_loader_args;

/* The settings of Loader(), loader_state() / resolve_state() and plan_report(). */
extern const vf_py_settings vf_py_loader_settings, vf_py_loader_state_settings, vf_py_plan_report_settings;

/* Zeroes a and fills in the engine's default settings. */
void vf_py_loader_args_init(vf_py_loader_args *a);

/* Parses the call's arguments into a (initialised, with any defaults of
 * the call's own set) and returns the open dataset, or NULL with an
 * exception set. vf_py_loader_args_free(a) either way. */
vf_dataset *vf_py_loader_args_parse(const vf_py_settings *spec, PyObject *args, PyObject *kwargs,
                                    vf_py_loader_args *a);
void vf_py_loader_args_free(vf_py_loader_args *a);

/* A Batch over b (released with it) that keeps the loader alive. */
PyObject *vf_py_make_batch(PyObject *loader, vf_batch *b);

#endif
