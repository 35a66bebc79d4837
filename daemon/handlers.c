/* handlers.c: kwarmd's requests: ping, keys, warmup, get, stats, evict.
 *
 * Replies carry the same JSON as the `--json` output of the kwarm command
 * of the same name.  A request that fails on its own input gets an ERROR
 * frame and the connection stays open; only protocol errors close it.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "kw_err.h"
#include "kw_keys.h"
#include "log.h"

/* A warmup or a get waiting on compiles. */
typedef struct slot {
    struct kw__req *req;
    size_t index;
} slot;

struct kw__req {
    kw__conn *conn;
    uint16_t type;     /* KW_PROTO_WARMUP or KW_PROTO_GET */
    kw_keys_set set;   /* warmup: every key; get: the one key */
    char *status;      /* per key: 'h' hit, 'c' compiled, 'f' failed, 0 waiting */
    slot *slots;
    size_t pending;
    size_t compiled, hits, failed;
    double t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void req_free(struct kw__req *r)
{
    kw_keys_set_destroy(&r->set);
    free(r->status);
    free(r->slots);
    free(r);
}

/* Reads the model and deployment of a keys or warmup request:
 * {"config": {...}, "name": "...", "deployment": {...}, "text_config": "/..."}
 * and derives its keys.  Returns 0, or a code with the message in err. */
static int request_keys(const cJSON *h, kw_config_model *m, kw_config_deploy *d,
                        kw_keys_set *set, char *err, size_t errlen)
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
    char *text = rc == 0 ? cJSON_PrintUnformatted(cfg) : NULL;
    if (rc == 0 && text == NULL)
        rc = KW_ENOMEM;
    if (rc == 0)
        rc = kw_config_load_buffer(m, name, text, strlen(text), d->text_config,
                                   err, errlen);
    free(text);
    if (rc == 0)
        rc = kw_config_resolve(d, m, err, errlen);
    if (rc == 0)
        rc = kw_keys_derive(m, d, set, err, errlen);
    return rc;
}

static void handle_ping(kw__conn *c)
{
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "version", c->d->version);
    kw__conn_send(c, KW_PROTO_PONG, h, NULL, 0);
    cJSON_Delete(h);
}

static void handle_keys(kw__conn *c, const cJSON *hdr)
{
    kw_config_model m;
    kw_config_deploy d;
    kw_keys_set set = {0};
    char err[KW_CONFIG_ERRLEN];
    cJSON *doc = NULL;
    int rc = request_keys(hdr, &m, &d, &set, err, sizeof err);
    if (rc == 0 && (rc = kw_keys_to_json(&m, &d, &set, &doc)) == 0)
        kw__conn_send(c, KW_PROTO_RESULT, doc, NULL, 0);
    else
        kw__conn_error(c, rc, rc == KW_ENOMEM ? NULL : err, false);
    cJSON_Delete(doc);
    kw_keys_set_destroy(&set);
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
}

/* ---- warmup ---------------------------------------------------------- */

static const char *status_name(char s)
{
    return s == 'h' ? "hit" : s == 'c' ? "compiled" : s == 'f' ? "failed" : "waiting";
}

/* Streams one PROGRESS frame for key i of a warmup. */
static void progress(struct kw__req *r, size_t i)
{
    char hex[KW_KEYS_HEX_LEN];
    cJSON *h = cJSON_CreateObject();
    kw_keys_hex(r->set.keys[i].digest, hex);
    cJSON_AddNumberToObject(h, "done", (double)(r->compiled + r->hits + r->failed));
    cJSON_AddNumberToObject(h, "total", (double)r->set.nkeys);
    cJSON_AddStringToObject(h, "digest", hex);
    cJSON_AddStringToObject(h, "family", kw_keys_family_name(r->set.keys[i].family));
    cJSON_AddStringToObject(h, "status", status_name(r->status[i]));
    kw__conn_send(r->conn, KW_PROTO_PROGRESS, h, NULL, 0);
    cJSON_Delete(h);
}

