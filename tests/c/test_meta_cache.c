/* test_meta_cache.c: the persistent metadata cache (meta_cache.c) on v3.0
 * datasets written here: a hit after the first open with the same model
 * as a fresh decode; a miss after the episodes file is touched, rewritten
 * with other content, or rewritten at the same size with its mtime put
 * back; a corrupt, truncated or foreign cache file rebuilt with a warning
 * (a FIFO in its place: a miss, not a hang);
 * a cache folder that cannot be created; the cache turned off by setting
 * and by VF_META_CACHE=0 (nothing written); pruning of the entries of
 * deleted datasets and of old temporary files; and the entry format itself
 * (round trip, each key field, every truncation). VF_CACHE_DIR points at
 * scratch folders throughout. */
#define _GNU_SOURCE /* utimensat, setenv, st_mtim */
#include "dataset/dataset.h"
#include "dataset/meta_cache.h"
#include "test_pq_helpers.h"
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- writing datasets ------------------------------------------------------ */

#define EPISODES 25
#define PER_FILE 10
#define RG 4

static void write_info(const char *dir)
{
    int64_t frames = 0;
    for (int e = 0; e < EPISODES; e++)
        frames += 1 + e % 3;
    char *info = vf_asprintf(
        "{\"codebase_version\": \"v3.0\", \"robot_type\": \"bot\", \"total_episodes\": %d,\n"
        " \"total_frames\": %lld, \"total_tasks\": 2, \"chunks_size\": 1000, \"fps\": 10,\n"
        " \"data_path\": \"data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet\",\n"
        " \"video_path\": \"videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4\",\n"
        " \"features\": {\n"
        "  \"action\": {\"dtype\": \"float64\", \"shape\": [1], \"names\": null},\n"
        "  \"cam\": {\"dtype\": \"video\", \"shape\": [48, 64, 3], \"names\": null,\n"
        "          \"info\": {\"video.codec\": \"av1\", \"video.width\": 64, \"video.height\": 48,\n"
        "                   \"video.pix_fmt\": \"yuv420p\", \"video.fps\": 10}},\n"
        "  \"timestamp\": {\"dtype\": \"float32\", \"shape\": [1], \"names\": null},\n"
        "  \"frame_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
        "  \"episode_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
        "  \"index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null},\n"
        "  \"task_index\": {\"dtype\": \"int64\", \"shape\": [1], \"names\": null}}}\n",
        EPISODES, (long long)frames);
    vf_test_write_text(dir, "meta/info.json", info);
    free(info);
}

static void write_tasks(const char *dir)
{
    char *path = vf_test_path_in(dir, "meta/tasks.parquet");
    vf_pq_writer *w;
    CHECK_OK(vf_pq_writer_open(&w, path, NULL));
    int64_t ti[2] = {0, 1}, offs[3] = {0, 4, 9};
    vf_pq_array f[2] = {int64_array("task_index", ti, 2), int64_array("task", NULL, 2)};
    f[1].type = VF_PQ_T_STRING;
    f[1].offsets = offs;
    f[1].data = (uint8_t *)"pickplace";
    f[1].data_len = 9;
    CHECK_OK(vf_pq_writer_write_row_group(w, f, 2));
    CHECK_OK(vf_pq_writer_close(w));
    free(path);
}

/* Episodes file `file` (episodes file*PER_FILE ..), RG rows per row group,
 * uncompressed PLAIN (so a same-length edit keeps the size). Episode e's
 * tasks: ["pick"], ["pick", "place"] when e % 5 == 0, null for episode 7;
 * `word` replaces "pick" (4 bytes) in this file. from_timestamp is shifted
 * by `shift`. */
