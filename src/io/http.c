/*
 * http.c: HTTP(S) and S3 objects through libcurl: URL parsing, a client
 * (settings, S3 credentials and addressing, a locked pool of reusable curl
 * handles), requests with retries, and a vf_source over an object with a
 * small read-ahead block cache.
 *
 * Requests. Every request (HEAD, whole GET, range GET, download to a file,
 * S3 list page) runs the same attempt loop:
 *  - an attempt has connect and low-speed timeouts and a total timeout equal
 *    to what is left of the request's budget, so nothing can hang;
 *  - 5xx, 408, 429, connection failures, resets, timeouts and truncated
 *    bodies are retried up to max_attempts with exponential backoff and
 *    jitter, within the budget; bytes already received are kept and the
 *    next attempt asks only for the rest (Range);
 *  - 404/410 is VF_ENOENT, other 4xx VF_EIO, both at once; every message
 *    names the URL (s3://... as the user wrote it), the HTTP status and the
 *    attempts made.
 * Responses are parsed defensively: header bytes per response are bounded
 * (MAX_HEADER_BYTES), Content-Range must be "bytes a-b/total" with a equal to
 * the requested start, b inside the request and total equal to the known
 * size; a 200 answer to a range request is accepted by skipping to the
 * wanted bytes (servers without range support still work, slowly).
 *
 * Threads: the client is shared; each request takes a curl easy handle from
 * the pool (or makes one) and gives it back, so connections are reused and
 * no handle is used by two threads at once. Counters are atomic.
 *
 * Source: reads shorter than block_bytes are served from aligned blocks kept
 * in a small LRU (one range GET fills a block), so Parquet footers and the
 * demuxer's 64 KiB reads cost one request per block; longer reads go
 * straight to one range GET. The block table is locked; fetches run outside
 * the lock (two threads missing the same block may both fetch it).
 */
#define _GNU_SOURCE
#include "io/io.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADER_BYTES (64 * 1024)  /* per response */
#define MAX_ERROR_BODY 2048           /* body bytes kept from an error response */
#define MAX_LIST_PAGE (16u << 20)     /* one S3 list page */
#define MAX_LIST_PAGES 10000
#define MAX_LIST_ENTRIES 1000000
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* ---- URLs ------------------------------------------------------------------ */

int vf_is_url(const char *s)
{
    return s && (!strncasecmp(s, "http://", 7) || !strncasecmp(s, "https://", 8) || !strncasecmp(s, "s3://", 5));
}

void vf_url_free(vf_url *u)
{
    if (!u)
        return;
    free(u->host);
    free(u->path);
    free(u->query);
    memset(u, 0, sizeof *u);
}

int vf_url_parse(const char *url, vf_url *out)
{
    memset(out, 0, sizeof *out);
    if (!url)
        return vf_error(VF_EINVAL, "URL is NULL");
    /* s3:// keys are raw bytes and may hold spaces; http(s) URLs must be
     * percent-encoded already. */
    int is_s3 = !strncasecmp(url, "s3://", 5);
    for (const unsigned char *p = (const unsigned char *)url; *p; p++)
        if (*p < ' ' || *p == 0x7f || (*p == ' ' && !is_s3))
            return vf_error(VF_EINVAL, "%s: URL contains a space or control character", url);
    const char *rest;
    if (!strncasecmp(url, "http://", 7)) {
        strcpy(out->scheme, "http");
        rest = url + 7;
    } else if (!strncasecmp(url, "https://", 8)) {
        strcpy(out->scheme, "https");
        rest = url + 8;
    } else if (!strncasecmp(url, "s3://", 5)) {
        strcpy(out->scheme, "s3");
        rest = url + 5;
    } else {
        return vf_error(VF_EINVAL, "%s: not a URL (want http://, https:// or s3://)", url);
    }
    size_t auth_len = strcspn(rest, "/?#");
    const char *after = rest + auth_len;
    if (memchr(rest, '@', auth_len))
        return vf_error(VF_EINVAL, "%s: user information in URLs is not supported (use credentials from the "
                        "environment)", url);
    const char *host = rest, *port = NULL;
    size_t host_len = auth_len;
    if (!strcmp(out->scheme, "s3")) {
        /* the bucket: no port */
    } else if (auth_len && rest[0] == '[') {
        const char *close = memchr(rest, ']', auth_len);
        if (!close)
            return vf_error(VF_EINVAL, "%s: unclosed '[' in the host", url);
        host = rest + 1;
        host_len = (size_t)(close - host);
        if (close + 1 < after) {
            if (close[1] != ':')
                return vf_error(VF_EINVAL, "%s: junk after the IPv6 host", url);
            port = close + 2;
        }
    } else {
        const char *colon = memchr(rest, ':', auth_len);
        if (colon) {
            host_len = (size_t)(colon - rest);
            port = colon + 1;
        }
    }
    if (host_len == 0)
        return vf_error(VF_EINVAL, "%s: no %s", url, strcmp(out->scheme, "s3") ? "host" : "bucket");
    if (port) {
        long value = 0;
        const char *p = port;
        if (p == after)
            return vf_error(VF_EINVAL, "%s: empty port", url);
        for (; p < after; p++) {
            if (*p < '0' || *p > '9' || value > 65535)
                return vf_error(VF_EINVAL, "%s: bad port", url);
            value = value * 10 + (*p - '0');
        }
        if (value < 1 || value > 65535)
            return vf_error(VF_EINVAL, "%s: port out of range", url);
        out->port = (int)value;
    }
    size_t path_len = strcspn(after, "?#");
    const char *query = after[path_len] == '?' ? after + path_len + 1 : NULL;
    size_t query_len = query ? strcspn(query, "#") : 0;
    out->host = vf_strndup(host, host_len);
    out->path = path_len ? vf_strndup(after, path_len) : vf_strdup("/");
    out->query = query ? vf_strndup(query, query_len) : NULL;
    if (!out->host || !out->path || (query && !out->query)) {
        vf_url_free(out);
        return VF_ENOMEM;
    }
    return 0;
}

/* ---- settings and client ------------------------------------------------- */

