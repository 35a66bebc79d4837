/* test_warm_writeback.c: fleet write-backs run where they block no other
 * request (issue 23, point 6), and their queue is bounded on both sides.
 *
 * The fleet tier here is a fake Redis in the test (enough RESP for
 * kw_remote: GET misses, SET NX takes the lease, EVAL releases it) whose
 * SET of an entry can be held unanswered: a Redis that stalls on writes.
 * Compiles are instant (KWARM_TEST_INSTANT_COMPILE).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "kw_remote.h"
#include "kw_test_util.h"
#include "kw_warm.h"

TestSuite(warm_writeback, .timeout = 120);

/* ---- a fake Redis whose entry SETs can be held ------------------------ */

typedef struct fake {
    int lfd;
    unsigned port;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool hold;      /* entry SETs wait while true */
    bool stop;
    int sets_seen;  /* entry SETs received (held or not) */
    int sets_done;  /* entry SETs answered */
    int conns;      /* connection threads still running */
} fake;

typedef struct fconn {
    fake *f;
    FILE *in;
    int fd;
} fconn;

/* Reads one RESP command into argv (each malloc'd); its argc, or -1. */
static int read_cmd(FILE *in, char **argv, size_t *lens, int max)
{
    char line[64];
    int argc = 0;
    if (fgets(line, sizeof line, in) == NULL || line[0] != '*' ||
        (argc = atoi(line + 1)) <= 0 || argc > max)
        return -1;
    for (int i = 0; i < argc; i++) {
        if (fgets(line, sizeof line, in) == NULL || line[0] != '$')
            return -1;
        lens[i] = (size_t)atol(line + 1);
        argv[i] = malloc(lens[i] + 3);
        if (argv[i] == NULL || fread(argv[i], 1, lens[i] + 2, in) != lens[i] + 2)
            return -1;
        argv[i][lens[i]] = '\0';
    }
    return argc;
}

static void reply(int fd, const char *s)
{
    size_t n = strlen(s);
    cr_assert_eq(write(fd, s, n), (ssize_t)n);
}

/* One connection: GET misses, SET NX succeeds, an entry SET waits while
 * held, EVAL and the rest answer at once. */
static void *conn_main(void *arg)
{
    fconn *fc = arg;
    fake *f = fc->f;
    char *argv[8] = {0};
    size_t lens[8];
    int argc;
    while ((argc = read_cmd(fc->in, argv, lens, 8)) > 0) {
        if (strcasecmp(argv[0], "GET") == 0) {
            reply(fc->fd, "$-1\r\n");
        } else if (strcasecmp(argv[0], "SET") == 0 && argc == 3) {
            pthread_mutex_lock(&f->mu);
            f->sets_seen++;
            pthread_cond_broadcast(&f->cv);
            while (f->hold && !f->stop)
                pthread_cond_wait(&f->cv, &f->mu);
            f->sets_done++;
            pthread_mutex_unlock(&f->mu);
            reply(fc->fd, "+OK\r\n");
        } else if (strcasecmp(argv[0], "EVAL") == 0 ||
                   strcasecmp(argv[0], "EXISTS") == 0) {
            reply(fc->fd, ":0\r\n");
        } else {
            reply(fc->fd, "+OK\r\n");
        }
        for (int i = 0; i < argc; i++) {
            free(argv[i]);
            argv[i] = NULL;
        }
    }
    for (int i = 0; i < 8; i++)
        free(argv[i]);
    fclose(fc->in);
    free(fc);
    pthread_mutex_lock(&f->mu);
    f->conns--;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void *accept_main(void *arg)
{
    fake *f = arg;
    int fd;
    while ((fd = accept(f->lfd, NULL, NULL)) >= 0) {
        fconn *fc = calloc(1, sizeof *fc);
        cr_assert_not_null(fc);
        fc->f = f;
        fc->fd = fd;
        fc->in = fdopen(fd, "r");
        pthread_mutex_lock(&f->mu);
        f->conns++;
        pthread_mutex_unlock(&f->mu);
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, conn_main, fc), 0);
        pthread_detach(t);
    }
    return NULL;
}

