/* test_pool.c: warm/'s compile worker pool and its helper, kwarm-compile
 * (issue 10, point 2): real compiles equal in-process ones, many callers,
 * crashes, hangs and memory limits fail one key and replace the worker,
 * cancel is prompt, and nothing (children, fds) is left behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "kw_test_util.h"
#include "pool.h"
#include "pool_util.h"

/* ---- helpers ------------------------------------------------------------ */

static kw__pool *start_pool(unsigned jobs, unsigned timeout_ms,
                            uint64_t mem_limit)
{
    kw__pool_opts o = {.helper = KW_COMPILE_HELPER_BIN, .jobs = jobs,
                       .timeout_ms = timeout_ms, .mem_limit = mem_limit};
    kw__pool *p = NULL;
    char err[512] = "";
    cr_assert_eq(kw__pool_start(&p, &o, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(p);
    return p;
}

/* One key of every family the fixtures use (at DCP world 2 each). */
static void one_key_per_family(kw_keys_key out[KW_K_NFAMILIES])
{
    static const char *const fixtures[] = {
        "deepseek-v3.2-exp.json", "deepseek-v4-flash.json", "glm-5.2.json",
        "glm-5-next-kpool.json", "composite-text-config.json"};
    bool have[KW_K_NFAMILIES] = {false};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        char path[512], err[KW_CONFIG_ERRLEN];
        kw_config_model m;
        kw_config_deploy d;
        kw_keys_set s;
        snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, fixtures[f]);
        kw_config_deploy_init(&d);
        cr_assert_eq(kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_WORLD, "2",
                                               err, sizeof err), 0, "%s", err);
        cr_assert_eq(kw_config_load(&m, path, NULL, err, sizeof err), 0, "%s",
                     err);
        cr_assert_eq(kw_config_resolve(&d, &m, err, sizeof err), 0, "%s", err);
        cr_assert_eq(kw_keys_derive(&m, &d, &s, err, sizeof err), 0, "%s",
                     err);
        for (size_t i = 0; i < s.nkeys; i++)
            if (!have[s.keys[i].family]) {
                have[s.keys[i].family] = true;
                out[s.keys[i].family] = s.keys[i];
            }
        kw_keys_set_destroy(&s);
        kw_config_model_destroy(&m);
        kw_config_deploy_destroy(&d);
    }
    for (int f = 0; f < KW_K_NFAMILIES; f++)
        cr_assert(have[f], "no fixture has a key of family %s",
                  kw_keys_family_name((kw_k_family)f));
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own fd */
}

/* True when this process has no child at all, zombie or running. */
static bool no_children(void)
{
    int st;
    return waitpid(-1, &st, WNOHANG) < 0 && errno == ECHILD;
}

/* Waits (bounded) until the pool's counts reach busy and waiting. */
static void wait_for_counts(kw__pool *p, unsigned busy, unsigned waiting)
{
    double t0 = now_s();
    kw__pool_counts c = {0};
    do {
        kw__pool_get_counts(p, &c);
        if (c.busy == busy && c.waiting == waiting)
            return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL); /* polling a condition, not a fixed wait */
    } while (now_s() - t0 < 30);
    cr_assert_fail("pool never reached busy %u waiting %u (at %u, %u)", busy,
                   waiting, c.busy, c.waiting);
}

