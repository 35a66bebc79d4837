/* warm.c: the warm pipeline's queues, threads and result delivery.
 *
 * One mutex (w->mu) guards the intake queue of jobs, the compile queue of
 * flights, the flight table and `stopping`.  It is never held across a
 * cache, fleet or worker call, nor across a callback.  Each job has its own
 * cb_mu, held while its callback runs, which serializes the callbacks of
 * one job and makes `last` truly the last.
 */
#include "kw_warm.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"
#include "kw_alloc.h"
#include "kw_err.h"

/* Protects the digests of job's keys from eviction while it runs: the
 * guard is made from the packed keys one digest at a time, with no array
 * of digests beside them. */
static int protect(kw_warm *w, kw_warm_job *job)
{
    kw__warm_digest_reader r = {.p = &job->keys};
    return kw_cache_protect_each(w->o.cache, job->n, kw__warm_next_digest, &r,
                                 &job->guard);
}

/* Puts job back at the intake queue's tail; w->mu held. */
static void intake_push_locked(kw_warm *w, kw_warm_job *job)
{
    kw_queue_push(&w->intake_q, &job->inode);
    pthread_cond_signal(&w->intake_cv);
}

/* Submits a job of the packed keys: taken (*keys left empty) when it
 * returns 0, else still the caller's. */
static int submit(kw_warm *w, kw_keys_packed *keys, unsigned flags,
                  kw_warm_result_fn fn, void *arg, kw_warm_job **out)
{
    size_t n = keys->n;
    if (n == 0)
        return KW_EINVAL;
    kw_warm_job *job = kw_calloc(1, sizeof *job);
    if (job == NULL)
        return KW_ENOMEM;
    job->keys = *keys; /* borrowed until the submit is certain */
    job->n = job->remaining = n;
    if ((flags & KW_WARM_PROTECT) && protect(w, job) < 0) {
        free(job); /* the keys are still the caller's */
        return KW_ENOMEM;
    }
    job->flags = flags;
    job->w = w;
    job->fn = fn;
    job->arg = arg;
    pthread_mutex_init(&job->cb_mu, NULL);
    atomic_init(&job->refs, out != NULL ? 2 : 1);
    if (out != NULL)
        *out = job; /* before any callback can run */
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        if (out != NULL)
            *out = NULL;
        atomic_store(&job->refs, 1);
        kw_keys_pack_init(&job->keys); /* still the caller's */
        kw_warm_job_release(job);
        return -ECANCELED;
    }
    kw_keys_pack_init(keys); /* the job's now */
    intake_push_locked(w, job);
    w->jobs_active++;
    atomic_fetch_add(&w->st.keys, n);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int kw_warm_submit(kw_warm *w, const kw_keys_key *keys, size_t n,
                   unsigned flags, kw_warm_result_fn fn, void *arg,
                   kw_warm_job **out)
{
    if (n == 0)
        return KW_EINVAL;
    kw_keys_packed p;
    if (kw_keys_pack(&p, keys, n) < 0)
        return KW_ENOMEM;
    int rc = submit(w, &p, flags, fn, arg, out);
    kw_keys_pack_destroy(&p); /* empty once taken */
    return rc;
}

int kw_warm_submit_packed(kw_warm *w, kw_keys_packed *keys, unsigned flags,
                          kw_warm_result_fn fn, void *arg, kw_warm_job **out)
{
    return submit(w, keys, flags, fn, arg, out);
}

void kw_warm_job_cancel(kw_warm_job *job)
{
    if (!atomic_exchange(&job->cancelled, true))
        kw_warm_job_resume(job); /* a parked job reports its keys cancelled */
}

void kw_warm_job_pause(kw_warm_job *job)
{
    pthread_mutex_lock(&job->w->mu);
    job->paused = true;
    pthread_mutex_unlock(&job->w->mu);
}

/* Takes job off the parked list; w->mu held, job->parked. */
static void unpark_locked(kw_warm *w, kw_warm_job *job)
{
    kw_warm_job **p = &w->parked;
    while (*p != job)
        p = &(*p)->next_parked;
    *p = job->next_parked;
    job->parked = false;
    intake_push_locked(w, job);
}

