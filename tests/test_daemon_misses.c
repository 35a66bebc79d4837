/* test_daemon_misses.c: the miss audit (issue 13 point 6).  A composite
 * config is warmed and pinned; a serving process that read the top-k from
 * the decoy root instead of the text config then asks for a key nobody
 * warmed.  `kwarm misses` must name the field, both values and the pin. */
#include "daemon_util.h"
#include "kw_client.h"

/* Each test's daemons are killed and their directories removed. */
TestSuite(daemon_misses, .fini = kwd_cleanup);

#define DECOY_TOPK 512

/* The composite fixture with a decoy "index_topk" at its root. */
static void write_decoy(const char *dir, char *path, size_t cap)
{
    char src[512];
    snprintf(src, sizeof src, "%s/composite-text-config.json", KW_FIXTURES);
    char *text = kw_test_read_file(src, NULL);
    cJSON *cfg = cJSON_Parse(text);
    cr_assert_not_null(cfg);
    cJSON_AddNumberToObject(cfg, "index_topk", DECOY_TOPK);
    char *out = cJSON_Print(cfg);
    cr_assert_eq(kw_test_write_file(dir, "decoy.json", out, strlen(out), path, cap), 0);
    free(out);
    free(text);
    cJSON_Delete(cfg);
}

Test(daemon_misses, a_key_from_the_wrong_config_level_is_explained)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwm-decoy", 1, NULL, &c);
    char cfg[512];
    write_decoy(d.dir, cfg, sizeof cfg);
    const char *warm[] = {KW_KWARM_BIN, "warmup", "--model", cfg, "--socket", d.sock,
                          "--pin", "composite-v1", "--json", "--quiet", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(warm, &out, &err), 0, "%s", err);
    cJSON *w = cJSON_Parse(out);
    free(out);
    free(err);
    /* The serving process's index_conversion key, with the root's top-k. */
    const cJSON *e, *ic = NULL;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(w, "manifest"))
        if (ic == NULL && strcmp(cJSON_GetStringValue(
                              cJSON_GetObjectItemCaseSensitive(e, "family")),
                          "index_conversion") == 0)
            ic = e;
    cr_assert_not_null(ic);
    const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ic, "digest"));
    const char *ls[] = {KW_KWARM_BIN, "keys", "--model", cfg, "--json", NULL};
    cr_assert_eq(kw_test_run(ls, &out, &err), 0, "%s", err);
    cJSON *keys = cJSON_Parse(out), *fields = NULL;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(keys, "keys"))
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "digest")),
                   hex) == 0)
            fields = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(e, "fields"), 1);
    cr_assert_not_null(fields);
    double warmed_topk = cJSON_GetNumberValue(
        cJSON_GetObjectItemCaseSensitive(fields, "num_topk_tokens"));
    cr_assert_neq(warmed_topk, DECOY_TOPK, "the text config's top-k was warmed");
    cJSON_ReplaceItemInObjectCaseSensitive(fields, "num_topk_tokens",
                                           cJSON_CreateNumber(DECOY_TOPK));
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "family", "index_conversion");
    cJSON_AddItemToObject(g, "fields", fields);
    cJSON_AddStringToObject(g, "arch", "sm_90");
    cJSON_AddBoolToObject(g, "compile", false);
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "the decoy key is not cached");
    kwr_free(&r);
    free(out);
    free(err);
    /* kwarm misses --json explains it. */
    const char *mq[] = {KW_KWARM_BIN, "misses", "--socket", d.sock, "--since", "1h",
                        "--json", NULL};
    cr_assert_eq(kw_test_run(mq, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "%s", out);
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(doc, "count")), 1);
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "misses"), 0);
    const cJSON *near = cJSON_GetObjectItemCaseSensitive(m, "nearest");
    cr_assert(cJSON_IsObject(near), "%s", out);
    const cJSON *diff = cJSON_GetObjectItemCaseSensitive(near, "differ");
    cr_expect_eq(cJSON_GetArraySize(diff), 1, "%s", out);
    const cJSON *d0 = cJSON_GetArrayItem(diff, 0);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d0, "field")),
                     "num_topk_tokens");
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d0, "requested")),
                 DECOY_TOPK);
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d0, "cached")),
                 warmed_topk);
    char *pins = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(near, "pins"));
    cr_expect_str_eq(pins, "[\"composite-v1\"]");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "outcome")),
                     "not compiled");
    free(pins);
    free(out);
    free(err);
    /* The text form says the same in words. */
    const char *mt[] = {KW_KWARM_BIN, "misses", "--socket", d.sock, NULL};
    cr_assert_eq(kw_test_run(mt, &out, &err), 0, "%s", err);
    char want[96];
    snprintf(want, sizeof want, "num_topk_tokens: requested %d, cached %.0f",
             DECOY_TOPK, warmed_topk);
    cr_expect(strstr(out, want) && strstr(out, "pinned by composite-v1"), "%s", out);
    free(out);
    free(err);
    cJSON_Delete(doc);
    cJSON_Delete(g);
    cJSON_Delete(keys);
    cJSON_Delete(w);
    kwd_down(&d, &c);
}

