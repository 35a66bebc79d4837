/* flight.c: the flights of missing keys: the table by digest (w->mu held
 * for each call but kw__warm_finish) and a flight's end, which serves its
 * waiters.  Called by the intake (warm.c), the compile threads
 * (compile.c) and the store stage (store.c); calls only job.c. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"

#define TABLE_MIN 1024u

/* The bucket of a digest: its first 8 bytes are uniform already. */
static size_t bucket(const kw_warm *w, const uint8_t *digest)
{
    uint64_t h;
    memcpy(&h, digest, sizeof h);
    return (size_t)h & (w->table_cap - 1);
}

int kw__warm_table_init(kw_warm *w)
{
    w->table = kw_calloc(TABLE_MIN, sizeof *w->table);
    w->table_cap = TABLE_MIN;
    return w->table != NULL ? 0 : KW_ENOMEM;
}

flight *kw__warm_table_find(kw_warm *w, const uint8_t *digest)
{
    for (flight *f = w->table[bucket(w, digest)]; f != NULL; f = f->next_h)
        if (memcmp(f->key.digest, digest, KW_KEYS_DIGEST_LEN) == 0)
            return f;
    return NULL;
}

/* Doubles the table when it is fuller than one flight per bucket; keeps
 * the old one when memory is short (chains just get longer). */
static void table_grow(kw_warm *w)
{
    size_t cap = w->table_cap * 2;
    flight **t = kw_calloc(cap, sizeof *t);
    if (t == NULL)
        return;
    flight **old = w->table;
    size_t oldcap = w->table_cap;
    w->table = t;
    w->table_cap = cap;
    for (size_t i = 0; i < oldcap; i++)
        for (flight *f = old[i], *next; f != NULL; f = next) {
            next = f->next_h;
            size_t b = bucket(w, f->key.digest);
            f->next_h = t[b];
            t[b] = f;
        }
    free(old);
}

void kw__warm_table_remove(kw_warm *w, flight *f)
{
    for (flight **p = &w->table[bucket(w, f->key.digest)]; *p; p = &(*p)->next_h)
        if (*p == f) {
            *p = f->next_h;
            w->ntable--;
            return;
        }
}

flight *kw__warm_flight_new(kw_warm *w, const kw_keys_key *k)
{
    flight *f = kw_calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    f->key = *k;
    if (w->ntable >= w->table_cap)
        table_grow(w);
    size_t b = bucket(w, k->digest);
    f->next_h = w->table[b];
    w->table[b] = f;
    w->ntable++;
    kw_queue_push(&w->compile_q, &f->qnode);
    w->nqueued++;
    pthread_cond_signal(&w->compile_cv);
    return f;
}

void kw__warm_finish(kw_warm *w, flight *f, bool in_table, const outcome *o)
{
    pthread_mutex_lock(&w->mu);
    if (in_table)
        kw__warm_table_remove(w, f);
    waiter *list = f->waiters;
    f->waiters = NULL;
    pthread_mutex_unlock(&w->mu);
    /* The entry is committed (or will not be): another process waiting
     * on the key's claim may look again. */
    kw_cache_claim_drop(f->claim);
    f->claim = NULL;
    while (list != NULL) {
        waiter *next = list->next;
        kw_warm_job *job = list->job;
        kw__warm_deliver(w, job, list->index, &f->key, o->status, o->rc,
                         o->log, next != NULL);
        kw_warm_job_release(job); /* the waiter's reference */
        free(list);
        list = next;
    }
    free(f);
}
