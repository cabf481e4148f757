/*
 * test_node_cache.c: the node cache (filecache.c, VF_NODE_CACHE_DIR), the
 * cross-process copy of remote objects, with a fake fetcher whose calls are
 * counted in shared memory across fork()ed processes:
 *  - 6 processes x 3 objects at once: each object fetched exactly once, every
 *    process reads the right bytes, the node counters add up (3 fetches,
 *    15 hits of which some waited, bytes fetched = the 3 sizes);
 *  - the bound: LRU eviction of the copy used least recently, an object larger
 *    than the bound is bypassed (read remotely), a copy held open survives its
 *    eviction, a reservation left by a dead process is dropped;
 *  - a failed fetch leaves no copy and names the URL; the next process retries.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/io.h"
#include "testutil.h"

typedef struct shared {
    atomic_int fetches[8];
    atomic_int fails;
} shared;

static shared *sh;

/* "obj:<size>:<digit>" objects; bytes are (digit + i) & 0xff. "fail:" fails. */
static int fake_size(void *ctx, const char *url, uint64_t *size)
{
    (void)ctx;
    unsigned long long n;
    int t;
    if (!strncmp(url, "fail:", 5))
        return vf_error(VF_EIO, "%s: HTTP 503 Service Unavailable", url);
    if (sscanf(url, "obj:%llu:%d", &n, &t) != 2)
        return vf_error(VF_ENOENT, "%s: HTTP 404 Not Found", url);
    *size = n;
    return 0;
}

