/*
 * test_plan.c: partitions and their MP4-open arithmetic (hand-made inputs
 * with cameras rolling over at different episodes, and a make-sample
 * dataset with many episodes per file and rollover), the epoch order
 * (permutations, determinism, seeds), the rank remainder rule, consumer
 * splits without duplicates, the shuffle buffer, and batching.
 */
#include "test_loader_helpers.h"

#include "plan/plan.h"

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* 6 episodes; cam0 rolls over before episode 3, cam1 before 2 and 5. */
static void test_partitions_by_hand(void)
{
    int64_t lengths[] = {10, 20, 30, 40, 50, 60};
    int64_t video[] = {/* cam0, cam1 per episode */ 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2};
    int64_t data[] = {0, 0, 0, 0, 1, 1};
    vf_plan_input in = {6, lengths, 2, video, data};
    vf_plan_task *t;
    size_t n;
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_FILE_GROUP, 1, &t, &n));
    /* The primary camera is cam1 (3 runs of files against cam0's 2): groups
     * {0,1} {2,3,4} {5}; cam0 rolls over inside the second group. */
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK_EQ_INT(t[0].first_episode, 0);
        CHECK_EQ_INT(t[0].num_episodes, 2);
        CHECK_EQ_INT(t[0].num_samples, 30);
        CHECK_EQ_INT(t[1].first_episode, 2);
        CHECK_EQ_INT(t[1].num_episodes, 3);
        CHECK_EQ_INT(t[1].first_position, 30);
        CHECK_EQ_INT(t[2].first_position, 150);
        CHECK_EQ_INT(t[2].num_samples, 60);
    }
    CHECK_EQ_INT(vf_plan_video_opens(&in, t, n), 7); /* 2 + (cam0 {0,1} + cam1 {1}) + 2 */
    free(t);
    /* Many primary files per consumer: a task spans several of them. 64
     * episodes, cam1 rolls over every episode, cam0 every 8: with 1
     * consumer, 64 / 4 = 16 -> at most 4 primary files per task. */
    {
        int64_t len64[64], vid64[128], dat64[64];
        for (int e = 0; e < 64; e++) {
            len64[e] = 5;
            vid64[2 * e] = e / 8;
            vid64[2 * e + 1] = e;
            dat64[e] = 0;
        }
        vf_plan_input big = {64, len64, 2, vid64, dat64};
        CHECK_OK(vf_plan_partition(&big, VF_PARTITION_FILE_GROUP, 1, &t, &n));
        CHECK_EQ_INT(n, 16);
        if (n == 16)
            CHECK_EQ_INT(t[3].first_episode, 12);
        /* cam0: each task of 4 episodes touches 1 file; cam1: 4 -> 16 + 64. */
        CHECK_EQ_INT(vf_plan_video_opens(&big, t, n), 80);
        free(t);
        CHECK_OK(vf_plan_partition(&big, VF_PARTITION_FILE_GROUP, 16, &t, &n));
        CHECK_EQ_INT(n, 64); /* 4 files per consumer or fewer: one primary file per task */
        free(t);
    }
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_EPISODE, 1, &t, &n));
    CHECK_EQ_INT(n, 6);
    CHECK_EQ_INT(vf_plan_video_opens(&in, t, n), 12);
    free(t);
    /* Sequential over 2 consumers: 210 frames, split at 105: episodes
     * starting before 105 (0..3, start 60) vs 4..5 (start 100 -> slot 0!
     * 100*2/210 = 0, so 0..4 and 5). */
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_SEQUENTIAL, 2, &t, &n));
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK_EQ_INT(t[0].num_episodes, 5);
        CHECK_EQ_INT(t[1].first_episode, 5);
        /* task 0 uses cam0 files {0,1}, cam1 {0,1}; task 1 one file each */
        CHECK_EQ_INT(vf_plan_video_opens(&in, t, n), 6);
    }
    free(t);
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_SEQUENTIAL, 100, &t, &n));
    CHECK_EQ_INT(n, 6); /* at most one task per episode */
    free(t);
    /* No camera: groups by data file. */
    in.num_cameras = 0;
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_FILE_GROUP, 1, &t, &n));
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(vf_plan_video_opens(&in, t, n), 0);
    free(t);
    CHECK_ERR(vf_plan_partition(&in, (vf_partition)7, 1, &t, &n), VF_EINVAL, "unknown partition");
    CHECK_EQ_INT(vf_plan_partition_from_name("file_group"), VF_PARTITION_FILE_GROUP);
    CHECK_EQ_INT(vf_plan_partition_from_name("bogus"), -1);
}