Test(daemon_misses, the_audit_outlives_a_restart)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwm-restart", 1, NULL, &c);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", "00112233445566778899aabbccddeeff"
                                         "00112233445566778899aabbccddeeff");
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "unknown digest");
    kwr_free(&r);
    kwd_down(&d, &c);
    kwd_start(&d, 1, NULL);
    kwc_must_open(&c, d.sock);
    cJSON *q = cJSON_CreateObject();
    kwr m = kwc_call(&c, KW_PROTO_MISSES, q, NULL);
    kwr_expect_type(&m, KW_PROTO_RESULT, "misses after a restart");
    cr_expect_eq(kwr_num(&m, "count"), 1);
    kwr_free(&m);
    cJSON_Delete(q);
    cJSON_Delete(g);
    kwd_down(&d, &c);
}

/* A get that says it is a serving process's miss ("miss": "runtime" or
 * "capture", issue 22) is audited with that kind even when the cache
 * answers it; any other "miss" is refused, naming the member. */
Test(daemon_misses, a_serving_processs_miss_is_audited_even_on_a_hit)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwm-kind", 1, NULL, &c);
    cJSON *get = cJSON_CreateObject();
    cJSON_AddStringToObject(get, "family", "indexer_topk");
    cJSON *f = cJSON_AddObjectToObject(get, "fields");
    cJSON_AddNumberToObject(f, "topk", 2048);
    cJSON_AddTrueToObject(f, "windowed");
    cJSON_AddStringToObject(get, "arch", "sm_90");
    kwr r = kwc_call(&c, KW_PROTO_GET, get, NULL); /* compiles it */
    kwr_expect_type(&r, KW_PROTO_RESULT, "the first get");
    kwr_free(&r);
    cJSON_AddStringToObject(get, "miss", "runtime");
    r = kwc_call(&c, KW_PROTO_GET, get, NULL); /* a hit */
    kwr_expect_type(&r, KW_PROTO_RESULT, "a runtime miss that hits");
    kwr_free(&r);
    cJSON_ReplaceItemInObject(get, "miss", cJSON_CreateString("capture"));
    cJSON_AddFalseToObject(get, "compile");
    r = kwc_call(&c, KW_PROTO_GET, get, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "a capture miss that hits");
    kwr_free(&r);
    cJSON_ReplaceItemInObject(get, "miss", cJSON_CreateString("later"));
    r = kwc_call(&c, KW_PROTO_GET, get, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "an unknown kind of miss");
    char *why = kwr_text(&r);
    cr_assert(strstr(why, "miss") && strstr(why, "runtime"), "%s", why);
    free(why);
    kwr_free(&r);
    cJSON_Delete(get);
    /* The ping after the error answers: the connection is still good. */
    r = kwc_call(&c, KW_PROTO_PING, NULL, NULL);
    kwr_expect_type(&r, KW_PROTO_PONG, "ping after the refused get");
    kwr_free(&r);
    kw_client *kc = NULL;
    cr_assert_eq(kw_client_connect(&kc, d.sock, 5000, NULL, 0), 0);
    char *doc = NULL;
    cr_assert_eq(kw_client_misses(kc, 0, &doc), 0, "%s",
                 kw_client_last_error(kc));
    kw_client_close(kc);
    cJSON *all = cJSON_Parse(doc);
    free(doc);
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(all, "misses");
    int runtime = 0, capture = 0, plain = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, items) {
        const char *kind = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(m, "kind"));
        const char *oc = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(m, "outcome"));
        if (kind && strcmp(kind, "runtime") == 0 && strcmp(oc, "cached") == 0)
            runtime++;
        else if (kind && strcmp(kind, "capture") == 0 &&
                 strcmp(oc, "cached") == 0)
            capture++;
        else if (!kind)
            plain++;
    }
    cr_assert_eq(runtime, 1);
    cr_assert_eq(capture, 1);
    cr_assert_eq(plain, 1, "the first get missed the cache itself");
    cJSON_Delete(all);
    kwd_down(&d, &c);
}
