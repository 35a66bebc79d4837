/* test_prewarm.c: `kwarm prewarm`, `get` and `stats` through the real
 * binary (issue 4): hits on a second run, a SIGKILL half-way, two
 * prewarms of one config on one cache at once. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"
#define V4 KW_FIXTURES "/deepseek-v4-flash.json"

static char tmpdir[64], cache[128];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(tmpdir, sizeof tmpdir, "prewarm"), 0);
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
}

static void teardown(void)
{
    kw_test_rmtree(tmpdir);
}

/* Runs kwarm with args; returns its --json document (or NULL) and exit. */
static cJSON *kwarm_json(const char *const *args, int *status)
{
    const char *argv[24] = {KW_KWARM_BIN};
    size_t n = 1;
    for (; args[n - 1] != NULL && n < 23; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char *out = NULL, *err = NULL;
    *status = kw_test_run(argv, &out, &err);
    cJSON *doc = out ? cJSON_Parse(out) : NULL;
    cr_log_info("stderr: %s", err ? err : "");
    free(out);
    free(err);
    return doc;
}

static long num(const cJSON *doc, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, name);
    cr_assert(cJSON_IsNumber(v), "no number %s", name);
    return (long)v->valuedouble;
}

/* How many keys `kwarm keys` derives for V32 at DCP world dcp ("1": the
 * default), so the counts follow the spec rather than a copy of it. */
static long count_keys(const char *dcp)
{
    const char *argv[] = {KW_KWARM_BIN, "keys", "--model", V32, "--json",
                          "--dcp-world", dcp, NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "kwarm keys: %s", err);
    cJSON *doc = cJSON_Parse(out);
    long n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "keys"));
    cJSON_Delete(doc);
    free(out);
    free(err);
    cr_assert_gt(n, 0);
    return n;
}

/* The cache's statistics, read through the library. */
static kw_cache_stats stats(void)
{
    kw_cache_opts o = {.dir = cache, .read_only = true};
    kw_cache *c = NULL;
    kw_cache_stats st = {0};
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_cache_stats_get(c, &st), 0);
    kw_cache_close(c);
    return st;
}

Test(prewarm, second_run_compiles_nothing_and_hits_every_key, .init = setup,
     .fini = teardown)
{
    const char *args[] = {"prewarm", "--model", V32, "--cache", cache, "--json",
                          "--jobs", "2", NULL};
    int status;
    cJSON *first = kwarm_json(args, &status);
    cr_assert_eq(status, 0);
    cr_assert_not_null(first);
    long keys = num(first, "keys");
    cr_expect_eq(keys, count_keys("1"));
    cr_expect_eq(num(first, "compiled"), keys);
    cr_expect_eq(num(first, "hits"), 0);
    cr_expect_eq(num(first, "failed"), 0);
    cJSON *second = kwarm_json(args, &status);
    cr_assert_eq(status, 0);
    cr_expect_eq(num(second, "compiled"), 0);
    cr_expect_eq(num(second, "hits"), keys);
    kw_cache_stats st = stats();
    cr_expect_eq(st.entries, (uint64_t)keys);
    cr_expect_eq(st.compiles, (uint64_t)keys);
    cr_expect_eq(st.hits, (uint64_t)keys);   /* the second run's checks */
    cr_expect_eq(st.misses, (uint64_t)keys); /* the first run's checks */
    cJSON_Delete(first);
    cJSON_Delete(second);
}

/* Starts kwarm with args in the background, output discarded. */
static pid_t spawn(const char *const *args)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        const char *argv[24] = {KW_KWARM_BIN};
        size_t n = 1;
        for (; args[n - 1] != NULL && n < 23; n++)
            argv[n] = args[n - 1];
        argv[n] = NULL;
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execv(KW_KWARM_BIN, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Entries in the cache, or 0 while it does not exist yet. */
static uint64_t entries_now(void)
{
    kw_cache_opts o = {.dir = cache, .read_only = true};
    kw_cache *c = NULL;
    kw_cache_stats st = {0};
    char err[256];
    if (access(cache, F_OK) < 0 || kw_cache_open(&c, &o, err, sizeof err) < 0)
        return 0;
    kw_cache_stats_get(c, &st);
    kw_cache_close(c);
    return st.entries;
}

typedef struct digests {
    uint8_t (*d)[KW_CACHE_DIGEST_LEN];
    size_t n;
} digests;

static int collect(const uint8_t *digest, const kw_cache_info *info, void *arg)
{
    digests *l = arg;
    (void)info;
    l->d = realloc(l->d, (l->n + 1) * sizeof *l->d);
    cr_assert_not_null(l->d);
    memcpy(l->d[l->n++], digest, KW_CACHE_DIGEST_LEN);
    return 0;
}

/* Every entry of the cache is whole: each get verifies its checksum.
 * Returns the number of entries. */
static uint64_t verify_all(void)
{
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[256];
    digests l = {0};
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_cache_foreach(c, collect, &l), 0);
    for (size_t i = 0; i < l.n; i++) {
        void *blob = NULL;
        size_t len = 0;
        cr_expect_eq(kw_cache_get(c, l.d[i], &blob, &len, NULL), 0,
                     "entry %zu does not verify", i);
        cr_expect_gt(len, 0);
        free(blob);
    }
    kw_cache_close(c);
    free(l.d);
    return l.n;
}

