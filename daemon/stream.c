/* stream.c: one request's reply stream and its budget, the frames its
 * producers make (kw__req_), the charge of its keys against
 * --max-keys-in-flight, and the loop's outbox that brings them to the
 * loop thread (jobs.h says how they fit). */
#include "jobs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

/* The error frame of last resort: fixed text, no cJSON. */
static uint8_t *oom_frame(size_t *len)
{
    static const char json[] = "{\"error\":\"out of memory\","
                               "\"code\":\"KW_ENOMEM\"}";
    uint8_t *f = kw_malloc(KW_PROTO_HEAD_LEN + sizeof json - 1);
    if (f == NULL)
        return NULL;
    kw_proto_encode_head(f, KW_PROTO_ERROR, sizeof json - 1, 0);
    memcpy(f + KW_PROTO_HEAD_LEN, json, sizeof json - 1);
    *len = KW_PROTO_HEAD_LEN + sizeof json - 1;
    return f;
}

kw__stream *kw__stream_new(kw__req *owner, size_t max_bytes,
                           _Atomic size_t *total, size_t max_total)
{
    kw__stream *s = kw_calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    if ((s->last_resort = oom_frame(&s->last_resort_len)) == NULL ||
        pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s->last_resort);
        free(s);
        return NULL;
    }
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s->last_resort);
        free(s);
        return NULL;
    }
    s->max_bytes = max_bytes;
    s->total = total;
    s->max_total = max_total;
    s->owner = owner;
    s->refs = 1;
    return s;
}

/* Full: past its own budget, or every stream's together (jobs.h). */
static bool full_locked(const kw__stream *s)
{
    return s->frames > 0 &&
           (s->bytes >= s->max_bytes || s->frames >= KW__STREAM_FRAMES ||
            atomic_load(s->total) >= s->max_total);
}

/* Charges and posts frame for r (s->mu held on entry, released here).
 * Returns 0, 1 when the budget is full after it, or a negative code. */
static int post_unlock(kw__req *r, kw__stream *s, uint8_t *frame, size_t len)
{
    if (s->aborted) {
        pthread_mutex_unlock(&s->mu);
        free(frame);
        return -ECANCELED;
    }
    kw__out *o = frame != NULL ? kw_calloc(1, sizeof *o) : NULL;
    if (o == NULL) {
        s->lost = true;
        pthread_mutex_unlock(&s->mu);
        free(frame);
        return KW_ENOMEM;
    }
    s->bytes += len;
    s->frames++;
    atomic_fetch_add(s->total, len);
    bool full = full_locked(s);
    pthread_mutex_unlock(&s->mu);
    *o = (kw__out){.req = r, .frame = frame, .len = len, .charged = true};
    kw__stream_post(o);
    return full;
}

int kw__stream_push(kw__req *r, uint8_t *frame, size_t len)
{
    kw__stream *s = r->s;
    pthread_mutex_lock(&s->mu);
    while (full_locked(s) && !s->aborted)
        pthread_cond_wait(&s->cv, &s->mu); /* parked: the client is slow */
    int rc = post_unlock(r, s, frame, len);
    return rc > 0 ? 0 : rc;
}

int kw__stream_push_nowait(kw__req *r, uint8_t *frame, size_t len)
{
    kw__stream *s = r->s;
    pthread_mutex_lock(&s->mu);
    return post_unlock(r, s, frame, len);
}

/* Room for a producer to go on: the budget drained to half, and every
 * stream's to half; or nothing of this one in flight (so that streams
 * whose clients read never wait on those that do not). */
static bool room_locked(const kw__stream *s)
{
    return s->frames == 0 ||
           (s->bytes <= s->max_bytes / 2 && s->frames <= KW__STREAM_FRAMES / 2 &&
            atomic_load(s->total) <= s->max_total / 2);
}

bool kw__stream_park(kw__req *r)
{
    kw__stream *s = r->s;
    pthread_mutex_lock(&s->mu);
    bool now = s->aborted || room_locked(s);
    s->parked = !now;
    pthread_mutex_unlock(&s->mu);
    return now;
}

void kw__stream_pause_job(kw__req *r)
{
    kw__stream *s = r->s;
    pthread_mutex_lock(&s->mu);
    if (!s->paused && s->job != NULL && !s->aborted && full_locked(s)) {
        s->paused = true;
        kw_warm_job_pause(s->job);
    }
    pthread_mutex_unlock(&s->mu);
}

