/*
 * loader_batch.c: the shard loader's fields and batch assembly.
 *
 * Fields: the suffixes named by the settings, or those of the first sample
 * of the first non-empty shard; each has a kind (image, npz, npy, class
 * label, raw bytes) from its extension.
 *
 * Batch assembly: take every position's sample from its consumer, parse
 * (npz inflate, .npy headers, image headers) in parallel per sample, fix
 * the batch's columns from its first good sample, check every sample
 * against them, then decode straight into the column slots in parallel
 * (images: TurboJPEG / libpng, one TurboJPEG handle per job), and compact
 * out samples that failed.
 *
 * Bad input: a sample missing a field, a member that does not decode, or a
 * shape that differs from the batch's fails the batch with a message naming
 * the shard, the member and the key (VF_WDS_RAISE), or under VF_WDS_SKIP
 * leaves the sample out of its batch and counts it.
 *
 * Budgets, each checked on what the headers declare before the memory is
 * allocated: an image's pixels (max_image_pixels) and the bytes it decodes
 * to (max_member_bytes, with the codec's scratch), a .npz's inflated
 * arrays (max_member_bytes, from its zip headers), a sample's members plus
 * what they decode to (max_sample_bytes), and the batch's columns
 * (max_batch_bytes: samples are admitted in order, and the columns are
 * allocated for the admitted ones only). A sample over one is bad input.
 */
#include <stdlib.h>
#include <string.h>

#include "wds/loader_internal.h"

/* ---- fields ---------------------------------------------------------------------- */

enum field_kind { FIELD_IMAGE, FIELD_NPZ, FIELD_NPY, FIELD_CLS, FIELD_BYTES };

static int kind_of(const char *suffix)
{
    const char *ext = strrchr(suffix, '.');
    ext = ext ? ext + 1 : suffix;
    if (!strcmp(ext, "jpg") || !strcmp(ext, "jpeg") || !strcmp(ext, "png"))
        return FIELD_IMAGE;
    if (!strcmp(ext, "npz"))
        return FIELD_NPZ;
    if (!strcmp(ext, "npy"))
        return FIELD_NPY;
    if (!strcmp(ext, "cls"))
        return FIELD_CLS;
    return FIELD_BYTES;
}

static int set_fields(vf_wds_loader *l, char **suffixes, size_t count)
{
    l->field_suffix = suffixes;
    l->num_fields = count;
    l->field_kind = vf_calloc(count ? count : 1, sizeof *l->field_kind);
    if (!l->field_kind)
        return VF_ENOMEM;
    for (size_t i = 0; i < count; i++)
        l->field_kind[i] = kind_of(suffixes[i]);
    return 0;
}

int vf_wds_fields_from_setting(vf_wds_loader *l, const char *list)
{
    char **out = NULL;
    size_t n = 0;
    const char *p = list;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len) {
            char **grown = vf_realloc(out, (n + 1) * sizeof *grown);
            if (!grown)
                goto nomem;
            out = grown;
            out[n] = vf_strndup(p, len);
            if (!out[n])
                goto nomem;
            for (char *q = out[n]; *q; q++)
                if (*q >= 'A' && *q <= 'Z')
                    *q = (char)(*q - 'A' + 'a');
            n++;
        }
        p += len + (comma ? 1 : 0);
    }
    if (n == 0) {
        free(out);
        return vf_error(VF_EINVAL, "wds loader: fields names no suffix");
    }
    return set_fields(l, out, n);
nomem:
    for (size_t i = 0; i < n; i++)
        free(out[i]);
    free(out);
    return VF_ENOMEM;
}

/* The fields of the first sample of the manifest's first non-empty shard. */
int vf_wds_fields_from_first_sample(vf_wds_loader *l)
{
    if (l->num_tasks == 0)
        return set_fields(l, NULL, 0);
    const char *url = vf_wds_manifest_shard_url(l->manifest, l->task_shard[0]);
    vf_wds_reader *r = NULL;
    int rc = vf_wds_reader_open(&r, url);
    const vf_wds_sample *smp = NULL;
    if (rc == 0)
        rc = vf_wds_reader_next(r, 0, &smp);
    if (rc == VF_EOF)
        rc = vf_error(VF_ECORRUPT, "shard %s: no samples, the manifest says %lld (fields come from its first "
                      "sample; pass fields= to name them)",
                      url, (long long)l->tasks[0].num_samples);
    char **out = NULL;
    if (rc == 0) {
        out = vf_calloc(smp->num_members ? smp->num_members : 1, sizeof *out);
        rc = out ? 0 : VF_ENOMEM;
        for (size_t i = 0; rc == 0 && i < smp->num_members; i++)
            if (!(out[i] = vf_strdup(smp->members[i].suffix)))
                rc = VF_ENOMEM;
    }
    size_t n = smp ? smp->num_members : 0;
    vf_wds_reader_close(r);
    if (rc < 0) {
        for (size_t i = 0; out && i < n; i++)
            free(out[i]);
        free(out);
        return rc;
    }
    return set_fields(l, out, n);
}

