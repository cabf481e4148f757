/*
 * loader.c: the shard loader. Batches of decoded columns from the shards of
 * a manifest, in an order computed from the manifest counts alone.
 *
 * Order: the plan layer's stream mode with one task per non-empty shard
 * (vf_plan_epoch_build): shards in a seeded permutation per epoch, each
 * shard's samples in tar order, the rank and consumer split of the
 * remainder rule, each consumer's part reordered by the bounded shuffle
 * buffer (vf_plan_shuffle_buffer, seeded by seed, epoch, rank, consumer),
 * cut into batches, consumers' batches round-robin. The plan gives the
 * global sample indices ("positions": shard i holds the positions
 * [prefix_i, prefix_i + num_sequences_i)) of every batch, so nothing in the
 * order depends on decoding, threads or timing.
 *
 * Reading: each consumer walks its part's pieces (runs of one shard's
 * positions, vf_plan_each_consumer) with one tar reader, keeping the
 * samples it still has to deliver (read but not yet emitted: at most about
 * shuffle_buffer of them) and skipping the bytes of the others (other
 * consumers' samples, or those delivered before a resume). A piece with
 * nothing left to deliver is not opened at all. A consumer whose piece
 * reaches its shard's end reads the tar to its end, so every shard's count
 * is checked against the manifest by the consumer that reads its tail.
 *
 * Bad input: a missing shard, a damaged or truncated tar, a count that
 * disagrees with the manifest, a sample missing a field, a member that does
 * not decode, or a shape that differs from the batch's: an error naming the
 * shard, the member and the key (VF_WDS_RAISE), or under VF_WDS_SKIP the
 * sample (or the rest of the shard) left out of its batch and counted.
 *
 * Batch assembly: parse (npz inflate, .npy headers, image headers) in
 * parallel per sample, fix the batch's columns from its first good sample,
 * check every sample against them, then decode straight into the column
 * slots in parallel (images: TurboJPEG / libpng, one TurboJPEG handle per
 * job), and compact out samples that failed.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "wds/wds.h"

enum field_kind { FIELD_IMAGE, FIELD_NPZ, FIELD_NPY, FIELD_CLS, FIELD_BYTES };

typedef struct stored_sample {
    int64_t position;
    int refs;                  /* deliveries still due */
    size_t shard;
    char *key;
    size_t num_members;
    vf_wds_member *members;    /* owned copies (suffix, name, data) */
} stored_sample;

typedef struct bad_range {
    int64_t start, end;        /* global positions [start, end) */
    char *message;
} bad_range;

typedef struct consumer {
    vf_plan_piece *pieces;
    size_t num_pieces, piece_i;
    int64_t *piece_needed;     /* needed positions per piece */
    int64_t *needed;           /* sorted needed positions (with repeats for repeated deliveries) */
    size_t num_needed;
    size_t delivered;          /* needed positions taken so far */
    vf_wds_reader *reader;
    size_t reader_task;
    size_t reader_piece;       /* the piece the reader serves (a later piece of the same shard may reuse it) */
    int64_t reader_pos;        /* global position of the sample the reader returns next */
    stored_sample **store;
    size_t num_store, cap_store;
    bad_range *bad;
    size_t num_bad;
} consumer;

/* Which part holds a position: a rank's slice holds each position once,
 * so the pieces of its parts are disjoint. */
typedef struct piece_ref {
    int64_t first, end;
    int part;
} piece_ref;

struct vf_wds_loader {
    vf_wds_loader_settings s;
    char *fields_copy;
    vf_wds_manifest *manifest;
    vf_plan_task *tasks;       /* one per non-empty shard */
    size_t *task_shard;
    size_t num_tasks;
    int64_t num_positions;
    char **field_suffix;       /* the delivered fields */
    int *field_kind;
    size_t num_fields;
    int64_t epoch;
    int64_t *ranges;           /* elastic resume: what remains of this epoch (NULL: all of it) */
    size_t num_ranges;
    int epoch_done;            /* an elastic restore found nothing left of the epoch */
    vf_plan_epoch plan;
    size_t next_batch;         /* index into plan batches */
    int64_t resume_base;       /* consumer loaders: rank-level batches skipped by the resume */
    consumer *consumers;       /* the rank's consumer parts, by consumer id (num_consumers) */
    piece_ref *piece_index;    /* every piece of the rank's parts, sorted by first position */
    size_t num_piece_index;
    int threads;
    vf_thread_pool *pool;
    vf_wds_stats stats;
    char **skip_messages;
    size_t num_skip_messages;
    char *failure;             /* set once a batch failed under VF_WDS_RAISE */
    /* Prefetch: a producer thread assembles batches ahead into a bounded
     * queue; everything above (plan, consumers, stats) belongs to it while
     * it runs, under work_lock. The caller's side counts what it received. */
    pthread_mutex_t work_lock;
    vf_queue *queue;
    pthread_t producer;
    int producer_running;
    size_t delivered;          /* batches of this epoch handed to the caller (from plan.first_batch) */
    int terminal;              /* the caller received the epoch's end or an error: */
    int terminal_rc;           /*   return this again */
    char *terminal_message;
};

typedef struct produced {
    vf_wds_batch *batch;
    int rc;
    char *message;
} produced;

static void stop_producer(vf_wds_loader *l);

void vf_wds_loader_defaults(vf_wds_loader_settings *s)
{
    memset(s, 0, sizeof *s);
    s->batch_size = 32;
    s->shuffle = 1;
    s->world_size = 1;
    s->num_consumers = 1;
    s->consumer = -1;
    s->shuffle_buffer = 1000;
    s->prefetch = 2;
}

static int kind_of(const char *suffix)
{
    const char *ext = strrchr(suffix, '.');
    ext = ext ? ext + 1 : suffix;
    if (!strcmp(ext, "jpg") || !strcmp(ext, "jpeg") || !strcmp(ext, "png"))
        return FIELD_IMAGE;
    if (!strcmp(ext, "npz"))
        return FIELD_NPZ;
    if (!strcmp(ext, "npy"))
        return FIELD_NPY;
    if (!strcmp(ext, "cls"))
        return FIELD_CLS;
    return FIELD_BYTES;
}

static void note_skip(vf_wds_loader *l, const char *message)
{
    if (l->num_skip_messages >= 64)
        return;
    char **grown = vf_realloc(l->skip_messages, (l->num_skip_messages + 1) * sizeof *grown);
    if (!grown)
        return;
    l->skip_messages = grown;
    char *copy = vf_strdup(message);
    if (copy)
        l->skip_messages[l->num_skip_messages++] = copy;
}

/* ---- consumers: reading the part ---------------------------------------------- */

static void stored_free(stored_sample *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->num_members; i++) {
        free((void *)st->members[i].data);
        free((void *)st->members[i].suffix);
        free((void *)st->members[i].name);
    }
    free(st->members);
    free(st->key);
    free(st);
}

