/*
 * parquet.h: vlafeed's Parquet reader and writer (the whole interface of
 * src/parquet/ to the layers above).
 *
 * No C Parquet library is packaged for this platform, so this layer
 * implements the format: Thrift compact protocol, schema tree and
 * definition/repetition levels, data pages v1/v2, PLAIN and dictionary
 * encodings, the RLE/bit-packed hybrid, the codecs through zlib, zstd and
 * snappy, and Dremel record assembly into columnar arrays. It is verified
 * value for value against pyarrow (tests/python/test_parquet_pyarrow.py).
 *
 * Depends on: base, io.
 *
 * Data model (Arrow-like):
 *  - Reading a top-level field of one row group (or of the whole file)
 *    yields a vf_pq_array: `length` elements, optional per-element validity
 *    bytes, and either fixed-width values, offsets+bytes (strings/binary),
 *    offsets+one child (LIST) or children (STRUCT).
 *  - The array owns all its memory; vf_pq_array_free() releases it.
 *  - Errors name the file, the column path and the row group / page.
 */
#ifndef VF_PARQUET_H
#define VF_PARQUET_H

#include "io/io.h"

/* ---- format enums (values are the Parquet Thrift values) ------------- */

typedef enum vf_pq_physical {
    VF_PQ_BOOLEAN = 0,
    VF_PQ_INT32 = 1,
    VF_PQ_INT64 = 2,
    VF_PQ_INT96 = 3,
    VF_PQ_FLOAT = 4,
    VF_PQ_DOUBLE = 5,
    VF_PQ_BYTE_ARRAY = 6,
    VF_PQ_FIXED_LEN_BYTE_ARRAY = 7,
} vf_pq_physical;

typedef enum vf_pq_repetition {
    VF_PQ_REQUIRED = 0,
    VF_PQ_OPTIONAL = 1,
    VF_PQ_REPEATED = 2,
} vf_pq_repetition;

/* Pages are read and written uncompressed or in SNAPPY, GZIP or ZSTD (snappy,
 * zlib and zstd do the work); the other codecs are named so that a file
 * using them is refused by name. */
typedef enum vf_pq_codec {
    VF_PQ_UNCOMPRESSED = 0,
    VF_PQ_SNAPPY = 1, /* the default of pyarrow and LeRobot's writers */
    VF_PQ_GZIP = 2,
    VF_PQ_LZO = 3,    /* refused */
    VF_PQ_BROTLI = 4, /* refused */
    VF_PQ_LZ4 = 5,    /* refused (Hadoop's framing) */
    VF_PQ_ZSTD = 6,
    VF_PQ_LZ4_RAW = 7, /* refused */
} vf_pq_codec;

/* ---- value types of assembled arrays --------------------------------- */

typedef enum vf_pq_type {
    VF_PQ_T_NULL = 0,  /* unknown / unsupported leaf (never returned by reads) */
    VF_PQ_T_BOOL,      /* values: uint8_t 0/1 */
    VF_PQ_T_INT8,      /* values: int8_t   (INT32 + INTEGER(8, signed)) */
    VF_PQ_T_INT16,     /* values: int16_t  */
    VF_PQ_T_INT32,     /* values: int32_t  */
    VF_PQ_T_INT64,     /* values: int64_t  */
    VF_PQ_T_UINT8,     /* values: uint8_t  */
    VF_PQ_T_UINT16,    /* values: uint16_t */
    VF_PQ_T_UINT32,    /* values: uint32_t */
    VF_PQ_T_UINT64,    /* values: uint64_t */
    VF_PQ_T_FLOAT16,   /* values: uint16_t IEEE half bits (FLBA(2) + FLOAT16) */
    VF_PQ_T_FLOAT,     /* values: float  */
    VF_PQ_T_DOUBLE,    /* values: double */
    VF_PQ_T_STRING,    /* offsets (length+1) into data; UTF-8 */
    VF_PQ_T_BINARY,    /* offsets (length+1) into data */
    VF_PQ_T_FIXED_BINARY, /* values: length * width bytes */
    VF_PQ_T_LIST,      /* offsets (length+1) into children[0] */
    VF_PQ_T_STRUCT,    /* children[0..num_children), each `length` long */
} vf_pq_type;

/* Bytes per element of a fixed-width type (0 for the others). */
size_t vf_pq_type_size(vf_pq_type t);
const char *vf_pq_type_name(vf_pq_type t);

