/*
 * pack.c: first-fit-decreasing packing over look-ahead windows (pack.h).
 *
 * Two passes: the first places each sample (row, offset) window by window;
 * the second lays the rows out in creation order and fills order,
 * cu_seqlens, row_first and position_ids from the placement. Sorting uses
 * a total order (length descending, then index ascending), so qsort's
 * instability cannot change the result.
 */
#include "pack/pack.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void vf_pack_defaults(vf_pack_settings *settings)
{
    settings->max_tokens = 2048;
    settings->window = 0;
}

void vf_pack_free(vf_pack_plan *plan)
{
    if (!plan)
        return;
    free(plan->sample_row);
    free(plan->sample_offset);
    free(plan->order);
    free(plan->cu_seqlens);
    free(plan->row_first);
    free(plan->row_tokens);
    free(plan->position_ids);
    memset(plan, 0, sizeof(*plan));
}

typedef struct pack_item {
    int32_t length;
    int32_t index;
} pack_item;

static int compare_longest_first(const void *a, const void *b)
{
    const pack_item *x = a, *y = b;
    if (x->length != y->length)
        return x->length > y->length ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int pack_validate(const int32_t *lengths, size_t count, const vf_pack_settings *settings,
                         size_t *token_count)
{
    if (settings->max_tokens < 1)
        return vf_error(VF_EINVAL, "pack: max_tokens is %d, must be >= 1", (int)settings->max_tokens);
    if (count > (size_t)INT32_MAX - 1)
        return vf_error(VF_ERANGE, "pack: %zu samples is more than a plan can index", count);
    if (count && !lengths)
        return vf_error(VF_EINVAL, "pack: %zu samples but no lengths", count);
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (lengths[i] < 1 || lengths[i] > settings->max_tokens)
            return vf_error(VF_EINVAL, "pack: sample %zu has %d tokens; a sample needs 1 to max_tokens (%d)", i,
                            (int)lengths[i], (int)settings->max_tokens);
        total += (size_t)lengths[i];
        if (total > (size_t)INT32_MAX)
            return vf_error(VF_ERANGE, "pack: more than %d tokens in total", INT32_MAX);
    }
    *token_count = total;
    return 0;
}

/* Places the samples: sample_row/sample_offset per sample, row_tokens per
 * row (rows numbered in creation order); returns the row count. */
static size_t pack_place(const int32_t *lengths, size_t count, const vf_pack_settings *settings,
                         pack_item *items, vf_pack_plan *plan)
{
    size_t window = settings->window ? settings->window : (count ? count : 1);
    size_t rows = 0;
    for (size_t start = 0; start < count; start += window) {
        size_t n = VF_MIN(window, count - start);
        for (size_t k = 0; k < n; k++)
            items[k] = (pack_item){lengths[start + k], (int32_t)(start + k)};
        qsort(items, n, sizeof(*items), compare_longest_first);
        size_t first_row = rows; /* rows of earlier windows are closed */
        for (size_t k = 0; k < n; k++) {
            size_t r = first_row;
            while (r < rows && plan->row_tokens[r] + items[k].length > settings->max_tokens)
                r++;
            if (r == rows)
                plan->row_tokens[rows++] = 0;
            plan->sample_row[items[k].index] = (int32_t)r;
            plan->sample_offset[items[k].index] = plan->row_tokens[r];
            plan->row_tokens[r] += items[k].length;
        }
    }
    return rows;
}

int vf_pack_build(vf_pack_plan *plan, const int32_t *lengths, size_t count, const vf_pack_settings *settings)
{
    memset(plan, 0, sizeof(*plan));
    size_t tokens = 0;
    int r = pack_validate(lengths, count, settings, &tokens);
    if (r < 0)
        return r;
    size_t slots = count ? count : 1;
    pack_item *items = vf_malloc_array(slots, sizeof(*items));
    int32_t *row_cursor = vf_malloc_array(slots, sizeof(int32_t));
    plan->sample_row = vf_malloc_array(slots, sizeof(int32_t));
    plan->sample_offset = vf_malloc_array(slots, sizeof(int32_t));
    plan->order = vf_malloc_array(slots, sizeof(int32_t));
    plan->cu_seqlens = vf_malloc_array(count + 1, sizeof(int32_t));
    plan->row_first = vf_malloc_array(count + 1, sizeof(int32_t));
    plan->row_tokens = vf_malloc_array(slots, sizeof(int32_t)); /* at most one row per sample */
    plan->position_ids = vf_malloc_array(tokens ? tokens : 1, sizeof(int32_t));
    if (!items || !row_cursor || !plan->sample_row || !plan->sample_offset || !plan->order || !plan->cu_seqlens ||
        !plan->row_first || !plan->row_tokens || !plan->position_ids) {
        free(items);
        free(row_cursor);
        vf_pack_free(plan);
        return VF_ENOMEM;
    }
    plan->sample_count = count;
    plan->token_count = tokens;
    plan->row_count = pack_place(lengths, count, settings, items, plan);

    /* Lay out rows in creation order: count samples per row, then place
     * each sample at its row's slot ordered by offset (offsets ascend with
     * placement, and placement visits a row's samples in offset order). */
    size_t rows = plan->row_count;
    memset(plan->row_first, 0, (count + 1) * sizeof(int32_t));
    for (size_t i = 0; i < count; i++)
        plan->row_first[plan->sample_row[i] + 1]++;
    for (size_t row = 0; row < rows; row++)
        plan->row_first[row + 1] += plan->row_first[row];
    memcpy(row_cursor, plan->row_first, rows * sizeof(int32_t));
    for (size_t i = 0; i < count; i++) {
        /* insertion by offset inside the row's slots (rows hold few samples) */
        int32_t row = plan->sample_row[i];
        int32_t pos = row_cursor[row]++;
        while (pos > plan->row_first[row] && plan->sample_offset[plan->order[pos - 1]] > plan->sample_offset[i]) {
            plan->order[pos] = plan->order[pos - 1];
            pos--;
        }
        plan->order[pos] = (int32_t)i;
    }
    plan->cu_seqlens[0] = 0;
    size_t t = 0;
    for (size_t k = 0; k < count; k++) {
        int32_t length = lengths[plan->order[k]];
        plan->cu_seqlens[k + 1] = plan->cu_seqlens[k] + length;
        for (int32_t p = 0; p < length; p++)
            plan->position_ids[t++] = p;
    }
    free(items);
    free(row_cursor);
    return 0;
}
