/*
 * window.c: delta_timestamps -> frame offsets, and the clamped window of
 * rows with its pad mask (lerobot-format.md §7.1-§7.2).
 *
 * LeRobot checks |d*fps - round(d*fps)| / fps <= tolerance_s for each delta
 * and converts with Python's round (ties to even); rint() in the default
 * rounding mode is the same. Padded steps read the boundary row, so a padded
 * value repeats the first or last frame of the episode, never zeros.
 */
#include "sample/sample.h"

#include <math.h>

int vf_sample_delta_offsets(const char *key, const double *seconds, size_t count, double fps, double tolerance_s,
                            int64_t *offsets)
{
    if (!(fps > 0) || !isfinite(fps))
        return vf_error(VF_EINVAL, "delta_timestamps['%s']: the dataset fps %g is not positive", key, fps);
    if (count == 0)
        return vf_error(VF_EINVAL, "delta_timestamps['%s']: empty list of deltas", key);
    if (!(tolerance_s >= 0) || !isfinite(tolerance_s))
        return vf_error(VF_EINVAL, "delta_timestamps['%s']: tolerance_s %g must be >= 0", key, tolerance_s);
    for (size_t i = 0; i < count; i++) {
        double d = seconds[i];
        if (!isfinite(d) || fabs(d * fps) > 1e12)
            return vf_error(VF_EINVAL, "delta_timestamps['%s'][%zu]: %g is not a usable number of seconds", key, i,
                            d);
        double frames = d * fps;
        double nearest = rint(frames);
        if (fabs(frames - nearest) / fps > tolerance_s)
            return vf_error(VF_EINVAL,
                            "delta_timestamps['%s'][%zu]: %.9g s is not a multiple of 1/fps (fps %g: nearest %.9g s, "
                            "off by %.3g s > tolerance_s %g)",
                            key, i, d, fps, nearest / fps, fabs(frames - nearest) / fps, tolerance_s);
        offsets[i] = (int64_t)nearest;
    }
    return 0;
}

void vf_sample_window(int64_t a, int64_t first, int64_t end, const int64_t *offsets, size_t count, int64_t *rows,
                      uint8_t *pad)
{
    for (size_t i = 0; i < count; i++) {
        int64_t q = a + offsets[i];
        uint8_t p = 0;
        if (q < first) {
            q = first;
            p = 1;
        } else if (q >= end) {
            q = end - 1;
            p = 1;
        }
        rows[i] = q;
        if (pad)
            pad[i] = p;
    }
}
