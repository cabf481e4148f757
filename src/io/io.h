/*
 * io.h: byte sources. Every reader above this layer (Parquet, JSON, video
 * demux, tar) reads through a vf_source, so a local file, a memory buffer
 * and (later) an HTTP/S3 object are interchangeable.
 *
 * Implementations: local files and memory (source.c), HTTP(S) and S3 range
 * reads through libcurl (http.c, requests in http_request.c, listings in
 * http_s3_list.c, signing in sigv4.c), and a local file cache that
 * downloads whole remote files ahead of use (filecache.c). Remote requests
 * can be cancelled (cancel.c).
 *
 * Invariants:
 *  - vf_source_read_at() is positional and thread-safe (pread semantics): no
 *    shared cursor, so several readers may share one source.
 *  - A source is reference counted; vf_source_close() drops one reference.
 *  - A short read past the end is an error (VF_ECORRUPT, "truncated"), never
 *    a silent partial result. Use vf_source_read_upto() when a short read is
 *    expected.
 */
#ifndef VF_IO_H
#define VF_IO_H

#include <stdatomic.h>

#include "base/base.h"

typedef struct vf_source vf_source;

typedef struct vf_source_ops {
    /* Reads up to len bytes at offset into buf; returns bytes read (0 at
     * end) or a negative code with the message set. */
    int64_t (*read_at)(void *impl, uint64_t offset, void *buf, size_t len);
    void (*destroy)(void *impl);
    /* Optional (NULL: no views). A read-only pointer to [offset, offset+len)
     * with no copy, or NULL when this range cannot be viewed (the caller
     * then reads); *token is handed back to unview. */
    const uint8_t *(*view)(void *impl, uint64_t offset, size_t len, int populate, void **token);
    void (*unview)(void *impl, void *token);
} vf_source_ops;

/* Wraps an implementation. name is copied (used in error messages); size is
 * the total byte size. On success the source owns impl (ops->destroy). */
int vf_source_create(vf_source **out, const char *name, uint64_t size, const vf_source_ops *ops, void *impl);

/* A local file opened read-only. Errors name the path (VF_ENOENT if absent). */
int vf_source_open_file(vf_source **out, const char *path);

/* A memory buffer. If copy is 0 the caller keeps data alive until the source
 * is closed; otherwise the source keeps its own copy. */
int vf_source_open_memory(vf_source **out, const char *name, const void *data, size_t len, int copy);

/* Exactly len bytes at offset, or an error naming the source
 * (VF_ECORRUPT "truncated" when the range passes the end). */
int vf_source_read_at(vf_source *s, uint64_t offset, void *buf, size_t len);
/* Up to len bytes; returns the count read or a negative code. */
int64_t vf_source_read_upto(vf_source *s, uint64_t offset, void *buf, size_t len);

/* A read-only view of [offset, offset+len) without a copy, where the source
 * can give one: a memory source's own buffer, or a local file mapped with
 * mmap (ranges of at least VF_SOURCE_VIEW_MIN bytes; smaller reads are
 * cheaper through pread). NULL otherwise (remote sources, small ranges, a
 * failed mapping): read with vf_source_read_at instead. populate asks for
 * the pages up front (MAP_POPULATE), for ranges that will be read whole.
 * Release with vf_source_unview(). A mapped local file that another process
 * truncates while it is viewed raises SIGBUS: views are for files the
 * engine only reads (a dataset's files), not for files being written. */
#define VF_SOURCE_VIEW_MIN ((size_t)1 << 20)
const uint8_t *vf_source_view(vf_source *s, uint64_t offset, size_t len, int populate, void **token);
void vf_source_unview(vf_source *s, void *token);

uint64_t vf_source_size(const vf_source *s);
const char *vf_source_name(const vf_source *s);

/* Reference counting: ref adds one; close drops one and frees at zero. */
vf_source *vf_source_ref(vf_source *s);
void vf_source_close(vf_source *s);

/* ---- URLs (http.c) ------------------------------------------------------ */

/* 1 if s starts with http://, https:// or s3:// (case-insensitive scheme). */
int vf_is_url(const char *s);

/* A parsed absolute URL. For s3://bucket/key, host is the bucket and path
 * is "/key". path always starts with '/' and is kept as written (already
 * percent-encoded for http(s); raw key bytes for s3). query excludes '?'
 * and is NULL when absent; a fragment is dropped. Strings newly allocated
 * (vf_url_free). */
