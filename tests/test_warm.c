/* test_warm.c: the warm pipeline (warm/kw_warm.h) on its own: counters
 * with one meaning each, single-flight across jobs, failures that carry
 * their reason, a crashing worker, cancellation at scale.
 *
 * Compiles run in real kwarm-compile worker processes (found beside this
 * test binary); KWARM_TEST_INSTANT_COMPILE makes them instant where the
 * test is about the pipeline, not NVRTC.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kw_alloc.h"
#include "kw_cache.h"
#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "kw_test_util.h"
#include "kw_warm.h"

/* What one job's callbacks saw. */
typedef struct seen {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t n, count[KW_WARM_CANCELLED + 1];
    bool last, bad_order;
    char first_log[512];
    char *status; /* per index: 0 not yet, else 1 + kw_warm_status */
    const kw_keys_key *expect; /* when set: each result's key must be so */
    size_t wrong_keys;
} seen;

static bool same_key(const kw_keys_key *a, const kw_keys_key *b)
{
    return a->family == b->family &&
           memcmp(a->fields, b->fields, sizeof a->fields) == 0 &&
           strcmp(a->arch, b->arch) == 0 &&
           memcmp(a->digest, b->digest, sizeof a->digest) == 0;
}

static void seen_init(seen *s, size_t n)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->status = calloc(n + 1, 1);
    cr_assert_not_null(s->status);
}

