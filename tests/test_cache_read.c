/* test_cache_read.c: the read path of issue 14: borrowed zero-copy views,
 * pooled read transactions (and the reader-slot limit behind them), many
 * threads reading while others write, and defer_writes, under which gets
 * never write. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

#define MIB (1ull << 20)

static char dir[256];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache-read"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

TestSuite(cache_read, .init = setup, .fini = teardown);

Test(cache_read, borrow_gives_the_verified_bytes_in_place)
{
    kw_cache *c = tc_open(dir, 0, false);
    tc_put(c, 1, 50000, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(1, d);
    kw_cache_view v;
    kw_cache_info info;
    cr_assert_eq(kw_cache_borrow(c, d, &v, &info), 0);
    uint8_t *want = tc_blob(1, 50000);
    cr_assert_eq(v.len, 50000);
    cr_assert(memcmp(v.data, want, v.len) == 0);
    cr_assert_str_eq(info.entry, tc_info(1).entry);
    /* the snapshot outlives a remove, puts and a flush */
    cr_assert_eq(kw_cache_remove(c, d), 0);
    for (uint64_t i = 10; i < 30; i++)
        tc_put(c, i, 20000, false);
    cr_assert_eq(kw_cache_flush(c), 0);
    cr_assert(memcmp(v.data, want, v.len) == 0, "still the same bytes");
    kw_cache_release(&v);
    cr_assert_null(v.data);
    kw_cache_release(&v); /* twice: a no-op */
    kw_cache_release(NULL);
    cr_assert_eq(kw_cache_borrow(c, d, &v, NULL), KW_ENOTFOUND);
    cr_assert_null(v.data);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.hits, 1);
    cr_assert_eq(s.misses, 1);
    free(want);
    kw_cache_close(c);
}

/* Flips one byte inside the only copy of `needle` in dir/data.mdb. */
static void flip_in_data_file(const uint8_t *needle, size_t nlen)
{
    char path[512];
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    size_t len;
    char *data = kw_test_read_file(path, &len);
    cr_assert_not_null(data);
    char *at = memmem(data, len, needle, nlen);
    cr_assert_not_null(at, "the blob's bytes are in data.mdb");
    at[nlen / 2] ^= 0x40;
    char written[512];
    cr_assert_eq(kw_test_write_file(dir, "data.mdb", data, len, written,
                                    sizeof written), 0);
    free(data);
}

/* Stores entries 0..n-1 (5000 bytes), closes, corrupts entries 0..bad-1. */
static void corrupt_cache(uint64_t n, uint64_t bad)
{
    kw_cache *c = tc_open(dir, 0, false);
    for (uint64_t i = 0; i < n; i++)
        tc_put(c, i, 5000, false);
    kw_cache_close(c);
    for (uint64_t i = 0; i < bad; i++) {
        uint8_t *b = tc_blob(i, 5000);
        flip_in_data_file(b + 1000, 256);
        free(b);
    }
}

