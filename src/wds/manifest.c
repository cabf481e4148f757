/*
 * manifest.c: manifest.jsonl of a WebDataset shard set. One JSON object
 * per line: "shard" (path relative to the manifest's directory, with or
 * without ".tar") and "num_sequences". VLA Foundry's loader builds
 * <dir>/<shard>.tar from stems (vla_foundry/data/dataloader.py), while its
 * docs show names ending in .tar; both are accepted and resolve to the
 * same file.
 *
 * Invariant: unless the caller opted in (allow_outside_base), every shard
 * URL this file hands out lies under the manifest's base, judged on the
 * text alone: the base is the manifest's folder (local) or its URL up to
 * the last '/' of the path (remote); a relative shard has no ".."
 * component, and an absolute path or URL starts with the base and has none
 * after it. A manifest that somebody else wrote (or that came over http)
 * therefore cannot make the loader read local files or other hosts.
 * Symbolic links are not resolved: a link inside the folder is followed.
 * With the opt-in a shard that is a URL or an absolute path is used as is
 * (plus ".tar" when missing) and a relative one is joined to the base.
 *
 * Counts: the loader allocates its plan in proportion to the counts, so
 * vf_wds_manifest_check_counts holds them to what the shards can contain
 * before that: their sum to a budget, and a local shard's count to its
 * file size (a sample is at least one 512-byte tar header). A manifest
 * line "num_sequences: 1e9" next to a 10 KB shard is refused by name
 * instead of allocating gigabytes.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include "io/io.h"
#include "json/json.h"
#include "wds/wds.h"

#define VF_WDS_MANIFEST_MAX_BYTES ((size_t)1 << 30)

typedef struct wds_shard {
    char *name, *url;
    int64_t samples;
    int64_t line;              /* the manifest line it was listed on */
} wds_shard;

struct vf_wds_manifest {
    char *name;
    char *base;                /* the folder or URL prefix shards resolve against, ending in '/' (or "") */
    wds_shard *shards;
    size_t count;
    int64_t total;
};

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && memcmp(s + n - k, tail, k) == 0;
}

void vf_wds_manifest_defaults(vf_wds_manifest_settings *s)
{
    const char *env = getenv("VF_WDS_ALLOW_OUTSIDE");
    memset(s, 0, sizeof *s);
    s->allow_outside_base = env && !strcmp(env, "1");
}

/* The base of manifest `name`, newly allocated: a local manifest's folder
 * ("" for a bare file name); for a URL, everything up to the last '/' of
 * its path, leaving out the query and fragment, and never shorter than
 * scheme://authority/ (so a manifest at a host's root cannot widen the
 * base to every host of the scheme). */
static char *manifest_base(const char *name)
{
    if (!vf_is_url(name)) {
        const char *slash = strrchr(name, '/');
        return vf_strndup(name, slash ? (size_t)(slash - name) + 1 : 0);
    }
    const char *authority = strstr(name, "://") + 3;
    const char *path = authority + strcspn(authority, "/?#");
    const char *path_end = path + strcspn(path, "?#");
    const char *slash = NULL;
    for (const char *p = path; p < path_end; p++)
        if (*p == '/')
            slash = p;
    if (slash)
        return vf_strndup(name, (size_t)(slash - name) + 1);
    return vf_asprintf("%.*s/", (int)(path - name), name);
}

/* 1 when s begins with a URL scheme and "://" (any scheme: file://, ftp://
 * as well as the ones the byte sources open). */
static int has_url_scheme(const char *s)
{
    size_t n = 0;
    if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
        return 0;
    while (s[n] && (isalnum((unsigned char)s[n]) || s[n] == '+' || s[n] == '-' || s[n] == '.'))
        n++;
    return !strncmp(s + n, "://", 3);
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 1 when path has a ".." component. Under a URL base a server may decode
 * percent-escapes (%2e, %2f, %5c) before it splits the path, and some
 * treat '\' as '/', so escapes are decoded here first (a decoded %00 is an
 * ordinary character, not the end); a local file name is taken literally. */
static int has_dotdot(const char *path, int url_base)
{
    size_t dots = 0, other = 0;
    for (const char *p = path;; p++) {
        int end = *p == '\0'; /* the string's end, not a decoded %00 */
        char c = *p;
        if (!end && url_base && c == '%' && hex_value(p[1]) >= 0 && hex_value(p[2]) >= 0) {
            c = (char)(hex_value(p[1]) * 16 + hex_value(p[2]));
            p += 2;
        }
        if (end || c == '/' || (url_base && c == '\\')) {
            if (dots == 2 && other == 0)
                return 1;
            if (end)
                return 0;
            dots = other = 0;
        } else if (c == '.') {
            dots++;
        } else {
            other++;
        }
    }
}

