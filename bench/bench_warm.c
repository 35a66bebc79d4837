/* bench_warm.c: how the warm pipeline scales with --jobs (issue 10).
 *
 * usage: bench_warm [--model PATH] [--dcp-world N] [--arch LIST]
 *                   [--jobs-list 1,2,4,8,16] [--runs R] [--mode both|prewarm|daemon]
 *                   [--json FILE]
 *
 * For each --jobs value: `kwarm prewarm` of the model into a fresh cache,
 * and a warmup through a kwarmd started on a fresh cache, R times each;
 * every key compiles (nothing cached).  Prints, per jobs value, the median
 * and best seconds and the speedup of the medians over --jobs 1, beside
 * the aim (at least 5x at --jobs 8 on the H200 host), as a table and JSON.
 * kwarm and kwarmd are taken from beside this program.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_util.h"
#include "kw_client.h"

#define MAX_JOBS 16
#define MAX_RUNS 9

typedef struct opts {
    const char *model, *world, *arch, *mode, *json;
    unsigned jobs[MAX_JOBS];
    size_t njobs;
    int runs;
} opts;

/* Seconds of one `kwarm prewarm --jobs jobs` into a fresh cache, or -1. */
static double run_prewarm(const opts *o, const char *jobs)
{
    char kwarm[4200], cmd[8600];
    bench_tmp t;
    bench_sibling("kwarm", kwarm, sizeof kwarm);
    if (bench_tmp_make(&t, "bwarm") < 0)
        return -1;
    snprintf(cmd, sizeof cmd, "'%s' prewarm --model '%s' --dcp-world %s --arch %s "
             "--cache %s --jobs %s --quiet --json >/dev/null", kwarm, o->model,
             o->world, o->arch, t.cache, jobs);
    double t0 = bench_now_ns();
    int st = system(cmd);
    double secs = (bench_now_ns() - t0) / 1e9;
    if (bench_tmp_remove(&t) < 0 || st != 0)
        return -1;
    return secs;
}

/* Seconds of one warmup through a fresh kwarmd --jobs jobs, or -1. */
static double run_daemon(const opts *o, const char *config, const char *jobs)
{
    char kwarmd[4200], dep[256];
    bench_tmp t;
    kw_client *c = NULL;
    bench_sibling("kwarmd", kwarmd, sizeof kwarmd);
    if (bench_tmp_make(&t, "bwarm") < 0)
        return -1;
    snprintf(dep, sizeof dep, "{\"dcp_world\": %s, \"arch\": \"%s\"}", o->world,
             o->arch);
    pid_t pid = bench_start_kwarmd(kwarmd, t.sock, t.cache, jobs, NULL, &c);
    double secs = -1;
    if (pid > 0) {
        char *res = NULL;
        kw_client_set_timeout(c, 0);
        double t0 = bench_now_ns();
        int rc = kw_client_warmup(c, config, dep, NULL, NULL, NULL, &res);
        secs = rc == 0 ? (bench_now_ns() - t0) / 1e9 : -1;
        cJSON *doc = rc == 0 ? cJSON_Parse(res) : NULL;
        const cJSON *failed = cJSON_GetObjectItemCaseSensitive(doc, "failed");
        if (!cJSON_IsNumber(failed) || failed->valuedouble != 0)
            secs = -1;
        cJSON_Delete(doc);
        free(res);
        kw_client_close(c);
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    return bench_tmp_remove(&t) == 0 ? secs : -1;
}


/* Median and best of n samples (sorted in place). */
static void stats(double *v, int n, double *median, double *best)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *best = v[0];
}

static int parse(opts *o, int argc, char **argv)
{
    if (argc % 2 == 0) /* a flag without its value, or --help */
        return -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--dcp-world") == 0)
            o->world = v;
        else if (strcmp(a, "--arch") == 0)
            o->arch = v;
        else if (strcmp(a, "--mode") == 0)
            o->mode = v;
        else if (strcmp(a, "--json") == 0)
            o->json = v;
        else if (strcmp(a, "--runs") == 0)
            o->runs = atoi(v);
        else if (strcmp(a, "--jobs-list") == 0) {
            char *copy = strdup(v), *save = NULL;
            o->njobs = 0;
            for (char *t = strtok_r(copy, ",", &save); t && o->njobs < MAX_JOBS;
                 t = strtok_r(NULL, ",", &save))
                o->jobs[o->njobs++] = (unsigned)atoi(t);
            free(copy);
        } else
            return -1;
    }
    return o->runs >= 1 && o->runs <= MAX_RUNS && o->njobs > 0 ? 0 : -1;
}

