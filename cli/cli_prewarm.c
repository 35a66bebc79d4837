/* cli_prewarm.c: `kwarm prewarm`, every key of a deployment compiled into
 * an LMDB cache directory without a daemon (bake it into an image, or warm
 * a node before traffic moves).
 *
 * Each key is first fetched from the cache, which verifies its checksum: a
 * hit is kept, a corrupt entry is reported (the cache removes it) and
 * compiled again like a miss.  Misses compile on --jobs worker threads,
 * each storing its result in the cache as soon as it is done, so an
 * interrupted prewarm keeps every entry it finished.
 */
#include "cli.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_parse.h"

static const char prewarm_usage[] =
    "usage: kwarm prewarm --model CONFIG.json [DEPLOYMENT] --cache DIR\n"
    "                     [--jobs N] [--pin] [--max-size SIZE] [--json]\n"
    "\n"
    "Compiles every missing key of the model and deployment into the cache\n"
    "directory DIR (LMDB, created if missing), N at a time. Keys already\n"
    "cached are verified (checksum) and counted as hits; a second prewarm of\n"
    "the same deployment compiles nothing.\n"
    "\n"
    "  --cache DIR                the cache directory (local disk, not NFS)\n"
    "  --jobs N                   compile threads (default: the cores)\n"
    "  --pin                      never evict these entries\n"
    "  --max-size SIZE            cache size limit: bytes, or with K/M/G\n"
    "                             (default 1G)\n"
    "  --json                     {\"keys\", \"compiled\", \"hits\", \"failed\",\n"
    "                             \"seconds\"} instead of the summary\n"
    "  -h, --help                 this text\n"
    "\n";

typedef struct prewarm_opts {
    const char *cache;
    unsigned jobs;
    uint64_t max_size;
    bool pin, json;
} prewarm_opts;

/* Shared by the compile workers: where results go. */
typedef struct store_ctx {
    kw_cache *cache;
    const kw_keys_key *keys;
    kw_jit_result *res;
    int *rc;      /* compile code, then the put's code */
    bool pin;
    int nvrtc_major, nvrtc_minor;
    _Atomic unsigned failures; /* printed in full up to KW_CLI_MAX_FAILS */
} store_ctx;

#define KW_CLI_MAX_FAILS 5

/* Fills the cache metadata of key k compiled into r. */
static void fill_info(kw_cache_info *info, const kw_keys_key *k,
                      const kw_jit_result *r, int major, int minor)
{
    memset(info, 0, sizeof *info);
    snprintf(info->family, sizeof info->family, "%s",
             kw_keys_family_name(k->family));
    info->nfields = (uint32_t)kw_keys_nfields(k->family);
    memcpy(info->fields, k->fields, info->nfields * sizeof k->fields[0]);
    snprintf(info->arch, sizeof info->arch, "%s", k->arch);
    snprintf(info->entry, sizeof info->entry, "%s",
             r->lowered_name ? r->lowered_name : "");
    snprintf(info->nvrtc, sizeof info->nvrtc, "%d.%d", major, minor);
    info->compile_seconds = r->seconds;
}

/* Worker callback: store key i's cubin, then free the compile result. */
static void store_one(size_t i, void *arg)
{
    store_ctx *s = arg;
    if (s->rc[i] == 0) {
        kw_cache_info info;
        bool stored;
        fill_info(&info, &s->keys[i], &s->res[i], s->nvrtc_major,
                  s->nvrtc_minor);
        s->rc[i] = kw_cache_put(s->cache, s->keys[i].digest, &info,
                                s->res[i].cubin, s->res[i].cubin_len, s->pin,
                                &stored);
        kw_cache_count(s->cache, KW_CACHE_COMPILES, 1);
    } else
        kw_cache_count(s->cache, KW_CACHE_COMPILE_FAILURES, 1);
    if (s->rc[i] < 0 && atomic_fetch_add(&s->failures, 1) < KW_CLI_MAX_FAILS) {
        /* The compile's log, or the cache's own reason (this thread's). */
        const char *why = s->res[i].log ? s->res[i].log
                                        : kw_cache_last_error(s->cache);
        kw__cli_err("prewarm", "%s %s: %s%s%s", kw_keys_family_name(s->keys[i].family),
                    s->keys[i].arch, kw_strerror(s->rc[i]),
                    why && why[0] ? ": " : "", why ? why : "");
    }
    kw_jit_result_destroy(&s->res[i]);
}

/* Fetches every key from the cache: hits are counted, misses (and corrupt
 * entries, which the cache removed) are gathered into miss[].  Returns how
 * many misses. */
static size_t find_misses(kw_cache *c, const kw_keys_set *set,
                          kw_keys_key *miss, size_t *hits)
{
    size_t n = 0;
    *hits = 0;
    for (size_t i = 0; i < set->nkeys; i++) {
        void *blob = NULL;
        size_t len = 0;
        int rc = kw_cache_get(c, set->keys[i].digest, &blob, &len, NULL);
        free(blob);
        if (rc == 0) {
            (*hits)++;
            continue;
        }
        if (rc == KW_ECORRUPT) {
            char hex[KW_KEYS_HEX_LEN];
            kw_keys_hex(set->keys[i].digest, hex);
            kw__cli_err("prewarm", "%.16s: cached entry failed its checksum; "
                        "removed, compiling again", hex);
        }
        miss[n++] = set->keys[i];
    }
    return n;
}