/* File groups on a make-sample dataset with rollover: recomputed from the
 * dataset's own per-episode file locations. */
static void test_partitions_dataset(void)
{
    char *root = make_dataset("plan", 12, 30, 0.03, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    size_t ne = vf_dataset_num_episodes(d), nc = vf_dataset_num_cameras(d);
    CHECK_EQ_INT(nc, 2);
    CHECK(vf_dataset_num_video_files(d, 0) >= 2); /* rollover happened */
    size_t groups = 0;
    int64_t frames = 0;
    for (size_t e = 0; e < ne; e++) {
        frames += vf_dataset_episode(d, e)->length;
        int same = e > 0;
        for (size_t c = 0; c < nc && same; c++) {
            vf_video_span a, b;
            vf_dataset_episode_video(d, e - 1, c, &a);
            vf_dataset_episode_video(d, e, c, &b);
            same = a.file == b.file;
        }
        groups += !same;
    }
    size_t files = 0;
    for (size_t c = 0; c < nc; c++)
        files += vf_dataset_num_video_files(d, c);
    vf_plan_summary s;
    (void)groups;
    /* File groups follow the camera with the most files. */
    size_t primary_files = 0;
    for (size_t c = 0; c < nc; c++)
        primary_files = VF_MAX(primary_files, vf_dataset_num_video_files(d, c));
    CHECK_OK(vf_plan_summarize(d, VF_PARTITION_FILE_GROUP, 1, 1, &s));
    CHECK_EQ_INT(s.tasks, primary_files);
    CHECK(s.tasks < ne);             /* many episodes per file */
    CHECK(s.video_opens >= files);
    CHECK(s.video_opens <= s.tasks * nc + files);
    CHECK_EQ_INT(s.episodes, ne);
    CHECK_EQ_INT(s.frames, frames);
    CHECK_OK(vf_plan_summarize(d, VF_PARTITION_EPISODE, 1, 1, &s));
    CHECK_EQ_INT(s.tasks, ne);
    CHECK_EQ_INT(s.video_opens, ne * nc);
    CHECK_OK(vf_plan_summarize(d, VF_PARTITION_SEQUENTIAL, 1, 1, &s));
    CHECK_EQ_INT(s.tasks, 1);
    CHECK_EQ_INT(s.video_opens, files);
    CHECK_ERR(vf_plan_summarize(d, VF_PARTITION_SEQUENTIAL, 0, 1, &s), VF_EINVAL, "world size");
    char *json = NULL;
    CHECK_OK(vf_plan_json(d, 2, 3, 0, &json));
    CHECK(json && strstr(json, "\"file_group\"") && strstr(json, "\"video_opens\"") &&
          strstr(json, "\"consumers\":6"));
    free(json);
    vf_dataset_close(d);
    remove_dataset(root);
}

static vf_plan_epoch_settings epoch_settings(void)
{
    vf_plan_epoch_settings s;
    memset(&s, 0, sizeof s);
    s.seed = 7;
    s.shuffle = 1;
    s.world_size = 1;
    s.num_consumers = 1;
    s.consumer = -1;
    s.batch_size = 4;
    return s;
}

static int is_permutation(const int64_t *v, int64_t n, int64_t of)
{
    if (n != of)
        return 0;
    int64_t *c = malloc((size_t)(n ? n : 1) * sizeof *c);
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_i64);
    int ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= c[i] == i;
    free(c);
    return ok;
}

static void test_epoch_map(void)
{
    vf_plan_epoch_settings s = epoch_settings();
    vf_plan_epoch a, b, c;
    CHECK_OK(vf_plan_epoch_build(&s, 103, NULL, 0, &a));
    CHECK(is_permutation(a.positions, a.num_samples, 103));
    CHECK_EQ_INT(a.num_batches, 26); /* 25 full + 1 of 3 */
    CHECK_EQ_INT(a.batch_start[25], 100);
    CHECK_EQ_INT(a.batch_start[26], 103);
    CHECK_OK(vf_plan_epoch_build(&s, 103, NULL, 0, &b));
    CHECK(memcmp(a.positions, b.positions, 103 * sizeof(int64_t)) == 0);
    s.seed = 8;
    CHECK_OK(vf_plan_epoch_build(&s, 103, NULL, 0, &c));
    CHECK(memcmp(a.positions, c.positions, 103 * sizeof(int64_t)) != 0);
    vf_plan_epoch_free(&c);
    s.seed = 7;
    s.epoch = 1;
    CHECK_OK(vf_plan_epoch_build(&s, 103, NULL, 0, &c));
    CHECK(memcmp(a.positions, c.positions, 103 * sizeof(int64_t)) != 0);
    CHECK(is_permutation(c.positions, c.num_samples, 103));
    vf_plan_epoch_free(&c);
    s.shuffle = 0;
    s.drop_last = 1;
    CHECK_OK(vf_plan_epoch_build(&s, 103, NULL, 0, &c));
    CHECK_EQ_INT(c.num_samples, 100);
    CHECK_EQ_INT(c.num_batches, 25);
    for (int64_t i = 0; i < c.num_samples; i++)
        CHECK_EQ_INT(c.positions[i], i);
    vf_plan_epoch_free(&a);
    vf_plan_epoch_free(&b);
    vf_plan_epoch_free(&c);
}

