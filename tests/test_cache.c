/* test_cache.c: the LMDB compile cache in one process: round trips, stats,
 * integrity, eviction by size and by map, pins, rejections.  Threads,
 * several processes and killed readers are in test_cache_proc.c. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

#define MIB (1ull << 20)

static char dir[256];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

TestSuite(cache, .init = setup, .fini = teardown);

Test(cache, put_then_get_returns_same_bytes_and_metadata)
{
    kw_cache *c = tc_open(dir, 0, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(7, d);
    uint8_t *b = tc_blob(7, 50000);
    kw_cache_info in = tc_info(7);
    bool stored = false;
    cr_assert_eq(kw_cache_put(c, d, &in, b, 50000, false, &stored), 0);
    cr_assert(stored);
    void *got;
    size_t n;
    kw_cache_info out;
    cr_assert_eq(kw_cache_get(c, d, &got, &n, &out), 0);
    cr_assert_eq(n, 50000);
    cr_assert(memcmp(got, b, n) == 0);
    cr_assert_str_eq(out.family, in.family);
    cr_assert_str_eq(out.arch, in.arch);
    cr_assert_str_eq(out.entry, in.entry);
    cr_assert_str_eq(out.nvrtc, in.nvrtc);
    cr_assert_eq(out.nfields, in.nfields);
    cr_assert(memcmp(out.fields, in.fields, in.nfields * 8) == 0);
    cr_assert_float_eq(out.compile_seconds, in.compile_seconds, 0);
    cr_assert_eq(out.size, 50000);
    cr_assert_not(out.pinned);
    cr_assert_eq(out.hits, 0, "hits are as of the last flush");
    cr_assert_gt(out.created, 1600000000u);
    cr_assert_geq(out.last_used, out.created);
    free(got);
    /* the allocation-free form, and a buffer one byte short */
    uint8_t *buf = malloc(50000);
    cr_assert_eq(kw_cache_get_into(c, d, buf, 50000, &n, NULL), 0);
    cr_assert(n == 50000 && memcmp(buf, b, n) == 0);
    n = 0;
    cr_assert_eq(kw_cache_get_into(c, d, buf, 49999, &n, NULL), KW_ENOSPC);
    cr_assert_eq(n, 50000, "ENOSPC reports the size needed");
    free(buf);
    free(b);
    kw_cache_close(c);
}

Test(cache, its_files_are_readable_by_the_group_and_nobody_else)
{
    mode_t old = umask(022);
    kw_cache *c = tc_open(dir, 0, false);
    umask(old);
    static const char *const files[] = {"data.mdb", "lock.mdb", "claims"};
    for (size_t i = 0; i < 3; i++) {
        char path[600];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_assert_eq(stat(path, &st), 0, "%s", path);
        cr_assert_eq(st.st_mode & 0777, 0640, "%s: %o", files[i],
                     (unsigned)(st.st_mode & 0777));
    }
    kw_cache_close(c);
}

