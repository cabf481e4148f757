/*
 * summary.c: the public plan summary (vf_plan_summarize) and the
 * `vlafeed plan --json` document (vf_plan_json): for each partition
 * strategy, the number of tasks and of MP4 opens needed to read every task
 * once, next to the episodes and frames, and the per-rank sample counts the
 * remainder rule gives.
 */
#include "plan/plan.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int summarize(const vf_plan_input *in, vf_partition partition, size_t consumers, vf_plan_summary *out,
                     int64_t *max_task_frames)
{
    memset(out, 0, sizeof *out);
    vf_plan_task *tasks;
    size_t n;
    int r = vf_plan_partition(in, partition, consumers, &tasks, &n);
    if (r < 0)
        return r;
    out->partition = partition;
    out->tasks = n;
    out->video_opens = vf_plan_video_opens(in, tasks, n);
    out->episodes = in->num_episodes;
    int64_t frames = 0, biggest = 0;
    for (size_t i = 0; i < n; i++) {
        frames += tasks[i].num_samples;
        biggest = VF_MAX(biggest, tasks[i].num_samples);
    }
    out->frames = frames;
    if (max_task_frames)
        *max_task_frames = biggest;
    free(tasks);
    return 0;
}

/* The plan input of d once the sizes are checked (the caller frees it). */
static int plan_input(const vf_dataset *d, int world_size, int num_consumers, vf_plan_input *in)
{
    if (world_size < 1 || world_size > 1 << 20)
        return vf_error(VF_EINVAL, "plan: world size %d must be between 1 and %d", world_size, 1 << 20);
    if (num_consumers < 1 || num_consumers > 1 << 16)
        return vf_error(VF_EINVAL, "plan: workers per rank %d must be between 1 and %d", num_consumers, 1 << 16);
    return vf_plan_input_from_dataset(d, in);
}

int vf_plan_summarize(const vf_dataset *d, vf_partition partition, int world_size, int num_consumers,
                      vf_plan_summary *out)
{
    memset(out, 0, sizeof *out);
    vf_plan_input in;
    int r = plan_input(d, world_size, num_consumers, &in);
    if (r < 0)
        return r;
    r = summarize(&in, partition, (size_t)world_size * (size_t)num_consumers, out, NULL);
    vf_plan_input_free(&in);
    return r;
}

int vf_plan_json(const vf_dataset *d, int world_size, int num_consumers, int flags, char **out)
{
    *out = NULL;
    vf_plan_input in;
    int r = plan_input(d, world_size, num_consumers, &in);
    if (r < 0)
        return r;
    size_t consumers = (size_t)world_size * (size_t)num_consumers;
    json_t *doc = json_object();
    json_t *cams = json_array();
    json_t *strategies = json_object();
    if (!doc || !cams || !strategies) {
        json_decref(doc);
        json_decref(cams);
        json_decref(strategies);
        vf_plan_input_free(&in);
        return vf_error(VF_ENOMEM, "out of memory");
    }
    int64_t frames = 0;
    for (size_t e = 0; e < in.num_episodes; e++)
        frames += in.lengths[e];
    json_object_set_new(doc, "dataset", json_string(vf_dataset_root(d)));
    json_object_set_new(doc, "fps", json_real(vf_dataset_fps(d)));
    json_object_set_new(doc, "episodes", json_integer((json_int_t)in.num_episodes));
    json_object_set_new(doc, "frames", json_integer(frames));
    for (size_t c = 0; c < vf_dataset_num_cameras(d); c++)
        json_array_append_new(cams, json_pack("{s:s,s:I}", "key", vf_dataset_camera(d, c)->key, "files",
                                              (json_int_t)vf_dataset_num_video_files(d, c)));
    json_object_set_new(doc, "cameras", cams);
    json_object_set_new(doc, "world_size", json_integer(world_size));
    json_object_set_new(doc, "workers", json_integer(num_consumers));
    json_object_set_new(doc, "consumers", json_integer((json_int_t)consumers));
    int64_t start, per_rank, per_rank_drop;
    vf_plan_rank_slice(frames, 0, world_size, 0, &start, &per_rank);
    vf_plan_rank_slice(frames, 0, world_size, 1, &start, &per_rank_drop);
    json_object_set_new(doc, "samples_per_rank", json_integer(per_rank));
    json_object_set_new(doc, "padded_samples", json_integer(per_rank * world_size - frames));
    json_object_set_new(doc, "samples_per_rank_drop_last", json_integer(per_rank_drop));
    const vf_partition order[] = {VF_PARTITION_SEQUENTIAL, VF_PARTITION_EPISODE, VF_PARTITION_FILE_GROUP};
    for (size_t i = 0; i < VF_ARRAY_LEN(order) && r == 0; i++) {
        vf_plan_summary s;
        int64_t biggest = 0;
        r = summarize(&in, order[i], consumers, &s, &biggest);
        if (r < 0)
            break;
        json_object_set_new(strategies, vf_plan_partition_name(order[i]),
                            json_pack("{s:I,s:I,s:I,s:I,s:I}", "tasks", (json_int_t)s.tasks, "video_opens",
                                      (json_int_t)s.video_opens, "episodes", (json_int_t)s.episodes, "frames",
                                      (json_int_t)s.frames, "max_task_frames", (json_int_t)biggest));
    }
    json_object_set_new(doc, "strategies", strategies);
    vf_plan_input_free(&in);
    if (r == 0) {
        char *text = json_dumps(doc, JSON_PRESERVE_ORDER | ((flags & VF_INFO_PRETTY) ? JSON_INDENT(2) : JSON_COMPACT));
        if (!text)
            r = vf_error(VF_ENOMEM, "plan: cannot serialise the JSON document");
        else
            *out = text;
    }
    json_decref(doc);
    return r;
}
