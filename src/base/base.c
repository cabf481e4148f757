/*
 * base.c: error messages, checked allocation and array growth, buffers,
 * logging, files.
 *
 * The only mutable state here is the thread-local error message and the
 * lazily read log level (benign race: every thread computes the same value).
 */
#define _GNU_SOURCE
#include "base/base.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
#include <time.h>

#define VF_ERROR_MAX 1024

static _Thread_local char error_message[VF_ERROR_MAX];
static _Thread_local int error_code;

const char *vf_last_error(void) { return error_message; }
int vf_last_error_code(void) { return error_code; }

const char *vf_version(void) { return VF_VERSION_STRING; }

int vf_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    error_code = code;
    return code;
}

int vf_error_context(int code, const char *fmt, ...)
{
    char prefix[VF_ERROR_MAX];
    char old[VF_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_message, sizeof old);
    const char *tail = old[0] ? old : vf_status_name(code);
    /* Assemble by hand: prefix + ": " + tail, truncated to fit. */
    size_t n = strnlen(prefix, sizeof error_message - 1);
    memcpy(error_message, prefix, n);
    if (n + 2 < sizeof error_message) {
        memcpy(error_message + n, ": ", 2);
        n += 2;
    }
    size_t room = sizeof error_message - 1 - n;
    size_t tail_len = strnlen(tail, room);
    memcpy(error_message + n, tail, tail_len);
    error_message[n + tail_len] = 0;
    error_code = code;
    return code;
}

const char *vf_status_name(int code)
{
    switch (code) {
    case VF_OK: return "ok";
    case VF_EINVAL: return "invalid argument";
    case VF_ENOMEM: return "out of memory";
    case VF_EIO: return "I/O error";
    case VF_ENOENT: return "not found";
    case VF_ECORRUPT: return "corrupt input";
    case VF_EUNSUPPORTED: return "unsupported";
    case VF_ERANGE: return "out of range";
    case VF_EAGAIN: return "try again";
    case VF_EOF: return "end of data";
    default: return "error";
    }
}

/* ---- allocation ---- */

