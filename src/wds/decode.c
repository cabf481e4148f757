/*
 * decode.c: field decoders for WebDataset members.
 *
 *  - JPEG: libjpeg-turbo through its TurboJPEG API, RGB output, default
 *    flags: the accurate integer IDCT (JDCT_ISLOW) and fancy upsampling,
 *    which is what PIL's decoder uses, so the pixels match PIL's.
 *  - PNG: libpng's simplified API to 8-bit RGB (palette and gray expanded,
 *    1, 2 and 4-bit samples scaled to 8 bits, alpha dropped). 16-bit PNGs
 *    (depth maps) are not decoded here: the loader hands their bytes to
 *    the caller.
 *  - Resize: a JPEG much larger than the target is decoded at one of
 *    libjpeg-turbo's scaling factors (1/2, 1/4, 1/8: the IDCT scales in the
 *    frequency domain, so a 1/8 decode needs a 64x smaller buffer), the
 *    smallest that keeps twice the target (vf_wds_decode_size), then
 *    libswscale (area filter) takes it to the target.
 *  - Budgets: an image's dimensions are read from its header (TurboJPEG's,
 *    or the PNG IHDR) and checked against a pixel budget before its buffer
 *    is allocated; a .npz member's size comes from its zip headers (the
 *    central directory) and is checked before it is inflated.
 *  - .npy: parsed by hand. The format is a magic string, a version, a
 *    header length and a Python dict literal with three keys, followed by
 *    the raw array; no C library for it is packaged on this platform (cnpy
 *    and libnpy are C++), and the header is a few dozen lines to parse.
 *  - .npz: a zip of .npy members (np.savez stores, np.savez_compressed
 *    deflates; numpy writes zip64 extras), read with libarchive's zip
 *    reader from memory, which checks each member's CRC-32.
 */
#include <archive.h>
#include <archive_entry.h>
#include <libswscale/swscale.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "wds/wds.h"

/* ---- .npy ------------------------------------------------------------------ */

static const char *skip_space(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Finds 'key': in the header and returns the position of the value after
 * the colon, or NULL when there is none (the header ends there): callers
 * read *p without checking it against the end. */
static const char *find_key(const char *h, const char *end, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = h; p + k + 2 < end; p++) {
        if ((*p == '\'' || *p == '"') && memcmp(p + 1, key, k) == 0 && p[k + 1] == *p) {
            const char *q = skip_space(p + k + 2, end);
            if (q < end && *q == ':') {
                q = skip_space(q + 1, end);
                return q < end ? q : NULL;
            }
        }
    }
    return NULL;
}

static int npy_itemsize(const char *descr, int *itemsize)
{
    /* byte order, kind, size */
    if (strlen(descr) != 3)
        return VF_EUNSUPPORTED;
    char order = descr[0], kind = descr[1], size = descr[2];
    if (size < '1' || size > '8')
        return VF_EUNSUPPORTED;
    int n = size - '0';
    if (n != 1 && n != 2 && n != 4 && n != 8)
        return VF_EUNSUPPORTED;
    if (!strchr("biuf", kind) || (kind == 'b' && n != 1) || (kind == 'f' && n == 1))
        return VF_EUNSUPPORTED;
    /* big-endian data would need swapping: leave it to numpy */
    if (order == '>' && n > 1)
        return VF_EUNSUPPORTED;
    if (order != '<' && order != '|' && order != '=' && order != '>')
        return VF_EUNSUPPORTED;
    *itemsize = n;
    return 0;
}

