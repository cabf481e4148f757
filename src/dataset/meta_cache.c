/*
 * meta_cache.c: a persistent cache of the decoded columns of v3.0
 * meta/episodes files (meta_cache.h), so that every open after the first
 * skips the Parquet footer walk and the page decoding of those files.
 *
 * One cache file per (episodes file, projection), named by a SHA-256 of
 * the format version, the file's absolute path and the projection. Layout
 * (native byte order, with a byte-order mark; every section 8-byte
 * aligned):
 *
 *   header (112 bytes): magic "VFMETAC\n", u32 version, u32 byte-order
 *     mark, u64 size, mtime_ns, ctime_ns, inode, device of the Parquet
 *     file, its tail SHA-256 [32], u64 ident_len, u64 body_len, u32 CRC-32
 *     of everything else in the file, u32 0
 *   ident: absolute path, NUL, projection (compared byte for byte)
 *   body: i64 rows, cameras, flags, item type (1 string, 2 binary), items,
 *     data bytes; the six
 *     fixed columns; per camera chunk, file, from, to; then, with a tasks
 *     column, its list offsets, item offsets, validity bytes and string data
 *
 * Invariants:
 *  - A load never fails: a missing, stale or corrupt entry is a miss (a
 *    corrupt one with a warning naming it), and every length and offset of
 *    a cache file is checked before use (fuzz_meta_cache), so a damaged
 *    file cannot crash the open or change the model.
 *  - An entry is stored only when the Parquet file's stat data is the same
 *    after the decode as before it (a file rewritten meanwhile is not
 *    cached under the old identity), through a temporary file in the same
 *    folder renamed over the entry, so readers see the old entry or the
 *    new one, never a partial one.
 *  - Only local files are cached (v3.c asks only for local roots).
 */
#define _GNU_SOURCE /* realpath, pread, mkstemp, O_CLOEXEC, st_mtim */
#include "dataset/meta_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC "VFMETAC\n"
#define TABLE_MAGIC "VFTABLE\n"
#define BYTE_ORDER_MARK 0x01020304u
#define HEADER_BYTES 112
#define CRC_AT 104
#define COVERED_AT 108 /* u32: bytes after the header under the CRC, in 8-byte units; 0: the whole file */
#define MAX_CACHE_FILE ((uint64_t)1 << 32) /* far above any real entry (~150 bytes per episode) */

enum { HAS_TASKS = 1, LIST_VALID = 2, ITEMS_VALID = 4 };          /* body flags */
enum { ITEMS_STRING = 1, ITEMS_BINARY = 2 };                      /* the task items' type, in the file */

struct vf_ds_meta_cache {
    const char *magic;           /* 8 bytes: "VFMETAC\n" or "VFTABLE\n" */
    uint32_t version;
    const char *ext;             /* ".vfmeta" or ".vftable" */
    const char *what;            /* "metadata" or "table": for messages */
    char *dir;
    char *projection;            /* the column names, '\n'-joined */
    size_t projection_len;
    pthread_mutex_t lock;        /* dir_state */
    int dir_state;               /* 0 not yet created, 1 ready, -1 unusable (stores off) */
    atomic_int stores_off;
    atomic_int corrupt_seen;     /* damaged entries met: the first is a warning, the rest debug lines */
};

static inline size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* ---- columns ----------------------------------------------------------------- */

void vf_ds_episodes_columns_free(vf_ds_episodes_columns *c)
{
    if (!c)
        return;
    if (!c->backing) {
        for (int k = 0; k < VF_DS_EP_NFIXED; k++)
            free(c->fixed[k]);
        for (size_t k = 0; k < c->num_cameras; k++) {
            if (c->vchunk)
                free(c->vchunk[k]);
            if (c->vfile)
                free(c->vfile[k]);
            if (c->vfrom)
                free(c->vfrom[k]);
            if (c->vto)
                free(c->vto[k]);
        }
        vf_pq_array_free(&c->tasks);
    }
    free(c->vchunk);
    free(c->vfile);
    free(c->vfrom);
    free(c->vto);
    free(c->backing);
    memset(c, 0, sizeof *c);
}

void vf_ds_meta_key_free(vf_ds_meta_key *key)
{
    if (!key)
        return;
    free(key->ident);
    memset(key, 0, sizeof *key);
}

