/*
 * meta_cache.h: the decoded columns of one v3.0 meta/episodes file, and a
 * persistent on-disk cache of them (meta_cache.c).
 *
 * Decoding a recorder-layout episodes file (10-row row groups, ~120
 * columns of which ~20 are needed) is mostly footer walking: ~18 MB of
 * Thrift per 10,000 episodes. The cache keeps what the v3.0 backend
 * (v3.c) extracts from each file, keyed by the file's absolute path and
 * the projection (the camera keys), and validated on every load against
 * the file's stat data (size, mtime, ctime, inode, device), a SHA-256 of
 * its last 64 KiB (the Parquet footer tail) and a CRC-32 of the cache file
 * itself. Whatever does not match is a miss: the file is decoded again and
 * the cache entry rewritten. A hit yields the same columns a fresh decode
 * would, which go through the same checks (add_episodes in v3.c).
 *
 * Depends on: base, parquet (vf_pq_array), zlib (crc32), libcrypto (SHA-256).
 */
#ifndef VF_DATASET_META_CACHE_H
#define VF_DATASET_META_CACHE_H

#include "dataset/dataset.h"

/* The fixed integer columns of an episodes file, in this order. */
enum {
    VF_DS_EP_INDEX = 0,      /* episode_index */
    VF_DS_EP_LENGTH,         /* length */
    VF_DS_EP_DATA_CHUNK,     /* data/chunk_index */
    VF_DS_EP_DATA_FILE,      /* data/file_index */
    VF_DS_EP_FROM,           /* dataset_from_index */
    VF_DS_EP_TO,             /* dataset_to_index */
    VF_DS_EP_NFIXED
};

/* What v3.c needs from one episodes file: rows x (6 fixed int64 columns,
 * per camera chunk/file int64 and from/to timestamps as double) and the
 * optional `tasks` column (LIST of STRING or BINARY). */
typedef struct vf_ds_episodes_columns {
    int64_t rows;
    size_t num_cameras;
    int64_t *fixed[VF_DS_EP_NFIXED];
    int64_t **vchunk, **vfile;   /* [num_cameras], each [rows] */
    double **vfrom, **vto;
    vf_pq_array tasks;           /* LIST<STRING|BINARY>, or zeroed when the file has no tasks column */
    /* A cache hit: every column array above (and the tasks arrays) points
     * into this one buffer, which is all that is freed with them. */
    uint8_t *backing;
    vf_pq_array task_items;      /* with backing: tasks.children points here */
} vf_ds_episodes_columns;

/* Frees what c owns (either way it was filled) and zeroes it. */
void vf_ds_episodes_columns_free(vf_ds_episodes_columns *c);

/* ---- the cache ------------------------------------------------------------ */

/* The version of the cache file format; a file of another version is a miss. */
#define VF_DS_META_CACHE_VERSION 1
/* Bytes at the end of the Parquet file whose SHA-256 is part of the key. */
#define VF_DS_META_CACHE_TAIL ((size_t)64 << 10)

/* The identity of one version of one episodes file. */
typedef struct vf_ds_meta_key {
    int valid;                   /* 0: the file could not be stat'ed or read; nothing is stored */
    uint64_t size, mtime_ns, ctime_ns, inode, device;
    uint8_t tail_sha256[32];
    char *ident;                 /* absolute path, NUL, projection (owned) */
    size_t ident_len;
} vf_ds_meta_key;
void vf_ds_meta_key_free(vf_ds_meta_key *key);

typedef struct vf_ds_meta_cache vf_ds_meta_cache;

/* A cache for one dataset open, in $VF_CACHE_DIR/meta, else
 * $XDG_CACHE_HOME/vlafeed/meta, else $HOME/.cache/vlafeed/meta. columns:
 * the projection (the names v3.c reads), part of every key. *out is NULL
 * (result 0) when VF_META_CACHE is 0/off/false/no or no folder can be
 * named; the result is < 0 only for ENOMEM. Thread-safe: loads and stores
 * of different files may run at once. The folder is created (mode 0700)
 * at the first store; a folder that cannot be created or written disables
 * the stores of this open with one debug line, never an error. */
int vf_ds_meta_cache_open(vf_ds_meta_cache **out, char *const *columns, int num_columns);
/* The same for either kind of cache (below): VF_DS_CACHE_META (above) or
 * VF_DS_CACHE_TABLE (folder `table`, files *.vftable, off with
 * VF_TABLE_CACHE=0). */
