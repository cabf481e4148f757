/*
 * test_http.c: the HTTP/S3 layer without a real server farm: URL parsing,
 * AWS SigV4 against AWS's published examples (the get-vanilla case of the
 * SigV4 test suite and the S3 GetObject example), query canonicalisation,
 * backoff bounds, and requests against a canned loopback server: range
 * reads, Content-Range validation, retries on 500 and truncated bodies
 * (resuming where the body broke), 404, oversized headers, servers that
 * ignore Range, stalls against the request budget, refused connections,
 * S3 request signing and listing, and errors that name the URL.
 * The retry policy: which statuses are retried (408, 429, 5xx) and which
 * are not (other 4xx: one attempt), a connection reset mid-body resuming
 * at the exact byte, an object that changed between attempts read again
 * whole, Retry-After (seconds and HTTP-date, capped) by the server's
 * timestamps, a budget set from the environment running out with a
 * message naming the URL (credentials redacted), the last status, the
 * attempts and the time, and a 3.5 s outage ridden out with the defaults.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/io.h"
#include "testutil.h"
#include "test_http_helpers.h"

/* ---- URL parsing ------------------------------------------------------------ */

static void test_url_parse(void)
{
    vf_url u;
    CHECK_OK(vf_url_parse("http://127.0.0.1:8080/ds/meta/info.json?x=1#frag", &u));
    CHECK(!strcmp(u.scheme, "http"));
    CHECK(!strcmp(u.host, "127.0.0.1"));
    CHECK_EQ_INT(u.port, 8080);
    CHECK(!strcmp(u.path, "/ds/meta/info.json"));
    CHECK(u.query && !strcmp(u.query, "x=1"));
    vf_url_free(&u);

    CHECK_OK(vf_url_parse("HTTPS://example.com", &u));
    CHECK(!strcmp(u.scheme, "https"));
    CHECK_EQ_INT(u.port, 0);
    CHECK(!strcmp(u.path, "/"));
    CHECK(u.query == NULL);
    vf_url_free(&u);

    CHECK_OK(vf_url_parse("http://[::1]:9000/a", &u));
    CHECK(!strcmp(u.host, "::1"));
    CHECK_EQ_INT(u.port, 9000);
    vf_url_free(&u);

    CHECK_OK(vf_url_parse("s3://my-bucket/datasets/g1/meta/info.json", &u));
    CHECK(!strcmp(u.scheme, "s3"));
    CHECK(!strcmp(u.host, "my-bucket"));
    CHECK(!strcmp(u.path, "/datasets/g1/meta/info.json"));
    vf_url_free(&u);

    CHECK(vf_is_url("s3://b/k") && vf_is_url("http://h") && vf_is_url("HTTPS://h"));
    CHECK(!vf_is_url("/data/ds") && !vf_is_url("ftp://h/x") && !vf_is_url(NULL));

    CHECK_ERR(vf_url_parse("ftp://host/x", &u), VF_EINVAL, "ftp://host/x: not a URL");
    CHECK_ERR(vf_url_parse("http:///path", &u), VF_EINVAL, "no host");
    CHECK_ERR(vf_url_parse("s3:///key", &u), VF_EINVAL, "no bucket");
    CHECK_ERR(vf_url_parse("http://host:99999/", &u), VF_EINVAL, "port");
    CHECK_ERR(vf_url_parse("http://host:12a/", &u), VF_EINVAL, "bad port");
    CHECK_ERR(vf_url_parse("http://host:/", &u), VF_EINVAL, "empty port");
    CHECK_ERR(vf_url_parse("http://user:pw@host/", &u), VF_EINVAL, "user information");
    CHECK_ERR(vf_url_parse("http://ho st/", &u), VF_EINVAL, "space or control");
    CHECK_ERR(vf_url_parse("http://[::1/", &u), VF_EINVAL, "unclosed");
}

/* ---- SigV4 -------------------------------------------------------------------- */