Test(cache, get_of_missing_digest_is_enotfound)
{
    kw_cache *c = tc_open(dir, 0, false);
    tc_put(c, 1, 100, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(2, d);
    void *got = (void *)1;
    size_t n;
    cr_assert_eq(kw_cache_get(c, d, &got, &n, NULL), KW_ENOTFOUND);
    cr_assert_null(got);
    cr_assert_not(kw_cache_contains(c, d));
    cr_assert(tc_has(c, 1));
    kw_cache_close(c);
}

Test(cache, stats_count_and_persist_across_reopen)
{
    kw_cache *c = tc_open(dir, 8 * MIB, false);
    tc_put(c, 1, 1000, false);
    tc_put(c, 2, 3000, true);
    cr_assert_eq(tc_get_check(c, 1, 1000), 0);
    cr_assert_eq(tc_get_check(c, 1, 1000), 0);
    cr_assert_eq(tc_get_check(c, 2, 3000), 0);
    cr_assert_eq(tc_get_check(c, 3, 10), KW_ENOTFOUND);
    kw_cache_count(c, KW_CACHE_COMPILES, 5);
    kw_cache_count(c, KW_CACHE_COMPILE_FAILURES, 1);
    kw_cache_stats s = tc_stats(c); /* before any flush: from memory */
    cr_assert_eq(s.entries, 2);
    cr_assert_eq(s.bytes, 4000);
    cr_assert_eq(s.max_size, 8 * MIB);
    cr_assert_eq(s.hits, 3);
    cr_assert_eq(s.misses, 1);
    cr_assert_eq(s.compiles, 5);
    cr_assert_eq(s.compile_failures, 1);
    cr_assert_eq(s.evictions + s.corrupt, 0);
    cr_assert_eq(kw_cache_flush(c), 0);
    kw_cache_stats f = tc_stats(c);
    cr_assert(memcmp(&s, &f, sizeof s) == 0, "a flush changes no total");
    kw_cache_count(c, KW_CACHE_COMPILES, 2);
    cr_assert_eq(tc_get_check(c, 2, 3000), 0);
    kw_cache_close(c); /* flushes the last hit and count */
    c = tc_open(dir, 8 * MIB, true);
    s = tc_stats(c);
    cr_assert_eq(s.entries, 2);
    cr_assert_eq(s.bytes, 4000);
    cr_assert_eq(s.hits, 4);
    cr_assert_eq(s.misses, 1);
    cr_assert_eq(s.compiles, 7);
    cr_assert_eq(s.compile_failures, 1);
    cr_assert_eq(s.max_size, 8 * MIB, "read-only shows the writer's limit");
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(1, d);
    kw_cache_info info;
    void *got;
    size_t n;
    cr_assert_eq(kw_cache_get(c, d, &got, &n, &info), 0);
    cr_assert_eq(info.hits, 2, "per-entry hits persisted by the flush");
    free(got);
    cr_assert_eq(kw_cache_get(c, d, &got, &n, &info), 0);
    cr_assert_eq(info.hits, 3, "plus the hit this read-only handle counted");
    free(got);
    cr_assert_eq(tc_stats(c).hits, 6, "a read-only get counts in memory");
    cr_assert(tc_stats(c).read_only);
    kw_cache_close(c);
    c = tc_open(dir, 8 * MIB, true);
    cr_assert_eq(tc_stats(c).hits, 4, "and never writes it");
    kw_cache_close(c);
}

/* A flush writes its hits in transactions of a few hundred (flush.c):
 * 3,000 digests with 1 to 3 hits each must all land, none twice. */
Test(cache, flush_of_thousands_of_digests_writes_every_hit_once)
{
    enum { N = 3000 };
    kw_cache *c = tc_open(dir, 64 * MIB, false);
    for (uint64_t i = 0; i < N; i++)
        tc_put(c, i, 64, false);
    for (uint64_t i = 0; i < N; i++)
        for (uint64_t h = 0; h <= i % 3; h++)
            cr_assert_eq(tc_get_check(c, i, 64), 0);
    cr_assert_eq(kw_cache_flush(c), 0);
    kw_cache_close(c);
    c = tc_open(dir, 64 * MIB, true); /* read-only: counts not written */
    cr_assert_eq(tc_stats(c).hits, 2 * N, "1 + 2 + 3 hits per three");
    for (uint64_t i = 0; i < N; i++) {
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        kw_cache_info info;
        void *got;
        size_t n;
        cr_assert_eq(kw_cache_get(c, d, &got, &n, &info), 0);
        cr_assert_eq(info.hits, i % 3 + 1, "entry %llu: %u hits",
                     (unsigned long long)i, (unsigned)info.hits);
        free(got);
    }
    kw_cache_close(c);
}

Test(cache, put_of_existing_digest_keeps_first_blob)
{
    kw_cache *c = tc_open(dir, 0, false);
    cr_assert(tc_put(c, 5, 4000, false));
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(5, d);
    uint8_t *other = tc_blob(99, 777);
    bool stored = true;
    cr_assert_eq(kw_cache_put(c, d, NULL, other, 777, true, &stored), 0);
    cr_assert_not(stored);
    free(other);
    cr_assert_eq(tc_get_check(c, 5, 4000), 0);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.bytes, 4000);
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
    size_t off = (size_t)(at - data);
    cr_assert_null(memmem(at + 1, len - off - 1, needle, nlen),
                   "exactly one copy, so the flip hits the live one");
    at[nlen / 2] ^= 0x40;
    char written[512];
    cr_assert_eq(kw_test_write_file(dir, "data.mdb", data, len, written,
                                    sizeof written), 0);
    free(data);
}

