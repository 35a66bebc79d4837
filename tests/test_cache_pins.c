/* test_cache_pins.c: what eviction may not touch (issue 12 points 1 and
 * 2): named pin sets stored in the cache, in-memory guards, the plan a
 * warm checks before writing, and a second deployment warmed next to a
 * first one near the size limit.  Digest prefixes (point 6) too. */
#include <criterion/criterion.h>
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
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache-pins"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

TestSuite(cache_pins, .init = setup, .fini = teardown);

typedef uint8_t digest_t[KW_CACHE_DIGEST_LEN];

/* The digests of entries first..first+n-1 into d. */
static void digests(uint64_t first, size_t n, digest_t *d)
{
    for (size_t i = 0; i < n; i++)
        tc_digest(first + i, d[i]);
}

/* Collects pins_foreach's reports. */
typedef struct pin_list {
    kw_cache_pin_info p[8];
    size_t n;
} pin_list;

static int collect_pin(const kw_cache_pin_info *p, void *arg)
{
    pin_list *l = arg;
    cr_assert_lt(l->n, 8);
    l->p[l->n++] = *p;
    return 0;
}

static pin_list list_pins(kw_cache *c)
{
    pin_list l;
    memset(&l, 0, sizeof l);
    cr_assert_eq(kw_cache_pins_foreach(c, collect_pin, &l), 0);
    return l;
}

Test(cache_pins, set_entries_are_never_evicted_and_are_reported)
{
    kw_cache *c = tc_open(dir, MIB, false);
    for (uint64_t i = 0; i < 3; i++)
        tc_put(c, i, 300 * KIB, false);
    digest_t d[3];
    digests(0, 2, d);
    tc_digest(99, d[2]); /* not stored yet: pinned once it is */
    cr_assert_eq(kw_cache_pin_set(c, "dep-a", (const digest_t *)d, 3), 0);
    tc_put(c, 10, 300 * KIB, false); /* evicts entry 2, oldest unpinned */
    cr_assert(tc_has(c, 0) && tc_has(c, 1) && !tc_has(c, 2));
    kw_cache_info info;
    void *blob;
    size_t len;
    cr_assert_eq(kw_cache_get(c, d[0], &blob, &len, &info), 0);
    free(blob);
    cr_assert(info.pinned, "pinned by a set reads as pinned");
    cr_assert_eq(info.pin_sets, 1);
    pin_list l = list_pins(c);
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.p[0].name, "dep-a");
    cr_assert_eq(l.p[0].digests, 3);
    cr_assert_eq(l.p[0].entries, 2, "the absent digest is not an entry");
    cr_assert_eq(l.p[0].bytes, 600 * KIB);
    cr_assert_gt(l.p[0].created, 0);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.pinned_entries, 2);
    cr_assert_eq(s.pinned_bytes, 600 * KIB);
    /* the absent one arrives: pinned from then on */
    tc_put(c, 99, 100 * KIB, false);
    tc_put(c, 11, 300 * KIB, false); /* evicts 10, not 99 */
    cr_assert(tc_has(c, 99) && !tc_has(c, 10));
    kw_cache_close(c);
    c = tc_open(dir, 0, false);
    cr_assert_eq(list_pins(c).p[0].entries, 3, "sets are stored in the cache");
    kw_cache_close(c);
}