void kw_warm_job_resume(kw_warm_job *job)
{
    kw_warm *w = job->w;
    pthread_mutex_lock(&w->mu);
    job->paused = false;
    if (job->parked)
        unpark_locked(w, job);
    pthread_mutex_unlock(&w->mu);
}

/* ---- intake: lookups, then flights ------------------------------------ */

/* True when digest is in the local cache.  With verify_hits the entry is
 * checked in place (a borrow: no copy) and counted as a get's lookup is,
 * and a corrupt one is dropped, so it misses and is compiled again. */
static bool lookup(kw_warm *w, const uint8_t *digest)
{
    if (!w->o.verify_hits)
        return kw_cache_contains(w->o.cache, digest);
    kw_cache_view v;
    if (kw_cache_borrow(w->o.cache, digest, &v, NULL) < 0)
        return false;
    kw_cache_release(&v);
    return true;
}

/* Key i of job (k) missed: joins its flight or starts one.  Returns
 * false when stopping (the caller reports the key cancelled). */
static bool to_flight(kw_warm *w, kw_warm_job *job, size_t i,
                      const kw_keys_key *k)
{
    waiter *wt = kw_malloc(sizeof *wt);
    if (wt == NULL)
        return false;
    *wt = (waiter){.job = job, .index = i};
    atomic_fetch_add(&job->refs, 1); /* dropped when wt is served */
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        atomic_fetch_sub(&job->refs, 1);
        free(wt);
        return false;
    }
    flight *f = kw__warm_table_find(w, k->digest);
    if (f != NULL) {
        atomic_fetch_add(&w->st.joined, 1);
    } else if ((f = kw__warm_flight_new(w, k)) == NULL) {
        pthread_mutex_unlock(&w->mu);
        atomic_fetch_sub(&job->refs, 1);
        free(wt);
        return false;
    }
    f->purge |= (job->flags & KW_WARM_PURGE) != 0;
    wt->next = f->waiters;
    f->waiters = wt;
    pthread_mutex_unlock(&w->mu);
    return true;
}

/* Results the intake settled and delivers in one run, so a streaming
 * caller sees `more` until the run's end. */
#define RUN_MAX 256
typedef struct run {
    size_t index[RUN_MAX];
    const kw_keys_key *key[RUN_MAX]; /* in w->chunk */
    kw_warm_status status[RUN_MAX];
    size_t n;
} run;

static void run_flush(kw_warm *w, kw_warm_job *job, run *r)
{
    for (size_t j = 0; j < r->n; j++)
        kw__warm_deliver(w, job, r->index[j], r->key[j], r->status[j],
                         -ECANCELED, NULL, j + 1 < r->n);
    r->n = 0;
}

static void run_add(kw_warm *w, kw_warm_job *job, run *r, size_t i,
                    const kw_keys_key *k, kw_warm_status st)
{
    r->index[r->n] = i;
    r->key[r->n] = k;
    r->status[r->n++] = st;
    if (r->n == RUN_MAX)
        run_flush(w, job, r);
}

/* Looks up the next KW_WARM_CHUNK keys of job, in order, unpacked into
 * w->chunk: hits (and keys cancelled before their lookup) are delivered
 * in runs, whose keys point there; misses go to flights, which copy
 * theirs.  Returns true when keys are left. */
static bool intake_chunk(kw_warm *w, kw_warm_job *job, run *r)
{
    size_t start = job->cursor.i;
    for (size_t j = 0; j < KW_WARM_CHUNK; j++) {
        kw_keys_key *k = &w->chunk[j];
        size_t i = start + j;
        /* A job its owner cancelled wants no more of its keys: they are
         * reported without a digest, which is most of a read's cost (a
         * 480,000-key job's cancellations take a second less). */
        bool owner_cancelled = atomic_load(&job->cancelled);
        if (!kw_keys_pack_read(&job->keys, &job->cursor, k, !owner_cancelled))
            break;
        if (owner_cancelled || atomic_load(&w->stopping_flag)) {
            run_add(w, job, r, i, k, KW_WARM_CANCELLED);
            continue;
        }
        if (lookup(w, k->digest)) {
            atomic_fetch_add(&w->st.hits, 1);
            run_add(w, job, r, i, k, KW_WARM_HIT);
            continue;
        }
        atomic_fetch_add(&w->st.misses, 1);
        if (!to_flight(w, job, i, k))
            run_add(w, job, r, i, k, KW_WARM_CANCELLED);
    }
    /* read before the flush may free the job */
    bool left = job->cursor.i < job->n;
    run_flush(w, job, r);
    return left;
}