/* The pids of this process's kwarm-compile children, from /proc. */
static size_t worker_pids(pid_t *out, size_t cap)
{
    DIR *d = opendir("/proc");
    size_t n = 0;
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL && n < cap;) {
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *rp = strrchr(buf, ')'); /* comm may hold spaces */
        int ppid = 0;
        if (strstr(buf, "(kwarm-compile)") && rp &&
            sscanf(rp + 2, "%*c %d", &ppid) == 1 && ppid == getpid())
            out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

/* VmSize of process pid, in bytes. */
static uint64_t vm_size(pid_t pid)
{
    char path[64], line[128];
    unsigned long long kb = 0;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024u;
}

/* True once pid is a zombie (dead, not yet reaped). */
static bool is_zombie(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    return rp != NULL && rp[1] == ' ' && rp[2] == 'Z';
}

/* ---- real compiles ----------------------------------------------------- */

/* No criterion .timeout in this suite: its watchdog leaks 48 bytes in the
 * runner, which fails the ASan build; every wait here is bounded anyway. */
Test(pool, real_compile_of_each_family_equals_in_process_compile)
{
    kw_keys_key keys[KW_K_NFAMILIES];
    one_key_per_family(keys);
    kw__pool *p = start_pool(2, 0, 0);
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        kw__pool_result r;
        kw_jit_result j;
        int rc = kw__pool_compile(p, &keys[f], &r);
        cr_assert_eq(rc, 0, "%s: %s: %s", kw_keys_family_name(f),
                     kw_strerror(rc), r.log ? r.log : "");
        cr_assert_eq(kw_keys_compile(&keys[f], false, &j), 0);
        cr_expect_str_eq(r.entry, j.lowered_name);
        cr_expect_eq(r.cubin_len, j.cubin_len, "%s", kw_keys_family_name(f));
        cr_expect(r.cubin_len == j.cubin_len &&
                      memcmp(r.cubin, j.cubin, j.cubin_len) == 0,
                  "%s: cubin differs", kw_keys_family_name(f));
        cr_expect_gt(r.seconds, 0.0);
        kw_jit_result_destroy(&j);
        kw__pool_result_destroy(&r);
    }
    kw__pool_stop(p);
}

Test(pool, key_refused_by_jit_returns_its_code_and_log_keeping_the_worker)
{
    kw_keys_key keys[KW_K_NFAMILIES];
    one_key_per_family(keys);
    /* sm_99 is no arch NVRTC knows: jit/ refuses it with a reason. */
    kw_keys_key k = keys[KW_K_INDEX_CONVERSION];
    memcpy(k.arch, "sm_99", 6);
    kw__pool *p = start_pool(1, 0, 0);
    kw__pool_result r;
    int rc = kw__pool_compile(p, &k, &r);
    cr_assert_eq(rc, KW_EINVAL, "%s", kw_strerror(rc));
    cr_assert_not_null(r.log);
    cr_assert(strstr(r.log, "sm_99") != NULL, "%s", r.log);
    cr_assert_null(r.cubin);
    cr_assert_str_eq(r.entry, "");
    kw__pool_result_destroy(&r);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.replaced, 0, "a rejected key must not cost a worker");
    kw__pool_stop(p);
}

/* ---- instant mode, many callers ---------------------------------------- */

#define N_THREADS 8
#define N_PER_THREAD 600

typedef struct many {
    kw__pool *p;
    unsigned base;
    _Atomic unsigned bad;
} many;

static void *compile_many(void *arg)
{
    many *m = arg;
    for (unsigned i = 0; i < N_PER_THREAD; i++) {
        kw_keys_key k = fake_key((kw_k_family)(i % KW_K_NFAMILIES),
                                 m->base + i);
        kw__pool_result r;
        bool ok = kw__pool_compile(m->p, &k, &r) == 0 &&
                  strcmp(r.entry, "kw_test_entry") == 0 &&
                  r.cubin_len == 8 * KW_KEYS_DIGEST_LEN;
        for (size_t o = 0; ok && o < r.cubin_len; o += KW_KEYS_DIGEST_LEN)
            ok = memcmp((uint8_t *)r.cubin + o, k.digest,
                        KW_KEYS_DIGEST_LEN) == 0;
        if (!ok)
            atomic_fetch_add(&m->bad, 1);
        kw__pool_result_destroy(&r);
    }
    return NULL;
}

Test(pool, instant_mode_serves_thousands_of_keys_from_eight_threads)
{
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    kw__pool *p = start_pool(3, 0, 0);
    many m[N_THREADS];
    pthread_t t[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        m[i] = (many){.p = p, .base = (unsigned)i * 100000u};
        cr_assert_eq(pthread_create(&t[i], NULL, compile_many, &m[i]), 0);
    }
    unsigned bad = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(t[i], NULL);
        bad += atomic_load(&m[i].bad);
    }
    cr_assert_eq(bad, 0, "%u of %u answers wrong", bad,
                 N_THREADS * N_PER_THREAD);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.live, 3);
    cr_assert_eq(c.replaced, 0);
    kw__pool_stop(p);
}