static void consumer_reset(consumer *c)
{
    vf_wds_reader_close(c->reader);
    for (size_t i = 0; i < c->num_store; i++)
        stored_free(c->store[i]);
    for (size_t i = 0; i < c->num_bad; i++)
        free(c->bad[i].message);
    free(c->store);
    free(c->bad);
    free(c->pieces);
    free(c->piece_needed);
    free(c->needed);
    memset(c, 0, sizeof *c);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Number of times position p is still needed (sorted array with repeats). */
static size_t needed_count(const consumer *c, int64_t p)
{
    size_t lo = 0, hi = c->num_needed;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->needed[mid] < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t k = 0;
    while (lo + k < c->num_needed && c->needed[lo + k] == p)
        k++;
    return k;
}

static stored_sample *find_stored(consumer *c, int64_t p, size_t *index)
{
    for (size_t i = 0; i < c->num_store; i++)
        if (c->store[i]->position == p) {
            *index = i;
            return c->store[i];
        }
    return NULL;
}

static const char *find_bad(const consumer *c, int64_t p)
{
    for (size_t i = 0; i < c->num_bad; i++)
        if (p >= c->bad[i].start && p < c->bad[i].end)
            return c->bad[i].message;
    return NULL;
}

static int add_bad(vf_wds_loader *l, consumer *c, int64_t start, int64_t end, const char *message)
{
    bad_range *grown = vf_realloc(c->bad, (c->num_bad + 1) * sizeof *grown);
    if (!grown)
        return VF_ENOMEM;
    c->bad = grown;
    char *copy = vf_strdup(message);
    if (!copy)
        return VF_ENOMEM;
    c->bad[c->num_bad++] = (bad_range){start, end, copy};
    if (l->s.on_error == VF_WDS_SKIP) {
        l->stats.skipped_shards++;
        note_skip(l, message);
    }
    return 0;
}

static int store_sample(consumer *c, const vf_wds_sample *smp, int64_t position, size_t shard, int refs)
{
    stored_sample *st = vf_calloc(1, sizeof *st);
    if (!st)
        return VF_ENOMEM;
    st->position = position;
    st->refs = refs;
    st->shard = shard;
    st->key = vf_strdup(smp->key);
    st->members = vf_calloc(smp->num_members ? smp->num_members : 1, sizeof *st->members);
    if (!st->key || !st->members) {
        stored_free(st);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < smp->num_members; i++) {
        const vf_wds_member *m = &smp->members[i];
        uint8_t *data = vf_malloc(m->size ? m->size : 1);
        char *suffix = vf_strdup(m->suffix), *name = vf_strdup(m->name);
        st->members[i] = (vf_wds_member){.suffix = suffix, .name = name, .data = data, .size = m->size};
        st->num_members = i + 1;
        if (!data || !suffix || !name) {
            stored_free(st);
            return VF_ENOMEM;
        }
        memcpy(data, m->data, m->size);
    }
    if (c->num_store == c->cap_store) {
        size_t cap = c->cap_store ? c->cap_store * 2 : 64;
        stored_sample **grown = vf_realloc(c->store, cap * sizeof *grown);
        if (!grown) {
            stored_free(st);
            return VF_ENOMEM;
        }
        c->store = grown;
        c->cap_store = cap;
    }
    c->store[c->num_store++] = st;
    return 0;
}

/* When the reader has just passed the last sample of the current piece and
 * that piece ends its shard, the tar must end there: a further sample means
 * the manifest's count is too low. Checked once per piece. */
static int check_tail(vf_wds_loader *l, consumer *c)
{
    if (!c->reader || c->piece_i >= c->num_pieces || c->reader_piece != c->piece_i)
        return 0;
    const vf_plan_piece *piece = &c->pieces[c->piece_i];
    const vf_plan_task *task = &l->tasks[piece->task];
    int64_t piece_end = piece->first_position + piece->num_samples;
    int64_t task_end = task->first_position + task->num_samples;
    if (piece_end != task_end || c->reader_pos != task_end)
        return 0;
    const char *url = vf_wds_manifest_shard_url(l->manifest, l->task_shard[piece->task]);
    const vf_wds_sample *extra = NULL;
    int rc = vf_wds_reader_next(c->reader, 0, &extra);
    c->reader_pos++;
    if (rc == 0) {
        char *msg = vf_asprintf("shard %s: more samples than the manifest's num_sequences %lld (first extra key %s)",
                                url, (long long)task->num_samples, extra->key);
        if (!msg)
            return VF_ENOMEM;
        int ar = l->s.on_error == VF_WDS_SKIP ? add_bad(l, c, task_end, task_end, msg)
                                              : vf_error(VF_ECORRUPT, "%s", msg);
        free(msg);
        return ar < 0 ? ar : 0;
    }
    if (rc != VF_EOF) {
        if (l->s.on_error != VF_WDS_SKIP)
            return rc;
        return add_bad(l, c, task_end, task_end, vf_last_error());
    }
    return 0;
}

/* Reads the consumer's part forward until position p is stored or known bad. */
static int ensure_position(vf_wds_loader *l, consumer *c, int64_t p)
{
    size_t idx;
    while (!find_stored(c, p, &idx) && !find_bad(c, p)) {
        if (c->piece_i >= c->num_pieces)
            return vf_error(VF_ECORRUPT, "wds loader: position %lld is not in its consumer's part (internal)",
                            (long long)p);
        const vf_plan_piece *piece = &c->pieces[c->piece_i];
        const vf_plan_task *task = &l->tasks[piece->task];
        size_t shard = l->task_shard[piece->task];
        const char *url = vf_wds_manifest_shard_url(l->manifest, shard);
        int64_t piece_end = piece->first_position + piece->num_samples;
        if (c->piece_needed[c->piece_i] == 0) {
            c->piece_i++;
            continue;
        }
        if (!c->reader || c->reader_task != piece->task ||
            (c->reader_piece != c->piece_i && c->reader_pos > piece->first_position)) {
            vf_wds_reader_close(c->reader);
            c->reader = NULL;
            int rc = vf_wds_reader_open(&c->reader, url);
            if (rc == VF_ENOMEM)
                return rc;
            if (rc < 0) {
                if ((rc = add_bad(l, c, piece->first_position, piece_end, vf_last_error())) < 0)
                    return rc;
                c->piece_i++;
                continue;
            }
            l->stats.shards_opened++;
            c->reader_task = piece->task;
            c->reader_pos = task->first_position;
        }
        c->reader_piece = c->piece_i;
        if (c->reader_pos >= piece_end) {
            int rc = check_tail(l, c);
            if (rc < 0)
                return rc;
            c->piece_i++;
            continue;
        }
        int64_t pos = c->reader_pos;
        size_t refs = pos >= piece->first_position ? needed_count(c, pos) : 0;
        const vf_wds_sample *smp = NULL;
        int rc = vf_wds_reader_next(c->reader, refs > 0, &smp);
        if (rc == VF_ENOMEM)
            return rc;
        if (rc == VF_EOF || rc < 0) {
            char *msg = rc == VF_EOF ? vf_asprintf("shard %s: ends after %lld samples, the manifest's num_sequences "
                                                   "is %lld",
                                                   url, (long long)(pos - task->first_position),
                                                   (long long)task->num_samples)
                                     : vf_strdup(vf_last_error());
            if (!msg)
                return VF_ENOMEM;
            int br = add_bad(l, c, pos > piece->first_position ? pos : piece->first_position, piece_end, msg);
            free(msg);
            if (br < 0)
                return br;
            vf_wds_reader_close(c->reader);
            c->reader = NULL;
            c->piece_i++;
            continue;
        }
        c->reader_pos++;
        if (refs > 0) {
            l->stats.samples_read++;
            for (size_t i = 0; i < smp->num_members; i++)
                l->stats.bytes_read += smp->members[i].size;
            if ((rc = store_sample(c, smp, pos, shard, (int)refs)) < 0)
                return rc;
        } else {
            l->stats.samples_passed++;
        }
    }
    return 0;
}

/* ---- plan ------------------------------------------------------------------------ */

typedef struct pieces_ctx {
    vf_wds_loader *l;
} pieces_ctx;

static int collect_pieces(void *ctx, int rank, int consumer_id, const vf_plan_piece *pieces, size_t count)
{
    (void)rank;
    vf_wds_loader *l = ((pieces_ctx *)ctx)->l;
    consumer *c = &l->consumers[consumer_id];
    c->pieces = vf_malloc_array(count ? count : 1, sizeof *pieces);
    c->piece_needed = vf_calloc(count ? count : 1, sizeof *c->piece_needed);
    if (!c->pieces || !c->piece_needed)
        return VF_ENOMEM;
    memcpy(c->pieces, pieces, count * sizeof *pieces);
    c->num_pieces = count;
    piece_ref *grown = vf_realloc(l->piece_index, (l->num_piece_index + count + 1) * sizeof *grown);
    if (!grown)
        return VF_ENOMEM;
    l->piece_index = grown;
    for (size_t i = 0; i < count; i++)
        l->piece_index[l->num_piece_index++] =
            (piece_ref){pieces[i].first_position, pieces[i].first_position + pieces[i].num_samples, consumer_id};
    return 0;
}

static void epoch_settings(const vf_wds_loader *l, int64_t epoch, int64_t resume_batch, vf_plan_epoch_settings *ps)
{
    memset(ps, 0, sizeof *ps);
    ps->seed = l->s.seed;
    ps->epoch = epoch;
    ps->shuffle = l->s.shuffle;
    ps->rank = l->s.rank;
    ps->world_size = l->s.world_size;
    ps->num_consumers = l->s.num_consumers;
    ps->consumer = l->s.consumer;
    ps->batch_size = l->s.batch_size;
    ps->drop_last = l->s.drop_last;
    ps->shuffle_buffer = l->s.shuffle ? l->s.shuffle_buffer : 0;
    ps->resume_batch = resume_batch;
    ps->ranges = l->ranges;
    ps->num_ranges = l->num_ranges;
}

static int cmp_piece_ref(const void *a, const void *b)
{
    int64_t x = ((const piece_ref *)a)->first, y = ((const piece_ref *)b)->first;
    return (x > y) - (x < y);
}

/* The part (consumer id) whose pieces hold position p, or -1. */
static int owner_part(const vf_wds_loader *l, int64_t p)
{
    size_t lo = 0, hi = l->num_piece_index;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (l->piece_index[mid].first <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || p >= l->piece_index[lo - 1].end)
        return -1;
    return l->piece_index[lo - 1].part;
}

static void drop_plan(vf_wds_loader *l)
{
    free(l->piece_index);
    l->piece_index = NULL;
    l->num_piece_index = 0;
    vf_plan_epoch_free(&l->plan);
    memset(&l->plan, 0, sizeof l->plan);
    if (l->consumers)
        for (int i = 0; i < l->s.num_consumers; i++)
            consumer_reset(&l->consumers[i]);
}

static int start_epoch(vf_wds_loader *l, int64_t epoch, int64_t resume_batch)
{
    drop_plan(l);
    free(l->failure);
    l->failure = NULL;
    vf_plan_epoch_settings ps;
    epoch_settings(l, epoch, resume_batch, &ps);
    int rc = vf_plan_epoch_build(&ps, l->num_positions, l->tasks, l->num_tasks, &l->plan);
    if (rc < 0)
        return rc;
    l->epoch = epoch;
    l->epoch_done = 0;
    l->next_batch = l->plan.first_batch;
    l->delivered = 0;
    l->terminal = 0;
    free(l->terminal_message);
    l->terminal_message = NULL;
    l->resume_base = l->s.consumer >= 0 ? resume_batch : 0;
    pieces_ctx ctx = {l};
    vf_plan_epoch_settings each = ps;
    each.consumer = -1; /* a resumed consumer loader serves batches of its rank's other parts too */
    if ((rc = vf_plan_each_consumer(&each, l->num_positions, l->tasks, l->num_tasks, collect_pieces, &ctx)) < 0)
        return rc;
    qsort(l->piece_index, l->num_piece_index, sizeof *l->piece_index, cmp_piece_ref);
    /* what each part still delivers */
    size_t *counts = vf_calloc((size_t)l->s.num_consumers, sizeof *counts);
    if (!counts)
        return VF_ENOMEM;
    for (int64_t k = l->plan.batch_start[l->plan.first_batch]; k < l->plan.batch_start[l->plan.num_batches]; k++) {
        int part = owner_part(l, l->plan.positions[k]);
        if (part < 0) {
            free(counts);
            return vf_error(VF_ECORRUPT, "wds loader: position %lld is in no part of this rank (internal)",
                            (long long)l->plan.positions[k]);
        }
        counts[part]++;
    }
    for (int ci = 0; ci < l->s.num_consumers; ci++) {
        consumer *c = &l->consumers[ci];
        c->needed = vf_malloc_array(counts[ci] ? counts[ci] : 1, sizeof *c->needed);
        if (!c->needed) {
            free(counts);
            return VF_ENOMEM;
        }
    }
    free(counts);
    for (int64_t k = l->plan.batch_start[l->plan.first_batch]; k < l->plan.batch_start[l->plan.num_batches]; k++) {
        consumer *c = &l->consumers[owner_part(l, l->plan.positions[k])];
        c->needed[c->num_needed++] = l->plan.positions[k];
    }
    for (int ci = 0; ci < l->s.num_consumers; ci++) {
        consumer *c = &l->consumers[ci];
        qsort(c->needed, c->num_needed, sizeof *c->needed, cmp_i64);
        for (size_t i = 0; i < c->num_pieces; i++) {
            const vf_plan_piece *pc = &c->pieces[i];
            for (int64_t p = pc->first_position; p < pc->first_position + pc->num_samples; p++)
                c->piece_needed[i] += (int64_t)needed_count(c, p);
        }
    }
    return 0;
}

/* ---- fields ---------------------------------------------------------------------- */

static int set_fields(vf_wds_loader *l, char **suffixes, size_t count)
{
    l->field_suffix = suffixes;
    l->num_fields = count;
    l->field_kind = vf_calloc(count ? count : 1, sizeof *l->field_kind);
    if (!l->field_kind)
        return VF_ENOMEM;
    for (size_t i = 0; i < count; i++)
        l->field_kind[i] = kind_of(suffixes[i]);
    return 0;
}

static int fields_from_setting(vf_wds_loader *l, const char *list)
{
    char **out = NULL;
    size_t n = 0;
    const char *p = list;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len) {
            char **grown = vf_realloc(out, (n + 1) * sizeof *grown);
            if (!grown)
                goto nomem;
            out = grown;
            out[n] = vf_strndup(p, len);
            if (!out[n])
                goto nomem;
            for (char *q = out[n]; *q; q++)
                if (*q >= 'A' && *q <= 'Z')
                    *q = (char)(*q - 'A' + 'a');
            n++;
        }
        p += len + (comma ? 1 : 0);
    }
    if (n == 0) {
        free(out);
        return vf_error(VF_EINVAL, "wds loader: fields names no suffix");
    }
    return set_fields(l, out, n);
