/*
 * test_http_helpers.h: a canned-response HTTP server on 127.0.0.1 for the
 * C tests of the HTTP layer (header-only, static functions).
 *
 * The server thread accepts connections on an ephemeral loopback port, reads
 * one request per connection (headers only), records it, and lets the
 * test's respond() callback write the answer; the connection is then
 * closed. It stops by itself after max_requests requests or 5 s without a
 * connection (canned_start_idle: another idle limit, for tests whose client
 * waits longer between attempts), and canned_stop() ends it at once, so a
 * test can never hang on it.
 */
#ifndef VF_TEST_HTTP_HELPERS_H
#define VF_TEST_HTTP_HELPERS_H

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CANNED_MAX_REQUESTS 32
#define CANNED_REQUEST_BYTES 8192

typedef struct canned_server canned_server;
/* Writes the response for request number n (0-based) to fd. */
typedef void (*canned_respond_fn)(canned_server *s, int n, const char *request, int fd);

struct canned_server {
    int listen_fd;
    int port;
    pthread_t thread;
    atomic_int stop;
    canned_respond_fn respond;
    void *ctx;
    int max_requests;
    double idle_limit_s;       /* stop after this long without a connection */
    atomic_int num_requests;
    char requests[CANNED_MAX_REQUESTS][CANNED_REQUEST_BYTES];
};

static void canned_write(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;
        p += n;
        len -= (size_t)n;
    }
}

static void canned_printf(int fd, const char *fmt, ...) VF_PRINTF(2, 3);
static void canned_printf(int fd, const char *fmt, ...)
{
    char buf[16384];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        canned_write(fd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void *canned_main(void *arg)
{
    canned_server *s = arg;
    double idle_since = vf_now_seconds();
    while (!atomic_load(&s->stop) && atomic_load(&s->num_requests) < s->max_requests) {
        struct pollfd p = {s->listen_fd, POLLIN, 0};
        int pr = poll(&p, 1, 50);
        if (pr <= 0) {
            if (vf_now_seconds() - idle_since > s->idle_limit_s)
                break;
            continue;
        }
        int fd = accept(s->listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        idle_since = vf_now_seconds();
        char req[CANNED_REQUEST_BYTES];
        size_t len = 0;
        double t0 = vf_now_seconds();
        while (len < sizeof req - 1 && vf_now_seconds() - t0 < 2.0) {
            struct pollfd q = {fd, POLLIN, 0};
            if (poll(&q, 1, 50) <= 0)
                continue;
            ssize_t n = recv(fd, req + len, sizeof req - 1 - len, 0);
            if (n <= 0)
                break;
            len += (size_t)n;
            req[len] = '\0';
            if (strstr(req, "\r\n\r\n"))
                break;
        }
        req[len] = '\0';
        int n = atomic_fetch_add(&s->num_requests, 1);
        if (n < CANNED_MAX_REQUESTS)
            memcpy(s->requests[n], req, len + 1);
        s->respond(s, n, req, fd);
        shutdown(fd, SHUT_WR);
        close(fd);
    }
    return NULL;
}

static int canned_start_idle(canned_server *s, canned_respond_fn respond, void *ctx, int max_requests,
                             double idle_limit_s)
{
    memset(s, 0, sizeof *s);
    s->idle_limit_s = idle_limit_s;
    s->respond = respond;
    s->ctx = ctx;
    s->max_requests = max_requests; /* only the first CANNED_MAX_REQUESTS are recorded */
    s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0)
        return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t alen = sizeof a;
    if (bind(s->listen_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(s->listen_fd, 16) < 0 ||
        getsockname(s->listen_fd, (struct sockaddr *)&a, &alen) < 0) {
        close(s->listen_fd);
        return -1;
    }
    s->port = ntohs(a.sin_port);
    if (pthread_create(&s->thread, NULL, canned_main, s) != 0) {
        close(s->listen_fd);
        return -1;
    }
    return 0;
}

static VF_UNUSED int canned_start(canned_server *s, canned_respond_fn respond, void *ctx, int max_requests)
{
    return canned_start_idle(s, respond, ctx, max_requests, 5.0);
}

static void canned_stop(canned_server *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    close(s->listen_fd);
}

/* The value of header `name` (case-insensitive) in request n, copied into
 * out; "" when absent. */
static VF_UNUSED const char *canned_header(canned_server *s, int n, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    if (n < 0 || n >= CANNED_MAX_REQUESTS)
        return out;
    const char *p = s->requests[n];
    size_t nl = strlen(name);
    while ((p = strstr(p, "\r\n")) != NULL) {
        p += 2;
        if (!strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t k = strcspn(v, "\r\n");
            if (k >= cap)
                k = cap - 1;
            memcpy(out, v, k);
            out[k] = '\0';
            return out;
        }
    }
    return out;
}

/* A responder serving files under a root directory (ctx: canned_files):
 * HEAD, GET and one "bytes=a-b" / "bytes=a-" range; counts GETs of paths
 * ending in count_suffix. */
typedef struct canned_files {
    const char *root;
    const char *count_suffix;
    atomic_int counted_gets;
} canned_files;

static VF_UNUSED void canned_serve_files(canned_server *s, int n, const char *req, int fd)
{
    canned_files *cf = s->ctx;
    int head = !strncmp(req, "HEAD ", 5);
    const char *p = strchr(req, ' ');
    const char *e = p ? strchr(p + 1, ' ') : NULL;
    char rel[1024];
    if (!p || !e || (size_t)(e - p - 1) >= sizeof rel || p[1] != '/' || memmem(p, (size_t)(e - p), "..", 2)) {
        canned_printf(fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    memcpy(rel, p + 2, (size_t)(e - p - 2));
    rel[e - p - 2] = '\0';
    char *path = vf_path_join(cf->root, rel);
    uint8_t *data = NULL;
    size_t len = 0;
    if (!path || vf_read_file(path, &data, &len) < 0) {
        free(path);
        canned_printf(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    free(path);
    size_t a = 0, b = len ? len - 1 : 0;
    const char *r = strcasestr(req, "\r\nRange: bytes=");
    if (r) {
        r += strlen("\r\nRange: bytes=");
        a = (size_t)strtoull(r, (char **)&r, 10);
        if (*r == '-' && r[1] >= '0' && r[1] <= '9')
            b = (size_t)strtoull(r + 1, NULL, 10);
        if (b >= len)
            b = len - 1;
    }
    if (!head && cf->count_suffix) {
        size_t lr = strlen(rel), ls = strlen(cf->count_suffix);
        if (lr >= ls && !strcmp(rel + lr - ls, cf->count_suffix))
            atomic_fetch_add(&cf->counted_gets, 1);
    }
    if (r && len && a <= b)
        canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: %zu\r\nContent-Range: bytes %zu-%zu/%zu\r\n"
                          "Connection: close\r\n\r\n", b - a + 1, a, b, len);
    else
        canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", len);
    if (!head && len)
        canned_write(fd, data + (r ? a : 0), r ? b - a + 1 : len);
    free(data);
}

/* A port on 127.0.0.1 where nothing listens (bound, then closed). */
static VF_UNUSED int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

#endif
