/* cli_prewarm.c: `kwarm prewarm`, every key of a deployment compiled into
 * an LMDB cache directory without a daemon (bake it into an image, or warm
 * a node before traffic moves).
 *
 * It runs the same warm pipeline as kwarmd (warm/kw_warm.h): each key is
 * looked up (its checksum verified: a corrupt entry is removed and
 * compiled again), fetched from the fleet tier when --remote is given, or
 * compiled in --jobs worker processes and stored at once, so an
 * interrupted prewarm keeps every entry it finished.  The deployment's
 * entries are never evicted by its own puts; when they cannot fit beside
 * the pinned entries, it fails before writing anything.
 */
#include "cli.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_parse.h"
#include "kw_warm.h"

typedef struct prewarm_opts {
    const char *cache, *pin, *remote, *remote_key;
    unsigned jobs, timeout_s;
    uint64_t max_size, mem_limit; /* 0: the defaults */
    bool json, quiet;
} prewarm_opts;

#define PO(field) .off = offsetof(prewarm_opts, field), \
                  .size = sizeof(((prewarm_opts *)0)->field)

static const kw_opt prewarm_rows[] = {
    KW__CLI_TEXT(prewarm_opts, cache, "cache", "DIR",
                 "the cache directory (local disk, not NFS)"),
    KW__CLI_JOBS(prewarm_opts, jobs,
                 "compile worker processes (default: the cores)"),
    KW__CLI_TEXT(prewarm_opts, pin, "pin", "NAME",
                 "record the deployment's keys as the pin set\n"
                 "NAME: never evicted until kwarm unpin NAME"),
    {.name = "max-size", .type = KW_OPT_SIZE, .arg = "SIZE",
     .min = KW_CACHE_MIN_SIZE, PO(max_size),
     .help = "size limit of a cache created now: bytes, or\n"
             "with K/M/G (default 1G)"},
    KW__CLI_SWITCH(prewarm_opts, json, "json",
                   "{\"keys\", \"hits\", \"remote_hits\",\n"
                   "\"compiled\", \"failed\", \"cancelled\",\n"
                   "\"seconds\"} instead of the summary"),
    KW__CLI_SWITCH(prewarm_opts, quiet, "quiet", "no progress on stderr"),
    {.name = "compile-timeout", .type = KW_OPT_UINT, .arg = "S",
     .unit = "seconds", .min = 1, .max = 86400, PO(timeout_s),
     .help = "a compile running longer fails (120)"},
    {.name = "compile-memory", .type = KW_OPT_SIZE, .arg = "SIZE",
     .min = UINT64_C(64) << 20, PO(mem_limit), /* kwarmd's bound */
     .help = "address space of a compile worker, at least\n"
             "64M; past it the compile fails (4G)"},
    KW__CLI_TEXT(prewarm_opts, remote, "remote", "URL",
                 "fleet tier: fetch keys other nodes compiled,\n"
                 "write back what this prewarm compiles"),
    KW__CLI_TEXT(prewarm_opts, remote_key, "remote-key-file", "F",
                 "the fleet's HMAC key file (with --remote)"),
};
#undef PO

static const kw__cli_cmd prewarm_cmd = {
    .name = "prewarm",
    .usage =
        "usage: kwarm prewarm --model CONFIG.json [DEPLOYMENT] --cache DIR\n"
        "                     [--jobs N] [--pin NAME] [--max-size SIZE] [--json]\n"
        "                     [--quiet] [--compile-timeout S] [--compile-memory SIZE]\n"
        "                     [--remote redis://HOST:PORT[/DB] --remote-key-file F]\n"
        "\n"
        "Compiles every missing key of the model and deployment into the cache\n"
        "directory DIR (LMDB, created if missing), in N worker processes. Keys\n"
        "already cached are verified (checksum) and counted as hits; a second\n"
        "prewarm of the same deployment compiles nothing. Exit 1 when a key\n"
        "failed or the deployment does not fit in the cache.\n"
        "\n",
    KW__CLI_ROWS(prewarm_rows),
    .model = true,
};

