/* test_cache_ro.c: read-only caches serve (issue 12 point 4): a cache of
 * another user (as `nobody` on a 0755 cache), a read-only bind mount (as
 * root), opts.read_only and opts.auto_read_only.  Hits are served and
 * counted in memory, never written; puts fail with KW_EROFS. */
#define _GNU_SOURCE /* unshare */
#include <criterion/criterion.h>
#include <errno.h>
#include <pwd.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

static char dir[256], cache[300];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache-ro"), 0);
    snprintf(cache, sizeof cache, "%s/c", dir);
}

static void teardown(void)
{
    umount2(cache, MNT_DETACH); /* when a test mounted it; else harmless */
    kw_test_rmtree(dir);
}

TestSuite(cache_ro, .init = setup, .fini = teardown);

/* Makes the cache of entries 0..2 (1000 bytes each), entry 0 pinned in a
 * set, one hit flushed on entry 1. */
static void make_cache(void)
{
    kw_cache *c = tc_open(cache, 0, false);
    for (uint64_t i = 0; i < 3; i++)
        tc_put(c, i, 1000, false);
    uint8_t d[1][KW_CACHE_DIGEST_LEN];
    tc_digest(0, d[0]);
    cr_assert_eq(kw_cache_pin_set(c, "shipped", (const uint8_t(*)[32])d, 1), 0);
    cr_assert_eq(tc_get_check(c, 1, 1000), 0);
    kw_cache_close(c);
}

/* Counts entries; a negative count when entry 1 does not show the hit
 * flushed by the writer plus the three counted in memory. */
static int count_entry(const uint8_t *d, const kw_cache_info *info, void *arg)
{
    uint8_t one[KW_CACHE_DIGEST_LEN];
    tc_digest(1, one);
    if (memcmp(d, one, sizeof one) == 0 && info->hits != 4)
        *(int *)arg = -100;
    ++*(int *)arg;
    return 0;
}

static int count_pins(const kw_cache_pin_info *p, void *arg)
{
    *(uint64_t *)arg += p->entries;
    return 0;
}

/* Everything a reader does, on a handle that cannot write.  Returns 0, or
 * the number of the first check that failed (run in children too, so no
 * criterion assertion inside). */
static int reader_checks(kw_cache *c)
{
    uint8_t d[KW_CACHE_DIGEST_LEN], out[KW_CACHE_DIGEST_LEN];
    char buf[2000], hex[9];
    size_t len;
    kw_cache_info info;
    kw_cache_stats s;
    int n = 0;
    uint64_t pinned = 0;
    tc_digest(1, d);
    if (!kw_cache_is_read_only(c))
        return 1;
    for (int i = 0; i < 3; i++)
        if (kw_cache_get_into(c, d, buf, sizeof buf, &len, &info) != 0 ||
            len != 1000)
            return 2;
    if (info.hits != 3) /* one flushed by the writer, two in memory */
        return 3;
    if (kw_cache_stats_get(c, &s) != 0 || !s.read_only || s.entries != 3 ||
        s.hits != 4 || s.pinned_entries != 1 || s.max_size == 0)
        return 4;
    if (kw_cache_foreach(c, count_entry, &n) != 0 || n != 3)
        return 5;
    if (kw_cache_pins_foreach(c, count_pins, &pinned) != 0 || pinned != 1)
        return 6;
    if (kw_cache_put(c, d, NULL, buf, 10, false, NULL) != KW_EROFS)
        return 7;
    for (int i = 0; i < 4; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    if (kw_cache_find_prefix(c, hex, out, NULL, 0) != 0 ||
        memcmp(out, d, sizeof out) != 0)
        return 8;
    kw_cache_view v;
    if (kw_cache_borrow(c, d, &v, NULL) != 0 || v.len != 1000)
        return 9;
    kw_cache_release(&v);
    if (kw_cache_flush(c) != 0)
        return 10;
    return 0;
}

/* Opens the cache with o and runs reader_checks; 100 + open failure. */
static int open_and_check(const kw_cache_opts *o)
{
    kw_cache *c = NULL;
    char err[512];
    if (kw_cache_open(&c, o, err, sizeof err) != 0)
        return 100;
    int rc = reader_checks(c);
    kw_cache_close(c);
    return rc;
}

/* Makes dir and everything under it readable by all, writable by root. */
static void share_read_only(void)
{
    const char *names[] = {"", "/c", "/c/data.mdb", "/c/lock.mdb"};
    for (int i = 0; i < 4; i++) {
        char p[400];
        snprintf(p, sizeof p, "%s%s", dir, names[i]);
        cr_assert_eq(chmod(p, i < 2 ? 0755 : 0644), 0, "chmod %s", p);
    }
}

Test(cache_ro, nobody_reads_a_0755_cache_of_root)
{
    struct passwd *pw = getpwnam("nobody");
    if (geteuid() != 0 || !pw)
        cr_skip_test("needs root and a `nobody` user");
    make_cache();
    share_read_only();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0)
            _exit(99);
        kw_cache_opts o = {.dir = cache};
        kw_cache *c = NULL;
        char err[512];
        int rc = kw_cache_open(&c, &o, err, sizeof err);
        if (rc == 0 || !strstr(err, cache)) /* a writer is refused */
            _exit(98);
        o.auto_read_only = true;
        if ((rc = open_and_check(&o)) != 0)
            _exit(rc);
        o.auto_read_only = false;
        o.read_only = true;
        _exit(open_and_check(&o) ? 97 : 0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "nobody's reader failed check %d", WEXITSTATUS(st));
    /* and nothing was written: the writer's view is unchanged */
    kw_cache *c = tc_open(cache, 0, false);
    cr_assert_eq(tc_stats(c).hits, 1);
    kw_cache_close(c);
}

