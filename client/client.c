/* client.c: libkwarm, the blocking client of kwarmd (kw_client.h): the
 * connection, errors and frame I/O; the requests are in client_req.c.
 *
 * One connection, one request at a time.  The socket is non-blocking and
 * every wait goes through poll(), so a timeout bounds each wait without
 * alarms or SO_RCVTIMEO.  Replies are read into one buffer that grows to
 * a frame's declared size only after kw_proto_parse_reply() (and then
 * kw_proto_peek()) accepted the fixed header, so the daemon can never make
 * the client allocate more than the protocol caps allow.
 */
#include "kw_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_err.h"
#include "kw_json.h"
#include "kw_proto.h"

#include "internal.h"

#define RECV_MIN 4096u          /* smallest receive buffer */
#define KEEP_MAX (256u * 1024u) /* a bigger, emptied buffer is freed */
#define CONNECT_RETRY_MS 5      /* pause while the listen backlog is full */


/* ---- errors ------------------------------------------------------------ */

int kw__client_fail(kw_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return rc;
}

/* kw__client_fail(), and closes the connection: after an I/O or protocol failure the
 * stream is at an unknown point, so no later request could be trusted. */
int kw__client_broken(kw_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = c->used = 0;
    return rc;
}

/* Maps the "code" name of an ERROR frame back to its value: a kw_err.h
 * name, "ESYS" (an errno of the daemon's, whose number is not sent) as
 * -EIO, anything else as KW_EPROTO. */