/* ---- failures that cost a worker ---------------------------------------- */

Test(pool, crash_fails_only_that_key_and_the_worker_is_replaced)
{
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    setenv("KWARM_TEST_CRASH_FAMILY", "dcp_stable_topk", 1);
    kw__pool *p = start_pool(1, 0, 0);
    kw__pool_result r;
    kw_keys_key bad = fake_key(KW_K_DCP_STABLE_TOPK, 1);
    kw_keys_key good = fake_key(KW_K_INDEX_CONVERSION, 2);
    cr_assert_eq(kw__pool_compile(p, &bad, &r), KW__POOL_ECRASH);
    cr_assert_not_null(r.log);
    cr_assert_str_eq(r.log, "compile worker crashed (signal 6)");
    cr_assert_null(r.cubin);
    kw__pool_result_destroy(&r);
    cr_assert_eq(kw__pool_compile(p, &good, &r), 0, "%s", r.log);
    cr_assert_str_eq(r.entry, "kw_test_entry");
    kw__pool_result_destroy(&r);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.live, 1);
    cr_assert_eq(c.replaced, 1);
    kw__pool_stop(p);
}

Test(pool, hang_is_killed_at_the_timeout_and_the_worker_is_replaced)
{
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    setenv("KWARM_TEST_HANG_FAMILY", "index_conversion", 1);
    kw__pool *p = start_pool(1, 300, 0);
    kw__pool_result r;
    kw_keys_key hang = fake_key(KW_K_INDEX_CONVERSION, 1);
    kw_keys_key good = fake_key(KW_K_DCP_STABLE_TOPK, 2);
    double t0 = now_s();
    cr_assert_eq(kw__pool_compile(p, &hang, &r), KW__POOL_ETIMEOUT);
    double took = now_s() - t0;
    cr_assert_geq(took, 0.3);
    cr_assert_lt(took, 5.0);
    cr_assert_str_eq(r.log, "compile worker killed after 0.3 s");
    kw__pool_result_destroy(&r);
    cr_assert_eq(kw__pool_compile(p, &good, &r), 0, "%s", r.log);
    kw__pool_result_destroy(&r);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.live, 1);
    cr_assert_eq(c.replaced, 1);
    kw__pool_stop(p);
}

Test(pool, tiny_memory_limit_fails_with_the_memory_reason)
{
    kw_keys_key keys[KW_K_NFAMILIES];
    one_key_per_family(keys);
    kw__pool *p = start_pool(1, 20000, 64ull << 20);
    kw__pool_result r;
    int rc = kw__pool_compile(p, &keys[KW_K_DCP_STABLE_TOPK], &r);
    cr_assert_eq(rc, KW__POOL_EMEMLIMIT, "%s: %s", kw_strerror(rc),
                 r.log ? r.log : "(no log)");
    cr_assert_not_null(r.log);
    cr_assert(strncmp(r.log,
                      "compile worker exceeded its memory limit (64 MiB)",
                      49) == 0, "%s", r.log);
    kw__pool_result_destroy(&r);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.live, 1, "the worker is replaced");
    kw__pool_stop(p);
}

/* ---- start failures ------------------------------------------------------ */

Test(pool, missing_helper_fails_start_with_its_path_and_reason)
{
    kw__pool_opts o = {.helper = "/nonexistent/kwarm-compile", .jobs = 2};
    kw__pool *p = NULL;
    char err[512] = "";
    cr_assert_eq(kw__pool_start(&p, &o, err, sizeof err), -ENOENT);
    cr_assert_null(p);
    cr_assert_str_eq(err, "compile helper /nonexistent/kwarm-compile: "
                          "No such file or directory");
    cr_assert(no_children());
}

Test(pool, non_executable_helper_fails_start)
{
    char dir[256], path[512], err[512] = "";
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "pool"), 0);
    cr_assert_eq(kw_test_write_file(dir, "kwarm-compile", "#!/bin/sh\n", 10,
                                    path, sizeof path), 0);
    chmod(path, 0644);
    kw__pool_opts o = {.helper = path, .jobs = 1};
    kw__pool *p = NULL;
    cr_assert_eq(kw__pool_start(&p, &o, err, sizeof err), -EACCES);
    char want[600];
    snprintf(want, sizeof want, "compile helper %s: Permission denied", path);
    cr_assert_str_eq(err, want);
    kw_test_rmtree(dir);
}