void vf_http_defaults(vf_http_settings *s)
{
    memset(s, 0, sizeof *s);
    s->max_attempts = 5;
    s->backoff_initial_s = 0.2;
    s->backoff_max_s = 5.0;
    s->request_budget_s = 120.0;
    s->connect_timeout_s = 10.0;
    s->low_speed_time_s = 15.0;
    s->low_speed_bytes = 1024;
    s->block_bytes = 1u << 20;
    s->cache_blocks = 4;
    s->max_idle_handles = 8;
    s->s3_path_style = -1;
    /* Operational overrides from the environment (a bad value is ignored). */
    static const struct {
        const char *name;
        double lo, hi;
        int which;
    } env[] = {
        {"VF_HTTP_ATTEMPTS", 1, 100, 0},         {"VF_HTTP_BUDGET_S", 0.01, 86400, 1},
        {"VF_HTTP_BACKOFF_S", 0, 60, 2},          {"VF_HTTP_BACKOFF_MAX_S", 0, 600, 3},
        {"VF_HTTP_CONNECT_TIMEOUT_S", 0.01, 600, 4}, {"VF_HTTP_LOW_SPEED_TIME_S", 0, 3600, 5},
        {"VF_HTTP_BLOCK_BYTES", 4096, 64 << 20, 6},
    };
    for (size_t i = 0; i < VF_ARRAY_LEN(env); i++) {
        const char *v = getenv(env[i].name);
        if (!v || !*v)
            continue;
        char *end;
        double x = strtod(v, &end);
        if (*end || !(x >= env[i].lo && x <= env[i].hi)) {
            vf_log(VF_LOG_WARN, "%s=%s ignored (want a number in [%g, %g])", env[i].name, v, env[i].lo, env[i].hi);
            continue;
        }
        switch (env[i].which) {
        case 0: s->max_attempts = (int)x; break;
        case 1: s->request_budget_s = x; break;
        case 2: s->backoff_initial_s = x; break;
        case 3: s->backoff_max_s = x; break;
        case 4: s->connect_timeout_s = x; break;
        case 5: s->low_speed_time_s = x; break;
        case 6: s->block_bytes = (size_t)x; break;
        }
    }
}

double vf_http_backoff_delay(const vf_http_settings *s, int attempt, double u)
{
    if (attempt < 1)
        attempt = 1;
    double step = s->backoff_initial_s > 0 ? s->backoff_initial_s : 0;
    for (int i = 1; i < attempt && step < s->backoff_max_s; i++)
        step *= 2;
    if (step > s->backoff_max_s)
        step = s->backoff_max_s;
    if (u < 0)
        u = 0;
    if (u >= 1)
        u = 0.999999;
    return step / 2 + step / 2 * u;
}

struct vf_http_client {
    atomic_int refs;
    vf_http_settings settings;
    /* S3 */
    char *s3_endpoint;      /* "scheme://host[:port]" without a trailing '/', NULL: AWS */
    char *s3_region;
    char *access_key, *secret_key, *session_token;
    int path_style;         /* -1: virtual-hosted unless the bucket has a '.' */
    /* handle pool */
    pthread_mutex_t lock;
    CURL **idle;
    int num_idle;
    atomic_int warned_no_range;
    atomic_uint_fast64_t requests, retries, bytes, block_hits, block_misses, jitter_counter;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static int curl_init_result;
static void curl_init_once(void) { curl_init_result = (int)curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *env_dup(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? vf_strdup(v) : NULL;
}

void vf_http_client_close(vf_http_client *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    for (int i = 0; i < c->num_idle; i++)
        curl_easy_cleanup(c->idle[i]);
    free(c->idle);
    pthread_mutex_destroy(&c->lock);
    free(c->s3_endpoint);
    free(c->s3_region);
    free(c->access_key);
    if (c->secret_key)
        memset(c->secret_key, 0, strlen(c->secret_key));
    free(c->secret_key);
    free(c->session_token);
    free(c);
}

vf_http_client *vf_http_client_ref(vf_http_client *c)
{
    atomic_fetch_add(&c->refs, 1);
    return c;
}

int vf_http_client_open(vf_http_client **out, const vf_http_settings *settings)
{
    *out = NULL;
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_result != 0)
        return vf_error(VF_EIO, "libcurl initialisation failed (code %d)", curl_init_result);
    vf_http_client *c = vf_calloc(1, sizeof *c);
    if (!c)
        return VF_ENOMEM;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->lock, NULL);
    if (settings)
        c->settings = *settings;
    else
        vf_http_defaults(&c->settings);
    vf_http_settings *s = &c->settings;
    if (s->max_attempts < 1)
        s->max_attempts = 1;
    if (s->max_attempts > 100)
        s->max_attempts = 100;
    if (s->block_bytes < 4096)
        s->block_bytes = 4096;
    if (s->block_bytes > (64u << 20))
        s->block_bytes = 64u << 20;
    if (s->cache_blocks < 1)
        s->cache_blocks = 1;
    if (s->cache_blocks > 256)
        s->cache_blocks = 256;
    if (s->max_idle_handles < 0)
        s->max_idle_handles = 0;
    if (s->request_budget_s <= 0)
        s->request_budget_s = 120;
    if (s->connect_timeout_s <= 0)
        s->connect_timeout_s = 10;
    int r = 0;
    c->idle = vf_calloc((size_t)s->max_idle_handles + 1, sizeof *c->idle);
    if (!c->idle)
        r = VF_ENOMEM;
    /* S3 configuration: settings first, then the standard environment. */
    const char *endpoint = s->s3_endpoint;
    char *env_endpoint = NULL;
    if (r == 0 && !endpoint) {
        env_endpoint = env_dup("AWS_ENDPOINT_URL_S3");
        if (!env_endpoint)
            env_endpoint = env_dup("AWS_ENDPOINT_URL");
        endpoint = env_endpoint;
    }
    if (r == 0 && endpoint) {
        vf_url u;
        r = vf_url_parse(endpoint, &u);
        if (r == 0 && !strcmp(u.scheme, "s3"))
            r = vf_error(VF_EINVAL, "%s: an S3 endpoint must be an http:// or https:// URL", endpoint);
        if (r == 0) {
            size_t len = strlen(endpoint);
            while (len && endpoint[len - 1] == '/')
                len--;
            c->s3_endpoint = vf_strndup(endpoint, len);
            if (!c->s3_endpoint)
                r = VF_ENOMEM;
        } else {
            r = vf_error_context(r, "S3 endpoint");
        }
        vf_url_free(&u);
    }
    free(env_endpoint);
    if (r == 0) {
        c->s3_region = s->s3_region ? vf_strdup(s->s3_region) : env_dup("AWS_REGION");
        if (!c->s3_region)
            c->s3_region = env_dup("AWS_DEFAULT_REGION");
        if (!c->s3_region)
            c->s3_region = vf_strdup("us-east-1");
        c->access_key = env_dup("AWS_ACCESS_KEY_ID");
        c->secret_key = env_dup("AWS_SECRET_ACCESS_KEY");
        c->session_token = env_dup("AWS_SESSION_TOKEN");
        if (!c->s3_region)
            r = VF_ENOMEM;
        if (r == 0 && (!c->access_key) != (!c->secret_key))
            r = vf_error(VF_EINVAL, "S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set "
                         "together");
    }
    c->path_style = s->s3_path_style >= 0 ? s->s3_path_style : (c->s3_endpoint ? 1 : -1);
    /* Settings strings are borrowed by the caller: do not keep them. */
    s->s3_endpoint = NULL;
    s->s3_region = NULL;
    atomic_init(&c->jitter_counter, (uint64_t)(uintptr_t)c ^ (uint64_t)(vf_now_seconds() * 1e9));
    if (r < 0) {
        vf_http_client_close(c);
        return r;
    }
    *out = c;
    return 0;
}

void vf_http_client_stats(vf_http_client *c, vf_http_stats *out)
{
    out->requests = atomic_load(&c->requests);
    out->retries = atomic_load(&c->retries);
    out->bytes = atomic_load(&c->bytes);
    out->block_hits = atomic_load(&c->block_hits);
    out->block_misses = atomic_load(&c->block_misses);
}