/* ---- encoding ------------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}


/* A cache file as the parts it is made of, each followed by zeros up to
 * a multiple of 8 bytes: the header, then pointers to the caller's
 * arrays, so that a store writes the columns without copying them into
 * one buffer first (2 x 180 MB at 1M episodes). */
typedef struct part {
    const void *data;
    size_t len;
} part;

typedef struct layout {
    uint8_t header[HEADER_BYTES];
    int64_t counts[6];           /* rows, cameras, flags, item type, items, data bytes */
    part *parts;
    size_t num_parts;
    size_t total;
} layout;

static const uint8_t zeros[8];

/* CRC-32 of the file the layout describes, without its CRC field. zlib's
 * crc32 takes a uInt length: long parts go in slices. */
static uLong crc_add(uLong crc, const void *data, size_t len)
{
    for (size_t at = 0; at < len;) {
        size_t n = VF_MIN(len - at, (size_t)1 << 30);
        crc = crc32(crc, (const Bytef *)data + at, (uInt)n);
        at += n;
    }
    return crc;
}

static void add_part(layout *l, const void *data, size_t len)
{
    l->parts[l->num_parts++] = (part){data, len};
    l->total += pad8(len);
}

/* Fills the header of layout l (whose parts after the ident are the body)
 * and its CRC, over the header and the first crc_parts parts (all of them
 * when crc_parts is SIZE_MAX: the metadata cache; the table cache checks
 * its column data per episode instead, so that a reader touches only what
 * it uses); l->total becomes the file's size. */
static void finish_layout(const char *magic, uint32_t version, const vf_ds_meta_key *key, layout *l,
                          size_t crc_parts)
{
    uint8_t *h = l->header;
    memcpy(h, magic, 8);
    put_u32(h + 8, version);
    put_u32(h + 12, BYTE_ORDER_MARK);
    put_u64(h + 16, key->size);
    put_u64(h + 24, key->mtime_ns);
    put_u64(h + 32, key->ctime_ns);
    put_u64(h + 40, key->inode);
    put_u64(h + 48, key->device);
    memcpy(h + 56, key->tail_sha256, 32);
    put_u64(h + 88, key->ident_len);
    put_u64(h + 96, l->total - pad8(key->ident_len)); /* the body */
    size_t covered = 0;
    if (crc_parts < l->num_parts) {
        for (size_t i = 0; i < crc_parts; i++)
            covered += pad8(l->parts[i].len);
        put_u32(h + COVERED_AT, (uint32_t)(covered / 8));
    } else {
        put_u32(h + COVERED_AT, 0);
        crc_parts = l->num_parts;
    }
    uLong crc = crc_add(crc_add(crc32(0L, Z_NULL, 0), h, CRC_AT), h + CRC_AT + 4, HEADER_BYTES - CRC_AT - 4);
    for (size_t i = 0; i < crc_parts; i++)
        crc = crc_add(crc_add(crc, l->parts[i].data, l->parts[i].len), zeros, pad8(l->parts[i].len) - l->parts[i].len);
    put_u32(h + CRC_AT, (uint32_t)crc);
    l->total += HEADER_BYTES;
}

static int build_layout(const vf_ds_meta_key *key, const vf_ds_episodes_columns *cols, layout *l)
{
    memset(l, 0, sizeof *l);
    const vf_pq_array *list = cols->tasks.type == VF_PQ_T_LIST ? &cols->tasks : NULL;
    const vf_pq_array *items = list ? &list->children[0] : NULL;
    size_t rows = (size_t)cols->rows, nc = cols->num_cameras;
    l->parts = vf_malloc_array(2 + VF_DS_EP_NFIXED + 4 * nc + 5, sizeof *l->parts);
    if (!l->parts)
        return VF_ENOMEM;
    l->counts[0] = cols->rows;
    l->counts[1] = (int64_t)nc;
    l->counts[2] = list ? HAS_TASKS | (list->valid ? LIST_VALID : 0) | (items->valid ? ITEMS_VALID : 0) : 0;
    l->counts[3] = !items ? 0 : items->type == VF_PQ_T_STRING ? ITEMS_STRING : ITEMS_BINARY;
    l->counts[4] = items ? items->length : 0;
    l->counts[5] = items ? items->data_len : 0;
    add_part(l, key->ident, key->ident_len);
    add_part(l, l->counts, sizeof l->counts);
    for (int k = 0; k < VF_DS_EP_NFIXED; k++)
        add_part(l, cols->fixed[k], rows * 8);
    for (size_t c = 0; c < nc; c++) {
        add_part(l, cols->vchunk[c], rows * 8);
        add_part(l, cols->vfile[c], rows * 8);
        add_part(l, cols->vfrom[c], rows * 8);
        add_part(l, cols->vto[c], rows * 8);
    }
    if (list) {
        size_t num_items = (size_t)items->length;
        add_part(l, list->offsets, (rows + 1) * 8);
        add_part(l, items->offsets, (num_items + 1) * 8);
        if (list->valid)
            add_part(l, list->valid, rows);
        if (items->valid)
            add_part(l, items->valid, num_items);
        add_part(l, items->data, (size_t)items->data_len);
    }
    finish_layout(MAGIC, VF_DS_META_CACHE_VERSION, key, l, SIZE_MAX);
    return 0;
}

