/* bench_kernels.c: each kernel family at production size on the GPU, its
 * achieved bandwidth beside the device-to-device copy bandwidth measured in
 * the same run, each ratio beside its aim, plus a correctness check of the
 * timed output.
 *
 * usage: bench_kernels [--model CONFIG] [--json FILE] [--dump DIR]
 *                      [--iters N] [--runs N] [--family F]...
 *
 * Keys come from the model (default tests/fixtures/deepseek-v3.2-exp.json)
 * under DCP world 8, rank 0, so every family has keys: the first key of
 * each family and every index_conversion key are timed.  Each of --runs
 * runs (default 5; the machine is noisy) times a 1 GiB copy and then every
 * kernel; a kernel's ratio in a run is its bandwidth over that run's copy,
 * and the table gives the median and the best of them.  --family (once
 * per family) times only the families named: a whole DeepSeek-V4-Flash
 * run printed nothing within 150 s on the H200 (2026-11-30), the same
 * with --family index_conversion --family dcp_pack_topk_candidates took
 * 8 s.  --dump writes the
 * dcp_stable_topk cubin and its entry name into DIR for the torch
 * comparison (bench/topk_torch.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_config.h"
#include "cuda_dev.h" /* kw_cuda, kw_cuda_dev_ops */
#include "kw_err.h"
#include "kw_keys.h"
#include "bench_util.h"

#define MAX_RUNS 32

typedef struct opts {
    const char *model, *json, *dump;
    int iters, runs;
    bool family[KW_K_NFAMILIES]; /* --family given: time only these */
    bool some_family;
} opts;

/* One timed key: what stays loaded across runs, and its samples. */
typedef struct row {
    char family[40], fields[256];
    const kw_keys_key *key;
    kw_cuda_fn *fn;
    kw_k_case *c;
    kw_k_dev dev;
    size_t bytes;
    double ms[MAX_RUNS], frac[MAX_RUNS];
    double ms_med, ms_best, frac_med, frac_best, aim;
    const char *check;
    int rc;
} row;

/* Two 1 GiB buffers for the copy, allocated once. */
typedef struct copy_bufs {
    uint64_t a, b;
    size_t n;
} copy_bufs;

/* Copy bandwidth: a 1 GiB device-to-device copy, read + write bytes. */
static double copy_gbps(kw_cuda *cu, const copy_bufs *cb, int iters)
{
    kw_cuda_timer *t = NULL;
    float ms = 0;
    double gbps = 0;
    if (kw_cuda_timer_new(cu, &t) < 0)
        return 0;
    kw_cuda_d2d(cu, cb->b, cb->a, cb->n);
    kw_cuda_timer_start(t);
    for (int i = 0; i < iters; i++)
        kw_cuda_d2d(cu, cb->b, cb->a, cb->n);
    if (kw_cuda_timer_stop_ms(t, &ms) == 0 && ms > 0)
        gbps = 2.0 * (double)cb->n * iters / (ms / 1e3) / 1e9;
    kw_cuda_timer_free(t);
    return gbps;
}

/* Renders a key's fields as "name=value ..." into buf. */
static void fields_text(const kw_keys_key *k, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < kw_keys_nfields(k->family) && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=%lld", i ? " " : "",
                              kw_keys_field_name(k->family, i),
                              (long long)k->fields[i]);
}

/* The key's top-k (field "num_topk_tokens" or "topk"); 0 when none. */
static long long key_topk(const kw_keys_key *k)
{
    for (size_t i = 0; i < kw_keys_nfields(k->family); i++) {
        const char *n = kw_keys_field_name(k->family, i);
        if (strcmp(n, "num_topk_tokens") == 0 || strcmp(n, "topk") == 0)
            return (long long)k->fields[i];
    }
    return 0;
}

/* The aimed fraction of copy bandwidth; 0 where bandwidth is not the
 * measure.  Issue 14 asks 0.70 at top-k 512 (DeepSeek-V4-Flash) of
 * index_conversion and the pack; the earlier aim, at least half of copy,
 * stands for the rest of the memory-bound families.  dcp_stable_topk is
 * compute-bound (its aim is against torch.topk, bench/topk_torch.py) and
 * prefill_chunk_metadata is 10 MB, so latency-bound. */