static int code_from_name(const char *name)
{
#define XX(n, v, m)                      \
    if (strcmp(name, "KW_" #n) == 0) \
        return (v);
    KW_ERR_MAP(XX)
#undef XX
    return strcmp(name, "ESYS") == 0 ? -EIO : KW_EPROTO;
}

/* Keeps the daemon's ERROR text in c->err; returns the mapped code. */
static int daemon_error(kw_client *c, const kw_msg *m)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(m->header, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(m->header, "code");
    int rc = cJSON_IsString(code) ? code_from_name(code->valuestring)
                                  : KW_EPROTO;
    return kw__client_fail(c, rc, "kwarmd: %s", cJSON_IsString(e) ? e->valuestring
                                                        : kw_strerror(rc));
}

/* ---- waiting, sending, receiving --------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until c->fd is ready for events, at most c->timeout_ms (EINTR
 * retried against the same deadline).  Readiness includes errors and
 * hang-ups: the following send/recv reports them.  0, -ETIMEDOUT, -errno. */
static int wait_fd(kw_client *c, short events)
{
    int64_t deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : -1;
    for (;;) {
        int left = -1;
        if (deadline >= 0) {
            int64_t d = deadline - now_ms();
            left = d > 0 ? (int)d : 0;
        }
        struct pollfd p = {.fd = c->fd, .events = events};
        int n = poll(&p, 1, left);
        if (n > 0)
            return 0;
        if (n == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

/* Sends n bytes, without SIGPIPE.  0, or a code with c broken. */
static int send_all(kw_client *c, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        int e = w < 0 ? errno : EIO;
        if (e == EINTR)
            continue;
        if (e != EAGAIN && e != EWOULDBLOCK)
            return kw__client_broken(c, -e, "send to kwarmd: %s", strerror(e));
        int rc = wait_fd(c, POLLOUT);
        if (rc < 0)
            return kw__client_broken(c, rc, "send to kwarmd: %s", strerror(-rc));
    }
    return 0;
}

/* Makes room for need bytes (a size the caps already bounded) and reads
 * what arrives.  0, or a code with c broken. */
static int read_more(kw_client *c, size_t need)
{
    if (need > c->cap) {
        size_t cap = need < RECV_MIN ? RECV_MIN : need;
        uint8_t *b = realloc(c->buf, cap);
        if (b == NULL)
            return kw__client_broken(c, KW_ENOMEM, "reply of %zu bytes: %s", need,
                          kw_strerror(KW_ENOMEM));
        c->buf = b;
        c->cap = cap;
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (r > 0) {
            c->len += (size_t)r;
            return 0;
        }
        if (r == 0)
            return kw__client_broken(c, -ECONNRESET, "kwarmd closed the connection");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return kw__client_broken(c, -errno, "recv from kwarmd: %s", strerror(errno));
        int rc = wait_fd(c, POLLIN);
        if (rc < 0)
            return kw__client_broken(c, rc, "waiting for kwarmd: %s", strerror(-rc));
    }
}

/* Drops the frame handed out last; frees a large buffer once empty so one
 * big cubin does not pin its memory for the connection's life. */
static void drop_used(kw_client *c)
{
    if (c->used > 0) {
        memmove(c->buf, c->buf + c->used, c->len - c->used);
        c->len -= c->used;
        c->used = 0;
    }
    if (c->len == 0 && c->cap > KEEP_MAX) {
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
}

/* Reads the next reply frame into *m (kw_msg_destroy() it).  m->payload
 * points into c->buf: valid until the next read on c.  0, or a code with
 * c broken. */
static int recv_frame(kw_client *c, kw_msg *m)
{
    drop_used(c);
    for (;;) {
        size_t used;
        int rc = kw_proto_parse_reply(c->buf, c->len, m, &used);
        if (rc == KW_PROTO_OK) {
            c->used = used;
            return 0;
        }
        if (rc == KW_EVERSION)
            return kw__client_broken(c, rc, "kwarmd speaks protocol version %u, this "
                          "client version %u: upgrade the older one",
                          kw_proto_frame_version(c->buf, c->len),
                          KW_PROTO_VERSION);
        if (rc < 0) {
            char esc[KW_PROTO_ESCAPE_CAP];
            kw_proto_escape(c->buf, c->len, esc, sizeof esc);
            return kw__client_broken(c, rc, "bad reply from kwarmd (%s): \"%s\"",
                          kw_strerror(rc), esc);
        }
        /* MORE: the head is valid so far, so its lengths are within caps. */
        size_t need = KW_PROTO_HEAD_LEN;
        uint32_t hl, pl;
        if (kw_proto_peek(c->buf, c->len, NULL, &hl, &pl) == KW_PROTO_OK)
            need += (size_t)hl + pl;
        if ((rc = read_more(c, need)) < 0)
            return rc;
    }
}

/* Takes one PROGRESS frame: its array's items move to s->items, then cb
 * sees the frame.  0, KW_EPROTO (no such array) or KW_ENOMEM. */
static int take_progress(kw_msg *m, stream *s)
{
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(m->header, s->member);
    if (!cJSON_IsArray(arr))
        return KW_EPROTO;
    if (s->cb != NULL) {
        char *text = cJSON_PrintUnformatted(m->header);
        if (text == NULL)
            return KW_ENOMEM;
        s->cb(text, s->arg);
        free(text);
    }
    while (arr->child != NULL)
        cJSON_AddItemToArray(s->items, cJSON_DetachItemViaPointer(arr, arr->child));
    return 0;
}

/* internal.h */
int kw__client_request(kw_client *c, uint16_t type, const cJSON *hdr,
                       uint16_t want, stream *st, kw_msg *reply)
{
    const char *name = kw_proto_type_name(type);
    if (c->fd < 0)
        return kw__client_fail(c, -ENOTCONN, "%s: not connected (an earlier failure "
                    "closed the connection)", name);
    uint8_t *frame;
    size_t n;
    int rc = kw_proto_encode(type, hdr, NULL, 0, &frame, &n);
    if (rc < 0)
        return kw__client_fail(c, rc, "%s request: %s", name,
                    rc == KW_E2BIG ? "JSON header over 64 KiB" : kw_strerror(rc));
    drop_used(c);
    if (c->len > 0)
        rc = kw__client_broken(c, KW_EPROTO, "kwarmd sent %zu bytes nobody asked for",
                    c->len);
    if (rc == 0)
        rc = send_all(c, frame, n);
    free(frame);
    while (rc == 0 && (rc = recv_frame(c, reply)) == 0) {
        if (reply->type == KW_PROTO_ERROR) {
            rc = daemon_error(c, reply);
        } else if (reply->type == KW_PROTO_PROGRESS && st != NULL) {
            if ((rc = take_progress(reply, st)) < 0)
                rc = kw__client_broken(c, rc, "%s: progress frame: %s", name,
                            kw_strerror(rc));
        } else if (reply->type != want &&
                   !(want == KW_PROTO_PROGRESS && reply->type == KW_PROTO_RESULT)) {
            rc = kw__client_broken(c, KW_EPROTO, "kwarmd answered %s to %s",
                        kw_proto_type_name(reply->type), name);
        } else {
            return 0;
        }
        kw_msg_destroy(reply);
    }
    return rc;
}

/* ---- connecting -------------------------------------------------------- */

const char *kw_client_default_socket(char *buf, size_t cap)
{
    const char *env = getenv("KWARM_SOCKET");
    const char *run = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env != NULL && env[0] != '\0')
        n = snprintf(buf, cap, "%s", env);
    else if (getuid() != 0 && run != NULL && run[0] != '\0')
        n = snprintf(buf, cap, "%s/kwarm.sock", run);
    else
        n = snprintf(buf, cap, "/run/kwarm/kwarm.sock");
    return n >= 0 && (size_t)n < cap ? buf : NULL;
}

/* Connects c->fd (non-blocking) to addr, retrying while the listen backlog
 * is full (EAGAIN on Linux) until c->timeout_ms passes.  0 or -errno. */
static int connect_wait(kw_client *c, const struct sockaddr_un *addr)
{
    int64_t deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : -1;
    for (;;) {
        if (connect(c->fd, (const struct sockaddr *)addr, sizeof *addr) == 0)
            return 0;
        int e = errno;
        if (e == EISCONN)
            return 0; /* an interrupted connect that completed */
        if (e == EINPROGRESS) {
            int rc = wait_fd(c, POLLOUT), soerr = 0;
            socklen_t len = sizeof soerr;
            if (rc == 0 && getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr,
                                      &len) < 0)
                rc = -errno;
            return rc < 0 ? rc : -soerr;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
            if (deadline >= 0 && now_ms() >= deadline)
                return -ETIMEDOUT;
            poll(NULL, 0, CONNECT_RETRY_MS);
        } else if (e != EINTR) {
            return -e;
        }
    }
}

/* Opens c's socket and connects it to c->path.  0 or -errno. */
static int open_socket(kw_client *c)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, c->path, strlen(c->path) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -errno;
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    return connect_wait(c, &addr);
}

int kw_client_connect(kw_client **out, const char *path, int timeout_ms,
                      char *err, size_t errlen)
{
    char def[KW_CLIENT_PATH_MAX];
    char dummy[1];
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
    if (out == NULL || (path != NULL && path[0] == '\0')) {
        snprintf(err, errlen, "kwarm client: no socket path or output");
        return KW_EINVAL;
    }
    if (path == NULL &&
        (path = kw_client_default_socket(def, sizeof def)) == NULL) {
        snprintf(err, errlen, "default socket path ($KWARM_SOCKET or "
                 "$XDG_RUNTIME_DIR/kwarm.sock) over %d bytes",
                 KW_CLIENT_PATH_MAX - 1);
        return -ENAMETOOLONG;
    }
    if (strlen(path) >= KW_CLIENT_PATH_MAX ||
        strlen(path) >= sizeof ((struct sockaddr_un *)0)->sun_path) {
        snprintf(err, errlen, "%.64s...: socket path over %d bytes", path,
                 KW_CLIENT_PATH_MAX - 1);
        return -ENAMETOOLONG;
    }
    kw_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "%s", kw_strerror(KW_ENOMEM));
        return KW_ENOMEM;
    }
    c->fd = -1;
    c->timeout_ms = timeout_ms;
    memcpy(c->path, path, strlen(path) + 1);
    int rc = open_socket(c);
    if (rc < 0) {
        snprintf(err, errlen, "connect(%s): %s", path, strerror(-rc));
        kw_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kw_client_close(kw_client *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c->buf);
    free(c);
}

void kw_client_set_timeout(kw_client *c, int timeout_ms)
{
    if (c != NULL)
        c->timeout_ms = timeout_ms;
}

const char *kw_client_path(const kw_client *c)
{
    return c != NULL ? c->path : "";
}

const char *kw_client_last_error(const kw_client *c)
{
    return c != NULL ? c->err : "";
}

