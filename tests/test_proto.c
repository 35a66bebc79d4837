/* test_proto.c: the wire format (client/kw_proto.h): round trips, partial
 * input, one negative test per parser rule, and a seeded fuzz loop.
 *
 * Every buffer handed to the parser is a malloc'd copy of exactly the bytes
 * under test, so AddressSanitizer catches a read one byte too far. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"
#include "kw_proto.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

static const uint16_t all_types[] = {
    KW_PROTO_PING,   KW_PROTO_KEYS,   KW_PROTO_WARMUP,   KW_PROTO_GET,
    KW_PROTO_STATS,  KW_PROTO_EVICT,  KW_PROTO_PONG,     KW_PROTO_RESULT,
    KW_PROTO_PROGRESS, KW_PROTO_ERROR,
};

/* A malloc'd copy of exactly n bytes (one byte allocated for n = 0). */
static uint8_t *exact(const void *p, size_t n)
{
    uint8_t *b = malloc(n > 0 ? n : 1);
    cr_assert_not_null(b);
    if (n > 0)
        memcpy(b, p, n);
    return b;
}

/* Writes a fixed header with arbitrary (unchecked) fields. */
static void put_head(uint8_t h[16], uint32_t magic, uint16_t version,
                     uint16_t type, uint32_t hl, uint32_t pl)
{
    uint32_t v[4] = {magic, (uint32_t)version | (uint32_t)type << 16, hl, pl};
    for (int i = 0; i < 16; i++)
        h[i] = (uint8_t)(v[i / 4] >> (8 * (i % 4)));
}

/* Parses the len bytes at p (copied exactly) and returns the code.  On any
 * return but KW_PROTO_OK, checks that *out and *used were not touched. */
static int parse_rc(const void *p, size_t len)
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
static int json_rc_n(const char *json, size_t n)
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

static int json_rc(const char *json)
{
    return json_rc_n(json, strlen(json));
}

static void reject_all(const char *const *jsons, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(json_rc(jsons[i]), KW_EPROTO, "accepted: %s", jsons[i]);
}

/* The code for a 16-byte fixed header alone (and for its first k bytes
 * when k < 16, via parse_rc on a shorter copy). */
static int head_rc(uint32_t magic, uint16_t version, uint16_t type,
                   uint32_t hl, uint32_t pl, size_t k)
{
    uint8_t h[16];
    put_head(h, magic, version, type, hl, pl);
    return parse_rc(h, k);
}

/* A header object exercising nesting, arrays, numbers and UTF-8. */
static cJSON *sample_header(uint16_t type)
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
static uint8_t *enc(uint16_t type, const cJSON *h, const void *pl, size_t n,
                    size_t *len)
{
    uint8_t *f = NULL;
    cr_assert_eq(kw_proto_encode(type, h, pl, n, &f, len), 0);
    return f;
}

/* ---- round trips -------------------------------------------------------- */

/* Encodes (type, header, payload), parses it back and compares. */
static void round_trip(uint16_t type, const cJSON *h, const uint8_t *pl,
                       size_t pl_len)
{
    size_t len = 0;
    uint8_t *f = enc(type, h, pl, pl_len, &len);
    uint8_t *b = exact(f, len);
    free(f);
    kw_msg m;
    size_t used = 0;
    cr_assert_eq(kw_proto_parse(b, len, &m, &used), KW_PROTO_OK);
    cr_assert_eq(used, len);
    cr_assert_eq(m.type, type);
    cr_assert(cJSON_IsObject(m.header));
    if (h != NULL)
        cr_assert(cJSON_Compare(m.header, h, 1));
    else
        cr_assert_null(m.header->child);
    cr_assert_eq(m.payload_len, pl_len);
    if (pl_len > 0) {
        cr_assert(m.payload >= b && m.payload + pl_len == b + len,
                  "payload must point into the buffer");
        cr_assert_arr_eq(m.payload, pl, pl_len);
    } else {
        cr_assert_null(m.payload);
    }
    kw_msg_destroy(&m);
    free(b);
}

Test(proto, round_trips_every_type)
{
    uint8_t cubin[1000];
    for (size_t i = 0; i < sizeof cubin; i++)
        cubin[i] = (uint8_t)(i * 7 + 3);
    for (size_t i = 0; i < N(all_types); i++) {
        cJSON *h = sample_header(all_types[i]);
        round_trip(all_types[i], h, NULL, 0);
        round_trip(all_types[i], NULL, NULL, 0);
        if (all_types[i] == KW_PROTO_RESULT)
            round_trip(all_types[i], h, cubin, sizeof cubin);
        cJSON_Delete(h);
    }
}