static void on_result(const kw_warm_result *r, void *arg)
{
    seen *s = arg;
    /* Callbacks of one job never overlap: no lock needed for these. */
    s->bad_order |= s->last || s->status[r->index] != 0;
    if (s->expect != NULL && !same_key(r->key, &s->expect[r->index]))
        s->wrong_keys++;
    s->status[r->index] = (char)(1 + r->status);
    s->count[r->status]++;
    s->n++;
    if (r->status == KW_WARM_FAILED && s->first_log[0] == '\0')
        snprintf(s->first_log, sizeof s->first_log, "%s",
                 r->log ? r->log : "(no log)");
    if (r->last) {
        pthread_mutex_lock(&s->lock);
        s->last = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
}

static void seen_wait(seen *s)
{
    pthread_mutex_lock(&s->lock);
    while (!s->last)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static void seen_destroy(seen *s)
{
    free(s->status);
}

/* The keys of fixture at DCP world w on archs. */
static kw_keys_set derive(const char *fixture, int w, const char *archs)
{
    char path[512], err[KW_CONFIG_ERRLEN], wbuf[16];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, fixture);
    snprintf(wbuf, sizeof wbuf, "%d", w);
    kw_config_model m;
    kw_config_deploy d;
    kw_keys_set set = {0};
    kw_config_deploy_init(&d);
    cr_assert_eq(kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_WORLD, wbuf, err,
                                           sizeof err), 0, "%s", err);
    cr_assert_eq(kw_config_deploy_set_flag(&d, KW_CONFIG_ARCH, archs, err,
                                           sizeof err), 0, "%s", err);
    cr_assert_eq(kw_config_load(&m, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_config_resolve(&d, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_keys_derive(&m, &d, &set, err, sizeof err), 0, "%s", err);
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
    return set;
}

/* A cache in a fresh directory, and a pipeline on it. */
typedef struct rig {
    char dir[128];
    kw_cache *cache;
    kw_warm *warm;
} rig;

static void rig_up(rig *r, const char *tag, unsigned jobs, unsigned timeout_ms)
{
    char err[512], cdir[160];
    cr_assert_eq(kw_test_mkdtemp(r->dir, sizeof r->dir, tag), 0);
    snprintf(cdir, sizeof cdir, "%s/cache", r->dir);
    kw_cache_opts co = {.dir = cdir};
    cr_assert_eq(kw_cache_open(&r->cache, &co, err, sizeof err), 0, "%s", err);
    kw_warm_opts wo = {.cache = r->cache, .jobs = jobs,
                       .compile_timeout_ms = timeout_ms};
    cr_assert_eq(kw_warm_open(&r->warm, &wo, err, sizeof err), 0, "%s", err);
}

static void rig_down(rig *r)
{
    kw_warm_close(r->warm);
    kw_cache_close(r->cache);
    kw_test_rmtree(r->dir);
}

static void instant(void)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
}

/* ---- counters and single-flight ------------------------------------------ */

Test(warm, two_jobs_of_the_same_keys_compile_each_key_once)
{
    instant();
    rig r;
    rig_up(&r, "warm-sf", 2, 0);
    kw_keys_set set = derive("deepseek-v4-flash.json", 64, "sm_90,sm_100");
    seen a, b;
    seen_init(&a, set.nkeys);
    seen_init(&b, set.nkeys);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &a,
                                NULL), 0);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &b,
                                NULL), 0);
    seen_wait(&a);
    seen_wait(&b);
    cr_expect_eq(a.n, set.nkeys);
    cr_expect_eq(b.n, set.nkeys);
    cr_expect(!a.bad_order && !b.bad_order, "a result after `last`, or twice");
    kw_warm_stats st;
    /* The gauges fall just after the last callback returns: poll them,
     * with a deadline. */
    for (int i = 0; i < 2000; i++) {
        kw_warm_stats_get(r.warm, &st);
        if (st.queued + st.compiling + st.jobs_active == 0)
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    /* One meaning each: every key is a hit or a miss; every miss joined a
     * flight or started one; every flight compiled (nothing failed). */
    cr_expect_eq(st.keys, 2 * set.nkeys);
    cr_expect_eq(st.hits + st.misses, st.keys);
    cr_expect_eq(st.compiles, set.nkeys, "one compile per distinct key");
    cr_expect_eq(st.misses, st.joined + st.compiles);
    cr_expect_eq(st.compile_failures + st.store_failures + st.cancelled, 0);
    cr_expect_eq(st.queued + st.compiling + st.jobs_active, 0);
    cr_expect_eq(a.count[KW_WARM_COMPILED] + b.count[KW_WARM_COMPILED] +
                 a.count[KW_WARM_HIT] + b.count[KW_WARM_HIT], 2 * set.nkeys);
    kw_cache_stats cs;
    cr_assert_eq(kw_cache_stats_get(r.cache, &cs), 0);
    cr_expect_eq(cs.entries, set.nkeys);
    cr_expect_eq(cs.compiles, set.nkeys, "the cache's counter agrees");
    seen_destroy(&a);
    seen_destroy(&b);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

/* ---- failures ------------------------------------------------------------ */

Test(warm, a_key_nvrtc_cannot_compile_fails_with_its_log)
{
    rig r;
    rig_up(&r, "warm-fail", 1, 0);
    /* sm_35: the deployment parser takes it, the compile step does not. */
    kw_keys_set set = derive("deepseek-v3.2-exp.json", 1, "sm_35");
    seen s;
    seen_init(&s, 1);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, 1, 0, on_result, &s, NULL), 0);
    seen_wait(&s);
    cr_expect_eq(s.count[KW_WARM_FAILED], 1);
    cr_expect(strstr(s.first_log, "sm_35") != NULL, "log: %s", s.first_log);
    kw_warm_stats st;
    kw_warm_stats_get(r.warm, &st);
    cr_expect_eq(st.compile_failures, 1);
    cr_expect_eq(st.compiles, 0);
    seen_destroy(&s);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

Test(warm, a_crashing_worker_fails_only_its_keys_and_is_replaced)
{
    instant();
    cr_assert_eq(setenv("KWARM_TEST_CRASH_FAMILY", "dcp_stable_topk", 1), 0);
    rig r;
    rig_up(&r, "warm-crash", 2, 0);
    kw_keys_set set = derive("deepseek-v3.2-exp.json", 2, "sm_90");
    size_t crashing = 0;
    for (size_t i = 0; i < set.nkeys; i++)
        crashing += set.keys[i].family == KW_K_DCP_STABLE_TOPK;
    cr_assert_gt(crashing, 0);
    seen s;
    seen_init(&s, set.nkeys);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &s,
                                NULL), 0);
    seen_wait(&s);
    cr_expect_eq(s.count[KW_WARM_FAILED], crashing);
    cr_expect_eq(s.count[KW_WARM_COMPILED], set.nkeys - crashing);
    cr_expect(strstr(s.first_log, "crash") != NULL, "log: %s", s.first_log);
    for (size_t i = 0; i < set.nkeys; i++)
        cr_expect_eq(s.status[i] - 1,
                     set.keys[i].family == KW_K_DCP_STABLE_TOPK ? KW_WARM_FAILED
                                                                 : KW_WARM_COMPILED,
                     "key %zu", i);
    seen_destroy(&s);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