/* CRC-32 of a whole cache file's bytes without its CRC field. */
static uint32_t file_crc(const uint8_t *buf, size_t len)
{
    uLong crc = crc_add(crc32(0L, Z_NULL, 0), buf, CRC_AT);
    return (uint32_t)crc_add(crc, buf + CRC_AT + 4, len - CRC_AT - 4);
}

int vf_ds_meta_cache_encode(const vf_ds_meta_key *key, const vf_ds_episodes_columns *cols, uint8_t **out,
                            size_t *len)
{
    *out = NULL;
    *len = 0;
    layout l;
    int r = build_layout(key, cols, &l);
    uint8_t *buf = r == 0 ? vf_malloc(l.total) : NULL;
    if (r == 0 && !buf)
        r = VF_ENOMEM;
    if (r == 0) {
        uint8_t *p = buf;
        memcpy(p, l.header, HEADER_BYTES);
        p += HEADER_BYTES;
        for (size_t i = 0; i < l.num_parts; i++) {
            if (l.parts[i].len)
                memcpy(p, l.parts[i].data, l.parts[i].len);
            memset(p + l.parts[i].len, 0, pad8(l.parts[i].len) - l.parts[i].len);
            p += pad8(l.parts[i].len);
        }
        *out = buf;
        *len = l.total;
    }
    free(l.parts);
    return r;
}

/* ---- decoding ------------------------------------------------------------------- */

typedef struct reader {
    uint8_t *p, *end;
} reader;

/* The next count elements of size bytes, or NULL when they do not fit. */
static void *take(reader *r, uint64_t count, size_t size)
{
    uint64_t left = (uint64_t)(r->end - r->p);
    if (count > left / size || pad8((size_t)(count * size)) > left)
        return NULL;
    void *at = r->p;
    r->p += pad8((size_t)(count * size));
    return at;
}

static int corrupt(const char *what) { return vf_error(VF_ECORRUPT, "metadata cache entry: %s", what); }

/* Offsets [count+1] ascending within [0, limit]. */
static int offsets_ok(const int64_t *o, int64_t count, int64_t limit)
{
    if (o[0] < 0)
        return 0;
    for (int64_t i = 0; i < count; i++)
        if (o[i + 1] < o[i])
            return 0;
    return o[count] <= limit;
}

