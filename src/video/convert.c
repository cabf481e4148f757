/*
 * convert.c: decoded frame -> caller memory, in one of the output layouts.
 *
 * RGB goes through libswscale with fast flags (bilinear by default; never
 * accurate_rnd / full_chroma_int, which cost ~12x). At the source size,
 * yuv420p -> rgb24 takes swscale's unscaled SIMD path, and the colourspace
 * is set the way the ffmpeg CLI's scale filter sets it (the frame's matrix,
 * BT.601 when unspecified; the frame's range), so HWC output is byte-equal to
 * `ffmpeg -sws_flags <same> -pix_fmt rgb24`.
 *
 * CHW layouts are produced from an HWC scratch by a de-interleave (uint8) or
 * a conversion to v / 255.0f (float32, exactly like torch's uint8 / 255), so
 * all layouts agree value for value. The float kernel avoids the division
 * with a fused multiply-add correction where this CPU has FMA and the
 * converter found it exact for all 256 values (else it divides); from
 * 640x480 up (3.5 MB of floats a frame, past what stays in cache) it writes
 * with non-temporal stores (about 8% less CPU for 8-frame windows). Measured on 640x480 (bench_video):
 * converting to planar GBRP directly takes swscale's generic path, about
 * twice the time of rgb24 + de-interleave, and its values differ from the
 * rgb24 path; so CHW goes through the HWC scratch.
 *
 * Depth (gray12le) is copied as raw 12-bit codes into uint16.
 *
 * Streaming destinations (format->streaming, set by the loader for batch
 * memory): the CHW kernels use non-temporal stores when the three planes
 * are aligned for them. A batch column is far larger than the cache and is
 * written once per batch, so an ordinary store first reads each destination
 * line from memory (read for ownership) only to overwrite it; measured on
 * 640x480 float32 into a rotating 2 GB buffer, 0.23 -> 0.19 ms per frame
 * (into a cache-hot buffer non-temporal stores are slower, 0.126 -> 0.137
 * ms, hence the flag). The values written are the same either way.
 */
#include "video/video_internal.h"

#include <stdlib.h>
#include <string.h>

#include <libavutil/pixdesc.h>

void vf_video_format_defaults(vf_video_format *f)
{
    memset(f, 0, sizeof *f);
    f->layout = VF_VIDEO_RGB_HWC_U8;
    f->scaler = VF_VIDEO_SCALE_BILINEAR;
}

size_t vf_video_format_bytes(const vf_video_format *f, int src_width, int src_height)
{
    size_t w = (size_t)(f->width > 0 ? f->width : src_width);
    size_t h = (size_t)(f->height > 0 ? f->height : src_height);
    switch (f->layout) {
    case VF_VIDEO_RGB_HWC_U8:
    case VF_VIDEO_RGB_CHW_U8: return w * h * 3;
    case VF_VIDEO_RGB_CHW_F32: return w * h * 3 * sizeof(float);
    case VF_VIDEO_GRAY_U16: return w * h * sizeof(uint16_t);
    }
    return 0;
}

int vf_vid_sws_flags(vf_video_scaler scaler)
{
    switch (scaler) {
    case VF_VIDEO_SCALE_FAST_BILINEAR: return SWS_FAST_BILINEAR;
    case VF_VIDEO_SCALE_BICUBIC: return SWS_BICUBIC;
    case VF_VIDEO_SCALE_AREA: return SWS_AREA;
    case VF_VIDEO_SCALE_POINT: return SWS_POINT;
    case VF_VIDEO_SCALE_BILINEAR:
    default: return SWS_BILINEAR;
    }
}

static int float_kernel_exact(const float *lut);

void vf_vid_converter_init(vf_vid_converter *c)
{
    memset(c, 0, sizeof *c);
    for (int v = 0; v < 256; v++)
        c->lut[v] = (float)v / 255.0f;
    c->fma_exact = float_kernel_exact(c->lut);
}

void vf_vid_converter_free(vf_vid_converter *c)
{
    sws_freeContext(c->sws);
    free(c->scratch);
    c->sws = NULL;
    c->scratch = NULL;
    c->scratch_size = 0;
}

static int ensure_scratch(vf_vid_converter *c, size_t size)
{
    if (c->scratch_size >= size)
        return 0;
    uint8_t *p = vf_realloc(c->scratch, size);
    if (!p)
        return VF_ENOMEM;
    c->scratch = p;
    c->scratch_size = size;
    return 0;
}