nomem:
    for (size_t i = 0; i < n; i++)
        free(out[i]);
    free(out);
    return VF_ENOMEM;
}

/* The fields of the first sample of the manifest's first non-empty shard. */
static int fields_from_first_sample(vf_wds_loader *l)
{
    if (l->num_tasks == 0)
        return set_fields(l, NULL, 0);
    const char *url = vf_wds_manifest_shard_url(l->manifest, l->task_shard[0]);
    vf_wds_reader *r = NULL;
    int rc = vf_wds_reader_open(&r, url);
    const vf_wds_sample *smp = NULL;
    if (rc == 0)
        rc = vf_wds_reader_next(r, 0, &smp);
    if (rc == VF_EOF)
        rc = vf_error(VF_ECORRUPT, "shard %s: no samples, the manifest says %lld (fields come from its first "
                      "sample; pass fields= to name them)",
                      url, (long long)l->tasks[0].num_samples);
    char **out = NULL;
    if (rc == 0) {
        out = vf_calloc(smp->num_members ? smp->num_members : 1, sizeof *out);
        rc = out ? 0 : VF_ENOMEM;
        for (size_t i = 0; rc == 0 && i < smp->num_members; i++)
            if (!(out[i] = vf_strdup(smp->members[i].suffix)))
                rc = VF_ENOMEM;
    }
    size_t n = smp ? smp->num_members : 0;
    vf_wds_reader_close(r);
    if (rc < 0) {
        for (size_t i = 0; out && i < n; i++)
            free(out[i]);
        free(out);
        return rc;
    }
    return set_fields(l, out, n);
}

/* ---- open / close ------------------------------------------------------------------ */