Test(cache_read, borrow_of_a_corrupt_entry_is_ecorrupt_and_removed)
{
    corrupt_cache(2, 1);
    kw_cache *c = tc_open(dir, 0, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(0, d);
    kw_cache_view v;
    cr_assert_eq(kw_cache_borrow(c, d, &v, NULL), KW_ECORRUPT);
    cr_assert_null(v.data);
    cr_assert_not(kw_cache_contains(c, d));
    cr_assert_eq(tc_stats(c).corrupt, 1);
    kw_cache_close(c);
}

/* Opens dir with defer_writes. */
static kw_cache *open_deferred(void)
{
    kw_cache_opts o = {.dir = dir, .defer_writes = true};
    kw_cache *c = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    return c;
}

/* The "corrupt" counter another process reads (what is on disk). */
static uint64_t corrupt_on_disk(void)
{
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kw_cache_opts o = {.dir = dir, .read_only = true};
        kw_cache *c = NULL;
        kw_cache_stats s = {0};
        char err[256];
        if (kw_cache_open(&c, &o, err, sizeof err) != 0 ||
            kw_cache_stats_get(c, &s) != 0)
            _exit(1);
        uint64_t v[2] = {s.corrupt, s.hits};
        _exit(write(fd[1], v, sizeof v) == sizeof v ? 0 : 1);
    }
    uint64_t v[2] = {~0ull, ~0ull};
    close(fd[1]);
    cr_assert_eq(read(fd[0], v, sizeof v), (ssize_t)sizeof v);
    close(fd[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return v[0];
}

Test(cache_read, defer_writes_queues_corrupt_entries_for_the_flush)
{
    /* the queue holds KW__CACHE_CORRUPT_MAX (64) digests: fill it, and
     * one more, which the next get queues again once there is room */
    corrupt_cache(66, 65);
    kw_cache *c = open_deferred();
    uint8_t d[KW_CACHE_DIGEST_LEN];
    for (uint64_t i = 0; i < 65; i++)
        cr_assert_eq(tc_get_check(c, i, 5000), KW_ECORRUPT);
    tc_digest(64, d);
    cr_assert(kw_cache_contains(c, d), "nothing removed by a get");
    cr_assert_eq(tc_stats(c).corrupt, 0);
    cr_assert_eq(corrupt_on_disk(), 0, "nothing written");
    cr_assert_eq(kw_cache_flush(c), 0);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.corrupt, 64, "the whole queue purged");
    cr_assert_eq(s.entries, 2, "the 65th waits for its next get");
    cr_assert_eq(tc_get_check(c, 64, 5000), KW_ECORRUPT);
    cr_assert_eq(kw_cache_flush(c), 0);
    cr_assert_not(kw_cache_contains(c, d));
    cr_assert_eq(tc_stats(c).corrupt, 65);
    cr_assert_eq(tc_get_check(c, 65, 5000), 0);
    kw_cache_close(c);
}

Test(cache_read, defer_writes_never_flushes_inline)
{
    /* past 4096 distinct digests pending, a plain handle flushes inside
     * a get; a defer_writes one leaves it to kw_cache_flush() */
    const uint64_t n = 4200;
    kw_cache *c = tc_open(dir, 0, false);
    for (uint64_t i = 0; i < n; i++)
        tc_put(c, i, 16, false);
    kw_cache_close(c);
    c = open_deferred();
    for (uint64_t i = 0; i < n; i++)
        cr_assert_eq(tc_get_check(c, i, 16), 0);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(0, d);
    kw_cache_info info;
    char buf[16];
    size_t len;
    cr_assert_eq(kw_cache_get_into(c, d, buf, sizeof buf, &len, &info), 0);
    cr_assert_eq(info.hits, 0, "no hit written yet");
    cr_assert_eq(kw_cache_flush(c), 0);
    cr_assert_eq(kw_cache_get_into(c, d, buf, sizeof buf, &len, &info), 0);
    cr_assert_eq(info.hits, 2);
    kw_cache_close(c);
}

Test(cache_read, reader_slots_run_out_cleanly_and_come_back)
{
    kw_cache *c = tc_open(dir, 0, false);
    tc_put(c, 1, 1000, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(1, d);
    enum { MAXV = 300 };
    kw_cache_view *v = calloc(MAXV, sizeof *v);
    int n = 0, rc = 0;
    while (n < MAXV && (rc = kw_cache_borrow(c, d, &v[n], NULL)) == 0)
        n++;
    /* 256 slots in the lock file, less the one open's own */
    cr_assert_geq(n, 250, "%d views before %s", n, kw_err_name(rc));
    cr_assert_lt(n, MAXV);
    cr_assert_eq(rc, KW_ECACHE);
    cr_assert(strstr(kw_cache_last_error(c), "MDB_READERS_FULL"), "%s",
              kw_cache_last_error(c));
    kw_cache_release(&v[--n]);
    cr_assert_eq(kw_cache_borrow(c, d, &v[n], NULL), 0, "one back, one more");
    for (int i = 0; i <= n; i++)
        kw_cache_release(&v[i]);
    for (int i = 0; i < MAXV && i < 260; i++) /* the pool recycles */
        cr_assert_eq(tc_get_check(c, 1, 1000), 0);
    free(v);
    kw_cache_close(c);
}

typedef struct reader_arg {
    kw_cache *c;
    int failures;
} reader_arg;

/* Gets and borrows entries 0..63 over and over while puts go on. */
static void *reader(void *p)
{
    reader_arg *a = p;
    uint8_t *buf = malloc(8192);
    for (int r = 0; r < 2000; r++) {
        uint64_t i = (uint64_t)r % 64;
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        size_t len;
        kw_cache_view v;
        uint8_t *want = tc_blob(i, 4096);
        if (kw_cache_get_into(a->c, d, buf, 8192, &len, NULL) != 0 ||
            len != 4096 || memcmp(buf, want, len) != 0)
            a->failures++;
        if (kw_cache_borrow(a->c, d, &v, NULL) != 0 || v.len != 4096 ||
            memcmp(v.data, want, v.len) != 0)
            a->failures++;
        kw_cache_release(&v);
        free(want);
    }
    free(buf);
    return NULL;
}

Test(cache_read, threads_share_the_pool_while_writers_commit)
{
    kw_cache *c = tc_open(dir, 64 * MIB, false);
    for (uint64_t i = 0; i < 64; i++)
        tc_put(c, i, 4096, false);
    enum { NT = 6 };
    pthread_t t[NT];
    reader_arg a[NT];
    for (int i = 0; i < NT; i++) {
        a[i] = (reader_arg){c, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, reader, &a[i]), 0);
    }
    for (uint64_t i = 100; i < 400; i++) /* commits under the readers */
        tc_put(c, i, 2000, false);
    for (int i = 0; i < NT; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(a[i].failures, 0, "reader %d", i);
    }
    cr_assert_eq(tc_stats(c).hits, NT * 2000 * 2);
    kw_cache_close(c);
}

/* In a child: opens dir as a writer, removes entry i and, when len is
 * not 0, stores a different blob (entry i + 1000's bytes) under its
 * digest.  Exits 0 on success. */
static void replace_in_child(uint64_t i, size_t len)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kw_cache_opts o = {.dir = dir};
        kw_cache *c = NULL;
        char err[256];
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        uint8_t *b = tc_blob(i + 1000, len ? len : 1);
        if (kw_cache_open(&c, &o, err, sizeof err) != 0 ||
            kw_cache_remove(c, d) != 0 ||
            (len && kw_cache_put(c, d, NULL, b, len, false, NULL) != 0))
            _exit(1);
        kw_cache_close(c);
        _exit(0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Hits are served from memory while nothing is committed (hint.c); a
 * commit by another process must be seen at once. */
Test(cache_read, hits_see_another_process_remove_and_replace)
{
    kw_cache *c = tc_open(dir, 0, false);
    tc_put(c, 1, 30000, false);
    tc_put(c, 2, 30000, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(1, d);
    for (int i = 0; i < 3; i++) /* the second and third hit use the hint */
        cr_assert_eq(tc_get_check(c, 1, 30000), 0);
    kw_cache_view v;
    cr_assert_eq(kw_cache_borrow(c, d, &v, NULL), 0);
    kw_cache_release(&v);
    replace_in_child(1, 0);
    cr_assert_eq(tc_get_check(c, 1, 30000), KW_ENOTFOUND);
    cr_assert_eq(kw_cache_borrow(c, d, &v, NULL), KW_ENOTFOUND);
    cr_assert_eq(tc_get_check(c, 2, 30000), 0);
    cr_assert_eq(tc_get_check(c, 2, 30000), 0);
    replace_in_child(2, 20000);
    tc_digest(2, d);
    void *got;
    size_t len;
    cr_assert_eq(kw_cache_get(c, d, &got, &len, NULL), 0);
    uint8_t *want = tc_blob(1002, 20000);
    cr_assert(len == 20000 && memcmp(got, want, len) == 0, "the new blob");
    free(got);
    cr_assert_eq(kw_cache_borrow(c, d, &v, NULL), 0);
    cr_assert(v.len == 20000 && memcmp(v.data, want, v.len) == 0);
    kw_cache_release(&v);
    free(want);
    cr_assert_eq(tc_stats(c).corrupt, 0, "no hint was taken for corruption");
    kw_cache_close(c);
}