Test(warm, a_compile_past_its_time_limit_fails_and_the_pipeline_goes_on)
{
    instant();
    cr_assert_eq(setenv("KWARM_TEST_HANG_FAMILY", "dcp_stable_topk", 1), 0);
    rig r;
    rig_up(&r, "warm-slow", 2, 500);
    kw_keys_set set = derive("deepseek-v3.2-exp.json", 2, "sm_90");
    seen s;
    seen_init(&s, set.nkeys);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &s,
                                NULL), 0);
    seen_wait(&s);
    cr_expect_gt(s.count[KW_WARM_FAILED], 0);
    cr_expect_eq(s.count[KW_WARM_FAILED] + s.count[KW_WARM_COMPILED], set.nkeys);
    cr_expect(strstr(s.first_log, "killed after") != NULL, "log: %s", s.first_log);
    seen_destroy(&s);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

Test(warm, a_missing_helper_fails_the_open_with_its_path)
{
    char err[512] = "";
    rig r;
    cr_assert_eq(kw_test_mkdtemp(r.dir, sizeof r.dir, "warm-nohelper"), 0);
    kw_cache_opts co = {.dir = r.dir};
    cr_assert_eq(kw_cache_open(&r.cache, &co, err, sizeof err), 0, "%s", err);
    kw_warm_opts wo = {.cache = r.cache, .jobs = 2,
                       .helper = "/nonexistent/kwarm-compile"};
    kw_warm *w = NULL;
    cr_expect_lt(kw_warm_open(&w, &wo, err, sizeof err), 0);
    cr_expect_null(w);
    cr_expect(strstr(err, "/nonexistent/kwarm-compile") != NULL, "%s", err);
    kw_cache_close(r.cache);
    kw_test_rmtree(r.dir);
}

/* ---- cancellation ---------------------------------------------------------- */

Test(warm, cancel_reports_every_queued_key_cancelled)
{
    instant();
    cr_assert_eq(setenv("KWARM_TEST_HANG_FAMILY", "prefill_chunk_metadata", 1), 0);
    rig r;
    rig_up(&r, "warm-cancel", 2, 0);
    kw_keys_set set = derive("deepseek-v4-flash.json", 1024, "sm_90,sm_100");
    seen s;
    seen_init(&s, set.nkeys);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &s,
                                NULL), 0);
    kw_warm_cancel(r.warm); /* whatever got where: nothing is lost */
    seen_wait(&s);
    cr_expect_eq(s.n, set.nkeys);
    cr_expect_eq(s.count[KW_WARM_FAILED], 0);
    cr_expect_gt(s.count[KW_WARM_CANCELLED], set.nkeys / 2);
    cr_expect_eq(kw_warm_submit(r.warm, set.keys, 1, 0, on_result, &s, NULL),
                 -ECANCELED);
    seen_destroy(&s);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

Test(warm, a_cancelled_job_stops_but_a_job_sharing_its_keys_completes)
{
    instant();
    rig r;
    rig_up(&r, "warm-jobcancel", 1, 0);
    kw_keys_set set = derive("deepseek-v4-flash.json", 256, "sm_90");
    seen a, b;
    seen_init(&a, set.nkeys);
    seen_init(&b, set.nkeys);
    kw_warm_job *job = NULL;
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &a,
                                &job), 0);
    kw_warm_job_cancel(job);
    cr_assert_eq(kw_warm_submit(r.warm, set.keys, set.nkeys, 0, on_result, &b,
                                NULL), 0);
    seen_wait(&a);
    seen_wait(&b);
    kw_warm_job_release(job);
    cr_expect_eq(a.n, set.nkeys);
    cr_expect_eq(b.n, set.nkeys);
    cr_expect_eq(b.count[KW_WARM_COMPILED] + b.count[KW_WARM_HIT], set.nkeys,
                 "the second job lost keys to the first one's cancel");
    seen_destroy(&a);
    seen_destroy(&b);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

/* kw_warm_submit_packed (issue 23): the job takes the caller's packed
 * set, no copy, and every result carries its key whole (unpacked, digest
 * computed again); a refused submit leaves the set with the caller. */
