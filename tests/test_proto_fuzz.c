/* test_proto_fuzz.c: seeded fuzzing of the frame parser, the encoders'
 * agreement with it, and the logging helpers. */
#include "proto_util.h"

#include <math.h>

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
    if (le32(h) != 0x4D52574Bu)
        return KW_EPROTO;
    if (ver != 2)
        return KW_EVERSION;
    if (!((type >= 1 && type <= 11) || (type >= 64 && type <= 67)))
        return KW_EPROTO;
    if (hl > (type >= 64 ? 1024u * 1024u : 64u * 1024u))
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
              rc == KW_E2BIG || rc == KW_EVERSION, "rc %d", rc);
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
    put_head(h, KW_PROTO_MAGIC, KW_PROTO_VERSION, type, hl, pl);
}

Test(proto_fuzz, survives_random_fixed_headers)
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

Test(proto_fuzz, survives_random_frames_with_bodies)
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
            put_head(buf, KW_PROTO_MAGIC, KW_PROTO_VERSION, type, hl,
                     type == KW_PROTO_RESULT ? (uint32_t)(body - hl) : 0);
        }
        int want = head_oracle(buf);
        int rc = parse_checked(buf, 16 + body);
        if (want < 0)
            cr_assert_eq(rc, want, "frame %d", i);
    }
}

Test(proto_fuzz, survives_mutations_of_a_valid_frame)
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

Test(proto_fuzz, encode_refuses_what_parse_would_refuse)
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
    cJSON *inf = cJSON_CreateObject(); /* cJSON would print null */
    cJSON_AddNumberToObject(inf, "a", HUGE_VAL);
    cr_assert_eq(enc_rc(KW_PROTO_GET, inf, NULL, 0), KW_EINVAL);
    cJSON_Delete(inf);
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

Test(proto_fuzz, encode_prefix_plus_payload_is_the_whole_frame)
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

Test(proto_fuzz, encode_head_writes_the_fixed_header_or_refuses)
{
    uint8_t h[16], want[16];
    put_head(want, KW_PROTO_MAGIC, KW_PROTO_VERSION, KW_PROTO_RESULT, 10, 20);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_RESULT, 10, 20), 16);
    cr_assert_arr_eq(h, want, 16);
    cr_assert_arr_eq(h, "KWRM\x02\x00\x41\x00", 8);
    memset(h, 0xEE, sizeof h);
    cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_GET, 10, 1), 0);
    cr_assert_eq(kw_proto_encode_head(h, 12, 0, 0), 0);
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

Test(proto_fuzz, error_frame_carries_text_and_code_name)
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

Test(proto_fuzz, escape_prints_at_most_64_bytes)
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

Test(proto_fuzz, escape_escapes_non_printables)
{
    static const uint8_t in[] = {'K', 0, '\n', '\r', '\t', '\\', '"', 0x7F,
                                 0x80, 0xFF, 0x1B, ' ', '~'};
    char out[KW_PROTO_ESCAPE_CAP];
    kw_proto_escape(in, sizeof in, out, sizeof out);
    cr_assert_str_eq(out, "K\\x00\\n\\r\\t\\\\\\\"\\x7f\\x80\\xff\\x1b ~");
}

Test(proto_fuzz, escape_never_splits_an_escape_or_overruns_cap)
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

Test(proto_fuzz, names_and_classifies_types)
{
    static const char *const names[] = {"ping", "keys", "warmup", "get",
                                        "stats", "evict", "misses", "ls",
                                        "pins", "unpin", "resize", "pong",
                                        "result", "progress", "error"};
    for (size_t i = 0; i < N(all_types); i++) {
        cr_assert_str_eq(kw_proto_type_name(all_types[i]), names[i]);
        cr_assert_eq(kw_proto_is_request(all_types[i]), i < 11);
        cr_assert_eq(kw_proto_is_reply(all_types[i]), i >= 11);
    }
    cr_assert_str_eq(kw_proto_type_name(0), "unknown");
    cr_assert_str_eq(kw_proto_type_name(68), "unknown");
    cr_assert(!kw_proto_is_request(0) && !kw_proto_is_reply(0));
}

Test(proto_fuzz, msg_destroy_accepts_null_and_zeroes)
{
    kw_msg_destroy(NULL);
    kw_msg m = {0};
    kw_msg_destroy(&m);
    cr_assert_eq(parse_rc("KWRM\x02\x00\x01\x00\0\0\0\0\0\0\0\0", 16),
                 KW_PROTO_OK);
    size_t used;
    cr_assert_eq(kw_proto_parse((const uint8_t *)"KWRM\x02\x00\x01\x00"
                                "\0\0\0\0\0\0\0\0", 16, &m, &used),
                 KW_PROTO_OK);
    kw_msg_destroy(&m);
    cr_assert_null(m.header);
    cr_assert_eq(m.type, 0);
}
