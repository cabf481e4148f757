/*
 * tar.c: one WebDataset shard as a stream of samples. libarchive parses the
 * tar (ustar, pax and GNU long names; a gzip/zstd/... filter is detected
 * like Python's tarfile "r|*"), fed from a vf_source through read and skip
 * callbacks, so local files, memory and http(s)/s3 objects (with the io
 * layer's read-ahead) are read the same way, and skipped members are never
 * transferred into memory (the skip callback only moves the offset).
 *
 * Grouping follows webdataset 1.0.2 (tariterators.py): base_plus_ext's
 * regular expression ^((?:.*\/|)[^.]+)[.]([^/]*)$ splits a name, the suffix
 * is lower-cased, consecutive members with the same key form one sample, a
 * repeated suffix inside a sample is an error, non-regular members and
 * `__*__` metadata names are skipped.
 *
 * Budgets (vf_wds_reader_limits): only the members of a wanted sample whose
 * suffix is a wanted field are read; every other member is skipped in the
 * stream (the skip callback moves the offset, a compressed stream is
 * inflated through without keeping it), whatever size it declares. A read
 * member's declared size (a GNU or pax sparse member's real size, which is
 * what reading it would produce) is checked against max_member_bytes, and
 * the sample's read members together against max_sample_bytes, before
 * anything is allocated for it.
 *
 * Invariant: the header of the member after a sample has been read when the
 * sample is returned (that is how its end is known), but its data has not:
 * it is read or skipped by the next call, according to that call's `want`.
 */
#include <archive.h>
#include <archive_entry.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "wds/wds.h"

#define VF_WDS_CHUNK (256 * 1024)

struct vf_wds_reader {
    char *name;
    vf_source *src;
    uint64_t offset;
    uint8_t *chunk;
    struct archive *archive;
    int opened, done;
    /* the member whose header was read and whose data was not */
    int has_pending;
    char *pending_name;
    size_t pending_key_len;
    int64_t pending_size;
    int pending_sparse;
    vf_wds_reader_limits limits;
    /* the sample being returned */
    char *key;
    vf_wds_member *members;
    char **owned;              /* names and suffixes, freed at the next call */
    size_t num_owned;
    size_t num_members, cap;
    int64_t next_index;
    int64_t sample_bytes;      /* bytes of the sample's members read so far */
    char *refusal;             /* skip_refused: why the sample being assembled is refused */
    vf_wds_sample sample;
};

int vf_wds_split_name(const char *name, size_t *key_len, const char **suffix)
{
    const char *slash = strrchr(name, '/');
    const char *dot = strchr(slash ? slash + 1 : name, '.');
    if (!dot)
        return 0;
    /* The key must end in a non-empty run of non-dots that starts after a
     * '/' (or at the start); when the base name starts with '.', that run
     * is the directory part before it. Take the last '/' leaving a
     * non-empty run and check the run holds no '.'. */
    size_t d = (size_t)(dot - name);
    size_t start = 0;
    if (d >= 2) {
        for (size_t j = d - 1; j-- > 0;) {
            if (name[j] == '/') {
                start = j + 1;
                break;
            }
        }
    }
    if (d == 0)
        return 0;
    for (size_t i = start; i < d; i++)
        if (name[i] == '.')
            return 0;
    *key_len = d;
    *suffix = dot + 1;
    return 1;
}

int vf_wds_is_meta_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 2 || name[0] != '_' || name[1] != '_')
        return 0;
    if (!strchr(name, '/') && n >= 4 && name[n - 1] == '_' && name[n - 2] == '_')
        return 1;
    /* re.match(r"__[^/]*__($|/)", name) */
    for (size_t k = 2; k + 1 < n && name[k] != '/'; k++)
        if (name[k] == '_' && name[k + 1] == '_' && (k + 2 == n || name[k + 2] == '/'))
            return 1;
    return 0;
}

