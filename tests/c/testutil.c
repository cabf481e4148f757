/* testutil.c: the shared pieces of the C test harness (see testutil.h). */
#define _GNU_SOURCE
#include "testutil.h"

#include <stdlib.h>
#include <unistd.h>

int vf_test_failures = 0;
int vf_test_checks = 0;

int vf_test_finish(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, vf_test_checks, vf_test_failures);
    return vf_test_failures ? 1 : 0;
}

char *vf_test_fixture(const char *relative)
{
    const char *root = getenv("VF_FIXTURES");
    if (!root)
        root = "../shared/fixtures";
    return vf_path_join(root, relative);
}

char *vf_test_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *templ = vf_asprintf("%s/vftest-%s-XXXXXX", base ? base : "/tmp", tag);
    if (!templ || !mkdtemp(templ)) {
        fprintf(stderr, "cannot create a temporary directory\n");
        exit(2);
    }
    return templ;
}

void vf_test_rmtree(const char *path)
{
    char *cmd = vf_asprintf("rm -rf '%s'", path);
    if (cmd && system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
    free(cmd);
}

static int capture_fd = -1, saved_stderr = -1;

void vf_test_capture_stderr_begin(void)
{
    char path[] = "/tmp/vftest-stderr-XXXXXX";
    capture_fd = mkstemp(path);
    if (capture_fd < 0) {
        fprintf(stderr, "cannot create a temporary file\n");
        exit(2);
    }
    unlink(path);
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    dup2(capture_fd, STDERR_FILENO);
}

void vf_test_capture_stderr_end(char *text, size_t size)
{
    fflush(stderr);
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    ssize_t n = pread(capture_fd, text, size - 1, 0);
    text[n > 0 ? n : 0] = 0;
    close(capture_fd);
    capture_fd = saved_stderr = -1;
}

char *vf_test_path_in(const char *dir, const char *rel)
{
    char *path = vf_path_join(dir, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    CHECK_OK(vf_mkdirs(path));
    *slash = '/';
    return path;
}

void vf_test_write_text(const char *dir, const char *rel, const char *text)
{
    char *path = vf_test_path_in(dir, rel);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    free(path);
}
