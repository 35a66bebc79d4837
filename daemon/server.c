/* server.c: the listening socket, connections, framing, idle timeouts.
 *
 * _GNU_SOURCE: struct ucred and SO_PEERCRED (Linux) to learn each peer's
 * uid and gid at accept.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "kw_err.h"
#include "log.h"


typedef struct write_req {
    uv_write_t req;
    kw__conn *conn;
    bool close_after;
    uint8_t *frame;   /* owned */
    void *payload;    /* owned, sent after frame without a copy; or NULL */
    size_t payload_cap;
} write_req;

static void conn_free(kw__conn *c)
{
    free(c->spare);
    free(c->buf);
    free(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    kw__conn *c = h->data;
    if (--c->handles > 0 || c->refs > 0)
        return;
    conn_free(c);
}

void kw__conn_unref(kw__conn *c)
{
    if (--c->refs == 0 && c->closing && c->handles == 0)
        conn_free(c);
}

void *kw__conn_take_buffer(kw__conn *c, size_t min, size_t *cap)
{
    void *b = c->spare;
    if (b != NULL && c->spare_cap >= min) {
        *cap = c->spare_cap;
        c->spare = NULL;
        return b;
    }
    if ((b = realloc(b, min)) == NULL)
        return NULL; /* the spare, if any, is still c's */
    c->spare = NULL;
    *cap = min;
    return b;
}

void kw__conn_close(kw__conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    kw__daemon *d = c->d;
    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->nconns--;
    if (c->active != NULL)
        kw__daemon_request_abort(c->active);
    uv_close((uv_handle_t *)&c->idle, on_handle_closed);
    uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
    kw__daemon_check_stop(d);
}

static void on_written(uv_write_t *req, int status)
{
    write_req *w = (write_req *)req;
    if (status < 0 || w->close_after)
        kw__conn_close(w->conn);
    /* Keep one payload buffer for the connection's next reply: gets of
     * large cubins then cost no allocation and no page faults. */
    if (w->payload != NULL && w->conn->spare == NULL && !w->conn->closing) {
        w->conn->spare = w->payload;
        w->conn->spare_cap = w->payload_cap;
    } else
        free(w->payload);
    kw__conn_unref(w->conn);
    free(w->frame);
    free(w);
}

/* Queues frame and then payload (both owned; payload may be NULL) for
 * writing to c in one writev. */
static void send_bufs(kw__conn *c, uint8_t *frame, size_t len, void *payload,
                      size_t plen, size_t pcap, bool close_after)
{
    write_req *w = calloc(1, sizeof *w);
    if (c->closing || w == NULL) {
        free(w);
        free(frame);
        free(payload);
        return;
    }
    w->conn = c;
    w->frame = frame;
    w->payload = payload;
    w->payload_cap = pcap;
    w->close_after = close_after;
    uv_buf_t b[2] = {uv_buf_init((char *)frame, (unsigned)len),
                     uv_buf_init(payload, (unsigned)plen)};
    c->refs++;
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, b, payload ? 2 : 1,
                 on_written) < 0) {
        c->refs--;
        free(frame);
        free(payload);
        free(w);
        kw__conn_close(c);
    }
}

static void send_frame(kw__conn *c, uint8_t *frame, size_t len, bool close_after)
{
    send_bufs(c, frame, len, NULL, 0, 0, close_after);
}

void kw__conn_send_owned(kw__conn *c, uint16_t type, const cJSON *header,
                         void *payload, size_t payload_len, size_t cap)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    int rc = kw_proto_encode_prefix(type, header, payload_len, &frame, &len);
    if (rc < 0) {
        free(payload);
        kw__conn_error(c, rc, "reply could not be encoded", false);
        return;
    }
    send_bufs(c, frame, len, payload, payload_len, cap, false);
}

void kw__conn_send(kw__conn *c, uint16_t type, const cJSON *header,
                   const void *payload, size_t payload_len)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    int rc = kw_proto_encode(type, header, payload, payload_len, &frame, &len);
    if (rc < 0) {
        kw__conn_error(c, rc, "reply could not be encoded", false);
        return;
    }
    send_frame(c, frame, len, false);
}

