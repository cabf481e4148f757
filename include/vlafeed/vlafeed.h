/*
 * vlafeed.h: the public C API of vlafeed (umbrella header).
 *
 * Conventions, for every function in include/vlafeed/:
 *  - A function that can fail returns int: 0 on success, or a negative
 *    errno-style code listed below. The reason, naming the file, episode and
 *    column involved, is then available from vf_last_error() on the same
 *    thread until the next failing call.
 *  - Objects are opaque handles created by vf_<thing>_open() from a settings
 *    struct filled by vf_<thing>_defaults(), and destroyed by
 *    vf_<thing>_close(). Each function comment states who owns what.
 */
#ifndef VLAFEED_H
#define VLAFEED_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VF_VERSION_MAJOR 0
#define VF_VERSION_MINOR 1
#define VF_VERSION_PATCH 0
#define VF_VERSION_STRING "0.1.0"

/* Status codes (negative errno values). */
#define VF_OK 0
#define VF_EINVAL (-EINVAL)          /* bad argument or setting */
#define VF_ENOMEM (-ENOMEM)          /* allocation failed */
#define VF_EIO (-EIO)                /* read/write failure */
#define VF_ENOENT (-ENOENT)          /* missing file, key, column or episode */
#define VF_ECORRUPT (-EBADMSG)       /* input is malformed or inconsistent */
#define VF_EUNSUPPORTED (-ENOTSUP)   /* valid input using a feature we lack */
#define VF_ERANGE (-ERANGE)          /* index or value out of range */
#define VF_EAGAIN (-EAGAIN)          /* try again (e.g. decoder needs input) */
#define VF_EOF (-ENODATA)            /* end of stream / epoch */

/* The message of the last failure on this thread (never NULL; "" if none).
 * Owned by the library; valid until the next vlafeed call on this thread. */
const char *vf_last_error(void);
/* The status code of the error vf_last_error() describes (0 before any). A
 * function returning VF_ENOMEM without a message of its own leaves an older
 * message: compare the codes before showing it. */
int vf_last_error_code(void);

/* How much vlafeed and the codec libraries under it (FFmpeg, SVT-AV1) print
 * on stderr: 0 errors only, 1 warnings (default), 2 info, 3 debug. The
 * VF_LOG environment variable (error|warn|info|debug) sets the initial
 * level. Call before opening datasets; not thread-safe with running work. */
void vf_set_log_level(int level);

/* Writes an RGB24 image (uint8 [height][width][3]) to path as PNG (name
 * ending in .png, encoded by FFmpeg's PNG encoder) or binary PPM (.ppm). */
int vf_image_write(const char *path, const uint8_t *rgb, int width, int height);

/* The version string of the linked library. */
const char *vf_version(void);

#ifdef __cplusplus
}
#endif

#include "vlafeed/dataset.h"

#endif
