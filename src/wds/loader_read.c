/*
 * loader_read.c: the consumers of the shard loader reading their parts.
 *
 * Each consumer walks its part's pieces (runs of one shard's positions,
 * vf_plan_each_consumer) with one tar reader, keeping the samples it still
 * has to deliver (read but not yet emitted: at most about shuffle_buffer
 * of them) and skipping the bytes of the others (other consumers' samples,
 * or those delivered before a resume). A piece with nothing left to
 * deliver is not opened at all. A consumer whose piece reaches its shard's
 * end reads the tar to its end, so every shard's count is checked against
 * the manifest by the consumer that reads its tail.
 *
 * Bad input: a missing shard, a damaged or truncated tar, or a count that
 * disagrees with the manifest fails with a message naming the shard
 * (VF_WDS_RAISE), or under VF_WDS_SKIP marks the positions it affects as a
 * bad range (counted, and left out of their batches).
 *
 * Budgets: each reader reads only the delivered fields' members and holds
 * them to max_member_bytes and max_sample_bytes (vf_wds_reader_limits); a
 * sample over one is passed over unread and its position marked bad (one
 * bad sample, not the rest of the shard: the tar itself is fine).
 *
 * The stored samples of all consumers together hold at most
 * max_buffer_bytes of members (loader buffer_bytes). Which samples are
 * stored at any moment is fixed by the plan (the order in which positions
 * are needed and the tar order), so the sample that would pass the budget
 * is the same on every run: it fails the pass there, under either on_error
 * policy, since leaving a good sample out for lack of room would make the
 * delivered set depend on a memory setting. Nothing is dropped or
 * reordered.
 */
#include <stdlib.h>
#include <string.h>

#include "wds/loader_internal.h"

/* ---- consumers: reading the part ---------------------------------------------- */

void vf_wds_stored_free(vf_wds_stored *st)
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

void vf_wds_consumer_reset(vf_wds_consumer *c)
{
    vf_wds_reader_close(c->reader);
    for (size_t i = 0; i < c->num_store; i++)
        vf_wds_stored_free(c->store[i]);
    for (size_t i = 0; i < c->num_bad; i++)
        free(c->bad[i].message);
    free(c->store);
    free(c->bad);
    free(c->pieces);
    free(c->piece_needed);
    free(c->needed);
    memset(c, 0, sizeof *c);
}

/* Number of times position p is still needed (sorted array with repeats). */
size_t vf_wds_needed_count(const vf_wds_consumer *c, int64_t p)
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

vf_wds_stored *vf_wds_find_stored(vf_wds_consumer *c, int64_t p, size_t *index)
{
    for (size_t i = 0; i < c->num_store; i++)
        if (c->store[i]->position == p) {
            *index = i;
            return c->store[i];
        }
    return NULL;
}

const char *vf_wds_find_bad(const vf_wds_consumer *c, int64_t p)
{
    for (size_t i = 0; i < c->num_bad; i++)
        if (p >= c->bad[i].start && p < c->bad[i].end)
            return c->bad[i].message;
    return NULL;
}

/* Marks [start, end) bad; count_shard: a skipped shard (or its rest) under
 * VF_WDS_SKIP, else one sample refused by a budget (counted as a skipped
 * sample when its batch is assembled). */
static int add_bad_range(vf_wds_loader *l, vf_wds_consumer *c, int64_t start, int64_t end, const char *message,
                         int count_shard)
{
    vf_wds_bad_range *grown = vf_realloc(c->bad, (c->num_bad + 1) * sizeof *grown);
    if (!grown)
        return VF_ENOMEM;
    c->bad = grown;
    char *copy = vf_strdup(message);
    if (!copy)
        return VF_ENOMEM;
    c->bad[c->num_bad++] = (vf_wds_bad_range){start, end, copy};
    if (count_shard && l->s.on_error == VF_WDS_SKIP) {
        l->stats.skipped_shards++;
        vf_wds_note_skip(l, message);
    }
    return 0;
}

static int add_bad(vf_wds_loader *l, vf_wds_consumer *c, int64_t start, int64_t end, const char *message)
{
    return add_bad_range(l, c, start, end, message, 1);
}

/* The reader's limits: the loader's budgets and delivered fields. */
static void limit_reader(const vf_wds_loader *l, vf_wds_reader *r)
{
    vf_wds_reader_limits limits = {.max_member_bytes = l->s.max_member_bytes,
                                   .max_sample_bytes = l->s.max_sample_bytes,
                                   .fields = l->field_suffix,
                                   .num_fields = l->num_fields,
                                   .skip_refused = 1};
    vf_wds_reader_set_limits(r, &limits);
}

/* The bytes of a sample's read members (those of delivered fields). */
static int64_t read_member_bytes(const vf_wds_sample *smp)
{
    int64_t bytes = 0;
    for (size_t i = 0; i < smp->num_members; i++)
        if (smp->members[i].data)
            bytes += (int64_t)smp->members[i].size;
    return bytes;
}

