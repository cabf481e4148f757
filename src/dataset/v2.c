/*
 * v2.c: the LeRobot v2.1 (and v2.0) backend: meta/episodes.jsonl,
 * meta/tasks.jsonl, meta/episodes_stats.jsonl (v2.1) or meta/stats.json
 * (v2.0); one data Parquet file and one mp4 per camera per episode.
 *
 * Model mapping (lerobot-format.md §10.1):
 *  - (data chunk, data file) = (episode_chunk, episode_index) with
 *    episode_chunk = episode_index / chunks_size; the same for each camera.
 *  - from_index = cumulative length in episodes.jsonl line order (LeRobot's
 *    get_episode_data_index), to_index = from_index + length.
 *  - Video time = the parquet timestamp: from_timestamp 0, to_timestamp =
 *    length / fps.
 *
 * Fatal: a missing or malformed episodes.jsonl or tasks.jsonl line (the
 * message names the line). Statistics problems are only reported.
 */
#include "dataset/dataset.h"

#include <stdlib.h>
#include <string.h>

#define MAX_EPISODE_TASKS 4096
#define MAX_EPISODES (INT64_C(1) << 31)

static int read_meta(vf_dataset *d, const char *rel, int required, uint8_t **text, size_t *len)
{
    int r = d->fs.read_all(d->fs.ctx, rel, text, len);
    if (r == VF_ENOENT && !required)
        return VF_ENOENT;
    if (r == VF_ENOENT)
        return vf_error(VF_ENOENT, "%s/%s: missing (required for %s datasets)", d->root, rel, d->version);
    return r;
}

/* Called for each line of a metadata JSONL file, a JSON object; `where`
 * is "line N" for messages. */
typedef int (*meta_row_fn)(vf_dataset *d, const char *file, const char *where, int64_t line, json_t *row,
                           void *state);

/* Reads the JSONL file rel and hands each line to on_row, stopping at the
 * first failure. A missing file that is not required reads as no lines.
 * *file gets the absolute name used in messages. */
static int each_meta_row(vf_dataset *d, const char *rel, int required, meta_row_fn on_row, void *state,
                         const char **file)
{
    *file = vf_ds_abs(d, rel);
    if (!*file)
        return VF_ENOMEM;
    uint8_t *text;
    size_t len;
    int r = read_meta(d, rel, required, &text, &len);
    if (r == VF_ENOENT && !required)
        return 0;
    if (r < 0)
        return r;
    vf_jsonl it;
    vf_jsonl_init(&it, *file, (const char *)text, len, 0);
    json_t *row;
    while ((r = vf_jsonl_next(&it, &row)) > 0) {
        char where[32];
        snprintf(where, sizeof where, "line %lld", (long long)it.line);
        if (!json_is_object(row))
            r = vf_error(VF_ECORRUPT, "%s:%lld: expected a JSON object", *file, (long long)it.line);
        else
            r = on_row(d, *file, where, it.line, row, state);
        json_decref(row);
        if (r < 0)
            break;
    }
    free(text);
    return r;
}

/* One line of episodes.jsonl; *next_from is the episode's first frame. */
static int episode_row(vf_dataset *d, const char *file, const char *where, int64_t line, json_t *row, void *state)
{
    int64_t *next_from = state;
    int64_t episode = 0, length = 0;
    const char **tasks = NULL;
    size_t ntasks = 0;
    int r = vf_json_get_int(file, where, row, "episode_index", 0, &episode);
    if (r >= 0)
        r = vf_json_get_int(file, where, row, "length", 0, &length);
    if (r >= 0 && (episode < 0 || episode >= MAX_EPISODES))
        r = vf_error(VF_ECORRUPT, "%s: %s.episode_index: out of range (%lld)", file, where, (long long)episode);
    if (r >= 0 && (length < 0 || length > (INT64_C(1) << 40)))
        r = vf_error(VF_ECORRUPT, "%s: %s.length: out of range (%lld)", file, where, (long long)length);
    if (r >= 0)
        r = vf_json_get_string_list(file, where, row, "tasks", VF_JSON_OPTIONAL | VF_JSON_NULLABLE, MAX_EPISODE_TASKS,
                                    &tasks, &ntasks);
    vf_ds_episode *e = r >= 0 ? vf_ds_add_episode(d) : NULL;
    if (r >= 0 && !e)
        r = VF_ENOMEM;
    if (r >= 0) {
        e->pub.episode_index = episode;
        e->pub.length = length;
        e->pub.from_index = *next_from;
        e->pub.to_index = *next_from + length;
        *next_from += length;
        e->data_chunk = episode / d->chunks_size;
        e->data_file = episode;
        for (size_t c = 0; c < d->num_cameras; c++) {
            e->video[c].chunk_index = e->data_chunk;
            e->video[c].file_index = episode;
            e->video[c].from_timestamp = 0;
            e->video[c].to_timestamp = (double)length / d->cameras[c].pub.fps;
        }
        const char **copy = vf_ds_alloc(d, ntasks, sizeof *copy);
        if (!copy)
            r = VF_ENOMEM;
        for (size_t i = 0; i < ntasks && r >= 0; i++)
            if (!(copy[i] = vf_ds_strdup(d, tasks[i])))
                r = VF_ENOMEM;
        e->pub.tasks = copy;
        e->pub.num_tasks = ntasks;
    }
    free(tasks);
    return r;
}

