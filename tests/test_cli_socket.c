/* test_cli_socket.c: kwarm ls, evict, pins, unpin, resize and get by a
 * digest prefix through kwarmd (--socket), answering with the documents
 * --cache gives (issue 12 points 5 and 6). */
#include "daemon_util.h"

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"


static cJSON *kwarm_json(const char *const *args, int want)
{
    char *out = NULL, *err = NULL;
    int st = kw_test_kwarm(args, &out, &err);
    cr_assert_eq(st, want, "kwarm %s: exit %d: %s", args[0], st, err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "%s", out);
    free(out);
    free(err);
    return doc;
}

Test(cli_socket, admin_commands_through_kwarmd_match_the_cache)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kws-admin", 1, NULL, &c);
    const char *warm[] = {"warmup", "--model", V32, "--socket", d.sock, "--pin",
                          "v32", "--quiet", NULL};
    cJSON_Delete(NULL);
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(warm, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    /* ls: the same entries as --cache reads (the cache stays kwarmd's). */
    const char *ls_s[] = {"ls", "--socket", d.sock, "--json", NULL};
    const char *ls_c[] = {"ls", "--cache", d.cache, "--json", NULL};
    cJSON *a = kwarm_json(ls_s, 0), *b = kwarm_json(ls_c, 0);
    cJSON *da = kwd_digests(cJSON_GetObjectItemCaseSensitive(a, "entries"));
    cJSON *db = kwd_digests(cJSON_GetObjectItemCaseSensitive(b, "entries"));
    cr_expect(cJSON_GetArraySize(da) > 0 && kwd_same_set(da, db), "ls differs");
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(a, "count")->valuedouble,
                 cJSON_GetArraySize(da));
    /* get by a unique 12-digit prefix, through kwarmd. */
    char prefix[13], path[300];
    snprintf(prefix, sizeof prefix, "%s", cJSON_GetArrayItem(da, 0)->valuestring);
    snprintf(path, sizeof path, "%s/k.cubin", d.dir);
    const char *get[] = {"get", "--digest", prefix, "--socket", d.sock, "-o", path,
                         NULL};
    cr_expect_eq(kw_test_kwarm(get, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    /* pins, then evict refusing pinned entries unless --force. */
    cJSON *p = kwarm_json((const char *[]){"pins", "--socket", d.sock, "--json", NULL}, 0);
    const cJSON *p0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "pins"), 0);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(p0, "name")),
                     "v32");
    const char *ev[] = {"evict", "--socket", d.sock, "--family", "indexer_topk", NULL};
    cr_expect_eq(kw_test_kwarm(ev, &out, &err), 1, "pinned entries are refused");
    cr_expect(strstr(err, "pinned") != NULL, "%s", err);
    free(out);
    free(err);
    const char *evf[] = {"evict", "--socket", d.sock, "--family", "indexer_topk",
                         "--force", "--json", NULL};
    cJSON *r = kwarm_json(evf, 0);
    int removed = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "removed"));
    cr_expect_gt(removed, 0);
    /* unpin, resize: both through kwarmd. */
    cJSON *u = kwarm_json((const char *[]){"unpin", "--socket", d.sock, "v32",
                                           "--json", NULL}, 0);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(u, "name")),
                     "v32");
    cr_expect_eq(kw_test_kwarm((const char *[]){"unpin", "--socket", d.sock, "v32", NULL},
                       &out, &err), 1, "the set is gone");
    free(out);
    free(err);
    cJSON *z = kwarm_json((const char *[]){"resize", "--socket", d.sock, "2M",
                                           "--json", NULL}, 0);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(z, "max_size")->valuedouble, 2097152);
    cr_expect_eq(kwc_stat(&c, "max_size"), 2097152, "kwarmd's cache took it");
    cJSON *after = kwarm_json(ls_s, 0);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(after, "count")->valuedouble,
                 cJSON_GetArraySize(da) - removed);
    for (cJSON **j = (cJSON *[]){a, b, da, db, p, r, u, z, after, NULL}; *j; j++)
        cJSON_Delete(*j);
    kwd_down(&d, &c);
}
