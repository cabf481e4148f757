/*
 * assemble.c: record assembly (Dremel) from decoded leaf columns into a
 * vf_pq_array tree.
 *
 * Level semantics, per plan node N (built in metadata.c):
 *  - an entry (def d, rep r) of N's representative leaf starts a new slot
 *    (array element) of N iff r <= N.slot_rep (it does not continue a
 *    deeper list) and d >= N.slot_def (the enclosing list has an element
 *    there, rather than being empty or null);
 *  - that slot is non-null iff d >= N.valid_def;
 *  - for a LIST, the child's slot starts inside the current slot are its
 *    elements, so the offsets count child slot starts.
 * A STRUCT takes its slots from its first leaf and assembles every child
 * from that child's own first leaf; the lengths must agree.
 *
 * Fast paths: when every entry of a leaf has def == max_def (page.c then
 * stores no definition levels: no nulls and no empty lists anywhere on the
 * path), a leaf's dense values become the array's values without a copy,
 * and a top-level list over a leaf takes the row starts page.c collected
 * as its offsets (max_rep 1) or scans the repetition levels 8 at a time.
 *
 * Invariants checked (hostile files): lengths of struct children equal
 * the struct's, list offsets end at the child's length, and the
 * top-level length equals the expected row count. Values are never read
 * past the column's num_values.
 */
#include "parquet/read_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct asm_ctx {
    const vf_pq_file *f;
    vf_pq_column *cols;
    int base;                /* leaf index of cols[0] */
} asm_ctx;

static int assemble_node(asm_ctx *a, const vf_pq_plan *p, vf_pq_array *out);

static int mismatch(asm_ctx *a, const vf_pq_plan *p, const char *what, int64_t got, int64_t want)
{
    return vf_error(VF_ECORRUPT, "%s: field '%s': %s (%lld, expected %lld)", a->f->name, p->name, what,
                    (long long)got, (long long)want);
}

static inline int is_slot(const vf_pq_column *c, const vf_pq_plan *p, int64_t i)
{
    int d = c->def ? c->def[i] : c->leaf->max_def, r = c->rep ? c->rep[i] : 0;
    return r <= p->slot_rep && d >= p->slot_def;
}

/* The general paths need per-entry repetition levels. */
static int need_rep(asm_ctx *a, vf_pq_column *c)
{
    if (c->leaf->max_rep == 1 && !c->rep && c->rows > 0 && !c->row_starts)
        return vf_error(VF_ECORRUPT, "%s: repetition levels of '%s' already consumed", a->f->name, c->leaf->name);
    return vf_pq_column_derive_rep(c);
}

static int count_slots(asm_ctx *a, vf_pq_column *c, const vf_pq_plan *p, int64_t *slots)
{
    int64_t n = c->num_entries, s = 0;
    if (!c->def) { /* every entry is a present value at the deepest level */
        if (c->leaf->max_rep == 0 || p->slot_rep >= c->leaf->max_rep) {
            *slots = n;
            return 0;
        }
        if (p->slot_rep == 0) {
            *slots = c->rows;
            return 0;
        }
    }
    int r = need_rep(a, c);
    if (r < 0)
        return r;
    if (!c->rep) {
        for (int64_t i = 0; i < n; i++)
            s += c->def[i] >= p->slot_def;
    } else if (!c->def) {
        for (int64_t i = 0; i < n; i++)
            s += c->rep[i] <= p->slot_rep;
    } else {
        for (int64_t i = 0; i < n; i++)
            s += c->rep[i] <= p->slot_rep && c->def[i] >= p->slot_def;
    }
    *slots = s;
    return 0;
}

/* Validity of the slots of p (NULL when all valid); sets null_count. */
static int build_validity(asm_ctx *a, vf_pq_column *c, const vf_pq_plan *p, int64_t slots, vf_pq_array *out)
{
    out->null_count = 0;
    out->valid = NULL;
    if (!c->def || p->valid_def <= p->slot_def)
        return 0;
    int r = need_rep(a, c);
    if (r < 0)
        return r;
    uint8_t *v = vf_malloc(slots ? (size_t)slots : 1);
    if (!v)
        return VF_ENOMEM;
    int64_t s = 0, nulls = 0;
    for (int64_t i = 0; i < c->num_entries && s < slots; i++) {
        if (!is_slot(c, p, i))
            continue;
        uint8_t ok = c->def[i] >= p->valid_def;
        v[s++] = ok;
        nulls += !ok;
    }
    if (!nulls) {
        free(v);
        return 0;
    }
    out->valid = v;
    out->null_count = nulls;
    return 0;
}

