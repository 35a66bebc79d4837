/* test_cache_limits.c: the size limit is stored in the cache (issue 12
 * point 3): set at creation, used by every opener, changed only by
 * kw_cache_resize(), and enforced on a writer's open. */
#include <criterion/criterion.h>
#include <lmdb.h>
#include <stdlib.h>
#include <string.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

#define KIB 1024u
#define MIB (1ull << 20)

static char dir[256];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache-limits"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

TestSuite(cache_limits, .init = setup, .fini = teardown);

/* Sets (v != 0) or deletes (v == 0) "max_size" in the cache's "stats"
 * database with LMDB directly, as an older build or another tool left
 * it.  The cache must be closed in this process. */
static void poke_max(uint64_t v)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 8), 0);
    cr_assert_eq(mdb_env_open(env, dir, MDB_NOTLS, 0600), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "stats", 0, &dbi), 0);
    MDB_val k = {8, "max_size"};
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    MDB_val d = {8, le};
    cr_assert_eq(v ? mdb_put(txn, dbi, &k, &d, 0) : mdb_del(txn, dbi, &k, NULL),
                 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

Test(cache_limits, limit_is_stored_at_creation_and_kept_by_openers)
{
    kw_cache *c = tc_open(dir, 2 * MIB, false);
    kw_cache_close(c);
    c = tc_open(dir, 8 * MIB, false); /* a later opener's own limit */
    cr_assert_eq(tc_stats(c).max_size, 2 * MIB);
    for (uint64_t i = 0; i < 5; i++)
        tc_put(c, i, 500 * KIB, false);
    kw_cache_stats s = tc_stats(c);
    cr_assert_leq(s.bytes, 2 * MIB, "the stored limit is enforced");
    cr_assert_eq(s.evictions, 1);
    kw_cache_close(c);
    c = tc_open(dir, 0, false); /* 0 does not mean "the default" here */
    cr_assert_eq(tc_stats(c).max_size, 2 * MIB);
    kw_cache_close(c);
    c = tc_open(dir, 0, true);
    cr_assert_eq(tc_stats(c).max_size, 2 * MIB);
    kw_cache_close(c);
}

Test(cache_limits, resize_changes_it_for_every_opener)
{
    kw_cache *c = tc_open(dir, 2 * MIB, false);
    cr_assert_eq(kw_cache_resize(c, 4 * MIB), 0);
    cr_assert_eq(tc_stats(c).max_size, 4 * MIB);
    for (uint64_t i = 0; i < 7; i++) /* 3.5 MiB: over the old limit */
        tc_put(c, i, 512 * KIB, false);
    cr_assert_eq(tc_stats(c).evictions, 0);
    kw_cache_close(c);
    c = tc_open(dir, 2 * MIB, true);
    cr_assert_eq(tc_stats(c).max_size, 4 * MIB);
    kw_cache_close(c);
}

Test(cache_limits, resize_bounds_on_both_sides)
{
    kw_cache *c = tc_open(dir, 2 * MIB, false);
    cr_assert_eq(kw_cache_resize(c, KW_CACHE_MIN_SIZE - 1), KW_EINVAL);
    cr_assert_eq(kw_cache_resize(c, KW_CACHE_MAX_SIZE + 1), KW_EINVAL);
    cr_assert_eq(kw_cache_resize(c, 0), KW_EINVAL);
    cr_assert_eq(tc_stats(c).max_size, 2 * MIB, "unchanged by a refusal");
    cr_assert_eq(kw_cache_resize(c, KW_CACHE_MIN_SIZE), 0);
    cr_assert_eq(tc_stats(c).max_size, KW_CACHE_MIN_SIZE);
    cr_assert_eq(kw_cache_resize(c, KW_CACHE_MAX_SIZE), 0);
    cr_assert_eq(tc_stats(c).max_size, KW_CACHE_MAX_SIZE);
    cr_assert_eq(kw_cache_resize(NULL, MIB), KW_EINVAL);
    kw_cache_close(c);
}

Test(cache_limits, resize_down_trims_lru_and_refuses_below_pinned)
{
    kw_cache *c = tc_open(dir, 4 * MIB, false);
    tc_put(c, 0, 600 * KIB, true);
    for (uint64_t i = 1; i < 6; i++)
        tc_put(c, i, 500 * KIB, false); /* 3100 KiB in all */
    cr_assert_eq(kw_cache_resize(c, 2 * MIB), 0);
    kw_cache_stats s = tc_stats(c);
    cr_assert_leq(s.bytes, 2 * MIB);
    cr_assert_eq(s.evictions, 3);
    cr_assert(tc_has(c, 0) && tc_has(c, 4) && tc_has(c, 5) && !tc_has(c, 3));
    /* 600 KiB pinned plus 2 x 500 KiB in a set: 1.6 MiB held */
    uint8_t d[2][KW_CACHE_DIGEST_LEN];
    tc_digest(4, d[0]);
    tc_digest(5, d[1]);
    cr_assert_eq(kw_cache_pin_set(c, "s", (const uint8_t(*)[32])d, 2), 0);
    cr_assert_eq(kw_cache_resize(c, MIB), KW_ENOSPC);
    cr_assert(strstr(kw_cache_last_error(c), "kwarm resize"), "%s",
              kw_cache_last_error(c));
    s = tc_stats(c);
    cr_assert_eq(s.max_size, 2 * MIB, "a refused resize changes nothing");
    cr_assert_eq(s.entries, 3);
    cr_assert_eq(kw_cache_resize(c, 1600 * KIB), 0, "exactly what is held");
    kw_cache_close(c);
}

Test(cache_limits, writer_trims_a_cache_found_over_its_limit)
{
    kw_cache *c = tc_open(dir, 4 * MIB, false);
    for (uint64_t i = 0; i < 6; i++)
        tc_put(c, i, 500 * KIB, false);
    kw_cache_close(c);
    poke_max(MIB); /* 3000 KiB stored under a 1 MiB limit */
    c = tc_open(dir, 0, true);
    cr_assert_eq(tc_stats(c).bytes, 3000 * KIB, "a reader trims nothing");
    kw_cache_close(c);
    c = tc_open(dir, 8 * MIB, false);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.max_size, MIB);
    cr_assert_leq(s.bytes, MIB);
    cr_assert_eq(s.entries, 2, "the two most recent stay");
    cr_assert(tc_has(c, 4) && tc_has(c, 5));
    kw_cache_close(c);
}

Test(cache_limits, old_cache_without_a_stored_limit_gets_the_openers)
{
    kw_cache *c = tc_open(dir, 4 * MIB, false);
    tc_put(c, 0, 1000, false);
    kw_cache_close(c);
    poke_max(0);
    c = tc_open(dir, 3 * MIB, false);
    cr_assert_eq(tc_stats(c).max_size, 3 * MIB);
    kw_cache_close(c);
    c = tc_open(dir, 5 * MIB, false);
    cr_assert_eq(tc_stats(c).max_size, 3 * MIB, "stored from then on");
    kw_cache_close(c);
}
