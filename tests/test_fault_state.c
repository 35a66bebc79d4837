/* test_fault_state.c: what a cache says survives its writers' faults
 * (issue 24, "Done when" 3).  crash_counters: a `kwarm prewarm` killed by
 * SIGKILL or by Ctrl-C (SIGINT) half-way, and a kwarmd killed
 * mid-warmup, leave entries == compiles on a fresh cache.
 * prewarm_claims: two prewarms of one deployment on one cache, with no
 * kwarmd, compile each key once between them, also when one of them is
 * killed holding claims; without a claims file they still work.
 *
 * Compiles are instant (KWARM_TEST_INSTANT_COMPILE) except those of one
 * family, which hang (KWARM_TEST_HANG_FAMILY), so a run is always "half
 * way" when every other key is stored: the test waits for that count in
 * the cache itself (polling the entry count, bounded), then kills.
 */
#include "daemon_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_test_util.h"

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"
#define HANG "indexer_logits" /* 2 of V32's 26 default keys */
#define POLL_MS 60000

static char tmpdir[64], cache[256];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(tmpdir, sizeof tmpdir, "crashcnt"), 0);
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    cr_assert_eq(setenv("KWARM_TEST_HANG_FAMILY", HANG, 1), 0);
}

static void teardown(void)
{
    kwd_cleanup();
    kw_test_rmtree(tmpdir);
}

/* The digest of a key of `kwarm keys --json`, into d. */
static void digest_of(const cJSON *k, uint8_t *d)
{
    const char *hex = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(k, "digest"));
    cr_assert(hex != NULL && strlen(hex) == 2 * KW_CACHE_DIGEST_LEN);
    for (int i = 0; i < KW_CACHE_DIGEST_LEN; i++)
        cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", &d[i]), 1);
}

/* Keys of V32's default deployment, and those of the hanging family;
 * first (may be NULL) gets the first key's digest. */
static void count_keys_first(long *all, long *hang, uint8_t *first)
{
    const char *args[] = {"keys", "--model", V32, "--json", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(args, &out, &err), 0, "kwarm keys: %s", err);
    cJSON *doc = cJSON_Parse(out);
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(doc, "keys"), *k;
    *all = *hang = 0;
    cJSON_ArrayForEach(k, keys) {
        const char *fam = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(k, "family"));
        if (first != NULL && *all == 0)
            digest_of(k, first);
        (*all)++;
        *hang += fam != NULL && strcmp(fam, HANG) == 0;
    }
    cJSON_Delete(doc);
    free(out);
    free(err);
    cr_assert(*hang > 0 && *hang < *all);
}

static void count_keys(long *all, long *hang)
{
    count_keys_first(all, hang, NULL);
}

/* The cache's statistics through a read-only handle; entries 0 while
 * the cache does not exist yet. */
static kw_cache_stats stats_of(const char *dir)
{
    kw_cache_opts o = {.dir = dir, .read_only = true};
    kw_cache *c = NULL;
    kw_cache_stats st = {0};
    char err[256];
    if (access(dir, F_OK) == 0 && kw_cache_open(&c, &o, err, sizeof err) == 0) {
        cr_assert_eq(kw_cache_stats_get(c, &st), 0);
        kw_cache_close(c);
    }
    return st;
}

/* Polls dir's entry count (every 20 ms, at most POLL_MS) until it is n;
 * fails the test if pid exits first or the time runs out. */
static void wait_entries(const char *dir, uint64_t n, pid_t pid)
{
    int64_t deadline = kwd_now_ms() + POLL_MS;
    while (stats_of(dir).entries < n) {
        int ws;
        cr_assert_neq(waitpid(pid, &ws, WNOHANG), pid,
                      "the writer exited (0x%x) before storing %llu entries",
                      ws, (unsigned long long)n);
        cr_assert_lt(kwd_now_ms(), deadline, "%llu entries never came",
                     (unsigned long long)n);
        kwd_nap_ms(20);
    }
}

/* Forks and execs kwarm with args, stdout to /dev/null and stderr to
 * errpath (NULL: /dev/null); returns its pid. */
static pid_t spawn_kwarm_err(const char *const *args, const char *errpath)
{
    const char *argv[24] = {KW_KWARM_BIN};
    size_t n = 1;
    for (; args[n - 1] != NULL && n < 23; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (freopen("/dev/null", "w", stdout) == NULL ||
            freopen(errpath ? errpath : "/dev/null", "w", stderr) == NULL)
            _exit(127);
        execv(KW_KWARM_BIN, (char *const *)argv);
        _exit(127);
    }
    kwd_track(pid, true);
    return pid;
}