Test(proto, round_trips_an_empty_header_as_zero_bytes)
{
    size_t len;
    uint8_t *f = enc(KW_PROTO_PING, NULL, NULL, 0, &len);
    cr_assert_eq(len, KW_PROTO_HEAD_LEN);
    cr_assert_eq(parse_rc(f, len), KW_PROTO_OK);
    free(f);
    /* An explicit "{}" with surrounding whitespace is the same message. */
    cr_assert_eq(json_rc(" \t\r\n{ }\n"), KW_PROTO_OK);
}

Test(proto, accepts_lengths_exactly_at_their_caps)
{
    size_t n = KW_PROTO_MAX_HEADER;
    char *json = malloc(n + 1);
    cr_assert_not_null(json);
    memset(json, 'x', n);
    memcpy(json, "{\"s\":\"", 6);
    memcpy(json + n - 2, "\"}", 2);
    json[n] = '\0';
    cr_assert_eq(json_rc(json), KW_PROTO_OK);
    free(json);

    uint8_t *big = calloc(1, KW_PROTO_MAX_PAYLOAD);
    cr_assert_not_null(big);
    big[KW_PROTO_MAX_PAYLOAD - 1] = 0x7F;
    round_trip(KW_PROTO_RESULT, NULL, big, KW_PROTO_MAX_PAYLOAD);
    free(big);
}

Test(proto, parses_back_to_back_frames_one_at_a_time)
{
    static const uint16_t type[] = {KW_PROTO_PROGRESS, KW_PROTO_RESULT,
                                    KW_PROTO_PONG};
    uint8_t cubin[] = {0x7F, 'E', 'L', 'F', 0, 1, 2}, all[1024];
    cJSON *h = sample_header(KW_PROTO_RESULT);
    size_t n[3], total = 0;
    for (int i = 0; i < 3; i++) {
        bool res = type[i] == KW_PROTO_RESULT;
        uint8_t *f = enc(type[i], h, res ? cubin : NULL,
                         res ? sizeof cubin : 0, &n[i]);
        cr_assert_leq(total + n[i], sizeof all);
        memcpy(all + total, f, n[i]);
        total += n[i];
        free(f);
    }
    uint8_t *b = exact(all, total);
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        kw_msg m;
        size_t used = 0;
        cr_assert_eq(kw_proto_parse(b + off, total - off, &m, &used), 0);
        cr_assert_eq(used, n[i]);
        cr_assert_eq(m.type, type[i]);
        kw_msg_destroy(&m);
        off += used;
    }
    cr_assert_eq(parse_rc(b + off, 0), KW_PROTO_MORE);
    free(b);
    cJSON_Delete(h);
}

Test(proto, returns_more_for_every_proper_prefix)
{
    uint8_t cubin[64];
    memset(cubin, 0xCC, sizeof cubin);
    cJSON *h = sample_header(KW_PROTO_RESULT);
    size_t len;
    uint8_t *f = enc(KW_PROTO_RESULT, h, cubin, sizeof cubin, &len);
    /* Each prefix is its own exact allocation: no peeking past it. */
    for (size_t k = 0; k < len; k++)
        cr_assert_eq(parse_rc(f, k), KW_PROTO_MORE, "prefix %zu of %zu", k,
                     len);
    cr_assert_eq(parse_rc(f, len), KW_PROTO_OK);
    free(f);
    cJSON_Delete(h);
}

Test(proto, waits_for_a_declared_header_without_judging_it)
{
    /* 60 KiB declared, none of it sent: wait, do not fail or allocate. */
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_GET, 60 * 1024, 0, 16),
                 KW_PROTO_MORE);
    size_t n = 60 * 1024;
    uint8_t *f = calloc(1, 16 + n);
    put_head(f, KW_PROTO_MAGIC, 1, KW_PROTO_GET, (uint32_t)n, 0);
    memset(f + 16, '[', n);
    cr_assert_eq(parse_rc(f, 16 + n - 1), KW_PROTO_MORE);
    cr_assert_eq(parse_rc(f, 16 + n), KW_EPROTO);
    free(f);
}

Test(proto, peek_reports_the_fixed_header)
{
    uint8_t h[16];
    put_head(h, KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 77, 99);
    uint16_t t = 0;
    uint32_t hl = 0, pl = 0;
    cr_assert_eq(kw_proto_peek(h, 15, &t, &hl, &pl), KW_PROTO_MORE);
    cr_assert_eq(t, 0);
    cr_assert_eq(kw_proto_peek(NULL, 0, &t, &hl, &pl), KW_PROTO_MORE);
    cr_assert_eq(kw_proto_peek(h, 16, &t, &hl, &pl), KW_PROTO_OK);
    cr_assert_eq(t, KW_PROTO_RESULT);
    cr_assert_eq(hl, 77);
    cr_assert_eq(pl, 99);
    cr_assert_eq(kw_proto_peek(h, 16, NULL, NULL, NULL), KW_PROTO_OK);
}

/* ---- fixed header: one test per rule ------------------------------------ */

