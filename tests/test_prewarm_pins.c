/* test_prewarm_pins.c: a warm deployment stays warm (issue 12 points 1
 * and 2, through the commands): a prewarm never evicts what it warms, one
 * that cannot fit beside the pinned entries fails before writing, and
 * `--pin NAME` on prewarm and warmup records a pin set.  Compiles are
 * instant (KWARM_TEST_INSTANT_COMPILE, 256-byte stand-in cubins), so
 * deployments of thousands of keys stay fast.
 */
#include "daemon_util.h"

#include "kw_cache.h"

#define V4 KW_FIXTURES "/deepseek-v4-flash.json"
#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"

static char dir[128], cache[200];

static void setup(void)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "pins"), 0);
    snprintf(cache, sizeof cache, "%s/cache", dir);
}

static void teardown(void)
{
    kwd_cleanup();
    kw_test_rmtree(dir);
}


static int kwarm_quiet(const char *const *args)
{
    char *out = NULL, *err = NULL;
    int st = kw_test_kwarm(args, &out, &err);
    if (st != 0)
        cr_log_error("kwarm %s: exit %d: %s", args[0], st, err);
    free(out);
    free(err);
    return st;
}

/* Every digest stored in the cache, as one JSON array of hex strings. */
static int collect(const uint8_t *digest, const kw_cache_info *info, void *arg)
{
    char hex[65];
    (void)info;
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    cJSON_AddItemToArray(arg, cJSON_CreateString(hex));
    return 0;
}

static cJSON *stored(void)
{
    kw_cache *c = NULL;
    kw_cache_opts o = {.dir = cache, .read_only = true};
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    cJSON *all = cJSON_CreateArray();
    cr_assert_eq(kw_cache_foreach(c, collect, all), 0);
    kw_cache_close(c);
    return all;
}

/* The reproduction: a second deployment warmed with a smaller
 * --max-size evicted the first one's entries and its own hits. */
Test(prewarm_pins, a_second_prewarm_evicts_nothing_it_or_the_first_one_warmed,
     .init = setup, .fini = teardown)
{
    const char *a[] = {"prewarm", "--model", V4, "--dcp-world", "8", "--cache",
                       cache, "--quiet", NULL};
    cr_assert_eq(kwarm_quiet(a), 0);
    cJSON *first = stored();
    const char *b[] = {"prewarm", "--model", V32, "--dcp-world", "4", "--dcp-rank",
                       "0", "--cache", cache, "--max-size", "1M", "--json",
                       "--quiet", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(b, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "%s", out);
    cJSON *after = stored();
    /* Everything the first prewarm stored is still there. */
    int kept = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, first) {
        const cJSON *f;
        cJSON_ArrayForEach(f, after) kept += strcmp(e->valuestring, f->valuestring) == 0;
    }
    cr_expect_eq(kept, cJSON_GetArraySize(first), "entries of the first "
                 "deployment were evicted");
    cr_expect_eq(cJSON_GetArraySize(after), cJSON_GetArraySize(first) +
                 (int)cJSON_GetObjectItemCaseSensitive(doc, "compiled")->valuedouble);
    cJSON_Delete(doc);
    cJSON_Delete(first);
    cJSON_Delete(after);
    free(out);
    free(err);
}

Test(prewarm_pins, a_deployment_that_cannot_fit_beside_the_pins_fails_before_writing,
     .init = setup, .fini = teardown)
{
    /* About 3,200 stand-in entries of 256 bytes, pinned, in a 1 MiB cache:
     * the same deployment on another arch cannot fit beside them. */
    const char *big[] = {"prewarm", "--model", V4, "--dcp-world", "512", "--arch",
                         "sm_90", "--cache", cache, "--max-size", "1M", "--pin",
                         "big", "--quiet", NULL};
    cr_assert_eq(kwarm_quiet(big), 0);
    cJSON *before = stored();
    const char *small[] = {"prewarm", "--model", V4, "--dcp-world", "512", "--arch",
                           "sm_100", "--cache", cache, "--quiet", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_kwarm(small, &out, &err), 1);
    cr_expect(strstr(err, "does not fit") && strstr(err, "nothing was written") &&
              strstr(err, "kwarm resize"), "%s", err);
    cJSON *after = stored();
    cr_expect_eq(cJSON_GetArraySize(after), cJSON_GetArraySize(before),
                 "the refused prewarm wrote or evicted entries");
    free(out);
    free(err);
    cJSON_Delete(before);
    cJSON_Delete(after);
    /* Unpinned, the old deployment makes room again: the new one fits
     * by evicting it, never its own entries. */
    const char *unpin[] = {"unpin", "--cache", cache, "big", NULL};
    cr_assert_eq(kwarm_quiet(unpin), 0);
    cr_expect_eq(kwarm_quiet(small), 0);
}

Test(prewarm_pins, pin_on_prewarm_and_on_warmup_records_the_deployment,
     .init = setup, .fini = teardown)
{
    const char *pw[] = {"prewarm", "--model", V32, "--cache", cache, "--pin",
                        "v32-a", "--quiet", NULL};
    cr_assert_eq(kwarm_quiet(pw), 0);
    kwd d;
    kwd_init(&d, "pins-kwd");
    snprintf(d.cache, sizeof d.cache, "%s", cache);
    kwd_start(&d, 2, NULL);
    const char *wu[] = {"warmup", "--model", V32, "--dcp-world", "2", "--socket",
                        d.sock, "--pin", "v32-b", "--json", "--quiet", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(wu, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "pinned")), "%s",
              out);
    double n = cJSON_GetObjectItemCaseSensitive(doc, "keys")->valuedouble;
    cJSON_Delete(doc);
    free(out);
    free(err);
    kwc c;
    kwc_must_open(&c, d.sock);
    kwd_down(&d, &c);
    kw_cache *kc = NULL;
    kw_cache_opts o = {.dir = cache, .read_only = true};
    char e[256];
    cr_assert_eq(kw_cache_open(&kc, &o, e, sizeof e), 0, "%s", e);
    kw_cache_stats st;
    cr_assert_eq(kw_cache_stats_get(kc, &st), 0);
    cr_expect_geq(st.pinned_entries, (uint64_t)n, "the warmup's keys are pinned");
    kw_cache_close(kc);
    const char *pins[] = {"pins", "--cache", cache, NULL};
    cr_assert_eq(kw_test_kwarm(pins, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "v32-a") && strstr(out, "v32-b"), "%s", out);
    free(out);
    free(err);
}
