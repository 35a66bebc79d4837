/* server.c: connections: their lifetime, framing, reads, writes and caps.
 *
 * The one place that takes and drops references on a connection and closes
 * it.  Each connection has caps (DESIGN.md, "Rules of the loop thread"):
 * the bytes of a request it may buffer (KW_PROTO_MAX_REQUEST), one request
 * in flight at a time (reading pauses meanwhile), and the bytes of replies
 * queued for it (--max-output): past that cap kwarmd stops reading its
 * requests until the queue drains to half, and drops it when nothing has
 * left for --idle-timeout.
 */
#include "conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

typedef struct write_req {
    uv_write_t req;
    kw__conn *conn;
    bool close_after;
    uint8_t *frame;   /* owned */
    void *payload;    /* owned, sent after frame without a copy; or NULL */
    size_t payload_cap;
    size_t bytes;     /* frame and payload: counted in conn->queued */
    kw__conn_done_fn done; /* called once written or dropped, or NULL */
    void *done_arg;
    /* A payload written straight from the cache's map: the view (and its
     * read transaction) is held until the write ends, in d's held list,
     * oldest first (the rules of kw__held_check, below). */
    kw_cache_view view; /* the zero-copy hit path's (dispatch.c says why
                           it reaches the cache itself) */
    uint64_t held_at;  /* uv_now() when it was queued */
    struct write_req *hnext, *hprev;
} write_req;

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b);
static void process(kw__conn *c);

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

/* A reply buffer of at least min bytes: c's spare one when big enough,
 * else a new allocation; *cap gets its size.  NULL when out of memory. */
static void *take_buffer(kw__conn *c, size_t min, size_t *cap)
{
    void *b = c->spare;
    if (b != NULL && c->spare_cap >= min) {
        *cap = c->spare_cap;
        c->spare = NULL;
        return b;
    }
    if ((b = kw_realloc(b, min)) == NULL)
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
    kw__loop *l = c->l;
    if (c->prev)
        c->prev->next = c->next;
    else
        l->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->d->nconns--;
    if (c->active != NULL)
        c->d->up.abort(c->active);
    uv_close((uv_handle_t *)&c->idle, on_handle_closed);
    uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
    kw__loop_check_stop(l);
}

void kw__loop_check_stop(kw__loop *l)
{
    if (!l->stopping || l->done || l->nreqs > 0 || l->conns != NULL)
        return;
    l->done = true;
    pthread_mutex_lock(&l->mu);
    l->closed = true; /* the main loop sends no wake from now on */
    pthread_mutex_unlock(&l->mu);
    uv_close((uv_handle_t *)&l->wake, NULL);
    uv_close((uv_handle_t *)&l->outbox, NULL);
    uv_close((uv_handle_t *)&l->held_timer, NULL);
    uv_close((uv_handle_t *)&l->heartbeat, NULL);
}

/* Reads when nothing holds it back: no request under way, the output
 * queue under its cap, not closing.  A refused connection only drains. */
static void update_reading(kw__conn *c)
{
    bool want = !c->closing && !c->l->stopping && !c->broken &&
                (c->refusing || (c->active == NULL && !c->throttled));
    if (want && !c->reading)
        uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
    else if (!want && c->reading && !c->closing)
        uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = want;
}

/* ---- held reads: replies written from the cache's map --------------- */

static void held_link(kw__loop *l, write_req *w)
{
    w->held_at = uv_now(&l->loop);
    w->hprev = l->held_tail;
    if (l->held_tail)
        l->held_tail->hnext = w;
    else
        l->held_head = w;
    l->held_tail = w;
    if (l->nheld++ == 0 && !l->done) {
        uint64_t every = l->d->opts->held_read_timeout_ms / 4;
        uv_timer_start(&l->held_timer, kw__held_check, every ? every : 1,
                       every ? every : 1);
    }
}

static void held_unlink(kw__loop *l, write_req *w)
{
    if (w->hprev)
        w->hprev->hnext = w->hnext;
    else
        l->held_head = w->hnext;
    if (w->hnext)
        w->hnext->hprev = w->hprev;
    else
        l->held_tail = w->hprev;
    l->d->nheld--;
    if (--l->nheld == 0 && !l->done)
        uv_timer_stop(&l->held_timer);
}

/* Takes one of the --max-held-reads slots, shared by every loop: false
 * when all are taken. */
static bool held_take(kw__daemon *d)
{
    size_t n = atomic_load(&d->nheld);
    while (n < d->opts->max_held_reads)
        if (atomic_compare_exchange_weak(&d->nheld, &n, n + 1))
            return true;
    return false;
}

