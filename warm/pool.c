/* pool.c: the compile worker pool (pool.h).
 *
 * Each slot holds one kwarm-compile process and the parent's end of a
 * socketpair that is the worker's stdin and stdout.  A socketpair rather
 * than two pipes: one fd per worker, and send(MSG_NOSIGNAL) turns a dead
 * worker into -EPIPE instead of a SIGPIPE that would kill kwarmd.
 *
 * A caller takes a free slot under the mutex, then talks to its worker with
 * the mutex released; only that caller touches the slot's pid and fd until
 * it gives the slot back.  So only the owner kills, reaps and replaces a
 * worker, and a pid is never signalled after it was reaped (no pid reuse
 * race).  kw__pool_cancel() therefore does not kill anything itself: it
 * makes an eventfd readable, which every owner polls beside its worker's
 * fd, and wakes the callers waiting for a slot.
 */
#include "pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "pool_frame.h"
#include "pool_internal.h"

/* ------------------------------------------------------------------------
 * Lifecycle. */

/* Checks o and copies it into a new pool.  Returns 0 or a code (err set). */
static int pool_new(kw__pool **out, const kw__pool_opts *o, char *err,
                    size_t errlen)
{
    if (o == NULL || o->jobs == 0 || o->jobs > KW__POOL_MAX_JOBS) {
        snprintf(err, errlen, "compile pool: jobs must be 1 to %u",
                 KW__POOL_MAX_JOBS);
        return KW_EINVAL;
    }
    kw__pool *p = kw_calloc(1, sizeof *p + o->jobs * sizeof p->slots[0]);
    if (p == NULL) {
        snprintf(err, errlen, "compile pool: out of memory");
        return KW_ENOMEM;
    }
    int rc = 0;
    if (o->helper == NULL)
        rc = kw__pool_find_helper(p->helper, sizeof p->helper);
    else if (strlen(o->helper) >= sizeof p->helper)
        rc = KW_ENOSPC;
    else
        strcpy(p->helper, o->helper);
    if (rc < 0) {
        snprintf(err, errlen, rc == -ENOENT
                                  ? "compile helper kwarm-compile not found "
                                    "(set KWARM_COMPILE_HELPER)"
                                  : "compile helper path too long");
        free(p);
        return rc;
    }
    p->jobs = o->jobs;
    p->timeout_ms = o->timeout_ms ? o->timeout_ms : KW__POOL_DEFAULT_TIMEOUT_MS;
    p->mem_limit = o->mem_limit ? o->mem_limit : KW__POOL_DEFAULT_MEM_LIMIT;
    p->cancel_fd = -1;
    for (unsigned i = 0; i < p->jobs; i++)
        p->slots[i] = (kw__pool_slot){.pid = -1, .fd = -1};
    *out = p;
    return 0;
}

/* Ends every worker and frees p (no thread may be inside compile). */
static void pool_free(kw__pool *p)
{
    for (unsigned i = 0; i < p->jobs; i++)
        kw__pool_slot_end(p, &p->slots[i], 0, NULL);
    if (p->cancel_fd >= 0)
        close(p->cancel_fd);
    if (p->sync_init) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
    }
    free(p);
}

int kw__pool_start(kw__pool **out, const kw__pool_opts *o, char *err,
                   size_t errlen)
{
    kw__pool *p = NULL;
    int rc = pool_new(&p, o, err, errlen);
    if (rc < 0)
        return rc;
    if (access(p->helper, X_OK) < 0) {
        rc = -errno;
        snprintf(err, errlen, "compile helper %s: %s", p->helper,
                 strerror(errno));
        goto fail;
    }
    p->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->cancel_fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "compile pool: eventfd: %s", strerror(errno));
        goto fail;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto fail_nomem;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        goto fail_nomem;
    }
    p->sync_init = true;
    p->nfree = p->jobs;
    for (unsigned i = 0; i < p->jobs; i++)
        if ((rc = kw__pool_slot_spawn(p, &p->slots[i], err, errlen)) < 0)
            goto fail;
    for (unsigned i = 0; i < p->jobs; i++)
        if ((rc = kw__pool_slot_hello(p, &p->slots[i], err, errlen)) < 0)
            goto fail;
    p->started = true;
    *out = p;
    return 0;
fail_nomem:
    rc = KW_ENOMEM;
    snprintf(err, errlen, "compile pool: out of memory");
fail:
    pool_free(p);
    return rc;
}