/* swscale context for frame -> (dst_w, dst_h, dst_fmt), with the CLI's
 * colourspace handling. */
static int prepare_sws(vf_vid_converter *c, const AVFrame *frame, int dst_w, int dst_h, enum AVPixelFormat dst_fmt,
                       int flags, const char *name)
{
    c->sws = sws_getCachedContext(c->sws, frame->width, frame->height, frame->format, dst_w, dst_h, dst_fmt, flags,
                                  NULL, NULL, NULL);
    if (!c->sws) {
        const char *fmt_name = av_get_pix_fmt_name(frame->format);
        return vf_error(VF_EUNSUPPORTED, "%s: cannot convert %s %dx%d to %s %dx%d", name,
                        fmt_name ? fmt_name : "?", frame->width, frame->height, av_get_pix_fmt_name(dst_fmt),
                        dst_w, dst_h);
    }
    if (dst_fmt == AV_PIX_FMT_RGB24) {
        int *inv_table, *table, src_full, dst_full, brightness, contrast, saturation;
        if (sws_getColorspaceDetails(c->sws, &inv_table, &src_full, &table, &dst_full, &brightness, &contrast,
                                     &saturation) >= 0) {
            const int *coeffs = sws_getCoefficients(frame->colorspace);
            if (frame->color_range != AVCOL_RANGE_UNSPECIFIED)
                src_full = frame->color_range == AVCOL_RANGE_JPEG;
            sws_setColorspaceDetails(c->sws, coeffs, src_full, coeffs, dst_full, brightness, contrast, saturation);
        }
    }
    return 0;
}

static int to_rgb24(vf_vid_converter *c, const AVFrame *frame, int w, int h, int flags, uint8_t *dst,
                    const char *name)
{
    int rc = prepare_sws(c, frame, w, h, AV_PIX_FMT_RGB24, flags, name);
    if (rc < 0)
        return rc;
    size_t row = (size_t)w * 3;
    if (w % 16 == 0) {
        uint8_t *planes[4] = {dst, NULL, NULL, NULL};
        int strides[4] = {(int)row, 0, 0, 0};
        if (sws_scale(c->sws, (const uint8_t *const *)frame->data, frame->linesize, 0, frame->height, planes,
                      strides) != h)
            return vf_error(VF_ECORRUPT, "%s: pixel conversion failed", name);
        return 0;
    }
    /* swscale's SIMD rows work in blocks of 8-16 pixels: give it padded rows
     * and copy the exact width out. A row may be stored up to 16 pixels past
     * its width (valgrind: 8 bytes past a 100-pixel row rounded to 320 bytes,
     * with yuv420p frames from av_frame_get_buffer, as NVDEC downloads are),
     * hence 16 pixels of slack per row and 64 bytes after the last. */
    size_t padded = (row + 16 * 3 + 63) & ~(size_t)63;
    size_t hwc = (size_t)w * h * 3;
    size_t need = hwc + padded * (size_t)h + 64;
    /* The padded area lives after the first hwc bytes so a CHW caller's
     * scratch HWC (at offset 0) is not overwritten. */
    if (dst != c->scratch) {
        rc = ensure_scratch(c, need);
        if (rc < 0)
            return rc;
    } else {
        uint8_t *old = c->scratch;
        rc = ensure_scratch(c, need);
        if (rc < 0)
            return rc;
        dst = c->scratch + (dst - old);
    }
    uint8_t *tmp = c->scratch + hwc;
    uint8_t *planes[4] = {tmp, NULL, NULL, NULL};
    int strides[4] = {(int)padded, 0, 0, 0};
    if (sws_scale(c->sws, (const uint8_t *const *)frame->data, frame->linesize, 0, frame->height, planes, strides) !=
        h)
        return vf_error(VF_ECORRUPT, "%s: pixel conversion failed", name);
    for (int y = 0; y < h; y++)
        memcpy(dst + (size_t)y * row, tmp + (size_t)y * padded, row);
    return 0;
}

/* ---- HWC -> CHW ----
 * Scalar versions everywhere; on x86 an SSSE3 de-interleave (pshufb, 16
 * pixels per step, ~5x the scalar loop) and an AVX2 float path that divides
 * by 255.0f in vector registers (IEEE division is exactly rounded, so the
 * result equals the table lookup bit for bit; multiplying by 1/255 would
 * not). Chosen at run time from the CPU's features. */

