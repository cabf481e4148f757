/*
 * cancel.c: cancellation tokens for remote requests (io.h).
 *
 * A token is one atomic flag owned by whoever may want to stop its
 * requests early (a loader, the file cache). The HTTP layer does not get
 * it passed down through the readers between (Parquet, demuxer, tables):
 * each thread names the token its requests watch, and a request picks up
 * its thread's token when it starts (vf_http_xfer_init).
 *
 * The watched token is per thread (_Thread_local): nothing here is shared
 * between threads but the flags themselves, which are atomics. A token
 * must outlive every thread that watches it, or be unwatched first.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include "io/io.h"

#include <errno.h>
#include <time.h>

static _Thread_local vf_io_cancel *watched_token;

void vf_io_cancel_request(vf_io_cancel *t)
{
    if (t)
        atomic_store(&t->requested, 1);
}

int vf_io_cancel_requested(vf_io_cancel *t) { return t && atomic_load(&t->requested); }

vf_io_cancel *vf_io_cancel_watch(vf_io_cancel *t)
{
    vf_io_cancel *previous = watched_token;
    watched_token = t;
    return previous;
}

vf_io_cancel *vf_io_cancel_watched(void) { return watched_token; }

/* Slices of a wait: how late a cancellation may be noticed. */
#define WAIT_SLICE_S 0.02

int vf_io_cancel_sleep(vf_io_cancel *t, double seconds)
{
    double end = vf_now_seconds() + seconds;
    for (;;) {
        if (vf_io_cancel_requested(t))
            return 1;
        double left = end - vf_now_seconds();
        if (left <= 0)
            return 0;
        double step = t && left > WAIT_SLICE_S ? WAIT_SLICE_S : left;
        struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
}