static int decode_body(reader *rd, size_t num_cameras, vf_ds_episodes_columns *c)
{
    int64_t *head = take(rd, 6, 8);
    if (!head)
        return corrupt("truncated body");
    int64_t rows = head[0], cameras = head[1], flags = head[2], item_type = head[3], num_items = head[4],
            data_len = head[5];
    if (rows < 0 || num_items < 0 || data_len < 0 || (flags & ~(int64_t)(HAS_TASKS | LIST_VALID | ITEMS_VALID)))
        return corrupt("bad counts");
    if (cameras != (int64_t)num_cameras)
        return VF_ENOENT; /* another projection: cannot happen with a matching key, but harmless */
    c->rows = rows;
    c->num_cameras = num_cameras;
    size_t nc = num_cameras ? num_cameras : 1;
    c->vchunk = vf_calloc(nc, sizeof *c->vchunk);
    c->vfile = vf_calloc(nc, sizeof *c->vfile);
    c->vfrom = vf_calloc(nc, sizeof *c->vfrom);
    c->vto = vf_calloc(nc, sizeof *c->vto);
    if (!c->vchunk || !c->vfile || !c->vfrom || !c->vto)
        return VF_ENOMEM;
    for (int k = 0; k < VF_DS_EP_NFIXED; k++)
        if (!(c->fixed[k] = take(rd, (uint64_t)rows, 8)))
            return corrupt("truncated columns");
    for (size_t k = 0; k < num_cameras; k++)
        if (!(c->vchunk[k] = take(rd, (uint64_t)rows, 8)) || !(c->vfile[k] = take(rd, (uint64_t)rows, 8)) ||
            !(c->vfrom[k] = take(rd, (uint64_t)rows, 8)) || !(c->vto[k] = take(rd, (uint64_t)rows, 8)))
            return corrupt("truncated camera columns");
    if (!(flags & HAS_TASKS)) {
        if (flags || num_items || data_len)
            return corrupt("task data without a tasks column");
    } else {
        if (item_type != ITEMS_STRING && item_type != ITEMS_BINARY)
            return corrupt("bad task item type");
        vf_pq_array *list = &c->tasks, *items = &c->task_items;
        list->type = VF_PQ_T_LIST;
        list->length = rows;
        list->num_children = 1;
        list->children = items;
        items->type = item_type == ITEMS_STRING ? VF_PQ_T_STRING : VF_PQ_T_BINARY;
        items->length = num_items;
        items->data_len = data_len;
        if (!(list->offsets = take(rd, (uint64_t)rows + 1, 8)) ||
            !(items->offsets = take(rd, (uint64_t)num_items + 1, 8)) ||
            ((flags & LIST_VALID) && !(list->valid = take(rd, (uint64_t)rows, 1))) ||
            ((flags & ITEMS_VALID) && !(items->valid = take(rd, (uint64_t)num_items, 1))) ||
            !(items->data = take(rd, (uint64_t)data_len, 1)))
            return corrupt("truncated tasks");
        if (!offsets_ok(list->offsets, rows, num_items) || !offsets_ok(items->offsets, num_items, data_len))
            return corrupt("task offsets out of order or out of range");
        for (int64_t i = 0; list->valid && i < rows; i++)
            list->null_count += list->valid[i] == 0;
        for (int64_t i = 0; items->valid && i < num_items; i++)
            items->null_count += items->valid[i] == 0;
    }
    if (rd->p != rd->end)
        return corrupt("trailing bytes");
    return 0;
}

/* The checks of a cache file's header (magic, version, lengths, key,
 * CRC): 0 and *body_at (where the body starts), VF_ENOENT when stale,
 * VF_ECORRUPT (message names `what`) when damaged. */
static int check_header(const char *magic, uint32_t version, const char *what, const uint8_t *buf, size_t avail,
                        uint64_t len, const vf_ds_meta_key *key, int verify_checksum, size_t *body_at)
{
    int r = 0;
    uint64_t ident_len = avail >= HEADER_BYTES ? get_u64(buf + 88) : 0;
    uint64_t body_len = avail >= HEADER_BYTES ? get_u64(buf + 96) : 0;
    uint64_t checked = avail >= HEADER_BYTES ? vf_ds_file_cache_checked_len(buf, len) : len; /* under the CRC */
    if (avail < HEADER_BYTES || len < HEADER_BYTES)
        r = vf_error(VF_ECORRUPT, "%s cache entry: shorter than its header", what);
    else if (memcmp(buf, magic, 8))
        r = vf_error(VF_ECORRUPT, "%s cache entry: not a vlafeed %s cache file", what, what);
    else if (get_u32(buf + 8) != version || get_u32(buf + 12) != BYTE_ORDER_MARK)
        r = VF_ENOENT; /* another version or byte order: stale, not damaged */
    else if (ident_len > len || body_len > len || HEADER_BYTES + pad8((size_t)ident_len) + body_len != len ||
             (body_len & 7))
        r = vf_error(VF_ECORRUPT, "%s cache entry: lengths do not match the file size", what);
    else if (checked > len || checked > avail || HEADER_BYTES + pad8((size_t)ident_len) > checked)
        r = vf_error(VF_ECORRUPT, "%s cache entry: checksummed length out of range", what);
    else if (key && (ident_len != key->ident_len || memcmp(buf + HEADER_BYTES, key->ident, key->ident_len) ||
                     get_u64(buf + 16) != key->size || get_u64(buf + 24) != key->mtime_ns ||
                     get_u64(buf + 32) != key->ctime_ns || get_u64(buf + 40) != key->inode ||
                     get_u64(buf + 48) != key->device || memcmp(buf + 56, key->tail_sha256, 32)))
        r = VF_ENOENT; /* the file changed (or another file hashed to this name) */
    else if (verify_checksum && file_crc(buf, (size_t)checked) != get_u32(buf + CRC_AT))
        r = vf_error(VF_ECORRUPT, "%s cache entry: checksum mismatch", what);
    *body_at = r == 0 ? HEADER_BYTES + pad8((size_t)ident_len) : 0;
    return r;
}

