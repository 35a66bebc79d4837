/* internal.h: what warm/'s own files share (kw__warm_; not API). */
#ifndef KW_WARM_INTERNAL_H
#define KW_WARM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "kw_queue.h"
#include "kw_remote.h"
#include "kw_warm.h"
#include "pool.h"

/* One key of one job waiting on a flight. */
typedef struct waiter {
    kw_warm_job *job; /* holds a reference until served */
    size_t index;
    struct waiter *next;
} waiter;

/* One missing key being fetched or compiled, and everyone waiting on it.
 * Lives in the table from creation until its result is taken. */
typedef struct flight {
    kw_keys_key key;
    waiter *waiters;     /* guarded by w->mu */
    bool purge;          /* a waiter saw a corrupt entry (KW_WARM_PURGE) */
    bool deferred;       /* its claim was held elsewhere once: requeued */
    kw_cache_claim *claim; /* held from before its compile until it ends
                              (kw__warm_finish drops it), or NULL */
    kw_queue_node qnode;   /* in the compile queue, guarded by w->mu */
    struct flight *next_h; /* table chain, guarded by w->mu */
} flight;

struct kw_warm_job {
    kw_keys_packed keys; /* owned, packed (about 3 bytes a key); read a
                            chunk at a time by the intake (cursor) */
    size_t n;
    unsigned flags;
    kw_warm_result_fn fn;
    void *arg;
    kw_cache_guard *guard; /* KW_WARM_PROTECT: released after the last */
    pthread_mutex_t cb_mu; /* held while fn runs; guards remaining */
    size_t remaining;      /* results still to deliver */
    _Atomic int refs;      /* pipeline, caller's handle, intake, waiters */
    _Atomic bool cancelled;
    kw_queue_node inode;   /* in the intake queue, guarded by w->mu */
    kw_warm_job *next_parked; /* on the parked list, guarded by w->mu */
    struct kw_warm *w;     /* its pipeline */
    kw_keys_cursor cursor; /* keys looked up so far (intake thread only) */
    bool paused;           /* kw_warm_job_pause(): guarded by w->mu */
    bool parked;           /* on w's parked list: guarded by w->mu */
};

typedef struct warm_counters {
    _Atomic uint64_t keys, hits, misses, joined, remote_hits, compiles,
        compile_failures, store_failures, cancelled, compiling,
        writebacks_dropped;
    /* by family (kw_warm_stats says what each means) */
    _Atomic uint64_t fam_compiles[KW_K_NFAMILIES], fam_failures[KW_K_NFAMILIES],
        fam_remote_hits[KW_K_NFAMILIES];
    _Atomic uint64_t compile_buckets[KW_WARM_COMPILE_BUCKETS + 1];
    _Atomic uint64_t compile_ns; /* the compiles' sum, nanoseconds */
} warm_counters;

struct kw_warm {
    kw_warm_opts o;
    kw__pool *pool;
    /* mu guards: intake_q, parked, compile_q/nqueued, table,
     * ntable, table_cap, stopping, jobs_active, and each job's inode, next_parked,
     * paused and parked. */
    pthread_mutex_t mu;
    pthread_cond_t intake_cv;  /* a job queued, or stopping */
    pthread_cond_t compile_cv; /* a flight queued, or stopping */
    pthread_cond_t idle_cv;    /* jobs_active fell to 0 */
    kw_queue intake_q;         /* of kw_warm_job, by inode */
    kw_warm_job *parked;       /* paused jobs, off the intake queue */
    kw_queue compile_q; /* of flight, by qnode */
    size_t nqueued;
    flight **table;
    size_t ntable, table_cap; /* a power of two */
    bool stopping;
    _Atomic bool stopping_flag; /* stopping, readable without mu */
    size_t jobs_active;
    pthread_t intake;
    bool have_intake;
    kw_keys_key *chunk; /* KW_WARM_CHUNK keys, unpacked: intake thread only */
    pthread_t *compilers;
    unsigned ncompilers;
    /* The store stage.  store_mu guards store_q, store_stop. */
    pthread_mutex_t store_mu;
    pthread_cond_t store_cv;
    kw_queue store_q; /* of stored, by node */
    bool store_stop;
    pthread_t store_thread;
    bool have_store;
    /* The write-back stage (writeback.c).  wb_mu guards wb_q, wb_n,
     * wb_bytes, wb_items, wb_stop. */
    pthread_mutex_t wb_mu;
    pthread_cond_t wb_cv;
    kw_queue wb_q;     /* of wb_item, by node */
    size_t wb_n, wb_bytes; /* entries with a cubin queued, and its bytes */
    size_t wb_items;       /* items queued or being written */
    bool wb_stop;
    pthread_t wb_thread;
    bool have_wb;
    warm_counters st;
};

