/* fuzz_proto.c: libFuzzer harness for the frame parser (client/proto.c).
 *
 * The input is a byte stream as it arrives on a socket.  It is parsed frame
 * by frame with both kw_proto_parse_request() (what kwarmd runs on client
 * bytes) and kw_proto_parse_reply() (what the client library runs on the
 * daemon's bytes), each on an exact-size heap copy so ASan sees any read
 * past the end.  Every accepted frame must be consistent: *used within the
 * buffer, a JSON object header that kw_json_check_tree() accepts, a
 * payload inside the frame, the frame less its last byte a valid prefix,
 * and its re-encoding a frame that parses.
 */
#include "kw_proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_err.h"
#include "kw_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts (a libFuzzer crash) when cond is false: a broken parser contract. */
#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond))                                                       \
            abort();                                                       \
    } while (0)

typedef int (*parse_fn)(const uint8_t *, size_t, kw_msg *, size_t *);

/* An accepted frame of used bytes cut one byte short is a valid prefix:
 * parse must say KW_PROTO_MORE (on an exact-size copy, so nothing past the
 * cut can be read). */
static void check_prefix(parse_fn parse, const uint8_t *frame, size_t used)
{
    uint8_t *cut = malloc(used - 1);
    if (cut == NULL)
        return;
    memcpy(cut, frame, used - 1);
    kw_msg m;
    size_t n = 0;
    CHECK(parse(cut, used - 1, &m, &n) == KW_PROTO_MORE);
    free(cut);
}

/* Parses every frame in buf (len bytes) with parse, as a connection's read
 * loop would, until an error or an incomplete frame. */
static void parse_stream(parse_fn parse, const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (off <= len) {
        kw_msg m;
        size_t used = 0;
        int rc = parse(buf + off, len - off, &m, &used);
        if (rc != KW_PROTO_OK) {
            CHECK(rc == KW_PROTO_MORE || rc == KW_EPROTO || rc == KW_E2BIG ||
                  rc == KW_EVERSION || rc == KW_ENOMEM);
            return;
        }
        CHECK(used >= KW_PROTO_HEAD_LEN && used <= len - off);
        CHECK(cJSON_IsObject(m.header));
        /* The tree rules of the one JSON reader hold for every accepted
         * header: unique names, finite numbers, bounded depth. */
        CHECK(kw_json_check_tree(m.header, KW_PROTO_MAX_DEPTH, NULL, 0) == 0);
        CHECK(m.payload_len == 0 ||
              (m.payload >= buf + off &&
               m.payload + m.payload_len <= buf + off + used));
        check_prefix(parse, buf + off, used);
        /* Re-encoding an accepted frame must give a frame that parses. */
        uint8_t *f = NULL;
        size_t flen = 0;
        if (kw_proto_encode(m.type, m.header, m.payload, m.payload_len, &f,
                            &flen) == 0) {
            kw_msg m2;
            size_t used2 = 0;
            CHECK(kw_proto_parse(f, flen, &m2, &used2) == KW_PROTO_OK);
            CHECK(used2 == flen && m2.type == m.type);
            kw_msg_destroy(&m2);
            free(f);
        }
        kw_msg_destroy(&m);
        off += used;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* One byte is allocated for an empty input; its length stays 0. */
    uint8_t *buf = malloc(size > 0 ? size : 1);
    if (buf == NULL)
        return 0;
    if (size > 0)
        memcpy(buf, data, size);
    parse_stream(kw_proto_parse_request, buf, size);
    parse_stream(kw_proto_parse_reply, buf, size);
    /* The log escaper, with its full cap and with a cap cut short. */
    char esc[KW_PROTO_ESCAPE_CAP];
    kw_proto_escape(buf, size, esc, sizeof esc);
    kw_proto_escape(buf, size, esc, size % (sizeof esc + 1));
    free(buf);
    return 0;
}