/* After a chunk of job with keys left: back to the queue's tail (jobs
 * take turns), or parked while paused (unless cancelled or stopping,
 * which must report the rest); w->mu held. */
static void requeue_locked(kw_warm *w, kw_warm_job *job)
{
    if (job->paused && !w->stopping && !atomic_load(&job->cancelled)) {
        job->parked = true;
        job->next_parked = w->parked;
        w->parked = job;
        return;
    }
    intake_push_locked(w, job);
}

/* The intake thread: the queued jobs in turn, a chunk of each. */
static void *intake_main(void *arg)
{
    kw_warm *w = arg;
    run r = {.n = 0}; /* 3 KiB of stack */
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (kw_queue_empty(&w->intake_q) && !w->stopping)
            pthread_cond_wait(&w->intake_cv, &w->mu);
        kw_queue_node *n = kw_queue_pop(&w->intake_q);
        if (n == NULL)
            break; /* stopping, nothing left */
        kw_warm_job *job = KW_QUEUE_ENTRY(n, kw_warm_job, inode);
        pthread_mutex_unlock(&w->mu);
        atomic_fetch_add(&job->refs, 1); /* held while intake reads it */
        bool left = intake_chunk(w, job, &r);
        pthread_mutex_lock(&w->mu);
        if (left)
            requeue_locked(w, job);
        pthread_mutex_unlock(&w->mu);
        kw_warm_job_release(job); /* the intake's reference */
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- life cycle ------------------------------------------------------- */

static void warm_free(kw_warm *w)
{
    kw__pool_stop(w->pool);
    free(w->compilers);
    free(w->chunk);
    free(w->table);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->intake_cv);
    pthread_cond_destroy(&w->compile_cv);
    pthread_cond_destroy(&w->idle_cv);
    pthread_mutex_destroy(&w->store_mu);
    pthread_cond_destroy(&w->store_cv);
    pthread_mutex_destroy(&w->wb_mu);
    pthread_cond_destroy(&w->wb_cv);
    free(w);
}

/* Starts the intake thread and the compile threads. */
static int start_threads(kw_warm *w)
{
    if (pthread_create(&w->intake, NULL, intake_main, w) != 0)
        return KW_ENOMEM;
    w->have_intake = true;
    if (pthread_create(&w->store_thread, NULL, kw__warm_store_main, w) != 0)
        return KW_ENOMEM;
    w->have_store = true;
    if (w->o.remote != NULL) {
        if (pthread_create(&w->wb_thread, NULL, kw__warm_writeback_main, w) != 0)
            return KW_ENOMEM;
        w->have_wb = true;
    }
    for (; w->ncompilers < w->o.jobs; w->ncompilers++)
        if (pthread_create(&w->compilers[w->ncompilers], NULL,
                           kw__warm_compile_main, w) != 0)
            break;
    return w->ncompilers > 0 ? 0 : KW_ENOMEM;
}