static pid_t spawn_kwarm(const char *const *args)
{
    return spawn_kwarm_err(args, NULL);
}

/* Sends sig to pid and reaps it; it must die of that signal or, for a
 * SIGINT it handles, exit non-zero. */
static void kill_and_reap(pid_t pid, int sig)
{
    int ws;
    cr_assert_eq(kill(pid, sig), 0);
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    kwd_track(pid, false);
    cr_assert((WIFSIGNALED(ws) && WTERMSIG(ws) == sig) ||
                  (WIFEXITED(ws) && WEXITSTATUS(ws) != 0),
              "the writer ended before it was killed (0x%x)", ws);
}

/* Counters of a fresh cache whose writer died with `stored` entries. */
static void expect_agree(const char *dir, long stored)
{
    kw_cache_stats st = stats_of(dir);
    cr_expect_eq(st.entries, (uint64_t)stored);
    cr_expect_eq(st.compiles, st.entries, "%llu compiles for %llu entries",
                 (unsigned long long)st.compiles,
                 (unsigned long long)st.entries);
    /* every stored key was a miss first, counted before its put */
    cr_expect_geq(st.misses, st.entries);
    cr_expect_eq(st.compile_failures, 0);
}

/* A prewarm killed by sig once every key but the hanging ones is stored;
 * returns its stderr (free it). */
static char *prewarm_killed(int sig, long *all, long *hang)
{
    count_keys(all, hang);
    char errpath[200];
    snprintf(errpath, sizeof errpath, "%s/stderr", tmpdir);
    const char *args[] = {"prewarm", "--model", V32, "--cache", cache,
                          "--jobs", "3", "--compile-timeout", "600", NULL};
    pid_t pid = spawn_kwarm_err(args, errpath);
    wait_entries(cache, (uint64_t)(*all - *hang), pid);
    kill_and_reap(pid, sig);
    expect_agree(cache, *all - *hang);
    char *err = kw_test_read_file(errpath, NULL);
    return err ? err : strdup("");
}

Test(crash_counters, prewarm_sigkilled_half_way_has_a_compile_per_entry,
     .init = setup, .fini = teardown, .timeout = 120)
{
    long all, hang;
    free(prewarm_killed(SIGKILL, &all, &hang));
}

/* Ctrl-C: the counters agree, and the last line says the prewarm was
 * interrupted, with its counts; its workers, whose pool went away, say
 * nothing (no "malformed request frame"), and nothing has a journald
 * prefix off journald (issue 24). */
Test(crash_counters, prewarm_interrupted_half_way_says_so_and_has_a_compile_per_entry,
     .init = setup, .fini = teardown, .timeout = 120)
{
    long all, hang;
    cr_assert_eq(unsetenv("JOURNAL_STREAM"), 0);
    char *err = prewarm_killed(SIGINT, &all, &hang);
    char want[200];
    snprintf(want, sizeof want, "kwarm prewarm: interrupted (SIGINT): %ld of "
             "%ld keys settled (%ld compiled, 0 hits, 0 failed), %ld "
             "cancelled; ", all - hang, all, all - hang, hang);
    cr_expect(strstr(err, want) != NULL, "no \"%s\" in: %s", want, err);
    cr_expect(strstr(err, "malformed") == NULL, "%s", err);
    cr_expect(strstr(err, "<3>") == NULL && strstr(err, "<4>") == NULL, "%s",
              err);
    free(err);
}

/* A kwarmd (d) whose warmup of V32 stored every key but the hanging
 * ones, which it holds on its workers; returns the warmup client's pid. */
static pid_t hung_warmup(kwd *d, const char *tag, long all, long hang)
{
    kwd_init(d, tag);
    kwd_start(d, 3, (const char *const[]){"--compile-timeout", "600", NULL});
    const char *args[] = {"warmup", "--model", V32, "--socket", d->sock,
                          "--quiet", NULL};
    pid_t client = spawn_kwarm(args);
    wait_entries(d->cache, (uint64_t)(all - hang), d->pid);
    return client;
}

/* SIGKILLs the kwarmd of hung_warmup() and reaps its client. */
static void kill_kwarmd(kwd *d, pid_t client)
{
    kill_and_reap(d->pid, SIGKILL);
    d->pid = 0;
    int ws;
    cr_assert_eq(waitpid(client, &ws, 0), client); /* its daemon is gone */
    kwd_track(client, false);
}