Test(cache_pins, names_replace_and_unpin)
{
    kw_cache *c = tc_open(dir, MIB, false);
    tc_put(c, 0, 1000, false);
    tc_put(c, 1, 1000, true); /* the old per-entry pin, beside the sets */
    digest_t d[2];
    digests(0, 2, d);
    char names[128];
    size_t n;
    cr_assert_eq(kw_cache_pin_set(c, "b", (const digest_t *)d, 1), 0);
    cr_assert_eq(kw_cache_pin_set(c, "a", (const digest_t *)d, 2), 0);
    cr_assert_eq(kw_cache_pin_names(c, d[0], names, sizeof names, &n), 0);
    cr_assert_str_eq(names, "a,b");
    cr_assert_eq(n, 2);
    cr_assert_eq(kw_cache_pin_names(c, d[0], names, 3, &n), KW_ENOSPC);
    cr_assert_str_eq(names, "a", "the names that fit, whole");
    cr_assert_eq(n, 2);
    /* replacing b with entry 1 only */
    cr_assert_eq(kw_cache_pin_set(c, "b", (const digest_t *)&d[1], 1), 0);
    cr_assert_eq(kw_cache_pin_names(c, d[0], names, sizeof names, &n), 0);
    cr_assert_str_eq(names, "a");
    cr_assert_eq(kw_cache_unpin_set(c, "a"), 0);
    cr_assert_eq(kw_cache_unpin_set(c, "a"), KW_ENOTFOUND);
    cr_assert_eq(kw_cache_pin_names(c, d[0], names, sizeof names, &n), 0);
    cr_assert_str_eq(names, "");
    cr_assert_eq(n, 0);
    kw_cache_stats s = tc_stats(c);
    cr_assert_eq(s.pinned_entries, 1, "entry 1: its flag and set b, once");
    cr_assert_eq(s.pinned_bytes, 1000);
    cr_assert_eq(kw_cache_pin(c, d[1], false), 0);
    cr_assert_eq(tc_stats(c).pinned_entries, 1, "still in set b");
    cr_assert_eq(kw_cache_unpin_set(c, "b"), 0);
    cr_assert_eq(tc_stats(c).pinned_entries, 0);
    cr_assert_eq(list_pins(c).n, 0);
    kw_cache_close(c);
}

Test(cache_pins, pin_set_caps_on_both_sides)
{
    kw_cache *c = tc_open(dir, MIB, false);
    char name[KW_CACHE_MAX_PIN_NAME + 2];
    memset(name, 'n', sizeof name);
    name[KW_CACHE_MAX_PIN_NAME] = '\0';
    size_t max = KW_CACHE_MAX_PIN_DIGESTS;
    digest_t *d = calloc(max + 1, sizeof *d);
    digests(0, max + 1, d);
    cr_assert_eq(kw_cache_pin_set(c, name, (const digest_t *)d, max), 0,
                 "a 64-byte name and the largest set");
    name[KW_CACHE_MAX_PIN_NAME] = 'n';
    name[KW_CACHE_MAX_PIN_NAME + 1] = '\0';
    cr_assert_eq(kw_cache_pin_set(c, name, (const digest_t *)d, 1), KW_EINVAL);
    cr_assert_eq(kw_cache_pin_set(c, "ok", (const digest_t *)d, max + 1),
                 KW_EINVAL);
    cr_assert_eq(kw_cache_pin_set(c, "ok", (const digest_t *)d, 0), KW_EINVAL);
    cr_assert_eq(kw_cache_pin_set(c, "", (const digest_t *)d, 1), KW_EINVAL);
    cr_assert_eq(kw_cache_pin_set(c, "a/b", (const digest_t *)d, 1),
                 KW_EINVAL);
    cr_assert_eq(kw_cache_pin_set(c, "a b", (const digest_t *)d, 1),
                 KW_EINVAL);
    cr_assert_eq(kw_cache_pin_set(c, "A-z_0.9:@+", (const digest_t *)d, 1),
                 0, "the whole name alphabet");
    cr_assert_eq(kw_cache_pin_set(c, "dup", (const digest_t *)d, 1), 0);
    digest_t two[2];
    memcpy(two[0], d[5], sizeof two[0]);
    memcpy(two[1], d[5], sizeof two[1]);
    cr_assert_eq(kw_cache_pin_set(c, "dup", (const digest_t *)two, 2), 0);
    pin_list l = list_pins(c);
    cr_assert_eq(l.n, 3);
    cr_assert_eq(l.p[1].digests, 1, "duplicates count once (%s)", l.p[1].name);
    cr_assert_eq(l.p[2].digests, max);
    free(d);
    kw_cache_close(c);
}