/* Why `shard` would resolve outside `base`, or NULL when it stays under it. */
static const char *outside_reason(const char *shard, const char *base, int url_base)
{
    size_t base_len = strlen(base);
    int url = vf_is_url(shard) || has_url_scheme(shard);
    if (url || shard[0] == '/') {
        if (base_len == 0 || strncmp(shard, base, base_len) != 0) {
            if (url)
                return url_base ? "a URL outside the URL prefix" : "a URL in a local manifest";
            return url_base ? "a local path in a remote manifest" : "an absolute path";
        }
        shard += base_len;
    }
    return has_dotdot(shard, url_base) ? "a '..' component" : NULL;
}

/* The path or URL shard `shard` of manifest `m` is read from. */
static char *shard_url(const vf_wds_manifest *m, const char *shard)
{
    const char *tar = ends_with(shard, ".tar") ? "" : ".tar";
    if (vf_is_url(shard) || shard[0] == '/')
        return vf_asprintf("%s%s", shard, tar);
    return vf_asprintf("%s%s%s", m->base, shard, tar);
}

int vf_wds_manifest_parse(vf_wds_manifest **out, const char *name, const char *text, size_t len)
{
    return vf_wds_manifest_parse_with(out, name, text, len, NULL);
}

int vf_wds_manifest_parse_with(vf_wds_manifest **out, const char *name, const char *text, size_t len,
                               const vf_wds_manifest_settings *settings)
{
    *out = NULL;
    vf_wds_manifest_settings defaults;
    if (!settings) {
        vf_wds_manifest_defaults(&defaults);
        settings = &defaults;
    }
    int url_base = vf_is_url(name);
    vf_wds_manifest *m = vf_calloc(1, sizeof *m);
    if (!m || !(m->name = vf_strdup(name)) || !(m->base = manifest_base(name))) {
        vf_wds_manifest_close(m);
        return VF_ENOMEM;
    }
    vf_jsonl it;
    vf_jsonl_init(&it, name, text, len, 0);
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        json_t *line = NULL;
        rc = vf_jsonl_next(&it, &line);
        if (rc <= 0)
            break;
        const char *shard = NULL;
        int64_t count = 0;
        char where[32];
        snprintf(where, sizeof where, "line %lld", (long long)it.line);
        rc = vf_json_get_string(name, where, line, "shard", 0, &shard);
        if (rc == 0)
            rc = vf_json_get_int(name, where, line, "num_sequences", 0, &count);
        if (rc == 0 && (count < 0 || !shard[0]))
            rc = vf_error(VF_ECORRUPT, "%s:%lld: %s", name, (long long)it.line,
                          count < 0 ? "num_sequences is negative" : "empty shard name");
        /* the total is an int64_t: a sum past it cannot be a real set (fuzz_wds_manifest found the overflow) */
        if (rc == 0 && count > INT64_MAX - m->total)
            rc = vf_error(VF_ECORRUPT, "%s:%lld: shard \"%s\": num_sequences %lld brings the manifest's total past "
                          "2^63 - 1 samples", name, (long long)it.line, shard, (long long)count);
        const char *why = rc == 0 && !settings->allow_outside_base ? outside_reason(shard, m->base, url_base) : NULL;
        if (why)
            rc = vf_error(VF_EINVAL, "%s:%lld: shard \"%s\" is refused: it leaves the manifest's base %s (%s); "
                          "shards must stay under it unless VF_WDS_ALLOW_OUTSIDE=1 or the allow_outside_base "
                          "setting lets them out",
                          name, (long long)it.line, shard, m->base[0] ? m->base : "./", why);
        if (rc == 0 && m->count == cap) {
            cap = cap ? cap * 2 : 64;
            wds_shard *grown = vf_realloc(m->shards, cap * sizeof *grown);
            if (!grown)
                rc = VF_ENOMEM;
            else
                m->shards = grown;
        }
        if (rc == 0) {
            wds_shard *s = &m->shards[m->count];
            s->name = vf_strdup(shard);
            s->url = shard_url(m, shard);
            s->samples = count;
            s->line = (int64_t)it.line;
            if (!s->name || !s->url) {
                free(s->name);
                free(s->url);
                rc = VF_ENOMEM;
            } else {
                m->count++;
                m->total += count;
            }
        }
        json_decref(line);
        if (rc < 0)
            break;
    }
    if (rc < 0) {
        vf_wds_manifest_close(m);
        return rc;
    }
    if (m->count == 0) {
        vf_wds_manifest_close(m);
        return vf_error(VF_ECORRUPT, "%s: no shards listed", name);
    }
    *out = m;
    return 0;
}

int vf_wds_manifest_open(vf_wds_manifest **out, const char *path_or_url)
{
    return vf_wds_manifest_open_with(out, path_or_url, NULL);
}