static CURL *take_handle(vf_http_client *c)
{
    CURL *h = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->num_idle)
        h = c->idle[--c->num_idle];
    pthread_mutex_unlock(&c->lock);
    if (h)
        curl_easy_reset(h); /* keeps the connection cache */
    else
        h = curl_easy_init();
    return h;
}

static void give_handle(vf_http_client *c, CURL *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&c->lock);
    if (c->num_idle < c->settings.max_idle_handles) {
        c->idle[c->num_idle++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    if (h)
        curl_easy_cleanup(h);
}

/* ---- resolving a URL into what is sent ------------------------------------ */

typedef struct target {
    char *url;            /* the http(s) URL sent */
    char *canonical_uri;  /* path as sent (S3 signing) */
    char *host_header;    /* host[:port] as curl sends it (S3 signing) */
    int s3;
} target;

static void target_free(target *t)
{
    free(t->url);
    free(t->canonical_uri);
    free(t->host_header);
    memset(t, 0, sizeof *t);
}

/* Builds the request for url; query (already encoded, may be NULL) is
 * appended for S3 list calls. */
static int resolve(vf_http_client *c, const char *url, const char *query, target *t)
{
    memset(t, 0, sizeof *t);
    vf_url u;
    int r = vf_url_parse(url, &u);
    if (r < 0)
        return r;
    if (strcmp(u.scheme, "s3") != 0) {
        t->url = query ? vf_asprintf("%s%s%s", url, strchr(url, '?') ? "&" : "?", query) : vf_strdup(url);
        vf_url_free(&u);
        return t->url ? 0 : VF_ENOMEM;
    }
    t->s3 = 1;
    vf_buf path = {0};
    const char *bucket = u.host;
    int path_style = c->path_style;
    if (path_style < 0)
        path_style = strchr(bucket, '.') != NULL;
    char *base = NULL; /* scheme://host[:port] */
    if (c->s3_endpoint) {
        base = vf_strdup(c->s3_endpoint);
    } else if (path_style) {
        base = vf_asprintf("https://s3.%s.amazonaws.com", c->s3_region);
    } else {
        base = vf_asprintf("https://%s.s3.%s.amazonaws.com", bucket, c->s3_region);
    }
    vf_url bu;
    memset(&bu, 0, sizeof bu);
    r = base ? vf_url_parse(base, &bu) : VF_ENOMEM;
    /* An endpoint may carry a base path (e.g. behind a proxy). */
    if (r == 0 && strcmp(bu.path, "/") != 0)
        r = vf_buf_append(&path, bu.path, strlen(bu.path));
    if (r == 0 && path_style) {
        r = vf_buf_append_u8(&path, '/');
        if (r == 0)
            r = vf_aws_uri_encode(&path, bucket, strlen(bucket), 0);
    }
    /* The key: u.path is "/key" (raw bytes); list calls have an empty key. */
    if (r == 0 && !(path_style && query && !strcmp(u.path, "/")))
        r = vf_aws_uri_encode(&path, u.path, strlen(u.path), 1);
    if (r == 0 && path.len == 0)
        r = vf_buf_append_u8(&path, '/');
    if (r == 0) {
        char *p = vf_buf_take_string(&path);
        t->canonical_uri = p;
        if (!p)
            r = VF_ENOMEM;
    }
    if (r == 0) {
        size_t blen = strlen(base);
        if (strcmp(bu.path, "/") != 0) /* drop the endpoint's base path: it is in canonical_uri */
            blen = (size_t)(strstr(base + strlen(bu.scheme) + 3, "/") - base);
        t->url = vf_asprintf("%.*s%s%s%s", (int)blen, base, t->canonical_uri, query ? "?" : "", query ? query : "");
        int default_port = bu.port == 0 || (bu.port == 80 && !strcmp(bu.scheme, "http")) ||
                           (bu.port == 443 && !strcmp(bu.scheme, "https"));
        int v6 = strchr(bu.host, ':') != NULL;
        t->host_header = default_port ? vf_asprintf(v6 ? "[%s]" : "%s", bu.host)
                                      : vf_asprintf(v6 ? "[%s]:%d" : "%s:%d", bu.host, bu.port);
        if (!t->url || !t->host_header)
            r = VF_ENOMEM;
    }
    vf_buf_free(&path);
    vf_url_free(&bu);
    vf_url_free(&u);
    free(base);
    if (r < 0)
        target_free(t);
    return r;
}

/* ---- one request ------------------------------------------------------------- */

typedef enum sink_kind {
    SINK_NONE = 0,   /* HEAD */
    SINK_MEMORY,     /* fixed caller buffer of `want` bytes */
    SINK_GROW,       /* growing vf_buf up to max_bytes (whole object) */
    SINK_FILE,       /* fd, written at the object offset */
} sink_kind;

typedef struct xfer {
    vf_http_client *client;
    const char *display;       /* URL for messages */
    const char *query;         /* extra query (S3 list) */
    int head;
    /* what is wanted: [start, start + want); want UINT64_MAX = to the end */
    uint64_t start, want;
    uint64_t known_size;       /* UINT64_MAX: unknown */
    sink_kind sink;
    uint8_t *mem;
    vf_buf *grow;
    size_t max_bytes;
    int fd;
    /* progress across attempts: bytes [start, start + delivered) are in */
    uint64_t delivered;

    /* per-response state (reset at each status line) */
    long status;
    char reason[64];
    int64_t content_length;
    int has_content_range, content_range_bad;
    uint64_t cr_first, cr_last, cr_total;
    int cr_total_known;
    size_t header_bytes;
    int header_overflow;
    /* per-attempt body state */
    int body_started;
    uint64_t body_base;        /* object offset of the body's first byte */
    uint64_t body_seen;
    int done_early;            /* aborted on purpose: everything wanted arrived */
    int sink_error;            /* VF_E* from the sink, or 0 */
    char sink_message[256];
    char error_body[MAX_ERROR_BODY + 1];
    size_t error_body_len;
} xfer;

static int header_name_is(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);
    return len > n && !strncasecmp(line, name, n) && line[n] == ':';
}

/* Parses an unsigned decimal of at most 19 digits; end at a non-digit. */
static int parse_u64(const char **p, const char *end, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    int digits = 0;
    while (s < end && *s >= '0' && *s <= '9' && digits < 19) {
        v = v * 10 + (uint64_t)(*s - '0');
        s++;
        digits++;
    }
    if (!digits || (s < end && *s >= '0' && *s <= '9'))
        return -1;
    *p = s;
    *out = v;
    return 0;
}