/* ---- batches ---------------------------------------------------------------------- */

typedef struct slot {
    vf_wds_stored *sample;     /* NULL: bad */
    const vf_wds_member **field_member; /* per field */
    vf_wds_npz *npz;           /* per field (FIELD_NPZ) */
    vf_wds_array *npy;         /* per field (FIELD_NPY) */
    int *npy_ok;
    int *img_w, *img_h;
    char *error;
} slot;

typedef struct assembly {
    vf_wds_loader *l;
    slot *slots;
    size_t count;
    int64_t *row_of;           /* per slot: its row in the columns, -1 when it has none */
    vf_wds_batch *batch;
    int *col_field;            /* per column: the field it comes from */
    int *col_array;            /* per column: npz array index, else -1 */
    int phase;                 /* 0 parse, 1 decode */
    int jobs;
    uint64_t images;
} assembly;

static void slot_fail(slot *sl, const char *fmt_shard, const char *member, const char *key, const char *what)
{
    if (sl->error)
        return;
    sl->error = member ? vf_asprintf("shard %s: member %s (key %s): %s", fmt_shard, member, key, what)
                       : vf_asprintf("shard %s: key %s: %s", fmt_shard, key, what);
    if (!sl->error)
        sl->error = vf_strdup("out of memory");
}

static const char *shard_url(const vf_wds_loader *l, const vf_wds_stored *st)
{
    return vf_wds_manifest_shard_url(l->manifest, st->shard);
}

/* The bytes an image decodes to at the batch's size: its slot in the column,
 * plus the codec's output when that is not the slot (another size, or the
 * float layout) and the resized copy the float layout converts from. */
static int64_t image_decoded_bytes(const vf_wds_loader *l, const vf_wds_member *m, int w, int h)
{
    int ow = l->s.resize_width ? l->s.resize_width : w, oh = l->s.resize_width ? l->s.resize_height : h;
    int dw, dh;
    vf_wds_decode_size(m->data, m->size, w, h, ow, oh, &dw, &dh);
    int64_t bytes = (int64_t)ow * oh * (l->s.image_float_chw ? 12 : 3);
    int resized = dw != ow || dh != oh;
    if (l->s.image_float_chw || resized)
        bytes += (int64_t)dw * dh * 3;
    if (l->s.image_float_chw && resized)
        bytes += (int64_t)ow * oh * 3;
    return bytes;
}

/* The budget one field of a sample breaks, as a message (newly allocated),
 * or NULL; adds what it decodes to to *sample_bytes. */
static char *field_over_budget(const vf_wds_loader *l, const slot *sl, size_t f, const vf_wds_member *m,
                               int64_t *sample_bytes)
{
    int64_t decoded = 0;
    if (l->field_kind[f] == FIELD_IMAGE && vf_wds_png_bit_depth(m->data, m->size) != 16) {
        int w = sl->img_w[f], h = sl->img_h[f];
        if ((int64_t)w * h > l->s.max_image_pixels)
            return vf_asprintf("image %dx%d is %lld pixels, above max_image_pixels %lld", w, h, (long long)w * h,
                               (long long)l->s.max_image_pixels);
        decoded = image_decoded_bytes(l, m, w, h);
        if (decoded > l->s.max_member_bytes)
            return vf_asprintf("image %dx%d decodes to %lld bytes, above max_member_bytes %lld", w, h,
                               (long long)decoded, (long long)l->s.max_member_bytes);
    } else if (l->field_kind[f] == FIELD_NPZ) {
        for (size_t k = 0; k < sl->npz[f].count; k++)
            decoded += (int64_t)sl->npz[f].sizes[k];
    }
    *sample_bytes += decoded;
    if (*sample_bytes > l->s.max_sample_bytes)
        return vf_asprintf("the sample reaches %lld bytes (its members as read and what they decode to), above "
                           "max_sample_bytes %lld",
                           (long long)*sample_bytes, (long long)l->s.max_sample_bytes);
    return NULL;
}

