/*
 * writer_internal.h: pieces shared by the Parquet writer's files
 * (writer.c: API, schema, file I/O and footer; writer_shred.c: Dremel
 * levels and value gathering; writer_encode.c: pages, encodings, codecs
 * and statistics). Not part of the parquet.h interface.
 *
 * Data flow for one row group: for each leaf column, vf_pq_w_shred() turns
 * the caller's top-level array into def/rep levels plus the present leaf
 * values (physical representation), then vf_pq_w_encode_chunk() cuts them
 * into pages and returns the chunk's bytes and footer metadata.
 */
#ifndef VF_PARQUET_WRITER_INTERNAL_H
#define VF_PARQUET_WRITER_INTERNAL_H

#include "parquet/parquet.h"
#include "parquet/thrift_write.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the Parquet writer assumes a little-endian host (PLAIN values are copied as is)"
#endif

/* Nesting limit of one field (each LIST costs two schema levels). */
#define VF_PQ_W_MAX_DEPTH 64
/* Dictionary encoding falls back to PLAIN once the dictionary page would
 * pass this many bytes (pyarrow's dictionary_pagesize_limit). */
#define VF_PQ_W_DICT_LIMIT (1024 * 1024)
/* Byte-array statistics longer than this are not written (parquet-cpp's
 * default max_statistics_size). */
#define VF_PQ_W_MAX_STAT_LEN 4096

/* One leaf column of the schema. */
typedef struct vf_pq_w_leaf {
    char **path;               /* path_in_schema elements (owned) */
    int path_len;
    char *dotted;              /* path joined with '.', for messages (owned) */
    int field_index;           /* top-level field it belongs to */
    int num_steps;             /* array levels from the field to the leaf */
    int steps[VF_PQ_W_MAX_DEPTH]; /* child taken at each STRUCT level (LIST: 0) */
    vf_pq_type type;           /* value type of the leaf array */
    vf_pq_physical physical;
    int32_t type_length;       /* FIXED_LEN_BYTE_ARRAY width */
    size_t value_size;         /* bytes per gathered value; 0 for byte arrays */
    int16_t max_def;
    int16_t max_rep;
} vf_pq_w_leaf;

/* The shredded form of one leaf over one row group. */
typedef struct vf_pq_w_column {
    int64_t num_levels;        /* slots = Parquet num_values */
    int16_t *def;              /* num_levels entries */
    int16_t *rep;              /* num_levels entries; NULL when max_rep == 0 */
    int64_t num_rows;
    int64_t num_values;        /* present leaf values (def == max_def) */
    uint8_t *fixed;            /* fixed-width: num_values * value_size bytes */
    const vf_pq_array *leaf;   /* byte arrays: the source array ... */
    int64_t *value_index;      /* ... and the element index of each value */
} vf_pq_w_column;

void vf_pq_w_column_free(vf_pq_w_column *c);

/* Shreds leaf `lf` of `field` (the caller's top-level array). */
int vf_pq_w_shred(const vf_pq_array *field, const vf_pq_w_leaf *lf, vf_pq_w_column *out);

/* The footer metadata of one written column chunk (all owned). */
typedef struct vf_pq_w_chunk {
    int64_t num_values;
    int64_t total_uncompressed_size;
    int64_t total_compressed_size;
    int64_t data_page_offset;       /* relative to the chunk start until placed */
    int has_dictionary_page;
    int64_t dictionary_page_offset;
    int32_t encodings[3];
    int num_encodings;
    vf_pq_tw_page_encoding_stats encoding_stats[3];
    int num_encoding_stats;
    int has_stats;
    vf_pq_tw_statistics stats;      /* min/max point into the buffers below */
    uint8_t *stat_min;
    uint8_t *stat_max;
} vf_pq_w_chunk;

void vf_pq_w_chunk_free(vf_pq_w_chunk *c);

/* Encodes a shredded column into pages. On success `dict_page` holds the
 * dictionary page (header + body, possibly empty) and `data_pages` the data
 * pages; both are written in that order. meta offsets are relative to the
 * first byte of dict_page. Buffers are appended to (the caller resets). */
int vf_pq_w_encode_chunk(const vf_pq_writer_settings *s, const vf_pq_w_leaf *lf, const vf_pq_w_column *col,
                         vf_buf *dict_page, vf_buf *data_pages, vf_pq_w_chunk *meta);

/* RLE/bit-packed hybrid of `count` values of `bit_width` bits (0..32),
 * appended to out without a length prefix. */
int vf_pq_w_rle_encode_u16(vf_buf *out, const int16_t *values, int64_t count, int bit_width);
int vf_pq_w_rle_encode_u32(vf_buf *out, const uint32_t *values, int64_t count, int bit_width);

/* Compresses `len` bytes with codec, appending to out. */
int vf_pq_w_compress(vf_pq_codec codec, const uint8_t *data, size_t len, vf_buf *out);

/* Bits needed for values 0..max_value. */
int vf_pq_w_bit_width(uint64_t max_value);

const char *vf_pq_w_type_name(vf_pq_type t);
const char *vf_pq_w_codec_name(vf_pq_codec c);

#endif
