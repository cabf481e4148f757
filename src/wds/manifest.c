/*
 * manifest.c: manifest.jsonl of a WebDataset shard set. One JSON object
 * per line: "shard" (path relative to the manifest's directory, with or
 * without ".tar") and "num_sequences". VLA Foundry's loader builds
 * <dir>/<shard>.tar from stems (vla_foundry/data/dataloader.py), while its
 * docs show names ending in .tar; both are accepted and resolve to the
 * same file. A shard that is itself a URL or an absolute path is used as
 * is (plus ".tar" when missing).
 */
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "json/json.h"
#include "wds/wds.h"

#define VF_WDS_MANIFEST_MAX_BYTES ((size_t)1 << 30)

typedef struct wds_shard {
    char *name, *url;
    int64_t samples;
} wds_shard;

struct vf_wds_manifest {
    char *name;
    wds_shard *shards;
    size_t count;
    int64_t total;
};

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && memcmp(s + n - k, tail, k) == 0;
}

int vf_wds_manifest_parse(vf_wds_manifest **out, const char *name, const char *text, size_t len)
{
    *out = NULL;
    vf_wds_manifest *m = vf_calloc(1, sizeof *m);
    if (!m || !(m->name = vf_strdup(name))) {
        free(m);
        return VF_ENOMEM;
    }
    const char *slash = strrchr(name, '/');
    size_t dir_len = slash ? (size_t)(slash - name) + 1 : 0;
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
            const char *tar = ends_with(shard, ".tar") ? "" : ".tar";
            int absolute = vf_is_url(shard) || shard[0] == '/';
            s->name = vf_strdup(shard);
            s->url = absolute ? vf_asprintf("%s%s", shard, tar)
                              : vf_asprintf("%.*s%s%s", (int)dir_len, name, shard, tar);
            s->samples = count;
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
    rc = vf_wds_manifest_parse(out, path_or_url, (const char *)data, len);
    free(data);
    return rc;
}

size_t vf_wds_manifest_num_shards(const vf_wds_manifest *m) { return m->count; }
const char *vf_wds_manifest_shard_url(const vf_wds_manifest *m, size_t i) { return m->shards[i].url; }
const char *vf_wds_manifest_shard_name(const vf_wds_manifest *m, size_t i) { return m->shards[i].name; }
int64_t vf_wds_manifest_shard_samples(const vf_wds_manifest *m, size_t i) { return m->shards[i].samples; }
int64_t vf_wds_manifest_total_samples(const vf_wds_manifest *m) { return m->total; }

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
    free(m);
}
