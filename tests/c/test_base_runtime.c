/* test_base_runtime.c: counter-based RNG, bounded queue, thread pool and
 * latency histogram. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "testutil.h"

static void test_rng(void)
{
    vf_rng a, b;
    uint64_t key = vf_rng_derive(42, 1, 2, 3, 4);
    CHECK(key != vf_rng_derive(42, 1, 2, 3, 5));
    CHECK(key != vf_rng_derive(43, 1, 2, 3, 4));
    CHECK(key == vf_rng_derive(42, 1, 2, 3, 4));
    vf_rng_init(&a, key);
    vf_rng_init(&b, key);
    for (int i = 0; i < 100; i++)
        CHECK(vf_rng_next(&a) == vf_rng_next(&b));
    /* skipping ahead by setting the counter reproduces the stream */
    vf_rng c;
    vf_rng_init(&c, key);
    c.counter = 50;
    vf_rng_init(&a, key);
    for (int i = 0; i < 50; i++)
        vf_rng_next(&a);
    CHECK(vf_rng_next(&a) == vf_rng_next(&c));
    /* below(n) is in range and roughly uniform */
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) {
        uint64_t x = vf_rng_below(&a, 10);
        CHECK(x < 10);
        counts[x]++;
    }
    for (int i = 0; i < 10; i++)
        CHECK(counts[i] > 9000 && counts[i] < 11000);
    double u = vf_rng_uniform(&a);
    CHECK(u >= 0 && u < 1);
    /* a shuffle is a permutation */
    int64_t v[1000];
    for (int i = 0; i < 1000; i++)
        v[i] = i;
    vf_rng_shuffle_i64(&a, v, 1000);
    int seen[1000] = {0}, moved = 0;
    for (int i = 0; i < 1000; i++) {
        CHECK(v[i] >= 0 && v[i] < 1000);
        if (v[i] >= 0 && v[i] < 1000)
            seen[v[i]]++;
        moved += v[i] != i;
    }
    for (int i = 0; i < 1000; i++)
        CHECK(seen[i] == 1);
    CHECK(moved > 900);
}

typedef struct producer_arg {
    vf_queue *q;
    int base, count;
} producer_arg;

static void *producer(void *opaque)
{
    producer_arg *p = opaque;
    for (int i = 0; i < p->count; i++)
        if (vf_queue_push(p->q, (void *)(intptr_t)(p->base + i + 1)) < 0)
            break;
    return NULL;
}

static void test_queue(void)
{
    vf_queue *q;
    CHECK_ERR(vf_queue_create(&q, 0), VF_EINVAL, "capacity");
    CHECK_OK(vf_queue_create(&q, 4));
    pthread_t threads[3];
    producer_arg args[3];
    for (int t = 0; t < 3; t++) {
        args[t] = (producer_arg){q, t * 10000, 1000};
        pthread_create(&threads[t], NULL, producer, &args[t]);
    }
    long long sum = 0;
    int got = 0;
    while (got < 3000) {
        void *item;
        CHECK_OK(vf_queue_pop(q, &item));
        CHECK(vf_queue_size(q) <= 4);
        sum += (intptr_t)item;
        got++;
    }
    for (int t = 0; t < 3; t++)
        pthread_join(threads[t], NULL);
    long long expect = 0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 1000; i++)
            expect += t * 10000 + i + 1;
    CHECK(sum == expect);
    void *item;
    CHECK_EQ_INT(vf_queue_try_pop(q, &item), VF_EAGAIN);
    CHECK_OK(vf_queue_push(q, (void *)1));
    vf_queue_close(q);
    CHECK_EQ_INT(vf_queue_push(q, (void *)2), VF_EOF);
    CHECK_OK(vf_queue_pop(q, &item)); /* drains what is left */
    CHECK(item == (void *)1);
    CHECK_EQ_INT(vf_queue_pop(q, &item), VF_EOF);
    vf_queue_destroy(q);
}

static pthread_mutex_t counter_lock = PTHREAD_MUTEX_INITIALIZER;
static void add_job(void *arg)
{
    pthread_mutex_lock(&counter_lock);
    *(long *)arg += 1;
    pthread_mutex_unlock(&counter_lock);
}

static void test_pool(void)
{
    vf_thread_pool *p;
    CHECK_OK(vf_thread_pool_create(&p, 3));
    CHECK_EQ_INT(vf_thread_pool_threads(p), 3);
    long counter = 0;
    for (int i = 0; i < 500; i++)
        CHECK_OK(vf_thread_pool_submit(p, add_job, &counter));
    vf_thread_pool_wait(p);
    CHECK_EQ_INT(counter, 500);
    for (int i = 0; i < 100; i++)
        CHECK_OK(vf_thread_pool_submit(p, add_job, &counter));
    vf_thread_pool_destroy(p); /* finishes queued jobs */
    CHECK_EQ_INT(counter, 600);
    CHECK(vf_cpu_count() >= 1);
}

static void test_histogram(void)
{
    vf_histogram h, g;
    vf_histogram_init(&h);
    CHECK(vf_histogram_quantile(&h, 0.5) == 0);
    for (int i = 1; i <= 1000; i++)
        vf_histogram_add(&h, i * 1e-3); /* 1 ms .. 1 s */
    double p50 = vf_histogram_quantile(&h, 0.5), p99 = vf_histogram_quantile(&h, 0.99);
    CHECK(fabs(p50 - 0.5) / 0.5 < 0.1);
    CHECK(fabs(p99 - 0.99) / 0.99 < 0.1);
    CHECK(vf_histogram_quantile(&h, 1.0) == 1.0);
    vf_histogram_init(&g);
    vf_histogram_add(&g, 5.0);
    vf_histogram_merge(&h, &g);
    CHECK(h.count == 1001 && h.max == 5.0);
    vf_histogram_add(&g, -1); /* clamped, never a crash */
    CHECK(g.min == 0);
}

int main(void)
{
    test_rng();
    test_queue();
    test_pool();
    test_histogram();
    return vf_test_finish("test_base_runtime");
}
