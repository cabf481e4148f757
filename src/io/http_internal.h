/*
 * http_internal.h: what the three files of the HTTP(S)/S3 client share, and
 * nothing the layers above may use (their interface is io.h).
 *
 *  - http.c: URLs, settings, the client (S3 configuration, the pool of
 *    reusable curl handles) and the vf_source over an object;
 *  - http_request.c: one request and its attempt loop (retries, backoff,
 *    Range, SigV4 headers, defensive response parsing) and the public
 *    requests built on it;
 *  - http_s3_list.c: ListObjectsV2 pages and their XML.
 *
 * Invariants: a client's settings are fixed once vf_http_client_open
 * returns (the limits already applied), and its counters only grow
 * (atomics, shared by every thread using the client). A curl handle taken
 * from the pool is used by one thread until it is given back. A request's
 * retry state (its jitter generator, attempts, clock) lives on the stack of
 * the thread performing it: nothing about retrying is shared but the
 * cancellation token it watches (an atomic flag, io.h).
 */
#ifndef VF_IO_HTTP_INTERNAL_H
#define VF_IO_HTTP_INTERNAL_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "io/io.h"

#define VF_HTTP_MAX_ERROR_BODY 2048 /* body bytes kept from an error response */
#define VF_HTTP_MAX_ETAG 128        /* ETag bytes compared across attempts */

/* The client behind io.h's opaque vf_http_client. */
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
    atomic_uint_fast64_t requests, retries, bytes, block_hits, block_misses;
    atomic_uint_fast64_t jitter_counter; /* keys of unseeded per-request jitter generators */
};

/* Where a request's body goes. */
typedef enum vf_http_sink_kind {
    VF_HTTP_SINK_NONE = 0,   /* HEAD */
    VF_HTTP_SINK_MEMORY,     /* fixed caller buffer of `want` bytes */
    VF_HTTP_SINK_GROW,       /* growing vf_buf up to max_bytes (whole object) */
    VF_HTTP_SINK_FILE,       /* fd, written at the object offset */
} vf_http_sink_kind;

/* One request: what is wanted and where it goes, the progress kept across
 * attempts, and what the current response and attempt have parsed. */
typedef struct vf_http_xfer {
    vf_http_client *client;
    const char *url;           /* what is requested (borrowed) */
    const char *display;       /* URL for messages: url with secret query values redacted
                                * (owned by vf_http_perform while it runs) */
    const char *query;         /* extra query (S3 list) */
    vf_io_cancel *cancel;      /* what stops the request early: the starting thread's token (NULL: none) */
    int head;
    /* what is wanted: [start, start + want); want UINT64_MAX = to the end */
    uint64_t start, want;
    uint64_t known_size;       /* UINT64_MAX: unknown (then learned from the first answer) */
    vf_http_sink_kind sink;
    uint8_t *mem;
    vf_buf *grow;
    size_t max_bytes;
    int fd;
    /* progress across attempts: bytes [start, start + delivered) are in,
     * read from the object version that first_etag names ("" when the
     * server sends no ETag; then known_size guards against a new version) */
    uint64_t delivered;
    char first_etag[VF_HTTP_MAX_ETAG];
    int size_learned;          /* known_size came from a response, not the caller */

    /* per-response state (reset at each status line) */
    long status;
    char reason[64];
    int64_t content_length;
    int has_content_range, content_range_bad;
    uint64_t cr_first, cr_last, cr_total;
    int cr_total_known;
    double retry_after_s;      /* Retry-After in seconds, -1 when absent or unreadable */
    char etag[VF_HTTP_MAX_ETAG];
    size_t header_bytes;
    int header_overflow;
    /* per-attempt body state */
    int body_started;
    uint64_t body_base;        /* object offset of the body's first byte */
    uint64_t body_seen;
    int done_early;            /* aborted on purpose: everything wanted arrived */
    int sink_error;            /* VF_E* from the sink, or 0 */
    int sink_retryable;        /* a malformed or misplaced answer (a proxy glitch?), not a final one */
    int restart;               /* the object changed: forget `delivered`, read again from the start */
    char sink_message[256];
    char error_body[VF_HTTP_MAX_ERROR_BODY + 1];
    size_t error_body_len;
} vf_http_xfer;

/* The pool (http.c): an idle handle (reset, its connections kept) or a new
 * one; NULL when curl cannot make one. Giving back keeps up to
 * max_idle_handles and cleans up the rest. */
CURL *vf_http_take_handle(vf_http_client *c);
void vf_http_give_handle(vf_http_client *c, CURL *h);

/* url for messages: the values of query parameters that carry credentials
 * (signatures, tokens, keys: presigned S3/GCS URLs, SAS tokens) replaced by
 * REDACTED; newly allocated (free), NULL when out of memory (http.c). */
char *vf_http_redact_url(const char *url);

/* Requests (http_request.c). vf_http_xfer_init: a GET of the whole object
 * at url (borrowed), no sink, size unknown, watching the calling thread's
 * cancellation token; the caller then sets what it wants. vf_http_perform:
 * runs it through every attempt it may take and returns 0 or the final
 * error, whose message names the URL. */
void vf_http_xfer_init(vf_http_xfer *x, vf_http_client *c, const char *url);
int vf_http_perform(vf_http_xfer *x);
/* A range GET of len bytes at offset into buf, checked against the
 * object's known size (UINT64_MAX: unknown). */
int vf_http_get_range_known(vf_http_client *c, const char *url, uint64_t offset, void *buf, size_t len,
                            uint64_t known_size);

#endif
