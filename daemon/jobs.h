/* jobs.h: daemon/'s layer of job threads and reply streams (kw__jobs_,
 * kw__stream_, kw__req_; not API), above the connection layer (conn.h).
 *
 * A request answered off the loop thread (kw__req) runs on a job thread
 * (jobs.c) and streams its reply through one stream (stream.c), in the
 * manner of redis's client output buffer: made when the request is
 * admitted, it is the request's budget, the bytes and frames its
 * producers posted that the socket has not yet taken (the loop's outbox
 * plus libuv's write queue).  A producer on a job thread parks in
 * kw__stream_push() while the budget is full (--max-output bytes,
 * KW__STREAM_FRAMES frames), or yields its thread
 * (kw__stream_push_nowait(), kw__stream_park()); a warm callback, which
 * must not park warm's threads, pauses its warm job instead, which the
 * loop resumes once the socket drained to half the budget.  The final
 * frame's envelope and an error frame of last resort are allocated with
 * the stream, so the request always ends with exactly one final frame,
 * out of memory included.  Frames made off a loop reach it through the
 * loop's outbox (kw__stream_post): a mutex-protected queue plus one
 * uv_async_t whose callback drains it whole.
 *
 * Threads: push, push_nowait, end and the kw__req_ producers on the
 * producer's thread; the rest on the loop thread.  A stream's mu guards
 * bytes, frames, aborted, paused, lost, parked and job; refs and fin are
 * the loop's (fin is filled by end()).
 */
#ifndef KW_DAEMON_JOBS_H
#define KW_DAEMON_JOBS_H

#include "conn.h"

#define KW__STREAM_FRAMES 256 /* frames in a stream's budget */

/* A frame for a connection, or the end of its request, made on any thread
 * and handed to the loop thread by kw__stream_post(). */
typedef struct kw__out {
    kw_queue_node node; /* in the loop's outbox */
    kw__req *req;       /* the request it belongs to */
    uint8_t *frame;     /* an encoded frame (owned), or NULL */
    size_t len;
    bool done;          /* the request is over after this (the stream's
                           fin: never freed by itself) */
    bool charged;       /* counted in the stream's budget */
    /* Runs on the loop thread before the request ends (done only); for a
     * get, which answers from the cache on the loop. */
    void (*on_loop)(kw__req *r);
} kw__out;

typedef struct kw__stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* the budget has room again, or aborted */
    size_t bytes, frames; /* posted, not yet written or dropped */
    size_t max_bytes;     /* --max-output */
    _Atomic size_t *total; /* bytes posted, not written, of every stream */
    size_t max_total;     /* their budget (KW__STREAMS_TOTAL) */
    bool aborted;         /* the connection closed: nothing more is sent */
    bool paused;          /* job was paused for the budget */
    bool lost;            /* a frame could not be posted: the final frame
                             is an ERROR that says so */
    kw_warm_job *job;     /* warmup: its warm job (released by the loop) */
    bool detached;        /* warmup "detach": an abort leaves job running
                             (resumed if paused); set before job */
    bool parked;          /* owner's producer yielded on a full budget and
                             left its job thread: the loop queues it
                             again once the socket drained */
    kw__req *owner;       /* the request (valid while it is parked) */
    int refs;             /* the request, and each charged write queued */
    kw__out fin;          /* the final frame's envelope */
    uint8_t *last_resort; /* an out-of-memory ERROR frame, made up front */
    size_t last_resort_len;
} kw__stream;

/* The streams' budget together, over the daemon: --max-output again.  A
 * stream is also full while all of them hold that much, so unread
 * streams do not add up to a budget each (eight unread 480,000-key keys
 * streams settled at +67 MB with twice it, at the defaults); it may still
 * post one frame when it has none in flight, so every stream whose
 * client reads goes on (a frame at a time, while others hold the total). */
#define KW__STREAMS_TOTAL(max_output) ((size_t)(max_output))

/* A new stream of owner with a budget of max_bytes, charged also to
 * *total (the daemon's, with a budget of max_total); NULL when out of
 * memory. */
