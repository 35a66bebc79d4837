/* loops.c: the serving loops (--loops): threads, each running a libuv
 * loop that owns the connections handed to it.
 *
 * The main loop (daemon.c) accepts every peer and hands a duplicate of its
 * socket to the loops in turn (kw__loops_hand); each loop then reads,
 * parses, answers and writes for its connections alone, so hits are
 * served by as many threads as there are loops.  Everything the loops
 * share (the cache, warm, the job queue, the counters) is thread-safe or
 * _Atomic.  The main loop talks to a loop through its wake handle only:
 * sockets to take, "stop" (serve what is under way, then end) and "close
 * all" (the grace period is over).  A loop that has ended tells the main
 * loop through d->loop_done; the main loop finishes the stop when every
 * loop has.
 */
#define _GNU_SOURCE /* syscall() */
#include "loops.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

/* Told to stop: stop resuming backlogs, close idle connections now (the
 * others after their request's last frame), end when nothing is left. */
static void loop_stop(kw__loop *l)
{
    if (l->stopping)
        return;
    l->stopping = true;
    uv_close((uv_handle_t *)&l->resume, NULL);
    for (kw__conn *c = l->conns, *next; c != NULL; c = next) {
        next = c->next;
        if (c->active == NULL)
            kw__conn_close(c);
    }
    kw__loop_check_stop(l);
}

/* The wake handle: sockets to take, then a stop or a close-all. */
static void on_wake(uv_async_t *h)
{
    kw__loop *l = h->data;
    pthread_mutex_lock(&l->mu);
    int *fds = l->fds;
    size_t n = l->nfds;
    bool stop = l->want_stop, close_all = l->want_close;
    l->fds = NULL;
    l->nfds = l->fds_cap = 0;
    pthread_mutex_unlock(&l->mu);
    for (size_t i = 0; i < n; i++)
        kw__loop_take(l, fds[i]); /* closes it when stopping */
    free(fds);
    if (close_all && !l->done)
        while (l->conns != NULL)
            kw__conn_close(l->conns);
    if (stop || close_all)
        loop_stop(l);
}

/* Asks the scheduler for a short time slice for the calling thread
 * (SCHED_OTHER, nice unchanged, sched_runtime LOOP_SLICE_NS).  Linux's
 * EEVDF scheduler (6.12 on) gives a thread with a shorter slice an
 * earlier deadline when it wakes, so a loop that wakes for a ping runs
 * before job threads that derive keys and stream JSON for whole slices,
 * without taking CPU from them (issue 23, point 7).  Older kernels
 * ignore sched_runtime for SCHED_OTHER; a kernel or seccomp profile that
 * refuses the call leaves the default, which is only slower, so the
 * failure is logged at debug level and not returned. */
#define LOOP_SLICE_NS 100000ull /* 0.1 ms, the kernel's least */
static void short_slice(void)
{
#ifdef SYS_sched_setattr
    /* The kernel's struct sched_attr, version 0 (linux/sched/types.h,
     * which cannot be included beside <sched.h>). */
    struct {
        uint32_t size, sched_policy;
        uint64_t sched_flags;
        int32_t sched_nice;
        uint32_t sched_priority;
        uint64_t sched_runtime, sched_deadline, sched_period;
    } a = {.size = sizeof a, .sched_policy = SCHED_OTHER,
           .sched_runtime = LOOP_SLICE_NS};
    /* Only a thread of the default policy, and with its nice: Linux's
     * nice is per thread, and a unit's Nice= or CPUSchedulingPolicy=
     * stays as set. */
    if (sched_getscheduler(0) != SCHED_OTHER)
        return;
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    if (nice == -1 && errno != 0)
        return;
    a.sched_nice = nice;
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        KW_LOG(KW_LOG_DEBUG, "serving loop: sched_setattr: %s",
               strerror(errno));
#endif
}

static void *loop_main(void *arg)
{
    kw__loop *l = arg;
    kw__daemon *d = l->d;
    short_slice();
    uv_run(&l->loop, UV_RUN_DEFAULT);
    /* under done_mu: the main loop closes loop_done only once every loop
     * has counted itself, so no send can follow the close */
    pthread_mutex_lock(&d->done_mu);
    d->nloops_done++;
    uv_async_send(&d->loop_done);
    pthread_mutex_unlock(&d->done_mu);
    return NULL;
}

