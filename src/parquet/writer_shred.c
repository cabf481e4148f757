/*
 * writer_shred.c: Dremel shredding for the Parquet writer. Turns one leaf of
 * a caller's (already validated) array tree into definition and repetition
 * levels and the present leaf values in their physical representation.
 *
 * Method: one "slot" per level entry. A slot is either alive (it points at an
 * element of the current array) or finished (its def level is known). The
 * walk goes down the leaf's path one array at a time:
 *   - every array node is OPTIONAL: a null element finishes its slot at the
 *     current def, otherwise def grows by one;
 *   - a STRUCT passes its slots to the chosen child unchanged;
 *   - a LIST replaces each alive slot by one slot per list element (the
 *     first keeps the slot's rep level, the others get this list's rep
 *     level); an empty list finishes its slot with "list present" def. The
 *     repeated `list` group adds one more def level.
 * At the leaf the alive slots are the present values (def == max_def).
 * Each level is a flat loop over the slots, so the cost per value is a few
 * array accesses, not a recursive call.
 */
#include "parquet/writer_internal.h"

#include <stdlib.h>
#include <string.h>

void vf_pq_w_column_free(vf_pq_w_column *c)
{
    free(c->def);
    free(c->rep);
    free(c->fixed);
    free(c->value_index);
    memset(c, 0, sizeof *c);
}

/* Element i of an INT8, UINT8, INT16 or UINT16 array, widened to the INT32
 * that Parquet stores it as. */
static int32_t small_int_at(const vf_pq_array *a, int64_t i)
{
    switch (a->type) {
    case VF_PQ_T_INT8: return ((const int8_t *)a->values)[i];
    case VF_PQ_T_UINT8: return ((const uint8_t *)a->values)[i];
    case VF_PQ_T_INT16: return ((const int16_t *)a->values)[i];
    default: return ((const uint16_t *)a->values)[i];
    }
}

/* Copies the present values (slot indices alive in `index`) into the
 * physical representation of the leaf type. */
static int gather_fixed(const vf_pq_array *a, const vf_pq_w_leaf *lf, const int64_t *index, int64_t num_slots,
                        int64_t num_values, uint8_t **out)
{
    uint8_t *buf = vf_malloc_array((size_t)(num_values ? num_values : 1), lf->value_size);
    if (!buf)
        return VF_ENOMEM;
    int64_t v = 0;
    switch (a->type) {
    case VF_PQ_T_BOOL: {
        const uint8_t *src = a->values;
        for (int64_t s = 0; s < num_slots; s++)
            if (index[s] >= 0)
                buf[v++] = src[index[s]] ? 1 : 0;
        break;
    }
    case VF_PQ_T_INT8:
    case VF_PQ_T_UINT8:
    case VF_PQ_T_INT16:
    case VF_PQ_T_UINT16: {
        int32_t *dst = (int32_t *)(void *)buf;
        for (int64_t s = 0; s < num_slots; s++)
            if (index[s] >= 0)
                dst[v++] = small_int_at(a, index[s]);
        break;
    }
    default: {
        /* Same bytes on disk as in memory: 2, 4, 8 or `width` bytes. */
        size_t size = lf->value_size;
        const uint8_t *src = a->values;
        int64_t s = 0;
        while (s < num_slots) {
            if (index[s] < 0) {
                s++;
                continue;
            }
            /* Copy runs of consecutive source elements at once. */
            int64_t run = 1;
            while (s + run < num_slots && index[s + run] == index[s] + run)
                run++;
            memcpy(buf + (size_t)v * size, src + (size_t)index[s] * size, (size_t)run * size);
            v += run;
            s += run;
        }
        break;
    }
    }
    *out = buf;
    return 0;
}