/* The RESULT of a warmup: counts, like prewarm --json, plus the manifest. */
static void warmup_result(struct kw__req *r)
{
    cJSON *h = cJSON_CreateObject(), *man = cJSON_CreateArray();
    cJSON_AddNumberToObject(h, "keys", (double)r->set.nkeys);
    cJSON_AddNumberToObject(h, "compiled", (double)r->compiled);
    cJSON_AddNumberToObject(h, "hits", (double)r->hits);
    cJSON_AddNumberToObject(h, "failed", (double)r->failed);
    cJSON_AddNumberToObject(h, "seconds", now_s() - r->t0);
    for (size_t i = 0; i < r->set.nkeys; i++) {
        char hex[KW_KEYS_HEX_LEN];
        cJSON *k = cJSON_CreateObject();
        kw_keys_hex(r->set.keys[i].digest, hex);
        cJSON_AddStringToObject(k, "digest", hex);
        cJSON_AddStringToObject(k, "family", kw_keys_family_name(r->set.keys[i].family));
        cJSON_AddStringToObject(k, "arch", r->set.keys[i].arch);
        cJSON_AddStringToObject(k, "status", status_name(r->status[i]));
        cJSON_AddItemToArray(man, k);
    }
    cJSON_AddItemToObject(h, "manifest", man);
    kw__conn_send(r->conn, KW_PROTO_RESULT, h, NULL, 0);
    cJSON_Delete(h);
}

static int get_reply(kw__conn *c, const uint8_t *digest, bool compiled,
                     bool report_miss);

/* Compile callback of one key of a warmup or get (loop thread). */
static void on_compiled(int rc, const char *log, void *arg)
{
    slot *s = arg;
    struct kw__req *r = s->req;
    kw__conn *c = r->conn;
    /* A key the fleet tier had (issue 6) is a hit: nothing compiled. */
    r->status[s->index] = rc == 0 ? 'c' : rc == KW__COMPILE_FETCHED ? 'h' : 'f';
    if (rc == 0)
        r->compiled++;
    else if (rc == KW__COMPILE_FETCHED)
        r->hits++;
    else {
        r->failed++;
        KW_LOG(KW_LOG_WARNING, "compile of a %s key failed: %s",
               kw_keys_family_name(r->set.keys[s->index].family), kw_strerror(rc));
        (void)log;
    }
    bool last = --r->pending == 0;
    if (!c->closing && r->type == KW_PROTO_WARMUP)
        progress(r, s->index);
    if (last && !c->closing) {
        if (r->type == KW_PROTO_WARMUP)
            warmup_result(r);
        else if (rc >= 0)
            get_reply(c, r->set.keys[0].digest, rc == 0, true);
        else
            kw__conn_error(c, rc, log, false);
    }
    if (last) {
        req_free(r);
        kw__conn_request_done(c);
    }
    kw__conn_unref(c);
}

/* Submits the keys of r whose status is unset; returns how many. */
static size_t submit_misses(struct kw__req *r)
{
    kw__conn *c = r->conn;
    size_t n = 0;
    for (size_t i = 0; i < r->set.nkeys; i++) {
        if (r->status[i] != 0)
            continue;
        r->slots[i] = (slot){r, i};
        r->pending++; /* before submit: a callback never runs inside it */
        if (kw__compiler_submit(c->d->compiler, &r->set.keys[i], on_compiled,
                                &r->slots[i]) < 0) {
            r->pending--;
            r->status[i] = 'f';
            r->failed++;
            continue;
        }
        c->refs++;
        n++;
    }
    return n;
}

/* Allocates a request of n keys for c. */
static struct kw__req *req_new(kw__conn *c, uint16_t type, size_t n)
{
    struct kw__req *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->conn = c;
    r->type = type;
    r->t0 = now_s();
    r->status = calloc(n + 1, 1);
    r->slots = calloc(n + 1, sizeof *r->slots);
    if (r->status == NULL || r->slots == NULL) {
        req_free(r);
        return NULL;
    }
    return r;
}

static void handle_warmup(kw__conn *c, const cJSON *hdr)
{
    kw_config_model m;
    kw_config_deploy d;
    kw_keys_set set = {0};
    char err[KW_CONFIG_ERRLEN];
    struct kw__req *r = NULL;
    int rc = request_keys(hdr, &m, &d, &set, err, sizeof err);
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
    if (rc == 0 && (r = req_new(c, KW_PROTO_WARMUP, set.nkeys)) == NULL)
        rc = KW_ENOMEM;
    if (rc < 0) {
        kw_keys_set_destroy(&set);
        kw__conn_error(c, rc, rc == KW_ENOMEM ? NULL : err, false);
        return;
    }
    r->set = set;
    for (size_t i = 0; i < set.nkeys; i++)
        if (kw_cache_contains(c->d->cache, set.keys[i].digest)) {
            r->status[i] = 'h';
            r->hits++;
            progress(r, i);
        }
    if (submit_misses(r) == 0) {
        warmup_result(r);
        req_free(r);
        return;
    }
    c->active = r;
}