int vf_ds_meta_cache_decode(uint8_t *buf, size_t len, const vf_ds_meta_key *key, size_t num_cameras,
                            int verify_checksum, vf_ds_episodes_columns *out)
{
    memset(out, 0, sizeof *out);
    size_t body_at = 0;
    int r = check_header(MAGIC, VF_DS_META_CACHE_VERSION, "metadata", buf, len, len, key, verify_checksum, &body_at);
    if (r == 0) {
        reader rd = {buf + body_at, buf + len};
        r = decode_body(&rd, num_cameras, out);
    }
    out->backing = buf; /* owned either way: freed with the columns */
    if (r < 0) {
        vf_ds_episodes_columns_free(out);
        return r;
    }
    return 0;
}

/* ---- the cache folder -------------------------------------------------------------- */

static int env_off(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "false") || !strcasecmp(v, "no"));
}

static char *cache_root(void)
{
    const char *v = getenv("VF_CACHE_DIR");
    if (v && *v)
        return vf_strdup(v);
    v = getenv("XDG_CACHE_HOME");
    if (v && v[0] == '/') /* the XDG spec: a relative value is ignored */
        return vf_path_join(v, "vlafeed");
    v = getenv("HOME");
    if (v && *v)
        return vf_asprintf("%s/.cache/vlafeed", v);
    return NULL;
}

int vf_ds_file_cache_open(vf_ds_meta_cache **out, int kind, char *const *columns, int num_columns)
{
    *out = NULL;
    if (env_off(kind == VF_DS_CACHE_TABLE ? "VF_TABLE_CACHE" : "VF_META_CACHE"))
        return 0;
    char *root = cache_root();
    if (!root)
        return 0;
    vf_ds_meta_cache *mc = vf_calloc(1, sizeof *mc);
    vf_buf projection = {0};
    int r = mc ? 0 : VF_ENOMEM;
    for (int i = 0; i < num_columns && r == 0; i++)
        r = vf_buf_printf(&projection, "%s%s", i ? "\n" : "", columns[i]);
    if (r == 0) {
        mc->magic = kind == VF_DS_CACHE_TABLE ? TABLE_MAGIC : MAGIC;
        mc->version = kind == VF_DS_CACHE_TABLE ? VF_DS_TABLE_CACHE_VERSION : VF_DS_META_CACHE_VERSION;
        mc->ext = kind == VF_DS_CACHE_TABLE ? ".vftable" : ".vfmeta";
        mc->what = kind == VF_DS_CACHE_TABLE ? "table" : "metadata";
        mc->dir = vf_path_join(root, kind == VF_DS_CACHE_TABLE ? "table" : "meta");
        mc->projection_len = projection.len;
        mc->projection = vf_buf_take_string(&projection);
        if (!mc->dir || !mc->projection)
            r = VF_ENOMEM;
    }
    free(root);
    vf_buf_free(&projection);
    if (r < 0) {
        if (mc) {
            free(mc->dir);
            free(mc->projection);
            free(mc);
        }
        return r;
    }
    pthread_mutex_init(&mc->lock, NULL);
    *out = mc;
    return 0;
}

int vf_ds_meta_cache_open(vf_ds_meta_cache **out, char *const *columns, int num_columns)
{
    return vf_ds_file_cache_open(out, VF_DS_CACHE_META, columns, num_columns);
}

void vf_ds_meta_cache_close(vf_ds_meta_cache *mc)
{
    if (!mc)
        return;
    pthread_mutex_destroy(&mc->lock);
    free(mc->dir);
    free(mc->projection);
    free(mc);
}

const char *vf_ds_meta_cache_dir(const vf_ds_meta_cache *mc) { return mc->dir; }

/* mkdir -p with mode 0700 for what it creates (the XDG spec's mode). */
static int make_private_dirs(const char *path)
{
    char *p = vf_strdup(path);
    if (!p)
        return VF_ENOMEM;
    int r = 0;
    for (char *s = p + 1; r == 0; s++) {
        if (*s && *s != '/')
            continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0700) < 0 && errno != EEXIST)
            r = VF_EIO;
        *s = c;
        if (!c)
            break;
    }
    free(p);
    return r;
}

