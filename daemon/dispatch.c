/* dispatch.c: the loop thread's side of kwarmd's requests (handlers.h).
 *
 * The loop answers ping, and a get that hits, itself: both cost a bounded
 * amount whatever the request.  Everything whose cost grows with the
 * request (keys and warmup: key derivation and streamed JSON; stats: a
 * wait on the cache's flush lock; evict: an LMDB write) goes to a job
 * thread (jobs.c); a get that misses goes to the warm pipeline and is
 * answered from the cache on the loop once its key is there.
 *
 * Replies carry the same JSON as the `--json` output of the kwarm command
 * of the same name.  A request that fails on its own input gets an ERROR
 * frame and the connection stays open; only protocol errors close it.
 */
#include "handlers.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"
#include "metrics.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void request_end(kw__req *r);

/* A request of c, holding a reference on c until it ends. */
static kw__req *req_new(kw__conn *c, uint16_t type, const cJSON *hdr)
{
    size_t max = c->d->opts->max_output;
    kw__req *r = kw_calloc(1, sizeof *r);
    if (r == NULL ||
        (r->s = kw__stream_new(r, max, &c->d->stream_bytes,
                               KW__STREAMS_TOTAL(max))) == NULL ||
        (hdr != NULL && (r->header = cJSON_Duplicate(hdr, 1)) == NULL)) {
        if (r != NULL)
            kw__stream_unref(r->s);
        free(r);
        return NULL;
    }
    r->d = c->d;
    r->conn = c;
    r->type = type;
    r->t0 = now_s();
    r->nconns = c->d->nconns;
    r->requests = c->d->requests;
    r->protocol_errors = c->d->protocol_errors;
    r->refused = c->d->refused;
    r->refused_full = c->d->refused_full;
    r->uid = c->uid;
    r->pid = c->pid;
    c->l->nreqs++;
    kw__conn_begin(c, r);
    if (type == KW_PROTO_WARMUP)
        kw__heartbeat_begin(r);
    return r;
}

/* d->up.end: ends r after its final frame, on the loop thread: counts
 * it, releases what it holds (its keys' charge, its warm job, its
 * stream) and resumes its connection. */
static void request_end(kw__req *r)
{
    kw__conn *c = r->conn;
    kw__loop *l = c->l; /* c may be freed below */
    kw__daemon *d = r->d;
    kw__metrics_request(d, r->type, !r->failed);
    if (r->alloc_armed)
        kw__alloc_hook_done(d);
    if (r->type == KW_PROTO_GET)
        kw__metrics_get(d, (uint64_t)((now_s() - r->t0) * 1e9));
    if (r->type == KW_PROTO_WARMUP)
        kw__heartbeat_end(r);
    kw_warm_job_release(r->job);
    atomic_fetch_sub(&d->keys_in_flight, r->keys_charged);
    kw__stream_unref(r->s); /* its writes still queued hold it */
    kw_keys_pack_destroy(&r->set);
    if (r->state_free != NULL)
        r->state_free(r->state); /* a streaming handler that never ended */
    cJSON_Delete(r->header);
    cJSON_Delete(r->batch);
    free(r->log);
    free(r);
    l->nreqs--;
    kw__conn_request_done(c);
    kw__conn_unref(c);
    kw__loop_check_stop(l);
}

/* d->up.abort: r's connection closed; r stops what it can. */
static void request_abort(kw__req *r)
{
    atomic_store(&r->aborted, true); /* a warmup's next result cancels */
    kw__stream_abort(r->s); /* parked producers wake and stop */
    if (r->job != NULL)
        kw_warm_job_cancel(r->job); /* nobody will read its results */
}

/* Runs r's handler once: true when it yielded on a full stream budget
 * (its state kept in r->state), false when it is over or left to warm. */
static bool run_handler(kw__req *r)
{
    switch (r->type) {
    case KW_PROTO_KEYS:
        return kw__run_keys(r);
    case KW_PROTO_LS:
        return kw__run_ls(r);
    case KW_PROTO_WARMUP:
        kw__run_warmup(r);
        break;
    case KW_PROTO_STATS:
        kw__run_stats(r);
        break;
    case KW_PROTO_MISSES:
        kw__run_misses(r);
        break;
    case KW_PROTO_PINS:
        kw__run_pins(r);
        break;
    case KW_PROTO_UNPIN:
        kw__run_unpin(r);
        break;
    case KW_PROTO_RESIZE:
        kw__run_resize(r);
        break;
    default:
        kw__run_evict(r);
    }
    return false;
}