static void write_episodes_file(const char *dir, int file, const char *word, double shift)
{
    char rel[64];
    snprintf(rel, sizeof rel, "meta/episodes/chunk-000/file-%03d.parquet", file);
    char *path = vf_test_path_in(dir, rel);
    vf_pq_writer_settings ws;
    vf_pq_writer_defaults(&ws);
    ws.codec = VF_PQ_UNCOMPRESSED;
    ws.dictionary = 0;
    vf_pq_writer *w;
    CHECK_OK(vf_pq_writer_open(&w, path, &ws));
    int first = file * PER_FILE, count = VF_MIN(PER_FILE, EPISODES - first);
    int64_t from = 0;
    for (int e = 0; e < first; e++)
        from += 1 + e % 3;
    for (int start = 0; start < count; start += RG) {
        int m = VF_MIN(RG, count - start);
        int64_t c[8][RG], loffs[RG + 1], soffs[2 * RG + 1];
        double vfrom[RG], vto[RG], stat[RG];
        uint8_t lvalid[RG], data[16 * RG];
        int nitems = 0, nbytes = 0, nulls = 0;
        loffs[0] = soffs[0] = 0;
        for (int i = 0; i < m; i++) {
            int e = first + start + i;
            int64_t len = 1 + e % 3;
            c[0][i] = e;
            c[1][i] = len;
            c[2][i] = 0;
            c[3][i] = e / 8;
            c[4][i] = from;
            c[5][i] = from + len;
            c[6][i] = 0;
            c[7][i] = e / 12;
            vfrom[i] = (e % 12) * 0.3 + shift;
            vto[i] = vfrom[i] + (double)len / 10.0;
            stat[i] = e * 0.25;
            from += len;
            lvalid[i] = e != 7;
            nulls += e == 7;
            if (e != 7) {
                memcpy(data + nbytes, word, 4);
                nbytes += 4;
                soffs[++nitems] = nbytes;
                if (e % 5 == 0) {
                    memcpy(data + nbytes, "place", 5);
                    nbytes += 5;
                    soffs[++nitems] = nbytes;
                }
            }
            loffs[i + 1] = nitems;
        }
        vf_pq_array item = int64_array("element", NULL, nitems);
        item.type = VF_PQ_T_STRING;
        item.offsets = soffs;
        item.data = data;
        item.data_len = nbytes;
        vf_pq_array f[12] = {
            int64_array("episode_index", c[0], m),
            int64_array("length", c[1], m),
            int64_array("data/chunk_index", c[2], m),
            int64_array("data/file_index", c[3], m),
            int64_array("dataset_from_index", c[4], m),
            int64_array("dataset_to_index", c[5], m),
            int64_array("tasks", NULL, m),
            double_array("stats/action/mean", stat, m),
            int64_array("videos/cam/chunk_index", c[6], m),
            int64_array("videos/cam/file_index", c[7], m),
            double_array("videos/cam/from_timestamp", vfrom, m),
            double_array("videos/cam/to_timestamp", vto, m),
        };
        f[6].type = VF_PQ_T_LIST;
        f[6].offsets = loffs;
        f[6].num_children = 1;
        f[6].children = &item;
        f[6].valid = nulls ? lvalid : NULL;
        f[6].null_count = nulls;
        CHECK_OK(vf_pq_writer_write_row_group(w, f, 12));
    }
    CHECK_OK(vf_pq_writer_close(w));
    free(path);
}

static void write_dataset(const char *dir)
{
    write_info(dir);
    write_tasks(dir);
    for (int f = 0; f * PER_FILE < EPISODES; f++)
        write_episodes_file(dir, f, "pick", 0.0);
}

/* ---- opening and comparing ------------------------------------------------- */

/* Everything the metadata put into the model, as text. */
static char *model_dump(const vf_dataset *d)
{
    vf_buf b = {0};
    vf_buf_printf(&b, "episodes %zu files %zu fp %016llx\n", d->num_all_episodes, d->num_meta_files,
                  (unsigned long long)vf_dataset_fingerprint(d));
    for (size_t i = 0; i < d->num_all_episodes; i++) {
        const vf_ds_episode *e = &d->episodes[i];
        vf_buf_printf(&b, "%lld %lld %lld %lld %d %d %d %lld |", (long long)e->pub.episode_index,
                      (long long)e->pub.length, (long long)e->pub.from_index, (long long)e->pub.to_index,
                      e->data_chunk, e->data_file, e->meta_file, (long long)e->row_offset);
        for (size_t c = 0; c < d->num_cameras; c++)
            vf_buf_printf(&b, " %d %d %.17g %.17g", e->video[c].chunk_index, e->video[c].file_index,
                          e->video[c].from_timestamp, e->video[c].to_timestamp);
        vf_buf_printf(&b, " | %zu:", e->pub.num_tasks);
        for (size_t t = 0; t < e->pub.num_tasks; t++)
            vf_buf_printf(&b, " '%s'", e->pub.tasks[t]);
        vf_buf_printf(&b, "\n");
    }
    for (size_t i = 0; i < vf_dataset_num_problems(d); i++) {
        const vf_problem *p = vf_dataset_problem(d, i);
        vf_buf_printf(&b, "problem %d %s %lld %s %s\n", p->severity, p->file, (long long)p->episode, p->column,
                      p->message);
    }
    return vf_buf_take_string(&b);
}

