/* test_cache_proc.c: the cache shared by threads and by processes: racing
 * writers store each digest once, a read-only process sees what a writer
 * committed, a reader killed inside its transaction leaves nothing behind.
 *
 * Children are forked before the parent opens the cache (LMDB handles do
 * not survive fork), report through their exit status, and end with
 * _exit() so criterion's own exit handlers run in the parent only. */
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

static char dir[256];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache-proc"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

TestSuite(cache, .init = setup, .fini = teardown);

/* Waits for pid; returns its exit status, or -1 when a signal ended it. */
static int wait_exit(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        cr_assert_eq(errno, EINTR);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Blocks until the write end of p is closed by everyone. */
static void wait_eof(int fd)
{
    char ch;
    while (read(fd, &ch, 1) < 0 && errno == EINTR)
        ;
}

#define NTHREADS 4
#define NDIGESTS 64

/* Blob size of entry i in the threaded test: 1 byte to 40 KB. */
static size_t thread_size(uint64_t i)
{
    return 1 + (size_t)(i * 613) % 40000;
}

typedef struct shared {
    kw_cache *c;
    int id;
    _Atomic int stored, failures;
} shared;

static shared sh[NTHREADS];

/* Puts and reads back every digest, starting at a different one per
 * thread so that threads race on the same digests. */
static void *thread_main(void *arg)
{
    shared *s = arg;
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < NDIGESTS; k++) {
            uint64_t i = (uint64_t)((k + s->id * NDIGESTS / NTHREADS) %
                                    NDIGESTS);
            uint8_t d[KW_CACHE_DIGEST_LEN];
            tc_digest(i, d);
            uint8_t *b = tc_blob(i, thread_size(i));
            kw_cache_info in = tc_info(i);
            bool stored;
            if (kw_cache_put(s->c, d, &in, b, thread_size(i), false,
                             &stored) != 0)
                atomic_fetch_add(&sh[0].failures, 1);
            else if (stored)
                atomic_fetch_add(&sh[0].stored, 1);
            void *got = NULL;
            size_t n = 0;
            if (kw_cache_get(s->c, d, &got, &n, NULL) != 0 ||
                n != thread_size(i) || memcmp(got, b, n) != 0)
                atomic_fetch_add(&sh[0].failures, 1);
            free(got);
            free(b);
        }
        if (s->id == 0 && kw_cache_flush(s->c) != 0)
            atomic_fetch_add(&sh[0].failures, 1);
    }
    return NULL;
}

Test(cache, threads_put_and_get_overlapping_digests)
{
    kw_cache *c = tc_open(dir, 64ull << 20, false);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        sh[i].c = c;
        sh[i].id = i;
        cr_assert_eq(pthread_create(&t[i], NULL, thread_main, &sh[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&sh[0].failures), 0);
    cr_assert_eq(atomic_load(&sh[0].stored), NDIGESTS,
                 "each digest stored exactly once");
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.entries, NDIGESTS);
    cr_assert_eq(s.hits, 3 * NTHREADS * NDIGESTS);
    cr_assert_eq(s.misses, 0);
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < NDIGESTS; i++)
        bytes += thread_size(i);
    cr_assert_eq(s.bytes, bytes);
    kw_cache_close(c);
}

#define NPROC_DIGESTS 200

/* A racing writer: waits for the start signal, puts every digest (in its
 * own order), exits with the number it stored, or 255 on any failure. */
static void writer_child(int start_fd, int order)
{
    wait_eof(start_fd);
    kw_cache_opts o = {.dir = dir, .max_size = 64ull << 20};
    kw_cache *c;
    char err[256];
    if (kw_cache_open(&c, &o, err, sizeof err) != 0)
        _exit(255);
    int stored_n = 0;
    for (int k = 0; k < NPROC_DIGESTS; k++) {
        uint64_t i = order ? (uint64_t)(NPROC_DIGESTS - 1 - k) : (uint64_t)k;
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        uint8_t *b = tc_blob(i, 2000 + i);
        bool stored;
        int rc = kw_cache_put(c, d, NULL, b, 2000 + i, false, &stored);
        free(b);
        if (rc != 0)
            _exit(255);
        stored_n += stored;
    }
    kw_cache_close(c);
    _exit(stored_n);
}