static la_ssize_t source_read(struct archive *a, void *ctx, const void **buf)
{
    vf_wds_reader *r = ctx;
    int64_t n = vf_source_read_upto(r->src, r->offset, r->chunk, VF_WDS_CHUNK);
    if (n < 0) {
        archive_set_error(a, EIO, "%s", vf_last_error());
        return -1;
    }
    r->offset += (uint64_t)n;
    *buf = r->chunk;
    return (la_ssize_t)n;
}

static la_int64_t source_skip(struct archive *a, void *ctx, la_int64_t request)
{
    (void)a;
    vf_wds_reader *r = ctx;
    uint64_t size = vf_source_size(r->src);
    uint64_t left = size > r->offset ? size - r->offset : 0;
    uint64_t step = (uint64_t)request < left ? (uint64_t)request : left;
    r->offset += step;
    return (la_int64_t)step;
}

static const char *archive_message(struct archive *a)
{
    const char *msg = archive_error_string(a);
    return msg ? msg : "damaged tar data";
}

static int reader_error(vf_wds_reader *r, int code, const char *member, const char *what)
{
    r->done = 1;
    if (member && r->key)
        return vf_error(code, "shard %s: member %s (key %s): %s", r->name, member, r->key, what);
    if (member)
        return vf_error(code, "shard %s: member %s: %s", r->name, member, what);
    if (r->key)
        return vf_error(code, "shard %s: after key %s: %s", r->name, r->key, what);
    return vf_error(code, "shard %s: %s", r->name, what);
}

static int open_archive(vf_wds_reader *r)
{
    r->archive = archive_read_new();
    r->chunk = vf_malloc(VF_WDS_CHUNK);
    if (!r->archive || !r->chunk)
        return VF_ENOMEM;
    archive_read_support_filter_all(r->archive);
    archive_read_support_format_tar(r->archive);
    archive_read_set_read_callback(r->archive, source_read);
    archive_read_set_skip_callback(r->archive, source_skip);
    archive_read_set_callback_data(r->archive, r);
    if (archive_read_open1(r->archive) != ARCHIVE_OK) {
        char *msg = vf_strdup(archive_error_string(r->archive) ? archive_error_string(r->archive) : "not a tar");
        int rc = reader_error(r, VF_ECORRUPT, NULL, msg ? msg : "not a tar");
        free(msg);
        return rc;
    }
    r->opened = 1;
    return 0;
}

