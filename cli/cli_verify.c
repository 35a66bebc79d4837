/* cli_verify.c: `kwarm verify`, every key's kernel against its CPU
 * reference on this machine's GPU.
 *
 * Keys are compiled in parallel, then each cubin is loaded and run on
 * random inputs of several shapes (kernels/' check harness), its outputs
 * compared element by element with the reference.  Any mismatch, compile
 * failure or missing GPU exits 1.
 */
#include "cli.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_cache.h"
#include "cuda_dev.h" /* kw_cuda, kw_cuda_dev_ops */
#include "kw_err.h"
#include "kw_parse.h"

#define NCASES 3 /* shapes run per key */

typedef struct fam_stats {
    size_t keys, skipped, compile_failed, cases, passed, failed;
    double *secs; /* compile seconds of each compiled key */
    size_t nsecs;
} fam_stats;

typedef struct verify_opts {
    unsigned jobs;
    uint64_t seed;
    const char *cache; /* --cache: verify the cached entries instead */
} verify_opts;

static const kw_opt verify_rows[] = {
    KW__CLI_JOBS(verify_opts, jobs, "compile threads (default: the cores)"),
    {.name = "seed", .type = KW_OPT_UINT, .arg = "S", .max = UINT64_MAX,
     .off = offsetof(verify_opts, seed), .size = sizeof(uint64_t),
     .help = "seed of the random inputs (default 1)"},
    KW__CLI_TEXT(verify_opts, cache, "cache", "DIR",
                 "run every entry of this cache directory instead\n"
                 "of a model's keys"),
};

static const kw__cli_cmd verify_cmd = {
    .name = "verify",
    .usage =
        "usage: kwarm verify --model CONFIG.json [DEPLOYMENT] [--jobs N] [--seed S]\n"
        "       kwarm verify --cache DIR [--seed S]\n"
        "\n"
        "On a GPU: compiles every key of the model and deployment, loads each\n"
        "cubin, runs it on random inputs of several shapes and compares every\n"
        "output element with the kernel's CPU reference. Prints a table per\n"
        "family; exits 1 on any mismatch, compile failure, or when no GPU is found.\n"
        "Keys for another architecture than the GPU's are counted as skipped.\n"
        "With --cache, runs every entry of the cache directory instead.\n"
        "\n",
    KW__CLI_ROWS(verify_rows),
    .model = true,
};

/* The i-th shape run for a key: the edge preset, the medium preset, and a
 * medium shape cut to about a third so sizes differ between cases. */
static int case_shape(kw_k_family f, int i, kw_k_shape *sh)
{
    int rc = kw_k_shape_preset(f, i == 0 ? KW_K_PRESET_EDGE : KW_K_PRESET_MEDIUM, sh);
    if (rc == 0 && i == 2) {
        sh->rows = sh->rows / 3 + 1;
        sh->batch = sh->batch / 2 + 1;
        sh->cols = sh->cols / 3 + 1;
    }
    return rc;
}

/* Prints one failure with the key it belongs to. */
static void report_failure(const kw_keys_key *k, int i, int rc,
                           const kw_k_check_result *res, const char *why)
{
    char hex[KW_KEYS_HEX_LEN];
    kw_keys_hex(k->digest, hex);
    fprintf(stderr, "FAIL %s %.16s case %d: ", kw_keys_family_name(k->family),
            hex, i);
    if (rc == KW_EMISMATCH)
        fprintf(stderr, "%llu of %llu differ; first %s[%llu]: expected %lld, "
                "got %lld\n", (unsigned long long)res->mismatches,
                (unsigned long long)res->checked, res->output,
                (unsigned long long)res->first_index, (long long)res->expected,
                (long long)res->got);
    else
        fprintf(stderr, "%s (%s)\n", kw_strerror(rc), why ? why : "");
}

/* Runs one case of key k with the loaded function's device operations. */
static int run_case(kw_cuda *cu, const kw_k_dev *dev, const kw_keys_key *k,
                    int i, uint64_t seed)
{
    kw_k_shape sh;
    kw_k_case *c = NULL;
    kw_k_check_result res = {0};
    int rc = case_shape(k->family, i, &sh);
    if (rc == 0)
        rc = kw_k_case_new(&c, k->family, k->fields, &sh, seed);
    if (rc == 0)
        rc = kw_k_case_upload(c, dev);
    if (rc == 0)
        rc = kw_k_case_launch(c, dev);
    if (rc == 0)
        rc = kw_k_case_compare(c, dev, &res);
    if (rc < 0)
        report_failure(k, i, rc, &res, kw_cuda_last_error(cu));
    kw_k_case_free(c, dev);
    return rc;
}

/* Loads key k's cubin (len bytes, entry point entry) and runs its cases,
 * counting into st. */
