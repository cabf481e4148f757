/*
 * stats.c: normalization statistics: meta/stats.json (v3.0, v2.0) and the
 * aggregation of meta/episodes_stats.jsonl (v2.1) the way LeRobot's
 * aggregate_stats does it (min/max element-wise, mean weighted by count,
 * std from the pooled variance, count summed).
 *
 * Statistics are auxiliary: a malformed stats file is reported as a problem
 * and the dataset opens without (some) statistics. Non-finite values
 * (Python writes NaN/Infinity tokens; null) are kept as NaN and flagged.
 *
 * Limits: at most 2^20 values per statistic, 8 dimensions.
 */
#include "dataset/dataset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STAT_VALUES (1u << 20)
#define MAX_STAT_NDIM 8

static int add_stat(vf_dataset *d, const char *feature, const char *name, const double *values,
                    const int64_t *shape, int ndim, size_t size)
{
    if (d->num_stats == d->cap_stats) {
        size_t ncap = d->cap_stats ? d->cap_stats * 2 : 32;
        vf_stat *grown = vf_ds_alloc(d, ncap, sizeof *grown);
        if (!grown)
            return VF_ENOMEM;
        if (d->num_stats)
            memcpy(grown, d->stats, d->num_stats * sizeof *grown);
        d->stats = grown; /* the old array stays in the arena (small) */
        d->cap_stats = ncap;
    }
    vf_stat *s = &d->stats[d->num_stats];
    s->feature = vf_ds_strdup(d, feature);
    s->name = vf_ds_strdup(d, name);
    int64_t *shp = vf_ds_alloc(d, ndim ? (size_t)ndim : 1, sizeof *shp);
    double *vals = vf_ds_alloc(d, size ? size : 1, sizeof *vals);
    if (!s->feature || !s->name || !shp || !vals)
        return VF_ENOMEM;
    memcpy(shp, shape, (size_t)ndim * sizeof *shp);
    memcpy(vals, values, size * sizeof *vals);
    s->shape = shp;
    s->ndim = ndim;
    s->size = size;
    s->values = vals;
    d->num_stats++;
    return 0;
}

static size_t first_nonfinite(const double *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return n;
}

/* ---- stats.json --------------------------------------------------------- */

int vf_ds_load_stats_json(vf_dataset *d, const char *rel, const char *text, size_t len)
{
    json_t *root;
    int r = vf_json_parse(rel, text, len, VF_JSON_ALLOW_NONFINITE, &root);
    if (r < 0)
        return r == VF_ENOMEM ? r : vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, "", "%s", vf_last_error());
    if (!json_is_object(root)) {
        json_decref(root);
        return vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, "", "expected a JSON object; statistics ignored");
    }
    const char *feature;
    json_t *fobj;
    r = 0;
    json_object_foreach(root, feature, fobj)
    {
        if (!json_is_object(fobj)) {
            r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, feature, "expected an object of statistics; ignored");
            if (r < 0)
                break;
            continue;
        }
        const char *name;
        json_t *value;
        json_object_foreach(fobj, name, value)
        {
            double *vals;
            int64_t *shape;
            int ndim;
            char *what = vf_asprintf("%s.%s", feature, name);
            if (!what) {
                r = VF_ENOMEM;
                break;
            }
            r = vf_json_number_array(rel, what, value, MAX_STAT_NDIM, MAX_STAT_VALUES, &vals, &shape, &ndim);
            if (r == VF_ENOMEM) {
                free(what);
                break;
            }
            if (r < 0) {
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, what, "%s; statistic ignored", vf_last_error());
                free(what);
                if (r < 0)
                    break;
                continue;
            }
            size_t size = 1;
            for (int k = 0; k < ndim; k++)
                size *= (size_t)shape[k];
            r = add_stat(d, feature, name, vals, shape, ndim, size);
            size_t bad = first_nonfinite(vals, size);
            if (r == 0 && bad < size)
                r = vf_ds_problem(d, VF_SEVERITY_WARNING, rel, -1, what, "non-finite value (NaN, Infinity or null) at element %zu",
                                  bad);
            free(vals);
            free(shape);
            free(what);
            if (r < 0)
                break;
        }
        if (r < 0)
            break;
    }
    json_decref(root);
    return r;
}

/* ---- episodes_stats.jsonl aggregation ---------------------------------- */

