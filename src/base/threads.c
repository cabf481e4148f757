/*
 * threads.c: a bounded blocking queue and a fixed thread pool (pthreads).
 *
 * Invariants: the queue never holds more than its capacity (producers wait:
 * backpressure, never unbounded growth); a closed queue wakes every waiter.
 * The pool runs jobs FIFO; vf_thread_pool_wait returns once the count of
 * unfinished jobs reaches zero. A pinned pool's threads are born with their
 * CPU set (pthread_attr_setaffinity_np, so no job ever runs unpinned) and
 * keep it; threads they start (a decoder's) inherit it.
 */
#define _GNU_SOURCE
#include "base/base.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
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
    pid_t pid;   /* the process whose threads these are */
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

/* CPU ids above this are refused (a cpu_set_t of this size is 8 KiB). */
#define MAX_CPU_ID 65535

/* The CPUs this process may run on (sched_getaffinity), as a newly
 * allocated set of *size bytes with room for ids up to MAX_CPU_ID. */
static cpu_set_t *allowed_set(size_t *size)
{
    cpu_set_t *set = CPU_ALLOC(MAX_CPU_ID + 1);
    if (!set)
        return NULL;
    *size = CPU_ALLOC_SIZE(MAX_CPU_ID + 1);
    CPU_ZERO_S(*size, set);
    if (sched_getaffinity(0, *size, set) != 0) {
        CPU_FREE(set);
        return NULL;
    }
    return set;
}

int vf_cpu_allowed_count(void)
{
    size_t size;
    cpu_set_t *set = allowed_set(&size);
    if (!set)
        return vf_cpu_count();
    int n = CPU_COUNT_S(size, set);
    CPU_FREE(set);
    return n > 0 ? n : 1;
}

int vf_cpu_list_check(const int *cpus, size_t num_cpus)
{
    if (num_cpus == 0)
        return 0;
    if (!cpus)
        return vf_error(VF_EINVAL, "CPU list: %zu CPUs but no list", num_cpus);
    size_t size;
    cpu_set_t *allowed = allowed_set(&size);
    if (!allowed)
        return vf_error(VF_EIO, "CPU list: cannot read this process's CPU affinity (errno %d)", errno);
    int r = 0;
    for (size_t i = 0; i < num_cpus && r == 0; i++) {
        if (cpus[i] < 0 || cpus[i] > MAX_CPU_ID)
            r = vf_error(VF_EINVAL, "CPU list: CPU %d is out of range (0..%d)", cpus[i], MAX_CPU_ID);
        else if (!CPU_ISSET_S((size_t)cpus[i], size, allowed))
            r = vf_error(VF_EINVAL, "CPU list: CPU %d does not exist or is not allowed for this process", cpus[i]);
    }
    CPU_FREE(allowed);
    return r;
}

int vf_thread_pool_create(vf_thread_pool **out, int threads)
{
    return vf_thread_pool_create_pinned(out, threads, NULL, 0);
}

int vf_thread_pool_create_pinned(vf_thread_pool **out, int threads, const int *cpus, size_t num_cpus)
{
    *out = NULL;
    int r = vf_cpu_list_check(cpus, num_cpus);
    if (r < 0)
        return r;
    if (threads <= 0)
        threads = num_cpus > 0 ? (int)VF_MIN(num_cpus, (size_t)1024) : vf_cpu_count();
    if (threads > 1024)
        return vf_error(VF_EINVAL, "thread pool: %d threads is too many", threads);
    pthread_attr_t attr, *attrp = NULL;
    cpu_set_t *set = NULL;
    size_t set_size = CPU_ALLOC_SIZE(MAX_CPU_ID + 1);
    if (num_cpus > 0) {
        if (!(set = CPU_ALLOC(MAX_CPU_ID + 1)))
            return VF_ENOMEM;
        CPU_ZERO_S(set_size, set);
        for (size_t i = 0; i < num_cpus; i++)
            CPU_SET_S((size_t)cpus[i], set_size, set);
        if (pthread_attr_init(&attr) != 0) {
            CPU_FREE(set);
            return VF_ENOMEM;
        }
        attrp = &attr;
        if ((r = pthread_attr_setaffinity_np(&attr, set_size, set)) != 0) {
            pthread_attr_destroy(&attr);
            CPU_FREE(set);
            return vf_error(VF_EINVAL, "thread pool: cannot pin threads to the CPU list (error %d)", r);
        }
    }
    vf_thread_pool *p = vf_calloc(1, sizeof *p);
    if (p && !(p->threads = vf_calloc((size_t)threads, sizeof(pthread_t)))) {
        free(p);
        p = NULL;
    }
    if (!p) {
        if (attrp)
            pthread_attr_destroy(attrp);
        CPU_FREE(set);
        return VF_ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->has_work, NULL);
    pthread_cond_init(&p->all_done, NULL);
    p->pid = getpid();
    r = 0;
    for (int i = 0; i < threads && r == 0; i++) {
        int e = pthread_create(&p->threads[i], attrp, worker_main, p);
        if (e != 0) {
            p->num_threads = i;
            r = vf_error(e == EINVAL ? VF_EINVAL : VF_ENOMEM, "thread pool: cannot start thread %d (error %d)", i, e);
        }
    }
    if (attrp)
        pthread_attr_destroy(attrp);
    CPU_FREE(set);
    if (r < 0) {
        vf_thread_pool_destroy(p);
        return r;
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
    /* A forked child holds a copy of the pool without its threads (and
     * perhaps its lock as another thread held it at fork): joining them
     * would crash or block. The copy is left as it is (a leak in the child
     * only). */
    if (p->pid != getpid())
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
