/*
 * http_request.c: one HTTP(S) or S3 request through libcurl, and the public
 * requests (HEAD, whole GET, range GET, download to a file) built on it.
 *
 * Every request runs the same attempt loop (vf_http_perform):
 *  - an attempt has connect and low-speed timeouts, and a total timeout of
 *    what is left of the request's budget, so nothing hangs;
 *  - 5xx (but 501 and 505), 408, 429, failed connections, resets,
 *    timeouts and truncated bodies are retried: the wait is drawn from [0, min(cap, base * 2^n))
 *    ("full jitter", so clients that failed together do not retry
 *    together) by a generator private to the request (seeded from
 *    retry_seed when set), or is the server's Retry-After
 *    (seconds or HTTP-date) when it sends one, never above the cap. Retries
 *    stop when the next wait would pass the request's time budget
 *    (request_budget_s, 300 s by default: outages of a few minutes are
 *    ridden out) or at max_attempts;
 *  - bytes already received are kept and the next attempt asks only for
 *    the rest (Range from the exact next byte); the answer must start at
 *    that byte (Content-Range) and be of the same object: a changed ETag
 *    (when the server sends one) drops what was kept and reads everything
 *    again, a changed total size (learned from the first answer when not
 *    known) fails the request. A request therefore yields exactly the
 *    bytes asked for, of one version of the object, or an error;
 *  - 404/410 is VF_ENOENT and other 4xx VF_EIO, neither retried; every
 *    message names the URL (s3://... as the user wrote it; credentials in
 *    a query string redacted), the last HTTP status or transport error,
 *    and, after retries, the attempts made, the time taken and what ran
 *    out;
 *  - a request watches the cancellation token of the thread that starts
 *    it (io.h): once the token is requested, no attempt starts, the wait
 *    between attempts ends (it sleeps in short slices) and a transfer in
 *    progress is aborted by the progress callback; the request then fails
 *    with VF_EIO, "cancelled", and what it had received is dropped.
 * Responses are parsed defensively: the header bytes of one response are
 * bounded (MAX_HEADER_BYTES); a Content-Range must read "bytes a-b/total"
 * with a the requested start, b inside the request and total the known
 * size; a 200 answer to a range request is accepted by skipping to the
 * wanted bytes (a server without range support still works, slowly).
 *
 * s3:// URLs are resolved per request into the http(s) URL sent (virtual-
 * hosted or path-style, custom endpoints with a base path) and signed with
 * SigV4 when the client has credentials.
 */
#define _GNU_SOURCE
#include "io/http_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADER_BYTES (64 * 1024)  /* per response */
#define OUTAGE_WARN_S 10.0            /* a request retrying this long says so (once) */
#define RETRY_TAG 0x7265747279ull     /* "retry": the purpose of the jitter generator's key */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

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

static void parse_content_range(vf_http_xfer *x, const char *v, const char *end)
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

/* Forgets the status line and headers parsed so far (a new response). */
static void reset_response(vf_http_xfer *x)
{
    x->status = 0;
    x->reason[0] = '\0';
    x->content_length = -1;
    x->has_content_range = x->content_range_bad = x->cr_total_known = 0;
    x->retry_after_s = -1;
    x->etag[0] = '\0';
    x->header_bytes = 0;
}

/* Retry-After: delay-seconds or an HTTP-date (RFC 9110 10.2.3); -1 when
 * unreadable. A date in the past is 0. */
static double parse_retry_after(const char *v, const char *end)
{
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (v < end && *v >= '0' && *v <= '9') {
        uint64_t n;
        if (parse_u64(&v, end, &n) < 0 || v != end)
            return -1;
        return n > 86400 * 365 ? 86400.0 * 365 : (double)n;
    }
    char date[64];
    size_t n = (size_t)(end - v);
    if (n == 0 || n >= sizeof date)
        return -1;
    memcpy(date, v, n);
    date[n] = '\0';
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!rest || *rest)
        return -1;
    double wait = difftime(timegm(&tm), time(NULL));
    return wait > 0 ? wait : 0;
}

/* The header value [v, end) without surrounding blanks, printable bytes only. */
static void copy_header_value(const char *v, const char *end, char *out, size_t cap)
{
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t n = VF_MIN((size_t)(end - v), cap - 1);
    for (size_t i = 0; i < n; i++)
        out[i] = (v[i] >= ' ' && v[i] < 0x7f) ? v[i] : '?';
    out[n] = '\0';
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg)
{
    vf_http_xfer *x = arg;
    size_t len = size * nmemb;
    if (len >= 5 && !strncmp(data, "HTTP/", 5)) {
        /* A new response (redirects, 100 Continue): reset what we parsed. */
        reset_response(x);
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
    } else if (header_name_is(data, len, "retry-after")) {
        x->retry_after_s = parse_retry_after(data + 12, end);
    } else if (header_name_is(data, len, "etag")) {
        copy_header_value(data + 5, end, x->etag, sizeof x->etag);
    }
    return len;
}

