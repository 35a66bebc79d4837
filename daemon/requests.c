/* requests.c: keys, stats and evict, run on a job thread.
 *
 * `keys` streams the derived keys KW__STREAM_KEYS to a PROGRESS frame
 * ({"keys": [...]}) and ends with a RESULT holding the rest of the
 * document of `kwarm keys --json` and "count"; the client puts the keys
 * back in (kw_client_keys), so no reply is refused for its size.
 */
#include "handlers.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"
#include "kw_jit.h"
#include "metrics.h"

static int req_keys(const cJSON *h, kw_config_model *m, kw_config_deploy *d,
                    kw_keys_packed *set, char *err, size_t errlen)
{
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(h, "config");
    const cJSON *dep = cJSON_GetObjectItemCaseSensitive(h, "deployment");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(h, "name");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(h, "text_config");
    const char *name = cJSON_IsString(nm) ? nm->valuestring : "config.json";
    int rc = 0;
    memset(m, 0, sizeof *m);
    kw_config_deploy_init(d);
    if (!cJSON_IsObject(cfg) || (tc != NULL && !cJSON_IsString(tc)) ||
        (dep != NULL && !cJSON_IsObject(dep))) {
        snprintf(err, errlen, "request: \"config\" must be an object, "
                 "\"deployment\" an object, \"text_config\" a string");
        return KW_EINVAL;
    }
    if (dep != NULL)
        rc = kw_config_deploy_from_json(d, dep, "deployment", err, errlen);
    if (rc == 0 && tc != NULL)
        rc = kw_config_deploy_set_flag(d, KW_CONFIG_TEXT_CONFIG, tc->valuestring,
                                       err, errlen);
    /* The request frame passed the strict reader (common/kw_json.h); the
     * printed tree is read back by the same rules. */
    char *text = rc == 0 ? cJSON_PrintUnformatted(cfg) : NULL;
    if (rc == 0 && text == NULL)
        rc = KW_ENOMEM;
    if (rc == 0)
        rc = kw_config_load_buffer(m, name, text, strlen(text), d->text_config,
                                   err, errlen);
    free(text);
    if (rc == 0)
        rc = kw_config_resolve(d, m, err, errlen);
    for (size_t i = 0; rc == 0 && i < d->narch; i++)
        if (!kw_jit_arch_valid(d->arch[i])) { /* before any work (issue 24) */
            snprintf(err, errlen, "deployment /arch: %.16s: the NVRTC kwarmd "
                     "links cannot build it (kwarm keys --arch names those "
                     "it can)", d->arch[i]);
            rc = KW_EINVAL;
        }
    if (rc == 0)
        rc = kw_keys_derive_packed(m, d, set, err, errlen);
    return rc;
}

/* A keys request between its runs: the packed keys, where the stream
 * is, and the RESULT made before the first key was sent. */
typedef struct keys_state {
    kw_keys_packed p;
    kw_keys_cursor cur;
    cJSON *result;
} keys_state;

static void keys_state_free(void *arg)
{
    keys_state *st = arg;
    if (st == NULL)
        return;
    kw_keys_pack_destroy(&st->p);
    cJSON_Delete(st->result);
    free(st);
}

/* The allocation test hook (common/kw_alloc.h) is paused across jit/'s
 * config and key code, whose failure paths are not daemon/'s to test. */
int kw__req_keys(const cJSON *h, kw_config_model *m, kw_config_deploy *d,
                 kw_keys_packed *set, char *err, size_t errlen)
{
    kw_alloc_pause();
    int rc = req_keys(h, m, d, set, err, errlen);
    kw_alloc_resume();
    return rc;
}

/* Streams the keys of st from where it stopped, in PROGRESS frames of
 * KW__STREAM_KEYS; 0 at the end, 1 when the stream's budget is full (the
 * caller yields), KW_ENOMEM or -ECANCELED (the client left). */
