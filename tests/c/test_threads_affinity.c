/* test_threads_affinity.c: pinned thread pools (the CPU set seen from
 * inside each job), refused CPU lists, and the loader's placement: its
 * engine threads pinned to settings.cpus, decode_threads = 0 resolved from
 * the cores, and the data-wait figures of vf_loader_stats. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "test_loader_helpers.h"

/* The lowest and highest CPUs this process may run on. */
static void allowed_range(int *lowest, int *highest, int *count)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    *lowest = *highest = -1;
    *count = CPU_COUNT(&set);
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (CPU_ISSET(c, &set)) {
            if (*lowest < 0)
                *lowest = c;
            *highest = c;
        }
    }
}

typedef struct seen {
    pthread_mutex_t lock;
    int jobs, pinned_right, count_sum;
    int want_cpu; /* -1: any set equal to the process's */
} seen;

static void record_affinity(void *arg)
{
    seen *s = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    int ok = pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0;
    pthread_mutex_lock(&s->lock);
    s->jobs++;
    s->count_sum += CPU_COUNT(&set);
    if (ok && (s->want_cpu < 0 || (CPU_COUNT(&set) == 1 && CPU_ISSET(s->want_cpu, &set))))
        s->pinned_right++;
    pthread_mutex_unlock(&s->lock);
    usleep(1000); /* let the other threads take jobs too */
}

static void test_pool(void)
{
    int lowest, highest, count;
    allowed_range(&lowest, &highest, &count);
    CHECK(lowest >= 0);
    CHECK_EQ_INT(vf_cpu_allowed_count(), count);

    /* pinned to one CPU: every job, on every thread, sees exactly that CPU */
    seen s = {.want_cpu = highest};
    pthread_mutex_init(&s.lock, NULL);
    vf_thread_pool *p = NULL;
    CHECK_OK(vf_thread_pool_create_pinned(&p, 3, &highest, 1));
    if (p) {
        CHECK_EQ_INT(vf_thread_pool_threads(p), 3);
        for (int i = 0; i < 24; i++)
            CHECK_OK(vf_thread_pool_submit(p, record_affinity, &s));
        vf_thread_pool_wait(p);
        vf_thread_pool_destroy(p);
    }
    CHECK_EQ_INT(s.jobs, 24);
    CHECK_EQ_INT(s.pinned_right, 24);

    /* threads = 0 with a list: one thread per listed CPU */
    int two[2] = {lowest, highest};
    CHECK_OK(vf_thread_pool_create_pinned(&p, 0, two, lowest == highest ? 1 : 2));
    if (p) {
        CHECK_EQ_INT(vf_thread_pool_threads(p), lowest == highest ? 1 : 2);
        vf_thread_pool_destroy(p);
    }

    /* unpinned: the jobs keep the process's set */
    seen all = {.want_cpu = -1};
    pthread_mutex_init(&all.lock, NULL);
    CHECK_OK(vf_thread_pool_create_pinned(&p, 2, NULL, 0));
    if (p) {
        for (int i = 0; i < 4; i++)
            CHECK_OK(vf_thread_pool_submit(p, record_affinity, &all));
        vf_thread_pool_wait(p);
        vf_thread_pool_destroy(p);
    }
    CHECK_EQ_INT(all.count_sum, 4 * count);

    /* refused lists: a CPU that does not exist (or is not allowed), a negative id, no array */
    int bad[2] = {lowest, 60000};
    p = (vf_thread_pool *)&s; /* must come back NULL */
    CHECK_ERR(vf_thread_pool_create_pinned(&p, 2, bad, 2), VF_EINVAL, "CPU 60000 does not exist or is not allowed");
    CHECK(p == NULL);
    int negative = -3;
    CHECK_ERR(vf_thread_pool_create_pinned(&p, 2, &negative, 1), VF_EINVAL, "CPU -3 is out of range");
    CHECK_ERR(vf_cpu_list_check(NULL, 2), VF_EINVAL, "no list");
    CHECK_OK(vf_cpu_list_check(NULL, 0));
    if (highest + 1 < CPU_SETSIZE) {
        int next = highest + 1; /* past the last allowed CPU: not allowed */
        CHECK_ERR(vf_cpu_list_check(&next, 1), VF_EINVAL, "is not allowed");
    }
    pthread_mutex_destroy(&s.lock);
    pthread_mutex_destroy(&all.lock);
}

