/*
 * rle.c: the RLE / bit-packed hybrid encoding (levels, dictionary indices,
 * RLE booleans) and LSB-first bit unpacking.
 *
 * Encoding: a sequence of runs, each starting with a ULEB128 header. If
 * the header's low bit is 1, (header >> 1) groups of 8 values follow,
 * bit-packed LSB-first at `width` bits each (a group is exactly `width`
 * bytes). Otherwise an RLE run of (header >> 1) copies of one value stored
 * in ceil(width / 8) little-endian bytes.
 *
 * Speed: unpacking is specialised per width (a switch over inline
 * functions with a constant width, so every shift and mask is an
 * immediate), works a group at a time from whole 64-bit words, and never
 * reads outside the group (a group is copied into a zeroed word array of
 * constant size). RLE runs are filled without unpacking.
 *
 * Safety: reads stay within [p, end); a bit-packed run that claims more
 * groups than remain is shortened to the whole groups present (plus one
 * zero-padded partial group); an RLE value wider than `width` is an error.
 */
#include "parquet/read_internal.h"

#include <string.h>

#define ALWAYS_INLINE __attribute__((always_inline)) inline

/* ---- unpacking ----------------------------------------------------------- */

static ALWAYS_INLINE void unpack_u32_w(const uint8_t *in, uint32_t *out, int64_t groups, const int w)
{
    const uint64_t mask = (w == 32) ? 0xffffffffull : ((1ull << w) - 1);
    for (int64_t g = 0; g < groups; g++) {
        uint64_t words[5] = {0, 0, 0, 0, 0};
        memcpy(words, in, (size_t)w);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const int bit = k * w, wi = bit >> 6, sh = bit & 63;
            uint64_t v = words[wi] >> sh;
            if (sh + w > 64)
                v |= words[wi + 1] << (64 - sh);
            out[k] = (uint32_t)(v & mask);
        }
        in += w;
        out += 8;
    }
}

static ALWAYS_INLINE void unpack_u8_w(const uint8_t *in, uint8_t *out, int64_t groups, const int w)
{
    const uint64_t mask = (1ull << w) - 1;
    for (int64_t g = 0; g < groups; g++) {
        uint64_t v = 0;
        memcpy(&v, in, (size_t)w);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            out[k] = (uint8_t)((v >> (k * w)) & mask);
        in += w;
        out += 8;
    }
}

/* One case of the width switches below: the unpacker inlined with a
 * constant width. */
#define UNPACK_CASE(unpack, w)                                                                       \
    case w:                                                                                          \
        unpack(in, out, groups, w);                                                                  \
        break;

void vf_pq_unpack_u32(const uint8_t *in, uint32_t *out, int64_t groups, int width)
{
    switch (width) {
    case 0: memset(out, 0, (size_t)groups * 8 * sizeof *out); break;
        UNPACK_CASE(unpack_u32_w, 1) UNPACK_CASE(unpack_u32_w, 2) UNPACK_CASE(unpack_u32_w, 3)
        UNPACK_CASE(unpack_u32_w, 4) UNPACK_CASE(unpack_u32_w, 5) UNPACK_CASE(unpack_u32_w, 6)
        UNPACK_CASE(unpack_u32_w, 7) UNPACK_CASE(unpack_u32_w, 8) UNPACK_CASE(unpack_u32_w, 9)
        UNPACK_CASE(unpack_u32_w, 10) UNPACK_CASE(unpack_u32_w, 11) UNPACK_CASE(unpack_u32_w, 12)
        UNPACK_CASE(unpack_u32_w, 13) UNPACK_CASE(unpack_u32_w, 14) UNPACK_CASE(unpack_u32_w, 15)
        UNPACK_CASE(unpack_u32_w, 16) UNPACK_CASE(unpack_u32_w, 17) UNPACK_CASE(unpack_u32_w, 18)
        UNPACK_CASE(unpack_u32_w, 19) UNPACK_CASE(unpack_u32_w, 20) UNPACK_CASE(unpack_u32_w, 21)
        UNPACK_CASE(unpack_u32_w, 22) UNPACK_CASE(unpack_u32_w, 23) UNPACK_CASE(unpack_u32_w, 24)
        UNPACK_CASE(unpack_u32_w, 25) UNPACK_CASE(unpack_u32_w, 26) UNPACK_CASE(unpack_u32_w, 27)
        UNPACK_CASE(unpack_u32_w, 28) UNPACK_CASE(unpack_u32_w, 29) UNPACK_CASE(unpack_u32_w, 30)
        UNPACK_CASE(unpack_u32_w, 31) UNPACK_CASE(unpack_u32_w, 32)
    default: memset(out, 0, (size_t)groups * 8 * sizeof *out); break; /* callers validate width */
    }
}

void vf_pq_unpack_u8(const uint8_t *in, uint8_t *out, int64_t groups, int width)
{
    switch (width) {
        UNPACK_CASE(unpack_u8_w, 1) UNPACK_CASE(unpack_u8_w, 2) UNPACK_CASE(unpack_u8_w, 3)
        UNPACK_CASE(unpack_u8_w, 4) UNPACK_CASE(unpack_u8_w, 5) UNPACK_CASE(unpack_u8_w, 6)
        UNPACK_CASE(unpack_u8_w, 7) UNPACK_CASE(unpack_u8_w, 8)
    default: memset(out, 0, (size_t)groups * 8); break; /* width 0 (callers validate width) */
    }
}