Test(prewarm, sigkill_half_way_leaves_whole_entries_that_a_rerun_completes,
     .init = setup, .fini = teardown, .timeout = 600)
{
    const char *args[] = {"prewarm", "--model", V4, "--dcp-world", "8",
                          "--cache", cache, "--jobs", "1", "--json", NULL};
    pid_t pid = spawn(args);
    /* Wait, by polling the cache (bounded), until some entries landed. */
    struct timespec tick = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 30000 && entries_now() < 10; i++)
        nanosleep(&tick, NULL);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL,
              "prewarm ended before it was killed half-way");
    uint64_t before = verify_all();
    cr_assert_geq(before, 10);
    int status;
    cJSON *doc = kwarm_json(args, &status);
    cr_assert_eq(status, 0);
    long keys = num(doc, "keys");
    cr_expect_lt((long)before, keys, "the kill came after the last entry");
    cr_expect_eq(num(doc, "hits"), (long)before);
    cr_expect_eq(num(doc, "compiled"), keys - (long)before);
    cr_expect_eq(num(doc, "failed"), 0);
    cr_expect_eq(stats().entries, (uint64_t)keys);
    cJSON_Delete(doc);
}

Test(prewarm, two_prewarms_at_once_both_succeed_and_compile_each_key_once,
     .init = setup, .fini = teardown, .timeout = 600)
{
    const char *args[] = {"prewarm", "--model", V32, "--dcp-world", "2",
                          "--cache", cache, "--jobs", "1", NULL};
    pid_t a = spawn(args), b = spawn(args);
    int wa, wb;
    cr_assert_eq(waitpid(a, &wa, 0), a);
    cr_assert_eq(waitpid(b, &wb, 0), b);
    cr_expect(WIFEXITED(wa) && WEXITSTATUS(wa) == 0);
    cr_expect(WIFEXITED(wb) && WEXITSTATUS(wb) == 0);
    kw_cache_stats st = stats();
    uint64_t n = (uint64_t)count_keys("2");
    cr_expect_eq(st.entries, n); /* the fixture's W = 2 key count */
    cr_expect_eq(st.compiles, n, "each key compiled once between the two "
                 "(claims, issue 24): %llu", (unsigned long long)st.compiles);
    cr_expect_eq(st.compile_failures, 0);
    cr_expect_eq(verify_all(), n);
}

Test(prewarm, get_writes_the_cached_cubin_by_digest_or_by_fields, .init = setup,
     .fini = teardown)
{
    const char *pre[] = {"prewarm", "--model", V32, "--cache", cache, NULL};
    int status;
    cJSON_Delete(kwarm_json(pre, &status));
    cr_assert_eq(status, 0);
    const char *keys[] = {"keys", "--model", V32, "--json", NULL};
    cJSON *doc = kwarm_json(keys, &status);
    const cJSON *k = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "keys"), 0);
    const char *hex = cJSON_GetObjectItem(k, "digest")->valuestring;
    char out1[200], out2[200], fields[512] = "";
    snprintf(out1, sizeof out1, "%s/a.cubin", tmpdir);
    snprintf(out2, sizeof out2, "%s/b.cubin", tmpdir);
    const char *by_digest[] = {"get", "--digest", hex, "--cache", cache, "-o", out1, NULL};
    cJSON_Delete(kwarm_json(by_digest, &status));
    cr_assert_eq(status, 0);
    for (const cJSON *f = cJSON_GetObjectItem(k, "fields")->child; f; f = f->next) {
        size_t n = strlen(fields);
        snprintf(fields + n, sizeof fields - n, "%s%s=%s", n ? "," : "", f->string,
                 cJSON_IsBool(f) ? (cJSON_IsTrue(f) ? "true" : "false") : "");
        if (cJSON_IsNumber(f))
            snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "%lld",
                     (long long)f->valuedouble);
    }
    const char *by_fields[] = {"get", "--family", "prefill_chunk_metadata",
                               "--fields", fields, "--arch", "sm_90", "--cache",
                               cache, "-o", out2, NULL};
    cJSON_Delete(kwarm_json(by_fields, &status));
    cr_assert_eq(status, 0);
    size_t l1, l2;
    char *b1 = kw_test_read_file(out1, &l1), *b2 = kw_test_read_file(out2, &l2);
    cr_assert(b1 && b2 && l1 == l2 && l1 > 64 && memcmp(b1, b2, l1) == 0);
    cr_expect_eq(kw_test_elf_machine((const uint8_t *)b1, l1), 190);
    free(b1);
    free(b2);
    const char *miss[] = {"get", "--digest", "00000000000000000000000000000000"
                          "00000000000000000000000000000000", "--cache", cache,
                          "-o", out1, NULL};
    cJSON_Delete(kwarm_json(miss, &status));
    cr_expect_eq(status, 1);
    cJSON_Delete(doc);
}