typedef struct vf_url {
    char scheme[8];   /* "http", "https" or "s3" (lower case) */
    char *host;       /* no brackets for IPv6 literals */
    int port;         /* 0: the scheme's default */
    char *path;
    char *query;
} vf_url;
/* VF_EINVAL naming the URL when it is not http(s)/s3, has no host (or
 * bucket), a bad port, user info, or control characters / spaces. */
int vf_url_parse(const char *url, vf_url *out);
void vf_url_free(vf_url *u);

/* ---- cancellation (cancel.c) ------------------------------------------------ */

/* A flag that stops the remote requests watching it. Once it is requested,
 * such a request makes no further attempt, its wait between attempts ends
 * at once and a transfer in progress is aborted (libcurl's progress
 * callback: within about a second), and the request fails with VF_EIO and
 * "<url>: cancelled ...": never a partial result. The owner of the work
 * (a loader, the file cache) owns the token; a thread chooses the token
 * its requests watch (vf_io_cancel_watch), so the readers between the
 * owner and the HTTP layer need not pass it along. A zero-initialized
 * token is not requested; it must outlive the requests watching it. */
typedef struct vf_io_cancel {
    atomic_int requested;
} vf_io_cancel;

/* Requests cancellation (t NULL: no-op). Any thread, at any time; it stays
 * requested. */
void vf_io_cancel_request(vf_io_cancel *t);
/* 1 once cancellation was requested; 0 for NULL. */
int vf_io_cancel_requested(vf_io_cancel *t);
/* The token the requests of the calling thread watch from now on (NULL:
 * none); returns the one watched before, to restore. */
vf_io_cancel *vf_io_cancel_watch(vf_io_cancel *t);
/* The token the calling thread's requests watch (NULL: none). */
vf_io_cancel *vf_io_cancel_watched(void);
/* Sleeps `seconds`, or less when t is (or becomes) requested: 1 then, 0
 * after the whole wait. */
int vf_io_cancel_sleep(vf_io_cancel *t, double seconds);

/* ---- HTTP(S) and S3 (http.c, http_request.c, http_s3_list.c) ------------- */

typedef struct vf_http_settings {
    /* Retries (see http_request.c): connection failures, timeouts, resets,
     * truncated bodies, 408, 429 and 5xx are retried after a wait drawn
     * uniformly from [0, min(backoff_max_s, backoff_initial_s * 2^(n-1)))
     * ("full jitter"; a Retry-After from the server replaces the draw,
     * within backoff_max_s), until request_budget_s or max_attempts runs out. */
    int max_attempts;          /* per request, including the first; default 100 (the budget binds first) */
    double backoff_initial_s;  /* base of the exponential wait window, default 0.2 */
    double backoff_max_s;      /* cap of one wait (Retry-After included), default 30 */
    double request_budget_s;   /* all attempts and waits of one request together, default 300 */
    uint64_t retry_seed;       /* jitter seed; 0 (default): fresh per request; else the same waits every time */
    double connect_timeout_s;  /* default 10 */
    double low_speed_time_s;   /* abort an attempt slower than low_speed_bytes/s */
    long low_speed_bytes;      /*   for this long; defaults 15 s, 1024 B/s */
    size_t block_bytes;        /* read-ahead block of a source, default 1 MiB */
    int cache_blocks;          /* blocks a source keeps (LRU), default 8 */
    int max_idle_handles;      /* curl handles kept for reuse per client, default 8 */
    /* S3. NULL fields come from the environment: AWS_ENDPOINT_URL_S3, else
     * AWS_ENDPOINT_URL (a custom endpoint implies path-style addressing);
     * AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1;
     * AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (no
     * keys: anonymous, unsigned requests). */
    const char *s3_endpoint;
    const char *s3_region;
    int s3_path_style;         /* -1 (default): path-style iff a custom endpoint */
} vf_http_settings;

/* Defaults as listed, then optional environment overrides (operations and
 * tests): VF_HTTP_ATTEMPTS (max_attempts, 1-10000), VF_HTTP_BUDGET_S
 * (request_budget_s), VF_HTTP_BACKOFF_S (backoff_initial_s),
 * VF_HTTP_BACKOFF_MAX_S (backoff_max_s), VF_HTTP_RETRY_SEED (retry_seed),
 * VF_HTTP_CONNECT_TIMEOUT_S, VF_HTTP_LOW_SPEED_TIME_S, VF_HTTP_BLOCK_BYTES
 * (out-of-range values are ignored with a warning). */