void kw__conn_error(kw__conn *c, int code, const char *msg, bool close_after)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    if (kw_proto_error_frame(code, msg, &frame, &len) < 0) {
        kw__conn_close(c);
        return;
    }
    send_frame(c, frame, len, close_after);
}

static void process(kw__conn *c);

/* A frame that broke the protocol: one ERROR frame (naming both versions
 * when only the version is wrong), then the connection closes. */
static void protocol_error(kw__conn *c, int rc)
{
    char esc[KW_PROTO_ESCAPE_CAP], msg[128];
    kw_proto_escape(c->buf, c->len, esc, sizeof esc);
    KW_LOG(KW_LOG_WARNING, "uid %u: %s; closing (input: %s)",
           (unsigned)c->uid, kw_strerror(rc), esc);
    c->d->protocol_errors++;
    if (rc == KW_EVERSION)
        snprintf(msg, sizeof msg, "protocol version %u is not supported: "
                 "kwarmd speaks version %u", kw_proto_frame_version(c->buf, c->len),
                 KW_PROTO_VERSION);
    kw__conn_error(c, rc, rc == KW_EVERSION ? msg : NULL, true);
    c->len = 0;
}

/* Runs each connection of the backlog once more (KW__FRAMES_PER_READ
 * frames); stops itself when the backlog is empty. */
static void on_resume(uv_idle_t *h)
{
    kw__daemon *d = h->data;
    kw__conn *list = d->backlog;
    d->backlog = NULL;
    while (list != NULL) {
        kw__conn *c = list;
        list = c->next_backlog;
        c->in_backlog = false;
        if (!c->closing)
            process(c);
        kw__conn_unref(c); /* the reference backlog_add() took */
    }
    if (d->backlog == NULL)
        uv_idle_stop(h);
}

void kw__daemon_backlog_init(kw__daemon *d)
{
    uv_idle_init(&d->loop, &d->resume);
    d->resume.data = d;
}

/* Queues c to be processed again on the next loop iteration. */
static void backlog_add(kw__conn *c)
{
    kw__daemon *d = c->d;
    if (c->in_backlog)
        return;
    c->in_backlog = true;
    c->next_backlog = d->backlog;
    d->backlog = c;
    c->refs++; /* dropped when the backlog is run (see process) */
    uv_idle_start(&d->resume, on_resume);
}

/* Parses and serves buffered requests, at most KW__FRAMES_PER_READ per
 * call, stopping while one is under way; frames left over are served on
 * the next loop iteration (the backlog), so one pipelining client cannot
 * hold the loop.  A protocol error gets one ERROR frame, then the
 * connection closes. */
