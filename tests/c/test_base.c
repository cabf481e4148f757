/* test_base.c: error messages, buffers, growable arrays, file kinds, paths,
 * byte sources and the log (a warning printed once per process). */
#define _POSIX_C_SOURCE 200809L
#include "io/io.h"
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

static void test_errors(void)
{
    CHECK(vf_error(VF_ECORRUPT, "bad %s", "thing") == VF_ECORRUPT);
    CHECK(strcmp(vf_last_error(), "bad thing") == 0);
    CHECK(vf_error_context(VF_ECORRUPT, "file.parquet") == VF_ECORRUPT);
    CHECK(strcmp(vf_last_error(), "file.parquet: bad thing") == 0);
    CHECK(strcmp(vf_status_name(VF_ENOENT), "not found") == 0);
}

static void test_buf(void)
{
    vf_buf b = {0};
    for (int i = 0; i < 1000; i++)
        CHECK_OK(vf_buf_printf(&b, "%d,", i));
    CHECK(b.len > 1000);
    CHECK(memcmp(b.data, "0,1,2,", 6) == 0);
    char *s = vf_buf_take_string(&b);
    CHECK(s && strlen(s) > 1000 && b.data == NULL);
    free(s);
    char *p = vf_path_join("/a/b/", "/c");
    CHECK(p && strcmp(p, "/a/b/c") == 0);
    free(p);
}

/* vf_grow_array: doubling from the first capacity, contents kept, and a
 * capacity that would overflow refused with the array left as it was. */
static void test_grow_array(void)
{
    int64_t *items = NULL;
    size_t cap = 0;
    for (size_t n = 0; n < 100; n++) {
        CHECK_OK(vf_grow_array(&items, n, &cap, 4, sizeof *items));
        CHECK(cap > n);
        items[n] = (int64_t)n * 3;
    }
    CHECK(cap == 128);
    int same = 1;
    for (size_t n = 0; n < 100; n++)
        same &= items[n] == (int64_t)n * 3;
    CHECK(same);
    CHECK_OK(vf_grow_array(&items, 100, &cap, 4, sizeof *items)); /* room left: unchanged */
    CHECK(cap == 128);
    int64_t *before = items;
    size_t huge = SIZE_MAX / 4;
    CHECK(vf_grow_array(&items, huge, &huge, 4, sizeof *items) == VF_ENOMEM);
    CHECK(items == before && huge == SIZE_MAX / 4);
    free(items);
}

/* vf_file_kind_name on what stat() reports for a few kinds of file. */
static void test_file_kinds(void)
{
    struct stat st;
    CHECK(stat(".", &st) == 0 && strcmp(vf_file_kind_name(st.st_mode), "a directory") == 0);
    CHECK(stat("/dev/null", &st) != 0 || strcmp(vf_file_kind_name(st.st_mode), "a character device") == 0);
    char *dir = vf_test_tmpdir("kinds");
    char *path = vf_path_join(dir, "file");
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    CHECK(stat(path, &st) == 0 && strcmp(vf_file_kind_name(st.st_mode), "a regular file") == 0);
    CHECK(strcmp(vf_file_kind_name(0), "not a file") == 0);
    vf_test_rmtree(dir);
    free(path);
    free(dir);
}

static void test_sources(void)
{
    const char text[] = "hello world";
    vf_source *s;
    CHECK_OK(vf_source_open_memory(&s, "mem", text, 11, 1));
    char out[16] = {0};
    CHECK_OK(vf_source_read_at(s, 6, out, 5));
    CHECK(memcmp(out, "world", 5) == 0);
    CHECK_ERR(vf_source_read_at(s, 8, out, 5), VF_ECORRUPT, "mem: truncated");
    CHECK_EQ_INT(vf_source_read_upto(s, 8, out, 5), 3);
    vf_source *again = vf_source_ref(s);
    vf_source_close(s);
    CHECK_EQ_INT(vf_source_size(again), 11);
    vf_source_close(again);

    CHECK_ERR(vf_source_open_file(&s, "/nonexistent/file.parquet"), VF_ENOENT, "/nonexistent/file.parquet");
    char *dir = vf_test_tmpdir("base");
    char *path = vf_path_join(dir, "x.bin");
    FILE *f = fopen(path, "wb");
    fwrite("abcdef", 1, 6, f);
    fclose(f);
    CHECK_OK(vf_source_open_file(&s, path));
    CHECK_OK(vf_source_read_at(s, 2, out, 3));
    CHECK(memcmp(out, "cde", 3) == 0);
    vf_source_close(s);
    uint8_t *data;
    size_t len;
    CHECK_OK(vf_read_file(path, &data, &len));
    CHECK(len == 6 && data[6] == 0);
    free(data);
    vf_test_rmtree(dir);
    free(path);
    free(dir);
}

