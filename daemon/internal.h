/* internal.h: kwarmd's shared state (kw__daemon_, kw__conn_; not API). */
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
#include "metrics.h"
#include "stream.h"

#define KW__FRAMES_PER_READ 16   /* requests parsed per read callback */
#define KW__FLUSH_MS 2000        /* cache hit flush period */
#define KW__JOB_THREADS 4        /* threads serving keys, warmup, stats, evict */
#define KW__STOP_GRACE_MS 3000   /* after SIGTERM, connections still open
                                    then are closed whatever they wait on */
#define KW__STREAM_KEYS 256      /* keys or results per streamed frame */
#define KW__TRIM_KEYS 65536      /* a derivation this big trims the heap */
#define KW__STREAM_BYTES (256u * 1024u) /* JSON bytes per streamed frame, about */
#define KW__HEARTBEAT_MS 2000    /* a warmup silent this long gets an empty
                                    PROGRESS frame (heartbeat.c) */

typedef struct kw__conn kw__conn;
typedef struct kw__loop kw__loop;
typedef struct kw__hits kw__hits;
struct write_req; /* server.c's */

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
 * 0, or KW_EINVAL with the field at fault in err (handlers.c). */
int kw__key_from_json(const cJSON *h, kw_keys_key *k, char *err, size_t errlen);

/* A loop thread that serves connections (--loops of them, loops.c).  The
 * main loop accepts each peer and hands its socket to the loops in turn;
 * from then on the connection, its requests and its writes live on that
 * loop alone.  Loop thread only, except what mu and out_mu guard. */
struct kw__loop {
    struct kw__daemon *d;
    uv_loop_t loop;
    pthread_t thread;
    bool running;       /* the thread was started (joined at the end) */
    /* wake: the main loop's requests.  mu guards fds, nfds, fds_cap,
     * want_stop, want_close and closed (wake is not sent once closed). */
    uv_async_t wake;
    pthread_mutex_t mu;
    int *fds;           /* accepted sockets to take */
    size_t nfds, fds_cap;
    bool want_stop, want_close, closed;
    uv_idle_t resume;   /* runs connections whose buffer still holds frames */
    kw__conn *backlog;  /* those connections, linked through next_backlog */
    /* The outbox: frames from job and warm threads.  out_mu guards
     * outq; outbox wakes the loop, which drains it whole. */
    uv_async_t outbox;
    pthread_mutex_t out_mu;
    kw_queue outq;      /* of kw__out, by node */
    /* Replies written straight from the cache's map, each holding a read
     * transaction until its write ends (server.c): oldest first, at most
     * --max-held-reads over all loops, none older than
     * --held-read-timeout (held_timer closes the connection of one that
     * is). */
    uv_timer_t held_timer;
    struct write_req *held_head, *held_tail;
    _Atomic size_t nheld;
    kw__hits *hits;     /* reply headers of recent hits (hits.c), or NULL */
    uv_timer_t heartbeat; /* runs while nwarmups > 0 (heartbeat.c) */
    size_t nwarmups;    /* warmup requests of this loop not yet over */
    kw__conn *conns;    /* this loop's open connections */
    size_t nreqs;       /* requests on them not yet over */
    bool stopping;      /* told to stop: serve what is under way, then end */
    bool done;          /* its handles are closing: the loop ends */
};

/* The daemon: everything shared lives here and travels by pointer (no
 * globals).  The main loop's fields are its thread's alone; the rest is
 * guarded by warm, the cache, the job queue, or is _Atomic. */