/* ---- schema ----------------------------------------------------------- */

typedef struct vf_pq_node vf_pq_node;
struct vf_pq_node {
    char *name;
    vf_pq_repetition repetition;
    int is_leaf;
    /* leaves */
    vf_pq_physical physical;
    int32_t type_length;       /* FIXED_LEN_BYTE_ARRAY width */
    int leaf_index;            /* column order among leaves; -1 for groups */
    int16_t max_def;           /* root excluded */
    int16_t max_rep;
    /* resolved value type: a scalar type for leaves; LIST or STRUCT for
     * groups (a group annotated LIST/converted LIST, or a legacy repeated
     * field, resolves to LIST) */
    vf_pq_type type;
    int converted_type;        /* Thrift ConvertedType, -1 if absent */
    int logical_type;          /* Thrift LogicalType union field id, 0 if absent */
    /* tree */
    vf_pq_node *parent;
    int num_children;
    vf_pq_node **children;
};

/* ---- arrays ----------------------------------------------------------- */

typedef struct vf_pq_array vf_pq_array;
struct vf_pq_array {
    vf_pq_type type;
    char *name;               /* field name (owned) */
    int64_t length;
    int64_t null_count;
    uint8_t *valid;           /* length bytes, 1 = valid; NULL when no nulls */
    void *values;             /* fixed-width payload (see vf_pq_type) */
    int32_t width;            /* FIXED_BINARY bytes per value */
    int64_t *offsets;         /* STRING/BINARY/LIST: length+1 entries */
    uint8_t *data;            /* STRING/BINARY bytes */
    int64_t data_len;
    int num_children;
    vf_pq_array *children;    /* LIST: 1; STRUCT: num_children */
};

/* Frees everything an array owns and zeroes it (safe on a zeroed array). */
void vf_pq_array_free(vf_pq_array *a);
/* Frees arrays[0..n). */
void vf_pq_arrays_free(vf_pq_array *arrays, int n);

/* Builders for the writer (the array owns what they allocate; on failure
 * free it with vf_pq_array_free). A zero-filled column of `length` values of
 * a fixed-width `type`; a STRING column of the n NUL-terminated strings. */
int vf_pq_array_init_scalar(vf_pq_array *a, const char *name, vf_pq_type type, int64_t length);
int vf_pq_array_init_strings(vf_pq_array *a, const char *name, const char *const *strings, int64_t n);

/* ---- reader ----------------------------------------------------------- */

typedef struct vf_pq_file vf_pq_file;

/* Opens a Parquet file: checks both magics, decodes the footer and builds
 * the schema tree. Takes its own reference on src. A leaf of a type the
 * reader cannot decode (INT96, ...) has type VF_PQ_T_NULL: opening works,
 * reading that field fails with VF_EUNSUPPORTED.
 *
 * After open the file is immutable: reads of any fields and row groups
 * may run concurrently on several threads (the source is read
 * positionally; each read keeps its own buffers). */
int vf_pq_open(vf_pq_file **out, vf_source *src);
/* The same, keeping only the column-chunk metadata of the named top-level
 * fields: the footer entries of every other column are skipped while it
 * is decoded, so a wide file with many small row groups (LeRobot's
 * meta/episodes with its stats columns) opens in time and memory
 * proportional to the columns used. Schema, row counts and key-value
 * metadata are complete; reads, statistics and chunk info of a field not
 * named fail with VF_EINVAL naming it. Names that are not in the file are
 * ignored. fields NULL: like vf_pq_open(). */
int vf_pq_open_projected(vf_pq_file **out, vf_source *src, const char *const *fields, int num_fields);
/* Convenience: opens a local path. */
int vf_pq_open_path(vf_pq_file **out, const char *path);
void vf_pq_close(vf_pq_file *f);
/* Estimated memory the open file holds: the footer's size, its decoded
 * metadata and the page indexes reads built (see vf_pq_read_field_rows);
 * for caches of open files. Thread-safe. */
size_t vf_pq_memory_bytes(vf_pq_file *f);
/* Frees the decoded dictionaries the page indexes keep (the biggest part
 * of an open file that reads rebuild cheaply); returns the bytes freed.
 * The page indexes stay. Only while no read uses f. */
size_t vf_pq_drop_kept_dictionaries(vf_pq_file *f);