static int check_settings(const vf_wds_loader_settings *s)
{
    if (s->batch_size < 1)
        return vf_error(VF_EINVAL, "wds loader: batch_size must be >= 1");
    if (s->world_size < 1 || s->rank < 0 || s->rank >= s->world_size)
        return vf_error(VF_EINVAL, "wds loader: rank %d outside world_size %d", s->rank, s->world_size);
    if (s->num_consumers < 1 || s->consumer < -1 || s->consumer >= s->num_consumers)
        return vf_error(VF_EINVAL, "wds loader: consumer %d outside num_consumers %d", s->consumer, s->num_consumers);
    if (s->resize_width < 0 || s->resize_height < 0 || (!s->resize_width) != (!s->resize_height))
        return vf_error(VF_EINVAL, "wds loader: resize needs both width and height > 0");
    if (s->on_error != VF_WDS_RAISE && s->on_error != VF_WDS_SKIP)
        return vf_error(VF_EINVAL, "wds loader: on_error must be raise or skip");
    return 0;
}

int vf_wds_loader_open(vf_wds_loader **out, const char *manifest, const vf_wds_loader_settings *settings)
{
    *out = NULL;
    int rc = check_settings(settings);
    if (rc < 0)
        return rc;
    vf_wds_loader *l = vf_calloc(1, sizeof *l);
    if (!l)
        return VF_ENOMEM;
    pthread_mutex_init(&l->work_lock, NULL);
    l->s = *settings;
    l->s.resume = NULL;
    l->s.fields = NULL;
    if ((rc = vf_wds_manifest_open(&l->manifest, manifest)) < 0)
        goto fail;
    size_t ns = vf_wds_manifest_num_shards(l->manifest);
    l->tasks = vf_calloc(ns, sizeof *l->tasks);
    l->task_shard = vf_calloc(ns, sizeof *l->task_shard);
    l->consumers = vf_calloc((size_t)l->s.num_consumers, sizeof *l->consumers);
    if (!l->tasks || !l->task_shard || !l->consumers) {
        rc = VF_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < ns; i++) {
        int64_t n = vf_wds_manifest_shard_samples(l->manifest, i);
        if (n == 0)
            continue;
        l->tasks[l->num_tasks] = (vf_plan_task){.first_episode = l->num_tasks, .num_episodes = 1,
                                                .first_position = l->num_positions, .num_samples = n};
        l->task_shard[l->num_tasks++] = i;
        l->num_positions += n;
    }
    rc = settings->fields ? fields_from_setting(l, settings->fields) : fields_from_first_sample(l);
    if (rc < 0)
        goto fail;
    l->threads = settings->threads > 0 ? settings->threads : VF_MIN(4, vf_cpu_count());
    if (l->threads > 1 && (rc = vf_thread_pool_create(&l->pool, l->threads)) < 0)
        goto fail;
    if (settings->resume) {
        /* plan first so set_state can check against this loader */
        if ((rc = start_epoch(l, settings->resume->epoch, 0)) < 0 || (rc = vf_wds_loader_set_state(l, settings->resume)) < 0)
            goto fail;
    } else if ((rc = start_epoch(l, settings->epoch, 0)) < 0) {
        goto fail;
    }
    *out = l;
    return 0;
fail:
    vf_wds_loader_close(l);
    return rc;
}

void vf_wds_loader_close(vf_wds_loader *l)
{
    if (!l)
        return;
    stop_producer(l);
    drop_plan(l);
    if (l->pool)
        vf_thread_pool_destroy(l->pool);
    free(l->consumers);
    for (size_t i = 0; i < l->num_fields; i++)
        free(l->field_suffix[i]);
    free(l->field_suffix);
    free(l->field_kind);
    for (size_t i = 0; i < l->num_skip_messages; i++)
        free(l->skip_messages[i]);
    free(l->skip_messages);
    free(l->failure);
    free(l->terminal_message);
    free(l->ranges);
    pthread_mutex_destroy(&l->work_lock);
    free(l->tasks);
    free(l->task_shard);
    vf_wds_manifest_close(l->manifest);
    free(l);
}

int64_t vf_wds_loader_num_samples(const vf_wds_loader *l)
{
    int64_t n = 0;
    for (size_t b = 0; b < l->plan.num_batches; b++)
        n += l->plan.batch_start[b + 1] - l->plan.batch_start[b];
    return n;
}

size_t vf_wds_loader_num_batches(const vf_wds_loader *l) { return l->plan.num_batches; }
const vf_wds_manifest *vf_wds_loader_manifest(const vf_wds_loader *l) { return l->manifest; }

int vf_wds_loader_set_epoch(vf_wds_loader *l, int64_t epoch)
{
    if (epoch < 0)
        return vf_error(VF_EINVAL, "wds loader: epoch must be >= 0");
    stop_producer(l);
    free(l->ranges);
    l->ranges = NULL;
    l->num_ranges = 0;
    return start_epoch(l, epoch, 0);
}

/* ---- resume ----------------------------------------------------------------------- */

static void state_from_loader(const vf_wds_loader *l, vf_loader_state *out)
{
    memset(out, 0, sizeof *out);
    out->version = VF_LOADER_STATE_VERSION;
    out->mode = VF_MODE_STREAM;
    out->fingerprint = vf_wds_manifest_fingerprint(l->manifest);
    out->selection = out->fingerprint;
    out->positions = l->num_positions;
    out->seed = l->s.seed;
    out->epoch = l->epoch;
    out->batch_size = (int64_t)l->s.batch_size;
    out->world_size = l->s.world_size;
    out->consumers = l->s.num_consumers;
    out->shuffle = l->s.shuffle;
    out->drop_last = l->s.drop_last;
    out->partition = VF_PARTITION_EPISODE;
    out->shuffle_buffer = l->s.shuffle ? (int64_t)l->s.shuffle_buffer : 0;
}

static int64_t rank_batches(const vf_wds_loader *l)
{
    int64_t delivered = (int64_t)l->delivered;
    if (l->s.consumer < 0)
        return (int64_t)l->plan.first_batch + delivered;
    if (l->s.num_consumers == 1)
        return l->resume_base + delivered;
    return -1;
}

size_t vf_wds_loader_batches_delivered(const vf_wds_loader *l)
{
    int64_t k = rank_batches(l);
    return k >= 0 ? (size_t)k : l->delivered;
}

int vf_wds_loader_get_state(const vf_wds_loader *l, vf_loader_state *out)
{
    int64_t k = rank_batches(l);
    if (k < 0)
        return vf_error(VF_EINVAL, "wds loader: consumer %d of %d cannot see its rank's progress; take the state "
                                   "where every consumer's batches arrive",
                        l->s.consumer, l->s.num_consumers);
    state_from_loader(l, out);
    out->ranges = l->ranges;
    out->num_ranges = l->num_ranges;
    int64_t rn = vf_plan_ranges_samples(l->ranges, l->num_ranges, l->num_positions);
    if (l->epoch_done)
        k = vf_plan_rank_batches(rn, l->s.world_size, l->s.num_consumers, l->s.batch_size, l->s.drop_last);
    int64_t per_rank = vf_plan_samples_after(rn, l->s.world_size, l->s.num_consumers, l->s.batch_size,
                                             l->s.drop_last, k);
    if (per_rank < 0)
        return vf_error(VF_EINVAL, "wds loader: %lld batches delivered is past the epoch", (long long)k);
    out->samples_consumed = per_rank * l->s.world_size;
    return 0;
}

int vf_wds_loader_state_at(const vf_wds_loader *l, int64_t batches, vf_loader_state *out)
{
    state_from_loader(l, out);
    out->ranges = l->ranges;
    out->num_ranges = l->num_ranges;
    int64_t rn = vf_plan_ranges_samples(l->ranges, l->num_ranges, l->num_positions);
    int64_t per_rank = vf_plan_samples_after(rn, l->s.world_size, l->s.num_consumers, l->s.batch_size,
                                             l->s.drop_last, batches);
    if (batches < 0 || per_rank < 0)
        return vf_error(VF_EINVAL, "wds loader: %lld batches is past the epoch", (long long)batches);
    out->samples_consumed = per_rank * l->s.world_size;
    return 0;
}