static void parse_slot(assembly *a, slot *sl)
{
    vf_wds_loader *l = a->l;
    vf_wds_stored *st = sl->sample;
    int64_t sample_bytes = 0;
    for (size_t i = 0; i < st->num_members; i++)
        sample_bytes += (int64_t)st->members[i].size;
    for (size_t f = 0; f < l->num_fields && !sl->error; f++) {
        const vf_wds_member *m = NULL;
        for (size_t i = 0; i < st->num_members; i++)
            if (!strcmp(st->members[i].suffix, l->field_suffix[f]))
                m = &st->members[i];
        if (!m) {
            char *what = vf_asprintf("missing field %s", l->field_suffix[f]);
            slot_fail(sl, shard_url(l, st), NULL, st->key, what ? what : "missing field");
            free(what);
            return;
        }
        sl->field_member[f] = m;
        int rc = 0;
        switch (l->field_kind[f]) {
        case FIELD_NPZ:
            rc = vf_wds_read_npz_limited(m->data, m->size, l->s.max_member_bytes, &sl->npz[f]);
            break;
        case FIELD_NPY:
            rc = vf_wds_parse_npy(m->data, m->size, &sl->npy[f]);
            if (rc == VF_EUNSUPPORTED)
                rc = 0;
            else if (rc == 0)
                sl->npy_ok[f] = 1;
            break;
        case FIELD_IMAGE:
            rc = vf_wds_image_size(m->data, m->size, &sl->img_w[f], &sl->img_h[f]);
            break;
        case FIELD_CLS: {
            char buf[32];
            size_t n = m->size < sizeof buf - 1 ? m->size : sizeof buf - 1;
            memcpy(buf, m->data, n);
            buf[n] = 0;
            char *end = NULL;
            (void)strtoll(buf, &end, 10);
            while (end && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t'))
                end++;
            if (m->size == 0 || m->size >= sizeof buf - 1 || !end || end == buf || *end)
                rc = vf_error(VF_ECORRUPT, "not an integer class label");
            break;
        }
        default:
            break;
        }
        if (rc < 0) {
            slot_fail(sl, shard_url(l, st), m->name, st->key, vf_last_error());
            return;
        }
        char *over = field_over_budget(l, sl, f, m, &sample_bytes);
        if (over) {
            slot_fail(sl, shard_url(l, st), m->name, st->key, over);
            free(over);
        }
    }
}

static const char *array_descr_type(const char *descr, int *type)
{
    static const struct {
        const char *d;
        int t;
    } map[] = {{"<f4", VF_COL_FLOAT32}, {"<f8", VF_COL_FLOAT64}, {"<i8", VF_COL_INT64}, {"<i4", VF_COL_INT32},
               {"|u1", VF_COL_UINT8},   {"|b1", VF_COL_BOOL}};
    *type = -1;
    for (size_t i = 0; i < VF_ARRAY_LEN(map); i++)
        if (!strcmp(descr, map[i].d))
            *type = map[i].t;
    return descr;
}

static size_t column_row_bytes(const vf_wds_column *c, int itemsize)
{
    size_t n = (size_t)itemsize;
    for (int d = 1; d < c->ndim; d++)
        n *= (size_t)c->shape[d];
    return n;
}

static int descr_itemsize(const char *descr)
{
    return descr[2] - '0';
}

static void decode_slot(assembly *a, size_t index, void **tj)
{
    vf_wds_loader *l = a->l;
    slot *sl = &a->slots[index];
    vf_wds_batch *b = a->batch;
    if (a->row_of[index] < 0)
        return;
    size_t row = (size_t)a->row_of[index];
    for (size_t ci = 0; ci < b->num_columns && !sl->error; ci++) {
        vf_wds_column *col = &b->columns[ci];
        int f = a->col_field[ci];
        const vf_wds_member *m = sl->field_member[f];
        if (col->type == VF_WDS_BYTES) {
            const uint8_t *src = m->data;
            size_t size = m->size;
            if (l->field_kind[f] == FIELD_NPZ) {
                src = sl->npz[f].storage[a->col_array[ci]];
                size = sl->npz[f].sizes[a->col_array[ci]];
            }
            col->items[row] = vf_malloc(size ? size : 1);
            if (!col->items[row]) {
                slot_fail(sl, shard_url(l, sl->sample), m->name, sl->sample->key, "out of memory");
                return;
            }
            memcpy(col->items[row], src, size);
            col->item_sizes[row] = size;
            continue;
        }
        size_t row_bytes = column_row_bytes(col, descr_itemsize(col->descr));
        uint8_t *dst = col->data + row * row_bytes;
        switch (l->field_kind[f]) {
        case FIELD_IMAGE: {
            int rc = vf_wds_decode_image_with(tj, m->data, m->size,
                                              (int)(l->s.image_float_chw ? col->shape[3] : col->shape[2]),
                                              (int)(l->s.image_float_chw ? col->shape[2] : col->shape[1]),
                                              l->s.image_float_chw, l->s.max_image_pixels, dst);
            if (rc < 0)
                slot_fail(sl, shard_url(l, sl->sample), m->name, sl->sample->key, vf_last_error());
            else
                __atomic_add_fetch(&a->images, 1, __ATOMIC_RELAXED);
            break;
        }
        case FIELD_NPZ:
            memcpy(dst, sl->npz[f].arrays[a->col_array[ci]].data, row_bytes);
            break;
        case FIELD_NPY:
            memcpy(dst, sl->npy[f].data, row_bytes);
            break;
        case FIELD_CLS: {
            char buf[32];
            memcpy(buf, m->data, m->size);
            buf[m->size] = 0;
            int64_t v = strtoll(buf, NULL, 10);
            memcpy(dst, &v, sizeof v);
            break;
        }
        default:
            break;
        }
    }
}

typedef struct job {
    assembly *a;
    int index;
} job;

static void run_job(void *arg)
{
    job *j = arg;
    assembly *a = j->a;
    void *tj = NULL;
    for (size_t row = (size_t)j->index; row < a->count; row += (size_t)a->jobs) {
        slot *sl = &a->slots[row];
        if (!sl->sample || sl->error)
            continue;
        if (a->phase == 0)
            parse_slot(a, sl);
        else
            decode_slot(a, row, &tj);
    }
    vf_wds_jpeg_handle_free(tj);
}

static void run_phase(assembly *a, int phase)
{
    a->phase = phase;
    job jobs[64];
    a->jobs = a->l->pool ? VF_MIN(VF_MIN(a->l->threads, 64), (int)a->count) : 1;
    if (a->jobs < 1)
        a->jobs = 1;
    for (int i = 0; i < a->jobs; i++)
        jobs[i] = (job){a, i};
    if (a->jobs == 1) {
        run_job(&jobs[0]);
        return;
    }
    for (int i = 0; i < a->jobs; i++)
        if (vf_thread_pool_submit(a->l->pool, run_job, &jobs[i]) < 0)
            run_job(&jobs[i]);
    vf_thread_pool_wait(a->l->pool);
}

void vf_wds_batch_free(vf_wds_batch *b)
{
    if (!b)
        return;
    for (size_t c = 0; c < b->num_columns; c++) {
        vf_wds_column *col = &b->columns[c];
        free(col->name);
        free(col->suffix);
        free(col->data);
        if (col->items)
            for (size_t i = 0; i < b->size; i++)
                free(col->items[i]);
        free(col->items);
        free(col->item_sizes);
    }
    free(b->columns);
    for (size_t i = 0; i < b->size; i++) {
        if (b->keys)
            free(b->keys[i]);
        if (b->shards)
            free(b->shards[i]);
    }
    free(b->keys);
    free(b->shards);
    free(b->positions);
    free(b);
}

static int add_column(vf_wds_batch *b, int *col_field, int *col_array, int field, int array, const char *name,
                      const char *suffix, int type, const char *descr, int ndim, const int64_t *shape)
{
    vf_wds_column *col = &b->columns[b->num_columns];
    memset(col, 0, sizeof *col);
    col->name = vf_strdup(name);
    col->suffix = vf_strdup(suffix);
    if (!col->name || !col->suffix) {
        free(col->name);
        free(col->suffix);
        return VF_ENOMEM;
    }
    col->type = type;
    if (descr)
        snprintf(col->descr, sizeof col->descr, "%s", descr);
    col->ndim = ndim + 1;
    col->shape[0] = (int64_t)b->size;
    for (int d = 0; d < ndim; d++)
        col->shape[d + 1] = shape[d];
    col_field[b->num_columns] = field;
    col_array[b->num_columns] = array;
    b->num_columns++;
    return 0;
}

static int image_column_shape(const vf_wds_loader *l, int w, int h, int64_t shape[3])
{
    if (l->s.resize_width) {
        w = l->s.resize_width;
        h = l->s.resize_height;
    }
    if (l->s.image_float_chw) {
        shape[0] = 3;
        shape[1] = h;
        shape[2] = w;
    } else {
        shape[0] = h;
        shape[1] = w;
        shape[2] = 3;
    }
    return 0;
}

/* The bytes slot i adds to the batch's columns. */
static int64_t row_cost(const assembly *a, size_t i)
{
    const vf_wds_loader *l = a->l;
    const vf_wds_batch *b = a->batch;
    const slot *sl = &a->slots[i];
    int64_t cost = 0;
    for (size_t ci = 0; ci < b->num_columns; ci++) {
        const vf_wds_column *col = &b->columns[ci];
        int f = a->col_field[ci];
        if (col->type != VF_WDS_BYTES)
            cost += (int64_t)column_row_bytes(col, descr_itemsize(col->descr));
        else if (l->field_kind[f] == FIELD_NPZ)
            cost += (int64_t)sl->npz[f].sizes[a->col_array[ci]];
        else
            cost += (int64_t)sl->field_member[f]->size;
    }
    return cost;
}

/* Gives the good slots their rows, in order, while the columns stay within
 * max_batch_bytes; a slot that would pass it fails. Returns the rows. */
static size_t admit_rows(assembly *a)
{
    const vf_wds_loader *l = a->l;
    int64_t total = 0;
    size_t rows = 0;
    for (size_t i = 0; i < a->count; i++) {
        slot *sl = &a->slots[i];
        a->row_of[i] = -1;
        if (!sl->sample || sl->error)
            continue;
        int64_t cost = row_cost(a, i);
        if (cost > l->s.max_batch_bytes - total) {
            char *what = vf_asprintf("the batch's columns would reach %lld bytes with this sample (%zu before it), "
                                     "above max_batch_bytes %lld",
                                     (long long)(total + cost), rows, (long long)l->s.max_batch_bytes);
            slot_fail(sl, shard_url(l, sl->sample), NULL, sl->sample->key, what ? what : "above max_batch_bytes");
            free(what);
            continue;
        }
        total += cost;
        a->row_of[i] = (int64_t)rows++;
    }
    return rows;
}

/* Columns from the first good slot; then checks every slot against them. */
static int build_columns(assembly *a)
{
    vf_wds_loader *l = a->l;
    vf_wds_batch *b = a->batch;
    slot *first = NULL;
    for (size_t i = 0; i < a->count && !first; i++)
        if (a->slots[i].sample && !a->slots[i].error)
            first = &a->slots[i];
    if (!first)
        return 0;
    size_t max_cols = 0;
    for (size_t f = 0; f < l->num_fields; f++)
        max_cols += l->field_kind[f] == FIELD_NPZ ? first->npz[f].count : 1;
    b->columns = vf_calloc(max_cols ? max_cols : 1, sizeof *b->columns);
    a->col_field = vf_calloc(max_cols ? max_cols : 1, sizeof *a->col_field);
    a->col_array = vf_calloc(max_cols ? max_cols : 1, sizeof *a->col_array);
    if (!b->columns || !a->col_field || !a->col_array)
        return VF_ENOMEM;
    int rc = 0;
    for (size_t f = 0; f < l->num_fields && rc == 0; f++) {
        const char *suffix = l->field_suffix[f];
        int type;
        switch (l->field_kind[f]) {
        case FIELD_IMAGE: {
            const vf_wds_member *m = first->field_member[f];
            int depth = vf_wds_png_bit_depth(m->data, m->size);
            char *name = vf_strndup(suffix, (size_t)(strrchr(suffix, '.') - suffix));
            if (!name)
                return VF_ENOMEM;
            if (depth == 16) { /* depth maps: the caller decodes them */
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_WDS_BYTES, NULL, 0, NULL);
            } else {
                int64_t shape[3];
                image_column_shape(l, first->img_w[f], first->img_h[f], shape);
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, name, suffix,
                                l->s.image_float_chw ? VF_COL_FLOAT32 : VF_COL_UINT8,
                                l->s.image_float_chw ? "<f4" : "|u1", 3, shape);
            }
            free(name);
            break;
        }
        case FIELD_NPZ:
            for (size_t k = 0; k < first->npz[f].count && rc == 0; k++) {
                const vf_wds_array *arr = &first->npz[f].arrays[k];
                if (first->npz[f].parsed[k]) {
                    array_descr_type(arr->descr, &type);
                    rc = add_column(b, a->col_field, a->col_array, (int)f, (int)k, first->npz[f].names[k], suffix,
                                    type, arr->descr, arr->ndim, arr->shape);
                } else {
                    rc = add_column(b, a->col_field, a->col_array, (int)f, (int)k, first->npz[f].names[k], suffix,
                                    VF_WDS_BYTES, NULL, 0, NULL);
                    b->columns[b->num_columns - 1].npy = 1;
                }
            }
            break;
        case FIELD_NPY:
            if (first->npy_ok[f]) {
                array_descr_type(first->npy[f].descr, &type);
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, type, first->npy[f].descr,
                                first->npy[f].ndim, first->npy[f].shape);
            } else {
                rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_WDS_BYTES, NULL, 0, NULL);
                b->columns[b->num_columns - 1].npy = 1;
            }
            break;
        case FIELD_CLS:
            rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_COL_INT64, "<i8", 0, NULL);
            break;
        default:
            rc = add_column(b, a->col_field, a->col_array, (int)f, -1, suffix, suffix, VF_WDS_BYTES, NULL, 0, NULL);
            break;
        }
    }
    if (rc < 0)
        return rc;
    /* check every slot against the columns */
    for (size_t i = 0; i < a->count; i++) {
        slot *sl = &a->slots[i];
        if (!sl->sample || sl->error)
            continue;
        for (size_t ci = 0; ci < b->num_columns && !sl->error; ci++) {
            const vf_wds_column *col = &b->columns[ci];
            int f = a->col_field[ci];
            const vf_wds_member *m = sl->field_member[f];
            char what[160] = "";
            if (l->field_kind[f] == FIELD_IMAGE && col->type != VF_WDS_BYTES) {
                int depth = vf_wds_png_bit_depth(m->data, m->size);
                if (depth == 16)
                    snprintf(what, sizeof what, "a 16-bit PNG where the batch holds 8-bit images");
                else if (!l->s.resize_width) {
                    int64_t shape[3];
                    image_column_shape(l, sl->img_w[f], sl->img_h[f], shape);
                    if (memcmp(shape, col->shape + 1, sizeof shape))
                        snprintf(what, sizeof what, "image %dx%d, the batch's are %lldx%lld (pass resize=)",
                                 sl->img_w[f], sl->img_h[f],
                                 (long long)(l->s.image_float_chw ? col->shape[3] : col->shape[2]),
                                 (long long)(l->s.image_float_chw ? col->shape[2] : col->shape[1]));
                }
            } else if (l->field_kind[f] == FIELD_NPZ) {
                const vf_wds_npz *z = &sl->npz[f];
                int k = a->col_array[ci];
                if ((size_t)k >= z->count || strcmp(z->names[k], col->name) ||
                    z->count != first->npz[f].count)
                    snprintf(what, sizeof what, "npz arrays differ from the batch's first sample's");
                else if (col->type == VF_WDS_BYTES ? z->parsed[k]
                                                   : (!z->parsed[k] || strcmp(z->arrays[k].descr, col->descr) ||
                                                      z->arrays[k].ndim != col->ndim - 1 ||
                                                      memcmp(z->arrays[k].shape, col->shape + 1,
                                                             sizeof(int64_t) * (size_t)z->arrays[k].ndim)))
                    snprintf(what, sizeof what, "npz array %s has another dtype or shape than the batch's first "
                                                "sample's", col->name);
            } else if (l->field_kind[f] == FIELD_NPY) {
                if (col->type == VF_WDS_BYTES ? sl->npy_ok[f]
                                              : (!sl->npy_ok[f] || strcmp(sl->npy[f].descr, col->descr) ||
                                                 sl->npy[f].ndim != col->ndim - 1 ||
                                                 memcmp(sl->npy[f].shape, col->shape + 1,
                                                        sizeof(int64_t) * (size_t)sl->npy[f].ndim)))
                    snprintf(what, sizeof what, ".npy dtype or shape differs from the batch's first sample's");
            }
            if (what[0])
                slot_fail(sl, shard_url(l, sl->sample), m->name, sl->sample->key, what);
        }
    }
    size_t rows = admit_rows(a);
    /* allocate, for the admitted rows only */
    for (size_t ci = 0; ci < b->num_columns; ci++) {
        vf_wds_column *col = &b->columns[ci];
        col->shape[0] = (int64_t)rows;
        if (col->type == VF_WDS_BYTES) {
            /* one entry per slot (vf_wds_batch_free walks b->size of them); rows use the first */
            col->items = vf_calloc(b->size ? b->size : 1, sizeof *col->items);
            col->item_sizes = vf_calloc(b->size ? b->size : 1, sizeof *col->item_sizes);
            if (!col->items || !col->item_sizes)
                return VF_ENOMEM;
            continue;
        }
        col->nbytes = column_row_bytes(col, descr_itemsize(col->descr)) * rows;
        col->data = vf_calloc(col->nbytes ? col->nbytes : 1, 1);
        if (!col->data)
            return VF_ENOMEM;
    }
    return 0;
}

