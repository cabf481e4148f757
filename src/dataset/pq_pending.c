/*
 * pq_pending.c: TEMPORARY stand-ins for the Parquet reader functions the
 * dataset layer calls, so the branch links until the reader (another
 * helper's src/parquet/) is merged. Every function fails cleanly with
 * VF_EUNSUPPORTED. DELETE THIS FILE when merging `parquet: reader`.
 */
#include "parquet/parquet.h"

#include <string.h>

static int pending(void) { return vf_error(VF_EUNSUPPORTED, "Parquet reader not available in this build yet"); }

int vf_pq_open(vf_pq_file **out, vf_source *src) { (void)src; *out = NULL; return pending(); }
void vf_pq_close(vf_pq_file *f) { (void)f; }
const char *vf_pq_name(const vf_pq_file *f) { (void)f; return ""; }
int64_t vf_pq_num_rows(const vf_pq_file *f) { (void)f; return 0; }
int vf_pq_num_row_groups(const vf_pq_file *f) { (void)f; return 0; }
int64_t vf_pq_row_group_rows(const vf_pq_file *f, int g) { (void)f; (void)g; return 0; }
int vf_pq_field_index(const vf_pq_file *f, const char *name) { (void)f; (void)name; return -1; }
const char *vf_pq_kv(const vf_pq_file *f, const char *key) { (void)f; (void)key; return NULL; }
const char *vf_pq_type_name(vf_pq_type t) { (void)t; return "?"; }
void vf_pq_array_free(vf_pq_array *a) { memset(a, 0, sizeof *a); }
int vf_pq_select_row_groups(const vf_pq_file *f, const char *name, int64_t lo, int64_t hi, int **rg, int *n)
{ (void)f; (void)name; (void)lo; (void)hi; *rg = NULL; *n = 0; return pending(); }
int vf_pq_read_field(vf_pq_file *f, int g, int i, vf_pq_array *out) { (void)f; (void)g; (void)i; memset(out, 0, sizeof *out); return pending(); }
int vf_pq_read_field_all(vf_pq_file *f, int i, vf_pq_array *out) { (void)f; (void)i; memset(out, 0, sizeof *out); return pending(); }
int vf_pq_open_path(vf_pq_file **out, const char *path) { (void)path; *out = NULL; return pending(); }