typedef struct opened {
    char *dump;
    vf_meta_cache_stats stats;
    char dir[512];
} opened;

/* Opens dir (metadata only), records its model and the cache counters. */
static opened open_ds(const char *dir, int meta_cache)
{
    vf_dataset_settings st;
    vf_dataset_defaults(&st);
    st.check_files = VF_CHECK_FILES_OFF;
    st.check_videos = 0;
    st.meta_cache = meta_cache;
    vf_dataset *d = NULL;
    opened o;
    memset(&o, 0, sizeof o);
    CHECK_OK(vf_dataset_open(&d, dir, &st));
    if (!d) {
        o.dump = vf_strdup("");
        return o;
    }
    o.dump = model_dump(d);
    vf_dataset_meta_cache_stats(d, &o.stats);
    snprintf(o.dir, sizeof o.dir, "%s", o.stats.dir ? o.stats.dir : "");
    o.stats.dir = NULL; /* owned by d */
    vf_dataset_close(d);
    return o;
}

#define CHECK_COUNTS(o, h, m, w)                                                                                     \
    do {                                                                                                           \
        CHECK_EQ_INT((o).stats.hits, h);                                                                           \
        CHECK_EQ_INT((o).stats.misses, m);                                                                         \
        CHECK_EQ_INT((o).stats.written, w);                                                                        \
    } while (0)

static void check_same_model(const opened *a, const char *reference)
{
    CHECK(!strcmp(a->dump, reference));
    if (strcmp(a->dump, reference))
        fprintf(stderr, "--- model with cache:\n%s--- reference:\n%s", a->dump, reference);
}

/* Names in folder dir (0 when it does not exist); *temps counts names not
 * ending in .vfmeta (a left-over temporary file). */
static int count_entries(const char *dir, int *temps)
{
    DIR *dh = opendir(dir);
    int n = 0;
    if (temps)
        *temps = 0;
    if (!dh)
        return 0;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        n++;
        size_t len = strlen(e->d_name);
        if (temps && (len < 7 || strcmp(e->d_name + len - 7, ".vfmeta")))
            (*temps)++;
    }
    closedir(dh);
    return n;
}

/* The path of the only cache entry of dir/meta, or NULL. */
static char *first_entry(const char *meta_dir)
{
    DIR *dh = opendir(meta_dir);
    char *path = NULL;
    struct dirent *e;
    while (dh && (e = readdir(dh)) != NULL)
        if (e->d_name[0] != '.' && !path)
            path = vf_path_join(meta_dir, e->d_name);
    if (dh)
        closedir(dh);
    return path;
}

static char *episodes_path(const char *dir, int file)
{
    char rel[64];
    snprintf(rel, sizeof rel, "meta/episodes/chunk-000/file-%03d.parquet", file);
    return vf_path_join(dir, rel);
}

static void set_mtime(const char *path, struct timespec t)
{
    struct timespec times[2] = {t, t};
    CHECK(utimensat(AT_FDCWD, path, times, 0) == 0);
}

/* ---- tests ------------------------------------------------------------------- */