/* Ranks: equal counts; the remainder wraps (pad) or is dropped; consumers
 * of a rank cover its slice exactly once; the interleaved loader equals the
 * union of its consumers. */
static void test_ranks_and_consumers(void)
{
    const int64_t n = 103;
    int world = 4;
    vf_plan_epoch_settings s = epoch_settings();
    s.world_size = world;
    int64_t counts[103] = {0};
    int64_t total = 0;
    for (int r = 0; r < world; r++) {
        s.rank = r;
        vf_plan_epoch e;
        CHECK_OK(vf_plan_epoch_build(&s, n, NULL, 0, &e));
        CHECK_EQ_INT(e.num_samples, 26); /* ceil(103 / 4) */
        for (int64_t i = 0; i < e.num_samples; i++)
            counts[e.positions[i]]++;
        total += e.num_samples;
        vf_plan_epoch_free(&e);
    }
    CHECK_EQ_INT(total, 104);
    int64_t once = 0, twice = 0;
    for (int64_t i = 0; i < n; i++) {
        once += counts[i] == 1;
        twice += counts[i] == 2;
    }
    CHECK_EQ_INT(once, 102);
    CHECK_EQ_INT(twice, 1); /* one padded sample: the first of the global sequence */
    s.drop_last = 1;
    s.rank = 3;
    vf_plan_epoch e;
    CHECK_OK(vf_plan_epoch_build(&s, n, NULL, 0, &e));
    CHECK_EQ_INT(e.num_samples, 24); /* floor(103/4) = 25, then drop_last batch of 1 */
    vf_plan_epoch_free(&e);

    /* Consumers: rank 1 of 2, 3 consumers. */
    s = epoch_settings();
    s.world_size = 2;
    s.rank = 1;
    s.num_consumers = 3;
    vf_plan_epoch all;
    CHECK_OK(vf_plan_epoch_build(&s, n, NULL, 0, &all));
    CHECK_EQ_INT(all.num_samples, 52);
    int64_t *union_ = malloc(52 * sizeof *union_);
    int64_t k = 0;
    for (int c = 0; c < 3; c++) {
        s.consumer = c;
        vf_plan_epoch one;
        CHECK_OK(vf_plan_epoch_build(&s, n, NULL, 0, &one));
        CHECK(one.num_samples == 17 || one.num_samples == 18);
        for (size_t bi = 0; bi < one.num_batches; bi++)
            CHECK_EQ_INT(one.batch_consumer[bi], c);
        for (int64_t i = 0; i < one.num_samples && k < 52; i++)
            union_[k++] = one.positions[i];
        /* The interleaved loader's batches of consumer c are exactly these. */
        int64_t m = 0;
        for (size_t bi = 0; bi < all.num_batches; bi++)
            if (all.batch_consumer[bi] == c)
                for (int64_t i = all.batch_start[bi]; i < all.batch_start[bi + 1]; i++)
                    CHECK_EQ_INT(all.positions[i], one.positions[m++]);
        CHECK_EQ_INT(m, one.num_samples);
        vf_plan_epoch_free(&one);
    }
    CHECK_EQ_INT(k, 52);
    qsort(union_, (size_t)k, sizeof *union_, cmp_i64);
    for (int64_t i = 1; i < k; i++)
        CHECK(union_[i] != union_[i - 1]); /* no duplicate inside a rank */
    /* Round-robin: batch 0 from consumer 0, batch 1 from consumer 1, ... */
    CHECK_EQ_INT(all.batch_consumer[0], 0);
    CHECK_EQ_INT(all.batch_consumer[1], 1);
    CHECK_EQ_INT(all.batch_consumer[2], 2);
    CHECK_EQ_INT(all.batch_consumer[3], 0);
    free(union_);
    vf_plan_epoch_free(&all);

    s = epoch_settings();
    s.consumer = 1;
    CHECK_ERR(vf_plan_epoch_build(&s, n, NULL, 0, &e), VF_EINVAL, "consumer 1");
}

