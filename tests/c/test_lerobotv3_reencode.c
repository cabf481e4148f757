/*
 * test_lerobotv3_reencode.c: re-encoding for `convert --codec`
 * (vf_video_transcode in src/video/encode.c, vf_lr3_reencode_resolve and
 * vf_video_encoder_check as the converter uses them).
 *
 *  - a LeRobot-style concatenated AV1 file (its timestamp gaps included)
 *    re-encoded to H.264: the same frame count, every frame at the same
 *    presentation time to the tick, keyframes every gop frames, quality
 *    measured on every frame, each frame still carrying its identity stamp;
 *  - a frame count that disagrees, a corrupt source: errors naming the
 *    source, no output file left;
 *  - option defaults and refusals, an encoder made to look missing.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "lerobotv3/lerobotv3.h"
#include "test_video_helpers.h"

static int transcode_file(const char *in, const char *out, vf_video_codec codec, int gop, int64_t expected,
                          vf_video_transcode_report *rep)
{
    vf_video_encode_settings s;
    vf_video_encode_defaults(&s);
    s.codec = codec;
    s.gop = gop;
    s.crf = 18;
    s.b_frames = codec == VF_VIDEO_CODEC_AV1 ? -1 : 0;
    s.x26x_preset = "ultrafast";
    vf_source *src = NULL;
    int r = vf_source_open_file(&src, in);
    if (r < 0)
        return r;
    r = vf_video_transcode(src, out, &s, expected, NULL, NULL, rep);
    vf_source_close(src);
    return r;
}

static void test_times_kept(const char *dir)
{
    const int64_t lengths[2] = {13, 7}; /* 13 frames at 30 fps: concat places the next one off the grid */
    camera_file cf;
    CHECK_OK(build_camera_file(&cf, dir, "src", VF_VIDEO_CODEC_AV1, 96, 64, 2, lengths, 2, 0, 1));
    char *out = vf_asprintf("%s/h264.mp4", dir);
    vf_video_transcode_report rep;
    CHECK_OK(transcode_file(cf.path, out, VF_VIDEO_CODEC_H264, 4, 20, &rep));
    CHECK_EQ_INT(rep.frames, 20);
    CHECK(rep.measured && rep.samples == 20 * (96 * 64 + 2 * 48 * 32));
    double psnr = vf_video_transcode_psnr(&rep);
    CHECK(psnr > 30 && rep.min_frame_psnr > 25 && rep.max_abs_diff > 0 && rep.max_abs_diff < 128);
    CHECK(rep.bytes_read > 0 && rep.bytes_written > 0);

    vf_video_index *a = NULL, *b = NULL;
    CHECK_OK(vf_video_index_build_file(&a, cf.path));
    CHECK_OK(vf_video_index_build_file(&b, out));
    if (a && b) {
        CHECK_EQ_INT(b->codec, VF_VIDEO_CODEC_H264);
        CHECK_EQ_INT(b->frame_count, a->frame_count);
        int gap = 0;
        for (int64_t k = 0; k < a->frame_count && k < b->frame_count; k++) {
            double ta = (double)a->pts[k] * a->time_base_num / a->time_base_den;
            double tb = (double)b->pts[k] * b->time_base_num / b->time_base_den;
            CHECK(fabs(ta - tb) < 1e-12);
            CHECK_EQ_INT(b->keyframe[k], k % 4 == 0);
            if (k > 0 && fabs(ta - (double)a->pts[k - 1] * a->time_base_num / a->time_base_den - 1 / 30.0) > 1e-6)
                gap = 1;
        }
        CHECK(gap); /* the source really was off the 1/30 grid somewhere, and that was kept */
    }
    vf_video_index_free(a);
    vf_video_index_free(b);

    /* the episodes still map by ordinal where the source's metadata says, frames stamped */
    vf_video_index *ix = NULL;
    CHECK_OK(vf_video_index_build_file(&ix, out));
    if (ix) {
        vf_video_map map;
        vf_video_map_settings ms = {30.0, 0, "h264"};
        CHECK_OK(vf_video_map_episodes(ix, cf.eps, cf.count, &ms, &map));
        CHECK_EQ_INT(map.method, VF_VIDEO_MAP_BY_ORDINAL);
        CHECK_EQ_INT(cf.eps[1].first_ordinal, 13);
        vf_video_map_free(&map, cf.eps, cf.count);
        vf_video_index_free(ix);
    }
    vf_video_reader *rd = NULL;
    CHECK_OK(vf_video_open_file(&rd, out, NULL));
    uint8_t *rgb = malloc(96 * 64 * 3);
    int64_t ordinal = 0;
    for (int i = 0; i < 2 && rd && rgb; i++)
        for (int64_t k = 0; k < lengths[i]; k++, ordinal++) {
            vf_video_format f;
            vf_video_format_defaults(&f);
            CHECK_OK(vf_video_read_frame(rd, ordinal, &f, rgb));
            CHECK(has_identity(rgb, 96, 64, i, k, 1));
        }
    free(rgb);
    vf_video_close(rd);

    /* a count that disagrees: refused, nothing left behind */
    char *bad = vf_asprintf("%s/bad.mp4", dir);
    CHECK_ERR(transcode_file(cf.path, bad, VF_VIDEO_CODEC_H264, 2, 21, &rep), VF_ECORRUPT,
              "holds 20 frames, expected 21");
    CHECK(access(bad, F_OK) != 0);
    /* a corrupt source names itself */
    char *junk = vf_asprintf("%s/junk.mp4", dir);
    FILE *f = fopen(junk, "wb");
    if (f) {
        for (int i = 0; i < 4096; i++)
            fputc(i * 37, f);
        fclose(f);
    }
    int r = transcode_file(junk, bad, VF_VIDEO_CODEC_H264, 2, 0, &rep);
    CHECK(r < 0 && strstr(vf_last_error(), "junk.mp4"));
    CHECK(access(bad, F_OK) != 0);
    unlink(junk);
    free(junk);
    free(bad);
    unlink(out);
    free(out);
    free_camera_file(&cf);
}

