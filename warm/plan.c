/* plan.c: what a warm must check and record in the cache around a job:
 * room beside the pinned entries before anything is written, and the
 * deployment's pin set after. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "kw_err.h"

/* kw_warm_plan_check() of the n digests that next(arg, out) gives: the
 * plan's set is made as the digests are read, with no array of them. */
static int plan_check(kw_cache *c, size_t n, kw_cache_digest_fn next,
                      void *arg, char *err, size_t errlen)
{
    kw_cache_plan p;
    kw_cache_stats st;
    int rc = kw_cache_plan_each(c, n, next, arg, &p);
    if (rc == 0)
        rc = kw_cache_stats_get(c, &st);
    if (rc < 0) {
        snprintf(err, errlen, "cache: %s", kw_strerror(rc));
        return rc;
    }
    /* The missing keys' sizes are unknown until they compile: estimate
     * each as the cache's average entry.  present may pass n only when
     * hashes collide (kw_cache_plan_each). */
    uint64_t missing = n > p.present ? n - p.present : 0;
    uint64_t avg = st.entries ? st.bytes / st.entries : 0;
    uint64_t need = p.present_bytes + p.held_bytes + missing * avg;
    if (need <= p.max_size)
        return 0;
    snprintf(err, errlen, "the deployment does not fit in the cache: it needs "
             "about %llu bytes (%llu cached, %llu keys to compile at about "
             "%llu each) beside %llu bytes pinned by others, over the limit "
             "of %llu; nothing was written; raise the limit (kwarm resize "
             "--cache DIR SIZE) or unpin an old deployment (kwarm unpin NAME)",
             (unsigned long long)(p.present_bytes + missing * avg),
             (unsigned long long)p.present_bytes, (unsigned long long)missing,
             (unsigned long long)avg, (unsigned long long)p.held_bytes,
             (unsigned long long)p.max_size);
    return KW_ENOSPC;
}

/* The kw_cache_digest_fn of an array of keys: arg is a cursor into it
 * (const kw_keys_key **), moved one key each call. */
static void next_key_digest(void *arg, uint8_t out[KW_KEYS_DIGEST_LEN])
{
    const kw_keys_key **k = arg;
    memcpy(out, (*k)->digest, KW_KEYS_DIGEST_LEN);
    (*k)++;
}

int kw_warm_plan_check(kw_cache *c, const kw_keys_key *keys, size_t n,
                       char *err, size_t errlen)
{
    const kw_keys_key *cur = keys;
    return plan_check(c, n, next_key_digest, &cur, err, errlen);
}

int kw_warm_plan_check_packed(kw_cache *c, const kw_keys_packed *keys,
                              char *err, size_t errlen)
{
    kw__warm_digest_reader r = {.p = keys};
    return plan_check(c, keys->n, kw__warm_next_digest, &r, err, errlen);
}

/* kw_warm_pin() of n digests d (NULL: out of memory), which it frees. */
static int pin(kw_cache *c, const char *name, uint8_t (*d)[KW_KEYS_DIGEST_LEN],
               size_t n, char *err, size_t errlen)
{
    int rc = d ? kw_cache_pin_set(c, name, (const uint8_t (*)[32])d, n)
               : KW_ENOMEM;
    free(d);
    if (rc < 0)
        snprintf(err, errlen, "--pin %s: %s%s%s", name, kw_strerror(rc),
                 kw_cache_last_error(c)[0] ? ": " : "", kw_cache_last_error(c));
    return rc;
}

int kw_warm_pin(kw_cache *c, const char *name, const kw_keys_key *keys,
                size_t n, char *err, size_t errlen)
{
    return pin(c, name, kw__warm_digests(keys, n), n, err, errlen);
}

int kw_warm_job_pin(const kw_warm_job *job, const char *name, char *err,
                    size_t errlen)
{
    return pin(job->w->o.cache, name, kw__warm_packed_digests(&job->keys),
               job->n, err, errlen);
}