Test(proto, rejects_bad_magic)
{
    static const char *const bad[] = {"KWRX", "kwrm", "MRWK", "GET ",
                                      "\0\0\0\0", "\xff\xff\xff\xff"};
    for (size_t i = 0; i < N(bad); i++) {
        uint8_t h[16];
        put_head(h, 0, 1, KW_PROTO_PING, 0, 0);
        memcpy(h, bad[i], 4);
        cr_expect_eq(parse_rc(h, 16), KW_EPROTO, "magic %zu", i);
        cr_expect_eq(kw_proto_peek(h, 16, NULL, NULL, NULL), KW_EPROTO);
    }
    /* Refused at the first wrong byte, without waiting for 16. */
    cr_assert_eq(parse_rc("G", 1), KW_EPROTO);
    cr_assert_eq(parse_rc("KWX", 3), KW_EPROTO);
    cr_assert_eq(parse_rc("GET / HTTP/1.1\r\n\r\n", 18), KW_EPROTO);
    cr_assert_eq(parse_rc("KW", 2), KW_PROTO_MORE);
}

Test(proto, rejects_bad_version)
{
    static const uint16_t bad[] = {0, 2, 3, 0x0100, 0xFFFF};
    for (size_t i = 0; i < N(bad); i++) {
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, bad[i], KW_PROTO_PING, 0, 0, 16),
                     KW_EPROTO, "version %u", bad[i]);
        /* Judged as soon as its two bytes are in. */
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, bad[i], KW_PROTO_PING, 0, 0, 6),
                     KW_EPROTO, "version %u", bad[i]);
    }
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_PING, 0, 0, 6),
                 KW_PROTO_MORE);
}

Test(proto, rejects_unknown_type)
{
    static const uint16_t named[] = {0, 7, 63, 68, 0xFFFF};
    for (size_t i = 0; i < N(named); i++)
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, named[i], 0, 0, 8),
                     KW_EPROTO, "type %u", named[i]);
    /* Every one of the 65536 values: exactly the ten known types pass. */
    size_t ok = 0;
    for (uint32_t t = 0; t <= 0xFFFF; t++) {
        int rc = head_rc(KW_PROTO_MAGIC, 1, (uint16_t)t, 0, 0, 16);
        bool known = kw_proto_is_request((uint16_t)t) ||
                     kw_proto_is_reply((uint16_t)t);
        cr_assert_eq(rc, known ? KW_PROTO_OK : KW_EPROTO, "type %u", t);
        ok += rc == KW_PROTO_OK;
    }
    cr_assert_eq(ok, N(all_types));
}

Test(proto, rejects_header_len_over_cap_from_the_fixed_header)
{
    static const uint32_t bad[] = {KW_PROTO_MAX_HEADER + 1, 0x80000000u,
                                   0xFFFFFFFFu};
    for (size_t i = 0; i < N(bad); i++) {
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_GET, bad[i], 0, 16),
                     KW_E2BIG);
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_GET, bad[i], 0, 12),
                     KW_E2BIG);
    }
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_GET, KW_PROTO_MAX_HEADER,
                         0, 16), KW_PROTO_MORE);
}

Test(proto, rejects_payload_len_over_cap_from_the_fixed_header)
{
    static const uint32_t bad[] = {KW_PROTO_MAX_PAYLOAD + 1, 0x80000000u,
                                   0xFFFFFFFFu};
    for (size_t i = 0; i < N(bad); i++)
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 0, bad[i],
                             16), KW_E2BIG);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 0,
                         KW_PROTO_MAX_PAYLOAD, 16), KW_PROTO_MORE);
}

Test(proto, rejects_lengths_whose_sum_overflows_32_bits)
{
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 0xFFFFFFFFu,
                         0xFFFFFFFFu, 16), KW_E2BIG);
    /* 16 + 16 + 0xFFFFFFE0 is 0 in 32 bits: a naive sum would say the frame
     * is complete already. */
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 16, 0xFFFFFFE0u,
                         16), KW_E2BIG);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 0xFFFFFFF0u, 0,
                         16), KW_E2BIG);
}

Test(proto, rejects_request_with_payload)
{
    for (uint16_t t = KW_PROTO_PING; t <= KW_PROTO_EVICT; t++) {
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, t, 0, 1, 16), KW_EPROTO,
                     "%s", kw_proto_type_name(t));
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, t, 2, 0xFFFFFFFFu, 16),
                     KW_EPROTO, "%s", kw_proto_type_name(t));
    }
}

Test(proto, rejects_payload_on_replies_other_than_result)
{
    static const uint16_t t[] = {KW_PROTO_PONG, KW_PROTO_PROGRESS,
                                 KW_PROTO_ERROR};
    for (size_t i = 0; i < N(t); i++)
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, 1, t[i], 0, 1, 16), KW_EPROTO);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 0, 1, 16),
                 KW_PROTO_MORE);
}