/* ---- get, stats, evict ------------------------------------------------ */

/* Answers a get from the cache: RESULT {digest, family, arch, entry, size,
 * compiled} with the cubin as payload, or an ERROR (KW_ENOTFOUND...; a
 * miss is left unanswered when !report_miss).  Returns the get's code. */
static int get_reply(kw__conn *c, const uint8_t *digest, bool compiled,
                     bool report_miss)
{
    size_t cap = 0, len = 0;
    kw_cache_info info;
    char hex[KW_KEYS_HEX_LEN];
    void *blob = kw__conn_take_buffer(c, 64 * 1024, &cap);
    int rc = blob ? kw_cache_get_into(c->d->cache, digest, blob, cap, &len, &info)
                  : KW_ENOMEM;
    if (rc == KW_ENOSPC) { /* bigger than the buffer: grow it once */
        void *b = realloc(blob, len);
        rc = b ? kw_cache_get_into(c->d->cache, digest, b, len, &len, &info)
               : KW_ENOMEM;
        blob = b ? b : blob;
        cap = b ? len : cap;
    }
    if (rc < 0) {
        free(blob);
        if (report_miss || (rc != KW_ENOTFOUND && rc != KW_ECORRUPT))
            kw__conn_error(c, rc, NULL, false);
        return rc;
    }
    kw_keys_hex(digest, hex);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "digest", hex);
    cJSON_AddStringToObject(h, "family", info.family);
    cJSON_AddStringToObject(h, "arch", info.arch);
    cJSON_AddStringToObject(h, "entry", info.entry);
    cJSON_AddNumberToObject(h, "size", (double)len);
    cJSON_AddBoolToObject(h, "compiled", compiled);
    kw__conn_send_owned(c, KW_PROTO_RESULT, h, blob, len, cap); /* takes blob */
    cJSON_Delete(h);
    return 0;
}

/* Reads a get's key: {"digest": HEX} or {"family", "fields": {...},
 * "arch"}.  *have_key says whether k is a whole key (compilable). */
static int get_key(const cJSON *h, kw_keys_key *k, bool *have_key, char *err,
                   size_t errlen)
{
    const cJSON *dg = cJSON_GetObjectItemCaseSensitive(h, "digest");
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(h, "family");
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(h, "fields");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(h, "arch");
    memset(k, 0, sizeof *k);
    *have_key = false;
    if (cJSON_IsString(dg)) {
        size_t n = 0;
        if (strlen(dg->valuestring) == 64 &&
            sodium_hex2bin(k->digest, sizeof k->digest, dg->valuestring, 64,
                           NULL, &n, NULL) == 0 && n == sizeof k->digest)
            return 0;
        snprintf(err, errlen, "get: \"digest\" must be 64 hex digits");
        return KW_EINVAL;
    }
    if (!cJSON_IsString(fam) || !cJSON_IsObject(fields) || !cJSON_IsString(arch) ||
        kw_keys_family_from_name(fam->valuestring, &k->family) < 0 ||
        snprintf(k->arch, sizeof k->arch, "%s", arch->valuestring) >= (int)sizeof k->arch) {
        snprintf(err, errlen, "get: needs \"digest\", or a known \"family\", "
                 "\"fields\" and \"arch\"");
        return KW_EINVAL;
    }
    for (size_t i = 0; i < kw_keys_nfields(k->family); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(fields,
                                                          kw_keys_field_name(k->family, i));
        /* Integers only, within int32 like every key field: a fraction
         * must not truncate into another key's value. */
        bool num = cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
                   fabs(v->valuedouble) <= 2147483647.0;
        if (!num && !cJSON_IsBool(v)) {
            snprintf(err, errlen, "get: /fields/%s: missing or not an integer",
                     kw_keys_field_name(k->family, i));
            return KW_EINVAL;
        }
        k->fields[i] = cJSON_IsBool(v) ? cJSON_IsTrue(v) : (int64_t)v->valuedouble;
    }
    *have_key = true;
    return kw_keys_digest(k, k->digest);
}