Test(warm, submit_packed_takes_the_keys_and_gives_each_result_its_key)
{
    instant();
    rig r;
    rig_up(&r, "warm-take", 2, 0);
    kw_keys_set set = derive("deepseek-v4-flash.json", 64, "sm_90,sm_100");
    size_t n = set.nkeys;
    cr_assert(n > KW_WARM_CHUNK, "%zu keys: more than one chunk", n);
    kw_keys_packed p;
    cr_assert_eq(kw_keys_pack(&p, set.keys, n), 0);
    cr_expect_null(p.keys, "the keys packed");
    seen s;
    seen_init(&s, n);
    s.expect = set.keys;
    kw_warm_job *job = NULL;
    cr_assert_eq(kw_warm_submit_packed(r.warm, &p, KW_WARM_PROTECT, on_result,
                                       &s, &job), 0);
    cr_expect(p.n == 0 && p.buf == NULL, "the set is the job's now");
    seen_wait(&s);
    cr_expect_eq(s.n, n);
    cr_expect_eq(s.count[KW_WARM_COMPILED], n);
    cr_expect_eq(s.wrong_keys, 0, "%zu results with another key", s.wrong_keys);
    cr_expect_not(s.bad_order);
    kw_warm_job_release(job);
    kw_warm_cancel(r.warm);
    cr_assert_eq(kw_keys_pack(&p, set.keys, 1), 0);
    cr_expect_eq(kw_warm_submit_packed(r.warm, &p, 0, on_result, &s, NULL),
                 -ECANCELED);
    cr_expect_eq(p.n, 1, "refused: still the caller's");
    kw_keys_pack_destroy(&p);
    seen_destroy(&s);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}

/* warm/store.c's check of its group's allocations (issue 23, point 6),
 * reached through common/kw_alloc.h's hook, SQLite-style: for every N
 * until no allocation is left to fail, the N-th allocation of a one-key
 * job fails.  Each time the key gets exactly one result (or the submit is
 * refused with KW_ENOMEM), and some N fails the store group's own
 * allocation, which fails the key with the store's out-of-memory reason.
 * The pipeline then compiles and stores a key as before. */
Test(warm, a_failed_allocation_of_the_store_stage_fails_its_keys_only)
{
    instant();
    rig r;
    rig_up(&r, "warm-store-oom", 1, 0);
    kw_keys_set set = derive("deepseek-v4-flash.json", 64, "sm_90,sm_100");
    char want[128];
    snprintf(want, sizeof want, "store: %s", kw_strerror(KW_ENOMEM));
    size_t store_oom = 0, n = 1;
    for (bool fired = true; fired; n++) {
        cr_assert(n + 1 < set.nkeys, "still failing at N = %zu", n);
        seen s;
        seen_init(&s, 1);
        kw_alloc_fail_at(n);
        int rc = kw_warm_submit(r.warm, &set.keys[n], 1, 0, on_result, &s, NULL);
        if (rc == 0)
            seen_wait(&s);
        fired = kw_alloc_failed();
        kw_alloc_fail_at(0);
        cr_assert(rc == 0 || rc == KW_ENOMEM, "N = %zu: submit %d", n, rc);
        if (rc == 0) {
            cr_expect_eq(s.n, 1, "N = %zu: %zu results", n, s.n);
            cr_expect_not(s.bad_order, "N = %zu", n);
        }
        if (rc == 0 && s.count[KW_WARM_FAILED] == 1 &&
            strcmp(s.first_log, want) == 0)
            store_oom++;
        seen_destroy(&s);
    }
    cr_log_info("%zu allocations failed in turn; %zu reached the store's "
                "check", n - 2, store_oom);
    cr_expect_geq(store_oom, 1, "no N reached store.c's allocation check");
    seen s;
    seen_init(&s, 1);
    cr_assert_eq(kw_warm_submit(r.warm, &set.keys[0], 1, 0, on_result, &s, NULL), 0);
    seen_wait(&s);
    cr_expect_eq(s.count[KW_WARM_COMPILED], 1, "the pipeline serves on");
    seen_destroy(&s);
    kw_keys_set_destroy(&set);
    rig_down(&r);
}
