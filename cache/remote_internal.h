/* remote_internal.h: what the fleet tier's own files share (kw__remote_*).
 * Not API: nothing outside cache/ includes this header.
 *
 * Files: remote.c (URL, key file, connection pool, backoff, get/put,
 * counters), remote_entry.c (the signed value format), remote_fleet.c
 * (lease, wait on a holder, backfill of the local cache).
 */
#ifndef KW_REMOTE_INTERNAL_H
#define KW_REMOTE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <hiredis.h>

#include "kw_remote.h"

#define KW__REMOTE_POOL 64 /* idle connections kept (one per worker) */
#define KW__REMOTE_ENTRY "kwarm:v1:"
#define KW__REMOTE_LEASE "kwarm:lease:"
#define KW__REMOTE_KEYLEN 80 /* longest prefix + 64 hex + NUL */

struct kw_remote {
    kw_remote_opts o; /* set by open, read-only after */
    pthread_mutex_t lock; /* guards pool, npool, down, retry_at_ms,
                             backoff_ms */
    redisContext *pool[KW__REMOTE_POOL]; /* idle, healthy connections */
    size_t npool;
    bool down;           /* the last connection-level call failed */
    int64_t retry_at_ms; /* while down: no connection attempt before it */
    unsigned backoff_ms; /* the next delay after a failure */
    _Atomic uint64_t hits, misses, errors, refused, puts;
};

/* CLOCK_MONOTONIC in milliseconds. */
int64_t kw__remote_now_ms(void);

/* Writes prefix followed by the 64 hex digits of digest into out
 * (KW__REMOTE_KEYLEN bytes). */
void kw__remote_key(char *out, const char *prefix,
                    const uint8_t digest[KW_CACHE_DIGEST_LEN]);

/* Runs one command on a pooled connection.  0 and *out (the caller frees
 * it with freeReplyObject); KW_EREMOTE (down, timeout, I/O, or an error
 * reply; counted in errors; a connection-level failure marks the tier
 * down). */
int kw__remote_cmd(kw_remote *r, redisReply **out, const char *fmt, ...);

/* kw_remote_get() without counting a miss (the lease wait polls). */
int kw__remote_fetch(kw_remote *r, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                     void **blob, size_t *len, kw_cache_info *info);

#endif /* KW_REMOTE_INTERNAL_H */