int vf_wds_manifest_open_with(vf_wds_manifest **out, const char *path_or_url, const vf_wds_manifest_settings *settings)
{
    *out = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    int rc;
    if (vf_is_url(path_or_url)) {
        vf_http_settings hs;
        vf_http_defaults(&hs);
        vf_http_client *client = NULL;
        rc = vf_http_client_open(&client, &hs);
        if (rc == 0)
            rc = vf_http_get(client, path_or_url, VF_WDS_MANIFEST_MAX_BYTES, &data, &len);
        vf_http_client_close(client);
    } else {
        rc = vf_read_file(path_or_url, &data, &len);
    }
    if (rc < 0)
        return vf_error_context(rc, "manifest %s", path_or_url);
    rc = vf_wds_manifest_parse_with(out, path_or_url, (const char *)data, len, settings);
    free(data);
    return rc;
}

size_t vf_wds_manifest_num_shards(const vf_wds_manifest *m) { return m->count; }
const char *vf_wds_manifest_shard_url(const vf_wds_manifest *m, size_t i) { return m->shards[i].url; }
const char *vf_wds_manifest_shard_name(const vf_wds_manifest *m, size_t i) { return m->shards[i].name; }
int64_t vf_wds_manifest_shard_samples(const vf_wds_manifest *m, size_t i) { return m->shards[i].samples; }
int64_t vf_wds_manifest_total_samples(const vf_wds_manifest *m) { return m->total; }
const char *vf_wds_manifest_path(const vf_wds_manifest *m) { return m->name; }
int64_t vf_wds_manifest_shard_line(const vf_wds_manifest *m, size_t i) { return m->shards[i].line; }

/* At most how many samples a local shard file can hold, or -1 when its
 * size says nothing (missing, or compressed with a filter that has no
 * useful expansion limit); *how names the rule for messages. */
static int64_t local_capacity(const char *path, int64_t *bytes, const char **how)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    uint8_t magic[6] = {0};
    size_t got = fread(magic, 1, sizeof magic, f);
    fclose(f);
    *bytes = (int64_t)st.st_size;
    if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        /* deflate expands at most 1032:1 */
        *how = "gzip'd: at most 1032 times its size in tar, and each sample needs at least one 512-byte tar header";
        return (int64_t)(st.st_size / 512 + 1) * 1032;
    }
    static const struct {
        const char *bytes;
        size_t len;
    } unbounded[] = {{"BZh", 3}, {"\xfd" "7zXZ", 5}, {"\x28\xb5\x2f\xfd", 4}, {"\x04\x22\x4d\x18", 4},
                     {"LZIP", 4}, {"\x5d\x00\x00", 3}, {"\x1f\x9d", 2}};
    for (size_t i = 0; i < VF_ARRAY_LEN(unbounded); i++)
        if (got >= unbounded[i].len && !memcmp(magic, unbounded[i].bytes, unbounded[i].len))
            return -1;
    *how = "each sample needs at least one 512-byte tar header";
    return (int64_t)st.st_size / 512;
}

int vf_wds_manifest_check_counts(const vf_wds_manifest *m, int64_t max_samples)
{
    int64_t total = 0;
    for (size_t i = 0; i < m->count; i++) {
        const wds_shard *s = &m->shards[i];
        /* a local shard's size bounds its count (remote: the size is not
         * fetched at open; the total budget holds, and the tar is checked
         * against the count when read) */
        int64_t bytes = 0, capacity = -1;
        const char *how = "";
        if (!vf_is_url(s->url) && s->samples > 0)
            capacity = local_capacity(s->url, &bytes, &how);
        if (capacity >= 0 && s->samples > capacity)
            return vf_error(VF_ECORRUPT, "%s:%lld: shard %s: num_sequences %lld cannot be right: the file has %lld "
                            "bytes, room for at most %lld samples (%s)",
                            m->name, (long long)s->line, s->url, (long long)s->samples, (long long)bytes,
                            (long long)capacity, how);
        if (s->samples > max_samples - total)
            return vf_error(VF_ECORRUPT, "%s:%lld: shard %s: num_sequences %lld brings the manifest to %lld samples, "
                            "above max_manifest_samples %lld (the plan of an epoch holds about 16 bytes per "
                            "sample; raise the budget for a set this large)",
                            m->name, (long long)s->line, s->url, (long long)s->samples,
                            (long long)(total + s->samples), (long long)max_samples);
        total += s->samples;
    }
    return 0;
}

uint64_t vf_wds_manifest_fingerprint(const vf_wds_manifest *m)
{
    uint64_t h = vf_mix64(0x77647300u + m->count);
    for (size_t i = 0; i < m->count; i++) {
        for (const char *p = m->shards[i].name; *p; p++)
            h = vf_mix64(h ^ (uint8_t)*p);
        h = vf_mix64(h ^ (uint64_t)m->shards[i].samples ^ 0x9e3779b97f4a7c15ull);
    }
    return h;
}

void vf_wds_manifest_close(vf_wds_manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->count; i++) {
        free(m->shards[i].name);
        free(m->shards[i].url);
    }
    free(m->shards);
    free(m->name);
    free(m->base);
    free(m);
}
