/* compile.c: the compile threads.
 *
 * A compile thread takes the oldest queued flight, claims its key across
 * processes (claim_flight), asks the fleet tier, else compiles it in a
 * worker process and hands the result to the store stage (store.c),
 * which puts it, queues its write-back to the fleet (writeback.c), then
 * takes the flight out of the table and serves every waiter (flight.c),
 * which drops the claim.  The flight leaves the table only after the
 * put, so a request arriving meanwhile either joins it or finds the entry
 * cached, and so does another process once it holds the claim.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kw_alloc.h"
#include "kw_err.h"

/* ---- one flight ------------------------------------------------------- */

/* The metadata stored beside a compiled key (the one place it is built). */
static void fill_info(kw_cache_info *info, const kw_keys_key *k,
                      const kw__pool_result *r)
{
    int major = 0, minor = 0;
    memset(info, 0, sizeof *info);
    kw_jit_version(&major, &minor);
    snprintf(info->family, sizeof info->family, "%s",
             kw_keys_family_name(k->family));
    info->nfields = (uint32_t)kw_keys_nfields(k->family);
    memcpy(info->fields, k->fields, info->nfields * sizeof k->fields[0]);
    snprintf(info->arch, sizeof info->arch, "%s", k->arch);
    snprintf(info->entry, sizeof info->entry, "%s", r->entry);
    snprintf(info->nvrtc, sizeof info->nvrtc, "%d.%d", major, minor);
    info->compile_seconds = r->seconds;
}