static int reader_from_source(vf_wds_reader **out, const char *name, vf_source *src)
{
    vf_wds_reader *r = vf_calloc(1, sizeof *r);
    if (!r) {
        vf_source_close(src);
        return VF_ENOMEM;
    }
    r->src = src;
    r->limits = (vf_wds_reader_limits){.max_member_bytes = VF_WDS_DEFAULT_MAX_MEMBER_BYTES,
                                       .max_sample_bytes = VF_WDS_DEFAULT_MAX_SAMPLE_BYTES};
    r->name = vf_strdup(name);
    if (!r->name) {
        vf_wds_reader_close(r);
        return VF_ENOMEM;
    }
    int rc = open_archive(r);
    if (rc < 0) {
        vf_wds_reader_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

int vf_wds_reader_open(vf_wds_reader **out, const char *path_or_url)
{
    *out = NULL;
    vf_source *src = NULL;
    int rc = vf_is_url(path_or_url) ? vf_source_open_url(&src, path_or_url, NULL)
                                    : vf_source_open_file(&src, path_or_url);
    if (rc < 0)
        return vf_error_context(rc, "shard %s", path_or_url);
    return reader_from_source(out, path_or_url, src);
}

int vf_wds_reader_open_memory(vf_wds_reader **out, const char *name, const void *data, size_t len)
{
    *out = NULL;
    vf_source *src = NULL;
    int rc = vf_source_open_memory(&src, name, data, len, 0);
    if (rc < 0)
        return rc;
    return reader_from_source(out, name, src);
}

void vf_wds_reader_set_limits(vf_wds_reader *r, const vf_wds_reader_limits *limits)
{
    r->limits = *limits;
}

static void clear_sample(vf_wds_reader *r)
{
    free(r->refusal);
    r->refusal = NULL;
    r->sample_bytes = 0;
    for (size_t i = 0; i < r->num_members; i++)
        free((void *)r->members[i].data);
    for (size_t i = 0; i < r->num_owned; i++)
        free(r->owned[i]);
    r->num_owned = 0;
    r->num_members = 0;
    free(r->key);
    r->key = NULL;
}

/* Reads headers up to the next regular member with a key; 1 when one is
 * pending, 0 at the end of the archive. */
static int read_header(vf_wds_reader *r)
{
    for (;;) {
        struct archive_entry *entry = NULL;
        int ar = archive_read_next_header(r->archive, &entry);
        if (ar == ARCHIVE_EOF)
            return 0;
        /* ARCHIVE_RETRY is libarchive's "damaged header" (bad checksum):
         * it would resynchronise past it, silently losing members, so it
         * is an error here like ARCHIVE_FATAL. The sample before it counts
         * as bad too: its last members may be the ones lost. */
        if (ar == ARCHIVE_RETRY || ar < ARCHIVE_WARN) {
            const char *msg = archive_error_string(r->archive);
            char *copy = vf_strdup(msg ? msg : "unreadable tar header");
            int rc = reader_error(r, VF_ECORRUPT, NULL, copy ? copy : "unreadable tar header");
            free(copy);
            return rc;
        }
        const char *name = archive_entry_pathname(entry);
        size_t key_len = 0;
        const char *suffix = NULL;
        if (archive_entry_filetype(entry) != AE_IFREG || !name || vf_wds_is_meta_name(name) ||
            !vf_wds_split_name(name, &key_len, &suffix)) {
            if (archive_read_data_skip(r->archive) < ARCHIVE_WARN)
                return reader_error(r, VF_ECORRUPT, name, archive_message(r->archive));
            continue;
        }
        free(r->pending_name);
        r->pending_name = vf_strdup(name);
        if (!r->pending_name)
            return VF_ENOMEM;
        r->pending_key_len = key_len;
        r->pending_size = archive_entry_size_is_set(entry) ? archive_entry_size(entry) : -1;
        r->pending_sparse = archive_entry_sparse_count(entry) > 0;
        r->has_pending = 1;
        return 1;
    }
}

static int keep(vf_wds_reader *r, char *s)
{
    if (!s)
        return VF_ENOMEM;
    char **grown = vf_realloc(r->owned, (r->num_owned + 1) * sizeof *grown);
    if (!grown) {
        free(s);
        return VF_ENOMEM;
    }
    r->owned = grown;
    r->owned[r->num_owned++] = s;
    return 0;
}

static int field_wanted(const vf_wds_reader *r, const char *suffix)
{
    if (!r->limits.fields)
        return 1;
    for (size_t i = 0; i < r->limits.num_fields; i++)
        if (!strcmp(r->limits.fields[i], suffix))
            return 1;
    return 0;
}

/* 1 when the pending member may be read within the budgets; 0 when it is
 * refused (skip_refused: the sample's refusal is set, and the member and
 * the rest of the sample are skipped), or a negative code (the reader ends). */
static int within_budgets(vf_wds_reader *r, const char *name)
{
    char *what = NULL;
    if (r->pending_size > r->limits.max_member_bytes)
        what = vf_asprintf("%lld bytes%s, above max_member_bytes %lld", (long long)r->pending_size,
                           r->pending_sparse ? " (a sparse member: the size it expands to)" : "",
                           (long long)r->limits.max_member_bytes);
    else if (r->pending_size > r->limits.max_sample_bytes - r->sample_bytes)
        what = vf_asprintf("the sample's read members reach %lld bytes with it, above max_sample_bytes %lld",
                           (long long)(r->sample_bytes + r->pending_size), (long long)r->limits.max_sample_bytes);
    else
        return 1;
    if (!what)
        return VF_ENOMEM;
    if (!r->limits.skip_refused) {
        int rc = reader_error(r, VF_ERANGE, name, what);
        free(what);
        return rc;
    }
    r->refusal = vf_asprintf("shard %s: member %s (key %s): %s", r->name, name, r->key, what);
    free(what);
    return r->refusal ? 0 : VF_ENOMEM;
}

/* Reads or skips the pending member's data and adds it to the sample. */
static int take_pending(vf_wds_reader *r, int want)
{
    const char *name = r->pending_name;
    char *suffix = vf_strdup(name + r->pending_key_len + 1);
    if (keep(r, suffix) < 0)
        return VF_ENOMEM;
    for (char *p = suffix; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    for (size_t i = 0; i < r->num_members; i++)
        if (strcmp(r->members[i].suffix, suffix) == 0)
            return reader_error(r, VF_ECORRUPT, name, "duplicate suffix in one sample (webdataset refuses it too)");
    if (r->pending_size < 0)
        return reader_error(r, VF_ECORRUPT, name, "member size missing");
    int read = want && !r->refusal && field_wanted(r, suffix);
    if (read) {
        int rc = within_budgets(r, name);
        if (rc < 0)
            return rc;
        read = rc;
    }
    uint8_t *data = NULL;
    size_t size = (size_t)r->pending_size;
    if (read) {
        data = vf_malloc(size ? size : 1);
        if (!data)
            return VF_ENOMEM;
        size_t got = 0;
        while (got < size) {
            la_ssize_t n = archive_read_data(r->archive, data + got, size - got);
            if (n < 0 || (n == 0 && got < size)) {
                free(data);
                const char *msg = n < 0 ? archive_error_string(r->archive) : NULL;
                return reader_error(r, VF_ECORRUPT, name, msg ? msg : "truncated member data");
            }
            got += (size_t)n;
        }
        r->sample_bytes += r->pending_size;
    } else if (archive_read_data_skip(r->archive) < ARCHIVE_WARN) {
        return reader_error(r, VF_ECORRUPT, name, archive_message(r->archive));
    }
    char *full = vf_strdup(name);
    if (keep(r, full) < 0) {
        free(data);
        return VF_ENOMEM;
    }
    if (r->num_members == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        vf_wds_member *grown = vf_realloc(r->members, cap * sizeof *grown);
        if (!grown) {
            free(data);
            return VF_ENOMEM;
        }
        r->members = grown;
        r->cap = cap;
    }
    r->members[r->num_members++] = (vf_wds_member){.suffix = suffix, .name = full, .data = data, .size = size};
    r->has_pending = 0;
    return 0;
}

int vf_wds_reader_next(vf_wds_reader *r, int want, const vf_wds_sample **out)
{
    *out = NULL;
    clear_sample(r);
    if (r->done)
        return VF_EOF;
    for (;;) {
        if (!r->has_pending) {
            int rc = read_header(r);
            if (rc < 0)
                return rc;
            if (rc == 0) {
                r->done = 1;
                if (r->num_members == 0)
                    return VF_EOF;
                break;
            }
        }
        if (r->key && (strlen(r->key) != r->pending_key_len ||
                       memcmp(r->key, r->pending_name, r->pending_key_len) != 0))
            break; /* the pending member starts the next sample */
        if (!r->key) {
            r->key = vf_strndup(r->pending_name, r->pending_key_len);
            if (!r->key)
                return VF_ENOMEM;
        }
        int rc = take_pending(r, want);
        if (rc < 0)
            return rc;
    }
    if (r->refusal) {
        /* skip_refused: the sample is passed over; what it had read goes now */
        for (size_t i = 0; i < r->num_members; i++) {
            free((void *)r->members[i].data);
            r->members[i].data = NULL;
        }
        r->next_index++;
        return vf_error(VF_ERANGE, "%s", r->refusal);
    }
    r->sample = (vf_wds_sample){.key = r->key, .index = r->next_index++, .num_members = r->num_members,
                                .members = r->members};
    *out = &r->sample;
    return 0;
}

void vf_wds_reader_close(vf_wds_reader *r)
{
    if (!r)
        return;
    clear_sample(r);
    if (r->archive)
        archive_read_free(r->archive);
    if (r->src)
        vf_source_close(r->src);
    free(r->members);
    free(r->owned);
    free(r->pending_name);
    free(r->chunk);
    free(r->name);
    free(r);
}
