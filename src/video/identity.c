/*
 * identity.c: frame identity stamps, so tests can prove that the pixels
 * returned for (episode, frame, camera) are that frame's pixels.
 *
 * A stamp is 72 bits: episode (24) | frame (24) | camera (8) | CRC-16
 * (CCITT, over the first 7 bytes), XORed with a fixed pattern so that no
 * identity paints a nearly uniform picture. Each bit is one cell of a 9 x 8
 * grid covering the image, black (0) or white (255) in all three channels:
 * luma only, so 4:2:0 chroma subsampling cannot touch it. Cells are at least
 * 2 x 2 pixels and are read from their central half (a quarter of the cell
 * inset on each side), which survives lossy coding (AV1 crf 30, H.264) and
 * resizing: compression disturbs block edges, not block centres.
 *
 * A read fails (VF_ECORRUPT) when any cell's mean is ambiguous or the CRC
 * does not match, so a wrong or damaged frame is detected, not misread.
 */
#include "video/video.h"

#include <string.h>

#define ID_COLS 9
#define ID_ROWS 8
#define ID_BYTES 9
#define ID_LOW 80   /* a cell mean at or below this is 0 */
#define ID_HIGH 176 /* at or above this is 1; in between is ambiguous */

static const uint8_t id_whitening[ID_BYTES] = {0xA5, 0x3C, 0x96, 0x5A, 0xC3, 0x69, 0x0F, 0x5A, 0xA5};

static uint16_t crc16_ccitt(const uint8_t *data, size_t len)
{
    uint16_t crc = 0xFFFF;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(data[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

static void cell_rect(int w, int h, int cell, int *x0, int *y0, int *x1, int *y1)
{
    int col = cell % ID_COLS, row = cell / ID_COLS;
    *x0 = col * w / ID_COLS;
    *x1 = (col + 1) * w / ID_COLS;
    *y0 = row * h / ID_ROWS;
    *y1 = (row + 1) * h / ID_ROWS;
}

static int check_image(const void *rgb, int w, int h, size_t stride)
{
    if (!rgb || w < VF_VIDEO_IDENTITY_MIN_WIDTH || h < VF_VIDEO_IDENTITY_MIN_HEIGHT || stride < (size_t)w * 3)
        return vf_error(VF_EINVAL, "identity stamp: image %dx%d (stride %zu) is too small; at least %dx%d needed", w,
                        h, stride, VF_VIDEO_IDENTITY_MIN_WIDTH, VF_VIDEO_IDENTITY_MIN_HEIGHT);
    return 0;
}

int vf_video_stamp_identity(uint8_t *rgb, int w, int h, size_t stride, int64_t episode, int64_t frame, int camera)
{
    int r = check_image(rgb, w, h, stride);
    if (r < 0)
        return r;
    if (episode < 0 || episode > VF_VIDEO_IDENTITY_MAX_EPISODE || frame < 0 || frame > VF_VIDEO_IDENTITY_MAX_FRAME ||
        camera < 0 || camera > VF_VIDEO_IDENTITY_MAX_CAMERA)
        return vf_error(VF_ERANGE, "identity stamp: (episode %lld, frame %lld, camera %d) out of range", (long long)episode,
                        (long long)frame, camera);
    uint8_t bytes[ID_BYTES] = {
        (uint8_t)(episode >> 16), (uint8_t)(episode >> 8), (uint8_t)episode, (uint8_t)(frame >> 16),
        (uint8_t)(frame >> 8),    (uint8_t)frame,          (uint8_t)camera,  0,
        0,
    };
    uint16_t crc = crc16_ccitt(bytes, 7);
    bytes[7] = (uint8_t)(crc >> 8);
    bytes[8] = (uint8_t)crc;
    for (int i = 0; i < ID_BYTES; i++)
        bytes[i] ^= id_whitening[i];
    for (int cell = 0; cell < ID_COLS * ID_ROWS; cell++) {
        int bit = (bytes[cell / 8] >> (7 - cell % 8)) & 1;
        uint8_t v = bit ? 255 : 0;
        int x0, y0, x1, y1;
        cell_rect(w, h, cell, &x0, &y0, &x1, &y1);
        for (int y = y0; y < y1; y++)
            memset(rgb + (size_t)y * stride + (size_t)x0 * 3, v, (size_t)(x1 - x0) * 3);
    }
    return 0;
}

int vf_video_read_identity(const uint8_t *rgb, int w, int h, size_t stride, int64_t *episode, int64_t *frame,
                           int *camera)
{
    *episode = -1;
    *frame = -1;
    *camera = -1;
    int r = check_image(rgb, w, h, stride);
    if (r < 0)
        return r;
    uint8_t bytes[ID_BYTES] = {0};
    for (int cell = 0; cell < ID_COLS * ID_ROWS; cell++) {
        int x0, y0, x1, y1;
        cell_rect(w, h, cell, &x0, &y0, &x1, &y1);
        int insetx = (x1 - x0) / 4, insety = (y1 - y0) / 4;
        x0 += insetx;
        x1 -= insetx;
        y0 += insety;
        y1 -= insety;
        uint64_t sum = 0, n = 0;
        for (int y = y0; y < y1; y++) {
            const uint8_t *p = rgb + (size_t)y * stride + (size_t)x0 * 3;
            for (int x = x0; x < x1; x++, p += 3) {
                sum += (uint64_t)p[0] + p[1] + p[2];
                n += 3;
            }
        }
        unsigned mean = n ? (unsigned)(sum / n) : 128;
        if (mean > ID_LOW && mean < ID_HIGH)
            return vf_error(VF_ECORRUPT, "identity stamp: block %d (row %d, column %d) is ambiguous (mean %u)", cell,
                            cell / ID_COLS, cell % ID_COLS, mean);
        if (mean >= ID_HIGH)
            bytes[cell / 8] |= (uint8_t)(1u << (7 - cell % 8));
    }
    for (int i = 0; i < ID_BYTES; i++)
        bytes[i] ^= id_whitening[i];
    uint16_t crc = crc16_ccitt(bytes, 7);
    if (bytes[7] != (uint8_t)(crc >> 8) || bytes[8] != (uint8_t)crc)
        return vf_error(VF_ECORRUPT, "identity stamp: checksum mismatch (not a stamped frame, or damaged)");
    *episode = ((int64_t)bytes[0] << 16) | ((int64_t)bytes[1] << 8) | bytes[2];
    *frame = ((int64_t)bytes[3] << 16) | ((int64_t)bytes[4] << 8) | bytes[5];
    *camera = bytes[6];
    return 0;
}