Test(pool, helper_that_exits_at_once_fails_start_without_hanging)
{
    kw__pool_opts o = {.helper = "/bin/false", .jobs = 4};
    kw__pool *p = NULL;
    char err[512] = "";
    cr_assert_eq(kw__pool_start(&p, &o, err, sizeof err), KW__POOL_ECRASH);
    cr_assert_str_eq(err, "compile helper /bin/false failed before it was "
                          "ready: exited with status 1");
    cr_assert(no_children());
}

Test(pool, zero_jobs_is_refused)
{
    kw__pool_opts o = {.helper = KW_COMPILE_HELPER_BIN, .jobs = 0};
    kw__pool *p = NULL;
    char err[512] = "";
    cr_assert_eq(kw__pool_start(&p, &o, err, sizeof err), KW_EINVAL);
    cr_assert_null(p);
}

/* ---- cancel, and what stop leaves behind ---------------------------------- */

typedef struct caller {
    kw__pool *p;
    kw_keys_key k;
    int rc;
} caller;

static void *compile_one(void *arg)
{
    caller *c = arg;
    kw__pool_result r;
    c->rc = kw__pool_compile(c->p, &c->k, &r);
    kw__pool_result_destroy(&r);
    return NULL;
}

Test(pool, cancel_ends_running_and_waiting_compiles_promptly)
{
    setenv("KWARM_TEST_HANG_FAMILY", "prefill_chunk_metadata", 1);
    kw__pool *p = start_pool(2, 0, 0); /* default timeout: 120 s */
    caller c[5];
    pthread_t t[5];
    for (int i = 0; i < 5; i++) {
        c[i] = (caller){.p = p, .k = fake_key(KW_K_PREFILL_CHUNK_METADATA, i)};
        cr_assert_eq(pthread_create(&t[i], NULL, compile_one, &c[i]), 0);
    }
    wait_for_counts(p, 2, 3); /* two hang in workers, three wait */
    double t0 = now_s();
    kw__pool_cancel(p);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    double took = now_s() - t0;
    for (int i = 0; i < 5; i++)
        cr_expect_eq(c[i].rc, KW__POOL_ECANCELED, "caller %d: %s", i,
                     kw_strerror(c[i].rc));
    cr_assert_lt(took, 0.5, "cancel took %.3f s", took);
    kw__pool_result r;
    kw_keys_key k = fake_key(KW_K_INDEX_CONVERSION, 9);
    cr_assert_eq(kw__pool_compile(p, &k, &r), KW__POOL_ECANCELED);
    kw__pool_result_destroy(&r);
    kw__pool_stop(p);
    cr_assert(no_children());
}

Test(pool, stop_reaps_every_child_and_closes_every_fd)
{
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    setenv("KWARM_TEST_CRASH_FAMILY", "index_conversion", 1);
    int before = count_fds();
    kw__pool *p = start_pool(3, 0, 0);
    kw__pool_result r;
    kw_keys_key crash = fake_key(KW_K_INDEX_CONVERSION, 1);
    kw_keys_key good = fake_key(KW_K_DCP_STABLE_TOPK, 2);
    cr_assert_eq(kw__pool_compile(p, &crash, &r), KW__POOL_ECRASH);
    kw__pool_result_destroy(&r);
    cr_assert_eq(kw__pool_compile(p, &good, &r), 0);
    kw__pool_result_destroy(&r);
    cr_assert_gt(count_fds(), before);
    kw__pool_stop(p);
    cr_assert(no_children());
    cr_assert_eq(count_fds(), before);
}

