/*
 * wds_output.c: what vf_wds_convert writes to disk, apart from the spill.
 *
 * The state directory (OUT/shards/.vlafeed-convert/) holds options.json,
 * the run counter, units.done ("unit run" lines), shards.done ("shard
 * bytes crc32" lines) and each finished lowdim unit's statistics. A new
 * run gets a new run number, skips finished units, keeps shards whose size
 * and CRC-32 still match, and ignores spill records of units that did not
 * finish (their run differs from the journal's).
 *
 * Assembly: one job per spill bucket scans the record headers, keeps the
 * records of finished units, sorts each shard's records by (slot, member),
 * checks that every slot has every member exactly once and from one
 * sample, and streams them into the shard tar (temporary name, fsync,
 * rename, journal line).
 *
 * Final files: manifest.jsonl, stats.json (per-unit statistics merged in
 * unit order, so the numbers do not depend on thread timing),
 * preprocessing_config.yaml, and processing_metadata.json last: its
 * presence means the conversion is complete. Every file is written through
 * a temporary name and renamed into place.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/wds_internal.h"

/* Chan et al. merge of (nb, mb, m2b, minb, maxb) into cell i of field f. */
static void stats_merge_cell(vf_cv_stats *st, size_t f, int t, int64_t width, int64_t k, double nb, double mb,
                             double m2b, double minb, double maxb)
{
    if (nb <= 0)
        return;
    double na = st->count[f][t];
    size_t i = (size_t)t * (size_t)width + (size_t)k;
    if (k == width - 1)
        st->count[f][t] = na + nb;
    if (na <= 0) {
        st->mean[f][i] = mb;
        st->m2[f][i] = m2b;
        st->min[f][i] = minb;
        st->max[f][i] = maxb;
        return;
    }
    double n = na + nb, delta = mb - st->mean[f][i];
    st->mean[f][i] += delta * nb / n;
    st->m2[f][i] += m2b + delta * delta * na * nb / n;
    st->min[f][i] = VF_MIN(st->min[f][i], minb);
    st->max[f][i] = VF_MAX(st->max[f][i], maxb);
}

char *vf_cv_state_path(const vf_cv_job *j, const char *fmt, ...) VF_PRINTF(2, 3);
char *vf_cv_state_path(const vf_cv_job *j, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return vf_path_join(j->state_dir, name);
}