static int assemble_leaf(asm_ctx *a, const vf_pq_plan *p, vf_pq_column *c, vf_pq_array *out)
{
    if (c->type == VF_PQ_T_NULL || p->type != c->type)
        return vf_error(VF_EUNSUPPORTED, "%s: field '%s' has an unsupported type", a->f->name, p->name);
    int64_t slots;
    int r = count_slots(a, c, p, &slots);
    if (r < 0)
        return r;
    int byte_array = c->type == VF_PQ_T_STRING || c->type == VF_PQ_T_BINARY;
    size_t w = c->value_size;
    out->length = slots;
    if (c->type == VF_PQ_T_FIXED_BINARY)
        out->width = (int32_t)w;
    if (slots == c->num_values) {
        /* No nulls among the slots: the dense values are the array. */
        if (byte_array) {
            if (!c->offsets) {
                c->offsets = vf_calloc(1, sizeof *c->offsets);
                if (!c->offsets)
                    return VF_ENOMEM;
            }
            out->offsets = c->offsets;
            out->data = c->data;
            out->data_len = c->data_len;
            c->offsets = NULL;
            c->data = NULL;
        } else {
            out->values = c->values;
            c->values = NULL;
        }
        return 0;
    }
    if (slots < c->num_values)
        return mismatch(a, p, "fewer slots than values", slots, c->num_values);
    if ((r = build_validity(a, c, p, slots, out)) < 0)
        return r;
    if (!out->valid)
        return mismatch(a, p, "values do not match the definition levels", c->num_values, slots);
    /* Scatter the dense values into their slots; null slots stay zero. */
    if (byte_array) {
        int64_t *o = vf_malloc_array((size_t)slots + 1, sizeof *o);
        if (!o)
            return VF_ENOMEM;
        o[0] = 0;
        int64_t k = 0;
        for (int64_t s = 0; s < slots; s++) {
            if (out->valid[s] && k < c->num_values)
                k++;
            o[s + 1] = c->offsets ? c->offsets[k] : 0;
        }
        out->offsets = o;
        out->data = c->data;
        out->data_len = c->data_len;
        c->data = NULL;
        return k == c->num_values ? 0 : mismatch(a, p, "values left over", k, c->num_values);
    }
    uint8_t *v = vf_calloc(slots ? (size_t)slots : 1, w);
    if (!v)
        return VF_ENOMEM;
    out->values = v;
    int64_t k = 0;
    for (int64_t s = 0; s < slots && k < c->num_values; s++) {
        if (!out->valid[s])
            continue;
        switch (w) {
        case 1: v[s] = c->values[k]; break;
        case 2: memcpy(v + 2 * s, c->values + 2 * k, 2); break;
        case 4: memcpy(v + 4 * s, c->values + 4 * k, 4); break;
        case 8: memcpy(v + 8 * s, c->values + 8 * k, 8); break;
        default: memcpy(v + (size_t)s * w, c->values + (size_t)k * w, w); break;
        }
        k++;
    }
    return k == c->num_values ? 0 : mismatch(a, p, "values left over", k, c->num_values);
}

/* Offsets of a top-level list whose elements are the leaf's entries:
 * a slot starts at each rep == 0. Scans 8 levels per step. */
static void offsets_from_rep0(const uint8_t *rep, int64_t n, int64_t *offsets)
{
    int64_t s = 0, i = 0;
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, rep + i, 8);
        if (!((w - ones) & ~w & highs))
            continue; /* no zero byte: no slot starts here */
        for (int j = 0; j < 8; j++)
            if (rep[i + j] == 0)
                offsets[s++] = i + j;
    }
    for (; i < n; i++)
        if (rep[i] == 0)
            offsets[s++] = i;
    offsets[s] = n;
}

