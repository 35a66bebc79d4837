/* warmup.c: a warmup, from its keys to its streamed results.
 *
 * On a job thread: derive the keys and submit them to the warm pipeline.
 * Then, on warm's threads (serialized per job): each key's result joins a
 * batch, sent as one PROGRESS frame
 *   {"done": D, "total": T, "results": [{"index", "digest", "family",
 *    "arch", "status", "error"?, "log"?}, ...]}
 * when it holds KW__STREAM_KEYS results or about KW__STREAM_BYTES, or when
 * warm has no further result at once (`more` false).  The last result
 * sends the counts-only RESULT
 *   {"keys", "hits", "remote_hits", "compiled", "failed", "cancelled",
 *    "seconds", "pinned"? (with "pin" in the request)}
 * and ends the request.  With "detach": true a client that leaves does not
 * cancel the warmup's compiles.  kwarm warmup --json and kw_client_warmup() put
 * the streamed results back into one "manifest", in key order ("index":
 * the key's place in the deployment's keys, as `kwarm keys` lists them).
 */
#include "handlers.h"

#include <errno.h>
#include <malloc.h>
#include <string.h>
#include <time.h>

#include "kw_err.h"
#include "log.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t settled(const kw__req *r)
{
    size_t n = 0;
    for (size_t i = 0; i <= KW_WARM_CANCELLED; i++)
        n += r->count[i];
    return n;
}

/* Sends the batch as one PROGRESS frame and starts a new one.  Out of
 * memory, the batch is lost and the request's final frame becomes an
 * ERROR saying so (an ERROR is always final: issue 23).  Never parks
 * warm's thread: past the stream's budget the warm job is paused. */
static void flush_batch(kw__req *r)
{
    if (r->batch_n == 0)
        return;
    cJSON *h = cJSON_CreateObject();
    bool ok = h != NULL &&
              cJSON_AddNumberToObject(h, "done", (double)settled(r)) != NULL &&
              cJSON_AddNumberToObject(h, "total", (double)r->set.n) != NULL &&
              cJSON_AddItemToObject(h, "results", r->batch);
    if (!ok)
        cJSON_Delete(r->batch);
    r->batch = NULL;
    r->batch_n = r->batch_bytes = 0;
    atomic_store(&r->hb_done, settled(r));
    kw__req_progress_nowait(r, ok ? h : NULL);
    cJSON_Delete(h);
}

/* The RESULT: counts only. */
static void send_result(kw__req *r)
{
    static const char *const names[] = {"hits", "remote_hits", "compiled",
                                        "failed", "cancelled"};
    cJSON *h = cJSON_CreateObject();
    bool ok = h != NULL &&
              cJSON_AddNumberToObject(h, "keys", (double)r->set.n) != NULL;
    for (size_t i = 0; ok && i <= KW_WARM_CANCELLED; i++)
        ok = cJSON_AddNumberToObject(h, names[i], (double)r->count[i]) != NULL;
    ok = ok && cJSON_AddNumberToObject(h, "seconds", now_s() - r->t0) != NULL;
    if (ok && cJSON_GetObjectItemCaseSensitive(r->header, "pin") != NULL)
        ok = cJSON_AddBoolToObject(h, "pinned", !r->pin_failed) != NULL;
    if (!ok) {
        cJSON_Delete(h);
        h = NULL; /* kw__req_finish answers KW_ENOMEM and ends the request */
    }
    kw__req_finish(r, KW_PROTO_RESULT, h);
    cJSON_Delete(h);
}

/* One key's entry in the batch; false when out of memory (the entry is
 * then left out: the RESULT's counts stay whole). */
static bool add_result(kw__req *r, const kw_warm_result *res)
{
    char hex[KW_KEYS_HEX_LEN];
    kw_keys_hex(res->key->digest, hex);
    if (r->batch == NULL && (r->batch = cJSON_CreateArray()) == NULL)
        return false;
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL &&
              cJSON_AddNumberToObject(o, "index", (double)res->index) != NULL &&
              cJSON_AddStringToObject(o, "digest", hex) != NULL &&
              cJSON_AddStringToObject(o, "family",
                                      kw_keys_family_name(res->key->family)) &&
              cJSON_AddStringToObject(o, "arch", res->key->arch) != NULL &&
              cJSON_AddStringToObject(o, "status",
                                      kw_warm_status_name(res->status)) != NULL;
    if (ok && res->status == KW_WARM_FAILED) {
        ok = cJSON_AddStringToObject(o, "error", kw_strerror(res->rc)) != NULL &&
             (res->log == NULL ||
              cJSON_AddStringToObject(o, "log", res->log) != NULL);
        /* JSON escaping can grow a log to 6 bytes a byte. */
        r->batch_bytes += res->log ? 6 * strlen(res->log) : 0;
    }
    if (!ok || !cJSON_AddItemToArray(r->batch, o)) {
        cJSON_Delete(o);
        return false;
    }
    r->batch_bytes += 160;
    r->batch_n++;
    return true;
}

