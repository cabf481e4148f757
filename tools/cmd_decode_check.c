/*
 * cmd_decode_check.c: `vlafeed decode-check PATH [--json] [--episodes LIST]
 * [--no-decode] [--decode-device auto|cpu|cuda]`: decodes every frame of
 * every video of the dataset and reports frame counts, keyframe intervals,
 * per-episode drift and the decoders available. With --decode-device, the
 * check decodes on that device (through VF_DECODE_DEVICE, which the readers
 * follow), and a loader on that device serves a sample of frames that are
 * compared with the CPU's (max abs diff per camera, uint8 RGB).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "vlafeed/loader.h"
#include "vlafeed/vlafeed.h"

/* Frames of the sample compared between the devices. */
#define COMPARED_FRAMES 16

static vf_loader *open_on(vf_dataset *d, vf_decode_device device)
{
    vf_loader_settings s;
    vf_loader_defaults(&s);
    s.mode = VF_MODE_MAP;
    s.shuffle = 0;
    s.threads = 1;
    s.log_warnings = 0;
    s.batch_size = COMPARED_FRAMES;
    s.sample.image_format = VF_IMAGE_UINT8_HWC;
    s.decode_device = device;
    vf_loader *l = NULL;
    return vf_loader_open(&l, d, &s) == 0 ? l : NULL;
}

/* decode_device of the report: where each camera decoded on `device`, and
 * the largest difference from the CPU over a spread sample of frames.
 * *failed is set when the device could not serve them. */
static json_t *device_report(vf_dataset *d, vf_decode_device device, int *failed)
{
    json_t *out = json_pack("{s:s}", "requested", vf_decode_device_name(device));
    vf_batch *on_device = NULL, *on_cpu = NULL;
    vf_loader *l = open_on(d, device), *cpu = NULL;
    int64_t n = l ? vf_loader_num_positions(l) : 0;
    int64_t count = n < COMPARED_FRAMES ? n : COMPARED_FRAMES;
    int64_t positions[COMPARED_FRAMES];
    for (int64_t i = 0; i < count; i++)
        positions[i] = count > 1 ? i * (n - 1) / (count - 1) : 0;
    int ok = l && vf_loader_get_items(l, positions, (size_t)count, &on_device) == 0;
    if (ok && device != VF_DECODE_DEVICE_CPU)
        ok = (cpu = open_on(d, VF_DECODE_DEVICE_CPU)) && vf_loader_get_items(cpu, positions, (size_t)count, &on_cpu) == 0;
    if (!ok) {
        json_object_set_new(out, "error", json_string(vf_last_error()));
        *failed = 1;
    }
    json_t *cameras = json_object();
    for (size_t k = 0; l && k < vf_dataset_num_cameras(d); k++) {
        vf_decode_device_report rep;
        if (vf_loader_decode_device(l, k, &rep) < 0)
            break;
        json_t *cam = json_pack("{s:s,s:I,s:I,s:s?}", "device",
                                rep.files_cuda && rep.files_cpu ? "mixed" : rep.files_cuda ? "cuda" : "cpu",
                                "files_cpu", (json_int_t)rep.files_cpu, "files_cuda", (json_int_t)rep.files_cuda,
                                "reason", rep.reason[0] ? rep.reason : NULL);
        const vf_column *a = on_device ? vf_batch_find(on_device, rep.camera) : NULL;
        const vf_column *b = on_cpu ? vf_batch_find(on_cpu, rep.camera) : NULL;
        if (a && b && a->data && b->data && a->nbytes == b->nbytes) {
            int diff = 0;
            for (size_t i = 0; i < a->nbytes; i++) {
                int delta = abs((int)((const uint8_t *)a->data)[i] - (int)((const uint8_t *)b->data)[i]);
                diff = delta > diff ? delta : diff;
            }
            json_object_set_new(cam, "frames_compared", json_integer(count));
            json_object_set_new(cam, "max_abs_diff", json_integer(diff));
        }
        json_object_set_new(cameras, rep.camera, cam);
    }
    json_object_set_new(out, "cameras", cameras);
    if (on_device)
        vf_batch_release(on_device);
    if (on_cpu)
        vf_batch_release(on_cpu);
    vf_loader_close(cpu);
    vf_loader_close(l);
    return out;
}

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
                 "  --decode-device D  decode on D (auto, cpu, cuda: NVDEC) and compare a sample of\n"
                 "                   frames with the CPU's (decode_device in the report)\n"
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
    vf_decode_device device = VF_DECODE_DEVICE_DEFAULT;
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
        } else if (!strcmp(a, "--decode-device") && i + 1 < argc) {
            if (vf_decode_device_parse(argv[++i], &device) < 0 || device == VF_DECODE_DEVICE_DEFAULT) {
                fprintf(stderr, "vlafeed decode-check: --decode-device must be auto, cpu or cuda, not '%s'\n", argv[i]);
                free(episodes);
                return 2;
            }
            setenv("VF_DECODE_DEVICE", vf_decode_device_name(device), 1); /* the check's own readers */
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
    int device_failed = 0;
    json_t *devices = r == 0 && device != VF_DECODE_DEVICE_DEFAULT ? device_report(d, device, &device_failed) : NULL;
    errors += (size_t)device_failed;
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
        if (devices)
            json_object_set(root, "decode_device", devices);
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
        if (devices) {
            const char *key, *err = json_string_value(json_object_get(devices, "error"));
            json_t *on;
            printf("decode device %s%s%s\n", json_string_value(json_object_get(devices, "requested")),
                   err ? ": ERROR " : "", err ? err : "");
            json_object_foreach(json_object_get(devices, "cameras"), key, on)
            {
                const char *why = json_string_value(json_object_get(on, "reason"));
                printf("  camera %s on %s", key, json_string_value(json_object_get(on, "device")));
                if (why)
                    printf(" (%s)", why);
                if (json_object_get(on, "max_abs_diff"))
                    printf(", max abs diff from the CPU %lld over %lld frames",
                           (long long)json_integer_value(json_object_get(on, "max_abs_diff")),
                           (long long)json_integer_value(json_object_get(on, "frames_compared")));
                printf("\n");
            }
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
    json_decref(devices);
    free(report);
    return errors ? 1 : changed ? 3 : 0;
}
