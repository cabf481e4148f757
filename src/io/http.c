/*
 * http.c: HTTP(S) and S3 objects through libcurl, the client side: URL
 * parsing and redaction for messages, settings (defaults, environment
 * overrides, limits) and the retry wait window, the client
 * (S3 endpoint, region, credentials and addressing; a locked pool of
 * reusable curl handles; atomic counters), and a vf_source over an object
 * with a small read-ahead block cache. Requests themselves are in
 * http_request.c, S3 listings in http_s3_list.c.
 *
 * Threads: a client is shared by reference count; every request borrows a
 * curl handle from the pool and returns it, so connections are reused and
 * no handle is ever driven by two threads at once.
 *
 * Source: a read shorter than block_bytes is served from aligned blocks in
 * a small LRU (one range GET fills one block), so a Parquet footer or the
 * demuxer's 64 KiB reads cost one request per block; a longer read is one
 * range GET of its own. The block table is locked, but fetches run outside
 * the lock (two threads missing the same block may both fetch it; the
 * second copy is dropped).
 */
#define _GNU_SOURCE
#include "io/http_internal.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

/* 1 if a query parameter named [name, name + len) carries a credential:
 * X-Amz-Signature / X-Amz-Credential / X-Amz-Security-Token (presigned S3),
 * X-Goog-Signature, Azure's sig, Signature and Key-Pair-Id (CloudFront),
 * access_token, api_key, ... */
static int secret_param(const char *name, size_t len)
{
    static const char *const words[] = {"sig", "token", "key", "secret", "password", "credential", "auth", "session"};
    for (size_t w = 0; w < VF_ARRAY_LEN(words); w++) {
        size_t wl = strlen(words[w]);
        for (size_t i = 0; i + wl <= len; i++)
            if (!strncasecmp(name + i, words[w], wl))
                return 1;
    }
    return 0;
}

char *vf_http_redact_url(const char *url)
{
    const char *q = strchr(url, '?');
    if (!q)
        return vf_strdup(url);
    const char *end = q + 1 + strcspn(q + 1, "#");
    vf_buf b = {0};
    int r = vf_buf_append(&b, url, (size_t)(q + 1 - url));
    for (const char *p = q + 1; r == 0 && p < end;) {
        const char *stop = memchr(p, '&', (size_t)(end - p));
        if (!stop)
            stop = end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        if (eq && secret_param(p, (size_t)(eq - p))) {
            r = vf_buf_append(&b, p, (size_t)(eq + 1 - p));
            if (r == 0)
                r = vf_buf_append(&b, "REDACTED", 8);
        } else {
            r = vf_buf_append(&b, p, (size_t)(stop - p));
        }
        if (r == 0 && stop < end)
            r = vf_buf_append_u8(&b, '&');
        p = stop + 1;
    }
    if (r == 0)
        r = vf_buf_append(&b, end, strlen(end));
    char *out = r == 0 ? vf_buf_take_string(&b) : NULL;
    vf_buf_free(&b);
    return out;
}

/* ---- settings and client ------------------------------------------------- */

void vf_http_defaults(vf_http_settings *s)
{
    memset(s, 0, sizeof *s);
    /* Retries: an outage of a few minutes is ridden out, one longer ends
     * the request with an error (request_budget_s); attempts do not bind
     * first (about 25 fit in 300 s with these waits). */
    s->max_attempts = 100;
    s->backoff_initial_s = 0.2;
    s->backoff_max_s = 30.0;
    s->request_budget_s = 300.0;
    s->retry_seed = 0;
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
        {"VF_HTTP_ATTEMPTS", 1, 10000, 0},       {"VF_HTTP_BUDGET_S", 0.01, 86400, 1},
        {"VF_HTTP_BACKOFF_S", 0, 60, 2},          {"VF_HTTP_BACKOFF_MAX_S", 0, 600, 3},
        {"VF_HTTP_CONNECT_TIMEOUT_S", 0.01, 600, 4}, {"VF_HTTP_LOW_SPEED_TIME_S", 0, 3600, 5},
        {"VF_HTTP_BLOCK_BYTES", 4096, 64 << 20, 6}, {"VF_HTTP_RETRY_SEED", 0, 9007199254740991.0, 7},
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
        case 7: s->retry_seed = (uint64_t)x; break;
        }
    }
}

double vf_http_backoff_delay(const vf_http_settings *s, int attempt, double u)
{
    if (attempt < 1)
        attempt = 1;
    double cap = s->backoff_max_s > 0 ? s->backoff_max_s : 0;
    double window = s->backoff_initial_s > 0 ? s->backoff_initial_s : 0;
    for (int i = 1; i < attempt && window < cap; i++)
        window *= 2;
    if (window > cap)
        window = cap;
    if (!(u >= 0)) /* NaN too */
        u = 0;
    if (u >= 1)
        u = 0.999999;
    return window * u;
}

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

/* v brought into [lo, hi] (settings out of range are limited, not refused). */
static int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
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
    s->max_attempts = clamp_int(s->max_attempts, 1, 10000);
    if (!(s->backoff_initial_s >= 0))
        s->backoff_initial_s = 0;
    if (!(s->backoff_max_s >= 0))
        s->backoff_max_s = 0;
    if (s->block_bytes < 4096)
        s->block_bytes = 4096;
    if (s->block_bytes > (64u << 20))
        s->block_bytes = 64u << 20;
    s->cache_blocks = clamp_int(s->cache_blocks, 1, 256);
    if (s->max_idle_handles < 0)
        s->max_idle_handles = 0;
    if (!(s->request_budget_s > 0))
        s->request_budget_s = 300;
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

CURL *vf_http_take_handle(vf_http_client *c)
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

void vf_http_give_handle(vf_http_client *c, CURL *h)
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
        int r = vf_http_get_range_known(s->client, s->url, offset, buf, len, s->size);
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
            int r = vf_http_get_range_known(s->client, s->url, block_start, data, block_len, s->size);
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
    if (vf_node_cache_dir()) { /* one download per node (filecache.c); 1: not cached, read remotely */
        int nr = vf_node_cache_open_source(c, url, known_size, out);
        if (nr <= 0)
            return nr;
    }
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
    char *name = vf_http_redact_url(url); /* the name shows in messages */
    r = name ? vf_source_create(out, name, size, &ops, s) : VF_ENOMEM;
    free(name);
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
