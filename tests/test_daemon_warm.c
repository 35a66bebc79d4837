/* test_daemon_warm.c: kwarmd's warm pipeline as clients see it (issue 10):
 * a 1,000-key warmup through the C client, the Python client and
 * `kwarm warmup --json`; a compile failure's log reaching the client, the
 * CLI and kwarmd's log; a crashing worker; a compile helper that is
 * missing; heartbeats while one compile runs long.
 */
#include "daemon_util.h"

#include <pthread.h>

#include "kw_client.h"

/* Each test's daemons are killed and their directories removed. */
TestSuite(daemon_warm, .fini = kwd_cleanup);

#define V4 "deepseek-v4-flash.json"
#define V32 "deepseek-v3.2-exp.json"

static void instant(void)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
}

static char *fixture_text(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, name);
    char *s = kw_test_read_file(path, NULL);
    cr_assert_not_null(s, "%s", path);
    return s;
}

/* Checks a whole warmup document: n results in key order, each settled. */
static void expect_manifest(const cJSON *doc, double n, const char *who)
{
    const cJSON *man = cJSON_GetObjectItemCaseSensitive(doc, "manifest");
    cr_assert_eq(cJSON_GetArraySize(man), (int)n, "%s: manifest size", who);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, man) {
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(e, "index");
        cr_expect(cJSON_IsNumber(ix) && ix->valuedouble == i, "%s: order", who);
        i++;
    }
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    cr_expect(cJSON_IsNumber(k) && k->valuedouble == n, "%s: keys", who);
}

Test(daemon_warm, a_1000_key_warmup_completes_through_every_client)
{
    instant();
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-1000", 2, NULL, &c);
    int n = 0;
    { /* how many keys: the deployment's, as kwarmd derives them */
        cJSON *h = kwd_model_hdr(V4, 0);
        cJSON_DeleteItemFromObjectCaseSensitive(h, "deployment");
        cJSON *dep = cJSON_AddObjectToObject(h, "deployment");
        cJSON_AddNumberToObject(dep, "dcp_world", 64);
        cJSON_AddStringToObject(dep, "arch", "sm_90,sm_100");
        kwr r = kwc_call(&c, KW_PROTO_KEYS, h, NULL);
        kwr_expect_type(&r, KW_PROTO_RESULT, "keys");
        n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r.hdr, "keys"));
        cr_assert_gt(n, 1000);
        kwr_free(&r);
        cJSON_Delete(h);
    }
    /* The C client (libkwarm). */
    char *cfg = fixture_text(V4), *res = NULL;
    kw_client *cl = NULL;
    cr_assert_eq(kw_client_connect(&cl, d.sock, 60000, NULL, 0), 0);
    cr_assert_eq(kw_client_warmup(cl, cfg, "{\"dcp_world\": 64, \"arch\": "
                                  "\"sm_90,sm_100\"}", V4, NULL, NULL, &res), 0,
                 "%s", kw_client_last_error(cl));
    cJSON *doc = cJSON_Parse(res);
    expect_manifest(doc, n, "C client");
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(doc, "compiled")->valuedouble, n);
    /* A warmup's lookups count as a get's do: n misses, no hit yet. */
    cr_expect_eq(kwc_stat(&c, "misses"), n);
    cr_expect_eq(kwc_stat(&c, "hits"), 0);
    cJSON_Delete(doc);
    free(res);
    kw_client_close(cl);
    /* kwarm warmup --json: one document, assembled by the CLI. */
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V4);
    const char *argv[] = {KW_KWARM_BIN, "warmup", "--model", path, "--dcp-world",
                          "64", "--arch", "sm_90,sm_100", "--socket", d.sock,
                          "--json", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "not one JSON document: %.200s", out);
    expect_manifest(doc, n, "kwarm warmup --json");
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(doc, "hits")->valuedouble, n);
    cr_expect_eq(kwc_stat(&c, "hits"), n, "the second warmup's hits counted");
    cr_expect_eq(kwc_stat(&c, "misses"), n);
    cJSON_Delete(doc);
    free(out);
    free(err);
    /* The Python client (standard library only). */
    char script[2048];
    snprintf(script, sizeof script,
             "import json, sys; sys.path.insert(0, '%s/../../client/python');"
             "import kwarm_client as k; c = k.Client('%s');"
             "r = c.warmup(json.load(open('%s')), {'dcp_world': 64, 'arch': "
             "'sm_90,sm_100'});"
             "assert [m['index'] for m in r['manifest']] == list(range(r['keys']));"
             "print(r['keys'], r['hits'], len(r['manifest']))",
             KW_FIXTURES, d.sock, path);
    const char *py[] = {"python3", "-c", script, NULL};
    cr_assert_eq(kw_test_run(py, &out, &err), 0, "python: %s", err);
    char want[64];
    snprintf(want, sizeof want, "%d %d %d\n", n, n, n);
    cr_expect_str_eq(out, want);
    free(out);
    free(err);
    free(cfg);
    kwd_down(&d, &c);
}