static int fake_fetch(void *ctx, const char *url, const char *dest, uint64_t size)
{
    (void)ctx;
    unsigned long long n;
    int t = 0;
    if (!strncmp(url, "fail:", 5)) {
        atomic_fetch_add(&sh->fails, 1);
        return vf_error(VF_EIO, "%s: HTTP 503 Service Unavailable", url);
    }
    sscanf(url, "obj:%llu:%d", &n, &t);
    atomic_fetch_add(&sh->fetches[t & 7], 1);
    usleep(30000); /* long enough for other processes to find it in flight */
    int fd = open(dest, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return vf_error(VF_EIO, "cannot create %s", dest);
    uint8_t buf[4096];
    for (uint64_t off = 0; off < size;) {
        size_t k = size - off < sizeof buf ? (size_t)(size - off) : sizeof buf;
        for (size_t i = 0; i < k; i++)
            buf[i] = (uint8_t)(t + off + i);
        if (write(fd, buf, k) != (ssize_t)k) {
            close(fd);
            return vf_error(VF_EIO, "short write");
        }
        off += k;
    }
    close(fd);
    return 0;
}

static const vf_file_cache_fetcher fetcher = {fake_size, fake_fetch, NULL};

static int check_bytes(int fd, uint64_t size, int t)
{
    uint8_t *buf = malloc(size ? size : 1);
    ssize_t n = pread(fd, buf, size, 0);
    int ok = n == (ssize_t)size;
    for (uint64_t i = 0; ok && i < size; i++)
        ok = buf[i] == (uint8_t)(t + i);
    free(buf);
    return ok;
}

static int get(const char *dir, uint64_t bound, const char *url, int t, uint64_t want)
{
    int fd;
    uint64_t size;
    int r = vf_node_cache_fetch(dir, bound, url, UINT64_MAX, &fetcher, &fd, &size);
    if (r != 0)
        return r;
    int ok = size == want && check_bytes(fd, size, t);
    close(fd);
    return ok ? 0 : -1000;
}

static void test_processes_share_one_download(const char *base)
{
    char *dir = vf_path_join(base, "shared");
    memset(sh, 0, sizeof *sh);
    const char *urls[3] = {"obj:70000:1", "obj:12345:2", "obj:1:3"};
    const uint64_t sizes[3] = {70000, 12345, 1};
    enum { PROCS = 6 };
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            int bad = 0;
            for (int k = 0; k < 3; k++) {
                int i = (k + p) % 3; /* different orders: some wait on a download in flight */
                bad |= get(dir, 1 << 20, urls[i], i + 1, sizes[i]) != 0;
            }
            vf_node_cache_stats st;
            vf_node_cache_process_stats(&st);
            bad |= st.hits + st.fetches != 3;
            _exit(bad);
        }
    }
    for (int p = 0; p < PROCS; p++) {
        int status = 0;
        waitpid(pids[p], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    for (int i = 1; i <= 3; i++)
        CHECK_EQ_INT(atomic_load(&sh->fetches[i]), 1);
    vf_node_cache_stats st;
    CHECK_OK(vf_node_cache_node_stats(dir, &st));
    CHECK_EQ_INT((int)st.fetches, 3);
    CHECK_EQ_INT((int)st.hits, PROCS * 3 - 3);
    CHECK(st.bytes_fetched == 70000 + 12345 + 1);
    CHECK(st.bytes_reused == (uint64_t)(PROCS - 1) * (70000 + 12345 + 1));
    CHECK_EQ_INT((int)st.evictions, 0);
    free(dir);
}

static int exists(const char *dir, const char *url, const char *suffix)
{
    char key[65];
    vf_sha256_hex(url, strlen(url), key);
    char *p = vf_asprintf("%s/%s%s", dir, key, suffix);
    struct stat st;
    int r = stat(p, &st) == 0;
    free(p);
    return r;
}

static void test_bound_and_eviction(const char *base)
{
    char *dir = vf_path_join(base, "bound");
    memset(sh, 0, sizeof *sh);
    const uint64_t bound = 25000;
    CHECK_OK(get(dir, bound, "obj:10000:1", 1, 10000));
    usleep(20000);
    CHECK_OK(get(dir, bound, "obj:10000:2", 2, 10000));
    usleep(20000);
    /* A hit refreshes 1: 2 is now the least recently used. Keep 2 open across its eviction. */
    CHECK_OK(get(dir, bound, "obj:10000:1", 1, 10000));
    int held;
    uint64_t size;
    CHECK_OK(vf_node_cache_fetch(dir, bound, "obj:10000:2", UINT64_MAX, &fetcher, &held, &size));
    usleep(20000);
    CHECK_OK(get(dir, bound, "obj:10000:1", 1, 10000));
    usleep(20000);
    CHECK_OK(get(dir, bound, "obj:10000:4", 4, 10000)); /* needs room: 2 goes */
    CHECK(exists(dir, "obj:10000:1", ".data") && !exists(dir, "obj:10000:2", ".data"));
    CHECK(exists(dir, "obj:10000:4", ".data"));
    CHECK(check_bytes(held, 10000, 2)); /* the open descriptor still reads the evicted copy */
    close(held);
    /* Larger than the bound: not cached (1), nothing fetched. */
    int fd = -1;
    CHECK_EQ_INT(vf_node_cache_fetch(dir, bound, "obj:30000:5", UINT64_MAX, &fetcher, &fd, &size), 1);
    CHECK(fd < 0 && atomic_load(&sh->fetches[5]) == 0);
    /* A reservation of a dead process (no lock held) does not count and is removed. */
    char key[65];
    vf_sha256_hex("obj:20000:6", 11, key);
    char *stale = vf_asprintf("%s/%s.part", dir, key);
    int sf = open(stale, O_WRONLY | O_CREAT, 0644);
    CHECK(sf >= 0 && ftruncate(sf, 20000) == 0);
    close(sf);
    CHECK_OK(get(dir, bound, "obj:10000:7", 7, 10000));
    struct stat st_;
    CHECK(stat(stale, &st_) < 0);
    free(stale);
    vf_node_cache_stats st;
    CHECK_OK(vf_node_cache_node_stats(dir, &st));
    CHECK_EQ_INT((int)st.fetches, 4);
    CHECK_EQ_INT((int)st.bypassed, 1);
    CHECK((int)st.evictions >= 2); /* 2, then 1 or 4 for 7 */
    /* A failed fetch names the URL, leaves nothing; a later call tries again. */
    CHECK_ERR(vf_node_cache_fetch(dir, bound, "fail:x", 100, &fetcher, &fd, &size), VF_EIO, "fail:x");
    CHECK(!exists(dir, "fail:x", ".data") && !exists(dir, "fail:x", ".part") && !exists(dir, "fail:x", ".tmp"));
    CHECK(vf_node_cache_fetch(dir, bound, "fail:x", 100, &fetcher, &fd, &size) < 0);
    CHECK_EQ_INT(atomic_load(&sh->fails), 2);
    free(dir);
}

static void test_env(void)
{
    unsetenv("VF_NODE_CACHE_DIR");
    CHECK(vf_node_cache_dir() == NULL);
    setenv("VF_NODE_CACHE_DIR", "", 1);
    CHECK(vf_node_cache_dir() == NULL);
    setenv("VF_NODE_CACHE_BYTES", "12345", 1);
    CHECK(vf_node_cache_bound() == 12345);
    unsetenv("VF_NODE_CACHE_BYTES");
    CHECK(vf_node_cache_bound() == (uint64_t)16 << 30);
    unsetenv("VF_NODE_CACHE_DIR");
}

int main(void)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    char *dir = vf_test_tmpdir("node_cache");
    test_processes_share_one_download(dir);
    test_bound_and_eviction(dir);
    test_env();
    vf_test_rmtree(dir);
    free(dir);
    return vf_test_finish("test_node_cache");
}