/* Hit after the first open, same model; misses on every kind of change. */
static void test_hits_and_invalidation(void)
{
    char *dir = vf_test_tmpdir("mc-data"), *cache = vf_test_tmpdir("mc-cache");
    char *meta = vf_path_join(cache, "meta");
    setenv("VF_CACHE_DIR", cache, 1);
    unsetenv("VF_META_CACHE");
    write_dataset(dir);
    opened ref = open_ds(dir, 0);
    CHECK(!ref.stats.enabled);
    CHECK_COUNTS(ref, 0, 0, 0);
    CHECK_EQ_INT(count_entries(meta, NULL), 0); /* off: the folder is not even created */
    CHECK(strstr(ref.dump, "episodes 25 files 3") != NULL);
    CHECK(strstr(ref.dump, "\n7 2 ") && strstr(ref.dump, "| 0:\n")); /* episode 7: null tasks */
    CHECK(strstr(ref.dump, "| 2: 'pick' 'place'\n") != NULL);

    opened first = open_ds(dir, 1);
    CHECK(first.stats.enabled);
    CHECK(!strcmp(first.dir, meta));
    CHECK_COUNTS(first, 0, 3, 3);
    check_same_model(&first, ref.dump);
    int temps = -1;
    CHECK_EQ_INT(count_entries(meta, &temps), 3);
    CHECK_EQ_INT(temps, 0);
    struct stat st;
    CHECK(stat(meta, &st) == 0 && (st.st_mode & 0777) == 0700);

    opened second = open_ds(dir, 1);
    CHECK_COUNTS(second, 3, 0, 0);
    check_same_model(&second, ref.dump);

    /* touched: a new mtime is another identity */
    char *f1 = episodes_path(dir, 1);
    struct stat before;
    CHECK(stat(f1, &before) == 0);
    set_mtime(f1, (struct timespec){.tv_sec = before.st_mtim.tv_sec - 100, .tv_nsec = 0});
    opened touched = open_ds(dir, 1);
    CHECK_COUNTS(touched, 2, 1, 1);
    check_same_model(&touched, ref.dump);
    CHECK_EQ_INT(count_entries(meta, NULL), 3); /* rewritten in place, not added */
    opened again = open_ds(dir, 1);
    CHECK_COUNTS(again, 3, 0, 0);

    /* rewritten with other content: the new content, not the cached one */
    write_episodes_file(dir, 1, "grab", 0.5);
    opened rewritten = open_ds(dir, 1);
    CHECK_COUNTS(rewritten, 2, 1, 1);
    CHECK(strstr(rewritten.dump, "'grab'") != NULL);
    opened rewritten_ref = open_ds(dir, 0);
    check_same_model(&rewritten, rewritten_ref.dump);

    /* the same size, mtime put back: the ctime and the footer tail differ */
    CHECK(stat(f1, &before) == 0);
    write_episodes_file(dir, 1, "grip", 0.5);
    struct stat after;
    CHECK(stat(f1, &after) == 0);
    CHECK_EQ_INT(after.st_size, before.st_size);
    set_mtime(f1, before.st_mtim);
    opened same_size = open_ds(dir, 1);
    CHECK_COUNTS(same_size, 2, 1, 1);
    CHECK(strstr(same_size.dump, "'grip'") && !strstr(same_size.dump, "'grab'"));
    opened same_size_ref = open_ds(dir, 0);
    check_same_model(&same_size, same_size_ref.dump);

    /* VF_META_CACHE=0 wins over the setting: nothing read or written */
    write_episodes_file(dir, 1, "pick", 0.0);
    setenv("VF_META_CACHE", "0", 1);
    opened env_off = open_ds(dir, 1);
    CHECK(!env_off.stats.enabled);
    CHECK_COUNTS(env_off, 0, 0, 0);
    check_same_model(&env_off, ref.dump);
    unsetenv("VF_META_CACHE");
    opened back = open_ds(dir, 1);
    CHECK_COUNTS(back, 2, 1, 1); /* file 1 changed while the cache was off */

    opened *all[] = {&ref, &first, &second, &touched, &again, &rewritten, &rewritten_ref, &same_size,
                     &same_size_ref, &env_off, &back};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->dump);
    free(f1);
    free(meta);
    vf_test_rmtree(dir);
    vf_test_rmtree(cache);
    free(dir);
    free(cache);
}

/* Damaged cache files: a warning naming the entry, the file decoded again,
 * the entry rewritten, the same model. */