Test(cache_pins, guard_protects_until_given_back)
{
    kw_cache *c = tc_open(dir, MIB, false);
    for (uint64_t i = 0; i < 3; i++)
        tc_put(c, i, 300 * KIB, false);
    digest_t d[1];
    digests(0, 1, d);
    kw_cache_guard *g = NULL, *g0 = NULL;
    cr_assert_eq(kw_cache_protect(c, (const digest_t *)d, 1, &g), 0);
    cr_assert_eq(kw_cache_protect(c, NULL, 0, &g0), 0, "an empty guard");
    cr_assert_eq(kw_cache_protect(c, NULL, 1, &g0), KW_EINVAL);
    tc_put(c, 3, 300 * KIB, false);
    cr_assert(tc_has(c, 0) && !tc_has(c, 1), "1 went instead of 0");
    kw_cache_unprotect(g);
    kw_cache_unprotect(g0);
    kw_cache_unprotect(NULL);
    tc_put(c, 4, 300 * KIB, false);
    cr_assert_not(tc_has(c, 0), "evictable again");
    kw_cache_close(c);
}

Test(cache_pins, put_that_needs_held_entries_fails_naming_the_size)
{
    kw_cache *c = tc_open(dir, MIB, false);
    tc_put(c, 0, 400 * KIB, false);
    tc_put(c, 1, 400 * KIB, false);
    tc_put(c, 2, 100 * KIB, false);
    digest_t d[2];
    digests(0, 2, d);
    kw_cache_guard *g;
    cr_assert_eq(kw_cache_pin_set(c, "p", (const digest_t *)d, 1), 0);
    cr_assert_eq(kw_cache_protect(c, (const digest_t *)&d[1], 1, &g), 0);
    uint8_t nd[KW_CACHE_DIGEST_LEN];
    tc_digest(3, nd);
    uint8_t *b = tc_blob(3, 300 * KIB);
    /* 800 KiB held + 300 KiB > 1 MiB, even with entry 2 evicted */
    cr_assert_eq(kw_cache_put(c, nd, NULL, b, 300 * KIB, false, NULL),
                 KW_ENOSPC);
    const char *e = kw_cache_last_error(c);
    cr_assert(strstr(e, "needs 1126400 bytes") && strstr(e, "kwarm resize"),
              "%s", e);
    cr_assert(tc_has(c, 2), "nothing evicted by the failed put");
    /* exactly the room left beside the held entries fits */
    cr_assert_eq(kw_cache_put(c, nd, NULL, b, 224 * KIB, false, NULL), 0);
    cr_assert(tc_has(c, 0) && tc_has(c, 1) && !tc_has(c, 2));
    free(b);
    kw_cache_unprotect(g);
    kw_cache_close(c);
}

/* Warms the n entries ids[] of `size` bytes as a warm would: the whole
 * set protected while it runs, a get for each, a put for each miss.
 * Returns the first failing put's code. */
static int warm(kw_cache *c, const uint64_t *ids, size_t n, size_t size)
{
    digest_t *d = calloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++)
        tc_digest(ids[i], d[i]);
    kw_cache_guard *g;
    cr_assert_eq(kw_cache_protect(c, (const digest_t *)d, n, &g), 0);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        void *got;
        size_t len;
        if (kw_cache_get(c, d[i], &got, &len, NULL) == 0) { /* a hit */
            free(got);
            continue;
        }
        uint8_t *b = tc_blob(ids[i], size);
        rc = kw_cache_put(c, d[i], NULL, b, size, false, NULL);
        free(b);
    }
    kw_cache_unprotect(g);
    free(d);
    return rc;
}

/* ids first..first+n-1 into ids. */
static void range(uint64_t first, size_t n, uint64_t *ids)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = first + i;
}

/* Issue 12 point 1: a warm of deployment B next to deployment A, near the
 * limit, never evicts B's own entries, hits included; one that cannot fit
 * is refused by the plan before anything is written. */