Test(proto, parse_request_refuses_replies_at_the_type_field)
{
    uint8_t h[16];
    kw_msg m;
    size_t used;
    for (size_t i = 0; i < N(all_types); i++) {
        put_head(h, KW_PROTO_MAGIC, 1, all_types[i], 0, 0);
        bool req = kw_proto_is_request(all_types[i]);
        cr_assert_eq(kw_proto_parse_request(h, 8, &m, &used),
                     req ? KW_PROTO_MORE : KW_EPROTO);
        cr_assert_eq(kw_proto_parse_reply(h, 8, &m, &used),
                     req ? KW_EPROTO : KW_PROTO_MORE);
        int rc = kw_proto_parse_request(h, 16, &m, &used);
        cr_assert_eq(rc, req ? KW_PROTO_OK : KW_EPROTO);
        if (rc == KW_PROTO_OK)
            kw_msg_destroy(&m);
        rc = kw_proto_parse_reply(h, 16, &m, &used);
        cr_assert_eq(rc, req ? KW_EPROTO : KW_PROTO_OK);
        if (rc == KW_PROTO_OK)
            kw_msg_destroy(&m);
    }
}

/* ---- JSON header: one test per rule ------------------------------------- */

Test(proto, rejects_header_that_is_not_json)
{
    static const char *const bad[] = {"hello", "{'a': 1}", "{a: 1}",
                                      "{\"a\": }", "{\"a\" 1}", "{,}",
                                      "{\"a\": tru}", "{\"a\": \"\\q\"}",
                                      "{\"a\": \"\\ud800\"}", " ", "\n"};
    reject_all(bad, N(bad));
}

Test(proto, rejects_header_that_is_not_an_object)
{
    static const char *const bad[] = {"[]", "[{}]", "\"s\"", "1", "-0.5",
                                      "true", "false", "null"};
    reject_all(bad, N(bad));
}

Test(proto, rejects_trailing_data_after_the_object)
{
    static const char *const bad[] = {"{} x", "{}{}", "{}]", "{}}", "{} 1",
                                      "{},", "{} \"\"", "{}\n{\"a\": 1}"};
    reject_all(bad, N(bad));
    cr_assert_eq(json_rc("{}\n\t \r\n"), KW_PROTO_OK);
}

Test(proto, rejects_nul_inside_the_header)
{
    cr_assert_eq(json_rc_n("{\"a\": \"b\0c\"}", 12), KW_EPROTO);
    cr_assert_eq(json_rc_n("{}\0", 3), KW_EPROTO);
    cr_assert_eq(json_rc_n("\0{}", 3), KW_EPROTO);
    cr_assert_eq(json_rc_n("{\"a\"\0: 1}", 9), KW_EPROTO);
    /* The escaped form would silently cut the string in cJSON. */
    cr_assert_eq(json_rc("{\"a\": \"b\\u0000c\"}"), KW_EPROTO);
    cr_assert_eq(json_rc("{\"a\": \"b\\u0001c\"}"), KW_PROTO_OK);
}

Test(proto, rejects_truncated_json)
{
    static const char *const bad[] = {"{", "{\"", "{\"a", "{\"a\"",
                                      "{\"a\":", "{\"a\": [1, 2",
                                      "{\"a\": \"xyz", "{\"a\": {\"b\": {}}",
                                      "{\"a\": \"\\", "{\"a\": \"\\u00"};
    reject_all(bad, N(bad));
}

Test(proto, rejects_invalid_utf8)
{
    static const char *const bad[] = {
        "{\"a\": \"\x80\"}",             /* lone continuation */
        "{\"a\": \"\xc0\xaf\"}",         /* overlong '/' */
        "{\"a\": \"\xe0\x80\xaf\"}",     /* overlong, 3 bytes */
        "{\"a\": \"\xed\xa0\x80\"}",     /* UTF-16 surrogate */
        "{\"a\": \"\xf4\x90\x80\x80\"}", /* above U+10FFFF */
        "{\"a\": \"\xf5\x80\x80\x80\"}", "{\"a\": \"\xff\"}",
        "{\"a\": \"\xe2\x82\"}",         /* truncated sequence */
        "{\"\xc3\": 1}",                 /* in a member name */
        "{\"a\": 1}\xc3\xa9",            /* outside any string */
    };
    reject_all(bad, N(bad));
    cr_assert_eq(json_rc("{\"caf\xc3\xa9\": \"\xf0\x9f\x94\xa5\"}"),
                 KW_PROTO_OK);
}

Test(proto, rejects_byte_order_mark)
{
    cr_assert_eq(json_rc("\xef\xbb\xbf{}"), KW_EPROTO);
}

