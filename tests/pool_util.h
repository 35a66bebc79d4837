/* pool_util.h: what the suites of warm/'s pool share (test_pool.c,
 * test_pool_frame.c): a clock and synthetic keys for the instant mode. */
#ifndef KW_TEST_POOL_UTIL_H
#define KW_TEST_POOL_UTIL_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kw_keys.h"

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A synthetic key for the instant mode: family f, digest from n.  Its
 * fields are zero: only compiles in the instant mode may use it. */
static inline kw_keys_key fake_key(kw_k_family f, uint32_t n)
{
    kw_keys_key k;
    memset(&k, 0, sizeof k);
    k.family = f;
    memcpy(k.arch, "sm_90", 6);
    for (size_t i = 0; i < KW_KEYS_DIGEST_LEN; i++)
        k.digest[i] = (uint8_t)(n >> (8 * (i % 4))) ^ (uint8_t)i;
    return k;
}

#endif /* KW_TEST_POOL_UTIL_H */
