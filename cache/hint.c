/* hint.c: what the last read of a digest found, kept in memory so that a
 * hit needs no B-tree lookup while nothing has been committed since
 * (internal.h, issue 14 point 1).
 *
 * Why: with named databases LMDB looks each database up again in every
 * renewed read transaction, so a hit through LMDB costs four B-tree
 * searches (two databases, each found then searched); on the 2-core
 * machine that was 0.4 µs, more than copying and hashing a 16 KB cubin.
 *
 * A hint is the decoded metadata of a digest and the address of its blob
 * in the map, as of one snapshot (the id of the transaction that read
 * them).  It is used only while that snapshot is the latest commit:
 *  - a borrow renews a pooled read transaction and uses the hint when the
 *    transaction's id is the hint's: same snapshot, same pages, held;
 *  - a get reads the last committed id, copies from the hint's address,
 *    and reads the id again: unchanged means no commit happened around
 *    the copy, so the entry was there and its pages were not reused (LMDB
 *    reuses a page freed by commit N only from commit N + 2 on).
 * Either way the XXH3-128 of the bytes is checked against the hint's sum,
 * itself from a metadata record that passed its own check, so a hint can
 * make a hit fall back to the lookup path, never serve other bytes.
 *
 * The table is direct-mapped by the digest's first bytes (a BLAKE2b
 * output), one slot per digest; a slot is guarded by one of
 * KW__CACHE_HINT_LOCKS mutexes, held for a copy of the slot only.
 */
#include "kw_cache.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

int kw__cache_hints_init(kw_cache *c)
{
    c->hints = calloc(KW__CACHE_HINTS, sizeof *c->hints);
    return c->hints ? 0 : KW_ENOMEM;
}

void kw__cache_hints_destroy(kw_cache *c)
{
    free(c->hints);
    c->hints = NULL;
}

/* The slot of digest and its lock. */
static size_t slot_index(const uint8_t *digest)
{
    uint64_t h;
    memcpy(&h, digest, sizeof h);
    return (size_t)(h % KW__CACHE_HINTS);
}

uint64_t kw__cache_last_txnid(kw_cache *c)
{
    MDB_envinfo ei;
    if (mdb_env_info(c->env, &ei) != 0)
        return 0; /* 0 is no hint's id: the caller takes the lookup path */
    /* the loads of the copy that follows must not move before this one */
    atomic_thread_fence(memory_order_acquire);
    return (uint64_t)ei.me_last_txnid;
}

bool kw__cache_hint_get(kw_cache *c, const uint8_t *digest, uint64_t txnid,
                        kw__cache_hint *out, bool with_meta)
{
    if (!c->hints || txnid == 0)
        return false;
    size_t i = slot_index(digest);
    pthread_mutex_t *mu = &c->hint_mu[i % KW__CACHE_HINT_LOCKS];
    const kw__cache_hint *h = &c->hints[i];
    pthread_mutex_lock(mu);
    bool ok = h->txnid == txnid &&
              memcmp(h->digest, digest, KW_CACHE_DIGEST_LEN) == 0;
    if (ok && with_meta) {
        *out = *h;
    } else if (ok) { /* what a hit without metadata needs */
        out->txnid = h->txnid;
        out->data = h->data;
        out->m.info.size = h->m.info.size;
        memcpy(out->m.sum, h->m.sum, sizeof out->m.sum);
    }
    pthread_mutex_unlock(mu);
    return ok;
}

void kw__cache_hint_put(kw_cache *c, const uint8_t *digest, uint64_t txnid,
                        const void *data, const kw__cache_meta *m)
{
    if (!c->hints)
        return;
    size_t i = slot_index(digest);
    pthread_mutex_t *mu = &c->hint_mu[i % KW__CACHE_HINT_LOCKS];
    kw__cache_hint *h = &c->hints[i];
    pthread_mutex_lock(mu);
    if (txnid >= h->txnid ||
        memcmp(h->digest, digest, KW_CACHE_DIGEST_LEN) != 0) {
        memcpy(h->digest, digest, KW_CACHE_DIGEST_LEN);
        h->txnid = txnid;
        h->data = data;
        h->m = *m;
    }
    pthread_mutex_unlock(mu);
}