/* ---- progress -------------------------------------------------------------- */

/* Runs argv (stderr a pipe, not a terminal); returns its stderr and
 * stores the "keys" of its JSON document in *keys. */
static char *stderr_of(const char *const *argv, int *keys)
{
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s: %s", argv[1], err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc, "%s: %.200s", argv[1], out);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    cr_assert(cJSON_IsNumber(k) && k->valuedouble > 0, "%s: keys", argv[1]);
    *keys = (int)k->valuedouble;
    cJSON_Delete(doc);
    free(out);
    return err;
}

Test(daemon_warm, progress_lines_go_to_stderr_unless_quiet)
{
    instant();
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-progress", 2, NULL, &c);
    char path[512], cache[512], want[64];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V32);
    snprintf(cache, sizeof cache, "%s/prewarm-cache", d.dir);
    const char *warm[] = {KW_KWARM_BIN, "warmup", "--model", path, "--socket",
                          d.sock, "--json", NULL, NULL};
    const char *pre[] = {KW_KWARM_BIN, "prewarm", "--model", path, "--cache",
                         cache, "--json", NULL, NULL};
    const char *const *cmds[] = {warm, pre};
    for (int q = 0; q < 2; q++) {
        for (int k = 0; k < 2; k++) {
            const char **argv = (const char **)cmds[k];
            argv[7] = q ? "--quiet" : NULL;
            int n = 0;
            char *err = stderr_of(argv, &n);
            snprintf(want, sizeof want, "%s: %d/%d keys settled (", argv[1],
                     n, n);
            if (q)
                cr_expect(strstr(err, "keys settled") == NULL,
                          "%s --quiet printed progress: %s", argv[1], err);
            else
                cr_expect(strstr(err, want) != NULL, "%s: no final progress "
                          "line \"%s\" in: %s", argv[1], want, err);
            free(err);
        }
    }
    kwd_down(&d, &c);
}

/* ---- failures carry their reason ------------------------------------------ */

Test(daemon_warm, a_failed_compile_reaches_the_client_the_cli_and_the_log)
{
    /* The workers fail every prefill_chunk_metadata key with a log, as a
     * failed NVRTC compile does (the hook: warm/pool.h). */
    instant();
    cr_assert_eq(setenv("KWARM_TEST_FAIL_FAMILY", "prefill_chunk_metadata", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-fail", 2, NULL, &c);
    /* An arch NVRTC cannot build is refused before any work, by kwarm and
     * by kwarmd itself (issue 24). */
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V32);
    const char *argv[] = {KW_KWARM_BIN, "warmup", "--model", path, "--arch",
                          "sm_35", "--socket", d.sock, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_run(argv, &out, &err), 2, "%s", err);
    cr_expect(strstr(err, "--arch sm_35") != NULL, "%s", err);
    free(out);
    free(err);
    cJSON *h = kwd_model_hdr(V32, 0);
    cJSON_DeleteItemFromObjectCaseSensitive(h, "deployment");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(h, "deployment"), "arch",
                            "sm_35");
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, h, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "warmup for sm_35");
    cr_expect(strstr(kwr_str(&r, "error"), "/arch: sm_35") != NULL, "%s",
              kwr_str(&r, "error"));
    kwr_free(&r);
    cJSON_Delete(h);
    /* The streamed result itself carries "error" and "log". */
    h = kwd_model_hdr(V32, 0);
    r = kwc_call(&c, KW_PROTO_WARMUP, h, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
    const cJSON *first = NULL, *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(r.hdr, "manifest"))
        if (first == NULL && strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
                                        e, "status")), "failed") == 0)
            first = e;
    cr_assert_not_null(first, "no failed key");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(first, "family")),
                     "prefill_chunk_metadata");
    const char *log = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(first, "log"));
    cr_assert(log != NULL && strstr(log, "KWARM_TEST_FAIL_FAMILY\n(a test hook") != NULL,
              "result log: %s", log ? log : "(none)");
    cr_expect(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(first, "error")) != NULL);
    cr_expect(kwr_num(&r, "failed") > 0 && kwr_num(&r, "failed") < kwr_num(&r, "keys"));
    char dg16[17] = "", line[61];
    const char *dg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(first, "digest"));
    cr_assert(dg != NULL && strlen(dg) == 64);
    memcpy(dg16, dg, 16);
    snprintf(line, sizeof line, "%.*s", (int)strcspn(log, "\n"), log);
    kwr_free(&r);
    cJSON_Delete(h);
    /* kwarmd's log: one line with the digest and the log's first line. */
    kwd_down(&d, &c);
    char *text = kwd_log(d.log);
    cr_expect(strstr(text, dg16) != NULL && strstr(text, "failed: ") != NULL &&
                  strstr(text, line) != NULL,
              "kwarmd's log lacks %s and the compile log's first line '%s': %s",
              dg16, line, text);
    free(text);
}