Test(proto, rejects_raw_control_characters)
{
    static const char *const bad[] = {
        "{\"a\": \"x\ty\"}", "{\"a\": \"\x01\"}", "{\"a\": \"\x1f\"}",
        "{\"a\": \"\\\x01\"}", /* escaped, still raw */
        /* cJSON would skip these as whitespace */
        "{\x01}", "\x0b{}", "{}\x0c", "{\"a\":\x7f 1}"};
    reject_all(bad, N(bad));
}

Test(proto, rejects_numbers_outside_rfc_8259)
{
    static const char *const bad[] = {
        "{\"a\": 01}",  "{\"a\": -01}", "{\"a\": 1.}",  "{\"a\": .5}",
        "{\"a\": +1}",  "{\"a\": -}",   "{\"a\": 1e}",  "{\"a\": 1e+}",
        "{\"a\": 0x10}", "{\"a\": NaN}", "{\"a\": Infinity}",
        "{\"a\": 1.2.3}", "{\"a\": --1}", "{\"a\": [1 2]}"};
    reject_all(bad, N(bad));
    cr_assert_eq(json_rc("{\"a\": [0, -0, -0.5e+10, 1E-3, 12, 1e400]}"),
                 KW_PROTO_OK);
}

Test(proto, rejects_duplicate_member_names)
{
    static const char *const bad[] = {
        "{\"a\": 1, \"a\": 2}", "{\"a\": 1, \"b\": 2, \"a\": 1}",
        "{\"x\": {\"b\": [], \"b\": []}}", "{\"x\": [{\"k\": 1, \"k\": 1}]}",
        "{\"\": 1, \"\": 2}"};
    reject_all(bad, N(bad));
    cr_assert_eq(json_rc("{\"a\": {\"a\": {\"a\": 1}}, \"b\": [{\"a\": 1}, "
                         "{\"a\": 2}]}"), KW_PROTO_OK);
    /* Many members, the duplicate last: found by sorting, not O(n^2). */
    char *json = malloc(KW_PROTO_MAX_HEADER);
    size_t o = 0;
    json[o++] = '{';
    for (int i = 0; i < 5000; i++)
        o += (size_t)sprintf(json + o, "\"k%d\":0,", i);
    o += (size_t)sprintf(json + o, "\"k17\":0}");
    cr_assert_lt(o, KW_PROTO_MAX_HEADER);
    cr_assert_eq(json_rc(json), KW_EPROTO);
    free(json);
}

/* A header of depth levels: the root object holding nested arrays. */
static char *nested(unsigned depth)
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

Test(proto, rejects_nesting_deeper_than_max_depth)
{
    char *ok = nested(KW_PROTO_MAX_DEPTH);
    cr_assert_eq(json_rc(ok), KW_PROTO_OK);
    free(ok);
    char *deep = nested(KW_PROTO_MAX_DEPTH + 1);
    cr_assert_eq(json_rc(deep), KW_EPROTO);
    free(deep);
    /* Far past cJSON's own limit of 1000: still a clean refusal. */
    char *deeper = nested(20000);
    cr_assert_eq(json_rc(deeper), KW_EPROTO);
    free(deeper);
    /* Brackets inside strings are not nesting. */
    cr_assert_eq(json_rc("{\"a\": \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}"),
                 KW_PROTO_OK);
}

/* ---- fuzz --------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

/* The fixed-header rules restated independently of proto.c. */
static int head_oracle(const uint8_t h[16])
{
    uint16_t ver = (uint16_t)(h[4] | h[5] << 8),
             type = (uint16_t)(h[6] | h[7] << 8);
    uint32_t hl = le32(h + 8), pl = le32(h + 12);
    if (le32(h) != 0x4D52574Bu || ver != 1)
        return KW_EPROTO;
    if (!((type >= 1 && type <= 6) || (type >= 64 && type <= 67)))
        return KW_EPROTO;
    if (hl > 64u * 1024u)
        return KW_E2BIG;
    if (pl > 0 && type != 65)
        return KW_EPROTO;
    if (pl > 64u * 1024u * 1024u)
        return KW_E2BIG;
    return KW_PROTO_OK;
}

/* Parses buf (len bytes); when it says OK, the message must be valid: the
 * fixed header passes the oracle and re-encoding gives the same message. */
static int parse_checked(const uint8_t *buf, size_t len)
{
    uint8_t *b = exact(buf, len);
    kw_msg m;
    size_t used = 0;
    int rc = kw_proto_parse(b, len, &m, &used);
    cr_assert(rc == KW_PROTO_OK || rc == KW_PROTO_MORE || rc == KW_EPROTO ||
              rc == KW_E2BIG, "rc %d", rc);
    if (rc == KW_PROTO_OK) {
        cr_assert_eq(head_oracle(b), KW_PROTO_OK);
        cr_assert(cJSON_IsObject(m.header));
        size_t n;
        uint8_t *f = enc(m.type, m.header, m.payload, m.payload_len, &n);
        kw_msg m2;
        size_t used2;
        cr_assert_eq(kw_proto_parse(f, n, &m2, &used2), KW_PROTO_OK);
        cr_assert(cJSON_Compare(m.header, m2.header, 1));
        kw_msg_destroy(&m2);
        free(f);
        kw_msg_destroy(&m);
    }
    free(b);
    return rc;
}