Test(pool, find_helper_prefers_the_environment)
{
    char path[512];
    setenv("KWARM_COMPILE_HELPER", "/opt/x/kwarm-compile", 1);
    cr_assert_eq(kw__pool_find_helper(path, sizeof path), 0);
    cr_assert_str_eq(path, "/opt/x/kwarm-compile");
    cr_assert_eq(kw__pool_find_helper(path, 8), KW_ENOSPC);
    unsetenv("KWARM_COMPILE_HELPER");
    /* The test binary sits beside kwarm-compile in the build tree. */
    cr_assert_eq(kw__pool_find_helper(path, sizeof path), 0);
    cr_assert_str_eq(path + strlen(path) - 14, "/kwarm-compile");
    cr_assert_eq(access(path, X_OK), 0);
}

Test(pool, workers_hold_only_stdin_stdout_stderr)
{
    /* Like systemd's LISTEN_FDS in kwarmd: an fd without O_CLOEXEC. */
    int leaky = open("/dev/null", O_RDONLY);
    cr_assert_geq(leaky, 3);
    kw__pool *p = start_pool(2, 0, 0);
    pid_t pids[8];
    cr_assert_eq(worker_pids(pids, 8), 2);
    for (int i = 0; i < 2; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pids[i]);
        DIR *d = opendir(dir);
        cr_assert_not_null(d);
        for (struct dirent *e; (e = readdir(d)) != NULL;)
            if (e->d_name[0] != '.')
                cr_expect_lt(atoi(e->d_name), 3, "worker %d holds fd %s",
                             (int)pids[i], e->d_name);
        closedir(d);
    }
    kw__pool_stop(p);
    close(leaky);
}

/* Workers run with NVRTC's own compile cache off (pool_worker.c), whatever
 * the caller's environment says. */
Test(pool, workers_run_with_the_nvrtc_cache_off)
{
    setenv("CUDA_CACHE_DISABLE", "0", 1);
    setenv("KW_TEST_POOL_MARK", "kept", 1);
    kw__pool *p = start_pool(2, 0, 0);
    pid_t pids[8];
    cr_assert_eq(worker_pids(pids, 8), 2);
    for (int i = 0; i < 2; i++) {
        char path[64], env[65536];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pids[i]);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s: %s", path, strerror(errno));
        size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[n] = '\0';
        int seen = 0, mark = 0;
        for (size_t at = 0; at < n; at += strlen(env + at) + 1) {
            if (strncmp(env + at, "CUDA_CACHE_DISABLE=", 19) == 0) {
                cr_expect_str_eq(env + at, "CUDA_CACHE_DISABLE=1");
                seen++;
            }
            mark += strcmp(env + at, "KW_TEST_POOL_MARK=kept") == 0;
        }
        cr_expect_eq(seen, 1, "worker %d: %d settings", (int)pids[i], seen);
        cr_expect_eq(mark, 1, "worker %d: the rest is passed on", (int)pids[i]);
    }
    kw__pool_stop(p);
    unsetenv("CUDA_CACHE_DISABLE");
    unsetenv("KW_TEST_POOL_MARK");
}

Test(pool, malformed_key_is_refused_without_costing_a_worker)
{
    kw__pool *p = start_pool(1, 0, 0);
    kw__pool_result r;
    kw_keys_key k = fake_key(KW_K_INDEX_CONVERSION, 1);
    k.family = KW_K_NFAMILIES;
    cr_assert_eq(kw__pool_compile(p, &k, &r), KW_EINVAL);
    k = fake_key(KW_K_INDEX_CONVERSION, 1);
    memset(k.arch, 'x', sizeof k.arch);
    cr_assert_eq(kw__pool_compile(p, &k, &r), KW_EINVAL);
    cr_assert_eq(kw__pool_compile(NULL, &k, &r), KW_EINVAL);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.replaced, 0);
    cr_assert_eq(c.live, 1);
    kw__pool_stop(p);
}

/* A limit just above what an idle worker maps lets NVRTC start and fail
 * midway (front end, ptxas or LLVM: each says it differently); every way
 * is reported as the memory limit, and a real compile works again after. */