static void parse_content_range(xfer *x, const char *v, const char *end)
{
    x->has_content_range = 1;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    if ((size_t)(end - v) < 6 || strncasecmp(v, "bytes ", 6)) {
        x->content_range_bad = 1;
        return;
    }
    v += 6;
    while (v < end && *v == ' ')
        v++;
    if (v < end && *v == '*') { /* "bytes *\/N" (unsatisfied range): only valid on 416 */
        x->content_range_bad = 1;
        return;
    }
    if (parse_u64(&v, end, &x->cr_first) < 0 || v >= end || *v++ != '-' || parse_u64(&v, end, &x->cr_last) < 0 ||
        v >= end || *v++ != '/' || x->cr_last < x->cr_first) {
        x->content_range_bad = 1;
        return;
    }
    if (v < end && *v == '*') {
        v++;
    } else {
        if (parse_u64(&v, end, &x->cr_total) < 0 || x->cr_last >= x->cr_total) {
            x->content_range_bad = 1;
            return;
        }
        x->cr_total_known = 1;
    }
    while (v < end && (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n'))
        v++;
    if (v != end)
        x->content_range_bad = 1;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg)
{
    xfer *x = arg;
    size_t len = size * nmemb;
    if (len >= 5 && !strncmp(data, "HTTP/", 5)) {
        /* A new response (redirects, 100 Continue): reset what we parsed. */
        x->status = 0;
        x->reason[0] = '\0';
        x->content_length = -1;
        x->has_content_range = x->content_range_bad = x->cr_total_known = 0;
        x->header_bytes = 0;
        const char *sp = memchr(data, ' ', len);
        if (sp) {
            const char *p = sp + 1, *end = data + len;
            uint64_t code = 0;
            if (parse_u64(&p, end, &code) == 0 && code < 1000)
                x->status = (long)code;
            while (p < end && *p == ' ')
                p++;
            size_t n = 0;
            while (p + n < end && p[n] != '\r' && p[n] != '\n' && n < sizeof x->reason - 1)
                n++;
            for (size_t i = 0; i < n; i++)
                x->reason[i] = (p[i] >= ' ' && p[i] < 0x7f) ? p[i] : '?';
            x->reason[n] = '\0';
        }
    }
    x->header_bytes += len;
    if (x->header_bytes > MAX_HEADER_BYTES) {
        x->header_overflow = 1;
        return 0; /* aborts the transfer */
    }
    const char *end = data + len;
    if (header_name_is(data, len, "content-length")) {
        const char *v = data + 15;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        uint64_t n;
        if (parse_u64(&v, end, &n) == 0 && n <= INT64_MAX)
            x->content_length = (int64_t)n;
    } else if (header_name_is(data, len, "content-range")) {
        parse_content_range(x, data + 14, end);
    }
    return len;
}

static int sink_fail(xfer *x, int code, const char *fmt, ...) VF_PRINTF(3, 4);
static int sink_fail(xfer *x, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->sink_message, sizeof x->sink_message, fmt, ap);
    va_end(ap);
    x->sink_error = code;
    return code;
}

/* Stores body bytes at object offset `at` (only the wanted part). */
static int sink_put(xfer *x, uint64_t at, const uint8_t *p, size_t n)
{
    uint64_t next = x->start + x->delivered; /* the next wanted byte */
    uint64_t end = x->want == UINT64_MAX ? UINT64_MAX : x->start + x->want;
    if (at + n <= next || at >= end)
        return 0;
    if (at > next)
        return sink_fail(x, VF_EIO, "body skipped bytes (offset %llu, expected %llu)", (unsigned long long)at,
                         (unsigned long long)next);
    size_t skip = (size_t)(next - at);
    p += skip;
    n -= skip;
    if (end != UINT64_MAX && n > end - next)
        n = (size_t)(end - next);
    switch (x->sink) {
    case SINK_MEMORY:
        memcpy(x->mem + x->delivered, p, n);
        break;
    case SINK_GROW:
        if (x->grow->len + n > x->max_bytes)
            return sink_fail(x, VF_ERANGE, "larger than the %zu-byte limit", x->max_bytes);
        if (vf_buf_append(x->grow, p, n) < 0)
            return sink_fail(x, VF_ENOMEM, "out of memory");
        break;
    case SINK_FILE: {
        size_t done = 0;
        while (done < n) {
            ssize_t w = pwrite(x->fd, p + done, n - done, (off_t)(x->delivered + done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return sink_fail(x, VF_EIO, "write to the local file failed: %s", strerror(errno));
            done += (size_t)w;
        }
        break;
    }
    case SINK_NONE:
        break;
    }
    x->delivered += n;
    if (x->known_size != UINT64_MAX && x->start + x->delivered > x->known_size)
        return sink_fail(x, VF_ECORRUPT, "the body is longer than the object's %llu bytes",
                         (unsigned long long)x->known_size);
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    xfer *x = arg;
    size_t len = size * nmemb;
    if (x->status < 200 || x->status > 299) {
        size_t room = MAX_ERROR_BODY - x->error_body_len;
        size_t n = VF_MIN(room, len);
        memcpy(x->error_body + x->error_body_len, data, n);
        x->error_body_len += n;
        x->error_body[x->error_body_len] = '\0';
        return len;
    }
    if (!x->body_started) {
        x->body_started = 1;
        uint64_t asked = x->start + x->delivered;
        if (x->status == 206) {
            if (!x->has_content_range || x->content_range_bad) {
                sink_fail(x, VF_ECORRUPT, "206 response with a missing or malformed Content-Range");
                return 0;
            }
            uint64_t last_wanted = x->want == UINT64_MAX ? UINT64_MAX : x->start + x->want - 1;
            if (x->cr_first != asked || x->cr_last > last_wanted) {
                sink_fail(x, VF_ECORRUPT, "Content-Range %llu-%llu does not match the requested range %llu-%s",
                          (unsigned long long)x->cr_first, (unsigned long long)x->cr_last,
                          (unsigned long long)asked, x->want == UINT64_MAX ? "" : "(bounded)");
                return 0;
            }
            if (x->cr_total_known && x->known_size != UINT64_MAX && x->cr_total != x->known_size) {
                sink_fail(x, VF_ECORRUPT, "the object changed size (%llu bytes, was %llu)",
                          (unsigned long long)x->cr_total, (unsigned long long)x->known_size);
                return 0;
            }
            x->body_base = x->cr_first;
        } else {
            /* A 200: the whole object from offset 0, whatever we asked. */
            if (asked > 0 && atomic_exchange(&x->client->warned_no_range, 1) == 0) {
                vf_log(VF_LOG_WARN, "%s: the server ignores Range requests; whole objects are read", x->display);
            }
            x->body_base = 0;
        }
    }
    uint64_t at = x->body_base + x->body_seen;
    x->body_seen += len;
    atomic_fetch_add(&x->client->bytes, len);
    if (sink_put(x, at, (const uint8_t *)data, len) < 0)
        return 0;
    if (x->want != UINT64_MAX && x->delivered == x->want && x->status == 200 &&
        x->body_base + x->body_seen < (x->content_length >= 0 ? (uint64_t)x->content_length : UINT64_MAX)) {
        x->done_early = 1; /* the rest of a 200 body is not needed */
        return 0;
    }
    return len;
}

typedef enum verdict { DONE = 0, RETRY = 1, FAIL = 2 } verdict;

static int retryable_curl(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
        return 1;
    default:
        return 0;
    }
}

/* The S3 error code in an XML error body (<Code>NoSuchKey</Code>), or "". */
static void s3_error_code(const char *body, char *out, size_t cap)
{
    out[0] = '\0';
    const char *a = strstr(body, "<Code>");
    const char *b = a ? strstr(a, "</Code>") : NULL;
    if (!a || !b)
        return;
    a += 6;
    size_t n = VF_MIN((size_t)(b - a), cap - 1);
    for (size_t i = 0; i < n; i++)
        out[i] = (a[i] >= ' ' && a[i] < 0x7f) ? a[i] : '?';
    out[n] = '\0';
}

static int sleep_seconds(double s)
{
    if (s <= 0)
        return 0;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
    return 0;
}

static double jitter_unit(vf_http_client *c)
{
    uint64_t n = atomic_fetch_add(&c->jitter_counter, 0x9E3779B97F4A7C15ULL);
    return (double)(vf_mix64(n) >> 11) * (1.0 / 9007199254740992.0);
}

static void amz_now(char out[17])
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* Headers of one attempt (Range, S3 signature). */
static int attempt_headers(xfer *x, const target *t, struct curl_slist **list)
{
    *list = NULL;
    vf_http_client *c = x->client;
    char line[256];
    uint64_t from = x->start + x->delivered;
    int ranged = !x->head && (x->want != UINT64_MAX || from > 0);
    struct curl_slist *l = NULL, *n;
    if (ranged) {
        if (x->want == UINT64_MAX)
            snprintf(line, sizeof line, "Range: bytes=%llu-", (unsigned long long)from);
        else
            snprintf(line, sizeof line, "Range: bytes=%llu-%llu", (unsigned long long)from,
                     (unsigned long long)(x->start + x->want - 1));
        if (!(n = curl_slist_append(l, line)))
            goto nomem;
        l = n;
    }
    if (t->s3 && c->access_key) {
        char date[17];
        amz_now(date);
        vf_sigv4_header h[4] = {
            {"host", t->host_header},
            {"x-amz-content-sha256", EMPTY_SHA256},
            {"x-amz-date", date},
            {"x-amz-security-token", c->session_token},
        };
        size_t nh = c->session_token ? 4 : 3;
        vf_sigv4_request req = {
            .method = x->head ? "HEAD" : "GET",
            .canonical_uri = t->canonical_uri,
            .query = x->query,
            .headers = h,
            .num_headers = nh,
            .payload_hash = EMPTY_SHA256,
            .amz_date = date,
            .region = c->s3_region,
            .service = "s3",
            .access_key = c->access_key,
            .secret_key = c->secret_key,
        };
        char *auth = NULL;
        int r = vf_sigv4_sign(&req, &auth, NULL, NULL);
        if (r < 0) {
            curl_slist_free_all(l);
            return r;
        }
        char *lines[4] = {vf_asprintf("Authorization: %s", auth), vf_asprintf("x-amz-date: %s", date),
                          vf_strdup("x-amz-content-sha256: " EMPTY_SHA256),
                          c->session_token ? vf_asprintf("x-amz-security-token: %s", c->session_token) : NULL};
        free(auth);
        int bad = !lines[0] || !lines[1] || !lines[2] || (c->session_token && !lines[3]);
        for (int i = 0; i < 4 && !bad; i++) {
            if (!lines[i])
                continue;
            if (!(n = curl_slist_append(l, lines[i])))
                bad = 1;
            else
                l = n;
        }
        for (int i = 0; i < 4; i++)
            free(lines[i]);
        if (bad)
            goto nomem;
    }
    *list = l;
    return 0;
nomem:
    curl_slist_free_all(l);
    return vf_error(VF_ENOMEM, "out of memory building request headers");
}

static void reset_attempt(xfer *x)
{
    x->status = 0;
    x->reason[0] = '\0';
    x->content_length = -1;
    x->has_content_range = x->content_range_bad = x->cr_total_known = 0;
    x->header_bytes = 0;
    x->header_overflow = 0;
    x->body_started = 0;
    x->body_base = x->body_seen = 0;
    x->done_early = 0;
    x->sink_error = 0;
    x->sink_message[0] = '\0';
    x->error_body_len = 0;
    x->error_body[0] = '\0';
}

/* Judges one finished attempt; on FAIL or RETRY writes why into why. */
static verdict judge(xfer *x, CURLcode rc, const char *curl_message, int *code, char *why, size_t cap)
{
    *code = VF_EIO;
    if (x->header_overflow) {
        *code = VF_ECORRUPT;
        snprintf(why, cap, "response headers exceed %d bytes", MAX_HEADER_BYTES);
        return FAIL;
    }
    if (x->sink_error) {
        *code = x->sink_error;
        snprintf(why, cap, "%s", x->sink_message);
        /* A misplaced/malformed range answer may be a proxy glitch: retry.
         * Limits, memory and local disk errors are final. */
        return x->sink_error == VF_ECORRUPT && !strstr(x->sink_message, "changed size") &&
                       !strstr(x->sink_message, "longer than")
                   ? RETRY
                   : FAIL;
    }
    if (x->done_early)
        return DONE;
    if (rc != CURLE_OK && x->status == 0) {
        snprintf(why, cap, "%s", curl_message[0] ? curl_message : curl_easy_strerror(rc));
        return retryable_curl(rc) ? RETRY : FAIL;
    }
    long st = x->status;
    if (st < 200 || st > 299) {
        char s3code[64];
        s3_error_code(x->error_body, s3code, sizeof s3code);
        snprintf(why, cap, "HTTP %ld%s%s%s%s%s", st, x->reason[0] ? " " : "", x->reason, s3code[0] ? " (" : "",
                 s3code, s3code[0] ? ")" : "");
        if (st == 404 || st == 410) {
            *code = VF_ENOENT;
            return FAIL;
        }
        if (st == 416) {
            *code = VF_ERANGE;
            return FAIL;
        }
        return (st >= 500 || st == 408 || st == 429) ? RETRY : FAIL;
    }
    if (rc != CURLE_OK) {
        snprintf(why, cap, "HTTP %ld but the transfer broke: %s", st,
                 curl_message[0] ? curl_message : curl_easy_strerror(rc));
        return retryable_curl(rc) ? RETRY : FAIL;
    }
    if (x->head)
        return DONE;
    if (x->want != UINT64_MAX && x->delivered < x->want) {
        snprintf(why, cap, "truncated body: %llu of %llu bytes", (unsigned long long)x->delivered,
                 (unsigned long long)x->want);
        return RETRY;
    }
    if (x->want == UINT64_MAX && x->content_length >= 0 && x->body_seen < (uint64_t)x->content_length) {
        snprintf(why, cap, "truncated body: %llu of %lld bytes", (unsigned long long)x->body_seen,
                 (long long)x->content_length);
        return RETRY;
    }
    if (x->want == UINT64_MAX && x->known_size != UINT64_MAX && x->start + x->delivered < x->known_size) {
        snprintf(why, cap, "truncated body: %llu of %llu bytes", (unsigned long long)(x->start + x->delivered),
                 (unsigned long long)x->known_size);
        return RETRY;
    }
    return DONE;
}

static int perform(xfer *x)
{
    vf_http_client *c = x->client;
    const vf_http_settings *s = &c->settings;
    target t;
    int r = resolve(c, x->display, x->query, &t);
    if (r < 0)
        return r;
    double t0 = vf_now_seconds();
    char why[512] = "";
    int code = VF_EIO, attempt = 0;
    verdict v = FAIL;
    for (;;) {
        attempt++;
        reset_attempt(x);
        if (x->sink == SINK_GROW && x->delivered == 0)
            x->grow->len = 0;
        double left = s->request_budget_s - (vf_now_seconds() - t0);
        CURL *h = take_handle(c);
        struct curl_slist *headers = NULL;
        if (!h) {
            r = vf_error(VF_ENOMEM, "%s: cannot create a curl handle", x->display);
            break;
        }
        if ((r = attempt_headers(x, &t, &headers)) < 0) {
            give_handle(c, h);
            break;
        }
        char curl_message[CURL_ERROR_SIZE];
        curl_message[0] = '\0';
        curl_easy_setopt(h, CURLOPT_URL, t.url);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_message);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, t.s3 ? 0L : 1L);
        curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(s->connect_timeout_s * 1000));
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(VF_MAX(left, 0.001) * 1000) + 1);
        if (s->low_speed_time_s > 0 && s->low_speed_bytes > 0) {
            curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, s->low_speed_bytes);
            curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(s->low_speed_time_s + 0.999));
        }
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
        curl_easy_setopt(h, CURLOPT_USERAGENT, "vlafeed/" VF_VERSION_STRING);
        curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, NULL); /* byte offsets must be of the stored bytes */
        if (x->head)
            curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        if (headers)
            curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        atomic_fetch_add(&c->requests, 1);
        CURLcode rc = curl_easy_perform(h);
        if (x->status == 0) {
            long st = 0;
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
            x->status = st;
        }
        curl_slist_free_all(headers);
        give_handle(c, h);
        v = judge(x, rc, curl_message, &code, why, sizeof why);
        if (v != RETRY)
            break;
        double elapsed = vf_now_seconds() - t0;
        if (attempt >= s->max_attempts)
            break;
        double delay = vf_http_backoff_delay(s, attempt, jitter_unit(c));
        if (elapsed + delay >= s->request_budget_s) {
            snprintf(why + strlen(why), sizeof why - strlen(why), "; the %.0f s request budget is spent",
                     s->request_budget_s);
            break;
        }
        vf_log(VF_LOG_INFO, "%s: %s; retry %d/%d in %.2f s", x->display, why, attempt, s->max_attempts - 1, delay);
        atomic_fetch_add(&c->retries, 1);
        sleep_seconds(delay);
    }
    target_free(&t);
    if (r < 0)
        return r;
    if (v == DONE)
        return 0;
    double elapsed = vf_now_seconds() - t0;
    if (v == RETRY || attempt > 1)
        return vf_error(code, "%s: %s (gave up after %d attempt%s in %.1f s)", x->display, why, attempt,
                        attempt == 1 ? "" : "s", elapsed);
    return vf_error(code, "%s: %s", x->display, why);
}

