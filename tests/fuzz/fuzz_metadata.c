/*
 * fuzz_metadata.c: libFuzzer target for the dataset metadata loaders.
 *
 * The input is a set of files served from memory through the dataset
 * layer's file hooks (vf_ds_fs). Sections 0-4 (JSON) are separated by NUL
 * bytes (JSON cannot contain a raw NUL, so the separator never collides
 * with their content); after the fifth NUL comes a little-endian u32
 * length, that many bytes of section 5, and the rest is section 6 (Parquet
 * is binary):
 *
 *   [0] meta/info.json
 *   [1] meta/episodes.jsonl          (v2.x)
 *   [2] meta/tasks.jsonl             (v2.x)
 *   [3] meta/episodes_stats.jsonl    (v2.1)
 *   [4] meta/stats.json              (v2.0, v3.0)
 *   [5] meta/episodes/chunk-000/file-000.parquet   (v3.0)
 *   [6] meta/tasks.parquet                          (v3.0)
 *
 * A missing or empty section is an absent file. Data and video files
 * "exist" except those of episode 1 / file 1, so the missing-file paths
 * run too. The whole open pipeline runs (parse, backend, selection,
 * validation), then every accessor, the JSON report, and a second open
 * with an episode subset. Parquet decode caps are lowered so hostile
 * sections cannot ask for gigabytes.
 */
#include <stdlib.h>
#include <string.h>

#include "dataset/dataset.h"

#define NUM_SECTIONS 7

static const char *const section_paths[NUM_SECTIONS] = {
    "meta/info.json",
    "meta/episodes.jsonl",
    "meta/tasks.jsonl",
    "meta/episodes_stats.jsonl",
    "meta/stats.json",
    "meta/episodes/chunk-000/file-000.parquet",
    "meta/tasks.parquet",
};

typedef struct mem_fs {
    const uint8_t *data[NUM_SECTIONS];
    size_t len[NUM_SECTIONS];
} mem_fs;

static int find(const mem_fs *m, const char *rel)
{
    for (int i = 0; i < NUM_SECTIONS; i++)
        if (!strcmp(rel, section_paths[i]) && m->len[i] > 0)
            return i;
    return -1;
}

static int mem_read_all(void *ctx, const char *rel, uint8_t **data, size_t *len)
{
    const mem_fs *m = ctx;
    int i = find(m, rel);
    if (i < 0)
        return vf_error(VF_ENOENT, "%s: not found", rel);
    *data = vf_malloc(m->len[i] + 1);
    if (!*data)
        return VF_ENOMEM;
    memcpy(*data, m->data[i], m->len[i]);
    (*data)[m->len[i]] = 0;
    *len = m->len[i];
    return 0;
}

static int mem_open_source(void *ctx, const char *rel, vf_source **out)
{
    const mem_fs *m = ctx;
    int i = find(m, rel);
    if (i < 0)
        return vf_error(VF_ENOENT, "%s: not found", rel);
    return vf_source_open_memory(out, rel, m->data[i], m->len[i], 0);
}

static int mem_exists(void *ctx, const char *rel)
{
    (void)ctx;
    return strstr(rel, "episode_000001") == NULL && strstr(rel, "file-001") == NULL;
}

static int mem_list_dir(void *ctx, const char *rel, char ***names, size_t *count)
{
    const mem_fs *m = ctx;
    const char *child = NULL;
    if (!strcmp(rel, "meta/episodes") && m->len[5])
        child = "chunk-000";
    else if (!strcmp(rel, "meta/episodes/chunk-000") && m->len[5])
        child = "file-000.parquet";
    if (!child)
        return vf_error(VF_ENOENT, "%s: no such directory", rel);
    *names = vf_malloc(sizeof **names);
    if (!*names)
        return VF_ENOMEM;
    (*names)[0] = vf_strdup(child);
    if (!(*names)[0]) {
        free(*names);
        return VF_ENOMEM;
    }
    *count = 1;
    return 0;
}

static void exercise(const vf_dataset *d)
{
    char *json;
    if (vf_dataset_info_json(d, 0, &json) == 0)
        free(json);
    for (size_t i = 0; i < vf_dataset_num_episodes(d); i++) {
        vf_data_span ds;
        vf_video_span vs;
        (void)vf_dataset_episode(d, i);
        (void)vf_dataset_episode_data(d, i, &ds);
        for (size_t c = 0; c < vf_dataset_num_cameras(d); c++)
            (void)vf_dataset_episode_video(d, i, c, &vs);
    }
    for (size_t i = 0; i < vf_dataset_num_stats(d); i++)
        (void)vf_dataset_stat(d, i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mem_fs m;
    memset(&m, 0, sizeof m);
    size_t start = 0;
    int section = 0;
    for (size_t i = 0; i <= size && section < 5; i++) {
        if (i == size || data[i] == 0) {
            m.data[section] = data + start;
            m.len[section] = i - start;
            section++;
            start = i + 1;
        }
    }
    if (section == 5 && start + 4 <= size) {
        size_t n = (size_t)data[start] | (size_t)data[start + 1] << 8 | (size_t)data[start + 2] << 16 |
                   (size_t)data[start + 3] << 24;
        start += 4;
        if (n > size - start)
            n = size - start;
        m.data[5] = data + start;
        m.len[5] = n;
        m.data[6] = data + start + n;
        m.len[6] = size - start - n;
    }
    vf_ds_fs fs = {
        .ctx = &m,
        .read_all = mem_read_all,
        .open_source = mem_open_source,
        .exists = mem_exists,
        .list_dir = mem_list_dir,
        .pq_max_entries = 1 << 20,
        .pq_max_bytes = 16 << 20,
    };
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    s.check_videos = 0; /* metadata only: videos are fuzz_mp4's (and would be opened from disk) */
    vf_dataset *d = NULL;
    if (vf_ds_open_fs(&d, "mem", &fs, &s) == 0) {
        exercise(d);
        size_t n = vf_dataset_num_episodes(d);
        int64_t first = n ? vf_dataset_episode(d, 0)->episode_index : 0;
        /* Subsets built from the model (vf_dataset_subset), and a subset of one. */
        int64_t picks[2] = {first, n ? vf_dataset_episode(d, n - 1)->episode_index : 1};
        vf_dataset *sub = NULL, *sub2 = NULL;
        if (vf_dataset_subset(d, picks, n > 1 ? 2 : 1, &sub) == 0) {
            exercise(sub);
            if (vf_dataset_subset(sub, picks, 1, &sub2) == 0)
                exercise(sub2);
            vf_dataset_close(sub2);
            vf_dataset_close(sub);
        }
        vf_dataset_close(d);
        int64_t subset[2] = {first, first + 1};
        s.episodes = subset;
        s.num_episodes = 2;
        if (vf_ds_open_fs(&d, "mem", &fs, &s) == 0) {
            exercise(d);
            vf_dataset_close(d);
        }
    }
    return 0;
}
