/* test_daemon_alloc.c: every allocation of a request fails once (issue
 * 23), SQLite-style: a hook in kwarmd (KWARMD_TEST_ALLOC_HOOK) fails the
 * N-th allocation made through kw_malloc and cJSON from the start of a
 * request that asks so ("test_fail_alloc": N), and a loop runs the
 * request for N = 1, 2, ... until its allocations are all passed.  Each
 * time the request ends with one final frame (its RESULT, or an ERROR),
 * or its connection closes; never a hang, and kwarmd serves on.  The same
 * for the allocations of a SIGTERM (KWARMD_TEST_ALLOC_AT_STOP).  Under
 * ASan (the sanitizer build) kwd_stop() also finds every leak.
 */
#include "daemon_util.h"

TestSuite(alloc, .fini = kwd_cleanup, .timeout = 600);

#define V32 "deepseek-v3.2-exp.json"
#define MAX_N 20000 /* a request with more allocations fails the test */

/* Reads frames until the final one (0: its type in *type), or the end of
 * the connection (KWC_EOF or a reset). */
static int final_frame(kwc *c, uint16_t *type)
{
    for (;;) {
        kwr r;
        int rc = kwc_recv(c, &r, 10000);
        if (rc != 0)
            return rc;
        *type = r.type;
        kwr_free(&r);
        if (*type != KW_PROTO_PROGRESS)
            return 0;
    }
}

/* A PING on c (reopened first when closed): true when the last armed
 * request's failure happened. */
static bool fired(kwc *c, const char *sock)
{
    if (c->fd < 0)
        kwc_must_open(c, sock);
    kwr r = kwc_call(c, KW_PROTO_PING, NULL, NULL);
    kwr_expect_type(&r, KW_PROTO_PONG, "ping after a failed allocation");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(r.hdr, "alloc_fired");
    cr_assert(cJSON_IsBool(f), "PONG without alloc_fired: hook not enabled");
    bool yes = cJSON_IsTrue(f);
    kwr_free(&r);
    return yes;
}

/* Runs request type with hdr (NULL: {}) for N = 1, 2, ... until no
 * allocation is left to fail; returns how many were. */
static size_t fault_loop(const kwd *d, uint16_t type, const cJSON *hdr,
                         uint16_t want)
{
    kwc c;
    kwc_must_open(&c, d->sock);
    size_t n = 1;
    for (; n < MAX_N; n++) {
        cJSON *h = hdr ? cJSON_Duplicate(hdr, 1) : cJSON_CreateObject();
        cJSON_AddNumberToObject(h, "test_fail_alloc", (double)n);
        cr_assert_eq(kwc_send(&c, type, h), 0);
        cJSON_Delete(h);
        uint16_t t = 0;
        int rc = final_frame(&c, &t);
        cr_assert(rc == 0 || rc == KWC_EOF || rc == -ECONNRESET,
                  "%s, allocation %zu failed: no final frame (%d)",
                  kw_proto_type_name(type), n, rc);
        if (rc == 0)
            cr_assert(t == want || t == KW_PROTO_ERROR, "%s, allocation %zu "
                      "failed: final frame %s", kw_proto_type_name(type), n,
                      kw_proto_type_name(t));
        else
            kwc_close(&c); /* closed: fine, the next request reconnects */
        if (!fired(&c, d->sock))
            break;
    }
    cr_assert(n < MAX_N, "%s: still failing after %d", kw_proto_type_name(type),
              MAX_N);
    /* The last run failed nothing: it must be the whole reply. */
    kwc_close(&c);
    return n - 1;
}

static void up(kwd *d, const char *tag)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "64", 1), 0);
    cr_assert_eq(setenv("KWARMD_TEST_ALLOC_HOOK", "1", 1), 0);
    kwd_init(d, tag);
    kwd_start(d, 1, NULL);
    cr_assert_eq(unsetenv("KWARMD_TEST_ALLOC_HOOK"), 0);
}

Test(alloc, every_allocation_of_a_request_can_fail_and_kwarmd_serves_on)
{
    kwd d;
    up(&d, "kwa-req");
    cJSON *warm = kwd_model_hdr(V32, 2);
    cJSON *doc = kwd_kwarm_keys(V32, 2);
    const cJSON *k0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "keys"), 0);
    cJSON *get = cJSON_CreateObject();
    cJSON_AddItemToObject(get, "family", cJSON_Duplicate(
        cJSON_GetObjectItemCaseSensitive(k0, "family"), 1));
    cJSON_AddItemToObject(get, "fields", cJSON_Duplicate(
        cJSON_GetObjectItemCaseSensitive(k0, "fields"), 1));
    cJSON_AddStringToObject(get, "arch", "sm_90");
    size_t nw = fault_loop(&d, KW_PROTO_WARMUP, warm, KW_PROTO_RESULT);
    size_t ng = fault_loop(&d, KW_PROTO_GET, get, KW_PROTO_RESULT);
    size_t nk = fault_loop(&d, KW_PROTO_KEYS, warm, KW_PROTO_RESULT);
    size_t nl = fault_loop(&d, KW_PROTO_LS, NULL, KW_PROTO_RESULT);
    cr_log_info("allocations failed one by one: warmup %zu, get %zu, keys "
                "%zu, ls %zu", nw, ng, nk, nl);
    cr_expect(nw > 10 && ng > 0 && nk > 10 && nl > 0, "the hook did not fire");
    cJSON_Delete(get);
    cJSON_Delete(doc);
    cJSON_Delete(warm);
    kwc c;
    kwc_must_open(&c, d.sock);
    kwc_expect_pong(&c, "after every failure");
    kwd_down(&d, &c);
}

/* SIGTERM with a warmup under way, the N-th allocation after the signal
 * failing: kwarmd exits 0 within 5 s every time (and leaks nothing,
 * under ASan). */
Test(alloc, every_allocation_of_a_sigterm_can_fail)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "64", 1), 0);
    cJSON *warm = kwd_model_hdr(V32, 2);
    size_t n = 1;
    for (; n < 400; n++) {
        char v[32];
        snprintf(v, sizeof v, "%zu", n);
        cr_assert_eq(setenv("KWARMD_TEST_ALLOC_AT_STOP", v, 1), 0);
        kwd d;
        kwc c;
        kwd_init(&d, "kwa-stop");
        kwd_start(&d, 1, NULL);
        kwc_must_open(&c, d.sock);
        cr_assert_eq(kwc_send(&c, KW_PROTO_WARMUP, warm), 0);
        cr_assert_eq(kill(d.pid, SIGTERM), 0);
        kwd_expect_exit0(&d, 5000);
        char *log = kwd_log(d.log);
        bool hit = strstr(log, "test hook: fired") != NULL;
        free(log);
        kwc_close(&c);
        kwd_forget(&d);
        if (!hit)
            break;
    }
    cr_assert_eq(unsetenv("KWARMD_TEST_ALLOC_AT_STOP"), 0);
    cr_log_info("allocations of a stop failed one by one: %zu", n - 1);
    cr_expect(n < 400, "the stop still allocates after 400");
    cJSON_Delete(warm);
}