static void fake_start(fake *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(f->lfd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(f->lfd, 16), 0);
    cr_assert_eq(getsockname(f->lfd, (struct sockaddr *)&sa, &len), 0);
    f->port = ntohs(sa.sin_port);
    cr_assert_eq(pthread_create(&f->thread, NULL, accept_main, f), 0);
}

static void fake_release(fake *f)
{
    pthread_mutex_lock(&f->mu);
    f->hold = false;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* Waits (bounded) until the fake has seen n entry SETs; how many it has. */
static int fake_wait_sets(fake *f, int n, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    pthread_mutex_lock(&f->mu);
    while (f->sets_seen < n &&
           pthread_cond_timedwait(&f->cv, &f->mu, &until) != ETIMEDOUT)
        ;
    int seen = f->sets_seen;
    pthread_mutex_unlock(&f->mu);
    return seen;
}

/* Stops accepting; every client connection is gone by then (the remote
 * handle was closed), so the connection threads have ended. */
static void fake_stop(fake *f)
{
    fake_release(f);
    shutdown(f->lfd, SHUT_RDWR);
    close(f->lfd);
    pthread_join(f->thread, NULL);
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    while (f->conns > 0)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
}

/* ---- the pipeline ------------------------------------------------------ */

typedef struct rig {
    char dir[128];
    kw_cache *cache;
    kw_remote *remote;
    kw_warm *warm;
} rig;

static void rig_up(rig *r, fake *f, const char *cubin_size)
{
    char err[512], cdir[160];
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", cubin_size, 1), 0);
    cr_assert_eq(kw_test_mkdtemp(r->dir, sizeof r->dir, "wb"), 0);
    snprintf(cdir, sizeof cdir, "%s/cache", r->dir);
    kw_cache_opts co = {.dir = cdir, .max_size = 1ull << 30};
    cr_assert_eq(kw_cache_open(&r->cache, &co, err, sizeof err), 0, "%s", err);
    kw_remote_opts ro = {.timeout_ms = 60000};
    snprintf(ro.addr.host, sizeof ro.addr.host, "127.0.0.1");
    ro.addr.port = f->port;
    memset(ro.key, 7, sizeof ro.key);
    cr_assert_eq(kw_remote_open(&r->remote, &ro, err, sizeof err), 0, "%s", err);
    kw_warm_opts wo = {.cache = r->cache, .remote = r->remote, .jobs = 1};
    cr_assert_eq(kw_warm_open(&r->warm, &wo, err, sizeof err), 0, "%s", err);
}

static void rig_down(rig *r)
{
    kw_warm_close(r->warm);
    kw_remote_close(r->remote);
    kw_cache_close(r->cache);
    kw_test_rmtree(r->dir);
}

/* Key i: one family's key with its first field set to i. */
static kw_keys_key key_of(int i)
{
    kw_keys_key k;
    memset(&k, 0, sizeof k);
    k.family = (kw_k_family)0;
    for (size_t j = 0; j < kw_keys_nfields(k.family); j++)
        k.fields[j] = 1;
    k.fields[0] = 1000 + i;
    snprintf(k.arch, sizeof k.arch, "sm_90");
    cr_assert_eq(kw_keys_digest(&k, k.digest), 0);
    return k;
}

/* One job's results. */
typedef struct seen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t n, compiled;
    bool last;
} seen;

