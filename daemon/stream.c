/* stream.c: one request's reply stream and its budget (stream.h). */
#include "stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
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

kw__stream *kw__stream_new(kw__req *owner, size_t max_bytes)
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
    s->owner = owner;
    s->refs = 1;
    return s;
}

static bool full_locked(const kw__stream *s)
{
    return s->frames > 0 &&
           (s->bytes >= s->max_bytes || s->frames >= KW__STREAM_FRAMES);
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
    bool full = full_locked(s);
    pthread_mutex_unlock(&s->mu);
    *o = (kw__out){.req = r, .frame = frame, .len = len, .charged = true};
    kw__daemon_post(o);
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

/* Room for a producer to go on: the budget drained to half. */
static bool room_locked(const kw__stream *s)
{
    return s->bytes <= s->max_bytes / 2 && s->frames <= KW__STREAM_FRAMES / 2;
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
    kw__daemon_post(&s->fin);
}

void kw__stream_uncharge(kw__stream *s, size_t len)
{
    pthread_mutex_lock(&s->mu);
    s->bytes -= len;
    s->frames--;
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
    s->parked = false;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (requeue != NULL)
        kw__jobs_push(requeue->d, requeue); /* to see the abort and end */
    if (job != NULL)
        kw_warm_job_cancel(job); /* and resumed, when it was paused */
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
