/*
 * read_internal.h: shared internals of the Parquet reader (metadata.c,
 * rle.c, page.c, assemble.c, reader.c). Not used by the writer.
 *
 * Data flow of a read: metadata.c decodes the footer once into a
 * vf_pq_file (schema nodes, per-field assembly plans, row-group and
 * column-chunk metadata). A read decodes every leaf under the requested
 * field, chunk by chunk, into a vf_pq_column (page.c: levels as bytes,
 * present values densely in their final in-memory type), then assembles
 * the leaves into one vf_pq_array tree (assemble.c, Dremel).
 *
 * Invariants:
 *  - Levels are stored as uint8 (schemas nesting deeper than
 *    VF_PQ_MAX_NESTING are refused at open, so every level fits).
 *  - A vf_pq_column's def/rep arrays are NULL when the leaf's max_def /
 *    max_rep is 0; values hold exactly the entries whose def == max_def.
 *  - Every level written into a column has been checked <= its maximum,
 *    and every dictionary index < the dictionary size, before use.
 */
#ifndef VF_PQ_READ_INTERNAL_H
#define VF_PQ_READ_INTERNAL_H

#include <pthread.h>

#include "parquet/parquet.h"
#include "parquet/thrift.h"

/* Schema depth limit (levels stay far below 255). */
#define VF_PQ_MAX_NESTING 64

/* Thrift enums used by the reader. */
enum { VF_PQ_PAGE_DATA = 0, VF_PQ_PAGE_INDEX = 1, VF_PQ_PAGE_DICTIONARY = 2, VF_PQ_PAGE_DATA_V2 = 3 };
enum {
    VF_PQ_ENC_PLAIN = 0,
    VF_PQ_ENC_PLAIN_DICTIONARY = 2,
    VF_PQ_ENC_RLE = 3,
    VF_PQ_ENC_BIT_PACKED = 4,
    VF_PQ_ENC_DELTA_BINARY_PACKED = 5,
    VF_PQ_ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
    VF_PQ_ENC_DELTA_BYTE_ARRAY = 7,
    VF_PQ_ENC_RLE_DICTIONARY = 8,
    VF_PQ_ENC_BYTE_STREAM_SPLIT = 9,
};
/* ConvertedType values. */
enum {
    VF_PQ_CT_UTF8 = 0,
    VF_PQ_CT_MAP = 1,
    VF_PQ_CT_MAP_KEY_VALUE = 2,
    VF_PQ_CT_LIST = 3,
    VF_PQ_CT_ENUM = 4,
    VF_PQ_CT_UINT_8 = 11,
    VF_PQ_CT_UINT_16 = 12,
    VF_PQ_CT_UINT_32 = 13,
    VF_PQ_CT_UINT_64 = 14,
    VF_PQ_CT_INT_8 = 15,
    VF_PQ_CT_INT_16 = 16,
    VF_PQ_CT_INT_32 = 17,
    VF_PQ_CT_INT_64 = 18,
    VF_PQ_CT_JSON = 19,
};
/* LogicalType union field ids. */
enum {
    VF_PQ_LT_STRING = 1,
    VF_PQ_LT_MAP = 2,
    VF_PQ_LT_LIST = 3,
    VF_PQ_LT_ENUM = 4,
    VF_PQ_LT_INTEGER = 10,
    VF_PQ_LT_JSON = 12,
    VF_PQ_LT_FLOAT16 = 15,
};

const char *vf_pq_encoding_name(int encoding);
const char *vf_pq_codec_name(int codec);
const char *vf_pq_physical_name(int physical);

/* ---- footer metadata -------------------------------------------------- */

typedef struct vf_pq_chunk_meta {
    int has_meta;              /* ColumnMetaData present */
    int external;              /* file_path set: data in another file */
    int physical;
    int codec;
    int64_t num_values;        /* level entries, nulls included */
    int64_t total_compressed_size;
    int64_t total_uncompressed_size;
    int64_t data_page_offset;
    int64_t dictionary_page_offset; /* -1 when absent */
    /* statistics: min_value/max_value, else the deprecated min/max */
    const uint8_t *stat_min, *stat_max; /* into the file's stats_arena (into the footer while parsing) */
    uint32_t stat_min_len, stat_max_len;
    int has_min, has_max;
    int stats_deprecated;      /* min/max came from fields 1/2 */
    int64_t null_count;        /* -1 when absent */
    /* path_in_schema, checked against the schema before the footer bytes
     * go: the first element's bytes in the footer (a compact-protocol list
     * of binaries, already bounds-checked) and the element count */
    const uint8_t *path_raw;
    int path_len;
} vf_pq_chunk_meta;

typedef struct vf_pq_row_group_meta {
    int64_t num_rows;
    int num_chunks;            /* column chunks listed in the footer */
    int num_columns;           /* chunks kept in `columns` (all, or the projected leaves') */
    vf_pq_chunk_meta *columns;
} vf_pq_row_group_meta;

/* One array level of a top-level field (see assemble.c for the level
 * semantics): an entry starts a slot of this node when rep <= slot_rep and
 * def >= slot_def; the slot is non-null when def >= valid_def. */