/* ---- hybrid decoder --------------------------------------------------------- */

void vf_pq_rle_init(vf_pq_rle *d, const uint8_t *data, size_t len, int width)
{
    memset(d, 0, sizeof *d);
    d->p = data;
    d->end = data + len;
    d->width = width;
    d->mask = width >= 32 ? 0xffffffffu : ((1u << width) - 1);
}

/* Reads the next run header. Returns 0, or -1 on malformed data. */
static ALWAYS_INLINE int next_run(vf_pq_rle *d)
{
    uint64_t h = 0;
    if (VF_LIKELY(d->p < d->end && *d->p < 0x80)) {
        h = *d->p++; /* one-byte header: runs shorter than 64 */
    } else {
        int shift = 0;
        for (;;) {
            if (d->p >= d->end || shift > 63)
                return -1;
            uint8_t b = *d->p++;
            h |= (uint64_t)(b & 0x7f) << shift;
            shift += 7;
            if (!(b & 0x80))
                break;
        }
    }
    size_t avail = (size_t)(d->end - d->p);
    if (h & 1) {
        uint64_t groups = h >> 1;
        if (d->width == 0) {
            d->packed_left = (int64_t)(VF_MIN(groups, (uint64_t)1 << 40) * 8);
            return 0;
        }
        uint64_t whole = avail / (size_t)d->width;
        if (groups > whole) {
            /* Truncated run: decode the whole groups present, then the
             * partial last group zero-padded (see `tail`). */
            d->packed_left = (int64_t)(whole * 8);
            d->tail = (int)(avail - (size_t)(whole * (uint64_t)d->width));
            return 0;
        }
        d->packed_left = (int64_t)(groups * 8);
        return 0;
    }
    uint64_t count = h >> 1;
    int nbytes = (d->width + 7) / 8;
    if ((size_t)nbytes > avail)
        return -1;
    uint32_t v = 0;
    for (int i = 0; i < nbytes; i++)
        v |= (uint32_t)d->p[i] << (8 * i);
    d->p += nbytes;
    if (v & ~d->mask)
        return -1;
    d->run_value = v;
    d->run_left = (int64_t)VF_MIN(count, (uint64_t)INT64_MAX);
    return 0;
}

#define DEFINE_RLE_READ(fname, T, unpack)                                                            \
    int fname(vf_pq_rle *d, T *out, int64_t n)                                                       \
    {                                                                                                \
        while (n > 0) {                                                                              \
            if (d->buf_pos < d->buf_len) {                                                           \
                int64_t k = VF_MIN(n, (int64_t)(d->buf_len - d->buf_pos));                           \
                for (int64_t i = 0; i < k; i++)                                                      \
                    out[i] = (T)d->buf[d->buf_pos + i];                                              \
                d->buf_pos += (int)k;                                                                \
                out += k;                                                                            \
                n -= k;                                                                              \
                continue;                                                                            \
            }                                                                                        \
            if (d->run_left > 0) {                                                                   \
                int64_t k = VF_MIN(n, d->run_left);                                                  \
                T v = (T)d->run_value;                                                               \
                if (sizeof(T) == 1)                                                                  \
                    memset(out, (int)v, (size_t)k);                                                  \
                else                                                                                 \
                    for (int64_t i = 0; i < k; i++)                                                  \
                        out[i] = v;                                                                  \
                d->run_left -= k;                                                                    \
                out += k;                                                                            \
                n -= k;                                                                              \
                continue;                                                                            \
            }                                                                                        \
            if (d->packed_left > 0) {                                                                \
                int64_t groups = VF_MIN(n, d->packed_left) / 8;                                      \
                if (groups > 0) {                                                                    \
                    unpack(d->p, out, groups, d->width);                                             \
                    d->p += groups * d->width;                                                       \
                    d->packed_left -= groups * 8;                                                    \
                    out += groups * 8;                                                               \
                    n -= groups * 8;                                                                 \
                    continue;                                                                        \
                }                                                                                    \
                vf_pq_unpack_u32(d->p, d->buf, 1, d->width);                                         \
                d->p += d->width;                                                                    \
                d->packed_left -= 8;                                                                 \
                d->buf_pos = 0;                                                                      \
                d->buf_len = 8;                                                                      \
                continue;                                                                            \
            }                                                                                        \
            if (d->tail) {                                                                           \
                uint8_t padded[32] = {0};                                                            \
                memcpy(padded, d->p, (size_t)d->tail);                                               \
                vf_pq_unpack_u32(padded, d->buf, 1, d->width);                                       \
                d->p = d->end;                                                                       \
                d->tail = 0;                                                                         \
                d->buf_pos = 0;                                                                      \
                d->buf_len = 8;                                                                      \
                continue;                                                                            \
            }                                                                                        \
            if (d->p >= d->end) {                                                                    \
                if (d->width != 0)                                                                   \
                    return -1;                                                                       \
                memset(out, 0, (size_t)n * sizeof(T));                                               \
                return 0;                                                                            \
            }                                                                                        \
            if (next_run(d) < 0)                                                                     \
                return -1;                                                                           \
        }                                                                                            \
        return 0;                                                                                    \
    }

