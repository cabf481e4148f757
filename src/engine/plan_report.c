/*
 * plan_report.c: the `vlafeed plan --json` document with the loader's
 * view (vf_plan_report_json): vf_plan_json's strategy table, plus the
 * remainder under drop_last for the batch size, the MP4 opens of one epoch
 * at world size x workers (vf_plan_count_opens), and on request the
 * partition's task list or one consumer's pieces with their video files.
 * Built on the public plan functions; metadata only.
 */
#include "engine/engine.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The video files (relative to the root) of a run of episodes, per camera. */
static json_t *task_files(const vf_dataset *d, size_t first, size_t count)
{
    json_t *files = json_object();
    size_t root_len = strlen(vf_dataset_root(d));
    for (size_t c = 0; files && c < vf_dataset_num_cameras(d); c++) {
        json_t *list = json_array();
        size_t last = (size_t)-1;
        for (size_t e = first; list && e < first + count; e++) {
            vf_video_span vs;
            if (vf_dataset_episode_video(d, e, c, &vs) < 0 || vs.file == last)
                continue;
            last = vs.file;
            const char *p = vs.path;
            if (strncmp(p, vf_dataset_root(d), root_len) == 0 && p[root_len] == '/')
                p += root_len + 1;
            json_array_append_new(list, json_string(p));
        }
        json_object_set_new(files, vf_dataset_camera(d, c)->key, list);
    }
    return files;
}

static json_t *task_json(const vf_dataset *d, const vf_task_info *t, int files)
{
    const vf_episode *a = vf_dataset_episode(d, t->first_episode);
    const vf_episode *b = vf_dataset_episode(d, t->first_episode + (t->num_episodes ? t->num_episodes - 1 : 0));
    json_t *o = json_pack("{s:I,s:[I,I],s:[I,I],s:[I,I],s:I}", "id", (json_int_t)t->id, "episodes",
                          (json_int_t)t->first_episode, (json_int_t)t->num_episodes, "episode_index",
                          (json_int_t)a->episode_index, (json_int_t)b->episode_index, "rows", (json_int_t)t->first_row,
                          (json_int_t)t->num_rows, "estimated_bytes", (json_int_t)t->estimated_bytes);
    if (o && t->rank >= 0) {
        json_object_set_new(o, "rank", json_integer(t->rank));
        json_object_set_new(o, "worker", json_integer(t->consumer));
    }
    if (o && files)
        json_object_set_new(o, "video_files", task_files(d, t->first_episode, t->num_episodes));
    return o;
}

int vf_plan_report_json(const vf_dataset *d, const vf_loader_settings *s, int64_t epoch, int list_tasks, int rank,
                        int worker, int flags, char **out)
{
    *out = NULL;
    char *base = NULL;
    int r = vf_plan_json(d, s->world_size, s->num_consumers, 0, &base);
    if (r < 0)
        return r;
    json_error_t err;
    json_t *doc = json_loads(base, 0, &err);
    free(base);
    if (!doc)
        return vf_error(VF_ENOMEM, "plan: cannot build the JSON document");
    int64_t frames = json_integer_value(json_object_get(doc, "frames"));
    int64_t w = s->world_size, bs = (int64_t)s->batch_size;
    int64_t kept_per_rank = frames / w / bs * bs;
    json_object_set_new(doc, "mode",
                        json_string(s->mode == VF_MODE_POOL ? "pool" : s->mode == VF_MODE_MAP ? "map" : "stream"));
    json_object_set_new(doc, "partition", s->mode == VF_MODE_MAP ? json_null()
                                          : json_string(s->mode == VF_MODE_POOL ? "episode"
                                                                                : vf_plan_partition_name(s->partition)));
    json_object_set_new(doc, "batch_size", json_integer(bs));
    json_object_set_new(doc, "samples_per_rank_drop_last", json_integer(kept_per_rank));
    json_object_set_new(doc, "dropped_drop_last", json_integer(frames - kept_per_rank * w));

    vf_plan_opens o;
    if ((r = vf_plan_count_opens(d, s, epoch, &o)) == 0)
        json_object_set_new(
            doc, "opens",
            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "consumers", (json_int_t)o.consumers, "distinct_files",
                      (json_int_t)o.distinct_files, "task_opens", (json_int_t)o.task_opens, "consumer_opens",
                      (json_int_t)o.consumer_opens, "decoder_cache_entries", (json_int_t)o.cache_entries,
                      "lower_bound", (json_int_t)o.lower_bound, "ratio_to_lower_bound",
                      o.lower_bound ? (double)o.consumer_opens / (double)o.lower_bound : 0.0));
    vf_task_info *t = NULL;
    size_t n = 0;
    if (r == 0 && list_tasks == 1 && rank < 0) {
        r = vf_plan_tasks(d, s->mode == VF_MODE_POOL ? VF_PARTITION_EPISODE : s->partition, s->world_size,
                          s->num_consumers, &t, &n);
        json_t *list = json_array();
        for (size_t i = 0; r == 0 && i < n; i++)
            json_array_append_new(list, task_json(d, &t[i], !(flags & VF_PLAN_NO_FILES)));
        json_object_set_new(doc, "tasks", list);
    } else if (r == 0 && (rank >= 0 || list_tasks == 2)) {
        /* One consumer's pieces, or (list_tasks 2, rank -1) every consumer's. */
        r = vf_plan_consumer_tasks(d, s, epoch, rank, rank >= 0 ? worker : -1, &t, &n);
        json_t *list = json_array();
        for (size_t i = 0; r == 0 && i < n; i++)
            json_array_append_new(list, task_json(d, &t[i], !(flags & VF_PLAN_NO_FILES)));
        json_object_set_new(doc, "consumer", json_pack("{s:i,s:i,s:I}", "rank", rank, "worker", rank >= 0 ? worker : -1,
                                                       "epoch", (json_int_t)epoch));
        json_object_set_new(doc, "consumer_tasks", list);
    }
    free(t);
    if (r == 0) {
        char *text = json_dumps(doc, JSON_PRESERVE_ORDER | ((flags & VF_INFO_PRETTY) ? JSON_INDENT(2) : JSON_COMPACT));
        if (!text)
            r = vf_error(VF_ENOMEM, "plan: cannot serialise the JSON document");
        *out = text;
    }
    json_decref(doc);
    return r;
}
