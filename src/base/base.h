/*
 * base.h: the bottom layer of vlafeed, included by every other layer.
 *
 * Owns: status codes and the thread-local error message, checked allocation,
 * growable arrays and byte buffers, logging, small string/path helpers, and
 * whole-file reads. Depends on nothing but libc and pthreads.
 *
 * Invariants:
 *  - A function that can fail returns int: 0 on success or a negative
 *    errno-style code (VF_E*). On failure it has set the thread-local
 *    message through vf_error(), so callers can add context with
 *    vf_error_context() and surface it with vf_last_error().
 *  - No global mutable state besides the thread-local message and the log
 *    level (read once from VF_LOG).
 */
#ifndef VF_BASE_H
#define VF_BASE_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vlafeed/vlafeed.h"

#ifdef __GNUC__
#define VF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define VF_UNUSED __attribute__((unused))
#define VF_LIKELY(x) __builtin_expect(!!(x), 1)
#define VF_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define VF_PRINTF(a, b)
#define VF_UNUSED
#define VF_LIKELY(x) (x)
#define VF_UNLIKELY(x) (x)
#endif

#define VF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define VF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define VF_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors ---------------------------------------------------------- */

/* Sets the thread-local message (printf-style) and returns code, so a
 * failing path reads `return vf_error(VF_ECORRUPT, "%s: bad magic", path);`.
 * code must be negative. */
int vf_error(int code, const char *fmt, ...) VF_PRINTF(2, 3);

/* Prepends context to the current message: "<context>: <old message>".
 * Returns code unchanged, for `return vf_error_context(r, "%s", path);`. */
int vf_error_context(int code, const char *fmt, ...) VF_PRINTF(2, 3);

/* A short name for a status code ("corrupt input", "not found", ...). */
const char *vf_status_name(int code);

/* ---- allocation ------------------------------------------------------ */

/* Each sets VF_ENOMEM's message on failure and returns NULL. Sizes are
 * checked for overflow (vf_malloc_array). Free with free(). */
void *vf_malloc(size_t size);
void *vf_calloc(size_t count, size_t size);
void *vf_realloc(void *ptr, size_t size);
void *vf_malloc_array(size_t count, size_t size);
/* Makes room for element `count` of a growable array: once count reaches
 * *cap, the array is reallocated to twice *cap elements (first_cap when
 * *cap is 0). `array` is the address of the caller's element pointer (a
 * T **, passed as void *) and elem_size is sizeof(T). Returns 0, or
 * VF_ENOMEM with the array and *cap unchanged. */
int vf_grow_array(void *array, size_t count, size_t *cap, size_t first_cap, size_t elem_size);
char *vf_strdup(const char *s);
char *vf_strndup(const char *s, size_t n);
/* vf_asprintf: a newly allocated formatted string, or NULL (ENOMEM set). */
char *vf_asprintf(const char *fmt, ...) VF_PRINTF(1, 2);

/* ---- growable buffer ------------------------------------------------- */

/* A byte buffer that owns its memory. Zero-initialise ({0}) to start. */
typedef struct vf_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
} vf_buf;

int vf_buf_reserve(vf_buf *b, size_t extra);   /* room for len+extra */
int vf_buf_append(vf_buf *b, const void *data, size_t n);
int vf_buf_append_u8(vf_buf *b, uint8_t v);
int vf_buf_printf(vf_buf *b, const char *fmt, ...) VF_PRINTF(2, 3);
void vf_buf_free(vf_buf *b);
/* Hands the memory to the caller (NUL-terminated as a convenience) and
 * resets b. Returns NULL on ENOMEM. */
char *vf_buf_take_string(vf_buf *b);

/* ---- logging --------------------------------------------------------- */

enum { VF_LOG_ERROR = 0, VF_LOG_WARN = 1, VF_LOG_INFO = 2, VF_LOG_DEBUG = 3 };
/* Level comes from the VF_LOG environment variable (error|warn|info|debug
 * or 0..3); default warn. Messages go to stderr prefixed "vlafeed: ". A
 * warning is printed once per process: the same text again is dropped. */
int vf_log_level(void);
void vf_log_set_level(int level);
void vf_log(int level, const char *fmt, ...) VF_PRINTF(2, 3);

/* ---- files and paths ------------------------------------------------- */

/* Reads a whole local file into a newly allocated buffer (NUL-terminated
 * one past len). Errors name the path. */
int vf_read_file(const char *path, uint8_t **data, size_t *len);
/* 1 if a regular file exists at path, 0 otherwise. */
/* "a directory", "a FIFO", ... for a stat() st_mode, for error messages. */
const char *vf_file_kind_name(unsigned mode);
/* Opens path read-only for a regular file only: a FIFO, a device or a
 * directory is refused at once (the open never blocks), the message naming
 * the path and the kind of file. *fd is the caller's to close; size may be
 * NULL. */