Test(daemon_warm, a_crashing_worker_fails_its_keys_and_kwarmd_serves_on)
{
    instant();
    cr_assert_eq(setenv("KWARM_TEST_CRASH_FAMILY", "dcp_stable_topk", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-crash", 2, NULL, &c);
    cJSON *h = kwd_model_hdr(V32, 2);
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, h, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
    cr_expect_gt(kwr_num(&r, "failed"), 0);
    cr_expect_gt(kwr_num(&r, "compiled"), 0);
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(r.hdr, "manifest")) {
        const char *fam = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "family"));
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "status"));
        bool crashes = strcmp(fam, "dcp_stable_topk") == 0;
        cr_expect_str_eq(st, crashes ? "failed" : "compiled", "%s", fam);
        if (crashes) {
            const char *log = cJSON_GetStringValue(
                cJSON_GetObjectItemCaseSensitive(e, "log"));
            cr_expect(log && strstr(log, "crash"), "log: %s", log ? log : "");
        }
    }
    kwr_free(&r);
    /* kwarm warmup and kwarm prewarm print each failure with its log. */
    char path[512], cache[600];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V32);
    snprintf(cache, sizeof cache, "%s/pw", d.dir);
    const char *const runs[][12] = {
        {KW_KWARM_BIN, "warmup", "--model", path, "--dcp-world", "2",
         "--socket", d.sock, NULL},
        {KW_KWARM_BIN, "prewarm", "--model", path, "--dcp-world", "2",
         "--cache", cache, "--jobs", "2", NULL}};
    for (size_t i = 0; i < 2; i++) {
        char *out = NULL, *err = NULL;
        cr_expect_eq(kw_test_run(runs[i], &out, &err), 1, "%s", err);
        cr_expect(strstr(err, "dcp_stable_topk") != NULL &&
                  strstr(err, " failed: ") != NULL && strstr(err, "crash"),
                  "%s: the failure and its log are not on stderr: %s",
                  runs[i][1], err);
        free(out);
        free(err);
    }
    kwc_expect_pong(&c, "after worker crashes");
    cJSON *h0 = kwd_model_hdr(V32, 0);
    r = kwc_call(&c, KW_PROTO_WARMUP, h0, NULL);
    cJSON_Delete(h0);
    kwr_expect_type(&r, KW_PROTO_RESULT, "a warmup after the crashes");
    cr_expect_eq(kwr_num(&r, "failed"), 0);
    kwr_free(&r);
    cJSON_Delete(h);
    kwd_down(&d, &c);
}

/* What a warmup's PROGRESS frames looked like to the client. */
typedef struct beats {
    size_t frames, empty; /* frames, and those with no results */
    double last_done, total;
    bool went_back;       /* "done" decreased */
    bool bad;             /* a frame was not JSON or had no results array */
    int64_t last_ms, max_gap_ms;
} beats;

