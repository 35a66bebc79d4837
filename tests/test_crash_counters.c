/* test_crash_counters.c: the cache's persistent counters agree with its
 * entries however a writer ends (issue 24, "Done when" 3): a `kwarm
 * prewarm` killed by SIGKILL or by Ctrl-C (SIGINT) half-way, and a kwarmd
 * killed mid-warmup, leave entries == compiles on a fresh cache.
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
#include <sys/wait.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_test_util.h"

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"
#define HANG "indexer_logits" /* 2 of V32's 26 default keys */
#define POLL_MS 60000

static char tmpdir[64], cache[128];

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

/* Keys of V32's default deployment, and those of the hanging family. */
static void count_keys(long *all, long *hang)
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
        (*all)++;
        *hang += fam != NULL && strcmp(fam, HANG) == 0;
    }
    cJSON_Delete(doc);
    free(out);
    free(err);
    cr_assert(*hang > 0 && *hang < *all);
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

/* Forks and execs kwarm with args, output to /dev/null; returns its pid. */
static pid_t spawn_kwarm(const char *const *args)
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
            freopen("/dev/null", "w", stderr) == NULL)
            _exit(127);
        execv(KW_KWARM_BIN, (char *const *)argv);
        _exit(127);
    }
    kwd_track(pid, true);
    return pid;
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

/* A prewarm killed by sig once every key but the hanging ones is stored. */
static void prewarm_killed(int sig)
{
    long all, hang;
    count_keys(&all, &hang);
    const char *args[] = {"prewarm", "--model", V32, "--cache", cache,
                          "--jobs", "3", "--compile-timeout", "600", NULL};
    pid_t pid = spawn_kwarm(args);
    wait_entries(cache, (uint64_t)(all - hang), pid);
    kill_and_reap(pid, sig);
    expect_agree(cache, all - hang);
}

Test(crash_counters, prewarm_sigkilled_half_way_has_a_compile_per_entry,
     .init = setup, .fini = teardown, .timeout = 120)
{
    prewarm_killed(SIGKILL);
}

Test(crash_counters, prewarm_interrupted_half_way_has_a_compile_per_entry,
     .init = setup, .fini = teardown, .timeout = 120)
{
    prewarm_killed(SIGINT);
}

Test(crash_counters, kwarmd_sigkilled_mid_warmup_has_a_compile_per_entry,
     .init = setup, .fini = teardown, .timeout = 120)
{
    long all, hang;
    count_keys(&all, &hang);
    kwd d;
    kwd_init(&d, "crashcnt-d");
    kwd_start(&d, 3, (const char *const[]){"--compile-timeout", "600", NULL});
    const char *args[] = {"warmup", "--model", V32, "--socket", d.sock,
                          "--quiet", NULL};
    pid_t client = spawn_kwarm(args);
    wait_entries(d.cache, (uint64_t)(all - hang), d.pid);
    kill_and_reap(d.pid, SIGKILL);
    kwd_track(d.pid, false);
    d.pid = 0;
    int ws;
    cr_assert_eq(waitpid(client, &ws, 0), client); /* its daemon is gone */
    kwd_track(client, false);
    expect_agree(d.cache, all - hang);
    kwd_forget(&d);
}
