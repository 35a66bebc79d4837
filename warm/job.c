/* job.c: warm's jobs at the bottom of warm/: delivering a result to a
 * job's callback, a job's references, and the names and bounds the
 * counters use.  Called by the intake (warm.c), the flights (flight.c)
 * and the compile threads (compile.c); calls none of them. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"

const char *kw_warm_status_name(kw_warm_status s)
{
    static const char *const names[] = {"hit", "remote_hit", "compiled",
                                        "failed", "cancelled"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "?";
}

bool kw_warm_result_unstored(const kw_warm_result *r)
{
    return r->status == KW_WARM_FAILED &&
           (r->rc == KW_EDISKFULL || r->rc == KW_ENOSPC);
}

const double *kw_warm_compile_bounds(void)
{
    /* NVRTC compiles of these kernels take 0.1 to 1 s (85 ms median on
     * the H200 host); the limit (--compile-timeout) is 120 s by default. */
    static const double b[KW_WARM_COMPILE_BUCKETS] = {
        0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
    return b;
}

/* Drops one reference to job; the last one frees it. */
static void job_unref(kw_warm_job *job)
{
    if (atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    kw_cache_unprotect(job->guard);
    pthread_mutex_destroy(&job->cb_mu);
    kw_keys_pack_destroy(&job->keys);
    free(job);
}

void kw__warm_deliver(kw_warm *w, kw_warm_job *job, size_t i,
                      const kw_keys_key *key, kw_warm_status st, int rc,
                      const char *log, bool more)
{
    kw_warm_result r = {.job = job, .index = i, .key = key, .status = st,
                        .rc = st == KW_WARM_FAILED ? rc : 0,
                        .log = st == KW_WARM_FAILED ? log : NULL,
                        .more = more};
    if (st == KW_WARM_CANCELLED)
        atomic_fetch_add(&w->st.cancelled, 1);
    pthread_mutex_lock(&job->cb_mu);
    r.last = --job->remaining == 0;
    job->fn(&r, job->arg);
    pthread_mutex_unlock(&job->cb_mu);
    if (!r.last)
        return;
    kw_cache_unprotect(job->guard); /* done: its entries are evictable */
    job->guard = NULL;
    pthread_mutex_lock(&w->mu);
    if (--w->jobs_active == 0)
        pthread_cond_broadcast(&w->idle_cv);
    pthread_mutex_unlock(&w->mu);
    job_unref(job); /* the pipeline's reference */
}

/* The digests of n keys as one array (malloc'd), as cache/ takes them. */
uint8_t (*kw__warm_digests(const kw_keys_key *keys, size_t n))[KW_KEYS_DIGEST_LEN]
{
    uint8_t (*d)[KW_KEYS_DIGEST_LEN] = kw_malloc((n ? n : 1) * sizeof *d);
    for (size_t i = 0; d != NULL && i < n; i++)
        memcpy(d[i], keys[i].digest, KW_KEYS_DIGEST_LEN);
    return d;
}

uint8_t (*kw__warm_packed_digests(const kw_keys_packed *p))[KW_KEYS_DIGEST_LEN]
{
    uint8_t (*d)[KW_KEYS_DIGEST_LEN] = kw_malloc((p->n ? p->n : 1) * sizeof *d);
    kw_keys_cursor cur = {0};
    kw_keys_key k;
    for (size_t i = 0; d != NULL && kw_keys_pack_next(p, &cur, &k); i++)
        memcpy(d[i], k.digest, KW_KEYS_DIGEST_LEN);
    return d;
}

void kw__warm_next_digest(void *arg, uint8_t out[KW_KEYS_DIGEST_LEN])
{
    kw__warm_digest_reader *r = arg;
    kw_keys_key k;
    if (kw_keys_pack_next(r->p, &r->cur, &k))
        memcpy(out, k.digest, KW_KEYS_DIGEST_LEN);
    else
        memset(out, 0, KW_KEYS_DIGEST_LEN); /* past the end: defined */
}

void kw_warm_job_release(kw_warm_job *job)
{
    if (job != NULL)
        job_unref(job);
}
