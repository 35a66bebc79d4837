/* compiler.c: worker threads, single-flight, results through uv_async. */
#include "compiler.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"

typedef struct waiter {
    kw__compile_cb cb;
    void *arg;
} waiter;

/* One key being compiled, and everyone waiting for it. */
typedef struct flight {
    kw_keys_key key;
    waiter *waiters; /* loop thread only */
    size_t nwaiters, cap;
    int rc;          /* set by the worker */
    char *log;       /* NVRTC log on failure, set by the worker */
    struct flight *next; /* in the todo or done queue */
    struct flight *all_next; /* in the loop thread's in-flight list */
} flight;

struct kw__compiler {
    uv_loop_t *loop;
    uv_async_t async; /* owned by the loop thread; wakes it for done */
    kw_cache *cache;
    kw_remote *remote; /* fleet tier, or NULL; thread-safe itself */
    pthread_t *threads;
    unsigned nthreads;
    pthread_mutex_t lock; /* guards todo_head/tail, done, stopping */
    pthread_cond_t cond;  /* signals workers: todo non-empty or stopping */
    flight *todo_head, *todo_tail;
    flight *done;
    int stopping;
    /* Loop thread only: */
    flight *all;    /* every flight not yet completed */
    size_t inflight;
    uint64_t started;
    void (*stop_done)(void *);
    void *stop_arg;
};

/* Fills the metadata stored beside a compiled key. */
static void fill_info(kw_cache_info *info, const kw_keys_key *k,
                      const kw_jit_result *r)
{
    int major = 0, minor = 0;
    memset(info, 0, sizeof *info);
    kw_jit_version(&major, &minor);
    snprintf(info->family, sizeof info->family, "%s", kw_keys_family_name(k->family));
    info->nfields = (uint32_t)kw_keys_nfields(k->family);
    memcpy(info->fields, k->fields, info->nfields * sizeof k->fields[0]);
    snprintf(info->arch, sizeof info->arch, "%s", k->arch);
    snprintf(info->entry, sizeof info->entry, "%s", r->lowered_name ? r->lowered_name : "");
    snprintf(info->nvrtc, sizeof info->nvrtc, "%d.%d", major, minor);
    info->compile_seconds = r->seconds;
}

/* ---- fleet tier (issue 6) -------------------------------------------- */

/* kw_remote_stop_fn: a worker waiting on another node's lease gives up
 * when the compiler stops. */
static bool is_stopping(void *arg)
{
    kw__compiler *c = arg;
    pthread_mutex_lock(&c->lock);
    bool stop = c->stopping != 0;
    pthread_mutex_unlock(&c->lock);
    return stop;
}

/* Compiles one key and stores it; with a fleet tier, asks it first (a
 * fetched entry is backfilled and nothing is compiled: returns
 * KW__COMPILE_FETCHED) and writes the result back after.  Returns the
 * flight's code; *log gets the NVRTC log (malloc'd) on failure. */
static int compile_key(kw__compiler *c, flight *f, char **log)
{
    kw_remote_lease lease;
    if (c->remote != NULL &&
        kw_remote_begin(c->remote, c->cache, f->key.digest, is_stopping, c,
                        &lease) == 0) {
        return KW__COMPILE_FETCHED;
    }
    if (c->remote != NULL && is_stopping(c)) { /* gave up waiting: stop */
        kw_remote_end(c->remote, &lease, NULL, NULL, 0);
        return -ECANCELED;
    }
    kw_jit_result r;
    kw_cache_info info = {0};
    bool stored;
    int rc = kw_keys_compile(&f->key, false, &r);
    if (rc == 0) {
        fill_info(&info, &f->key, &r);
        rc = kw_cache_put(c->cache, f->key.digest, &info, r.cubin, r.cubin_len,
                          false, &stored);
    }
    if (c->remote != NULL)
        kw_remote_end(c->remote, &lease, &info, rc == 0 ? r.cubin : NULL,
                      rc == 0 ? r.cubin_len : 0);
    kw_cache_count(c->cache, rc == 0 ? KW_CACHE_COMPILES
                                     : KW_CACHE_COMPILE_FAILURES, 1);
    if (rc < 0 && r.log != NULL)
        *log = strdup(r.log);
    kw_jit_result_destroy(&r);
    return rc;
}

/* ---- end of fleet tier ------------------------------------------------ */

/* Compiles one flight on a worker thread and queues it as done. */
static void run_flight(kw__compiler *c, flight *f)
{
    f->rc = compile_key(c, f, &f->log);
    pthread_mutex_lock(&c->lock);
    f->next = c->done;
    c->done = f;
    pthread_mutex_unlock(&c->lock);
    uv_async_send(&c->async);
}

/* Worker thread: takes queued flights until told to stop.  Queued flights
 * left at stop are cancelled by the loop thread, not here. */
static void *worker(void *arg)
{
    kw__compiler *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        while (c->todo_head == NULL && !c->stopping)
            pthread_cond_wait(&c->cond, &c->lock);
        if (c->stopping) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        flight *f = c->todo_head;
        c->todo_head = f->next;
        if (c->todo_head == NULL)
            c->todo_tail = NULL;
        pthread_mutex_unlock(&c->lock);
        run_flight(c, f);
    }
}