typedef struct kw__daemon {
    const kw_daemon_opts *opts;
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
    kw_cache *cache;
    kw_remote *remote; /* fleet tier, or NULL; thread-safe itself */
    kw_warm *warm;     /* the warm pipeline; thread-safe itself */
    kw__audit audit;   /* gets that missed; thread-safe itself */
    /* Job threads (jobs.c).  job_mu guards job_q, jobs_stopping. */
    pthread_t job_threads[KW__JOB_THREADS];
    unsigned njob_threads;
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv;
    kw_queue job_q;     /* of kw__req, by jnode */
    bool jobs_stopping;
    uv_timer_t stop_timer; /* the SIGTERM grace period */
    uint64_t stop_at;      /* uv_now() of the signal */
    bool stopped;          /* the final close ran */
    bool test_peercred_fail; /* KWARMD_TEST_PEERCRED_FAIL: tests only */
    bool alloc_hook;         /* KWARMD_TEST_ALLOC_HOOK: tests only */
    uint64_t alloc_at_stop;  /* KWARMD_TEST_ALLOC_AT_STOP: tests only */
    _Atomic bool alloc_fired; /* the last armed request's failure happened */
    _Atomic bool warned_max_conn; /* the connection cap was logged, not
                                     yet cleared */
    int remote_down;       /* the fleet tier's state last logged; -1: none */
    _Atomic uint64_t refused_full; /* connections refused for the cap */
    _Atomic size_t nheld;          /* held reads over all loops */
    _Atomic uint64_t held_expired; /* connections closed for one */
    _Atomic uint64_t held_copied;  /* replies copied out: the cap was full */
    _Atomic size_t nconns; /* open connections over all loops */
    _Atomic uint64_t keys_in_flight; /* keys of requests not yet over
                                        (--max-keys-in-flight) */
    _Atomic uint64_t refused_keys;   /* requests refused for that budget */
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

/* One request being served off the loop thread (keys, warmup, stats,
 * evict) or waiting on a compile (get).  Created and ended on the loop
 * thread; in between it belongs to the job thread running it, then to
 * warm's callbacks, which warm serializes. */
struct kw__req {
    kw__daemon *d;
    kw__conn *conn;    /* holds a reference until the request ends */
    uint16_t type;
    cJSON *header;     /* the request's JSON, owned */
    kw_queue_node jnode; /* in the job queue */
    kw_warm_job *job;  /* get: the warm job (loop thread; released at the end) */
    kw__stream *s;     /* its reply stream (stream.h), made when admitted */
    void *state;       /* a yielding handler's state between runs */
    void (*state_free)(void *state); /* frees it (at the request's end) */
    size_t keys_charged; /* keys counted in d->keys_in_flight (set by the
                            job thread, released by the loop at the end) */
    bool failed;       /* answered by an ERROR frame (the metrics) */
    bool alloc_armed;  /* the test hook was armed for it (disarmed at end) */
    _Atomic bool aborted; /* the connection closed: stop what can stop */
    double t0;
    /* warmup: its keys and what streamed so far */
    kw_keys_set set;
    size_t count[KW_WARM_CANCELLED + 1]; /* results by kw_warm_status */
    cJSON *batch;      /* results not yet sent */
    size_t batch_n, batch_bytes;
    bool pin_failed;   /* "pin" asked, but the set was not recorded */
    bool pin_stage;    /* every result is in: a job thread pins, ends it */
    /* warmup's heartbeat (heartbeat.c): frames posted and not yet sent,
     * "done" of the last PROGRESS built, the key count once the keys went
     * to warm (0 before), and (loop thread) uv_now() of the last frame */
    _Atomic size_t hb_pending, hb_done, hb_total;
    uint64_t hb_last;
    /* get: the key, the kind of miss the client says it is (kw__miss),
     * and its compile's outcome */
    kw_keys_key key;
    int miss_kind;
    kw_warm_status status;
    int rc;
    char *log;
    /* the peer, for log lines */
    uid_t uid;
    pid_t pid;
    char text_config[KW_PROTO_ESCAPE_CAP]; /* warmup: where the settings
                                              were found, escaped */
    /* stats: the loop's counters when it was asked */
    size_t nconns;
    uint64_t requests, protocol_errors, refused, refused_full;
};

/* Streams one PROGRESS frame with header h for r (any producer thread
 * but warm's: it parks while r's stream is over its budget).  Returns 0,
 * -ECANCELED (the client left: stop producing) or KW_ENOMEM (the frame
 * is lost; r's final frame will be an ERROR). */
int kw__req_progress(kw__req *r, const cJSON *h);

/* The same for a handler that yields: never waits; returns 1 when the
 * budget is full after this frame (the handler returns, keeping its
 * state, and is run again once the socket drained). */
int kw__req_progress_yield(kw__req *r, const cJSON *h);

/* The same from a warm callback: never parks; pauses r's warm job once
 * the stream's budget is full (resumed when the socket drains). */
int kw__req_progress_nowait(kw__req *r, const cJSON *h);

/* Ends r with a frame of type and header h (h NULL, or one that cannot
 * be encoded: an out-of-memory ERROR).  Never allocates past encoding,
 * never parks: exactly one final frame per request. */
void kw__req_finish(kw__req *r, uint16_t type, const cJSON *h);

/* Ends r with an ERROR frame (msg NULL: kw_strerror(code)).  An ERROR is
 * always final. */
void kw__req_error(kw__req *r, int code, const char *msg);

/* Charges n keys of r against the daemon-wide --max-keys-in-flight; 0,
 * or -EBUSY with a message naming the budget in err. */
int kw__req_charge_keys(kw__req *r, size_t n, char *err, size_t errlen);

/* Derives the keys of a keys or warmup request's model and deployment;
 * 0, or a code with the message in err (requests.c). */
int kw__req_keys(const cJSON *h, kw_config_model *m, kw_config_deploy *d,
                 kw_keys_set *set, char *err, size_t errlen);

/* Reads the key of a get or evict request ({"digest"} or family, fields
 * and arch) into digest; 0 or KW_EINVAL with the message in err. */
int kw__req_digest(kw_cache *c, const cJSON *h, uint8_t digest[KW_KEYS_DIGEST_LEN],
                   char *err, size_t errlen);

/* A derived key set packed for streaming (keypack.c): 66 bytes a key
 * instead of 152, in the set's own buffer. */
typedef struct kw__keypack {
    uint8_t *buf;      /* packed keys, or NULL */
    kw_keys_key *keys; /* the set as it was, when a key does not pack */
    size_t n;
    char archs[KW_CONFIG_MAX_ARCH][KW_CONFIG_ARCH_LEN];
    size_t narchs;
} kw__keypack;

/* Takes set's keys into p (set is left empty). */
void kw__keypack_take(kw__keypack *p, kw_keys_set *set);
/* Unpacks key i, whose packed bytes start at off (0 for the first), into
 * k; returns where key i + 1 starts.  Keys are read in order. */
size_t kw__keypack_next(const kw__keypack *p, size_t i, size_t off,
                        kw_keys_key *k);
void kw__keypack_free(kw__keypack *p);

/* The job handlers (requests.c, warmup.c), on a job thread. */
/* keys and ls stream with yields: they return true when they yielded
 * (their state in r->state), and are run again to go on. */
bool kw__run_keys(kw__req *r);
bool kw__run_ls(kw__req *r);
void kw__run_stats(kw__req *r);
void kw__run_evict(kw__req *r);
void kw__run_warmup(kw__req *r);
void kw__run_misses(kw__req *r);
void kw__run_pins(kw__req *r);
void kw__run_unpin(kw__req *r);
void kw__run_resize(kw__req *r);
/* evict {"match": {...}, "force"?} (admin.c); kw__run_evict hands over. */
void kw__run_evict_match(kw__req *r, const cJSON *match);

/* A client connection.  Freed in the uv_close callback of its pipe, once
 * no compile still holds a reference to it (refs). */
struct kw__conn {
    uv_pipe_t pipe; /* first: the handle's data is this conn */
    uv_timer_t idle;
    kw__daemon *d;
    kw__loop *l;    /* the loop that serves it */
    kw__conn *next, *prev;
    uint8_t *buf; /* bytes received, not yet parsed; cap KW_PROTO_MAX_REQUEST */
    size_t len;
    kw__req *active; /* the request under way, reading paused meanwhile */
    int refs;        /* writes and requests not yet over */
    int handles;     /* uv handles not yet closed (pipe, timer) */
    kw__conn *next_backlog;
    void *spare;      /* a reply buffer to reuse (no malloc/page faults per get) */
    size_t spare_cap;
    size_t queued;    /* reply bytes handed to uv_write, not yet written */
    uint64_t progress_at; /* uv_now() of the last write done (or start) */
    bool closing;
    bool reading;     /* uv_read_start in effect */
    bool throttled;   /* queued passed --max-output: reading stopped */
    bool refusing;    /* refused: an error frame out, input drained */
    bool broken;      /* a frame broke the protocol: its ERROR frame is
                         out, nothing more is read or served; it closes
                         once that frame is written */
    bool in_backlog;
    uid_t uid;
    gid_t gid;
    pid_t pid;        /* the peer's, at connect (SO_PEERCRED) */
};

/* Hands out to the loop thread: its frame is sent (unless the connection
 * closed meanwhile), then, when out->done, the request ends.  Any thread;
 * takes out (malloc'd, or the stream's fin when done) and its frame. */
void kw__daemon_post(kw__out *out);

/* Called by server.c on the loop thread when the connection of an active
 * request closes: the request stops what it can (handlers.c). */
void kw__daemon_request_abort(kw__req *r);

/* Ends request r on the loop thread: frees it, resumes its connection
 * (handlers.c frees; server.c resumes). */
void kw__daemon_request_end(kw__req *r);

/* The connection a request answers, and its daemon. */
kw__conn *kw__req_conn(const kw__req *r);

/* The allocation-failure test hook (jobs.c): KWARMD_TEST_FAIL_ALLOC=TYPE
 * ("stats", "ping", ...) makes every cJSON allocation fail while a thread
 * serves a request of that type, until its error frame is made.  Read
 * once at start (kw__alloc_hook_init). */
extern _Thread_local bool kw__alloc_fail;
extern uint16_t kw__alloc_fail_type;
void kw__alloc_hook_init(void);
/* The test hook's request ended: records whether its failure happened,
 * and disarms it (jobs.c). */
void kw__alloc_hook_done(kw__daemon *d);

/* Job threads (jobs.c): start; queue a request (its handler runs there;
 * once cancelled, it is answered "kwarmd is stopping" at once); cancel
 * (requests still queued are answered so, without waiting); stop (cancel,
 * then join: every request taken has posted its end by then). */
int kw__jobs_start(kw__daemon *d);
void kw__jobs_push(kw__daemon *d, kw__req *r);
void kw__jobs_cancel(kw__daemon *d);
void kw__jobs_stop(kw__daemon *d);

/* Runs request r on a job thread (handlers.c).  True when its handler
 * yielded on a full stream budget (the request goes on: see
 * kw__stream_park); false when it is over or left to warm. */
bool kw__daemon_run_job(kw__req *r);

/* Answers r with the daemon is stopping, from a job thread. */
void kw__daemon_refuse_job(kw__req *r);

/* Called on a serving loop when a request ended or a connection closed,
 * to end that loop once it is stopping and nothing is left (loops.c). */
void kw__loop_check_stop(kw__loop *l);

/* Starts the --loops serving loops (threads); 0 or a code with err. */
int kw__loops_start(kw__daemon *d, char *err, size_t errlen);
/* Hands an accepted socket to the next loop (main loop). */
void kw__loops_hand(kw__daemon *d, int fd);
/* Tells every loop to stop (close_all: to close every connection now). */
void kw__loops_tell(kw__daemon *d, bool close_all);
/* Joins the loop threads and closes their loops (after a stop, or to undo
 * a failed start: close_first tells them to stop). */
void kw__loops_join(kw__daemon *d, bool close_first);
/* Takes the accepted socket fd on loop l (listen.c): credentials, the
 * allowlist, the connection cap, then serving. */
void kw__loop_take(kw__loop *l, int fd);

/* Initialises l's outbox (listen.c). */
int kw__loop_outbox_init(kw__loop *l);

/* A new connection of loop l (handles initialised, socket not yet
 * opened), counted in d->nconns; NULL when out of memory. */
kw__conn *kw__conn_new(kw__loop *l);

/* Starts serving an accepted c: its idle timer (idle_ms) and reading. */
void kw__conn_start(kw__conn *c, unsigned idle_ms);

/* Refuses c: one error frame, our side shut down, its input drained and
 * dropped until it closes or the idle timer ends it, so the peer reads
 * the reason instead of a reset. */
void kw__conn_refuse(kw__conn *c, int code, const char *msg);

/* Sends an encoded frame (owned) to c; close_after closes c once it is
 * written. */
void kw__conn_send_frame(kw__conn *c, uint8_t *frame, size_t len,
                         bool close_after);

/* The same for a frame charged to stream s: uncharged once written or
 * dropped (kw__stream_uncharge). */
void kw__conn_send_charged(kw__conn *c, uint8_t *frame, size_t len,
                           bool close_after, kw__stream *s);

/* Sends one frame to c (header encoded, payload copied into the frame). */
void kw__conn_send(kw__conn *c, uint16_t type, const cJSON *header,
                   const void *payload, size_t payload_len);

/* Sends a frame whose prefix (head and JSON header, len bytes) is frame
 * and whose payload is v's bytes, written from the cache's map without a
 * copy; takes v (released once written, or at once when the socket takes
 * the whole frame; see held_timer) and, when owned, frame (else it is
 * copied if the reply must wait). */
void kw__conn_send_view_frame(kw__conn *c, const uint8_t *frame, size_t len,
                              bool owned, kw_cache_view *v);
/* held_timer's callback (server.c). */
void kw__held_check(uv_timer_t *t);

/* Sends an ERROR frame {"error", "code"} for code and message. */
void kw__conn_error(kw__conn *c, int code, const char *msg, bool close_after);

/* Closes c (idempotent); it is freed once its handles and refs are gone. */
void kw__conn_close(kw__conn *c);

/* Makes r c's active request (reading pauses) and takes a reference on c
 * that kw__conn_unref() drops when the request ends. */
void kw__conn_begin(kw__conn *c, kw__req *r);

/* Called when the active request finished: resumes reading and parsing. */
void kw__conn_request_done(kw__conn *c);

/* Drops one compile reference taken on c; frees it if it was closing. */
void kw__conn_unref(kw__conn *c);

/* Serves one parsed request (handlers.c).  Either answers at once, or sets
 * c->active and answers later, calling kw__conn_request_done(). */
void kw__daemon_dispatch(kw__conn *c, const kw_msg *m);

/* The encoded reply header of a hit on the entry digest with metadata
 * info and size bytes, when l made one before (NULL: none; *len its
 * length); put keeps a copy of one; free drops them all (hits.c). */
const uint8_t *kw__hits_get(kw__loop *l, const uint8_t *digest,
                            const kw_cache_info *info, uint64_t size,
                            size_t *len);
void kw__hits_put(kw__loop *l, const uint8_t *digest, const kw_cache_info *info,
                  uint64_t size, const uint8_t *frame, size_t len);
void kw__hits_free(kw__loop *l);

/* Heartbeats of silent warmups (heartbeat.c), on the loop thread: init
 * sets up l's timer (closed with the loop's handles); begin and end
 * bracket a warmup request; delivered is called for each of r's posted
 * items as the loop takes it (kw__daemon_post counts them in). */
void kw__heartbeat_init(kw__loop *l);
void kw__heartbeat_begin(kw__req *r);
void kw__heartbeat_end(kw__req *r);
void kw__heartbeat_delivered(kw__req *r);

/* Initialises the backlog machinery (a uv_idle_t) of loop l. */
void kw__loop_backlog_init(kw__loop *l);

/* Starts listening: the systemd socket or a new one at opts->socket_path. */
int kw__daemon_listen(kw__daemon *d, char *err, size_t errlen);

#endif /* KW_DAEMON_INTERNAL_H */
