/* test_cli_socket.c: kwarm ls, evict, pins, unpin, resize and get by a
 * digest prefix through kwarmd (--socket), answering with the documents
 * --cache gives (issue 12 points 5 and 6). */
#include "daemon_util.h"

#include "kw_cache.h"
#include "kw_keys.h"

/* Each test's daemons are killed and their directories removed. */
TestSuite(cli_socket, .fini = kwd_cleanup);

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

/* Puts a made-up index_conversion entry under the digest hex. */
static void put_made_up(kw_cache *c, const char *hex)
{
    kw_k_family f;
    cr_assert_eq(kw_keys_family_from_name("index_conversion", &f), 0);
    kw_cache_info info = {.nfields = (uint32_t)kw_keys_nfields(f),
                          .arch = "sm_90", .entry = "kw_k_x", .nvrtc = "13.0",
                          .family = "index_conversion"};
    for (uint32_t i = 0; i < info.nfields; i++)
        info.fields[i] = kw_keys_field_is_bool(f, i) ? 1 : (int64_t)i + 2;
    uint8_t d[KW_CACHE_DIGEST_LEN];
    for (size_t i = 0; i < KW_CACHE_DIGEST_LEN; i++)
        cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", &d[i]), 1);
    uint8_t blob[64];
    memset(blob, 0x5a, sizeof blob);
    cr_assert_eq(kw_cache_put(c, d, &info, blob, sizeof blob, false, NULL), 0);
}

#define P1 "aabbccdd11111111111111111111111111111111111111111111111111111111"
#define P2 "aabbccdd22222222222222222222222222222222222222222222222222222222"

/* An ambiguous prefix is the caller's error through kwarmd as with
 * --cache: exit 2, both candidates named, nothing removed. */
Test(cli_socket, an_ambiguous_prefix_exits_2_naming_the_candidates)
{
    kwd d;
    kwc c;
    kwd_init(&d, "kws-ambig");
    kw_cache_opts o = {.dir = d.cache};
    kw_cache *kc = NULL;
    char e[256];
    cr_assert_eq(kw_cache_open(&kc, &o, e, sizeof e), 0, "%s", e);
    put_made_up(kc, P1);
    put_made_up(kc, P2);
    kw_cache_close(kc);
    kwd_start(&d, 1, NULL);
    kwc_must_open(&c, d.sock);
    const char *cmds[][8] = {
        {"evict", "--socket", d.sock, "--digest", "aabbccdd", NULL},
        {"get", "--socket", d.sock, "--digest", "aabbccdd", "-o", "/dev/null", NULL},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL, *err = NULL;
        cr_expect_eq(kw_test_kwarm(cmds[i], &out, &err), 2, "%s: %s",
                     cmds[i][0], err);
        cr_expect(strstr(err, "ambiguous") && strstr(err, P1) && strstr(err, P2) &&
                  strchr(err, '?') == NULL,
                  "%s does not name both candidates: %s", cmds[i][0], err);
        free(out);
        free(err);
    }
    cr_expect_eq(kwc_stat(&c, "entries"), 2, "nothing was removed");
    kwd_down(&d, &c);
}