void vf_http_defaults(vf_http_settings *s);

/* A client: copied settings, resolved S3 credentials, a locked pool of
 * reusable curl handles (keep-alive connections) and counters. Thread-safe;
 * reference counted (close drops one reference; sources opened through it
 * hold one). */
typedef struct vf_http_client vf_http_client;

typedef struct vf_http_stats {
    uint64_t requests;         /* attempts sent (HEAD, GET, LIST) */
    uint64_t retries;          /* attempts after a retryable failure */
    uint64_t bytes;            /* body bytes received */
    uint64_t block_hits;       /* source reads served from the read-ahead cache */
    uint64_t block_misses;
} vf_http_stats;

int vf_http_client_open(vf_http_client **out, const vf_http_settings *settings);
vf_http_client *vf_http_client_ref(vf_http_client *c);
void vf_http_client_close(vf_http_client *c);
void vf_http_client_stats(vf_http_client *c, vf_http_stats *out);

/* The object's size (HEAD, else a one-byte range GET when HEAD gives no
 * length). VF_ENOENT when the server answers 404 or 410; other failures
 * (403 included: S3 answers it for a missing key when the caller may not
 * list the bucket) are VF_EIO. Errors name the URL and HTTP status. */
int vf_http_head(vf_http_client *c, const char *url, uint64_t *size);
/* vf_http_head, and the last HTTP status the server answered, whatever
 * the result (0: no answer, e.g. refused or reset connections), so a
 * caller can tell a refusal (401/403) from an outage. */
int vf_http_head_status(vf_http_client *c, const char *url, uint64_t *size, long *status);

/* The whole object into a newly allocated NUL-terminated buffer (free()).
 * More than max_bytes is VF_ERANGE naming the URL. */
int vf_http_get(vf_http_client *c, const char *url, size_t max_bytes, uint8_t **data, size_t *len);

/* Bytes [offset, offset+len) into buf, exactly: a short, long or
 * misplaced body (Content-Range checked) is retried, then an error. */
int vf_http_get_range(vf_http_client *c, const char *url, uint64_t offset, void *buf, size_t len);

/* Downloads the object to path (created/truncated; removed on failure).
 * expected_size (UINT64_MAX: unknown) is enforced: a different length is
 * VF_ECORRUPT. A broken transfer resumes with a range request. */
int vf_http_download(vf_http_client *c, const char *url, const char *path, uint64_t expected_size,
                     uint64_t *bytes);

/* S3 only: the entries directly under the "directory" url (s3://b/prefix):
 * sub-directory names (no trailing '/') and object names, newly allocated
 * (free each, then the array). VF_ENOENT when nothing is there,
 * VF_EUNSUPPORTED for http(s) URLs (no listing protocol). */
int vf_http_list(vf_http_client *c, const char *url, char ***names, size_t *count);

/* A byte source over the object at url: size from HEAD (or known_size when
 * not UINT64_MAX), range GETs behind a read-ahead block cache (reads of at
 * least block_bytes bypass it). The source holds a reference on c. */
int vf_http_open_source(vf_http_client *c, const char *url, uint64_t known_size, vf_source **out);

/* A private client + vf_http_open_source. settings may be NULL. */
int vf_source_open_url(vf_source **out, const char *url, const vf_http_settings *settings);

/* Retry wait after failed attempt `attempt` (1 = before the first retry):
 * u in [0, 1) scales the window min(backoff_max_s, backoff_initial_s *
 * 2^(attempt-1)) ("full jitter"), so a wait never exceeds backoff_max_s.
 * Exposed for tests. */
double vf_http_backoff_delay(const vf_http_settings *s, int attempt, double u);

/* ---- AWS Signature Version 4 (sigv4.c) ------------------------------------ */

typedef struct vf_sigv4_header {
    const char *name;   /* lower case */
    const char *value;  /* trimmed */
} vf_sigv4_header;

typedef struct vf_sigv4_request {
    const char *method;         /* "GET" */
    const char *canonical_uri;  /* the path as sent (already encoded), e.g. "/" */
    const char *query;          /* as sent (already encoded), NULL or "" when none */
    const vf_sigv4_header *headers; /* every signed header, host included */
    size_t num_headers;
    const char *payload_hash;   /* hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;       /* "YYYYMMDDTHHMMSSZ" */
    const char *region, *service;
    const char *access_key, *secret_key;
} vf_sigv4_request;

