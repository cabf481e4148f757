/*
 * metadata.c: decodes the Parquet footer (FileMetaData, Thrift compact)
 * into a vf_pq_file: schema tree, leaves, per-field assembly plans,
 * key-value metadata, row groups and column-chunk metadata.
 *
 * Invariants established here (the rest of the reader relies on them):
 *  - The schema tree uses every element of the flattened pre-order list
 *    exactly once (num_children validated), is at most VF_PQ_MAX_NESTING
 *    deep, and every non-root group has at least one child.
 *  - Each leaf has max_def/max_rep computed from its path (root excluded)
 *    and a resolved vf_pq_type (VF_PQ_T_NULL if unsupported; reads of such
 *    a leaf fail with VF_EUNSUPPORTED, opening does not).
 *  - Every row group has exactly one chunk per leaf, in leaf order, and
 *    each chunk's path_in_schema equals its leaf's path element by element.
 *  - Unknown Thrift fields are skipped at every level.
 */
#include "parquet/read_internal.h"

#include <stdlib.h>
#include <string.h>

const char *vf_pq_encoding_name(int e)
{
    static const char *names[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                  "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                  "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
    return e >= 0 && e < (int)VF_ARRAY_LEN(names) ? names[e] : "unknown encoding";
}

const char *vf_pq_codec_name(int c)
{
    static const char *names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return c >= 0 && c < (int)VF_ARRAY_LEN(names) ? names[c] : "unknown codec";
}

const char *vf_pq_physical_name(int p)
{
    static const char *names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
                                  "FIXED_LEN_BYTE_ARRAY"};
    return p >= 0 && p < (int)VF_ARRAY_LEN(names) ? names[p] : "unknown type";
}

/* ---- Thrift structs ---------------------------------------------------- */

typedef struct schema_elem {
    int has_type;
    int type;
    int32_t type_length;
    int repetition;
    char *name;
    int32_t num_children;
    int converted;
    int logical;
    int int_bits, int_signed;
} schema_elem;

typedef struct footer {
    int version;
    int64_t num_rows;
    int has_schema, has_num_rows, has_row_groups, has_kv;
    uint32_t num_elems;
    schema_elem *elems;
    char *created_by;
    uint32_t num_kv;
    char **kv_keys, **kv_values;
    uint32_t num_row_groups;
    vf_pq_row_group_meta *row_groups;
    /* projection (vf_pq_open_projected) */
    const char *const *proj;
    int num_proj;
    int *leaf_slot;            /* set once the schema is read, if the row groups come after it */
    int num_flat_leaves, num_slots;
} footer;

#define WANT(type_, expected) ((type_) == (expected) ? 1 : (vf_pq_tr_skip(t, (type_)), 0))

static int32_t int_field(vf_pq_tr *t, int type)
{
    int ok;
    int64_t v = vf_pq_tr_int_field(t, type, &ok);
    if (ok && (v < INT32_MIN || v > INT32_MAX)) {
        vf_pq_tr_fail(t, "integer field out of range");
        return 0;
    }
    return (int32_t)v;
}

/* Checks a list header just read (n elements of wire type elem): the
 * elements must be of type want_elem, else the decoder fails with
 * `not_that`; too_long (unless NULL) refuses more elements than an int
 * counts. Returns 0 or the decoder's error. */
static int check_list(vf_pq_tr *t, uint32_t n, int elem, int want_elem, const char *not_that, const char *too_long)
{
    if (n && elem != want_elem)
        return vf_pq_tr_fail(t, not_that);
    if (too_long && n > INT32_MAX)
        return vf_pq_tr_fail(t, too_long);
    return 0;
}

/* The LogicalType union of field `wire_type` (skipped unless a struct). */
static void parse_logical_type(vf_pq_tr *t, int wire_type, schema_elem *e)
{
    int16_t last = 0, id, iid;
    int type, itype;
    if (!WANT(wire_type, VF_TC_STRUCT))
        return;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        if (type != VF_TC_STRUCT) {
            vf_pq_tr_skip(t, type);
            continue;
        }
        e->logical = id;
        if (id != VF_PQ_LT_INTEGER) {
            vf_pq_tr_skip(t, type);
            continue;
        }
        int16_t ilast = 0;
        vf_pq_tr_struct_begin(t);
        while (vf_pq_tr_field(t, &ilast, &iid, &itype)) {
            if (iid == 1)
                e->int_bits = int_field(t, itype);
            else if (iid == 2 && (itype == VF_TC_TRUE || itype == VF_TC_FALSE))
                e->int_signed = itype == VF_TC_TRUE;
            else
                vf_pq_tr_skip(t, itype);
        }
        vf_pq_tr_struct_end(t);
    }
    vf_pq_tr_struct_end(t);
}