static void test_sigv4_get_vanilla(void)
{
    /* AWS SigV4 test suite, get-vanilla: GET / with Host and X-Amz-Date,
     * service "service", region us-east-1, the suite's example keys. */
    vf_sigv4_header h[] = {{"x-amz-date", "20150830T123600Z"}, {"host", "example.amazonaws.com"}};
    vf_sigv4_request req = {
        .method = "GET",
        .canonical_uri = "/",
        .query = "",
        .headers = h,
        .num_headers = 2,
        .payload_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        .amz_date = "20150830T123600Z",
        .region = "us-east-1",
        .service = "service",
        .access_key = "AKIDEXAMPLE",
        .secret_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    };
    char *auth = NULL, *creq = NULL, *sts = NULL;
    CHECK_OK(vf_sigv4_sign(&req, &auth, &creq, &sts));
    CHECK(creq && !strcmp(creq, "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
                                "host;x-amz-date\n"
                                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    CHECK(sts && !strcmp(sts, "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
                              "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"));
    CHECK(auth && !strcmp(auth, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
                                "SignedHeaders=host;x-amz-date, "
                                "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"));
    free(auth);
    free(creq);
    free(sts);

    /* A changed secret must change the signature (the test can fail). */
    req.secret_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEZ";
    CHECK_OK(vf_sigv4_sign(&req, &auth, NULL, NULL));
    CHECK(auth && !strstr(auth, "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"));
    free(auth);

    req.amz_date = "2015-08-30";
    CHECK_ERR(vf_sigv4_sign(&req, &auth, NULL, NULL), VF_EINVAL, "x-amz-date");
}

static void test_sigv4_s3_get_object(void)
{
    /* The S3 documentation's GetObject example (bytes 0-9 of test.txt in
     * examplebucket, 20130524, us-east-1). */
    vf_sigv4_header h[] = {
        {"host", "examplebucket.s3.amazonaws.com"},
        {"range", "bytes=0-9"},
        {"x-amz-content-sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"x-amz-date", "20130524T000000Z"},
    };
    vf_sigv4_request req = {
        .method = "GET",
        .canonical_uri = "/test.txt",
        .headers = h,
        .num_headers = 4,
        .payload_hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        .amz_date = "20130524T000000Z",
        .region = "us-east-1",
        .service = "s3",
        .access_key = "AKIAIOSFODNN7EXAMPLE",
        .secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    };
    char *auth = NULL, *sts = NULL;
    CHECK_OK(vf_sigv4_sign(&req, &auth, NULL, &sts));
    CHECK(sts && strstr(sts, "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"));
    CHECK(auth && strstr(auth, "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                               "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"));
    free(auth);
    free(sts);
}

static void test_sigv4_query_and_encoding(void)
{
    vf_sigv4_header h[] = {{"host", "h"}};
    vf_sigv4_request req = {
        .method = "GET", .canonical_uri = "/b", .query = "prefix=a%2Fb&list-type=2&delimiter=%2F&flag",
        .headers = h, .num_headers = 1, .payload_hash = "UNSIGNED-PAYLOAD", .amz_date = "20240101T000000Z",
        .region = "r", .service = "s3", .access_key = "k", .secret_key = "s",
    };
    char *auth = NULL, *creq = NULL;
    CHECK_OK(vf_sigv4_sign(&req, &auth, &creq, NULL));
    CHECK(creq && strstr(creq, "\n/b\ndelimiter=%2F&flag=&list-type=2&prefix=a%2Fb\nhost:h\n"));
    free(auth);
    free(creq);

    vf_buf b = {0};
    CHECK_OK(vf_aws_uri_encode(&b, "dir/a b+c~_.-é", strlen("dir/a b+c~_.-é"), 1));
    CHECK_OK(vf_buf_append_u8(&b, 0));
    CHECK(!strcmp((char *)b.data, "dir/a%20b%2Bc~_.-%C3%A9"));
    b.len = 0;
    CHECK_OK(vf_aws_uri_encode(&b, "a/b", 3, 0));
    CHECK_OK(vf_buf_append_u8(&b, 0));
    CHECK(!strcmp((char *)b.data, "a%2Fb"));
    vf_buf_free(&b);

    char hex[65];
    vf_sha256_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
}

/* ---- backoff -------------------------------------------------------------------- */

static void test_backoff_bounds(void)
{
    vf_http_settings s;
    vf_http_defaults(&s);
    s.backoff_initial_s = 0.1;
    s.backoff_max_s = 2.0;
    double prev_hi = 0;
    for (int attempt = 1; attempt <= 40; attempt++) {
        double lo = vf_http_backoff_delay(&s, attempt, 0.0);
        double hi = vf_http_backoff_delay(&s, attempt, 0.999999);
        double mid = vf_http_backoff_delay(&s, attempt, 0.5);
        CHECK(lo >= 0 && lo <= mid && mid <= hi);
        CHECK(hi <= s.backoff_max_s + 1e-12); /* never above the cap */
        CHECK(lo <= 1e-12);                   /* full jitter: anywhere from 0 */
        CHECK(hi >= prev_hi - 1e-12);         /* the window never shrinks */
        prev_hi = hi;
    }
    /* The window doubles from the base: [0, 0.1), [0, 0.2), [0, 0.4), ... */
    CHECK(vf_http_backoff_delay(&s, 1, 0.999) <= 0.1 + 1e-12 && vf_http_backoff_delay(&s, 1, 0.5) >= 0.05 - 1e-12);
    CHECK(vf_http_backoff_delay(&s, 3, 0.999) <= 0.4 + 1e-12 && vf_http_backoff_delay(&s, 3, 0.5) >= 0.2 - 1e-12);
    CHECK(vf_http_backoff_delay(&s, 40, 0.999) >= 1.99);
    /* Out-of-range u is clamped, huge attempts stay capped. */
    CHECK(vf_http_backoff_delay(&s, 1000000, 5.0) <= s.backoff_max_s);
    CHECK(vf_http_backoff_delay(&s, -3, -1.0) >= 0);
    /* The defaults: 0.2 s base, 30 s cap, a 300 s budget, attempts that do
     * not bind before the budget. */
    vf_http_defaults(&s);
    CHECK(s.backoff_initial_s == 0.2 && s.backoff_max_s == 30 && s.request_budget_s == 300);
    CHECK(s.max_attempts >= 100);
    /* Thousands of draws from a seeded generator stay inside [0, cap]. */
    vf_rng rng;
    vf_rng_init(&rng, 42);
    for (int i = 0; i < 5000; i++) {
        double d = vf_http_backoff_delay(&s, 1 + i % 60, vf_rng_uniform(&rng));
        CHECK(d >= 0 && d <= s.backoff_max_s);
    }
}

/* ---- canned server behaviours -------------------------------------------------- */

static const char OBJECT[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"; /* 62 bytes */
#define OBJECT_LEN 62

/* Parses "bytes=a-b" from the request (b = last byte when absent). */
static void requested_range(const char *req, long *a, long *b)
{
    *a = 0;
    *b = OBJECT_LEN - 1;
    const char *r = strcasestr(req, "\r\nRange: bytes=");
    if (!r)
        return;
    r += strlen("\r\nRange: bytes=");
    *a = strtol(r, (char **)&r, 10);
    if (*r == '-' && r[1] >= '0' && r[1] <= '9')
        *b = strtol(r + 1, NULL, 10);
    if (*b > OBJECT_LEN - 1)
        *b = OBJECT_LEN - 1;
}

static void send_206(int fd, const char *req)
{
    long a, b;
    requested_range(req, &a, &b);
    canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: %ld\r\nContent-Range: bytes %ld-%ld/%d\r\n"
                      "Connection: close\r\n\r\n", b - a + 1, a, b, OBJECT_LEN);
    if (strncmp(req, "HEAD", 4))
        canned_write(fd, OBJECT + a, (size_t)(b - a + 1));
}

static void respond_good(canned_server *s, int n, const char *req, int fd)
{
    if (!strncmp(req, "HEAD", 4)) {
        canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", OBJECT_LEN);
        return;
    }
    send_206(fd, req);
}

static void respond_500_twice(canned_server *s, int n, const char *req, int fd)
{
    if (n < 2) {
        canned_printf(fd, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\nConnection: close\r\n\r\noops!");
        return;
    }
    send_206(fd, req);
}

static void respond_truncated_once(canned_server *s, int n, const char *req, int fd)
{
    if (n == 0) { /* promises 10 bytes, sends 5, closes */
        long a, b;
        requested_range(req, &a, &b);
        canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: %ld\r\nContent-Range: bytes %ld-%ld/%d\r\n"
                          "Connection: close\r\n\r\n", b - a + 1, a, b, OBJECT_LEN);
        canned_write(fd, OBJECT + a, 5);
        return;
    }
    send_206(fd, req);
}

static void respond_bad_range(canned_server *s, int n, const char *req, int fd)
{
    /* Always the wrong bytes: starts one past what was asked. */
    long a, b;
    requested_range(req, &a, &b);
    canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: %ld\r\nContent-Range: bytes %ld-%ld/%d\r\n"
                      "Connection: close\r\n\r\n", b - a, a + 1, b, OBJECT_LEN);
    canned_write(fd, OBJECT + a + 1, (size_t)(b - a));
}

static void respond_garbage_range(canned_server *s, int n, const char *req, int fd)
{
    canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes ten-twenty/62\r\n"
                      "Connection: close\r\n\r\n0123456789");
}

static void respond_404(canned_server *s, int n, const char *req, int fd)
{
    canned_printf(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
}

static void respond_403_s3(canned_server *s, int n, const char *req, int fd)
{
    const char *body = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>no</Message></Error>";
    canned_printf(fd, "HTTP/1.1 403 Forbidden\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(body),
                  body);
}

static void respond_huge_headers(canned_server *s, int n, const char *req, int fd)
{
    canned_printf(fd, "HTTP/1.1 200 OK\r\n");
    char line[1100];
    memset(line, 'a', sizeof line);
    memcpy(line, "X-Junk: ", 8);
    line[sizeof line - 2] = '\r';
    line[sizeof line - 1] = '\n';
    for (int i = 0; i < 80; i++)
        canned_write(fd, line, sizeof line);
    canned_printf(fd, "Content-Length: 3\r\nConnection: close\r\n\r\nabc");
}

static void respond_no_range_support(canned_server *s, int n, const char *req, int fd)
{
    canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", OBJECT_LEN);
    canned_write(fd, OBJECT, OBJECT_LEN);
}

static void respond_stall(canned_server *s, int n, const char *req, int fd)
{
    canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/62\r\n\r\n01");
    /* then nothing for a while (bounded), so the client's budget fires */
    for (int i = 0; i < 40 && !atomic_load(&s->stop); i++)
        usleep(50 * 1000);
}

static void respond_head_no_length(canned_server *s, int n, const char *req, int fd)
{
    if (!strncmp(req, "HEAD", 4)) {
        canned_printf(fd, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    send_206(fd, req);
}

static void fast_settings(vf_http_settings *s)
{
    vf_http_defaults(s);
    s->max_attempts = 3;
    s->backoff_initial_s = 0.01;
    s->backoff_max_s = 0.02;
    s->request_budget_s = 10;
    s->connect_timeout_s = 2;
}

static char *url_of(canned_server *s, const char *path) { return vf_asprintf("http://127.0.0.1:%d%s", s->port, path); }

static void test_range_and_head(void)
{
    vf_http_settings st;
    fast_settings(&st);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    CHECK(canned_start(&s, respond_good, NULL, 4) == 0);
    char *url = url_of(&s, "/obj.bin");
    uint64_t size = 0;
    CHECK_OK(vf_http_head(c, url, &size));
    CHECK_EQ_INT(size, OBJECT_LEN);
    char buf[16] = {0};
    CHECK_OK(vf_http_get_range(c, url, 10, buf, 10));
    CHECK(!memcmp(buf, OBJECT + 10, 10));
    char h[128];
    CHECK(!strcmp(canned_header(&s, 1, "Range", h, sizeof h), "bytes=10-19"));
    CHECK(!strncmp(s.requests[0], "HEAD /obj.bin ", 14));
    canned_stop(&s);
    free(url);

    /* HEAD refused (405): the size comes from a one-byte range GET. */
    CHECK(canned_start(&s, respond_head_no_length, NULL, 4) == 0);
    url = url_of(&s, "/obj.bin");
    CHECK_OK(vf_http_head(c, url, &size));
    CHECK_EQ_INT(size, OBJECT_LEN);
    CHECK(!strcmp(canned_header(&s, 1, "Range", h, sizeof h), "bytes=0-0"));
    canned_stop(&s);
    free(url);
    vf_http_client_close(c);
}

static void test_retry_500(void)
{
    vf_http_settings st;
    fast_settings(&st);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    CHECK(canned_start(&s, respond_500_twice, NULL, 8) == 0);
    char *url = url_of(&s, "/x");
    char buf[8];
    CHECK_OK(vf_http_get_range(c, url, 3, buf, 8));
    CHECK(!memcmp(buf, OBJECT + 3, 8));
    vf_http_stats stats;
    vf_http_client_stats(c, &stats);
    CHECK_EQ_INT(stats.retries, 2);
    CHECK_EQ_INT(stats.requests, 3);
    canned_stop(&s);
    free(url);

    /* Exhausted: 3 attempts of 500 -> a clear error naming URL and status. */
    st.max_attempts = 2;
    vf_http_client *c2;
    CHECK_OK(vf_http_client_open(&c2, &st));
    CHECK(canned_start(&s, respond_500_twice, NULL, 8) == 0);
    url = url_of(&s, "/ds/data.parquet");
    CHECK_ERR(vf_http_get_range(c2, url, 0, buf, 8), VF_EIO, "/ds/data.parquet: HTTP 500 Internal Server Error");
    CHECK(strstr(vf_last_error(), "gave up after 2 attempts"));
    CHECK(strstr(vf_last_error(), "http://127.0.0.1:"));
    CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
    canned_stop(&s);
    free(url);
    vf_http_client_close(c2);
    vf_http_client_close(c);
}

static void test_truncated_body_resumes(void)
{
    vf_http_settings st;
    fast_settings(&st);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    CHECK(canned_start(&s, respond_truncated_once, NULL, 4) == 0);
    char *url = url_of(&s, "/t");
    char buf[10];
    CHECK_OK(vf_http_get_range(c, url, 20, buf, 10));
    CHECK(!memcmp(buf, OBJECT + 20, 10));
    char h[64];
    CHECK(!strcmp(canned_header(&s, 0, "Range", h, sizeof h), "bytes=20-29"));
    CHECK(!strcmp(canned_header(&s, 1, "Range", h, sizeof h), "bytes=25-29")); /* only the rest */
    canned_stop(&s);
    free(url);
    vf_http_client_close(c);
}

static void test_bad_responses(void)
{
    vf_http_settings st;
    fast_settings(&st);
    st.max_attempts = 2;
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    char buf[16];

    CHECK(canned_start(&s, respond_bad_range, NULL, 4) == 0);
    char *url = url_of(&s, "/r");
    CHECK_ERR(vf_http_get_range(c, url, 4, buf, 8), VF_ECORRUPT, "does not match the requested range");
    CHECK(strstr(vf_last_error(), url));
    canned_stop(&s);
    free(url);

    CHECK(canned_start(&s, respond_garbage_range, NULL, 4) == 0);
    url = url_of(&s, "/g");
    CHECK_ERR(vf_http_get_range(c, url, 0, buf, 10), VF_ECORRUPT, "malformed Content-Range");
    canned_stop(&s);
    free(url);

    CHECK(canned_start(&s, respond_404, NULL, 4) == 0);
    url = url_of(&s, "/missing/info.json");
    uint64_t size;
    CHECK_ERR(vf_http_head(c, url, &size), VF_ENOENT, "/missing/info.json: HTTP 404 Not Found");
    CHECK_EQ_INT(atomic_load(&s.num_requests), 1); /* never retried */
    uint8_t *data;
    size_t len;
    CHECK_ERR(vf_http_get(c, url, 1000, &data, &len), VF_ENOENT, "HTTP 404");
    canned_stop(&s);
    free(url);

    CHECK(canned_start(&s, respond_huge_headers, NULL, 4) == 0);
    url = url_of(&s, "/h");
    CHECK_ERR(vf_http_get(c, url, 1000, &data, &len), VF_ECORRUPT, "response headers exceed");
    canned_stop(&s);
    free(url);

    CHECK(canned_start(&s, respond_no_range_support, NULL, 4) == 0);
    url = url_of(&s, "/n");
    vf_log_set_level(VF_LOG_ERROR); /* the "ignores Range" warning is expected */
    CHECK_OK(vf_http_get_range(c, url, 40, buf, 12));
    vf_log_set_level(VF_LOG_WARN);
    CHECK(!memcmp(buf, OBJECT + 40, 12));
    CHECK_OK(vf_http_get(c, url, 1000, &data, &len));
    CHECK_EQ_INT(len, OBJECT_LEN);
    CHECK(!memcmp(data, OBJECT, OBJECT_LEN));
    free(data);
    CHECK_ERR(vf_http_get(c, url, 10, &data, &len), VF_ERANGE, "larger than the 10-byte limit");
    canned_stop(&s);
    free(url);
    vf_http_client_close(c);
}

static void test_stall_and_refused(void)
{
    vf_http_settings st;
    fast_settings(&st);
    st.max_attempts = 5;
    st.request_budget_s = 0.4; /* the stalling server holds 2 s */
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    CHECK(canned_start(&s, respond_stall, NULL, 8) == 0);
    char *url = url_of(&s, "/slow");
    char buf[10];
    CHECK_ERR(vf_http_get_range(c, url, 0, buf, 10), VF_EIO, "/slow");
    CHECK(strstr(vf_last_error(), "gave up after"));
    canned_stop(&s);
    free(url);
    vf_http_client_close(c);

    fast_settings(&st);
    st.max_attempts = 2;
    CHECK_OK(vf_http_client_open(&c, &st));
    int port = closed_port();
    CHECK(port > 0);
    url = vf_asprintf("http://127.0.0.1:%d/ds/meta/info.json", port);
    uint64_t size;
    CHECK_ERR(vf_http_head(c, url, &size), VF_EIO, url);
    CHECK(strstr(vf_last_error(), "gave up after 2 attempts"));
    free(url);
    vf_http_client_close(c);
}

/* ---- the retry policy --------------------------------------------------------- */

/* Request timestamps and a scripted fault, shared with the server thread
 * (read by the test only after canned_stop has joined it). */
typedef struct retry_script {
    double outage_s;        /* 503 until this long after the first request */
    int status;             /* answer of the first request (0: none) */
    const char *retry_after;/* Retry-After value sent with it (NULL: none) */
    int always;             /* answer `status` to every request */
    double first_at;
    double at[CANNED_MAX_REQUESTS];
} retry_script;

static void respond_scripted(canned_server *s, int n, const char *req, int fd)
{
    retry_script *rs = s->ctx;
    double now = vf_now_seconds();
    if (n == 0)
        rs->first_at = now;
    if (n < CANNED_MAX_REQUESTS)
        rs->at[n] = now;
    int fail = rs->always || (n == 0 && rs->status) || (rs->outage_s > 0 && now - rs->first_at < rs->outage_s);
    if (fail) {
        int st = rs->status ? rs->status : 503;
        char extra[128] = "";
        if (rs->retry_after)
            snprintf(extra, sizeof extra, "Retry-After: %s\r\n", rs->retry_after);
        canned_printf(fd, "HTTP/1.1 %d Scripted\r\n%sContent-Length: 4\r\nConnection: close\r\n\r\nnope", st, extra);
        return;
    }
    send_206(fd, req);
}

/* An outage of 3.5 s (every answer 503) is ridden out with the default
 * policy. The old one (5 attempts, at most 3 s of waits) gave up. */
static void test_outage_ridden_out_with_defaults(void)
{
    setenv("VF_HTTP_RETRY_SEED", "7", 1); /* deterministic jitter */
    vf_http_settings st;
    vf_http_defaults(&st);
    unsetenv("VF_HTTP_RETRY_SEED");
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    retry_script rs = {.outage_s = 3.5};
    canned_server s;
    CHECK(canned_start_idle(&s, respond_scripted, &rs, 1000, 120) == 0);
    char *url = url_of(&s, "/ds/data/chunk-000/file-000.parquet");
    char buf[20];
    double t0 = vf_now_seconds();
    int r = vf_http_get_range(c, url, 5, buf, 20);
    double took = vf_now_seconds() - t0;
    CHECK_OK(r);
    if (r < 0)
        fprintf(stderr, "  outage: %s\n", vf_last_error());
    CHECK(!memcmp(buf, OBJECT + 5, 20));
    canned_stop(&s);
    int n = atomic_load(&s.num_requests);
    CHECK(n >= 3);                                      /* it retried */
    CHECK(n <= CANNED_MAX_REQUESTS && rs.at[n - 1] - rs.first_at >= 3.5 - 0.01); /* the last came after the outage */
    CHECK(took >= 3.4 && took < 120);
    free(url);
    vf_http_client_close(c);
}

/* A 503 with Retry-After: the next attempt waits at least that long (the
 * server's timestamps), even though the backoff alone would be ~10 ms; a
 * Retry-After above the cap waits only the cap. */
static void test_retry_after(void)
{
    vf_http_settings st;
    fast_settings(&st);
    st.backoff_max_s = 5;
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    char buf[10];
    canned_server s;

    retry_script rs = {.status = 503, .retry_after = "1"};
    CHECK(canned_start(&s, respond_scripted, &rs, 8) == 0);
    char *url = url_of(&s, "/ra");
    CHECK_OK(vf_http_get_range(c, url, 0, buf, 10));
    CHECK(!memcmp(buf, OBJECT, 10));
    canned_stop(&s);
    CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
    CHECK(rs.at[1] - rs.at[0] >= 1.0 - 0.02);
    free(url);

    /* The HTTP-date form: two seconds ahead of the server's clock. */
    char date[64];
    time_t when = time(NULL) + 2;
    struct tm tm;
    gmtime_r(&when, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    retry_script rd = {.status = 429, .retry_after = date};
    CHECK(canned_start(&s, respond_scripted, &rd, 8) == 0);
    url = url_of(&s, "/rd");
    CHECK_OK(vf_http_get_range(c, url, 0, buf, 10));
    canned_stop(&s);
    CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
    CHECK(rd.at[1] - rd.at[0] >= 0.9);
    free(url);
    vf_http_client_close(c);

    /* Retry-After: 3600 against a 0.3 s cap: the wait is the cap. */
    fast_settings(&st);
    st.backoff_max_s = 0.3;
    CHECK_OK(vf_http_client_open(&c, &st));
    retry_script rl = {.status = 503, .retry_after = "3600"};
    CHECK(canned_start(&s, respond_scripted, &rl, 8) == 0);
    url = url_of(&s, "/rl");
    CHECK_OK(vf_http_get_range(c, url, 0, buf, 10));
    canned_stop(&s);
    CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
    CHECK(rl.at[1] - rl.at[0] >= 0.3 - 0.02 && rl.at[1] - rl.at[0] < 30);
    free(url);
    vf_http_client_close(c);
}

/* An outage longer than the budget (1 s, from the environment): a clear
 * error naming the URL (its signature redacted), the last status, the
 * attempts and the time. */
static void test_budget_spent(void)
{
    setenv("VF_HTTP_BUDGET_S", "1", 1);
    setenv("VF_HTTP_BACKOFF_S", "0.05", 1);
    vf_http_settings st;
    vf_http_defaults(&st);
    unsetenv("VF_HTTP_BUDGET_S");
    unsetenv("VF_HTTP_BACKOFF_S");
    CHECK(st.request_budget_s == 1 && st.backoff_initial_s == 0.05);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    retry_script rs = {.always = 1, .status = 503};
    canned_server s;
    CHECK(canned_start_idle(&s, respond_scripted, &rs, 1000, 30) == 0);
    char *url = vf_asprintf("http://127.0.0.1:%d/ds/meta/info.json?X-Amz-Signature=c0ffee5ecret&part=1", s.port);
    char *shown = vf_asprintf("http://127.0.0.1:%d/ds/meta/info.json?X-Amz-Signature=REDACTED&part=1", s.port);
    uint8_t *data = NULL;
    size_t len = 0;
    double t0 = vf_now_seconds();
    CHECK_ERR(vf_http_get(c, url, 1000, &data, &len), VF_EIO, shown);
    double took = vf_now_seconds() - t0;
    const char *msg = vf_last_error();
    CHECK(strstr(msg, "HTTP 503 Scripted") && strstr(msg, "gave up after") && strstr(msg, "attempts in"));
    CHECK(strstr(msg, "the 1 s retry budget is spent"));
    CHECK(!strstr(msg, "c0ffee5ecret"));
    canned_stop(&s);
    CHECK(atomic_load(&s.num_requests) >= 2);
    CHECK(took >= 0.3 && took < 30);
    free(url);
    free(shown);
    vf_http_client_close(c);
}

/* Which statuses are retried: 408, 429 and 5xx once each then served;
 * other 4xx, 501 and 505 answered once, never retried. */
static void test_status_policy(void)
{
    vf_http_settings st;
    fast_settings(&st);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    static const int retried[] = {408, 429, 500, 502, 503, 504};
    static const int final[] = {400, 401, 403, 404, 410, 416, 501, 505};
    char buf[4];
    for (size_t i = 0; i < VF_ARRAY_LEN(retried); i++) {
        retry_script rs = {.status = retried[i]};
        canned_server s;
        CHECK(canned_start(&s, respond_scripted, &rs, 8) == 0);
        char *url = url_of(&s, "/p");
        CHECK_OK(vf_http_get_range(c, url, 1, buf, 4));
        canned_stop(&s);
        CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
        free(url);
    }
    for (size_t i = 0; i < VF_ARRAY_LEN(final); i++) {
        retry_script rs = {.status = final[i], .always = 1};
        canned_server s;
        CHECK(canned_start(&s, respond_scripted, &rs, 8) == 0);
        char *url = url_of(&s, "/f");
        char want[32];
        snprintf(want, sizeof want, "HTTP %d", final[i]);
        int r = vf_http_get_range(c, url, 1, buf, 4);
        CHECK(r < 0 && strstr(vf_last_error(), want) && strstr(vf_last_error(), url));
        CHECK(!strstr(vf_last_error(), "gave up"));
        canned_stop(&s);
        CHECK_EQ_INT(atomic_load(&s.num_requests), 1); /* one attempt */
        free(url);
    }
    vf_http_client_close(c);
}

/* Sends the headers of the requested range and half its body, then resets
 * the connection (RST); later requests are served. */
static void respond_reset_once(canned_server *s, int n, const char *req, int fd)
{
    if (n == 0) {
        long a, b;
        requested_range(req, &a, &b);
        canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nContent-Length: %ld\r\nContent-Range: bytes %ld-%ld/%d\r\n"
                          "Connection: close\r\n\r\n", b - a + 1, a, b, OBJECT_LEN);
        canned_write(fd, OBJECT + a, (size_t)(b - a + 1) / 2);
        usleep(100 * 1000);
        struct linger lg = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg); /* close() now sends RST */
        return;
    }
    send_206(fd, req);
}

/* A connection reset half-way through a body: the next attempt asks for
 * exactly the bytes still missing, and the result is exact. */
static void test_reset_mid_body(void)
{
    vf_http_settings st;
    fast_settings(&st);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    CHECK(canned_start(&s, respond_reset_once, NULL, 4) == 0);
    char *url = url_of(&s, "/reset");
    char buf[40];
    CHECK_OK(vf_http_get_range(c, url, 10, buf, 40));
    CHECK(!memcmp(buf, OBJECT + 10, 40));
    char h[64];
    CHECK(!strcmp(canned_header(&s, 0, "Range", h, sizeof h), "bytes=10-49"));
    long from = -1, to = -1;
    canned_header(&s, 1, "Range", h, sizeof h);
    CHECK(sscanf(h, "bytes=%ld-%ld", &from, &to) == 2);
    CHECK(from >= 10 && from <= 30 && to == 49); /* resumed, never past the bytes received */
    if (from != 30)
        fprintf(stderr, "  note: resumed at %ld (the RST dropped received bytes)\n", from);
    canned_stop(&s);
    free(url);

    /* A whole-object GET broken the same way. */
    CHECK(canned_start(&s, respond_reset_once, NULL, 4) == 0);
    url = url_of(&s, "/reset-all");
    uint8_t *data = NULL;
    size_t len = 0;
    CHECK_OK(vf_http_get(c, url, 1000, &data, &len));
    CHECK(len == OBJECT_LEN && data && !memcmp(data, OBJECT, OBJECT_LEN));
    free(data);
    CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
    canned_stop(&s);
    free(url);
    vf_http_client_close(c);
}

/* The first answer (ETag "v1") breaks half-way; later ones are a new
 * version of the object (ETag "v2", other bytes, same size). */
static const char OBJECT_V2[] = "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba9876543210"; /* 62 bytes */

static void respond_changed_while_read(canned_server *s, int n, const char *req, int fd)
{
    long a, b;
    requested_range(req, &a, &b);
    const char *version = n == 0 ? OBJECT : OBJECT_V2;
    canned_printf(fd, "HTTP/1.1 206 Partial Content\r\nETag: \"%s\"\r\nContent-Length: %ld\r\n"
                      "Content-Range: bytes %ld-%ld/%d\r\nConnection: close\r\n\r\n", n == 0 ? "v1" : "v2",
                  b - a + 1, a, b, OBJECT_LEN);
    canned_write(fd, version + a, n == 0 ? (size_t)(b - a + 1) / 2 : (size_t)(b - a + 1));
}

/* A resumed read that meets another version of the object reads the
 * whole range again: the bytes are all of one version, never a mix. */
static void test_object_changed_while_read(void)
{
    vf_http_settings st;
    fast_settings(&st);
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    canned_server s;
    CHECK(canned_start(&s, respond_changed_while_read, NULL, 8) == 0);
    char *url = url_of(&s, "/changing");
    char buf[40];
    CHECK_OK(vf_http_get_range(c, url, 10, buf, 40));
    CHECK(!memcmp(buf, OBJECT_V2 + 10, 40));
    canned_stop(&s);
    CHECK_EQ_INT(atomic_load(&s.num_requests), 3); /* broken, refused (v2 after v1), whole again */
    char h[64];
    CHECK(!strcmp(canned_header(&s, 0, "Range", h, sizeof h), "bytes=10-49"));
    CHECK(!strcmp(canned_header(&s, 1, "Range", h, sizeof h), "bytes=30-49"));
    CHECK(!strcmp(canned_header(&s, 2, "Range", h, sizeof h), "bytes=10-49"));
    free(url);
    vf_http_client_close(c);
}

/* ---- source --------------------------------------------------------------------- */

static void test_source_block_cache(void)
{
    vf_http_settings st;
    fast_settings(&st);
    st.block_bytes = 4096; /* the minimum; the object is one block */
    canned_server s;
    CHECK(canned_start(&s, respond_good, NULL, 8) == 0);
    char *url = url_of(&s, "/obj");
    vf_source *src;
    CHECK_OK(vf_source_open_url(&src, url, &st));
    CHECK_EQ_INT(vf_source_size(src), OBJECT_LEN);
    CHECK(!strcmp(vf_source_name(src), url));
    char a[8], b[8], tail[4];
    CHECK_OK(vf_source_read_at(src, 0, a, 8));
    CHECK_OK(vf_source_read_at(src, 30, b, 8));
    CHECK_OK(vf_source_read_at(src, OBJECT_LEN - 4, tail, 4));
    CHECK(!memcmp(a, OBJECT, 8) && !memcmp(b, OBJECT + 30, 8) && !memcmp(tail, OBJECT + OBJECT_LEN - 4, 4));
    /* one HEAD + one block fetch for three reads */
    CHECK_EQ_INT(atomic_load(&s.num_requests), 2);
    CHECK_ERR(vf_source_read_at(src, OBJECT_LEN - 2, tail, 4), VF_ECORRUPT, "truncated");
    vf_source_close(src);
    canned_stop(&s);
    free(url);

    CHECK(canned_start(&s, respond_404, NULL, 4) == 0);
    url = url_of(&s, "/gone.mp4");
    CHECK_ERR(vf_source_open_url(&src, url, &st), VF_ENOENT, "/gone.mp4: HTTP 404");
    canned_stop(&s);
    free(url);
}

/* ---- S3 ------------------------------------------------------------------------- */

static void test_s3_signed_request(void)
{
    canned_server s;
    CHECK(canned_start(&s, respond_good, NULL, 4) == 0);
    char *endpoint = vf_asprintf("http://127.0.0.1:%d", s.port);
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
    setenv("AWS_SESSION_TOKEN", "tok123", 1);
    setenv("AWS_REGION", "eu-west-3", 1);
    vf_http_settings st;
    fast_settings(&st);
    st.s3_endpoint = endpoint;
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    char buf[4];
    CHECK_OK(vf_http_get_range(c, "s3://bucket-1/ds/videos/cam 0/file-000.mp4", 2, buf, 4));
    CHECK(!memcmp(buf, OBJECT + 2, 4));
    CHECK(!strncmp(s.requests[0], "GET /bucket-1/ds/videos/cam%200/file-000.mp4 HTTP/1.1\r\n", 55));
    char h[512];
    canned_header(&s, 0, "Authorization", h, sizeof h);
    CHECK(!strncmp(h, "AWS4-HMAC-SHA256 Credential=AKIDTEST/", 37));
    CHECK(strstr(h, "/eu-west-3/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                    "x-amz-security-token, Signature="));
    CHECK(!strcmp(canned_header(&s, 0, "x-amz-security-token", h, sizeof h), "tok123"));
    CHECK(strlen(canned_header(&s, 0, "x-amz-date", h, sizeof h)) == 16);
    CHECK(!strcmp(canned_header(&s, 0, "x-amz-content-sha256", h, sizeof h),
                  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    vf_http_client_close(c);
    canned_stop(&s);

    /* S3 error bodies: the code is in the message, with the s3:// URL. */
    CHECK(canned_start(&s, respond_403_s3, NULL, 4) == 0);
    free(endpoint);
    endpoint = vf_asprintf("http://127.0.0.1:%d/", s.port);
    setenv("AWS_ENDPOINT_URL", endpoint, 1);
    CHECK_OK(vf_http_client_open(&c, NULL));
    uint8_t *data;
    size_t len;
    CHECK_ERR(vf_http_get(c, "s3://bucket-1/ds/meta/info.json", 100, &data, &len), VF_EIO,
              "s3://bucket-1/ds/meta/info.json: HTTP 403 Forbidden (AccessDenied)");
    vf_http_client_close(c);
    canned_stop(&s);
    unsetenv("AWS_ENDPOINT_URL");
    unsetenv("AWS_SESSION_TOKEN");
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_REGION");
    free(endpoint);

    /* One key without the other is a configuration error. */
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    CHECK_ERR(vf_http_client_open(&c, NULL), VF_EINVAL, "AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_ACCESS_KEY_ID");
}

static void respond_listing(canned_server *s, int n, const char *req, int fd)
{
    const char *body;
    if (n == 0)
        body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><Name>b</Name><Prefix>ds/meta/episodes/"
               "</Prefix><IsTruncated>true</IsTruncated><NextContinuationToken>tok/+=</NextContinuationToken>"
               "<CommonPrefixes><Prefix>ds/meta/episodes/chunk-000/</Prefix></CommonPrefixes>"
               "<Contents><Key>ds/meta/episodes/a&amp;b.txt</Key><Size>3</Size></Contents>"
               "</ListBucketResult>";
    else
        body = "<ListBucketResult><IsTruncated>false</IsTruncated>"
               "<CommonPrefixes><Prefix>ds/meta/episodes/chunk-001/</Prefix></CommonPrefixes>"
               "<Contents><Key>ds/meta/episodes/chunk-000/ignored-deeper.parquet</Key></Contents>"
               "</ListBucketResult>";
    canned_printf(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %zu\r\nConnection: close\r\n"
                      "\r\n%s", strlen(body), body);
}

static void test_s3_list(void)
{
    canned_server s;
    CHECK(canned_start(&s, respond_listing, NULL, 4) == 0);
    char *endpoint = vf_asprintf("http://127.0.0.1:%d", s.port);
    vf_http_settings st;
    fast_settings(&st);
    st.s3_endpoint = endpoint;
    vf_http_client *c;
    CHECK_OK(vf_http_client_open(&c, &st));
    char **names = NULL;
    size_t count = 0;
    CHECK_OK(vf_http_list(c, "s3://b/ds/meta/episodes", &names, &count));
    CHECK_EQ_INT(count, 3);
    if (count == 3) {
        CHECK(!strcmp(names[0], "chunk-000"));
        CHECK(!strcmp(names[1], "a&b.txt"));
        CHECK(!strcmp(names[2], "chunk-001"));
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    CHECK(!strncmp(s.requests[0], "GET /b?delimiter=%2F&list-type=2&prefix=ds%2Fmeta%2Fepisodes%2F HTTP/1.1", 70));
    CHECK(!strncmp(s.requests[1], "GET /b?continuation-token=tok%2F%2B%3D&delimiter=%2F&list-type=2&prefix=", 70));
    CHECK_ERR(vf_http_list(c, "http://127.0.0.1:1/x", &names, &count), VF_EUNSUPPORTED, "no directory listing");
    vf_http_client_close(c);
    canned_stop(&s);
    free(endpoint);
}

int main(void)
{
    /* The tests set their own S3 environment. */
    unsetenv("AWS_ENDPOINT_URL");
    unsetenv("AWS_ENDPOINT_URL_S3");
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    /* ... and their own HTTP knobs. */
    static const char *knobs[] = {"VF_HTTP_ATTEMPTS", "VF_HTTP_BUDGET_S", "VF_HTTP_BACKOFF_S", "VF_HTTP_BACKOFF_MAX_S",
                                  "VF_HTTP_RETRY_SEED", "VF_HTTP_CONNECT_TIMEOUT_S", "VF_HTTP_LOW_SPEED_TIME_S"};
    for (size_t i = 0; i < VF_ARRAY_LEN(knobs); i++)
        unsetenv(knobs[i]);
    test_url_parse();
    test_sigv4_get_vanilla();
    test_sigv4_s3_get_object();
    test_sigv4_query_and_encoding();
    test_backoff_bounds();
    test_range_and_head();
    test_retry_500();
    test_truncated_body_resumes();
    test_bad_responses();
    test_stall_and_refused();
    test_status_policy();
    test_reset_mid_body();
    test_object_changed_while_read();
    test_retry_after();
    test_budget_spent();
    test_outage_ridden_out_with_defaults();
    test_source_block_cache();
    test_s3_signed_request();
    test_s3_list();
    return vf_test_finish("test_http");
}