static void test_corrupt_entries(void)
{
    char *dir = vf_test_tmpdir("mc-data"), *cache = vf_test_tmpdir("mc-cache");
    char *meta = vf_path_join(cache, "meta");
    setenv("VF_CACHE_DIR", cache, 1);
    write_info(dir);
    write_tasks(dir);
    write_episodes_file(dir, 0, "pick", 0.0); /* one file: one entry */
    opened ref = open_ds(dir, 0);
    opened first = open_ds(dir, 1);
    CHECK_COUNTS(first, 0, 1, 1);
    char *entry = first_entry(meta);
    CHECK(entry != NULL);
    uint8_t *good = NULL;
    size_t len = 0;
    CHECK_OK(vf_read_file(entry, &good, &len));
    enum { FLIP_BODY, FLIP_HEADER, TRUNCATE, GARBAGE, EMPTY, NUM_DAMAGES };
    for (int damage = 0; damage < NUM_DAMAGES && good; damage++) {
        FILE *f = fopen(entry, "wb");
        CHECK(f != NULL);
        if (!f)
            break;
        if (damage == FLIP_BODY || damage == FLIP_HEADER) {
            uint8_t *copy = malloc(len);
            memcpy(copy, good, len);
            copy[damage == FLIP_BODY ? len - 40 : 20] ^= 0x10;
            fwrite(copy, 1, len, f);
            free(copy);
        } else if (damage == TRUNCATE) {
            fwrite(good, 1, len / 2, f);
        } else if (damage == GARBAGE) {
            fputs("this is not a cache file at all, but long enough to have a header.................."
                  "..............................................",
                  f);
        }
        fclose(f);
        char log[4096];
        vf_test_capture_stderr_begin();
        opened o = open_ds(dir, 1);
        vf_test_capture_stderr_end(log, sizeof log);
        CHECK_COUNTS(o, 0, 1, 1);
        check_same_model(&o, ref.dump);
        /* FLIP_HEADER hits the stat data (a stale key, no warning); the rest warn */
        if (damage != FLIP_HEADER) {
            CHECK(strstr(log, entry) != NULL);
            CHECK(strstr(log, "decoding the file again") != NULL);
        }
        free(o.dump);
        opened healed = open_ds(dir, 1);
        CHECK_COUNTS(healed, 1, 0, 0);
        free(healed.dump);
    }
    /* a FIFO where the entry should be: a miss, not a hang; replaced by the store */
    CHECK(unlink(entry) == 0 && mkfifo(entry, 0600) == 0);
    opened fifo = open_ds(dir, 1);
    CHECK_COUNTS(fifo, 0, 1, 1);
    check_same_model(&fifo, ref.dump);
    struct stat st;
    CHECK(stat(entry, &st) == 0 && S_ISREG(st.st_mode));
    free(fifo.dump);
    free(good);
    free(entry);
    free(ref.dump);
    free(first.dump);
    free(meta);
    vf_test_rmtree(dir);
    vf_test_rmtree(cache);
    free(dir);
    free(cache);
}

/* A cache folder that cannot be created (its parent is a file), and one
 * that cannot be written (when not root): the open works, uncached. */
static void test_unusable_folder(void)
{
    char *dir = vf_test_tmpdir("mc-data"), *scratch = vf_test_tmpdir("mc-cache");
    write_dataset(dir);
    opened ref = open_ds(dir, 0);
    char *file = vf_path_join(scratch, "a-file");
    vf_test_write_text(scratch, "a-file", "x");
    char *under_file = vf_path_join(file, "cache");
    setenv("VF_CACHE_DIR", under_file, 1);
    opened o = open_ds(dir, 1);
    CHECK(o.stats.enabled);
    CHECK_COUNTS(o, 0, 3, 0);
    check_same_model(&o, ref.dump);
    free(o.dump);
    if (geteuid() != 0) { /* root writes anywhere */
        char *ro = vf_path_join(scratch, "ro");
        char *ro_meta = vf_path_join(ro, "meta");
        CHECK_OK(vf_mkdirs(ro_meta));
        CHECK(chmod(ro_meta, 0500) == 0);
        setenv("VF_CACHE_DIR", ro, 1);
        opened r = open_ds(dir, 1);
        CHECK_COUNTS(r, 0, 3, 0);
        check_same_model(&r, ref.dump);
        CHECK_EQ_INT(count_entries(ro_meta, NULL), 0);
        chmod(ro_meta, 0700);
        free(r.dump);
        free(ro);
        free(ro_meta);
    }
    free(ref.dump);
    free(file);
    free(under_file);
    vf_test_rmtree(dir);
    vf_test_rmtree(scratch);
    free(dir);
    free(scratch);
}

/* An open that writes entries removes those of deleted datasets and old
 * temporary files, and leaves everything else. */
