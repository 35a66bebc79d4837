/* bench_pool.c: NVRTC compiles through warm/'s worker pool at several
 * --jobs, the measurement behind "compiles run in processes" (issue 10).
 *
 * usage: bench_pool [--model CONFIG] [--dcp-world N] [--keys N]
 *                   [--jobs 1,2,4,8,16] [--repeat R] [--threads]
 *
 * Derives the model's keys (default DeepSeek-V4-Flash at DCP world 8),
 * takes the first N distinct ones (default 16) and, for each jobs value,
 * starts a pool of that many kwarm-compile workers (start time shown apart)
 * and compiles all N keys from `jobs` caller threads.  --threads adds the
 * same compiles as in-process threads (kw_keys_compile), which is what the
 * pool replaces: on the H200 host those do not run in parallel.  No cache is
 * involved, NVRTC's own included (bench_real_compiles), so every run
 * compiles for real.  With --repeat R each row is
 * run R times and the fastest is shown (a shared machine is noisy).  The helper is found as kwarmd
 * finds it (KWARM_COMPILE_HELPER, else beside this binary).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "pool.h"

#define MAX_RUNS 16

typedef struct run {
    kw__pool *pool;          /* NULL: in-process threads */
    const kw_keys_key *keys;
    size_t nkeys;
    _Atomic size_t next;
    _Atomic size_t failed;
    _Atomic uint64_t worker_us; /* sum of compile times in the workers */
} run;

/* One caller: compiles keys until none is left. */
static void *caller(void *arg)
{
    run *r = arg;
    for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->nkeys;) {
        int rc;
        double secs;
        if (r->pool) {
            kw__pool_result res;
            rc = kw__pool_compile(r->pool, &r->keys[i], &res);
            secs = res.seconds;
            if (rc < 0)
                fprintf(stderr, "bench_pool: %s\n",
                        res.log ? res.log : kw_strerror(rc));
            kw__pool_result_destroy(&res);
        } else {
            kw_jit_result res;
            rc = kw_keys_compile(&r->keys[i], false, &res);
            secs = res.seconds;
            kw_jit_result_destroy(&res);
        }
        if (rc < 0)
            atomic_fetch_add(&r->failed, 1);
        atomic_fetch_add(&r->worker_us, (uint64_t)(secs * 1e6));
    }
    return NULL;
}

/* Compiles every key from `jobs` threads; returns the wall seconds. */
static double timed_run(run *r, unsigned jobs)
{
    pthread_t t[256];
    double t0 = bench_now_ns();
    for (unsigned i = 0; i < jobs; i++)
        if (pthread_create(&t[i], NULL, caller, r) != 0)
            jobs = i;
    for (unsigned i = 0; i < jobs; i++)
        pthread_join(t[i], NULL);
    return (bench_now_ns() - t0) / 1e9;
}

/* One timed run: a fresh pool (procs) or none, every key compiled.
 * Stores its start ms, wall s, summed compile s and failures. */
static int one_run(const kw_keys_key *keys, size_t n, unsigned jobs,
                   bool procs, double out[3], size_t *failed)
{
    run r = {.keys = keys, .nkeys = n};
    out[0] = 0;
    if (procs) {
        char err[512] = "";
        kw__pool_opts o = {.jobs = jobs};
        double t0 = bench_now_ns();
        if (kw__pool_start(&r.pool, &o, err, sizeof err) < 0) {
            fprintf(stderr, "bench_pool: %s\n", err);
            return -1;
        }
        out[0] = (bench_now_ns() - t0) / 1e6;
    }
    out[1] = timed_run(&r, jobs);
    out[2] = atomic_load(&r.worker_us) / 1e6;
    *failed = atomic_load(&r.failed);
    kw__pool_stop(r.pool);
    return 0;
}

/* Runs one row of the table (the fastest of `repeat` runs); *base is the
 * first row's wall time, which the speedups are against. */
static int row(const kw_keys_key *keys, size_t n, unsigned jobs, bool procs,
               unsigned repeat, double *base)
{
    double best[3] = {0}, cur[3];
    size_t failed = 0, f;
    for (unsigned i = 0; i < repeat; i++) {
        if (one_run(keys, n, jobs, procs, cur, &f) < 0)
            return -1;
        failed += f;
        if (i == 0 || cur[1] < best[1])
            memcpy(best, cur, sizeof best);
    }
    if (*base == 0)
        *base = best[1];
    printf("%-9s %5u %5zu %9.2f %9.3f %8.2fx %10.2f %6zu\n",
           procs ? "processes" : "threads", jobs, n, best[0], best[1],
           *base / best[1], best[2], failed);
    fflush(stdout);
    return 0;
}

/* Parses "1,2,4" into jobs[]; returns how many, 0 on a bad list. */
static size_t parse_jobs(const char *s, unsigned *jobs)
{
    size_t n = 0;
    for (char *end; *s != '\0' && n < MAX_RUNS; s = *end ? end + 1 : end) {
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0 || v > 256 || (*end != ',' && *end != '\0'))
            return 0;
        jobs[n++] = (unsigned)v;
    }
    return n;
}

/* The command line. */
typedef struct args {
    const char *model, *world, *jobs;
    size_t keys;
    unsigned repeat;
    bool threads;
} args;

/* Parses argv into *a.  Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){"tests/fixtures/deepseek-v4-flash.json", "8", "1,2", 16, 1,
                false};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--threads") == 0) {
            a->threads = true;
            continue;
        }
        if (v && strcmp(argv[i], "--model") == 0)
            a->model = v;
        else if (v && strcmp(argv[i], "--dcp-world") == 0)
            a->world = v;
        else if (v && strcmp(argv[i], "--jobs") == 0)
            a->jobs = v;
        else if (v && strcmp(argv[i], "--keys") == 0)
            a->keys = strtoul(v, NULL, 10);
        else if (v && strcmp(argv[i], "--repeat") == 0)
            a->repeat = (unsigned)strtoul(v, NULL, 10);
        else {
            fprintf(stderr, "usage: bench_pool [--model CONFIG] [--dcp-world N] "
                    "[--keys N] [--jobs 1,2,4,8,16] [--repeat R] [--threads]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
        i++;
    }
    return a->keys == 0 || a->repeat == 0 ? 2 : -1;
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    bench_real_compiles();
    unsigned jobs[MAX_RUNS];
    size_t njobs = parse_jobs(a.jobs, jobs);
    kw_keys_set set;
    if (njobs == 0 || bench_derive(a.model, a.world, "all", &set) < 0)
        return 2;
    size_t n = a.keys < set.nkeys ? a.keys : set.nkeys;
    printf("%zu distinct keys of %s at DCP world %s, best of %u\n", n,
           a.model, a.world, a.repeat);
    printf("%-9s %5s %5s %9s %9s %9s %10s %6s\n", "MODE", "JOBS", "KEYS",
           "start ms", "wall s", "speedup", "compile s", "FAILED");
    double base = 0, tbase = 0;
    rc = 0;
    for (size_t j = 0; j < njobs && rc == 0; j++)
        rc = row(set.keys, n, jobs[j], true, a.repeat, &base);
    for (size_t j = 0; j < njobs && rc == 0 && a.threads; j++)
        rc = row(set.keys, n, jobs[j], false, a.repeat, &tbase);
    kw_keys_set_destroy(&set);
    return rc < 0 ? 1 : 0;
}
