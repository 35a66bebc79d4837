/* cli_verify.c: `kwarm verify`, every key's kernel against its CPU
 * reference on this machine's GPU.
 *
 * Keys are compiled in parallel, then each cubin is loaded and run on
 * random inputs of several shapes (kernels/' check harness), its outputs
 * compared element by element with the reference.  Any mismatch, compile
 * failure or missing GPU exits 1.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_cuda.h"
#include "kw_err.h"
#include "kw_parse.h"

static const char verify_usage[] =
    "usage: kwarm verify --model CONFIG.json [DEPLOYMENT] [--jobs N] [--seed S]\n"
    "\n"
    "On a GPU: compiles every key of the model and deployment, loads each\n"
    "cubin, runs it on random inputs of several shapes and compares every\n"
    "output element with the kernel's CPU reference. Prints a table per\n"
    "family; exits 1 on any mismatch, compile failure, or when no GPU is found.\n"
    "Keys for another architecture than the GPU's are counted as skipped.\n"
    "\n"
    "  --jobs N                   compile threads (default: the cores)\n"
    "  --seed S                   seed of the random inputs (default 1)\n"
    "  -h, --help                 this text\n"
    "\n";

#define NCASES 3 /* shapes run per key */

typedef struct fam_stats {
    size_t keys, skipped, compile_failed, cases, passed, failed;
    double *secs; /* compile seconds of each compiled key */
    size_t nsecs;
} fam_stats;

typedef struct verify_opts {
    unsigned jobs;
    uint64_t seed;
} verify_opts;

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

/* Loads key k's cubin and runs its cases, counting into st. */
static void run_key(kw_cuda *cu, const kw_keys_key *k, const kw_jit_result *r,
                    uint64_t seed, fam_stats *st)
{
    kw_cuda_fn *fn = NULL;
    int rc = kw_cuda_load(cu, r->cubin, r->cubin_len, r->lowered_name, &fn);
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
    kw__cli_compile_all(run, n, o->jobs, res, rcs, "compile");
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
            run_key(cu, &run[i], &res[i], o->seed, &st[f]);
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

/* Parses verify's own flags; returns -1 to go on, else an exit code. */
static int parse(kw__cli_model *a, verify_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        int rc = kw__cli_model_arg(a, "verify", argc, argv, &i);
        if (rc != 0) {
            if (rc < 0)
                return -rc;
            continue;
        }
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("%s%s", verify_usage, kw__cli_deploy_help);
            return KW_CLI_OK;
        }
        bool jobs = kw__cli_is(argv[i], "--jobs");
        if (!jobs && !kw__cli_is(argv[i], "--seed")) {
            kw__cli_err("verify", "%s: unknown argument (see kwarm verify "
                        "--help)", argv[i]);
            return KW_CLI_USAGE;
        }
        const char *flag = jobs ? "--jobs" : "--seed";
        const char *v = kw__cli_value("verify", argc, argv, &i);
        uint64_t x;
        if (v == NULL || kw_parse_u64(v, jobs ? KW_CLI_MAX_JOBS : UINT64_MAX, &x) < 0 ||
            (jobs && x == 0)) {
            if (v != NULL)
                kw__cli_err("verify", "%s: '%.32s' is not an integer in [%d, "
                            "%s]", flag, v, jobs, jobs ? "256" : "2^64-1");
            return KW_CLI_USAGE;
        }
        if (jobs)
            o->jobs = (unsigned)x;
        else
            o->seed = x;
    }
    return -1;
}

int kw__cli_verify(int argc, char **argv)
{
    kw__cli_model a;
    kw_keys_set set = {0};
    kw_cuda *cu = NULL;
    verify_opts o = {kw__cli_default_jobs(), 1};
    char err[512], name[128];
    int major = 0, minor = 0, sms = 0;
    kw__cli_model_init(&a);
    int rc = parse(&a, &o, argc, argv);
    if (rc >= 0)
        goto out;
    if ((rc = kw__cli_model_load(&a, "verify")) != KW_CLI_OK ||
        (rc = kw__cli_derive(&a, "verify", &set)) != KW_CLI_OK)
        goto out;
    if (kw_cuda_open(&cu, 0, err, sizeof err) < 0 ||
        kw_cuda_device_info(cu, name, sizeof name, &major, &minor, &sms) < 0) {
        kw__cli_err("verify", "no usable GPU (verify runs kernels): %s",
                    cu ? kw_cuda_last_error(cu) : err);
        rc = KW_CLI_RUNTIME;
        goto out;
    }
    printf("device: %s (sm_%d%d, %d SMs); model %s, text config %s\n", name,
           major, minor, sms, a.cfg.path, a.cfg.text_config);
    rc = verify_keys(cu, &set, &o, major, minor);
out:
    kw_cuda_close(cu);
    kw_keys_set_destroy(&set);
    kw__cli_model_destroy(&a);
    return rc;
}
