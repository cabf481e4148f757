/*
 * test_pq_helpers.h: flat Parquet columns over caller arrays, for the C
 * tests that write Parquet files with the engine's writer (values are
 * borrowed, not copied).
 */
#ifndef VF_TEST_PQ_HELPERS_H
#define VF_TEST_PQ_HELPERS_H

#include <string.h>

#include "parquet/parquet.h"

static VF_UNUSED vf_pq_array int64_array(const char *name, const int64_t *values, int64_t n)
{
    vf_pq_array a;
    memset(&a, 0, sizeof a);
    a.type = VF_PQ_T_INT64;
    a.name = (char *)name;
    a.length = n;
    a.values = (void *)values;
    return a;
}

static VF_UNUSED vf_pq_array double_array(const char *name, const double *values, int64_t n)
{
    vf_pq_array a = int64_array(name, NULL, n);
    a.type = VF_PQ_T_DOUBLE;
    a.values = (void *)values;
    return a;
}

#endif
