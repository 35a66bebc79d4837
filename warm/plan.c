/* plan.c: what a warm must check and record in the cache around a job:
 * room beside the pinned entries before anything is written, and the
 * deployment's pin set after. */
#include "internal.h"

#include <stdlib.h>

#include "kw_err.h"

/* kw_warm_plan_check() of n digests d (NULL: out of memory), which it
 * frees. */
static int plan_check(kw_cache *c, uint8_t (*d)[KW_KEYS_DIGEST_LEN], size_t n,
                      char *err, size_t errlen)
{
    kw_cache_plan p;
    kw_cache_stats st;
    int rc = d ? kw_cache_plan_get(c, (const uint8_t (*)[32])d, n, &p)
               : KW_ENOMEM;
    free(d);
    if (rc == 0)
        rc = kw_cache_stats_get(c, &st);
    if (rc < 0) {
        snprintf(err, errlen, "cache: %s", kw_strerror(rc));
        return rc;
    }
    /* The missing keys' sizes are unknown until they compile: estimate
     * each as the cache's average entry. */
    uint64_t missing = n - p.present;
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

int kw_warm_plan_check(kw_cache *c, const kw_keys_key *keys, size_t n,
                       char *err, size_t errlen)
{
    return plan_check(c, kw__warm_digests(keys, n), n, err, errlen);
}

int kw_warm_plan_check_packed(kw_cache *c, const kw_keys_packed *keys,
                              char *err, size_t errlen)
{
    return plan_check(c, kw__warm_packed_digests(keys), keys->n, err, errlen);
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
