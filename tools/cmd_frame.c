/*
 * cmd_frame.c: `vlafeed frame PATH --episode E --frame K --camera KEY --out FILE`:
 * decodes one frame, located by its ordinal in the camera file, to PNG/PPM.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "vlafeed/vlafeed.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: vlafeed frame PATH --episode E --frame K --camera KEY --out FILE.png|FILE.ppm\n\n"
                 "Decodes frame K (0-based within episode E) of camera KEY (its feature name, e.g.\n"
                 "observation.images.cam_high; the last name part, e.g. cam_high, also works when it is\n"
                 "unique) and writes it as an RGB image. The frame is found by its ordinal in the camera's\n"
                 "MP4 file, so it is exact even where LeRobot's concatenation drift fools a timestamp\n"
                 "lookup. Conversion: swscale yuv420p -> rgb24, bilinear (same as the loader).\n");
}

/* Accepts the full key or a unique suffix after the last '.'. */
static const char *resolve_camera(const vf_dataset *d, const char *name)
{
    const char *match = NULL;
    int count = 0;
    for (size_t c = 0; c < vf_dataset_num_cameras(d); c++) {
        const char *key = vf_dataset_camera(d, c)->key;
        if (!strcmp(key, name))
            return key;
        const char *dot = strrchr(key, '.');
        if (dot && !strcmp(dot + 1, name)) {
            match = key;
            count++;
        }
    }
    return count == 1 ? match : name;
}

int vf_cmd_frame(int argc, char **argv)
{
    const char *path = NULL, *camera = NULL, *out = NULL;
    long long episode = -1, frame = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (vf_cli_is(a, "--help", "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--episode") && v) {
            if (vf_cli_int(a, v, 0, (long long)1 << 40, &episode)) return 2;
            i++;
        } else if (!strcmp(a, "--frame") && v) {
            if (vf_cli_int(a, v, 0, (long long)1 << 40, &frame)) return 2;
            i++;
        } else if (!strcmp(a, "--camera") && v) {
            camera = argv[++i];
        } else if (!strcmp(a, "--out") && v) {
            out = argv[++i];
        } else if (a[0] != '-' && !path) {
            path = a;
        } else {
            fprintf(stderr, "vlafeed frame: unexpected argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!path || episode < 0 || frame < 0 || !camera || !out) {
        usage(stderr);
        return 2;
    }
    vf_dataset_settings s;
    vf_dataset_defaults(&s);
    int64_t selected = episode;
    s.episodes = &selected;
    s.num_episodes = 1;
    vf_dataset *d = NULL;
    if (vf_dataset_open(&d, path, &s) < 0)
        return vf_cli_fail("frame");
    uint8_t *rgb = NULL;
    int w = 0, h = 0;
    int r = vf_dataset_read_frame(d, episode, frame, resolve_camera(d, camera), &rgb, &w, &h);
    if (r == 0)
        r = vf_image_write(out, rgb, w, h);
    free(rgb);
    vf_dataset_close(d);
    if (r < 0)
        return vf_cli_fail("frame");
    fprintf(stderr, "frame: episode %lld frame %lld camera %s -> %s (%dx%d)\n", episode, frame, camera, out, w, h);
    return 0;
}