/* Writes data to path through path.tmp + rename. */
int vf_cv_write_atomic(const char *path, const void *data, size_t len)
{
    char *tmp = vf_asprintf("%s.tmp", path);
    if (!tmp)
        return VF_ENOMEM;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int r = 0;
    if (fd < 0)
        r = vf_error(VF_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    const uint8_t *p = data;
    while (r == 0 && len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            r = vf_error(VF_EIO, "%s: write: %s", tmp, strerror(errno));
        else {
            p += w;
            len -= (size_t)w;
        }
    }
    if (fd >= 0 && r == 0 && fsync(fd) < 0)
        r = vf_error(VF_EIO, "%s: fsync: %s", tmp, strerror(errno));
    if (fd >= 0)
        close(fd);
    if (r == 0 && rename(tmp, path) < 0)
        r = vf_error(VF_EIO, "%s: rename: %s", path, strerror(errno));
    if (r < 0)
        unlink(tmp);
    free(tmp);
    return r;
}

int vf_cv_journal_append(int fd, const char *line)
{
    size_t len = strlen(line);
    if (write(fd, line, len) != (ssize_t)len)
        return vf_error(VF_EIO, "convert journal: write: %s", strerror(errno));
    return 0;
}
/* ---- assembly ---------------------------------------------------------- */

static int cmp_ref(const void *pa, const void *pb)
{
    const vf_cv_record_ref *a = pa, *b = pb;
    if (a->head.shard != b->head.shard)
        return a->head.shard < b->head.shard ? -1 : 1;
    if (a->head.pos != b->head.pos)
        return a->head.pos < b->head.pos ? -1 : 1;
    if (a->head.member != b->head.member)
        return a->head.member < b->head.member ? -1 : 1;
    return 0;
}

static void member_name(const vf_cv_job *j, int member, char *out, size_t size)
{
    size_t nimg = j->num_members - 3;
    if ((size_t)member < nimg)
        snprintf(out, size, "%s_t%d.jpg", j->cams[(size_t)member % j->num_cams].name,
                 j->offsets[(size_t)member / j->num_cams]);
    else
        snprintf(out, size, "%s",
                 (size_t)member == nimg ? "lowdim.npz" : (size_t)member == nimg + 1 ? "metadata.json"
                                                                              : "language_instructions.json");
}

static char *shard_path(const vf_cv_job *j, uint64_t shard, int tmp)
{
    return vf_asprintf("%s/shard_%06llu.tar%s", j->shards_dir, (unsigned long long)shard, tmp ? ".tmp" : "");
}

static int assemble_shard(vf_cv_job *j, size_t bucket, uint64_t shard, const vf_cv_record_ref *refs, size_t count)
{
    uint64_t samples = vf_cv_shard_samples(j, shard);
    size_t M = j->num_members;
    char *tmp = shard_path(j, shard, 1), *final = shard_path(j, shard, 0);
    vf_cv_tar *tar = NULL;
    vf_buf payload = {0};
    int r = tmp && final ? 0 : VF_ENOMEM;
    /* every slot must have every member once */
    for (size_t i = 0, want = 0; r == 0 && want < samples * M; want++) {
        uint32_t pos = (uint32_t)(want / M);
        uint16_t member = (uint16_t)(want % M);
        char name[256];
        member_name(j, member, name, sizeof name);
        if (i >= count || refs[i].head.pos != pos || refs[i].head.member != member) {
            r = vf_error(VF_ECORRUPT, "shard_%06llu: slot %u has no %s in the spill (converter bug or damaged spill; "
                         "delete %s and convert again)", (unsigned long long)shard, pos, name, j->state_dir);
            break;
        }
        if (i + 1 < count && refs[i + 1].head.pos == pos && refs[i + 1].head.member == member) {
            r = vf_error(VF_ECORRUPT, "shard_%06llu: slot %u has %s twice in the spill", (unsigned long long)shard, pos,
                         name);
            break;
        }
        if (refs[i].head.episode_index != refs[i - (i % M)].head.episode_index ||
            refs[i].head.frame != refs[i - (i % M)].head.frame) {
            r = vf_error(VF_ECORRUPT, "shard_%06llu: slot %u mixes two samples in the spill", (unsigned long long)shard,
                         pos);
            break;
        }
        i++;
    }
    if (r == 0 && count != samples * M)
        r = vf_error(VF_ECORRUPT, "shard_%06llu: %zu records in the spill, expected %llu", (unsigned long long)shard,
                     count, (unsigned long long)(samples * M));
    if (r == 0)
        r = vf_cv_tar_open(&tar, tmp);
    for (size_t i = 0; i < count && r == 0; i++) {
        const vf_cv_record *h = &refs[i].head;
        payload.len = 0;
        if ((r = vf_buf_reserve(&payload, h->len ? h->len : 1)) < 0)
            break;
        if ((r = vf_cv_spill_read(j->spill, bucket, refs[i].offset, payload.data, h->len)) < 0)
            break;
        char key[33], suffix[256], name[320];
        vf_cv_sample_key(j, h->episode_index, h->frame, key);
        member_name(j, h->member, suffix, sizeof suffix);
        snprintf(name, sizeof name, "%s.%s", key, suffix);
        r = vf_cv_tar_add(tar, name, payload.data, h->len);
    }
    uint64_t bytes = 0;
    uint32_t crc = 0;
    if (tar) {
        if (r == 0)
            r = vf_cv_tar_finish(tar, &bytes, &crc);
        else
            vf_cv_tar_abort(tar);
    }
    if (r == 0 && rename(tmp, final) < 0)
        r = vf_error(VF_EIO, "%s: rename: %s", final, strerror(errno));
    if (r == 0) {
        char line[96];
        snprintf(line, sizeof line, "%llu %llu %u\n", (unsigned long long)shard, (unsigned long long)bytes, crc);
        r = vf_cv_journal_append(j->journal_shards_fd, line);
        j->shard_bytes[shard] = bytes;
        j->shard_crc[shard] = crc;
        j->shard_done[shard] = 1;
        vf_cv_maybe_kill_for_test("assemble", atomic_fetch_add(&j->shards_written, 1) + 1);
    } else if (tmp) {
        unlink(tmp);
    }
    vf_buf_free(&payload);
    free(tmp);
    free(final);
    return r;
}

void vf_cv_bucket_job(void *p)
{
    vf_cv_work *a = p;
    vf_cv_job *j = a->j;
    if (atomic_load(&j->abort))
        return;
    uint64_t first = (uint64_t)a->index * j->shards_per_bucket;
    uint64_t last = VF_MIN(first + j->shards_per_bucket, j->num_shards);
    int todo = 0;
    for (uint64_t s = first; s < last; s++)
        todo |= !j->shard_done[s];
    if (!todo)
        return;
    vf_cv_record_ref *refs = NULL;
    size_t count = 0;
    int r = vf_cv_spill_scan(j->spill, a->index, &refs, &count);
    size_t kept = 0;
    for (size_t i = 0; i < count && r == 0; i++) {
        const vf_cv_record *h = &refs[i].head;
        if (h->unit >= j->num_units || j->units[h->unit].done_run != h->run)
            continue; /* left by a unit that did not finish */
        if (h->shard < first || h->shard >= last || h->member >= j->num_members) {
            r = vf_error(VF_ECORRUPT, "spill bucket %zu: record for shard %u member %u does not belong there", a->index,
                         h->shard, h->member);
            break;
        }
        refs[kept++] = refs[i];
    }
    if (r == 0)
        qsort(refs, kept, sizeof *refs, cmp_ref);
    size_t i = 0;
    for (uint64_t s = first; s < last && r == 0 && !atomic_load(&j->abort); s++) {
        size_t begin = i;
        while (i < kept && refs[i].head.shard == s)
            i++;
        if (j->shard_done[s])
            continue;
        r = assemble_shard(j, a->index, s, refs + begin, i - begin);
        vf_cv_job_progress(j, 1, "assemble");
    }
    free(refs);
    if (r < 0)
        vf_cv_job_fail(j, r);
}

/* ---- options, state and the final files -------------------------------- */

json_t *vf_cv_options_json(const vf_cv_job *j)
{
    const vf_wds_convert_settings *s = j->s;
    json_t *o = json_object();
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)vf_dataset_fingerprint(j->d));
    json_object_set_new(o, "dataset_fingerprint", json_string(fp));
    json_t *eps = json_array();
    for (size_t i = 0; i < j->num_eps; i++)
        json_array_append_new(eps, json_integer(j->eps[i].episode_index));
    json_object_set_new(o, "episodes", s->episodes ? eps : (json_decref(eps), json_null()));
    json_object_set_new(o, "samples_per_shard", json_integer(j->sps));
    json_object_set_new(o, "past", json_integer(j->past));
    json_object_set_new(o, "future", json_integer(j->future));
    json_t *offs = json_array();
    for (int i = 0; i < j->num_offsets; i++)
        json_array_append_new(offs, json_integer(j->offsets[i]));
    json_object_set_new(o, "image_offsets", offs);
    json_t *cams = json_array();
    for (size_t c = 0; c < j->num_cams; c++)
        json_array_append_new(cams, json_string(j->cams[c].key));
    json_object_set_new(o, "cameras", cams);
    json_object_set_new(o, "resize", s->resize_width ? json_pack("[ii]", s->resize_width, s->resize_height)
                                                     : json_null());
    json_object_set_new(o, "jpeg_quality", json_integer(s->jpeg_quality));
    json_object_set_new(o, "seed", json_integer((json_int_t)s->seed));
    return o;
}