/* The folder, created at the first store; 0 when it can be written to. */
static int ensure_dir(vf_ds_meta_cache *mc)
{
    pthread_mutex_lock(&mc->lock);
    if (mc->dir_state == 0) {
        mc->dir_state = make_private_dirs(mc->dir) == 0 ? 1 : -1;
        if (mc->dir_state < 0) {
            vf_log(VF_LOG_DEBUG, "%s: %s cache folder cannot be created (%s); not caching", mc->dir, mc->what,
                   strerror(errno));
            atomic_store(&mc->stores_off, 1);
        }
    }
    int r = mc->dir_state > 0 ? 0 : -1;
    pthread_mutex_unlock(&mc->lock);
    return r;
}

/* The cache file of an identity: <dir>/<32 hex digits of SHA-256(version, ident)>.vfmeta */
static char *entry_path(const vf_ds_meta_cache *mc, const vf_ds_meta_key *key)
{
    uint8_t md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    uint32_t version = mc->version;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, &version, sizeof version) &&
             EVP_DigestUpdate(ctx, key->ident, key->ident_len) && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen >= 16;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        return NULL;
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return vf_asprintf("%s/%s%s", mc->dir, hex, mc->ext);
}

static uint64_t ns(struct timespec t) { return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec; }

/* Identity of the file at path as it is now: stat data and tail hash.
 * Opens are non-blocking: a FIFO in the way is refused, not waited on. */
