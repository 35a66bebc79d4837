/* test_cache_batch.c: kw_cache_put_many, the group commit of the warm
 * pipeline's store stage (issue 14 point 4). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

static char dir[128];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cbatch"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

/* n items 0..n-1 of len bytes each, blobs and digests from tc_*. */
typedef struct items {
    kw_cache_item v[600];
    uint8_t d[600][KW_CACHE_DIGEST_LEN];
    kw_cache_info info[600];
    uint8_t *blob[600];
    int rc[600];
} items;

static items *make(size_t n, size_t len, uint64_t first)
{
    items *it = calloc(1, sizeof *it);
    cr_assert_not_null(it);
    for (size_t i = 0; i < n; i++) {
        tc_digest(first + i, it->d[i]);
        it->info[i] = tc_info(first + i);
        it->blob[i] = tc_blob(first + i, len);
        it->v[i] = (kw_cache_item){it->d[i], &it->info[i], it->blob[i], len, false,
                                   false};
        it->rc[i] = 12345;
    }
    return it;
}

static void drop(items *it, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(it->blob[i]);
    free(it);
}

Test(cache_batch, five_hundred_puts_in_one_commit_all_stored_and_verified,
     .init = setup, .fini = teardown)
{
    kw_cache *c = tc_open(dir, 0, false);
    items *it = make(500, 3000, 0);
    cr_assert_eq(kw_cache_put_many(c, it->v, 500, it->rc), 0);
    for (size_t i = 0; i < 500; i++) {
        cr_expect_eq(it->rc[i], 0, "item %zu", i);
        cr_expect_eq(tc_get_check(c, i, 3000), 0, "item %zu reads back", i);
    }
    cr_expect_eq(tc_stats(c).entries, 500);
    cr_expect_eq(tc_stats(c).bytes, 500 * 3000);
    drop(it, 500);
    kw_cache_close(c);
}

Test(cache_batch, an_entry_already_there_is_left_alone_and_a_bad_item_is_its_own,
     .init = setup, .fini = teardown)
{
    kw_cache *c = tc_open(dir, 0, false);
    cr_assert(tc_put(c, 3, 100, false));
    items *it = make(8, 200, 0);
    it->v[5].len = 0; /* refused: an empty blob */
    cr_assert_eq(kw_cache_put_many(c, it->v, 8, it->rc), 0);
    for (size_t i = 0; i < 8; i++)
        cr_expect_eq(it->rc[i], i == 5 ? KW_EINVAL : 0, "item %zu: %d", i, it->rc[i]);
    cr_expect_eq(tc_get_check(c, 3, 100), 0, "the older entry stays as it was");
    cr_expect(!tc_has(c, 5));
    cr_expect_eq(tc_stats(c).entries, 7);
    drop(it, 8);
    kw_cache_close(c);
}

/* A batch over the limit beside pinned entries: the group fails as a
 * whole, then each item alone gets its own answer. */
Test(cache_batch, a_group_that_cannot_fit_falls_back_to_one_put_each,
     .init = setup, .fini = teardown)
{
    kw_cache *c = tc_open(dir, 1u << 20, false);
    for (uint64_t i = 100; i < 103; i++) /* 900 KiB pinned */
        cr_assert(tc_put(c, i, 300 * 1024, true));
    items *it = make(3, 60 * 1024, 0); /* 180 KiB: only two fit */
    /* Protected, as a warm protects its deployment: a later item of the
     * group may not evict an earlier one, so the group cannot commit. */
    kw_cache_guard *g = NULL;
    cr_assert_eq(kw_cache_protect(c, (const uint8_t (*)[KW_CACHE_DIGEST_LEN])it->d,
                                  3, &g), 0);
    cr_assert_eq(kw_cache_put_many(c, it->v, 3, it->rc), 0);
    int stored = 0, nospc = 0;
    for (size_t i = 0; i < 3; i++) {
        stored += it->rc[i] == 0;
        nospc += it->rc[i] == KW_ENOSPC;
    }
    cr_expect_eq(stored + nospc, 3, "%d %d %d", it->rc[0], it->rc[1], it->rc[2]);
    cr_expect_geq(stored, 1, "what fits is stored");
    cr_expect_geq(nospc, 1, "what does not fit says so");
    for (uint64_t i = 100; i < 103; i++)
        cr_expect(tc_has(c, i), "a pinned entry was evicted");
    cr_expect_eq(stored, 2, "%d %d %d", it->rc[0], it->rc[1], it->rc[2]);
    kw_cache_unprotect(g);
    drop(it, 3);
    kw_cache_close(c);
}

Test(cache_batch, a_read_only_cache_refuses_every_item, .init = setup,
     .fini = teardown)
{
    kw_cache *c = tc_open(dir, 0, false);
    kw_cache_close(c);
    c = tc_open(dir, 0, true);
    items *it = make(4, 100, 0);
    cr_assert_eq(kw_cache_put_many(c, it->v, 4, it->rc), 0);
    for (size_t i = 0; i < 4; i++)
        cr_expect_eq(it->rc[i], KW_EROFS);
    drop(it, 4);
    kw_cache_close(c);
}
