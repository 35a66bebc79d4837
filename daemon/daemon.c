/* daemon.c: kwarmd's life cycle: start, serve, stop on a signal. */
#include "loops.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <sodium.h>
#include <systemd/sd-daemon.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"
#include "metrics.h"

void kw_daemon_opts_init(kw_daemon_opts *o)
{
    const char *run = getenv("XDG_RUNTIME_DIR"), *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    memset(o, 0, sizeof *o);
    if (getuid() == 0 || run == NULL)
        snprintf(o->socket_path, sizeof o->socket_path, "/run/kwarm/kwarm.sock");
    else
        snprintf(o->socket_path, sizeof o->socket_path, "%s/kwarm.sock", run);
    if (getuid() == 0)
        snprintf(o->cache_dir, sizeof o->cache_dir, "/var/cache/kwarm");
    else if (cache != NULL)
        snprintf(o->cache_dir, sizeof o->cache_dir, "%s/kwarm", cache);
    else
        snprintf(o->cache_dir, sizeof o->cache_dir, "%s/.cache/kwarm",
                 home ? home : "/tmp");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    o->jobs = n > 0 ? (unsigned)n : 1;      /* compile workers: the cores */
    o->compile_timeout_ms = 120 * 1000;     /* a compile past it is killed */
    o->compile_mem_limit = 4ull << 30;      /* address space of a worker */
    o->max_size = 0; /* not given: a new cache gets 1 GiB of cubins */
    o->idle_timeout_ms = 60 * 1000;         /* silent clients go after 60 s */
    o->max_output = 16u << 20;              /* replies queued per connection */
    o->max_connections = 1024;              /* open connections at once */
    o->max_keys_in_flight = 2000000;        /* keys of requests under way */
    o->max_held_reads = 64;                 /* snapshots held by replies */
    o->held_read_timeout_ms = 5000;         /* and for how long at most */
    o->loops = n >= 12 ? (unsigned)(n / 4 < 8 ? n / 4 : 8) : 2; /* serving
                                               loops: a quarter of the
                                               cores, 2 to 8 */
    o->log_level = 6;                       /* info */
    o->socket_mode = 0660;                  /* owner and group */
}

/* The flush test hook: with KWARMD_TEST_FLUSH_FIFOS=DIR, kwarmd writes
 * 'S' to the FIFO DIR/events when a flush starts and 'K' when a tick
 * finds one still running (and starts none), and each flush waits for
 * one byte on the FIFO DIR/hold before it flushes: a test holds a flush
 * and sees that the ticks meanwhile start no second one.  Tests only. */
static void init_flush_test_hook(kw__daemon *d)
{
    const char *dir = getenv("KWARMD_TEST_FLUSH_FIFOS");
    char path[4096];
    d->flush_ev_fd = d->flush_hold_fd = -1;
    if (dir == NULL)
        return;
    /* O_RDWR: neither open waits for the test's end of the FIFO. */
    snprintf(path, sizeof path, "%s/events", dir);
    d->flush_ev_fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    snprintf(path, sizeof path, "%s/hold", dir);
    d->flush_hold_fd = open(path, O_RDWR | O_CLOEXEC);
}

static void flush_test_event(const kw__daemon *d, char ev)
{
    if (d->flush_ev_fd >= 0 && write(d->flush_ev_fd, &ev, 1) < 0)
        KW_LOG(KW_LOG_DEBUG, "test hook: flush event lost");
}

static void close_flush_test_hook(kw__daemon *d)
{
    if (d->flush_ev_fd >= 0)
        close(d->flush_ev_fd);
    if (d->flush_hold_fd >= 0)
        close(d->flush_hold_fd);
}

/* Writes recorded cache hits off the loop thread (an LMDB write txn). */
static void flush_work(uv_work_t *w)
{
    kw__daemon *d = w->data;
    char b;
    if (d->flush_hold_fd >= 0) /* tests only: held until released */
        while (read(d->flush_hold_fd, &b, 1) < 0 && errno == EINTR)
            ;
    kw_cache_flush(d->cache);
    kw__audit_flush(&d->audit); /* the miss audit's file, off the loop too */
}

