/* test_json.c: the JSON helpers: error positions, typed getters and their
 * key-path messages, number arrays, JSON Lines, non-finite tokens. */
#include "json/json.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>

static json_t *parse(const char *text)
{
    json_t *v = NULL;
    CHECK_OK(vf_json_parse("doc.json", text, strlen(text), 0, &v));
    return v;
}

static void test_parse_errors(void)
{
    json_t *v;
    /* Truncated: the message names file, line and column. */
    const char *text = "{\n  \"fps\": 30,\n  \"features\": {";
    CHECK_ERR(vf_json_parse("meta/info.json", text, strlen(text), 0, &v), VF_ECORRUPT, "meta/info.json:3:");
    CHECK(v == NULL);
    CHECK_ERR(vf_json_parse("x.json", "{\"a\": tru}", 10, 0, &v), VF_ECORRUPT, "x.json:1:");
    CHECK_ERR(vf_json_parse("x.json", "", 0, 0, &v), VF_ECORRUPT, "x.json:");
    /* Non-finite tokens are refused unless allowed. */
    CHECK_ERR(vf_json_parse("s.json", "[NaN]", 5, 0, &v), VF_ECORRUPT, "s.json:1:");
    /* Embedded NUL bytes are refused. */
    CHECK_ERR(vf_json_parse("n.json", "{\"a\":\0 1}", 9, 0, &v), VF_ECORRUPT, "n.json");
    /* Not NUL-terminated input: only len bytes are read. */
    CHECK_OK(vf_json_parse("p.json", "[1,2]garbage", 5, 0, &v));
    CHECK(json_array_size(v) == 2);
    json_decref(v);
    CHECK_ERR(vf_json_load_file("/nonexistent/meta/info.json", 0, &v), VF_ENOENT, "/nonexistent/meta/info.json");
}

static void test_nonfinite(void)
{
    const char *text = "{\"m\": [NaN, Infinity, -Infinity, 1.5], \"s\": \"NaN Infinity\", \"NaNkey\": -2}";
    json_t *v = NULL;
    CHECK_OK(vf_json_parse("stats.json", text, strlen(text), VF_JSON_ALLOW_NONFINITE, &v));
    double *vals;
    int64_t *shape;
    int ndim;
    CHECK_OK(vf_json_number_array("stats.json", "m", json_object_get(v, "m"), 4, 100, &vals, &shape, &ndim));
    CHECK_EQ_INT(ndim, 1);
    CHECK_EQ_INT(shape[0], 4);
    CHECK(isnan(vals[0]) && isnan(vals[1]) && isnan(vals[2]) && vals[3] == 1.5);
    free(vals);
    free(shape);
    /* Strings and keys are left alone. */
    CHECK(strcmp(json_string_value(json_object_get(v, "s")), "NaN Infinity") == 0);
    CHECK(json_integer_value(json_object_get(v, "NaNkey")) == -2);
    json_decref(v);
    /* A token glued to an identifier is not a token. */
    CHECK_ERR(vf_json_parse("s.json", "[NaNa]", 6, VF_JSON_ALLOW_NONFINITE, &v), VF_ECORRUPT, "s.json:1:");
}

static void test_getters(void)
{
    json_t *root = parse("{\"fps\": 30, \"half\": 29.97, \"whole\": 30.0, \"name\": \"g1\", \"none\": null,"
                         " \"flag\": true, \"features\": {\"action\": {\"shape\": [26, \"x\"], \"ok\": [1, 2]}}}");
    int64_t i = -1;
    CHECK_OK(vf_json_get_int("f.json", "", root, "fps", 0, &i));
    CHECK_EQ_INT(i, 30);
    CHECK_OK(vf_json_get_int("f.json", "", root, "whole", 0, &i));
    CHECK_EQ_INT(i, 30);
    CHECK_ERR(vf_json_get_int("f.json", "", root, "half", 0, &i), VF_ECORRUPT, "f.json: half: expected an integer");
    CHECK_ERR(vf_json_get_int("f.json", "", root, "name", 0, &i), VF_ECORRUPT, "f.json: name: expected an integer");
    CHECK_ERR(vf_json_get_int("f.json", "", root, "absent", 0, &i), VF_ECORRUPT, "f.json: missing key 'absent'");
    i = 7;
    CHECK_OK(vf_json_get_int("f.json", "", root, "absent", VF_JSON_OPTIONAL, &i));
    CHECK_EQ_INT(i, 7);
    CHECK_ERR(vf_json_get_int("f.json", "", root, "none", 0, &i), VF_ECORRUPT, "none: expected an integer");
    CHECK_OK(vf_json_get_int("f.json", "", root, "none", VF_JSON_NULLABLE, &i));
    CHECK_EQ_INT(i, 7);
    double dv = 0;
    CHECK_OK(vf_json_get_double("f.json", "", root, "half", 0, &dv));
    CHECK(dv == 29.97);
    const char *s = NULL;
    CHECK_OK(vf_json_get_string("f.json", "", root, "name", 0, &s));
    CHECK(s && !strcmp(s, "g1"));
    CHECK_ERR(vf_json_get_string("f.json", "", root, "fps", 0, &s), VF_ECORRUPT, "fps: expected a string");
    int b = 0;
    CHECK_OK(vf_json_get_bool("f.json", "", root, "flag", 0, &b));
    CHECK(b == 1);
    json_t *features = NULL, *action = NULL;
    CHECK_OK(vf_json_get_object("f.json", "", root, "features", 0, &features));
    CHECK_OK(vf_json_get_object("f.json", "features", features, "action", 0, &action));
    int64_t *list;
    size_t n;
    CHECK_ERR(vf_json_get_int_list("meta/info.json", "features.action", action, "shape", 0, 8, 1, 100, &list, &n),
              VF_ECORRUPT, "meta/info.json: features.action.shape: expected a list of integers");
    CHECK_OK(vf_json_get_int_list("f.json", "features.action", action, "ok", 0, 8, 1, 100, &list, &n));
    CHECK(n == 2 && list[0] == 1 && list[1] == 2);
    free(list);
    CHECK_ERR(vf_json_get_int_list("f.json", "features.action", action, "ok", 0, 1, 1, 100, &list, &n), VF_ECORRUPT,
              "at most 1 integers (got 2)");
    CHECK_ERR(vf_json_get_int_list("f.json", "features.action", action, "ok", 0, 8, 2, 100, &list, &n), VF_ECORRUPT,
              "item 0 is 1");
    CHECK_ERR(vf_json_get_object("f.json", "features", features, "missing", 0, &action), VF_ECORRUPT,
              "f.json: features: missing key 'missing'");
    /* A non-object parent has no keys. */
    CHECK_ERR(vf_json_get_int("f.json", "fps", json_object_get(root, "fps"), "x", 0, &i), VF_ECORRUPT, "missing key 'x'");
    json_decref(root);
}