/* The held-read timer: a connection whose reply has held a snapshot for
 * --held-read-timeout is closed, which cancels its writes and so releases
 * the snapshot.  The list is oldest first. */
void kw__held_check(uv_timer_t *t)
{
    kw__loop *l = t->data;
    kw__daemon *d = l->d;
    uint64_t now = uv_now(&l->loop), limit = d->opts->held_read_timeout_ms;
    for (write_req *w = l->held_head; w && now - w->held_at >= limit;
         w = w->hnext) {
        kw__conn *c = w->conn;
        if (c->closing)
            continue; /* its cancelled writes release the view soon */
        KW_LOG(KW_LOG_WARNING, "uid %u: a reply has held a cache snapshot "
               "for %llu ms unread (--held-read-timeout); closing",
               (unsigned)c->uid, (unsigned long long)(now - w->held_at));
        d->held_expired++;
        kw__conn_close(c);
    }
}

/* Frees w and what it owns; a held view is released. */
static void write_free(write_req *w)
{
    if (w->done != NULL)
        w->done(w->done_arg, w->bytes);
    if (w->view.data != NULL) {
        held_unlink(w->conn->l, w);
        kw_cache_release(&w->view);
    }
    free(w->payload);
    free(w->frame);
    free(w);
}

static void on_written(uv_write_t *req, int status)
{
    write_req *w = (write_req *)req;
    kw__conn *c = w->conn;
    c->queued -= w->bytes;
    c->progress_at = uv_now(&c->l->loop);
    atomic_store_explicit(&c->d->last_write_ms, c->progress_at,
                          memory_order_relaxed);
    if (status < 0 || w->close_after)
        kw__conn_close(c);
    /* Keep one payload buffer for the connection's next reply: gets of
     * large cubins then cost no allocation and no page faults. */
    if (w->payload != NULL && c->spare == NULL && !c->closing) {
        c->spare = w->payload;
        c->spare_cap = w->payload_cap;
        w->payload = NULL;
    }
    if (c->throttled && c->queued <= c->d->opts->max_output / 2 && !c->closing) {
        c->throttled = false; /* drained: read and serve again */
        update_reading(c);
        process(c);
    }
    write_free(w); /* before the unref, which may free c */
    kw__conn_unref(c);
}

/* Queues w's buffers b[0..nb) for writing to c; past --max-output queued,
 * reading stops.  Takes w. */
static void queue_write(kw__conn *c, write_req *w, const uv_buf_t *b,
                        unsigned nb)
{
    c->refs++;
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, b, nb, on_written) < 0) {
        c->refs--;
        write_free(w);
        kw__conn_close(c);
        return;
    }
    if (c->queued == 0)
        c->progress_at = uv_now(&c->l->loop); /* the clock starts now */
    c->queued += w->bytes;
    if (!c->throttled && c->queued > c->d->opts->max_output) {
        c->throttled = true;
        update_reading(c);
    }
}

/* What the socket takes at once of frame[0..len) then v's bytes, when
 * nothing is queued before them: the bytes written, or a libuv error. */
static ssize_t write_now(kw__conn *c, uint8_t *frame, size_t len,
                         const kw_cache_view *v)
{
    if (c->queued > 0)
        return 0;
    uv_buf_t b[2] = {uv_buf_init((char *)frame, (unsigned)len),
                     uv_buf_init((char *)v->data, (unsigned)v->len)};
    int n = uv_try_write((uv_stream_t *)&c->pipe, b, 2);
    return n == UV_EAGAIN ? 0 : n;
}

/* The rest of a view reply after its first done bytes.  Queued straight
 * from the map when it is next on the wire (hold: nothing was queued
 * before it) and fewer than --max-held-reads replies hold a snapshot;
 * else copied out and the view released, so a connection holds at most
 * one snapshot, and only while its client reads the reply it is on.
 * Takes w and v. */
