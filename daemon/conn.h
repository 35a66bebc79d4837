/* conn.h: daemon/'s connection and frame I/O layer (kw__conn_, kw__loop_,
 * kw__hits_; not API): a serving loop's state, its connections, their
 * reads, framing, writes and caps (server.c), taking an accepted peer
 * (peer.c), and the reply headers of recent hits (hits.c).  Above the
 * base (internal.h) only; the request a connection serves is opaque here
 * (c->active), and reaches the handlers through d->up.
 */
#ifndef KW_DAEMON_CONN_H
#define KW_DAEMON_CONN_H

#include "internal.h"

struct write_req; /* server.c's */

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

/* Takes the accepted socket fd on loop l (peer.c): credentials, the
 * allowlist, the connection cap, then serving. */
void kw__loop_take(kw__loop *l, int fd);

/* Called on a serving loop when a request ended or a connection closed,
 * to end that loop once it is stopping and nothing is left: closes the
 * loop's handles, so that uv_run returns (server.c). */
void kw__loop_check_stop(kw__loop *l);

/* Initialises the backlog machinery (a uv_idle_t) of loop l. */
void kw__loop_backlog_init(kw__loop *l);

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

/* Called once for a frame of len bytes sent with kw__conn_send_then,
 * when it was written or dropped (loop thread). */
typedef void (*kw__conn_done_fn)(void *arg, size_t len);

/* The same, calling done(arg, len) once the frame is written or dropped
 * (a stream's budget: jobs.h). */
void kw__conn_send_then(kw__conn *c, uint8_t *frame, size_t len,
                        bool close_after, kw__conn_done_fn done, void *arg);

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

/* Drops one reference taken on c; frees it if it was closing. */
void kw__conn_unref(kw__conn *c);

/* The encoded reply header of a hit on the entry digest with metadata
 * info and size bytes, when l made one before (NULL: none; *len its
 * length); put keeps a copy of one; free drops them all (hits.c). */
const uint8_t *kw__hits_get(kw__loop *l, const uint8_t *digest,
                            const kw_cache_info *info, uint64_t size,
                            size_t *len);
void kw__hits_put(kw__loop *l, const uint8_t *digest, const kw_cache_info *info,
                  uint64_t size, const uint8_t *frame, size_t len);
void kw__hits_free(kw__loop *l);

#endif /* KW_DAEMON_CONN_H */
