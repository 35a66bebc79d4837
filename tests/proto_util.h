/* proto_util.h: helpers shared by the protocol suites (test_proto.c,
 * test_proto_fuzz.c): frame building and parse shorthands. */
#ifndef KW_TEST_PROTO_UTIL_H
#define KW_TEST_PROTO_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kw_err.h"
#include "kw_proto.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))
static const uint16_t all_types[] __attribute__((unused)) = {
    KW_PROTO_PING,   KW_PROTO_KEYS,   KW_PROTO_WARMUP,   KW_PROTO_GET,
    KW_PROTO_STATS,  KW_PROTO_EVICT,  KW_PROTO_MISSES,   KW_PROTO_LS,
    KW_PROTO_PINS,   KW_PROTO_UNPIN,  KW_PROTO_RESIZE,   KW_PROTO_PONG,
    KW_PROTO_RESULT, KW_PROTO_PROGRESS, KW_PROTO_ERROR,
};

/* A malloc'd copy of exactly n bytes (one byte allocated for n = 0). */
static inline uint8_t *exact(const void *p, size_t n)
{
    uint8_t *b = malloc(n > 0 ? n : 1);
    cr_assert_not_null(b);
    if (n > 0)
        memcpy(b, p, n);
    return b;
}

/* Writes a fixed header with arbitrary (unchecked) fields. */
static inline void put_head(uint8_t h[16], uint32_t magic, uint16_t version,
                     uint16_t type, uint32_t hl, uint32_t pl)
{
    uint32_t v[4] = {magic, (uint32_t)version | (uint32_t)type << 16, hl, pl};
    for (int i = 0; i < 16; i++)
        h[i] = (uint8_t)(v[i / 4] >> (8 * (i % 4)));
}

/* Parses the len bytes at p (copied exactly) and returns the code.  On any
 * return but KW_PROTO_OK, checks that *out and *used were not touched. */
static inline int parse_rc(const void *p, size_t len)
{
    uint8_t *b = exact(p, len);
    kw_msg m, sentinel;
    memset(&m, 0xA5, sizeof m);
    memcpy(&sentinel, &m, sizeof m);
    size_t used = 12345;
    int rc = kw_proto_parse(b, len, &m, &used);
    if (rc == KW_PROTO_OK) {
        cr_assert_leq(used, len);
        kw_msg_destroy(&m);
    } else {
        cr_assert_eq(used, 12345, "used touched on rc %d", rc);
        cr_assert_arr_eq(&m, &sentinel, sizeof m, "out touched on rc %d", rc);
    }
    free(b);
    return rc;
}

/* The code for a GET frame whose JSON header is the n bytes of json. */
static inline int json_rc_n(const char *json, size_t n)
{
    uint8_t *f = malloc(16 + n);
    cr_assert_not_null(f);
    put_head(f, KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET, (uint32_t)n,
             0);
    memcpy(f + 16, json, n);
    int rc = parse_rc(f, 16 + n);
    free(f);
    return rc;
}

static inline int json_rc(const char *json)
{
    return json_rc_n(json, strlen(json));
}

static inline void reject_all(const char *const *jsons, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(json_rc(jsons[i]), KW_EPROTO, "accepted: %s", jsons[i]);
}

/* The code for a 16-byte fixed header alone (and for its first k bytes
 * when k < 16, via parse_rc on a shorter copy). */
static inline int head_rc(uint32_t magic, uint16_t version, uint16_t type,
                   uint32_t hl, uint32_t pl, size_t k)
{
    uint8_t h[16];
    put_head(h, magic, version, type, hl, pl);
    return parse_rc(h, k);
}

/* A header object exercising nesting, arrays, numbers and UTF-8. */
static inline cJSON *sample_header(uint16_t type)
{
    cJSON *h = cJSON_Parse("{\"family\": \"mla_decode\", \"arch\": \"sm_90\","
                           " \"fields\": {\"h\": 128, \"d\": [1, 2.5, -3e2],"
                           " \"ok\": true, \"none\": null},"
                           " \"note\": \"caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x94"
                           "\xa5\"}");
    cr_assert_not_null(h);
    cJSON_AddStringToObject(h, "type", kw_proto_type_name(type));
    return h;
}

/* Encodes a frame that must encode; free() the result. */
static inline uint8_t *enc(uint16_t type, const cJSON *h, const void *pl, size_t n,
                    size_t *len)
{
    uint8_t *f = NULL;
    cr_assert_eq(kw_proto_encode(type, h, pl, n, &f, len), 0);
    return f;
}

/* A header of depth levels: the root object holding nested arrays. */
static inline char *nested(unsigned depth)
{
    char *s = malloc(2 * depth + 16);
    size_t o = 0;
    o += (size_t)sprintf(s, "{\"a\":");
    for (unsigned i = 1; i < depth; i++)
        s[o++] = '[';
    for (unsigned i = 1; i < depth; i++)
        s[o++] = ']';
    s[o++] = '}';
    s[o] = '\0';
    return s;
}

#endif /* KW_TEST_PROTO_UTIL_H */
