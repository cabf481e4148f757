/*
 * thrift_write.c: Thrift compact protocol encoder and the Parquet footer /
 * page-header serialisation built on it (see thrift_write.h).
 *
 * Compact protocol, as written here:
 *  - field header: one byte (delta << 4 | type) when the id grows by 1..15
 *    from the previous field of the same struct, otherwise the type byte
 *    followed by the zigzag varint id; a struct ends with a 0 byte;
 *  - bool fields carry their value in the type nibble (1 true, 2 false);
 *  - i16/i32/i64: zigzag varints; i8: one raw byte; double: 8 bytes LE;
 *  - binary/string: uvarint length + bytes;
 *  - list: one byte (count << 4 | elem_type) when count < 15, else
 *    0xF0 | elem_type followed by the uvarint count.
 * Invariant: t->status holds the first failure; after it every call is a
 * no-op, so serialising code need not check each call.
 */
#include "parquet/thrift_write.h"

#include <string.h>

void vf_pq_tw_init(vf_pq_tw *t, vf_buf *out)
{
    memset(t, 0, sizeof *t);
    t->out = out;
}

int vf_pq_tw_put_uvarint(vf_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
        tmp[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (uint8_t)v;
    return vf_buf_append(b, tmp, n);
}

int vf_pq_tw_put_zigzag(vf_buf *b, int64_t v)
{
    uint64_t u = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    return vf_pq_tw_put_uvarint(b, u);
}

static void put_byte(vf_pq_tw *t, uint8_t v)
{
    if (t->status == 0)
        t->status = vf_buf_append_u8(t->out, v);
}

static void put_bytes(vf_pq_tw *t, const void *data, size_t len)
{
    if (t->status == 0)
        t->status = vf_buf_append(t->out, data, len);
}

static void put_uvarint(vf_pq_tw *t, uint64_t v)
{
    if (t->status == 0)
        t->status = vf_pq_tw_put_uvarint(t->out, v);
}

static void put_zigzag(vf_pq_tw *t, int64_t v)
{
    if (t->status == 0)
        t->status = vf_pq_tw_put_zigzag(t->out, v);
}

static void field_header(vf_pq_tw *t, int16_t id, int type)
{
    if (t->depth <= 0) {
        if (t->status == 0)
            t->status = vf_error(VF_EINVAL, "thrift encoder: field %d outside a struct", id);
        return;
    }
    int16_t *last = &t->last_id[t->depth - 1];
    int delta = (int)id - (int)*last;
    if (delta > 0 && delta <= 15) {
        put_byte(t, (uint8_t)(delta << 4 | type));
    } else {
        put_byte(t, (uint8_t)type);
        put_zigzag(t, id);
    }
    *last = id;
}

void vf_pq_tw_struct_begin(vf_pq_tw *t)
{
    if (t->depth >= VF_PQ_TW_MAX_DEPTH) {
        if (t->status == 0)
            t->status = vf_error(VF_EINVAL, "thrift encoder: structs nested too deeply");
        t->depth++;
        return;
    }
    t->last_id[t->depth++] = 0;
}

void vf_pq_tw_struct_end(vf_pq_tw *t)
{
    put_byte(t, 0);
    if (t->depth > 0)
        t->depth--;
}

void vf_pq_tw_field_bool(vf_pq_tw *t, int16_t id, int v)
{
    field_header(t, id, v ? VF_PQ_TW_BOOL_TRUE : VF_PQ_TW_BOOL_FALSE);
}

void vf_pq_tw_field_i8(vf_pq_tw *t, int16_t id, int8_t v)
{
    field_header(t, id, VF_PQ_TW_I8);
    put_byte(t, (uint8_t)v);
}

void vf_pq_tw_field_i16(vf_pq_tw *t, int16_t id, int16_t v)
{
    field_header(t, id, VF_PQ_TW_I16);
    put_zigzag(t, v);
}

void vf_pq_tw_field_i32(vf_pq_tw *t, int16_t id, int32_t v)
{
    field_header(t, id, VF_PQ_TW_I32);
    put_zigzag(t, v);
}

void vf_pq_tw_field_i64(vf_pq_tw *t, int16_t id, int64_t v)
{
    field_header(t, id, VF_PQ_TW_I64);
    put_zigzag(t, v);
}

void vf_pq_tw_field_double(vf_pq_tw *t, int16_t id, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(bits >> (8 * i));
    field_header(t, id, VF_PQ_TW_DOUBLE);
    put_bytes(t, le, 8);
}

void vf_pq_tw_field_binary(vf_pq_tw *t, int16_t id, const void *data, size_t len)
{
    field_header(t, id, VF_PQ_TW_BINARY);
    put_uvarint(t, len);
    put_bytes(t, data, len);
}

void vf_pq_tw_field_string(vf_pq_tw *t, int16_t id, const char *s)
{
    vf_pq_tw_field_binary(t, id, s, strlen(s));
}

void vf_pq_tw_field_struct_begin(vf_pq_tw *t, int16_t id)
{
    field_header(t, id, VF_PQ_TW_STRUCT);
    vf_pq_tw_struct_begin(t);
}

static void list_header(vf_pq_tw *t, int elem_type, int64_t count)
{
    if (count < 15) {
        put_byte(t, (uint8_t)(count << 4 | elem_type));
    } else {
        put_byte(t, (uint8_t)(0xF0 | elem_type));
        put_uvarint(t, (uint64_t)count);
    }
}

void vf_pq_tw_field_list_begin(vf_pq_tw *t, int16_t id, int elem_type, int64_t count)
{
    field_header(t, id, VF_PQ_TW_LIST);
    list_header(t, elem_type, count);
}

void vf_pq_tw_elem_i32(vf_pq_tw *t, int32_t v) { put_zigzag(t, v); }

void vf_pq_tw_elem_i64(vf_pq_tw *t, int64_t v) { put_zigzag(t, v); }

void vf_pq_tw_elem_binary(vf_pq_tw *t, const void *data, size_t len)
{
    put_uvarint(t, len);
    put_bytes(t, data, len);
}

void vf_pq_tw_elem_string(vf_pq_tw *t, const char *s) { vf_pq_tw_elem_binary(t, s, strlen(s)); }

void vf_pq_tw_elem_struct_begin(vf_pq_tw *t) { vf_pq_tw_struct_begin(t); }

/* ---- Parquet structures ---- */

/* A top-level struct (a PageHeader or the FileMetaData) appended to out:
 * begin sets up the encoder, end closes the struct and returns the first
 * failure or 0. */
static void begin_top_struct(vf_pq_tw *t, vf_buf *out)
{
    vf_pq_tw_init(t, out);
    vf_pq_tw_struct_begin(t);
}

static int end_top_struct(vf_pq_tw *t)
{
    vf_pq_tw_struct_end(t);
    return t->status;
}

static void write_statistics(vf_pq_tw *t, int16_t id, const vf_pq_tw_statistics *s)
{
    vf_pq_tw_field_struct_begin(t, id);
    if (s->has_min_max && s->write_legacy) {
        vf_pq_tw_field_binary(t, 1, s->max_value, s->max_len);
        vf_pq_tw_field_binary(t, 2, s->min_value, s->min_len);
    }
    if (s->has_null_count)
        vf_pq_tw_field_i64(t, 3, s->null_count);
    if (s->has_min_max) {
        vf_pq_tw_field_binary(t, 5, s->max_value, s->max_len);
        vf_pq_tw_field_binary(t, 6, s->min_value, s->min_len);
        vf_pq_tw_field_bool(t, 7, 1); /* is_max_value_exact */
        vf_pq_tw_field_bool(t, 8, 1); /* is_min_value_exact */
    }
    vf_pq_tw_struct_end(t);
}

/* One of PageHeader's per-type structs (field `id`): i32 fields 1..n in
 * order, then, unless it is -1, a bool field n + 1. */
static void write_page_type_header(vf_pq_tw *t, int16_t id, const int32_t *fields, int n, int last_bool)
{
    vf_pq_tw_field_struct_begin(t, id);
    for (int i = 0; i < n; i++)
        vf_pq_tw_field_i32(t, (int16_t)(i + 1), fields[i]);
    if (last_bool >= 0)
        vf_pq_tw_field_bool(t, (int16_t)(n + 1), last_bool);
    vf_pq_tw_struct_end(t);
}

int vf_pq_tw_write_page_header(vf_buf *out, const vf_pq_tw_page_header *h)
{
    vf_pq_tw t;
    begin_top_struct(&t, out);
    vf_pq_tw_field_i32(&t, 1, h->type);
    vf_pq_tw_field_i32(&t, 2, h->uncompressed_page_size);
    vf_pq_tw_field_i32(&t, 3, h->compressed_page_size);
    switch (h->type) {
    case VF_PQ_W_PAGE_DATA: {
        const int32_t v1[] = {h->num_values, h->encoding, h->def_encoding, h->rep_encoding};
        write_page_type_header(&t, 5, v1, 4, -1);
        break;
    }
    case VF_PQ_W_PAGE_DICTIONARY: {
        const int32_t dict[] = {h->num_values, h->encoding};
        write_page_type_header(&t, 7, dict, 2, h->is_sorted != 0);
        break;
    }
    case VF_PQ_W_PAGE_DATA_V2: {
        const int32_t v2[] = {h->num_values, h->num_nulls, h->num_rows, h->encoding,
                              h->def_levels_byte_length, h->rep_levels_byte_length};
        write_page_type_header(&t, 8, v2, 6, h->is_compressed != 0);
        break;
    }
    default:
        return vf_error(VF_EINVAL, "thrift encoder: unsupported page type %d", h->type);
    }
    return end_top_struct(&t);
}

static void write_schema_element(vf_pq_tw *t, const vf_pq_tw_schema_element *e)
{
    vf_pq_tw_elem_struct_begin(t);
    if (e->has_type)
        vf_pq_tw_field_i32(t, 1, e->type);
    if (e->type_length > 0)
        vf_pq_tw_field_i32(t, 2, e->type_length);
    if (e->has_repetition)
        vf_pq_tw_field_i32(t, 3, e->repetition);
    vf_pq_tw_field_string(t, 4, e->name);
    if (e->num_children >= 0)
        vf_pq_tw_field_i32(t, 5, e->num_children);
    if (e->converted_type >= 0)
        vf_pq_tw_field_i32(t, 6, e->converted_type);
    if (e->logical_type != VF_PQ_W_LT_NONE) {
        vf_pq_tw_field_struct_begin(t, 10);
        vf_pq_tw_field_struct_begin(t, (int16_t)e->logical_type);
        if (e->logical_type == VF_PQ_W_LT_INTEGER) {
            vf_pq_tw_field_i8(t, 1, e->int_bit_width);
            vf_pq_tw_field_bool(t, 2, e->int_signed);
        }
        vf_pq_tw_struct_end(t); /* the member's struct */
        vf_pq_tw_struct_end(t); /* the union */
    }
    vf_pq_tw_struct_end(t);
}

static void write_column_meta(vf_pq_tw *t, const vf_pq_tw_column_meta *c)
{
    vf_pq_tw_field_struct_begin(t, 3);
    vf_pq_tw_field_i32(t, 1, c->type);
    vf_pq_tw_field_list_begin(t, 2, VF_PQ_TW_I32, c->num_encodings);
    for (int i = 0; i < c->num_encodings; i++)
        vf_pq_tw_elem_i32(t, c->encodings[i]);
    vf_pq_tw_field_list_begin(t, 3, VF_PQ_TW_BINARY, c->path_len);
    for (int i = 0; i < c->path_len; i++)
        vf_pq_tw_elem_string(t, c->path[i]);
    vf_pq_tw_field_i32(t, 4, c->codec);
    vf_pq_tw_field_i64(t, 5, c->num_values);
    vf_pq_tw_field_i64(t, 6, c->total_uncompressed_size);
    vf_pq_tw_field_i64(t, 7, c->total_compressed_size);
    vf_pq_tw_field_i64(t, 9, c->data_page_offset);
    if (c->has_dictionary_page_offset)
        vf_pq_tw_field_i64(t, 11, c->dictionary_page_offset);
    if (c->statistics)
        write_statistics(t, 12, c->statistics);
    if (c->num_encoding_stats > 0) {
        vf_pq_tw_field_list_begin(t, 13, VF_PQ_TW_STRUCT, c->num_encoding_stats);
        for (int i = 0; i < c->num_encoding_stats; i++) {
            vf_pq_tw_elem_struct_begin(t);
            vf_pq_tw_field_i32(t, 1, c->encoding_stats[i].page_type);
            vf_pq_tw_field_i32(t, 2, c->encoding_stats[i].encoding);
            vf_pq_tw_field_i32(t, 3, c->encoding_stats[i].count);
            vf_pq_tw_struct_end(t);
        }
    }
    vf_pq_tw_struct_end(t);
}

static void write_row_group(vf_pq_tw *t, const vf_pq_tw_row_group *rg)
{
    vf_pq_tw_elem_struct_begin(t);
    vf_pq_tw_field_list_begin(t, 1, VF_PQ_TW_STRUCT, rg->num_columns);
    for (int i = 0; i < rg->num_columns; i++) {
        vf_pq_tw_elem_struct_begin(t);              /* ColumnChunk */
        vf_pq_tw_field_i64(t, 2, 0);                /* file_offset (deprecated) */
        write_column_meta(t, &rg->columns[i]);
        vf_pq_tw_struct_end(t);
    }
    vf_pq_tw_field_i64(t, 2, rg->total_byte_size);
    vf_pq_tw_field_i64(t, 3, rg->num_rows);
    vf_pq_tw_field_i64(t, 5, rg->file_offset);
    vf_pq_tw_field_i64(t, 6, rg->total_compressed_size);
    if (rg->ordinal >= 0 && rg->ordinal <= INT16_MAX)
        vf_pq_tw_field_i16(t, 7, (int16_t)rg->ordinal);
    vf_pq_tw_struct_end(t);
}

int vf_pq_tw_write_file_metadata(vf_buf *out, const vf_pq_tw_file_metadata *m)
{
    vf_pq_tw t;
    begin_top_struct(&t, out);
    vf_pq_tw_field_i32(&t, 1, m->version);
    vf_pq_tw_field_list_begin(&t, 2, VF_PQ_TW_STRUCT, m->num_schema);
    for (int i = 0; i < m->num_schema; i++)
        write_schema_element(&t, &m->schema[i]);
    vf_pq_tw_field_i64(&t, 3, m->num_rows);
    vf_pq_tw_field_list_begin(&t, 4, VF_PQ_TW_STRUCT, m->num_row_groups);
    for (int i = 0; i < m->num_row_groups; i++)
        write_row_group(&t, &m->row_groups[i]);
    if (m->num_kv > 0) {
        vf_pq_tw_field_list_begin(&t, 5, VF_PQ_TW_STRUCT, m->num_kv);
        for (int i = 0; i < m->num_kv; i++) {
            vf_pq_tw_elem_struct_begin(&t);
            vf_pq_tw_field_string(&t, 1, m->kv[i].key);
            if (m->kv[i].value)
                vf_pq_tw_field_string(&t, 2, m->kv[i].value);
            vf_pq_tw_struct_end(&t);
        }
    }
    if (m->created_by)
        vf_pq_tw_field_string(&t, 6, m->created_by);
    vf_pq_tw_field_list_begin(&t, 7, VF_PQ_TW_STRUCT, m->num_leaves);
    for (int i = 0; i < m->num_leaves; i++) {
        vf_pq_tw_elem_struct_begin(&t);   /* ColumnOrder union */
        vf_pq_tw_field_struct_begin(&t, 1); /* TYPE_ORDER: TypeDefinedOrder {} */
        vf_pq_tw_struct_end(&t);
        vf_pq_tw_struct_end(&t);
    }
    return end_top_struct(&t);
}