/* kw_client's progress callback; it may run on a thread of the test, so
 * it records rather than asserts. */
static void count_beats(const char *json, void *arg)
{
    beats *b = arg;
    cJSON *p = cJSON_Parse(json);
    double done = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p, "done"));
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(p, "results");
    if (!cJSON_IsArray(res)) {
        b->bad = true;
        cJSON_Delete(p);
        return;
    }
    b->frames++;
    b->empty += cJSON_GetArraySize(res) == 0;
    b->went_back |= done < b->last_done;
    b->last_done = done;
    b->total = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p, "total"));
    int64_t now = kwd_now_ms();
    if (now - b->last_ms > b->max_gap_ms)
        b->max_gap_ms = now - b->last_ms;
    b->last_ms = now;
    cJSON_Delete(p);
}

/* One client: its warmup through kw_client, 4 s per wait (may run on a
 * thread of the test: it records, the test asserts). */
typedef struct beat_client {
    const char *sock, *cfg;
    int rc;
    double failed;
    beats b;
    char err[256];
} beat_client;

static void *beat_main(void *arg)
{
    beat_client *w = arg;
    kw_client *cl = NULL;
    char *out = NULL;
    w->b.last_ms = kwd_now_ms();
    w->rc = kw_client_connect(&cl, w->sock, 4000, w->err, sizeof w->err);
    if (w->rc == 0)
        w->rc = kw_client_warmup(cl, w->cfg, "{\"dcp_world\": 2}", V32,
                                 count_beats, &w->b, &out);
    if (w->rc < 0 && cl != NULL)
        snprintf(w->err, sizeof w->err, "%s", kw_client_last_error(cl));
    cJSON *doc = out ? cJSON_Parse(out) : NULL;
    w->failed = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(doc, "failed"));
    cJSON_Delete(doc);
    free(out);
    kw_client_close(cl);
    return NULL;
}

/* kwarmd (d, c) whose dcp_stable_topk compiles hang until a 6 s compile
 * timeout kills them; the other keys compile at once. */
static void hung_daemon(kwd *d, kwc *c, const char *tag)
{
    instant();
    cr_assert_eq(setenv("KWARM_TEST_HANG_FAMILY", "dcp_stable_topk", 1), 0);
    kwd_up(d, tag, 2, (const char *const[]){"--compile-timeout", "6", NULL}, c);
}

/* What client i of a hung daemon must have seen: its result with the hung
 * key failed, at least 2 heartbeats, no wait of 4 s, counts that never go
 * back, the deployment's key count. */
static void expect_beats(const beat_client *w, int i, double keys)
{
    cr_expect_eq(w->rc, 0, "client %d: %s", i, w->err);
    cr_expect_eq(w->failed, 1, "client %d: the hung key", i);
    cr_expect_geq(w->b.empty, 2, "client %d: %zu heartbeats in %zu frames", i,
                  w->b.empty, w->b.frames);
    cr_expect_lt(w->b.max_gap_ms, 4000, "client %d", i);
    cr_expect_not(w->b.went_back, "client %d: \"done\" went back", i);
    cr_expect_not(w->b.bad, "client %d: a frame without a results array", i);
    cr_expect_eq(w->b.total, keys, "client %d", i);
}

/* One key's compile hangs until --compile-timeout (6 s) kills it, while
 * the client bounds each wait at 4 s: only the heartbeats, every 2 to
 * 2.5 s, keep its waits short.  Their counts never go back. */
Test(daemon_warm, heartbeats_keep_a_client_with_a_per_wait_timeout_through_a_long_compile)
{
    kwd d;
    kwc c;
    hung_daemon(&d, &c, "kwd-beat");
    char *cfg = fixture_text(V32);
    beat_client w = {.sock = d.sock, .cfg = cfg};
    int64_t t0 = kwd_now_ms();
    beat_main(&w);
    cr_expect_geq(kwd_now_ms() - t0, 6000, "the compile was not held 6 s");
    expect_beats(&w, 0, kwd_count_keys(V32, 2));
    free(cfg);
    /* kwarm warmup, waiting at most 4 s a frame: the hung key fails (exit
     * 1), but the wait never gives up. */
    char path[512], *out = NULL, *err = NULL;
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V32);
    const char *argv[] = {KW_KWARM_BIN, "warmup", "--model", path, "--dcp-world",
                          "2", "--socket", d.sock, "--wait-timeout", "4", NULL};
    cr_expect_eq(kw_test_run(argv, &out, &err), 1, "%s", err);
    cr_expect(strstr(err, "dcp_stable_topk") != NULL, "%s", err);
    cr_expect(strstr(err, "looks stuck") == NULL, "%s", err);
    free(out);
    free(err);
    kwd_down(&d, &c);
}