/* d->up.run, on a job thread: runs r's handler, or refuses r when the
 * job threads are stopping.  A handler that yielded on a full budget goes
 * on at once when room came meanwhile; else it is parked, and the loop
 * queues it again (no job thread waits for a slow client). */
static void run_job(kw__req *r, bool refuse)
{
    if (refuse) {
        kw__req_error(r, -ECANCELED, "kwarmd is stopping");
        return;
    }
    while (run_handler(r) && kw__stream_park(r))
        ;
}

/* Answers a ping; false when that was an error frame. */
static bool handle_ping(kw__conn *c)
{
    cJSON *h = cJSON_CreateObject();
    bool ok = h != NULL &&
              cJSON_AddStringToObject(h, "version", c->d->version) != NULL;
    if (ok && c->d->alloc_hook) /* tests only */
        ok = cJSON_AddBoolToObject(h, "alloc_fired",
                                   atomic_load(&c->d->alloc_fired)) != NULL;
    if (!ok)
        kw__conn_error(c, KW_ENOMEM, NULL, false);
    else
        kw__conn_send(c, KW_PROTO_PONG, h, NULL, 0);
    cJSON_Delete(h);
    return ok;
}

/* ---- get -------------------------------------------------------------- */

/* The RESULT header of a get: {digest, family, arch, entry, size,
 * compiled}, encoded as the prefix of a frame of size payload bytes. */
static int encode_get(const uint8_t *digest, const kw_cache_info *info,
                      size_t size, bool compiled, uint8_t **frame, size_t *len)
{
    char hex[KW_KEYS_HEX_LEN];
    kw_keys_hex(digest, hex);
    cJSON *h = cJSON_CreateObject();
    int rc = KW_ENOMEM;
    if (h != NULL && cJSON_AddStringToObject(h, "digest", hex) &&
        cJSON_AddStringToObject(h, "family", info->family) &&
        cJSON_AddStringToObject(h, "arch", info->arch) &&
        cJSON_AddStringToObject(h, "entry", info->entry) &&
        cJSON_AddNumberToObject(h, "size", (double)size) &&
        cJSON_AddBoolToObject(h, "compiled", compiled))
        rc = kw_proto_encode_prefix(KW_PROTO_RESULT, h, size, frame, len);
    cJSON_Delete(h);
    return rc;
}

/* Answers a get from the cache: RESULT with the cubin as payload, written
 * from the cache's map (kw__conn_send_view_frame; a hit's header comes
 * from the loop's table when it was made before), or an ERROR
 * (KW_ENOTFOUND...; a miss is left unanswered when !report_miss).  The
 * cache never writes on this path (defer_writes): a corrupt entry is
 * queued for the next flush.  Returns the get's code. */
static int get_reply(kw__conn *c, const uint8_t *digest, bool compiled,
                     bool report_miss)
{
    kw_cache_view v;
    kw_cache_info info;
    /* Straight to the cache, not through warm/: the zero-copy hit path,
     * one borrow of the map per hit whose bytes go to the socket as they
     * are (design.md section 6).  docs/perf.md, "Cache hit against
     * compile": borrow + release 0.46 us p50 against 0.73 us for a
     * checked copy (bench_cache); warm/ has no view to lend. */
    int rc = kw_cache_borrow(c->d->cache, digest, &v, &info);
    if (rc < 0) {
        if (report_miss || (rc != KW_ENOTFOUND && rc != KW_ECORRUPT))
            kw__conn_error(c, rc, NULL, false);
        return rc;
    }
    size_t len = 0;
    const uint8_t *memo = compiled ? NULL
                                   : kw__hits_get(c->l, digest, &info, v.len, &len);
    if (memo != NULL) {
        kw__conn_send_view_frame(c, memo, len, false, &v); /* takes v */
        return 0;
    }
    uint8_t *frame = NULL;
    if ((rc = encode_get(digest, &info, v.len, compiled, &frame, &len)) < 0) {
        kw_cache_release(&v);
        kw__conn_error(c, rc, NULL, false);
        return 0;
    }
    if (!compiled)
        kw__hits_put(c->l, digest, &info, v.len, frame, len);
    kw__conn_send_view_frame(c, frame, len, true, &v); /* takes v, frame */
    return 0;
}

