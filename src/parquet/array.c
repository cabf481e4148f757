/*
 * array.c: vf_pq_array helpers shared by the reader and the writer:
 * freeing, element sizes and type names, and the column builders the
 * writers (make-sample, the v2.1 -> v3.0 converter) share.
 */
#include "parquet/parquet.h"

#include <stdlib.h>
#include <string.h>

void vf_pq_array_free(vf_pq_array *a)
{
    if (!a)
        return;
    for (int i = 0; a->children && i < a->num_children; i++)
        vf_pq_array_free(&a->children[i]);
    free(a->children);
    free(a->name);
    free(a->valid);
    free(a->values);
    free(a->offsets);
    free(a->data);
    memset(a, 0, sizeof *a);
}

size_t vf_pq_type_size(vf_pq_type t)
{
    switch (t) {
    case VF_PQ_T_BOOL:
    case VF_PQ_T_INT8:
    case VF_PQ_T_UINT8: return 1;
    case VF_PQ_T_INT16:
    case VF_PQ_T_UINT16:
    case VF_PQ_T_FLOAT16: return 2;
    case VF_PQ_T_INT32:
    case VF_PQ_T_UINT32:
    case VF_PQ_T_FLOAT: return 4;
    case VF_PQ_T_INT64:
    case VF_PQ_T_UINT64:
    case VF_PQ_T_DOUBLE: return 8;
    default: return 0;
    }
}

const char *vf_pq_type_name(vf_pq_type t)
{
    switch (t) {
    case VF_PQ_T_NULL: return "null";
    case VF_PQ_T_BOOL: return "bool";
    case VF_PQ_T_INT8: return "int8";
    case VF_PQ_T_INT16: return "int16";
    case VF_PQ_T_INT32: return "int32";
    case VF_PQ_T_INT64: return "int64";
    case VF_PQ_T_UINT8: return "uint8";
    case VF_PQ_T_UINT16: return "uint16";
    case VF_PQ_T_UINT32: return "uint32";
    case VF_PQ_T_UINT64: return "uint64";
    case VF_PQ_T_FLOAT16: return "float16";
    case VF_PQ_T_FLOAT: return "float";
    case VF_PQ_T_DOUBLE: return "double";
    case VF_PQ_T_STRING: return "string";
    case VF_PQ_T_BINARY: return "binary";
    case VF_PQ_T_FIXED_BINARY: return "fixed_binary";
    case VF_PQ_T_LIST: return "list";
    case VF_PQ_T_STRUCT: return "struct";
    }
    return "unknown";
}

void vf_pq_arrays_free(vf_pq_array *arrays, int n)
{
    for (int i = 0; i < n; i++)
        vf_pq_array_free(&arrays[i]);
}

int vf_pq_array_init_scalar(vf_pq_array *a, const char *name, vf_pq_type type, int64_t length)
{
    memset(a, 0, sizeof *a);
    a->type = type;
    a->length = length;
    a->name = vf_strdup(name);
    a->values = vf_calloc((size_t)(length ? length : 1), vf_pq_type_size(type));
    return a->name && a->values ? 0 : VF_ENOMEM;
}

int vf_pq_array_init_strings(vf_pq_array *a, const char *name, const char *const *strings, int64_t n)
{
    memset(a, 0, sizeof *a);
    a->type = VF_PQ_T_STRING;
    a->length = n;
    a->name = vf_strdup(name);
    a->offsets = vf_malloc_array((size_t)n + 1, sizeof(int64_t));
    if (!a->name || !a->offsets)
        return VF_ENOMEM;
    vf_buf b = {0};
    a->offsets[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (vf_buf_append(&b, strings[i], strlen(strings[i])) < 0)
            return VF_ENOMEM;
        a->offsets[i + 1] = (int64_t)b.len;
    }
    a->data_len = (int64_t)b.len;
    a->data = b.data ? b.data : vf_calloc(1, 1);
    return a->data ? 0 : VF_ENOMEM;
}