static void flush_done(uv_work_t *w, int status)
{
    kw__daemon *d = w->data;
    (void)status;
    d->flushing = false; /* the next tick may start one */
    free(w);
}

/* Logs the fleet tier going down or coming back (cache/ never logs), as
 * seen on the flush timer's tick. */
static void log_remote_state(kw__daemon *d)
{
    if (d->remote == NULL)
        return;
    int down = kw_remote_is_down(d->remote);
    if (down == d->remote_down)
        return;
    kw_remote_stats rs;
    kw_remote_stats_get(d->remote, &rs);
    if (down)
        KW_LOG(KW_LOG_WARNING, "fleet tier %s is down: Redis calls fail or "
               "time out (%llu failed so far); compiling and serving from the "
               "local cache, reconnecting with backoff", d->opts->remote_url,
               (unsigned long long)rs.errors);
    else
        KW_LOG(KW_LOG_INFO, "fleet tier %s is %s", d->opts->remote_url,
               d->remote_down < 0 ? "reachable" : "back");
    d->remote_down = down;
}

static void on_flush_timer(uv_timer_t *t)
{
    kw__daemon *d = t->data;
    log_remote_state(d);
    /* Idle since the last tick: hand the heap the busy period grew (glibc
     * keeps per-thread arenas) back to the system, once per idle spell. */
    if (d->requests == d->requests_at_tick && d->requests != d->requests_trimmed) {
        malloc_trim(0);
        d->requests_trimmed = d->requests;
    }
    d->requests_at_tick = d->requests;
    /* One flush at a time: a slow one (an fsync, a rewrite of
     * misses.jsonl) is not joined by the next tick's (issue 23). */
    if (d->flushing) {
        flush_test_event(d, 'K');
        return;
    }
    uv_work_t *w = kw_malloc(sizeof *w);
    if (w == NULL)
        return;
    w->data = d;
    if (uv_queue_work(&d->loop, w, flush_work, flush_done) < 0) {
        free(w);
        return;
    }
    d->flushing = true;
    flush_test_event(d, 'S');
}

/* The end of a stop: every serving loop has ended, so everything a
 * request could still post has been delivered; close the last handles,
 * and the main loop ends by itself. */
static void finish_stop(kw__daemon *d)
{
    d->stopped = true;
    KW_LOG(KW_LOG_DEBUG, "stop: requests over after %llu ms",
           (unsigned long long)(uv_now(&d->loop) - d->stop_at));
    kw__jobs_stop(d);       /* idle: every request taken has ended */
    kw__metrics_stop(d);    /* its handler reads warm and the cache */
    kw_warm_close(d->warm); /* every job got its last result */
    d->warm = NULL;
    uv_close((uv_handle_t *)&d->loop_done, NULL);
    uv_close((uv_handle_t *)&d->stop_timer, NULL);
}

/* A serving loop ended; the last one finishes the stop. */
static void on_loop_done(uv_async_t *h)
{
    kw__daemon *d = h->data;
    pthread_mutex_lock(&d->done_mu);
    if (d->nloops_done == d->nloops && d->stopping && !d->stopped)
        finish_stop(d);
    pthread_mutex_unlock(&d->done_mu);
}

/* The grace period is over: close what is still open, unless clients
 * are still reading (a write completed within the last grace period: a
 * warmup's 100,000 cancellations take a loaded client seconds to read,
 * and a client that reads its socket in large pieces leaves gaps), then
 * look again after KW__STOP_EXTEND_MS, up to KW__STOP_MAX_MS after the
 * signal.  Requests under way end as their (cancelled) results arrive. */