static void queue_view(kw__conn *c, write_req *w, size_t done, size_t len,
                       kw_cache_view *v, bool hold)
{
    kw__daemon *d = c->d;
    size_t off = done > len ? done - len : 0;
    uv_buf_t b[2];
    unsigned nb = 0;
    if (done < len)
        b[nb++] = uv_buf_init((char *)w->frame + done, (unsigned)(len - done));
    const char *rest = (const char *)v->data + off;
    size_t rest_len = v->len - off;
    if (hold && held_take(d)) {
        w->view = *v;
        held_link(c->l, w);
    } else if ((w->payload = take_buffer(c, rest_len, &w->payload_cap)) != NULL) {
        memcpy(w->payload, rest, rest_len);
        rest = w->payload;
        d->held_copied += hold; /* the cap was full */
        kw_cache_release(v);
    } else {
        kw_cache_release(v);
        write_free(w);
        kw__conn_close(c); /* part of the frame may be out: cannot go on */
        return;
    }
    b[nb++] = uv_buf_init((char *)rest, (unsigned)rest_len);
    memset(v, 0, sizeof *v); /* w holds it now, or it was released */
    queue_write(c, w, b, nb);
}

void kw__conn_send_view_frame(kw__conn *c, const uint8_t *frame, size_t len,
                              bool owned, kw_cache_view *v)
{
    bool first = c->queued == 0; /* the reply goes on the wire now */
    ssize_t n = c->closing ? UV_ECANCELED
                           : write_now(c, (uint8_t *)frame, len, v);
    bool rest = n >= 0 && (size_t)n < len + v->len;
    write_req *w = rest ? kw_calloc(1, sizeof *w) : NULL;
    uint8_t *own = w == NULL || owned ? (uint8_t *)frame : kw_malloc(len);
    if (w == NULL || own == NULL) { /* all written at once (the usual
                                       case), or lost */
        if (owned)
            free((uint8_t *)frame);
        free(w);
        kw_cache_release(v);
        if (rest || n < 0)
            kw__conn_close(c);
        else
            c->progress_at = uv_now(&c->l->loop);
        return;
    }
    if (own != frame)
        memcpy(own, frame, len); /* the memo's header: queued, so copied */
    *w = (write_req){.conn = c, .frame = own,
                     .bytes = len + v->len - (size_t)n};
    queue_view(c, w, (size_t)n, len, v, first);
}

void kw__conn_send_then(kw__conn *c, uint8_t *frame, size_t len,
                        bool close_after, kw__conn_done_fn done, void *arg)
{
    write_req *w = c->closing ? NULL : kw_calloc(1, sizeof *w);
    if (w == NULL) {
        free(frame);
        if (done != NULL)
            done(arg, len);
        /* A frame lost out of memory would leave the client waiting for
         * it: the connection is closed instead (issue 23). */
        kw__conn_close(c);
        return;
    }
    *w = (write_req){.conn = c, .frame = frame, .close_after = close_after,
                     .bytes = len, .done = done, .done_arg = arg};
    uv_buf_t b = uv_buf_init((char *)frame, (unsigned)len);
    queue_write(c, w, &b, 1);
}

void kw__conn_send_frame(kw__conn *c, uint8_t *frame, size_t len,
                         bool close_after)
{
    kw__conn_send_then(c, frame, len, close_after, NULL, NULL);
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
    kw__conn_send_frame(c, frame, len, false);
}

void kw__conn_error(kw__conn *c, int code, const char *msg, bool close_after)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    kw__alloc_fail = false; /* the test hook fails a request, not its error */
    if (kw_proto_error_frame(code, msg, &frame, &len) < 0) {
        kw__conn_close(c);
        return;
    }
    kw__conn_send_frame(c, frame, len, close_after);
}

/* ---- refusing a peer ---------------------------------------------------- */

static void on_shutdown(uv_shutdown_t *req, int status)
{
    kw__conn *c = req->data;
    (void)status;
    free(req);
    kw__conn_unref(c);
}

void kw__conn_refuse(kw__conn *c, int code, const char *msg)
{
    /* Closing a socket whose peer sent bytes we did not read makes the
     * kernel answer with a reset, which can destroy the error frame before
     * the peer reads it ("Broken pipe").  So: send the frame, shut our
     * side down, read and discard until the peer closes (or the idle
     * timer gives up), then close. */
    c->refusing = true;
    kw__conn_error(c, code, msg, false);
    uv_shutdown_t *req = kw_malloc(sizeof *req);
    if (req == NULL) {
        kw__conn_close(c);
        return;
    }
    req->data = c;
    c->refs++;
    if (uv_shutdown(req, (uv_stream_t *)&c->pipe, on_shutdown) < 0) {
        c->refs--;
        free(req);
    }
    update_reading(c);
}

/* ---- the backlog: pipelined frames left after a read ------------------- */

/* A frame that broke the protocol: one ERROR frame (naming both versions
 * when only the version is wrong), then reading stops for good and the
 * connection closes once the frame is written: whatever else the peer
 * sent is never parsed, logged or counted (issue 23). */
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
    c->broken = true;
    c->len = 0;
    update_reading(c);
    kw__conn_error(c, rc, rc == KW_EVERSION ? msg : NULL, true);
}