int vf_open_regular_file(const char *path, int *fd, uint64_t *size);
int vf_file_exists(const char *path);
int vf_dir_exists(const char *path);
/* "a" + "/" + "b" (no double slash). Newly allocated; NULL on ENOMEM. */
char *vf_path_join(const char *a, const char *b);
/* mkdir -p. */
int vf_mkdirs(const char *path);

/* ---- time ------------------------------------------------------------ */
double vf_now_seconds(void); /* monotonic */

/* ---- counter-based random numbers (rng.c) ---------------------------- */

/* A generator is a 64-bit key plus a counter: the n-th output is a pure
 * function of (key, n), so streams can be derived, skipped and replayed
 * without shared state. Keys are derived from (seed, purpose, ids...) with
 * vf_rng_derive, so e.g. the order of (seed, epoch, rank, worker) never
 * depends on thread timing. */
typedef struct vf_rng {
    uint64_t key;
    uint64_t counter;
} vf_rng;

uint64_t vf_mix64(uint64_t x); /* SplitMix64 finaliser: a bijective hash */
/* A key from a seed and up to 4 stream ids (purpose tag first). */
uint64_t vf_rng_derive(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d);
void vf_rng_init(vf_rng *r, uint64_t key);
uint64_t vf_rng_next(vf_rng *r);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t vf_rng_below(vf_rng *r, uint64_t n);
double vf_rng_uniform(vf_rng *r); /* [0, 1) with 53 random bits */
/* Fisher-Yates shuffle of n int64 values in place. */
void vf_rng_shuffle_i64(vf_rng *r, int64_t *values, int64_t n);

/* ---- threads (threads.c) ---------------------------------------------- */

/* A bounded multi-producer multi-consumer queue of pointers. push blocks
 * while full (backpressure), pop blocks while empty; after close, push
 * fails with VF_EOF and pop drains what is left then returns VF_EOF. */
typedef struct vf_queue vf_queue;
int vf_queue_create(vf_queue **out, size_t capacity);
int vf_queue_push(vf_queue *q, void *item);
int vf_queue_pop(vf_queue *q, void **item);
/* Non-blocking pop: VF_EAGAIN when empty (VF_EOF when closed and empty). */
int vf_queue_try_pop(vf_queue *q, void **item);
void vf_queue_close(vf_queue *q);
size_t vf_queue_size(vf_queue *q);
void vf_queue_destroy(vf_queue *q); /* items left inside are not freed */

/* A fixed pool of worker threads running submitted jobs in FIFO order. */
typedef struct vf_thread_pool vf_thread_pool;
typedef void (*vf_job_fn)(void *arg);
/* threads <= 0 means the number of online cores. */
int vf_thread_pool_create(vf_thread_pool **out, int threads);
/* The same, every thread pinned to the num_cpus CPUs of cpus (NULL / 0:
 * not pinned, as vf_thread_pool_create) from its start; threads <= 0 then
 * means one per CPU of the list. A CPU outside this process's affinity
 * (sched_getaffinity: absent, offline or not allowed) is refused
 * (VF_EINVAL naming it). The list is not kept. */
int vf_thread_pool_create_pinned(vf_thread_pool **out, int threads, const int *cpus, size_t num_cpus);
/* 0 when every CPU of the list is one this process may run on, else
 * VF_EINVAL naming the first that is not. */
int vf_cpu_list_check(const int *cpus, size_t num_cpus);
/* CPUs this process may run on (sched_getaffinity; vf_cpu_count if unknown). */
int vf_cpu_allowed_count(void);
int vf_thread_pool_submit(vf_thread_pool *p, vf_job_fn fn, void *arg);
/* Blocks until every submitted job has finished. */
void vf_thread_pool_wait(vf_thread_pool *p);
int vf_thread_pool_threads(const vf_thread_pool *p);
/* Finishes queued jobs, joins the threads and frees the pool. */
void vf_thread_pool_destroy(vf_thread_pool *p);
int vf_cpu_count(void);

/* ---- latency histogram (histogram.c) ---------------------------------- */

/* Log-bucketed histogram of durations in seconds (1 us .. ~1 h, 8 buckets
 * per doubling, so a percentile is within ~9%). Not thread-safe: keep one per
 * thread and merge. */
#define VF_HIST_BUCKETS 256
typedef struct vf_histogram {
    uint64_t count;
    double sum, min, max;
    uint64_t buckets[VF_HIST_BUCKETS];
} vf_histogram;
void vf_histogram_init(vf_histogram *h);
void vf_histogram_add(vf_histogram *h, double seconds);
void vf_histogram_merge(vf_histogram *into, const vf_histogram *from);
/* q in [0, 1]; 0 when empty. */
double vf_histogram_quantile(const vf_histogram *h, double q);

#endif