static void parse_schema_element(vf_pq_tr *t, schema_elem *e)
{
    int16_t last = 0, id;
    int type;
    e->converted = -1;
    e->repetition = VF_PQ_REQUIRED;
    e->int_signed = 1;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1:
            e->type = int_field(t, type);
            e->has_type = 1;
            break;
        case 2: e->type_length = int_field(t, type); break;
        case 3: e->repetition = int_field(t, type); break;
        case 4:
            if (WANT(type, VF_TC_BINARY)) {
                free(e->name);
                e->name = vf_pq_tr_string(t);
            }
            break;
        case 5: e->num_children = int_field(t, type); break;
        case 6: e->converted = int_field(t, type); break;
        case 10: parse_logical_type(t, type, e); break;
        default: vf_pq_tr_skip(t, type); break;
        }
    }
    vf_pq_tr_struct_end(t);
}

/* Statistics are kept as pointers into the footer while it is parsed
 * (no allocation per column chunk: a LeRobot episodes file with small row
 * groups has millions) and copied into one block per file at the end
 * (collect_stats). The field's wire type must be a struct (else skipped). */
static void parse_statistics(vf_pq_tr *t, int wire_type, vf_pq_chunk_meta *c)
{
    int16_t last = 0, id;
    int type;
    const uint8_t *vals[7] = {0};
    uint32_t lens[7] = {0};
    if (!WANT(wire_type, VF_TC_STRUCT))
        return;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        if ((id == 1 || id == 2 || id == 5 || id == 6) && type == VF_TC_BINARY) {
            vals[id] = vf_pq_tr_binary(t, &lens[id]);
        } else if (id == 3) {
            int ok;
            int64_t v = vf_pq_tr_int_field(t, type, &ok);
            if (ok)
                c->null_count = v;
        } else {
            vf_pq_tr_skip(t, type);
        }
    }
    vf_pq_tr_struct_end(t);
    /* Prefer min_value/max_value (6/5); fall back to the deprecated
     * min/max (2/1), whose ordering is only right for signed types. */
    int use_new = vals[5] || vals[6];
    int imin = use_new ? 6 : 2, imax = use_new ? 5 : 1;
    c->stat_min = vals[imin];
    c->stat_min_len = lens[imin];
    c->has_min = vals[imin] != NULL;
    c->stat_max = vals[imax];
    c->stat_max_len = lens[imax];
    c->has_max = vals[imax] != NULL;
    c->stats_deprecated = !use_new;
}

static void parse_column_meta(vf_pq_tr *t, vf_pq_chunk_meta *c)
{
    int16_t last = 0, id;
    int type, ok;
    c->has_meta = 1;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1: c->physical = int_field(t, type); break;
        case 3: {
            if (!WANT(type, VF_TC_LIST))
                break;
            int elem;
            uint32_t n = vf_pq_tr_list_begin(t, &elem);
            if (check_list(t, n, elem, VF_TC_BINARY, "path_in_schema is not a list of strings",
                           "path_in_schema too long") < 0)
                break;
            c->path_raw = t->p;
            c->path_len = (int)n;
            for (uint32_t i = 0; i < n && !t->err; i++) {
                uint32_t len;
                (void)vf_pq_tr_binary(t, &len);
            }
            break;
        }
        case 4: c->codec = int_field(t, type); break;
        case 5: c->num_values = vf_pq_tr_int_field(t, type, &ok); break;
        case 6: c->total_uncompressed_size = vf_pq_tr_int_field(t, type, &ok); break;
        case 7: c->total_compressed_size = vf_pq_tr_int_field(t, type, &ok); break;
        case 9: c->data_page_offset = vf_pq_tr_int_field(t, type, &ok); break;
        case 11: c->dictionary_page_offset = vf_pq_tr_int_field(t, type, &ok); break;
        case 12: parse_statistics(t, type, c); break;
        default: vf_pq_tr_skip(t, type); break;
        }
    }
    vf_pq_tr_struct_end(t);
}

static void parse_column_chunk(vf_pq_tr *t, vf_pq_chunk_meta *c)
{
    int16_t last = 0, id;
    int type;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        if (id == 1 && type == VF_TC_BINARY) {
            uint32_t n;
            (void)vf_pq_tr_binary(t, &n);
            c->external = n > 0;
        } else if (id == 3 && type == VF_TC_STRUCT) {
            if (c->has_meta) {
                vf_pq_tr_fail(t, "column chunk has two meta_data fields");
                break;
            }
            parse_column_meta(t, c);
        } else {
            vf_pq_tr_skip(t, type);
        }
    }
    vf_pq_tr_struct_end(t);
}

static void free_row_group(vf_pq_row_group_meta *rg)
{
    free(rg->columns);
    rg->columns = NULL;
    rg->num_columns = 0;
}

/* Projection: which flattened leaves belong to the requested top-level
 * fields, from the schema elements (pre-order, num_children). A schema
 * the tree builder will refuse may map oddly here; the open fails then. */
