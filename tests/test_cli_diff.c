/* test_cli_diff.c: `kwarm diff` (issue 13 point 7) on the fixtures. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_test_util.h"

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"


/* The digests of `kwarm keys --json` with args, as one JSON array. */
static cJSON *digests(const char *const *args)
{
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(args, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out), *all = cJSON_CreateArray();
    const cJSON *k;
    cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(doc, "keys"))
        cJSON_AddItemToArray(all, cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k, "digest"), 1));
    cJSON_Delete(doc);
    free(out);
    free(err);
    return all;
}

static int count_missing(const cJSON *from, const cJSON *in)
{
    int n = 0;
    const cJSON *a, *b;
    cJSON_ArrayForEach(a, from) {
        bool found = false;
        cJSON_ArrayForEach(b, in) found = found || strcmp(a->valuestring, b->valuestring) == 0;
        n += !found;
    }
    return n;
}

Test(cli_diff, the_same_deployment_is_equal_and_exits_0)
{
    const char *args[] = {"diff", "--model", V32, "--dcp-world", "2", "--against",
                          V32, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_kwarm(args, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "equal: 0 new compiles") != NULL, "%s", out);
    free(out);
    free(err);
}

Test(cli_diff, a_deployment_change_lists_the_new_and_the_dropped_keys)
{
    const char *ka[] = {"keys", "--model", V32, "--dcp-world", "2", "--json", NULL};
    const char *kb[] = {"keys", "--model", V32, "--dcp-world", "4", "--arch",
                        "sm_90,sm_100", "--json", NULL};
    cJSON *a = digests(ka), *b = digests(kb);
    const char *args[] = {"diff", "--model", V32, "--dcp-world", "2", "--against",
                          V32, "--dcp-world", "4", "--arch", "sm_90,sm_100",
                          "--json", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_kwarm(args, &out, &err), 1, "differ: exit 1 (%s)", err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "%s", out);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(doc, "equal")));
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(doc, "only_in_b")->valuedouble,
                 count_missing(b, a));
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(doc, "only_in_a")->valuedouble,
                 count_missing(a, b));
    /* The deployment values that moved, with both values. */
    char *dep = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(doc, "deployment"));
    cr_expect(strstr(dep, "{\"name\":\"dcp_world\",\"a\":2,\"b\":4}") != NULL, "%s", dep);
    cr_expect(strstr(dep, "\"name\":\"arch\"") != NULL, "%s", dep);
    free(dep);
    cJSON_Delete(doc);
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(out);
    free(err);
}

Test(cli_diff, a_model_update_names_the_setting_that_changed)
{
    char dir[128], path[256];
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "diff"), 0);
    char *text = kw_test_read_file(V32, NULL);
    cJSON *cfg = cJSON_Parse(text);
    cJSON_ReplaceItemInObjectCaseSensitive(cfg, "index_topk", cJSON_CreateNumber(512));
    char *changed = cJSON_Print(cfg);
    cr_assert_eq(kw_test_write_file(dir, "new.json", changed, strlen(changed),
                                    path, sizeof path), 0);
    const char *args[] = {"diff", "--model", V32, "--against", path, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_kwarm(args, &out, &err), 1, "%s", err);
    cr_expect(strstr(out, "settings that differ:") && strstr(out, "index_topk") &&
              strstr(out, "2048 -> 512"), "%s", out);
    cr_expect(strstr(out, "new compiles for B") != NULL, "%s", out);
    free(out);
    free(err);
    free(changed);
    free(text);
    cJSON_Delete(cfg);
    kw_test_rmtree(dir);
}

Test(cli_diff, bad_input_exits_2_naming_the_flag)
{
    const char *cases[][8] = {
        {"diff", "--model", V32, NULL},
        {"diff", "--model", V32, "--against", V32, "--against", V32, NULL},
        {"diff", "--model", V32, "--against", V32, "--dcp-world", "0", NULL},
        {"diff", "--model", V32, "--bogus", NULL}};
    const char *needle[] = {"--against", "--against", "--dcp-world", "--bogus"};
    for (size_t i = 0; i < 4; i++) {
        char *out = NULL, *err = NULL;
        cr_expect_eq(kw_test_kwarm(cases[i], &out, &err), 2, "case %zu", i);
        cr_expect(strstr(err, needle[i]) != NULL, "case %zu: %s", i, err);
        free(out);
        free(err);
    }
}
