/*
 * batch.c: batch buffers and their pool, the public vf_batch accessors, and
 * the parallel helper.
 *
 * A buffer is one allocation: the column table, the per-column pointers,
 * the positions, the string pointer arrays and the column data (each column
 * 64-byte aligned, laid out for `capacity` samples; a batch of size <
 * capacity uses the first `size` samples of each column, which stay
 * contiguous because samples are the outer dimension).
 */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

static size_t align_up(size_t v) { return (v + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

int vf_engine_core_create(vf_engine_core **out, vf_sample_spec *spec, size_t batch_capacity, size_t max_free)
{
    *out = NULL;
    vf_engine_core *c = vf_calloc(1, sizeof *c);
    if (!c)
        return VF_ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->refs = 1;
    c->spec = spec;
    c->batch_capacity = batch_capacity ? batch_capacity : 1;
    c->max_free = max_free;
    *out = c;
    return 0;
}

static void batch_free(vf_batch *b)
{
    free(b->memory);
}

static void core_destroy(vf_engine_core *c)
{
    while (c->free_list) {
        vf_batch *b = c->free_list;
        c->free_list = b->next_free;
        batch_free(b);
    }
    vf_sample_spec_free(c->spec);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void vf_engine_core_unref(vf_engine_core *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->lock);
    if (last)
        core_destroy(c);
}

/* Allocates a buffer laid out for capacity samples. */
static int batch_new(const vf_sample_spec *s, size_t capacity, vf_batch **out)
{
    size_t nc = s->num_columns;
    size_t off = align_up(sizeof(vf_batch));
    size_t off_columns = off;
    off = align_up(off + nc * sizeof(vf_column));
    size_t off_data = off;
    off = align_up(off + nc * sizeof(void *));
    size_t off_strings = off;
    off = align_up(off + nc * sizeof(char **));
    size_t off_positions = off;
    off = align_up(off + capacity * sizeof(int64_t));
    size_t *col_off = vf_malloc_array(nc ? nc : 1, sizeof *col_off);
    if (!col_off)
        return VF_ENOMEM;
    for (size_t i = 0; i < nc; i++) {
        const vf_sample_column *c = &s->columns[i];
        size_t per = c->type == VF_COL_STRING ? sizeof(char *) : c->sample_bytes;
        if (per && capacity > (SIZE_MAX / 2 - off) / per) {
            free(col_off);
            return vf_error(VF_ENOMEM, "a batch of %zu samples does not fit in memory (column %s)", capacity, c->name);
        }
        col_off[i] = off;
        off = align_up(off + capacity * per);
    }
    uint8_t *mem = aligned_alloc(ALIGN, off); /* off is a multiple of ALIGN and > 0 */
    if (!mem) {
        free(col_off);
        return vf_error(VF_ENOMEM, "out of memory allocating a batch buffer of %zu bytes", off);
    }
    vf_batch *b = (vf_batch *)mem;
    memset(b, 0, sizeof *b);
    b->memory = mem;
    b->capacity = capacity;
    b->num_columns = nc;
    b->columns = (vf_column *)(mem + off_columns);
    b->data = (void **)(mem + off_data);
    b->strings = (const char ***)(mem + off_strings);
    b->positions = (int64_t *)(mem + off_positions);
    for (size_t i = 0; i < nc; i++) {
        const vf_sample_column *sc = &s->columns[i];
        vf_column *c = &b->columns[i];
        memset(c, 0, sizeof *c);
        c->name = sc->name;
        c->type = sc->type;
        c->ndim = sc->ndim + 1;
        for (int k = 0; k < sc->ndim; k++)
            c->shape[k + 1] = sc->shape[k];
        if (sc->type == VF_COL_STRING) {
            b->strings[i] = (const char **)(mem + col_off[i]);
            b->data[i] = NULL;
            c->strings = b->strings[i];
        } else {
            b->data[i] = mem + col_off[i];
            b->strings[i] = NULL;
            c->data = b->data[i];
        }
    }
    free(col_off);
    *out = b;
    return 0;
}

static void batch_set_size(vf_batch *b, const vf_sample_spec *s, size_t n)
{
    b->size = n;
    for (size_t i = 0; i < b->num_columns; i++) {
        vf_column *c = &b->columns[i];
        c->shape[0] = (int64_t)n;
        c->nbytes = s->columns[i].type == VF_COL_STRING ? 0 : n * s->columns[i].sample_bytes;
    }
}

int vf_engine_batch_acquire(vf_engine_core *core, size_t n, vf_batch **out)
{
    *out = NULL;
    vf_batch *b = NULL;
    pthread_mutex_lock(&core->lock);
    if (n <= core->batch_capacity && core->free_list) {
        b = core->free_list;
        core->free_list = b->next_free;
        core->num_free--;
    }
    core->refs++;
    pthread_mutex_unlock(&core->lock);
    if (!b) {
        int r = batch_new(core->spec, VF_MAX(n, core->batch_capacity), &b);
        if (r < 0) {
            vf_engine_core_unref(core);
            return r;
        }
        pthread_mutex_lock(&core->lock);
        core->allocated++;
        pthread_mutex_unlock(&core->lock);
    }
    b->core = core;
    b->next_free = NULL;
    atomic_store(&b->refs, 1);
    batch_set_size(b, core->spec, n);
    *out = b;
    return 0;
}

void vf_engine_batch_shrink(vf_batch *b, size_t n)
{
    if (n < b->size)
        batch_set_size(b, b->core->spec, n);
}

void vf_engine_batch_dest(vf_batch *b, vf_sample_dest *dest)
{
    dest->data = b->data;
    dest->strings = b->strings;
    dest->first = 0;
}

/* ---- public accessors ---------------------------------------------------------- */

size_t vf_batch_size(const vf_batch *b) { return b->size; }
size_t vf_batch_num_columns(const vf_batch *b) { return b->num_columns; }

const vf_column *vf_batch_column(const vf_batch *b, size_t i)
{
    return i < b->num_columns ? &b->columns[i] : NULL;
}

const vf_column *vf_batch_find(const vf_batch *b, const char *name)
{
    for (size_t i = 0; i < b->num_columns; i++)
        if (strcmp(b->columns[i].name, name) == 0)
            return &b->columns[i];
    return NULL;
}

const int64_t *vf_batch_positions(const vf_batch *b) { return b->positions; }

vf_batch *vf_batch_ref(vf_batch *b)
{
    if (b)
        atomic_fetch_add(&b->refs, 1);
    return b;
}

void vf_batch_release(vf_batch *b)
{
    if (!b || atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    vf_engine_core *core = b->core;
    int keep;
    pthread_mutex_lock(&core->lock);
    keep = b->capacity == core->batch_capacity && core->num_free < core->max_free;
    if (keep) {
        b->next_free = core->free_list;
        core->free_list = b;
        core->num_free++;
    } else {
        core->allocated--;
    }
    pthread_mutex_unlock(&core->lock);
    if (!keep)
        batch_free(b);
    vf_engine_core_unref(core);
}

/* ---- parallel helper ------------------------------------------------------------- */

typedef struct par_ctx {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int refs;                  /* caller + helpers not yet finished */
    size_t next, done, n;
    void (*fn)(void *arg, size_t i);
    void *arg;
} par_ctx;

static void par_unref(par_ctx *p)
{
    pthread_mutex_lock(&p->lock);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->lock);
    if (last) {
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        free(p);
    }
}

/* Claims and runs items until none is left. */
static void par_work(par_ctx *p)
{
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next < p->n ? p->next++ : p->n;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n)
            return;
        p->fn(p->arg, i);
        pthread_mutex_lock(&p->lock);
        if (++p->done == p->n)
            pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
    }
}

static void par_helper(void *arg)
{
    par_ctx *p = arg;
    par_work(p);
    par_unref(p);
}

void vf_engine_parallel_run(void *thread_pool, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
    vf_thread_pool *pool = thread_pool;
    par_ctx *p = pool && n > 1 ? vf_calloc(1, sizeof *p) : NULL;
    if (!p) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i);
        return;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->refs = 1;
    p->n = n;
    p->fn = fn;
    p->arg = arg;
    size_t helpers = VF_MIN(n - 1, (size_t)vf_thread_pool_threads(pool));
    for (size_t h = 0; h < helpers; h++) {
        pthread_mutex_lock(&p->lock);
        p->refs++;
        pthread_mutex_unlock(&p->lock);
        if (vf_thread_pool_submit(pool, par_helper, p) < 0) {
            pthread_mutex_lock(&p->lock);
            p->refs--;
            pthread_mutex_unlock(&p->lock);
            break;
        }
    }
    par_work(p);
    pthread_mutex_lock(&p->lock);
    while (p->done < p->n)
        pthread_cond_wait(&p->cond, &p->lock);
    pthread_mutex_unlock(&p->lock);
    par_unref(p);
}