#define STATE_FIELD_CHECK(field, what)                                                                        \
    if (state->field != mine.field)                                                                          \
        return vf_error(VF_EINVAL, "wds loader: the state's %s (%lld) differs from this loader's (%lld)", what, \
                        (long long)state->field, (long long)mine.field);

int vf_wds_loader_set_state(vf_wds_loader *l, const vf_loader_state *state)
{
    vf_loader_state mine;
    state_from_loader(l, &mine);
    if (state->fingerprint != mine.fingerprint || state->positions != mine.positions)
        return vf_error(VF_EINVAL, "wds loader: the state comes from another manifest (shard names or counts differ)");
    STATE_FIELD_CHECK(mode, "mode");
    STATE_FIELD_CHECK(seed, "seed");
    STATE_FIELD_CHECK(shuffle, "shuffle");
    STATE_FIELD_CHECK(drop_last, "drop_last");
    STATE_FIELD_CHECK(shuffle_buffer, "shuffle_buffer");
    if (state->epoch < 0 || state->samples_consumed < 0 || state->world_size < 1 || state->consumers < 1 ||
        state->batch_size < 1 || state->samples_consumed % state->world_size)
        return vf_error(VF_EINVAL, "wds loader: the state's epoch, layout or samples_consumed is invalid");
    if (state->num_ranges && (!state->ranges || vf_plan_ranges_check(state->ranges, state->num_ranges,
                                                                     l->num_positions) < 0))
        return vf_error(VF_EINVAL, "wds loader: the state's ranges are invalid");
    int64_t rn = vf_plan_ranges_samples(state->ranges, state->num_ranges, l->num_positions);
    int64_t k = vf_plan_batches_at(rn, state->world_size, state->consumers, (size_t)state->batch_size,
                                   state->drop_last, state->samples_consumed / state->world_size);
    if (k < 0)
        return vf_error(VF_EINVAL, "wds loader: samples_consumed %lld does not fall on a batch boundary",
                        (long long)state->samples_consumed);
    int64_t *ranges = NULL;
    size_t nr = 0;
    int same = state->world_size == mine.world_size && state->consumers == mine.consumers &&
               state->batch_size == mine.batch_size;
    if (same && state->num_ranges) {
        ranges = vf_malloc_array(2 * state->num_ranges, sizeof *ranges);
        if (!ranges)
            return VF_ENOMEM;
        memcpy(ranges, state->ranges, 2 * state->num_ranges * sizeof *ranges);
        nr = state->num_ranges;
    } else if (!same) {
        /* elastic: replay what the state's layout had delivered, keep the rest */
        vf_plan_epoch_settings old;
        epoch_settings(l, state->epoch, 0, &old);
        old.world_size = state->world_size;
        old.num_consumers = state->consumers;
        old.batch_size = (size_t)state->batch_size;
        old.rank = 0;
        old.consumer = -1;
        old.ranges = state->ranges;
        old.num_ranges = state->num_ranges;
        int rc = vf_plan_remaining(&old, l->num_positions, l->tasks, l->num_tasks, k, &ranges, &nr);
        if (rc < 0)
            return rc;
        k = 0;
    }
    int nothing_left = !same && nr == 0;
    stop_producer(l);
    free(l->ranges);
    l->ranges = ranges;
    l->num_ranges = nr;
    int rc = start_epoch(l, state->epoch, k);
    if (rc == 0 && nothing_left) {
        l->next_batch = l->plan.num_batches;
        l->delivered = l->plan.num_batches - l->plan.first_batch;
        l->epoch_done = 1;
    }
    return rc;
}

/* ---- batches ---------------------------------------------------------------------- */

typedef struct slot {
    stored_sample *sample;     /* NULL: bad */
    const vf_wds_member **field_member; /* per field */
    vf_wds_npz *npz;           /* per field (FIELD_NPZ) */
    vf_wds_array *npy;         /* per field (FIELD_NPY) */
    int *npy_ok;
    int *img_w, *img_h;
    char *error;
} slot;

typedef struct assembly {
    vf_wds_loader *l;
    slot *slots;
    size_t count;
    vf_wds_batch *batch;
    int *col_field;            /* per column: the field it comes from */
    int *col_array;            /* per column: npz array index, else -1 */
    int phase;                 /* 0 parse, 1 decode */
    int jobs;
    uint64_t images;
} assembly;

static void slot_fail(slot *sl, const char *fmt_shard, const char *member, const char *key, const char *what)
{
    if (sl->error)
        return;
    sl->error = member ? vf_asprintf("shard %s: member %s (key %s): %s", fmt_shard, member, key, what)
                       : vf_asprintf("shard %s: key %s: %s", fmt_shard, key, what);
    if (!sl->error)
        sl->error = vf_strdup("out of memory");
}

static const char *shard_url(const vf_wds_loader *l, const stored_sample *st)
{
    return vf_wds_manifest_shard_url(l->manifest, st->shard);
}

