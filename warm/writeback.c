/* writeback.c: the fleet write-back stage (issue 23, point 6).
 *
 * A compiled entry is written back to the fleet tier, and a flight's
 * fleet lease released, by one thread of its own, after the local put:
 * a slow or stalled Redis (every call may take up to --remote-timeout)
 * then delays no compile, no store and no request's result.  The queue
 * is bounded: at most WB_MAX_ITEMS entries and WB_MAX_BYTES cubin bytes
 * wait; past either, the entry is not written back (counted in
 * writebacks_dropped: the fleet compiles it again where it misses) but
 * its lease release still queues, cubin-less, so the fleet's waiters are
 * let go at once instead of at the lease's expiry.  A release is a few
 * dozen bytes, and there is at most one per flight.
 */
#include "internal.h"

#include <stdlib.h>

#include "kw_alloc.h"

#define WB_MAX_ITEMS 1024u
#define WB_MAX_BYTES (64u * 1024u * 1024u)

typedef struct wb_item {
    kw_queue_node node;     /* in w->wb_q */
    kw_remote_lease lease;  /* released after the put, when held */
    kw_cache_info info;
    void *cubin;            /* owned; NULL: a lease release only */
    size_t len;
} wb_item;

void kw__warm_writeback_push(kw_warm *w, const kw_remote_lease *lease,
                             const kw_cache_info *info, void **cubin,
                             size_t len)
{
    if (w->o.remote == NULL || (!lease->held && (cubin == NULL || *cubin == NULL)))
        return;
    wb_item *it = kw_calloc(1, sizeof *it);
    if (it == NULL) { /* no memory: release here, skip the write-back */
        kw_remote_lease l = *lease;
        atomic_fetch_add(&w->st.writebacks_dropped, cubin && *cubin ? 1 : 0);
        kw_remote_end(w->o.remote, &l, NULL, NULL, 0);
        return;
    }
    it->lease = *lease;
    if (info != NULL)
        it->info = *info;
    pthread_mutex_lock(&w->wb_mu);
    if (cubin != NULL && *cubin != NULL) {
        if (w->wb_n < WB_MAX_ITEMS && w->wb_bytes + len <= WB_MAX_BYTES) {
            it->cubin = *cubin; /* moved */
            it->len = len;
            *cubin = NULL;
            w->wb_n++;
            w->wb_bytes += len;
        } else {
            atomic_fetch_add(&w->st.writebacks_dropped, 1);
        }
    }
    if (it->cubin == NULL && !it->lease.held) { /* nothing left to do */
        pthread_mutex_unlock(&w->wb_mu);
        free(it);
        return;
    }
    kw_queue_push(&w->wb_q, &it->node);
    w->wb_items++;
    pthread_cond_signal(&w->wb_cv);
    pthread_mutex_unlock(&w->wb_mu);
}

/* The write-back thread: writes and releases until stopped and drained. */
void *kw__warm_writeback_main(void *arg)
{
    kw_warm *w = arg;
    pthread_mutex_lock(&w->wb_mu);
    for (;;) {
        while (kw_queue_empty(&w->wb_q) && !w->wb_stop)
            pthread_cond_wait(&w->wb_cv, &w->wb_mu);
        kw_queue_node *n = kw_queue_pop(&w->wb_q);
        if (n == NULL)
            break; /* stopped and drained */
        wb_item *it = KW_QUEUE_ENTRY(n, wb_item, node);
        pthread_mutex_unlock(&w->wb_mu);
        kw_remote_end(w->o.remote, &it->lease, &it->info, it->cubin, it->len);
        pthread_mutex_lock(&w->wb_mu);
        if (it->cubin != NULL) {
            w->wb_n--;
            w->wb_bytes -= it->len;
        }
        w->wb_items--; /* after the write: a reader of 0 sees it done */
        free(it->cubin);
        free(it);
    }
    pthread_mutex_unlock(&w->wb_mu);
    return NULL;
}

void kw__warm_writeback_stop(kw_warm *w)
{
    pthread_mutex_lock(&w->wb_mu);
    w->wb_stop = true;
    pthread_cond_broadcast(&w->wb_cv);
    pthread_mutex_unlock(&w->wb_mu);
    if (w->have_wb)
        pthread_join(w->wb_thread, NULL);
    w->have_wb = false;
}
