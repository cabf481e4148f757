/*
 * test_wds_manifest.c: where the shards of a manifest.jsonl may live.
 *
 * A shard must resolve under the manifest's base: the manifest's folder
 * for a local manifest, the URL prefix up to its last '/' for an
 * http(s):// or s3:// one. Checked here: '..' components (plain and
 * percent-encoded in URLs), absolute paths, URLs in a local manifest,
 * other hosts and local paths in a remote manifest, file:// URLs with a
 * "?.tar" tail; each refused at open with the manifest, the line, the
 * shard and the reason named. Entries that stay inside (absolute ones
 * under the base included) still resolve, and the opt-in (the settings
 * field, the loader's field, or VF_WDS_ALLOW_OUTSIDE=1 read by the
 * *_defaults functions) lets every entry through as written. The loader
 * end to end: a set whose manifest reaches into a sibling folder is
 * refused before any shard is read, and read with the opt-in; a symbolic
 * link inside the folder is followed (the check reads the text only, as
 * documented). Counts whose total passes int64_t are refused by line.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, symlink */
#include <archive.h>
#include <archive_entry.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "wds/wds.h"

#define LOCAL "/data/shards/manifest.jsonl"
#define REMOTE "http://host/set/manifest.jsonl"

/* A manifest of two good lines, then `shard` on line 3. */
static char *with_third_line(const char *shard)
{
    return vf_asprintf("{\"shard\": \"ok_0\", \"num_sequences\": 1}\n"
                       "{\"shard\": \"sub/ok_1.tar\", \"num_sequences\": 1}\n"
                       "{\"shard\": \"%s\", \"num_sequences\": 2}\n",
                       shard);
}

/* Parses `shard` on line 3 of manifest `name` with the given opt-in
 * (-1: the defaults); returns the result code. */
static int parse_one(const char *name, const char *shard, int allow_outside, vf_wds_manifest **out)
{
    char *text = with_third_line(shard);
    int rc;
    if (allow_outside < 0) {
        rc = vf_wds_manifest_parse(out, name, text, strlen(text));
    } else {
        vf_wds_manifest_settings ms;
        vf_wds_manifest_defaults(&ms);
        ms.allow_outside_base = allow_outside;
        rc = vf_wds_manifest_parse_with(out, name, text, strlen(text), &ms);
    }
    free(text);
    return rc;
}

/* `shard` is JSON text; `shown` how the message quotes it (NULL: the same). */
static void expect_refused_shown(const char *name, const char *shard, const char *shown, const char *reason)
{
    vf_wds_manifest *m = (vf_wds_manifest *)1;
    int rc = parse_one(name, shard, -1, &m);
    CHECK_EQ_INT(rc, VF_EINVAL);
    CHECK(m == NULL);
    const char *msg = vf_last_error();
    char *line = vf_asprintf("%s:3:", name);
    if (!shown)
        shown = shard;
    if (!strstr(msg, line) || !strstr(msg, shown) || !strstr(msg, reason) || !strstr(msg, "VF_WDS_ALLOW_OUTSIDE"))
        fprintf(stderr, "for shard %s in %s: message \"%s\" lacks \"%s\" or \"%s\"\n", shard, name, msg, line,
                reason);
    CHECK(strstr(msg, line) && strstr(msg, shown) && strstr(msg, reason) && strstr(msg, "VF_WDS_ALLOW_OUTSIDE"));
    free(line);
    /* the explicit opt-in accepts it, resolved as the manifest wrote it */
    m = NULL;
    CHECK_OK(parse_one(name, shard, 1, &m));
    CHECK(m && vf_wds_manifest_num_shards(m) == 3);
    vf_wds_manifest_close(m);
}

static void expect_refused(const char *name, const char *shard, const char *reason)
{
    expect_refused_shown(name, shard, NULL, reason);
}

static void expect_url(const char *name, const char *shard, const char *url)
{
    vf_wds_manifest *m = NULL;
    CHECK_OK(parse_one(name, shard, -1, &m));
    if (m && strcmp(vf_wds_manifest_shard_url(m, 2), url))
        fprintf(stderr, "shard %s of %s: resolved to %s, expected %s\n", shard, name,
                vf_wds_manifest_shard_url(m, 2), url);
    CHECK(m && !strcmp(vf_wds_manifest_shard_url(m, 2), url));
    vf_wds_manifest_close(m);
}