Test(pool, limit_hit_midway_through_a_compile_names_the_memory_limit)
{
    kw__pool *probe = start_pool(1, 0, 0);
    pid_t pid;
    cr_assert_eq(worker_pids(&pid, 1), 1);
    uint64_t idle = vm_size(pid);
    kw__pool_stop(probe);
#if defined(__SANITIZE_ADDRESS__)
    idle = 0; /* ASan workers limit growth over their start already */
#endif
    kw_keys_key keys[KW_K_NFAMILIES];
    one_key_per_family(keys);
    for (uint64_t extra = 8; extra <= 24; extra += 8) {
        uint64_t limit = idle + (extra << 20);
        kw__pool *p = start_pool(1, 20000, limit);
        kw__pool_result r;
        int rc = kw__pool_compile(p, &keys[KW_K_DCP_STABLE_TOPK], &r);
        cr_expect(rc == KW__POOL_EMEMLIMIT || rc == 0,
                  "idle + %llu MiB: %s: %s", (unsigned long long)extra,
                  kw_strerror(rc), r.log ? r.log : "");
        /* A compile needs more than 8 MiB over an idle worker. */
        cr_expect(extra > 8 || rc != 0, "compiled in idle + 8 MiB");
        if (rc != 0)
            cr_expect(strstr(r.log, "exceeded its memory limit") != NULL);
        kw__pool_result_destroy(&r);
        kw__pool_stop(p);
    }
}

Test(pool, helper_that_never_says_hello_fails_start_at_the_timeout)
{
    char dir[256], path[512], err[512] = "";
    static const char script[] = "#!/bin/sh\nexec sleep 100\n";
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "pool"), 0);
    cr_assert_eq(kw_test_write_file(dir, "kwarm-compile", script,
                                    sizeof script - 1, path, sizeof path), 0);
    chmod(path, 0755);
    kw__pool_opts o = {.helper = path, .jobs = 2, .timeout_ms = 200};
    kw__pool *p = NULL;
    double t0 = now_s();
    cr_assert_eq(kw__pool_start(&p, &o, err, sizeof err), KW__POOL_ETIMEOUT);
    cr_assert_lt(now_s() - t0, 5.0);
    char want[600];
    snprintf(want, sizeof want, "compile helper %s did not start within 0.2 s",
             path);
    cr_assert_str_eq(err, want);
    cr_assert(no_children());
    kw_test_rmtree(dir);
}

/* A worker started by a thread that then exits must live on: warm/ replaces
 * workers from its compile threads (PR_SET_PDEATHSIG would kill it). */
Test(pool, worker_replaced_by_a_thread_outlives_that_thread)
{
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    setenv("KWARM_TEST_CRASH_FAMILY", "index_conversion", 1);
    kw__pool *p = start_pool(1, 0, 0);
    caller c = {.p = p, .k = fake_key(KW_K_INDEX_CONVERSION, 1)};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, compile_one, &c), 0);
    pthread_join(t, NULL);
    cr_assert_eq(c.rc, KW__POOL_ECRASH);
    kw__pool_result r;
    kw_keys_key good = fake_key(KW_K_DCP_STABLE_TOPK, 2);
    cr_assert_eq(kw__pool_compile(p, &good, &r), 0, "%s", r.log);
    kw__pool_result_destroy(&r);
    kw__pool_counts n;
    kw__pool_get_counts(p, &n);
    cr_assert_eq(n.replaced, 1, "the replacement died with its thread");
    kw__pool_stop(p);
}

Test(pool, idle_worker_killed_from_outside_is_replaced_without_failing_a_key)
{
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    kw__pool *p = start_pool(1, 0, 0);
    pid_t pid;
    cr_assert_eq(worker_pids(&pid, 1), 1);
    cr_assert_eq(kill(pid, SIGKILL), 0); /* as the kernel's OOM killer */
    double t0 = now_s();
    while (!is_zombie(pid) && now_s() - t0 < 10)
        sched_yield();
    cr_assert(is_zombie(pid));
    kw__pool_result r;
    kw_keys_key k = fake_key(KW_K_DCP_STABLE_TOPK, 3);
    cr_assert_eq(kw__pool_compile(p, &k, &r), 0, "%s", r.log);
    kw__pool_result_destroy(&r);
    kw__pool_counts c;
    kw__pool_get_counts(p, &c);
    cr_assert_eq(c.replaced, 1);
    cr_assert_eq(c.live, 1);
    kw__pool_stop(p);
    cr_assert(no_children());
}