static int take_key(const vf_ds_meta_cache *mc, const char *path, vf_ds_meta_key *key)
{
    memset(key, 0, sizeof *key);
    char *abs = realpath(path, NULL);
    if (!abs)
        return -1;
    int fd = open(abs, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    int r = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? 0 : -1;
    size_t tail = r == 0 ? (size_t)VF_MIN((uint64_t)st.st_size, (uint64_t)VF_DS_META_CACHE_TAIL) : 0;
    uint8_t *buf = r == 0 ? vf_malloc(tail ? tail : 1) : NULL;
    if (r == 0 && (!buf || pread(fd, buf, tail, st.st_size - (off_t)tail) != (ssize_t)tail))
        r = -1;
    unsigned mdlen = 0;
    if (r == 0 && (!EVP_Digest(buf, tail, key->tail_sha256, &mdlen, EVP_sha256(), NULL) || mdlen != 32))
        r = -1;
    free(buf);
    if (fd >= 0)
        close(fd);
    if (r == 0) {
        size_t alen = strlen(abs);
        key->ident_len = alen + 1 + mc->projection_len;
        key->ident = vf_malloc(key->ident_len);
        if (key->ident) {
            memcpy(key->ident, abs, alen + 1);
            memcpy(key->ident + alen + 1, mc->projection, mc->projection_len);
            key->size = (uint64_t)st.st_size;
            key->mtime_ns = ns(st.st_mtim);
            key->ctime_ns = ns(st.st_ctim);
            key->inode = (uint64_t)st.st_ino;
            key->device = (uint64_t)st.st_dev;
            key->valid = 1;
        }
    }
    free(abs);
    return key->valid ? 0 : -1;
}

/* The whole cache file into an 8-byte aligned buffer; -1 when absent or unreadable. */
static int read_entry(const char *path, uint8_t **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    int r = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= MAX_CACHE_FILE ? 0 : -1;
    size_t n = r == 0 ? (size_t)st.st_size : 0;
    uint8_t *buf = r == 0 ? vf_malloc(n ? n : 1) : NULL; /* malloc: aligned for int64 */
    size_t got = 0;
    while (buf && got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (!buf || got != n) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

int vf_ds_meta_cache_load(vf_ds_meta_cache *mc, const char *path, size_t num_cameras, vf_ds_meta_key *key,
                          vf_ds_episodes_columns *out)
{
    memset(out, 0, sizeof *out);
    if (take_key(mc, path, key) < 0)
        return 0;
    char *entry = entry_path(mc, key);
    uint8_t *buf;
    size_t len;
    if (!entry || read_entry(entry, &buf, &len) < 0) {
        free(entry);
        return 0;
    }
    int r = vf_ds_meta_cache_decode(buf, len, key, num_cameras, 1, out);
    if (r == VF_ECORRUPT)
        vf_ds_file_cache_damaged(mc, entry, path);
    free(entry);
    return r == 0;
}

static int write_all(int fd, const void *data, size_t len)
{
    for (size_t done = 0; done < len;) {
        ssize_t k = write(fd, (const uint8_t *)data + done, len - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        done += (size_t)k;
    }
    return 0;
}

/* Writes the file of layout l to a new file in the cache folder and
 * renames it to entry. */
static int write_entry(const char *entry, const layout *l)
{
    char *tmp = vf_asprintf("%s.XXXXXX", entry);
    if (!tmp)
        return VF_ENOMEM;
    int fd = mkstemp(tmp); /* mode 0600 */
    if (fd < 0) {
        free(tmp);
        return VF_EIO;
    }
    int ok = write_all(fd, l->header, HEADER_BYTES) == 0;
    for (size_t i = 0; i < l->num_parts && ok; i++)
        ok = write_all(fd, l->parts[i].data, l->parts[i].len) == 0 &&
             write_all(fd, zeros, pad8(l->parts[i].len) - l->parts[i].len) == 0;
    ok = close(fd) == 0 && ok;
    int r = ok && rename(tmp, entry) == 0 ? 0 : VF_EIO;
    if (r < 0)
        unlink(tmp);
    free(tmp);
    return r;
}

/* 1 when an entry for key may be written now: stores are on, the file is
 * still what key describes (a rewrite during the decode would store new
 * columns under the old identity) and the folder exists. */
static int store_ready(vf_ds_meta_cache *mc, const vf_ds_meta_key *key)
{
    if (!key->valid || atomic_load(&mc->stores_off))
        return 0;
    struct stat st;
    if (stat(key->ident, &st) < 0 || (uint64_t)st.st_size != key->size || ns(st.st_mtim) != key->mtime_ns ||
        ns(st.st_ctim) != key->ctime_ns || (uint64_t)st.st_ino != key->inode || (uint64_t)st.st_dev != key->device)
        return 0;
    return ensure_dir(mc) == 0;
}

int vf_ds_meta_cache_store(vf_ds_meta_cache *mc, const vf_ds_meta_key *key, const vf_ds_episodes_columns *cols)
{
    if (!store_ready(mc, key))
        return 0;
    char *entry = entry_path(mc, key);
    layout l = {0};
    int r = entry ? build_layout(key, cols, &l) : VF_ENOMEM;
    if (r == 0)
        r = write_entry(entry, &l);
    if (r < 0 && !atomic_exchange(&mc->stores_off, 1))
        vf_log(VF_LOG_DEBUG, "%s: %s cache entry cannot be written (%s); not caching", entry ? entry : mc->dir,
               mc->what, strerror(errno));
    free(l.parts);
    free(entry);
    return r == 0;
}

/* ---- pruning -------------------------------------------------------------------- */

/* 1 when the cache file at path is a well-formed entry of this version
 * whose episodes file no longer exists (ENOENT). */
static int source_gone(const vf_ds_meta_cache *mc, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    uint8_t head[HEADER_BYTES + 4096];
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    if (n < HEADER_BYTES || memcmp(head, mc->magic, 8) || get_u32(head + 8) != mc->version ||
        get_u32(head + 12) != BYTE_ORDER_MARK)
        return 0;
    const char *ident = (const char *)head + HEADER_BYTES;
    size_t ident_len = (size_t)VF_MIN(get_u64(head + 88), (uint64_t)(n - HEADER_BYTES));
    if (!memchr(ident, 0, ident_len) || ident[0] != '/')
        return 0; /* no complete absolute path in what was read */
    struct stat st;
    return stat(ident, &st) < 0 && errno == ENOENT;
}

size_t vf_ds_meta_cache_prune(vf_ds_meta_cache *mc)
{
    DIR *dh = opendir(mc->dir);
    if (!dh)
        return 0;
    size_t removed = 0, seen = 0;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(dh)) != NULL && seen < 100000) {
        size_t el = strlen(mc->ext);
        const char *ext = strstr(e->d_name, mc->ext);
        if (!ext || (ext[el] && ext[el] != '.'))
            continue; /* not ours */
        seen++;
        char *path = vf_path_join(mc->dir, e->d_name);
        struct stat st;
        int remove = 0;
        if (path && lstat(path, &st) == 0 && S_ISREG(st.st_mode))
            remove = ext[el] ? now - st.st_mtime > 3600 /* a writer's temporary file, left by a crash */
                             : source_gone(mc, path);
        if (remove && unlink(path) == 0)
            removed++;
        free(path);
    }
    closedir(dh);
    if (removed)
        vf_log(VF_LOG_DEBUG, "%s: removed %zu %s cache files of Parquet files that no longer exist", mc->dir, removed,
               mc->what);
    return removed;
}

/* ---- shared with the table cache (table_cache.c) ---------------------------------- */

int vf_ds_file_cache_key(const vf_ds_meta_cache *mc, const char *path, vf_ds_meta_key *key)
{
    return take_key(mc, path, key);
}

char *vf_ds_file_cache_entry(const vf_ds_meta_cache *mc, const vf_ds_meta_key *key) { return entry_path(mc, key); }

const char *vf_ds_file_cache_what(const vf_ds_meta_cache *mc) { return mc->what; }

int vf_ds_file_cache_writable(vf_ds_meta_cache *mc) { return !atomic_load(&mc->stores_off) && ensure_dir(mc) == 0; }

uint64_t vf_ds_file_cache_checked_len(const uint8_t *header, uint64_t file_len)
{
    uint32_t covered = get_u32(header + COVERED_AT);
    return covered ? HEADER_BYTES + (uint64_t)covered * 8 : file_len;
}

int vf_ds_file_cache_check(int kind, const uint8_t *buf, size_t avail, uint64_t len, const vf_ds_meta_key *key,
                           int verify_checksum, size_t *body_at)
{
    if (kind == VF_DS_CACHE_TABLE)
        return check_header(TABLE_MAGIC, VF_DS_TABLE_CACHE_VERSION, "table", buf, avail, len, key, verify_checksum,
                            body_at);
    return check_header(MAGIC, VF_DS_META_CACHE_VERSION, "metadata", buf, avail, len, key, verify_checksum, body_at);
}

void vf_ds_file_cache_damaged(vf_ds_meta_cache *mc, const char *entry, const char *path)
{
    int first = atomic_fetch_add(&mc->corrupt_seen, 1) == 0;
    vf_log(first ? VF_LOG_WARN : VF_LOG_DEBUG, "%s (cache of %s): %s; decoding the file again%s", entry, path,
           vf_last_error(), first ? " (other damaged entries: VF_LOG=debug)" : "");
}

/* Free bytes of the file system holding dir, or UINT64_MAX when unknown. */
static uint64_t free_bytes(const char *dir)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) < 0)
        return UINT64_MAX;
    return (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
}

