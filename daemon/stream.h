/* stream.h: one request's reply stream (kw__stream_; not API).
 *
 * Every request that is answered off the loop thread (keys, warmup, ls,
 * misses, a get that compiles...) gets one stream when it is admitted, in
 * the manner of redis's client output buffer.  The stream is the
 * request's budget: the bytes and frames its producers posted that the
 * socket has not yet taken (outbox plus libuv's write queue).  A producer
 * on a job thread parks in kw__stream_push() while the budget is full
 * (--max-output bytes, KW__STREAM_FRAMES frames); a warm callback, which
 * must not park warm's threads, posts with kw__stream_push_nowait() and
 * pauses its warm job instead, which the loop resumes once the socket
 * drained to half the budget.  The final frame's envelope and an error
 * frame of last resort are allocated with the stream, so the request
 * always ends with exactly one final frame, out of memory included.
 *
 * Threads: push, push_nowait, end and set_job on the producer's thread;
 * the rest on the loop thread.  mu guards bytes, frames, aborted, paused,
 * lost and job; refs and fin are the loop's (fin is filled by end()).
 */
#ifndef KW_DAEMON_STREAM_H
#define KW_DAEMON_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kw_queue.h"
#include "kw_warm.h"

#define KW__STREAM_FRAMES 256 /* frames in a stream's budget */

typedef struct kw__req kw__req;

/* A frame for a connection, or the end of its request, made on any thread
 * and handed to the loop thread by kw__daemon_post(). */
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
    bool aborted;         /* the connection closed: nothing more is sent */
    bool paused;          /* job was paused for the budget */
    bool lost;            /* a frame could not be posted: the final frame
                             is an ERROR that says so */
    kw_warm_job *job;     /* warmup: its warm job (released by the loop) */
    bool parked;          /* owner's producer yielded on a full budget and
                             left its job thread: the loop queues it
                             again once the socket drained */
    kw__req *owner;       /* the request (valid while it is parked) */
    int refs;             /* the request, and each charged write queued */
    kw__out fin;          /* the final frame's envelope */
    uint8_t *last_resort; /* an out-of-memory ERROR frame, made up front */
    size_t last_resort_len;
} kw__stream;

/* A new stream of owner with a budget of max_bytes; NULL when out of
 * memory. */
kw__stream *kw__stream_new(kw__req *owner, size_t max_bytes);

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

#endif /* KW_DAEMON_STREAM_H */
