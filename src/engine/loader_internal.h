/*
 * loader_internal.h: what the three files of the loader (the public
 * include/vlafeed/loader.h) share; nothing above the engine layer sees it.
 *
 *  - loader.c: the loader's life on the caller's side: settings and sizes,
 *    open and close, epochs and resume, delivery of batches in sequence
 *    order, statistics;
 *  - loader_produce.c: production on the engine threads: batch jobs (with
 *    the on_error = SKIP fallback), the submit window, the pool's episode
 *    segments (admit/evict hooks, prefetch-on-admit) and epoch planning;
 *  - loader_plan.c: what settings imply for a dataset without a running
 *    loader: the order-defining state (hashes, checks, elastic resume) and
 *    the public task lists and MP4 open counts.
 *
 * Invariants: the loader is driven by one caller thread at a time. Engine
 * threads only read the settings, dataset, spec and plan (an epoch is
 * re-planned only after drain, with no job out), use the thread-safe video
 * cache and the atomic counters, and write their own job and, under
 * stats_lock, the latency histogram.
 */
#ifndef VF_ENGINE_LOADER_INTERNAL_H
#define VF_ENGINE_LOADER_INTERNAL_H

#include <sys/types.h>

#include "engine/engine.h"

/* One batch to produce: submitted by the caller's thread, filled by an
 * engine thread, passed back through the done queue. */
typedef struct vf_engine_job {
    struct vf_loader *loader;
    size_t seq;
    vf_batch *batch;
    int rc;
    char *message;
    double done_at;            /* when the batch was ready (first-batch latency) */
    vf_loader_skip *skips;     /* on_error = SKIP: the samples left out of this batch (strings owned) */
    size_t num_skips;
} vf_engine_job;

#define VF_ENGINE_MAX_SKIP_RECORDS 65536

typedef struct vf_engine_devices vf_engine_devices;

/* Where an epoch continues after a restore (vf_engine_resolve_state). The
 * state a loader reports carries `base` and `generations`, never the
 * derived `ranges` (unless they are the base: a version 2 state). */
typedef struct vf_engine_resume {
    int64_t *ranges;           /* the remainder this run serves, replayed (NULL: the whole epoch) */
    size_t num_ranges;
    int64_t *base;             /* the state's own ranges, which the generations replay from */
    size_t num_base;
    vf_loader_generation *generations;
    size_t num_generations;
    int64_t batches;           /* rank-level batches already delivered within `ranges` */
} vf_engine_resume;

struct vf_loader {
    vf_dataset *dataset;
    pid_t pid;                 /* the process that opened it */
    vf_loader_settings settings;
    vf_engine_core *core;
    vf_sample_spec *spec;      /* owned by core */
    vf_video_cache *cache;
    vf_engine_devices *devices; /* decode device per camera, the shared CUDA device (loader_devices.c) */
    vf_ds_opener opener;       /* the cache's open hook: local files, or URLs through the dataset's fs */
    vf_file_cache *file_cache; /* prefetch-on-admit downloads (pool mode over URLs), or NULL */
    vf_pool_hooks user_hooks;  /* the caller's hooks, run after/before the prefetch ones */
    vf_thread_pool *threads;
    int nthreads;
    int *cpus;                 /* the CPU set the engine threads are pinned to (copy), or NULL */
    size_t num_cpus;
    int decode_threads;        /* settings' decode_threads, 0 resolved */
    vf_sample_counters counters;
    vf_plan_task *tasks;       /* stream mode: partitions; pool mode: one per episode */
    size_t num_tasks;
    uint64_t selection;        /* hash of the selected episodes (resume states) */
    size_t cache_capacity;
    char **warnings;           /* logged once each */
    unsigned char *warning_global; /* per warning: 1 = the same text on every rank */
    size_t num_warnings;
    size_t notes_taken;        /* the spec's notes already made warnings */
    vf_loader_skip *skips;     /* on_error = SKIP: samples left out of delivered batches (the first
                                  VF_ENGINE_MAX_SKIP_RECORDS) */
    size_t num_skips;
    uint64_t skipped;          /* all of them, records kept or not */

    /* the current epoch */
    int64_t epoch;
    vf_engine_resume resumed;  /* elastic resume: what of the epoch's global order remains (ranges NULL: all) */
    uint8_t *wanted;           /* [selected episodes]: those this epoch's plan emits (table read-ahead) */
    vf_plan_epoch plan;
    int64_t resume_base;       /* rank-level batches skipped by a consumer plan's resume (else 0) */
    size_t start_batch;        /* where delivery of this epoch (re)started */
    int started;
    size_t window;
    size_t next_submit, next_deliver;
    vf_engine_job **stash;     /* [window], by seq % window */
    vf_queue *done;
    atomic_int cancel;
    vf_io_cancel io_cancel;    /* vf_loader_cancel: watched by the engine threads' remote requests */
    size_t in_flight;          /* submitted, not yet taken from the queue */

