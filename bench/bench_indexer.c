/* bench_indexer.c: compiles the indexer keys of DeepSeek-V3.2 (heads 64,
 * head_dim 128, top-k 2048) in a fresh process, as a serving process
 * without kwarm would at start-up, and writes each cubin, its entry and
 * its launch geometry for bench/indexer_bench.py, which times them on
 * the GPU against torch and Triton on the same data.
 *
 * usage: bench_indexer OUTDIR [NVRTC-OPTION...]
 * Writes OUTDIR/<name>.cubin and OUTDIR/kernels.json; prints the compile
 * seconds of each key and the process's total (the NVRTC side of the
 * start-up comparison in docs/perf.md).  Options after OUTDIR (say
 * -DIL_WREG=1 or --ptxas-options=-v) are appended to each key's own, for
 * kernel experiments timed beside the committed build; such cubins are
 * never what a cache holds. */
#include <stdio.h>
#include <string.h>

#include "bench_util.h"
#include "kw_err.h"
#include "kw_keys.h"

typedef struct bkey {
    const char *name;
    kw_k_family family;
    int64_t fields[5];
} bkey;

static const bkey keys[] = {
    {"logits_prefill", KW_K_INDEXER_LOGITS, {64, 128, 0, 0, 1}},
    {"logits_prefill_h32", KW_K_INDEXER_LOGITS, {32, 128, 0, 0, 1}},
    {"logits_decode_n1", KW_K_INDEXER_LOGITS, {64, 128, 1, 64, 1}},
    {"logits_decode_n2", KW_K_INDEXER_LOGITS, {64, 128, 1, 64, 2}},
    {"topk_windowed", KW_K_INDEXER_TOPK, {2048, 1}},
    {"topk_rows", KW_K_INDEXER_TOPK, {2048, 0}},
};
#define NKEYS (sizeof keys / sizeof keys[0])

#define MAXOPTS 64

/* kw_keys_compile() of k with nextra more NVRTC options after its own. */
static int compile(const kw_keys_key *k, char **extra, int nextra,
                   kw_jit_result *r)
{
    kw_keys_build b;
    kw_jit_req req;
    const char *opts[MAXOPTS];
    memset(r, 0, sizeof *r);
    int rc = kw_keys_jit_req(k, &b, &req);
    if (rc < 0)
        return rc;
    if (req.nextra + (size_t)nextra > MAXOPTS)
        return -22; /* -EINVAL */
    for (size_t i = 0; i < req.nextra; i++)
        opts[i] = req.extra_opts[i];
    for (int i = 0; i < nextra; i++)
        opts[req.nextra + (size_t)i] = extra[i];
    req.extra_opts = opts;
    req.nextra += (size_t)nextra;
    return kw_jit_compile(&req, r);
}

/* Compiles one key and writes its cubin; appends its JSON entry. */
static int one(const char *dir, const bkey *b, FILE *js, bool first,
               char **extra, int nextra)
{
    kw_keys_key k = {.family = b->family};
    kw_jit_result r;
    char path[1024];
    memcpy(k.fields, b->fields, sizeof b->fields);
    snprintf(k.arch, sizeof k.arch, "sm_90");
    double t0 = bench_now_ns();
    int rc = compile(&k, extra, nextra, &r);
    double s = (bench_now_ns() - t0) / 1e9;
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n%s\n", b->name, kw_strerror(rc),
                r.log ? r.log : "");
        kw_jit_result_destroy(&r);
        return rc;
    }
    snprintf(path, sizeof path, "%s/%s.cubin", dir, b->name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(r.cubin, 1, r.cubin_len, f) != r.cubin_len)
        rc = -5; /* -EIO */
    if (f != NULL)
        fclose(f);
    fprintf(js, "%s\n  \"%s\": {\"entry\": \"%s\", \"threads\": %u, "
            "\"shmem\": %u, \"queries\": %u, \"compile_s\": %.3f, "
            "\"cubin_bytes\": %zu}", first ? "" : ",", b->name,
            r.lowered_name, kw_k_block_threads(k.family, k.fields),
            kw_k_shmem_bytes(k.family, k.fields),
            kw_k_logits_queries(k.family, k.fields), s, r.cubin_len);
    printf("%-18s compile %.3f s, %zu bytes\n", b->name, s, r.cubin_len);
    if (r.log != NULL && r.log[0] != '\0') /* warnings: C7514 etc. */
        fprintf(stderr, "%s: NVRTC log:\n%s\n", b->name, r.log);
    kw_jit_result_destroy(&r);
    return rc;
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, "usage: bench_indexer OUTDIR [NVRTC-OPTION...]"))
        return 0;
    if (argc < 2) {
        fprintf(stderr, "usage: bench_indexer OUTDIR [NVRTC-OPTION...]\n");
        return 2;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/kernels.json", argv[1]);
    FILE *js = fopen(path, "w");
    if (js == NULL) {
        perror(path);
        return 1;
    }
    double t0 = bench_now_ns();
    int rc = 0;
    fprintf(js, "{");
    for (size_t i = 0; i < NKEYS && rc == 0; i++)
        rc = one(argv[1], &keys[i], js, i == 0, argv + 2, argc - 2);
    double s = (bench_now_ns() - t0) / 1e9;
    fprintf(js, ",\n  \"total_compile_s\": %.3f\n}\n", s);
    fclose(js);
    printf("total: %zu keys compiled in %.3f s\n", NKEYS, s);
    return rc < 0 ? 1 : 0;
}