Test(crash_counters, kwarmd_sigkilled_mid_warmup_has_a_compile_per_entry,
     .init = setup, .fini = teardown, .timeout = 120)
{
    long all, hang;
    count_keys(&all, &hang);
    kwd d;
    kill_kwarmd(&d, hung_warmup(&d, "crashcnt-d", all, hang));
    expect_agree(d.cache, all - hang);
    kwd_forget(&d);
}

/* ---- prewarm_claims ---------------------------------------------------- */

static void setup_claims(void)
{
    setup();
    cr_assert_eq(unsetenv("KWARM_TEST_HANG_FAMILY"), 0); /* instant, all */
}

static const char *const prewarm_json[] = {
    KW_KWARM_BIN, "prewarm", "--model", V32, "--cache", cache, "--jobs", "2",
    "--json", NULL};

/* The number named in a prewarm's --json document. */
static long json_num(const char *doc, const char *name)
{
    cJSON *d = cJSON_Parse(doc);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(d, name);
    cr_assert(cJSON_IsNumber(v), "no %s in: %s", name, doc);
    long n = (long)v->valuedouble;
    cJSON_Delete(d);
    return n;
}

/* Waits for a prewarm started with kw_test_spawn; exit 0 asserted, its
 * --json document returned (free it). */
static char *prewarm_done(kw_test_proc *p)
{
    char *out = NULL, *err = NULL;
    int st = kw_test_wait(p, &out, &err);
    cr_log_info("prewarm stderr: %s", err);
    cr_assert_eq(st, 0, "prewarm exit %d: %s", st, err);
    free(err);
    return out;
}

/* Each key compiled once overall, and every key present and whole. */
static void expect_each_once(long all)
{
    kw_cache_stats st = stats_of(cache);
    cr_expect_eq(st.entries, (uint64_t)all);
    cr_expect_eq(st.compiles, (uint64_t)all, "%llu compiles for %ld keys",
                 (unsigned long long)st.compiles, all);
    cr_expect_eq(st.corrupt, 0);
}

/* The test itself holds one key's claim while a real prewarm runs: the
 * prewarm stores every other key, then waits; the test stores that key
 * and lets go, and the prewarm finds it instead of compiling it. */
Test(prewarm_claims, a_key_claimed_elsewhere_is_found_not_compiled_again,
     .init = setup_claims, .fini = teardown, .timeout = 120)
{
    long all, hang;
    uint8_t d[KW_CACHE_DIGEST_LEN];
    count_keys_first(&all, &hang, d);
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    kw_cache_claim *cl = NULL;
    cr_assert_eq(kw_cache_claim_take(c, d, false, NULL, NULL, &cl), 0);
    cr_assert_not_null(cl);
    kw_test_proc p;
    cr_assert_eq(kw_test_spawn(prewarm_json, &p), 0);
    kw_cache_stats st = {0};
    int64_t deadline = kwd_now_ms() + POLL_MS;
    for (;;) {
        cr_assert_eq(kw_cache_stats_get(c, &st), 0);
        if (st.entries >= (uint64_t)all - 1)
            break;
        cr_assert_lt(kwd_now_ms(), deadline, "%llu entries",
                     (unsigned long long)st.entries);
        kwd_nap_ms(20);
    }
    cr_expect_eq(st.entries, (uint64_t)all - 1, "the claimed key waited");
    uint8_t blob[256];
    memset(blob, 0x5a, sizeof blob);
    kw_cache_item it = {.digest = d, .blob = blob, .len = sizeof blob,
                        .compiled = true};
    int rc;
    cr_assert_eq(kw_cache_put_many(c, &it, 1, &rc), 0);
    cr_assert_eq(rc, 0);
    kw_cache_claim_drop(cl);
    char *doc = prewarm_done(&p);
    cr_expect_eq(json_num(doc, "compiled"), all - 1);
    cr_expect_eq(json_num(doc, "hits"), 1, "found once it held the claim");
    free(doc);
    kw_cache_close(c);
    expect_each_once(all);
}

/* How many keys of V32 another process holds claims on. */
static long claims_held(kw_cache *c)
{
    const char *args[] = {"keys", "--model", V32, "--json", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(args, &out, &err), 0, "kwarm keys: %s", err);
    cJSON *doc = cJSON_Parse(out);
    const cJSON *k;
    long held = 0;
    cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(doc, "keys")) {
        uint8_t d[KW_CACHE_DIGEST_LEN];
        digest_of(k, d);
        kw_cache_claim *cl = NULL;
        int rc = kw_cache_claim_take(c, d, false, NULL, NULL, &cl);
        cr_assert(rc == 0 || rc == -EAGAIN);
        held += rc == -EAGAIN;
        kw_cache_claim_drop(cl);
    }
    cJSON_Delete(doc);
    free(out);
    free(err);
    return held;
}