static void on_stop_timer(uv_timer_t *t)
{
    kw__daemon *d = t->data;
    uint64_t now = uv_now(&d->loop), last = atomic_load(&d->last_write_ms);
    uint64_t since = now - d->stop_at;
    bool reading = last + KW__STOP_GRACE_MS > now;
    if (reading && since + KW__STOP_EXTEND_MS <= KW__STOP_MAX_MS) {
        uv_timer_start(&d->stop_timer, on_stop_timer, KW__STOP_EXTEND_MS, 0);
        return;
    }
    KW_LOG(KW_LOG_WARNING, "stop: %zu connections still open after %llu ms "
           "(%s); closing them", (size_t)d->nconns, (unsigned long long)since,
           reading ? "still reading at the cap" : "no progress");
    kw__loops_tell(d, true);
}

/* SIGTERM/SIGINT: stop accepting, cancel every key not yet compiled (the
 * warm pipeline reports them cancelled, and kills running compiles), let
 * each warmup send its last frames, close idle connections now and the
 * others after their request's last frame (or after a grace period). */
/* SIGHUP is logged and ignored: kwarmd has nothing to reload (its flags
 * and --config are read once), and the default action would kill it
 * with a stale socket when the terminal of a `kwarmd &` closes. */
static void on_sighup(uv_signal_t *s, int signum)
{
    (void)s;
    KW_LOG(KW_LOG_WARNING, "signal %d (SIGHUP): ignored; kwarmd does not "
           "reload, restart it to apply new flags", signum);
}

static void on_signal(uv_signal_t *s, int signum)
{
    kw__daemon *d = s->data;
    if (d->stopping)
        return;
    d->stopping = true;
    d->stop_at = uv_now(&d->loop);
    if (d->alloc_at_stop > 0) /* tests only: fail an allocation of the stop */
        kw_alloc_fail_at(d->alloc_at_stop);
    KW_LOG(KW_LOG_INFO, "signal %d: stopping", signum);
    sd_notify(0, "STOPPING=1\nSTATUS=stopping");
    uv_close((uv_handle_t *)&d->listener, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sighup, NULL);
    uv_close((uv_handle_t *)&d->flush_timer, NULL);
    kw_warm_cancel(d->warm);
    kw__jobs_cancel(d);
    uv_timer_start(&d->stop_timer, on_stop_timer, KW__STOP_GRACE_MS, 0);
    kw__loops_tell(d, false); /* each ends once its requests are over */
}

/* Opens the fleet tier of --remote (warm/remote.c checks the key file,
 * so a bad one stops kwarmd before it serves). */
static int open_remote(kw__daemon *d, char *err, size_t errlen)
{
    const kw_daemon_opts *o = d->opts;
    return kw_warm_remote_open(&d->remote, o->remote_url, o->remote_key_file,
                               o->remote_timeout_ms, o->remote_lease_ms, err,
                               errlen);
}

/* Takes <cache>/kwarmd.lock (a POSIX write lock, held while the fd is
 * open): a second kwarmd on the same cache would double every compile and
 * fight over the size limit, so it is refused.  Prewarms may still share
 * the cache; they do not take this lock. */
static int lock_cache(kw__daemon *d, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/kwarmd.lock", d->opts->cache_dir);
    d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (d->lock_fd >= 0 && fcntl(d->lock_fd, F_SETLK, &fl) == 0)
        return 0;
    int e = errno;
    if (e == EACCES || e == EAGAIN)
        snprintf(err, errlen, "--cache: %s: another kwarmd uses this cache",
                 d->opts->cache_dir);
    else
        snprintf(err, errlen, "--cache: %s: %s", path, strerror(e));
    return -e;
}

/* Starts the warm pipeline and its compile worker processes. */
static int open_warm(kw__daemon *d, char *err, size_t errlen)
{
    const kw_daemon_opts *o = d->opts;
    kw_warm_opts wo = {.cache = d->cache, .remote = d->remote, .jobs = o->jobs,
                       .read_only = kw_cache_is_read_only(d->cache),
                       /* a warmup's hit is read, verified and counted as
                        * a get's is; a corrupt entry is dropped and
                        * compiled again */
                       .verify_hits = true,
                       .compile_timeout_ms = o->compile_timeout_ms,
                       .mem_limit = o->compile_mem_limit,
                       .helper = o->compile_helper[0] ? o->compile_helper : NULL};
    return kw_warm_open(&d->warm, &wo, err, errlen);
}