/* Calls job's callback for key i (key: its unpacked form, borrowed for
 * the call; st, rc, log), serialized per job; the last one releases the
 * pipeline's reference.  Any warm thread; never with w->mu held. */
void kw__warm_deliver(kw_warm *w, kw_warm_job *job, size_t i,
                      const kw_keys_key *key, kw_warm_status st, int rc,
                      const char *log, bool more);

/* The digests of a packed set as one array (malloc'd; NULL when out of
 * memory), the form cache/ takes. */
uint8_t (*kw__warm_packed_digests(const kw_keys_packed *p))[KW_KEYS_DIGEST_LEN];

/* A packed set read one digest at a time, for cache/'s calls that take
 * a kw_cache_digest_fn (kw_cache_protect_each, kw_cache_plan_each), so
 * that no array of the set's digests is made beside the packed keys.
 * Start it as {.p = set}; p is borrowed for the reads. */
typedef struct kw__warm_digest_reader {
    const kw_keys_packed *p;
    kw_keys_cursor cur;
} kw__warm_digest_reader;

/* The kw_cache_digest_fn of a reader (arg): the next key's digest, or
 * zeros past the set's end. */
void kw__warm_next_digest(void *arg, uint8_t out[KW_KEYS_DIGEST_LEN]);

/* The digests of n keys as one array (malloc'd; NULL when out of
 * memory), the form cache/ takes. */
uint8_t (*kw__warm_digests(const kw_keys_key *keys, size_t n))[KW_KEYS_DIGEST_LEN];

/* The flight table (flight.c), w->mu held for each. */
int kw__warm_table_init(kw_warm *w);
flight *kw__warm_table_find(kw_warm *w, const uint8_t *digest);
void kw__warm_table_remove(kw_warm *w, flight *f);
/* A new flight for k, in the table and at the tail of the compile queue;
 * NULL when out of memory. */
flight *kw__warm_flight_new(kw_warm *w, const kw_keys_key *k);

/* A compile thread's main: takes flights until stopping and drained. */
void *kw__warm_compile_main(void *arg);

/* What a flight came to: a status for its waiters, a code and a log. */
typedef struct outcome {
    kw_warm_status status;
    int rc;
    char *log; /* malloc'd or NULL */
} outcome;

/* Takes f out of the table (unless already out), serves every waiter with
 * o and frees f (flight.c).  No lock held. */
void kw__warm_finish(kw_warm *w, flight *f, bool in_table, const outcome *o);

/* The store stage (store.c): compiled flights wait here for a group
 * commit, so one LMDB transaction (one fsync) stores every result ready
 * at that moment, up to opts.store_batch.  push takes r's cubin and log. */
void kw__warm_store_push(kw_warm *w, flight *f, kw__pool_result *r,
                         const kw_cache_info *info,
                         const kw_remote_lease *lease);
void *kw__warm_store_main(void *arg);

/* The write-back stage (writeback.c): push queues the write-back of a
 * compiled entry (*cubin of len bytes, taken when it fits the queue's
 * bound, else left to the caller and counted in writebacks_dropped;
 * cubin NULL: none) and the release of lease (when held), for the
 * write-back thread, so that Redis never blocks a compile, a store or a
 * result.  Never waits on Redis; any warm thread.  stop drains the
 * queue, then joins the thread. */
void kw__warm_writeback_push(kw_warm *w, const kw_remote_lease *lease,
                             const kw_cache_info *info, void **cubin,
                             size_t len);
void *kw__warm_writeback_main(void *arg);
void kw__warm_writeback_stop(kw_warm *w);

#endif /* KW_WARM_INTERNAL_H */