static void chw_u8_scalar(const uint8_t *src, uint8_t *r, uint8_t *g, uint8_t *b, size_t from, size_t pixels)
{
    for (size_t i = from; i < pixels; i++) {
        r[i] = src[3 * i];
        g[i] = src[3 * i + 1];
        b[i] = src[3 * i + 2];
    }
}

static void chw_f32_scalar(const uint8_t *src, float *r, float *g, float *b, size_t from, size_t pixels,
                           const float *lut)
{
    for (size_t i = from; i < pixels; i++) {
        r[i] = lut[src[3 * i]];
        g[i] = lut[src[3 * i + 1]];
        b[i] = lut[src[3 * i + 2]];
    }
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define VF_VID_X86 1

/* Splits 16 RGB pixels (48 bytes) into 16 R, 16 G and 16 B bytes. */
__attribute__((target("ssse3"))) static inline void split16(const uint8_t *src, __m128i *r, __m128i *g, __m128i *b)
{
    const __m128i a = _mm_loadu_si128((const __m128i *)src);
    const __m128i m = _mm_loadu_si128((const __m128i *)(src + 16));
    const __m128i z = _mm_loadu_si128((const __m128i *)(src + 32));
    *r = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1,
                                                                      -1, -1, -1)),
                                   _mm_shuffle_epi8(m, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1,
                                                                     -1, -1, -1))),
                      _mm_shuffle_epi8(z, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13)));
    *g = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                      -1, -1, -1)),
                                   _mm_shuffle_epi8(m, _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1,
                                                                     -1, -1, -1))),
                      _mm_shuffle_epi8(z, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14)));
    *b = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1,
                                                                      -1, -1, -1)),
                                   _mm_shuffle_epi8(m, _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1,
                                                                     -1, -1, -1))),
                      _mm_shuffle_epi8(z, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15)));
}

/* The block loop of both kernels: whole 16-pixel blocks from src are split
 * into planes and each plane's 16 values stored by STORE(dst, vector);
 * `done` ends as the number of pixels done. A macro, not a function,
 * because the kernels are compiled for different instruction sets and
 * STORE must be inlined into each. */
#define CHW_BLOCKS(done, src, r, g, b, pixels, STORE)                                                \
    for (done = 0; done + 16 <= (pixels); done += 16) {                                              \
        __m128i vr, vg, vb;                                                                          \
        split16((src) + 3 * done, &vr, &vg, &vb);                                                    \
        STORE((r) + done, vr);                                                                       \
        STORE((g) + done, vg);                                                                       \
        STORE((b) + done, vb);                                                                       \
    }

/* 16 bytes stored as they are. */
__attribute__((target("ssse3"))) static inline void store16_u8(uint8_t *dst, __m128i v)
{
    _mm_storeu_si128((__m128i *)dst, v);
}

__attribute__((target("ssse3"))) static size_t chw_u8_ssse3(const uint8_t *src, uint8_t *r, uint8_t *g, uint8_t *b,
                                                             size_t pixels)
{
    size_t done;
    CHW_BLOCKS(done, src, r, g, b, pixels, store16_u8)
    return done;
}

/* 16 bytes stored past the cache (dst 16-byte aligned). */
__attribute__((target("ssse3"))) static inline void stream16_u8(uint8_t *dst, __m128i v)
{
    _mm_stream_si128((__m128i *)dst, v);
}

__attribute__((target("ssse3"))) static size_t chw_u8_ssse3_stream(const uint8_t *src, uint8_t *r, uint8_t *g,
                                                                    uint8_t *b, size_t pixels)
{
    size_t done;
    CHW_BLOCKS(done, src, r, g, b, pixels, stream16_u8)
    _mm_sfence(); /* the stores are weakly ordered: complete them before the batch is handed on */
    return done;
}

/* 16 bytes -> 16 floats v / 255.0f. */
__attribute__((target("avx2"))) static inline void store16_div255(float *dst, __m128i v)
{
    const __m256 k = _mm256_set1_ps(255.0f);
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    _mm256_storeu_ps(dst, _mm256_div_ps(lo, k));
    _mm256_storeu_ps(dst + 8, _mm256_div_ps(hi, k));
}

