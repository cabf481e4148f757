/*
 * cmd_decode_check.c: `vlafeed decode-check PATH [--json] [--episodes LIST]
 * [--no-decode]`: decodes every frame of every video of the dataset and
 * reports frame counts, keyframe intervals, per-episode drift and the
 * decoders available.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "vlafeed/vlafeed.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: vlafeed decode-check PATH [--json] [--episodes LIST] [--no-decode] [--thorough] [--quiet]\n\n"
                 "Checks every MP4 used by the (selected) episodes: frames in the file against what the\n"
                 "metadata needs, keyframe intervals (GOP), each episode's start drift (real pts minus\n"
                 "from_timestamp, in ms; LeRobot's concatenation drifts at 30 fps), frames located by\n"
                 "ordinal or, when counts disagree and pts gaps show where, by timestamp with every\n"
                 "unmatched frame reported (counts that disagree with no gap to say where: the file and\n"
                 "every episode in it refused, mapping \"refused\"); then decodes every frame (unless\n"
                 "--no-decode) and reports decode speed. Also lists the decoders of this machine (CPU;\n"
                 "NVDEC when a CUDA device is present).\n\n"
                 "  --json           print the report as JSON\n"
                 "  --episodes LIST  e.g. 1,2,4 or 0-9\n"
                 "  --no-decode      read the sample tables only\n"
                 "  --thorough       also every error the open finds (metadata, data footers, videos'\n"
                 "                   codec, size, frame count and pts grid against the metadata) and every\n"
                 "                   data page read and verified: exit 0 only when loading is correct\n"
                 "exit status: 0 every item loads as the metadata describes, 1 errors found (items the\n"
                 "loaders refuse), 2 usage, 3 no errors but something is served otherwise than the\n"
                 "metadata says (frames at the files' size, a feature left out, files by timestamp; the\n"
                 "loaders warn: LoaderWarning in Python)\n");
}

int vf_cmd_decode_check(int argc, char **argv)
{
    const char *path = NULL;
    int as_json = 0, quiet = 0;
    vf_decode_check_settings cs;
    vf_decode_check_defaults(&cs);
    vf_dataset_settings ds;
    vf_dataset_defaults(&ds);
    int64_t *episodes = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            as_json = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--no-decode")) {
            cs.decode = 0;
        } else if (!strcmp(a, "--thorough")) {
            cs.thorough = 1;
            ds.check_data_files = 1;
            ds.check_videos = 2;
        } else if (!strcmp(a, "--episodes") && i + 1 < argc) {
            free(episodes);
            if (vf_cli_episode_list("--episodes", argv[++i], &episodes, &ds.num_episodes))
                return 2;
            ds.episodes = episodes;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "vlafeed decode-check: unexpected argument '%s' (see --help)\n", a);
            free(episodes);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    vf_dataset *d = NULL;
    int r = vf_dataset_open(&d, path, &ds);
    free(episodes);
    if (r < 0)
        return vf_cli_fail("decode-check");
    vf_cli_progress bar;
    vf_cli_progress_start(&bar, "decode-check", quiet || as_json);
    cs.progress = vf_cli_progress_cb;
    cs.progress_ctx = &bar;
    char *report = NULL;
    size_t errors = 0;
    r = vf_dataset_decode_check(d, &cs, &report, &errors);
    vf_cli_progress_finish(&bar);
    /* What the open found that makes the loaders serve otherwise than the
     * metadata says (and warn): exit 3 when nothing is an error. */
    json_t *otherwise = json_array();
    for (size_t i = 0; r == 0 && i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        if (p->changes_samples)
            json_array_append_new(otherwise, json_pack("{s:s, s:s, s:s}", "file", p->file, "column", p->column,
                                                       "message", p->message));
    }
    vf_dataset_close(d);
    if (r < 0) {
        json_decref(otherwise);
        return vf_cli_fail("decode-check");
    }
    size_t changed = json_array_size(otherwise);
    if (as_json) {
        json_t *root = json_loads(report, 0, NULL);
        json_object_set(root, "served_otherwise", otherwise);
        char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
        printf("%s\n", text ? text : report);
        free(text);
        json_decref(root);
    } else {
        json_t *root = json_loads(report, 0, NULL);
        json_t *dec = json_object_get(root, "decoders");
        printf("decoders   cpu: av1=%s h264=%s hevc=%s; nvdec: %s\n",
               json_string_value(json_object_get(json_object_get(dec, "cpu"), "av1")) ?: "none",
               json_string_value(json_object_get(json_object_get(dec, "cpu"), "h264")) ?: "none",
               json_string_value(json_object_get(json_object_get(dec, "cpu"), "hevc")) ?: "none",
               json_string_value(json_object_get(json_object_get(dec, "nvdec"), "reason")) ?: "?");
        size_t ci, fi;
        json_t *cam, *file;
        json_array_foreach(json_object_get(root, "cameras"), ci, cam)
        {
            printf("camera %s\n", json_string_value(json_object_get(cam, "key")));
            json_array_foreach(json_object_get(cam, "files"), fi, file)
            {
                const char *err = json_string_value(json_object_get(file, "error"));
                if (err) {
                    printf("  %-52s ERROR %s\n", json_string_value(json_object_get(file, "file")), err);
                    continue;
                }
                printf("  %-52s %s %lldx%lld frames %lld/%lld needed, GOP max %lld, %s, drift max %.3f ms",
                       json_string_value(json_object_get(file, "file")),
                       json_string_value(json_object_get(file, "codec")),
                       (long long)json_integer_value(json_object_get(file, "width")),
                       (long long)json_integer_value(json_object_get(file, "height")),
                       (long long)json_integer_value(json_object_get(file, "frames")),
                       (long long)json_integer_value(json_object_get(file, "frames_expected")),
                       (long long)json_integer_value(json_object_get(file, "max_keyframe_interval")),
                       json_string_value(json_object_get(file, "mapping")),
                       json_number_value(json_object_get(file, "max_abs_drift_ms")));
                if (json_object_get(file, "decode_fps"))
                    printf(", decoded %lld at %.0f fps",
                           (long long)json_integer_value(json_object_get(file, "frames_decoded")),
                           json_number_value(json_object_get(file, "decode_fps")));
                printf("\n");
            }
        }
        json_t *p;
        size_t pi;
        json_array_foreach(json_object_get(root, "problems"), pi, p)
        {
            /* episode -1: the problem is the whole file's, not one episode's */
            long long episode = (long long)json_integer_value(json_object_get(p, "episode"));
            const char *camera = json_string_value(json_object_get(p, "camera"));
            printf("%-7s %s: %s", json_string_value(json_object_get(p, "severity")),
                   json_string_value(json_object_get(p, "file")), json_string_value(json_object_get(p, "kind")));
            if (camera && *camera)
                printf(" (camera %s)", camera);
            if (episode >= 0)
                printf(" (episode %lld)", episode);
            printf(": %s\n", json_string_value(json_object_get(p, "message")));
        }
        json_array_foreach(otherwise, pi, p)
        {
            printf("warning %s: %s (the loaders serve this otherwise than the metadata says)\n",
                   json_string_value(json_object_get(p, "file")), json_string_value(json_object_get(p, "message")));
        }
        printf("frames %lld, decoded %lld, %zu error(s)",
               (long long)json_integer_value(json_object_get(root, "frames")),
               (long long)json_integer_value(json_object_get(root, "frames_decoded")), errors);
        if (changed)
            printf(", %zu served otherwise than the metadata says", changed);
        printf("\n");
        json_decref(root);
    }
    json_decref(otherwise);
    free(report);
    return errors ? 1 : changed ? 3 : 0;
}