static void compute_projection(vf_pq_tr *t, footer *m)
{
    uint32_t n = m->num_elems;
    int *slot = vf_malloc_array(n ? n : 1, sizeof *slot);
    if (!slot) {
        t->err = VF_ENOMEM;
        t->p = t->end;
        return;
    }
    int leaves = 0, kept = 0;
    uint32_t i = 1;
    int32_t top = n ? m->elems[0].num_children : 0;
    for (int32_t k = 0; k < top && i < n; k++) {
        const char *name = m->elems[i].name;
        int want = 0;
        for (int j = 0; j < m->num_proj && !want; j++)
            want = name && m->proj[j] && !strcmp(name, m->proj[j]);
        int64_t pending = 1;
        while (pending > 0 && i < n) {
            const schema_elem *e = &m->elems[i++];
            pending--;
            if (e->num_children > 0)
                pending += e->num_children;
            else
                slot[leaves++] = want ? kept++ : -1;
        }
    }
    m->leaf_slot = slot;
    m->num_flat_leaves = leaves;
    m->num_slots = kept;
}

static void parse_row_group(vf_pq_tr *t, vf_pq_row_group_meta *rg, const footer *m)
{
    int16_t last = 0, id;
    int type, ok, seen_columns = 0;
    rg->num_rows = -1;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        if (id == 1 && type == VF_TC_LIST) {
            int elem;
            uint32_t n = vf_pq_tr_list_begin(t, &elem);
            if (seen_columns) {
                vf_pq_tr_fail(t, "row group has two column lists");
                break;
            }
            seen_columns = 1;
            if (check_list(t, n, elem, VF_TC_STRUCT, "row group columns are not structs", "too many column chunks") < 0)
                break;
            rg->num_chunks = (int)n;
            uint32_t kept = m->leaf_slot ? (uint32_t)m->num_slots : n;
            if (kept) {
                rg->columns = vf_calloc(kept, sizeof *rg->columns);
                if (!rg->columns) {
                    t->err = VF_ENOMEM;
                    t->p = t->end;
                    break;
                }
                rg->num_columns = (int)kept;
                for (uint32_t i = 0; i < kept; i++) {
                    rg->columns[i].dictionary_page_offset = -1;
                    rg->columns[i].null_count = -1;
                }
            }
            for (uint32_t i = 0; i < n && !t->err;) {
                int s = (int)i;
                if (m->leaf_slot)
                    s = (int)i < m->num_flat_leaves ? m->leaf_slot[i] : -1;
                if (s >= 0) {
                    parse_column_chunk(t, &rg->columns[s]);
                    i++;
                    continue;
                }
                /* Not projected, never materialised: the run of such
                 * chunks (LeRobot's stats columns) is skipped in one pass. */
                uint32_t run = 1;
                while (i + run < n && ((int)(i + run) >= m->num_flat_leaves || m->leaf_slot[i + run] < 0))
                    run++;
                vf_pq_tr_skip_structs(t, run);
                i += run;
            }
        } else if (id == 3) {
            rg->num_rows = vf_pq_tr_int_field(t, type, &ok);
        } else {
            vf_pq_tr_skip(t, type);
        }
    }
    vf_pq_tr_struct_end(t);
}

static void parse_kv(vf_pq_tr *t, char **key, char **value)
{
    int16_t last = 0, id;
    int type;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        if ((id == 1 || id == 2) && type == VF_TC_BINARY) {
            char **dst = id == 1 ? key : value;
            free(*dst);
            *dst = vf_pq_tr_string(t);
        } else {
            vf_pq_tr_skip(t, type);
        }
    }
    vf_pq_tr_struct_end(t);
}

/* Allocates a zeroed array for a list field. */
static void *list_alloc(vf_pq_tr *t, uint32_t n, size_t size)
{
    void *p = vf_calloc(n ? n : 1, size);
    if (!p) {
        t->err = VF_ENOMEM;
        t->p = t->end;
    }
    return p;
}

/* Starts FileMetaData's list field `name` (wire type `type`), which must
 * be a list of structs and come once (*seen). Returns a zeroed array for
 * its *n items of item_size bytes, or NULL when the field is skipped (not
 * a list) or refused (the decoder has failed). The caller counts the items
 * as it parses them, so that free_footer frees only what was read. */
static void *begin_struct_list(vf_pq_tr *t, int type, const char *name, int *seen, size_t item_size, uint32_t *n)
{
    if (!WANT(type, VF_TC_LIST))
        return NULL;
    int elem;
    char reason[96];
    *n = vf_pq_tr_list_begin(t, &elem);
    snprintf(reason, sizeof reason, "%s is not a list of structs", name);
    if (check_list(t, *n, elem, VF_TC_STRUCT, reason, NULL) < 0)
        return NULL;
    if (*seen) {
        snprintf(reason, sizeof reason, "duplicate %s field", name);
        vf_pq_tr_fail(t, reason);
        return NULL;
    }
    *seen = 1;
    return list_alloc(t, *n, item_size);
}

