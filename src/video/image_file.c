/*
 * image_file.c: vf_image_write, single RGB images to PNG (FFmpeg's png
 * encoder: no hand-written deflate/CRC) or binary PPM, for `vlafeed frame`.
 */
#include <libavcodec/avcodec.h>
#include <libavutil/imgutils.h>
#include <stdio.h>
#include <string.h>

#include "video/video.h"

static int write_bytes(const char *path, const void *head, size_t head_len, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return vf_error(VF_EIO, "%s: cannot create: %s", path, strerror(errno));
    int ok = (!head_len || fwrite(head, 1, head_len, f) == head_len) && fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : vf_error(VF_EIO, "%s: write failed", path);
}

static int write_png(const char *path, const uint8_t *rgb, int width, int height)
{
    const AVCodec *codec = avcodec_find_encoder(AV_CODEC_ID_PNG);
    if (!codec)
        return vf_error(VF_EUNSUPPORTED, "%s: this FFmpeg has no PNG encoder (write .ppm instead)", path);
    AVCodecContext *ctx = avcodec_alloc_context3(codec);
    AVFrame *frame = av_frame_alloc();
    AVPacket *pkt = av_packet_alloc();
    int r = (!ctx || !frame || !pkt) ? vf_error(VF_ENOMEM, "%s: out of memory", path) : 0;
    if (r == 0) {
        ctx->width = width;
        ctx->height = height;
        ctx->pix_fmt = AV_PIX_FMT_RGB24;
        ctx->time_base = (AVRational){1, 1};
        frame->width = width;
        frame->height = height;
        frame->format = AV_PIX_FMT_RGB24;
        /* The encoder only reads the frame: point it at the caller's rows. */
        frame->data[0] = (uint8_t *)rgb;
        frame->linesize[0] = width * 3;
        if (avcodec_open2(ctx, codec, NULL) < 0 || avcodec_send_frame(ctx, frame) < 0 ||
            avcodec_send_frame(ctx, NULL) < 0 || avcodec_receive_packet(ctx, pkt) < 0)
            r = vf_error(VF_EIO, "%s: PNG encoding failed", path);
        else
            r = write_bytes(path, NULL, 0, pkt->data, (size_t)pkt->size);
    }
    frame->data[0] = NULL;
    av_packet_free(&pkt);
    av_frame_free(&frame);
    avcodec_free_context(&ctx);
    return r;
}

int vf_image_write(const char *path, const uint8_t *rgb, int width, int height)
{
    if (width <= 0 || height <= 0 || width > 65535 || height > 65535)
        return vf_error(VF_EINVAL, "%s: bad image size %dx%d", path, width, height);
    size_t n = strlen(path);
    if (n >= 4 && !strcmp(path + n - 4, ".png"))
        return write_png(path, rgb, width, height);
    if (n >= 4 && !strcmp(path + n - 4, ".ppm")) {
        char head[64];
        int len = snprintf(head, sizeof head, "P6\n%d %d\n255\n", width, height);
        return write_bytes(path, head, (size_t)len, rgb, (size_t)width * (size_t)height * 3);
    }
    return vf_error(VF_EINVAL, "%s: the output name must end in .png or .ppm", path);
}