typedef struct agg_feature {
    char *name;
    int64_t shape[MAX_STAT_NDIM];
    int ndim;
    size_t size;
    int broken;            /* inconsistent shapes: dropped */
    int64_t episodes;
    double *min, *max, *sum_cm, *sum_cq; /* per element: Σ c·mean, Σ c·(std² + mean²) */
    double count;
} agg_feature;

typedef struct agg_state {
    agg_feature *features;
    size_t n, cap;
} agg_state;

static void agg_free(agg_state *a)
{
    for (size_t i = 0; i < a->n; i++) {
        free(a->features[i].name);
        free(a->features[i].min);
        free(a->features[i].max);
        free(a->features[i].sum_cm);
        free(a->features[i].sum_cq);
    }
    free(a->features);
}

static agg_feature *agg_find(agg_state *a, const char *name)
{
    for (size_t i = 0; i < a->n; i++)
        if (!strcmp(a->features[i].name, name))
            return &a->features[i];
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        agg_feature *grown = vf_realloc(a->features, cap * sizeof *grown);
        if (!grown)
            return NULL;
        a->features = grown;
        a->cap = cap;
    }
    agg_feature *f = &a->features[a->n];
    memset(f, 0, sizeof *f);
    if (!(f->name = vf_strdup(name)))
        return NULL;
    a->n++;
    return f;
}

/* Reads one stat of an episode as a flat array; NULL values when absent. */
static int read_stat(vf_dataset *d, const char *rel, int64_t line, int64_t episode, const char *feature,
                     const json_t *fobj, const char *name, double **vals, int64_t *shape, int *ndim, size_t *size)
{
    *vals = NULL;
    json_t *v = vf_json_member(fobj, name);
    if (!v)
        return 0;
    char what[512];
    snprintf(what, sizeof what, "line %lld: stats.%s.%s", (long long)line, feature, name);
    int64_t *shp;
    int r = vf_json_number_array(rel, what, v, MAX_STAT_NDIM, MAX_STAT_VALUES, vals, &shp, ndim);
    if (r == VF_ENOMEM)
        return r;
    if (r < 0) {
        char column[300];
        snprintf(column, sizeof column, "%s.%s", feature, name);
        return vf_ds_problem(d, VF_SEVERITY_ERROR, rel, episode, column, "%s", vf_last_error());
    }
    *size = 1;
    for (int k = 0; k < *ndim; k++) {
        shape[k] = shp[k];
        *size *= (size_t)shp[k];
    }
    free(shp);
    return 0;
}

/* Adds one episode's statistics of one feature. */
static int agg_add(vf_dataset *d, agg_state *a, const char *rel, int64_t line, int64_t episode, const char *feature,
                   const json_t *fobj)
{
    static const char *const names[] = {"min", "max", "mean", "std", "count"};
    double *v[5] = {0};
    int64_t shapes[5][MAX_STAT_NDIM];
    int ndims[5] = {0};
    size_t sizes[5] = {0};
    int r = 0;
    for (int i = 0; i < 5 && r == 0; i++)
        r = read_stat(d, rel, line, episode, feature, fobj, names[i], &v[i], shapes[i], &ndims[i], &sizes[i]);
    if (r < 0)
        goto done;
    for (int i = 0; i < 4; i++) {
        if (v[i] && first_nonfinite(v[i], sizes[i]) < sizes[i]) {
            char column[300];
            snprintf(column, sizeof column, "%s.%s", feature, names[i]);
            if ((r = vf_ds_problem(d, VF_SEVERITY_WARNING, rel, episode, column,
                                   "non-finite value (NaN, Infinity or null) at element %zu",
                                   first_nonfinite(v[i], sizes[i]))) < 0)
                goto done;
        }
    }
    agg_feature *f = agg_find(a, feature);
    if (!f) {
        r = VF_ENOMEM;
        goto done;
    }
    if (f->broken)
        goto done;
    int complete = v[0] && v[1] && v[2] && v[3] && v[4] && sizes[4] == 1;
    for (int i = 1; i < 4 && complete; i++)
        complete = sizes[i] == sizes[0] && ndims[i] == ndims[0] &&
                   !memcmp(shapes[i], shapes[0], (size_t)ndims[0] * sizeof(int64_t));
    if (complete && f->episodes > 0)
        complete = sizes[0] == f->size && ndims[0] == f->ndim &&
                   !memcmp(shapes[0], f->shape, (size_t)f->ndim * sizeof(int64_t));
    if (!complete) {
        f->broken = 1;
        r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, episode, feature,
                          "line %lld: statistics need min, max, mean, std of one shape and a one-element count, "
                          "consistent over episodes; no aggregated statistics for this feature",
                          (long long)line);
        goto done;
    }
    double c = v[4][0];
    if (f->episodes == 0) {
        f->size = sizes[0];
        f->ndim = ndims[0];
        memcpy(f->shape, shapes[0], (size_t)ndims[0] * sizeof(int64_t));
        size_t n = f->size ? f->size : 1;
        f->min = vf_malloc_array(n, sizeof(double));
        f->max = vf_malloc_array(n, sizeof(double));
        f->sum_cm = vf_calloc(n, sizeof(double));
        f->sum_cq = vf_calloc(n, sizeof(double));
        if (!f->min || !f->max || !f->sum_cm || !f->sum_cq) {
            r = VF_ENOMEM;
            goto done;
        }
        memcpy(f->min, v[0], f->size * sizeof(double));
        memcpy(f->max, v[1], f->size * sizeof(double));
    } else {
        for (size_t k = 0; k < f->size; k++) {
            f->min[k] = fmin(f->min[k], v[0][k]);
            f->max[k] = fmax(f->max[k], v[1][k]);
        }
    }
    for (size_t k = 0; k < f->size; k++) {
        f->sum_cm[k] += c * v[2][k];
        f->sum_cq[k] += c * (v[3][k] * v[3][k] + v[2][k] * v[2][k]);
    }
    f->count += c;
    f->episodes++;