Test(cache_ro, read_only_bind_mount_serves)
{
    make_cache();
    /* a private mount namespace, so nothing leaks out of this test */
    if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount(cache, cache, NULL, MS_BIND, NULL) != 0)
        cr_skip_test("cannot bind-mount here (%s)", strerror(errno));
    if (mount(NULL, cache, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0)
        cr_skip_test("cannot remount read-only (%s)", strerror(errno));
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[512];
    int rc = kw_cache_open(&c, &o, err, sizeof err);
    cr_assert_neq(rc, 0, "a writer cannot open a read-only mount");
    cr_assert(strstr(err, cache), "%s", err);
    o.auto_read_only = true;
    cr_assert_eq(open_and_check(&o), 0, "auto_read_only");
    o.auto_read_only = false;
    o.read_only = true;
    cr_assert_eq(open_and_check(&o), 0, "read_only");
}

Test(cache_ro, auto_read_only_stays_writable_when_it_can_write)
{
    make_cache();
    kw_cache_opts o = {.dir = cache, .auto_read_only = true};
    kw_cache *c = NULL;
    char err[512];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    cr_assert_not(kw_cache_is_read_only(c));
    cr_assert_not(tc_stats(c).read_only);
    tc_put(c, 7, 100, false);
    kw_cache_close(c);
    o.dir = dir; /* a directory with no cache: read-only has nothing */
    o.read_only = true;
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), -ENOENT);
}

Test(cache_ro, read_only_handle_keeps_counts_in_memory_only)
{
    make_cache();
    kw_cache_opts o = {.dir = cache, .read_only = true};
    cr_assert_eq(open_and_check(&o), 0);
    cr_assert_eq(open_and_check(&o), 0, "the first handle wrote nothing");
    kw_cache *c = tc_open(cache, 0, true);
    cr_assert_eq(tc_get_check(c, 9, 10), KW_ENOTFOUND);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.misses, 1, "misses too are counted in memory");
    kw_cache_count(c, KW_CACHE_COMPILES, 1);
    cr_assert_eq(tc_stats(c).compiles, 0, "a read-only cache compiles nothing");
    kw_cache_close(c);
}

/* Every write a read-only handle refuses leaves a reason naming the
 * cache, so that kwarmd's refusal of a resize or evict is never an empty
 * "kwarmd: " (issue 24). */
Test(cache_ro, refused_writes_name_the_read_only_cache)
{
    make_cache();
    kw_cache *c = tc_open(cache, 0, true);
    uint8_t d[1][KW_CACHE_DIGEST_LEN];
    tc_digest(1, d[0]);
    char want[320];
    snprintf(want, sizeof want, "%s is read-only", cache);
    int rcs[5] = {kw_cache_resize(c, 2ull << 20), kw_cache_remove(c, d[0]),
                  kw_cache_pin(c, d[0], true),
                  kw_cache_pin_set(c, "x", (const uint8_t(*)[32])d, 1),
                  kw_cache_put(c, d[0], NULL, d[0], 32, false, NULL)};
    for (int i = 0; i < 5; i++)
        cr_expect_eq(rcs[i], KW_EROFS, "write %d", i);
    cr_expect_str_eq(kw_cache_last_error(c), want);
    cr_assert_eq(kw_cache_unpin_set(c, "shipped"), KW_EROFS);
    cr_expect_str_eq(kw_cache_last_error(c), want);
    kw_cache_close(c);
}
