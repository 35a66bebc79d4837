/* internal.h: the base of daemon/ (kw__daemon_, kw__audit_, kw__alloc_;
 * not API): kwarmd's shared state and what every layer uses.
 *
 * daemon/ is layered, each layer with its header, each file including
 * and calling only its own layer and those below (issue 23):
 *
 *   daemon.c, main.c       life cycle: start, serve, stop on a signal
 *   loops.h                the serving loops and the listener
 *                          (loops.c, listen.c)
 *   handlers.h             request handlers: the dispatcher (dispatch.c)
 *                          over the handlers of each request (requests.c,
 *                          warmup.c, admin.c, misses.c, heartbeat.c) and
 *                          their keys (reqkey.c)
 *   jobs.h                 job threads (jobs.c) and each request's reply
 *                          stream and the outbox (stream.c)
 *   conn.h                 connection and frame I/O: the serving loop's
 *                          state, connections, reads, writes, caps
 *                          (server.c, peer.c, hits.c)
 *   internal.h             this base: the daemon's state, the miss audit
 *                          (audit.c), the test allocation hook
 *                          (alloc_hook.c), metrics.h, log.h
 *
 * A lower layer reaches a higher one only through the function pointers
 * of kw__upcalls, which daemon.c fills in before anything runs.
 */
#ifndef KW_DAEMON_INTERNAL_H
#define KW_DAEMON_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include <pthread.h>
#include <stdatomic.h>

#include "kw_cache.h"
#include "kw_config.h"
#include "kw_daemon.h"
#include "kw_keys.h"
#include "kw_proto.h"
#include "kw_queue.h"
#include "kw_remote.h"
#include "kw_warm.h"

#define KW__FRAMES_PER_READ 16   /* requests parsed per read callback */
#define KW__FLUSH_MS 2000        /* cache hit flush period */
#define KW__JOB_THREADS 4        /* threads serving keys, warmup, stats, evict */
#define KW__DERIVE_SLOTS 2       /* keys and warmup requests deriving their
                                    keys at once (jobs.c); the rest wait
                                    their turn, queued, not refused */
#define KW__STOP_GRACE_MS 3000   /* after SIGTERM, connections still open
                                    then are closed whatever they wait on,
                                    unless a write completed within the
                                    last KW__STOP_GRACE_MS: */
#define KW__STOP_EXTEND_MS 1000  /* then checked again this much later, */
#define KW__STOP_MAX_MS 15000    /* up to this long after the signal (half
                                    systemd's TimeoutStopSec of 30 s) */
#define KW__STREAM_KEYS 256      /* keys or results per streamed frame */
#define KW__TRIM_KEYS 65536      /* a derivation this big trims the heap */
#define KW__STREAM_BYTES (256u * 1024u) /* JSON bytes per streamed frame, about */
#define KW__HEARTBEAT_MS 2000    /* a warmup silent this long gets an empty
                                    PROGRESS frame (heartbeat.c) */

/* The loop threads' counts for the metrics alone (metrics.c reads them;
 * written on the loops, read by any thread). */
#define KW__REQ_TYPES 11    /* KW_PROTO_PING (1) .. KW_PROTO_RESIZE (11) */
#define KW__GET_BUCKETS 14  /* get latency bounds (metrics.c), then +Inf */

/* What the loop thread counts for the metrics alone (written there, read
 * by any thread). */
typedef struct kw__metrics_counters {
    /* requests ended, by type - 1, [0] answered, [1] answered by an ERROR
     * frame (or a compiling get whose connection closed first) */
    _Atomic uint64_t requests[KW__REQ_TYPES][2];
    /* gets by seconds from dispatch to reply: per bucket, and the sum */
    _Atomic uint64_t get_buckets[KW__GET_BUCKETS + 1];
    _Atomic uint64_t get_ns;
} kw__metrics_counters;

typedef struct kw__conn kw__conn;   /* conn.h */
typedef struct kw__loop kw__loop;   /* conn.h */
typedef struct kw__hits kw__hits;   /* hits.c */
typedef struct kw__req kw__req;     /* jobs.h */

/* ---- the miss audit (audit.c) ---- */

