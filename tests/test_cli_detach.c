/* test_cli_detach.c: kwarm warmup --detach (issue 24 point 4): kwarmd goes
 * on warming after the client leaves, against a real kwarmd with real
 * compiles (one worker, so the client is gone long before the last). */
#include "daemon_util.h"

TestSuite(cli_detach, .fini = kwd_cleanup, .timeout = 300);

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"

Test(cli_detach, a_detached_warmup_goes_on_after_the_client_leaves)
{
    cr_assert_eq(unsetenv("KWARM_TEST_INSTANT_COMPILE"), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwdt-go", 1, NULL, &c);
    int n = kwd_count_keys("deepseek-v3.2-exp.json", 0);
    const char *args[] = {"warmup", "--detach", "--json", "--model", V32,
                          "--socket", d.sock, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_kwarm(args, &out, &err);
    cr_assert_eq(st, 0, "kwarm warmup --detach: exit %d: %s", st, err);
    cJSON *first = cJSON_Parse(out);
    cr_assert_not_null(first, "%s", out);
    cr_expect_eq(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(first, "total")),
                 n, "%s", out);
    cJSON_Delete(first);
    free(out);
    free(err);
    /* The client has exited; one worker compiles a key at a time, so the
     * deployment is not warm yet.  c is opened again: kwarmd closes a
     * connection idle for --idle-timeout, which a slow (ASan) run of the
     * client can pass. */
    kwc_close(&c);
    kwc_must_open(&c, d.sock);
    cr_expect_lt(kwc_stat(&c, "compiles"), n, "the warmup ended before the "
                 "client left: this test proves nothing");
    /* Nothing else asks for these keys: kwarmd's one line for the warmup
     * (written when its last key settles) says what came of them.  A
     * client that left a warmup without --detach has its keys cancelled. */
    char want[160], *line = NULL;
    snprintf(want, sizeof want, "%d keys: 0 hits, 0 remote hits, %d compiled, "
             "0 failed, 0 cancelled", n, n);
    int64_t deadline = kwd_now_ms() + 240000;
    char *log = NULL;
    while (line == NULL && kwd_now_ms() < deadline) {
        free(log);
        log = kwd_log(d.log);
        line = strstr(log, "info: warmup from uid");
        if (line == NULL)
            kwd_nap_ms(20); /* polls the log for the line, bounded */
    }
    cr_assert_not_null(line, "no warmup line in kwarmd's log:\n%s", log);
    cr_expect(strstr(line, want) != NULL, "want \"%s\": %.300s", want, line);
    free(log);
    kwc_close(&c); /* idle through the wait, as above */
    kwc_must_open(&c, d.sock);
    cr_expect_eq(kwc_stat(&c, "compiles"), n);
    cr_expect_eq(kwc_stat(&c, "cancelled"), 0);
    kwd_down(&d, &c);
}

/* "detach" is a boolean; anything else is refused before any work. */
Test(cli_detach, detach_must_be_a_boolean)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwdt-bad", 1, NULL, &c);
    cJSON *hdr = kwd_model_hdr("deepseek-v3.2-exp.json", 0);
    cJSON_AddStringToObject(hdr, "detach", "yes");
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, hdr, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "\"detach\": \"yes\"");
    cr_expect(strstr(kwr_str(&r, "error"), "detach") != NULL, "%s",
              kwr_str(&r, "error"));
    kwr_free(&r);
    cr_expect_eq(kwc_stat(&c, "warm_keys"), 0, "keys were submitted");
    cJSON_Delete(hdr);
    kwd_down(&d, &c);
}