/* Opens everything kwarmd serves with, in order.  daemon.c owns the
 * cache handle: it opens, flushes and closes it; requests reach it
 * through warm/, but for the zero-copy hit path (dispatch.c, server.c). */
static int start(kw__daemon *d, char *err, size_t errlen)
{
    const kw_daemon_opts *o = d->opts;
    kw_cache_opts co = {.dir = o->cache_dir, .max_size = o->max_size,
                        .defer_writes = true, .read_only = o->read_only,
                        .auto_read_only = true};
    int rc = open_remote(d, err, errlen);
    if (rc == 0)
        rc = kw_cache_open(&d->cache, &co, err, errlen);
    uint64_t stored; /* as prewarm says it (issue 24) */
    if (rc == 0 && kw_cache_limit_differs(d->cache, o->max_size, &stored))
        KW_LOG(KW_LOG_WARNING, "--max-size %llu not applied: cache %s "
               "already stores a limit of %llu bytes, which stays in force "
               "(kwarm resize SIZE changes it)",
               (unsigned long long)o->max_size, o->cache_dir,
               (unsigned long long)stored);
    /* served, but a prewarm beside it may compile a key kwarmd compiles */
    if (rc == 0 && kw_cache_claims_note(d->cache) != NULL)
        KW_LOG(KW_LOG_WARNING, "no claims: %s", kw_cache_claims_note(d->cache));
    bool ro = rc == 0 && kw_cache_is_read_only(d->cache);
    d->read_only = ro;
    if (ro) /* serves hits, compiles nothing; kwarmd writes nothing there */
        KW_LOG(KW_LOG_INFO, "cache %s is read-only%s: hits are served, a miss "
               "is answered \"not cached (read-only cache)\"", o->cache_dir,
               o->read_only ? " (--read-only)" : " (not writable here)");
    if (rc == 0 && !ro) /* a read-only cache cannot be fought over */
        rc = lock_cache(d, err, errlen);
    if (rc == 0 && (rc = kw__audit_open(&d->audit, o->cache_dir,
                                        kw_cache_is_read_only(d->cache))) < 0)
        snprintf(err, errlen, "miss audit: %s", kw_strerror(rc));
    if (rc == 0)
        rc = open_warm(d, err, errlen);
    if (rc == 0 && (rc = uv_async_init(&d->loop, &d->loop_done,
                                       on_loop_done)) < 0)
        snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    d->loop_done.data = d;
    if (rc == 0 && (rc = kw__jobs_start(d)) < 0)
        snprintf(err, errlen, "job threads: %s", strerror(-rc));
    if (rc == 0) /* before the socket: a failure leaves no socket file */
        rc = kw__metrics_start(d, err, errlen);
    if (rc == 0)
        rc = kw__loops_start(d, err, errlen);
    if (rc == 0)
        rc = kw__daemon_listen(d, err, errlen);
    if (rc < 0)
        return rc;
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    uv_signal_init(&d->loop, &d->sighup);
    uv_timer_init(&d->loop, &d->flush_timer);
    uv_timer_init(&d->loop, &d->stop_timer);
    d->sigterm.data = d->sigint.data = d->sighup.data = d;
    d->flush_timer.data = d;
    d->stop_timer.data = d;
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_signal_start(&d->sighup, on_sighup, SIGHUP);
    uv_timer_start(&d->flush_timer, on_flush_timer, KW__FLUSH_MS, KW__FLUSH_MS);
    return 0;
}

/* Releases what a failed start left open, running the loop to close it. */
static void abort_start(kw__daemon *d)
{
    kw__loops_join(d, true); /* no connection yet: they end at once */
    kw__metrics_stop(d);
    kw__jobs_stop(d);
    kw_warm_close(d->warm);
    d->warm = NULL;
    if (d->loop_done.type != UV_UNKNOWN_HANDLE)
        uv_close((uv_handle_t *)&d->loop_done, NULL);
    if (d->listener.type != UV_UNKNOWN_HANDLE)
        uv_close((uv_handle_t *)&d->listener, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
}

/* Raises the soft limit on open files toward what max_connections needs
 * (the hard limit bounds it; --max-connections still holds the count). */
static void raise_fd_limit(unsigned max_connections)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)max_connections + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want
                                                                    : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want)
        KW_LOG(KW_LOG_WARNING, "open-file limit %llu is below what %u "
               "connections need", (unsigned long long)rl.rlim_cur,
               max_connections);
}

