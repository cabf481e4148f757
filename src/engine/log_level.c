/*
 * log_level.c: vf_set_log_level, the public switch for how much vlafeed and
 * the codec libraries under it print. It lives in the engine layer because
 * it reaches into video (FFmpeg's log level) as well as base.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "video/video.h"
#include "vlafeed/vlafeed.h"

void vf_set_log_level(int level)
{
    vf_log_set_level(level);
    vf_video_set_ffmpeg_log_level(level);
    /* SVT-AV1 reads SVT_LOG when an encoder starts: 1 errors, 2 warnings,
     * 3 info. Respect a value the user set. */
    char value[8];
    snprintf(value, sizeof value, "%d", level <= 0 ? 1 : level == 1 ? 1 : level == 2 ? 3 : 4);
    setenv("SVT_LOG", value, 0);
}