bool kw__stream_lost(kw__stream *s)
{
    pthread_mutex_lock(&s->mu);
    bool lost = s->lost || s->aborted;
    pthread_mutex_unlock(&s->mu);
    return lost;
}

void kw__stream_end(kw__req *r, uint8_t *frame, size_t len,
                    void (*on_loop)(kw__req *r))
{
    kw__stream *s = r->s;
    pthread_mutex_lock(&s->mu);
    bool lost = s->lost;
    pthread_mutex_unlock(&s->mu);
    if (lost) { /* the stream has a hole: its end must not look whole */
        free(frame);
        frame = NULL;
        r->failed = true;
        if (kw_proto_error_frame(KW_ENOMEM, "reply incomplete: frames were "
                                 "lost (out of memory)", &frame, &len) < 0)
            frame = NULL;
    }
    if (frame == NULL && on_loop == NULL) {
        frame = s->last_resort;
        len = s->last_resort_len;
        s->last_resort = NULL;
        r->failed = true;
    }
    s->fin = (kw__out){.req = r, .frame = frame, .len = len, .done = true,
                       .on_loop = on_loop};
    kw__stream_post(&s->fin);
}

void kw__stream_uncharge(kw__stream *s, size_t len)
{
    pthread_mutex_lock(&s->mu);
    s->bytes -= len;
    s->frames--;
    atomic_fetch_sub(s->total, len);
    bool room = room_locked(s);
    kw_warm_job *resume = room && s->paused ? s->job : NULL;
    kw__req *requeue = room && s->parked ? s->owner : NULL;
    if (resume != NULL)
        s->paused = false;
    if (requeue != NULL)
        s->parked = false;
    if (room)
        pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (resume != NULL)
        kw_warm_job_resume(resume);
    if (requeue != NULL)
        kw__jobs_push(requeue->d, requeue); /* its handler goes on */
}

void kw__stream_abort(kw__stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->aborted = true;
    kw_warm_job *job = s->job;
    kw__req *requeue = s->parked ? s->owner : NULL;
    /* A detached warmup (issue 24) outlives its client: not cancelled,
     * and resumed if the budget had paused it, since nothing drains now. */
    bool keep = s->detached, resume = keep && s->paused;
    s->paused = s->paused && !keep;
    s->parked = false;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (requeue != NULL)
        kw__jobs_push(requeue->d, requeue); /* to see the abort and end */
    if (job != NULL && !keep)
        kw_warm_job_cancel(job); /* and resumed, when it was paused */
    else if (job != NULL && resume)
        kw_warm_job_resume(job);
}

void kw__stream_unref(kw__stream *s)
{
    if (s == NULL || --s->refs > 0)
        return;
    kw_warm_job_release(s->job);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->last_resort);
    free(s);
}

/* ---- what producers post ---------------------------------------------- */

/* Encodes h as a frame of type; NULL when h is NULL or out of memory. */
static uint8_t *encode(uint16_t type, const cJSON *h, size_t *len)
{
    uint8_t *frame = NULL;
    if (h == NULL || kw_proto_encode(type, h, NULL, 0, &frame, len) < 0)
        return NULL;
    return frame;
}

int kw__req_progress(kw__req *r, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(KW_PROTO_PROGRESS, h, &len);
    if (frame == NULL) {
        kw__stream_push(r, NULL, 0); /* marks the hole: nothing is sent */
        return KW_ENOMEM;
    }
    return kw__stream_push(r, frame, len);
}

int kw__req_progress_yield(kw__req *r, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(KW_PROTO_PROGRESS, h, &len);
    return kw__stream_push_nowait(r, frame, len); /* NULL: marks the hole */
}

int kw__req_progress_nowait(kw__req *r, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(KW_PROTO_PROGRESS, h, &len);
    int rc = frame ? kw__stream_push_nowait(r, frame, len)
                   : kw__stream_push_nowait(r, NULL, 0);
    if (rc == 1)
        kw__stream_pause_job(r);
    return frame ? (rc > 0 ? 0 : rc) : KW_ENOMEM;
}

void kw__req_finish(kw__req *r, uint16_t type, const cJSON *h)
{
    size_t len = 0;
    uint8_t *frame = encode(type, h, &len);
    if (frame == NULL && h != NULL) { /* the reply did not fit in memory */
        kw__req_error(r, KW_ENOMEM, "reply could not be encoded");
        return;
    }
    kw__stream_end(r, frame, len, NULL);
}