static void test_local_manifest(void)
{
    expect_refused(LOCAL, "../x.tar", "'..'");
    expect_refused(LOCAL, "..", "'..'");
    expect_refused(LOCAL, "sub/../../x.tar", "'..'");
    expect_refused(LOCAL, "sub/..", "'..'");
    expect_refused(LOCAL, "/abs/x.tar", "absolute path");
    expect_refused(LOCAL, "/data/shards/../x.tar", "'..'");
    expect_refused(LOCAL, "/data/shardsX/x.tar", "absolute path");
    expect_refused(LOCAL, "http://other-host/x.tar", "URL");
    expect_refused(LOCAL, "s3://bucket/x", "URL");
    expect_refused(LOCAL, "file:///etc/passwd?.tar", "URL");
    expect_refused("manifest.jsonl", "/abs/x.tar", "absolute path");
    expect_refused("manifest.jsonl", "../x", "'..'");

    expect_url(LOCAL, "x", "/data/shards/x.tar");
    expect_url(LOCAL, "./sub/y.tar", "/data/shards/./sub/y.tar");
    expect_url(LOCAL, "a..b/..c", "/data/shards/a..b/..c.tar");
    expect_url(LOCAL, "/data/shards/sub/z.tar", "/data/shards/sub/z.tar");
    expect_url(LOCAL, "%2e%2e/x", "/data/shards/%2e%2e/x.tar"); /* a literal folder name on disk */
    expect_url("manifest.jsonl", "x", "x.tar");
}

static void test_remote_manifest(void)
{
    expect_refused(REMOTE, "/etc/passwd", "local path");
    expect_refused(REMOTE, "file:///etc/passwd?.tar", "URL outside");
    expect_refused(REMOTE, "http://other-host/x.tar", "URL outside");
    expect_refused(REMOTE, "https://host/set/x.tar", "URL outside");
    expect_refused(REMOTE, "http://host/other/x.tar", "URL outside");
    expect_refused(REMOTE, "http://host/set/../x.tar", "'..'");
    expect_refused(REMOTE, "../x.tar", "'..'");
    expect_refused(REMOTE, "%2e%2e/x.tar", "'..'");
    expect_refused(REMOTE, ".%2E/x.tar", "'..'");
    expect_refused(REMOTE, "sub%2f..%2f..%2fx.tar", "'..'");
    expect_refused(REMOTE, "u%00a/../x.tar", "'..'"); /* an escaped NUL does not end the check */
    expect_refused(REMOTE, "%%%00/%2e%2e/x.tar", "'..'");
    expect_refused_shown(REMOTE, "sub\\\\..\\\\..\\\\x.tar", "sub\\..\\..\\x.tar", "'..'");
    expect_refused("s3://bucket/set/manifest.jsonl", "s3://other/x", "URL outside");
    expect_refused("s3://bucket/set/manifest.jsonl", "/tmp/x", "local path");

    expect_url(REMOTE, "x", "http://host/set/x.tar");
    expect_url(REMOTE, "sub/y.tar", "http://host/set/sub/y.tar");
    expect_url(REMOTE, "http://host/set/sub/z.tar", "http://host/set/sub/z.tar");
    expect_url("s3://bucket/set/manifest.jsonl", "s3://bucket/set/q", "s3://bucket/set/q.tar");
    /* the folder of a URL ends before its query string */
    expect_url("http://host/set/manifest.jsonl?sig=a/b", "x", "http://host/set/x.tar");
    /* a manifest at the root of a host: the host is the base, never the bare scheme */
    expect_url("http://host", "x", "http://host/x.tar");
    expect_refused("http://host", "http://other/x", "URL outside");
}

static void test_environment_opt_in(void)
{
    vf_wds_manifest_settings ms;
    vf_wds_loader_settings ls;
    vf_wds_manifest *m = NULL;
    unsetenv("VF_WDS_ALLOW_OUTSIDE");
    vf_wds_manifest_defaults(&ms);
    vf_wds_loader_defaults(&ls);
    CHECK(ms.allow_outside_base == 0 && ls.allow_outside_base == 0);
    setenv("VF_WDS_ALLOW_OUTSIDE", "0", 1);
    vf_wds_manifest_defaults(&ms);
    CHECK(ms.allow_outside_base == 0);
    CHECK_EQ_INT(parse_one(LOCAL, "../x", -1, &m), VF_EINVAL);
    setenv("VF_WDS_ALLOW_OUTSIDE", "1", 1);
    vf_wds_manifest_defaults(&ms);
    vf_wds_loader_defaults(&ls);
    CHECK(ms.allow_outside_base == 1 && ls.allow_outside_base == 1);
    CHECK_OK(parse_one(LOCAL, "../x", -1, &m));
    CHECK(m && !strcmp(vf_wds_manifest_shard_url(m, 2), "/data/shards/../x.tar"));
    vf_wds_manifest_close(m);
    m = NULL;
    /* an explicit 0 in the settings wins over the environment */
    CHECK_EQ_INT(parse_one(LOCAL, "../x", 0, &m), VF_EINVAL);
    unsetenv("VF_WDS_ALLOW_OUTSIDE");
}