/* Records a get that missed (the cache, or the client's loaded set: kind),
 * for `kwarm misses`. */
static void audit_miss(kw__daemon *d, uid_t uid, pid_t pid, const kw_keys_key *k,
                       bool have_key, int outcome, int kind)
{
    kw__miss m = {.t = kw__audit_now(), .uid = uid, .pid = pid, .key = *k,
                  .have_key = have_key, .outcome = outcome, .kind = kind};
    kw__audit_add(&d->audit, &m);
}

/* The get's "miss": absent (0), "runtime" (1) or "capture" (2): a serving
 * process says its own loaded set lacked the key (issue 22), so the get
 * is audited even when the cache answers it.  -1 for anything else. */
static int miss_kind(const cJSON *hdr)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(hdr, "miss");
    if (m == NULL)
        return 0;
    return kw__audit_kind_from_name(cJSON_GetStringValue(m));
}

/* The loop's half of a get that compiled: answer from the cache. */
static void get_finish(kw__req *r)
{
    kw__conn *c = r->conn;
    r->failed = true; /* unless the reply below is a RESULT */
    if (c->closing)
        return;
    if (r->status == KW_WARM_FAILED)
        kw__conn_error(c, r->rc, r->log, false);
    else if (r->status == KW_WARM_CANCELLED)
        kw__conn_error(c, -ECANCELED, "kwarmd is stopping", false);
    else
        r->failed = get_reply(c, r->key.digest, r->status == KW_WARM_COMPILED,
                              true) < 0;
}

/* warm's callback for a get's one key (a warm thread). */
static void on_get_result(const kw_warm_result *res, void *arg)
{
    kw__req *r = arg;
    static const int outcome[] = {[KW_WARM_HIT] = 1, [KW_WARM_REMOTE_HIT] = 3,
                                  [KW_WARM_COMPILED] = 1, [KW_WARM_FAILED] = 2,
                                  [KW_WARM_CANCELLED] = 4};
    audit_miss(r->d, r->uid, r->pid, &r->key, true, outcome[res->status],
               r->miss_kind);
    r->status = res->status;
    r->rc = res->rc;
    if (res->log != NULL)
        r->log = kw_strdup(res->log); /* NULL: the error names no log */
    if (res->status == KW_WARM_FAILED)
        KW_LOG(KW_LOG_WARNING, "compile of a %s key failed: %s",
               kw_keys_family_name(res->key->family), kw_strerror(res->rc));
    /* The final envelope was allocated with the request: this cannot
     * fail, so the get always ends (issue 23). */
    kw__stream_end(r, NULL, 0, get_finish);
}

/* Serves a get that started at t0 (now_s()): 0 answered, -1 answered by
 * an ERROR frame, 1 under way (a compile; the request ends later). */