int vf_ds_file_cache_store_parts(vf_ds_meta_cache *mc, const vf_ds_meta_key *key, const void *const *data,
                                 const size_t *lens, size_t num_parts, size_t crc_parts)
{
    if (!store_ready(mc, key))
        return 0;
    layout l = {0};
    if (!(l.parts = vf_malloc_array(num_parts + 1, sizeof *l.parts)))
        return VF_ENOMEM;
    add_part(&l, key->ident, key->ident_len);
    for (size_t i = 0; i < num_parts; i++)
        add_part(&l, data[i], lens[i]);
    crc_parts = crc_parts < num_parts ? crc_parts + 1 : SIZE_MAX; /* + the ident */
    finish_layout(mc->magic, mc->version, key, &l, crc_parts);
    /* Leave room: an entry is written only while 1 GiB stays free after it. */
    uint64_t avail = free_bytes(mc->dir);
    if (avail != UINT64_MAX && avail < (uint64_t)l.total + ((uint64_t)1 << 30)) {
        if (!atomic_exchange(&mc->stores_off, 1))
            vf_log(VF_LOG_INFO, "%s: %s cache not written: %.1f GiB free, the entry needs %.1f GiB and 1 GiB is kept "
                                "free",
                   mc->dir, mc->what, (double)avail / (1u << 30), (double)l.total / (1u << 30));
        free(l.parts);
        return 0;
    }
    char *entry = entry_path(mc, key);
    int r = entry ? write_entry(entry, &l) : VF_ENOMEM;
    if (r < 0 && !atomic_exchange(&mc->stores_off, 1))
        vf_log(VF_LOG_DEBUG, "%s: %s cache entry cannot be written (%s); not caching", entry ? entry : mc->dir,
               mc->what, strerror(errno));
    free(l.parts);
    free(entry);
    return r == 0;
}
