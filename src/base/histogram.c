/*
 * histogram.c: log-bucketed latency histogram. Bucket b covers
 * [1us * 2^(b/8), 1us * 2^((b+1)/8)); values below 1 us land in bucket 0 and
 * values past the last bucket in the last one. Exact min/max/sum are kept.
 */
#include "base/base.h"

#include <math.h>
#include <string.h>

#define BASE_SECONDS 1e-6
#define PER_DOUBLING 8.0

void vf_histogram_init(vf_histogram *h)
{
    memset(h, 0, sizeof *h);
    h->min = INFINITY;
    h->max = 0;
}

static int bucket_of(double seconds)
{
    if (!(seconds > BASE_SECONDS))
        return 0;
    double b = floor(log2(seconds / BASE_SECONDS) * PER_DOUBLING);
    return b >= VF_HIST_BUCKETS - 1 ? VF_HIST_BUCKETS - 1 : (int)b;
}

void vf_histogram_add(vf_histogram *h, double seconds)
{
    if (!(seconds >= 0))
        seconds = 0;
    h->count++;
    h->sum += seconds;
    if (seconds < h->min)
        h->min = seconds;
    if (seconds > h->max)
        h->max = seconds;
    h->buckets[bucket_of(seconds)]++;
}

void vf_histogram_merge(vf_histogram *into, const vf_histogram *from)
{
    into->count += from->count;
    into->sum += from->sum;
    if (from->min < into->min)
        into->min = from->min;
    if (from->max > into->max)
        into->max = from->max;
    for (int i = 0; i < VF_HIST_BUCKETS; i++)
        into->buckets[i] += from->buckets[i];
}

double vf_histogram_quantile(const vf_histogram *h, double q)
{
    if (h->count == 0)
        return 0;
    if (q <= 0)
        return h->min;
    if (q >= 1)
        return h->max;
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    uint64_t seen = 0;
    for (int b = 0; b < VF_HIST_BUCKETS; b++) {
        seen += h->buckets[b];
        if (seen >= rank) {
            /* geometric middle of the bucket, clamped to the exact extremes */
            double lo = BASE_SECONDS * exp2(b / PER_DOUBLING), hi = BASE_SECONDS * exp2((b + 1) / PER_DOUBLING);
            double mid = b == 0 ? h->min : sqrt(lo * hi);
            return fmin(fmax(mid, h->min), h->max);
        }
    }
    return h->max;
}
