/*
 * thrift_write.h: the Thrift compact protocol ENCODER used by the Parquet
 * writer, and the Parquet footer / page-header structures it serialises.
 *
 * Two layers:
 *  - vf_pq_tw: a streaming encoder over a vf_buf (field headers with
 *    field-id deltas, zigzag varints, binaries, lists, nested structs).
 *    Errors (only allocation can fail) are sticky: the first one is kept in
 *    `status` and later calls do nothing, so a whole structure is written
 *    and checked once at the end.
 *  - Plain C descriptions of the Parquet structures the writer emits
 *    (FileMetaData, SchemaElement, RowGroup, ColumnChunk, ColumnMetaData,
 *    Statistics, PageHeader and its three page kinds, KeyValue) and one
 *    function per top-level structure. Field ids follow parquet.thrift
 *    (lerobot-format.md §11.2). Optional fields have a `has_*` flag or are
 *    omitted when their pointer is NULL.
 *
 * Independent of the reader's thrift.h: every symbol here is vf_pq_tw_*.
 * Depends on: base.
 */
#ifndef VF_PARQUET_THRIFT_WRITE_H
#define VF_PARQUET_THRIFT_WRITE_H

#include "base/base.h"

/* ---- compact protocol primitives ------------------------------------- */

enum {
    VF_PQ_TW_BOOL_TRUE = 1,
    VF_PQ_TW_BOOL_FALSE = 2,
    VF_PQ_TW_I8 = 3,
    VF_PQ_TW_I16 = 4,
    VF_PQ_TW_I32 = 5,
    VF_PQ_TW_I64 = 6,
    VF_PQ_TW_DOUBLE = 7,
    VF_PQ_TW_BINARY = 8,
    VF_PQ_TW_LIST = 9,
    VF_PQ_TW_SET = 10,
    VF_PQ_TW_MAP = 11,
    VF_PQ_TW_STRUCT = 12,
};

#define VF_PQ_TW_MAX_DEPTH 32

typedef struct vf_pq_tw {
    vf_buf *out;
    int status;                          /* 0 or the first error */
    int depth;                           /* open structs */
    int16_t last_id[VF_PQ_TW_MAX_DEPTH]; /* last field id per open struct */
} vf_pq_tw;

void vf_pq_tw_init(vf_pq_tw *t, vf_buf *out);

/* Unsigned LEB128 varint and zigzag varint, appended to a buffer. */
int vf_pq_tw_put_uvarint(vf_buf *b, uint64_t v);
int vf_pq_tw_put_zigzag(vf_buf *b, int64_t v);

/* Fields of the innermost open struct (ids must increase within a struct
 * for the short form; any order is encoded correctly). */
void vf_pq_tw_field_bool(vf_pq_tw *t, int16_t id, int v);
void vf_pq_tw_field_i8(vf_pq_tw *t, int16_t id, int8_t v);
void vf_pq_tw_field_i16(vf_pq_tw *t, int16_t id, int16_t v);
void vf_pq_tw_field_i32(vf_pq_tw *t, int16_t id, int32_t v);
void vf_pq_tw_field_i64(vf_pq_tw *t, int16_t id, int64_t v);
void vf_pq_tw_field_double(vf_pq_tw *t, int16_t id, double v);
void vf_pq_tw_field_binary(vf_pq_tw *t, int16_t id, const void *data, size_t len);
void vf_pq_tw_field_string(vf_pq_tw *t, int16_t id, const char *s);
/* Opens a struct-valued field; close it with vf_pq_tw_struct_end. */
void vf_pq_tw_field_struct_begin(vf_pq_tw *t, int16_t id);
/* Opens a list-valued field of `count` elements of compact type elem_type;
 * then write exactly `count` elements with the vf_pq_tw_elem_* calls. */
void vf_pq_tw_field_list_begin(vf_pq_tw *t, int16_t id, int elem_type, int64_t count);

/* List elements. */
void vf_pq_tw_elem_i32(vf_pq_tw *t, int32_t v);
void vf_pq_tw_elem_i64(vf_pq_tw *t, int64_t v);
void vf_pq_tw_elem_binary(vf_pq_tw *t, const void *data, size_t len);
void vf_pq_tw_elem_string(vf_pq_tw *t, const char *s);
void vf_pq_tw_elem_struct_begin(vf_pq_tw *t);

/* A top-level (message) struct and the end of any struct: writes the stop
 * byte and restores the enclosing struct's field-id state. */
void vf_pq_tw_struct_begin(vf_pq_tw *t);
void vf_pq_tw_struct_end(vf_pq_tw *t);

/* ---- Parquet structures ---------------------------------------------- */