static void parse_file_metadata(vf_pq_tr *t, footer *m)
{
    int16_t last = 0, id;
    int type, ok;
    uint32_t n;
    void *list;
    vf_pq_tr_struct_begin(t);
    while (vf_pq_tr_field(t, &last, &id, &type)) {
        switch (id) {
        case 1: m->version = int_field(t, type); break;
        case 2:
            if (!(list = begin_struct_list(t, type, "schema", &m->has_schema, sizeof *m->elems, &n)))
                break;
            m->elems = list;
            while (m->num_elems < n && !t->err)
                parse_schema_element(t, &m->elems[m->num_elems++]);
            if (m->proj && !m->row_groups && !t->err)
                compute_projection(t, m);
            break;
        case 3:
            m->num_rows = vf_pq_tr_int_field(t, type, &ok);
            m->has_num_rows = ok;
            break;
        case 4:
            if (!(list = begin_struct_list(t, type, "row_groups", &m->has_row_groups, sizeof *m->row_groups, &n)))
                break;
            m->row_groups = list;
            while (m->num_row_groups < n && !t->err)
                parse_row_group(t, &m->row_groups[m->num_row_groups++], m);
            break;
        case 5:
            if (!(list = begin_struct_list(t, type, "key_value_metadata", &m->has_kv, sizeof(char *), &n)))
                break;
            m->kv_keys = list;
            m->kv_values = list_alloc(t, n, sizeof(char *));
            while (m->kv_values && m->num_kv < n && !t->err) {
                uint32_t i = m->num_kv++;
                parse_kv(t, &m->kv_keys[i], &m->kv_values[i]);
            }
            break;
        case 6:
            if (WANT(type, VF_TC_BINARY)) {
                free(m->created_by);
                m->created_by = vf_pq_tr_string(t);
            }
            break;
        default: vf_pq_tr_skip(t, type); break;
        }
    }
    vf_pq_tr_struct_end(t);
}

static void free_footer(footer *m)
{
    for (uint32_t i = 0; m->elems && i < m->num_elems; i++)
        free(m->elems[i].name);
    free(m->elems);
    for (uint32_t i = 0; m->kv_keys && i < m->num_kv; i++) {
        free(m->kv_keys[i]);
        if (m->kv_values)
            free(m->kv_values[i]);
    }
    free(m->kv_keys);
    free(m->kv_values);
    for (uint32_t i = 0; m->row_groups && i < m->num_row_groups; i++)
        free_row_group(&m->row_groups[i]);
    free(m->row_groups);
    free(m->created_by);
    free(m->leaf_slot);
    memset(m, 0, sizeof *m);
}

/* ---- schema tree ------------------------------------------------------- */

static vf_pq_type resolve_leaf_type(const schema_elem *e)
{
    int ct = e->converted, lt = e->logical;
    switch (e->type) {
    case VF_PQ_BOOLEAN: return VF_PQ_T_BOOL;
    case VF_PQ_INT32:
        if (lt == VF_PQ_LT_INTEGER) {
            if (e->int_bits == 8)
                return e->int_signed ? VF_PQ_T_INT8 : VF_PQ_T_UINT8;
            if (e->int_bits == 16)
                return e->int_signed ? VF_PQ_T_INT16 : VF_PQ_T_UINT16;
            if (e->int_bits == 32)
                return e->int_signed ? VF_PQ_T_INT32 : VF_PQ_T_UINT32;
            return VF_PQ_T_INT32;
        }
        switch (ct) {
        case VF_PQ_CT_INT_8: return VF_PQ_T_INT8;
        case VF_PQ_CT_INT_16: return VF_PQ_T_INT16;
        case VF_PQ_CT_UINT_8: return VF_PQ_T_UINT8;
        case VF_PQ_CT_UINT_16: return VF_PQ_T_UINT16;
        case VF_PQ_CT_UINT_32: return VF_PQ_T_UINT32;
        default: return VF_PQ_T_INT32;
        }
    case VF_PQ_INT64:
        if ((lt == VF_PQ_LT_INTEGER && !e->int_signed) || (lt != VF_PQ_LT_INTEGER && ct == VF_PQ_CT_UINT_64))
            return VF_PQ_T_UINT64;
        return VF_PQ_T_INT64;
    case VF_PQ_FLOAT: return VF_PQ_T_FLOAT;
    case VF_PQ_DOUBLE: return VF_PQ_T_DOUBLE;
    case VF_PQ_BYTE_ARRAY:
        if (lt == VF_PQ_LT_STRING || lt == VF_PQ_LT_ENUM || lt == VF_PQ_LT_JSON || ct == VF_PQ_CT_UTF8 ||
            ct == VF_PQ_CT_ENUM || ct == VF_PQ_CT_JSON)
            return VF_PQ_T_STRING;
        return VF_PQ_T_BINARY;
    case VF_PQ_FIXED_LEN_BYTE_ARRAY:
        if (e->type_length <= 0)
            return VF_PQ_T_NULL;
        if (lt == VF_PQ_LT_FLOAT16 && e->type_length == 2)
            return VF_PQ_T_FLOAT16;
        return VF_PQ_T_FIXED_BINARY;
    default: return VF_PQ_T_NULL; /* INT96 and unknown physical types */
    }
}