/* The fault-injection hook of tests (common/kw_alloc.h): with
 * KWARMD_TEST_ALLOC_HOOK set, a request's "test_fail_alloc": N fails the
 * N-th allocation made through kw_malloc and cJSON from its start, and a
 * PONG says whether the last armed one fired; KWARMD_TEST_ALLOC_AT_STOP=N
 * fails the N-th allocation after the stop signal. */
static void init_alloc_test_hook(kw__daemon *d)
{
    const char *stop = getenv("KWARMD_TEST_ALLOC_AT_STOP");
    d->alloc_hook = getenv("KWARMD_TEST_ALLOC_HOOK") != NULL;
    d->alloc_at_stop = stop ? strtoull(stop, NULL, 10) : 0;
    if (d->alloc_hook || d->alloc_at_stop > 0) {
        cJSON_Hooks hooks = {kw_malloc, free};
        cJSON_InitHooks(&hooks);
    }
}

int kw_daemon_run(const kw_daemon_opts *o, char *err, size_t errlen)
{
    kw__daemon d = {.opts = o, .lock_fd = -1, .remote_down = -1,
                    .done_mu = PTHREAD_MUTEX_INITIALIZER};
    snprintf(d.version, sizeof d.version, "%s", KW_VERSION);
    d.test_peercred_fail = getenv("KWARMD_TEST_PEERCRED_FAIL") != NULL;
    kw__alloc_hook_init();
    kw__daemon_upcalls(&d); /* before anything can call up */
    init_alloc_test_hook(&d);
    init_flush_test_hook(&d);
    /* Blocks of 1 MiB and more (a derivation's key arrays, grown by
     * realloc) are mapped on their own and unmapped when freed: with
     * glibc's sliding threshold they land in the job threads' arenas,
     * which keep tens of MB each after a big keys request (issue 23). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an EPIPE */
    raise_fd_limit(o->max_connections);
    int rc = uv_loop_init(&d.loop);
    if (rc < 0) {
        snprintf(err, errlen, "uv_loop_init: %s", uv_strerror(rc));
        return rc;
    }
    if ((rc = start(&d, err, errlen)) < 0) {
        abort_start(&d);
    } else {
        KW_LOG(KW_LOG_INFO, "kwarmd %s: cache %s, %u compile workers%s%s",
               d.version, o->cache_dir, o->jobs,
               d.remote ? ", fleet tier " : "", d.remote ? o->remote_url : "");
        sd_notifyf(0, "READY=1\nSTATUS=serving %s", o->socket_path);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        kw__loops_join(&d, false); /* each has ended: the stop waited */
        if (d.bound) /* ours to remove; systemd's socket is systemd's */
            unlink(o->socket_path);
        uv_update_time(&d.loop);
        KW_LOG(KW_LOG_INFO, "stopped %llu ms after the signal",
               (unsigned long long)(uv_now(&d.loop) - d.stop_at));
    }
    kw__audit_close(&d.audit); /* writes what the last flush left */
    kw_cache_close(d.cache);
    if (d.lock_fd >= 0)
        close(d.lock_fd); /* releases the cache lock */
    kw_remote_close(d.remote); /* the workers are joined */
    if (d.alloc_at_stop > 0) /* tests only: did the stop reach it? */
        KW_LOG(KW_LOG_INFO, "test hook: %s", kw_alloc_failed() ? "fired"
                                                               : "never fired");
    close_flush_test_hook(&d);
    int crc = uv_loop_close(&d.loop);
    if (rc == 0 && crc < 0) {
        snprintf(err, errlen, "uv_loop_close: %s (a handle leaked)", uv_strerror(crc));
        rc = crc;
    }
    return rc;
}