/* Compiles the misses into the cache; returns how many failed. */
static size_t compile_misses(kw_cache *c, const kw_keys_key *miss, size_t n,
                             const prewarm_opts *o)
{
    store_ctx s = {.cache = c, .keys = miss, .pin = o->pin};
    size_t failed = 0;
    s.res = calloc(n + 1, sizeof *s.res);
    s.rc = calloc(n + 1, sizeof *s.rc);
    if (s.res == NULL || s.rc == NULL) {
        free(s.res);
        free(s.rc);
        return n;
    }
    kw_jit_version(&s.nvrtc_major, &s.nvrtc_minor);
    kw__cli_compile_all(miss, n, o->jobs, s.res, s.rc, "prewarm", store_one, &s);
    for (size_t i = 0; i < n; i++)
        failed += s.rc[i] < 0;
    if (failed > KW_CLI_MAX_FAILS)
        kw__cli_err("prewarm", "... and %zu more failures like those",
                    failed - KW_CLI_MAX_FAILS);
    free(s.res);
    free(s.rc);
    return failed;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs the prewarm proper once the keys are derived. */
static int prewarm_keys(const kw_keys_set *set, const prewarm_opts *o)
{
    kw_cache_opts co = {.dir = o->cache, .max_size = o->max_size};
    kw_cache *c = NULL;
    char err[512];
    double t0 = now();
    int rc = kw_cache_open(&c, &co, err, sizeof err);
    if (rc < 0) {
        kw__cli_err("prewarm", "%s", err);
        return rc == KW_EINVAL ? KW_CLI_USAGE : KW_CLI_RUNTIME;
    }
    kw_keys_key *miss = calloc(set->nkeys + 1, sizeof *miss);
    if (miss == NULL) {
        kw_cache_close(c);
        kw__cli_err("prewarm", "%s", kw_strerror(KW_ENOMEM));
        return KW_CLI_RUNTIME;
    }
    size_t hits, n = find_misses(c, set, miss, &hits);
    size_t failed = compile_misses(c, miss, n, o);
    kw_cache_flush(c);
    double secs = now() - t0;
    if (o->json)
        printf("{\"keys\": %zu, \"compiled\": %zu, \"hits\": %zu, \"failed\": "
               "%zu, \"seconds\": %.3f}\n", set->nkeys, n - failed, hits,
               failed, secs);
    else {
        printf("prewarm: %zu keys: %zu compiled, %zu hits, %zu failed in "
               "%.2f s\n", set->nkeys, n - failed, hits, failed, secs);
        kw_cache_stats st;
        if (kw_cache_stats_get(c, &st) == 0)
            kw__cli_print_stats(&st, o->cache, false);
    }
    free(miss);
    kw_cache_close(c);
    return failed == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
}

/* Parses prewarm's own flags; returns -1 to go on, else an exit code. */
static int parse(kw__cli_model *a, prewarm_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        int rc = kw__cli_model_arg(a, "prewarm", argc, argv, &i);
        if (rc != 0) {
            if (rc < 0)
                return -rc;
            continue;
        }
        const char *arg = argv[i], *v;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            printf("%s%s", prewarm_usage, kw__cli_deploy_help);
            return KW_CLI_OK;
        } else if (strcmp(arg, "--pin") == 0)
            o->pin = true;
        else if (strcmp(arg, "--json") == 0)
            o->json = true;
        else if (kw__cli_is(arg, "--cache")) {
            if ((o->cache = kw__cli_value("prewarm", argc, argv, &i)) == NULL)
                return KW_CLI_USAGE;
        } else if (kw__cli_is(arg, "--jobs")) {
            if (kw__cli_jobs("prewarm", argc, argv, &i, &o->jobs) < 0)
                return KW_CLI_USAGE;
        } else if (kw__cli_is(arg, "--max-size")) {
            if ((v = kw__cli_value("prewarm", argc, argv, &i)) == NULL)
                return KW_CLI_USAGE;
            if (kw_parse_size(v, &o->max_size) < 0 ||
                o->max_size < KW_CACHE_MIN_SIZE) {
                kw__cli_err("prewarm", "--max-size: '%.32s' is not a size of "
                            "at least 1M (bytes, or with K, M, G)", v);
                return KW_CLI_USAGE;
            }
        } else {
            kw__cli_err("prewarm", "%s: unknown argument (see kwarm prewarm "
                        "--help)", arg);
            return KW_CLI_USAGE;
        }
    }
    return -1;
}

int kw__cli_prewarm(int argc, char **argv)
{
    kw__cli_model a;
    kw_keys_set set = {0};
    prewarm_opts o = {.jobs = kw__cli_default_jobs()};
    kw__cli_model_init(&a);
    int rc = parse(&a, &o, argc, argv);
    if (rc >= 0)
        goto out;
    if (o.cache == NULL) {
        kw__cli_err("prewarm", "--cache: required (see kwarm prewarm --help)");
        rc = KW_CLI_USAGE;
        goto out;
    }
    if ((rc = kw__cli_model_load(&a, "prewarm")) == KW_CLI_OK &&
        (rc = kw__cli_derive(&a, "prewarm", &set)) == KW_CLI_OK)
        rc = prewarm_keys(&set, &o);
out:
    kw_keys_set_destroy(&set);
    kw__cli_model_destroy(&a);
    return rc;
}