static void test_av1_to_av1(const char *dir)
{
    char *in = vf_asprintf("%s/in.mp4", dir), *out = vf_asprintf("%s/av1.mp4", dir);
    CHECK_OK(write_stamped(in, VF_VIDEO_CODEC_AV1, 96, 64, 2, 3, 9, 0));
    vf_video_transcode_report rep;
    CHECK_OK(transcode_file(in, out, VF_VIDEO_CODEC_AV1, 2, 9, &rep));
    CHECK_EQ_INT(rep.frames, 9);
    CHECK(rep.measured && vf_video_transcode_psnr(&rep) > 30);
    unlink(in);
    unlink(out);
    free(in);
    free(out);
}

static void test_options(void)
{
    vf_lr3_reencode re = {VF_VIDEO_CODEC_H264, -1, NULL, 0};
    CHECK_OK(vf_lr3_reencode_resolve(&re));
    CHECK(re.crf == 18 && !strcmp(re.preset, "medium"));
    re = (vf_lr3_reencode){VF_VIDEO_CODEC_AV1, -1, NULL, 0};
    CHECK_OK(vf_lr3_reencode_resolve(&re));
    CHECK(re.crf == 24 && !strcmp(re.preset, "8"));
    re = (vf_lr3_reencode){VF_VIDEO_CODEC_HEVC, 52, NULL, 0};
    CHECK_ERR(vf_lr3_reencode_resolve(&re), VF_EINVAL, "--crf 52");
    re = (vf_lr3_reencode){VF_VIDEO_CODEC_AV1, 30, "fast", 0};
    CHECK_ERR(vf_lr3_reencode_resolve(&re), VF_EINVAL, "--preset fast");
    re = (vf_lr3_reencode){VF_VIDEO_CODEC_H264, 20, "fastest", 0};
    CHECK_ERR(vf_lr3_reencode_resolve(&re), VF_EINVAL, "libx264 takes");
    re = (vf_lr3_reencode){VF_VIDEO_CODEC_UNKNOWN, -1, NULL, 0};
    CHECK_ERR(vf_lr3_reencode_resolve(&re), VF_EINVAL, "h264, hevc or av1");

    CHECK_OK(vf_video_encoder_check(VF_VIDEO_CODEC_H264));
    setenv("VF_ENCODERS_HIDE", "libsvtav1,libx265", 1);
    CHECK_ERR(vf_video_encoder_check(VF_VIDEO_CODEC_HEVC), VF_EUNSUPPORTED, "encoder libx265 (for codec hevc)");
    CHECK_ERR(vf_video_encoder_check(VF_VIDEO_CODEC_AV1), VF_EUNSUPPORTED, "libsvtav1");
    CHECK_OK(vf_video_encoder_check(VF_VIDEO_CODEC_H264));
    unsetenv("VF_ENCODERS_HIDE");
    CHECK(!strcmp(vf_video_encoder_name(VF_VIDEO_CODEC_HEVC), "libx265"));
}

int main(void)
{
    vf_video_set_ffmpeg_log_level(-1);
    char *dir = vf_test_tmpdir("lr3reencode");
    test_times_kept(dir);
    test_av1_to_av1(dir);
    test_options();
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_lerobotv3_reencode");
}