static void xfer_init(xfer *x, vf_http_client *c, const char *url)
{
    memset(x, 0, sizeof *x);
    x->client = c;
    x->display = url;
    x->want = UINT64_MAX;
    x->known_size = UINT64_MAX;
    x->fd = -1;
}

/* ---- public requests ----------------------------------------------------------- */

int vf_http_head(vf_http_client *c, const char *url, uint64_t *size)
{
    *size = 0;
    xfer x;
    xfer_init(&x, c, url);
    x.head = 1;
    int r = perform(&x);
    /* Servers that refuse HEAD get the one-byte GET below. */
    if (r < 0 && !(r == VF_EIO && (x.status == 405 || x.status == 501)))
        return r;
    if (r == 0 && x.content_length >= 0) {
        *size = (uint64_t)x.content_length;
        return 0;
    }
    /* No length on HEAD (chunked, or HEAD unsupported): ask for one byte. */
    uint8_t one;
    xfer_init(&x, c, url);
    x.start = 0;
    x.want = 1;
    x.sink = SINK_MEMORY;
    x.mem = &one;
    r = perform(&x);
    if (r == VF_ERANGE) { /* 416 on an empty object */
        *size = 0;
        return 0;
    }
    if (r < 0)
        return r;
    if (x.status == 206 && x.cr_total_known) {
        *size = x.cr_total;
        return 0;
    }
    if (x.status == 200 && x.content_length >= 0) {
        *size = (uint64_t)x.content_length;
        return 0;
    }
    return vf_error(VF_EIO, "%s: the server reports no object size (no Content-Length or Content-Range)", url);
}

