/* store.c: the store stage: compiled flights committed in groups.
 *
 * Compile threads push each compiled flight here and go on compiling; one
 * store thread takes every flight waiting (up to opts.store_batch) and
 * stores them with kw_cache_put_many(): one LMDB transaction, one fsync,
 * for the whole group.  A prewarm of hundreds of keys on a real disk is
 * then not bounded by one fsync per key.  Only after the group committed
 * are its flights taken out of the table and their waiters served, so a
 * request arriving meanwhile joins the flight or finds the entry.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"

#define STORE_BATCH_DEFAULT 64u

typedef struct stored {
    flight *f;
    kw__pool_result r; /* cubin and log owned */
    kw_cache_info info;
    kw_remote_lease lease; /* the fleet's, when remote (held or not) */
    bool remote;
    kw_queue_node node; /* in w->store_q, then in a group */
} stored;

static stored *next_of(const stored *s)
{
    return s->node.next ? KW_QUEUE_ENTRY(s->node.next, stored, node) : NULL;
}

void kw__warm_store_push(kw_warm *w, flight *f, kw__pool_result *r,
                         const kw_cache_info *info,
                         const kw_remote_lease *lease)
{
    stored *s = kw_calloc(1, sizeof *s);
    if (s == NULL) { /* cannot queue it: the key fails, nothing is lost */
        outcome o = {KW_WARM_FAILED, KW_ENOMEM, NULL};
        atomic_fetch_add(&w->st.store_failures, 1);
        if (lease != NULL)
            kw__warm_writeback_push(w, lease, NULL, NULL, 0);
        kw__warm_finish(w, f, true, &o);
        return;
    }
    if (lease != NULL) {
        s->lease = *lease;
        s->remote = true;
    }
    s->f = f;
    s->r = *r;
    *r = (kw__pool_result){0}; /* moved */
    s->info = *info;
    pthread_mutex_lock(&w->store_mu);
    kw_queue_push(&w->store_q, &s->node);
    pthread_cond_signal(&w->store_cv);
    pthread_mutex_unlock(&w->store_mu);
}

/* The outcome of one stored flight; counters follow warm's meanings. */
static void settle(kw_warm *w, stored *s, int rc)
{
    outcome o = {KW_WARM_COMPILED, 0, NULL};
    if (rc == 0) {
        atomic_fetch_add(&w->st.compiles, 1);
        atomic_fetch_add(&w->st.fam_compiles[s->f->key.family], 1);
        /* the cache's "compiles" was counted by the put itself */
    } else {
        atomic_fetch_add(&w->st.store_failures, 1);
        const char *why = kw_cache_last_error(w->o.cache);
        size_t n = strlen(why) + 64;
        if ((o.log = kw_malloc(n)) != NULL)
            snprintf(o.log, n, "store: %s%s%s", kw_strerror(rc),
                     why[0] ? ": " : "", why);
        o.status = KW_WARM_FAILED;
        o.rc = rc;
    }
    /* Written back whether or not the local put took it: the fleet has
     * the compile either way.  Queued (never waiting on Redis) before the
     * waiters are served, so a caller that saw its result finds the
     * write-back counted in writebacks_queued.  Takes the cubin when the
     * queue has room. */
    if (s->remote)
        kw__warm_writeback_push(w, &s->lease, &s->info, &s->r.cubin,
                                s->r.cubin_len);
    kw__warm_finish(w, s->f, true, &o);
    free(o.log);
    kw__pool_result_destroy(&s->r);
    free(s);
}

/* Stores one group (a list of n) in one transaction and settles it. */
static void store_group(kw_warm *w, stored *list, size_t n)
{
    kw_cache_item *items = kw_calloc(n, sizeof *items);
    int *rcs = kw_calloc(n, sizeof *rcs);
    bool purge = false;
    size_t i = 0;
    /* Out of memory, every key of the group fails with KW_ENOMEM. */
    for (stored *s = items && rcs ? list : NULL; s != NULL; s = next_of(s), i++) {
        items[i] = (kw_cache_item){.digest = s->f->key.digest,
                                   .info = &s->info, .blob = s->r.cubin,
                                   .len = s->r.cubin_len, .compiled = true};
        purge |= s->f->purge;
    }
    if (purge)
        kw_cache_flush(w->o.cache); /* removes corrupt copies first */
    int rc = items && rcs ? kw_cache_put_many(w->o.cache, items, n, rcs)
                          : KW_ENOMEM;
    i = 0;
    for (stored *s = list, *next; s != NULL; s = next, i++) {
        next = next_of(s);
        settle(w, s, rc < 0 ? rc : rcs[i]);
    }
    free(items);
    free(rcs);
}

void *kw__warm_store_main(void *arg)
{
    kw_warm *w = arg;
    unsigned batch = w->o.store_batch ? w->o.store_batch : STORE_BATCH_DEFAULT;
    pthread_mutex_lock(&w->store_mu);
    for (;;) {
        while (kw_queue_empty(&w->store_q) && !w->store_stop)
            pthread_cond_wait(&w->store_cv, &w->store_mu);
        if (kw_queue_empty(&w->store_q))
            break; /* stopped and drained */
        size_t n = 0;
        kw_queue_node *first = kw_queue_take(&w->store_q, batch, &n);
        stored *list = KW_QUEUE_ENTRY(first, stored, node);
        pthread_mutex_unlock(&w->store_mu);
        store_group(w, list, n);
        pthread_mutex_lock(&w->store_mu);
    }
    pthread_mutex_unlock(&w->store_mu);
    return NULL;
}