static void test_number_arrays(void)
{
    json_t *root = parse("{\"img\": [[[0.5]], [[0.25]], [[null]]], \"ragged\": [[1, 2], [3]], \"deep\": [[[[[[[[[1]]]]]]]]],"
                         " \"scalar\": 4, \"empty\": [], \"bad\": [1, \"x\"]}");
    double *v;
    int64_t *shape;
    int ndim;
    CHECK_OK(vf_json_number_array("s.json", "img", json_object_get(root, "img"), 8, 100, &v, &shape, &ndim));
    CHECK_EQ_INT(ndim, 3);
    CHECK(shape[0] == 3 && shape[1] == 1 && shape[2] == 1);
    CHECK(v[0] == 0.5 && v[1] == 0.25 && isnan(v[2]));
    free(v);
    free(shape);
    CHECK_ERR(vf_json_number_array("s.json", "ragged", json_object_get(root, "ragged"), 8, 100, &v, &shape, &ndim),
              VF_ECORRUPT, "s.json: ragged: nested lists are not rectangular");
    CHECK_ERR(vf_json_number_array("s.json", "deep", json_object_get(root, "deep"), 8, 100, &v, &shape, &ndim),
              VF_ECORRUPT, "more than 8 levels");
    CHECK_ERR(vf_json_number_array("s.json", "img", json_object_get(root, "img"), 8, 2, &v, &shape, &ndim), VF_ECORRUPT,
              "more than 2 values");
    CHECK_ERR(vf_json_number_array("s.json", "bad", json_object_get(root, "bad"), 8, 100, &v, &shape, &ndim),
              VF_ECORRUPT, "s.json: bad: expected a number");
    CHECK_OK(vf_json_number_array("s.json", "scalar", json_object_get(root, "scalar"), 8, 100, &v, &shape, &ndim));
    CHECK(ndim == 0 && v[0] == 4);
    free(v);
    free(shape);
    CHECK_OK(vf_json_number_array("s.json", "empty", json_object_get(root, "empty"), 8, 100, &v, &shape, &ndim));
    CHECK(ndim == 1 && shape[0] == 0);
    free(v);
    free(shape);
    json_decref(root);
}

static void test_jsonl(void)
{
    const char *text = "{\"a\": 1}\n\n  \r\n{\"a\": 2}\r\n{\"a\": 3}";
    vf_jsonl it;
    vf_jsonl_init(&it, "e.jsonl", text, strlen(text), 0);
    json_t *v;
    int64_t seen[3], lines[3];
    int n = 0, r;
    while ((r = vf_jsonl_next(&it, &v)) > 0 && n < 3) {
        seen[n] = json_integer_value(json_object_get(v, "a"));
        lines[n++] = it.line;
        json_decref(v);
    }
    CHECK_EQ_INT(r, 0);
    CHECK_EQ_INT(n, 3);
    CHECK(seen[0] == 1 && seen[1] == 2 && seen[2] == 3);
    CHECK(lines[0] == 1 && lines[1] == 4 && lines[2] == 5);

    /* A malformed line: the message names that line, not the document's
     * line 1. */
    const char *bad = "{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3,\n{\"a\": 4}\n";
    vf_jsonl_init(&it, "meta/episodes.jsonl", bad, strlen(bad), 0);
    CHECK_EQ_INT(vf_jsonl_next(&it, &v), 1);
    json_decref(v);
    CHECK_EQ_INT(vf_jsonl_next(&it, &v), 1);
    json_decref(v);
    CHECK_ERR(vf_jsonl_next(&it, &v), VF_ECORRUPT, "meta/episodes.jsonl:3:");
    /* Two values on one line are an error too. */
    vf_jsonl_init(&it, "t.jsonl", "{} {}\n", 6, 0);
    CHECK_ERR(vf_jsonl_next(&it, &v), VF_ECORRUPT, "t.jsonl:1:");
    vf_jsonl_init(&it, "t.jsonl", NULL, 0, 0);
    CHECK_EQ_INT(vf_jsonl_next(&it, &v), 0);
}

int main(void)
{
    test_parse_errors();
    test_nonfinite();
    test_getters();
    test_number_arrays();
    test_jsonl();
    json_t *nan = vf_json_real_or_null(NAN);
    CHECK(json_is_null(nan));
    json_decref(nan);
    return vf_test_finish("test_json");
}