const char *vf_pq_name(const vf_pq_file *f);       /* the source name */
int64_t vf_pq_num_rows(const vf_pq_file *f);
int vf_pq_num_row_groups(const vf_pq_file *f);
int64_t vf_pq_row_group_rows(const vf_pq_file *f, int row_group);
const char *vf_pq_created_by(const vf_pq_file *f); /* "" if absent */
/* The row group holding file row `row` (0-based over the whole file), by
 * binary search over the cumulative row counts; *first_row (may be NULL)
 * gets that group's first file row. -1 when row is outside the file. */
int vf_pq_row_group_of_row(const vf_pq_file *f, int64_t row, int64_t *first_row);

/* Schema: the root group, its top-level fields, and the leaves in column
 * order. Nodes are owned by the file. Names are compared exactly (a name
 * such as "observation.state" is one element: dots are not separators). */
const vf_pq_node *vf_pq_schema(const vf_pq_file *f);
int vf_pq_num_fields(const vf_pq_file *f);
const vf_pq_node *vf_pq_field(const vf_pq_file *f, int field_index);
int vf_pq_field_index(const vf_pq_file *f, const char *name); /* -1 if absent */
int vf_pq_num_leaves(const vf_pq_file *f);
const vf_pq_node *vf_pq_leaf(const vf_pq_file *f, int leaf_index);

/* Key-value metadata (e.g. "huggingface", "pandas", "ARROW:schema"). The
 * value is owned by the file; NULL if the key is absent. */
const char *vf_pq_kv(const vf_pq_file *f, const char *key);
int vf_pq_num_kv(const vf_pq_file *f);
void vf_pq_kv_at(const vf_pq_file *f, int i, const char **key, const char **value);

/* Codec of a leaf's column chunk in a row group. */
vf_pq_codec vf_pq_column_codec(const vf_pq_file *f, int row_group, int leaf_index);

/* Metadata of one column chunk (for inspection tools). Pointers are owned
 * by the file. Statistics are the raw PLAIN bytes of min_value/max_value
 * (or of the deprecated min/max, flagged by stats_deprecated); NULL when
 * absent. Returns VF_ERANGE for a bad row group or leaf. */
typedef struct vf_pq_chunk_info {
    vf_pq_codec codec;
    int64_t num_values;        /* level entries, nulls included */
    int64_t compressed_size, uncompressed_size;
    int64_t data_page_offset;
    int64_t dictionary_page_offset; /* -1 when absent */
    int64_t null_count;        /* -1 when absent */
    const uint8_t *min, *max;
    size_t min_len, max_len;
    int stats_deprecated;
} vf_pq_chunk_info;
int vf_pq_column_chunk(const vf_pq_file *f, int row_group, int leaf_index, vf_pq_chunk_info *out);

/* Caps what one read may decode per leaf column: level entries and bytes
 * of values (a few bytes of RLE can claim billions of values). Exceeding
 * a cap fails with VF_EUNSUPPORTED. Defaults are far above any real file
 * (2^34 entries, 256 GiB); fuzzers lower them. 0 restores a default. */
void vf_pq_set_limits(vf_pq_file *f, int64_t max_entries, int64_t max_bytes);

/* Min/max statistics of an integer leaf (INT32 or INT64) in a row group.
 * Returns 0, VF_ENOENT when the chunk has no statistics. */
int vf_pq_stats_i64(const vf_pq_file *f, int row_group, int leaf_index, int64_t *min, int64_t *max);

/* Row groups whose statistics for the integer top-level scalar column
 * `name` overlap [lo, hi]. *row_groups is newly allocated (free()); a row
 * group without statistics is always included. */
int vf_pq_select_row_groups(const vf_pq_file *f, const char *name, int64_t lo, int64_t hi,
                            int **row_groups, int *count);

/* Reads one top-level field (projection) of one row group into *out,
 * assembling nested lists and structs. *out is overwritten (not freed);
 * on failure it is left zeroed. Fixed-width payloads hold one element per
 * slot (zero in null slots); `values`/`data` may be NULL when there is
 * nothing to hold. Codecs: UNCOMPRESSED, SNAPPY, GZIP, ZSTD; encodings:
 * PLAIN, dictionary, RLE (booleans), BYTE_STREAM_SPLIT; others fail with
 * VF_EUNSUPPORTED naming them. Errors name the file, column path, row
 * group and page. */