/* Removes the rows of slots that failed after admission, and the slots
 * that never had one, from the batch (keeps order). */
static void compact(assembly *a)
{
    vf_wds_batch *b = a->batch;
    size_t keep = 0;
    for (size_t i = 0; i < a->count; i++) {
        int good = a->slots[i].sample && !a->slots[i].error;
        int64_t r = a->row_of[i];
        if (r < 0)
            continue;
        size_t row = (size_t)r;
        if (!good) {
            for (size_t ci = 0; ci < b->num_columns; ci++)
                if (b->columns[ci].items) {
                    free(b->columns[ci].items[row]);
                    b->columns[ci].items[row] = NULL;
                }
            continue;
        }
        if (keep != row) {
            for (size_t ci = 0; ci < b->num_columns; ci++) {
                vf_wds_column *col = &b->columns[ci];
                if (col->items) {
                    col->items[keep] = col->items[row];
                    col->item_sizes[keep] = col->item_sizes[row];
                    col->items[row] = NULL;
                } else {
                    size_t rb = column_row_bytes(col, descr_itemsize(col->descr));
                    memmove(col->data + keep * rb, col->data + row * rb, rb);
                }
            }
        }
        b->positions[keep] = b->positions[i];
        keep++;
    }
    for (size_t ci = 0; ci < b->num_columns; ci++) {
        vf_wds_column *col = &b->columns[ci];
        if (!col->items)
            col->nbytes = column_row_bytes(col, descr_itemsize(col->descr)) * keep;
        col->shape[0] = (int64_t)keep;
    }
    b->size = keep;
}