done:
    for (int i = 0; i < 5; i++)
        free(v[i]);
    return r;
}

int vf_ds_aggregate_episode_stats(vf_dataset *d, const char *rel, const char *text, size_t len)
{
    agg_state a = {0};
    vf_jsonl it;
    vf_jsonl_init(&it, rel, text, len, VF_JSON_ALLOW_NONFINITE);
    json_t *row;
    int r;
    while ((r = vf_jsonl_next(&it, &row)) > 0) {
        int64_t episode = -1;
        json_t *stats = NULL;
        char where[32];
        snprintf(where, sizeof where, "line %lld", (long long)it.line);
        r = vf_json_get_int(rel, where, row, "episode_index", 0, &episode);
        if (r == 0)
            r = vf_json_get_object(rel, where, row, "stats", 0, &stats);
        if (r < 0) {
            json_decref(row);
            if (r == VF_ENOMEM)
                break;
            if ((r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, episode, "", "%s", vf_last_error())) < 0)
                break;
            continue;
        }
        const char *feature;
        json_t *fobj;
        json_object_foreach(stats, feature, fobj)
        {
            if (!json_is_object(fobj))
                r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, episode, feature,
                                  "line %lld: expected an object of statistics", (long long)it.line);
            else
                r = agg_add(d, &a, rel, it.line, episode, feature, fobj);
            if (r < 0)
                break;
        }
        json_decref(row);
        if (r < 0)
            break;
    }
    if (r < 0 && r != VF_ENOMEM)
        r = vf_ds_problem(d, VF_SEVERITY_ERROR, rel, -1, "", "%s; later lines ignored", vf_last_error());
    for (size_t i = 0; i < a.n && r == 0; i++) {
        agg_feature *f = &a.features[i];
        if (f->broken || f->episodes == 0)
            continue;
        size_t n = f->size ? f->size : 1;
        double *mean = vf_malloc_array(n, sizeof *mean), *std = vf_malloc_array(n, sizeof *std);
        if (!mean || !std) {
            free(mean);
            free(std);
            r = VF_ENOMEM;
            break;
        }
        for (size_t k = 0; k < f->size; k++) {
            mean[k] = f->count > 0 ? f->sum_cm[k] / f->count : NAN;
            double var = f->count > 0 ? f->sum_cq[k] / f->count - mean[k] * mean[k] : NAN;
            std[k] = var > 0 ? sqrt(var) : (var <= 0 ? 0.0 : NAN);
        }
        int64_t one = 1;
        if ((r = add_stat(d, f->name, "min", f->min, f->shape, f->ndim, f->size)) == 0 &&
            (r = add_stat(d, f->name, "max", f->max, f->shape, f->ndim, f->size)) == 0 &&
            (r = add_stat(d, f->name, "mean", mean, f->shape, f->ndim, f->size)) == 0 &&
            (r = add_stat(d, f->name, "std", std, f->shape, f->ndim, f->size)) == 0)
            r = add_stat(d, f->name, "count", &f->count, &one, 1, 1);
        free(mean);
        free(std);
    }
    agg_free(&a);
    return r;
}