static void run_key(kw_cuda *cu, const kw_keys_key *k, const void *cubin,
                    size_t len, const char *entry, uint64_t seed, fam_stats *st)
{
    kw_cuda_fn *fn = NULL;
    int rc = kw_cuda_load(cu, cubin, len, entry, &fn);
    if (rc < 0) {
        report_failure(k, 0, rc, NULL, kw_cuda_last_error(cu));
        st->cases += NCASES;
        st->failed += NCASES;
        return;
    }
    kw_k_dev dev;
    kw_cuda_dev_ops(cu, fn, &dev);
    for (int i = 0; i < NCASES; i++) {
        rc = run_case(cu, &dev, k, i, seed * 7919 + (uint64_t)i);
        st->cases++;
        if (rc == 0)
            st->passed++;
        else
            st->failed++;
    }
    kw_cuda_unload(fn);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prints the per-family table and returns the number of failures. */
static size_t print_table(fam_stats *st)
{
    size_t bad = 0;
    printf("%-25s %5s %7s %6s %6s %6s %11s %9s\n", "FAMILY", "KEYS", "SKIPPED",
           "CASES", "PASSED", "FAILED", "COMPILE p50", "max");
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        fam_stats *s = &st[f];
        double p50 = 0, max = 0;
        if (s->nsecs > 0) {
            qsort(s->secs, s->nsecs, sizeof *s->secs, cmp_double);
            p50 = s->secs[s->nsecs / 2];
            max = s->secs[s->nsecs - 1];
        }
        printf("%-25s %5zu %7zu %6zu %6zu %6zu %9.3f s %7.3f s\n",
               kw_keys_family_name((kw_k_family)f), s->keys, s->skipped,
               s->cases, s->passed, s->failed + s->compile_failed, p50, max);
        bad += s->failed + s->compile_failed;
    }
    return bad;
}

/* True when a cubin built for arch runs on a GPU of compute capability
 * major.minor: the digits must match (sm_90 and sm_90a on 9.0). */
static bool arch_runs_on(const char *arch, int major, int minor)
{
    char want[16];
    snprintf(want, sizeof want, "sm_%d%d", major, minor);
    size_t n = strlen(want);
    return strncmp(arch, want, n) == 0 &&
           (arch[n] == '\0' || arch[n] == 'a' || arch[n] == 'f');
}

/* Compiles the runnable keys, runs them and prints the table. */
static int verify_keys(kw_cuda *cu, const kw_keys_set *set,
                       const verify_opts *o, int major, int minor)
{
    fam_stats st[KW_K_NFAMILIES] = {{0}};
    kw_keys_key *run = calloc(set->nkeys + 1, sizeof *run);
    kw_jit_result *res = calloc(set->nkeys + 1, sizeof *res);
    int *rcs = calloc(set->nkeys + 1, sizeof *rcs);
    double *secs0 = calloc(set->nkeys + 1, sizeof *secs0), *secs = secs0;
    size_t n = 0, bad = 1;
    if (run == NULL || res == NULL || rcs == NULL || secs0 == NULL)
        goto out;
    for (size_t i = 0; i < set->nkeys; i++) {
        st[set->keys[i].family].keys++;
        if (arch_runs_on(set->keys[i].arch, major, minor))
            run[n++] = set->keys[i];
        else
            st[set->keys[i].family].skipped++;
    }
    /* NVRTC's own cache of compiles (in the driver's compute cache, on by
     * default where a driver runs) serializes compiles in threads: on the
     * H200 host 8 threads compiled 64 keys 5.1x faster than 1 with it off,
     * where with it on they had measured 1.05x (docs/perf.md).  A user's
     * own setting wins. */
    setenv("CUDA_CACHE_DISABLE", "1", 0);
    kw__cli_compile_all(run, n, o->jobs, res, rcs, "compile", NULL, NULL);
    /* Each family's compile times are packed one after another in secs. */
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        st[f].secs = secs;
        for (size_t i = 0; i < n; i++) {
            if (run[i].family != (kw_k_family)f)
                continue;
            if (rcs[i] < 0) {
                st[f].compile_failed++;
                fprintf(stderr, "FAIL %s: compile: %s\n%s\n",
                        kw_keys_family_name(run[i].family), kw_strerror(rcs[i]),
                        res[i].log ? res[i].log : "");
                continue;
            }
            secs[st[f].nsecs++] = res[i].seconds;
            run_key(cu, &run[i], res[i].cubin, res[i].cubin_len,
                    res[i].lowered_name, o->seed, &st[f]);
        }
        secs += st[f].nsecs;
    }
    bad = print_table(st);
    printf("verify: %zu keys run, %zu skipped (other arch), %zu failed\n", n,
           set->nkeys - n, bad);
out:
    for (size_t i = 0; res != NULL && i < n; i++)
        kw_jit_result_destroy(&res[i]);
    free(secs0);
    free(run);
    free(res);
    free(rcs);
    return bad == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
}

/* Collects the cache's entries (digest, metadata) for verify_cache(). */
typedef struct entry_list {
    kw_keys_key *keys;
    char (*entry)[256];
    size_t n, cap;
} entry_list;