static void parse_slot(assembly *a, slot *sl)
{
    vf_wds_loader *l = a->l;
    stored_sample *st = sl->sample;
    for (size_t f = 0; f < l->num_fields && !sl->error; f++) {
        const vf_wds_member *m = NULL;
        for (size_t i = 0; i < st->num_members; i++)
            if (!strcmp(st->members[i].suffix, l->field_suffix[f]))
                m = &st->members[i];
        if (!m) {
            char *what = vf_asprintf("missing field %s", l->field_suffix[f]);
            slot_fail(sl, shard_url(l, st), NULL, st->key, what ? what : "missing field");
            free(what);
            return;
        }
        sl->field_member[f] = m;
        int rc = 0;
        switch (l->field_kind[f]) {
        case FIELD_NPZ:
            rc = vf_wds_read_npz(m->data, m->size, &sl->npz[f]);
            break;
        case FIELD_NPY:
            rc = vf_wds_parse_npy(m->data, m->size, &sl->npy[f]);
            if (rc == VF_EUNSUPPORTED)
                rc = 0;
            else if (rc == 0)
                sl->npy_ok[f] = 1;
            break;
        case FIELD_IMAGE:
            rc = vf_wds_image_size(m->data, m->size, &sl->img_w[f], &sl->img_h[f]);
            break;
        case FIELD_CLS: {
            char buf[32];
            size_t n = m->size < sizeof buf - 1 ? m->size : sizeof buf - 1;
            memcpy(buf, m->data, n);
            buf[n] = 0;
            char *end = NULL;
            (void)strtoll(buf, &end, 10);
            while (end && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
                end++;
            if (m->size == 0 || m->size >= sizeof buf - 1 || !end || end == buf || *end)
                rc = vf_error(VF_ECORRUPT, "not an integer class label");
            break;
        }
        default:
            break;
        }
        if (rc < 0)
            slot_fail(sl, shard_url(l, st), m->name, st->key, vf_last_error());
    }
}

static const char *array_descr_type(const char *descr, int *type)
{
    static const struct {
        const char *d;
        int t;
    } map[] = {{"<f4", VF_COL_FLOAT32}, {"<f8", VF_COL_FLOAT64}, {"<i8", VF_COL_INT64}, {"<i4", VF_COL_INT32},
               {"|u1", VF_COL_UINT8},   {"|b1", VF_COL_BOOL}};
    *type = -1;
    for (size_t i = 0; i < VF_ARRAY_LEN(map); i++)
        if (!strcmp(descr, map[i].d))
            *type = map[i].t;
    return descr;
}

static size_t column_row_bytes(const vf_wds_column *c, int itemsize)
{
    size_t n = (size_t)itemsize;
    for (int d = 1; d < c->ndim; d++)
        n *= (size_t)c->shape[d];
    return n;
}

static int descr_itemsize(const char *descr)
{
    return descr[2] - '0';
}

static void decode_slot(assembly *a, size_t row, void **tj)
{
    vf_wds_loader *l = a->l;
    slot *sl = &a->slots[row];
    vf_wds_batch *b = a->batch;
    for (size_t ci = 0; ci < b->num_columns && !sl->error; ci++) {
        vf_wds_column *col = &b->columns[ci];
        int f = a->col_field[ci];
        const vf_wds_member *m = sl->field_member[f];
        if (col->type == VF_WDS_BYTES) {
            const uint8_t *src = m->data;
            size_t size = m->size;
            if (l->field_kind[f] == FIELD_NPZ) {
                src = sl->npz[f].storage[a->col_array[ci]];
                size = sl->npz[f].sizes[a->col_array[ci]];
            }
            col->items[row] = vf_malloc(size ? size : 1);
            if (!col->items[row]) {
                slot_fail(sl, shard_url(l, sl->sample), m->name, sl->sample->key, "out of memory");
                return;
            }
            memcpy(col->items[row], src, size);
            col->item_sizes[row] = size;
            continue;
        }
        size_t row_bytes = col->nbytes / (size_t)col->shape[0];
        uint8_t *dst = col->data + row * row_bytes;
        switch (l->field_kind[f]) {
        case FIELD_IMAGE: {
            int rc = vf_wds_decode_image_with(tj, m->data, m->size, (int)(l->s.image_float_chw ? col->shape[3] : col->shape[2]),
                                              (int)(l->s.image_float_chw ? col->shape[2] : col->shape[1]),
                                              l->s.image_float_chw, dst);
            if (rc < 0)
                slot_fail(sl, shard_url(l, sl->sample), m->name, sl->sample->key, vf_last_error());
            else
                __atomic_add_fetch(&a->images, 1, __ATOMIC_RELAXED);
            break;
        }
        case FIELD_NPZ:
            memcpy(dst, sl->npz[f].arrays[a->col_array[ci]].data, row_bytes);
            break;
        case FIELD_NPY:
            memcpy(dst, sl->npy[f].data, row_bytes);
            break;
        case FIELD_CLS: {
            char buf[32];
            memcpy(buf, m->data, m->size);
            buf[m->size] = 0;
            int64_t v = strtoll(buf, NULL, 10);
            memcpy(dst, &v, sizeof v);
            break;
        }
        default:
            break;
        }
    }
}

typedef struct job {
    assembly *a;
    int index;
} job;

static void run_job(void *arg)
{
    job *j = arg;
    assembly *a = j->a;
    void *tj = NULL;
    for (size_t row = (size_t)j->index; row < a->count; row += (size_t)a->jobs) {
        slot *sl = &a->slots[row];
        if (!sl->sample || sl->error)
            continue;
        if (a->phase == 0)
            parse_slot(a, sl);
        else
            decode_slot(a, row, &tj);
    }
    vf_wds_jpeg_handle_free(tj);
}

static void run_phase(assembly *a, int phase)
{
    a->phase = phase;
    job jobs[64];
    a->jobs = a->l->pool ? VF_MIN(VF_MIN(a->l->threads, 64), (int)a->count) : 1;
    if (a->jobs < 1)
        a->jobs = 1;
    for (int i = 0; i < a->jobs; i++)
        jobs[i] = (job){a, i};
    if (a->jobs == 1) {
        run_job(&jobs[0]);
        return;
    }
    for (int i = 0; i < a->jobs; i++)
        if (vf_thread_pool_submit(a->l->pool, run_job, &jobs[i]) < 0)
            run_job(&jobs[i]);
    vf_thread_pool_wait(a->l->pool);
}

void vf_wds_batch_free(vf_wds_batch *b)
{
    if (!b)
        return;
    for (size_t c = 0; c < b->num_columns; c++) {
        vf_wds_column *col = &b->columns[c];
        free(col->name);
        free(col->suffix);
        free(col->data);
        if (col->items)
            for (size_t i = 0; i < b->size; i++)
                free(col->items[i]);
        free(col->items);
        free(col->item_sizes);
    }
    free(b->columns);
    for (size_t i = 0; i < b->size; i++) {
        if (b->keys)
            free(b->keys[i]);
        if (b->shards)
            free(b->shards[i]);
    }
    free(b->keys);
    free(b->shards);
    free(b->positions);
    free(b);
}

static int add_column(vf_wds_batch *b, int *col_field, int *col_array, int field, int array, const char *name,
                      const char *suffix, int type, const char *descr, int ndim, const int64_t *shape)
{
    vf_wds_column *col = &b->columns[b->num_columns];
    memset(col, 0, sizeof *col);
    col->name = vf_strdup(name);
    col->suffix = vf_strdup(suffix);
    if (!col->name || !col->suffix) {
        free(col->name);
        free(col->suffix);
        return VF_ENOMEM;
    }
    col->type = type;
    if (descr)
        snprintf(col->descr, sizeof col->descr, "%s", descr);
    col->ndim = ndim + 1;
    col->shape[0] = (int64_t)b->size;
    for (int d = 0; d < ndim; d++)
        col->shape[d + 1] = shape[d];
    col_field[b->num_columns] = field;
    col_array[b->num_columns] = array;
    b->num_columns++;
    return 0;
}

static int image_column_shape(const vf_wds_loader *l, int w, int h, int64_t shape[3])
{
    if (l->s.resize_width) {
        w = l->s.resize_width;
        h = l->s.resize_height;
    }
    if (l->s.image_float_chw) {
        shape[0] = 3;
        shape[1] = h;
        shape[2] = w;
    } else {
        shape[0] = h;
        shape[1] = w;
        shape[2] = 3;
    }
    return 0;
}

/* Columns from the first good slot; then checks every slot against them. */
static int build_columns(assembly *a)
{
    vf_wds_loader *l = a->l;
    vf_wds_batch *b = a->batch;
    slot *first = NULL;
    for (size_t i = 0; i < a->count && !first; i++)
        if (a->slots[i].sample && !a->slots[i].error)
            first = &a->slots[i];
    if (!first)
        return 0;
    size_t max_cols = 0;
    for (size_t f = 0; f < l->num_fields; f++)
        max_cols += l->field_kind[f] == FIELD_NPZ ? first->npz[f].count : 1;
    b->columns = vf_calloc(max_cols ? max_cols : 1, sizeof *b->columns);
    a->col_field = vf_calloc(max_cols ? max_cols : 1, sizeof *a->col_field);
    a->col_array = vf_calloc(max_cols ? max_cols : 1, sizeof *a->col_array);
    if (!b->columns || !a->col_field || !a->col_array)
        return VF_ENOMEM;
    int rc = 0;
    for (size_t f = 0; f < l->num_fields && rc == 0; f++) {
        const char *suffix = l->field_suffix[f];
        int type;
        switch (l->field_kind[f]) {
        case FIELD_IMAGE: {
            const vf_wds_member *m = first->field_member[f];
            int depth = vf_wds_png_bit_depth(m->data, m->size);
            char *name = vf_strndup(suffix, (size_t)(strrchr(suffix, '.') - suffix));
            if (!name)
                return VF_ENOMEM;
            if (depth != -1 && depth != 8) {
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_WDS_BYTES, NULL, 0, NULL);
            } else {
                int64_t shape[3];
                image_column_shape(l, first->img_w[f], first->img_h[f], shape);
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, name, suffix,
                                l->s.image_float_chw ? VF_COL_FLOAT32 : VF_COL_UINT8,
                                l->s.image_float_chw ? "<f4" : "|u1", 3, shape);
            }
            free(name);
            break;
        }
        case FIELD_NPZ:
            for (size_t k = 0; k < first->npz[f].count && rc == 0; k++) {
                const vf_wds_array *arr = &first->npz[f].arrays[k];
                if (first->npz[f].parsed[k]) {
                    array_descr_type(arr->descr, &type);
                    rc = add_column(b, a->col_field, a->col_array, (int)f, (int)k, first->npz[f].names[k], suffix,
                                    type, arr->descr, arr->ndim, arr->shape);
                } else {
                    rc = add_column(b, a->col_field, a->col_array, (int)f, (int)k, first->npz[f].names[k], suffix,
                                    VF_WDS_BYTES, NULL, 0, NULL);
                    b->columns[b->num_columns - 1].npy = 1;
                }
            }
            break;
        case FIELD_NPY:
            if (first->npy_ok[f]) {
                array_descr_type(first->npy[f].descr, &type);
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, type, first->npy[f].descr,
                                first->npy[f].ndim, first->npy[f].shape);
            } else {
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_WDS_BYTES, NULL, 0, NULL);
                b->columns[b->num_columns - 1].npy = 1;
            }
            break;
        case FIELD_CLS:
            rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_COL_INT64, "<i8", 0, NULL);
            break;
        default:
            rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_WDS_BYTES, NULL, 0, NULL);
            break;
        }
    }
    if (rc < 0)
        return rc;
    /* check every slot against the columns */
    for (size_t i = 0; i < a->count; i++) {
        slot *sl = &a->slots[i];
        if (!sl->sample || sl->error)
            continue;
        for (size_t ci = 0; ci < b->num_columns && !sl->error; ci++) {
            const vf_wds_column *col = &b->columns[ci];
            int f = a->col_field[ci];
            const vf_wds_member *m = sl->field_member[f];
            char what[160] = "";
            if (l->field_kind[f] == FIELD_IMAGE && col->type != VF_WDS_BYTES) {
                int depth = vf_wds_png_bit_depth(m->data, m->size);
                if (depth != -1 && depth != 8)
                    snprintf(what, sizeof what, "a %d-bit PNG where the batch holds 8-bit images", depth);
                else if (!l->s.resize_width) {
                    int64_t shape[3];
                    image_column_shape(l, sl->img_w[f], sl->img_h[f], shape);
                    if (memcmp(shape, col->shape + 1, sizeof shape))
                        snprintf(what, sizeof what, "image %dx%d, the batch's are %lldx%lld (pass resize=)",
                                 sl->img_w[f], sl->img_h[f],
                                 (long long)(l->s.image_float_chw ? col->shape[3] : col->shape[2]),
                                 (long long)(l->s.image_float_chw ? col->shape[2] : col->shape[1]));
                }
            } else if (l->field_kind[f] == FIELD_NPZ) {
                const vf_wds_npz *z = &sl->npz[f];
                int k = a->col_array[ci];
                if ((size_t)k >= z->count || strcmp(z->names[k], col->name) ||
                    z->count != first->npz[f].count)
                    snprintf(what, sizeof what, "npz arrays differ from the batch's first sample's");
                else if (col->type == VF_WDS_BYTES ? z->parsed[k]
                                                   : (!z->parsed[k] || strcmp(z->arrays[k].descr, col->descr) ||
                                                      z->arrays[k].ndim != col->ndim - 1 ||
                                                      memcmp(z->arrays[k].shape, col->shape + 1,
                                                             sizeof(int64_t) * (size_t)z->arrays[k].ndim)))
                    snprintf(what, sizeof what, "npz array %s has another dtype or shape than the batch's first "
                                                "sample's", col->name);
            } else if (l->field_kind[f] == FIELD_NPY) {
                if (col->type == VF_WDS_BYTES ? sl->npy_ok[f]
                                              : (!sl->npy_ok[f] || strcmp(sl->npy[f].descr, col->descr) ||
                                                 sl->npy[f].ndim != col->ndim - 1 ||
                                                 memcmp(sl->npy[f].shape, col->shape + 1,
                                                        sizeof(int64_t) * (size_t)sl->npy[f].ndim)))
                    snprintf(what, sizeof what, ".npy dtype or shape differs from the batch's first sample's");
            }
            if (what[0])
                slot_fail(sl, shard_url(l, sl->sample), m->name, sl->sample->key, what);
        }
    }
    /* allocate */
    for (size_t ci = 0; ci < b->num_columns; ci++) {
        vf_wds_column *col = &b->columns[ci];
        if (col->type == VF_WDS_BYTES) {
            col->items = vf_calloc(b->size ? b->size : 1, sizeof *col->items);
            col->item_sizes = vf_calloc(b->size ? b->size : 1, sizeof *col->item_sizes);
            if (!col->items || !col->item_sizes)
                return VF_ENOMEM;
            continue;
        }
        col->nbytes = column_row_bytes(col, descr_itemsize(col->descr)) * b->size;
        col->data = vf_calloc(col->nbytes ? col->nbytes : 1, 1);
        if (!col->data)
            return VF_ENOMEM;
    }
    return 0;
}