/* The Authorization header value ("AWS4-HMAC-SHA256 Credential=...,
 * SignedHeaders=..., Signature=...") into a newly allocated string; the
 * canonical request and string to sign too when those pointers are not
 * NULL (for tests and debugging). */
int vf_sigv4_sign(const vf_sigv4_request *req, char **authorization, char **canonical_request,
                  char **string_to_sign);

/* Hex SHA-256 of data (65 bytes with the NUL). */
void vf_sha256_hex(const void *data, size_t len, char out[65]);

/* Appends s percent-encoded the AWS way (unreserved A-Z a-z 0-9 - _ . ~
 * kept; '/' kept iff keep_slash). */
int vf_aws_uri_encode(vf_buf *b, const char *s, size_t len, int keep_slash);

/* ---- local file cache (filecache.c) ------------------------------------- */

/* Whole remote files downloaded to a local directory ahead of use, so the
 * decoder reads local bytes. Entries are keyed by URL and reference counted
 * (several episodes share one MP4): acquire takes a reference, release drops
 * it; a file whose count is zero stays cached but becomes evictable (LRU)
 * and is deleted when evicted. Downloads run on the cache's worker threads.
 *
 * Invariants:
 *  - The bytes of downloading + downloaded files never exceed max_bytes
 *    (space is reserved from the object's size before the download starts;
 *    a download that needs space waits, without holding a worker, until
 *    releases make room). A file alone larger than max_bytes fails with a
 *    message naming the URL, its size and the bound.
 *  - Files live in a private subdirectory of dir, removed by close. */
typedef struct vf_file_cache vf_file_cache;

/* How a cache fetches (pluggable for tests; NULL members: HTTP/S3 through a
 * vf_http_client). size: the object's byte size. fetch: writes the object to
 * dest (exactly `size` bytes, else an error). Both are called from worker
 * threads and must be thread-safe. */
typedef struct vf_file_cache_fetcher {
    int (*size)(void *ctx, const char *url, uint64_t *size);
    int (*fetch)(void *ctx, const char *url, const char *dest, uint64_t size);
    void *ctx;
} vf_file_cache_fetcher;

typedef struct vf_file_cache_settings {
    const char *dir;            /* required; created if absent */
    uint64_t max_bytes;         /* required, > 0 */
    int threads;                /* download workers, default 2 */
    vf_file_cache_fetcher fetcher;
    const vf_http_settings *http; /* for the default fetcher; NULL: defaults */
} vf_file_cache_settings;

typedef struct vf_file_cache_stats {
    uint64_t hits;             /* acquire/prefetch found the URL present (ready or in flight) */
    uint64_t misses;           /* a download had to start */
    uint64_t bytes_downloaded;
    uint64_t downloads, failures;
    uint64_t evictions;
    uint64_t bytes;            /* reserved now (downloading + ready) */
    uint64_t peak_bytes;       /* highest `bytes` ever */
    uint64_t entries;
    uint64_t waiting_for_space;/* downloads queued until space frees */
} vf_file_cache_stats;

void vf_file_cache_defaults(vf_file_cache_settings *s);
int vf_file_cache_open(vf_file_cache **out, const char *dir, uint64_t max_bytes);
int vf_file_cache_open_with(vf_file_cache **out, const vf_file_cache_settings *settings);
/* Cancels the downloads in flight (their remote requests fail as
 * cancelled, see vf_io_cancel), waits for the workers, deletes every
 * cached file and the private directory. References still held are
 * dropped (logged). */
void vf_file_cache_close(vf_file_cache *c);
/* Makes every remote request of the cache's downloads, running or to
 * come, fail as cancelled (whoever waits for such a download gets that
 * failure); the cache is then only good for closing. Thread-safe: for an
 * owner about to close it that must not wait for a download riding out
 * an outage. */
void vf_file_cache_cancel(vf_file_cache *c);

/* Takes a reference and waits until the file is local; *local_path (owned
 * by the cache) stays valid while the reference is held. On failure no
 * reference is kept and the message names the URL. */
int vf_file_cache_acquire(vf_file_cache *c, const char *url, const char **local_path);
/* Takes a reference and starts the download if needed, without waiting:
 * 0 with *local_path when the file is already local, VF_EAGAIN while it is
 * in flight (the reference is held either way; release it as usual). */