static void test_epoch_stream(void)
{
    int64_t lengths[] = {5, 7, 3, 9, 4, 6};
    int64_t video[] = {0, 0, 1, 1, 2, 2};
    vf_plan_input in = {6, lengths, 1, video, NULL};
    vf_plan_task *t;
    size_t nt;
    CHECK_OK(vf_plan_partition(&in, VF_PARTITION_FILE_GROUP, 1, &t, &nt));
    CHECK_EQ_INT(nt, 3);
    vf_plan_epoch_settings s = epoch_settings();
    s.batch_size = 5;
    vf_plan_epoch e;
    CHECK_OK(vf_plan_epoch_build(&s, 34, t, nt, &e));
    CHECK(is_permutation(e.positions, e.num_samples, 34));
    /* Tasks stay whole and in order inside: a task's positions are contiguous. */
    int64_t runs = 1;
    for (int64_t i = 1; i < e.num_samples; i++)
        if (e.positions[i] != e.positions[i - 1] + 1)
            runs++;
    CHECK(runs <= 3);
    vf_plan_epoch_free(&e);
    /* With a shuffle buffer: still a permutation, different order, seeded. */
    s.shuffle_buffer = 8;
    vf_plan_epoch f, g;
    CHECK_OK(vf_plan_epoch_build(&s, 34, t, nt, &f));
    CHECK_OK(vf_plan_epoch_build(&s, 34, t, nt, &g));
    CHECK(is_permutation(f.positions, f.num_samples, 34));
    CHECK(memcmp(f.positions, g.positions, 34 * sizeof(int64_t)) == 0);
    int64_t far = 0;
    runs = 1;
    for (int64_t i = 1; i < f.num_samples; i++)
        runs += f.positions[i] != f.positions[i - 1] + 1;
    CHECK(runs > 3);
    /* Bounded: the value emitted at i was among the first i + buffer of the unbuffered order. */
    vf_plan_epoch_settings s0 = s;
    s0.shuffle_buffer = 0;
    CHECK_OK(vf_plan_epoch_build(&s0, 34, t, nt, &e));
    for (int64_t i = 0; i < 34; i++) {
        int64_t where = -1;
        for (int64_t j = 0; j < 34; j++)
            if (e.positions[j] == f.positions[i])
                where = j;
        if (where >= i + 8)
            far++;
    }
    CHECK_EQ_INT(far, 0);
    vf_plan_epoch_free(&e);
    vf_plan_epoch_free(&f);
    vf_plan_epoch_free(&g);
    free(t);

    /* The buffer alone. */
    int64_t v[50], out[50];
    for (int i = 0; i < 50; i++)
        v[i] = i;
    vf_rng r;
    vf_rng_init(&r, 1);
    CHECK_OK(vf_plan_shuffle_buffer(v, 50, 10, &r, out));
    CHECK(is_permutation(out, 50, 50));
    CHECK_OK(vf_plan_shuffle_buffer(v, 50, 0, &r, out));
    CHECK(memcmp(v, out, sizeof v) == 0);
}

/* The public task lists: partition tasks tile the selection; every
 * consumer's pieces (one walk over all consumers, or one consumer at a
 * time) are exactly the positions its plan emits; opens counted from them
 * lie between the lower bound and the per-task count. */
static int cmp_task_row(const void *pa, const void *pb)
{
    const vf_task_info *a = pa, *b = pb;
    return a->first_row < b->first_row ? -1 : a->first_row > b->first_row;
}

