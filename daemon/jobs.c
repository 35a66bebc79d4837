/* jobs.c: kwarmd's job threads, and frames posted from any thread.
 *
 * A few threads (KW__JOB_THREADS) take requests the loop hands over and
 * run their handlers; the frames they make travel back through the outbox
 * (server.c), so the loop thread only ever writes ready bytes.  A warmup
 * leaves its thread once its keys are submitted: its results come on
 * warm's threads, which post frames the same way.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

/* Encodes h as a frame of type; NULL when h is NULL or out of memory. */
static uint8_t *encode(uint16_t type, const cJSON *h, size_t *len)
{
    uint8_t *frame = NULL;
    if (h == NULL || kw_proto_encode(type, h, NULL, 0, &frame, len) < 0)
        return NULL;
    return frame;
}

int kw__req_progress(kw__req *r, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(KW_PROTO_PROGRESS, h, &len);
    if (frame == NULL) {
        kw__stream_push(r, NULL, 0); /* marks the hole: nothing is sent */
        return KW_ENOMEM;
    }
    return kw__stream_push(r, frame, len);
}

int kw__req_progress_yield(kw__req *r, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(KW_PROTO_PROGRESS, h, &len);
    return kw__stream_push_nowait(r, frame, len); /* NULL: marks the hole */
}

int kw__req_progress_nowait(kw__req *r, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(KW_PROTO_PROGRESS, h, &len);
    int rc = frame ? kw__stream_push_nowait(r, frame, len)
                   : kw__stream_push_nowait(r, NULL, 0);
    if (rc == 1)
        kw__stream_pause_job(r);
    return frame ? (rc > 0 ? 0 : rc) : KW_ENOMEM;
}

void kw__req_finish(kw__req *r, uint16_t type, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(type, h, &len);
    if (frame == NULL && h != NULL) { /* the reply did not fit in memory */
        kw__req_error(r, KW_ENOMEM, "reply could not be encoded");
        return;
    }
    kw__stream_end(r, frame, len, NULL);
}

void kw__req_error(kw__req *r, int code, const char *msg)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    kw__alloc_fail = false; /* the test hook fails a request, not its error */
    r->failed = true; /* read on the loop once the request ends (metrics) */
    if (kw_proto_error_frame(code, msg, &frame, &len) < 0)
        frame = NULL; /* the stream's error frame of last resort */
    kw__stream_end(r, frame, len, NULL);
}

int kw__req_charge_keys(kw__req *r, size_t n, char *err, size_t errlen)
{
    kw__daemon *d = r->d;
    uint64_t max = d->opts->max_keys_in_flight;
    uint64_t cur = atomic_load(&d->keys_in_flight);
    do {
        if (cur + n > max) {
            atomic_fetch_add(&d->refused_keys, 1);
            snprintf(err, errlen, "%zu keys would pass the budget of keys in "
                     "flight (--max-keys-in-flight %llu; %llu in flight now): "
                     "retry when other requests are over", n,
                     (unsigned long long)max, (unsigned long long)cur);
            return -EBUSY;
        }
    } while (!atomic_compare_exchange_weak(&d->keys_in_flight, &cur, cur + n));
    r->keys_charged = n;
    return 0;
}

/* A job thread: runs queued requests until stopped; once stopping, the
 * requests left are refused. */
static void *job_main(void *arg)
{
    kw__daemon *d = arg;
    pthread_mutex_lock(&d->job_mu);
    for (;;) {
        while (kw_queue_empty(&d->job_q) && !d->jobs_stopping)
            pthread_cond_wait(&d->job_cv, &d->job_mu);
        kw_queue_node *n = kw_queue_pop(&d->job_q);
        if (n == NULL)
            break;
        kw__req *r = KW_QUEUE_ENTRY(n, kw__req, jnode);
        bool stopping = d->jobs_stopping;
        pthread_mutex_unlock(&d->job_mu);
        if (stopping) {
            kw__daemon_refuse_job(r);
        } else {
            kw__alloc_fail = kw__alloc_fail_type == r->type; /* tests only */
            /* A handler that yielded on a full budget goes on at once
             * when room came meanwhile; else it is parked, and the loop
             * queues it again (no job thread waits for a slow client). */
            while (kw__daemon_run_job(r) && kw__stream_park(r))
                ;
            kw__alloc_fail = false;
        }
        pthread_mutex_lock(&d->job_mu);
    }
    pthread_mutex_unlock(&d->job_mu);
    return NULL;
}

/* ---- the allocation-failure hook (tests only) ------------------------- */

_Thread_local bool kw__alloc_fail;
uint16_t kw__alloc_fail_type;

/* cJSON's allocator while KWARMD_TEST_FAIL_ALLOC names a request type:
 * fails while this thread serves a request of that type. */
static void *hook_malloc(size_t n)
{
    return kw__alloc_fail ? NULL : kw_malloc(n);
}

void kw__alloc_hook_init(void)
{
    static const char *const names[] = {"ping", "keys", "warmup", "get",
                                        "stats", "evict", "misses", "ls",
                                        "pins", "unpin", "resize"};
    const char *v = getenv("KWARMD_TEST_FAIL_ALLOC");
    for (size_t i = 0; v != NULL && i < sizeof names / sizeof *names; i++)
        if (strcmp(v, names[i]) == 0) {
            kw__alloc_fail_type = (uint16_t)(i + 1); /* KW_PROTO_PING... */
            cJSON_Hooks hooks = {hook_malloc, free};
            cJSON_InitHooks(&hooks);
        }
}

int kw__jobs_start(kw__daemon *d)
{
    int rc = -pthread_mutex_init(&d->job_mu, NULL);
    if (rc == 0 && (rc = -pthread_cond_init(&d->job_cv, NULL)) != 0)
        pthread_mutex_destroy(&d->job_mu);
    if (rc < 0)
        return rc;
    for (; d->njob_threads < KW__JOB_THREADS; d->njob_threads++)
        if ((rc = -pthread_create(&d->job_threads[d->njob_threads], NULL,
                                  job_main, d)) != 0)
            break;
    return d->njob_threads > 0 ? 0 : rc;
}

void kw__jobs_push(kw__daemon *d, kw__req *r)
{
    pthread_mutex_lock(&d->job_mu);
    if (d->jobs_stopping) {
        /* A serving loop may dispatch a request between the signal and
         * its own stop; the job threads may have left already. */
        pthread_mutex_unlock(&d->job_mu);
        kw__daemon_refuse_job(r);
        return;
    }
    kw_queue_push(&d->job_q, &r->jnode);
    pthread_cond_signal(&d->job_cv);
    pthread_mutex_unlock(&d->job_mu);
}

void kw__jobs_cancel(kw__daemon *d)
{
    if (d->njob_threads == 0)
        return;
    pthread_mutex_lock(&d->job_mu);
    d->jobs_stopping = true;
    pthread_cond_broadcast(&d->job_cv);
    pthread_mutex_unlock(&d->job_mu);
}

void kw__jobs_stop(kw__daemon *d)
{
    if (d->njob_threads == 0)
        return;
    kw__jobs_cancel(d);
    for (unsigned i = 0; i < d->njob_threads; i++)
        pthread_join(d->job_threads[i], NULL);
    d->njob_threads = 0;
    pthread_cond_destroy(&d->job_cv);
    pthread_mutex_destroy(&d->job_mu);
}

void kw__alloc_hook_done(kw__daemon *d)
{
    atomic_store(&d->alloc_fired, kw_alloc_failed());
    kw_alloc_fail_at(0);
}
