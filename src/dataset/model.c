/*
 * model.c: the vf_dataset object: its arena, problem list, the open
 * pipeline (info.json -> backend -> selection -> file lists -> validation),
 * path templates, the local file system hooks and the public accessors.
 *
 * Invariants: everything reachable from a vf_dataset is allocated in its
 * arena (blocks freed together in vf_dataset_close()), so a failed open
 * needs no partial cleanup beyond closing. The object is never modified
 * after vf_ds_open_fs() returns.
 */
#define _GNU_SOURCE
#include "dataset/dataset.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------------- */

struct vf_ds_arena_block {
    vf_ds_arena_block *next;
    size_t used, cap;
    max_align_t data[];
};

#define ARENA_BLOCK (64 * 1024)

void *vf_ds_alloc(vf_dataset *d, size_t count, size_t size)
{
    if (size && count > (SIZE_MAX / 2) / size) {
        vf_error(VF_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    size_t n = count * size;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0)
        n = sizeof(max_align_t);
    vf_ds_arena_block *b = d->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK / 4 ? n : ARENA_BLOCK;
        vf_ds_arena_block *nb = vf_malloc(sizeof *nb + cap);
        if (!nb)
            return NULL;
        nb->used = 0;
        nb->cap = cap;
        if (b && n > ARENA_BLOCK / 4) {
            /* A big allocation gets its own block behind the current one,
             * so the current block's free space stays usable. */
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            d->arena = nb;
        }
        b = nb;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *vf_ds_strndup(vf_dataset *d, const char *s, size_t n)
{
    char *p = vf_ds_alloc(d, n + 1, 1);
    if (p)
        memcpy(p, s, n);
    return p;
}

char *vf_ds_strdup(vf_dataset *d, const char *s) { return vf_ds_strndup(d, s ? s : "", s ? strlen(s) : 0); }

char *vf_ds_printf(vf_dataset *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return vf_ds_strdup(d, "");
    char *p = vf_ds_alloc(d, (size_t)n + 1, 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

const char *vf_ds_abs(vf_dataset *d, const char *rel)
{
    size_t lr = strlen(d->root);
    while (lr > 1 && d->root[lr - 1] == '/')
        lr--;
    return vf_ds_printf(d, "%.*s/%s", (int)lr, d->root, rel);
}

/* ---- problems ------------------------------------------------------------- */

/* At most this many problems are kept; one more says how many were cut. */
#define MAX_PROBLEMS 10000

int vf_ds_problem(vf_dataset *d, vf_severity severity, const char *file, int64_t episode, const char *column,
                  const char *fmt, ...)
{
    if (severity == VF_SEVERITY_ERROR)
        d->num_errors++;
    if (d->num_problems > MAX_PROBLEMS)
        return 0;
    if (vf_grow_array(&d->problems, d->num_problems, &d->cap_problems, 16, sizeof *d->problems) < 0)
        return VF_ENOMEM;
    vf_problem *p = &d->problems[d->num_problems];
    char message[1024];
    if (d->num_problems == MAX_PROBLEMS) {
        snprintf(message, sizeof message, "more problems not listed (limit %d)", MAX_PROBLEMS);
        file = "";
        column = "";
        episode = -1;
        severity = VF_SEVERITY_WARNING;
    } else {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof message, fmt, ap);
        va_end(ap);
    }
    p->severity = severity;
    p->changes_samples = severity == VF_SEVERITY_WARNING && file && !strcmp(file, "meta/info.json");
    p->episode = episode;
    p->file = vf_ds_strdup(d, file ? file : "");
    p->column = vf_ds_strdup(d, column ? column : "");
    p->message = vf_ds_strdup(d, message);
    if (!p->file || !p->column || !p->message)
        return VF_ENOMEM;
    d->num_problems++;
    return 0;
}

int vf_ds_missing_file(vf_dataset *d, const char *rel)
{
    if (vf_grow_array(&d->missing, d->num_missing, &d->cap_missing, 16, sizeof *d->missing) < 0)
        return VF_ENOMEM;
    d->missing[d->num_missing] = vf_ds_strdup(d, rel);
    if (!d->missing[d->num_missing])
        return VF_ENOMEM;
    d->num_missing++;
    return 0;
}

vf_ds_episode *vf_ds_add_episode(vf_dataset *d)
{
    if (vf_grow_array(&d->episodes, d->num_all_episodes, &d->cap_episodes, 64, sizeof *d->episodes) < 0)
        return NULL;
    vf_ds_episode *e = &d->episodes[d->num_all_episodes];
    memset(e, 0, sizeof *e);
    e->data_file_id = -1;
    e->meta_file = -1;
    if (d->num_cameras) {
        if (d->video_block_used < d->video_block_cap) {
            e->video = d->video_block + d->video_block_used++ * d->num_cameras;
            memset(e->video, 0, d->num_cameras * sizeof *e->video);
        } else {
            e->video = vf_ds_alloc(d, d->num_cameras, sizeof *e->video);
        }
        if (!e->video)
            return NULL;
        for (size_t c = 0; c < d->num_cameras; c++)
            e->video[c].file = -1;
    }
    d->num_all_episodes++;
    return e;
}

int vf_ds_reserve_episodes(vf_dataset *d, size_t n)
{
    if (n > d->cap_episodes) {
        size_t cap = VF_MAX(n, d->cap_episodes + d->cap_episodes / 2); /* geometric: called once per window */
        vf_ds_episode *grown = vf_realloc(d->episodes, cap * sizeof *grown);
        if (!grown)
            return VF_ENOMEM;
        d->episodes = grown;
        d->cap_episodes = cap;
    }
    size_t more = n > d->num_all_episodes ? n - d->num_all_episodes : 0;
    if (d->num_cameras && more > d->video_block_cap - d->video_block_used) {
        vf_ds_video_loc *block = vf_ds_alloc(d, more, d->num_cameras * sizeof *block);
        if (!block)
            return VF_ENOMEM;
        d->video_block = block;
        d->video_block_used = 0;
        d->video_block_cap = more;
    }
    return 0;
}

/* ---- path templates ------------------------------------------------------- */

/* A path made from a metadata template must name a file inside the dataset
 * root, local or remote: relative, no '..' component, no scheme, no
 * backslash (a Windows separator that a server may honour). */
static int check_relative_path(const char *templ, const char *path)
{
    if (!*path)
        return vf_error(VF_ECORRUPT, "path template '%s': expands to an empty path", templ);
    if (path[0] == '/' || strchr(path, '\\') || strstr(path, "://"))
        return vf_error(VF_ECORRUPT, "path template '%s': expands to '%s', which is not a path inside the dataset root",
                        templ, path);
    for (const char *p = path; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return vf_error(VF_ECORRUPT,
                            "path template '%s': expands to '%s', which leaves the dataset root ('..' component)", templ,
                            path);
        p += n;
        if (*p == '/')
            p++;
    }
    return 0;
}

int vf_ds_format_template(const char *templ, const vf_ds_template_vars *vars, char **out)
{
    *out = NULL;
    vf_buf b = {0};
    int r = 0;
    for (const char *p = templ; *p && r == 0;) {
        if (*p == '{' && p[1] == '{') {
            r = vf_buf_append_u8(&b, '{');
            p += 2;
            continue;
        }
        if (*p == '}' && p[1] == '}') {
            r = vf_buf_append_u8(&b, '}');
            p += 2;
            continue;
        }
        if (*p == '}') {
            r = vf_error(VF_ECORRUPT, "path template '%s': single '}'", templ);
            break;
        }
        if (*p != '{') {
            r = vf_buf_append_u8(&b, (uint8_t)*p++);
            continue;
        }
        const char *close = strchr(p, '}');
        if (!close) {
            r = vf_error(VF_ECORRUPT, "path template '%s': unclosed '{'", templ);
            break;
        }
        const char *colon = memchr(p, ':', (size_t)(close - p));
        size_t name_len = (size_t)((colon ? colon : close) - (p + 1));
        const char *name = p + 1;
        /* Spec: empty, or [0][width]d (width up to 2 digits). */
        int zero = 0, width = 0, spec_ok = 1, is_d = 0;
        if (colon) {
            const char *s = colon + 1;
            if (*s == '0') {
                zero = 1;
                s++;
            }
            int digits = 0;
            while (s < close && *s >= '0' && *s <= '9' && digits < 2) {
                width = width * 10 + (*s - '0');
                s++;
                digits++;
            }
            if (s < close && *s == 'd') {
                is_d = 1;
                s++;
            }
            spec_ok = (s == close);
        }
        int64_t value = 0;
        int is_int = 1;
        if (name_len == 11 && !memcmp(name, "chunk_index", 11))
            value = vars->chunk_index;
        else if (name_len == 10 && !memcmp(name, "file_index", 10))
            value = vars->file_index;
        else if (name_len == 13 && !memcmp(name, "episode_chunk", 13))
            value = vars->episode_chunk;
        else if (name_len == 13 && !memcmp(name, "episode_index", 13))
            value = vars->episode_index;
        else if (name_len == 9 && !memcmp(name, "video_key", 9) && vars->video_key)
            is_int = 0;
        else {
            r = vf_error(VF_ECORRUPT, "path template '%s': unknown placeholder {%.*s}", templ, (int)name_len, name);
            break;
        }
        if (!spec_ok || (!is_int && colon)) {
            r = vf_error(VF_ECORRUPT, "path template '%s': unsupported format spec in {%.*s}", templ,
                         (int)(close - p - 1), p + 1);
            break;
        }
        (void)is_d;
        if (is_int)
            r = zero ? vf_buf_printf(&b, "%0*lld", width, (long long)value)
                     : vf_buf_printf(&b, "%*lld", width, (long long)value);
        else
            r = vf_buf_printf(&b, "%s", vars->video_key);
        p = close + 1;
    }
    if (r < 0) {
        vf_buf_free(&b);
        return r;
    }
    *out = vf_buf_take_string(&b);
    if (!*out)
        return VF_ENOMEM;
    if ((r = check_relative_path(templ, *out)) < 0) {
        free(*out);
        *out = NULL;
    }
    return r;
}

/* ---- local file system ---------------------------------------------------- */

static char *local_path(void *ctx, const char *rel) { return vf_path_join((const char *)ctx, rel); }

static int local_read_all(void *ctx, const char *rel, uint8_t **data, size_t *len)
{
    char *p = local_path(ctx, rel);
    if (!p)
        return VF_ENOMEM;
    int r = vf_read_file(p, data, len);
    free(p);
    return r;
}

static int local_open_source(void *ctx, const char *rel, vf_source **out)
{
    char *p = local_path(ctx, rel);
    if (!p)
        return VF_ENOMEM;
    int r = vf_source_open_file(out, p);
    free(p);
    return r;
}

static int local_exists(void *ctx, const char *rel)
{
    char *p = local_path(ctx, rel);
    int r = p ? vf_file_exists(p) : 0;
    free(p);
    return r;
}

static int local_list_dir(void *ctx, const char *rel, char ***names, size_t *count)
{
    *names = NULL;
    *count = 0;
    char *p = local_path(ctx, rel);
    if (!p)
        return VF_ENOMEM;
    DIR *dir = opendir(p);
    if (!dir) {
        int r = vf_error(errno == ENOENT || errno == ENOTDIR ? VF_ENOENT : VF_EIO, "%s: cannot list directory: %s", p,
                         strerror(errno));
        free(p);
        return r;
    }
    free(p);
    size_t n = 0, cap = 0;
    char **list = NULL;
    struct dirent *e;
    int r = 0;
    while ((e = readdir(dir)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **grown = vf_realloc(list, cap * sizeof *grown);
            if (!grown) {
                r = VF_ENOMEM;
                break;
            }
            list = grown;
        }
        if (!(list[n] = vf_strdup(e->d_name))) {
            r = VF_ENOMEM;
            break;
        }
        n++;
    }
    closedir(dir);
    if (r < 0) {
        for (size_t i = 0; i < n; i++)
            free(list[i]);
        free(list);
        return r;
    }
    *names = list;
    *count = n;
    return 0;
}

int vf_ds_open_parquet(const vf_dataset *d, const char *rel, vf_pq_file **out)
{
    *out = NULL;
    vf_source *src;
    int r = d->fs.open_source(d->fs.ctx, rel, &src);
    if (r < 0)
        return r;
    r = vf_pq_open(out, src);
    vf_source_close(src);
    if (r == 0 && (d->fs.pq_max_entries || d->fs.pq_max_bytes))
        vf_pq_set_limits(*out, d->fs.pq_max_entries, d->fs.pq_max_bytes);
    return r;
}

void vf_ds_fs_local(vf_ds_fs *fs, const char *root)
{
    memset(fs, 0, sizeof *fs);
    fs->ctx = (void *)root;
    fs->read_all = local_read_all;
    fs->open_source = local_open_source;
    fs->exists = local_exists;
    fs->list_dir = local_list_dir;
    fs->thread_safe = 1;
}

/* ---- open ----------------------------------------------------------------- */

void vf_dataset_defaults(vf_dataset_settings *s)
{
    memset(s, 0, sizeof *s);
    s->check_files = VF_CHECK_FILES_AUTO;
    s->check_data_files = 0;
    s->check_videos = 1;
    s->meta_cache = 1;
}

void vf_dataset_meta_cache_stats(const vf_dataset *d, vf_meta_cache_stats *out)
{
    *out = d->meta_cache;
}

static int cmp_size_by_episode(const void *a, const void *b, void *ctx)
{
    const vf_dataset *d = ctx;
    size_t pa = *(const size_t *)a, pb = *(const size_t *)b;
    int64_t x = d->episodes[pa].pub.episode_index, y = d->episodes[pb].pub.episode_index;
    if (x != y)
        return (x > y) - (x < y);
    return (pa > pb) - (pa < pb);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Position of an episode_index among all episodes: a direct hit when row
 * i is episode i (the normal case), else a linear search. */
static long find_all(const vf_dataset *d, int64_t episode_index)
{
    if (episode_index >= 0 && (uint64_t)episode_index < d->num_all_episodes &&
        d->episodes[episode_index].pub.episode_index == episode_index)
        return (long)episode_index;
    for (size_t i = 0; i < d->num_all_episodes; i++)
        if (d->episodes[i].pub.episode_index == episode_index)
            return (long)i;
    return -1;
}

static int build_selection(vf_dataset *d, const vf_dataset_settings *s)
{
    if (!s->episodes) {
        d->num_selected = d->num_all_episodes;
        d->selected = vf_ds_alloc(d, d->num_selected, sizeof *d->selected);
        if (!d->selected)
            return VF_ENOMEM;
        for (size_t i = 0; i < d->num_selected; i++)
            d->selected[i] = i;
        /* Keep ascending episode_index order even if the metadata is not
         * (a problem reported by validation); duplicates stay in
         * metadata order. */
        int sorted = 1;
        for (size_t i = 1; i < d->num_selected && sorted; i++)
            sorted = d->episodes[i - 1].pub.episode_index < d->episodes[i].pub.episode_index;
        if (!sorted)
            qsort_r(d->selected, d->num_selected, sizeof *d->selected, cmp_size_by_episode, d);
        return 0;
    }
    int64_t *want = vf_malloc_array(s->num_episodes ? s->num_episodes : 1, sizeof *want);
    if (!want)
        return VF_ENOMEM;
    memcpy(want, s->episodes, s->num_episodes * sizeof *want);
    qsort(want, s->num_episodes, sizeof *want, cmp_i64);
    int r = 0;
    for (size_t i = 1; i < s->num_episodes; i++)
        if (want[i] == want[i - 1]) {
            r = vf_error(VF_EINVAL, "%s: episode %lld is selected twice", d->root, (long long)want[i]);
            break;
        }
    d->selected = vf_ds_alloc(d, s->num_episodes, sizeof *d->selected);
    if (!d->selected && r == 0)
        r = VF_ENOMEM;
    for (size_t i = 0; i < s->num_episodes && r == 0; i++) {
        long pos = find_all(d, want[i]);
        if (pos < 0) {
            r = vf_error(VF_ENOENT, "%s: episode %lld is not in the dataset (%zu episodes, indices %lld..%lld)",
                         d->root, (long long)want[i], d->num_all_episodes,
                         d->num_all_episodes ? (long long)d->episodes[0].pub.episode_index : 0LL,
                         d->num_all_episodes ? (long long)d->episodes[d->num_all_episodes - 1].pub.episode_index
                                             : -1LL);
            break;
        }
        d->selected[i] = (size_t)pos;
    }
    free(want);
    if (r == 0)
        d->num_selected = s->num_episodes;
    return r;
}

static int cmp_file(const void *a, const void *b)
{
    const vf_ds_file *x = a, *y = b;
    if (x->chunk_index != y->chunk_index)
        return x->chunk_index < y->chunk_index ? -1 : 1;
    return (x->file_index > y->file_index) - (x->file_index < y->file_index);
}

/* Index of (chunk, file) in a sorted, unique list; -1 if absent. */
static long find_file(const vf_ds_file *files, size_t n, int64_t chunk, int64_t file)
{
    size_t lo = 0, hi = n;
    vf_ds_file key = {.chunk_index = chunk, .file_index = file};
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_file(&files[mid], &key);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

typedef struct file_key {
    int64_t chunk_index, file_index;
} file_key;

static int cmp_file_key(const void *a, const void *b)
{
    const file_key *x = a, *y = b;
    if (x->chunk_index != y->chunk_index)
        return x->chunk_index < y->chunk_index ? -1 : 1;
    return (x->file_index > y->file_index) - (x->file_index < y->file_index);
}

/* find_file() that first tries the id found last (consecutive episodes
 * mostly share a file, so this skips the search at 1M episodes). */
static long find_file_near(const vf_ds_file *files, size_t n, int64_t chunk, int64_t file, long *last)
{
    if (*last >= 0 && (size_t)*last < n && files[*last].chunk_index == chunk && files[*last].file_index == file)
        return *last;
    long id = find_file(files, n, chunk, file);
    *last = id;
    return id;
}

/* The file lists of the selected episodes: one "slot" per list, the data
 * files (camera -1) and each camera's MP4s. All slots are built in the same
 * few passes over the episodes (at 1M episodes the model is ~250 MB, and a
 * pass per slot and step was a fifth of a loader's open). */
typedef struct files_slot {
    int camera;     /* -1: data files */
    file_key *keys; /* distinct (chunk, file) pairs, then sorted */
    size_t n, cap;
    int sorted;
    vf_ds_file *files;
    long last;      /* find_file_near's memo */
} files_slot;

static inline file_key slot_key(const vf_ds_episode *e, int camera)
{
    return camera < 0 ? (file_key){e->data_chunk, e->data_file}
                      : (file_key){e->video[camera].chunk_index, e->video[camera].file_index};
}

/* Sorts and uniques a slot's keys and makes its file list with formatted
 * paths. */
static int make_file_list(vf_dataset *d, files_slot *sl)
{
    int camera = sl->camera;
    file_key *tmp = sl->keys;
    size_t n = sl->n;
    if (!sl->sorted) {
        qsort(tmp, n, sizeof *tmp, cmp_file_key);
        size_t u = 0;
        for (size_t i = 0; i < n; i++)
            if (u == 0 || cmp_file_key(&tmp[u - 1], &tmp[i]) != 0)
                tmp[u++] = tmp[i];
        n = sl->n = u;
    }
    vf_ds_file *files = sl->files = vf_ds_alloc(d, n, sizeof *files);
    int r = files ? 0 : VF_ENOMEM;
    for (size_t i = 0; i < n && r == 0; i++) {
        files[i].chunk_index = tmp[i].chunk_index;
        files[i].file_index = tmp[i].file_index;
        files[i].exists = -1;
        /* v2.x stores (episode_chunk, episode_index) as (chunk, file),
         * so both spellings of the placeholders resolve the same way. */
        vf_ds_template_vars vars = {
            .chunk_index = files[i].chunk_index,
            .file_index = files[i].file_index,
            .episode_chunk = files[i].chunk_index,
            .episode_index = files[i].file_index,
            .video_key = camera >= 0 ? d->cameras[camera].pub.key : NULL,
        };
        char *rel;
        r = vf_ds_format_template(camera < 0 ? d->data_path : d->video_path, &vars, &rel);
        if (r < 0) {
            r = vf_error_context(r, "%s/meta/info.json: %s", d->root, camera < 0 ? "data_path" : "video_path");
            break;
        }
        files[i].rel = vf_ds_strdup(d, rel);
        free(rel);
        files[i].path = files[i].rel ? vf_ds_abs(d, files[i].rel) : NULL;
        if (!files[i].rel || !files[i].path)
            r = VF_ENOMEM;
    }
    return r;
}

/* Collects the distinct (chunk, file) pairs of the selected episodes into
 * sorted lists with formatted paths (d->data_files, each camera's files),
 * and links every selected episode to its files and back. */
static int build_files(vf_dataset *d)
{
    size_t ns = 1 + d->num_cameras;
    files_slot *sl = vf_calloc(ns, sizeof *sl);
    if (!sl)
        return VF_ENOMEM;
    int r = 0;
    for (size_t k = 0; k < ns; k++) {
        sl[k].camera = (int)k - 1;
        sl[k].sorted = 1;
        sl[k].last = -1;
    }
    /* Distinct keys in selection order; usually already ascending (files
     * fill up in episode order), then no sort is needed. */
    for (size_t i = 0; i < d->num_selected && r == 0; i++) {
        const vf_ds_episode *e = &d->episodes[d->selected[i]];
        for (size_t k = 0; k < ns; k++) {
            files_slot *s = &sl[k];
            file_key key = slot_key(e, s->camera);
            int c = s->n ? cmp_file_key(&s->keys[s->n - 1], &key) : -1;
            if (c == 0)
                continue;
            if (c > 0)
                s->sorted = 0;
            if (s->n == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 1024;
                file_key *grown = vf_realloc(s->keys, cap * sizeof *grown);
                if (!grown) {
                    r = VF_ENOMEM;
                    break;
                }
                s->keys = grown;
                s->cap = cap;
            }
            s->keys[s->n++] = key;
        }
    }
    for (size_t k = 0; k < ns && r == 0; k++)
        r = make_file_list(d, &sl[k]);
    /* Each selected episode's file ids, and the files' episode counts. */
    for (size_t i = 0; i < d->num_selected && r == 0; i++) {
        vf_ds_episode *e = &d->episodes[d->selected[i]];
        for (size_t k = 0; k < ns; k++) {
            files_slot *s = &sl[k];
            file_key key = slot_key(e, s->camera);
            long id = find_file_near(s->files, s->n, key.chunk_index, key.file_index, &s->last);
            if (s->camera < 0)
                e->data_file_id = (int)id;
            else
                e->video[s->camera].file = (int)id;
            s->files[id].num_episodes++;
        }
    }
    /* Each file's selected episodes (positions, ascending). */
    for (size_t k = 0; k < ns && r == 0; k++)
        for (size_t i = 0; i < sl[k].n && r == 0; i++) {
            vf_ds_file *f = &sl[k].files[i];
            if (!(f->episodes = vf_ds_alloc(d, f->num_episodes, sizeof *f->episodes)))
                r = VF_ENOMEM;
            f->num_episodes = 0;
        }
    for (size_t i = 0; i < d->num_selected && r == 0; i++) {
        const vf_ds_episode *e = &d->episodes[d->selected[i]];
        for (size_t k = 0; k < ns; k++) {
            vf_ds_file *f = &sl[k].files[sl[k].camera < 0 ? e->data_file_id : e->video[sl[k].camera].file];
            f->episodes[f->num_episodes++] = i;
        }
    }
    /* Data files: rows the file must hold = lengths of ALL its episodes. */
    long last = -1;
    for (size_t i = 0; i < d->num_all_episodes && r == 0; i++) {
        const vf_ds_episode *e = &d->episodes[i];
        long id = find_file_near(sl[0].files, sl[0].n, e->data_chunk, e->data_file, &last);
        if (id >= 0 && e->pub.length > 0 && sl[0].files[id].expected_rows <= INT64_MAX - e->pub.length)
            sl[0].files[id].expected_rows += e->pub.length;
    }
    if (r == 0) {
        d->data_files = sl[0].files;
        d->num_data_files = sl[0].n;
        for (size_t c = 0; c < d->num_cameras; c++) {
            d->cameras[c].files = sl[c + 1].files;
            d->cameras[c].pub.num_files = d->cameras[c].num_files = sl[c + 1].n;
        }
    }
    for (size_t k = 0; k < ns; k++)
        free(sl[k].keys);
    free(sl);
    return r;
}

/* Orders episode positions by (data chunk, data file, from_index). */
static int cmp_by_data_file(const void *a, const void *b, void *ctx)
{
    const vf_dataset *d = ctx;
    const vf_ds_episode *x = &d->episodes[*(const size_t *)a], *y = &d->episodes[*(const size_t *)b];
    if (x->data_chunk != y->data_chunk)
        return x->data_chunk < y->data_chunk ? -1 : 1;
    if (x->data_file != y->data_file)
        return x->data_file < y->data_file ? -1 : 1;
    return (x->pub.from_index > y->pub.from_index) - (x->pub.from_index < y->pub.from_index);
}

/* row_offset = from_index - min from_index of the episodes sharing the
 * data file, over ALL episodes (a subset must not shift the rows). */
static int compute_row_offsets(vf_dataset *d)
{
    size_t n = d->num_all_episodes;
    if (n == 0)
        return 0;
    size_t *order = vf_malloc_array(n, sizeof *order);
    if (!order)
        return VF_ENOMEM;
    int sorted = 1;
    for (size_t i = 0; i < n; i++) {
        order[i] = i;
        if (i && sorted && cmp_by_data_file(&order[i - 1], &order[i], d) > 0)
            sorted = 0;
    }
    if (!sorted)
        qsort_r(order, n, sizeof *order, cmp_by_data_file, d);
    size_t start = 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n) {
            const vf_ds_episode *a = &d->episodes[order[start]], *b = &d->episodes[order[i]];
            if (a->data_chunk == b->data_chunk && a->data_file == b->data_file)
                continue;
        }
        int64_t base = d->episodes[order[start]].pub.from_index;
        for (size_t k = start; k < i; k++)
            d->episodes[order[k]].row_offset = d->episodes[order[k]].pub.from_index - base;
        start = i;
    }
    free(order);
    return 0;
}

/* FNV-1a over the identity of the dataset. */
static void fp_bytes(uint64_t *h, const void *data, size_t n)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        *h ^= p[i];
        *h *= 1099511628211ULL;
    }
}
static void fp_i64(uint64_t *h, int64_t v) { fp_bytes(h, &v, sizeof v); }
static void fp_str(uint64_t *h, const char *s) { fp_bytes(h, s ? s : "", (s ? strlen(s) : 0) + 1); }

static uint64_t compute_fingerprint(const vf_dataset *d)
{
    uint64_t h = 1469598103934665603ULL;
    fp_str(&h, d->version);
    fp_bytes(&h, &d->fps, sizeof d->fps);
    for (size_t i = 0; i < d->num_features; i++) {
        fp_str(&h, d->features[i].name);
        fp_str(&h, d->features[i].dtype);
        for (int k = 0; k < d->features[i].ndim; k++)
            fp_i64(&h, d->features[i].shape[k]);
    }
    for (size_t i = 0; i < d->num_all_episodes; i++) {
        const vf_ds_episode *e = &d->episodes[i];
        fp_i64(&h, e->pub.episode_index);
        fp_i64(&h, e->pub.length);
        fp_i64(&h, e->pub.from_index);
        fp_i64(&h, e->data_chunk);
        fp_i64(&h, e->data_file);
        for (size_t c = 0; c < d->num_cameras; c++) {
            fp_i64(&h, e->video[c].chunk_index);
            fp_i64(&h, e->video[c].file_index);
            fp_bytes(&h, &e->video[c].from_timestamp, sizeof(double));
        }
    }
    for (size_t i = 0; i < d->num_tasks; i++)
        fp_str(&h, d->tasks[i]);
    return h;
}

int vf_ds_open_fs(vf_dataset **out, const char *root, const vf_ds_fs *fs, const vf_dataset_settings *settings)
{
    *out = NULL;
    vf_dataset_settings defaults;
    if (!settings) {
        vf_dataset_defaults(&defaults);
        settings = &defaults;
    }
    int r = 0;
    if (!root || !*root)
        r = vf_error(VF_EINVAL, "dataset root is empty");
    else if (settings->num_episodes && !settings->episodes)
        r = vf_error(VF_EINVAL, "settings.num_episodes is %zu but settings.episodes is NULL", settings->num_episodes);
    else if ((unsigned)settings->video_mismatch > VF_VIDEO_MISMATCH_TIMESTAMP)
        r = vf_error(VF_EINVAL, "settings.video_mismatch is %d (VF_VIDEO_MISMATCH_DEFAULT, _REFUSE or _TIMESTAMP)",
                     (int)settings->video_mismatch);
    vf_dataset *d = r == 0 ? vf_calloc(1, sizeof *d) : NULL;
    if (r == 0 && !d)
        r = VF_ENOMEM;
    if (r < 0) {
        if (fs->destroy) /* the fs is ours from here on */
            fs->destroy(fs->ctx);
        return r;
    }
    pthread_mutex_init(&d->fingerprint_lock, NULL);
    d->video_mismatch = vf_video_mismatch_resolve(settings->video_mismatch);
    d->fs = *fs;
    d->local_fs = fs->open_source == local_open_source;
    d->meta_cache.enabled = settings->meta_cache != 0;
    d->root = vf_ds_strdup(d, root);
    if (!d->root) {
        vf_dataset_close(d);
        return VF_ENOMEM;
    }

    uint8_t *text = NULL;
    size_t len = 0;
    r = d->fs.read_all(d->fs.ctx, "meta/info.json", &text, &len);
    if (r == VF_ENOENT)
        r = vf_error(VF_ENOENT, "%s: not a LeRobot dataset: meta/info.json not found", root);
    if (r == 0) {
        r = vf_ds_load_info(d, (const char *)text, len);
        free(text);
    }
    if (r == 0 && d->major != 3)
        d->meta_cache.enabled = 0; /* only v3.0's Parquet episodes files are cached */
    if (r == 0)
        r = d->major == 3 ? vf_ds_load_v3(d) : vf_ds_load_v2(d);
    if (r == 0)
        r = compute_row_offsets(d);
    if (r == 0)
        r = build_selection(d, settings);
    if (r == 0)
        r = build_files(d);
    /* File checks: deferred to first use above VF_LAZY_FILE_CHECKS files. */
    vf_dataset_settings checks = *settings;
    if (r == 0) {
        size_t nfiles = d->num_data_files;
        for (size_t c = 0; c < d->num_cameras; c++)
            nfiles += d->cameras[c].num_files;
        if (checks.check_files == VF_CHECK_FILES_AUTO && nfiles > VF_LAZY_FILE_CHECKS) {
            checks.check_files = 0;
            checks.check_data_files = 0;
            d->file_checks = VF_FILES_DEFERRED;
        } else {
            d->file_checks = checks.check_files ? VF_FILES_CHECKED : VF_FILES_NOT_CHECKED;
        }
        if (!checks.check_files)
            checks.check_data_files = 0; /* no per-file access at all */
        r = vf_ds_validate(d, &checks);
    }
    if (r < 0) {
        vf_dataset_close(d);
        return r;
    }
    *out = d;
    return 0;
}

/* ---- subsets --------------------------------------------------------------- */

/* The set of src positions a subset keeps: a bitmap over src (calloc'd, so
 * only the pages of kept positions are touched) and the list of them. */
typedef struct kept_set {
    uint8_t *bit;
    size_t *pos;
    size_t n, cap;
} kept_set;

static int keep_pos(kept_set *k, size_t p)
{
    if (k->bit[p])
        return 0;
    if (vf_grow_array(&k->pos, k->n, &k->cap, 64, sizeof *k->pos) < 0)
        return VF_ENOMEM;
    k->bit[p] = 1;
    k->pos[k->n++] = p;
    return 0;
}

/* Keeps every position of src->episodes stored in file (chunk, file) of
 * slot camera (-1: data files): through src's per-file episode lists when
 * src selects every episode it holds, else by a scan (src is then itself a
 * subset, as small as its closure). */
static int keep_file_episodes(const vf_dataset *src, int camera, int64_t chunk, int64_t file, kept_set *k)
{
    int r = 0;
    if (src->num_selected == src->num_all_episodes) {
        const vf_ds_file *files = camera < 0 ? src->data_files : src->cameras[camera].files;
        size_t n = camera < 0 ? src->num_data_files : src->cameras[camera].num_files;
        long id = find_file(files, n, chunk, file);
        if (id >= 0) {
            for (size_t j = 0; j < files[id].num_episodes && r == 0; j++)
                r = keep_pos(k, src->selected[files[id].episodes[j]]);
            return r;
        }
    }
    for (size_t i = 0; i < src->num_all_episodes && r == 0; i++) {
        file_key key = slot_key(&src->episodes[i], camera);
        if (key.chunk_index == chunk && key.file_index == file)
            r = keep_pos(k, i);
    }
    return r;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int vf_dataset_subset(const vf_dataset *src, const int64_t *episodes, size_t num_episodes, vf_dataset **out)
{
    if (out)
        *out = NULL;
    if (!src || !out || (num_episodes && !episodes))
        return vf_error(VF_EINVAL, "vf_dataset_subset: src, out and the episodes are required");
    size_t n_all = src->num_all_episodes;
    int64_t *want = vf_malloc_array(num_episodes ? num_episodes : 1, sizeof *want);
    size_t *pos = vf_malloc_array(num_episodes ? num_episodes : 1, sizeof *pos);
    kept_set k = {.bit = vf_calloc(n_all ? n_all : 1, 1)};
    int r = want && pos && k.bit ? 0 : VF_ENOMEM;
    if (r == 0) {
        memcpy(want, episodes, num_episodes * sizeof *want);
        qsort(want, num_episodes, sizeof *want, cmp_i64); /* the selection's order, as vf_dataset_open's */
    }
    for (size_t i = 0; i < num_episodes && r == 0; i++) {
        long p = find_all(src, want[i]);
        if (i && want[i] == want[i - 1])
            r = vf_error(VF_EINVAL, "%s: episode %lld is selected twice", src->root, (long long)want[i]);
        else if (p < 0)
            r = vf_error(VF_ENOENT, "%s: episode %lld is not in the dataset (%zu episodes)", src->root,
                         (long long)want[i], n_all);
        else
            pos[i] = (size_t)p;
    }
    /* The closure: every episode sharing a data or video file with a wanted one. */
    for (size_t i = 0; i < num_episodes && r == 0; i++) {
        const vf_ds_episode *e = &src->episodes[pos[i]];
        for (int c = -1; c < (int)src->num_cameras && r == 0; c++) {
            file_key key = slot_key(e, c);
            r = keep_file_episodes(src, c, key.chunk_index, key.file_index, &k);
        }
        if (r == 0)
            r = keep_pos(&k, pos[i]); /* held by the closure already; the selection below looks it up */
    }
    vf_dataset *d = r == 0 ? vf_calloc(1, sizeof *d) : NULL;
    if (r == 0 && !d)
        r = VF_ENOMEM;
    free(k.bit);
    if (r < 0) {
        free(want);
        free(pos);
        free(k.pos);
        return r;
    }
    /* In src's order, which keeps row_offset (computed over all of src's
     * episodes) and each file's episode order valid. */
    qsort(k.pos, k.n, sizeof *k.pos, cmp_size);
    pthread_mutex_init(&d->fingerprint_lock, NULL);
    /* Borrowed from src (its arena and fs; no destroy hook here). */
    d->root = src->root;
    d->fs = src->fs;
    d->fs.destroy = NULL;
    d->local_fs = src->local_fs;
    d->version = src->version;
    d->major = src->major;
    d->minor = src->minor;
    d->robot_type = src->robot_type;
    d->fps = src->fps;
    d->total_episodes = src->total_episodes;
    d->total_frames = src->total_frames;
    d->total_tasks = src->total_tasks;
    d->chunks_size = src->chunks_size;
    d->data_path = src->data_path;
    d->video_path = src->video_path;
    d->features = src->features;
    d->num_features = src->num_features;
    d->meta_files = src->meta_files;
    d->num_meta_files = src->num_meta_files;
    d->tasks = src->tasks;
    d->num_tasks = src->num_tasks;
    d->stats = src->stats;
    d->num_stats = src->num_stats;
    d->file_checks = src->file_checks == VF_FILES_NOT_CHECKED ? VF_FILES_NOT_CHECKED : VF_FILES_DEFERRED;
    d->video_mismatch = src->video_mismatch;
    /* Own: the cameras (their file lists are per selection), the episodes, the selection. */
    d->num_cameras = src->num_cameras;
    if (d->num_cameras && !(d->cameras = vf_ds_alloc(d, d->num_cameras, sizeof *d->cameras)))
        r = VF_ENOMEM;
    for (size_t c = 0; c < d->num_cameras && r == 0; c++) {
        d->cameras[c].pub = src->cameras[c].pub;
        d->cameras[c].pub.num_files = 0;
    }
    if (r == 0 && !(d->episodes = vf_malloc_array(k.n ? k.n : 1, sizeof *d->episodes)))
        r = VF_ENOMEM;
    vf_ds_video_loc *locs = NULL;
    if (r == 0 && d->num_cameras && k.n && !(locs = vf_ds_alloc(d, k.n * d->num_cameras, sizeof *locs)))
        r = VF_ENOMEM;
    for (size_t i = 0; i < k.n && r == 0; i++) {
        const vf_ds_episode *from = &src->episodes[k.pos[i]];
        vf_ds_episode *e = &d->episodes[i];
        *e = *from;
        e->data_file_id = -1;
        e->video = d->num_cameras ? locs + i * d->num_cameras : NULL;
        for (size_t c = 0; c < d->num_cameras; c++) {
            e->video[c] = from->video[c];
            e->video[c].file = -1;
        }
    }
    if (r == 0) {
        d->num_all_episodes = d->cap_episodes = k.n;
        d->num_selected = num_episodes;
        if (!(d->selected = vf_ds_alloc(d, num_episodes ? num_episodes : 1, sizeof *d->selected)))
            r = VF_ENOMEM;
    }
    for (size_t i = 0; i < num_episodes && r == 0; i++) {
        size_t *hit = bsearch(&pos[i], k.pos, k.n, sizeof *k.pos, cmp_size);
        d->selected[i] = (size_t)(hit - k.pos); /* kept above */
    }
    if (r == 0)
        r = build_files(d);
    /* A data file's expected rows count every episode stored in it: the
     * closure holds them all, so the sums equal src's. */
    free(want);
    free(pos);
    free(k.pos);
    if (r < 0) {
        vf_dataset_close(d);
        return r;
    }
    *out = d;
    return 0;
}

int vf_dataset_open(vf_dataset **out, const char *root, const vf_dataset_settings *settings)
{
    if (out)
        *out = NULL;
    if (!out || !root)
        return vf_error(VF_EINVAL, "vf_dataset_open: out and root are required");
    if (vf_is_url(root)) {
        vf_ds_fs remote;
        int r = vf_ds_fs_remote(&remote, root, NULL);
        return r < 0 ? r : vf_ds_open_fs(out, root, &remote, settings);
    }
    if (!vf_dir_exists(root))
        return vf_error(VF_ENOENT, "%s: no such directory", root);
    vf_ds_fs fs;
    vf_ds_fs_local(&fs, root);
    int r = vf_ds_open_fs(out, root, &fs, settings);
    if (r == 0) {
        /* The hooks must not borrow the caller's string past open. */
        (*out)->fs.ctx = (void *)(*out)->root;
        (*out)->local_fs = 1;
    }
    return r;
}

void vf_dataset_close(vf_dataset *d)
{
    if (!d)
        return;
    if (d->fs.destroy)
        d->fs.destroy(d->fs.ctx);
    pthread_mutex_destroy(&d->fingerprint_lock);
    vf_ds_arena_block *b = d->arena;
    while (b) {
        vf_ds_arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(d->problems);
    free(d->missing);
    free(d->episodes);
    free(d);
}

/* ---- accessors ------------------------------------------------------------ */

const char *vf_dataset_root(const vf_dataset *d) { return d->root; }
const char *vf_dataset_format_version(const vf_dataset *d) { return d->version; }
const char *vf_dataset_robot_type(const vf_dataset *d) { return d->robot_type; }
double vf_dataset_fps(const vf_dataset *d) { return d->fps; }
int64_t vf_dataset_total_episodes(const vf_dataset *d) { return d->total_episodes; }
int64_t vf_dataset_total_frames(const vf_dataset *d) { return d->total_frames; }
int64_t vf_dataset_total_tasks(const vf_dataset *d) { return d->total_tasks; }
uint64_t vf_dataset_fingerprint(const vf_dataset *d)
{
    vf_dataset *m = (vf_dataset *)d; /* the fingerprint is a cache; the model stays as opened */
    pthread_mutex_lock(&m->fingerprint_lock);
    if (!m->fingerprint_ready) {
        m->fingerprint = compute_fingerprint(d);
        m->fingerprint_ready = 1;
    }
    uint64_t h = m->fingerprint;
    pthread_mutex_unlock(&m->fingerprint_lock);
    return h;
}
vf_file_checks vf_dataset_file_checks(const vf_dataset *d) { return d->file_checks; }
vf_video_mismatch vf_dataset_video_mismatch(const vf_dataset *d) { return d->video_mismatch; }

size_t vf_dataset_num_features(const vf_dataset *d) { return d->num_features; }
const vf_feature *vf_dataset_feature(const vf_dataset *d, size_t i)
{
    return i < d->num_features ? &d->features[i] : NULL;
}
const vf_feature *vf_dataset_find_feature(const vf_dataset *d, const char *name)
{
    for (size_t i = 0; i < d->num_features; i++)
        if (!strcmp(d->features[i].name, name))
            return &d->features[i];
    return NULL;
}

size_t vf_dataset_num_cameras(const vf_dataset *d) { return d->num_cameras; }
const vf_camera *vf_dataset_camera(const vf_dataset *d, size_t i)
{
    return i < d->num_cameras ? &d->cameras[i].pub : NULL;
}

size_t vf_dataset_num_tasks(const vf_dataset *d) { return d->num_tasks; }
const char *vf_dataset_task(const vf_dataset *d, size_t task_index)
{
    return task_index < d->num_tasks ? d->tasks[task_index] : NULL;
}

size_t vf_dataset_num_stats(const vf_dataset *d) { return d->num_stats; }
const vf_stat *vf_dataset_stat(const vf_dataset *d, size_t i) { return i < d->num_stats ? &d->stats[i] : NULL; }
const vf_stat *vf_dataset_find_stat(const vf_dataset *d, const char *feature, const char *name)
{
    for (size_t i = 0; i < d->num_stats; i++)
        if (!strcmp(d->stats[i].feature, feature) && !strcmp(d->stats[i].name, name))
            return &d->stats[i];
    return NULL;
}

size_t vf_dataset_num_episodes(const vf_dataset *d) { return d->num_selected; }
const vf_episode *vf_dataset_episode(const vf_dataset *d, size_t pos)
{
    return pos < d->num_selected ? &d->episodes[d->selected[pos]].pub : NULL;
}

int vf_dataset_find_episode(const vf_dataset *d, int64_t episode_index, size_t *pos)
{
    size_t lo = 0, hi = d->num_selected;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int64_t e = d->episodes[d->selected[mid]].pub.episode_index;
        if (e == episode_index) {
            /* Duplicated indices (a reported problem): the first one. */
            while (mid > 0 && d->episodes[d->selected[mid - 1]].pub.episode_index == episode_index)
                mid--;
            *pos = mid;
            return 0;
        }
        if (e < episode_index)
            lo = mid + 1;
        else
            hi = mid;
    }
    return vf_error(VF_ENOENT, "%s: episode %lld is not among the %zu selected episodes", d->root,
                    (long long)episode_index, d->num_selected);
}

int vf_dataset_episode_data(const vf_dataset *d, size_t pos, vf_data_span *out)
{
    if (pos >= d->num_selected)
        return vf_error(VF_ERANGE, "%s: episode position %zu out of range (%zu selected)", d->root, pos,
                        d->num_selected);
    const vf_ds_episode *e = &d->episodes[d->selected[pos]];
    out->file = (size_t)e->data_file_id;
    out->path = d->data_files[e->data_file_id].path;
    out->row_offset = e->row_offset;
    out->length = e->pub.length;
    return 0;
}

int vf_dataset_episode_video(const vf_dataset *d, size_t pos, size_t camera, vf_video_span *out)
{
    if (pos >= d->num_selected)
        return vf_error(VF_ERANGE, "%s: episode position %zu out of range (%zu selected)", d->root, pos,
                        d->num_selected);
    if (camera >= d->num_cameras)
        return vf_error(VF_ERANGE, "%s: camera %zu out of range (%zu cameras)", d->root, camera, d->num_cameras);
    const vf_ds_episode *e = &d->episodes[d->selected[pos]];
    const vf_ds_video_loc *v = &e->video[camera];
    out->file = (size_t)v->file;
    out->path = d->cameras[camera].files[v->file].path;
    out->from_timestamp = v->from_timestamp;
    out->to_timestamp = v->to_timestamp;
    out->length = e->pub.length;
    double fps = d->cameras[camera].pub.fps > 0 ? d->cameras[camera].pub.fps : d->fps;
    double guess = v->from_timestamp * fps + 0.5;
    out->first_frame_guess = guess > 0 && guess < 9e18 ? (int64_t)guess : 0;
    return 0;
}

size_t vf_dataset_num_data_files(const vf_dataset *d) { return d->num_data_files; }
const char *vf_dataset_data_file(const vf_dataset *d, size_t i)
{
    return i < d->num_data_files ? d->data_files[i].path : NULL;
}
size_t vf_dataset_num_video_files(const vf_dataset *d, size_t camera)
{
    return camera < d->num_cameras ? d->cameras[camera].num_files : 0;
}
const char *vf_dataset_video_file(const vf_dataset *d, size_t camera, size_t i)
{
    if (camera >= d->num_cameras || i >= d->cameras[camera].num_files)
        return NULL;
    return d->cameras[camera].files[i].path;
}

size_t vf_dataset_num_problems(const vf_dataset *d) { return d->num_problems; }
const vf_problem *vf_dataset_problem(const vf_dataset *d, size_t i)
{
    return i < d->num_problems ? &d->problems[i] : NULL;
}
size_t vf_dataset_num_errors(const vf_dataset *d) { return d->num_errors; }
size_t vf_dataset_num_missing_files(const vf_dataset *d) { return d->num_missing; }
const char *vf_dataset_missing_file(const vf_dataset *d, size_t i)
{
    return i < d->num_missing ? d->missing[i] : NULL;
}