static void test_task_api(void)
{
    char *root = make_dataset("tasks", 14, 30, 0.03, NULL);
    vf_dataset *d = open_dataset(root, NULL, 0);
    size_t ne = vf_dataset_num_episodes(d);
    int64_t frames = 0;
    for (size_t e = 0; e < ne; e++)
        frames += vf_dataset_episode(d, e)->length;
    vf_task_info *t;
    size_t n;
    CHECK_OK(vf_plan_tasks(d, VF_PARTITION_FILE_GROUP, 1, 1, &t, &n));
    int64_t at = 0;
    size_t ep = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(t[i].id, i);
        CHECK_EQ_INT(t[i].first_row, at);
        CHECK_EQ_INT(t[i].first_episode, ep);
        CHECK(t[i].estimated_bytes > t[i].num_rows * 3 * 64); /* two cameras of 96x64 at least */
        at += t[i].num_rows;
        ep += t[i].num_episodes;
    }
    CHECK_EQ_INT(at, frames);
    CHECK_EQ_INT(ep, ne);
    free(t);

    vf_loader_settings ls;
    vf_loader_defaults(&ls);
    ls.mode = VF_MODE_STREAM;
    ls.batch_size = 4;
    ls.seed = 5;
    ls.world_size = 3;
    ls.num_consumers = 2;
    CHECK_OK(vf_plan_consumer_tasks(d, &ls, 2, -1, -1, &t, &n));
    int64_t *count = calloc((size_t)frames, sizeof *count);
    for (size_t i = 0; i < n; i++)
        for (int64_t p = t[i].first_row; p < t[i].first_row + t[i].num_rows; p++)
            count[p]++;
    int64_t once = 0, more = 0;
    for (int64_t p = 0; p < frames; p++) {
        once += count[p] >= 1;
        more += count[p] > 1 ? count[p] - 1 : 0;
    }
    CHECK_EQ_INT(once, frames);
    CHECK_EQ_INT(more, (frames + 2) / 3 * 3 - frames); /* the wrap padding */
    /* Each consumer's pieces are its plan's positions (as sets). */
    for (int rank = 0; rank < 3; rank++)
        for (int c = 0; c < 2; c++) {
            vf_task_info *mine;
            size_t nm;
            CHECK_OK(vf_plan_consumer_tasks(d, &ls, 2, rank, c, &mine, &nm));
            vf_plan_input in;
            vf_plan_task *tasks;
            size_t nt;
            CHECK_OK(vf_plan_input_from_dataset(d, &in));
            CHECK_OK(vf_plan_partition(&in, VF_PARTITION_FILE_GROUP, 6, &tasks, &nt));
            vf_plan_epoch_settings es = {.seed = 5, .epoch = 2, .shuffle = 1, .rank = rank, .world_size = 3,
                                         .num_consumers = 2, .consumer = c, .batch_size = 4};
            vf_plan_epoch e;
            CHECK_OK(vf_plan_epoch_build(&es, frames, tasks, nt, &e));
            int64_t k = 0;
            int same = 1;
            for (size_t i = 0; i < nm; i++) {
                CHECK(mine[i].rank == rank && mine[i].consumer == c);
                for (int64_t p = mine[i].first_row; p < mine[i].first_row + mine[i].num_rows; p++, k++)
                    same &= k < e.num_samples && e.positions[k] == p; /* no buffer: the same order */
            }
            CHECK(same && k == e.num_samples);
            vf_plan_epoch_free(&e);
            free(tasks);
            vf_plan_input_free(&in);
            free(mine);
        }
    free(count);
    qsort(t, n, sizeof *t, cmp_task_row);
    free(t);

    vf_plan_opens o;
    ls.world_size = 1;
    ls.num_consumers = 1;
    CHECK_OK(vf_plan_count_opens(d, &ls, 0, &o));
    size_t files = 0;
    for (size_t c = 0; c < vf_dataset_num_cameras(d); c++)
        files += vf_dataset_num_video_files(d, c);
    CHECK_EQ_INT(o.distinct_files, files);
    CHECK_EQ_INT(o.consumer_opens, files); /* one consumer opens each file once */
    CHECK_EQ_INT(o.lower_bound, files);
    CHECK_EQ_INT(o.samples, frames);
    ls.world_size = 4;
    ls.num_consumers = 3;
    CHECK_OK(vf_plan_count_opens(d, &ls, 0, &o));
    CHECK(o.consumer_opens >= o.lower_bound && o.lower_bound >= 12 * 2);
    ls.mode = VF_MODE_MAP; /* counted too: every consumer's random order, batch by batch */
    CHECK_OK(vf_plan_count_opens(d, &ls, 0, &o));
    CHECK(o.consumer_opens >= o.lower_bound && o.lower_bound >= 12 * 2 && o.task_opens == 0);
    CHECK_ERR(vf_plan_consumer_tasks(d, &ls, 0, 0, 0, &t, &n), VF_EINVAL, "map mode has no tasks");
    ls.mode = VF_MODE_POOL;
    CHECK_ERR(vf_plan_consumer_tasks(d, &ls, 0, 4, 0, &t, &n), VF_EINVAL, "rank 4, consumer 0 is not in");
    vf_dataset_close(d);
    remove_dataset(root);
}

int main(void)
{
    test_task_api();
    test_partitions_by_hand();
    test_partitions_dataset();
    test_epoch_map();
    test_ranks_and_consumers();
    test_epoch_stream();
    return vf_test_finish("test_plan");
}