/* Fills h with random bytes; most get a valid magic and version (and some
 * a known type, small lengths) so that the later rules are reached. */
static void random_head(uint8_t h[16], uint64_t *s, int i)
{
    for (int j = 0; j < 16; j += 8) {
        uint64_t r = rng_next(s);
        memcpy(h + j, &r, 8);
    }
    if (i % 4 == 0)
        return;
    uint16_t type = i % 3 ? (uint16_t)(h[6] | h[7] << 8)
                          : (uint16_t)((h[6] & 0x47) % 68);
    uint32_t hl = h[8] & 1 ? h[9] : le32(h + 8);
    uint32_t pl = h[12] & 1 ? 0 : h[12] & 2 ? h[13] : le32(h + 12);
    put_head(h, KW_PROTO_MAGIC, 1, type, hl, pl);
}

Test(proto, survives_random_fixed_headers)
{
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 200000; i++) {
        uint8_t h[16];
        random_head(h, &s, i);
        int want = head_oracle(h);
        int rc = parse_checked(h, 16);
        if (want < 0)
            cr_assert_eq(rc, want, "frame %d", i);
        else
            cr_assert(rc == KW_PROTO_OK || rc == KW_PROTO_MORE, "frame %d", i);
        if (rc == KW_PROTO_OK)
            cr_assert_eq(le32(h + 8) + le32(h + 12), 0);
    }
}

Test(proto, survives_random_frames_with_bodies)
{
    uint64_t s = 42;
    static const char alphabet[] =
        "{}[]:,\"\\0123456789-+.eEtrufalsn \n\x01\xc3\xa9\x80";
    uint8_t buf[16 + 256 + 64];
    for (int i = 0; i < 50000; i++) {
        random_head(buf, &s, i);
        size_t body = rng_next(&s) % (sizeof buf - 16);
        for (size_t j = 0; j < body; j++) {
            uint64_t r = rng_next(&s);
            buf[16 + j] = i % 2 ? (uint8_t)r
                                : (uint8_t)alphabet[r % (sizeof alphabet - 1)];
        }
        /* Give some frames lengths that fit the body exactly. */
        if (i % 5 == 0) {
            uint16_t type = (uint16_t)(buf[6] | buf[7] << 8);
            uint32_t hl = (uint32_t)(rng_next(&s) % (body + 1));
            put_head(buf, KW_PROTO_MAGIC, 1, type, hl,
                     type == KW_PROTO_RESULT ? (uint32_t)(body - hl) : 0);
        }
        int want = head_oracle(buf);
        int rc = parse_checked(buf, 16 + body);
        if (want < 0)
            cr_assert_eq(rc, want, "frame %d", i);
    }
}

Test(proto, survives_mutations_of_a_valid_frame)
{
    cJSON *h = sample_header(KW_PROTO_RESULT);
    uint8_t cubin[32] = {0x7F, 'E', 'L', 'F'};
    size_t len;
    uint8_t *f = enc(KW_PROTO_RESULT, h, cubin, sizeof cubin, &len);
    uint64_t s = 7;
    size_t accepted = 0;
    for (int i = 0; i < 50000; i++) {
        uint8_t *m = exact(f, len);
        int flips = 1 + (int)(rng_next(&s) % 3);
        for (int k = 0; k < flips; k++) {
            /* Mostly inside the JSON, sometimes anywhere. */
            size_t at = i % 4 ? 16 + rng_next(&s) % (len - 16 - sizeof cubin)
                              : rng_next(&s) % len;
            m[at] = (uint8_t)rng_next(&s);
        }
        size_t cut = i % 7 ? len : rng_next(&s) % (len + 1);
        accepted += parse_checked(m, cut) == KW_PROTO_OK;
        free(m);
    }
    /* Some mutations land in string contents and stay valid. */
    cr_assert_gt(accepted, 0);
    free(f);
    cJSON_Delete(h);
}

/* ---- encoding ----------------------------------------------------------- */

/* kw_proto_encode()'s code; checks that a failure leaves *out, *len be. */
static int enc_rc(uint16_t type, const cJSON *h, const void *pl, size_t n)
{
    uint8_t *f = (uint8_t *)"untouched";
    size_t len = 99;
    int rc = kw_proto_encode(type, h, pl, n, &f, &len);
    if (rc == 0) {
        free(f);
        return 0;
    }
    cr_assert_str_eq((const char *)f, "untouched");
    cr_assert_eq(len, 99);
    return rc;
}

/* The code for encoding a GET whose header cJSON's lenient parser built
 * from json. */