Test(cache, flipped_byte_in_blob_is_ecorrupt_and_removed)
{
    kw_cache *c = tc_open(dir, 0, false);
    tc_put(c, 1, 20000, false);
    tc_put(c, 2, 30000, false);
    tc_put(c, 3, 500, false); /* small: stored inside a leaf page */
    kw_cache_close(c);
    uint8_t *b = tc_blob(2, 30000);
    flip_in_data_file(b + 10000, 256);
    free(b);

    c = tc_open(dir, 0, false);
    cr_assert(tc_has(c, 2), "corruption is only seen by a get");
    cr_assert_eq(tc_get_check(c, 2, 30000), KW_ECORRUPT);
    cr_assert_not(tc_has(c, 2));
    cr_assert_eq(tc_get_check(c, 2, 30000), KW_ENOTFOUND);
    cr_assert_eq(tc_get_check(c, 1, 20000), 0);
    cr_assert_eq(tc_get_check(c, 3, 500), 0);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.corrupt, 1);
    cr_assert_eq(s.entries, 2);
    cr_assert_eq(s.bytes, 20500, "the removed entry's bytes are gone");
    tc_put(c, 2, 30000, false); /* the caller recompiles and stores */
    cr_assert_eq(tc_get_check(c, 2, 30000), 0);
    kw_cache_close(c);
}

/* Size of entry i in the size-limit workload: 8 KiB to 200 KiB. */
static size_t work_size(uint64_t i)
{
    uint64_t s = i;
    return 8192 + (size_t)(tc_mix(&s) % (192 * 1024));
}

Test(cache, size_limit_evicts_lru_and_keeps_pinned)
{
    const uint64_t max = 4 * MIB;
    kw_cache *c = tc_open(dir, max, false);
    uint64_t total = 0, i = 0;
    /* 0..3 pinned, 4..7 hot (read after every fifth put), the rest cold */
    for (; total < 3 * max; i++) {
        tc_put(c, i, work_size(i), i < 4);
        total += work_size(i);
        kw_cache_stats s = tc_stats(c);
        cr_assert_leq(s.bytes, max, "after put %llu: %llu bytes",
                      (unsigned long long)i, (unsigned long long)s.bytes);
        if (i >= 8 && i % 5 == 0) {
            for (uint64_t h = 4; h < 8; h++)
                cr_assert_eq(tc_get_check(c, h, work_size(h)), 0,
                             "hot entry %llu", (unsigned long long)h);
            cr_assert_eq(kw_cache_flush(c), 0);
        }
    }
    const uint64_t n = i;
    kw_cache_stats s = tc_stats(c);
    cr_assert_gt(s.evictions, 0);
    cr_assert_eq(s.entries + s.evictions, n, "every put stored");
    for (uint64_t p = 0; p < 4; p++)
        cr_assert_eq(tc_get_check(c, p, work_size(p)), 0, "pinned %llu",
                     (unsigned long long)p);
    for (uint64_t h = 4; h < 8; h++)
        cr_assert_eq(tc_get_check(c, h, work_size(h)), 0, "hot %llu",
                     (unsigned long long)h);
    for (uint64_t o = 8; o < 16; o++)
        cr_assert_not(tc_has(c, o), "old entry %llu evicted",
                      (unsigned long long)o);
    for (uint64_t r = n - 5; r < n; r++)
        cr_assert_eq(tc_get_check(c, r, work_size(r)), 0, "recent %llu",
                     (unsigned long long)r);
    kw_cache_close(c);
}

Test(cache, map_full_is_served_by_eviction)
{
    /* 12,000 tiny entries with long names: under 200 KB of cubins, far
     * below the 1 MiB limit, but their B-tree pages outgrow the map. */
    const uint64_t n = 12000;
    kw_cache *c = tc_open(dir, KW_CACHE_MIN_SIZE, false);
    kw_cache_info in = tc_info(1);
    memset(in.entry, 'e', sizeof in.entry - 1);
    memset(in.family, 'f', sizeof in.family - 1);
    for (uint64_t i = 0; i < n; i++) {
        uint8_t d[KW_CACHE_DIGEST_LEN], b[16];
        tc_digest(i, d);
        memcpy(b, d, sizeof b);
        bool stored = false;
        int rc = kw_cache_put(c, d, &in, b, 1 + i % 16, false, &stored);
        cr_assert_eq(rc, 0, "put %llu: %s: %s", (unsigned long long)i,
                     kw_err_name(rc), kw_cache_last_error(c));
        cr_assert(stored);
    }
    kw_cache_stats s = tc_stats(c);
    cr_assert_gt(s.evictions, 0, "the map filled before the byte limit");
    cr_assert_lt(s.bytes, KW_CACHE_MIN_SIZE / 4);
    cr_assert_eq(s.entries + s.evictions, n);
    for (uint64_t i = n - 100; i < n; i++) {
        uint8_t d[KW_CACHE_DIGEST_LEN];
        tc_digest(i, d);
        void *got;
        size_t len;
        cr_assert_eq(kw_cache_get(c, d, &got, &len, NULL), 0);
        cr_assert(len == 1 + i % 16 && memcmp(got, d, len) == 0);
        free(got);
    }
    cr_assert_not(tc_has(c, 0), "the oldest went first");
    kw_cache_close(c);
}

