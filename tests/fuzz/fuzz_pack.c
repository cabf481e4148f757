/*
 * fuzz_pack.c: libFuzzer target for src/pack (sequence packing).
 *
 * Input: byte 0 picks the window (0..15), bytes 1-2 the max_tokens
 * (little-endian u16, 0 allowed to reach the error path), then each pair
 * of bytes is one sample length (i16, so zero and negative lengths occur).
 * A failed build must leave a zeroed plan; a successful one must satisfy
 * every invariant of pack.h, and a second build of the same input must be
 * identical. Any violation aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pack/pack.h"

#define REQUIRE(cond)      \
    do {                   \
        if (!(cond))       \
            abort();       \
    } while (0)

static void check_plan(const vf_pack_plan *p, const int32_t *lengths, size_t n, const vf_pack_settings *s)
{
    char *seen = calloc(n ? n : 1, 1);
    REQUIRE(seen);
    REQUIRE(p->sample_count == n && p->row_first[0] == 0 && (size_t)p->row_first[p->row_count] == n);
    size_t total = 0, token = 0;
    for (size_t r = 0; r < p->row_count; r++) {
        int32_t used = 0;
        REQUIRE(p->row_first[r + 1] > p->row_first[r]);
        for (int32_t k = p->row_first[r]; k < p->row_first[r + 1]; k++) {
            int32_t i = p->order[k];
            REQUIRE(i >= 0 && (size_t)i < n && !seen[i]);
            seen[i] = 1;
            REQUIRE(p->sample_row[i] == (int32_t)r && p->sample_offset[i] == used);
            REQUIRE(p->cu_seqlens[k + 1] - p->cu_seqlens[k] == lengths[i]);
            for (int32_t t = 0; t < lengths[i]; t++)
                REQUIRE(p->position_ids[token++] == t);
            if (s->window)
                REQUIRE((size_t)i / s->window == (size_t)p->order[p->row_first[r]] / s->window);
            used += lengths[i];
        }
        REQUIRE(used <= s->max_tokens && p->row_tokens[r] == used);
        total += (size_t)used;
    }
    REQUIRE(total == p->token_count && token == total);
    free(seen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    vf_pack_settings s;
    vf_pack_defaults(&s);
    s.window = data[0] % 16;
    s.max_tokens = (int32_t)(data[1] | (data[2] << 8));
    size_t n = (size - 3) / 2;
    int32_t *lengths = malloc((n ? n : 1) * sizeof(int32_t));
    if (!lengths)
        return 0;
    for (size_t i = 0; i < n; i++)
        lengths[i] = (int16_t)(data[3 + 2 * i] | (data[4 + 2 * i] << 8));
    vf_pack_plan a, b;
    int r = vf_pack_build(&a, lengths, n, &s);
    if (r < 0) {
        REQUIRE(a.order == NULL && a.row_count == 0);
    } else {
        check_plan(&a, lengths, n, &s);
        REQUIRE(vf_pack_build(&b, lengths, n, &s) == 0);
        REQUIRE(b.row_count == a.row_count);
        REQUIRE(n == 0 || memcmp(a.order, b.order, n * sizeof(int32_t)) == 0);
        REQUIRE(n == 0 || memcmp(a.sample_offset, b.sample_offset, n * sizeof(int32_t)) == 0);
        vf_pack_free(&b);
    }
    vf_pack_free(&a);
    free(lengths);
    return 0;
}
