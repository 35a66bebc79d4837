/* bench_ops.c: what libkwarm's launch contract costs the host (issue 22).
 *
 * usage: bench_ops [--model CONFIG] [--calls N] [--rounds R] [--json FILE]
 *
 * Starts kwarmd (from beside this program; it compiles what the cache
 * lacks), loads DeepSeek-V3.2's kernels with kw_ops_load() in this
 * process (GPU 0), then times on the host, per call, for three ops at a
 * small shape (indexer_topk over 4 rows, index_conversion of 4 rows, the
 * paged indexer_logits of 2 requests):
 *   kw_ops_run     dispatch, checks, geometry, lookup, parameters and
 *                  cuLaunchKernel, on the legacy stream
 *   bare launch    cuLaunchKernel of the same function with parameters
 *                  built once (kw_cuda_launch_on), the floor
 * N launches a round (the GPU drains between rounds), the median of R
 * rounds and their spread; then the load: kw_ops_load() timed from a
 * warm kwarmd, R times.  A table and JSON.  Needs a GPU.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "bench_util.h"
#include "kw_client.h"
#include "kw_err.h"
#include "kw_ops.h"

#define USAGE "usage: bench_ops [--model CONFIG] [--calls N] [--rounds R] " \
              "[--json FILE]\n"

typedef struct bench_op {
    const char *name;
    kw_launch_op op;
    kw_launch_call call;
} bench_op;

/* Device buffers big enough for every small call below. */
static int small_calls(kw_cuda *cu, bench_op *ops, uint64_t *bufs)
{
    for (int i = 0; i < 4; i++)
        if (kw_cuda_alloc(cu, 64u << 20, &bufs[i]) < 0 ||
            kw_cuda_memset(cu, bufs[i], 0, 64u << 20) < 0)
            return -1;
    int64_t a = (int64_t)bufs[0], b = (int64_t)bufs[1], c = (int64_t)bufs[2];
    int64_t o = (int64_t)bufs[3];
    ops[0] = (bench_op){"indexer_topk", KW_LAUNCH_INDEXER_TOPK,
                        {.a = {a, 0, 0, 4, 4096, o, b}}};
    ops[1] = (bench_op){"index_conversion", KW_LAUNCH_INDEX_CONVERSION, {{0}}};
    int64_t *ic = ops[1].call.a;
    ic[KW_LAUNCH_IC_REQ_ID] = b;
    ic[KW_LAUNCH_IC_BLOCK_TABLE] = c;
    ic[KW_LAUNCH_IC_TOPK_POS] = a;
    ic[KW_LAUNCH_IC_NUM_ROWS] = 4;
    ic[KW_LAUNCH_IC_NUM_REQS] = 1;
    ic[KW_LAUNCH_IC_WIDTH] = 1280;
    ic[KW_LAUNCH_IC_OUT] = o;
    ops[2] = (bench_op){"indexer_logits_paged", KW_LAUNCH_INDEXER_LOGITS_PAGED,
                        {.a = {a, b, c, b, b, b, 2, 4, 256, o, 64, 1, 64,
                               128}}};
    return 0;
}

typedef struct stat3 {
    double med, lo, hi;
} stat3;

static stat3 summarise(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return (stat3){v[n / 2], v[0], v[n - 1]};
}

/* Host microseconds per call of op through kw_ops_run (bare: false) or
 * through a bare launch of the same kernel (bare: true). */
static stat3 time_calls(kw_ops *ops, kw_cuda *cu, const bench_op *b,
                        kw_cuda_fn *fn, int calls, int rounds)
{
    double *us = calloc((size_t)rounds, sizeof(*us));
    int64_t f[KW_LAUNCH_MAX_FIELDS];
    kw_launch_params p;
    kw_launch_geo g;
    kw_ops_dispatch(ops, b->op, &b->call, f, NULL);
    kw_launch_params_build(b->op, f, kw_ops_deploy(ops), &b->call, &p);
    kw_launch_geometry(b->op, f, &b->call, 132, &g);
    for (int r = 0; r < rounds; r++) {
        kw_cuda_sync(cu);
        double t0 = bench_now_ns();
        for (int i = 0; i < calls; i++) {
            int rc = fn ? kw_cuda_launch_on(fn, g.grid, g.block, g.shmem,
                                            p.args, 0)
                        : kw_ops_run(ops, b->op, &b->call, 0);
            if (rc < 0) {
                fprintf(stderr, "bench_ops: %s: %s\n", b->name,
                        fn ? kw_cuda_last_error(cu) : kw_ops_last_error(ops));
                exit(1);
            }
        }
        us[r] = (bench_now_ns() - t0) / 1e3 / calls;
    }
    kw_cuda_sync(cu);
    stat3 s = summarise(us, rounds);
    free(us);
    return s;
}

/* The loaded key's digest of b's call, for the bare launch's own load. */
typedef struct find_ctx {
    int fam;
    const int64_t *f;
    char digest[65];
} find_ctx;

static void find_one(void *ctx, int fam, const int64_t *fields,
                     const char *digest)
{
    find_ctx *x = ctx;
    if (fam == x->fam &&
        memcmp(fields, x->f, kw_launch_nfields(fam) * sizeof(*fields)) == 0)
        snprintf(x->digest, sizeof(x->digest), "%s", digest);
}

