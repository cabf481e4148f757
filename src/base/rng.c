/*
 * rng.c: the counter-based random generator (see base.h). Output n of a
 * generator is vf_mix64(key + n * golden), i.e. SplitMix64 evaluated at an
 * arbitrary position: no state besides the counter, so any stream can be
 * skipped ahead or replayed exactly.
 */
#include "base/base.h"

#define GOLDEN 0x9E3779B97F4A7C15ull

uint64_t vf_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t vf_rng_derive(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    uint64_t k = vf_mix64(seed + GOLDEN);
    k = vf_mix64(k ^ (a + 0x632BE59BD9B4E019ull));
    k = vf_mix64(k ^ (b + 0x8CB92BA72F3D8DD7ull));
    k = vf_mix64(k ^ (c + 0xD6E8FEB86659FD93ull));
    k = vf_mix64(k ^ (d + 0xA0761D6478BD642Full));
    return k;
}

void vf_rng_init(vf_rng *r, uint64_t key)
{
    r->key = key;
    r->counter = 0;
}

uint64_t vf_rng_next(vf_rng *r)
{
    r->counter++;
    return vf_mix64(r->key + r->counter * GOLDEN);
}

uint64_t vf_rng_below(vf_rng *r, uint64_t n)
{
    /* Rejection on the top of the range: unbiased, rarely loops. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = vf_rng_next(r);
    } while (x >= limit);
    return x % n;
}

double vf_rng_uniform(vf_rng *r) { return (double)(vf_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

void vf_rng_shuffle_i64(vf_rng *r, int64_t *values, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)vf_rng_below(r, (uint64_t)i + 1);
        int64_t t = values[i];
        values[i] = values[j];
        values[j] = t;
    }
}