Test(cache, all_pinned_gives_enospc_and_evicts_nothing)
{
    kw_cache *c = tc_open(dir, KW_CACHE_MIN_SIZE, false);
    for (uint64_t i = 0; i < 3; i++)
        tc_put(c, i, 300 * 1024, true);
    tc_put(c, 3, 100 * 1024, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(4, d);
    uint8_t *b = tc_blob(4, 200 * 1024);
    bool stored = true;
    cr_assert_eq(kw_cache_put(c, d, NULL, b, 200 * 1024, false, &stored),
                 KW_ENOSPC);
    cr_assert_not(stored);
    cr_assert(strstr(kw_cache_last_error(c), "pinned"), "%s",
              kw_cache_last_error(c));
    cr_assert(tc_has(c, 3), "nothing was evicted for a put that failed");
    cr_assert_eq(tc_stats(c).evictions, 0);
    /* room made by evicting the unpinned entry is fine */
    cr_assert_eq(kw_cache_put(c, d, NULL, b, 120 * 1024, false, &stored), 0);
    cr_assert(stored);
    cr_assert_not(tc_has(c, 3));
    cr_assert_eq(tc_stats(c).evictions, 1);
    free(b);
    kw_cache_close(c);
}

Test(cache, rejects_invalid_puts)
{
    kw_cache *c = tc_open(dir, 0, false);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(1, d);
    size_t big = KW_CACHE_MAX_BLOB + 1;
    uint8_t *b = calloc(1, big); /* untouched pages cost nothing */
    cr_assert_not_null(b);
    bool stored = true;
    cr_assert_eq(kw_cache_put(c, d, NULL, b, 0, false, &stored), KW_EINVAL);
    cr_assert_not(stored);
    cr_assert_eq(kw_cache_put(c, d, NULL, b, big, false, NULL), KW_EINVAL);
    kw_cache_info in = tc_info(1);
    memset(in.arch, 'x', sizeof in.arch); /* no NUL inside the array */
    cr_assert_eq(kw_cache_put(c, d, &in, b, 10, false, NULL), KW_EINVAL);
    in = tc_info(1);
    in.nfields = KW_CACHE_MAX_FIELDS + 1;
    cr_assert_eq(kw_cache_put(c, d, &in, b, 10, false, NULL), KW_EINVAL);
    cr_assert_eq(tc_stats(c).entries, 0);
    tc_put(c, 2, 100, false);
    kw_cache_close(c);

    c = tc_open(dir, 0, true);
    cr_assert_eq(kw_cache_put(c, d, NULL, b, 10, false, NULL), KW_EROFS);
    cr_assert_str_eq(kw_strerror(KW_EROFS), "not cached (read-only cache)");
    tc_digest(2, d);
    cr_assert_eq(kw_cache_remove(c, d), KW_EROFS);
    cr_assert_eq(kw_cache_pin(c, d, true), KW_EROFS);
    cr_assert_eq(kw_cache_resize(c, 2 * MIB), KW_EROFS);
    cr_assert_eq(kw_cache_pin_set(c, "x", (const uint8_t(*)[32])d, 1),
                 KW_EROFS);
    cr_assert_eq(kw_cache_unpin_set(c, "x"), KW_EROFS);
    cr_assert_eq(kw_cache_flush(c), 0);
    cr_assert_eq(tc_get_check(c, 2, 100), 0, "read-only gets work");
    kw_cache_close(c);
    free(b);
}

Test(cache, open_rejects_bad_options_naming_the_directory)
{
    char sub[400], err[512];
    snprintf(sub, sizeof sub, "%s/missing/cache", dir);
    kw_cache_opts o = {.dir = sub};
    kw_cache *c = (kw_cache *)&o; /* must stay untouched */
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), -ENOENT);
    cr_assert_eq(c, (kw_cache *)&o);
    cr_assert(strstr(err, sub), "message names %s: %s", sub, err);
    o.dir = dir;
    o.max_size = KW_CACHE_MIN_SIZE - 1;
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), KW_EINVAL);
    cr_assert(strstr(err, dir), "%s", err);
    o.max_size = 0;
    o.read_only = true; /* a directory with no cache in it */
    cr_assert_neq(kw_cache_open(&c, &o, err, sizeof err), 0);
    cr_assert(strstr(err, dir), "%s", err);
    o.dir = sub; /* read-only never creates */
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), -ENOENT);
    cr_assert(strstr(err, sub), "%s", err);
    kw_cache_close(NULL);
}