/* Removes the rows of bad slots from the batch (keeps order). */
static void compact(assembly *a)
{
    vf_wds_batch *b = a->batch;
    size_t keep = 0;
    for (size_t i = 0; i < a->count; i++) {
        int good = a->slots[i].sample && !a->slots[i].error;
        if (!good) {
            for (size_t ci = 0; ci < b->num_columns; ci++)
                if (b->columns[ci].items) {
                    free(b->columns[ci].items[i]);
                    b->columns[ci].items[i] = NULL;
                }
            continue;
        }
        if (keep != i) {
            for (size_t ci = 0; ci < b->num_columns; ci++) {
                vf_wds_column *col = &b->columns[ci];
                if (col->items) {
                    col->items[keep] = col->items[i];
                    col->item_sizes[keep] = col->item_sizes[i];
                    col->items[i] = NULL;
                } else {
                    size_t rb = col->nbytes / (size_t)col->shape[0];
                    memmove(col->data + keep * rb, col->data + i * rb, rb);
                }
            }
            b->positions[keep] = b->positions[i];
        }
        keep++;
    }
    for (size_t ci = 0; ci < b->num_columns; ci++) {
        vf_wds_column *col = &b->columns[ci];
        if (!col->items && b->size)
            col->nbytes = col->nbytes / (size_t)col->shape[0] * keep;
        col->shape[0] = (int64_t)keep;
    }
    b->size = keep;
}

static void free_slots(assembly *a)
{
    const vf_wds_loader *l = a->l;
    for (size_t i = 0; i < a->count; i++) {
        slot *sl = &a->slots[i];
        if (sl->npz)
            for (size_t f = 0; f < l->num_fields; f++)
                vf_wds_npz_free(&sl->npz[f]);
        free(sl->npz);
        free(sl->npy);
        free(sl->npy_ok);
        free(sl->img_w);
        free(sl->img_h);
        free(sl->field_member);
        free(sl->error);
        stored_free(sl->sample);
    }
    free(a->slots);
    free(a->col_field);
    free(a->col_array);
}

/* Takes position p's sample out of consumer c (or records why it is bad). */
static int take_sample(vf_wds_loader *l, consumer *c, int64_t p, slot *sl)
{
    int rc = ensure_position(l, c, p);
    if (rc < 0)
        return rc;
    size_t idx;
    stored_sample *st = find_stored(c, p, &idx);
    if (++c->delivered == c->num_needed) {
        /* nothing more to read: the part's last piece still gets its count check */
        while (c->piece_i < c->num_pieces && c->reader && c->reader_piece == c->piece_i) {
            const vf_plan_piece *piece = &c->pieces[c->piece_i];
            if (c->reader_pos < piece->first_position + piece->num_samples)
                break;
            if ((rc = check_tail(l, c)) < 0)
                return rc;
            c->piece_i++;
        }
    }
    if (!st) {
        sl->error = vf_strdup(find_bad(c, p));
        return sl->error ? 0 : VF_ENOMEM;
    }
    if (--st->refs == 0) {
        c->store[idx] = c->store[--c->num_store];
        sl->sample = st;
        return 0;
    }
    /* delivered again later (wrap padding): hand out a copy */
    vf_wds_sample view = {.key = st->key, .num_members = st->num_members, .members = st->members};
    consumer tmp;
    memset(&tmp, 0, sizeof tmp);
    if ((rc = store_sample(&tmp, &view, p, st->shard, 1)) < 0)
        return rc;
    sl->sample = tmp.store[0];
    free(tmp.store);
    return 0;
}