Test(cache_pins, second_deployment_never_evicts_its_own_entries)
{
    kw_cache *c = tc_open(dir, MIB, false);
    uint64_t ids[11];
    range(0, 10, ids);
    cr_assert_eq(warm(c, ids, 10, 100 * KIB), 0); /* A: 0..9, 1000 KiB */
    /* B: 0..3 (hits, the oldest of A) and 100..105 (new) */
    digest_t b[10];
    digests(0, 4, b);
    digests(100, 6, b + 4);
    range(0, 4, ids);
    range(100, 6, ids + 4);
    kw_cache_plan plan;
    cr_assert_eq(kw_cache_plan_get(c, (const digest_t *)b, 10, &plan), 0);
    cr_assert_eq(plan.present, 4);
    cr_assert_eq(plan.present_bytes, 400 * KIB);
    cr_assert_eq(plan.held_bytes, 0);
    cr_assert_eq(plan.max_size, MIB);
    cr_assert_eq(plan.available, MIB - 400 * KIB);
    cr_assert_geq(plan.available, 6 * 100 * KIB, "B fits");
    cr_assert_eq(warm(c, ids, 10, 100 * KIB), 0);
    for (int i = 0; i < 10; i++)
        cr_assert(kw_cache_contains(c, b[i]), "B's entry %d was evicted", i);
    for (uint64_t i = 4; i < 10; i++)
        cr_assert_not(tc_has(c, i), "A's other entries made the room");
    /* C: 11 new entries of 100 KiB, with B pinned: the plan refuses it */
    cr_assert_eq(kw_cache_pin_set(c, "b", (const digest_t *)b, 10), 0);
    digest_t cset[11];
    digests(200, 11, cset);
    cr_assert_eq(kw_cache_plan_get(c, (const digest_t *)cset, 11, &plan), 0);
    cr_assert_eq(plan.present, 0);
    cr_assert_eq(plan.held_bytes, 1000 * KIB);
    cr_assert_eq(plan.available, MIB - 1000 * KIB);
    cr_assert_lt(plan.available, 11 * 100 * KIB, "C does not fit: refused");
    cr_assert_eq(tc_stats(c).entries, 10, "nothing written");
    /* without the pin, a put-by-put warm of C fails on C's own entries
     * before evicting any of them */
    cr_assert_eq(kw_cache_unpin_set(c, "b"), 0);
    range(200, 11, ids);
    cr_assert_eq(warm(c, ids, 11, 100 * KIB), KW_ENOSPC);
    for (uint64_t i = 200; i < 210; i++)
        cr_assert(tc_has(c, i), "C's entry %llu was evicted",
                  (unsigned long long)i);
    kw_cache_close(c);
}

Test(cache_pins, plan_counts_each_kind_of_held_entry_once)
{
    kw_cache *c = tc_open(dir, MIB, false);
    tc_put(c, 0, 1000, true);  /* flag */
    tc_put(c, 1, 2000, false); /* set */
    tc_put(c, 2, 4000, false); /* guard */
    tc_put(c, 3, 8000, false); /* neither */
    tc_put(c, 4, 16000, true); /* flag, but in the request */
    digest_t d[5];
    digests(0, 5, d);
    kw_cache_guard *g;
    cr_assert_eq(kw_cache_pin_set(c, "s", (const digest_t *)&d[1], 1), 0);
    cr_assert_eq(kw_cache_pin_set(c, "t", (const digest_t *)&d[0], 2), 0);
    cr_assert_eq(kw_cache_protect(c, (const digest_t *)&d[2], 1, &g), 0);
    digest_t req[3];
    memcpy(req[0], d[4], sizeof req[0]);
    memcpy(req[1], d[4], sizeof req[1]);
    tc_digest(50, req[2]);
    kw_cache_plan p;
    cr_assert_eq(kw_cache_plan_get(c, (const digest_t *)req, 3, &p), 0);
    cr_assert_eq(p.present, 1);
    cr_assert_eq(p.present_bytes, 16000);
    cr_assert_eq(p.held_bytes, 7000);
    cr_assert_eq(p.available, MIB - 23000);
    cr_assert_eq(kw_cache_plan_get(c, NULL, 0, &p), 0);
    cr_assert_eq(p.held_bytes, 23000);
    cr_assert_eq(kw_cache_plan_get(c, NULL, 1, &p), KW_EINVAL);
    kw_cache_unprotect(g);
    kw_cache_close(c);
}

