/*
 * fuzz_meta_cache.c: libFuzzer target for the metadata cache file parser
 * (vf_ds_meta_cache_decode, meta_cache.c).
 *
 * Input: one byte of camera count (low 2 bits), then the bytes of a cache
 * file. The file is parsed twice: as a load would (checksum verified, any
 * key accepted) and with the checksum skipped, so that mutations reach the
 * body parser past the CRC. Every column of a parsed entry is then read
 * to its last element, and its task lists walked the way add_episodes
 * (v3.c) walks them, so an out-of-range length or offset that the parser
 * let through shows under ASan. A parsed entry must also survive a round
 * trip: encoded again and decoded with its key, it yields the same columns
 * (abort otherwise).
 */
#include <stdlib.h>
#include <string.h>

#include "dataset/meta_cache.h"

static volatile uint64_t sink;

/* Reads every value the model would read. */
static void walk(const vf_ds_episodes_columns *c)
{
    uint64_t acc = 0;
    for (int64_t i = 0; i < c->rows; i++) {
        for (int k = 0; k < VF_DS_EP_NFIXED; k++)
            acc += (uint64_t)c->fixed[k][i];
        for (size_t k = 0; k < c->num_cameras; k++)
            acc += (uint64_t)c->vchunk[k][i] + (uint64_t)c->vfile[k][i] + (uint64_t)(c->vfrom[k][i] != 0) +
                   (uint64_t)(c->vto[k][i] != 0);
    }
    const vf_pq_array *list = c->tasks.type == VF_PQ_T_LIST ? &c->tasks : NULL;
    if (list) {
        const vf_pq_array *items = &list->children[0];
        for (int64_t i = 0; i < list->length; i++) {
            if (list->valid && !list->valid[i])
                continue;
            for (int64_t k = list->offsets[i]; k < list->offsets[i + 1]; k++) {
                if (k < 0 || k >= items->length)
                    abort(); /* the parser must have refused it */
                if (items->valid && !items->valid[k])
                    continue;
                int64_t lo = items->offsets[k], hi = items->offsets[k + 1];
                if (lo < 0 || hi < lo || hi > items->data_len)
                    abort();
                for (int64_t b = lo; b < hi; b++)
                    acc += items->data[b];
            }
        }
    }
    sink = acc;
}

static int same_columns(const vf_ds_episodes_columns *a, const vf_ds_episodes_columns *b)
{
    size_t n = (size_t)a->rows * 8;
    if (a->rows != b->rows || a->num_cameras != b->num_cameras || a->tasks.type != b->tasks.type)
        return 0;
    for (int k = 0; k < VF_DS_EP_NFIXED; k++)
        if (memcmp(a->fixed[k], b->fixed[k], n))
            return 0;
    for (size_t k = 0; k < a->num_cameras; k++)
        if (memcmp(a->vchunk[k], b->vchunk[k], n) || memcmp(a->vfile[k], b->vfile[k], n) ||
            memcmp(a->vfrom[k], b->vfrom[k], n) || memcmp(a->vto[k], b->vto[k], n))
            return 0;
    if (a->tasks.type == VF_PQ_T_LIST) {
        const vf_pq_array *x = &a->task_items, *y = &b->task_items;
        if (x->length != y->length || x->data_len != y->data_len || x->type != y->type ||
            memcmp(a->tasks.offsets, b->tasks.offsets, n + 8) ||
            memcmp(x->offsets, y->offsets, (size_t)(x->length + 1) * 8) ||
            memcmp(x->data, y->data, (size_t)x->data_len) || !a->tasks.valid != !b->tasks.valid ||
            !x->valid != !y->valid)
            return 0;
    }
    return 1;
}

static void round_trip(const vf_ds_episodes_columns *c)
{
    char ident[] = "/fuzz/meta/episodes/chunk-000/file-000.parquet\0episode_index";
    vf_ds_meta_key key = {.valid = 1, .size = 1, .ident = ident, .ident_len = sizeof ident - 1};
    uint8_t *buf;
    size_t len;
    if (vf_ds_meta_cache_encode(&key, c, &buf, &len) < 0)
        return; /* ENOMEM */
    vf_ds_episodes_columns again;
    int r = vf_ds_meta_cache_decode(buf, len, &key, c->num_cameras, 1, &again);
    if (r == VF_ENOMEM)
        return;
    if (r < 0 || !same_columns(c, &again))
        abort();
    vf_ds_episodes_columns_free(&again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t cameras = data[0] & 3;
    for (int verify = 1; verify >= 0; verify--) {
        uint8_t *buf = malloc(size - 1 ? size - 1 : 1); /* decode takes it; malloc'd and aligned as a load's */
        if (!buf)
            return 0;
        memcpy(buf, data + 1, size - 1);
        vf_ds_episodes_columns c;
        if (vf_ds_meta_cache_decode(buf, size - 1, NULL, cameras, verify, &c) == 0) {
            walk(&c);
            round_trip(&c);
            vf_ds_episodes_columns_free(&c);
        }
    }
    return 0;
}