/* Storing sample smp of shard `url` (`bytes` of members) would pass
 * max_buffer_bytes: fails the pass (l->failure repeats it), naming the
 * shard, the sample's largest member, its key, and the settings that
 * decide the room. */
static int refuse_buffer(vf_wds_loader *l, const vf_wds_sample *smp, const char *url, int64_t bytes)
{
    const vf_wds_member *largest = NULL;
    for (size_t i = 0; i < smp->num_members; i++)
        if (smp->members[i].data && (!largest || smp->members[i].size > largest->size))
            largest = &smp->members[i];
    size_t held = 0;
    for (int i = 0; i < l->s.num_consumers; i++)
        held += l->consumers[i].num_store;
    char *msg = vf_asprintf("shard %s: member %s (key %s): holding this sample until its turn would bring the "
                            "read-ahead buffer to %lld bytes (%zu samples held before it), above "
                            "max_buffer_bytes %lld; raise max_buffer_bytes or lower shuffle_buffer (%zu)",
                            url, largest ? largest->name : "(none)", smp->key, (long long)(l->buffer_bytes + bytes),
                            held, (long long)l->s.max_buffer_bytes,
                            l->s.shuffle ? l->s.shuffle_buffer : 0);
    if (!msg)
        return VF_ENOMEM;
    int rc = vf_error(VF_ECORRUPT, "%s", msg);
    free(l->failure);
    l->failure = msg;
    return rc;
}

int vf_wds_store_sample(vf_wds_consumer *c, const vf_wds_sample *smp, int64_t position, size_t shard, int refs)
{
    vf_wds_stored *st = vf_calloc(1, sizeof *st);
    if (!st)
        return VF_ENOMEM;
    st->position = position;
    st->refs = refs;
    st->bytes = read_member_bytes(smp);
    st->shard = shard;
    st->key = vf_strdup(smp->key);
    st->members = vf_calloc(smp->num_members ? smp->num_members : 1, sizeof *st->members);
    if (!st->key || !st->members) {
        vf_wds_stored_free(st);
        return VF_ENOMEM;
    }
    for (size_t i = 0; i < smp->num_members; i++) {
        const vf_wds_member *m = &smp->members[i];
        if (!m->data)
            continue; /* not a delivered field: never read */
        uint8_t *data = vf_malloc(m->size ? m->size : 1);
        char *suffix = vf_strdup(m->suffix), *name = vf_strdup(m->name);
        st->members[st->num_members++] = (vf_wds_member){.suffix = suffix, .name = name, .data = data,
                                                         .size = m->size};
        if (!data || !suffix || !name) {
            vf_wds_stored_free(st);
            return VF_ENOMEM;
        }
        memcpy(data, m->data, m->size);
    }
    if (c->num_store == c->cap_store) {
        size_t cap = c->cap_store ? c->cap_store * 2 : 64;
        vf_wds_stored **grown = vf_realloc(c->store, cap * sizeof *grown);
        if (!grown) {
            vf_wds_stored_free(st);
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
int vf_wds_check_tail(vf_wds_loader *l, vf_wds_consumer *c)
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
int vf_wds_ensure_position(vf_wds_loader *l, vf_wds_consumer *c, int64_t p)
{
    size_t idx;
    while (!vf_wds_find_stored(c, p, &idx) && !vf_wds_find_bad(c, p)) {
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
            limit_reader(l, c->reader);
            c->reader_task = piece->task;
            c->reader_pos = task->first_position;
        }
        c->reader_piece = c->piece_i;
        if (c->reader_pos >= piece_end) {
            int rc = vf_wds_check_tail(l, c);
            if (rc < 0)
                return rc;
            c->piece_i++;
            continue;
        }
        int64_t pos = c->reader_pos;
        size_t refs = pos >= piece->first_position ? vf_wds_needed_count(c, pos) : 0;
        const vf_wds_sample *smp = NULL;
        int rc = vf_wds_reader_next(c->reader, refs > 0, &smp);
        if (rc == VF_ENOMEM)
            return rc;
        if (rc == VF_ERANGE) {
            /* refused by a budget, passed over unread: this sample only */
            c->reader_pos++;
            if ((rc = add_bad_range(l, c, pos, pos + 1, vf_last_error(), 0)) < 0)
                return rc;
            continue;
        }
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
            int64_t bytes = read_member_bytes(smp);
            l->stats.samples_read++;
            l->stats.bytes_read += bytes;
            if (bytes > l->s.max_buffer_bytes - l->buffer_bytes)
                return refuse_buffer(l, smp, url, bytes);
            if ((rc = vf_wds_store_sample(c, smp, pos, shard, (int)refs)) < 0)
                return rc;
            l->buffer_bytes += bytes;
        } else {
            l->stats.samples_passed++;
        }
    }
    return 0;
}