static void handle_get(kw__conn *c, const cJSON *hdr)
{
    kw_keys_key k;
    bool have_key;
    char err[256];
    const cJSON *comp = cJSON_GetObjectItemCaseSensitive(hdr, "compile");
    int rc = get_key(hdr, &k, &have_key, err, sizeof err);
    if (rc < 0) {
        kw__conn_error(c, rc, err, false);
        return;
    }
    /* One lookup on the hit path; a miss (or a corrupt entry, which the
     * cache removed) goes on to a compile when the key is whole. */
    bool may_compile = have_key && !cJSON_IsFalse(comp);
    rc = get_reply(c, k.digest, false, !may_compile);
    if (rc == 0 || !may_compile || (rc != KW_ENOTFOUND && rc != KW_ECORRUPT))
        return;
    struct kw__req *r = req_new(c, KW_PROTO_GET, 1);
    kw_keys_key *one = r ? malloc(sizeof *one) : NULL;
    if (one == NULL) {
        if (r)
            req_free(r);
        kw__conn_error(c, KW_ENOMEM, NULL, false);
        return;
    }
    *one = k;
    r->set.keys = one;
    r->set.nkeys = 1;
    if (submit_misses(r) == 0) {
        kw__conn_error(c, -ECANCELED, "kwarmd is stopping", false);
        req_free(r);
        return;
    }
    c->active = r;
}

static void handle_stats(kw__conn *c)
{
    kw_cache_stats st;
    kw__daemon *d = c->d;
    int rc = kw_cache_stats_get(d->cache, &st);
    if (rc < 0) {
        kw__conn_error(c, rc, NULL, false);
        return;
    }
    cJSON *h = cJSON_CreateObject();
    const char *names[] = {"entries", "bytes", "max_size", "hits", "misses",
                           "compiles", "compile_failures", "evictions", "corrupt"};
    uint64_t v[] = {st.entries, st.bytes, st.max_size, st.hits, st.misses,
                    st.compiles, st.compile_failures, st.evictions, st.corrupt};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        cJSON_AddNumberToObject(h, names[i], (double)v[i]);
    cJSON_AddNumberToObject(h, "connections", (double)d->nconns);
    cJSON_AddNumberToObject(h, "requests", (double)d->requests);
    cJSON_AddNumberToObject(h, "compiles_started",
                            (double)kw__compiler_started(d->compiler));
    cJSON_AddNumberToObject(h, "compiles_inflight",
                            (double)kw__compiler_inflight(d->compiler));
    cJSON_AddNumberToObject(h, "protocol_errors", (double)d->protocol_errors);
    cJSON_AddNumberToObject(h, "refused", (double)d->refused);
    kw_remote_stats rs = {0}; /* fleet tier (issue 6): zeros without one */
    if (d->remote != NULL)
        kw_remote_stats_get(d->remote, &rs);
    cJSON_AddNumberToObject(h, "remote_hits", (double)rs.hits);
    cJSON_AddNumberToObject(h, "remote_misses", (double)rs.misses);
    cJSON_AddNumberToObject(h, "remote_errors", (double)rs.errors);
    cJSON_AddNumberToObject(h, "remote_refused", (double)rs.refused);
    cJSON_AddNumberToObject(h, "remote_puts", (double)rs.puts);
    kw__conn_send(c, KW_PROTO_RESULT, h, NULL, 0);
    cJSON_Delete(h);
}

static void handle_evict(kw__conn *c, const cJSON *hdr)
{
    kw_keys_key k;
    bool have_key;
    char err[256];
    int rc = get_key(hdr, &k, &have_key, err, sizeof err);
    if (rc == 0)
        rc = kw_cache_remove(c->d->cache, k.digest);
    if (rc < 0 && rc != KW_ENOTFOUND) {
        kw__conn_error(c, rc, rc == KW_EINVAL ? err : NULL, false);
        return;
    }
    cJSON *h = cJSON_CreateObject();
    cJSON_AddBoolToObject(h, "evicted", rc == 0);
    kw__conn_send(c, KW_PROTO_RESULT, h, NULL, 0);
    cJSON_Delete(h);
}

void kw__daemon_dispatch(kw__conn *c, const kw_msg *m)
{
    switch (m->type) {
    case KW_PROTO_PING:
        handle_ping(c);
        break;
    case KW_PROTO_KEYS:
        handle_keys(c, m->header);
        break;
    case KW_PROTO_WARMUP:
        handle_warmup(c, m->header);
        break;
    case KW_PROTO_GET:
        handle_get(c, m->header);
        break;
    case KW_PROTO_STATS:
        handle_stats(c);
        break;
    case KW_PROTO_EVICT:
        handle_evict(c, m->header);
        break;
    default: /* kw_proto_parse_request() lets only requests through */
        kw__conn_error(c, KW_EPROTO, "not a request type", true);
    }
}