int vf_pq_w_shred(const vf_pq_array *field, const vf_pq_w_leaf *lf, vf_pq_w_column *out)
{
    memset(out, 0, sizeof *out);
    int64_t n = field->length;
    int64_t *index = vf_malloc_array((size_t)(n ? n : 1), sizeof *index);
    int16_t *def = vf_malloc_array((size_t)(n ? n : 1), sizeof *def);
    int16_t *rep = lf->max_rep > 0 ? vf_calloc((size_t)(n ? n : 1), sizeof *rep) : NULL;
    if (!index || !def || (lf->max_rep > 0 && !rep))
        goto nomem;
    for (int64_t i = 0; i < n; i++)
        index[i] = i;

    const vf_pq_array *a = field;
    int16_t d = 0;     /* def level of alive slots before this array */
    int16_t r = 0;     /* rep level of the innermost list entered */
    for (int step = 0;; step++) {
        if (a->valid) {
            for (int64_t s = 0; s < n; s++) {
                if (index[s] >= 0 && !a->valid[index[s]]) {
                    def[s] = d;
                    index[s] = -1;
                }
            }
        }
        d++;
        if (a->type == VF_PQ_T_STRUCT) {
            a = &a->children[lf->steps[step]];
            continue;
        }
        if (a->type != VF_PQ_T_LIST)
            break;
        /* Expand the list level. */
        const int64_t *off = a->offsets;
        int64_t count = 0;
        for (int64_t s = 0; s < n; s++) {
            int64_t len = index[s] >= 0 ? off[index[s] + 1] - off[index[s]] : 0;
            count += len > 0 ? len : 1;
        }
        int64_t *new_index = vf_malloc_array((size_t)(count ? count : 1), sizeof *new_index);
        int16_t *new_def = vf_malloc_array((size_t)(count ? count : 1), sizeof *new_def);
        int16_t *new_rep = vf_malloc_array((size_t)(count ? count : 1), sizeof *new_rep);
        if (!new_index || !new_def || !new_rep) {
            free(new_index);
            free(new_def);
            free(new_rep);
            goto nomem;
        }
        int16_t list_rep = (int16_t)(r + 1);
        int64_t o = 0;
        for (int64_t s = 0; s < n; s++) {
            int64_t i = index[s];
            if (i < 0) {
                new_index[o] = -1;
                new_def[o] = def[s];
                new_rep[o++] = rep[s];
                continue;
            }
            int64_t b = off[i], e = off[i + 1];
            if (b == e) {
                new_index[o] = -1;
                new_def[o] = d;
                new_rep[o++] = rep[s];
                continue;
            }
            new_index[o] = b;
            new_rep[o++] = rep[s];
            for (int64_t j = b + 1; j < e; j++) {
                new_index[o] = j;
                new_rep[o++] = list_rep;
            }
        }
        free(index);
        free(def);
        free(rep);
        index = new_index;
        def = new_def;
        rep = new_rep;
        n = count;
        r = list_rep;
        d++; /* the repeated `list` group */
        a = &a->children[0];
    }

    /* a is the leaf array; alive slots are present values at def d. */
    int64_t num_values = 0;
    for (int64_t s = 0; s < n; s++) {
        if (index[s] >= 0) {
            def[s] = d;
            num_values++;
        }
    }
    int64_t num_rows = field->length;
    out->num_levels = n;
    out->def = def;
    out->rep = rep;
    out->num_rows = num_rows;
    out->num_values = num_values;
    def = NULL;
    rep = NULL;
    int rc;
    if (lf->value_size > 0) {
        rc = gather_fixed(a, lf, index, n, num_values, &out->fixed);
        if (rc < 0)
            goto fail;
    } else {
        /* Byte arrays: keep the element indices, compacted. */
        int64_t v = 0;
        for (int64_t s = 0; s < n; s++)
            if (index[s] >= 0)
                index[v++] = index[s];
        out->leaf = a;
        out->value_index = index;
        index = NULL;
    }
    free(index);
    return 0;

nomem:
    rc = VF_ENOMEM;
fail:
    free(index);
    free(def);
    free(rep);
    vf_pq_w_column_free(out);
    return vf_error_context(rc, "column %s", lf->dotted);
}