/* Sets up loop l (its handles), not yet running; 0 or a libuv code.
 * libuv opens one descriptor per loop, kept for the loop's life, at its
 * first stream (a reserve for when descriptors run out): a pipe handle
 * made and closed here opens it now, so kwarmd's descriptor count does not
 * move with the first connection each loop serves. */
static int loop_init(kw__daemon *d, kw__loop *l)
{
    l->d = d;
    int rc = uv_loop_init(&l->loop);
    if (rc < 0)
        return rc;
    uv_pipe_t first;
    uv_pipe_init(&l->loop, &first, 0);
    uv_close((uv_handle_t *)&first, NULL);
    uv_run(&l->loop, UV_RUN_NOWAIT); /* the close ends: nothing refers to it */
    if ((rc = -pthread_mutex_init(&l->mu, NULL)) == 0 &&
        (rc = uv_async_init(&l->loop, &l->wake, on_wake)) == 0 &&
        (rc = kw__loop_outbox_init(l)) == 0) {
        l->wake.data = l;
        kw__loop_backlog_init(l);
        uv_timer_init(&l->loop, &l->held_timer);
        l->held_timer.data = l;
        kw__heartbeat_init(l);
    }
    return rc;
}

int kw__loops_start(kw__daemon *d, char *err, size_t errlen)
{
    unsigned n = d->opts->loops ? d->opts->loops : 1;
    d->loops = kw_calloc(n, sizeof *d->loops);
    if (d->loops == NULL) {
        snprintf(err, errlen, "serving loops: out of memory");
        return KW_ENOMEM;
    }
    int rc = 0;
    for (unsigned i = 0; i < n && rc == 0; i++) {
        kw__loop *l = &d->loops[i];
        if ((rc = loop_init(d, l)) < 0) {
            snprintf(err, errlen, "serving loop %u: %s", i, uv_strerror(rc));
            break;
        }
        d->nloops++;
        if ((rc = -pthread_create(&l->thread, NULL, loop_main, l)) < 0) {
            snprintf(err, errlen, "serving loop %u: %s", i, strerror(-rc));
            break;
        }
        l->running = true;
    }
    return rc;
}

/* Sends l's wake unless l has closed it; false when it had. */
static bool wake(kw__loop *l)
{
    bool open = !l->closed;
    if (open)
        uv_async_send(&l->wake);
    return open;
}

void kw__loops_hand(kw__daemon *d, int fd)
{
    kw__loop *l = &d->loops[d->next_loop++ % d->nloops];
    pthread_mutex_lock(&l->mu);
    if (l->nfds == l->fds_cap) {
        size_t cap = l->fds_cap ? 2 * l->fds_cap : 16;
        int *f = kw_realloc(l->fds, cap * sizeof *f);
        if (f == NULL) {
            pthread_mutex_unlock(&l->mu);
            close(fd); /* out of memory: the peer sees a hang-up */
            return;
        }
        l->fds = f;
        l->fds_cap = cap;
    }
    l->fds[l->nfds++] = fd;
    bool ok = wake(l);
    if (!ok)
        close(l->fds[--l->nfds]); /* that loop has ended */
    pthread_mutex_unlock(&l->mu);
}

void kw__loops_tell(kw__daemon *d, bool close_all)
{
    for (unsigned i = 0; i < d->nloops; i++) {
        kw__loop *l = &d->loops[i];
        pthread_mutex_lock(&l->mu);
        l->want_stop = true;
        l->want_close |= close_all;
        wake(l);
        pthread_mutex_unlock(&l->mu);
    }
}

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void kw__loops_join(kw__daemon *d, bool close_first)
{
    if (close_first)
        kw__loops_tell(d, true);
    for (unsigned i = 0; i < d->nloops; i++) {
        kw__loop *l = &d->loops[i];
        if (l->running) {
            pthread_join(l->thread, NULL);
        } else { /* set up, never run: close its handles here */
            uv_walk(&l->loop, close_handle, NULL);
            uv_run(&l->loop, UV_RUN_DEFAULT);
        }
        for (size_t k = 0; k < l->nfds; k++)
            close(l->fds[k]);
        free(l->fds);
        kw__hits_free(l);
        uv_loop_close(&l->loop);
        pthread_mutex_destroy(&l->mu);
        pthread_mutex_destroy(&l->out_mu);
    }
    free(d->loops);
    d->loops = NULL;
    d->nloops = 0;
}