static void process(kw__conn *c)
{
    int n = 0;
    for (; n < KW__FRAMES_PER_READ && !c->closing && !c->active; n++) {
        kw_msg m;
        size_t used = 0;
        int rc = kw_proto_parse_request(c->buf, c->len, &m, &used);
        if (rc == KW_PROTO_MORE)
            return;
        if (rc < 0) {
            protocol_error(c, rc);
            return;
        }
        c->d->requests++;
        kw__daemon_dispatch(c, &m);
        kw_msg_destroy(&m);
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
        if (c->active != NULL && !c->paused && !c->closing) {
            uv_read_stop((uv_stream_t *)&c->pipe); /* one request at a time */
            c->paused = true;
        }
    }
    if (n == KW__FRAMES_PER_READ && !c->closing && !c->active && c->len > 0)
        backlog_add(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    kw__conn *c = h->data;
    (void)suggested;
    /* Never more than the largest request: the per-connection cap. */
    b->base = (char *)c->buf + c->len;
    b->len = KW_PROTO_MAX_REQUEST - c->len;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    kw__conn *c = s->data;
    (void)b;
    if (n < 0) {
        kw__conn_close(c);
        return;
    }
    /* UV_ENOBUFS (a full buffer: impossible for valid requests, which
     * parse before the cap), EOF and errors all end the connection. */
    c->len += (size_t)n;
    uv_timer_again(&c->idle);
    process(c);
}

void kw__conn_begin(kw__conn *c, kw__req *r)
{
    c->refs++;
    c->active = r;
}

void kw__conn_request_done(kw__conn *c)
{
    c->active = NULL;
    if (c->closing || c->d->stopping)
        return; /* stopping: the connection closes after its last frame */
    uv_timer_again(&c->idle);
    process(c);
    if (!c->closing && !c->active && c->paused) {
        c->paused = false;
        uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
    }
}

static void on_idle(uv_timer_t *t)
{
    kw__conn *c = t->data;
    if (c->active != NULL)
        return; /* a long warmup is not idleness */
    KW_LOG(KW_LOG_INFO, "uid %u: idle for %u ms; closing", (unsigned)c->uid,
           c->d->opts->idle_timeout_ms);
    kw__conn_close(c);
}

/* True when the peer's uid or gid is allowed (default: ours and root). */
static bool peer_allowed(const kw__daemon *d, uid_t uid, gid_t gid)
{
    const kw_daemon_opts *o = d->opts;
    if (o->nallow_uid == 0 && o->nallow_gid == 0)
        return uid == 0 || uid == getuid();
    for (size_t i = 0; i < o->nallow_uid; i++)
        if (o->allow_uid[i] == uid)
            return true;
    for (size_t i = 0; i < o->nallow_gid; i++)
        if (o->allow_gid[i] == gid)
            return true;
    return false;
}

/* Reads SO_PEERCRED of the accepted pipe into c. */
static int peer_creds(kw__conn *c)
{
    uv_os_fd_t fd;
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return -errno;
    c->uid = cr.uid;
    c->gid = cr.gid;
    return 0;
}

/* Sets up a new connection's handles and buffer; NULL when out of memory
 * or the accept fails. */
static kw__conn *conn_new(kw__daemon *d)
{
    kw__conn *c = calloc(1, sizeof *c);
    uint8_t *buf = malloc(KW_PROTO_MAX_REQUEST);
    if (c == NULL || buf == NULL) {
        free(c);
        free(buf);
        return NULL;
    }
    c->d = d;
    c->buf = buf;
    uv_pipe_init(&d->loop, &c->pipe, 0);
    uv_timer_init(&d->loop, &c->idle);
    c->pipe.data = c->idle.data = c;
    c->handles = 2;
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    return c;
}

/* Accepts the pending connection; false when it could not be set up. */
static bool accept_one(kw__daemon *d)
{
    kw__conn *c = conn_new(d);
    if (c == NULL)
        return false;
    if (uv_accept((uv_stream_t *)&d->listener, (uv_stream_t *)&c->pipe) < 0) {
        kw__conn_close(c);
        return false;
    }
    if (peer_creds(c) < 0 || !peer_allowed(d, c->uid, c->gid)) {
        KW_LOG(KW_LOG_WARNING, "refused a client of uid %u gid %u",
               (unsigned)c->uid, (unsigned)c->gid);
        d->refused++;
        kw__conn_error(c, -EACCES, "this uid/gid may not use kwarmd", true);
        return true;
    }
    uv_timer_start(&c->idle, on_idle, d->opts->idle_timeout_ms,
                   d->opts->idle_timeout_ms);
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
    return true;
}

static void on_connection(uv_stream_t *l, int status)
{
    kw__daemon *d = l->data;
    if (status < 0 || d->stopping)
        return;
    /* libuv hands over one accepted socket per callback (uv_accept may be
     * called once), so the per-event work is bounded already. */
    accept_one(d);
}

/* ---- the outbox: frames from job and warm threads -------------------- */

void kw__daemon_post(kw__daemon *d, kw__out *o)
{
    o->next = NULL;
    pthread_mutex_lock(&d->out_mu);
    if (d->out_tail != NULL)
        d->out_tail->next = o;
    else
        d->out_head = o;
    d->out_tail = o;
    pthread_mutex_unlock(&d->out_mu);
    uv_async_send(&d->outbox);
}

/* Sends or drops one posted item, then ends its request when done.  While
 * stopping, the connection closes after a request's last frame. */
static void deliver(kw__daemon *d, kw__out *o)
{
    kw__req *r = o->req;
    kw__conn *c = kw__req_conn(r);
    bool close_after = o->done && d->stopping;
    if (o->on_loop != NULL)
        o->on_loop(r);
    if (o->frame != NULL && !c->closing)
        send_frame(c, o->frame, o->len, close_after);
    else
        free(o->frame);
    if (close_after && o->frame == NULL)
        kw__conn_close(c);
    if (o->done)
        kw__daemon_request_end(r);
    free(o);
}

/* The outbox's async callback: drains the whole queue (sends coalesce). */
static void on_outbox(uv_async_t *h)
{
    kw__daemon *d = h->data;
    pthread_mutex_lock(&d->out_mu);
    kw__out *list = d->out_head;
    d->out_head = d->out_tail = NULL;
    pthread_mutex_unlock(&d->out_mu);
    while (list != NULL) {
        kw__out *next = list->next;
        deliver(d, list);
        list = next;
    }
}

int kw__daemon_outbox_init(kw__daemon *d)
{
    int rc = -pthread_mutex_init(&d->out_mu, NULL);
    if (rc == 0 && (rc = uv_async_init(&d->loop, &d->outbox, on_outbox)) < 0)
        pthread_mutex_destroy(&d->out_mu);
    d->outbox.data = d;
    return rc;
}

/* Refuses a socket path that does not fit sun_path (never truncates). */
static int check_path(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "--socket: %s: longer than %zu bytes", path,
                 sizeof sa.sun_path - 1);
        return KW_EINVAL;
    }
    return 0;
}

