/*
 * loader_internal.h: what the three files of the shard loader share; the
 * layer's interface stays wds.h.
 *
 *  - loader.c: the loader's life: settings, open and close, the plan of an
 *    epoch (each consumer part's pieces and needed positions), resume
 *    states, and the prefetch thread that hands batches to the caller;
 *  - loader_read.c: the consumers reading their parts: one tar reader per
 *    consumer, samples kept until delivered, bad ranges, count checks;
 *  - loader_batch.c: the fields delivered and batch assembly (parse,
 *    columns, decode, compaction).
 *
 * Invariants: while the prefetch thread runs, everything in the loader
 * above work_lock (plan, consumers, stats, skip messages, failure) belongs
 * to it, under work_lock; the caller's side only counts what it received.
 * A stored sample owns copies of its members, and refs counts the
 * deliveries still due (wrap padding may deliver a position twice).
 */
#ifndef VF_WDS_LOADER_INTERNAL_H
#define VF_WDS_LOADER_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "io/io.h"
#include "plan/plan.h"
#include "wds/wds.h"

/* A sample read ahead of its delivery. */
typedef struct vf_wds_stored {
    int64_t position;
    int refs;                  /* deliveries still due */
    int64_t bytes;             /* its members' bytes, counted in the loader's buffer_bytes while stored */
    size_t shard;
    char *key;
    size_t num_members;
    vf_wds_member *members;    /* owned copies (suffix, name, data) */
} vf_wds_stored;

/* Positions of a part known to be bad, and why (a missing or broken shard,
 * a count that disagrees with the manifest). */
typedef struct vf_wds_bad_range {
    int64_t start, end;        /* global positions [start, end) */
    char *message;
} vf_wds_bad_range;

/* One consumer's part of the rank's slice, and the reader walking it. */
typedef struct vf_wds_consumer {
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
    vf_wds_stored **store;
    size_t num_store, cap_store;
    vf_wds_bad_range *bad;
    size_t num_bad;
} vf_wds_consumer;

/* Which part holds a position: a rank's slice holds each position once,
 * so the pieces of its parts are disjoint. */
typedef struct vf_wds_piece_ref {
    int64_t first, end;
    int part;
} vf_wds_piece_ref;

struct vf_wds_loader {
    vf_wds_loader_settings s;
    vf_io_cancel io_cancel;    /* the shard reads (producer or caller thread) watch it; vf_wds_loader_cancel */
    pid_t pid;                 /* the process that opened it: a forked copy is never used or closed */
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
    vf_wds_consumer *consumers; /* the rank's consumer parts, by consumer id (num_consumers) */
    vf_wds_piece_ref *piece_index; /* every piece of the rank's parts, sorted by first position */
    size_t num_piece_index;
    int threads;
    vf_thread_pool *pool;
    int64_t buffer_bytes;      /* members of the samples stored in all consumers (max_buffer_bytes) */
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

/* ---- loader.c --------------------------------------------------------------- */

/* Keeps a skip message (the first 64) for vf_wds_loader_skip_message. */
void vf_wds_note_skip(vf_wds_loader *l, const char *message);
/* The part (consumer id) whose pieces hold position p, or -1. */
int vf_wds_owner_part(const vf_wds_loader *l, int64_t p);

/* ---- loader_read.c ---------------------------------------------------------- */

void vf_wds_stored_free(vf_wds_stored *st);
/* Closes the reader and frees what the consumer holds; zeroes it. */
void vf_wds_consumer_reset(vf_wds_consumer *c);
/* Number of times position p is still needed (sorted array with repeats). */
size_t vf_wds_needed_count(const vf_wds_consumer *c, int64_t p);
/* The stored sample of position p (and its index in the store), or NULL. */
vf_wds_stored *vf_wds_find_stored(vf_wds_consumer *c, int64_t p, size_t *index);
/* Why position p is bad, or NULL when it is not. */
const char *vf_wds_find_bad(const vf_wds_consumer *c, int64_t p);
/* Stores a copy of smp as position p of shard, due `refs` times. */
int vf_wds_store_sample(vf_wds_consumer *c, const vf_wds_sample *smp, int64_t position, size_t shard, int refs);
/* At the end of a piece that ends its shard: checks that the tar ends there. */
int vf_wds_check_tail(vf_wds_loader *l, vf_wds_consumer *c);
/* Reads the consumer's part forward until position p is stored or known bad. */
int vf_wds_ensure_position(vf_wds_loader *l, vf_wds_consumer *c, int64_t p);

/* ---- loader_batch.c --------------------------------------------------------- */

/* The delivered fields from the setting's comma-separated suffixes, or from
 * the first sample of the first non-empty shard. */
int vf_wds_fields_from_setting(vf_wds_loader *l, const char *list);
int vf_wds_fields_from_first_sample(vf_wds_loader *l);
/* Assembles the next batch of the plan (VF_EOF after the last). */
int vf_wds_produce(vf_wds_loader *l, vf_wds_batch **out);

#endif