/* Collects what foreach visits. */
typedef struct seen {
    uint8_t digest[16][KW_CACHE_DIGEST_LEN];
    kw_cache_info info[16];
    int n;
} seen;

static int collect(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                   const kw_cache_info *info, void *arg)
{
    seen *s = arg;
    if (s->n == 16)
        return -1;
    memcpy(s->digest[s->n], digest, KW_CACHE_DIGEST_LEN);
    s->info[s->n++] = *info;
    return 0;
}

static int stop_at_first(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                         const kw_cache_info *info, void *arg)
{
    (void)digest;
    (void)info;
    ++*(int *)arg;
    return 7;
}

Test(cache, foreach_visits_every_entry_with_its_metadata)
{
    kw_cache *c = tc_open(dir, 0, false);
    for (uint64_t i = 0; i < 10; i++)
        tc_put(c, i, 100 + i, i == 3);
    seen s = {.n = 0};
    cr_assert_eq(kw_cache_foreach(c, collect, &s), 0);
    cr_assert_eq(s.n, 10);
    bool found[10] = {false};
    for (int k = 0; k < s.n; k++) {
        if (k > 0)
            cr_assert_lt(memcmp(s.digest[k - 1], s.digest[k],
                                KW_CACHE_DIGEST_LEN), 0, "digest order");
        for (uint64_t i = 0; i < 10; i++) {
            uint8_t d[KW_CACHE_DIGEST_LEN];
            tc_digest(i, d);
            if (memcmp(d, s.digest[k], sizeof d) != 0)
                continue;
            kw_cache_info want = tc_info(i);
            cr_assert_str_eq(s.info[k].family, want.family);
            cr_assert_str_eq(s.info[k].entry, want.entry);
            cr_assert_eq(s.info[k].nfields, want.nfields);
            cr_assert_eq(s.info[k].size, 100 + i);
            cr_assert_eq(s.info[k].pinned, i == 3);
            found[i] = true;
        }
    }
    for (int i = 0; i < 10; i++)
        cr_assert(found[i], "entry %d visited", i);
    int calls = 0;
    cr_assert_eq(kw_cache_foreach(c, stop_at_first, &calls), 7);
    cr_assert_eq(calls, 1);
    kw_cache_close(c);
}

Test(cache, remove_and_pin_work)
{
    kw_cache *c = tc_open(dir, KW_CACHE_MIN_SIZE, false);
    tc_put(c, 1, 400 * 1024, false);
    tc_put(c, 2, 400 * 1024, false);
    uint8_t d1[KW_CACHE_DIGEST_LEN], d2[KW_CACHE_DIGEST_LEN];
    tc_digest(1, d1);
    tc_digest(2, d2);
    cr_assert_eq(kw_cache_pin(c, d1, true), 0);
    cr_assert_eq(kw_cache_pin(c, d1, true), 0, "pinning twice is fine");
    /* 1 is the oldest, but pinned: the third put evicts 2 */
    tc_put(c, 3, 400 * 1024, false);
    cr_assert(tc_has(c, 1));
    cr_assert_not(tc_has(c, 2));
    cr_assert_eq(kw_cache_pin(c, d2, true), KW_ENOTFOUND);
    cr_assert_eq(kw_cache_remove(c, d2), KW_ENOTFOUND);
    cr_assert_eq(kw_cache_pin(c, d1, false), 0);
    /* unpinned again, 1 is the oldest and goes next */
    tc_put(c, 4, 400 * 1024, false);
    cr_assert_not(tc_has(c, 1));
    cr_assert(tc_has(c, 3));
    uint8_t d3[KW_CACHE_DIGEST_LEN];
    tc_digest(3, d3);
    cr_assert_eq(kw_cache_remove(c, d3), 0);
    cr_assert_not(tc_has(c, 3));
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.bytes, 400 * 1024);
    cr_assert_eq(s.evictions, 2);
    kw_cache_close(c);
}