Test(cache, two_processes_store_each_digest_once)
{
    int start[2];
    cr_assert_eq(pipe(start), 0);
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        pid[i] = fork();
        cr_assert_geq(pid[i], 0);
        if (pid[i] == 0) {
            close(start[1]);
            writer_child(start[0], i);
        }
    }
    close(start[0]);
    close(start[1]); /* both start now */
    int a = wait_exit(pid[0]), b = wait_exit(pid[1]);
    cr_assert(a >= 0 && a <= NPROC_DIGESTS, "writer 0 exit %d", a);
    cr_assert(b >= 0 && b <= NPROC_DIGESTS, "writer 1 exit %d", b);
    cr_assert_eq(a + b, NPROC_DIGESTS, "stored %d + %d", a, b);
    kw_cache *c = tc_open(dir, 64ull << 20, false);
    cr_assert_eq(tc_stats(c).entries, NPROC_DIGESTS);
    for (uint64_t i = 0; i < NPROC_DIGESTS; i++) {
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        uint8_t *want = tc_blob(i, 2000 + i);
        void *got;
        size_t n;
        cr_assert_eq(kw_cache_get(c, d, &got, &n, NULL), 0);
        cr_assert(n == 2000 + i && memcmp(got, want, n) == 0);
        free(got);
        free(want);
    }
    kw_cache_close(c);
}

/* A read-only process: exits 0 when entries [0, n) are served intact,
 * entry n is missing and puts are refused; else the failing step. */
static void reader_child(uint64_t n)
{
    kw_cache_opts o = {.dir = dir, .read_only = true};
    kw_cache *c;
    char err[256];
    if (kw_cache_open(&c, &o, err, sizeof err) != 0)
        _exit(1);
    for (uint64_t i = 0; i < n; i++) {
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        uint8_t *want = tc_blob(i, 5000);
        void *got;
        size_t len;
        if (kw_cache_get(c, d, &got, &len, NULL) != 0)
            _exit(2);
        if (len != 5000 || memcmp(got, want, len) != 0)
            _exit(3);
        free(got);
        free(want);
    }
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(n, d);
    if (kw_cache_contains(c, d))
        _exit(4);
    if (kw_cache_put(c, d, NULL, d, sizeof d, false, NULL) != KW_EROFS)
        _exit(5);
    kw_cache_close(c);
    _exit(0);
}

/* Forks reader_child(n) and returns its exit status. */
static int run_reader(uint64_t n)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        reader_child(n);
    return wait_exit(pid);
}

Test(cache, read_only_process_sees_entries_a_writer_committed)
{
    kw_cache *c = tc_open(dir, 0, false);
    for (uint64_t i = 0; i < 3; i++)
        tc_put(c, i, 5000, false);
    /* the writer stays open: the reader shares the environment with it */
    cr_assert_eq(run_reader(3), 0);
    for (uint64_t i = 3; i < 40; i++)
        tc_put(c, i, 5000, false);
    cr_assert_eq(run_reader(40), 0);
    kw_cache_close(c);
}

/* Opens the cache and stops inside a foreach's read transaction, telling
 * the parent through fd; waits there until killed. */
static int park(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                const kw_cache_info *info, void *arg)
{
    (void)digest;
    (void)info;
    int fd = *(int *)arg;
    if (write(fd, "r", 1) != 1)
        _exit(2);
    for (;;)
        pause();
}

static void parked_reader(int fd)
{
    kw_cache_opts o = {.dir = dir};
    kw_cache *c;
    char err[256];
    if (kw_cache_open(&c, &o, err, sizeof err) != 0)
        _exit(1);
    kw_cache_foreach(c, park, &fd);
    _exit(3); /* never reached: park does not return */
}

/* Holds the cache open (so the lock file is not reset when the parent
 * reopens) until the parent closes `hold`. */
static void holder(int fd, int hold)
{
    kw_cache_opts o = {.dir = dir};
    kw_cache *c;
    char err[256];
    if (kw_cache_open(&c, &o, err, sizeof err) != 0)
        _exit(1);
    if (write(fd, "h", 1) != 1)
        _exit(2);
    wait_eof(hold);
    kw_cache_close(c);
    _exit(0);
}

