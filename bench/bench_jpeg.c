/*
 * bench_jpeg.c: JPEG decode cost of WebDataset shards, the C counterpart of
 * bench_video's seq_rgb (so the video-vs-JPEG comparison in
 * bench/convert-wds-results.md is C against C).
 *
 *   bench_jpeg SUFFIX SHARD.tar [SHARD.tar ...]
 *
 * Reads every member whose name ends in SUFFIX (e.g. ".cam0_t0.jpg") into
 * memory, then decodes each with TurboJPEG into RGB24 and prints
 * "jpeg_rgb <frames per CPU second> frames/cpu-s (<n> images, <bytes> bytes each on average)".
 */
#define _GNU_SOURCE
#include <archive.h>
#include <archive_entry.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_jpeg SUFFIX SHARD.tar [SHARD.tar ...]\n");
        return 2;
    }
    const char *suffix = argv[1];
    size_t n = 0, cap = 0, total = 0;
    unsigned char **blobs = NULL;
    unsigned long *sizes = NULL;
    for (int i = 2; i < argc; i++) {
        struct archive *a = archive_read_new();
        archive_read_support_format_tar(a);
        if (archive_read_open_filename(a, argv[i], 1 << 16) != ARCHIVE_OK) {
            fprintf(stderr, "%s: %s\n", argv[i], archive_error_string(a));
            return 1;
        }
        struct archive_entry *e;
        while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
            const char *name = archive_entry_pathname(e);
            size_t len = strlen(name), sl = strlen(suffix);
            if (len < sl || strcmp(name + len - sl, suffix))
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 256;
                blobs = realloc(blobs, cap * sizeof *blobs);
                sizes = realloc(sizes, cap * sizeof *sizes);
            }
            size_t size = (size_t)archive_entry_size(e);
            blobs[n] = malloc(size);
            if (archive_read_data(a, blobs[n], size) != (la_ssize_t)size) {
                fprintf(stderr, "%s: %s: short read\n", argv[i], name);
                return 1;
            }
            sizes[n++] = size;
            total += size;
        }
        archive_read_free(a);
    }
    if (n == 0) {
        fprintf(stderr, "no member ends in %s\n", suffix);
        return 1;
    }
    tjhandle tj = tjInitDecompress();
    unsigned char *rgb = NULL;
    size_t rgb_cap = 0;
    double c0 = cpu_seconds();
    for (size_t i = 0; i < n; i++) {
        int w, h, sub, cs;
        if (tjDecompressHeader3(tj, blobs[i], sizes[i], &w, &h, &sub, &cs) != 0) {
            fprintf(stderr, "image %zu: %s\n", i, tjGetErrorStr2(tj));
            return 1;
        }
        if ((size_t)w * (size_t)h * 3 > rgb_cap) {
            rgb_cap = (size_t)w * (size_t)h * 3;
            rgb = realloc(rgb, rgb_cap);
        }
        if (tjDecompress2(tj, blobs[i], sizes[i], rgb, w, 0, h, TJPF_RGB, 0) != 0) {
            fprintf(stderr, "image %zu: %s\n", i, tjGetErrorStr2(tj));
            return 1;
        }
    }
    double cpu = cpu_seconds() - c0;
    printf("jpeg_rgb %.1f frames/cpu-s (%zu images, %.0f bytes each on average)\n", (double)n / cpu, n,
           (double)total / (double)n);
    tjDestroy(tj);
    for (size_t i = 0; i < n; i++)
        free(blobs[i]);
    free(blobs);
    free(sizes);
    free(rgb);
    return 0;
}