int vf_http_get(vf_http_client *c, const char *url, size_t max_bytes, uint8_t **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    vf_buf b = {0};
    xfer x;
    xfer_init(&x, c, url);
    x.sink = SINK_GROW;
    x.grow = &b;
    x.max_bytes = max_bytes;
    int r = perform(&x);
    if (r < 0) {
        vf_buf_free(&b);
        return r;
    }
    *len = b.len;
    *data = (uint8_t *)vf_buf_take_string(&b);
    return *data ? 0 : VF_ENOMEM;
}

static int get_range_known(vf_http_client *c, const char *url, uint64_t offset, void *buf, size_t len,
                           uint64_t known_size)
{
    if (len == 0)
        return 0;
    xfer x;
    xfer_init(&x, c, url);
    x.start = offset;
    x.want = len;
    x.known_size = known_size;
    x.sink = SINK_MEMORY;
    x.mem = buf;
    return perform(&x);
}

int vf_http_get_range(vf_http_client *c, const char *url, uint64_t offset, void *buf, size_t len)
{
    return get_range_known(c, url, offset, buf, len, UINT64_MAX);
}

int vf_http_download(vf_http_client *c, const char *url, const char *path, uint64_t expected_size, uint64_t *bytes)
{
    if (bytes)
        *bytes = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return vf_error(VF_EIO, "%s: cannot create %s: %s", url, path, strerror(errno));
    xfer x;
    xfer_init(&x, c, url);
    x.sink = SINK_FILE;
    x.fd = fd;
    x.known_size = expected_size;
    int r = perform(&x);
    if (r == 0 && expected_size != UINT64_MAX && x.delivered != expected_size)
        r = vf_error(VF_ECORRUPT, "%s: downloaded %llu bytes but the object has %llu", url,
                     (unsigned long long)x.delivered, (unsigned long long)expected_size);
    if (close(fd) < 0 && r == 0)
        r = vf_error(VF_EIO, "%s: closing %s failed: %s", url, path, strerror(errno));
    if (r < 0) {
        unlink(path);
        return r;
    }
    if (bytes)
        *bytes = x.delivered;
    return 0;
}

/* ---- S3 listing ------------------------------------------------------------------ */