#define KW_CLI_MAX_FAILS 5 /* failures printed in full */

/* What the callbacks gather; lock/cond signal the last result. */
typedef struct tally {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t count[KW_WARM_CANCELLED + 1];
    size_t done, total;
    int interrupted;       /* the signal that stopped it (SIGINT), or 0 */
    size_t unstored;       /* compiled, but the cache had no room */
    char unstored_why[512]; /* the first such key's reason */
    bool finished;
    kw__cli_progress progress;
} tally;

/* warm's callback: count, print a failure, draw progress. */
static void on_result(const kw_warm_result *r, void *arg)
{
    tally *t = arg;
    t->count[r->status]++;
    t->done++;
    if (kw_warm_result_unstored(r) && t->unstored++ == 0)
        snprintf(t->unstored_why, sizeof t->unstored_why, "%s",
                 r->log ? r->log : kw_strerror(r->rc));
    if (r->status == KW_WARM_FAILED && !kw_warm_result_unstored(r) &&
        t->count[KW_WARM_FAILED] - t->unstored <= KW_CLI_MAX_FAILS) {
        char hex[KW_KEYS_HEX_LEN];
        kw_keys_hex(r->key->digest, hex);
        kw__cli_print_failure("prewarm", kw_keys_family_name(r->key->family),
                              r->key->arch, hex, kw_strerror(r->rc), r->log);
    }
    kw__cli_tally sum = {
        .hits = t->count[KW_WARM_HIT] + t->count[KW_WARM_REMOTE_HIT],
        .compiled = t->count[KW_WARM_COMPILED],
        .failed = t->count[KW_WARM_FAILED],
        .cancelled = t->count[KW_WARM_CANCELLED]};
    kw__cli_progress_show(&t->progress, t->done, t->total, &sum);
    if (r->last) {
        pthread_mutex_lock(&t->lock);
        t->finished = true;
        pthread_cond_signal(&t->cond);
        pthread_mutex_unlock(&t->lock);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* kw__cli_interrupt's stop: cancels the warm (arg). */
static void stop_warm(void *arg)
{
    kw_warm_cancel(arg);
}

/* Runs the keys through a warm pipeline on c; fills t.  Returns an exit
 * code (the pipeline could not start: 1). */
static int run_warm(kw_cache *c, kw_remote *remote, const kw_keys_set *set,
                    const prewarm_opts *o, tally *t)
{
    kw_warm_opts wo = {.cache = c, .remote = remote, .jobs = o->jobs,
                       .compile_timeout_ms = o->timeout_s * 1000,
                       .mem_limit = o->mem_limit,
                       .verify_hits = true};
    kw_warm *w = NULL;
    char err[512];
    kw__cli_interrupt in; /* before warm's threads: they inherit its mask */
    bool catching = kw__cli_interrupt_start(&in) == 0;
    int rc = kw_warm_open(&w, &wo, err, sizeof err);
    if (rc < 0) {
        if (catching)
            kw__cli_interrupt_stop(&in);
        kw__cli_err("prewarm", "%s", err);
        return KW_CLI_RUNTIME;
    }
    t->total = set->nkeys;
    kw__cli_progress_init(&t->progress, "prewarm", o->quiet);
    /* Ctrl-C: the rest is cancelled, what is stored stays, report says so */
    kw__cli_interrupt_arm(&in, stop_warm, w);
    rc = kw_warm_submit(w, set->keys, set->nkeys, KW_WARM_PROTECT, on_result, t,
                        NULL);
    pthread_mutex_lock(&t->lock);
    while (rc == 0 && !t->finished)
        pthread_cond_wait(&t->cond, &t->lock);
    pthread_mutex_unlock(&t->lock);
    kw__cli_interrupt_arm(&in, NULL, NULL);
    kw_warm_close(w);
    if (catching)
        t->interrupted = kw__cli_interrupt_stop(&in);
    if (rc < 0) {
        kw__cli_err("prewarm", "%s", kw_strerror(rc));
        return KW_CLI_RUNTIME;
    }
    return KW_CLI_OK;
}

/* Prints the outcome; returns the exit code. */
static int report(kw_cache *c, const tally *t, const kw_keys_set *set,
                  const prewarm_opts *o, double secs)
{
    size_t failed = t->count[KW_WARM_FAILED];
    size_t cancelled = t->count[KW_WARM_CANCELLED];
    if (failed - t->unstored > KW_CLI_MAX_FAILS)
        kw__cli_err("prewarm", "... and %zu more failures",
                    failed - t->unstored - KW_CLI_MAX_FAILS);
    if (t->unstored > 0) { /* "store: " is the stage: the line says so */
        const char *why = t->unstored_why;
        why += strncmp(why, "store: ", 7) == 0 ? 7 : 0;
        bool named = strstr(why, o->cache) != NULL; /* the disk's names it */
        kw__cli_err("prewarm", "%zu keys compiled but not stored%s%s: %s",
                    t->unstored, named ? "" : " in ", named ? "" : o->cache,
                    why);
    }
    if (t->interrupted != 0) /* the signal that stopped it, and where */
        kw__cli_err("prewarm", "interrupted (%s): %zu of %zu keys settled "
                    "(%zu compiled, %zu hits, %zu failed), %zu cancelled; "
                    "what was stored is kept, a rerun finishes the rest",
                    t->interrupted == SIGINT ? "SIGINT" : "SIGTERM",
                    t->done - cancelled, set->nkeys, t->count[KW_WARM_COMPILED],
                    t->count[KW_WARM_HIT] + t->count[KW_WARM_REMOTE_HIT],
                    failed, cancelled);
    if (o->json) {
        printf("{\"keys\": %zu, \"hits\": %zu, \"remote_hits\": %zu, "
               "\"compiled\": %zu, \"failed\": %zu, \"cancelled\": %zu, "
               "\"seconds\": %.3f}\n", set->nkeys, t->count[KW_WARM_HIT],
               t->count[KW_WARM_REMOTE_HIT], t->count[KW_WARM_COMPILED], failed,
               cancelled, secs);
    } else {
        printf("prewarm: %zu keys: %zu compiled, %zu hits, %zu remote hits, "
               "%zu failed, %zu cancelled in %.2f s\n", set->nkeys,
               t->count[KW_WARM_COMPILED], t->count[KW_WARM_HIT],
               t->count[KW_WARM_REMOTE_HIT], failed, cancelled, secs);
        kw_cache_stats st;
        if (kw_cache_stats_get(c, &st) == 0)
            kw__cli_print_stats(&st, o->cache, false);
    }
    return failed == 0 && cancelled == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
}

/* Opens the cache and the fleet tier; prints why not.  An exit code. */
static int open_stores(const prewarm_opts *o, kw_cache **c, kw_remote **r)
{
    kw_cache_opts co = {.dir = o->cache, .max_size = o->max_size};
    char err[512];
    int rc = kw_cache_open(c, &co, err, sizeof err);
    if (rc == 0 && (rc = kw_warm_remote_open(r, o->remote, o->remote_key, 0, 0,
                                             err, sizeof err)) < 0) {
        kw_cache_close(*c);
        *c = NULL;
    }
    if (rc < 0) {
        kw__cli_err("prewarm", "%s", err);
        return rc == KW_EINVAL ? KW_CLI_USAGE : KW_CLI_RUNTIME;
    }
    return KW_CLI_OK;
}

/* Says so when --max-size was given but the cache already stored
 * another limit: the stored one is in force (only kwarm resize changes
 * it), and a silent --max-size would look obeyed. */
static void note_max_size(kw_cache *c, const prewarm_opts *o)
{
    uint64_t stored;
    if (!kw_cache_limit_differs(c, o->max_size, &stored))
        return;
    kw__cli_err("prewarm", "warning: --max-size %llu not applied: %s already "
                "stores a limit of %llu bytes, which stays in force (kwarm "
                "resize --cache %s SIZE changes it)",
                (unsigned long long)o->max_size, o->cache,
                (unsigned long long)stored, o->cache);
}

/* Says so when --remote was given but every call to it failed: the keys
 * were compiled here and nothing was written back, which exit 0 alone
 * would hide. */
static void note_remote(kw_remote *r, const prewarm_opts *o)
{
    kw_remote_stats st;
    if (r == NULL)
        return;
    kw_remote_stats_get(r, &st);
    if (st.errors == 0 || st.hits + st.misses + st.puts > 0)
        return;
    kw__cli_err("prewarm", "warning: --remote %s: unreachable (%llu calls "
                "failed); every key was looked up and compiled locally, "
                "nothing was fetched or written back", o->remote,
                (unsigned long long)st.errors);
}

/* Runs the prewarm proper once the keys are derived. */
static int prewarm_keys(const kw_keys_set *set, const prewarm_opts *o)
{
    kw_cache *c = NULL;
    kw_remote *remote = NULL;
    char err[1024];
    tally t = {.lock = PTHREAD_MUTEX_INITIALIZER,
               .cond = PTHREAD_COND_INITIALIZER};
    double t0 = now();
    int rc = open_stores(o, &c, &remote);
    if (rc != KW_CLI_OK)
        return rc;
    note_max_size(c, o);
    if (kw_cache_claims_note(c) != NULL) /* works, without single flight */
        kw__cli_err("prewarm", "note: no claims: %s", kw_cache_claims_note(c));
    if (set->nkeys > 0 && kw_warm_plan_check(c, set->keys, set->nkeys, err,
                                             sizeof err) < 0) {
        kw__cli_err("prewarm", "%s: %s", o->cache, err);
        rc = KW_CLI_RUNTIME;
    }
    if (rc == KW_CLI_OK && set->nkeys > 0)
        rc = run_warm(c, remote, set, o, &t);
    if (rc == KW_CLI_OK && o->pin != NULL &&
        kw_warm_pin(c, o->pin, set->keys, set->nkeys, err, sizeof err) < 0) {
        kw__cli_err("prewarm", "%s", err);
        rc = KW_CLI_RUNTIME;
    }
    kw_cache_flush(c);
    note_remote(remote, o);
    if (rc == KW_CLI_OK)
        rc = report(c, &t, set, o, now() - t0);
    kw_remote_close(remote);
    kw_cache_close(c);
    return rc;
}

/* Parses prewarm's flags; returns -1 to go on, else an exit code. */
static int parse(kw__cli_model *a, prewarm_opts *o, int argc, char **argv)
{
    int rc = kw__cli_getopt(&prewarm_cmd, argc, argv, o, a, NULL, 0);
    if (rc >= 0)
        return rc;
    if (o->cache == NULL) {
        kw__cli_err("prewarm", "--cache: required (see kwarm prewarm --help)");
        return KW_CLI_USAGE;
    }
    if ((o->remote != NULL) != (o->remote_key != NULL)) {
        kw__cli_err("prewarm", "--remote and --remote-key-file go together");
        return KW_CLI_USAGE;
    }
    return kw__cli_pin_check("prewarm", o->pin); /* before any compile */
}

int kw__cli_prewarm(int argc, char **argv)
{
    kw__cli_model a;
    kw_keys_set set = {0};
    prewarm_opts o = {.jobs = kw__cli_default_jobs(), .timeout_s = 120};
    kw__cli_model_init(&a);
    int rc = parse(&a, &o, argc, argv);
    if (rc < 0 && (rc = kw__cli_model_load(&a, "prewarm")) == KW_CLI_OK &&
        (rc = kw__cli_derive(&a, "prewarm", &set)) == KW_CLI_OK)
        rc = prewarm_keys(&set, &o);
    kw_keys_set_destroy(&set);
    kw__cli_model_destroy(&a);
    return rc;
}