/* Threads of this process whose Cpus_allowed_list is exactly `want`. */
static int threads_with_cpu_list(const char *want)
{
    DIR *dir = opendir("/proc/self/task");
    if (!dir)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
                char *v = line + 18;
                while (*v == ' ' || *v == '\t')
                    v++;
                v[strcspn(v, "\n")] = 0;
                n += strcmp(v, want) == 0;
            }
        }
        fclose(f);
    }
    closedir(dir);
    return n;
}

static void test_loader(vf_dataset *d)
{
    int lowest, highest, count;
    allowed_range(&lowest, &highest, &count);
    vf_loader_settings s;
    vf_loader_defaults(&s);
    s.mode = VF_MODE_STREAM;
    s.batch_size = 8;
    s.threads = 0;
    s.decode_threads = 0;
    s.cpus = &highest;
    s.num_cpus = 1;
    vf_loader *l = NULL;
    CHECK_OK(vf_loader_open(&l, d, &s));
    if (!l)
        return;
    vf_loader_stats st;
    vf_loader_get_stats(l, &st);
    CHECK_EQ_INT(st.pinned_cpus, 1);
    CHECK_EQ_INT(st.engine_threads, 1); /* threads = 0: one per pinned CPU */
    CHECK_EQ_INT(st.decode_threads, 1); /* one core for one engine thread */
    char want[16];
    snprintf(want, sizeof want, "%d", highest);
    if (count > 1) /* with one CPU every thread has that list anyway */
        CHECK(threads_with_cpu_list(want) >= 1);
    vf_batch *b;
    int r, batches = 0;
    while ((r = vf_loader_next(l, &b)) == 0) {
        batches++;
        vf_batch_release(b);
        usleep(2000); /* a "training step", so the engine can run ahead */
    }
    CHECK_EQ_INT(r, VF_EOF);
    vf_loader_get_stats(l, &st);
    CHECK(batches >= 3);
    CHECK(st.handout_seconds > 0);
    CHECK(st.wait_after_first_seconds >= 0);
    CHECK(st.wait_after_first_seconds <= st.wait_seconds + 1e-9);
    CHECK(st.wait_after_first_seconds <= st.handout_seconds + 1e-9);
    CHECK(st.handout_seconds >= 0.002 * (batches - 1) * 0.9);
    vf_loader_close(l);

    /* unpinned, decode_threads = 0: cores / engine threads, within 1..8 */
    vf_loader_defaults(&s);
    s.mode = VF_MODE_STREAM;
    s.threads = 1;
    s.decode_threads = 0;
    CHECK_OK(vf_loader_open(&l, d, &s));
    if (l) {
        vf_loader_get_stats(l, &st);
        CHECK_EQ_INT(st.pinned_cpus, 0);
        CHECK_EQ_INT(st.decode_threads, count < 1 ? 1 : count > 8 ? 8 : count);
        CHECK_EQ_INT(st.handout_seconds, 0); /* nothing handed out yet */
        vf_loader_close(l);
    }

    /* a CPU the process may not run on is refused at open, named */
    int bad = 60001;
    vf_loader_defaults(&s);
    s.cpus = &bad;
    s.num_cpus = 1;
    l = (vf_loader *)d;
    CHECK_ERR(vf_loader_open(&l, d, &s), VF_EINVAL, "loader: cpus: CPU list: CPU 60001 does not exist");
    CHECK(l == NULL);
}

int main(void)
{
    test_pool();
    char *root = make_dataset("threads-affinity", 3, 30, 200, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    test_loader(d);
    vf_dataset_close(d);
    remove_dataset(root);
    return vf_test_finish("test_threads_affinity");
}