int vf_wds_parse_npy(const uint8_t *data, size_t size, vf_wds_array *out)
{
    memset(out, 0, sizeof *out);
    if (size < 10 || memcmp(data, "\x93NUMPY", 6) != 0)
        return vf_error(VF_ECORRUPT, "not a .npy document (bad magic)");
    int major = data[6];
    size_t header_len, start;
    if (major == 1) {
        header_len = (size_t)data[8] | (size_t)data[9] << 8;
        start = 10;
    } else if (major == 2 || major == 3) {
        if (size < 12)
            return vf_error(VF_ECORRUPT, ".npy header truncated");
        header_len = (size_t)data[8] | (size_t)data[9] << 8 | (size_t)data[10] << 16 | (size_t)data[11] << 24;
        start = 12;
    } else {
        return vf_error(VF_EUNSUPPORTED, ".npy format version %d", major);
    }
    if (header_len > size - start)
        return vf_error(VF_ECORRUPT, ".npy header length %zu past the end (%zu bytes)", header_len, size);
    const char *h = (const char *)data + start, *end = h + header_len;
    const char *p = find_key(h, end, "descr");
    if (!p || (*p != '\'' && *p != '"'))
        return p && *p == '[' ? vf_error(VF_EUNSUPPORTED, ".npy structured dtype")
                              : vf_error(VF_ECORRUPT, ".npy header without a descr string");
    const char *q = memchr(p + 1, *p, (size_t)(end - p - 1));
    if (!q || q - p - 1 >= (ptrdiff_t)sizeof out->descr)
        return vf_error(q ? VF_EUNSUPPORTED : VF_ECORRUPT, ".npy descr %s", q ? "not a simple dtype" : "unterminated");
    memcpy(out->descr, p + 1, (size_t)(q - p - 1));
    p = find_key(h, end, "fortran_order");
    if (!p)
        return vf_error(VF_ECORRUPT, ".npy header without fortran_order");
    if (end - p >= 4 && memcmp(p, "True", 4) == 0)
        return vf_error(VF_EUNSUPPORTED, ".npy in Fortran order");
    if (end - p < 5 || memcmp(p, "False", 5) != 0)
        return vf_error(VF_ECORRUPT, ".npy fortran_order is neither True nor False");
    p = find_key(h, end, "shape");
    if (!p || *p != '(')
        return vf_error(VF_ECORRUPT, ".npy header without a shape tuple");
    p++;
    uint64_t count = 1;
    for (;;) {
        p = skip_space(p, end);
        if (p >= end)
            return vf_error(VF_ECORRUPT, ".npy shape unterminated");
        if (*p == ')')
            break;
        if (*p < '0' || *p > '9')
            return vf_error(VF_ECORRUPT, ".npy shape holds a non-integer");
        uint64_t dim = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            dim = dim * 10 + (uint64_t)(*p - '0');
            if (dim > ((uint64_t)1 << 40))
                return vf_error(VF_ECORRUPT, ".npy dimension too large");
            p++;
        }
        if (out->ndim == 8)
            return vf_error(VF_EUNSUPPORTED, ".npy with more than 8 dimensions");
        out->shape[out->ndim++] = (int64_t)dim;
        if (dim && count > ((uint64_t)1 << 40) / dim)
            return vf_error(VF_ECORRUPT, ".npy shape too large");
        count *= dim;
        p = skip_space(p, end);
        if (p < end && *p == ',')
            p++;
        else if (p < end && *p != ')')
            return vf_error(VF_ECORRUPT, ".npy shape malformed");
    }
    int rc = npy_itemsize(out->descr, &out->itemsize);
    if (rc < 0)
        return vf_error(rc, ".npy dtype %s is decoded by numpy, not here", out->descr);
    uint64_t nbytes = count * (uint64_t)out->itemsize;
    size_t offset = start + header_len;
    if (nbytes > size - offset)
        return vf_error(VF_ECORRUPT, ".npy data truncated: %llu bytes needed, %zu present",
                        (unsigned long long)nbytes, size - offset);
    out->data = data + offset;
    out->nbytes = (size_t)nbytes;
    return 0;
}

/* ---- .npz ------------------------------------------------------------------ */

void vf_wds_npz_free(vf_wds_npz *z)
{
    for (size_t i = 0; i < z->count; i++) {
        free(z->names[i]);
        free(z->storage[i]);
    }
    free(z->names);
    free(z->storage);
    free(z->arrays);
    free(z->sizes);
    free(z->parsed);
    memset(z, 0, sizeof *z);
}

