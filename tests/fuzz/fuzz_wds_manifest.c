/*
 * fuzz_wds_manifest.c: libFuzzer target for the WebDataset manifest parser
 * (src/wds/manifest.c: manifest.jsonl lines, shard name resolution, the
 * base-escape check and the count checks).
 *
 * Input: one byte choosing where the manifest is said to live (a local
 * folder, a bare file name, an absolute path, an http or s3 URL with or
 * without a query) and whether shards may leave its base, then the
 * manifest's text. Nothing is read from disk or the network: the text is
 * parsed from memory, and the counts are checked only for remote names
 * (a local name would stat fuzzed paths).
 *
 * Invariants checked on success: at least one shard; every shard has a
 * non-empty name and a URL ending in ".tar", a count >= 0 and a line
 * number that grows; the counts add up to the total; without the opt-in,
 * every URL starts with the manifest's base and has no ".." component
 * after it. On failure the error has a message naming the manifest. Any
 * violation aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wds/wds.h"

#define REQUIRE(cond)      \
    do {                   \
        if (!(cond))       \
            abort();       \
    } while (0)

static const struct {
    const char *name, *base;
} places[] = {
    {"shards/manifest.jsonl", "shards/"},
    {"manifest.jsonl", ""},
    {"/data/wds/manifest.jsonl", "/data/wds/"},
    {"http://host:8080/sets/a/manifest.jsonl", "http://host:8080/sets/a/"},
    {"https://host/manifest.jsonl?sig=x/y#f", "https://host/"},
    {"s3://bucket/prefix/manifest.jsonl", "s3://bucket/prefix/"},
};

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && memcmp(s + n - k, tail, k) == 0;
}

/* 1 when a literal "/../" (or a trailing "/..") follows the base in url. */
static int dotdot_after(const char *url, size_t base_len)
{
    const char *rest = url + base_len;
    if (!strncmp(rest, "../", 3) || !strcmp(rest, ".."))
        return 1;
    for (const char *p = strstr(rest, "/.."); p; p = strstr(p + 1, "/.."))
        if (p[3] == '/' || p[3] == '\0')
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t place = (size_t)(data[0] & 0x7f) % (sizeof places / sizeof places[0]);
    vf_wds_manifest_settings settings = {.allow_outside_base = (data[0] & 0x80) != 0};
    const char *name = places[place].name, *base = places[place].base;
    vf_wds_manifest *m = NULL;
    int rc = vf_wds_manifest_parse_with(&m, name, (const char *)data + 1, size - 1, &settings);
    if (rc < 0) {
        REQUIRE(m == NULL);
        REQUIRE(vf_last_error()[0] != '\0');
        return 0;
    }
    REQUIRE(m != NULL);
    size_t n = vf_wds_manifest_num_shards(m);
    REQUIRE(n >= 1);
    REQUIRE(!strcmp(vf_wds_manifest_path(m), name));
    int64_t total = 0, last_line = 0;
    for (size_t i = 0; i < n; i++) {
        const char *shard = vf_wds_manifest_shard_name(m, i), *url = vf_wds_manifest_shard_url(m, i);
        int64_t samples = vf_wds_manifest_shard_samples(m, i), line = vf_wds_manifest_shard_line(m, i);
        REQUIRE(shard && shard[0] && url && ends_with(url, ".tar"));
        REQUIRE(samples >= 0 && line > last_line);
        last_line = line;
        total += samples;
        if (!settings.allow_outside_base) {
            size_t base_len = strlen(base);
            REQUIRE(!strncmp(url, base, base_len));
            REQUIRE(!dotdot_after(url, base_len));
        }
    }
    REQUIRE(total == vf_wds_manifest_total_samples(m));
    (void)vf_wds_manifest_fingerprint(m);
    if (place >= 3) {
        /* remote names: no file is looked at, only the total budget */
        rc = vf_wds_manifest_check_counts(m, 1000);
        REQUIRE(rc == 0 || rc == VF_ECORRUPT);
        REQUIRE(rc < 0 || total <= 1000);
    }
    vf_wds_manifest_close(m);
    return 0;
}