#define KW__AUDIT_MAX 10000 /* misses kept, in memory and in the file */

/* One get that missed the local cache. */
typedef struct kw__miss {
    uint64_t t;        /* Unix seconds */
    uid_t uid;
    pid_t pid;
    kw_keys_key key;   /* the digest always; family, fields, arch when given */
    bool have_key;     /* the get named family, fields and arch */
    int outcome;       /* 0 not compiled, 1 compiled, 2 failed, 3 remote hit,
                          4 cancelled, 5 cached (a serving process's
                          miss this cache could answer) */
    int kind;          /* who missed (kw__audit_kind_name): 0 the cache (a
                          get kwarmd could not answer from it), 1 a serving
                          process's loaded set ("runtime"), 2 the same while
                          its stream captured a graph ("capture") */
} kw__miss;

typedef struct kw__audit {
    pthread_mutex_t mu; /* guards ring, next, n, added, written */
    pthread_mutex_t flush_mu; /* held by a flush: one at a time; guards
                                 lines */
    kw__miss *ring;     /* KW__AUDIT_MAX records */
    size_t next, n;
    uint64_t added, written;
    size_t lines;       /* lines in the file (flush work only) */
    char path[4200];    /* <cache>/misses.jsonl; "": memory only */
} kw__audit;

int kw__audit_open(kw__audit *a, const char *cache_dir, bool read_only);
void kw__audit_close(kw__audit *a);
/* Adds one record; any thread, O(1), no I/O. */
void kw__audit_add(kw__audit *a, const kw__miss *m);
/* Writes the new records to the file; off the loop thread only. */
void kw__audit_flush(kw__audit *a);
/* A copy (malloc'd, *out) of the records since `since`, oldest first. */
size_t kw__audit_snapshot(kw__audit *a, uint64_t since, kw__miss **out);
cJSON *kw__audit_json(const kw__miss *m);
/* "runtime" / "capture" for a kind a client reported, NULL for 0; and
 * back (-1 for a name that is neither). */
const char *kw__audit_kind_name(int kind);
int kw__audit_kind_from_name(const char *name);
const char *kw__audit_outcome_name(int outcome);
uint64_t kw__audit_now(void);

/* Reads {"family", "fields": {...}, "arch"} into k (digest computed);
 * 0, or KW_EINVAL with the field at fault in err (audit.c: the
 * form of a get's key, and of the audit file's records). */
int kw__key_from_json(const cJSON *h, kw_keys_key *k, char *err, size_t errlen);


/* The allocation-failure test hook (alloc_hook.c): KWARMD_TEST_FAIL_ALLOC=TYPE
 * ("stats", "ping", ...) makes every cJSON allocation fail while a thread
 * serves a request of that type, until its error frame is made.  Read
 * once at start (kw__alloc_hook_init). */
extern _Thread_local bool kw__alloc_fail;
extern uint16_t kw__alloc_fail_type;
void kw__alloc_hook_init(void);
/* The test hook's request ended: records whether its failure happened,
 * and disarms it. */
struct kw__daemon;
void kw__alloc_hook_done(struct kw__daemon *d);
/* KWARMD_TEST_ALLOC_HOOK: arms the N-th-allocation failure for a request
 * whose header asks for it ("test_fail_alloc": N); true when armed. */
bool kw__alloc_hook_arm(struct kw__daemon *d, const cJSON *header);

/* The calls a lower layer makes up into a higher one, as function
 * pointers (set by daemon.c before the loops start, read-only after), so
 * that no file calls upward: the connection layer hands each parsed
 * request to the dispatcher and tells it when the connection of an
 * active request closed; a job thread runs a request's handler (or, once
 * the threads are stopping, refuses it); the outbox ends a request after
 * its final frame. */
typedef struct kw__upcalls {
    /* Serves one parsed request of c (loop thread): answers at once, or
     * makes a request that c->active holds until it ends. */
    void (*dispatch)(kw__conn *c, const kw_msg *m);
    /* c closed while r was active (loop thread): r stops what it can. */
    void (*abort)(kw__req *r);
    /* Runs r's handler on a job thread, or answers "kwarmd is stopping"
     * when refuse. */
    void (*run)(kw__req *r, bool refuse);
    /* Ends r after its final frame (loop thread): frees it. */
    void (*end)(kw__req *r);
} kw__upcalls;