static int enc_json_rc(const char *json)
{
    cJSON *h = cJSON_Parse(json);
    cr_assert_not_null(h, "%s", json);
    int rc = enc_rc(KW_PROTO_GET, h, NULL, 0);
    cJSON_Delete(h);
    return rc;
}

Test(proto, encode_refuses_what_parse_would_refuse)
{
    uint8_t one = 1;
    cJSON *h = cJSON_CreateObject();
    cr_assert_eq(enc_rc(KW_PROTO_GET, h, &one, 1), KW_EINVAL);
    cr_assert_eq(enc_rc(KW_PROTO_PONG, h, &one, 1), KW_EINVAL);
    cr_assert_eq(enc_rc(0, h, NULL, 0), KW_EINVAL);
    cr_assert_eq(enc_rc(68, h, NULL, 0), KW_EINVAL);
    cr_assert_eq(enc_rc(KW_PROTO_RESULT, h, NULL, 1), KW_EINVAL);
    uint8_t *f;
    size_t len;
    cr_assert_eq(kw_proto_encode_prefix(KW_PROTO_RESULT, h,
                                        (size_t)KW_PROTO_MAX_PAYLOAD + 1, &f,
                                        &len), KW_E2BIG);
    cr_assert_eq(enc_json_rc("[]"), KW_EINVAL);
    cr_assert_eq(enc_json_rc("{\"a\": 1, \"a\": 2}"), KW_EINVAL);
    cr_assert_eq(enc_json_rc("{\"a\": \"\xff\"}"), KW_EINVAL);
    char *deep = nested(KW_PROTO_MAX_DEPTH + 1);
    cr_assert_eq(enc_json_rc(deep), KW_EINVAL);
    free(deep);
    cJSON_AddRawToObject(h, "a", "01"); /* printed verbatim: refused */
    cr_assert_eq(enc_rc(KW_PROTO_GET, h, NULL, 0), KW_EINVAL);
    cJSON_Delete(h);
    h = cJSON_CreateObject();
    char *s = calloc(1, KW_PROTO_MAX_HEADER);
    memset(s, 'x', KW_PROTO_MAX_HEADER - 1);
    cJSON_AddStringToObject(h, "s", s);
    cr_assert_eq(enc_rc(KW_PROTO_GET, h, NULL, 0), KW_E2BIG);
    free(s);
    cJSON_Delete(h);
}

Test(proto, encode_prefix_plus_payload_is_the_whole_frame)
{
    cJSON *h = sample_header(KW_PROTO_RESULT);
    uint8_t cubin[300];
    for (size_t i = 0; i < sizeof cubin; i++)
        cubin[i] = (uint8_t)i;
    uint8_t *whole, *pre;
    size_t n_whole, n_pre;
    cr_assert_eq(kw_proto_encode(KW_PROTO_RESULT, h, cubin, sizeof cubin,
                                 &whole, &n_whole), 0);
    cr_assert_eq(kw_proto_encode_prefix(KW_PROTO_RESULT, h, sizeof cubin,
                                        &pre, &n_pre), 0);
    cr_assert_eq(n_pre + sizeof cubin, n_whole);
    cr_assert_arr_eq(pre, whole, n_pre);
    cr_assert_arr_eq(whole + n_pre, cubin, sizeof cubin);
    free(whole);
    free(pre);
    cJSON_Delete(h);
}

Test(proto, encode_head_writes_the_fixed_header_or_refuses)
{
    uint8_t h[16], want[16];
    put_head(want, KW_PROTO_MAGIC, 1, KW_PROTO_RESULT, 10, 20);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_RESULT, 10, 20), 16);
    cr_assert_arr_eq(h, want, 16);
    cr_assert_arr_eq(h, "KWRM\x01\x00\x41\x00", 8);
    memset(h, 0xEE, sizeof h);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_GET, 10, 1), 0);
    cr_assert_eq(kw_proto_encode_head(h, 7, 0, 0), 0);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_GET,
                                      KW_PROTO_MAX_HEADER + 1, 0), 0);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_RESULT, 0,
                                      KW_PROTO_MAX_PAYLOAD + 1), 0);
    cr_assert_eq(h[0], 0xEE);
}

/* Parses an error frame and checks its two fields. */
static void check_error_frame(const uint8_t *f, size_t len, const char *error,
                              const char *code)
{
    kw_msg m;
    size_t used;
    cr_assert_eq(kw_proto_parse_reply(f, len, &m, &used), KW_PROTO_OK);
    cr_assert_eq(m.type, KW_PROTO_ERROR);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(m.header,
                                                              "error")),
                     error);
    cr_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(m.header,
                                                              "code")),
                     code);
    kw_msg_destroy(&m);
}