/* Records why the body was refused. retryable: another attempt may get a
 * good answer (a misplaced or malformed range: a proxy glitch?); limits,
 * memory, local disk errors and a changed object are final. */
static int sink_fail(vf_http_xfer *x, int code, int retryable, const char *fmt, ...) VF_PRINTF(4, 5);
static int sink_fail(vf_http_xfer *x, int code, int retryable, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->sink_message, sizeof x->sink_message, fmt, ap);
    va_end(ap);
    x->sink_error = code;
    x->sink_retryable = retryable;
    return code;
}

/* Stores body bytes at object offset `at` (only the wanted part). */
static int sink_put(vf_http_xfer *x, uint64_t at, const uint8_t *p, size_t n)
{
    uint64_t next = x->start + x->delivered; /* the next wanted byte */
    uint64_t end = x->want == UINT64_MAX ? UINT64_MAX : x->start + x->want;
    if (at + n <= next || at >= end)
        return 0;
    if (at > next)
        return sink_fail(x, VF_EIO, 0, "body skipped bytes (offset %llu, expected %llu)", (unsigned long long)at,
                         (unsigned long long)next);
    size_t skip = (size_t)(next - at);
    p += skip;
    n -= skip;
    if (end != UINT64_MAX && n > end - next)
        n = (size_t)(end - next);
    switch (x->sink) {
    case VF_HTTP_SINK_MEMORY:
        memcpy(x->mem + x->delivered, p, n);
        break;
    case VF_HTTP_SINK_GROW:
        if (x->grow->len + n > x->max_bytes)
            return sink_fail(x, VF_ERANGE, 0, "larger than the %zu-byte limit", x->max_bytes);
        if (vf_buf_append(x->grow, p, n) < 0)
            return sink_fail(x, VF_ENOMEM, 0, "out of memory");
        break;
    case VF_HTTP_SINK_FILE: {
        size_t done = 0;
        while (done < n) {
            ssize_t w = pwrite(x->fd, p + done, n - done, (off_t)(x->delivered + done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return sink_fail(x, VF_EIO, 0, "write to the local file failed: %s", strerror(errno));
            done += (size_t)w;
        }
        break;
    }
    case VF_HTTP_SINK_NONE:
        break;
    }
    x->delivered += n;
    if (x->known_size != UINT64_MAX && x->start + x->delivered > x->known_size)
        return sink_fail(x, VF_ECORRUPT, 0, "the body is longer than the object's %llu bytes",
                         (unsigned long long)x->known_size);
    return 0;
}

/* Checks the first body bytes of a 2xx answer against what is wanted and
 * what earlier attempts kept; -1 (sink error set) refuses the answer. */
static int body_start(vf_http_xfer *x)
{
    uint64_t asked = x->start + x->delivered;
    /* Bytes already kept must be of the same object version: when the ETag
     * changed, the object is read again from the start (never a mix). */
    if (x->delivered > 0 && x->etag[0] && x->first_etag[0] && strcmp(x->etag, x->first_etag) != 0) {
        x->restart = 1;
        sink_fail(x, VF_ECORRUPT, 1, "the object changed while it was read (ETag %s, was %s)", x->etag,
                  x->first_etag);
        return -1;
    }
    if (x->status == 206) {
        if (!x->has_content_range || x->content_range_bad) {
            sink_fail(x, VF_ECORRUPT, 1, "206 response with a missing or malformed Content-Range");
            return -1;
        }
        uint64_t last_wanted = x->want == UINT64_MAX ? UINT64_MAX : x->start + x->want - 1;
        if (x->cr_first != asked || x->cr_last > last_wanted) {
            sink_fail(x, VF_ECORRUPT, 1, "Content-Range %llu-%llu does not match the requested range %llu-%s",
                      (unsigned long long)x->cr_first, (unsigned long long)x->cr_last, (unsigned long long)asked,
                      x->want == UINT64_MAX ? "" : "(bounded)");
            return -1;
        }
        if (x->cr_total_known && x->known_size != UINT64_MAX && x->cr_total != x->known_size) {
            sink_fail(x, VF_ECORRUPT, 0, "the object changed size (%llu bytes, was %llu)",
                      (unsigned long long)x->cr_total, (unsigned long long)x->known_size);
            return -1;
        }
        x->body_base = x->cr_first;
    } else {
        /* A 200: the whole object from offset 0, whatever we asked. */
        if (asked > 0 && atomic_exchange(&x->client->warned_no_range, 1) == 0)
            vf_log(VF_LOG_WARN, "%s: the server ignores Range requests; whole objects are read", x->display);
        if (x->known_size != UINT64_MAX && x->content_length >= 0 && (uint64_t)x->content_length != x->known_size) {
            sink_fail(x, VF_ECORRUPT, 0, "the object changed size (%lld bytes, was %llu)",
                      (long long)x->content_length, (unsigned long long)x->known_size);
            return -1;
        }
        x->body_base = 0;
    }
    if (x->delivered == 0)
        memcpy(x->first_etag, x->etag, sizeof x->etag);
    /* The object's size, when not known, from this first answer: a resumed
     * attempt must then report the same. */
    if (x->known_size == UINT64_MAX) {
        if (x->status == 206 && x->cr_total_known)
            x->known_size = x->cr_total;
        else if (x->status != 206 && x->content_length >= 0)
            x->known_size = (uint64_t)x->content_length;
        x->size_learned = x->known_size != UINT64_MAX;
    }
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    vf_http_xfer *x = arg;
    size_t len = size * nmemb;
    if (x->status < 200 || x->status > 299) {
        size_t room = VF_HTTP_MAX_ERROR_BODY - x->error_body_len;
        size_t n = VF_MIN(room, len);
        memcpy(x->error_body + x->error_body_len, data, n);
        x->error_body_len += n;
        x->error_body[x->error_body_len] = '\0';
        return len;
    }
    if (!x->body_started) {
        x->body_started = 1;
        if (body_start(x) < 0)
            return 0;
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

/* libcurl's progress callback: a non-zero answer aborts the transfer
 * (CURLE_ABORTED_BY_CALLBACK). Called at least about once a second, also
 * while nothing arrives. */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    const vf_http_xfer *x = arg;
    return vf_io_cancel_requested(x->cancel);
}

/* The key of a request's jitter generator: from retry_seed when it is set
 * (every request then draws the same waits, run after run: tests), else a
 * fresh one per request. */
static uint64_t jitter_key(vf_http_client *c)
{
    if (c->settings.retry_seed)
        return vf_rng_derive(c->settings.retry_seed, RETRY_TAG, 0, 0, 0);
    return vf_mix64(atomic_fetch_add(&c->jitter_counter, 0x9E3779B97F4A7C15ull));
}

static void amz_now(char out[17])
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* Headers of one attempt (Range, S3 signature). */
static int attempt_headers(vf_http_xfer *x, const target *t, struct curl_slist **list)
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

static void reset_attempt(vf_http_xfer *x)
{
    reset_response(x);
    x->header_overflow = 0;
    x->body_started = 0;
    x->body_base = x->body_seen = 0;
    x->done_early = 0;
    x->sink_error = 0;
    x->sink_retryable = 0;
    x->restart = 0;
    x->sink_message[0] = '\0';
    x->error_body_len = 0;
    x->error_body[0] = '\0';
}

/* Drops what earlier attempts kept (the object changed under them): the
 * next attempt reads everything again. */
static int forget_progress(vf_http_xfer *x)
{
    x->delivered = 0;
    x->first_etag[0] = '\0';
    if (x->size_learned) {
        x->known_size = UINT64_MAX;
        x->size_learned = 0;
    }
    if (x->sink == VF_HTTP_SINK_FILE && ftruncate(x->fd, 0) < 0)
        return vf_error(VF_EIO, "%s: truncating the local file failed: %s", x->display, strerror(errno));
    return 0;
}

/* Judges one finished attempt; on FAIL or RETRY writes why into why. */
static verdict judge(vf_http_xfer *x, CURLcode rc, const char *curl_message, int *code, char *why, size_t cap)
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
        return x->sink_retryable ? RETRY : FAIL;
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
        /* Transient: timeouts, throttling, server errors; but 501 Not
         * Implemented and 505 HTTP Version Not Supported are answers (a
         * server refusing HEAD with 501 gets a GET at once). */
        return (st == 408 || st == 429 || (st >= 500 && st != 501 && st != 505)) ? RETRY : FAIL;
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

int vf_http_perform(vf_http_xfer *x)
{
    vf_http_client *c = x->client;
    const vf_http_settings *s = &c->settings;
    char *shown = vf_http_redact_url(x->url);
    if (!shown)
        return VF_ENOMEM;
    x->display = shown;
    target t;
    int r = resolve(c, x->url, x->query, &t);
    if (r < 0) {
        x->display = x->url;
        free(shown);
        return r;
    }
    vf_rng jitter;
    vf_rng_init(&jitter, jitter_key(c));
    double t0 = vf_now_seconds();
    char why[512] = "";
    /* what ended the retries */
    enum { RAN_NOTHING, RAN_ATTEMPTS, RAN_BUDGET, CANCELLED } ran_out = RAN_NOTHING;
    int code = VF_EIO, attempt = 0, warned = 0;
    verdict v = FAIL;
    for (;;) {
        if (vf_io_cancel_requested(x->cancel)) {
            ran_out = CANCELLED;
            break;
        }
        attempt++;
        reset_attempt(x);
        if (x->sink == VF_HTTP_SINK_GROW && x->delivered == 0)
            x->grow->len = 0;
        double left = s->request_budget_s - (vf_now_seconds() - t0);
        CURL *h = vf_http_take_handle(c);
        struct curl_slist *headers = NULL;
        if (!h) {
            r = vf_error(VF_ENOMEM, "%s: cannot create a curl handle", shown);
            break;
        }
        if ((r = attempt_headers(x, &t, &headers)) < 0) {
            vf_http_give_handle(c, h);
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
        if (x->cancel) {
            curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
            curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
            curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        }
        atomic_fetch_add(&c->requests, 1);
        CURLcode rc = curl_easy_perform(h);
        if (x->status == 0) {
            long st = 0;
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
            x->status = st;
        }
        curl_slist_free_all(headers);
        vf_http_give_handle(c, h);
        if (rc == CURLE_ABORTED_BY_CALLBACK && vf_io_cancel_requested(x->cancel)) {
            ran_out = CANCELLED;
            break;
        }
        v = judge(x, rc, curl_message, &code, why, sizeof why);
        if (v == RETRY && x->restart && (r = forget_progress(x)) < 0)
            break;
        if (v != RETRY)
            break;
        if (attempt >= s->max_attempts) {
            ran_out = RAN_ATTEMPTS;
            break;
        }
        /* The wait: the server's Retry-After if it gave one, else a draw
         * from the exponential window; never above the cap. */
        int server_wait = x->retry_after_s >= 0;
        double wait = server_wait ? VF_MIN(x->retry_after_s, s->backoff_max_s)
                                  : vf_http_backoff_delay(s, attempt, vf_rng_uniform(&jitter));
        double elapsed = vf_now_seconds() - t0;
        if (elapsed + wait >= s->request_budget_s) {
            ran_out = RAN_BUDGET;
            break;
        }
        if (!warned && elapsed + wait >= OUTAGE_WARN_S) {
            warned = 1;
            vf_log(VF_LOG_WARN, "%s: %s after %d attempts over %.0f s; next try in %.1f s (retrying for up to %g s)",
                   shown, why, attempt, elapsed, wait, s->request_budget_s);
        }
        vf_log(VF_LOG_INFO, "%s: %s; retry %d in %.2f s%s", shown, why, attempt, wait,
               server_wait ? " (Retry-After)" : "");
        atomic_fetch_add(&c->retries, 1);
        if (vf_io_cancel_sleep(x->cancel, wait)) {
            ran_out = CANCELLED;
            break;
        }
    }
    target_free(&t);
    x->display = x->url;
    if (r < 0) {
        free(shown);
        return r;
    }
    if (v == DONE) {
        free(shown);
        return 0;
    }
    double elapsed = vf_now_seconds() - t0;
    if (ran_out == CANCELLED && why[0])
        r = vf_error(VF_EIO, "%s: cancelled after %d attempt%s in %.1f s (the last failed: %s)", shown, attempt,
                     attempt == 1 ? "" : "s", elapsed, why);
    else if (ran_out == CANCELLED)
        r = vf_error(VF_EIO, "%s: cancelled after %d attempt%s in %.1f s", shown, attempt, attempt == 1 ? "" : "s",
                     elapsed);
    else if (ran_out == RAN_BUDGET)
        r = vf_error(code, "%s: %s (gave up after %d attempt%s in %.1f s: the %g s retry budget is spent)", shown, why,
                     attempt, attempt == 1 ? "" : "s", elapsed, s->request_budget_s);
    else if (ran_out == RAN_ATTEMPTS)
        r = vf_error(code, "%s: %s (gave up after %d attempt%s in %.1f s: the attempt limit)", shown, why, attempt,
                     attempt == 1 ? "" : "s", elapsed);
    else if (attempt > 1)
        r = vf_error(code, "%s: %s (after %d attempts in %.1f s)", shown, why, attempt, elapsed);
    else
        r = vf_error(code, "%s: %s", shown, why);
    free(shown);
    return r;
}

void vf_http_xfer_init(vf_http_xfer *x, vf_http_client *c, const char *url)
{
    memset(x, 0, sizeof *x);
    x->client = c;
    x->url = url;
    x->display = url;
    x->want = UINT64_MAX;
    x->known_size = UINT64_MAX;
    x->fd = -1;
    x->cancel = vf_io_cancel_watched();
}

/* ---- public requests ----------------------------------------------------------- */

/* An error naming url as messages show it (credentials redacted). */
static int url_error(int code, const char *url, const char *fmt, ...) VF_PRINTF(3, 4);
static int url_error(int code, const char *url, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char *shown = vf_http_redact_url(url);
    int r = vf_error(code, "%s: %s", shown ? shown : "(URL)", what);
    free(shown);
    return r;
}

int vf_http_head_status(vf_http_client *c, const char *url, uint64_t *size, long *status)
{
    *size = 0;
    vf_http_xfer x;
    vf_http_xfer_init(&x, c, url);
    x.head = 1;
    int r = vf_http_perform(&x);
    *status = x.status;
    /* Servers that refuse HEAD get the one-byte GET below. */
    if (r < 0 && !(r == VF_EIO && (x.status == 405 || x.status == 501)))
        return r;
    if (r == 0 && x.content_length >= 0) {
        *size = (uint64_t)x.content_length;
        return 0;
    }
    /* No length on HEAD (chunked, or HEAD unsupported): ask for one byte. */
    uint8_t one;
    vf_http_xfer_init(&x, c, url);
    x.start = 0;
    x.want = 1;
    x.sink = VF_HTTP_SINK_MEMORY;
    x.mem = &one;
    r = vf_http_perform(&x);
    *status = x.status;
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
    return url_error(VF_EIO, url, "the server reports no object size (no Content-Length or Content-Range)");
}

int vf_http_head(vf_http_client *c, const char *url, uint64_t *size)
{
    long status;
    return vf_http_head_status(c, url, size, &status);
}

int vf_http_get(vf_http_client *c, const char *url, size_t max_bytes, uint8_t **data, size_t *len)
{
    if (vf_node_cache_dir()) { /* one download per node (filecache.c); 1: not cached, read remotely */
        int nr = vf_node_cache_get(c, url, max_bytes, data, len);
        if (nr <= 0)
            return nr;
    }
    *data = NULL;
    *len = 0;
    vf_buf b = {0};
    vf_http_xfer x;
    vf_http_xfer_init(&x, c, url);
    x.sink = VF_HTTP_SINK_GROW;
    x.grow = &b;
    x.max_bytes = max_bytes;
    int r = vf_http_perform(&x);
    if (r < 0) {
        vf_buf_free(&b);
        return r;
    }
    *len = b.len;
    *data = (uint8_t *)vf_buf_take_string(&b);
    return *data ? 0 : VF_ENOMEM;
}

int vf_http_get_range_known(vf_http_client *c, const char *url, uint64_t offset, void *buf, size_t len,
                            uint64_t known_size)
{
    if (len == 0)
        return 0;
    vf_http_xfer x;
    vf_http_xfer_init(&x, c, url);
    x.start = offset;
    x.want = len;
    x.known_size = known_size;
    x.sink = VF_HTTP_SINK_MEMORY;
    x.mem = buf;
    return vf_http_perform(&x);
}

int vf_http_get_range(vf_http_client *c, const char *url, uint64_t offset, void *buf, size_t len)
{
    return vf_http_get_range_known(c, url, offset, buf, len, UINT64_MAX);
}

int vf_http_download(vf_http_client *c, const char *url, const char *path, uint64_t expected_size, uint64_t *bytes)
{
    if (bytes)
        *bytes = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return url_error(VF_EIO, url, "cannot create %s: %s", path, strerror(errno));
    vf_http_xfer x;
    vf_http_xfer_init(&x, c, url);
    x.sink = VF_HTTP_SINK_FILE;
    x.fd = fd;
    x.known_size = expected_size;
    int r = vf_http_perform(&x);
    if (r == 0 && expected_size != UINT64_MAX && x.delivered != expected_size)
        r = url_error(VF_ECORRUPT, url, "downloaded %llu bytes but the object has %llu",
                      (unsigned long long)x.delivered, (unsigned long long)expected_size);
    if (close(fd) < 0 && r == 0)
        r = url_error(VF_EIO, url, "closing %s failed: %s", path, strerror(errno));
    if (r < 0) {
        unlink(path);
        return r;
    }
    if (bytes)
        *bytes = x.delivered;
    return 0;
}

