/* pool_internal.h: what pool.c and pool_worker.c share (not API).
 *
 * The pool's struct and the functions that start, talk to and end one
 * worker process.  Those run only on the thread that owns the slot (see
 * pool.c), or on start/stop when no caller can hold one.
 */
#ifndef KW_WARM_POOL_INTERNAL_H
#define KW_WARM_POOL_INTERNAL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pool.h"

/* One worker.  pid and fd belong to the caller that holds the slot (busy),
 * or to start/stop when no caller can; busy is guarded by kw__pool.mu. */
typedef struct kw__pool_slot {
    pid_t pid; /* -1: empty (a replacement failed, or stopped) */
    int fd;    /* the parent's end of the socketpair, -1 when empty */
    bool busy;
} kw__pool_slot;

struct kw__pool {
    char helper[PATH_MAX];
    unsigned jobs, timeout_ms;
    uint64_t mem_limit;
    int cancel_fd;            /* eventfd, readable once cancelled */
    _Atomic bool cancelled;
    _Atomic unsigned live;    /* workers running (stats and tests) */
    _Atomic uint64_t replaced; /* workers started after kw__pool_start() */
    bool started;             /* kw__pool_start() is done (start/stop only) */
    bool sync_init;           /* mu and cv initialised */
    pthread_mutex_t mu;       /* guards nfree, inside, slots[].busy */
    pthread_cond_t cv;        /* a slot freed, cancel, or inside fell */
    unsigned nfree;           /* slots not busy */
    unsigned inside;          /* threads inside kw__pool_compile() */
    kw__pool_slot slots[];
};

/* Monotonic milliseconds, for deadlines. */
uint64_t kw__pool_now_ms(void);

/* Writes "compile worker exceeded its memory limit (4 GiB)" into msg. */
void kw__pool_mem_msg(const kw__pool *p, char *msg, size_t cap);

/* Reads exactly len bytes of fd into buf before deadline (now_ms()).
 * Returns 0; KW__POOL_ECANCELED when the pool is cancelled first (checked
 * before the data, so a cancel is seen within one poll); KW__POOL_ETIMEOUT;
 * -EPIPE on EOF; or -errno. */
int kw__pool_recv_full(kw__pool *p, int fd, void *buf, size_t len,
                       uint64_t deadline);

/* Ends the worker of s, if any: closes its fd, gives it grace_ms to exit
 * by itself (0: none), then SIGKILLs and reaps it.  Stores its wait status
 * in *status when status is not NULL (0 when there was no worker). */
void kw__pool_slot_end(kw__pool *p, kw__pool_slot *s, unsigned grace_ms,
                       int *status);

/* Ends the worker of s after EOF on its pipe (eof: it closed its end, so
 * it is exiting) or a broken frame (!eof), and describes how it ended in
 * msg: "compile worker crashed (signal 6)", "... exited with status 3",
 * "... broke the pipe protocol", or the memory limit when it exited with
 * KW__POOL_EXIT_NOMEM.  Returns KW__POOL_EMEMLIMIT or KW__POOL_ECRASH. */
int kw__pool_slot_end_crashed(kw__pool *p, kw__pool_slot *s, bool eof,
                              char *msg, size_t cap);

/* Starts a worker in the empty slot s and waits for its HELLO.
 * Returns 0, KW__POOL_ECANCELED, or a failure code with msg set; on any
 * failure the slot is left empty and the child, if any, reaped. */
int kw__pool_slot_start(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap);

/* The two halves of kw__pool_slot_start(), so that kw__pool_start() can
 * spawn every worker before it waits for the first HELLO (workers load
 * NVRTC in parallel).  spawn returns 0 or -errno (msg set); hello returns
 * what kw__pool_slot_start() does and reaps the worker on failure. */
int kw__pool_slot_spawn(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap);
int kw__pool_slot_hello(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap);

#endif /* KW_WARM_POOL_INTERNAL_H */
