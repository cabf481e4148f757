/*
 * engine.h: the engine layer's internals (the public side is
 * include/vlafeed/loader.h): the refcounted core that batches keep alive,
 * the batch buffer pool, and the parallel helper that spreads one batch's
 * file groups over the engine threads.
 *
 * Depends on: base, video, sample, plan.
 *
 * Invariants:
 *  - A batch buffer is allocated once (one block holding every column, each
 *    column 64-byte aligned) and reused: vf_batch_release of the last
 *    reference puts it back on the core's free list (or frees it past the
 *    free-list bound). Column memory is never touched by the engine while a
 *    caller holds a reference.
 *  - The core (sample spec + pool) lives until the loader is closed AND the
 *    last batch is released, so batches (and their task strings, which
 *    point into the dataset) stay valid after vf_loader_close as long as the
 *    dataset is open.
 */
#ifndef VF_ENGINE_H
#define VF_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/base.h"
#include "plan/plan.h"
#include "sample/sample.h"
#include "vlafeed/loader.h"

typedef struct vf_engine_core {
    pthread_mutex_t lock;
    int refs;                  /* 1 for the loader + 1 per batch out of the pool */
    vf_sample_spec *spec;      /* owned */
    size_t batch_capacity;     /* samples per pooled buffer */
    vf_batch *free_list;
    size_t num_free, max_free;
    size_t allocated;          /* buffers alive (free or in use) */
} vf_engine_core;

struct vf_batch {
    vf_engine_core *core;
    atomic_int refs;
    size_t capacity, size;
    size_t num_columns;
    vf_column *columns;
    void **data;               /* per column: numeric base (NULL for strings) */
    const char ***strings;     /* per column: string array (NULL for numeric) */
    int64_t *positions;
    void *memory;
    vf_batch *next_free;
};

/* Creates a core owning spec (freed with the core). The caller holds the
 * first reference. */
int vf_engine_core_create(vf_engine_core **out, vf_sample_spec *spec, size_t batch_capacity, size_t max_free);
/* Drops a reference; the last one frees the pool, the spec and the core. */
void vf_engine_core_unref(vf_engine_core *core);

/* A batch buffer for n samples (a pooled one when n <= batch_capacity),
 * with one reference for the caller and one core reference. */
int vf_engine_batch_acquire(vf_engine_core *core, size_t n, vf_batch **out);

/* Makes a batch hold its first n samples (n <= its size). */
void vf_engine_batch_shrink(vf_batch *b, size_t n);

/* The destinations of a batch for vf_sample_assemble. */
void vf_engine_batch_dest(vf_batch *b, vf_sample_dest *dest);

/* ---- parallel helper --------------------------------------------------------- */

/* vf_sample_parallel over a thread pool: the caller works too and returns
 * once every item is done; helpers that start late find nothing to do. */
void vf_engine_parallel_run(void *thread_pool, size_t n, void (*fn)(void *arg, size_t i), void *arg);

#endif
