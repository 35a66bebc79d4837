/* bench_store.c: the warm pipeline's store stage, group commits against
 * one commit per key (issue 14 point 4).
 *
 * usage: bench_store [--dir DIR] [--dcp-world N] [--runs R] [--json FILE]
 *
 * Warms V4-Flash at DCP world N (default 512: about 3,200 keys on sm_90)
 * into a fresh cache under DIR (default: ./bench-store, on the disk the
 * cache would live on: a tmpfs hides the fsync this is about) with
 * compiles made instant (KWARM_TEST_INSTANT_COMPILE: the worker answers a
 * 256-byte stand-in at once), so what is measured is the store alone.
 * Twice per run, in the same run: store_batch 1 (one transaction, one
 * fsync, per key) and the default group commit.  Prints keys per second,
 * median and best of R runs, and the ratio, as a table and JSON.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_util.h"
#include "kw_cache.h"
#include "kw_warm.h"

#define MAX_RUNS 9

typedef struct done {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool last;
    size_t failed;
} done;

static void on_result(const kw_warm_result *r, void *arg)
{
    done *d = arg;
    d->failed += r->status != KW_WARM_COMPILED;
    if (r->last) {
        pthread_mutex_lock(&d->mu);
        d->last = true;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
}

/* Keys per second storing set into a fresh cache at dir, batch at most
 * batch keys per commit; -1 on failure. */
static double run_once(const char *dir, const kw_keys_set *set, unsigned batch)
{
    char err[512];
    if (bench_rmtree(dir) < 0)
        return -1;
    kw_cache *c = NULL;
    kw_cache_opts co = {.dir = dir, .max_size = 4ull << 30};
    kw_warm *w = NULL;
    if (kw_cache_open(&c, &co, err, sizeof err) < 0)
        return -1;
    kw_warm_opts wo = {.cache = c, .jobs = 2, .store_batch = batch};
    if (kw_warm_open(&w, &wo, err, sizeof err) < 0) {
        fprintf(stderr, "bench_store: %s\n", err);
        kw_cache_close(c);
        return -1;
    }
    done d = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    double t0 = bench_now_ns();
    int rc = kw_warm_submit(w, set->keys, set->nkeys, 0, on_result, &d, NULL);
    pthread_mutex_lock(&d.mu);
    while (rc == 0 && !d.last)
        pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);
    double secs = (bench_now_ns() - t0) / 1e9;
    kw_warm_close(w);
    kw_cache_close(c);
    return rc == 0 && d.failed == 0 ? (double)set->nkeys / secs : -1;
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, "usage: bench_store [--dir DIR] [--dcp-world N] [--runs R] [--json FILE]"))
        return 0;
    const char *dir = "bench-store", *world = "512", *json = NULL;
    int runs = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
        else if (strcmp(argv[i], "--dcp-world") == 0)
            world = argv[i + 1];
        else if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--json") == 0)
            json = argv[i + 1];
    }
    if (runs < 1 || runs > MAX_RUNS) {
        fprintf(stderr, "usage: bench_store [--dir DIR] [--dcp-world N] "
                "[--runs R<=9] [--json FILE]\n");
        return 2;
    }
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    kw_keys_set set = {0};
    if (bench_derive("tests/fixtures/deepseek-v4-flash.json", world, "all", &set) < 0)
        return 1;
    double one[MAX_RUNS], group[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
        one[r] = run_once(dir, &set, 1);
        group[r] = run_once(dir, &set, 0);
        fprintf(stderr, "  run %d: %.0f keys/s one commit per key, %.0f grouped\n",
                r + 1, one[r], group[r]);
        if (one[r] < 0 || group[r] < 0)
            return 1;
    }
    qsort(one, (size_t)runs, sizeof *one, bench_cmp_double);
    qsort(group, (size_t)runs, sizeof *group, bench_cmp_double);
    double m1 = one[runs / 2], mg = group[runs / 2];
    printf("store of %zu keys into %s (instant compiles), %d runs\n", set.nkeys,
           dir, runs);
    printf("  %-22s %12s %12s\n", "", "median k/s", "best k/s");
    printf("  %-22s %12.0f %12.0f\n", "one commit per key", m1, one[runs - 1]);
    printf("  %-22s %12.0f %12.0f\n", "group commits", mg, group[runs - 1]);
    printf("  group / one: %.1fx (median)\n", mg / m1);
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"keys\": %zu, \"one_commit_kps\": %.1f, \"group_kps\": "
                    "%.1f, \"ratio\": %.2f}\n", set.nkeys, m1, mg, mg / m1);
            fclose(f);
        }
    }
    kw_keys_set_destroy(&set);
    return bench_rmtree(dir) == 0 ? 0 : 1;
}