static void write_shard(const char *path)
{
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    CHECK(archive_write_open_filename(a, path) == ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, "k0.txt");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, 5);
    archive_write_header(a, e);
    archive_write_data(a, "hello", 5);
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Opens `manifest` with the opt-in given and reads its one batch. */
static int read_set(const char *manifest, int allow_outside)
{
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    s.allow_outside_base = allow_outside;
    s.threads = 1;
    s.prefetch = 0;
    vf_wds_loader *l = NULL;
    int rc = vf_wds_loader_open(&l, manifest, &s);
    if (rc < 0)
        return rc;
    vf_wds_batch *b = NULL;
    rc = vf_wds_loader_next(l, &b);
    CHECK(rc < 0 || (b && b->size == 1 && !strcmp(b->keys[0], "k0")));
    vf_wds_batch_free(b);
    vf_wds_loader_close(l);
    return rc;
}

static void test_loader(void)
{
    unsetenv("VF_WDS_ALLOW_OUTSIDE");
    char *root = vf_test_tmpdir("wds_manifest");
    char *outside = vf_asprintf("%s/outside", root), *set = vf_asprintf("%s/set", root);
    char *shard = vf_asprintf("%s/outside/x.tar", root), *link = vf_asprintf("%s/set/link.tar", root);
    char *escaping = vf_asprintf("%s/set/manifest.jsonl", root), *linked = vf_asprintf("%s/set/linked.jsonl", root);
    CHECK_OK(vf_mkdirs(outside));
    CHECK_OK(vf_mkdirs(set));
    write_shard(shard);
    write_text(escaping, "{\"shard\": \"../outside/x\", \"num_sequences\": 1}\n");
    write_text(linked, "{\"shard\": \"link\", \"num_sequences\": 1}\n");
    CHECK(symlink(shard, link) == 0);

    CHECK_ERR(read_set(escaping, 0), VF_EINVAL, "manifest.jsonl:1: shard \"../outside/x\" is refused");
    CHECK_OK(read_set(escaping, 1));
    setenv("VF_WDS_ALLOW_OUTSIDE", "1", 1);
    vf_wds_loader_settings s;
    vf_wds_loader_defaults(&s);
    unsetenv("VF_WDS_ALLOW_OUTSIDE");
    CHECK(s.allow_outside_base == 1);
    /* a link inside the folder is followed: documented, not refused */
    CHECK_OK(read_set(linked, 0));

    vf_test_rmtree(root);
    free(root);
    free(outside);
    free(set);
    free(shard);
    free(link);
    free(escaping);
    free(linked);
}

/* Counts whose sum passes int64_t are refused by name (before: signed overflow in the total). */
static void test_count_overflow(void)
{
    const char *text = "{\"shard\": \"a\", \"num_sequences\": 9223372036854775807}\n"
                       "{\"shard\": \"b\", \"num_sequences\": 5}\n";
    vf_wds_manifest *m = NULL;
    CHECK_ERR(vf_wds_manifest_parse(&m, LOCAL, text, strlen(text)), VF_ECORRUPT,
              LOCAL ":2: shard \"b\": num_sequences 5 brings the manifest's total past 2^63 - 1 samples");
    CHECK(m == NULL);
    const char *one = "{\"shard\": \"a\", \"num_sequences\": 9223372036854775807}\n";
    CHECK_OK(vf_wds_manifest_parse(&m, LOCAL, one, strlen(one)));
    CHECK(m && vf_wds_manifest_total_samples(m) == INT64_MAX);
    CHECK_ERR(vf_wds_manifest_check_counts(m, 1 << 20), VF_ECORRUPT, "above max_manifest_samples");
    vf_wds_manifest_close(m);
}

int main(void)
{
    test_local_manifest();
    test_remote_manifest();
    test_environment_opt_in();
    test_loader();
    test_count_overflow();
    return vf_test_finish("test_wds_manifest");
}