static int assemble_list(asm_ctx *a, const vf_pq_plan *p, vf_pq_column *c, vf_pq_array *out)
{
    const vf_pq_plan *child = &p->children[0];
    int64_t n = c->num_entries;
    int64_t slots, child_count;
    int r = count_slots(a, c, p, &slots);
    if (r < 0)
        return r;
    out->length = slots;
    if (!c->def && p->slot_rep == 0 && child->slot_rep >= c->leaf->max_rep) {
        /* All present and the child is at the leaf level (LeRobot vectors):
         * the row starts are the offsets. */
        if (c->leaf->max_rep == 1 && c->row_starts) {
            out->offsets = c->row_starts;
            c->row_starts = NULL;
            out->offsets[slots] = n;
        } else {
            if ((r = need_rep(a, c)) < 0)
                return r;
            if (!(out->offsets = vf_malloc_array((size_t)slots + 1, sizeof *out->offsets)))
                return VF_ENOMEM;
            if (c->rep)
                offsets_from_rep0(c->rep, n, out->offsets);
            else
                out->offsets[0] = 0;
        }
        child_count = n;
    } else {
        if ((r = need_rep(a, c)) < 0 || (r = build_validity(a, c, p, slots, out)) < 0)
            return r;
        int64_t *o = vf_malloc_array((size_t)slots + 1, sizeof *o);
        if (!o)
            return VF_ENOMEM;
        out->offsets = o;
        int64_t s = 0, k = 0;
        for (int64_t i = 0; i < n; i++) {
            int d = c->def ? c->def[i] : c->leaf->max_def, rl = c->rep[i];
            if (rl <= p->slot_rep && d >= p->slot_def && s < slots)
                o[s++] = k;
            if (rl <= child->slot_rep && d >= child->slot_def)
                k++;
        }
        o[s] = k;
        child_count = k;
    }
    out->children = vf_calloc(1, sizeof *out->children);
    if (!out->children)
        return VF_ENOMEM;
    out->num_children = 1;
    if ((r = assemble_node(a, child, &out->children[0])) < 0)
        return r;
    if (out->children[0].length != child_count)
        return mismatch(a, p, "list elements do not match the child length", out->children[0].length, child_count);
    return 0;
}

static int assemble_struct(asm_ctx *a, const vf_pq_plan *p, vf_pq_column *c, vf_pq_array *out)
{
    int64_t slots;
    int r = count_slots(a, c, p, &slots);
    if (r < 0 || (r = build_validity(a, c, p, slots, out)) < 0)
        return r;
    out->length = slots;
    out->children = vf_calloc(p->num_children ? (size_t)p->num_children : 1, sizeof *out->children);
    if (!out->children)
        return VF_ENOMEM;
    out->num_children = p->num_children;
    for (int i = 0; i < p->num_children; i++) {
        if ((r = assemble_node(a, &p->children[i], &out->children[i])) < 0)
            return r;
        if (out->children[i].length != slots)
            return mismatch(a, &p->children[i], "struct child length differs from its parent",
                            out->children[i].length, slots);
    }
    return 0;
}

static int assemble_node(asm_ctx *a, const vf_pq_plan *p, vf_pq_array *out)
{
    memset(out, 0, sizeof *out);
    out->type = p->type;
    out->name = vf_strdup(p->name);
    if (!out->name)
        return VF_ENOMEM;
    if (p->num_leaves < 1)
        return vf_error(VF_ECORRUPT, "%s: field '%s' has no leaves", a->f->name, p->name);
    vf_pq_column *c = &a->cols[p->first_leaf - a->base];
    switch (p->type) {
    case VF_PQ_T_LIST: return assemble_list(a, p, c, out);
    case VF_PQ_T_STRUCT: return assemble_struct(a, p, c, out);
    default: return assemble_leaf(a, p, c, out);
    }
}

int vf_pq_assemble(const vf_pq_file *f, const vf_pq_plan *plan, vf_pq_column *cols, int64_t num_rows,
                   vf_pq_array *out)
{
    asm_ctx a = {.f = f, .cols = cols, .base = plan->first_leaf};
    int r = assemble_node(&a, plan, out);
    if (r == 0 && out->length != num_rows)
        r = mismatch(&a, plan, "row count differs from the row groups", out->length, num_rows);
    if (r < 0)
        vf_pq_array_free(out);
    return r;
}