typedef struct vf_pq_plan vf_pq_plan;
struct vf_pq_plan {
    vf_pq_type type;
    const char *name;          /* borrowed from the schema node */
    const vf_pq_node *node;    /* leaf node for scalars */
    int16_t slot_def, slot_rep, valid_def;
    int first_leaf;            /* leaf whose levels give this node's slots */
    int num_leaves;            /* leaves first_leaf .. first_leaf+num_leaves-1 */
    int num_children;
    vf_pq_plan *children;
};

struct vf_pq_file {
    vf_source *src;
    const char *name;          /* vf_source_name(src) */
    uint64_t size;
    int version;
    int64_t num_rows;
    char *created_by;
    int num_nodes;
    vf_pq_node *nodes;         /* nodes[0] is the root */
    vf_pq_node **child_slots;  /* storage for every node's children array */
    int num_leaves;
    vf_pq_node **leaves;
    vf_pq_plan *fields;        /* one plan per top-level field */
    int num_kv;
    char **kv_keys, **kv_values;
    int num_row_groups;
    vf_pq_row_group_meta *row_groups;
    /* Projected open: leaf index -> index into each row group's columns,
     * -1 for a leaf whose chunk metadata was skipped. NULL: every leaf
     * kept, columns indexed by leaf. */
    int *leaf_slot;
    int64_t *rg_first_row;     /* num_row_groups + 1 cumulative row counts */
    uint8_t *stats_arena;      /* every chunk's statistics bytes, one allocation */
    int64_t max_entries;       /* per leaf per read (vf_pq_set_limits) */
    int64_t max_bytes;
    size_t footer_len;
    int64_t page_index_min;    /* chunk bytes from which reads build a page index (vf_pq_set_page_index_min) */
    /* Page indexes of big column chunks (page.c), built by the first
     * page-level read that needs one and kept: [num_row_groups *
     * num_leaves] pointers, allocated on first use; under index_lock. */
    pthread_mutex_t index_lock;
    struct vf_pq_chunk_pages **page_index;
    size_t page_index_bytes;
};

/* Where a column chunk's data pages are (page.c): the header offset of
 * each, the rows started before it (repetition level 0 entries) and the
 * level entries before it. */
typedef struct vf_pq_page_loc {
    int64_t offset, first_row, entries_before;
    int64_t span;              /* header and payload bytes */
    int ordinal;               /* page number in the chunk (dictionary page counted) */
} vf_pq_page_loc;
typedef struct vf_pq_chunk_pages {
    /* The chunk's decoded dictionary, kept by the first read that needed
     * it (page.c; under the file's index_lock, immutable once set). */
    struct vf_pq_column *dict;
    int count;
    vf_pq_page_loc loc[];
} vf_pq_chunk_pages;
/* Frees the page indexes (vf_pq_close). */
void vf_pq_free_page_index(vf_pq_file *f);

/* Decodes the footer (FileMetaData bytes) into f and builds the schema
 * tree, leaves and plans. Errors name f->name. With fields (num_fields
 * names of top-level fields), the column-chunk metadata of every other
 * field is skipped on the wire, not materialised (f->leaf_slot); this
 * needs the schema before the row groups in the footer, as every writer
 * puts it; otherwise everything is kept. */
int vf_pq_parse_metadata(vf_pq_file *f, const uint8_t *data, size_t len, const char *const *fields,
                         int num_fields);
/* The chunk metadata of a leaf in a row group; NULL when the leaf was not
 * kept by a projected open. Bounds are the caller's. */
static inline const vf_pq_chunk_meta *vf_pq_chunk_at(const vf_pq_file *f, int row_group, int leaf_index)
{
    int slot = f->leaf_slot ? f->leaf_slot[leaf_index] : leaf_index;
    return slot < 0 ? NULL : &f->row_groups[row_group].columns[slot];
}
void vf_pq_free_metadata(vf_pq_file *f);
/* "a.list.element" for messages (static per-thread-free: caller frees). */
char *vf_pq_leaf_path_string(const vf_pq_node *leaf);

/* ---- RLE / bit-packed hybrid (rle.c) --------------------------------- */

typedef struct vf_pq_rle {
    const uint8_t *p, *end;
    int width;
    uint32_t mask;
    uint32_t run_value;
    int64_t run_left;          /* repeats left in the current RLE run */
    int64_t packed_left;       /* values left in whole groups at p */
    int tail;                  /* bytes of a truncated last group after them */
    uint32_t buf[8];           /* one decoded group, partly consumed */
    int buf_pos, buf_len;
} vf_pq_rle;

void vf_pq_rle_init(vf_pq_rle *d, const uint8_t *data, size_t len, int width);
/* Decode exactly n values; return 0, or -1 when the data is exhausted or
 * malformed (the caller sets the message). */
int vf_pq_rle_read_u32(vf_pq_rle *d, uint32_t *out, int64_t n);
int vf_pq_rle_read_u8(vf_pq_rle *d, uint8_t *out, int64_t n);
/* If the stream is at an RLE run of `value`, consumes up to max of it
 * and returns how many; else 0 (nothing consumed). */
