/* internal.h: kwarmd's shared state (kw__daemon_, kw__conn_; not API). */
#ifndef KW_DAEMON_INTERNAL_H
#define KW_DAEMON_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "compiler.h"
#include "kw_cache.h"
#include "kw_daemon.h"
#include "kw_proto.h"
#include "kw_remote.h"

#define KW__FRAMES_PER_READ 16   /* requests parsed per read callback */
#define KW__FLUSH_MS 2000        /* cache hit flush period */

typedef struct kw__conn kw__conn;

/* The daemon: everything lives here and travels by pointer (no globals).
 * Loop thread only, except what the compiler and cache guard themselves. */
typedef struct kw__daemon {
    const kw_daemon_opts *opts;
    uv_loop_t loop;
    uv_pipe_t listener;
    uv_signal_t sigterm, sigint;
    uv_timer_t flush_timer;
    uv_idle_t resume;   /* runs connections whose buffer still holds frames */
    kw__conn *backlog;  /* those connections, linked through next_backlog */
    kw_cache *cache;
    kw_remote *remote; /* fleet tier, or NULL; thread-safe itself */
    kw__compiler *compiler;
    kw__conn *conns; /* every open connection */
    size_t nconns;
    bool stopping;
    bool listening;
    bool bound; /* we created the socket file (not systemd) */
    int lock_fd; /* <cache>/kwarmd.lock, write-locked while we run */
    uint64_t requests, protocol_errors, refused;
    uint64_t requests_at_tick, requests_trimmed; /* idle detection for trims */
    char version[32];
} kw__daemon;

/* One request being served (one at a time per connection). */
typedef struct kw__req kw__req;

/* A client connection.  Freed in the uv_close callback of its pipe, once
 * no compile still holds a reference to it (refs). */
struct kw__conn {
    uv_pipe_t pipe; /* first: the handle's data is this conn */
    uv_timer_t idle;
    kw__daemon *d;
    kw__conn *next, *prev;
    uint8_t *buf; /* bytes received, not yet parsed; cap KW_PROTO_MAX_REQUEST */
    size_t len;
    kw__req *active; /* the request under way, reading paused meanwhile */
    int refs;        /* compile callbacks still to come */
    int handles;     /* uv handles not yet closed (pipe, timer) */
    kw__conn *next_backlog;
    void *spare;      /* a reply buffer to reuse (no malloc/page faults per get) */
    size_t spare_cap;
    bool closing;
    bool paused;
    bool in_backlog;
    uid_t uid;
    gid_t gid;
};

/* Sends one frame to c (header encoded, payload copied into the frame). */
void kw__conn_send(kw__conn *c, uint16_t type, const cJSON *header,
                   const void *payload, size_t payload_len);

/* Sends a frame whose payload (malloc'd, cap bytes) is handed over: written
 * after the encoded header without a copy, then kept as c's spare reply
 * buffer (kw__conn_take_buffer) or freed. */
void kw__conn_send_owned(kw__conn *c, uint16_t type, const cJSON *header,
                         void *payload, size_t payload_len, size_t cap);

/* A reply buffer of at least min bytes: c's spare one when big enough,
 * else a new allocation; *cap gets its size.  NULL when out of memory. */
void *kw__conn_take_buffer(kw__conn *c, size_t min, size_t *cap);

/* Sends an ERROR frame {"error", "code"} for code and message. */
void kw__conn_error(kw__conn *c, int code, const char *msg, bool close_after);

/* Closes c (idempotent); it is freed once its handles and refs are gone. */
void kw__conn_close(kw__conn *c);

/* Called when the active request finished: resumes reading and parsing. */
void kw__conn_request_done(kw__conn *c);

/* Drops one compile reference taken on c; frees it if it was closing. */
void kw__conn_unref(kw__conn *c);

/* Serves one parsed request (handlers.c).  Either answers at once, or sets
 * c->active and answers later, calling kw__conn_request_done(). */
void kw__daemon_dispatch(kw__conn *c, const kw_msg *m);

/* Initialises the backlog machinery (a uv_idle_t) of d. */
void kw__daemon_backlog_init(kw__daemon *d);

/* Starts listening: the systemd socket or a new one at opts->socket_path. */
int kw__daemon_listen(kw__daemon *d, char *err, size_t errlen);

#endif /* KW_DAEMON_INTERNAL_H */