static void free_slots(assembly *a)
{
    const vf_wds_loader *l = a->l;
    for (size_t i = 0; i < a->count; i++) {
        slot *sl = &a->slots[i];
        if (sl->npz)
            for (size_t f = 0; f < l->num_fields; f++)
                vf_wds_npz_free(&sl->npz[f]);
        free(sl->npz);
        free(sl->npy);
        free(sl->npy_ok);
        free(sl->img_w);
        free(sl->img_h);
        free(sl->field_member);
        free(sl->error);
        vf_wds_stored_free(sl->sample);
    }
    free(a->slots);
    free(a->row_of);
    free(a->col_field);
    free(a->col_array);
}

/* Takes position p's sample out of consumer c (or records why it is bad). */
static int take_sample(vf_wds_loader *l, vf_wds_consumer *c, int64_t p, slot *sl)
{
    int rc = vf_wds_ensure_position(l, c, p);
    if (rc < 0)
        return rc;
    size_t idx;
    vf_wds_stored *st = vf_wds_find_stored(c, p, &idx);
    if (++c->delivered == c->num_needed) {
        /* nothing more to read: the part's last piece still gets its count check */
        while (c->piece_i < c->num_pieces && c->reader && c->reader_piece == c->piece_i) {
            const vf_plan_piece *piece = &c->pieces[c->piece_i];
            if (c->reader_pos < piece->first_position + piece->num_samples)
                break;
            if ((rc = vf_wds_check_tail(l, c)) < 0)
                return rc;
            c->piece_i++;
        }
    }
    if (!st) {
        sl->error = vf_strdup(vf_wds_find_bad(c, p));
        return sl->error ? 0 : VF_ENOMEM;
    }
    if (--st->refs == 0) {
        c->store[idx] = c->store[--c->num_store];
        l->buffer_bytes -= st->bytes; /* the slot owns it now: out of the read-ahead buffer */
        sl->sample = st;
        return 0;
    }
    /* delivered again later (wrap padding): hand out a copy */
    vf_wds_sample view = {.key = st->key, .num_members = st->num_members, .members = st->members};
    vf_wds_consumer tmp;
    memset(&tmp, 0, sizeof tmp);
    if ((rc = vf_wds_store_sample(&tmp, &view, p, st->shard, 1)) < 0)
        return rc;
    sl->sample = tmp.store[0];
    free(tmp.store);
    return 0;
}