/* Logs a failed key: digest, family and the first line of its log. */
static void log_failure(const kw_warm_result *res)
{
    char hex[KW_KEYS_HEX_LEN];
    const char *log = res->log ? res->log : "";
    size_t n = strcspn(log, "\n");
    kw_keys_hex(res->key->digest, hex);
    KW_LOG(KW_LOG_WARNING, "compile of %.16s (%s %s) failed: %s%s%.*s", hex,
           kw_keys_family_name(res->key->family), res->key->arch,
           kw_strerror(res->rc), n ? ": " : "", (int)(n > 300 ? 300 : n), log);
}

/* With "pin": NAME and every key cached, records the deployment's pin set
 * (an LMDB write, on a job thread: run_pin_stage); a failure is logged and
 * the RESULT says "pinned": false. */
static void pin(kw__req *r)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(r->header, "pin");
    char err[512];
    if (!cJSON_IsString(name))
        return;
    if (r->count[KW_WARM_FAILED] + r->count[KW_WARM_CANCELLED] > 0) {
        r->pin_failed = true; /* a partial deployment is not pinned */
        return;
    }
    /* The keys are warm's since the submit: read from the job, whose
     * handle the stream holds until the request ends. */
    if (kw_warm_job_pin(r->s->job, name->valuestring, err, sizeof err) < 0) {
        for (char *p = err; *p != '\0'; p++) /* it may name the client's pin */
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        KW_LOG(KW_LOG_WARNING, "warmup: %s", err);
        r->pin_failed = true;
    }
}

/* One line per warmup: who asked, which text config, what came of it. */
static void log_warmup(const kw__req *r)
{
    KW_LOG(KW_LOG_INFO, "warmup from uid %u pid %d: text config \"%s\": %zu "
           "keys: %zu hits, %zu remote hits, %zu compiled, %zu failed, %zu "
           "cancelled in %.2f s", (unsigned)r->uid, (int)r->pid,
           r->text_config, r->set.n, r->count[KW_WARM_HIT],
           r->count[KW_WARM_REMOTE_HIT], r->count[KW_WARM_COMPILED],
           r->count[KW_WARM_FAILED], r->count[KW_WARM_CANCELLED],
           now_s() - r->t0);
    if (r->unstored > 0)
        KW_LOG(KW_LOG_WARNING, "warmup from uid %u pid %d: %zu keys compiled "
               "but not stored: %s", (unsigned)r->uid, (int)r->pid,
               r->unstored, r->unstored_why);
}

/* A warmup with "detach": true (kwarm warmup --detach, issue 24) goes on
 * when its client leaves: its keys are compiled and cached all the same;
 * only its frames go nowhere.  kw__run_warmup checked the member. */
static bool detached(const kw__req *r)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r->header, "detach"));
}

/* After a large warmup's RESULT: its flights, waiters and frames came
 * and went through the arenas of every warm and job thread, and glibc
 * keeps what they freed (575 MB of the 590 MB kwarmd held after a
 * 480,348-key warmup, 13 MB in use; 49 MB after a trim).  The idle tick's
 * trim (daemon.c) comes only when no request arrives for a tick, which a
 * health check's pings, or one long warmup's own arrival, defeat.  Takes
 * the count, read before the RESULT: the request may be gone after it. */
static void trim_after(size_t nkeys)
{
    if (nkeys >= KW__TRIM_KEYS)
        malloc_trim(0);
}