Test(proto, error_frame_carries_text_and_code_name)
{
    uint8_t *f;
    size_t len;
    cr_assert_eq(kw_proto_error_frame(KW_EPROTO, "bad magic \"GET \"", &f,
                                      &len), 0);
    check_error_frame(f, len, "bad magic \"GET \"", "KW_EPROTO");
    free(f);
    cr_assert_eq(kw_proto_error_frame(KW_E2BIG, NULL, &f, &len), 0);
    check_error_frame(f, len, kw_strerror(KW_E2BIG), "KW_E2BIG");
    free(f);
    /* Any bytes can be sent: invalid UTF-8 becomes '?'. */
    cr_assert_eq(kw_proto_error_frame(KW_EPROTO, "a\xff\xc3" "b\xc3\xa9", &f,
                                      &len), 0);
    check_error_frame(f, len, "a??" "b\xc3\xa9", "KW_EPROTO");
    free(f);
    char *longmsg = malloc(5000);
    memset(longmsg, 'm', 4999);
    longmsg[4999] = '\0';
    cr_assert_eq(kw_proto_error_frame(KW_EPROTO, longmsg, &f, &len), 0);
    longmsg[KW_PROTO_MAX_ERROR_MSG] = '\0';
    check_error_frame(f, len, longmsg, "KW_EPROTO");
    free(f);
    free(longmsg);
}

/* ---- helpers ------------------------------------------------------------ */

Test(proto, escape_prints_at_most_64_bytes)
{
    uint8_t in[200];
    memset(in, 'A', sizeof in);
    char out[KW_PROTO_ESCAPE_CAP];
    kw_proto_escape(in, sizeof in, out, sizeof out);
    cr_assert_eq(strlen(out), 64 + 3);
    cr_assert_eq(strspn(out, "A"), 64);
    cr_assert_str_eq(out + 64, "...");
    kw_proto_escape(in, 64, out, sizeof out);
    cr_assert_eq(strlen(out), 64, "exactly 64 bytes: no ellipsis");
    /* The worst case fits KW_PROTO_ESCAPE_CAP exactly. */
    memset(in, 0xFF, sizeof in);
    kw_proto_escape(in, sizeof in, out, sizeof out);
    cr_assert_eq(strlen(out) + 1, KW_PROTO_ESCAPE_CAP);
}

Test(proto, escape_escapes_non_printables)
{
    static const uint8_t in[] = {'K', 0, '\n', '\r', '\t', '\\', '"', 0x7F,
                                 0x80, 0xFF, 0x1B, ' ', '~'};
    char out[KW_PROTO_ESCAPE_CAP];
    kw_proto_escape(in, sizeof in, out, sizeof out);
    cr_assert_str_eq(out, "K\\x00\\n\\r\\t\\\\\\\"\\x7f\\x80\\xff\\x1b ~");
}

Test(proto, escape_never_splits_an_escape_or_overruns_cap)
{
    static const uint8_t in[] = {'a', 0xFF, 'b'};
    char out[8];
    memset(out, '#', sizeof out);
    kw_proto_escape(in, sizeof in, out, 5); /* "a" + "\xff" needs 6 */
    cr_assert_str_eq(out, "a");
    cr_assert_eq(out[5], '#');
    kw_proto_escape(in, sizeof in, out, 1);
    cr_assert_str_eq(out, "");
    out[0] = '#';
    kw_proto_escape(in, sizeof in, out, 0);
    cr_assert_eq(out[0], '#');
    kw_proto_escape(NULL, 0, out, sizeof out);
    cr_assert_str_eq(out, "");
}

Test(proto, names_and_classifies_types)
{
    static const char *const names[] = {"ping", "keys", "warmup", "get",
                                        "stats", "evict", "pong", "result",
                                        "progress", "error"};
    for (size_t i = 0; i < N(all_types); i++) {
        cr_assert_str_eq(kw_proto_type_name(all_types[i]), names[i]);
        cr_assert_eq(kw_proto_is_request(all_types[i]), i < 6);
        cr_assert_eq(kw_proto_is_reply(all_types[i]), i >= 6);
    }
    cr_assert_str_eq(kw_proto_type_name(0), "unknown");
    cr_assert_str_eq(kw_proto_type_name(68), "unknown");
    cr_assert(!kw_proto_is_request(0) && !kw_proto_is_reply(0));
}

Test(proto, msg_destroy_accepts_null_and_zeroes)
{
    kw_msg_destroy(NULL);
    kw_msg m = {0};
    kw_msg_destroy(&m);
    cr_assert_eq(parse_rc("KWRM\x01\x00\x01\x00\0\0\0\0\0\0\0\0", 16),
                 KW_PROTO_OK);
    size_t used;
    cr_assert_eq(kw_proto_parse((const uint8_t *)"KWRM\x01\x00\x01\x00"
                                "\0\0\0\0\0\0\0\0", 16, &m, &used),
                 KW_PROTO_OK);
    kw_msg_destroy(&m);
    cr_assert_null(m.header);
    cr_assert_eq(m.type, 0);
}