void kw__req_error(kw__req *r, int code, const char *msg)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    kw__alloc_fail = false; /* the test hook fails a request, not its error */
    r->failed = true; /* read on the loop once the request ends (metrics) */
    if (kw_proto_error_frame(code, msg, &frame, &len) < 0)
        frame = NULL; /* the stream's error frame of last resort */
    kw__stream_end(r, frame, len, NULL);
}

int kw__req_charge_keys(kw__req *r, size_t n, char *err, size_t errlen)
{
    kw__daemon *d = r->d;
    uint64_t max = d->opts->max_keys_in_flight;
    uint64_t cur = atomic_load(&d->keys_in_flight);
    do {
        if (cur + n > max) {
            atomic_fetch_add(&d->refused_keys, 1);
            snprintf(err, errlen, "%zu keys would pass the budget of keys in "
                     "flight (--max-keys-in-flight %llu; %llu in flight now): "
                     "retry when other requests are over", n,
                     (unsigned long long)max, (unsigned long long)cur);
            return -EBUSY;
        }
    } while (!atomic_compare_exchange_weak(&d->keys_in_flight, &cur, cur + n));
    r->keys_charged = n;
    return 0;
}

/* ---- the outbox: frames from job and warm threads -------------------- */

void kw__stream_post(kw__out *o)
{
    kw__loop *l = o->req->conn->l;
    atomic_fetch_add(&o->req->hb_pending, 1);
    pthread_mutex_lock(&l->out_mu);
    kw_queue_push(&l->outq, &o->node);
    pthread_mutex_unlock(&l->out_mu);
    uv_async_send(&l->outbox);
}

/* A charged frame of the stream arg was written or dropped: it leaves
 * the budget, and the reference its write held goes. */
static void on_charged_done(void *arg, size_t len)
{
    kw__stream *s = arg;
    kw__stream_uncharge(s, len);
    kw__stream_unref(s);
}

/* Sends or drops one posted item, then ends its request when done.  While
 * stopping, the connection closes after a request's last frame.  A
 * charged frame is uncharged from the request's stream once written or
 * dropped (the write holds a reference on the stream, which may outlive
 * its request); the final item is the stream's own envelope (not
 * freed).  Each item taken counts for r's heartbeat (heartbeat.c): one
 * fewer waits, and r was heard from now. */
static void deliver(kw__loop *l, kw__out *o)
{
    kw__req *r = o->req;
    kw__conn *c = r->conn;
    bool done = o->done, close_after = done && l->stopping;
    if (o->on_loop != NULL)
        o->on_loop(r);
    if (o->frame != NULL && !c->closing && o->charged) {
        r->s->refs++;
        kw__conn_send_then(c, o->frame, o->len, close_after, on_charged_done,
                           r->s);
    } else if (o->frame != NULL && !c->closing) {
        kw__conn_send_frame(c, o->frame, o->len, close_after);
    } else if (o->frame != NULL) {
        free(o->frame);
        if (o->charged)
            kw__stream_uncharge(r->s, o->len);
    }
    if (close_after && o->frame == NULL)
        kw__conn_close(c);
    r->hb_last = uv_now(&l->loop);
    atomic_fetch_sub(&r->hb_pending, 1);
    if (!done)
        free(o);
    else
        r->d->up.end(r); /* o is r's stream's: freed with it */
}

/* The outbox's async callback: drains the whole queue (sends coalesce). */
static void on_outbox(uv_async_t *h)
{
    kw__loop *l = h->data;
    pthread_mutex_lock(&l->out_mu);
    kw_queue_node *n = kw_queue_take(&l->outq, 0, NULL);
    pthread_mutex_unlock(&l->out_mu);
    while (n != NULL) {
        kw_queue_node *next = n->next; /* deliver frees the item */
        deliver(l, KW_QUEUE_ENTRY(n, kw__out, node));
        n = next;
    }
}

int kw__loop_outbox_init(kw__loop *l)
{
    int rc = -pthread_mutex_init(&l->out_mu, NULL);
    if (rc == 0 && (rc = uv_async_init(&l->loop, &l->outbox, on_outbox)) < 0)
        pthread_mutex_destroy(&l->out_mu);
    l->outbox.data = l;
    return rc;
}