/* The plan as kw_cache_plan_get() made it from a sorted copy of the
 * digests, before plans held hashes (issue 23): each stored entry whose
 * digest equals one of the request's is present, else held when it is
 * pinned or one of the guarded digests. */
typedef struct array_plan {
    const digest_t *req, *guarded;
    size_t nreq, nguarded;
    kw_cache_plan p;
} array_plan;

static bool in_digests(const digest_t *d, size_t n, const uint8_t *x)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(d[i], x, KW_CACHE_DIGEST_LEN) == 0)
            return true;
    return false;
}

static int array_plan_entry(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                            const kw_cache_info *info, void *arg)
{
    array_plan *a = arg;
    if (in_digests(a->req, a->nreq, digest)) {
        a->p.present++;
        a->p.present_bytes += info->size;
    } else if (info->pinned || in_digests(a->guarded, a->nguarded, digest)) {
        a->p.held_bytes += info->size;
    }
    return 0;
}

/* A kw_cache_digest_fn over an array that counts its calls. */
typedef struct counting_reader {
    const digest_t *d;
    size_t calls;
} counting_reader;

static void next_counted(void *arg, uint8_t out[KW_CACHE_DIGEST_LEN])
{
    counting_reader *r = arg;
    memcpy(out, r->d[r->calls++], KW_CACHE_DIGEST_LEN);
}

/* Issue 23: a plan made one digest at a time, as the hashes of the set,
 * counts what the array plan counted: duplicates once, absent digests
 * not at all, held entries beside the set. */
Test(cache_pins, plan_each_counts_as_the_array_plan_did)
{
    kw_cache *c = tc_open(dir, MIB, false);
    for (uint64_t i = 0; i < 40; i++) /* 0..4 pinned by their flag */
        tc_put(c, i, 1000 + 37 * i, i < 5);
    digest_t d[40];
    digests(0, 40, d);
    kw_cache_guard *g;
    cr_assert_eq(kw_cache_pin_set(c, "s", (const digest_t *)&d[5], 5), 0);
    cr_assert_eq(kw_cache_protect(c, (const digest_t *)&d[10], 5, &g), 0);
    /* 9 present digests (of each kind), each 3 times, and 50 absent */
    static const uint64_t present[] = {0, 2, 5, 7, 10, 12, 20, 21, 39};
    digest_t req[77]; /* in a mixed order: slot i * 10 % 77 gets the i-th */
    for (size_t i = 0; i < 77; i++) {
        uint8_t *slot = req[i * 10 % 77];
        if (i < 27)
            memcpy(slot, d[present[i % 9]], KW_CACHE_DIGEST_LEN);
        else
            tc_digest(100 + i, slot);
    }
    array_plan a = {.req = (const digest_t *)req, .nreq = 77,
                    .guarded = (const digest_t *)&d[10], .nguarded = 5};
    cr_assert_eq(kw_cache_foreach(c, array_plan_entry, &a), 0);
    cr_assert_eq(a.p.present, 9, "the reference itself");
    counting_reader r = {.d = (const digest_t *)req};
    kw_cache_plan p, q;
    cr_assert_eq(kw_cache_plan_each(c, 77, next_counted, &r, &p), 0);
    cr_assert_eq(r.calls, 77, "next is called once a digest");
    cr_assert_eq(p.present, a.p.present);
    cr_assert_eq(p.present_bytes, a.p.present_bytes);
    cr_assert_eq(p.held_bytes, a.p.held_bytes);
    cr_assert_eq(p.max_size, MIB);
    cr_assert_eq(p.available, MIB - p.present_bytes - p.held_bytes);
    cr_assert_eq(kw_cache_plan_get(c, (const digest_t *)req, 77, &q), 0);
    cr_assert(memcmp(&p, &q, sizeof p) == 0, "plan_get is plan_each");
    cr_assert_eq(kw_cache_plan_each(c, 1, NULL, NULL, &p), KW_EINVAL);
    cr_assert_eq(kw_cache_plan_each(c, 0, NULL, NULL, &p), 0);
    cr_assert_eq(p.held_bytes, a.p.held_bytes + a.p.present_bytes -
                                   (1000 + 37 * 20) - (1000 + 37 * 21) -
                                   (1000 + 37 * 39),
                 "an empty set: every held entry, the request's too");
    kw_cache_unprotect(g);
    kw_cache_close(c);
}