int kw_warm_open(kw_warm **out, const kw_warm_opts *o, char *err,
                 size_t errlen)
{
    kw_warm *w = kw_calloc(1, sizeof *w);
    if (w == NULL)
        return KW_ENOMEM;
    w->o = *o;
    if (w->o.jobs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        w->o.jobs = n > 0 ? (unsigned)n : 1;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->intake_cv, NULL);
    pthread_cond_init(&w->compile_cv, NULL);
    pthread_cond_init(&w->idle_cv, NULL);
    pthread_mutex_init(&w->store_mu, NULL);
    pthread_cond_init(&w->store_cv, NULL);
    pthread_mutex_init(&w->wb_mu, NULL);
    pthread_cond_init(&w->wb_cv, NULL);
    kw__pool_opts po = {.helper = o->helper, .jobs = w->o.jobs,
                        .timeout_ms = o->compile_timeout_ms,
                        .mem_limit = o->mem_limit};
    int rc = kw__warm_table_init(w);
    if (rc == 0 && (w->compilers = kw_calloc(w->o.jobs, sizeof *w->compilers)) == NULL)
        rc = KW_ENOMEM;
    if (rc == 0 && (w->chunk = kw_malloc(KW_WARM_CHUNK * sizeof *w->chunk)) == NULL)
        rc = KW_ENOMEM;
    if (rc == 0)
        rc = kw__pool_start(&w->pool, &po, err, errlen);
    if (rc == 0 && (rc = start_threads(w)) < 0)
        snprintf(err, errlen, "warm: cannot start threads");
    if (rc < 0) {
        kw_warm_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

void kw_warm_cancel(kw_warm *w)
{
    pthread_mutex_lock(&w->mu);
    bool first = !w->stopping;
    w->stopping = true;
    atomic_store(&w->stopping_flag, true);
    while (w->parked != NULL) /* they report their keys cancelled */
        unpark_locked(w, w->parked);
    pthread_cond_broadcast(&w->intake_cv);
    pthread_cond_broadcast(&w->compile_cv);
    pthread_mutex_unlock(&w->mu);
    if (first && w->pool != NULL)
        kw__pool_cancel(w->pool); /* running compiles return -ECANCELED */
}

void kw_warm_stats_get(kw_warm *w, kw_warm_stats *s)
{
    s->keys = atomic_load(&w->st.keys);
    s->hits = atomic_load(&w->st.hits);
    s->misses = atomic_load(&w->st.misses);
    s->joined = atomic_load(&w->st.joined);
    s->remote_hits = atomic_load(&w->st.remote_hits);
    s->compiles = atomic_load(&w->st.compiles);
    s->compile_failures = atomic_load(&w->st.compile_failures);
    s->store_failures = atomic_load(&w->st.store_failures);
    s->writebacks_dropped = atomic_load(&w->st.writebacks_dropped);
    s->cancelled = atomic_load(&w->st.cancelled);
    s->compiling = atomic_load(&w->st.compiling);
    for (size_t f = 0; f < KW_K_NFAMILIES; f++) {
        s->family_compiles[f] = atomic_load(&w->st.fam_compiles[f]);
        s->family_failures[f] = atomic_load(&w->st.fam_failures[f]);
        s->family_remote_hits[f] = atomic_load(&w->st.fam_remote_hits[f]);
    }
    for (size_t b = 0; b <= KW_WARM_COMPILE_BUCKETS; b++)
        s->compile_buckets[b] = atomic_load(&w->st.compile_buckets[b]);
    s->compile_seconds = (double)atomic_load(&w->st.compile_ns) / 1e9;
    pthread_mutex_lock(&w->mu);
    s->queued = w->nqueued;
    s->jobs_active = w->jobs_active;
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&w->wb_mu);
    s->writebacks_queued = w->wb_items;
    pthread_mutex_unlock(&w->wb_mu);
}

int kw_warm_cache_stats(kw_warm *w, kw_cache_stats *out)
{
    return kw_cache_stats_get(w->o.cache, out);
}

void kw_warm_close(kw_warm *w)
{
    if (w == NULL)
        return;
    kw_warm_cancel(w);
    if (w->have_intake)
        pthread_join(w->intake, NULL);
    for (unsigned i = 0; i < w->ncompilers; i++)
        pthread_join(w->compilers[i], NULL);
    /* Compiles are over; the store stage commits what they left, then
     * leaves. */
    pthread_mutex_lock(&w->store_mu);
    w->store_stop = true;
    pthread_cond_broadcast(&w->store_cv);
    pthread_mutex_unlock(&w->store_mu);
    if (w->have_store)
        pthread_join(w->store_thread, NULL);
    /* The store stage queued its last write-backs: they are written (each
     * Redis call bounded by its timeout), then the thread leaves. */
    kw__warm_writeback_stop(w);
    /* Every job got its last callback: the intake reported its keys, the
     * compile threads drained their queue, the store stage its own. */
    warm_free(w);
}