static int npz_grow(vf_wds_npz *z, size_t *cap)
{
    if (z->count < *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 8;
    char **names = vf_realloc(z->names, n * sizeof *names);
    if (names)
        z->names = names;
    uint8_t **storage = names ? vf_realloc(z->storage, n * sizeof *storage) : NULL;
    if (storage)
        z->storage = storage;
    vf_wds_array *arrays = storage ? vf_realloc(z->arrays, n * sizeof *arrays) : NULL;
    if (arrays)
        z->arrays = arrays;
    size_t *sizes = arrays ? vf_realloc(z->sizes, n * sizeof *sizes) : NULL;
    if (sizes)
        z->sizes = sizes;
    int *parsed = sizes ? vf_realloc(z->parsed, n * sizeof *parsed) : NULL;
    if (!parsed)
        return VF_ENOMEM;
    z->parsed = parsed;
    *cap = n;
    return 0;
}

int vf_wds_read_npz(const uint8_t *data, size_t size, vf_wds_npz *out)
{
    return vf_wds_read_npz_limited(data, size, VF_WDS_DEFAULT_MAX_MEMBER_BYTES, out);
}

int vf_wds_read_npz_limited(const uint8_t *data, size_t size, int64_t max_bytes, vf_wds_npz *out)
{
    memset(out, 0, sizeof *out);
    int64_t total = 0;
    struct archive *a = archive_read_new();
    if (!a)
        return VF_ENOMEM;
    archive_read_support_format_zip_seekable(a);
    int rc = 0;
    size_t cap = 0;
    if (archive_read_open_memory(a, data, size) != ARCHIVE_OK) {
        rc = vf_error(VF_ECORRUPT, "npz: %s", archive_error_string(a) ? archive_error_string(a) : "not a zip");
        goto done;
    }
    for (;;) {
        struct archive_entry *entry = NULL;
        int ar = archive_read_next_header(a, &entry);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar < ARCHIVE_WARN) {
            rc = vf_error(VF_ECORRUPT, "npz: %s", archive_error_string(a) ? archive_error_string(a) : "bad zip entry");
            goto done;
        }
        const char *name = archive_entry_pathname(entry);
        if (!name)
            name = "";
        int64_t esize = archive_entry_size_is_set(entry) ? archive_entry_size(entry) : -1;
        if (esize < 0) {
            rc = vf_error(VF_ECORRUPT, "npz member %s: size unknown", name);
            goto done;
        }
        /* what the zip headers declare, before a byte is inflated (reading
         * more than declared fails below: "longer than its header says") */
        if (esize > max_bytes - total) {
            rc = vf_error(VF_ERANGE, "npz member %s: inflates to %lld bytes (the npz's arrays: %lld), above "
                          "max_member_bytes %lld",
                          name, (long long)esize, (long long)(total + esize), (long long)max_bytes);
            goto done;
        }
        total += esize;
        if ((rc = npz_grow(out, &cap)) < 0)
            goto done;
        size_t n = strlen(name);
        size_t keep = n >= 4 && strcmp(name + n - 4, ".npy") == 0 ? n - 4 : n;
        uint8_t *buf = vf_malloc(esize ? (size_t)esize : 1);
        char *short_name = vf_strndup(name, keep);
        if (!buf || !short_name) {
            free(buf);
            free(short_name);
            rc = VF_ENOMEM;
            goto done;
        }
        size_t got = 0;
        while (got < (size_t)esize) {
            la_ssize_t r = archive_read_data(a, buf + got, (size_t)esize - got);
            if (r <= 0) {
                rc = vf_error(VF_ECORRUPT, "npz member %s: %s", name,
                              r < 0 && archive_error_string(a) ? archive_error_string(a) : "truncated data");
                break;
            }
            got += (size_t)r;
        }
        /* reading past the end checks the CRC of the whole member */
        if (rc == 0) {
            uint8_t extra;
            la_ssize_t r = archive_read_data(a, &extra, 1);
            if (r != 0)
                rc = vf_error(VF_ECORRUPT, "npz member %s: %s", name,
                              r < 0 && archive_error_string(a) ? archive_error_string(a) : "longer than its header says");
        }
        out->names[out->count] = short_name;
        out->storage[out->count] = buf;
        out->sizes[out->count] = (size_t)esize;
        out->parsed[out->count] = 0;
        memset(&out->arrays[out->count], 0, sizeof out->arrays[0]);
        out->count++;
        if (rc < 0)
            goto done;
        int pr = vf_wds_parse_npy(buf, (size_t)esize, &out->arrays[out->count - 1]);
        if (pr == VF_EUNSUPPORTED) {
            out->parsed[out->count - 1] = 0;
        } else if (pr < 0) {
            rc = vf_error_context(pr, "npz member %s", name);
            goto done;
        } else {
            out->parsed[out->count - 1] = 1;
        }
    }
done:
    archive_read_free(a);
    if (rc < 0)
        vf_wds_npz_free(out);
    return rc;
}