static double aim_of(const kw_keys_key *k)
{
    switch (k->family) {
    case KW_K_INDEX_CONVERSION:
    case KW_K_DCP_PACK_TOPK_CANDIDATES:
        return key_topk(k) <= 512 ? 0.70 : 0.50;
    case KW_K_COMPRESSED_SLOT_MAPPING:
        return 0.50;
    default:
        return 0;
    }
}

/* Writes the cubin and entry name of k for the torch comparison. */
static void dump(const char *dir, const kw_jit_result *r)
{
    char path[512];
    snprintf(path, sizeof path, "%s/stable_topk.cubin", dir);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(r->cubin, 1, r->cubin_len, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/stable_topk.entry", dir);
    if ((f = fopen(path, "w")) != NULL) {
        fprintf(f, "%s\n", r->lowered_name);
        fclose(f);
    }
}

/* Times one launch of case c (after warm-up) over iters launches. */
static int time_case(kw_cuda *cu, kw_k_case *c, const kw_k_dev *dev,
                     int iters, double *ms_out)
{
    kw_cuda_timer *t = NULL;
    float ms = 0;
    int rc = kw_cuda_timer_new(cu, &t);
    for (int i = 0; rc == 0 && i < 3; i++)
        rc = kw_k_case_launch(c, dev);
    if (rc == 0)
        rc = kw_cuda_timer_start(t);
    for (int i = 0; rc == 0 && i < iters; i++)
        rc = kw_k_case_launch(c, dev);
    if (rc == 0)
        rc = kw_cuda_timer_stop_ms(t, &ms);
    kw_cuda_timer_free(t);
    *ms_out = ms / iters;
    return rc;
}

/* Compiles and loads key k and uploads its production-size case. */
static int setup_key(kw_cuda *cu, const kw_keys_key *k, const opts *o,
                     row *out)
{
    kw_jit_result r;
    kw_k_shape sh;
    memset(out, 0, sizeof *out);
    out->key = k;
    out->aim = aim_of(k);
    snprintf(out->family, sizeof out->family, "%s",
             kw_keys_family_name(k->family));
    fields_text(k, out->fields, sizeof out->fields);
    int rc = kw_keys_compile(k, false, &r);
    if (rc == 0 && o->dump && k->family == KW_K_DCP_STABLE_TOPK)
        dump(o->dump, &r);
    if (rc == 0)
        rc = kw_cuda_load(cu, r.cubin, r.cubin_len, r.lowered_name, &out->fn);
    kw_cuda_dev_ops(cu, out->fn, &out->dev);
    if (rc == 0)
        rc = kw_k_shape_preset(k->family, KW_K_PRESET_PRODUCTION, &sh);
    if (rc == 0)
        rc = kw_k_case_new(&out->c, k->family, k->fields, &sh, 42);
    if (rc == 0)
        rc = kw_k_case_upload(out->c, &out->dev);
    if (rc == 0)
        out->bytes = kw_k_case_bytes(out->c);
    if (rc < 0)
        fprintf(stderr, "bench %s: %s %s\n%s\n", out->family, kw_strerror(rc),
                kw_cuda_last_error(cu), r.log ? r.log : "");
    kw_jit_result_destroy(&r);
    return out->rc = rc;
}

/* Checks the last timed output against the CPU reference; frees all. */
static void finish_key(row *w, int runs)
{
    kw_k_check_result chk = {0};
    double s[MAX_RUNS];
    if (w->rc == 0) {
        int crc = kw_k_case_compare(w->c, &w->dev, &chk);
        w->check = crc == 0 ? "ok" : crc == KW_EMISMATCH ? "MISMATCH" : "error";
        memcpy(s, w->ms, sizeof(double) * (size_t)runs);
        qsort(s, (size_t)runs, sizeof *s, bench_cmp_double);
        w->ms_med = s[runs / 2], w->ms_best = s[0];
        memcpy(s, w->frac, sizeof(double) * (size_t)runs);
        qsort(s, (size_t)runs, sizeof *s, bench_cmp_double);
        w->frac_med = s[runs / 2], w->frac_best = s[runs - 1];
    } else {
        w->check = "error";
    }
    kw_k_case_free(w->c, &w->dev);
    kw_cuda_unload(w->fn);
}

static const char *verdict(const row *w)
{
    if (w->aim <= 0)
        return "-";
    return w->frac_med >= w->aim ? "met" : "NOT met";
}

static void print_json(FILE *json, const row *rows, size_t n, int runs,
                       double copy, const char *dev)
{
    fprintf(json, "{\"device\": \"%s\", \"runs\": %d, \"copy_gbps_median\": "
            "%.1f, \"kernels\": [", dev, runs, copy);
    for (size_t i = 0; i < n; i++) {
        const row *w = &rows[i];
        fprintf(json, "%s\n {\"family\": \"%s\", \"key\": \"%s\", "
                "\"bytes\": %zu, \"ms_median\": %.5f, \"ms_best\": %.5f, "
                "\"fraction_of_copy_median\": %.3f, "
                "\"fraction_of_copy_best\": %.3f, \"aim\": %.2f, "
                "\"check\": \"%s\", \"ms\": [", i ? "," : "", w->family,
                w->fields, w->bytes, w->ms_med, w->ms_best, w->frac_med,
                w->frac_best, w->aim, w->check);
        for (int r = 0; r < runs; r++)
            fprintf(json, "%s%.5f", r ? ", " : "", w->ms[r]);
        fprintf(json, "]}");
    }
    fprintf(json, "]}\n");
}

static void print_rows(FILE *json, const row *rows, size_t n, int runs,
                       const double *copies, const char *dev)
{
    double s[MAX_RUNS];
    memcpy(s, copies, sizeof(double) * (size_t)runs);
    qsort(s, (size_t)runs, sizeof *s, bench_cmp_double);
    printf("device: %s; device-to-device copy (read + write): median %.0f "
           "GB/s, best %.0f GB/s over %d runs\n\n", dev, s[runs / 2],
           s[runs - 1], runs);
    printf("%-25s %9s %9s %9s %9s %8s %8s %5s %-8s %-8s %s\n", "FAMILY",
           "MED us", "BEST us", "MB moved", "GB/s", "x copy", "best", "AIM",
           "", "CHECK", "KEY");
    for (size_t i = 0; i < n; i++) {
        const row *w = &rows[i];
        char aim[16] = "-";
        if (w->aim > 0)
            snprintf(aim, sizeof aim, "%.2f", w->aim);
        printf("%-25s %9.1f %9.1f %9.1f %9.0f %8.2f %8.2f %5s %-8s %-8s %s\n",
               w->family, w->ms_med * 1e3, w->ms_best * 1e3, w->bytes / 1e6,
               w->ms_med > 0 ? w->bytes / (w->ms_med / 1e3) / 1e9 : 0,
               w->frac_med, w->frac_best, aim, verdict(w), w->check,
               w->fields);
    }
    if (json != NULL)
        print_json(json, rows, n, runs, s[runs / 2], dev);
}

/* The family named name, or -1. */
static int family_of(const char *name)
{
    for (int f = 0; f < KW_K_NFAMILIES; f++)
        if (strcmp(kw_keys_family_name((kw_k_family)f), name) == 0)
            return f;
    return -1;
}

static int parse(opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v != NULL && strcmp(argv[i], "--model") == 0)
            o->model = v;
        else if (v != NULL && strcmp(argv[i], "--json") == 0)
            o->json = v;
        else if (v != NULL && strcmp(argv[i], "--dump") == 0)
            o->dump = v;
        else if (v != NULL && strcmp(argv[i], "--iters") == 0)
            o->iters = atoi(v) > 0 ? atoi(v) : 20;
        else if (v != NULL && strcmp(argv[i], "--runs") == 0)
            o->runs = atoi(v) > 0 && atoi(v) <= MAX_RUNS ? atoi(v) : 5;
        else if (v != NULL && strcmp(argv[i], "--family") == 0 &&
                 family_of(v) >= 0)
            o->family[family_of(v)] = o->some_family = true;
        else {
            fprintf(stderr, "usage: bench_kernels [--model CONFIG] [--json FILE] "
                    "[--dump DIR] [--iters N] [--runs N] [--family F]...\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
        i++;
    }
    return -1;
}

/* Sets up the timed keys of set: the first of each family, and every
 * index_conversion key.  Returns how many rows it filled. */
static size_t setup_all(kw_cuda *cu, const kw_keys_set *set, const opts *o,
                        row *rows)
{
    size_t n = 0;
    bool seen[KW_K_NFAMILIES] = {false};
    for (size_t i = 0; i < set->nkeys; i++) {
        const kw_keys_key *k = &set->keys[i];
        if ((seen[k->family] && k->family != KW_K_INDEX_CONVERSION) ||
            (o->some_family && !o->family[k->family]))
            continue;
        seen[k->family] = true;
        fprintf(stderr, "bench_kernels: %s: compile, inputs at production size\n",
                kw_keys_family_name(k->family));
        setup_key(cu, k, o, &rows[n++]);
    }
    return n;
}

/* Each run: the copy, then every key, so a ratio pairs measurements taken
 * moments apart. */
static void time_runs(kw_cuda *cu, const copy_bufs *cb, const opts *o,
                      row *rows, size_t n, double *copies)
{
    for (int r = 0; r < o->runs; r++) {
        copies[r] = copy_gbps(cu, cb, o->iters);
        for (size_t i = 0; i < n; i++) {
            row *w = &rows[i];
            if (w->rc == 0)
                w->rc = time_case(cu, w->c, &w->dev, o->iters, &w->ms[r]);
            double gbps = w->ms[r] > 0 ? w->bytes / (w->ms[r] / 1e3) / 1e9 : 0;
            w->frac[r] = copies[r] > 0 ? gbps / copies[r] : 0;
        }
        fprintf(stderr, "bench_kernels: run %d of %d timed\n", r + 1, o->runs);
    }
}

int main(int argc, char **argv)
{
    opts o = {.model = "tests/fixtures/deepseek-v3.2-exp.json", .iters = 20, .runs = 5};
    kw_keys_set set = {0};
    kw_cuda *cu = NULL;
    copy_bufs cb = {0, 0, (size_t)1 << 30};
    double copies[MAX_RUNS] = {0};
    char err[512], name[128] = "";
    int rc = parse(&o, argc, argv), bad = 0;
    if (rc >= 0)
        return rc;
    if (kw_cuda_open(&cu, 0, err, sizeof err) < 0) {
        fprintf(stderr, "bench_kernels: needs a GPU: %s\n", err);
        return 1;
    }
    kw_cuda_device_info(cu, name, sizeof name, NULL, NULL, NULL);
    if (bench_derive(o.model, "8", "0", &set) < 0)
        return 2;
    row *rows = calloc(set.nkeys, sizeof *rows);
    if (rows == NULL || kw_cuda_alloc(cu, cb.n, &cb.a) < 0 ||
        kw_cuda_alloc(cu, cb.n, &cb.b) < 0 ||
        kw_cuda_memset(cu, cb.a, 1, cb.n) < 0) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        return 1;
    }
    size_t n = setup_all(cu, &set, &o, rows);
    time_runs(cu, &cb, &o, rows, n, copies);
    for (size_t i = 0; i < n; i++) {
        fprintf(stderr, "bench_kernels: %s: output against the CPU reference\n",
                rows[i].family);
        finish_key(&rows[i], o.runs);
        bad |= rows[i].rc < 0 || strcmp(rows[i].check, "ok") != 0;
    }
    FILE *json = o.json ? fopen(o.json, "w") : NULL;
    print_rows(json, rows, n, o.runs, copies, name);
    if (json != NULL)
        fclose(json);
    free(rows);
    kw_cuda_free(cu, cb.a);
    kw_cuda_free(cu, cb.b);
    kw_keys_set_destroy(&set);
    kw_cuda_close(cu);
    return bad ? 1 : 0;
}
