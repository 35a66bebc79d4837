/* heartbeat.c: a warmup that has sent nothing for KW__HEARTBEAT_MS gets
 * a PROGRESS frame with no results,
 *   {"done": D, "total": T, "results": []}
 * so a client that bounds each wait (kw_client_set_timeout, the Python
 * client's timeout) can tell "kwarmd is stuck" from "one compile is slow":
 * without it a warmup is silent for as long as its slowest key compiles
 * (up to --compile-timeout).  Loop thread only, but for the atomics that
 * warm's threads write (kw__req's hb_* fields).
 *
 * Order on the wire: a heartbeat is written straight to the socket, so it
 * is sent only when no frame of the request waits in the outbox
 * (hb_pending 0).  Every frame posted before it has then gone out first,
 * and its "done" is the count of the last PROGRESS frame built, so the
 * counts a client sees never go down.  It is not sent to a client that is
 * not reading (bytes still queued: the idle timeout is the rule there), nor
 * before the keys are derived ("total" unknown), nor after the request's
 * RESULT (the request has ended and left c->active).
 */
#include "handlers.h"

/* How often the loop looks: a heartbeat goes out between KW__HEARTBEAT_MS
 * and KW__HEARTBEAT_MS + KW__HEARTBEAT_TICK_MS after the last frame. */
#define KW__HEARTBEAT_TICK_MS (KW__HEARTBEAT_MS / 4)

/* Sends r's heartbeat on c; out of memory, it is skipped (the next tick
 * tries again), not answered with an error frame as kw__conn_send() would:
 * that would end the client's warmup. */
static void beat(kw__conn *c, kw__req *r)
{
    cJSON *h = cJSON_CreateObject();
    uint8_t *frame = NULL;
    size_t len = 0;
    bool ok = h != NULL &&
              cJSON_AddNumberToObject(h, "done",
                                      (double)atomic_load(&r->hb_done)) != NULL &&
              cJSON_AddNumberToObject(h, "total",
                                      (double)atomic_load(&r->hb_total)) != NULL &&
              cJSON_AddArrayToObject(h, "results") != NULL &&
              kw_proto_encode(KW_PROTO_PROGRESS, h, NULL, 0, &frame, &len) == 0;
    cJSON_Delete(h);
    if (!ok)
        return;
    kw__conn_send_frame(c, frame, len, false);
    r->hb_last = uv_now(&c->l->loop);
}

static void on_tick(uv_timer_t *t)
{
    kw__loop *l = t->data;
    uint64_t now = uv_now(&l->loop);
    for (kw__conn *c = l->conns; c != NULL; c = c->next) {
        kw__req *r = c->active;
        if (r == NULL || r->type != KW_PROTO_WARMUP || c->closing ||
            c->queued > 0 || now - r->hb_last < KW__HEARTBEAT_MS ||
            atomic_load(&r->hb_total) == 0 || atomic_load(&r->hb_pending) > 0)
            continue;
        beat(c, r);
    }
}

void kw__heartbeat_init(kw__loop *l)
{
    uv_timer_init(&l->loop, &l->heartbeat);
    l->heartbeat.data = l;
}

void kw__heartbeat_begin(kw__req *r)
{
    kw__loop *l = r->conn->l;
    r->hb_last = uv_now(&l->loop);
    if (l->nwarmups++ == 0 && !l->done)
        uv_timer_start(&l->heartbeat, on_tick, KW__HEARTBEAT_TICK_MS,
                       KW__HEARTBEAT_TICK_MS);
}

void kw__heartbeat_end(kw__req *r)
{
    kw__loop *l = r->conn->l;
    if (--l->nwarmups == 0 && !l->done)
        uv_timer_stop(&l->heartbeat);
}