/* Views: a memory source's own bytes; a local file mapped at an unaligned
 * offset gives the same bytes as pread; small or out-of-range views and
 * VF_NO_MMAP give NULL (the caller reads instead). */
static void test_views(void)
{
    const char text[] = "hello world";
    vf_source *s;
    void *tok;
    CHECK_OK(vf_source_open_memory(&s, "mem", text, 11, 0));
    const uint8_t *v = vf_source_view(s, 6, 5, 0, &tok);
    CHECK(v == (const uint8_t *)text + 6);
    vf_source_unview(s, tok);
    CHECK(vf_source_view(s, 8, 5, 0, &tok) == NULL && tok == NULL);
    vf_source_close(s);

    char *dir = vf_test_tmpdir("views");
    char *path = vf_path_join(dir, "big.bin");
    size_t n = 3 * VF_SOURCE_VIEW_MIN + 123;
    uint8_t *data = malloc(n), *back = malloc(n);
    CHECK(data && back);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)(i * 2654435761u >> 13);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n);
    fclose(f);
    CHECK_OK(vf_source_open_file(&s, path));
    for (int populate = 0; populate <= 1; populate++) {
        uint64_t off = 4097 + (uint64_t)populate;
        size_t len = n - off;
        v = vf_source_view(s, off, len, populate, &tok);
        CHECK(v != NULL);
        CHECK_OK(vf_source_read_at(s, off, back, len));
        CHECK(v && memcmp(v, back, len) == 0 && memcmp(v, data + off, len) == 0);
        vf_source_unview(s, tok);
    }
    CHECK(vf_source_view(s, 0, 4096, 1, &tok) == NULL);           /* small: read it */
    CHECK(vf_source_view(s, 10, n, 1, &tok) == NULL);             /* past the end */
    setenv("VF_NO_MMAP", "1", 1);
    CHECK(vf_source_view(s, 0, n, 1, &tok) == NULL);
    unsetenv("VF_NO_MMAP");
    vf_source_close(s);
    free(data);
    free(back);
    vf_test_rmtree(dir);
    free(path);
    free(dir);
}

/* stderr captured while the log prints: a warning's second print is dropped,
 * errors and a different warning are not. */
static void test_log_once(void)
{
    vf_test_capture_stderr_begin();
    vf_log_set_level(VF_LOG_WARN);
    for (int i = 0; i < 3; i++) {
        vf_log(VF_LOG_WARN, "same warning %d", 7);
        vf_log(VF_LOG_ERROR, "an error");
    }
    vf_log(VF_LOG_WARN, "same warning %d", 8);
    vf_log(VF_LOG_INFO, "info, below the level");
    char text[1024];
    vf_test_capture_stderr_end(text, sizeof text);
    const char *want = "vlafeed: warning: same warning 7\nvlafeed: error: an error\nvlafeed: error: an error\n"
                       "vlafeed: error: an error\nvlafeed: warning: same warning 8\n";
    CHECK(strcmp(text, want) == 0);
    if (strcmp(text, want) != 0)
        fprintf(stderr, "log printed:\n%s", text);
}

int main(void)
{
    test_errors();
    test_buf();
    test_grow_array();
    test_file_kinds();
    test_sources();
    test_views();
    test_log_once();
    return vf_test_finish("test_base");
}