/* ---- images ---------------------------------------------------------------- */

static int is_png(const uint8_t *data, size_t size)
{
    return size >= 8 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
}

int vf_wds_png_bit_depth(const uint8_t *data, size_t size)
{
    return is_png(data, size) && size >= 29 ? data[24] : -1;
}

int vf_wds_image_size(const uint8_t *data, size_t size, int *width, int *height)
{
    if (is_png(data, size)) {
        if (size < 24 || memcmp(data + 12, "IHDR", 4) != 0)
            return vf_error(VF_ECORRUPT, "PNG without an IHDR chunk");
        uint32_t w = (uint32_t)data[16] << 24 | (uint32_t)data[17] << 16 | (uint32_t)data[18] << 8 | data[19];
        uint32_t h = (uint32_t)data[20] << 24 | (uint32_t)data[21] << 16 | (uint32_t)data[22] << 8 | data[23];
        if (w == 0 || h == 0 || w > 65535 || h > 65535)
            return vf_error(VF_ECORRUPT, "PNG size %ux%u out of range", w, h);
        *width = (int)w;
        *height = (int)h;
        return 0;
    }
    tjhandle tj = tjInitDecompress();
    if (!tj)
        return VF_ENOMEM;
    int subsamp = 0, colorspace = 0;
    int r = size > 0x7fffffff ? -1 : tjDecompressHeader3(tj, data, (unsigned long)size, width, height, &subsamp, &colorspace);
    int rc = r < 0 ? vf_error(VF_ECORRUPT, "not a JPEG or PNG image: %s", tjGetErrorStr2(tj)) : 0;
    if (rc == 0 && (*width <= 0 || *height <= 0 || *width > 65535 || *height > 65535))
        rc = vf_error(VF_ECORRUPT, "JPEG size %dx%d out of range", *width, *height);
    tjDestroy(tj);
    return rc;
}

static int decode_png(const uint8_t *data, size_t size, int width, int height, uint8_t *rgb)
{
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, data, size))
        return vf_error(VF_ECORRUPT, "PNG: %s", image.message);
    if ((int)image.width != width || (int)image.height != height) {
        png_image_free(&image);
        return vf_error(VF_ECORRUPT, "PNG: size changed between header and decode");
    }
    image.format = PNG_FORMAT_RGB;
    if (!png_image_finish_read(&image, NULL, rgb, 0, NULL)) {
        int rc = vf_error(VF_ECORRUPT, "PNG: %s", image.message);
        png_image_free(&image);
        return rc;
    }
    return 0;
}

static int decode_rgb(void **tj_handle, const uint8_t *data, size_t size, int width, int height, uint8_t *rgb)
{
    if (is_png(data, size))
        return decode_png(data, size, width, height, rgb);
    tjhandle tj = tj_handle ? *tj_handle : NULL;
    if (!tj) {
        tj = tjInitDecompress();
        if (!tj)
            return VF_ENOMEM;
        if (tj_handle)
            *tj_handle = tj;
    }
    int rc = 0;
    /* libjpeg's warnings (premature end of data, corrupt entropy data)
     * fail too: the image would be partly gray, and PIL refuses a truncated
     * JPEG as well */
    if (tjDecompress2(tj, data, (unsigned long)size, rgb, width, 0, height, TJPF_RGB, 0) < 0)
        rc = vf_error(VF_ECORRUPT, "JPEG: %s", tjGetErrorStr2(tj));
    if (!tj_handle)
        tjDestroy(tj);
    return rc;
}

static int resize_rgb(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh)
{
    struct SwsContext *sws = sws_getContext(sw, sh, AV_PIX_FMT_RGB24, dw, dh, AV_PIX_FMT_RGB24, SWS_AREA, NULL,
                                            NULL, NULL);
    if (!sws)
        return vf_error(VF_ENOMEM, "swscale: no context for %dx%d -> %dx%d", sw, sh, dw, dh);
    const uint8_t *src_planes[4] = {src, NULL, NULL, NULL};
    int src_strides[4] = {sw * 3, 0, 0, 0};
    uint8_t *dst_planes[4] = {dst, NULL, NULL, NULL};
    int dst_strides[4] = {dw * 3, 0, 0, 0};
    sws_scale(sws, src_planes, src_strides, 0, sh, dst_planes, dst_strides);
    sws_freeContext(sws);
    return 0;
}

