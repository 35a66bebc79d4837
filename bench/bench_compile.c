/* bench_compile.c: NVRTC compile time per key, the cost a cache hit
 * removes.  Runs on any machine with the toolkit; no GPU needed.
 *
 * usage: bench_compile [--model CONFIG] [--dcp-world N] [--json FILE]
 *
 * Derives the keys of the model (default tests/fixtures/deepseek-v3.2-exp.json
 * under DCP world 2, rank all: every family), compiles each once on this
 * thread, and prints p50 and max seconds and cubin size per family.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "bench_util.h"

typedef struct fam {
    double *secs;
    size_t n, bytes, failed;
} fam;

/* Compiles every key once, sorting times into their family. */
static void compile_all(const kw_keys_set *set, fam *fams)
{
    for (size_t i = 0; i < set->nkeys; i++) {
        const kw_keys_key *k = &set->keys[i];
        kw_jit_result r;
        fam *f = &fams[k->family];
        if (kw_keys_compile(k, false, &r) == 0) {
            f->secs[f->n++] = r.seconds;
            f->bytes += r.cubin_len;
        } else
            f->failed++;
        kw_jit_result_destroy(&r);
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "\rcompiled %zu/%zu", i + 1, set->nkeys);
    }
    if (isatty(STDERR_FILENO))
        fputc('\n', stderr);
}

static void report(fam *fams, FILE *json)
{
    printf("%-25s %5s %9s %9s %11s %6s\n", "FAMILY", "KEYS", "p50 s", "max s",
           "cubin KB", "FAILED");
    if (json)
        fprintf(json, "{\"compile\": [");
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        fam *x = &fams[f];
        double p50 = 0, max = 0;
        if (x->n > 0) {
            qsort(x->secs, x->n, sizeof *x->secs, bench_cmp_double);
            p50 = x->secs[x->n / 2];
            max = x->secs[x->n - 1];
        }
        double kb = x->n ? x->bytes / 1024.0 / x->n : 0;
        const char *name = kw_keys_family_name((kw_k_family)f);
        printf("%-25s %5zu %9.3f %9.3f %11.1f %6zu\n", name, x->n, p50, max,
               kb, x->failed);
        if (json)
            fprintf(json, "%s\n {\"family\": \"%s\", \"keys\": %zu, \"p50_s\": "
                    "%.4f, \"max_s\": %.4f, \"cubin_kb\": %.1f, \"failed\": %zu}",
                    f ? "," : "", name, x->n, p50, max, kb, x->failed);
    }
    if (json)
        fprintf(json, "]}\n");
}

int main(int argc, char **argv)
{
    const char *model = "tests/fixtures/deepseek-v3.2-exp.json", *world = "2";
    const char *json_path = NULL;
    bench_real_compiles();
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && strcmp(argv[i], "--model") == 0)
            model = v;
        else if (v && strcmp(argv[i], "--dcp-world") == 0)
            world = v;
        else if (v && strcmp(argv[i], "--json") == 0)
            json_path = v;
        else {
            fprintf(stderr, "usage: bench_compile [--model CONFIG] "
                    "[--dcp-world N] [--json FILE]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
        i++;
    }
    kw_keys_set set;
    if (bench_derive(model, world, "all", &set) < 0)
        return 2;
    fam fams[KW_K_NFAMILIES] = {{0}};
    double *secs = calloc(set.nkeys + 1, sizeof *secs);
    for (int f = 0, off = 0; f < KW_K_NFAMILIES; f++) {
        fams[f].secs = secs + off;
        for (size_t i = 0; i < set.nkeys; i++)
            off += set.keys[i].family == (kw_k_family)f;
    }
    compile_all(&set, fams);
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    report(fams, json);
    if (json)
        fclose(json);
    free(secs);
    kw_keys_set_destroy(&set);
    return 0;
}