/* The daemon: everything shared lives here and travels by pointer (no
 * globals).  The main loop's fields are its thread's alone; the rest is
 * guarded by warm, the cache, the job queue, or is _Atomic. */
typedef struct kw__daemon {
    const kw_daemon_opts *opts;
    kw__upcalls up;     /* set once before the loops start */
    uv_loop_t loop;     /* the main loop: listener, signals, timers */
    uv_pipe_t listener;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t flush_timer;
    bool flushing;      /* a flush is queued or running (main loop's) */
    kw__loop *loops;    /* --loops serving loops */
    unsigned nloops, next_loop;
    uv_async_t loop_done; /* a serving loop ended (after a stop) */
    pthread_mutex_t done_mu; /* guards nloops_done, and loop_done's closing */
    unsigned nloops_done;
    kw_cache *cache;    /* opened and closed by daemon.c, its owner */
    bool read_only;     /* the cache opened read-only (set before serving) */
    kw_remote *remote; /* fleet tier, or NULL; thread-safe itself */
    kw_warm *warm;     /* the warm pipeline; thread-safe itself */
    kw__audit audit;   /* gets that missed; thread-safe itself */
    /* Job threads (jobs.c).  job_mu guards job_q, derive_q, nderiving,
     * jobs_stopping. */
    pthread_t job_threads[KW__JOB_THREADS];
    unsigned njob_threads;
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv;
    kw_queue job_q;     /* of kw__req, by jnode */
    kw_queue derive_q;  /* requests waiting for a derivation slot, by jnode */
    unsigned nderiving; /* handlers deriving now (KW__DERIVE_SLOTS) */
    bool jobs_stopping;
    uv_timer_t stop_timer; /* the SIGTERM grace period */
    uint64_t stop_at;      /* uv_now() of the signal */
    bool stopped;          /* the final close ran */
    bool test_peercred_fail; /* KWARMD_TEST_PEERCRED_FAIL: tests only */
    bool alloc_hook;         /* KWARMD_TEST_ALLOC_HOOK: tests only */
    uint64_t alloc_at_stop;  /* KWARMD_TEST_ALLOC_AT_STOP: tests only */
    int flush_ev_fd, flush_hold_fd; /* KWARMD_TEST_FLUSH_FIFOS: tests only;
                                       -1 without */
    _Atomic bool alloc_fired; /* the last armed request's failure happened */
    _Atomic bool warned_max_conn; /* the connection cap was logged, not
                                     yet cleared */
    int remote_down;       /* the fleet tier's state last logged; -1: none */
    _Atomic uint64_t refused_full; /* connections refused for the cap */
    _Atomic size_t nheld;          /* held reads over all loops */
    _Atomic uint64_t held_expired; /* connections closed for one */
    _Atomic uint64_t held_copied;  /* replies copied out: the cap was full */
    _Atomic uint64_t last_write_ms; /* uv_now() of the last write completed
                                       on any loop (one clock): the stop
                                       grace extends while it is recent */
    _Atomic size_t nconns; /* open connections over all loops */
    _Atomic uint64_t keys_in_flight; /* keys of requests not yet over
                                        (--max-keys-in-flight) */
    _Atomic uint64_t refused_keys;   /* requests refused for that budget */
    _Atomic size_t stream_bytes;     /* posted by every stream, not yet
                                        written (KW__STREAMS_TOTAL) */
    bool stopping;         /* the main loop's: a signal came */
    bool listening;
    bool bound; /* we created the socket file (not systemd) */
    int lock_fd; /* <cache>/kwarmd.lock, write-locked while we run */
    _Atomic uint64_t requests, protocol_errors, refused; /* metrics read them */
    kw__metrics_counters mc; /* the loop's counts for the metrics */
    struct MHD_Daemon *httpd; /* --metrics-listen's server, or NULL */
    uint64_t requests_at_tick, requests_trimmed; /* idle detection for trims */
    char version[32];
} kw__daemon;

#endif /* KW_DAEMON_INTERNAL_H */