static void test_prune(void)
{
    char *gone = vf_test_tmpdir("mc-gone"), *kept = vf_test_tmpdir("mc-kept"), *fresh = vf_test_tmpdir("mc-new");
    char *cache = vf_test_tmpdir("mc-cache");
    char *meta = vf_path_join(cache, "meta");
    setenv("VF_CACHE_DIR", cache, 1);
    write_dataset(gone);
    write_dataset(kept);
    write_dataset(fresh);
    opened a = open_ds(gone, 1), b = open_ds(kept, 1);
    CHECK_COUNTS(a, 0, 3, 3);
    CHECK_COUNTS(b, 0, 3, 3);
    CHECK_EQ_INT(count_entries(meta, NULL), 6);
    vf_test_rmtree(gone);
    vf_test_write_text(meta, "old.vfmeta.AbCdEf", "x");   /* a crashed writer's, 2 hours old */
    vf_test_write_text(meta, "young.vfmeta.AbCdEf", "x"); /* a writer at work */
    vf_test_write_text(meta, "notes.txt", "x");           /* not ours */
    vf_test_write_text(meta, "junk.vfmeta", "not a cache file");
    char *old = vf_path_join(meta, "old.vfmeta.AbCdEf");
    set_mtime(old, (struct timespec){.tv_sec = time(NULL) - 7200, .tv_nsec = 0});
    CHECK_EQ_INT(count_entries(meta, NULL), 10);
    opened b2 = open_ds(kept, 1); /* all hits: writes nothing, prunes nothing */
    CHECK_COUNTS(b2, 3, 0, 0);
    CHECK_EQ_INT(count_entries(meta, NULL), 10);
    opened c = open_ds(fresh, 1); /* writes: prunes */
    CHECK_COUNTS(c, 0, 3, 3);
    int temps = 0;
    CHECK_EQ_INT(count_entries(meta, &temps), 3 + 3 + 3); /* kept's, fresh's, young temp, notes, junk */
    CHECK_EQ_INT(temps, 2);                               /* young.vfmeta.AbCdEf, notes.txt */
    CHECK(!vf_file_exists(old));
    opened b3 = open_ds(kept, 1);
    CHECK_COUNTS(b3, 3, 0, 0);
    opened *all[] = {&a, &b, &b2, &c, &b3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->dump);
    free(old);
    free(meta);
    vf_test_rmtree(kept);
    vf_test_rmtree(fresh);
    vf_test_rmtree(cache);
    free(gone);
    free(kept);
    free(fresh);
    free(cache);
}