kw__stream *kw__stream_new(kw__req *owner, size_t max_bytes,
                           _Atomic size_t *total, size_t max_total);

/* Posts a non-final frame (owned) of r, parking while the budget is full.
 * Returns 0; -ECANCELED (the connection closed: frame dropped, stop
 * producing); or KW_ENOMEM (frame lost, the final frame becomes an
 * ERROR). */
int kw__stream_push(kw__req *r, uint8_t *frame, size_t len);

/* As push, but never waits: returns 1 when the budget is now full, so
 * that the caller yields (a job: see kw__stream_park) or pauses what
 * produces (warm: see kw__stream_pause_job). */
int kw__stream_push_nowait(kw__req *r, uint8_t *frame, size_t len);

/* A job thread whose handler yielded on r's full budget: true when the
 * budget has room again (or the client left), so the handler is run again
 * at once; else r is parked and the loop queues it again when the socket
 * has drained to half the budget (kw__stream_uncharge).  Either way no job
 * thread waits for a slow client. */
bool kw__stream_park(kw__req *r);

/* Pauses r's warm job until the loop drains its stream (warm callback). */
void kw__stream_pause_job(kw__req *r);

/* Posts r's final frame (owned; NULL: encoding failed, the error frame of
 * last resort goes instead, unless on_loop, which then answers on the
 * loop), with on_loop (may be NULL).  Never
 * allocates and never parks.  When a frame was lost before, the frame is
 * replaced by an ERROR saying so. */
void kw__stream_end(kw__req *r, uint8_t *frame, size_t len,
                    void (*on_loop)(kw__req *r));

/* Loop thread: a charged frame of len bytes was written or dropped. */
void kw__stream_uncharge(kw__stream *s, size_t len);

/* Loop thread: the connection closed; wakes parked producers. */
void kw__stream_abort(kw__stream *s);

/* Loop thread: drops a reference (the request's, at its end). */
void kw__stream_unref(kw__stream *s);

/* True when the stream's producer lost a frame or the connection left. */
bool kw__stream_lost(kw__stream *s);


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
    kw__stream *s;     /* its reply stream (above), made when admitted */
    void *state;       /* a yielding handler's state between runs */
    void (*state_free)(void *state); /* frees it (at the request's end) */
    size_t keys_charged; /* keys counted in d->keys_in_flight (set by the
                            job thread, released by the loop at the end) */
    bool failed;       /* answered by an ERROR frame (the metrics) */
    bool alloc_armed;  /* the test hook was armed for it (disarmed at end) */
    _Atomic bool aborted; /* the connection closed: stop what can stop */
    double t0;
    /* warmup: its keys and what streamed so far */
    kw_keys_packed set; /* packed; warm's once submitted (n stays) */
    size_t count[KW_WARM_CANCELLED + 1]; /* results by kw_warm_status */
    cJSON *batch;      /* results not yet sent */
    size_t batch_n, batch_bytes;
    bool pin_failed;   /* "pin" asked, but the set was not recorded */
    size_t unstored;   /* compiled, but no room to store: said once, at the
                          end (log_warmup), not per key */
    char unstored_why[256]; /* the first such key's reason */
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

/* Loop l's outbox (stream.c): init sets it up (closed with the loop's
 * handles); post hands out to the loop thread: its frame is sent (unless
 * the connection closed meanwhile), then, when out->done, the request
 * ends (d->up.end).  post: any thread; takes out (malloc'd, or the
 * stream's fin when done) and its frame. */
int kw__loop_outbox_init(kw__loop *l);
void kw__stream_post(kw__out *out);

/* Job threads (jobs.c): start; queue a request (d->up.run runs it there;
 * once cancelled, it is refused at once, "kwarmd is stopping"); cancel
 * (requests still queued are refused so, without waiting); stop (cancel,
 * then join: every request taken has posted its end by then). */
int kw__jobs_start(kw__daemon *d);
void kw__jobs_push(kw__daemon *d, kw__req *r);
void kw__jobs_cancel(kw__daemon *d);
void kw__jobs_stop(kw__daemon *d);

#endif /* KW_DAEMON_JOBS_H */