static int produce(vf_wds_loader *l, vf_wds_batch **out);

/* The next batch, its shard reads watching the loader's cancel token (so a
 * remote read riding out an outage ends when the loader is cancelled). */
int vf_wds_produce(vf_wds_loader *l, vf_wds_batch **out)
{
    *out = NULL;
    if (vf_io_cancel_requested(&l->io_cancel))
        return vf_error(VF_EIO, "wds loader: cancelled (vf_wds_loader_cancel, or close from another thread)");
    vf_io_cancel *outer = vf_io_cancel_watch(&l->io_cancel);
    int r = produce(l, out);
    vf_io_cancel_watch(outer);
    return r;
}

static int produce(vf_wds_loader *l, vf_wds_batch **out)
{
    *out = NULL;
    if (l->failure)
        return vf_error(VF_ECORRUPT, "%s", l->failure);
    if (l->next_batch >= l->plan.num_batches)
        return VF_EOF;
    size_t bi = l->next_batch;
    int64_t begin = l->plan.batch_start[bi], end = l->plan.batch_start[bi + 1];
    assembly a;
    memset(&a, 0, sizeof a);
    a.l = l;
    a.count = (size_t)(end - begin);
    a.slots = vf_calloc(a.count ? a.count : 1, sizeof *a.slots);
    a.row_of = vf_malloc_array(a.count ? a.count : 1, sizeof *a.row_of);
    a.batch = vf_calloc(1, sizeof *a.batch);
    int rc = a.slots && a.row_of && a.batch ? 0 : VF_ENOMEM;
    for (size_t i = 0; rc == 0 && i < a.count; i++)
        a.row_of[i] = -1;
    if (rc == 0) {
        a.batch->size = a.count;
        a.batch->positions = vf_malloc_array(a.count ? a.count : 1, sizeof *a.batch->positions);
        rc = a.batch->positions ? 0 : VF_ENOMEM;
    }
    size_t nf = l->num_fields ? l->num_fields : 1;
    for (size_t i = 0; rc == 0 && i < a.count; i++) {
        slot *sl = &a.slots[i];
        a.batch->positions[i] = l->plan.positions[begin + (int64_t)i];
        sl->field_member = vf_calloc(nf, sizeof *sl->field_member);
        sl->npz = vf_calloc(nf, sizeof *sl->npz);
        sl->npy = vf_calloc(nf, sizeof *sl->npy);
        sl->npy_ok = vf_calloc(nf, sizeof *sl->npy_ok);
        sl->img_w = vf_calloc(nf, sizeof *sl->img_w);
        sl->img_h = vf_calloc(nf, sizeof *sl->img_h);
        if (!sl->field_member || !sl->npz || !sl->npy || !sl->npy_ok || !sl->img_w || !sl->img_h)
            rc = VF_ENOMEM;
        else
            rc = take_sample(l, &l->consumers[vf_wds_owner_part(l, a.batch->positions[i])], a.batch->positions[i], sl);
    }
    double t0 = vf_now_seconds();
    if (rc == 0)
        run_phase(&a, 0);
    if (rc == 0)
        rc = build_columns(&a);
    if (rc == 0)
        run_phase(&a, 1);
    l->stats.decode_seconds += vf_now_seconds() - t0;
    l->stats.images_decoded += a.images;
    if (rc == 0) {
        /* bad samples: the first one fails the batch, or all are skipped */
        for (size_t i = 0; i < a.count; i++) {
            slot *sl = &a.slots[i];
            if (!sl->error)
                continue;
            if (l->s.on_error == VF_WDS_RAISE) {
                rc = vf_error(VF_ECORRUPT, "%s", sl->error);
                l->failure = vf_strdup(sl->error);
                break;
            }
            l->stats.skipped_samples++;
            vf_wds_note_skip(l, sl->error);
        }
    }
    if (rc == 0) {
        vf_wds_batch *b = a.batch;
        b->keys = vf_calloc(a.count ? a.count : 1, sizeof *b->keys);
        b->shards = vf_calloc(a.count ? a.count : 1, sizeof *b->shards);
        if (!b->keys || !b->shards)
            rc = VF_ENOMEM;
        compact(&a);
        size_t k = 0;
        for (size_t i = 0; rc == 0 && i < a.count; i++) {
            slot *sl = &a.slots[i];
            if (!sl->sample || sl->error)
                continue;
            b->keys[k] = vf_strdup(sl->sample->key);
            b->shards[k] = vf_strdup(vf_wds_manifest_shard_name(l->manifest, sl->sample->shard));
            if (!b->keys[k] || !b->shards[k])
                rc = VF_ENOMEM;
            k++;
        }
    }
    free_slots(&a);
    if (rc < 0) {
        vf_wds_batch_free(a.batch);
        return rc;
    }
    l->next_batch++;
    l->stats.batches++;
    l->stats.samples += a.batch->size;
    *out = a.batch;
    return 0;
}