/* Decodes XML character data [a, b) (the five entities and &#N; / &#xN;). */
static char *xml_text(const char *a, const char *b)
{
    vf_buf out = {0};
    int r = 0;
    while (a < b && r == 0) {
        if (*a != '&') {
            r = vf_buf_append_u8(&out, (uint8_t)*a++);
            continue;
        }
        const char *semi = memchr(a, ';', (size_t)(b - a));
        if (!semi || semi - a > 10) {
            r = vf_buf_append_u8(&out, (uint8_t)*a++);
            continue;
        }
        size_t n = (size_t)(semi - a - 1);
        const char *e = a + 1;
        unsigned long cp = 0;
        if (n == 3 && !strncmp(e, "amp", 3))
            cp = '&';
        else if (n == 2 && !strncmp(e, "lt", 2))
            cp = '<';
        else if (n == 2 && !strncmp(e, "gt", 2))
            cp = '>';
        else if (n == 4 && !strncmp(e, "quot", 4))
            cp = '"';
        else if (n == 4 && !strncmp(e, "apos", 4))
            cp = '\'';
        else if (n >= 2 && e[0] == '#') {
            char tmp[12];
            memcpy(tmp, e + 1, n - 1);
            tmp[n - 1] = '\0';
            char *end;
            cp = (tmp[0] == 'x' || tmp[0] == 'X') ? strtoul(tmp + 1, &end, 16) : strtoul(tmp, &end, 10);
            if (*end || cp == 0 || cp > 0x10FFFF)
                cp = 0;
        }
        if (!cp) {
            r = vf_buf_append_u8(&out, (uint8_t)*a++);
            continue;
        }
        uint8_t u[4];
        size_t k;
        if (cp < 0x80) {
            u[0] = (uint8_t)cp;
            k = 1;
        } else if (cp < 0x800) {
            u[0] = (uint8_t)(0xC0 | (cp >> 6));
            u[1] = (uint8_t)(0x80 | (cp & 0x3F));
            k = 2;
        } else if (cp < 0x10000) {
            u[0] = (uint8_t)(0xE0 | (cp >> 12));
            u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (uint8_t)(0x80 | (cp & 0x3F));
            k = 3;
        } else {
            u[0] = (uint8_t)(0xF0 | (cp >> 18));
            u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            u[3] = (uint8_t)(0x80 | (cp & 0x3F));
            k = 4;
        }
        r = vf_buf_append(&out, u, k);
        a = semi + 1;
    }
    if (r < 0) {
        vf_buf_free(&out);
        return NULL;
    }
    return vf_buf_take_string(&out);
}

/* The text of the first <tag>...</tag> inside [a, b), or NULL (not found). */
static const char *xml_find(const char *a, const char *b, const char *tag, const char **text_end)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *s = memmem(a, (size_t)(b - a), open, strlen(open));
    if (!s)
        return NULL;
    s += strlen(open);
    const char *e = memmem(s, (size_t)(b - s), close, strlen(close));
    if (!e)
        return NULL;
    *text_end = e;
    return s;
}

typedef struct name_list {
    char **names;
    size_t count, cap;
} name_list;

static int add_name(name_list *l, const char *name, size_t len)
{
    for (size_t i = 0; i < l->count; i++)
        if (strlen(l->names[i]) == len && !memcmp(l->names[i], name, len))
            return 0;
    if (l->count >= MAX_LIST_ENTRIES)
        return vf_error(VF_ERANGE, "more than %d entries in one listing", MAX_LIST_ENTRIES);
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **grown = vf_realloc(l->names, cap * sizeof *grown);
        if (!grown)
            return VF_ENOMEM;
        l->names = grown;
        l->cap = cap;
    }
    if (!(l->names[l->count] = vf_strndup(name, len)))
        return VF_ENOMEM;
    l->count++;
    return 0;
}

/* Adds the entries of one ListObjectsV2 page; *token gets the next
 * continuation token (NULL when the listing is complete). */
static int parse_list_page(const char *url, const char *xml, size_t len, const char *prefix, name_list *l,
                           char **token)
{
    *token = NULL;
    const char *end = xml + len;
    if (!memmem(xml, len, "<ListBucketResult", 17))
        return vf_error(VF_ECORRUPT, "%s: the listing is not a ListBucketResult document", url);
    size_t plen = strlen(prefix);
    int r = 0;
    static const char *const blocks[2][2] = {{"CommonPrefixes", "Prefix"}, {"Contents", "Key"}};
    for (int k = 0; k < 2 && r == 0; k++) {
        char open[32], close[32];
        snprintf(open, sizeof open, "<%s>", blocks[k][0]);
        snprintf(close, sizeof close, "</%s>", blocks[k][0]);
        const char *p = xml;
        while (r == 0 && (p = memmem(p, (size_t)(end - p), open, strlen(open))) != NULL) {
            const char *block_end = memmem(p, (size_t)(end - p), close, strlen(close));
            if (!block_end)
                return vf_error(VF_ECORRUPT, "%s: unclosed <%s> in the listing", url, blocks[k][0]);
            const char *text_end;
            const char *text = xml_find(p, block_end, blocks[k][1], &text_end);
            p = block_end + strlen(close);
            if (!text)
                continue;
            char *value = xml_text(text, text_end);
            if (!value)
                return VF_ENOMEM;
            size_t vlen = strlen(value);
            if (vlen > plen && !strncmp(value, prefix, plen)) {
                const char *name = value + plen;
                size_t nlen = vlen - plen;
                if (nlen && name[nlen - 1] == '/')
                    nlen--;
                if (nlen && !memchr(name, '/', nlen))
                    r = add_name(l, name, nlen);
            }
            free(value);
        }
    }
    const char *te;
    const char *trunc = xml_find(xml, end, "IsTruncated", &te);
    if (r == 0 && trunc && te - trunc == 4 && !strncmp(trunc, "true", 4)) {
        const char *tok = xml_find(xml, end, "NextContinuationToken", &te);
        if (!tok)
            return vf_error(VF_ECORRUPT, "%s: truncated listing without a continuation token", url);
        *token = xml_text(tok, te);
        if (!*token)
            return VF_ENOMEM;
    }
    return r;
}

