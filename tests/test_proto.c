/* test_proto.c: the wire format (client/kw_proto.h): round trips, partial
 * input, and one negative test per parser rule (fuzzing: test_proto_fuzz.c).
 *
 * Every buffer handed to the parser is a malloc'd copy of exactly the bytes
 * under test, so AddressSanitizer catches a read one byte too far. */
#include "proto_util.h"

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
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET, 60 * 1024, 0, 16),
                 KW_PROTO_MORE);
    size_t n = 60 * 1024;
    uint8_t *f = calloc(1, 16 + n);
    put_head(f, KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET, (uint32_t)n, 0);
    memset(f + 16, '[', n);
    cr_assert_eq(parse_rc(f, 16 + n - 1), KW_PROTO_MORE);
    cr_assert_eq(parse_rc(f, 16 + n), KW_EPROTO);
    free(f);
}

Test(proto, peek_reports_the_fixed_header)
{
    uint8_t h[16];
    put_head(h, KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 77, 99);
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
    static const uint16_t bad[] = {0, 1, 3, 0x0100, 0xFFFF};
    for (size_t i = 0; i < N(bad); i++) {
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, bad[i], KW_PROTO_PING, 0, 0, 16),
                     KW_EVERSION, "version %u", bad[i]);
        /* Judged as soon as its two bytes are in. */
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, bad[i], KW_PROTO_PING, 0, 0, 6),
                     KW_EVERSION, "version %u", bad[i]);
        uint8_t h[16];
        put_head(h, KW_PROTO_MAGIC, bad[i], KW_PROTO_PING, 0, 0);
        cr_expect_eq(kw_proto_frame_version(h, 6), bad[i]);
    }
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_PING, 0, 0, 6),
                 KW_PROTO_MORE);
}

/* Replies may carry larger headers (streamed warmup results with NVRTC
 * logs) than requests: each direction has its cap, both sides tested. */
Test(proto, reply_headers_have_their_own_cap)
{
    cr_assert_eq(kw_proto_max_header(KW_PROTO_GET), KW_PROTO_MAX_HEADER);
    cr_assert_eq(kw_proto_max_header(KW_PROTO_PROGRESS), KW_PROTO_MAX_REPLY_HEADER);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_PROGRESS,
                         KW_PROTO_MAX_REPLY_HEADER, 0, 16), KW_PROTO_MORE);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_PROGRESS,
                         KW_PROTO_MAX_REPLY_HEADER + 1, 0, 16), KW_E2BIG);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET,
                         KW_PROTO_MAX_HEADER + 1, 0, 16), KW_E2BIG);
    uint8_t h[16];
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_RESULT, KW_PROTO_MAX_REPLY_HEADER, 0),
                 16);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_RESULT,
                                      KW_PROTO_MAX_REPLY_HEADER + 1, 0), 0);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_GET, KW_PROTO_MAX_HEADER + 1, 0), 0);
}

Test(proto, rejects_unknown_type)
{
    static const uint16_t named[] = {0, 12, 63, 68, 0xFFFF};
    for (size_t i = 0; i < N(named); i++)
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, named[i], 0, 0, 8),
                     KW_EPROTO, "type %u", named[i]);
    /* Every one of the 65536 values: exactly the fifteen known types pass. */
    size_t ok = 0;
    for (uint32_t t = 0; t <= 0xFFFF; t++) {
        int rc = head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, (uint16_t)t, 0, 0, 16);
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
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET, bad[i], 0, 16),
                     KW_E2BIG);
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET, bad[i], 0, 12),
                     KW_E2BIG);
    }
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_GET, KW_PROTO_MAX_HEADER,
                         0, 16), KW_PROTO_MORE);
}

Test(proto, rejects_payload_len_over_cap_from_the_fixed_header)
{
    static const uint32_t bad[] = {KW_PROTO_MAX_PAYLOAD + 1, 0x80000000u,
                                   0xFFFFFFFFu};
    for (size_t i = 0; i < N(bad); i++)
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 0, bad[i],
                             16), KW_E2BIG);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 0,
                         KW_PROTO_MAX_PAYLOAD, 16), KW_PROTO_MORE);
}

Test(proto, rejects_lengths_whose_sum_overflows_32_bits)
{
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 0xFFFFFFFFu,
                         0xFFFFFFFFu, 16), KW_E2BIG);
    /* 16 + 16 + 0xFFFFFFE0 is 0 in 32 bits: a naive sum would say the frame
     * is complete already. */
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 16, 0xFFFFFFE0u,
                         16), KW_E2BIG);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 0xFFFFFFF0u, 0,
                         16), KW_E2BIG);
}

Test(proto, rejects_request_with_payload)
{
    for (uint16_t t = KW_PROTO_PING; t <= KW_PROTO_RESIZE; t++) {
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, t, 0, 1, 16), KW_EPROTO,
                     "%s", kw_proto_type_name(t));
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, t, 2, 0xFFFFFFFFu, 16),
                     KW_EPROTO, "%s", kw_proto_type_name(t));
    }
}

Test(proto, rejects_payload_on_replies_other_than_result)
{
    static const uint16_t t[] = {KW_PROTO_PONG, KW_PROTO_PROGRESS,
                                 KW_PROTO_ERROR};
    for (size_t i = 0; i < N(t); i++)
        cr_expect_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, t[i], 0, 1, 16), KW_EPROTO);
    cr_assert_eq(head_rc(KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 0, 1, 16),
                 KW_PROTO_MORE);
}

Test(proto, parse_request_refuses_replies_at_the_type_field)
{
    uint8_t h[16];
    kw_msg m;
    size_t used;
    for (size_t i = 0; i < N(all_types); i++) {
        put_head(h, KW_PROTO_MAGIC, KW_PROTO_VERSION, all_types[i], 0, 0);
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
        "{\x01}", "\x0b{}", "{}\x0c", "{\"a\":\x7f 1}", "{\"a\":\x01 1}",
        "{\"a\": 1,\x1f\"b\": 2}"};
    reject_all(bad, N(bad));
}

Test(proto, rejects_numbers_outside_rfc_8259)
{
    static const char *const bad[] = {
        "{\"a\": 01}",  "{\"a\": -01}", "{\"a\": 1.}",  "{\"a\": .5}",
        "{\"a\": +1}",  "{\"a\": -}",   "{\"a\": 1e}",  "{\"a\": 1e+}",
        "{\"a\": 0x10}", "{\"a\": NaN}", "{\"a\": Infinity}",
        "{\"a\": 1.2.3}", "{\"a\": --1}", "{\"a\": [1 2]}",
        /* RFC grammar, but no double holds it: two readers would disagree */
        "{\"a\": 1e400}", "{\"a\": -1e400}", "{\"a\": [1, 2E+309]}"};
    reject_all(bad, N(bad));
    /* Underflow rounds to 0 as every double reader does. */
    cr_assert_eq(json_rc("{\"a\": [0, -0, -0.5e+10, 1E-3, 12, 1e-400, "
                         "1.7976931348623157e308]}"), KW_PROTO_OK);
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