static int is_list_group(const vf_pq_node *n)
{
    return n->logical_type == VF_PQ_LT_LIST || n->converted_type == VF_PQ_CT_LIST;
}

static int is_map_group(const vf_pq_node *n)
{
    return n->logical_type == VF_PQ_LT_MAP || n->converted_type == VF_PQ_CT_MAP ||
           n->converted_type == VF_PQ_CT_MAP_KEY_VALUE;
}

typedef struct tree_ctx {
    vf_pq_file *f;
    schema_elem *elems;
    uint32_t num_elems;
    uint32_t next;        /* next element to consume */
    int slots_used;
    int leaves;
    int *first_leaf;      /* per node */
    int *leaf_count;
} tree_ctx;

static int build_node(tree_ctx *c, vf_pq_node *parent, int depth)
{
    vf_pq_file *f = c->f;
    if (c->next >= c->num_elems)
        return vf_error(VF_ECORRUPT, "%s: schema num_children needs more elements than the %u present", f->name,
                        c->num_elems);
    if (depth > VF_PQ_MAX_NESTING)
        return vf_error(VF_EUNSUPPORTED, "%s: schema nested deeper than %d levels", f->name, VF_PQ_MAX_NESTING);
    uint32_t idx = c->next++;
    schema_elem *e = &c->elems[idx];
    vf_pq_node *n = &f->nodes[idx];
    n->name = e->name ? e->name : vf_strdup("");
    e->name = NULL;
    if (!n->name)
        return VF_ENOMEM;
    n->parent = parent;
    n->leaf_index = -1;
    n->converted_type = e->converted;
    n->logical_type = e->logical;
    n->physical = e->has_type ? (vf_pq_physical)e->type : VF_PQ_BOOLEAN;
    n->type_length = e->type_length;
    if (parent) {
        if (e->repetition < VF_PQ_REQUIRED || e->repetition > VF_PQ_REPEATED)
            return vf_error(VF_ECORRUPT, "%s: schema element '%s' has bad repetition %d", f->name, n->name,
                            e->repetition);
        n->repetition = (vf_pq_repetition)e->repetition;
        n->max_def = (int16_t)(parent->max_def + (n->repetition != VF_PQ_REQUIRED));
        n->max_rep = (int16_t)(parent->max_rep + (n->repetition == VF_PQ_REPEATED));
    } else {
        n->repetition = VF_PQ_REQUIRED;
    }
    c->first_leaf[idx] = c->leaves;
    if (e->num_children < 0)
        return vf_error(VF_ECORRUPT, "%s: schema element '%s' has %d children", f->name, n->name, e->num_children);
    if (e->num_children == 0 && parent) {
        if (!e->has_type)
            return vf_error(VF_ECORRUPT, "%s: schema group '%s' has no children", f->name, n->name);
        n->is_leaf = 1;
        n->leaf_index = c->leaves++;
        n->type = resolve_leaf_type(e);
        c->leaf_count[idx] = 1;
        return 0;
    }
    if ((uint32_t)e->num_children > c->num_elems - c->next)
        return vf_error(VF_ECORRUPT, "%s: schema element '%s' claims %d children but only %u elements follow",
                        f->name, n->name, e->num_children, c->num_elems - c->next);
    if ((uint32_t)e->num_children > c->num_elems - (uint32_t)c->slots_used)
        return vf_error(VF_ECORRUPT, "%s: schema num_children counts exceed the %u elements", f->name,
                        c->num_elems);
    n->num_children = e->num_children;
    n->children = f->child_slots + c->slots_used;
    c->slots_used += n->num_children;
    n->type = (parent && (is_list_group(n) || is_map_group(n) || n->repetition == VF_PQ_REPEATED)) ? VF_PQ_T_LIST
                                                                                                  : VF_PQ_T_STRUCT;
    for (int i = 0; i < n->num_children; i++) {
        n->children[i] = &f->nodes[c->next];
        int r = build_node(c, n, depth + 1);
        if (r < 0)
            return r;
    }
    c->leaf_count[idx] = c->leaves - c->first_leaf[idx];
    return 0;
}

/* ---- assembly plans ----------------------------------------------------- */

static int plan_field(tree_ctx *c, const vf_pq_node *n, int16_t slot_def, int16_t slot_rep, vf_pq_plan *p,
                      int depth);

static void plan_leaves(tree_ctx *c, const vf_pq_node *n, vf_pq_plan *p)
{
    int idx = (int)(n - c->f->nodes);
    p->first_leaf = c->first_leaf[idx];
    p->num_leaves = c->leaf_count[idx];
}