/* Puts an entry under an explicit digest. */
static void put_digest(kw_cache *c, const uint8_t *d, uint64_t i)
{
    uint8_t *b = tc_blob(i, 100);
    cr_assert_eq(kw_cache_put(c, d, NULL, b, 100, false, NULL), 0);
    free(b);
}

static void hex_of(const uint8_t *d, char *out)
{
    for (int i = 0; i < KW_CACHE_DIGEST_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

Test(cache_pins, prefixes_resolve_like_git)
{
    kw_cache *c = tc_open(dir, MIB, false);
    uint8_t d1[KW_CACHE_DIGEST_LEN], d2[KW_CACHE_DIGEST_LEN], out[32];
    memset(d1, 0xab, sizeof d1);
    memset(d2, 0xab, sizeof d2);
    d2[5] = 0xcd; /* d1 and d2 share their first 10 hex digits */
    put_digest(c, d1, 1);
    put_digest(c, d2, 2);
    tc_put(c, 3, 100, false);
    char h1[65], h2[65], h3[65], cand[200], p[80];
    hex_of(d1, h1);
    hex_of(d2, h2);
    uint8_t d3[KW_CACHE_DIGEST_LEN];
    tc_digest(3, d3);
    hex_of(d3, h3);
    memcpy(p, h3, 8);
    p[8] = '\0';
    cr_assert_eq(kw_cache_find_prefix(c, p, out, NULL, 0), 0, "8 digits");
    cr_assert(memcmp(out, d3, 32) == 0);
    p[7] = '\0';
    cr_assert_eq(kw_cache_find_prefix(c, p, out, NULL, 0), KW_EINVAL, "7");
    cr_assert_eq(kw_cache_find_prefix(c, h3, out, NULL, 0), 0, "all 64");
    snprintf(p, sizeof p, "%s0", h3);
    cr_assert_eq(kw_cache_find_prefix(c, p, out, NULL, 0), KW_EINVAL, "65");
    cr_assert_eq(kw_cache_find_prefix(c, "abababaG", out, NULL, 0), KW_EINVAL);
    cr_assert_eq(kw_cache_find_prefix(c, "ABABABABAB", out, cand,
                                      sizeof cand), KW_EAMBIGUOUS);
    char want[140];
    snprintf(want, sizeof want, "%s\n%s", h1, h2);
    cr_assert_str_eq(cand, want);
    cr_assert_eq(kw_cache_find_prefix(c, "ababababab", out, cand, 100),
                 KW_EAMBIGUOUS);
    cr_assert_str_eq(cand, h1, "as many as fit");
    cr_assert_eq(kw_cache_find_prefix(c, "abababababc", out, NULL, 0), 0,
                 "an odd number of digits");
    cr_assert(memcmp(out, d2, 32) == 0);
    cr_assert_eq(kw_cache_find_prefix(c, "abababababa", out, NULL, 0), 0);
    cr_assert(memcmp(out, d1, 32) == 0);
    cr_assert_eq(kw_cache_find_prefix(c, "abababababf", out, NULL, 0),
                 KW_ENOTFOUND);
    kw_cache_close(c);
}