static int handle_get(kw__conn *c, const cJSON *hdr, double t0)
{
    kw_keys_key k;
    bool have_key;
    char err[256];
    const cJSON *comp = cJSON_GetObjectItemCaseSensitive(hdr, "compile");
    int kind = miss_kind(hdr);
    int rc = kind < 0 ? KW_EINVAL
                      : kw__req_get_key(c->d->cache, hdr, &k, &have_key, err,
                                        sizeof err);
    if (kind < 0)
        snprintf(err, sizeof err, "get: \"miss\" must be \"runtime\" or "
                 "\"capture\"");
    if (rc < 0) {
        kw__conn_error(c, rc, err, false);
        return -1;
    }
    /* One lookup on the hit path; a miss (or a corrupt entry, queued for
     * removal) goes on to the warm pipeline when the key is whole. */
    bool ro = c->d->read_only;
    bool may_compile = have_key && !cJSON_IsFalse(comp) && !ro;
    rc = get_reply(c, k.digest, false, !may_compile && !ro && have_key);
    bool missed = rc == KW_ENOTFOUND || rc == KW_ECORRUPT;
    if (missed && ro) /* nothing is compiled into a read-only cache */
        kw__conn_error(c, KW_EROFS, "not cached (read-only cache)", false);
    else if (missed && !have_key)
        kw__conn_error(c, KW_ENOTFOUND, "not cached, and a digest cannot be "
                       "compiled: ask by family, fields and arch (kwarm keys "
                       "--json lists them), or warm the deployment first", false);
    if (missed && !may_compile)
        audit_miss(c->d, c->uid, c->pid, &k, have_key, 0, kind);
    else if (rc == 0 && kind) /* the client missed; the cache had it */
        audit_miss(c->d, c->uid, c->pid, &k, have_key, 5, kind);
    if (rc == 0 || !may_compile || !missed)
        return rc == 0 ? 0 : -1;
    kw__req *r = req_new(c, KW_PROTO_GET, NULL);
    if (r == NULL) {
        kw__conn_error(c, KW_ENOMEM, NULL, false);
        return -1;
    }
    r->key = k;
    r->miss_kind = kind;
    r->t0 = t0;
    rc = kw_warm_submit(c->d->warm, &k, 1, rc == KW_ECORRUPT ? KW_WARM_PURGE : 0,
                        on_get_result, r, &r->job);
    if (rc < 0) {
        kw__conn_error(c, rc, rc == -ECANCELED ? "kwarmd is stopping" : NULL,
                       false);
        r->failed = true;
        request_end(r); /* counts it */
    }
    return 1;
}

/* Hands a request whose cost grows with it to a job thread. */
static void offload(kw__conn *c, uint16_t type, const cJSON *hdr)
{
    kw__req *r = req_new(c, type, hdr);
    if (r == NULL) {
        kw__conn_error(c, KW_ENOMEM, NULL, false);
        kw__metrics_request(c->d, type, false);
        return;
    }
    kw__jobs_push(c->d, r); /* counted when it ends */
}

/* Serves one parsed request of c. */
static void serve(kw__conn *c, const kw_msg *m)
{
    switch (m->type) {
    case KW_PROTO_PING:
        kw__metrics_request(c->d, m->type, handle_ping(c));
        break;
    case KW_PROTO_GET: {
        /* Timed here, on the loop, for the get latency histogram; a get
         * that compiles is timed and counted when its request ends. */
        double t0 = now_s();
        int st = handle_get(c, m->header, t0);
        if (st <= 0) {
            kw__metrics_request(c->d, m->type, st == 0);
            kw__metrics_get(c->d, (uint64_t)((now_s() - t0) * 1e9));
        }
        break;
    }
    case KW_PROTO_KEYS:
    case KW_PROTO_WARMUP:
    case KW_PROTO_STATS:
    case KW_PROTO_EVICT:
    case KW_PROTO_MISSES:
    case KW_PROTO_LS:
    case KW_PROTO_PINS:
    case KW_PROTO_UNPIN:
    case KW_PROTO_RESIZE:
        offload(c, m->type, m->header);
        break;
    default: /* kw_proto_parse_request() lets only requests through */
        kw__conn_error(c, KW_EPROTO, "not a request type", true);
    }
}

/* d->up.dispatch: serves m, with the test hooks armed around it when a
 * test asks (KWARMD_TEST_FAIL_ALLOC, KWARMD_TEST_ALLOC_HOOK): an armed
 * request that goes on is disarmed at its end (request_end). */
static void dispatch(kw__conn *c, const kw_msg *m)
{
    kw__alloc_fail = kw__alloc_fail_type == m->type; /* tests only */
    bool armed = kw__alloc_hook_arm(c->d, m->header);
    serve(c, m);
    if (armed && c->active != NULL)
        c->active->alloc_armed = true; /* disarmed at its end */
    else if (armed)
        kw__alloc_hook_done(c->d);
    kw__alloc_fail = false;
}

void kw__daemon_upcalls(kw__daemon *d)
{
    d->up = (kw__upcalls){.dispatch = dispatch, .abort = request_abort,
                          .run = run_job, .end = request_end};
}