__attribute__((target("avx2,ssse3"))) static size_t chw_f32_avx2(const uint8_t *src, float *r, float *g, float *b,
                                                                 size_t pixels)
{
    size_t done;
    CHW_BLOCKS(done, src, r, g, b, pixels, store16_div255)
    return done;
}

/* As store16_div255, stored past the cache (dst 32-byte aligned). */
__attribute__((target("avx2"))) static inline void stream16_div255(float *dst, __m128i v)
{
    const __m256 k = _mm256_set1_ps(255.0f);
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    _mm256_stream_ps(dst, _mm256_div_ps(lo, k));
    _mm256_stream_ps(dst + 8, _mm256_div_ps(hi, k));
}

__attribute__((target("avx2,ssse3"))) static size_t chw_f32_avx2_stream(const uint8_t *src, float *r, float *g,
                                                                        float *b, size_t pixels)
{
    size_t done;
    CHW_BLOCKS(done, src, r, g, b, pixels, stream16_div255)
    _mm_sfence();
    return done;
}

/* Whether all three planes start on an `align`-byte boundary (then every
 * 16-pixel block's stores are aligned too: 16 bytes of uint8, 64 of float). */
static int planes_aligned(const void *r, const void *g, const void *b, uintptr_t align)
{
    return (((uintptr_t)r | (uintptr_t)g | (uintptr_t)b) & (align - 1)) == 0;
}
/* v / 255.0f without a division (vdivps is the kernel's bottleneck: ~5
 * cycles per 8 floats): q = v * (1/255), then one Newton step on the exact
 * residual, q + (v - 255 q) / 255, with fused multiply-adds. The result is
 * the correctly rounded quotient for every v in 0..255; the converter
 * checks that on this CPU before using it (fma_exact). */
__attribute__((target("avx2,fma"))) static inline __m256 div255_fma(__m256 v)
{
    const __m256 inv = _mm256_set1_ps(1.0f / 255.0f), k = _mm256_set1_ps(255.0f);
    __m256 q = _mm256_mul_ps(v, inv);
    __m256 residual = _mm256_fnmadd_ps(q, k, v);
    return _mm256_fmadd_ps(residual, inv, q);
}

__attribute__((target("avx2,fma,ssse3"))) static inline void store16_div255_fma(float *dst, __m128i v)
{
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    _mm256_storeu_ps(dst, div255_fma(lo));
    _mm256_storeu_ps(dst + 8, div255_fma(hi));
}

/* The same with non-temporal stores, for outputs too large to stay in
 * cache (32-byte aligned planes only). */
__attribute__((target("avx2,fma,ssse3"))) static inline void stream16_div255_fma(float *dst, __m128i v)
{
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    _mm256_stream_ps(dst, div255_fma(lo));
    _mm256_stream_ps(dst + 8, div255_fma(hi));
}

/* stream: non-temporal stores (the caller checked 32-byte aligned planes). */
__attribute__((target("avx2,fma,ssse3"))) static size_t chw_f32_fma(const uint8_t *src, float *r, float *g,
                                                                    float *b, size_t pixels, int stream)
{
    size_t done;
    if (stream) {
        CHW_BLOCKS(done, src, r, g, b, pixels, stream16_div255_fma)
        _mm_sfence();
    } else {
        CHW_BLOCKS(done, src, r, g, b, pixels, store16_div255_fma)
    }
    return done;
}

/* 1 when chw_f32_fma gives lut[v] bit for bit for all 256 values here. */
static int fma_kernel_exact(const float *lut)
{
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("ssse3"))
        return 0;
    uint8_t src[256 * 3];
    float out[256 * 3];
    for (int i = 0; i < 256 * 3; i++)
        src[i] = (uint8_t)(i / 3);
    if (chw_f32_fma(src, out, out + 256, out + 512, 256, 0) != 256)
        return 0;
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++)
            if (memcmp(&out[c * 256 + v], &lut[v], sizeof(float)) != 0)
                return 0;
    return 1;
}
#endif

/* Whether the division-free float kernel may be used here. */
static int float_kernel_exact(const float *lut)
{
#ifdef VF_VID_X86
    return fma_kernel_exact(lut);
#else
    (void)lut;
    return 0;
#endif
}

