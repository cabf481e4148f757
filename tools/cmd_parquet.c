/*
 * cmd_parquet.c: `vlafeed parquet FILE`: inspect a Parquet file with
 * vlafeed's own reader: the schema tree with definition/repetition levels,
 * row groups and column chunks (codec, sizes, statistics), key-value
 * metadata keys, and the first N values of each (or one) column, as text
 * or JSON.
 *
 * This tool sits on src/parquet/parquet.h (the Parquet layer's interface)
 * rather than the public dataset API, because inspecting a file's
 * physical layout is exactly what that API hides.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "parquet/parquet.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: vlafeed parquet FILE [--schema] [--json] [--head N] [--column NAME]\n"
            "\n"
            "Inspect a Parquet file with vlafeed's reader (what training will see).\n"
            "\n"
            "  (default)      summary: created_by, rows, row groups with their column\n"
            "                 chunks (codec, sizes, min/max), key-value metadata keys,\n"
            "                 the schema tree and the first 5 rows\n"
            "  --schema       only the schema tree: every node with its repetition,\n"
            "                 physical/resolved type and, for leaves, max definition\n"
            "                 and repetition levels\n"
            "  --head N       print the first N rows (0: none; default 5)\n"
            "  --column NAME  only this top-level column (exact name, dots included)\n"
            "  --json         one JSON object instead of text (values as JSON: lists,\n"
            "                 objects for structs, null, binary as hex strings)\n"
            "\n"
            "Exit status: 0 ok, 1 the file could not be read, 2 usage error.\n");
}

static const char *repetition_name(vf_pq_repetition r)
{
    return r == VF_PQ_REQUIRED ? "required" : r == VF_PQ_OPTIONAL ? "optional" : "repeated";
}

static const char *physical_name(vf_pq_physical p)
{
    static const char *names[] = {"BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
                                  "FIXED_LEN_BYTE_ARRAY"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

static const char *codec_name(vf_pq_codec c)
{
    static const char *names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : "?";
}

/* ---- JSON / text value output ------------------------------------------ */

static void put_json_string(vf_buf *b, const uint8_t *s, size_t n)
{
    vf_buf_append_u8(b, '"');
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = s[i];
        if (ch == '"' || ch == '\\')
            vf_buf_printf(b, "\\%c", ch);
        else if (ch < 0x20)
            vf_buf_printf(b, "\\u%04x", ch);
        else
            vf_buf_append_u8(b, ch);
    }
    vf_buf_append_u8(b, '"');
}

