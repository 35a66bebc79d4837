/* remote_fleet.c: fleet-wide single-flight around a compile.
 *
 * The lease "kwarm:lease:<hex>" is taken with SET NX PX (it expires by
 * itself if its holder dies) and released with a compare-and-delete
 * script, so a holder whose lease expired never deletes its successor's.
 * Every failure here degrades to "compile locally": the fleet tier saves
 * work, it is never needed to serve.
 */
#include "kw_remote.h"
#include "remote_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "kw_err.h"

/* Deletes the lease only while it still holds our token. */
static const char release_lua[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) end return 0";

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Fetches the entry and stores it in the local cache.  0 once stored;
 * KW_ENOTFOUND; KW_ECORRUPT (refused); KW_EREMOTE; a kw_cache_put code. */
static int backfill(kw_remote *r, kw_cache *cache, const uint8_t *digest)
{
    void *blob = NULL;
    size_t len = 0;
    kw_cache_info info;
    int rc = kw__remote_fetch(r, digest, &blob, &len, &info);
    if (rc == 0)
        rc = kw_cache_put(cache, digest, &info, blob, len, false, NULL);
    free(blob);
    return rc;
}

/* SET NX PX: lease->held tells whether we got it.  0 or KW_EREMOTE. */
static int take_lease(kw_remote *r, kw_remote_lease *lease)
{
    char key[KW__REMOTE_KEYLEN], ms[16];
    redisReply *rep;
    kw__remote_key(key, KW__REMOTE_LEASE, lease->digest);
    snprintf(ms, sizeof ms, "%u", r->o.lease_ms);
    int rc = kw__remote_cmd(r, &rep, "SET %s %s NX PX %s", key, lease->token,
                            ms);
    if (rc < 0)
        return rc;
    lease->held = rep->type == REDIS_REPLY_STATUS;
    freeReplyObject(rep);
    return 0;
}

/* Whether anyone holds the lease of digest now.  0 or KW_EREMOTE. */
static int lease_exists(kw_remote *r, const uint8_t *digest, bool *exists)
{
    char key[KW__REMOTE_KEYLEN];
    redisReply *rep;
    kw__remote_key(key, KW__REMOTE_LEASE, digest);
    int rc = kw__remote_cmd(r, &rep, "EXISTS %s", key);
    if (rc < 0)
        return rc;
    *exists = rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
    freeReplyObject(rep);
    return 0;
}

/* Waits while another node holds the lease: polls the entry until it
 * appears (0), the lease is gone (KW_EAGAIN-like: 1, try to take it), or
 * the deadline passes, the caller stops or Redis fails (KW_ENOTFOUND). */
static int wait_holder(kw_remote *r, kw_cache *cache, const uint8_t *digest,
                       int64_t deadline, kw_remote_stop_fn stop, void *arg)
{
    while (kw__remote_now_ms() < deadline && !(stop && stop(arg))) {
        nap_ms(KW_REMOTE_POLL_MS);
        int rc = backfill(r, cache, digest);
        if (rc != KW_ENOTFOUND)
            return rc == 0 ? 0 : KW_ENOTFOUND;
        bool exists = true;
        if (lease_exists(r, digest, &exists) < 0)
            return KW_ENOTFOUND;
        if (!exists)
            return 1;
    }
    return KW_ENOTFOUND;
}

int kw_remote_begin(kw_remote *r, kw_cache *cache,
                    const uint8_t digest[KW_CACHE_DIGEST_LEN],
                    kw_remote_stop_fn stop, void *arg, kw_remote_lease *lease)
{
    uint8_t nonce[16];
    memset(lease, 0, sizeof *lease);
    memcpy(lease->digest, digest, KW_CACHE_DIGEST_LEN);
    randombytes_buf(nonce, sizeof nonce);
    sodium_bin2hex(lease->token, sizeof lease->token, nonce, sizeof nonce);
    int rc = backfill(r, cache, digest);
    if (rc != KW_ENOTFOUND) /* stored, or refused / down: compile */
        return rc == 0 ? 0 : KW_ENOTFOUND;
    int64_t deadline = kw__remote_now_ms() + r->o.lease_ms;
    for (;;) {
        if (take_lease(r, lease) < 0)
            break;
        if (lease->held) {
            /* The entry may have landed between our GET and the SET NX
             * (its holder put it, then released): look once more. */
            if (backfill(r, cache, digest) != 0)
                break;
            kw_remote_end(r, lease, NULL, NULL, 0);
            return 0;
        }
        rc = wait_holder(r, cache, digest, deadline, stop, arg);
        if (rc == 0)
            return 0;
        if (rc < 0)
            break;
        /* rc == 1: the holder let go without an entry; take over. */
    }
    atomic_fetch_add(&r->misses, 1);
    return KW_ENOTFOUND;
}

void kw_remote_end(kw_remote *r, kw_remote_lease *lease,
                   const kw_cache_info *info, const void *blob, size_t len)
{
    if (blob != NULL)
        (void)kw_remote_put(r, lease->digest, info, blob, len); /* counted */
    if (!lease->held)
        return;
    char key[KW__REMOTE_KEYLEN];
    redisReply *rep;
    kw__remote_key(key, KW__REMOTE_LEASE, lease->digest);
    if (kw__remote_cmd(r, &rep, "EVAL %s 1 %s %s", release_lua, key,
                       lease->token) == 0)
        freeReplyObject(rep);
    lease->held = false; /* if the release failed, the lease expires */
}
