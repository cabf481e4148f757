/*
 * test_pack.c: src/pack/ first-fit-decreasing packing. A hand-worked case,
 * the invariants (every sample exactly once, rows within max_tokens,
 * contiguous offsets, cu_seqlens and position_ids consistent with the
 * lengths, rows never spanning windows) on many pseudo-random inputs,
 * determinism (same input, same plan), and the error paths (a sample longer
 * than a row, a zero length, a bad max_tokens, an empty input).
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "pack/pack.h"

static void test_by_hand(void)
{
    /* max 10, one window: sorted 8(2) 7(4) 5(0) 3(1) 2(3) 1(5)
     * 8 -> row0; 7 -> row1; 5 -> row2; 3 -> row1 (7+3); 2 -> row0 (8+2); 1 -> row2 */
    int32_t lengths[] = {5, 3, 8, 2, 7, 1};
    vf_pack_settings s;
    vf_pack_defaults(&s);
    s.max_tokens = 10;
    vf_pack_plan p;
    CHECK_OK(vf_pack_build(&p, lengths, 6, &s));
    CHECK_EQ_INT(p.row_count, 3);
    CHECK_EQ_INT(p.token_count, 26);
    int32_t rows[] = {2, 1, 0, 0, 1, 2}, offsets[] = {0, 7, 0, 8, 0, 5}, order[] = {2, 3, 4, 1, 0, 5};
    int32_t cu[] = {0, 8, 10, 17, 20, 25, 26};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(p.sample_row[i], rows[i]);
        CHECK_EQ_INT(p.sample_offset[i], offsets[i]);
        CHECK_EQ_INT(p.order[i], order[i]);
    }
    for (int i = 0; i < 7; i++)
        CHECK_EQ_INT(p.cu_seqlens[i], cu[i]);
    CHECK_EQ_INT(p.row_tokens[0], 10);
    CHECK_EQ_INT(p.row_tokens[2], 6);
    CHECK_EQ_INT(p.position_ids[8], 0); /* sample 3 starts after sample 2's 8 tokens */
    CHECK_EQ_INT(p.position_ids[9], 1);
    vf_pack_free(&p);
    CHECK(p.order == NULL && p.row_count == 0);

    /* window 3: {5,3,8} -> rows 0:[8] 1:[5,3]; {2,7,1} -> rows 2:[7,2,1] */
    s.window = 3;
    CHECK_OK(vf_pack_build(&p, lengths, 6, &s));
    CHECK_EQ_INT(p.row_count, 3);
    CHECK_EQ_INT(p.sample_row[2], 0);
    CHECK_EQ_INT(p.sample_row[0], 1);
    CHECK_EQ_INT(p.sample_row[1], 1);
    CHECK_EQ_INT(p.sample_row[4], 2);
    CHECK_EQ_INT(p.sample_row[3], 2);
    CHECK_EQ_INT(p.sample_offset[5], 9);
    vf_pack_free(&p);
}

static uint64_t next_random(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return *state >> 33;
}

static void check_invariants(const vf_pack_plan *p, const int32_t *lengths, size_t n, const vf_pack_settings *s)
{
    char *seen = calloc(n ? n : 1, 1);
    CHECK(p->row_first[0] == 0 && (size_t)p->row_first[p->row_count] == n);
    size_t total = 0;
    for (size_t r = 0; r < p->row_count; r++) {
        int32_t used = 0;
        CHECK(p->row_first[r + 1] > p->row_first[r]); /* no empty row */
        for (int32_t k = p->row_first[r]; k < p->row_first[r + 1]; k++) {
            int32_t i = p->order[k];
            CHECK(i >= 0 && (size_t)i < n && !seen[i]);
            seen[i] = 1;
            CHECK_EQ_INT(p->sample_row[i], (int32_t)r);
            CHECK_EQ_INT(p->sample_offset[i], used); /* contiguous, ascending */
            CHECK_EQ_INT(p->cu_seqlens[k + 1] - p->cu_seqlens[k], lengths[i]);
            for (int32_t t = 0; t < lengths[i]; t++)
                CHECK(p->position_ids[p->cu_seqlens[k] + t] == t);
            if (s->window) /* a row never mixes windows */
                CHECK((size_t)i / s->window == (size_t)p->order[p->row_first[r]] / s->window);
            used += lengths[i];
        }
        CHECK(used <= s->max_tokens);
        CHECK_EQ_INT(p->row_tokens[r], used);
        total += (size_t)used;
    }
    CHECK_EQ_INT(total, p->token_count);
    for (size_t i = 0; i < n; i++)
        CHECK(seen[i]);
    free(seen);
}

static void test_random_invariants_and_determinism(void)
{
    uint64_t state = 42;
    for (int round = 0; round < 300; round++) {
        size_t n = next_random(&state) % 64;
        int32_t lengths[64];
        vf_pack_settings s;
        vf_pack_defaults(&s);
        s.max_tokens = 1 + (int32_t)(next_random(&state) % 200);
        s.window = next_random(&state) % 9;
        for (size_t i = 0; i < n; i++)
            lengths[i] = 1 + (int32_t)(next_random(&state) % (uint64_t)s.max_tokens);
        vf_pack_plan a, b;
        CHECK_OK(vf_pack_build(&a, lengths, n, &s));
        check_invariants(&a, lengths, n, &s);
        CHECK_OK(vf_pack_build(&b, lengths, n, &s));
        CHECK(a.row_count == b.row_count);
        CHECK(memcmp(a.order, b.order, n * sizeof(int32_t)) == 0);
        CHECK(memcmp(a.sample_offset, b.sample_offset, n * sizeof(int32_t)) == 0);
        /* first-fit-decreasing in one window never needs more than 2x the lower bound (+1) */
        if (!s.window && n) {
            size_t bound = (a.token_count + (size_t)s.max_tokens - 1) / (size_t)s.max_tokens;
            CHECK(a.row_count <= 2 * bound + 1);
        }
        vf_pack_free(&a);
        vf_pack_free(&b);
    }
}

static void test_errors(void)
{
    vf_pack_settings s;
    vf_pack_defaults(&s);
    s.max_tokens = 10;
    vf_pack_plan p;
    int32_t too_long[] = {4, 11};
    CHECK_ERR(vf_pack_build(&p, too_long, 2, &s), VF_EINVAL, "sample 1 has 11 tokens");
    CHECK(p.order == NULL);
    int32_t zero[] = {3, 0, 2};
    CHECK_ERR(vf_pack_build(&p, zero, 3, &s), VF_EINVAL, "sample 1 has 0 tokens");
    s.max_tokens = 0;
    CHECK_ERR(vf_pack_build(&p, zero, 3, &s), VF_EINVAL, "max_tokens is 0");
    s.max_tokens = 10;
    CHECK_ERR(vf_pack_build(&p, NULL, 3, &s), VF_EINVAL, "no lengths");
    int32_t huge[] = {INT32_MAX, INT32_MAX};
    s.max_tokens = INT32_MAX;
    CHECK_ERR(vf_pack_build(&p, huge, 2, &s), VF_ERANGE, "tokens in total");
    CHECK_OK(vf_pack_build(&p, NULL, 0, &s)); /* empty input: empty plan */
    CHECK_EQ_INT(p.row_count, 0);
    CHECK_EQ_INT(p.cu_seqlens[0], 0);
    vf_pack_free(&p);
    vf_pack_free(NULL);
}

int main(void)
{
    test_by_hand();
    test_random_invariants_and_determinism();
    test_errors();
    return vf_test_finish("test_pack");
}