static void on_result(const kw_warm_result *res, void *arg)
{
    seen *s = arg;
    pthread_mutex_lock(&s->mu);
    s->n++;
    s->compiled += res->status == KW_WARM_COMPILED;
    s->last |= res->last;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Runs one job of n keys from first and waits (at most ms) for its last
 * result; the keys compiled, or -1 when the last never came. */
static long run_job(rig *r, int first, size_t n, int ms)
{
    kw_keys_key *keys = calloc(n, sizeof *keys);
    cr_assert_not_null(keys);
    for (size_t i = 0; i < n; i++)
        keys[i] = key_of(first + (int)i);
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    kw_warm_job *job = NULL;
    cr_assert_eq(kw_warm_submit(r->warm, keys, n, 0, on_result, &s, &job), 0);
    free(keys);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    pthread_mutex_lock(&s.mu);
    while (!s.last && pthread_cond_timedwait(&s.cv, &s.mu, &until) != ETIMEDOUT)
        ;
    bool last = s.last;
    pthread_mutex_unlock(&s.mu);
    long compiled = last ? (long)s.compiled : -1;
    if (!last) { /* let the pipeline finish with s before it goes */
        kw_warm_job_cancel(job);
        pthread_mutex_lock(&s.mu);
        while (!s.last)
            pthread_cond_wait(&s.cv, &s.mu);
        pthread_mutex_unlock(&s.mu);
    }
    kw_warm_job_release(job);
    return compiled;
}

static kw_warm_stats stats_of(rig *r)
{
    kw_warm_stats st;
    kw_warm_stats_get(r->warm, &st);
    return st;
}

/* A Redis that stalls on a write-back delays neither that key's result
 * nor the next compile: both are served while the SET waits. */
Test(warm_writeback, a_stalled_write_back_blocks_no_result_and_no_compile)
{
    fake f;
    rig r;
    fake_start(&f);
    f.hold = true;
    rig_up(&r, &f, "1");
    cr_expect_eq(run_job(&r, 0, 1, 20000), 1, "key A's result waited on Redis");
    cr_assert_eq(fake_wait_sets(&f, 1, 20000), 1, "A was never written back");
    cr_expect_eq(run_job(&r, 1, 1, 20000), 1,
                 "key B waited behind A's write-back");
    kw_warm_stats st = stats_of(&r);
    cr_expect_eq(st.writebacks_queued, 2, "A's SET held, B's queued behind it: %llu", (unsigned long long)st.writebacks_queued);
    cr_expect_eq(st.writebacks_dropped, 0);
    fake_release(&f);
    rig_down(&r); /* drains the write-backs */
    cr_expect_eq(f.sets_done, 2, "both written back once Redis answered");
    fake_stop(&f);
}

/* Compiles n keys of cubin_size bytes while Redis stalls on writes, and
 * checks what the write-back queue took: dropped entries, items waiting
 * (entries and lease releases), and the SETs done once Redis answers. */
static void fill_stalled(const char *cubin_size, size_t n, uint64_t dropped,
                         int sets)
{
    fake f;
    rig r;
    fake_start(&f);
    f.hold = true;
    rig_up(&r, &f, cubin_size);
    cr_expect_eq(run_job(&r, 0, n, 60000), (long)n);
    kw_warm_stats st = stats_of(&r);
    cr_expect_eq(st.writebacks_dropped, dropped, "dropped %llu",
                 (unsigned long long)st.writebacks_dropped);
    cr_expect_eq(st.writebacks_queued, n, "a dropped entry's lease waits too");
    fake_release(&f);
    rig_down(&r);
    cr_expect_eq(f.sets_done, sets);
    fake_stop(&f);
}

/* The queue holds at most 1024 entries: with Redis stalled, 1024 wait
 * and every later one is dropped, counted; its lease release still
 * queues. */
Test(warm_writeback, the_queue_caps_entries_at_1024)
{
    fill_stalled("1", 1030, 6, 1024);
}

/* ... and at most 64 MiB of cubins: four of 16 MiB fit, the fifth does
 * not. */
Test(warm_writeback, the_queue_caps_bytes_at_64_mib)
{
    fill_stalled("16777216", 5, 1, 4);
}