static int collect(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                   const kw_cache_info *info, void *arg)
{
    entry_list *l = arg;
    kw_k_family f;
    if (kw_keys_family_from_name(info->family, &f) < 0 ||
        info->nfields != kw_keys_nfields(f))
        return 0; /* a family this build does not know: not ours to run */
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        kw_keys_key *k = realloc(l->keys, cap * sizeof *k);
        if (k != NULL)
            l->keys = k;
        char(*e)[256] = realloc(l->entry, cap * sizeof *e);
        if (e != NULL)
            l->entry = e;
        if (k == NULL || e == NULL)
            return KW_ENOMEM;
        l->cap = cap;
    }
    kw_keys_key *k = &l->keys[l->n];
    memset(k, 0, sizeof *k);
    k->family = f;
    memcpy(k->fields, info->fields, info->nfields * sizeof k->fields[0]);
    memcpy(k->arch, info->arch, sizeof k->arch - 1); /* info's is NUL-ended */
    memcpy(k->digest, digest, KW_KEYS_DIGEST_LEN);
    memcpy(l->entry[l->n++], info->entry, sizeof l->entry[0]);
    return 0;
}

/* Runs every entry of the cache at o->cache against its reference. */
static int verify_cache(kw_cuda *cu, const verify_opts *o, int major,
                        int minor)
{
    kw_cache_opts co = {.dir = o->cache, .read_only = true};
    kw_cache *c = NULL;
    entry_list l = {0};
    fam_stats st[KW_K_NFAMILIES] = {{0}};
    char err[512];
    size_t run = 0;
    if (kw_cache_open(&c, &co, err, sizeof err) < 0) {
        kw__cli_err("verify", "%s", err);
        return KW_CLI_USAGE;
    }
    int rc = kw_cache_foreach(c, collect, &l);
    for (size_t i = 0; rc == 0 && i < l.n; i++) {
        const kw_keys_key *k = &l.keys[i];
        void *blob = NULL;
        size_t len = 0;
        st[k->family].keys++;
        if (!arch_runs_on(k->arch, major, minor)) {
            st[k->family].skipped++;
            continue;
        }
        if (kw_cache_get(c, k->digest, &blob, &len, NULL) < 0) {
            report_failure(k, 0, KW_ECORRUPT, NULL, kw_cache_last_error(c));
            st[k->family].compile_failed++;
            continue;
        }
        run_key(cu, k, blob, len, l.entry[i], o->seed, &st[k->family]);
        free(blob);
        run++;
    }
    size_t bad = rc == 0 ? print_table(st) : 1;
    printf("verify: %zu cached entries run, %zu skipped, %zu failed\n", run,
           l.n - run, bad);
    free(l.keys);
    free(l.entry);
    kw_cache_close(c);
    return bad == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
}

/* Opens the GPU and prints what it is; an exit code on failure. */
static int open_gpu(kw_cuda **cu, int *major, int *minor)
{
    char err[512], name[128];
    int sms = 0;
    if (kw_cuda_open(cu, 0, err, sizeof err) < 0 ||
        kw_cuda_device_info(*cu, name, sizeof name, major, minor, &sms) < 0) {
        kw__cli_err("verify", "no usable GPU (verify runs kernels): %s",
                    *cu ? kw_cuda_last_error(*cu) : err);
        return KW_CLI_RUNTIME;
    }
    printf("device: %s (sm_%d%d, %d SMs)\n", name, *major, *minor, sms);
    return KW_CLI_OK;
}

int kw__cli_verify(int argc, char **argv)
{
    kw__cli_model a;
    kw_keys_set set = {0};
    kw_cuda *cu = NULL;
    verify_opts o = {kw__cli_default_jobs(), 1, NULL};
    int major = 0, minor = 0;
    kw__cli_model_init(&a);
    int rc = kw__cli_getopt(&verify_cmd, argc, argv, &o, &a, NULL, 0);
    if (rc >= 0)
        goto out;
    if (o.cache != NULL && a.model != NULL) {
        kw__cli_err("verify", "--cache: give either --cache or --model");
        rc = KW_CLI_USAGE;
        goto out;
    }
    if (o.cache == NULL &&
        ((rc = kw__cli_model_load(&a, "verify")) != KW_CLI_OK ||
         (rc = kw__cli_derive(&a, "verify", &set)) != KW_CLI_OK))
        goto out;
    if ((rc = open_gpu(&cu, &major, &minor)) != KW_CLI_OK)
        goto out;
    if (o.cache != NULL)
        rc = verify_cache(cu, &o, major, minor);
    else {
        printf("model %s, text config %s\n", a.cfg.path, a.cfg.text_config);
        rc = verify_keys(cu, &set, &o, major, minor);
    }
out:
    kw_cuda_close(cu);
    kw_keys_set_destroy(&set);
    kw__cli_model_destroy(&a);
    return rc;
}