/* Another process holds the claims of `hang` keys of the cache. */
static void expect_claims_held(long hang)
{
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    cr_expect_eq(claims_held(c), hang, "claims held elsewhere");
    kw_cache_close(c);
}

/* Prewarm p finished what a killed holder left: it compiled the `hang`
 * keys the holder had claimed and found the others; each key once. */
static void expect_finished_by(kw_test_proc *p, long all, long hang)
{
    char *doc = prewarm_done(p);
    cr_expect_eq(json_num(doc, "compiled"), hang, "what the holder left");
    cr_expect_eq(json_num(doc, "hits"), all - hang, "what it stored");
    free(doc);
    expect_each_once(all);
}

/* Prewarm A's compiles of one family hang, holding their claims; B
 * starts, A is killed (SIGKILL) holding them, and B compiles what A
 * left: each key once overall. */
Test(prewarm_claims, a_holder_sigkilled_leaves_its_keys_to_the_other_prewarm,
     .init = setup, .fini = teardown, .timeout = 120)
{
    long all, hang;
    count_keys(&all, &hang);
    const char *args[] = {"prewarm", "--model", V32, "--cache", cache,
                          "--jobs", "3", "--compile-timeout", "600", NULL};
    pid_t a = spawn_kwarm(args);
    wait_entries(cache, (uint64_t)(all - hang), a);
    cr_assert_eq(unsetenv("KWARM_TEST_HANG_FAMILY"), 0);
    expect_claims_held(hang); /* A's, of the keys it hangs on */
    kw_test_proc b;
    cr_assert_eq(kw_test_spawn(prewarm_json, &b), 0);
    kill_and_reap(a, SIGKILL);
    expect_finished_by(&b, all, hang);
}

Test(prewarm_claims, two_prewarms_at_once_compile_each_key_once_between_them,
     .init = setup_claims, .fini = teardown, .timeout = 120)
{
    long all, hang;
    count_keys(&all, &hang);
    kw_test_proc a, b;
    cr_assert_eq(kw_test_spawn(prewarm_json, &a), 0);
    cr_assert_eq(kw_test_spawn(prewarm_json, &b), 0);
    char *da = prewarm_done(&a), *db = prewarm_done(&b);
    cr_expect_eq(json_num(da, "compiled") + json_num(db, "compiled"), all,
                 "A: %s B: %s", da, db);
    cr_expect_eq(json_num(da, "failed") + json_num(db, "failed"), 0);
    free(da);
    free(db);
    expect_each_once(all);
}

Test(prewarm_claims, without_a_claims_file_a_prewarm_works_and_says_so,
     .init = setup_claims, .fini = teardown, .timeout = 120)
{
    long all, hang;
    count_keys(&all, &hang);
    char path[300];
    cr_assert_eq(mkdir(cache, 0700), 0);
    snprintf(path, sizeof path, "%s/claims", cache);
    cr_assert_eq(mkdir(path, 0700), 0); /* cannot be opened as a file */
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(prewarm_json, &out, &err), 0, "%s", err);
    cr_expect(strstr(err, "note: no claims") != NULL && strstr(err, path),
              "stderr: %s", err);
    cr_expect_eq(json_num(out, "compiled"), all);
    free(out);
    free(err);
    expect_each_once(all);
}

/* kwarmd takes the same claims: its warmup's compiles of one family hang
 * holding them, a prewarm of the cache waits for those keys, kwarmd is
 * SIGKILLed, and the prewarm compiles them: each key once overall. */
Test(prewarm_claims, a_prewarm_beside_a_sigkilled_kwarmd_compiles_what_it_held,
     .init = setup, .fini = teardown, .timeout = 120)
{
    long all, hang;
    count_keys(&all, &hang);
    kwd d;
    pid_t client = hung_warmup(&d, "claims-d", all, hang);
    snprintf(cache, sizeof cache, "%s", d.cache); /* prewarm_json's */
    expect_claims_held(hang);
    cr_assert_eq(unsetenv("KWARM_TEST_HANG_FAMILY"), 0);
    kw_test_proc p;
    cr_assert_eq(kw_test_spawn(prewarm_json, &p), 0);
    kill_kwarmd(&d, client);
    expect_finished_by(&p, all, hang);
    kwd_forget(&d);
}