typedef struct reader_count {
    pid_t pid;
    int n;
} reader_count;

static int count_line(const char *msg, void *arg)
{
    reader_count *r = arg;
    int pid;
    if (sscanf(msg, "%d", &pid) == 1 && pid == r->pid)
        r->n++;
    return 0;
}

/* Reader slots held by pid, read with plain LMDB: an environment opened
 * without mdb_reader_check, so it reports what the lock file holds. */
static int slots_of(pid_t pid)
{
    MDB_env *env;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxreaders(env, 256), 0);
    cr_assert_eq(mdb_env_open(env, dir, MDB_RDONLY, 0600), 0);
    reader_count r = {pid, 0};
    cr_assert_geq(mdb_reader_list(env, count_line, &r), 0);
    mdb_env_close(env);
    return r.n;
}

Test(cache, reopen_after_a_killed_reader_clears_its_slot)
{
    kw_cache *c = tc_open(dir, 0, false);
    for (uint64_t i = 0; i < 3; i++)
        tc_put(c, i, 5000, false);
    kw_cache_close(c); /* nothing open across the forks */
    int ready[2], hold[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(hold), 0);
    pid_t r = fork();
    cr_assert_geq(r, 0);
    if (r == 0) {
        close(ready[0]);
        close(hold[1]);
        parked_reader(ready[1]);
    }
    pid_t h = fork();
    cr_assert_geq(h, 0);
    if (h == 0) {
        close(ready[0]);
        close(hold[1]);
        holder(ready[1], hold[0]);
    }
    close(ready[1]);
    close(hold[0]);
    char got[2];
    for (size_t n = 0; n < 2;) { /* "r" and "h", in either order */
        ssize_t k = read(ready[0], got + n, 2 - n);
        cr_assert_gt(k, 0, "a child died before it was ready");
        n += (size_t)k;
    }
    cr_assert_eq(kill(r, SIGKILL), 0);
    cr_assert_eq(wait_exit(r), -1);
    cr_assert_eq(slots_of(r), 1, "the dead reader's slot is still taken");

    c = tc_open(dir, 0, false); /* runs mdb_reader_check */
    kw_cache_close(c);
    cr_assert_eq(slots_of(r), 0, "the open cleared it");
    c = tc_open(dir, 0, false);
    for (uint64_t i = 3; i < 10; i++)
        cr_assert(tc_put(c, i, 5000, false));
    for (uint64_t i = 0; i < 10; i++)
        cr_assert_eq(tc_get_check(c, i, 5000), 0);
    kw_cache_close(c);
    close(hold[1]);
    cr_assert_eq(wait_exit(h), 0);
    close(ready[0]);
}

/* A foreach parked in its callback until released: a long read
 * transaction, which keeps LMDB from reusing any page freed after it. */
typedef struct parked {
    kw_cache *c;
    pthread_mutex_t mu; /* guards inside and release */
    pthread_cond_t cv;
    bool inside, release;
} parked;

static int park_until_released(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                               const kw_cache_info *info, void *arg)
{
    (void)digest;
    (void)info;
    parked *p = arg;
    pthread_mutex_lock(&p->mu);
    p->inside = true;
    pthread_cond_broadcast(&p->cv);
    while (!p->release)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return 1; /* one entry is enough */
}

static void *long_reader(void *arg)
{
    parked *p = arg;
    kw_cache_foreach(p->c, park_until_released, p);
    return NULL;
}

/* Puts tiny entry i with a long name (B-tree pages, not cubin bytes). */
static int put_tiny(kw_cache *c, uint64_t i)
{
    kw_cache_info in = tc_info(i);
    memset(in.entry, 'e', sizeof in.entry - 1);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(i, d);
    return kw_cache_put(c, d, &in, d, 8, false, NULL);
}