static kw_cuda_fn *bare_fn(kw_ops *ops, kw_cuda *cu, kw_client *c,
                           const bench_op *b)
{
    int64_t f[KW_LAUNCH_MAX_FIELDS];
    bool loaded = false;
    kw_ops_dispatch(ops, b->op, &b->call, f, &loaded);
    find_ctx x = {kw_launch_op_family(b->op), f, ""};
    kw_ops_each(ops, find_one, &x);
    kw_cuda_fn *fn = NULL;
    if (!loaded || kw_client_load(c, cu, x.digest, &fn) < 0) {
        fprintf(stderr, "bench_ops: %s: no loaded key (%s)\n", b->name,
                kw_client_last_error(c));
        exit(1);
    }
    return fn;
}

static int parse(int argc, char **argv, const char **model, int *calls,
                 int *rounds, const char **json)
{
    for (int i = 1; i < argc; i++) {
        bool more = i + 1 < argc;
        if (strcmp(argv[i], "--model") == 0 && more)
            *model = argv[++i];
        else if (strcmp(argv[i], "--calls") == 0 && more)
            *calls = atoi(argv[++i]);
        else if (strcmp(argv[i], "--rounds") == 0 && more)
            *rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--json") == 0 && more)
            *json = argv[++i];
        else {
            fprintf(stderr, "bench_ops: unknown or incomplete option %s\n%s",
                    argv[i], USAGE);
            return 2;
        }
    }
    if (*calls < 1 || *rounds < 1) {
        fprintf(stderr, "bench_ops: --calls and --rounds must be >= 1\n");
        return 2;
    }
    return 0;
}

/* kw_ops_load() R times from the warm kwarmd: milliseconds. */
static stat3 time_loads(const kw_ops_opts *o, int rounds)
{
    double *ms = calloc((size_t)rounds, sizeof(*ms));
    for (int r = 0; r < rounds; r++) {
        kw_ops *x = NULL;
        char err[512];
        double t0 = bench_now_ns();
        if (kw_ops_load(&x, o, err, sizeof(err)) < 0) {
            fprintf(stderr, "bench_ops: %s\n", err);
            exit(1);
        }
        ms[r] = (bench_now_ns() - t0) / 1e6;
        kw_ops_free(x);
    }
    stat3 s = summarise(ms, rounds);
    free(ms);
    return s;
}

static void report(const bench_op *b, stat3 run[3], stat3 bare[3],
                   stat3 load, const char *json)
{
    printf("%-22s %14s %14s %8s\n", "op (host, per call)", "kw_ops_run us",
           "bare launch us", "ratio");
    cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "ops");
    for (int i = 0; i < 3; i++) {
        printf("%-22s %6.2f (%.2f-%.2f) %6.2f (%.2f-%.2f) %6.2fx\n", b[i].name,
               run[i].med, run[i].lo, run[i].hi, bare[i].med, bare[i].lo,
               bare[i].hi, run[i].med / bare[i].med);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "op", b[i].name);
        cJSON_AddNumberToObject(o, "kw_ops_run_us", run[i].med);
        cJSON_AddNumberToObject(o, "bare_launch_us", bare[i].med);
        cJSON_AddItemToArray(arr, o);
    }
    printf("kw_ops_load from a warm kwarmd (26 keys): %.2f ms (%.2f-%.2f)\n",
           load.med, load.lo, load.hi);
    cJSON_AddNumberToObject(j, "load_ms", load.med);
    char *text = cJSON_PrintUnformatted(j);
    printf("%s\n", text);
    FILE *f = json ? fopen(json, "w") : NULL;
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    cJSON_free(text);
    cJSON_Delete(j);
}

int main(int argc, char **argv)
{
    const char *model = "tests/fixtures/deepseek-v3.2-exp.json", *json = NULL;
    int calls = 20000, rounds = 7, rc;
    if (bench_help(argc, argv, USAGE))
        return 0;
    if ((rc = parse(argc, argv, &model, &calls, &rounds, &json)) != 0)
        return rc;
    char err[512], bin[PATH_MAX + 16];
    kw_cuda *cu = NULL;
    if (kw_cuda_open(&cu, 0, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_ops: %s\n", err);
        return 1;
    }
    bench_tmp t;
    kw_client *c = NULL;
    bench_sibling("kwarmd", bin, sizeof(bin));
    char *config = bench_slurp(model);
    pid_t pid = bench_tmp_make(&t, "ops") < 0 || !config
                    ? -1 : bench_start_kwarmd(bin, t.sock, t.cache, "16",
                                              NULL, &c);
    if (pid < 0) {
        fprintf(stderr, "bench_ops: cannot start %s or read %s\n", bin, model);
        return 1;
    }
    kw_ops_opts o = {.socket = t.sock, .config_json = config, .cuda = cu,
                     .timeout_ms = 600000};
    kw_ops *ops = NULL;
    if (kw_ops_load(&ops, &o, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_ops: %s\n", err);
        return 1;
    }
    bench_op b[3];
    uint64_t bufs[4];
    stat3 run[3], bare[3];
    if (small_calls(cu, b, bufs) < 0)
        return 1;
    for (int i = 0; i < 3; i++) {
        kw_cuda_fn *fn = bare_fn(ops, cu, c, &b[i]);
        run[i] = time_calls(ops, cu, &b[i], NULL, calls, rounds);
        bare[i] = time_calls(ops, cu, &b[i], fn, calls, rounds);
        kw_cuda_unload(fn);
    }
    report(b, run, bare, time_loads(&o, rounds), json);
    for (int i = 0; i < 4; i++)
        kw_cuda_free(cu, bufs[i]);
    kw_ops_free(ops);
    kw_client_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    bench_tmp_remove(&t);
    free(config);
    kw_cuda_close(cu);
    return 0;
}