/* Thrift enum values of parquet.thrift used by the writer. */
enum {
    VF_PQ_W_PAGE_DATA = 0,
    VF_PQ_W_PAGE_INDEX = 1,
    VF_PQ_W_PAGE_DICTIONARY = 2,
    VF_PQ_W_PAGE_DATA_V2 = 3,
};
enum {
    VF_PQ_W_ENC_PLAIN = 0,
    VF_PQ_W_ENC_PLAIN_DICTIONARY = 2,
    VF_PQ_W_ENC_RLE = 3,
    VF_PQ_W_ENC_BIT_PACKED = 4,
    VF_PQ_W_ENC_RLE_DICTIONARY = 8,
};
enum {
    VF_PQ_W_CT_UTF8 = 0,
    VF_PQ_W_CT_LIST = 3,
    VF_PQ_W_CT_UINT_8 = 11,
    VF_PQ_W_CT_UINT_16 = 12,
    VF_PQ_W_CT_UINT_32 = 13,
    VF_PQ_W_CT_UINT_64 = 14,
    VF_PQ_W_CT_INT_8 = 15,
    VF_PQ_W_CT_INT_16 = 16,
    VF_PQ_W_CT_INT_32 = 17,
    VF_PQ_W_CT_INT_64 = 18,
};
/* LogicalType union member ids. */
enum {
    VF_PQ_W_LT_NONE = 0,
    VF_PQ_W_LT_STRING = 1,
    VF_PQ_W_LT_LIST = 3,
    VF_PQ_W_LT_INTEGER = 10,
    VF_PQ_W_LT_FLOAT16 = 15,
};

typedef struct vf_pq_tw_statistics {
    int has_min_max;
    const uint8_t *min_value; /* PLAIN encoding of the physical type */
    size_t min_len;
    const uint8_t *max_value;
    size_t max_len;
    int write_legacy;         /* also the deprecated min (2) / max (1) */
    int has_null_count;
    int64_t null_count;
} vf_pq_tw_statistics;

typedef struct vf_pq_tw_schema_element {
    const char *name;
    int has_type;              /* leaves only */
    int32_t type;              /* vf_pq_physical */
    int32_t type_length;       /* written when > 0 (FIXED_LEN_BYTE_ARRAY) */
    int has_repetition;        /* all but the root */
    int32_t repetition;        /* vf_pq_repetition */
    int32_t num_children;      /* written for groups (>= 0), -1 for leaves */
    int32_t converted_type;    /* -1: absent */
    int logical_type;          /* VF_PQ_W_LT_*; 0: absent */
    int8_t int_bit_width;      /* VF_PQ_W_LT_INTEGER */
    int int_signed;
} vf_pq_tw_schema_element;

typedef struct vf_pq_tw_page_encoding_stats {
    int32_t page_type;
    int32_t encoding;
    int32_t count;
} vf_pq_tw_page_encoding_stats;

typedef struct vf_pq_tw_column_meta {
    int32_t type;                      /* vf_pq_physical */
    const int32_t *encodings;
    int num_encodings;
    const char *const *path;           /* path_in_schema elements */
    int path_len;
    int32_t codec;
    int64_t num_values;
    int64_t total_uncompressed_size;
    int64_t total_compressed_size;
    int64_t data_page_offset;
    int has_dictionary_page_offset;
    int64_t dictionary_page_offset;
    const vf_pq_tw_statistics *statistics; /* NULL: none */
    const vf_pq_tw_page_encoding_stats *encoding_stats;
    int num_encoding_stats;
} vf_pq_tw_column_meta;

typedef struct vf_pq_tw_row_group {
    const vf_pq_tw_column_meta *columns;
    int num_columns;
    int64_t total_byte_size;      /* uncompressed */
    int64_t num_rows;
    int64_t file_offset;
    int64_t total_compressed_size;
    int32_t ordinal;              /* -1: omitted (past the i16 range) */
} vf_pq_tw_row_group;

typedef struct vf_pq_tw_key_value {
    const char *key;
    const char *value;            /* NULL: no value */
} vf_pq_tw_key_value;

typedef struct vf_pq_tw_file_metadata {
    int32_t version;
    const vf_pq_tw_schema_element *schema;
    int num_schema;
    int num_leaves;               /* column_orders: TypeDefinedOrder each */
    int64_t num_rows;
    const vf_pq_tw_row_group *row_groups;
    int num_row_groups;
    const vf_pq_tw_key_value *kv;
    int num_kv;
    const char *created_by;
} vf_pq_tw_file_metadata;

typedef struct vf_pq_tw_page_header {
    int32_t type;                 /* VF_PQ_W_PAGE_* */
    int32_t uncompressed_page_size;
    int32_t compressed_page_size;
    int32_t num_values;
    int32_t encoding;             /* values (dictionary page: PLAIN) */
    /* DATA_PAGE */
    int32_t def_encoding;
    int32_t rep_encoding;
    /* DATA_PAGE_V2 */
    int32_t num_nulls;
    int32_t num_rows;
    int32_t def_levels_byte_length;
    int32_t rep_levels_byte_length;
    int is_compressed;
    /* DICTIONARY_PAGE */
    int is_sorted;
} vf_pq_tw_page_header;

/* Each appends one serialised structure to out; 0 or VF_ENOMEM. */
int vf_pq_tw_write_page_header(vf_buf *out, const vf_pq_tw_page_header *h);
int vf_pq_tw_write_file_metadata(vf_buf *out, const vf_pq_tw_file_metadata *m);

#endif