/* kw_remote_stop_fn: a wait on another node's lease ends on stop. */
static bool is_stopping(void *arg)
{
    kw_warm *w = arg;
    return atomic_load(&w->stopping_flag);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Counts one worker compile of ns nanoseconds in the histogram. */
static void observe_compile(kw_warm *w, uint64_t ns)
{
    const double *bound = kw_warm_compile_bounds();
    size_t b = 0;
    while (b < KW_WARM_COMPILE_BUCKETS && (double)ns / 1e9 > bound[b])
        b++;
    atomic_fetch_add(&w->st.compile_buckets[b], 1);
    atomic_fetch_add(&w->st.compile_ns, ns);
}

/* Fetches, or compiles, flight f (no lock held).  Returns true when f
 * went on to the store stage, which finishes it; else the caller does,
 * with *out. */
static bool run_flight(kw_warm *w, flight *f, outcome *out)
{
    kw_remote_lease lease;
    kw_remote *remote = w->o.remote;
    *out = (outcome){KW_WARM_FAILED, 0, NULL};
    if (w->o.read_only) { /* nothing can be stored: nothing is compiled */
        out->rc = KW_EROFS; /* "not cached (read-only cache)" says it all */
        return false;
    }
    if (remote != NULL &&
        kw_remote_begin(remote, w->o.cache, f->key.digest, is_stopping, w,
                        &lease) == 0) {
        atomic_fetch_add(&w->st.remote_hits, 1);
        atomic_fetch_add(&w->st.fam_remote_hits[f->key.family], 1);
        out->status = KW_WARM_REMOTE_HIT;
        return false;
    }
    kw__pool_result r = {0};
    kw_cache_info info = {0};
    atomic_fetch_add(&w->st.compiling, 1);
    uint64_t t0 = now_ns();
    int rc = is_stopping(w) ? -ECANCELED : kw__pool_compile(w->pool, &f->key, &r);
    if (rc != -ECANCELED)
        observe_compile(w, now_ns() - t0);
    atomic_fetch_sub(&w->st.compiling, 1);
    if (rc == 0) {
        fill_info(&info, &f->key, &r);
        out->status = KW_WARM_COMPILED; /* for the write-back; store decides */
    } else if (rc == -ECANCELED) {
        out->status = KW_WARM_CANCELLED;
    } else {
        atomic_fetch_add(&w->st.compile_failures, 1);
        atomic_fetch_add(&w->st.fam_failures[f->key.family], 1);
        kw_cache_count(w->o.cache, KW_CACHE_COMPILE_FAILURES, 1);
        out->rc = rc;
        out->log = r.log;
        r.log = NULL;
    }
    /* The write-back and the lease's release go to the write-back
     * thread, after the local put for a compiled key: Redis never holds
     * up this thread or the key's waiters (issue 23). */
    if (rc == 0)
        kw__warm_store_push(w, f, &r, &info, remote ? &lease : NULL);
    else if (remote != NULL)
        kw__warm_writeback_push(w, &lease, NULL, NULL, 0);
    kw__pool_result_destroy(&r);
    return rc == 0;
}

/* What claiming a flight's key came to. */
typedef enum claim_step {
    CLAIM_GO,    /* claimed, or no claims here: compile it */
    CLAIM_LATER, /* another process holds it: f is back in the queue */
    CLAIM_DONE,  /* *o says: the holder stored it (a hit), or stopping */
} claim_step;

/* Claims f's key across processes before it is fetched or compiled
 * (kw_cache_claim_take), so that two prewarms, or a prewarm and kwarmd, of
 * one cache compile it once between them.  The first time another
 * process holds the claim, f goes back to the queue's tail and this
 * thread takes other work; the next time, it waits (polling, ending
 * when the pipeline stops).  Once claimed, an entry that is there now
 * was stored by the other holder: a hit, not a compile (unless a waiter
 * saw the entry corrupt: it is compiled again).  No lock held. */
static claim_step claim_flight(kw_warm *w, flight *f, outcome *o)
{
    if (w->o.read_only) /* nothing is compiled: nothing to claim */
        return CLAIM_GO;
    int rc = kw_cache_claim_take(w->o.cache, f->key.digest, f->deferred,
                                 is_stopping, w, &f->claim);
    if (rc == -EAGAIN) {
        pthread_mutex_lock(&w->mu);
        f->deferred = true;
        kw_queue_push(&w->compile_q, &f->qnode);
        w->nqueued++;
        pthread_mutex_unlock(&w->mu);
        return CLAIM_LATER;
    }
    if (rc == -ECANCELED) {
        *o = (outcome){KW_WARM_CANCELLED, -ECANCELED, NULL};
        return CLAIM_DONE;
    }
    if (f->claim != NULL && !f->purge &&
        kw_cache_contains(w->o.cache, f->key.digest)) {
        *o = (outcome){KW_WARM_HIT, 0, NULL};
        return CLAIM_DONE;
    }
    return CLAIM_GO; /* KW_ENOMEM too: compiled unclaimed */
}

/* True when every waiter's job was cancelled: nobody wants the result. */
static bool unwanted(const flight *f)
{
    for (const waiter *wt = f->waiters; wt != NULL; wt = wt->next)
        if (!atomic_load(&wt->job->cancelled))
            return false;
    return true;
}

/* Stopping: takes the whole queue (w->mu held, released on return) and
 * reports every waiter cancelled, in one run per job where possible, so a
 * streaming caller sends few frames for 100,000 cancelled keys. */
static void cancel_queue(kw_warm *w)
{
    kw_queue_node *n = kw_queue_take(&w->compile_q, 0, NULL);
    w->nqueued = 0;
    for (kw_queue_node *p = n; p != NULL; p = p->next)
        kw__warm_table_remove(w, KW_QUEUE_ENTRY(p, flight, qnode));
    pthread_mutex_unlock(&w->mu);
    flight *list = n ? KW_QUEUE_ENTRY(n, flight, qnode) : NULL;
    while (list != NULL) {
        flight *f = list;
        list = f->qnode.next ? KW_QUEUE_ENTRY(f->qnode.next, flight, qnode)
                             : NULL;
        for (waiter *wt = f->waiters, *next; wt != NULL; wt = next) {
            next = wt->next;
            bool more = next != NULL || (list != NULL && list->waiters != NULL &&
                                         list->waiters->job == wt->job);
            kw__warm_deliver(w, wt->job, wt->index, &f->key,
                             KW_WARM_CANCELLED, -ECANCELED, NULL, more);
            kw_warm_job_release(wt->job);
            free(wt);
        }
        free(f);
    }
}

void *kw__warm_compile_main(void *arg)
{
    kw_warm *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (kw_queue_empty(&w->compile_q) && !w->stopping)
            pthread_cond_wait(&w->compile_cv, &w->mu);
        if (w->stopping && !kw_queue_empty(&w->compile_q)) {
            cancel_queue(w);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        kw_queue_node *qn = kw_queue_pop(&w->compile_q);
        if (qn == NULL)
            break; /* stopping and drained */
        flight *f = KW_QUEUE_ENTRY(qn, flight, qnode);
        w->nqueued--;
        /* Out of the table now when nobody will get a compile, so a key
         * submitted later starts a new flight instead of joining this. */
        bool skip = w->stopping || unwanted(f);
        if (skip)
            kw__warm_table_remove(w, f);
        pthread_mutex_unlock(&w->mu);
        outcome o = {KW_WARM_CANCELLED, -ECANCELED, NULL};
        claim_step cs = skip ? CLAIM_DONE : claim_flight(w, f, &o);
        if (cs == CLAIM_LATER) {
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (cs == CLAIM_DONE || !run_flight(w, f, &o))
            kw__warm_finish(w, f, !skip, &o);
        free(o.log);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}