static int stream_keys(kw__req *r, keys_state *st)
{
    const kw_keys_packed *p = &st->p;
    while (st->cur.i < p->n) {
        cJSON *h = cJSON_CreateObject(), *arr = h ? cJSON_AddArrayToObject(h, "keys")
                                                  : NULL;
        if (arr == NULL) {
            cJSON_Delete(h);
            return KW_ENOMEM;
        }
        kw_keys_key key;
        for (size_t n = 0; n < KW__STREAM_KEYS && kw_keys_pack_next(p, &st->cur, &key);
             n++) {
            kw_alloc_pause(); /* jit/'s tree: its failure paths leak */
            cJSON *k = kw_keys_key_json(&key);
            kw_alloc_resume();
            if (k == NULL) {
                cJSON_Delete(h);
                return KW_ENOMEM;
            }
            cJSON_AddItemToArray(arr, k);
        }
        int rc = kw__req_progress_yield(r, h);
        cJSON_Delete(h);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* The RESULT of keys: the document without its keys, plus "count". */
static int keys_result(const kw_config_model *m, const kw_config_deploy *d,
                       const kw_keys_packed *set, cJSON **out)
{
    kw_keys_set none = {.workspace_rows = set->workspace_rows,
                        .workspace_bytes = set->workspace_bytes};
    size_t count = set->n;
    cJSON *doc = NULL;
    kw_alloc_pause(); /* jit/'s tree: its failure paths leak */
    int rc = kw_keys_to_json(m, d, &none, &doc);
    kw_alloc_resume();
    if (rc == 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(doc, "keys");
        if (cJSON_AddNumberToObject(doc, "count", (double)count) == NULL)
            rc = KW_ENOMEM;
    }
    if (rc < 0)
        cJSON_Delete(doc);
    else
        *out = doc;
    return rc;
}

/* The first run of a keys request: derive (packed), charge, make the
 * RESULT; 0 with r->state set, or a code with the message in err. */
static int keys_begin(kw__req *r, char *err, size_t errlen)
{
    kw_config_model m;
    kw_config_deploy d;
    keys_state *st = kw_calloc(1, sizeof *st);
    int rc = st ? kw__req_keys(r->header, &m, &d, &st->p, err, errlen) : KW_ENOMEM;
    if (st == NULL)
        return rc;
    if (rc == 0)
        rc = kw__req_charge_keys(r, st->p.n, err, errlen);
    if (rc == 0)
        rc = keys_result(&m, &d, &st->p, &st->result);
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
    /* The derivation's scratch is freed but kept by glibc's arena of this
     * thread; give it back before the (maybe long) stream. */
    if (st->p.n >= KW__TRIM_KEYS || rc < 0)
        malloc_trim(0);
    if (rc < 0) {
        keys_state_free(st);
        return rc;
    }
    r->state = st;
    r->state_free = keys_state_free;
    return 0;
}

bool kw__run_keys(kw__req *r)
{
    char err[KW_CONFIG_ERRLEN];
    int rc = r->state != NULL ? 0 : keys_begin(r, err, sizeof err);
    if (rc == 0 && (rc = stream_keys(r, r->state)) == 1)
        return true; /* yielded: the budget is full */
    if (rc < 0) {
        kw__req_error(r, rc, rc == KW_ENOMEM || rc == -ECANCELED ||
                             r->state != NULL ? NULL : err);
        return false;
    }
    keys_state *st = r->state;
    kw__req_finish(r, KW_PROTO_RESULT, st->result);
    return false; /* the state goes with the request */
}

/* Adds n numbers to h; false when an allocation failed (h is then
 * incomplete and must not be sent). */
static bool add_numbers(cJSON *h, const char *const *names, const uint64_t *v,
                        size_t n)
{
    bool ok = h != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddNumberToObject(h, names[i], (double)v[i]) != NULL;
    return ok;
}

#define NSTATS 35

/* Every counter of `stats` (README.md says what each means): the cache's,
 * the loop's (as of the request), the warm pipeline's, the fleet tier's. */
static size_t collect_stats(const kw__req *r, const kw_cache_stats *st,
                            const kw_warm_stats *wsp, const kw_remote_stats *rsp,
                            const char **names, uint64_t *v)
{
    const kw_warm_stats ws = *wsp;
    const kw_remote_stats rs = *rsp;
    static const char *const n[NSTATS] = {
        "entries", "bytes", "max_size", "hits", "misses", "compiles",
        "compile_failures", "evictions", "corrupt", "connections", "requests",
        "protocol_errors", "refused", "refused_full", "warm_keys", "warm_hits",
        "warm_misses", "warm_joined", "remote_hits", "store_failures",
        "cancelled", "compiles_queued", "compiles_inflight", "warm_jobs_active",
        "compiles_started", "remote_fetches", "remote_misses", "remote_errors",
        "remote_refused", "remote_puts", "held_reads", "held_read_timeouts",
        "held_reads_copied", "remote_writebacks_queued",
        "remote_writebacks_dropped"};
    /* compiles_started: flights that reached a worker. */
    uint64_t started = ws.compiles + ws.compile_failures + ws.store_failures +
                       ws.compiling;
    const uint64_t val[NSTATS] = {
        st->entries, st->bytes, st->max_size, st->hits, st->misses,
        st->compiles, st->compile_failures, st->evictions, st->corrupt,
        r->nconns, r->requests, r->protocol_errors, r->refused,
        r->refused_full, ws.keys, ws.hits, ws.misses, ws.joined,
        ws.remote_hits, ws.store_failures, ws.cancelled, ws.queued,
        ws.compiling, ws.jobs_active, started, rs.hits, rs.misses, rs.errors,
        rs.refused, rs.puts, atomic_load(&r->d->nheld),
        atomic_load(&r->d->held_expired), atomic_load(&r->d->held_copied),
        ws.writebacks_queued, ws.writebacks_dropped};
    memcpy(names, n, sizeof n);
    memcpy(v, val, sizeof val);
    return NSTATS;
}

/* The reply of stats: every counter, and "prometheus", the text of
 * GET /metrics made from the same snapshots (`kwarm stats --prometheus`
 * prints it; the CLI's other forms leave it out).  A reply member rather
 * than a request option: older clients need no change, and a kwarmd
 * without it just lacks the member. */
void kw__run_stats(kw__req *r)
{
    kw_cache_stats st;
    kw_warm_stats ws;
    kw_remote_stats rs = {0}; /* fleet tier: zeros without one */
    const char *names[NSTATS];
    uint64_t v[NSTATS];
    int rc = kw_warm_cache_stats(r->d->warm, &st);
    if (rc < 0) {
        kw__req_error(r, rc, NULL);
        return;
    }
    kw_warm_stats_get(r->d->warm, &ws);
    if (r->d->remote != NULL)
        kw_remote_stats_get(r->d->remote, &rs);
    size_t n = collect_stats(r, &st, &ws, &rs, names, v), len = 0;
    char *text = NULL;
    cJSON *h = cJSON_CreateObject();
    if (!add_numbers(h, names, v, n) ||
        cJSON_AddBoolToObject(h, "read_only", st.read_only) == NULL ||
        kw__metrics_format(r->d, &st, &ws, &rs, &text, &len) < 0 ||
        cJSON_AddStringToObject(h, "prometheus", text) == NULL) {
        cJSON_Delete(h);
        h = NULL; /* kw__req_finish answers KW_ENOMEM */
    }
    free(text);
    kw__req_finish(r, KW_PROTO_RESULT, h);
    cJSON_Delete(h);
}

void kw__run_evict(kw__req *r)
{
    const cJSON *match = cJSON_GetObjectItemCaseSensitive(r->header, "match");
    if (match != NULL) { /* by criteria, as kwarm evict --socket asks */
        kw__run_evict_match(r, match);
        return;
    }
    uint8_t digest[KW_KEYS_DIGEST_LEN];
    char err[700] = "";
    int rc = kw__req_digest(r->d->cache, r->header, digest, err, sizeof err);
    if (rc == 0)
        rc = kw_warm_remove(r->d->cache, digest, err, sizeof err);
    if (rc < 0 && rc != KW_ENOTFOUND) {
        kw__req_error(r, rc, err[0] ? err : NULL);
        return;
    }
    cJSON *h = cJSON_CreateObject();
    if (h != NULL && cJSON_AddBoolToObject(h, "evicted", rc == 0) == NULL) {
        cJSON_Delete(h);
        h = NULL;
    }
    kw__req_finish(r, KW_PROTO_RESULT, h);
    cJSON_Delete(h);
}