int vf_file_cache_acquire_nowait(vf_file_cache *c, const char *url, const char **local_path);
/* Starts a download without taking a reference (no-op when present). */
int vf_file_cache_prefetch(vf_file_cache *c, const char *url);
/* Drops a reference taken by acquire / acquire_nowait. */
int vf_file_cache_release(vf_file_cache *c, const char *url);
/* Opens a source over the local copy if the file is local (0), waits when it
 * is downloading right now, and answers VF_ENOENT when it is absent, failed
 * or queued for space (the caller then reads remotely). */
int vf_file_cache_open_source(vf_file_cache *c, const char *url, vf_source **out);
void vf_file_cache_get_stats(vf_file_cache *c, vf_file_cache_stats *out);
/* Reference count of url (0 when absent), for tests and diagnostics. */
int vf_file_cache_refs(vf_file_cache *c, const char *url);

/* ---- node cache (filecache.c): one download per node ------------------- */

/* With VF_NODE_CACHE_DIR set, every process on a node (ranks, DataLoader
 * workers, Ray tasks) that reads an http(s)/s3 object through
 * vf_http_open_source or vf_http_get first makes sure a whole copy is in
 * that directory, and then reads the copy: the object crosses the network
 * once per node, not once per process.
 *
 * Cross-process protocol (flock(2) on per-object lock files):
 *  - <key>.data is a complete copy (key: SHA-256 of the URL); it only ever
 *    appears by rename, so opening it needs no lock (a hit);
 *  - a miss takes <key>.lock exclusively (others wanting the same object
 *    block on it, then find the copy), reserves the object's size as a
 *    sparse <key>.part, downloads into <key>.tmp and renames it to .data;
 *  - the size bound (VF_NODE_CACHE_BYTES, default 16 GiB) counts copies and
 *    reservations; room is made under .evict.lock by deleting the least
 *    recently used copies (mtime, refreshed at every hit) whose lock is
 *    free. Open descriptors keep evicted bytes readable. An object larger
 *    than the bound, or one that cannot get room, is read remotely
 *    (counted as bypassed). A reservation left by a killed process is
 *    dropped by the next scan (its lock is free).
 *  - copies are keyed by URL alone: objects are taken as immutable (a
 *    dataset's files are); delete the directory after rewriting one;
 *  - node-wide counters live in <dir>/.stats (flock-protected text: one
 *    "name value" per line), this process's in vf_node_cache_process_stats. */
typedef struct vf_node_cache_stats {
    uint64_t fetches;       /* objects downloaded into the node cache */
    uint64_t bytes_fetched; /* their bytes: what crossed the network */
    uint64_t hits;          /* opens served by a copy already there */
    uint64_t bytes_reused;  /* bytes of those copies */
    uint64_t waits;         /* hits that first waited for another process's download */
    uint64_t evictions;     /* copies deleted to stay within the bound */
    uint64_t bypassed;      /* reads that went remote: larger than the bound, or no room */
} vf_node_cache_stats;

/* $VF_NODE_CACHE_DIR, or NULL when unset or empty. */
const char *vf_node_cache_dir(void);
/* $VF_NODE_CACHE_BYTES (default 16 GiB). */
uint64_t vf_node_cache_bound(void);
/* Makes sure url's whole object is in dir and opens it: 0 with *fd (read
 * only, the caller closes it) and *size; 1 when the object is not cached
 * (read it remotely); a negative code on a failed size or fetch. known_size
 * may be UINT64_MAX. */
int vf_node_cache_fetch(const char *dir, uint64_t max_bytes, const char *url, uint64_t known_size,
                        const vf_file_cache_fetcher *fetcher, int *fd, uint64_t *size);
/* The hooks of vf_http_open_source and vf_http_get: 1 when the node cache
 * is off or cannot hold the object (go on remotely), else their result. */
int vf_node_cache_open_source(vf_http_client *c, const char *url, uint64_t known_size, vf_source **out);
int vf_node_cache_get(vf_http_client *c, const char *url, size_t max_bytes, uint8_t **data, size_t *len);
void vf_node_cache_process_stats(vf_node_cache_stats *out);
/* The node-wide counters of the cache in dir (zeros when there are none). */
int vf_node_cache_node_stats(const char *dir, vf_node_cache_stats *out);

#endif