/* A socket file left at path: another kwarmd answering on it is an
 * error; a dead one (ECONNREFUSED) is removed so we can bind. */
static int clear_stale(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "--socket: %s exists and is not a socket", path);
        return -EEXIST;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int rc = fd < 0 ? -errno : connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (rc == 0) {
        snprintf(err, errlen, "--socket: %s: another kwarmd is serving it", path);
        return -EADDRINUSE;
    }
    if (e != ECONNREFUSED) {
        snprintf(err, errlen, "--socket: %s: %s", path, strerror(e));
        return -e;
    }
    return unlink(path) < 0 ? -errno : 0;
}

/* Binds a new socket at path, created with its final mode: the umask is
 * set around bind, so there is no window of wrong permissions. */
static int bind_socket(kw__daemon *d, char *err, size_t errlen)
{
    const char *path = d->opts->socket_path;
    int rc = check_path(path, err, errlen);
    if (rc == 0)
        rc = clear_stale(path, err, errlen);
    if (rc < 0)
        return rc;
    mode_t old = umask(~d->opts->socket_mode & 0777);
    rc = uv_pipe_bind(&d->listener, path);
    umask(old);
    if (rc < 0)
        snprintf(err, errlen, "--socket: %s: %s", path, uv_strerror(rc));
    return rc;
}

int kw__daemon_listen(kw__daemon *d, char *err, size_t errlen)
{
    int rc = uv_pipe_init(&d->loop, &d->listener, 0);
    if (rc < 0)
        return rc;
    d->listener.data = d;
    if (sd_listen_fds(1) >= 1) {
        rc = uv_pipe_open(&d->listener, SD_LISTEN_FDS_START);
        KW_LOG(KW_LOG_INFO, "listening on the socket systemd passed");
    } else if ((rc = bind_socket(d, err, errlen)) == 0) {
        d->bound = true;
        KW_LOG(KW_LOG_INFO, "listening on %s", d->opts->socket_path);
    }
    if (rc == 0 && (rc = uv_listen((uv_stream_t *)&d->listener, 128,
                                   on_connection)) < 0)
        snprintf(err, errlen, "listen: %s", uv_strerror(rc));
    d->listening = rc == 0;
    return rc;
}