/* Removes f from the loop thread's in-flight list. */
static void unlink_flight(kw__compiler *c, flight *f)
{
    for (flight **p = &c->all; *p != NULL; p = &(*p)->all_next)
        if (*p == f) {
            *p = f->all_next;
            break;
        }
    c->inflight--;
}

/* Calls every waiter of f with its result, then frees f. */
static void complete(kw__compiler *c, flight *f)
{
    unlink_flight(c, f);
    if (f->rc == KW__COMPILE_FETCHED)
        c->started--; /* the fleet had it: no compile after all */
    for (size_t i = 0; i < f->nwaiters; i++)
        f->waiters[i].cb(f->rc, f->log, f->waiters[i].arg);
    free(f->waiters);
    free(f->log);
    free(f);
}

/* The async callback: drains the whole done queue (sends coalesce). */
static void on_async(uv_async_t *h)
{
    kw__compiler *c = h->data;
    pthread_mutex_lock(&c->lock);
    flight *list = c->done;
    c->done = NULL;
    pthread_mutex_unlock(&c->lock);
    while (list != NULL) {
        flight *next = list->next;
        complete(c, list);
        list = next;
    }
}

int kw__compiler_start(kw__compiler **out, uv_loop_t *loop, kw_cache *cache,
                       kw_remote *remote, unsigned jobs)
{
    kw__compiler *c = calloc(1, sizeof *c);
    if (c == NULL)
        return KW_ENOMEM;
    c->loop = loop;
    c->cache = cache;
    c->remote = remote;
    c->threads = calloc(jobs ? jobs : 1, sizeof *c->threads);
    int rc = c->threads ? 0 : KW_ENOMEM;
    if (rc == 0 && (rc = -pthread_mutex_init(&c->lock, NULL)) == 0 &&
        (rc = -pthread_cond_init(&c->cond, NULL)) == 0 &&
        (rc = uv_async_init(loop, &c->async, on_async)) == 0) {
        c->async.data = c;
        for (; c->nthreads < (jobs ? jobs : 1); c->nthreads++)
            if ((rc = -pthread_create(&c->threads[c->nthreads], NULL, worker, c)) != 0)
                break;
        if (c->nthreads > 0)
            rc = 0; /* fewer workers than asked still serve */
    }
    if (rc < 0) {
        free(c->threads);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Finds the flight of a digest, or NULL. */
static flight *find(kw__compiler *c, const uint8_t *digest)
{
    for (flight *f = c->all; f != NULL; f = f->all_next)
        if (memcmp(f->key.digest, digest, KW_KEYS_DIGEST_LEN) == 0)
            return f;
    return NULL;
}

static int add_waiter(flight *f, kw__compile_cb cb, void *arg)
{
    if (f->nwaiters == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4;
        waiter *w = realloc(f->waiters, cap * sizeof *w);
        if (w == NULL)
            return KW_ENOMEM;
        f->waiters = w;
        f->cap = cap;
    }
    f->waiters[f->nwaiters++] = (waiter){cb, arg};
    return 0;
}

int kw__compiler_submit(kw__compiler *c, const kw_keys_key *k,
                        kw__compile_cb cb, void *arg)
{
    if (c->stop_done != NULL)
        return -ECANCELED;
    flight *f = find(c, k->digest);
    if (f != NULL)
        return add_waiter(f, cb, arg); /* single-flight: join it */
    if ((f = calloc(1, sizeof *f)) == NULL)
        return KW_ENOMEM;
    f->key = *k;
    if (add_waiter(f, cb, arg) < 0) {
        free(f);
        return KW_ENOMEM;
    }
    f->all_next = c->all;
    c->all = f;
    c->inflight++;
    c->started++;
    pthread_mutex_lock(&c->lock);
    if (c->todo_tail != NULL)
        c->todo_tail->next = f;
    else
        c->todo_head = f;
    c->todo_tail = f;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

uint64_t kw__compiler_started(const kw__compiler *c)
{
    return c->started;
}

size_t kw__compiler_inflight(const kw__compiler *c)
{
    return c->inflight;
}

static void on_async_closed(uv_handle_t *h)
{
    kw__compiler *c = h->data;
    void (*done)(void *) = c->stop_done;
    void *arg = c->stop_arg;
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c->threads);
    free(c);
    done(arg);
}

void kw__compiler_stop(kw__compiler *c, void (*done)(void *arg), void *arg)
{
    c->stop_done = done;
    c->stop_arg = arg;
    pthread_mutex_lock(&c->lock);
    c->stopping = 1;
    flight *queued = c->todo_head;
    c->todo_head = c->todo_tail = NULL;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    /* Compiles under way finish (and are stored) before the join. */
    for (unsigned i = 0; i < c->nthreads; i++)
        pthread_join(c->threads[i], NULL);
    for (flight *f = queued; f != NULL;) {
        flight *next = f->next;
        f->rc = -ECANCELED;
        complete(c, f);
        f = next;
    }
    on_async(&c->async); /* deliver what finished during the join */
    uv_close((uv_handle_t *)&c->async, on_async_closed);
}