void vf_wds_decode_size(const uint8_t *data, size_t size, int sw, int sh, int width, int height, int *decode_w,
                        int *decode_h)
{
    *decode_w = sw;
    *decode_h = sh;
    if (is_png(data, size) || width <= 0 || height <= 0 || (width >= sw && height >= sh))
        return;
    /* Only 1/2, 1/4 and 1/8 (libjpeg-turbo's SIMD reduced IDCTs; 1/8 is
     * the exact 8x8 block mean), and only down to twice the target, so the
     * area filter still averages 2x2 or more decoded pixels per output
     * pixel: measured against the full decode + area resize, the mean
     * difference stays under 0.6 levels on photo-like content and under 4
     * on JPEG'd uniform noise (the tolerance test_wds_read.py allows
     * against PIL). Decoding straight to the target differs by up to 12 on
     * noise: the reduced IDCT drops the frequencies a box filter aliases. */
    int count = 0;
    tjscalingfactor *factors = tjGetScalingFactors(&count);
    for (int i = 0; factors && i < count; i++) {
        tjscalingfactor f = factors[i];
        if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8))
            continue;
        int w = TJSCALED(sw, f), h = TJSCALED(sh, f);
        if (w >= 2 * (int64_t)width && h >= 2 * (int64_t)height && (int64_t)w * h < (int64_t)*decode_w * *decode_h) {
            *decode_w = w;
            *decode_h = h;
        }
    }
}

int vf_wds_decode_image_with(void **tj_handle, const uint8_t *data, size_t size, int width, int height,
                             int float_chw, int64_t max_pixels, void *out)
{
    int sw = 0, sh = 0;
    int rc = vf_wds_image_size(data, size, &sw, &sh);
    if (rc < 0)
        return rc;
    if ((int64_t)sw * sh > max_pixels)
        return vf_error(VF_ERANGE, "image %dx%d is %lld pixels, above max_image_pixels %lld", sw, sh,
                        (long long)sw * sh, (long long)max_pixels);
    if (width <= 0 || height <= 0) {
        width = sw;
        height = sh;
    }
    /* a JPEG comes out of the codec at (dw, dh): its own size, or scaled
     * down towards the target */
    int dw, dh;
    vf_wds_decode_size(data, size, sw, sh, width, height, &dw, &dh);
    int direct = !float_chw && dw == width && dh == height;
    uint8_t *decoded = direct ? out : vf_malloc_array((size_t)dw * (size_t)dh, 3);
    uint8_t *resized = NULL;
    if (!decoded)
        return VF_ENOMEM;
    rc = decode_rgb(tj_handle, data, size, dw, dh, decoded);
    const uint8_t *rgb = decoded;
    if (rc == 0 && (dw != width || dh != height)) {
        resized = float_chw ? vf_malloc_array((size_t)width * (size_t)height, 3) : out;
        rc = resized ? resize_rgb(decoded, dw, dh, resized, width, height) : VF_ENOMEM;
        rgb = resized;
    }
    if (rc == 0 && float_chw) {
        float *f = out;
        size_t plane = (size_t)width * (size_t)height;
        for (size_t i = 0; i < plane; i++) {
            f[i] = rgb[3 * i] * (1.0f / 255.0f);
            f[plane + i] = rgb[3 * i + 1] * (1.0f / 255.0f);
            f[2 * plane + i] = rgb[3 * i + 2] * (1.0f / 255.0f);
        }
    }
    if (!direct)
        free(decoded);
    if (float_chw)
        free(resized);
    return rc;
}

int vf_wds_decode_image(const uint8_t *data, size_t size, int width, int height, int float_chw, void *out)
{
    return vf_wds_decode_image_with(NULL, data, size, width, height, float_chw, VF_WDS_DEFAULT_MAX_IMAGE_PIXELS,
                                    out);
}

void vf_wds_jpeg_handle_free(void *tj_handle)
{
    if (tj_handle)
        tjDestroy(tj_handle);
}