/* VF_EINVAL naming the first option whose value differs. */
int vf_cv_compare_options(const char *where, json_t *saved, json_t *now)
{
    if (!json_is_object(saved))
        return vf_error(VF_ECORRUPT, "%s: no options object", where);
    const char *k;
    json_t *v;
    json_object_foreach(now, k, v) {
        json_t *old = json_object_get(saved, k);
        if (!old || !json_equal(old, v)) {
            char *a = old ? json_dumps(old, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            char *b = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            int r = vf_error(VF_EINVAL,
                             "%s was made with different options: %s was %s, now %s; convert into another "
                             "directory or remove it",
                             where, k, a ? a : "(absent)", b ? b : "?");
            free(a);
            free(b);
            return r;
        }
    }
    return 0;
}

static int read_lines(const char *path, char ***lines, size_t *count)
{
    *lines = NULL;
    *count = 0;
    if (!vf_file_exists(path))
        return 0;
    uint8_t *data;
    size_t len;
    int r = vf_read_file(path, &data, &len);
    if (r < 0)
        return r;
    size_t cap = 0;
    char *save = NULL;
    for (char *line = strtok_r((char *)data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (*count == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = vf_realloc(*lines, cap * sizeof **lines);
            if (!grown) {
                r = VF_ENOMEM;
                break;
            }
            *lines = grown;
        }
        if (!((*lines)[(*count)++] = vf_strdup(line))) {
            r = VF_ENOMEM;
            break;
        }
    }
    free(data);
    return r;
}

static void free_lines(char **lines, size_t count)
{
    for (size_t i = 0; i < count; i++)
        free(lines[i]);
    free(lines);
}

/* Loads the resume state (units finished, shards verified) of an earlier run. */
int vf_cv_load_state(vf_cv_job *j)
{
    char *runs = vf_cv_state_path(j, "run"), *units = vf_cv_state_path(j, "units.done"),
         *shards = vf_cv_state_path(j, "shards.done");
    int r = runs && units && shards ? 0 : VF_ENOMEM;
    uint32_t last_run = 0;
    if (r == 0 && vf_file_exists(runs)) {
        uint8_t *data;
        size_t len;
        if ((r = vf_read_file(runs, &data, &len)) == 0) {
            last_run = (uint32_t)strtoul((char *)data, NULL, 10);
            free(data);
        }
    }
    j->run = last_run + 1;
    char text[32];
    snprintf(text, sizeof text, "%u\n", j->run);
    if (r == 0)
        r = vf_cv_write_atomic(runs, text, strlen(text));
    char **lines = NULL;
    size_t n = 0;
    if (r == 0)
        r = read_lines(units, &lines, &n);
    for (size_t i = 0; i < n && r == 0; i++) {
        unsigned unit, run;
        if (sscanf(lines[i], "%u %u", &unit, &run) == 2 && unit < j->num_units && run < j->run) {
            j->units[unit].done_run = run;
        }
    }
    free_lines(lines, n);
    if (r == 0)
        r = read_lines(shards, &lines, &n);
    for (size_t i = 0; i < n && r == 0; i++) {
        unsigned long long shard, bytes;
        unsigned crc;
        if (sscanf(lines[i], "%llu %llu %u", &shard, &bytes, &crc) != 3 || shard >= j->num_shards)
            continue;
        char *path = shard_path(j, shard, 0);
        uint64_t got_bytes = 0;
        uint32_t got_crc = 0;
        if (path && vf_file_exists(path) && vf_cv_file_crc(path, &got_bytes, &got_crc) == 0 && got_bytes == bytes &&
            got_crc == crc) {
            if (!j->shard_done[shard])
                j->shards_kept++;
            j->shard_done[shard] = 1;
            j->shard_bytes[shard] = bytes;
            j->shard_crc[shard] = crc;
        } else if (path) {
            j->shard_done[shard] = 0; /* damaged or gone since: made again */
            unlink(path);
        }
        free(path);
    }
    free_lines(lines, n);
    free(runs);
    free(units);
    free(shards);
    return r;
}

static int write_stats(vf_cv_job *j, json_t **out)
{
    vf_cv_stats total;
    int r = vf_cv_stats_alloc(j, &total);
    vf_cv_stats part;
    memset(&part, 0, sizeof part);
    if (r == 0)
        r = vf_cv_stats_alloc(j, &part);
    for (size_t u = 0; u < j->num_lowdim_units && r == 0; u++) {
        char *path = vf_cv_state_path(j, "stats_%06zu.bin", u);
        uint8_t *data = NULL;
        size_t len = 0;
        r = path ? vf_read_file(path, &data, &len) : VF_ENOMEM;
        size_t off = 0;
        for (size_t f = 0; f < j->num_fields && r == 0; f++) {
            size_t cells = (size_t)j->T * (size_t)j->fields[f].width;
            double *dst[] = {part.count[f], part.mean[f], part.m2[f], part.min[f], part.max[f]};
            size_t sizes[] = {(size_t)j->T, cells, cells, cells, cells};
            for (int a = 0; a < 5 && r == 0; a++) {
                if (off + sizes[a] * sizeof(double) > len) {
                    r = vf_error(VF_ECORRUPT, "%s: truncated", path);
                    break;
                }
                memcpy(dst[a], data + off, sizes[a] * sizeof(double));
                off += sizes[a] * sizeof(double);
            }
            int64_t width = j->fields[f].width;
            for (int t = 0; t < j->T && r == 0; t++)
                for (int64_t k = 0; k < width; k++) {
                    size_t i = (size_t)t * (size_t)width + (size_t)k;
                    stats_merge_cell(&total, f, t, width, k, part.count[f][t], part.mean[f][i], part.m2[f][i],
                                     part.min[f][i], part.max[f][i]);
                }
        }
        free(data);
        free(path);
    }
    json_t *root = json_object();
    for (size_t f = 0; f < j->num_fields && r == 0; f++) {
        int64_t width = j->fields[f].width;
        json_t *o = json_object();
        json_t *mean = json_array(), *std = json_array(), *mn = json_array(), *mx = json_array();
        for (int64_t k = 0; k < width; k++) { /* all valid entries of a channel, pooled over offsets */
            double n = 0, m = 0, m2 = 0, lo = 0, hi = 0;
            for (int t = 0; t < j->T; t++) {
                double nb = total.count[f][t];
                size_t i = (size_t)t * (size_t)width + (size_t)k;
                if (nb <= 0)
                    continue;
                if (n <= 0) {
                    n = nb, m = total.mean[f][i], m2 = total.m2[f][i], lo = total.min[f][i], hi = total.max[f][i];
                    continue;
                }
                double nn = n + nb, delta = total.mean[f][i] - m;
                m += delta * nb / nn;
                m2 += total.m2[f][i] + delta * delta * n * nb / nn;
                lo = VF_MIN(lo, total.min[f][i]);
                hi = VF_MAX(hi, total.max[f][i]);
                n = nn;
            }
            json_array_append_new(mean, n > 0 ? json_real(m) : json_null());
            json_array_append_new(std, n > 0 ? json_real(sqrt(m2 / n)) : json_null());
            json_array_append_new(mn, n > 0 ? json_real(lo) : json_null());
            json_array_append_new(mx, n > 0 ? json_real(hi) : json_null());
        }
        json_object_set_new(o, "mean", mean);
        json_object_set_new(o, "std", std);
        json_object_set_new(o, "min", mn);
        json_object_set_new(o, "max", mx);
        const char *names[] = {"mean_per_timestep", "std_per_timestep", "min_per_timestep", "max_per_timestep"};
        for (int a = 0; a < 4; a++) {
            json_t *rows = json_array();
            for (int t = 0; t < j->T; t++) {
                json_t *row = json_array();
                double n = total.count[f][t];
                for (int64_t k = 0; k < width; k++) {
                    size_t i = (size_t)t * (size_t)width + (size_t)k;
                    double v = a == 0 ? total.mean[f][i] : a == 1 ? sqrt(total.m2[f][i] / (n > 0 ? n : 1))
                                                     : a == 2 ? total.min[f][i] : total.max[f][i];
                    json_array_append_new(row, n > 0 ? json_real(v) : json_null());
                }
                json_array_append_new(rows, row);
            }
            json_object_set_new(o, names[a], rows);
        }
        json_t *count = json_array();
        for (int t = 0; t < j->T; t++)
            json_array_append_new(count, json_integer((json_int_t)total.count[f][t]));
        json_object_set_new(o, "count", count);
        json_object_set_new(root, j->fields[f].feature->name, o);
    }
    vf_cv_stats_free(j, &total);
    vf_cv_stats_free(j, &part);
    if (r < 0) {
        json_decref(root);
        return r;
    }
    *out = root;
    return 0;
}

static int write_json_file(const char *dir, const char *name, json_t *value, size_t flags)
{
    char *path = vf_path_join(dir, name);
    char *text = json_dumps(value, flags);
    int r = path && text ? vf_cv_write_atomic(path, text, strlen(text)) : VF_ENOMEM;
    free(path);
    free(text);
    return r;
}

static void yaml_string_list(vf_buf *b, const char *key, const char *const *items, size_t n)
{
    vf_buf_printf(b, "%s: [", key);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_string(items[i]);
        char *q = json_dumps(s, JSON_ENCODE_ANY);
        vf_buf_printf(b, "%s%s", i ? ", " : "", q ? q : "\"\"");
        free(q);
        json_decref(s);
    }
    vf_buf_printf(b, "]\n");
}

int vf_cv_write_final_files(vf_cv_job *j, json_t *options)
{
    /* manifest.jsonl: lines joined by \n, no trailing newline (as VLA Foundry writes it) */
    vf_buf manifest = {0};
    for (uint64_t s = 0; s < j->num_shards; s++)
        vf_buf_printf(&manifest, "%s{\"shard\": \"shard_%06llu\", \"num_sequences\": %llu}", s ? "\n" : "",
                      (unsigned long long)s, (unsigned long long)vf_cv_shard_samples(j, s));
    char *path = vf_path_join(j->shards_dir, "manifest.jsonl");
    int r = path ? vf_cv_write_atomic(path, manifest.data ? manifest.data : (uint8_t *)"", manifest.len) : VF_ENOMEM;
    free(path);
    vf_buf_free(&manifest);

    json_t *stats = NULL;
    if (r == 0)
        r = write_stats(j, &stats);
    if (r == 0)
        r = write_json_file(j->shards_dir, "stats.json", stats, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(stats);

    vf_buf y = {0};
    vf_buf_printf(&y, "# written by vlafeed %s (vlafeed convert --to wds)\ntype: lerobot\n", vf_version());
    vf_buf_printf(&y, "past_lowdim_steps: %d\nfuture_lowdim_steps: %d\n", j->past, j->future);
    vf_buf_printf(&y, "image_indices: [");
    for (int i = 0; i < j->num_offsets; i++)
        vf_buf_printf(&y, "%s%d", i ? ", " : "", j->offsets[i]);
    vf_buf_printf(&y, "]\n");
    const char **names = vf_calloc(VF_MAX(j->num_cams, j->num_fields) + 1, sizeof *names);
    for (size_t c = 0; names && c < j->num_cams; c++)
        names[c] = j->cams[c].name;
    if (names)
        yaml_string_list(&y, "camera_names", names, j->num_cams);
    for (size_t f = 0; names && f < j->num_fields; f++)
        names[f] = j->fields[f].feature->name;
    if (names)
        yaml_string_list(&y, "lowdim_keys", names, j->num_fields);
    free(names);
    if (j->s->resize_width)
        vf_buf_printf(&y, "resize_images_size: [%d, %d]\nimage_resizing_method: center_crop\n", j->s->resize_width,
                      j->s->resize_height);
    else
        vf_buf_printf(&y, "resize_images_size: null\n");
    vf_buf_printf(&y, "jpeg_quality: %d\nsamples_per_shard: %lld\nstride: 1\npadding_strategy: copy\n",
                  j->s->jpeg_quality, (long long)j->sps);
    vf_buf_printf(&y, "max_padding_left: %d\nmax_padding_right: %d\nseed: %llu\n", j->past, j->future,
                  (unsigned long long)j->s->seed);
    path = vf_path_join(j->shards_dir, "preprocessing_config.yaml");
    if (r == 0)
        r = path ? vf_cv_write_atomic(path, y.data, y.len) : VF_ENOMEM;
    free(path);
    vf_buf_free(&y);

    if (r == 0) { /* last: its presence marks the conversion complete */
        json_t *pm = json_object();
        json_object_set_new(pm, "source", json_string(j->source));
        json_object_set_new(pm, "converter", json_string("vlafeed convert --to wds"));
        json_object_set_new(pm, "vlafeed_version", json_string(vf_version()));
        json_object_set_new(pm, "options", json_incref(options));
        json_object_set_new(pm, "seed", json_integer((json_int_t)j->s->seed));
        json_object_set_new(pm, "total_samples", json_integer((json_int_t)j->N));
        json_object_set_new(pm, "total_potential_samples", json_integer((json_int_t)j->N));
        json_object_set_new(pm, "padding_samples_filtered", json_integer(0));
        json_object_set_new(pm, "still_samples_filtered", json_integer(0));
        json_object_set_new(pm, "num_episodes", json_integer((json_int_t)j->num_eps));
        json_object_set_new(pm, "num_shards", json_integer((json_int_t)j->num_shards));
        json_t *shards = json_array();
        for (uint64_t s = 0; s < j->num_shards; s++) {
            char stem[32];
            snprintf(stem, sizeof stem, "shard_%06llu", (unsigned long long)s);
            json_array_append_new(shards, json_pack("{ss sI sI sI}", "shard", stem, "num_sequences",
                                                    (json_int_t)vf_cv_shard_samples(j, s), "bytes",
                                                    (json_int_t)j->shard_bytes[s], "crc32",
                                                    (json_int_t)j->shard_crc[s]));
        }
        json_object_set_new(pm, "shards", shards);
        r = write_json_file(j->shards_dir, "processing_metadata.json", pm, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(pm);
    }
    return r;
}

void vf_cv_remove_state_dir(const char *dir)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return;
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *p = vf_path_join(dir, de->d_name);
        if (p)
            unlink(p);
        free(p);
    }
    closedir(dh);
    rmdir(dir);
}

/* Verifies the shards of a complete conversion against its metadata. */
int vf_cv_verify_complete(vf_cv_job *j, json_t *pm)
{
    json_t *shards = json_object_get(pm, "shards");
    if (!json_is_array(shards) || json_array_size(shards) != j->num_shards)
        return vf_error(VF_ECORRUPT, "%s/processing_metadata.json: shard list does not match the plan", j->shards_dir);
    size_t i;
    json_t *s;
    json_array_foreach(shards, i, s) {
        char *path = shard_path(j, i, 0);
        uint64_t bytes = 0;
        uint32_t crc = 0;
        int r = path ? vf_cv_file_crc(path, &bytes, &crc) : VF_ENOMEM;
        if (r == 0 && (bytes != (uint64_t)json_integer_value(json_object_get(s, "bytes")) ||
                       crc != (uint32_t)json_integer_value(json_object_get(s, "crc32"))))
            r = vf_error(VF_ECORRUPT, "%s: size or CRC-32 differs from processing_metadata.json (changed since the "
                         "conversion); remove %s and convert again", path, j->shards_dir);
        free(path);
        if (r < 0)
            return r;
        j->shard_bytes[i] = bytes;
    }
    return 0;
}

