/*
 * bench_parquet_read.c: decoding speed of the Parquet reader.
 *
 *   bench_parquet_read FILE [ITERATIONS] [--column NAME]...
 *
 * Opens FILE and reads every top-level field (or the named ones) of every
 * row group, ITERATIONS times (default 5), then prints the throughput in
 * MB/s of file bytes (file size / time per pass) and of decoded bytes
 * (values, offsets, validity and string data of the arrays produced).
 * The first pass warms the page cache and is not timed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/parquet.h"

static int64_t array_bytes(const vf_pq_array *a)
{
    int64_t n = 0;
    size_t w = vf_pq_type_size(a->type);
    if (a->type == VF_PQ_T_FIXED_BINARY)
        w = (size_t)a->width;
    if (a->values)
        n += a->length * (int64_t)w;
    if (a->offsets)
        n += (a->length + 1) * 8;
    if (a->valid)
        n += a->length;
    n += a->data_len;
    for (int i = 0; i < a->num_children; i++)
        n += array_bytes(&a->children[i]);
    return n;
}

/* One pass: open, read the selected fields, close. Returns decoded bytes or -1. */
static int64_t one_pass(const char *path, char **names, int num_names)
{
    vf_pq_file *f;
    if (vf_pq_open_path(&f, path) < 0)
        return -1;
    int64_t bytes = 0;
    for (int i = 0; i < vf_pq_num_fields(f); i++) {
        const char *name = vf_pq_field(f, i)->name;
        int wanted = num_names == 0;
        for (int k = 0; k < num_names && !wanted; k++)
            wanted = !strcmp(names[k], name);
        if (!wanted)
            continue;
        vf_pq_array a;
        if (vf_pq_read_field_all(f, i, &a) < 0) {
            vf_pq_close(f);
            return -1;
        }
        bytes += array_bytes(&a);
        vf_pq_array_free(&a);
    }
    vf_pq_close(f);
    return bytes;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "usage: bench_parquet_read FILE [ITERATIONS] [--column NAME]...\n");
        return 2;
    }
    const char *path = argv[1];
    int iterations = 5;
    char *names[64];
    int num_names = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--column") && i + 1 < argc && num_names < 64)
            names[num_names++] = argv[++i];
        else
            iterations = atoi(argv[i]);
    }
    if (iterations < 1)
        iterations = 1;
    uint8_t *tmp;
    size_t file_size;
    if (vf_read_file(path, &tmp, &file_size) < 0) {
        fprintf(stderr, "bench_parquet_read: %s\n", vf_last_error());
        return 1;
    }
    free(tmp);
    if (one_pass(path, names, num_names) < 0) { /* warm-up */
        fprintf(stderr, "bench_parquet_read: %s\n", vf_last_error());
        return 1;
    }
    double best = 1e30, total = 0;
    int64_t decoded = 0;
    for (int it = 0; it < iterations; it++) {
        double t0 = vf_now_seconds();
        decoded = one_pass(path, names, num_names);
        double dt = vf_now_seconds() - t0;
        if (decoded < 0) {
            fprintf(stderr, "bench_parquet_read: %s\n", vf_last_error());
            return 1;
        }
        total += dt;
        best = dt < best ? dt : best;
    }
    double mean = total / iterations;
    printf("file: %s\nfile bytes: %zu\ndecoded bytes: %lld\niterations: %d\n", path, file_size, (long long)decoded,
           iterations);
    printf("seconds per pass: mean %.4f best %.4f\n", mean, best);
    printf("file MB/s: %.1f (best %.1f)\n", file_size / mean / 1e6, file_size / best / 1e6);
    printf("decoded MB/s: %.1f (best %.1f)\n", decoded / mean / 1e6, decoded / best / 1e6);
    return 0;
}