/* Runs each connection of the backlog once more (KW__FRAMES_PER_READ
 * frames); stops itself when the backlog is empty. */
static void on_resume(uv_idle_t *h)
{
    kw__loop *l = h->data;
    kw__conn *list = l->backlog;
    l->backlog = NULL;
    while (list != NULL) {
        kw__conn *c = list;
        list = c->next_backlog;
        c->in_backlog = false;
        if (!c->closing)
            process(c);
        kw__conn_unref(c); /* the reference backlog_add() took */
    }
    if (l->backlog == NULL)
        uv_idle_stop(h);
}

void kw__loop_backlog_init(kw__loop *l)
{
    uv_idle_init(&l->loop, &l->resume);
    l->resume.data = l;
}

/* Queues c to be processed again on the next loop iteration. */
static void backlog_add(kw__conn *c)
{
    kw__loop *l = c->l;
    if (c->in_backlog)
        return;
    c->in_backlog = true;
    c->next_backlog = l->backlog;
    l->backlog = c;
    c->refs++; /* dropped when the backlog is run (see process) */
    uv_idle_start(&l->resume, on_resume);
}

/* True while c may serve another buffered request now. */
static bool may_serve(const kw__conn *c)
{
    return !c->closing && !c->active && !c->throttled && !c->refusing &&
           !c->broken && !c->l->stopping;
}

/* Parses and serves buffered requests, at most KW__FRAMES_PER_READ per
 * call, stopping while one is under way or the output queue is over its
 * cap; frames left over are served on the next loop iteration (the
 * backlog), so one pipelining client cannot hold the loop.  A protocol
 * error gets one ERROR frame, then the connection closes. */
static void process(kw__conn *c)
{
    int n = 0;
    for (; n < KW__FRAMES_PER_READ && may_serve(c); n++) {
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
        c->d->up.dispatch(c, &m);
        kw_msg_destroy(&m);
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
        update_reading(c); /* one request at a time; the output cap */
    }
    if (n == KW__FRAMES_PER_READ && may_serve(c) && c->len > 0)
        backlog_add(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    kw__conn *c = h->data;
    (void)suggested;
    if (c->refusing) /* input is only drained */
        c->len = 0;
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
    if (c->refusing || c->broken)
        return;
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
    if (c->closing || c->l->stopping)
        return; /* stopping: the connection closes after its last frame */
    uv_timer_again(&c->idle);
    update_reading(c);
    process(c);
}

static void on_idle(uv_timer_t *t)
{
    kw__conn *c = t->data;
    kw__daemon *d = c->d;
    uint64_t stalled = uv_now(&c->l->loop) - c->progress_at;
    if (c->queued > 0 && stalled >= d->opts->idle_timeout_ms) {
        KW_LOG(KW_LOG_WARNING, "uid %u: %zu bytes of replies unread for %u ms; "
               "closing", (unsigned)c->uid, c->queued, d->opts->idle_timeout_ms);
        kw__conn_close(c);
        return;
    }
    if (c->active != NULL || c->queued > 0)
        return; /* a long warmup, or a reader still reading, is not idle */
    if (!c->refusing)
        KW_LOG(KW_LOG_INFO, "uid %u: idle for %u ms; closing", (unsigned)c->uid,
               d->opts->idle_timeout_ms);
    kw__conn_close(c);
}

void kw__conn_start(kw__conn *c, unsigned idle_ms)
{
    uv_timer_start(&c->idle, on_idle, idle_ms, idle_ms);
    update_reading(c);
}

kw__conn *kw__conn_new(kw__loop *l)
{
    kw__daemon *d = l->d;
    kw__conn *c = kw_calloc(1, sizeof *c);
    uint8_t *buf = kw_malloc(KW_PROTO_MAX_REQUEST);
    if (c == NULL || buf == NULL) {
        free(c);
        free(buf);
        return NULL;
    }
    c->d = d;
    c->l = l;
    c->buf = buf;
    uv_pipe_init(&l->loop, &c->pipe, 0);
    uv_timer_init(&l->loop, &c->idle);
    c->pipe.data = c->idle.data = c;
    c->handles = 2;
    c->progress_at = uv_now(&l->loop);
    c->next = l->conns;
    if (l->conns)
        l->conns->prev = c;
    l->conns = c;
    d->nconns++;
    return c;
}