Test(cache, map_full_under_a_long_reader_fails_cleanly_then_recovers)
{
    kw_cache *c = tc_open(dir, KW_CACHE_MIN_SIZE, false);
    tc_put(c, 0, 1000, true);
    parked p = {.c = c, .inside = false, .release = false};
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, long_reader, &p), 0);
    pthread_mutex_lock(&p.mu);
    while (!p.inside)
        pthread_cond_wait(&p.cv, &p.mu);
    pthread_mutex_unlock(&p.mu);
    int rc = 0;
    uint64_t i = 1;
    for (; i < 20000 && rc == 0; i++)
        rc = put_tiny(c, i);
    cr_assert_eq(rc, KW_ECACHE, "put %llu: %s", (unsigned long long)i,
                 kw_err_name(rc));
    cr_assert(strstr(kw_cache_last_error(c), "MDB_MAP_FULL"), "%s",
              kw_cache_last_error(c));
    /* the map is full, not the disk (issue 24: KW_EDISKFULL is the disk's) */
    cr_expect(strstr(kw_cache_last_error(c), "disk") == NULL, "%s",
              kw_cache_last_error(c));
    cr_assert_eq(tc_get_check(c, 0, 1000), 0, "reads still work");
    pthread_mutex_lock(&p.mu);
    p.release = true;
    pthread_cond_broadcast(&p.cv);
    pthread_mutex_unlock(&p.mu);
    pthread_join(t, NULL);
    /* the pages are reusable again: puts, and evictions, go on */
    for (uint64_t k = 0; k < 3000; k++) {
        rc = put_tiny(c, 100000 + k);
        cr_assert_eq(rc, 0, "put after release %llu: %s: %s",
                     (unsigned long long)k, kw_err_name(rc),
                     kw_cache_last_error(c));
    }
    cr_assert_eq(tc_get_check(c, 0, 1000), 0, "the pinned entry stays");
    kw_cache_close(c);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
}

/* Puts item i (2000 + i bytes) with compiled set or not; its code. */
static int put_item(kw_cache *c, uint64_t i, bool compiled, uint64_t len)
{
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(i, d);
    uint8_t *blob = tc_blob(i, len);
    kw_cache_item it = {.digest = d, .blob = blob, .len = len,
                        .compiled = compiled};
    int rc;
    if (kw_cache_put_many(c, &it, 1, &rc) < 0)
        rc = KW_ENOMEM;
    free(blob);
    return rc;
}

/* A writer that counts a miss and a compile failure, stores two compiled
 * entries and one that was not compiled, races itself on one of them
 * (found stored: still a compile made), fails a compiled put that does
 * not fit, then dies without closing or flushing (issue 24).  Exit 0 when
 * every call answered as expected. */
static void counting_child(void)
{
    kw_cache *c = tc_open(dir, 1ull << 20, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(0, d);
    void *blob;
    size_t len;
    if (kw_cache_get(c, d, &blob, &len, NULL) != KW_ENOTFOUND)
        _exit(1);
    kw_cache_count(c, KW_CACHE_COMPILE_FAILURES, 1);
    if (put_item(c, 0, true, 2000) != 0 || put_item(c, 1, true, 2001) != 0 ||
        put_item(c, 2, false, 2002) != 0 || put_item(c, 1, true, 2001) != 0)
        _exit(2);
    if (put_item(c, 3, true, 2ull << 20) != KW_EINVAL &&
        put_item(c, 3, true, 2ull << 20) != KW_ENOSPC)
        _exit(3); /* over the 1 MiB limit: not stored, not counted */
    kw_cache_count(c, KW_CACHE_COMPILE_FAILURES, 1); /* after the last put */
    _exit(0);
}

Test(cache, compiles_and_counters_are_committed_with_the_puts_before_a_crash)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        counting_child();
    cr_assert_eq(wait_exit(pid), 0);
    kw_cache *c = tc_open(dir, 1ull << 20, false);
    kw_cache_stats s = tc_stats(c);
    cr_expect_eq(s.entries, 3);
    cr_expect_eq(s.compiles, 3, "2 stored, 1 found stored: %llu",
                 (unsigned long long)s.compiles);
    cr_expect_eq(s.misses, 1, "the miss rode on the next put");
    cr_expect_eq(s.compile_failures, 1, "the one after the last put is lost");
    kw_cache_close(c);
}
