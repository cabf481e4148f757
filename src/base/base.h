/*
 * base.h: the bottom layer of vlafeed, included by every other layer.
 *
 * Owns: status codes and the thread-local error message, checked allocation,
 * growable byte buffers, logging, small string/path helpers, and whole-file
 * reads. Depends on nothing but libc and pthreads.
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
 * or 0..3); default warn. Messages go to stderr prefixed "vlafeed: ". */
int vf_log_level(void);
void vf_log(int level, const char *fmt, ...) VF_PRINTF(2, 3);

/* ---- files and paths ------------------------------------------------- */

/* Reads a whole local file into a newly allocated buffer (NUL-terminated
 * one past len). Errors name the path. */
int vf_read_file(const char *path, uint8_t **data, size_t *len);
/* 1 if a regular file exists at path, 0 otherwise. */
int vf_file_exists(const char *path);
int vf_dir_exists(const char *path);
/* "a" + "/" + "b" (no double slash). Newly allocated; NULL on ENOMEM. */
char *vf_path_join(const char *a, const char *b);
/* mkdir -p. */
int vf_mkdirs(const char *path);

/* ---- time ------------------------------------------------------------ */
double vf_now_seconds(void); /* monotonic */

#endif
