/* bench_kernels.c: each kernel family at production size on the GPU, its
 * achieved bandwidth beside the device-to-device copy bandwidth measured in
 * the same run, plus a correctness check of the timed output.
 *
 * usage: bench_kernels [--model CONFIG] [--json FILE] [--dump DIR] [--iters N]
 *
 * Keys come from the model (default tests/fixtures/deepseek-v3.2-exp.json)
 * under DCP world 8, rank 0, so every family has keys: the first key of
 * each family and every index_conversion key are timed.  --dump writes the
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

typedef struct opts {
    const char *model, *json, *dump;
    int iters;
} opts;

typedef struct row {
    char family[40], fields[256];
    double ms, gbps, frac;
    size_t bytes;
    const char *check;
} row;

/* Copy bandwidth: a 1 GiB device-to-device copy, read + write bytes. */
static double copy_gbps(kw_cuda *cu, int iters)
{
    size_t n = (size_t)1 << 30;
    uint64_t a = 0, b = 0;
    kw_cuda_timer *t = NULL;
    float ms = 0;
    double gbps = 0;
    if (kw_cuda_alloc(cu, n, &a) < 0 || kw_cuda_alloc(cu, n, &b) < 0 ||
        kw_cuda_timer_new(cu, &t) < 0 || kw_cuda_memset(cu, a, 1, n) < 0)
        goto out;
    kw_cuda_d2d(cu, b, a, n);
    kw_cuda_timer_start(t);
    for (int i = 0; i < iters; i++)
        kw_cuda_d2d(cu, b, a, n);
    if (kw_cuda_timer_stop_ms(t, &ms) == 0 && ms > 0)
        gbps = 2.0 * (double)n * iters / (ms / 1e3) / 1e9;
out:
    kw_cuda_timer_free(t);
    kw_cuda_free(cu, a);
    kw_cuda_free(cu, b);
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

/* Compiles, loads and times key k at its family's production shape. */
static int bench_key(kw_cuda *cu, const kw_keys_key *k, const opts *o,
                     double copy, row *out)
{
    kw_jit_result r;
    kw_cuda_fn *fn = NULL;
    kw_k_case *c = NULL;
    kw_k_shape sh;
    kw_k_dev dev;
    kw_k_check_result chk = {0};
    memset(out, 0, sizeof *out);
    snprintf(out->family, sizeof out->family, "%s", kw_keys_family_name(k->family));
    fields_text(k, out->fields, sizeof out->fields);
    int rc = kw_keys_compile(k, false, &r);
    if (rc == 0 && o->dump && k->family == KW_K_DCP_STABLE_TOPK)
        dump(o->dump, &r);
    if (rc == 0)
        rc = kw_cuda_load(cu, r.cubin, r.cubin_len, r.lowered_name, &fn);
    kw_cuda_dev_ops(cu, fn, &dev);
    if (rc == 0)
        rc = kw_k_shape_preset(k->family, KW_K_PRESET_PRODUCTION, &sh);
    if (rc == 0)
        rc = kw_k_case_new(&c, k->family, k->fields, &sh, 42);
    if (rc == 0)
        rc = kw_k_case_upload(c, &dev);
    if (rc == 0)
        rc = time_case(cu, c, &dev, o->iters, &out->ms);
    if (rc == 0) {
        out->bytes = kw_k_case_bytes(c);
        out->gbps = (double)out->bytes / (out->ms / 1e3) / 1e9;
        out->frac = copy > 0 ? out->gbps / copy : 0;
        int crc = kw_k_case_compare(c, &dev, &chk);
        out->check = crc == 0 ? "ok" : crc == KW_EMISMATCH ? "MISMATCH" : "error";
    }
    if (rc < 0)
        fprintf(stderr, "bench %s: %s %s\n%s\n", out->family, kw_strerror(rc),
                kw_cuda_last_error(cu), r.log ? r.log : "");
    kw_k_case_free(c, &dev);
    kw_cuda_unload(fn);
    kw_jit_result_destroy(&r);
    return rc;
}

static void print_rows(FILE *json, const row *rows, size_t n, double copy,
                       const char *dev)
{
    printf("device: %s; device-to-device copy: %.0f GB/s (read + write)\n\n",
           dev, copy);
    printf("%-25s %9s %10s %9s %7s %-8s %s\n", "FAMILY", "TIME ms", "MB moved",
           "GB/s", "x copy", "CHECK", "KEY");
    for (size_t i = 0; i < n; i++)
        printf("%-25s %9.4f %10.1f %9.0f %7.2f %-8s %s\n", rows[i].family,
               rows[i].ms, rows[i].bytes / 1e6, rows[i].gbps, rows[i].frac,
               rows[i].check, rows[i].fields);
    if (json == NULL)
        return;
    fprintf(json, "{\"device\": \"%s\", \"copy_gbps\": %.1f, \"kernels\": [", dev, copy);
    for (size_t i = 0; i < n; i++)
        fprintf(json, "%s\n {\"family\": \"%s\", \"key\": \"%s\", \"ms\": %.5f, "
                "\"bytes\": %zu, \"gbps\": %.1f, \"fraction_of_copy\": %.3f, "
                "\"check\": \"%s\"}", i ? "," : "", rows[i].family,
                rows[i].fields, rows[i].ms, rows[i].bytes, rows[i].gbps,
                rows[i].frac, rows[i].check);
    fprintf(json, "]}\n");
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
        else {
            fprintf(stderr, "usage: bench_kernels [--model CONFIG] [--json FILE] "
                    "[--dump DIR] [--iters N]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
        i++;
    }
    return -1;
}

int main(int argc, char **argv)
{
    opts o = {"tests/fixtures/deepseek-v3.2-exp.json", NULL, NULL, 20};
    kw_keys_set set = {0};
    kw_cuda *cu = NULL;
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
    double copy = copy_gbps(cu, o.iters);
    row *rows = calloc(set.nkeys, sizeof *rows);
    size_t n = 0;
    bool seen[KW_K_NFAMILIES] = {false};
    for (size_t i = 0; rows != NULL && i < set.nkeys; i++) {
        const kw_keys_key *k = &set.keys[i];
        if (seen[k->family] && k->family != KW_K_INDEX_CONVERSION)
            continue;
        seen[k->family] = true;
        bad |= bench_key(cu, k, &o, copy, &rows[n]) < 0;
        if (rows[n].check != NULL && strcmp(rows[n].check, "ok") != 0)
            bad = 1;
        n++;
    }
    FILE *json = o.json ? fopen(o.json, "w") : NULL;
    print_rows(json, rows, n, copy, name);
    if (json != NULL)
        fclose(json);
    free(rows);
    kw_keys_set_destroy(&set);
    kw_cuda_close(cu);
    return bad ? 1 : 0;
}