int vf_pq_read_field(vf_pq_file *f, int row_group, int field_index, vf_pq_array *out);
/* Data pages a read decoded, and skipped without fetching or decoding. */
typedef struct vf_pq_page_counts {
    int64_t decoded, skipped;
} vf_pq_page_counts;
/* Rows [first_row, first_row + num_rows) of one row group of a field
 * (page-level reads): a data page whose header tells its rows (every page
 * of a non-repeated column, and v2 pages) is neither fetched nor decoded
 * when it lies before the range, and no page after the range is read; a
 * repeated column in v1 pages is decoded from the chunk's first page up
 * to the range's end. *out holds exactly the range. *pages (optional)
 * gets the page counts. A big column chunk (at least
 * VF_PQ_PAGE_INDEX_MIN_BYTES) read from a row past its start gets a page
 * index the first time, kept with the open file: each data page's offset
 * and first row (a repeated column's v1 pages decompressed once for their
 * repetition levels), so later reads of the chunk go straight to the page
 * holding their first row, whatever the column, and decode only the pages
 * of their range. The environment variable VF_PQ_PAGE_INDEX_MIN_BYTES
 * overrides the size at open (tests). */
#define VF_PQ_PAGE_INDEX_MIN_BYTES (128 * 1024)
/* Sets the chunk size from which page-level reads build a page index (0:
 * VF_PQ_PAGE_INDEX_MIN_BYTES); the fuzzer lowers it to reach the index
 * with small inputs. Call before reading. */
void vf_pq_set_page_index_min(vf_pq_file *f, int64_t bytes);
int vf_pq_read_field_rows(vf_pq_file *f, int row_group, int field_index, int64_t first_row, int64_t num_rows,
                          vf_pq_array *out, vf_pq_page_counts *pages);
/* The same over every row group, concatenated. */
int vf_pq_read_field_all(vf_pq_file *f, int field_index, vf_pq_array *out);
/* Several fields over every row group (out[k] for field_index[k]), row
 * group by row group: the wanted chunks of a row group are fetched with
 * one read when they lie within a few MiB, which is what makes a wide
 * file with many small row groups cheap to read. On failure every out[k]
 * is left zeroed. */
int vf_pq_read_fields_all(vf_pq_file *f, const int *field_index, int num_fields, vf_pq_array *out);

/* ---- writer ----------------------------------------------------------- */

typedef struct vf_pq_writer_settings {
    vf_pq_codec codec;        /* UNCOMPRESSED, SNAPPY (default), GZIP, ZSTD */
    int dictionary;           /* 1: dictionary-encode (default), 0: PLAIN */
    int data_page_version;    /* 1 (default) or 2 */
    size_t page_size;         /* target uncompressed bytes per data page (1 MiB) */
    const char *created_by;   /* default "vlafeed version X" */
} vf_pq_writer_settings;

void vf_pq_writer_defaults(vf_pq_writer_settings *s);

typedef struct vf_pq_writer vf_pq_writer;

/* Creates path (truncating). The schema is taken from the first row group's
 * arrays: every field OPTIONAL (as pyarrow writes), LIST as the 3-level
 * `list`/`element` form, STRUCT as a group. */
int vf_pq_writer_open(vf_pq_writer **out, const char *path, const vf_pq_writer_settings *s);
int vf_pq_writer_add_kv(vf_pq_writer *w, const char *key, const char *value);
/* Writes one row group from num_fields top-level arrays of equal length;
 * later row groups must have the same names and types. The arrays stay the
 * caller's. */
int vf_pq_writer_write_row_group(vf_pq_writer *w, const vf_pq_array *fields, int num_fields);
/* Bytes of the file so far (row groups written, the footer not yet): what
 * its size will be before close, e.g. for a size-based rollover. */
int64_t vf_pq_writer_bytes(const vf_pq_writer *w);
/* Writes the footer and closes the file; frees w in every case. */
int vf_pq_writer_close(vf_pq_writer *w);
/* Closes and deletes a partly written file; frees w. */
void vf_pq_writer_abort(vf_pq_writer *w);

/* A whole file in one call: path (truncated) with the default settings,
 * one row group from the arrays and, when kv_key is set, one key-value
 * pair. A failure leaves no partial file. */
int vf_pq_write_file(const char *path, const vf_pq_array *fields, int num_fields, const char *kv_key,
                     const char *kv_value);

#endif