static void hwc_to_chw_u8(const uint8_t *src, uint8_t *dst, size_t pixels, int streaming)
{
    uint8_t *r = dst, *g = dst + pixels, *b = dst + 2 * pixels;
    size_t done = 0;
#ifdef VF_VID_X86
    if (__builtin_cpu_supports("ssse3"))
        done = streaming && planes_aligned(r, g, b, 16) ? chw_u8_ssse3_stream(src, r, g, b, pixels)
                                                        : chw_u8_ssse3(src, r, g, b, pixels);
#else
    (void)streaming;
#endif
    chw_u8_scalar(src, r, g, b, done, pixels);
}

/* streaming: the frame goes into batch memory (non-temporal stores where the
 * planes are aligned); frames of 256K pixels and more stream in any case. */
static void hwc_to_chw_f32(const uint8_t *src, float *dst, size_t pixels, const float *lut, int fma_exact,
                           int streaming)
{
    float *r = dst, *g = dst + pixels, *b = dst + 2 * pixels;
    size_t done = 0;
#ifdef VF_VID_X86
    int stream = (streaming || pixels >= 256 * 1024) && planes_aligned(r, g, b, 32);
    if (fma_exact)
        done = chw_f32_fma(src, r, g, b, pixels, stream);
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("ssse3"))
        done = stream ? chw_f32_avx2_stream(src, r, g, b, pixels) : chw_f32_avx2(src, r, g, b, pixels);
#else
    (void)fma_exact;
    (void)streaming;
#endif
    chw_f32_scalar(src, r, g, b, done, pixels, lut);
}

static int to_gray16(vf_vid_converter *c, const AVFrame *frame, int w, int h, int flags, uint16_t *dst,
                     const char *name)
{
    if (w == frame->width && h == frame->height) {
        size_t row = (size_t)w * sizeof(uint16_t);
        for (int y = 0; y < h; y++)
            memcpy((uint8_t *)dst + (size_t)y * row, frame->data[0] + (size_t)y * frame->linesize[0], row);
        return 0;
    }
    int rc = prepare_sws(c, frame, w, h, frame->format, flags, name);
    if (rc < 0)
        return rc;
    uint8_t *planes[4] = {(uint8_t *)dst, NULL, NULL, NULL};
    int strides[4] = {w * (int)sizeof(uint16_t), 0, 0, 0};
    if (sws_scale(c->sws, (const uint8_t *const *)frame->data, frame->linesize, 0, frame->height, planes, strides) !=
        h)
        return vf_error(VF_ECORRUPT, "%s: depth resize failed", name);
    return 0;
}

int vf_vid_convert(vf_vid_converter *c, const AVFrame *frame, const vf_video_format *format, void *dest,
                   const char *name)
{
    int w = format->width > 0 ? format->width : frame->width;
    int h = format->height > 0 ? format->height : frame->height;
    int flags = vf_vid_sws_flags(format->scaler);
    vf_video_pixfmt pf = vf_vid_pixfmt_from_av(frame->format);
    const char *fmt_name = av_get_pix_fmt_name(frame->format);
    if (pf == VF_VIDEO_PIX_UNKNOWN)
        return vf_error(VF_EUNSUPPORTED, "%s: decoder produced unsupported pixel format %s", name,
                        fmt_name ? fmt_name : "?");
    if (format->layout == VF_VIDEO_GRAY_U16) {
        if (pf != VF_VIDEO_PIX_GRAY12)
            return vf_error(VF_EINVAL, "%s: 16-bit gray output requested from a %s (colour) stream", name, fmt_name);
        return to_gray16(c, frame, w, h, flags, dest, name);
    }
    if (pf == VF_VIDEO_PIX_GRAY12)
        return vf_error(VF_EINVAL, "%s: RGB output requested from a gray12le (depth) stream; use 16-bit gray output",
                        name);
    if (format->layout == VF_VIDEO_RGB_HWC_U8)
        return to_rgb24(c, frame, w, h, flags, dest, name);

    size_t pixels = (size_t)w * h;
    int rc = ensure_scratch(c, pixels * 3);
    if (rc < 0)
        return rc;
    rc = to_rgb24(c, frame, w, h, flags, c->scratch, name);
    if (rc < 0)
        return rc;
    if (format->layout == VF_VIDEO_RGB_CHW_U8)
        hwc_to_chw_u8(c->scratch, dest, pixels, format->streaming);
    else
        hwc_to_chw_f32(c->scratch, dest, pixels, c->lut, c->fma_exact, format->streaming);
    return 0;
}