/* warm's callback for one key of a warmup. */
static void on_result(const kw_warm_result *res, void *arg)
{
    kw__req *r = arg;
    bool gone = atomic_load(&r->aborted);
    if (gone && res->job != NULL && !detached(r))
        kw_warm_job_cancel(res->job); /* the client left (once: cheap after) */
    r->count[res->status]++;
    bool no_room = kw_warm_result_unstored(res);
    if (no_room && r->unstored++ == 0)
        snprintf(r->unstored_why, sizeof r->unstored_why, "%s",
                 res->log ? res->log : kw_strerror(res->rc));
    if (res->status == KW_WARM_FAILED && res->rc != KW_EROFS && !no_room)
        log_failure(res); /* a read-only miss or a full disk: not a compile */
    /* Nobody reads a client that left: its results are counted, not
     * built into frames (a stop with 100,000 keys queued ends sooner). */
    if (!gone && !add_result(r, res))
        KW_LOG(KW_LOG_ERR, "out of memory streaming a warmup result");
    if (!gone && (r->batch_n >= KW__STREAM_KEYS ||
                  r->batch_bytes >= KW__STREAM_BYTES || !res->more || res->last))
        flush_batch(r);
    if (!res->last)
        return;
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r->header, "pin")) &&
        r->count[KW_WARM_FAILED] + r->count[KW_WARM_CANCELLED] == 0) {
        /* The pin is an LMDB write with an fsync: a job thread makes it,
         * not warm's thread, where it would hold up every other request's
         * results (issue 23). */
        r->pin_stage = true;
        kw__jobs_push(r->d, r);
        return;
    }
    pin(r); /* only marks a partial deployment unpinned */
    log_warmup(r);
    size_t n = r->set.n;
    send_result(r);
    trim_after(n);
}

/* The pin stage of a warmup, on a job thread: records the pin set, then
 * the RESULT. */
static void run_pin_stage(kw__req *r)
{
    pin(r);
    log_warmup(r);
    size_t n = r->set.n;
    send_result(r);
    trim_after(n);
}

/* kwarmd stopped before the keys reached the pipeline: every key is
 * reported cancelled, as if the pipeline had done it. */
static void cancel_all(kw__req *r)
{
    kw_keys_cursor cur = {0};
    kw_keys_key k;
    for (size_t i = 0; kw_keys_pack_next(&r->set, &cur, &k); i++) {
        kw_warm_result res = {.index = i, .key = &k,
                              .status = KW_WARM_CANCELLED, .rc = -ECANCELED,
                              .last = i + 1 == r->set.n,
                              .more = i + 1 < r->set.n};
        on_result(&res, r);
    }
}

void kw__run_warmup(kw__req *r)
{
    if (r->pin_stage) {
        run_pin_stage(r);
        return;
    }
    kw_config_model m;
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    int rc = kw__req_keys(r->header, &m, &d, &r->set, err, sizeof err);
    if (rc == 0) { /* client text: escaped for the log (issue 23) */
        const char *tc = m.text_config ? m.text_config : "/";
        kw_proto_escape((const uint8_t *)tc, strlen(tc), r->text_config,
                        sizeof r->text_config);
    }
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
    if (rc == 0)
        rc = kw__req_charge_keys(r, r->set.n, err, sizeof err);
    if (rc < 0) {
        kw__req_error(r, rc, rc == KW_ENOMEM ? NULL : err);
        return;
    }
    if (r->set.n == 0) {
        log_warmup(r);
        send_result(r);
        return;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(r->header, "pin");
    if (name != NULL && !cJSON_IsString(name)) {
        kw__req_error(r, KW_EINVAL, "warmup: \"pin\" must be a string");
        return;
    }
    const cJSON *detach = cJSON_GetObjectItemCaseSensitive(r->header, "detach");
    if (detach != NULL && !cJSON_IsBool(detach)) {
        kw__req_error(r, KW_EINVAL, "warmup: \"detach\" must be true or false");
        return;
    }
    /* Nothing is written when the deployment cannot fit beside the pins. */
    if ((rc = kw_warm_plan_check_packed(r->d->cache, &r->set, err,
                                        sizeof err)) < 0) {
        kw__req_error(r, rc, err);
        return;
    }
    /* From here the request is warm's callbacks'; the stream keeps the
     * job's handle, to pause and to cancel it.  Heartbeats may go now. */
    atomic_store(&r->hb_total, r->set.n);
    /* The stream's lock is held across the submit so that no callback
     * posts before the stream knows the job it may pause (they wait);
     * warm takes the packed keys, no copy (r->set keeps only the count). */
    kw_keys_packed keys;
    kw_keys_pack_move(&keys, &r->set);
    r->set.n = keys.n; /* the count, which the callbacks read */
    pthread_mutex_lock(&r->s->mu);
    r->s->detached = detached(r); /* an abort from now on leaves it running */
    rc = kw_warm_submit_packed(r->d->warm, &keys, KW_WARM_PROTECT, on_result,
                               r, &r->s->job);
    pthread_mutex_unlock(&r->s->mu);
    if (rc < 0)
        kw_keys_pack_move(&r->set, &keys); /* still ours: cancel_all reads it */
    if (rc == -ECANCELED)
        cancel_all(r);
    else if (rc < 0)
        kw__req_error(r, rc, NULL);
}