static void put_hex(vf_buf *b, const uint8_t *s, size_t n)
{
    vf_buf_append_u8(b, '"');
    for (size_t i = 0; i < n; i++)
        vf_buf_printf(b, "%02x", s[i]);
    vf_buf_append_u8(b, '"');
}

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Shortest %g that reads back to the same value. */
static void put_real(vf_buf *b, double v, int is_float)
{
    if (isnan(v) || isinf(v)) {
        vf_buf_printf(b, "%s", isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
        return;
    }
    char tmp[40];
    for (int prec = is_float ? 6 : 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (is_float ? (float)strtod(tmp, NULL) == (float)v : strtod(tmp, NULL) == v)
            break;
    }
    vf_buf_printf(b, "%s", tmp);
    if (!strpbrk(tmp, ".eE"))
        vf_buf_printf(b, ".0");
}

static void put_value(vf_buf *b, const vf_pq_array *a, int64_t i)
{
    if (a->valid && !a->valid[i]) {
        vf_buf_printf(b, "null");
        return;
    }
    const void *v = a->values;
    switch (a->type) {
    case VF_PQ_T_BOOL: vf_buf_printf(b, "%s", ((const uint8_t *)v)[i] ? "true" : "false"); break;
    case VF_PQ_T_INT8: vf_buf_printf(b, "%d", ((const int8_t *)v)[i]); break;
    case VF_PQ_T_INT16: vf_buf_printf(b, "%d", ((const int16_t *)v)[i]); break;
    case VF_PQ_T_INT32: vf_buf_printf(b, "%" PRId32, ((const int32_t *)v)[i]); break;
    case VF_PQ_T_INT64: vf_buf_printf(b, "%" PRId64, ((const int64_t *)v)[i]); break;
    case VF_PQ_T_UINT8: vf_buf_printf(b, "%u", ((const uint8_t *)v)[i]); break;
    case VF_PQ_T_UINT16: vf_buf_printf(b, "%u", ((const uint16_t *)v)[i]); break;
    case VF_PQ_T_UINT32: vf_buf_printf(b, "%" PRIu32, ((const uint32_t *)v)[i]); break;
    case VF_PQ_T_UINT64: vf_buf_printf(b, "%" PRIu64, ((const uint64_t *)v)[i]); break;
    case VF_PQ_T_FLOAT16: put_real(b, half_to_double(((const uint16_t *)v)[i]), 1); break;
    case VF_PQ_T_FLOAT: put_real(b, ((const float *)v)[i], 1); break;
    case VF_PQ_T_DOUBLE: put_real(b, ((const double *)v)[i], 0); break;
    case VF_PQ_T_STRING:
        put_json_string(b, a->data + a->offsets[i], (size_t)(a->offsets[i + 1] - a->offsets[i]));
        break;
    case VF_PQ_T_BINARY: put_hex(b, a->data + a->offsets[i], (size_t)(a->offsets[i + 1] - a->offsets[i])); break;
    case VF_PQ_T_FIXED_BINARY: put_hex(b, (const uint8_t *)v + (size_t)i * (size_t)a->width, (size_t)a->width); break;
    case VF_PQ_T_LIST:
        vf_buf_append_u8(b, '[');
        for (int64_t k = a->offsets[i]; k < a->offsets[i + 1]; k++) {
            if (k > a->offsets[i])
                vf_buf_printf(b, ", ");
            put_value(b, &a->children[0], k);
        }
        vf_buf_append_u8(b, ']');
        break;
    case VF_PQ_T_STRUCT:
        vf_buf_append_u8(b, '{');
        for (int c = 0; c < a->num_children; c++) {
            if (c)
                vf_buf_printf(b, ", ");
            put_json_string(b, (const uint8_t *)a->children[c].name, strlen(a->children[c].name));
            vf_buf_printf(b, ": ");
            put_value(b, &a->children[c], i);
        }
        vf_buf_append_u8(b, '}');
        break;
    default: vf_buf_printf(b, "null"); break;
    }
}

/* ---- schema ------------------------------------------------------------- */

static void node_type(const vf_pq_node *n, char *out, size_t cap)
{
    if (!n->is_leaf)
        snprintf(out, cap, "group");
    else if (n->physical == VF_PQ_FIXED_LEN_BYTE_ARRAY)
        snprintf(out, cap, "FIXED_LEN_BYTE_ARRAY(%d)", n->type_length);
    else
        snprintf(out, cap, "%s", physical_name(n->physical));
}

static void print_schema_text(const vf_pq_node *n, int depth)
{
    char t[64];
    node_type(n, t, sizeof t);
    if (depth == 0) {
        printf("schema:\n");
    } else {
        printf("%*s%s %s %s -> %s", depth * 2, "", repetition_name(n->repetition), t, n->name,
               vf_pq_type_name(n->type));
        if (n->is_leaf)
            printf("  [leaf %d, max_def %d, max_rep %d]", n->leaf_index, n->max_def, n->max_rep);
        printf("\n");
    }
    for (int i = 0; i < n->num_children; i++)
        print_schema_text(n->children[i], depth + 1);
}

static void schema_json(vf_buf *b, const vf_pq_node *n)
{
    char t[64];
    node_type(n, t, sizeof t);
    vf_buf_printf(b, "{\"name\": ");
    put_json_string(b, (const uint8_t *)n->name, strlen(n->name));
    vf_buf_printf(b, ", \"repetition\": \"%s\", \"physical\": \"%s\", \"type\": \"%s\"", repetition_name(n->repetition),
                  t, vf_pq_type_name(n->type));
    if (n->is_leaf)
        vf_buf_printf(b, ", \"leaf_index\": %d, \"max_def\": %d, \"max_rep\": %d", n->leaf_index, n->max_def,
                      n->max_rep);
    if (n->num_children) {
        vf_buf_printf(b, ", \"children\": [");
        for (int i = 0; i < n->num_children; i++) {
            if (i)
                vf_buf_printf(b, ", ");
            schema_json(b, n->children[i]);
        }
        vf_buf_printf(b, "]");
    }
    vf_buf_printf(b, "}");
}

/* A chunk statistic rendered by the leaf's type (ints and floats). */
static void put_stat(vf_buf *b, const vf_pq_node *leaf, const uint8_t *p, size_t n)
{
    if (!p) {
        vf_buf_printf(b, "null");
        return;
    }
    if (leaf->physical == VF_PQ_INT32 && n == 4) {
        int32_t v;
        memcpy(&v, p, 4);
        vf_buf_printf(b, "%" PRId32, v);
    } else if (leaf->physical == VF_PQ_INT64 && n == 8) {
        int64_t v;
        memcpy(&v, p, 8);
        vf_buf_printf(b, "%" PRId64, v);
    } else if (leaf->physical == VF_PQ_FLOAT && n == 4) {
        float v;
        memcpy(&v, p, 4);
        put_real(b, v, 1);
    } else if (leaf->physical == VF_PQ_DOUBLE && n == 8) {
        double v;
        memcpy(&v, p, 8);
        put_real(b, v, 0);
    } else if (leaf->type == VF_PQ_T_STRING) {
        put_json_string(b, p, n);
    } else {
        put_hex(b, p, n);
    }
}

int vf_cmd_parquet(int argc, char **argv)
{
    const char *path = NULL, *column = NULL;
    int schema_only = 0, json = 0;
    long head = 5;
    for (int i = 1; i < argc; i++) {
        if (vf_cli_is(argv[i], "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--schema")) {
            schema_only = 1;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--head") && i + 1 < argc) {
            char *end;
            head = strtol(argv[++i], &end, 10);
            if (*end || head < 0) {
                fprintf(stderr, "vlafeed parquet: --head needs a count >= 0\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--column") && i + 1 < argc) {
            column = argv[++i];
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "vlafeed parquet: unexpected argument '%s'\n\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    vf_pq_file *f;
    if (vf_pq_open_path(&f, path) < 0)
        return vf_cli_fail("parquet");
    int first = 0, last = vf_pq_num_fields(f);
    if (column) {
        first = vf_pq_field_index(f, column);
        if (first < 0) {
            fprintf(stderr, "vlafeed parquet: %s: no top-level column '%s'\n", path, column);
            vf_pq_close(f);
            return 1;
        }
        last = first + 1;
    }
    vf_buf b = {0};
    int status = 0;
    if (json)
        vf_buf_printf(&b, "{\"file\": ");
    if (json) {
        put_json_string(&b, (const uint8_t *)path, strlen(path));
        vf_buf_printf(&b, ", \"created_by\": ");
        put_json_string(&b, (const uint8_t *)vf_pq_created_by(f), strlen(vf_pq_created_by(f)));
        vf_buf_printf(&b, ", \"num_rows\": %" PRId64 ", \"schema\": ", vf_pq_num_rows(f));
        schema_json(&b, vf_pq_schema(f));
    } else if (!schema_only) {
        printf("file: %s\ncreated_by: %s\nrows: %" PRId64 "\nrow groups: %d\nleaves: %d\n", path, vf_pq_created_by(f),
               vf_pq_num_rows(f), vf_pq_num_row_groups(f), vf_pq_num_leaves(f));
    }
    if (!json)
        print_schema_text(vf_pq_schema(f), 0);
    if (!schema_only) {
        /* Key-value metadata keys and row groups. */
        if (json) {
            vf_buf_printf(&b, ", \"kv_keys\": [");
            for (int i = 0; i < vf_pq_num_kv(f); i++) {
                const char *k, *v;
                vf_pq_kv_at(f, i, &k, &v);
                if (i)
                    vf_buf_printf(&b, ", ");
                put_json_string(&b, (const uint8_t *)k, strlen(k));
            }
            vf_buf_printf(&b, "], \"row_groups\": [");
        } else {
            printf("key-value metadata:\n");
            for (int i = 0; i < vf_pq_num_kv(f); i++) {
                const char *k, *v;
                vf_pq_kv_at(f, i, &k, &v);
                printf("  %s (%zu bytes)\n", k, strlen(v));
            }
        }
        for (int g = 0; g < vf_pq_num_row_groups(f); g++) {
            if (json)
                vf_buf_printf(&b, "%s{\"num_rows\": %" PRId64 ", \"columns\": [", g ? ", " : "",
                              vf_pq_row_group_rows(f, g));
            else
                printf("row group %d: %" PRId64 " rows\n", g, vf_pq_row_group_rows(f, g));
            for (int l = 0; l < vf_pq_num_leaves(f); l++) {
                vf_pq_chunk_info ci;
                if (vf_pq_column_chunk(f, g, l, &ci) < 0)
                    continue;
                const vf_pq_node *leaf = vf_pq_leaf(f, l);
                vf_buf s = {0};
                vf_buf_printf(&s, "min ");
                put_stat(&s, leaf, ci.min, ci.min_len);
                vf_buf_printf(&s, ", max ");
                put_stat(&s, leaf, ci.max, ci.max_len);
                if (json) {
                    vf_buf_printf(&b, "%s{\"leaf\": %d, \"codec\": \"%s\", \"num_values\": %" PRId64
                                      ", \"compressed_size\": %" PRId64 ", \"uncompressed_size\": %" PRId64
                                      ", \"null_count\": %" PRId64 ", \"min\": ",
                                  l ? ", " : "", l, codec_name(ci.codec), ci.num_values, ci.compressed_size,
                                  ci.uncompressed_size, ci.null_count);
                    put_stat(&b, leaf, ci.min, ci.min_len);
                    vf_buf_printf(&b, ", \"max\": ");
                    put_stat(&b, leaf, ci.max, ci.max_len);
                    vf_buf_printf(&b, "}");
                } else {
                    printf("  leaf %d %-24s %-12s %8" PRId64 " values %10" PRId64 " -> %10" PRId64 " bytes  %s\n",
                           l, leaf->name, codec_name(ci.codec), ci.num_values, ci.compressed_size,
                           ci.uncompressed_size, s.data ? (char *)s.data : "");
                }
                vf_buf_free(&s);
            }
            if (json)
                vf_buf_printf(&b, "]}");
        }
        if (json)
            vf_buf_printf(&b, "]");
    }
    if (head > 0 && !schema_only) {
        if (json)
            vf_buf_printf(&b, ", \"head\": {");
        else
            printf("first %ld rows:\n", head);
        for (int fi = first; fi < last; fi++) {
            vf_pq_array a;
            const vf_pq_node *field = vf_pq_field(f, fi);
            if (vf_pq_read_field_all(f, fi, &a) < 0) {
                fprintf(stderr, "vlafeed parquet: %s\n", vf_last_error());
                status = 1;
                continue;
            }
            vf_buf line = {0};
            if (json) {
                if (fi > first)
                    vf_buf_printf(&b, ", ");
                put_json_string(&b, (const uint8_t *)field->name, strlen(field->name));
                vf_buf_printf(&b, ": [");
            }
            for (int64_t i = 0; i < a.length && i < head; i++) {
                if (json) {
                    if (i)
                        vf_buf_printf(&b, ", ");
                    put_value(&b, &a, i);
                } else {
                    line.len = 0;
                    put_value(&line, &a, i);
                    vf_buf_append_u8(&line, 0);
                    printf("  %s[%" PRId64 "] = %s\n", field->name, i, (char *)line.data);
                }
            }
            if (json)
                vf_buf_printf(&b, "]");
            vf_buf_free(&line);
            vf_pq_array_free(&a);
        }
        if (json)
            vf_buf_printf(&b, "}");
    }
    if (json) {
        vf_buf_printf(&b, "}\n");
        fwrite(b.data, 1, b.len, stdout);
    }
    vf_buf_free(&b);
    vf_pq_close(f);
    return status;
}