void kw__pool_cancel(kw__pool *p)
{
    if (p == NULL || atomic_exchange(&p->cancelled, true))
        return;
    uint64_t one = 1;
    /* Never drained: the eventfd stays readable for every later poll. */
    while (write(p->cancel_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void kw__pool_stop(kw__pool *p)
{
    if (p == NULL)
        return;
    kw__pool_cancel(p);
    pthread_mutex_lock(&p->mu);
    while (p->inside > 0)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pool_free(p);
}

void kw__pool_get_counts(kw__pool *p, kw__pool_counts *out)
{
    if (p == NULL || out == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    out->busy = p->jobs - p->nfree;
    out->waiting = p->inside - out->busy;
    pthread_mutex_unlock(&p->mu);
    out->live = atomic_load(&p->live);
    out->replaced = atomic_load(&p->replaced);
}

void kw__pool_result_destroy(kw__pool_result *r)
{
    if (r == NULL)
        return;
    free(r->cubin);
    free(r->log);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------------
 * One compile. */

/* Waits for a free slot and marks it busy.  Returns it, or NULL once the
 * pool is cancelled.  Counts the caller in p->inside either way until
 * release_slot() (or, for NULL, until it returns). */
static kw__pool_slot *acquire_slot(kw__pool *p)
{
    kw__pool_slot *s = NULL;
    pthread_mutex_lock(&p->mu);
    p->inside++;
    while (!atomic_load(&p->cancelled) && p->nfree == 0)
        pthread_cond_wait(&p->cv, &p->mu);
    if (atomic_load(&p->cancelled)) {
        if (--p->inside == 0)
            pthread_cond_broadcast(&p->cv); /* kw__pool_stop() waits */
    } else {
        for (unsigned i = 0; s == NULL; i++)
            if (!p->slots[i].busy)
                s = &p->slots[i];
        s->busy = true;
        p->nfree--;
    }
    pthread_mutex_unlock(&p->mu);
    return s;
}

static void release_slot(kw__pool *p, kw__pool_slot *s)
{
    pthread_mutex_lock(&p->mu);
    s->busy = false;
    p->nfree++;
    p->inside--;
    if (atomic_load(&p->cancelled))
        pthread_cond_broadcast(&p->cv);
    else
        pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Sends k's REQUEST to the worker of s.  A worker that died while idle
 * (the OOM killer, a stray signal) is replaced once and the request sent
 * again, since this key never reached it.  Returns 0 or a code with msg
 * set; *start_failed tells that the replacement could not start. */
static int send_request(kw__pool *p, kw__pool_slot *s, const kw_keys_key *k,
                        char *msg, size_t cap, bool *start_failed)
{
    uint8_t frame[KW__POOL_HDR_LEN + KW__POOL_REQ_LEN];
    kw__pool_hdr_put(frame, KW__POOL_T_REQUEST, KW__POOL_REQ_LEN);
    kw__pool_req_put(frame + KW__POOL_HDR_LEN, k);
    int rc = kw__pool_write_all(s->fd, frame, sizeof frame);
    if (rc == 0)
        return 0;
    kw__pool_slot_end(p, s, 0, NULL);
    if ((rc = kw__pool_slot_start(p, s, msg, cap)) < 0) {
        *start_failed = true;
        return rc;
    }
    if (kw__pool_write_all(s->fd, frame, sizeof frame) < 0)
        return kw__pool_slot_end_crashed(p, s, true, msg, cap);
    return 0;
}

/* Moves a checked RESPONSE body into res.  Returns 0 or KW_ENOMEM. */
static int take_response(const kw__pool_resp_head *h, const uint8_t *body,
                         kw__pool_result *res)
{
    const uint8_t *entry = body + KW__POOL_RESP_FIXED;
    const uint8_t *log = entry + h->entry_len, *cubin = log + h->log_len;
    memcpy(res->entry, entry, h->entry_len);
    res->entry[h->entry_len] = '\0';
    res->seconds = h->seconds;
    if (h->log_len > 0) {
        if ((res->log = kw_malloc(h->log_len + 1)) == NULL)
            return KW_ENOMEM;
        memcpy(res->log, log, h->log_len);
        res->log[h->log_len] = '\0';
    }
    if (h->cubin_len > 0) {
        if ((res->cubin = kw_malloc(h->cubin_len)) == NULL)
            return KW_ENOMEM;
        memcpy(res->cubin, cubin, h->cubin_len);
        res->cubin_len = h->cubin_len;
    }
    return 0;
}

/* Reads the RESPONSE to the request just sent, within the compile timeout.
 * Returns the compile's rc (0, KW_ENVRTC, KW__POOL_EMEMLIMIT...) with res
 * filled and *answered set, or a failure to get an answer:
 * KW__POOL_ECANCELED, KW__POOL_ETIMEOUT, KW_EPROTO or KW_E2BIG (garbage),
 * -EPIPE (EOF), KW_ENOMEM (here), -errno. */
static int recv_response(kw__pool *p, kw__pool_slot *s, kw__pool_result *res,
                         bool *answered)
{
    uint64_t deadline = kw__pool_now_ms() + p->timeout_ms;
    uint8_t hdr[KW__POOL_HDR_LEN];
    uint32_t len;
    kw__pool_resp_head h;
    int rc = kw__pool_recv_full(p, s->fd, hdr, sizeof hdr, deadline);
    if (rc < 0 || (rc = kw__pool_hdr_parse(hdr, KW__POOL_T_RESPONSE, &len)) < 0)
        return rc;
    uint8_t *body = kw_malloc(len); /* len <= KW__POOL_MAX_RESP, checked */
    if (body == NULL)
        return KW_ENOMEM;
    if ((rc = kw__pool_recv_full(p, s->fd, body, len, deadline)) == 0 &&
        (rc = kw__pool_resp_parse(body, len, &h)) == 0 &&
        (rc = take_response(&h, body, res)) == 0) {
        *answered = true;
        rc = h.rc;
    }
    free(body);
    return rc;
}

/* Puts a one-line reason (then the worker's own log, if any) into res and
 * drops any output. */
static void fail_result(kw__pool_result *res, const char *why)
{
    free(res->cubin);
    res->cubin = NULL;
    res->cubin_len = 0;
    res->entry[0] = '\0';
    if (why[0] == '\0')
        return;
    size_t wl = strlen(why), ol = res->log ? strlen(res->log) : 0;
    char *log = kw_malloc(wl + ol + 2);
    if (log == NULL)
        return; /* the code still says what happened */
    memcpy(log, why, wl + 1);
    if (ol > 0) {
        log[wl] = '\n';
        memcpy(log + wl + 1, res->log, ol + 1);
    }
    free(res->log);
    res->log = log;
}

/* Ends the worker of s after a failed compile and says why in msg.
 * rc: what the compile returned; answered: whether the worker answered.
 * Returns the code the caller gets. */
static int end_failed_worker(kw__pool *p, kw__pool_slot *s, int rc,
                             bool answered, char *msg, size_t cap)
{
    if (s->pid < 0)
        return rc; /* already reaped by a failed start; msg is set */
    if (answered) { /* KW__POOL_EMEMLIMIT: its heap hit the limit */
        kw__pool_slot_end(p, s, 0, NULL);
        kw__pool_mem_msg(p, msg, cap);
        return rc;
    }
    if (rc == KW__POOL_ETIMEOUT) {
        kw__pool_slot_end(p, s, 0, NULL);
        snprintf(msg, cap, "compile worker killed after %g s",
                 p->timeout_ms / 1000.0);
        return rc;
    }
    if (rc == KW_ENOMEM) { /* ours: the stream is out of step now */
        kw__pool_slot_end(p, s, 0, NULL);
        return rc;
    }
    return kw__pool_slot_end_crashed(p, s, rc == -EPIPE, msg, cap);
}

/* Runs k on the worker of s (starting one first if the slot is empty) and
 * handles every way the worker can fail: kill, reap, reason, replace. */
static int run_on_slot(kw__pool *p, kw__pool_slot *s, const kw_keys_key *k,
                       kw__pool_result *res)
{
    char msg[PATH_MAX + 128] = "";
    bool answered = false, start_failed = s->pid < 0;
    int rc = s->pid > 0 ? 0 : kw__pool_slot_start(p, s, msg, sizeof msg);
    start_failed = start_failed && rc < 0;
    if (rc == 0 && (rc = send_request(p, s, k, msg, sizeof msg,
                                      &start_failed)) == 0)
        rc = recv_response(p, s, res, &answered);
    if (rc == KW__POOL_ECANCELED || atomic_load(&p->cancelled)) {
        kw__pool_slot_end(p, s, 0, NULL);
        kw__pool_result_destroy(res);
        return KW__POOL_ECANCELED;
    }
    if (answered && rc != KW__POOL_EMEMLIMIT)
        return rc; /* the worker answered and stays */
    rc = end_failed_worker(p, s, rc, answered, msg, sizeof msg);
    fail_result(res, msg);
    /* Replace it now, so the next caller finds a warm worker; a start that
     * just failed is not retried here but by the next caller. */
    if (!start_failed)
        kw__pool_slot_start(p, s, msg, sizeof msg);
    return rc;
}

int kw__pool_compile(kw__pool *p, const kw_keys_key *k, kw__pool_result *res)
{
    if (res == NULL)
        return KW_EINVAL;
    memset(res, 0, sizeof *res);
    /* A key the helper would refuse as a malformed frame fails here, not
     * by costing a worker. */
    if (p == NULL || k == NULL || (unsigned)k->family >= KW_K_NFAMILIES ||
        memchr(k->arch, '\0', sizeof k->arch) == NULL)
        return res->rc = KW_EINVAL;
    kw__pool_slot *s = acquire_slot(p);
    if (s == NULL)
        return res->rc = KW__POOL_ECANCELED;
    res->rc = run_on_slot(p, s, k, res);
    release_slot(p, s);
    return res->rc;
}
