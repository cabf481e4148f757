/*
 * threads.c: a bounded blocking queue and a fixed thread pool (pthreads).
 *
 * Invariants: the queue never holds more than its capacity (producers wait:
 * backpressure, never unbounded growth); a closed queue wakes every waiter.
 * The pool runs jobs FIFO; vf_thread_pool_wait returns once the count of
 * unfinished jobs reaches zero.
 */
#define _GNU_SOURCE
#include "base/base.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct vf_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    void **items;
    size_t capacity, head, count;
    int closed;
};

int vf_queue_create(vf_queue **out, size_t capacity)
{
    *out = NULL;
    if (capacity == 0)
        return vf_error(VF_EINVAL, "queue capacity must be at least 1");
    vf_queue *q = vf_calloc(1, sizeof *q);
    if (!q)
        return VF_ENOMEM;
    q->items = vf_malloc_array(capacity, sizeof(void *));
    if (!q->items) {
        free(q);
        return VF_ENOMEM;
    }
    q->capacity = capacity;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    *out = q;
    return 0;
}

int vf_queue_push(vf_queue *q, void *item)
{
    pthread_mutex_lock(&q->lock);
    while (q->count == q->capacity && !q->closed)
        pthread_cond_wait(&q->not_full, &q->lock);
    if (q->closed) {
        pthread_mutex_unlock(&q->lock);
        return VF_EOF;
    }
    q->items[(q->head + q->count) % q->capacity] = item;
    q->count++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

static void *take_locked(vf_queue *q)
{
    void *item = q->items[q->head];
    q->head = (q->head + 1) % q->capacity;
    q->count--;
    pthread_cond_signal(&q->not_full);
    return item;
}

int vf_queue_pop(vf_queue *q, void **item)
{
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && !q->closed)
        pthread_cond_wait(&q->not_empty, &q->lock);
    if (q->count == 0) {
        pthread_mutex_unlock(&q->lock);
        *item = NULL;
        return VF_EOF;
    }
    *item = take_locked(q);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

int vf_queue_try_pop(vf_queue *q, void **item)
{
    pthread_mutex_lock(&q->lock);
    int r = 0;
    if (q->count == 0) {
        *item = NULL;
        r = q->closed ? VF_EOF : VF_EAGAIN;
    } else {
        *item = take_locked(q);
    }
    pthread_mutex_unlock(&q->lock);
    return r;
}

void vf_queue_close(vf_queue *q)
{
    pthread_mutex_lock(&q->lock);
    q->closed = 1;
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->lock);
}

size_t vf_queue_size(vf_queue *q)
{
    pthread_mutex_lock(&q->lock);
    size_t n = q->count;
    pthread_mutex_unlock(&q->lock);
    return n;
}

void vf_queue_destroy(vf_queue *q)
{
    if (!q)
        return;
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    free(q->items);
    free(q);
}

/* ---- thread pool ---- */

typedef struct job {
    vf_job_fn fn;
    void *arg;
    struct job *next;
} job;

struct vf_thread_pool {
    pthread_mutex_t lock;
    pthread_cond_t has_work, all_done;
    job *head, *tail;
    int pending; /* queued + running */
    int stopping;
    int num_threads;
    pthread_t *threads;
};

static void *worker_main(void *opaque)
{
    vf_thread_pool *p = opaque;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stopping)
            pthread_cond_wait(&p->has_work, &p->lock);
        if (!p->head && p->stopping)
            break;
        job *j = p->head;
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->lock);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&p->lock);
        if (--p->pending == 0)
            pthread_cond_broadcast(&p->all_done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int vf_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int vf_thread_pool_create(vf_thread_pool **out, int threads)
{
    *out = NULL;
    if (threads <= 0)
        threads = vf_cpu_count();
    if (threads > 1024)
        return vf_error(VF_EINVAL, "thread pool: %d threads is too many", threads);
    vf_thread_pool *p = vf_calloc(1, sizeof *p);
    if (!p)
        return VF_ENOMEM;
    p->threads = vf_calloc((size_t)threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return VF_ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->has_work, NULL);
    pthread_cond_init(&p->all_done, NULL);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->num_threads = i;
            vf_thread_pool_destroy(p);
            return vf_error(VF_ENOMEM, "thread pool: cannot start thread %d", i);
        }
    }
    p->num_threads = threads;
    *out = p;
    return 0;
}

int vf_thread_pool_submit(vf_thread_pool *p, vf_job_fn fn, void *arg)
{
    job *j = vf_malloc(sizeof *j);
    if (!j)
        return VF_ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    p->pending++;
    pthread_cond_signal(&p->has_work);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void vf_thread_pool_wait(vf_thread_pool *p)
{
    pthread_mutex_lock(&p->lock);
    while (p->pending > 0)
        pthread_cond_wait(&p->all_done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

int vf_thread_pool_threads(const vf_thread_pool *p) { return p->num_threads; }

void vf_thread_pool_destroy(vf_thread_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->has_work);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->num_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->has_work);
    pthread_cond_destroy(&p->all_done);
    free(p->threads);
    free(p);
}