void *vf_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        vf_error(VF_ENOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

void *vf_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        vf_error(VF_ENOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *vf_realloc(void *ptr, size_t size)
{
    void *p = realloc(ptr, size ? size : 1);
    if (!p)
        vf_error(VF_ENOMEM, "out of memory reallocating %zu bytes", size);
    return p;
}

int vf_grow_array(void *array, size_t count, size_t *cap, size_t first_cap, size_t elem_size)
{
    if (count < *cap)
        return 0;
    size_t new_cap = *cap ? *cap * 2 : first_cap;
    if (new_cap < *cap || (elem_size && new_cap > SIZE_MAX / elem_size))
        return vf_error(VF_ENOMEM, "array of %zu x %zu bytes overflows", new_cap, elem_size);
    /* The caller's pointer is read and written through memcpy: it is some
     * T *, and only its representation is shared with void *. */
    void *items;
    memcpy(&items, array, sizeof items);
    void *grown = vf_realloc(items, new_cap * elem_size);
    if (!grown)
        return VF_ENOMEM;
    memcpy(array, &grown, sizeof grown);
    *cap = new_cap;
    return 0;
}

void *vf_malloc_array(size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size) {
        vf_error(VF_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    return vf_malloc(count * size);
}

char *vf_strdup(const char *s) { return vf_strndup(s, strlen(s)); }

char *vf_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *p = vf_malloc(len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = 0;
    }
    return p;
}

char *vf_asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = vf_malloc((size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

/* ---- buffer ---- */

int vf_buf_reserve(vf_buf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return vf_error(VF_ENOMEM, "buffer size overflow");
    size_t need = b->len + extra + 1; /* +1 keeps room for a terminator */
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = vf_realloc(b->data, cap);
    if (!p)
        return VF_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int vf_buf_append(vf_buf *b, const void *data, size_t n)
{
    int r = vf_buf_reserve(b, n);
    if (r < 0)
        return r;
    if (n)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    return 0;
}

int vf_buf_append_u8(vf_buf *b, uint8_t v) { return vf_buf_append(b, &v, 1); }

int vf_buf_printf(vf_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return vf_error(VF_EINVAL, "bad format string");
    int r = vf_buf_reserve(b, (size_t)n);
    if (r < 0)
        return r;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void vf_buf_free(vf_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *vf_buf_take_string(vf_buf *b)
{
    if (vf_buf_reserve(b, 0) < 0)
        return NULL;
    b->data[b->len] = 0;
    char *s = (char *)b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return s;
}

/* ---- logging ---- */

static int log_level_cached = -1;

int vf_log_level(void)
{
    if (log_level_cached >= 0)
        return log_level_cached;
    int level = VF_LOG_WARN;
    const char *env = getenv("VF_LOG");
    if (env && *env) {
        if (!strcmp(env, "error")) level = VF_LOG_ERROR;
        else if (!strcmp(env, "warn")) level = VF_LOG_WARN;
        else if (!strcmp(env, "info")) level = VF_LOG_INFO;
        else if (!strcmp(env, "debug")) level = VF_LOG_DEBUG;
        else if (env[0] >= '0' && env[0] <= '3') level = env[0] - '0';
    }
    log_level_cached = level;
    return level;
}

void vf_log_set_level(int level) { log_level_cached = level < 0 ? 0 : level > 3 ? 3 : level; }

/* Warnings are printed once per process: the same text from another
 * loader, thread or epoch is dropped (a run with many loaders or file opens
 * would otherwise repeat it). The set of texts printed is a table of
 * hashes, bounded: past WARNED_MAX distinct warnings, every one prints. */
enum { WARNED_MAX = 1024 };
static pthread_mutex_t warned_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t warned[WARNED_MAX];
static size_t warned_count;

static int first_warning(const char *line)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the text, then mixed */
    for (const unsigned char *c = (const unsigned char *)line; *c; c++)
        h = (h ^ *c) * 1099511628211ull;
    h = vf_mix64(h);
    int first = 1;
    pthread_mutex_lock(&warned_lock);
    for (size_t i = 0; i < warned_count && first; i++)
        first = warned[i] != h;
    if (first && warned_count < WARNED_MAX)
        warned[warned_count++] = h;
    pthread_mutex_unlock(&warned_lock);
    return first;
}

void vf_log(int level, const char *fmt, ...)
{
    if (level > vf_log_level())
        return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (level == VF_LOG_WARN && !first_warning(line))
        return;
    fprintf(stderr, "vlafeed: %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], line);
}

/* ---- files ---- */

int vf_open_regular_file(const char *path, int *fd_out, uint64_t *size)
{
    *fd_out = -1;
    /* Opened non-blocking and checked before any read: a FIFO or a device
     * in place of a file is refused at once instead of blocking the open
     * (O_NONBLOCK has no effect on reads of a regular file). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return vf_error(errno == ENOENT ? VF_ENOENT : VF_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return vf_error(VF_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return vf_error(VF_EIO, "%s: not a regular file (%s)", path, vf_file_kind_name(st.st_mode));
    }
    *fd_out = fd;
    if (size)
        *size = (uint64_t)st.st_size;
    return 0;
}

int vf_read_file(const char *path, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd;
    int r = vf_open_regular_file(path, &fd, NULL);
    if (r < 0)
        return r;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return vf_error(VF_ENOMEM, "%s: cannot open: %s", path, strerror(errno));
    }
    vf_buf b = {0};
    uint8_t chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (vf_buf_append(&b, chunk, n) < 0) {
            fclose(f);
            vf_buf_free(&b);
            return vf_error_context(VF_ENOMEM, "%s", path);
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        vf_buf_free(&b);
        return vf_error(VF_EIO, "%s: read error", path);
    }
    *len = b.len;
    *data = (uint8_t *)vf_buf_take_string(&b);
    return *data ? 0 : VF_ENOMEM;
}

const char *vf_file_kind_name(unsigned mode)
{
    static const struct {
        unsigned type;
        const char *name;
    } kinds[] = {
        {S_IFDIR, "a directory"},
        {S_IFIFO, "a FIFO"},
        {S_IFCHR, "a character device"},
        {S_IFBLK, "a block device"},
        {S_IFSOCK, "a socket"},
        {S_IFREG, "a regular file"},
    };
    for (size_t i = 0; i < VF_ARRAY_LEN(kinds); i++)
        if ((mode & S_IFMT) == kinds[i].type)
            return kinds[i].name;
    return "not a file";
}

int vf_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int vf_dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *vf_path_join(const char *a, const char *b)
{
    size_t la = strlen(a);
    while (la > 1 && a[la - 1] == '/')
        la--;
    while (*b == '/')
        b++;
    return vf_asprintf("%.*s/%s", (int)la, a, b);
}

int vf_mkdirs(const char *path)
{
    char *p = vf_strdup(path);
    if (!p)
        return VF_ENOMEM;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0755) < 0 && errno != EEXIST) {
            int r = vf_error(VF_EIO, "%s: cannot create directory: %s", p, strerror(errno));
            free(p);
            return r;
        }
        *s = '/';
    }
    int r = 0;
    if (mkdir(p, 0755) < 0 && errno != EEXIST)
        r = vf_error(VF_EIO, "%s: cannot create directory: %s", p, strerror(errno));
    free(p);
    return r;
}

double vf_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