int vf_http_list(vf_http_client *c, const char *url, char ***names, size_t *count)
{
    *names = NULL;
    *count = 0;
    vf_url u;
    int r = vf_url_parse(url, &u);
    if (r < 0)
        return r;
    if (strcmp(u.scheme, "s3") != 0) {
        vf_url_free(&u);
        return vf_error(VF_EUNSUPPORTED, "%s: HTTP has no directory listing (only s3:// URLs can be listed)", url);
    }
    /* prefix: the key with one trailing '/' (empty for the bucket root) */
    const char *key = u.path + 1;
    size_t klen = strlen(key);
    while (klen && key[klen - 1] == '/')
        klen--;
    char *prefix = klen ? vf_asprintf("%.*s/", (int)klen, key) : vf_strdup("");
    char *bucket_url = vf_asprintf("s3://%s/", u.host);
    vf_url_free(&u);
    name_list l = {0};
    char *token = NULL;
    if (!prefix || !bucket_url)
        r = VF_ENOMEM;
    for (int page = 0; r == 0; page++) {
        if (page >= MAX_LIST_PAGES) {
            r = vf_error(VF_ERANGE, "%s: more than %d listing pages", url, MAX_LIST_PAGES);
            break;
        }
        /* Query parameters sorted by name, AWS-encoded (signed as sent). */
        vf_buf q = {0};
        if (token) {
            r = vf_buf_printf(&q, "continuation-token=");
            if (r == 0)
                r = vf_aws_uri_encode(&q, token, strlen(token), 0);
            if (r == 0)
                r = vf_buf_append_u8(&q, '&');
        }
        if (r == 0)
            r = vf_buf_printf(&q, "delimiter=%%2F&list-type=2&prefix=");
        if (r == 0)
            r = vf_aws_uri_encode(&q, prefix, strlen(prefix), 0);
        char *query = r == 0 ? vf_buf_take_string(&q) : NULL;
        vf_buf_free(&q);
        if (r == 0 && !query)
            r = VF_ENOMEM;
        free(token);
        token = NULL;
        if (r < 0) {
            free(query);
            break;
        }
        vf_buf body = {0};
        xfer x;
        xfer_init(&x, c, bucket_url);
        x.query = query;
        x.sink = SINK_GROW;
        x.grow = &body;
        x.max_bytes = MAX_LIST_PAGE;
        r = perform(&x);
        free(query);
        if (r < 0) {
            r = vf_error_context(r, "listing %s", url);
        } else {
            char *text = vf_buf_take_string(&body);
            r = text ? parse_list_page(url, text, body.len ? body.len : strlen(text), prefix, &l, &token) : VF_ENOMEM;
            free(text);
        }
        vf_buf_free(&body);
        if (r < 0 || !token)
            break;
    }
    free(token);
    free(prefix);
    free(bucket_url);
    if (r == 0 && l.count == 0)
        r = vf_error(VF_ENOENT, "%s: nothing stored under this prefix", url);
    if (r < 0) {
        for (size_t i = 0; i < l.count; i++)
            free(l.names[i]);
        free(l.names);
        return r;
    }
    *names = l.names;
    *count = l.count;
    return 0;
}

/* ---- source ---------------------------------------------------------------------- */

typedef struct block {
    uint64_t index;
    uint64_t stamp;   /* LRU clock; 0 = empty */
    size_t len;
    uint8_t *data;
} block;

typedef struct http_source {
    vf_http_client *client;
    char *url;
    uint64_t size;
    size_t block_bytes;
    int num_blocks;
    pthread_mutex_t lock;
    uint64_t clock;
    block *blocks;
} http_source;

static void http_source_destroy(void *impl)
{
    http_source *s = impl;
    for (int i = 0; i < s->num_blocks; i++)
        free(s->blocks[i].data);
    free(s->blocks);
    pthread_mutex_destroy(&s->lock);
    vf_http_client_close(s->client);
    free(s->url);
    free(s);
}

/* Copies [offset, offset+n) of block idx into dst if cached; 1 on a hit. */
static int block_copy(http_source *s, uint64_t idx, uint64_t offset, uint8_t *dst, size_t n)
{
    int hit = 0;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->num_blocks; i++) {
        block *b = &s->blocks[i];
        if (b->stamp && b->index == idx) {
            memcpy(dst, b->data + (offset - idx * s->block_bytes), n);
            b->stamp = ++s->clock;
            hit = 1;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return hit;
}

static void block_insert(http_source *s, uint64_t idx, uint8_t *data, size_t len)
{
    pthread_mutex_lock(&s->lock);
    block *victim = &s->blocks[0];
    for (int i = 0; i < s->num_blocks; i++) {
        block *b = &s->blocks[i];
        if (b->stamp && b->index == idx) { /* another thread was first */
            victim = NULL;
            break;
        }
        if (b->stamp < victim->stamp)
            victim = b;
    }
    if (victim) {
        free(victim->data);
        victim->data = data;
        victim->len = len;
        victim->index = idx;
        victim->stamp = ++s->clock;
        data = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    free(data);
}

static int64_t http_source_read(void *impl, uint64_t offset, void *buf, size_t len)
{
    http_source *s = impl;
    if (offset >= s->size)
        return 0;
    if (len > s->size - offset)
        len = (size_t)(s->size - offset);
    if (len == 0)
        return 0;
    if (len >= s->block_bytes) {
        int r = get_range_known(s->client, s->url, offset, buf, len, s->size);
        return r < 0 ? r : (int64_t)len;
    }
    uint8_t *dst = buf;
    size_t done = 0;
    while (done < len) {
        uint64_t at = offset + done;
        uint64_t idx = at / s->block_bytes;
        uint64_t block_start = idx * s->block_bytes;
        size_t block_len = (size_t)VF_MIN((uint64_t)s->block_bytes, s->size - block_start);
        size_t n = (size_t)VF_MIN((uint64_t)(len - done), block_start + block_len - at);
        if (block_copy(s, idx, at, dst + done, n)) {
            atomic_fetch_add(&s->client->block_hits, 1);
        } else {
            atomic_fetch_add(&s->client->block_misses, 1);
            uint8_t *data = vf_malloc(block_len);
            if (!data)
                return VF_ENOMEM;
            int r = get_range_known(s->client, s->url, block_start, data, block_len, s->size);
            if (r < 0) {
                free(data);
                return r;
            }
            memcpy(dst + done, data + (at - block_start), n);
            block_insert(s, idx, data, block_len);
        }
        done += n;
    }
    return (int64_t)len;
}

int vf_http_open_source(vf_http_client *c, const char *url, uint64_t known_size, vf_source **out)
{
    *out = NULL;
    uint64_t size = known_size;
    int r = 0;
    if (size == UINT64_MAX && (r = vf_http_head(c, url, &size)) < 0)
        return r;
    http_source *s = vf_calloc(1, sizeof *s);
    if (!s)
        return VF_ENOMEM;
    s->url = vf_strdup(url);
    s->num_blocks = c->settings.cache_blocks;
    s->blocks = vf_calloc((size_t)s->num_blocks, sizeof *s->blocks);
    if (!s->url || !s->blocks) {
        free(s->url);
        free(s->blocks);
        free(s);
        return VF_ENOMEM;
    }
    s->client = vf_http_client_ref(c);
    s->size = size;
    s->block_bytes = c->settings.block_bytes;
    pthread_mutex_init(&s->lock, NULL);
    static const vf_source_ops ops = {http_source_read, http_source_destroy, NULL, NULL};
    r = vf_source_create(out, url, size, &ops, s);
    if (r < 0)
        http_source_destroy(s);
    return r;
}

int vf_source_open_url(vf_source **out, const char *url, const vf_http_settings *settings)
{
    *out = NULL;
    vf_http_client *c;
    int r = vf_http_client_open(&c, settings);
    if (r < 0)
        return r;
    r = vf_http_open_source(c, url, UINT64_MAX, out);
    vf_http_client_close(c);
    return r;
}