    /* pool segments of the current epoch (plan.segments) */
    uint8_t *seg_state;        /* 0 pending, 1 admitted, 2 evicted / skipped */
    size_t *evict_order;       /* segment indices by evict_batch */
    size_t admit_next, evict_next;
    size_t live_segments;
    uint64_t admitted, evicted;

    /* metrics */
    pthread_mutex_t stats_lock;
    vf_histogram latency;
    double started_at;
    double first_batch_seconds;
    int have_first;
    double wait_seconds;
    double first_handout_at, last_handout_at; /* vf_now_seconds of the first / latest batch handed out */
    double wait_after_first;   /* wait_seconds after the first batch was handed out */
    uint64_t samples, batches;
};

/* ---- loader_devices.c ------------------------------------------------------ */

/* Resolves each camera's decode device (settings and environment; an
 * unknown camera in decode_device_cameras is refused) and opens the shared
 * CUDA device when one asks for NVDEC (a camera requiring it without a
 * device fails here). Keeps no pointer into s. */
int vf_engine_devices_open(vf_engine_devices **out, const vf_dataset *d, const vf_loader_settings *s);
void vf_engine_devices_close(vf_engine_devices *v);
/* Sets the cache's device hooks and shared device (v outlives the cache). */
void vf_engine_devices_configure(vf_engine_devices *v, vf_video_cache_settings *cs);

/* ---- loader.c ------------------------------------------------------------ */

/* Checks settings (already copied from the caller's) and fills RANK /
 * WORLD_SIZE from the environment where they are -1. */
int vf_engine_check_settings(vf_loader_settings *s);
/* decode_threads = 0 resolved for a rank's cores (see loader.c). */
int vf_engine_decode_threads(size_t pinned_cpus, int engine_threads);
/* The decoder cache bound for settings s (see loader.c). */
size_t vf_engine_cache_entries(const vf_loader_settings *s, size_t cameras, size_t files, int threads);

/* ---- loader_produce.c ---------------------------------------------------- */

/* Frees the strings of a skip record. */
void vf_engine_free_skip(vf_loader_skip *k);
/* Frees a job and whatever it still holds (NULL: nothing). */
void vf_engine_free_job(vf_engine_job *j);
/* Pool hooks that prefetch an admitted episode's remote files into the
 * file cache around the caller's own hooks; ctx is the loader. */
void vf_engine_prefetch_admit(void *ctx, const vf_pool_event *event);
void vf_engine_prefetch_evict(void *ctx, const vf_pool_event *event);
/* Evicts the admitted segments whose last batch is at most `batch`. */
void vf_engine_evict_until(vf_loader *l, size_t batch);
/* Evicts everything still admitted (the epoch is abandoned or over). */
void vf_engine_evict_all(vf_loader *l);
/* Submits jobs up to the window ahead of the next delivery. */
int vf_engine_submit_more(vf_loader *l);
/* Waits for every submitted job and drops what they produced. */
void vf_engine_drain(vf_loader *l);
/* Plans the current epoch from rank-level batch resume_batch and resets
 * delivery there. */
int vf_engine_plan_epoch(vf_loader *l, int64_t resume_batch);
/* Starts production of the planned epoch. */
int vf_engine_start(vf_loader *l);

/* Makes the spec's new notes (features left out, frames not as info.json
 * says, ...) warnings of the loader. Called on the caller's thread. */
void vf_engine_take_notes(vf_loader *l);

/* ---- loader_plan.c -------------------------------------------------------- */

/* A hash of the selected episodes (indices and lengths). */
uint64_t vf_engine_selection_hash(const vf_dataset *d);
/* The settings_hash of a state's order-defining fields. */
uint64_t vf_engine_state_hash(const vf_loader_state *st);
/* The order-defining fields of a state for checked settings (epoch and
 * samples_consumed 0). */
void vf_engine_state_from_settings(const vf_loader_settings *s, const vf_dataset *d, int64_t positions,
                                   uint64_t selection, vf_loader_state *st);
/* The partition's tasks for a mode (NULL for map mode). */
int vf_engine_make_tasks(const vf_dataset *d, vf_mode mode, vf_partition partition, size_t consumers,
                         vf_plan_task **tasks, size_t *num_tasks);
/* Where a state continues for a loader with settings s (see loader_plan.c). */
int vf_engine_resolve_state(const vf_loader_settings *s, const vf_dataset *d, int64_t positions, uint64_t selection,
                            const vf_plan_task *tasks, size_t num_tasks, const vf_loader_state *st,
                            vf_engine_resume *out);
/* Frees a resume's arrays and zeroes it. */
void vf_engine_resume_free(vf_engine_resume *r);
/* Points a state's ranges and generations at a resume's (borrowed). */
void vf_engine_resume_to_state(const vf_engine_resume *r, vf_loader_state *st);

#endif