/* The entry format: round trip; every key field; every truncation. */
static void test_entry_format(void)
{
    int64_t fixed[VF_DS_EP_NFIXED][3], chunk[3] = {0, 0, 1}, file[3] = {4, 5, 6};
    double from[3] = {0, 1.5, 3}, to[3] = {1.5, 3, 4.5};
    for (int k = 0; k < VF_DS_EP_NFIXED; k++)
        for (int i = 0; i < 3; i++)
            fixed[k][i] = k * 10 + i;
    int64_t loffs[4] = {0, 1, 1, 3}, soffs[4] = {0, 4, 9, 12};
    uint8_t lvalid[3] = {1, 0, 1};
    vf_ds_episodes_columns cols;
    memset(&cols, 0, sizeof cols);
    cols.rows = 3;
    cols.num_cameras = 1;
    for (int k = 0; k < VF_DS_EP_NFIXED; k++)
        cols.fixed[k] = fixed[k];
    int64_t *vchunk[1] = {chunk}, *vfile[1] = {file};
    double *vfrom[1] = {from}, *vto[1] = {to};
    cols.vchunk = vchunk;
    cols.vfile = vfile;
    cols.vfrom = vfrom;
    cols.vto = vto;
    vf_pq_array items = int64_array("element", NULL, 3);
    items.type = VF_PQ_T_STRING;
    items.offsets = soffs;
    items.data = (uint8_t *)"pickplacecup";
    items.data_len = 12;
    cols.tasks = int64_array("tasks", NULL, 3);
    cols.tasks.type = VF_PQ_T_LIST;
    cols.tasks.offsets = loffs;
    cols.tasks.valid = lvalid;
    cols.tasks.num_children = 1;
    cols.tasks.children = &items;
    vf_ds_meta_key key = {.valid = 1, .size = 1234, .mtime_ns = 5, .ctime_ns = 6, .inode = 7, .device = 8};
    memset(key.tail_sha256, 0xab, sizeof key.tail_sha256);
    char ident[] = "/data/x/meta/episodes/chunk-000/file-000.parquet\0episode_index\nlength";
    key.ident = ident;
    key.ident_len = sizeof ident - 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    CHECK_OK(vf_ds_meta_cache_encode(&key, &cols, &buf, &len));
    CHECK(len % 8 == 0);

    uint8_t *copy = malloc(len);
    memcpy(copy, buf, len);
    vf_ds_episodes_columns out;
    CHECK_OK(vf_ds_meta_cache_decode(copy, len, &key, 1, 1, &out));
    CHECK_EQ_INT(out.rows, 3);
    CHECK(out.backing != NULL);
    for (int k = 0; k < VF_DS_EP_NFIXED && out.backing; k++)
        CHECK(!memcmp(out.fixed[k], fixed[k], sizeof fixed[k]));
    if (out.backing) {
        CHECK(!memcmp(out.vfile[0], file, sizeof file) && !memcmp(out.vto[0], to, sizeof to));
        CHECK(out.tasks.type == VF_PQ_T_LIST && out.tasks.valid && !out.tasks.valid[1]);
        CHECK_EQ_INT(out.tasks.null_count, 1);
        CHECK(out.task_items.type == VF_PQ_T_STRING && out.task_items.data_len == 12);
        CHECK(!memcmp(out.task_items.data, "pickplacecup", 12) && out.task_items.offsets[2] == 9);
    }
    vf_ds_episodes_columns_free(&out);

    /* another camera count is stale, never a misread */
    copy = malloc(len);
    memcpy(copy, buf, len);
    CHECK_EQ_INT(vf_ds_meta_cache_decode(copy, len, &key, 2, 1, &out), VF_ENOENT);

    /* each field of the key: stale (VF_ENOENT), not corrupt */
    for (int field = 0; field < 8; field++) {
        vf_ds_meta_key other = key;
        char other_ident[sizeof ident];
        memcpy(other_ident, ident, sizeof ident);
        other.ident = other_ident;
        switch (field) {
        case 0: other.size++; break;
        case 1: other.mtime_ns++; break;
        case 2: other.ctime_ns++; break;
        case 3: other.inode++; break;
        case 4: other.device++; break;
        case 5: other.tail_sha256[31] ^= 1; break;
        case 6: other_ident[sizeof ident - 2] = 'X'; break; /* another projection */
        case 7: other_ident[1] = 'D'; break;                /* another path */
        }
        copy = malloc(len);
        memcpy(copy, buf, len);
        CHECK_EQ_INT(vf_ds_meta_cache_decode(copy, len, &other, 1, 1, &out), VF_ENOENT);
    }
    /* every truncation: corrupt, never a crash (ASan) */
    for (size_t cut = 0; cut < len; cut++) {
        copy = malloc(cut ? cut : 1);
        memcpy(copy, buf, cut);
        CHECK_EQ_INT(vf_ds_meta_cache_decode(copy, cut, &key, 1, 1, &out), VF_ECORRUPT);
    }
    /* every single-byte flip past the header: corrupt by checksum */
    int detected = 0;
    for (size_t at = 112 + ((sizeof ident - 1 + 7) & ~(size_t)7); at < len; at++) {
        copy = malloc(len);
        memcpy(copy, buf, len);
        copy[at] ^= 0x40;
        detected += vf_ds_meta_cache_decode(copy, len, &key, 1, 1, &out) == VF_ECORRUPT;
    }
    CHECK_EQ_INT(detected, (int)(len - 112 - ((sizeof ident - 1 + 7) & ~(size_t)7)));
    /* another version: stale */
    copy = malloc(len);
    memcpy(copy, buf, len);
    copy[8] ^= 0x02;
    CHECK_EQ_INT(vf_ds_meta_cache_decode(copy, len, &key, 1, 1, &out), VF_ENOENT);
    free(buf);
}

int main(void)
{
    vf_log_set_level(VF_LOG_WARN);
    test_entry_format();
    test_hits_and_invalidation();
    test_corrupt_entries();
    test_unusable_folder();
    test_prune();
    return vf_test_finish("test_meta_cache");
}
