/* test_cache_util.h: deterministic digests, blobs and metadata, and
 * open/put/verify shorthands for the cache suites (test_cache.c,
 * test_cache_proc.c). */
#ifndef KW_TEST_CACHE_UTIL_H
#define KW_TEST_CACHE_UTIL_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"

/* splitmix64: a well-mixed sequence from any seed. */
static inline uint64_t tc_mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The digest of test entry i (random-looking, as BLAKE2b output is). */
static inline void tc_digest(uint64_t i, uint8_t d[KW_CACHE_DIGEST_LEN])
{
    uint64_t s = i * 7919 + 1;
    for (int w = 0; w < KW_CACHE_DIGEST_LEN / 8; w++) {
        uint64_t v = tc_mix(&s);
        memcpy(d + 8 * w, &v, 8);
    }
}

/* A new len-byte blob for entry i (free it); bytes differ per i. */
static inline uint8_t *tc_blob(uint64_t i, size_t len)
{
    uint8_t *b = malloc(len);
    cr_assert_not_null(b);
    uint64_t s = i ^ 0xb10bull;
    for (size_t off = 0; off < len; off += 8) {
        uint64_t v = tc_mix(&s);
        memcpy(b + off, &v, len - off < 8 ? len - off : 8);
    }
    return b;
}

/* Metadata for entry i, every field set. */
static inline kw_cache_info tc_info(uint64_t i)
{
    kw_cache_info in;
    memset(&in, 0, sizeof in);
    snprintf(in.family, sizeof in.family, "fam%llu", (unsigned long long)i);
    in.nfields = (uint32_t)(i % (KW_CACHE_MAX_FIELDS + 1));
    for (uint32_t f = 0; f < in.nfields; f++)
        in.fields[f] = (int64_t)(i * 100 + f) - 50;
    snprintf(in.arch, sizeof in.arch, "sm_%u", 80 + (unsigned)(i % 20));
    snprintf(in.entry, sizeof in.entry, "_Z8kernel%lluv", (unsigned long long)i);
    snprintf(in.nvrtc, sizeof in.nvrtc, "13.%u", (unsigned)(i % 3));
    in.compile_seconds = 0.25 * (double)(i + 1);
    return in;
}

/* Opens dir with max_size max (0: default), asserting success. */
static inline kw_cache *tc_open(const char *dir, uint64_t max, bool ro)
{
    kw_cache_opts o = {.dir = dir, .max_size = max, .read_only = ro};
    kw_cache *c = NULL;
    char err[512];
    int rc = kw_cache_open(&c, &o, err, sizeof err);
    cr_assert_eq(rc, 0, "open %s: %s (%s)", dir, kw_err_name(rc), err);
    return c;
}

/* Puts entry i (blob of len bytes), asserting rc 0; returns *stored. */
static inline bool tc_put(kw_cache *c, uint64_t i, size_t len, bool pin)
{
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(i, d);
    uint8_t *b = tc_blob(i, len);
    kw_cache_info in = tc_info(i);
    bool stored = false;
    int rc = kw_cache_put(c, d, &in, b, len, pin, &stored);
    free(b);
    cr_assert_eq(rc, 0, "put %llu: %s: %s", (unsigned long long)i,
                 kw_err_name(rc), kw_cache_last_error(c));
    return stored;
}

/* Gets entry i and checks its bytes are those of tc_blob(i, len) and its
 * metadata that of tc_info(i).  Returns the get's code (0 checked). */
static inline int tc_get_check(kw_cache *c, uint64_t i, size_t len)
{
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(i, d);
    void *got = NULL;
    size_t n = 0;
    kw_cache_info info;
    int rc = kw_cache_get(c, d, &got, &n, &info);
    if (rc != 0) {
        cr_assert_null(got);
        return rc;
    }
    uint8_t *want = tc_blob(i, len);
    kw_cache_info wi = tc_info(i);
    cr_assert_eq(n, len, "entry %llu: %zu bytes, want %zu",
                 (unsigned long long)i, n, len);
    cr_assert(memcmp(got, want, len) == 0, "entry %llu: bytes differ",
              (unsigned long long)i);
    cr_assert_str_eq(info.family, wi.family);
    cr_assert_str_eq(info.entry, wi.entry);
    cr_assert_eq(info.size, len);
    free(want);
    free(got);
    return 0;
}

/* True when entry i is present. */
static inline bool tc_has(kw_cache *c, uint64_t i)
{
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(i, d);
    return kw_cache_contains(c, d);
}

static inline kw_cache_stats tc_stats(kw_cache *c)
{
    kw_cache_stats s;
    int rc = kw_cache_stats_get(c, &s);
    cr_assert_eq(rc, 0, "stats: %s", kw_err_name(rc));
    return s;
}

#endif /* KW_TEST_CACHE_UTIL_H */