static int produce(vf_wds_loader *l, vf_wds_batch **out)
{
    *out = NULL;
    if (l->failure)
        return vf_error(VF_ECORRUPT, "%s", l->failure);
    if (l->next_batch >= l->plan.num_batches)
        return VF_EOF;
    size_t bi = l->next_batch;
    int64_t begin = l->plan.batch_start[bi], end = l->plan.batch_start[bi + 1];
    assembly a;
    memset(&a, 0, sizeof a);
    a.l = l;
    a.count = (size_t)(end - begin);
    a.slots = vf_calloc(a.count ? a.count : 1, sizeof *a.slots);
    a.batch = vf_calloc(1, sizeof *a.batch);
    int rc = a.slots && a.batch ? 0 : VF_ENOMEM;
    if (rc == 0) {
        a.batch->size = a.count;
        a.batch->positions = vf_malloc_array(a.count ? a.count : 1, sizeof *a.batch->positions);
        rc = a.batch->positions ? 0 : VF_ENOMEM;
    }
    size_t nf = l->num_fields ? l->num_fields : 1;
    for (size_t i = 0; rc == 0 && i < a.count; i++) {
        slot *sl = &a.slots[i];
        a.batch->positions[i] = l->plan.positions[begin + (int64_t)i];
        sl->field_member = vf_calloc(nf, sizeof *sl->field_member);
        sl->npz = vf_calloc(nf, sizeof *sl->npz);
        sl->npy = vf_calloc(nf, sizeof *sl->npy);
        sl->npy_ok = vf_calloc(nf, sizeof *sl->npy_ok);
        sl->img_w = vf_calloc(nf, sizeof *sl->img_w);
        sl->img_h = vf_calloc(nf, sizeof *sl->img_h);
        if (!sl->field_member || !sl->npz || !sl->npy || !sl->npy_ok || !sl->img_w || !sl->img_h)
            rc = VF_ENOMEM;
        else
            rc = take_sample(l, &l->consumers[owner_part(l, a.batch->positions[i])], a.batch->positions[i], sl);
    }
    double t0 = vf_now_seconds();
    if (rc == 0)
        run_phase(&a, 0);
    if (rc == 0)
        rc = build_columns(&a);
    if (rc == 0)
        run_phase(&a, 1);
    l->stats.decode_seconds += vf_now_seconds() - t0;
    l->stats.images_decoded += a.images;
    if (rc == 0) {
        /* bad samples: the first one fails the batch, or all are skipped */
        for (size_t i = 0; i < a.count; i++) {
            slot *sl = &a.slots[i];
            if (!sl->error)
                continue;
            if (l->s.on_error == VF_WDS_RAISE) {
                rc = vf_error(VF_ECORRUPT, "%s", sl->error);
                l->failure = vf_strdup(sl->error);
                break;
            }
            l->stats.skipped_samples++;
            note_skip(l, sl->error);
        }
    }
    if (rc == 0) {
        vf_wds_batch *b = a.batch;
        b->keys = vf_calloc(a.count ? a.count : 1, sizeof *b->keys);
        b->shards = vf_calloc(a.count ? a.count : 1, sizeof *b->shards);
        if (!b->keys || !b->shards)
            rc = VF_ENOMEM;
        compact(&a);
        size_t k = 0;
        for (size_t i = 0; rc == 0 && i < a.count; i++) {
            slot *sl = &a.slots[i];
            if (!sl->sample || sl->error)
                continue;
            b->keys[k] = vf_strdup(sl->sample->key);
            b->shards[k] = vf_strdup(vf_wds_manifest_shard_name(l->manifest, sl->sample->shard));
            if (!b->keys[k] || !b->shards[k])
                rc = VF_ENOMEM;
            k++;
        }
    }
    free_slots(&a);
    if (rc < 0) {
        vf_wds_batch_free(a.batch);
        return rc;
    }
    l->next_batch++;
    l->stats.batches++;
    l->stats.samples += a.batch->size;
    *out = a.batch;
    return 0;
}

/* ---- prefetch ------------------------------------------------------------------------ */

static void *producer_main(void *arg)
{
    vf_wds_loader *l = arg;
    for (;;) {
        produced *item = vf_calloc(1, sizeof *item);
        if (!item)
            break; /* the caller's pop then sees the queue closed */
        pthread_mutex_lock(&l->work_lock);
        item->rc = produce(l, &item->batch);
        pthread_mutex_unlock(&l->work_lock);
        if (item->rc < 0 && item->rc != VF_EOF)
            item->message = vf_strdup(vf_last_error());
        int last = item->rc < 0;
        if (vf_queue_push(l->queue, item) < 0) {
            vf_wds_batch_free(item->batch);
            free(item->message);
            free(item);
            break;
        }
        if (last)
            break;
    }
    vf_queue_close(l->queue);
    return NULL;
}

static int start_producer(vf_wds_loader *l)
{
    int rc = vf_queue_create(&l->queue, l->s.prefetch);
    if (rc < 0)
        return rc;
    if (pthread_create(&l->producer, NULL, producer_main, l) != 0) {
        vf_queue_destroy(l->queue);
        l->queue = NULL;
        return vf_error(VF_ENOMEM, "wds loader: cannot start the prefetch thread");
    }
    l->producer_running = 1;
    return 0;
}

/* Stops the producer (if any) and drops what it had prefetched. */
static void stop_producer(vf_wds_loader *l)
{
    if (!l->producer_running)
        return;
    vf_queue_close(l->queue);
    pthread_join(l->producer, NULL);
    void *item;
    while (vf_queue_pop(l->queue, &item) == 0) {
        produced *p = item;
        vf_wds_batch_free(p->batch);
        free(p->message);
        free(p);
    }
    vf_queue_destroy(l->queue);
    l->queue = NULL;
    l->producer_running = 0;
}

static int set_terminal(vf_wds_loader *l, int rc, const char *message)
{
    l->terminal = 1;
    l->terminal_rc = rc;
    free(l->terminal_message);
    l->terminal_message = message ? vf_strdup(message) : NULL;
    return rc == VF_EOF ? VF_EOF : vf_error(rc, "%s", message ? message : "wds loader: failed");
}

int vf_wds_loader_next(vf_wds_loader *l, vf_wds_batch **out)
{
    *out = NULL;
    if (l->terminal)
        return l->terminal_rc == VF_EOF ? VF_EOF
                                        : vf_error(l->terminal_rc, "%s",
                                                   l->terminal_message ? l->terminal_message : "wds loader: failed");
    if (l->s.prefetch == 0) {
        int rc = produce(l, out);
        if (rc == 0)
            l->delivered++;
        return rc;
    }
    if (!l->producer_running) {
        int rc = start_producer(l);
        if (rc < 0)
            return rc;
    }
    void *item = NULL;
    if (vf_queue_pop(l->queue, &item) < 0)
        return set_terminal(l, VF_ENOMEM, "wds loader: the prefetch thread stopped (out of memory)");
    produced *p = item;
    int rc = p->rc;
    if (rc == 0) {
        *out = p->batch;
        l->delivered++;
    } else {
        rc = set_terminal(l, rc, p->message);
    }
    free(p->message);
    free(p);
    return rc;
}

void vf_wds_loader_stats(const vf_wds_loader *l, vf_wds_stats *out)
{
    vf_wds_loader *m = (vf_wds_loader *)l;
    pthread_mutex_lock(&m->work_lock);
    *out = l->stats;
    pthread_mutex_unlock(&m->work_lock);
}

size_t vf_wds_loader_num_skip_messages(const vf_wds_loader *l)
{
    vf_wds_loader *m = (vf_wds_loader *)l;
    pthread_mutex_lock(&m->work_lock);
    size_t n = l->num_skip_messages;
    pthread_mutex_unlock(&m->work_lock);
    return n;
}

const char *vf_wds_loader_skip_message(const vf_wds_loader *l, size_t i)
{
    vf_wds_loader *m = (vf_wds_loader *)l;
    pthread_mutex_lock(&m->work_lock);
    const char *msg = i < l->num_skip_messages ? l->skip_messages[i] : NULL;
    pthread_mutex_unlock(&m->work_lock);
    return msg;
}