enum { VF_DS_CACHE_META = 0, VF_DS_CACHE_TABLE = 1 };
int vf_ds_file_cache_open(vf_ds_meta_cache **out, int kind, char *const *columns, int num_columns);
void vf_ds_meta_cache_close(vf_ds_meta_cache *mc);
/* The cache's folder (owned by mc). */
const char *vf_ds_meta_cache_dir(const vf_ds_meta_cache *mc);

/* Looks up the episodes file at path (absolute or relative to the current
 * directory). 1: a hit, *out filled (num_cameras camera columns). 0: a
 * miss, *out zeroed; *key identifies the file as read now (key->valid 0 if
 * it could not be stat'ed), to pass to vf_ds_meta_cache_store after a
 * successful decode. A corrupt cache file is a miss with a logged warning.
 * *key is the caller's to free (vf_ds_meta_key_free) either way. */
int vf_ds_meta_cache_load(vf_ds_meta_cache *mc, const char *path, size_t num_cameras, vf_ds_meta_key *key,
                          vf_ds_episodes_columns *out);
/* Stores cols for the file identified by key, atomically (temporary file
 * + rename), unless the file changed since key was taken. 1 written, 0
 * not (never an error). */
int vf_ds_meta_cache_store(vf_ds_meta_cache *mc, const vf_ds_meta_key *key, const vf_ds_episodes_columns *cols);

/* Removes the entries of episodes files that no longer exist (their path
 * is gone: a deleted or moved dataset) and temporary files older than an
 * hour (a writer that crashed); other files are left alone. Returns how
 * many were removed. The v3.0 backend calls it after an open that wrote
 * entries, so the folder does not keep what nothing can use again. */
size_t vf_ds_meta_cache_prune(vf_ds_meta_cache *mc);

/* The cache file format, for the fuzzer and the tests. encode: the bytes
 * of a cache file for key and cols (*out newly allocated, free()). decode:
 * parses a cache file's bytes, taking ownership of buf (a malloc'd buffer,
 * 8-byte aligned) in every case: 0 and *out filled when it is a
 * well-formed entry for key with num_cameras cameras; VF_ENOENT when it
 * is well formed but for another key (stale); VF_ECORRUPT (message set)
 * when it is not well formed. For the fuzzer, to reach the body parser:
 * verify_checksum 0 skips the CRC and key NULL accepts any key. */
int vf_ds_meta_cache_encode(const vf_ds_meta_key *key, const vf_ds_episodes_columns *cols, uint8_t **out,
                            size_t *len);
int vf_ds_meta_cache_decode(uint8_t *buf, size_t len, const vf_ds_meta_key *key, size_t num_cameras,
                            int verify_checksum, vf_ds_episodes_columns *out);

/* ---- the table cache (table_cache.c) ----------------------------------------
 *
 * Map mode's random reads of a large table decode a Parquet page per
 * column for every episode they miss. The table cache keeps, per (data
 * file, projection), the decoded columns of every episode of the file in
 * one cache file; an episode's rows are then one pread per column. It shares the metadata cache's folder logic,
 * keys (path, stat data, tail SHA-256), CRC and atomic stores, in
 * <cache>/table. Only numeric columns (VF_DS_F32, VF_DS_I64) are kept.
 *
 * Body (after the common header and ident; int64 fields, 8-aligned):
 *   columns, entries, rows; per column: type, width;
 *   per entry (episode, ascending by row_offset): row_offset (in the data
 *     file), length, start (row in the cache file), episode_index,
 *     from_index (dataset_from_index: the checks the rows passed), CRC-32
 *     of the episode's values (each column's slice in column order);
 *   per column: rows x width values (float or int64), zero-padded to 8.
 * The header's CRC covers everything up to the column data; a reader
 * checks an episode's CRC when it reads the episode
 * (vf_ds_table_cache_read, pread: nothing is mapped), so opening a file
 * reads only its entries.
 */
#define VF_DS_TABLE_CACHE_VERSION 1
#define VF_DS_TABLE_ENTRY_FIELDS 6

typedef struct vf_ds_table_cache_file {
    int fd;                      /* the cache file, open for preads (-1: none) */
    uint8_t *head;               /* its checksummed start: header .. entries (owned) */
    size_t head_len;
    int64_t rows, num_entries;
    size_t num_columns;
    const int64_t *entries;      /* [num_entries][VF_DS_TABLE_ENTRY_FIELDS], in head */
    uint64_t *column_at;         /* [num_columns]: file offset of each column's values */
    uint64_t file_len;
} vf_ds_table_cache_file;