/* 100 clients on 3 serving loops wait on the same hung compile (one
 * compile for all: single flight), each bounding its waits at 4 s: every
 * one gets its heartbeats and its result. */
#define NBEAT 100
Test(daemon_warm, heartbeats_reach_100_clients_waiting_on_one_hung_compile)
{
    kwd d;
    kwc c;
    hung_daemon(&d, &c, "kwd-beats");
    char *cfg = fixture_text(V32);
    beat_client *w = calloc(NBEAT, sizeof *w);
    pthread_t th[NBEAT];
    cr_assert_not_null(w);
    for (int i = 0; i < NBEAT; i++) {
        w[i].sock = d.sock;
        w[i].cfg = cfg;
        cr_assert_eq(pthread_create(&th[i], NULL, beat_main, &w[i]), 0);
    }
    for (int i = 0; i < NBEAT; i++)
        pthread_join(th[i], NULL);
    double keys = kwd_count_keys(V32, 2);
    for (int i = 0; i < NBEAT; i++)
        expect_beats(&w[i], i, keys);
    cr_expect_eq(kwc_stat(&c, "compiles_started"), keys, "one compile a key");
    free(w);
    free(cfg);
    kwd_down(&d, &c);
}

/* A kwarmd that sends nothing (stopped by SIGSTOP) makes kwarm warmup give
 * up after --wait-timeout, saying so; the flag's bounds are [1, 86400]. */
Test(daemon_warm, warmup_gives_up_on_a_silent_kwarmd_after_wait_timeout)
{
    instant();
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-stuck", 2, NULL, &c);
    char path[512], *out = NULL, *err = NULL;
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V32);
    const char *argv[] = {KW_KWARM_BIN, "warmup", "--model", path, "--socket",
                          d.sock, "--wait-timeout", "2", NULL};
    cr_assert_eq(kill(d.pid, SIGSTOP), 0);
    int64_t t0 = kwd_now_ms();
    int st = kw_test_run(argv, &out, &err);
    int64_t ms = kwd_now_ms() - t0;
    cr_assert_eq(kill(d.pid, SIGCONT), 0);
    cr_expect_eq(st, 1, "%s", err);
    cr_expect(strstr(err, "sent nothing for 2 s") != NULL, "%s", err);
    cr_expect(ms >= 2000 && ms < 30000, "gave up after %lld ms", (long long)ms);
    free(out);
    free(err);
    static const char *const bad[] = {"0", "86401", "1.5", "-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        argv[7] = bad[i];
        cr_expect_eq(kw_test_run(argv, &out, &err), 2, "%s: %s", bad[i], err);
        cr_expect(strstr(err, "--wait-timeout") != NULL, "%s", err);
        free(out);
        free(err);
    }
    argv[7] = "86400"; /* the cap itself: the warmup runs */
    cr_expect_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    kwd_down(&d, &c);
}

Test(daemon_warm, a_missing_compile_helper_stops_kwarmd_at_start_with_exit_1)
{
    kwd d;
    kwd_init(&d, "kwd-nohelper");
    const char *bad[][2] = {{"--compile-helper", "/nonexistent/kwarm-compile"},
                            {"--compile-helper", "/etc/hostname"}};
    for (size_t i = 0; i < 2; i++) {
        const char *args[] = {"--socket", d.sock, "--cache", d.cache,
                              bad[i][0], bad[i][1], NULL};
        pid_t pid = kwd_spawn(&d, args, d.log);
        int st = 0;
        cr_assert(kwd_wait_exit(pid, 10000, &st), "kwarmd hung without a helper");
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
    }
    char *log = kwd_log(d.log);
    cr_expect(strstr(log, "/nonexistent/kwarm-compile") != NULL, "%s", log);
    cr_expect(strstr(log, "/etc/hostname") != NULL, "%s", log);
    free(log);
}