DEFINE_RLE_READ(vf_pq_rle_read_u32, uint32_t, vf_pq_unpack_u32)
DEFINE_RLE_READ(vf_pq_rle_read_u8, uint8_t, vf_pq_unpack_u8)

int vf_pq_rle_skip(vf_pq_rle *d, int64_t n)
{
    while (n > 0) {
        if (d->buf_pos < d->buf_len) {
            int64_t k = VF_MIN(n, (int64_t)(d->buf_len - d->buf_pos));
            d->buf_pos += (int)k;
            n -= k;
        } else if (d->run_left > 0) {
            int64_t k = VF_MIN(n, d->run_left);
            d->run_left -= k;
            n -= k;
        } else if (d->packed_left > 0) {
            int64_t groups = VF_MIN(n, d->packed_left) / 8;
            if (groups > 0) {
                d->p += groups * d->width;
                d->packed_left -= groups * 8;
                n -= groups * 8;
                continue;
            }
            /* A partial group: decode it and consume part of it. */
            vf_pq_unpack_u32(d->p, d->buf, 1, d->width);
            d->p += d->width;
            d->packed_left -= 8;
            d->buf_pos = 0;
            d->buf_len = 8;
        } else if (d->tail) {
            uint8_t padded[32] = {0};
            memcpy(padded, d->p, (size_t)d->tail);
            vf_pq_unpack_u32(padded, d->buf, 1, d->width);
            d->p = d->end;
            d->tail = 0;
            d->buf_pos = 0;
            d->buf_len = 8;
        } else if (d->p >= d->end) {
            return d->width != 0 ? -1 : 0;
        } else if (next_run(d) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ---- level shortcuts --------------------------------------------------------- */

int64_t vf_pq_rle_skip_run(vf_pq_rle *d, uint32_t value, int64_t max)
{
    if (d->buf_pos < d->buf_len || d->packed_left > 0 || d->tail)
        return 0;
    if (d->run_left == 0) {
        if (d->p >= d->end || next_run(d) < 0)
            return 0; /* the regular read reports the error */
        if (d->run_left == 0)
            return 0;
    }
    if (d->run_value != value)
        return 0;
    int64_t k = VF_MIN(max, d->run_left);
    d->run_left -= k;
    return k;
}

int64_t vf_pq_rle_zero_positions(vf_pq_rle *d, int64_t n, int64_t base, int64_t *out)
{
    int64_t i = 0, cnt = 0;
    if (d->width != 1)
        return -1;
    /* Values already buffered or in a started run come first. */
    while (i < n && (d->buf_pos < d->buf_len || d->run_left > 0 || d->packed_left > 0 || d->tail)) {
        uint32_t v;
        if (vf_pq_rle_read_u32(d, &v, 1) < 0)
            return -1;
        if (v == 0)
            out[cnt++] = base + i;
        i++;
    }
    /* Then whole runs straight from the bytes: an RLE run of ones has no
     * row start, a run of zeros is all row starts, and a bit-packed group
     * is one byte whose zero bits are row starts. */
    const uint8_t *p = d->p, *end = d->end;
    while (i < n) {
        if (p >= end)
            return -1;
        uint64_t h;
        if (VF_LIKELY(*p < 0x80)) {
            h = *p++;
        } else {
            h = 0;
            for (int shift = 0;; shift += 7) {
                if (p >= end || shift > 63)
                    return -1;
                uint8_t b = *p++;
                h |= (uint64_t)(b & 0x7f) << shift;
                if (!(b & 0x80))
                    break;
            }
        }
        if (h & 1) {
            uint64_t bytes = VF_MIN(h >> 1, (uint64_t)(end - p));
            int64_t k = (int64_t)VF_MIN((uint64_t)(n - i), bytes * 8);
            int64_t whole = k / 8;
            for (int64_t g = 0; g < whole; g++) {
                unsigned zeros = ~(unsigned)p[g] & 0xffu;
                while (zeros) {
                    out[cnt++] = base + i + g * 8 + __builtin_ctz(zeros);
                    zeros &= zeros - 1;
                }
            }
            if (k % 8) {
                unsigned zeros = ~(unsigned)p[whole] & ((1u << (k % 8)) - 1);
                while (zeros) {
                    out[cnt++] = base + i + whole * 8 + __builtin_ctz(zeros);
                    zeros &= zeros - 1;
                }
            }
            p += bytes;
            i += k;
        } else {
            if (p >= end || *p > 1)
                return -1;
            uint8_t v = *p++;
            int64_t k = (int64_t)VF_MIN(h >> 1, (uint64_t)(n - i));
            if (v == 0)
                for (int64_t j = 0; j < k; j++)
                    out[cnt++] = base + i + j;
            i += k;
        }
    }
    d->p = p; /* the decoder is finished: it stops within the last run */
    return cnt;
}