int64_t vf_pq_rle_skip_run(vf_pq_rle *d, uint32_t value, int64_t max);
/* Consumes n values without decoding them (bit-packed groups are stepped
 * over, not unpacked); 0, or -1 when the data ends first or is malformed. */
int vf_pq_rle_skip(vf_pq_rle *d, int64_t n);
/* Width 1 only: consumes n levels and writes base+i for each zero level
 * to out (room for n); returns the count, or -1 on malformed data. The
 * decoder cannot be read further afterwards (it stops inside a run). */
int64_t vf_pq_rle_zero_positions(vf_pq_rle *d, int64_t n, int64_t base, int64_t *out);
/* Bit-unpacking of whole groups of 8 values (exported for tests). */
void vf_pq_unpack_u32(const uint8_t *in, uint32_t *out, int64_t groups, int width);
void vf_pq_unpack_u8(const uint8_t *in, uint8_t *out, int64_t groups, int width);

/* ---- decoded leaf data (page.c) -------------------------------------- */

/* Levels are kept compactly: def is NULL while every entry so far has
 * def == max_def (the usual no-null case, so nothing is stored), and a
 * leaf with max_rep == 1 keeps only the entry index of each row start
 * (rep == 0) in row_starts, which is exactly a list's offsets. rep holds
 * full repetition levels for max_rep >= 2 (assembly can also derive it
 * for max_rep == 1 when a general path needs it). */
typedef struct vf_pq_column {
    const vf_pq_node *leaf;
    vf_pq_type type;
    size_t value_size;         /* bytes per fixed-width value; 0 for byte arrays */
    int64_t num_entries;       /* level entries */
    int64_t rows;              /* entries with rep == 0 */
    uint8_t *def;              /* NULL: every def == max_def */
    int64_t cap_def;
    uint8_t *rep;              /* max_rep >= 2 (or derived) */
    int64_t cap_rep;
    int64_t *row_starts;       /* max_rep == 1: rows entries (+1 spare) */
    int64_t cap_rows;
    int64_t num_values, cap_values; /* values present (def == max_def) */
    uint8_t *values;           /* fixed-width values */
    int64_t *offsets;          /* byte arrays: num_values+1 */
    uint8_t *data;
    int64_t data_len, data_cap;
} vf_pq_column;

/* Buffers reused across the chunks of one read: a window of the file
 * (pages are read through it, a few MiB at a time), the decompressed
 * page, and a BYTE_STREAM_SPLIT reassembly buffer. Zero-initialise. */
typedef struct vf_pq_scratch {
    uint8_t *window;
    size_t window_cap;
    int64_t window_start, window_len;
    /* A view of the file (vf_source_view) that pages are decoded from in
     * place when it covers them; released by vf_pq_scratch_free. */
    const uint8_t *view;
    void *view_token;
    struct vf_source *view_src;
    int64_t view_start, view_len;
    uint8_t *page;
    size_t page_cap;
    uint8_t *split;
    size_t split_cap;
    uint8_t *saved, *levels;   /* direct decompression (page.c) */
    size_t saved_cap, levels_cap;
    void *chunk_ctx;           /* the decoder's per-chunk state, reused across chunks (page.c) */
    int64_t pages_decoded;     /* data pages decoded */
    int64_t pages_skipped;     /* data pages not fetched or decoded (vf_pq_decode_chunk_rows) */
} vf_pq_scratch;

void vf_pq_scratch_free(vf_pq_scratch *s);
void vf_pq_column_init(vf_pq_column *c, const vf_pq_node *leaf);
void vf_pq_column_free(vf_pq_column *c);
/* Decodes one column chunk and appends its entries to c. */
int vf_pq_decode_chunk(vf_pq_file *f, int row_group, int leaf_index, vf_pq_column *c, vf_pq_scratch *s);
/* The same for rows [row_lo, row_hi) of the row group: pages outside are
 * skipped where their headers tell their rows (page.c says which); c gets
 * the decoded pages' rows, the first of them *first_row (relative to the
 * row group), a superset of the range. c must be empty or end at a row. */
int vf_pq_decode_chunk_rows(vf_pq_file *f, int row_group, int leaf_index, vf_pq_column *c, vf_pq_scratch *s,
                            int64_t row_lo, int64_t row_hi, int64_t *first_row);
/* Keeps rows [a, b) of a decoded column (levels, row starts, values). */
int vf_pq_column_keep_rows(vf_pq_column *c, int64_t a, int64_t b);
/* Fills c->rep from row_starts for a max_rep == 1 leaf (no-op otherwise). */
int vf_pq_column_derive_rep(vf_pq_column *c);

/* ---- assembly (assemble.c) ------------------------------------------- */

/* Builds the array of one top-level field from its decoded leaves
 * (cols indexed by leaf_index - plan->first_leaf). Takes ownership of
 * buffers it can move out of cols. num_rows is the expected length. */
int vf_pq_assemble(const vf_pq_file *f, const vf_pq_plan *plan, vf_pq_column *cols, int64_t num_rows,
                   vf_pq_array *out);

#endif
