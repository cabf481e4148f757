/*
 * fuzz_wds.c: libFuzzer target for src/wds: the tar stream and webdataset's
 * grouping (tar.c), and the member parsers behind it (decode.c: .npy,
 * .npz, image headers and decoding).
 *
 * Input: a tar. Every sample is read (odd samples skipped, even ones read,
 * so both paths run); each member ending in .npy is parsed, .npz read, an
 * image's size taken and, when it is small, decoded. Invariants checked:
 * sample indices count up from 0; keys are non-empty and suffixes
 * lower-case; a parsed .npy's data lies inside the member and its byte
 * count is the product of its shape and item size; the reader ends (EOF or
 * an error) and stays ended. Any violation aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wds/wds.h"

#define REQUIRE(cond)      \
    do {                   \
        if (!(cond))       \
            abort();       \
    } while (0)

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && memcmp(s + n - k, tail, k) == 0;
}

static void check_array(const vf_wds_array *a, const uint8_t *data, size_t size)
{
    uint64_t count = 1;
    for (int d = 0; d < a->ndim; d++)
        count *= (uint64_t)a->shape[d];
    REQUIRE(count * (uint64_t)a->itemsize == a->nbytes);
    REQUIRE(a->data >= data && a->data + a->nbytes <= data + size);
}

static void check_member(const vf_wds_member *m)
{
    for (const char *p = m->suffix; *p; p++)
        REQUIRE(!(*p >= 'A' && *p <= 'Z'));
    if (!m->data)
        return;
    if (ends_with(m->suffix, "npy")) {
        vf_wds_array a;
        if (vf_wds_parse_npy(m->data, m->size, &a) == 0)
            check_array(&a, m->data, m->size);
    } else if (ends_with(m->suffix, "npz")) {
        vf_wds_npz z;
        if (vf_wds_read_npz(m->data, m->size, &z) == 0) {
            for (size_t i = 0; i < z.count; i++)
                if (z.parsed[i])
                    check_array(&z.arrays[i], z.storage[i], z.sizes[i]);
            vf_wds_npz_free(&z);
        }
    } else if (ends_with(m->suffix, "jpg") || ends_with(m->suffix, "png")) {
        int w = 0, h = 0;
        if (vf_wds_image_size(m->data, m->size, &w, &h) == 0 && (int64_t)w * h <= 256 * 256) {
            REQUIRE(w > 0 && h > 0);
            uint8_t *rgb = malloc((size_t)w * (size_t)h * 3);
            REQUIRE(rgb);
            (void)vf_wds_decode_image(m->data, m->size, w, h, 0, rgb);
            free(rgb);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    vf_wds_reader *r = NULL;
    if (vf_wds_reader_open_memory(&r, "fuzz.tar", data, size) < 0)
        return 0;
    int64_t expected = 0;
    for (int guard = 0; guard < 100000; guard++) {
        const vf_wds_sample *s = NULL;
        int rc = vf_wds_reader_next(r, (int)(expected % 2 == 0), &s);
        if (rc < 0) {
            REQUIRE(vf_wds_reader_next(r, 1, &s) == VF_EOF);
            break;
        }
        REQUIRE(s->index == expected++ && s->key[0] && s->num_members > 0);
        for (size_t i = 0; i < s->num_members; i++)
            check_member(&s->members[i]);
    }
    vf_wds_reader_close(r);
    return 0;
}
