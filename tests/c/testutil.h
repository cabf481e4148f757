/*
 * testutil.h: a minimal assertion harness for the C unit tests (ctest runs
 * one executable per tests/c/test_*.c). A failed check prints file:line,
 * the expression and vf_last_error(), and the test exits non-zero at the end.
 */
#ifndef VF_TESTUTIL_H
#define VF_TESTUTIL_H

#include <stdio.h>
#include <string.h>

#include "base/base.h"

extern int vf_test_failures;
extern int vf_test_checks;

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        vf_test_checks++;                                                                        \
        if (!(cond)) {                                                                           \
            vf_test_failures++;                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    vf_last_error());                                                            \
        }                                                                                        \
    } while (0)

#define CHECK_OK(expr)                                                                           \
    do {                                                                                         \
        vf_test_checks++;                                                                        \
        int check_rc_ = (expr);                                                                  \
        if (check_rc_ < 0) {                                                                     \
            vf_test_failures++;                                                                  \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr, check_rc_,  \
                    vf_last_error());                                                            \
        }                                                                                        \
    } while (0)

/* Expects a failure with code `code` whose message contains `needle`. */
#define CHECK_ERR(expr, code, needle)                                                            \
    do {                                                                                         \
        vf_test_checks++;                                                                        \
        int check_rc_ = (expr);                                                                  \
        if (check_rc_ != (code) || !strstr(vf_last_error(), (needle))) {                         \
            vf_test_failures++;                                                                  \
            fprintf(stderr, "%s:%d: %s: expected %d containing \"%s\", got %d \"%s\"\n", __FILE__, \
                    __LINE__, #expr, (code), (needle), check_rc_, vf_last_error());              \
        }                                                                                        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                       \
    do {                                                                                         \
        vf_test_checks++;                                                                        \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                          \
        if (check_a_ != check_b_) {                                                              \
            vf_test_failures++;                                                                  \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, \
                    check_a_, check_b_);                                                         \
        }                                                                                        \
    } while (0)

/* Prints the summary line and returns the process exit code. */
int vf_test_finish(const char *name);

/* What the code between begin and end prints on stderr: end restores stderr
 * and copies at most size - 1 bytes of it, NUL-terminated, into text. */
void vf_test_capture_stderr_begin(void);
void vf_test_capture_stderr_end(char *text, size_t size);

/* Paths: the shared fixtures folder and a fresh scratch directory
 * (under $TMPDIR, removed by the caller with vf_test_rmtree). Newly
 * allocated strings. */
char *vf_test_fixture(const char *relative);
char *vf_test_tmpdir(const char *tag);
void vf_test_rmtree(const char *path);

/* dir/rel with rel's parent folders created (a check fails if they cannot
 * be); a newly allocated string. */
char *vf_test_path_in(const char *dir, const char *rel);
/* Writes text to dir/rel, creating rel's parent folders. */
void vf_test_write_text(const char *dir, const char *rel, const char *text);

#endif