/* Runs one mode over every jobs value; fills med/best. */
static int measure(const opts *o, bool daemon, const char *config,
                   double *med, double *best)
{
    for (size_t j = 0; j < o->njobs; j++) {
        double v[MAX_RUNS];
        char jobs[16];
        snprintf(jobs, sizeof jobs, "%u", o->jobs[j]);
        for (int r = 0; r < o->runs; r++) {
            v[r] = daemon ? run_daemon(o, config, jobs) : run_prewarm(o, jobs);
            if (v[r] < 0) {
                fprintf(stderr, "bench_warm: %s --jobs %s failed\n",
                        daemon ? "daemon warmup" : "prewarm", jobs);
                return -1;
            }
            fprintf(stderr, "  %s --jobs %-3s run %d: %.2f s\n",
                    daemon ? "daemon " : "prewarm", jobs, r + 1, v[r]);
        }
        stats(v, o->runs, &med[j], &best[j]);
    }
    return 0;
}

static void report(const opts *o, const char *mode, const double *med,
                   const double *best, cJSON *arr)
{
    printf("\n%s: %s at DCP world %s on %s, median of %d\n", mode, o->model,
           o->world, o->arch, o->runs);
    printf("  jobs  median s  best s  speedup  aim\n");
    for (size_t j = 0; j < o->njobs; j++) {
        double sp = med[0] / med[j];
        printf("  %4u  %8.2f  %6.2f  %6.2fx  %s\n", o->jobs[j], med[j], best[j],
               sp, o->jobs[j] == 8 ? ">= 5x on the H200 host" : "");
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "mode", mode);
        cJSON_AddNumberToObject(e, "jobs", o->jobs[j]);
        cJSON_AddNumberToObject(e, "median_s", med[j]);
        cJSON_AddNumberToObject(e, "best_s", best[j]);
        cJSON_AddNumberToObject(e, "speedup", sp);
        cJSON_AddItemToArray(arr, e);
    }
}

int main(int argc, char **argv)
{
    opts o = {.model = "tests/fixtures/deepseek-v4-flash.json", .world = "8",
              .arch = "sm_90", .mode = "both", .runs = 1,
              .jobs = {1, 2, 4, 8, 16}, .njobs = 5};
    if (parse(&o, argc, argv) < 0) {
        bool help = argc == 2 && strcmp(argv[1], "--help") == 0;
        fprintf(help ? stdout : stderr, "usage: bench_warm [--model PATH] [--dcp-world N] "
                "[--arch LIST] [--jobs-list 1,2,4,8,16] [--runs R<=9] "
                "[--mode both|prewarm|daemon] [--json FILE]\n");
        return help ? 0 : 2;
    }
    char *config = bench_slurp(o.model);
    double med[MAX_JOBS], best[MAX_JOBS];
    cJSON *arr = cJSON_CreateArray();
    int rc = config ? 0 : -1;
    for (int m = 0; rc == 0 && m < 2; m++) {
        bool daemon = m == 1;
        if (strcmp(o.mode, "both") != 0 &&
            strcmp(o.mode, daemon ? "daemon" : "prewarm") != 0)
            continue;
        if ((rc = measure(&o, daemon, config, med, best)) == 0)
            report(&o, daemon ? "daemon warmup" : "prewarm", med, best, arr);
    }
    char *text = cJSON_Print(arr);
    if (rc == 0 && o.json != NULL) {
        FILE *f = fopen(o.json, "w");
        if (f != NULL) {
            fprintf(f, "%s\n", text);
            fclose(f);
        }
    }
    if (rc == 0)
        printf("\n%s\n", text);
    free(text);
    cJSON_Delete(arr);
    free(config);
    return rc == 0 ? 0 : 1;
}
