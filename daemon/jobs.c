/* jobs.c: kwarmd's job threads (jobs.h).
 *
 * A few threads (KW__JOB_THREADS) take requests the loop hands over and
 * run their handlers (d->up.run); the frames they make travel back
 * through the loop's outbox (stream.c), so the loop thread only ever
 * writes ready bytes.  A warmup leaves its thread once its keys are
 * submitted: its results come on warm's threads, which post frames the
 * same way.  A handler that yields on a full stream is run again when
 * its stream drained (kw__stream_park), never waiting on a thread here.
 */
#include "jobs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

/* True when r's next run derives its keys: a keys request's first run,
 * a warmup's (its pin stage derives nothing). */
static bool derives(const kw__req *r)
{
    return (r->type == KW_PROTO_KEYS && r->state == NULL) ||
           (r->type == KW_PROTO_WARMUP && !r->pin_stage);
}

/* Takes a derivation slot for r when its run needs one (job_mu held):
 * false when all KW__DERIVE_SLOTS are taken and r was queued on derive_q
 * instead, to run when a slot is given back (give_slot_locked).  A
 * derivation holds a core and its key set (about 15 MB at 480,000 keys)
 * while it runs: bounding how many run at once bounds that memory and
 * leaves the cores to the loops (issue 23, point 7).  Once stopping,
 * requests are refused at once and take no slot. */
static bool take_slot_locked(kw__daemon *d, kw__req *r, bool *slot)
{
    *slot = !d->jobs_stopping && derives(r);
    if (!*slot)
        return true;
    if (d->nderiving >= KW__DERIVE_SLOTS) {
        kw_queue_push(&d->derive_q, &r->jnode);
        *slot = false;
        return false;
    }
    d->nderiving++;
    return true;
}

/* Gives a derivation slot back (job_mu held): the oldest request waiting
 * for one joins the job queue again. */
static void give_slot_locked(kw__daemon *d)
{
    d->nderiving--;
    kw_queue_node *n = kw_queue_pop(&d->derive_q);
    if (n != NULL) {
        kw_queue_push(&d->job_q, n);
        pthread_cond_signal(&d->job_cv);
    }
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
        bool slot;
        if (!take_slot_locked(d, r, &slot))
            continue; /* waits on derive_q */
        bool stopping = d->jobs_stopping;
        pthread_mutex_unlock(&d->job_mu);
        kw__alloc_fail = !stopping && kw__alloc_fail_type == r->type; /* tests */
        d->up.run(r, stopping);
        kw__alloc_fail = false;
        pthread_mutex_lock(&d->job_mu);
        if (slot)
            give_slot_locked(d);
    }
    pthread_mutex_unlock(&d->job_mu);
    return NULL;
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
        d->up.run(r, true); /* refused at once */
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
    kw_queue_node *n; /* those waiting for a slot are refused too */
    while ((n = kw_queue_pop(&d->derive_q)) != NULL)
        kw_queue_push(&d->job_q, n);
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