static int load_episodes(vf_dataset *d)
{
    int64_t next_from = 0;
    const char *file;
    int r = each_meta_row(d, "meta/episodes.jsonl", 1, episode_row, &next_from, &file);
    if (r == 0 && d->num_all_episodes == 0)
        r = vf_error(VF_ECORRUPT, "%s: no episodes", file);
    return r;
}

/* One line of tasks.jsonl; *cap is the capacity of d->tasks. */
static int task_row(vf_dataset *d, const char *file, const char *where, int64_t line, json_t *row, void *state)
{
    size_t *cap = state;
    int64_t task_index = 0;
    const char *task = NULL;
    int r = vf_json_get_int(file, where, row, "task_index", 0, &task_index);
    if (r >= 0)
        r = vf_json_get_string(file, where, row, "task", 0, &task);
    if (r >= 0 && d->num_tasks == *cap) {
        size_t ncap = *cap ? *cap * 2 : 16;
        const char **grown = vf_ds_alloc(d, ncap, sizeof *grown);
        if (!grown)
            r = VF_ENOMEM;
        else {
            if (d->num_tasks)
                memcpy(grown, d->tasks, d->num_tasks * sizeof *grown);
            d->tasks = grown;
            *cap = ncap;
        }
    }
    if (r >= 0 && !(d->tasks[d->num_tasks] = vf_ds_strdup(d, task)))
        r = VF_ENOMEM;
    if (r >= 0) {
        if (task_index != (int64_t)d->num_tasks)
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, "meta/tasks.jsonl", -1, "task_index",
                              "line %lld: task_index %lld at position %zu; tasks are looked up by position",
                              (long long)line, (long long)task_index, d->num_tasks);
        d->num_tasks++;
    }
    return r;
}

static int load_tasks(vf_dataset *d)
{
    /* total_tasks 0 and no file: no tasks. */
    size_t cap = 0;
    const char *file;
    return each_meta_row(d, "meta/tasks.jsonl", d->total_tasks > 0, task_row, &cap, &file);
}

static int load_stats(vf_dataset *d)
{
    /* v2.1: per-episode stats aggregated; v2.0: one stats.json. */
    const char *rel = d->minor >= 1 ? "meta/episodes_stats.jsonl" : "meta/stats.json";
    uint8_t *text;
    size_t len;
    int r = read_meta(d, rel, 0, &text, &len);
    if (r == VF_ENOENT)
        return vf_ds_problem(d, VF_SEVERITY_WARNING, rel, -1, "", "missing: no normalization statistics");
    if (r < 0)
        return r == VF_ENOMEM ? r : vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, "", "%s", vf_last_error());
    if (d->minor >= 1)
        r = vf_ds_aggregate_episode_stats(d, rel, (const char *)text, len);
    else
        r = vf_ds_load_stats_json(d, rel, (const char *)text, len);
    free(text);
    return r;
}

int vf_ds_load_v2(vf_dataset *d)
{
    int r = load_episodes(d);
    if (r == 0)
        r = load_tasks(d);
    if (r == 0)
        r = load_stats(d);
    return r;
}