/* Stores the decoded rows of a data file's episodes: t holds them (as
 * vf_ds_read_table returns them, in ascending row_offset order), with, per
 * episode of t, its row offset in the data file, episode_index and
 * dataset_from_index. Numeric columns only (VF_EINVAL otherwise). 1
 * written, 0 not (a changed file, a folder that cannot be written, too
 * little free space: never an error), < 0 for ENOMEM. */
int vf_ds_table_cache_store(vf_ds_meta_cache *mc, const vf_ds_meta_key *key, const vf_ds_table *t,
                            const int64_t *row_offsets, const int64_t *episode_index, const int64_t *from_index);
/* Opens the cache file of the data file at path for columns of the given
 * types and widths, reading and checking its entries (not its values).
 * 1: a hit, *out filled; 0: a miss (*key identifies the file now, for a
 * store; key->valid 0 when it cannot be read). A damaged cache file is a
 * miss with one warning per cache. *key is the caller's to free. */
int vf_ds_table_cache_open(vf_ds_meta_cache *mc, const char *path, const int *types, const int64_t *widths,
                          size_t num_columns, vf_ds_meta_key *key, vf_ds_table_cache_file *out);
/* The entry of an episode by its row offset in the data file, or NULL. */
const int64_t *vf_ds_table_cache_find(const vf_ds_table_cache_file *f, int64_t row_offset);
/* Reads entry x's rows of every column into dest[i] (x[1] x widths[i]
 * values each) and, with check, compares their CRC: 0, VF_EIO or
 * VF_ECORRUPT (checksum mismatch). Thread-safe (pread). A reader checks an
 * episode the first time it reads it from an open cache file (its fd
 * keeps that version of the file, whatever replaces the name). */
int vf_ds_table_cache_read(const vf_ds_table_cache_file *f, const int *types, const int64_t *widths,
                           const int64_t *x, void *const *dest, int check);
void vf_ds_table_cache_close(vf_ds_table_cache_file *f);
/* The format's parser, for the fuzzer and tests: buf (8-byte aligned) holds
 * the first avail bytes of a cache file of file_len bytes (at least its
 * checksummed start). 0 and *out filled (head copied; fd -1), VF_ENOENT
 * (stale: another key or version) or VF_ECORRUPT. key NULL accepts any
 * key; types NULL any column types. */
int vf_ds_table_cache_parse(const uint8_t *buf, size_t avail, uint64_t file_len, const vf_ds_meta_key *key,
                            const int *types, const int64_t *widths, size_t num_columns, int verify_checksum,
                            vf_ds_table_cache_file *out);

/* Internal to meta_cache.c / table_cache.c: the shared pieces. */
int vf_ds_file_cache_key(const vf_ds_meta_cache *mc, const char *path, vf_ds_meta_key *key);
char *vf_ds_file_cache_entry(const vf_ds_meta_cache *mc, const vf_ds_meta_key *key);
/* Checks a cache file's header given its first avail bytes (at least its
 * checksummed start) and its length: 0 and *body_at, VF_ENOENT (stale) or
 * VF_ECORRUPT. */
int vf_ds_file_cache_check(int kind, const uint8_t *buf, size_t avail, uint64_t len, const vf_ds_meta_key *key,
                           int verify_checksum, size_t *body_at);
/* Stores body parts (each zero-padded to 8 bytes) for key, atomically,
 * when the file is unchanged and the folder writable: 1 written, 0 not.
 * The header's CRC covers the header, the ident and the first crc_parts
 * parts (SIZE_MAX: all); the length it covers is in the header. */
int vf_ds_file_cache_store_parts(vf_ds_meta_cache *mc, const vf_ds_meta_key *key, const void *const *data,
                                 const size_t *lens, size_t num_parts, size_t crc_parts);
/* Logs a damaged entry: a warning the first time for this cache, then debug lines. */
void vf_ds_file_cache_damaged(vf_ds_meta_cache *mc, const char *entry, const char *path);
/* Bytes of a cache file of file_len bytes that its CRC covers, from its
 * 112-byte header: the header, the ident and what the store's crc_parts
 * named (the whole file for the metadata cache). Not checked: the caller
 * compares it with what it can read. */
uint64_t vf_ds_file_cache_checked_len(const uint8_t *header, uint64_t file_len);
/* The kind's name in messages: "metadata" or "table". */
const char *vf_ds_file_cache_what(const vf_ds_meta_cache *mc);
/* 1 while stores can be made: the folder exists or was created, and no
 * store failed. */
int vf_ds_file_cache_writable(vf_ds_meta_cache *mc);

#endif