static int plan_children(tree_ctx *c, const vf_pq_node *n, int16_t slot_def, int16_t slot_rep, vf_pq_plan *p,
                         int depth)
{
    p->children = vf_calloc((size_t)n->num_children, sizeof *p->children);
    if (!p->children)
        return VF_ENOMEM;
    p->num_children = n->num_children;
    for (int i = 0; i < n->num_children; i++) {
        int r = plan_field(c, n->children[i], slot_def, slot_rep, &p->children[i], depth + 1);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The element of a list whose repeated node is n, taken as required: a
 * scalar for a leaf, else a struct of n's children. */
static int plan_element(tree_ctx *c, const vf_pq_node *n, vf_pq_plan *p, int depth)
{
    p->name = n->name;
    p->slot_def = n->max_def;
    p->slot_rep = n->max_rep;
    p->valid_def = n->max_def;
    plan_leaves(c, n, p);
    if (n->is_leaf) {
        p->type = n->type;
        p->node = n;
        return 0;
    }
    p->type = VF_PQ_T_STRUCT;
    return plan_children(c, n, n->max_def, n->max_rep, p, depth);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int plan_field(tree_ctx *c, const vf_pq_node *n, int16_t slot_def, int16_t slot_rep, vf_pq_plan *p,
                      int depth)
{
    if (depth > 2 * VF_PQ_MAX_NESTING)
        return vf_error(VF_EUNSUPPORTED, "%s: schema nested too deeply", c->f->name);
    p->name = n->name;
    p->slot_def = slot_def;
    p->slot_rep = slot_rep;
    plan_leaves(c, n, p);
    if (n->repetition == VF_PQ_REPEATED) {
        /* Legacy: a repeated field outside a LIST group is a required
         * list of required elements. */
        p->type = VF_PQ_T_LIST;
        p->valid_def = (int16_t)(n->max_def - 1);
        p->children = vf_calloc(1, sizeof *p->children);
        if (!p->children)
            return VF_ENOMEM;
        p->num_children = 1;
        return plan_element(c, n, p->children, depth + 1);
    }
    p->valid_def = n->max_def;
    if (n->is_leaf) {
        p->type = n->type;
        p->node = n;
        return 0;
    }
    if (is_list_group(n) || is_map_group(n)) {
        if (n->num_children != 1 || n->children[0]->repetition != VF_PQ_REPEATED)
            return vf_error(VF_ECORRUPT, "%s: %s group '%s' must have exactly one repeated child", c->f->name,
                            is_list_group(n) ? "LIST" : "MAP", n->name);
        const vf_pq_node *r = n->children[0];
        p->type = VF_PQ_T_LIST;
        p->children = vf_calloc(1, sizeof *p->children);
        if (!p->children)
            return VF_ENOMEM;
        p->num_children = 1;
        /* Backward-compatibility rules of the LIST spec: the repeated node
         * is itself the element when it is a primitive, has several
         * fields, or is named "array" / "*_tuple" (and for MAP). */
        if (is_map_group(n) || r->is_leaf || r->num_children > 1 || !strcmp(r->name, "array") ||
            ends_with(r->name, "_tuple"))
            return plan_element(c, r, p->children, depth + 1);
        return plan_field(c, r->children[0], r->max_def, r->max_rep, p->children, depth + 1);
    }
    p->type = VF_PQ_T_STRUCT;
    return plan_children(c, n, slot_def, slot_rep, p, depth);
}

static void free_plan(vf_pq_plan *p)
{
    for (int i = 0; i < p->num_children; i++)
        free_plan(&p->children[i]);
    free(p->children);
    p->children = NULL;
    p->num_children = 0;
}

char *vf_pq_leaf_path_string(const vf_pq_node *leaf)
{
    const vf_pq_node *chain[VF_PQ_MAX_NESTING + 2];
    int n = 0;
    for (const vf_pq_node *x = leaf; x && x->parent && n < (int)VF_ARRAY_LEN(chain); x = x->parent)
        chain[n++] = x;
    vf_buf b = {0};
    for (int i = n - 1; i >= 0; i--)
        vf_buf_printf(&b, "%s%s", i == n - 1 ? "" : ".", chain[i]->name);
    if (!b.data)
        return vf_strdup("");
    return vf_buf_take_string(&b);
}

/* One element of a raw path_in_schema list (bounds checked when parsed). */
static const uint8_t *raw_path_elem(const uint8_t *p, uint32_t *len)
{
    uint32_t v = 0;
    for (int shift = 0;; shift += 7) {
        uint8_t b = *p++;
        v |= (uint32_t)(b & 0x7f) << shift;
        if (!(b & 0x80) || shift >= 28)
            break;
    }
    *len = v;
    return p;
}

static int check_path(const vf_pq_file *f, const vf_pq_node *leaf, const vf_pq_chunk_meta *m)
{
    /* the leaf's chain of names, root's child first */
    int depth = 0;
    for (const vf_pq_node *x = leaf; x && x->parent; x = x->parent)
        depth++;
    int ok = depth == m->path_len;
    const uint8_t *raw = m->path_raw;
    for (int i = 0; ok && i < depth; i++) {
        const vf_pq_node *x = leaf;
        for (int up = depth - 1 - i; up > 0; up--)
            x = x->parent;
        uint32_t len;
        const uint8_t *s = raw_path_elem(raw, &len);
        ok = x->name && strlen(x->name) == len && memcmp(x->name, s, len) == 0;
        raw = s + len;
    }
    if (!ok) {
        char *p = vf_pq_leaf_path_string(leaf);
        int r = vf_error(VF_ECORRUPT, "%s: column chunk path_in_schema does not match leaf %d ('%s')", f->name,
                         leaf->leaf_index, p ? p : "?");
        free(p);
        return r;
    }
    return 0;
}

/* ---- entry points ------------------------------------------------------- */

static void free_fields(vf_pq_file *f, int num_fields);

void vf_pq_free_metadata(vf_pq_file *f)
{
    if (f->fields)
        free_fields(f, f->nodes && f->num_nodes ? f->nodes[0].num_children : 0);
    for (int i = 0; f->nodes && i < f->num_nodes; i++)
        free(f->nodes[i].name);
    free(f->nodes);
    free(f->child_slots);
    free(f->leaves);
    free(f->created_by);
    for (int i = 0; i < f->num_kv; i++) {
        free(f->kv_keys[i]);
        free(f->kv_values[i]);
    }
    free(f->kv_keys);
    free(f->kv_values);
    for (int i = 0; i < f->num_row_groups; i++)
        free_row_group(&f->row_groups[i]);
    free(f->row_groups);
    free(f->leaf_slot);
    f->leaf_slot = NULL;
    free(f->rg_first_row);
    free(f->stats_arena);
    f->stats_arena = NULL;
    f->rg_first_row = NULL;
    f->nodes = NULL;
    f->child_slots = NULL;
    f->leaves = NULL;
    f->created_by = NULL;
    f->kv_keys = f->kv_values = NULL;
    f->row_groups = NULL;
    f->num_nodes = f->num_kv = f->num_row_groups = f->num_leaves = 0;
}

static void free_fields(vf_pq_file *f, int num_fields)
{
    for (int i = 0; f->fields && i < num_fields; i++)
        free_plan(&f->fields[i]);
    free(f->fields);
    f->fields = NULL;
}

/* Copies every chunk's statistics out of the footer into one block. */
static int collect_stats(vf_pq_file *f)
{
    size_t total = 0;
    for (int g = 0; g < f->num_row_groups; g++) {
        const vf_pq_row_group_meta *rg = &f->row_groups[g];
        for (int k = 0; k < rg->num_columns; k++)
            total += (size_t)rg->columns[k].stat_min_len + rg->columns[k].stat_max_len;
    }
    f->stats_arena = vf_malloc(total ? total : 1);
    if (!f->stats_arena)
        return VF_ENOMEM;
    size_t at = 0;
    for (int g = 0; g < f->num_row_groups; g++) {
        vf_pq_row_group_meta *rg = &f->row_groups[g];
        for (int k = 0; k < rg->num_columns; k++) {
            vf_pq_chunk_meta *c = &rg->columns[k];
            if (c->stat_min) {
                memcpy(f->stats_arena + at, c->stat_min, c->stat_min_len);
                c->stat_min = f->stats_arena + at;
                at += c->stat_min_len;
            }
            if (c->stat_max) {
                memcpy(f->stats_arena + at, c->stat_max, c->stat_max_len);
                c->stat_max = f->stats_arena + at;
                at += c->stat_max_len;
            }
        }
    }
    return 0;
}

static int build_everything(vf_pq_file *f, footer *m)
{
    if (!m->has_schema || m->num_elems == 0)
        return vf_error(VF_ECORRUPT, "%s: footer has no schema", f->name);
    if (!m->has_num_rows || m->num_rows < 0)
        return vf_error(VF_ECORRUPT, "%s: footer has no valid num_rows", f->name);
    f->version = m->version;
    f->num_rows = m->num_rows;
    f->created_by = m->created_by ? m->created_by : vf_strdup("");
    m->created_by = NULL;
    if (!f->created_by)
        return VF_ENOMEM;

    /* Key-value metadata (a missing value reads as ""). */
    f->num_kv = (int)m->num_kv;
    f->kv_keys = m->kv_keys;
    f->kv_values = m->kv_values;
    m->kv_keys = m->kv_values = NULL;
    m->num_kv = 0;
    for (int i = 0; i < f->num_kv; i++) {
        if (!f->kv_keys[i] && !(f->kv_keys[i] = vf_strdup("")))
            return VF_ENOMEM;
        if (!f->kv_values[i] && !(f->kv_values[i] = vf_strdup("")))
            return VF_ENOMEM;
    }

    /* Schema tree. */
    f->nodes = vf_calloc(m->num_elems, sizeof *f->nodes);
    f->child_slots = vf_calloc(m->num_elems, sizeof *f->child_slots);
    tree_ctx c = {.f = f, .elems = m->elems, .num_elems = m->num_elems};
    c.first_leaf = vf_calloc(m->num_elems, sizeof(int));
    c.leaf_count = vf_calloc(m->num_elems, sizeof(int));
    int r = VF_ENOMEM;
    if (!f->nodes || !f->child_slots || !c.first_leaf || !c.leaf_count)
        goto out;
    f->num_nodes = (int)m->num_elems;
    if ((r = build_node(&c, NULL, 0)) < 0)
        goto out;
    if (c.next != m->num_elems) {
        r = vf_error(VF_ECORRUPT, "%s: schema has %u elements but the tree uses %u", f->name, m->num_elems, c.next);
        goto out;
    }
    f->num_leaves = c.leaves;
    f->leaves = vf_calloc(f->num_leaves ? (size_t)f->num_leaves : 1, sizeof *f->leaves);
    if (!f->leaves) {
        r = VF_ENOMEM;
        goto out;
    }
    for (int i = 0; i < f->num_nodes; i++)
        if (f->nodes[i].is_leaf)
            f->leaves[f->nodes[i].leaf_index] = &f->nodes[i];

    /* Plans for the top-level fields. */
    const vf_pq_node *root = &f->nodes[0];
    f->fields = vf_calloc(root->num_children ? (size_t)root->num_children : 1, sizeof *f->fields);
    if (!f->fields) {
        r = VF_ENOMEM;
        goto out;
    }
    for (int i = 0; i < root->num_children; i++)
        if ((r = plan_field(&c, root->children[i], 0, 0, &f->fields[i], 0)) < 0) {
            free_fields(f, root->num_children);
            goto out;
        }

    /* Row groups. */
    f->num_row_groups = (int)m->num_row_groups;
    f->row_groups = m->row_groups;
    m->row_groups = NULL;
    m->num_row_groups = 0;
    if (m->leaf_slot) {
        if (m->num_flat_leaves != f->num_leaves) {
            r = vf_error(VF_ECORRUPT, "%s: schema leaves do not add up (%d, %d)", f->name, m->num_flat_leaves,
                         f->num_leaves);
            goto fail_fields;
        }
        f->leaf_slot = m->leaf_slot;
        m->leaf_slot = NULL;
    }
    int64_t total = 0;
    for (int g = 0; g < f->num_row_groups; g++) {
        vf_pq_row_group_meta *rg = &f->row_groups[g];
        if (rg->num_rows < 0) {
            r = vf_error(VF_ECORRUPT, "%s: row group %d has no valid num_rows", f->name, g);
            goto fail_fields;
        }
        if (rg->num_chunks != f->num_leaves) {
            r = vf_error(VF_ECORRUPT, "%s: row group %d has %d column chunks for %d leaves", f->name, g,
                         rg->num_chunks, f->num_leaves);
            goto fail_fields;
        }
        if (rg->num_rows > INT64_MAX - total) {
            r = vf_error(VF_ECORRUPT, "%s: row counts overflow", f->name);
            goto fail_fields;
        }
        total += rg->num_rows;
        for (int k = 0; k < f->num_leaves; k++) {
            vf_pq_chunk_meta *cm = (vf_pq_chunk_meta *)vf_pq_chunk_at(f, g, k);
            if (!cm)
                continue;
            if (cm->has_meta && cm->path_len && (r = check_path(f, f->leaves[k], cm)) < 0) {
                vf_error_context(r, "row group %d", g);
                goto fail_fields;
            }
            cm->path_raw = NULL;
            cm->path_len = 0;
        }
    }
    if ((r = collect_stats(f)) < 0)
        goto fail_fields;
    f->rg_first_row = vf_malloc_array((size_t)f->num_row_groups + 1, sizeof *f->rg_first_row);
    if (!f->rg_first_row) {
        r = VF_ENOMEM;
        goto fail_fields;
    }
    f->rg_first_row[0] = 0;
    for (int g = 0; g < f->num_row_groups; g++)
        f->rg_first_row[g + 1] = f->rg_first_row[g] + f->row_groups[g].num_rows;
    if (f->num_row_groups && total != f->num_rows) {
        r = vf_error(VF_ECORRUPT, "%s: num_rows %lld differs from the row groups' sum %lld", f->name,
                     (long long)f->num_rows, (long long)total);
        goto fail_fields;
    }
    r = 0;
    goto out;
fail_fields:
    free_fields(f, root->num_children);
out:
    free(c.first_leaf);
    free(c.leaf_count);
    return r;
}

int vf_pq_parse_metadata(vf_pq_file *f, const uint8_t *data, size_t len, const char *const *fields,
                         int num_fields)
{
    footer m;
    memset(&m, 0, sizeof m);
    m.proj = num_fields > 0 ? fields : NULL;
    m.num_proj = num_fields;
    char *what = vf_asprintf("%s: footer", f->name);
    if (!what)
        return VF_ENOMEM;
    vf_pq_tr t;
    vf_pq_tr_init(&t, data, len, what);
    parse_file_metadata(&t, &m);
    int r = t.err;
    free(what);
    if (r == 0)
        r = build_everything(f, &m);
    free_footer(&m);
    return r;
}

