/* internal.h: what client.c (connection and frame I/O) shares with
 * client_req.c (the requests).  Not installed. */
#ifndef KW_CLIENT_INTERNAL_H
#define KW_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kw_client.h"
#include "kw_proto.h"

struct kw_client {
    int fd;         /* -1 once closed after a failure */
    int timeout_ms; /* per wait; <= 0: none */
    uint8_t *buf;   /* received bytes [0, len) of cap */
    size_t len, cap;
    size_t used; /* bytes of the frame last handed out, dropped next read */
    char path[KW_CLIENT_PATH_MAX];
    char err[KW_CLIENT_ERRLEN];
};

/* What a streamed reply (keys, warmup) gathers from its PROGRESS frames:
 * the items of each frame's array `member`, in order. */
typedef struct stream {
    const char *member;        /* "keys" or "results" */
    cJSON *items;              /* an array, owned */
    kw_client_progress_fn cb;  /* warmup: each frame's header as text */
    void *arg;
} stream;

/* Formats the last-error text of c and returns rc. */
__attribute__((format(printf, 3, 4))) int
kw__client_fail(kw_client *c, int rc, const char *fmt, ...);

/* kw__client_fail(), and closes the connection: after an I/O or protocol
 * failure the stream is at an unknown point, so no later request could be
 * trusted. */
__attribute__((format(printf, 3, 4))) int
kw__client_broken(kw_client *c, int rc, const char *fmt, ...);

/* Sends a request of type with header hdr (NULL: {}) and reads up to its
 * final reply, which must be of type want; PROGRESS frames (keys and
 * warmup only: st not NULL) are gathered into st.  Returns 0 with *reply
 * set (kw_msg_destroy() it), the daemon's ERROR as a code, or a failure. */
int kw__client_request(kw_client *c, uint16_t type, const cJSON *hdr,
                       uint16_t want, stream *st, kw_msg *reply);

#endif /* KW_CLIENT_INTERNAL_H */
