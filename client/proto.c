/* proto.c: the kwarmd wire format (kw_proto.h).
 *
 * Pure code: no I/O, no logging.  A frame is checked in the order its
 * bytes arrive, fixed header first, so a bad magic, an unknown type or an
 * oversized length is refused before the reader waits for (or allocates
 * for) a body that the peer only claims to have.
 *
 * The JSON header is read by common/'s strict reader (kw_json.h), the one
 * config files go through too, with KW_PROTO_MAX_DEPTH as its depth cap;
 * cJSON's own leniencies never reach a handler.
 */
#include "kw_proto.h"

#include <stdlib.h>
#include <string.h>

#include "kw_err.h"
#include "kw_json.h"

/* Which directions a parse accepts. */
enum { ACCEPT_REQUEST = 1, ACCEPT_REPLY = 2, ACCEPT_ANY = 3 };

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

bool kw_proto_is_request(uint16_t type)
{
    return type >= KW_PROTO_PING && type <= KW_PROTO_RESIZE;
}

uint32_t kw_proto_max_header(uint16_t type)
{
    return kw_proto_is_reply(type) ? KW_PROTO_MAX_REPLY_HEADER
                                   : KW_PROTO_MAX_HEADER;
}

unsigned kw_proto_frame_version(const uint8_t *buf, size_t len)
{
    return len >= 6 ? rd16(buf + 4) : 0;
}

bool kw_proto_is_reply(uint16_t type)
{
    return type >= KW_PROTO_PONG && type <= KW_PROTO_ERROR;
}

const char *kw_proto_type_name(uint16_t type)
{
    switch (type) {
    case KW_PROTO_PING: return "ping";
    case KW_PROTO_KEYS: return "keys";
    case KW_PROTO_WARMUP: return "warmup";
    case KW_PROTO_GET: return "get";
    case KW_PROTO_STATS: return "stats";
    case KW_PROTO_EVICT: return "evict";
    case KW_PROTO_MISSES: return "misses";
    case KW_PROTO_LS: return "ls";
    case KW_PROTO_PINS: return "pins";
    case KW_PROTO_UNPIN: return "unpin";
    case KW_PROTO_RESIZE: return "resize";
    case KW_PROTO_PONG: return "pong";
    case KW_PROTO_RESULT: return "result";
    case KW_PROTO_PROGRESS: return "progress";
    case KW_PROTO_ERROR: return "error";
    default: return "unknown";
    }
}

/* The rules of kw_proto_peek() for one direction mask.  Each field is
 * judged as soon as its bytes are in buf; the magic even byte by byte.
 * Returns KW_PROTO_OK with the fields stored, KW_PROTO_MORE, or an error;
 * outputs untouched unless KW_PROTO_OK. */
static int check_head(const uint8_t *buf, size_t len, int accept,
                      uint16_t *type, uint32_t *header_len,
                      uint32_t *payload_len)
{
    static const uint8_t magic[4] = {'K', 'W', 'R', 'M'};
    if (memcmp(buf, magic, len < 4 ? len : 4) != 0)
        return KW_EPROTO;
    if (len >= 6 && rd16(buf + 4) != KW_PROTO_VERSION)
        return KW_EVERSION;
    if (len >= 8) {
        uint16_t t = rd16(buf + 6);
        int dir = kw_proto_is_request(t) ? ACCEPT_REQUEST
                  : kw_proto_is_reply(t) ? ACCEPT_REPLY
                                         : 0;
        if ((dir & accept) == 0)
            return KW_EPROTO;
    }
    if (len >= 12 && rd32(buf + 8) > kw_proto_max_header(rd16(buf + 6)))
        return KW_E2BIG;
    if (len < KW_PROTO_HEAD_LEN)
        return KW_PROTO_MORE;
    uint32_t pl = rd32(buf + 12);
    if (pl > 0 && rd16(buf + 6) != KW_PROTO_RESULT)
        return KW_EPROTO;
    if (pl > KW_PROTO_MAX_PAYLOAD)
        return KW_E2BIG;
    if (type != NULL)
        *type = rd16(buf + 6);
    if (header_len != NULL)
        *header_len = rd32(buf + 8);
    if (payload_len != NULL)
        *payload_len = pl;
    return KW_PROTO_OK;
}

int kw_proto_peek(const uint8_t *buf, size_t len, uint16_t *type,
                  uint32_t *header_len, uint32_t *payload_len)
{
    if (len == 0)
        return KW_PROTO_MORE;
    return check_head(buf, len, ACCEPT_ANY, type, header_len, payload_len);
}

/* Parses the len-byte JSON header at s into *out (a new object tree) by
 * kw_json.h's rules.  Returns 0, KW_EPROTO or KW_ENOMEM.  cJSON returns
 * NULL for running out of memory as for bad syntax, so OOM inside cJSON
 * reads as KW_EPROTO. */
static int parse_header(const uint8_t *s, size_t len, cJSON **out)
{
    if (len == 0) {
        *out = cJSON_CreateObject();
        return *out != NULL ? 0 : KW_ENOMEM;
    }
    /* len is at most KW_PROTO_MAX_HEADER and its bytes are all present. */
    cJSON *root = NULL;
    int rc = kw_json_parse((const char *)s, len, KW_PROTO_MAX_DEPTH, &root,
                           NULL, 0);
    if (rc == 0 && !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        rc = KW_EJSON;
    }
    if (rc == 0)
        *out = root;
    return rc == KW_EJSON ? KW_EPROTO : rc;
}

/* kw_proto_parse() restricted to the directions in accept. */
static int parse_frame(const uint8_t *buf, size_t len, int accept,
                       kw_msg *out, size_t *used)
{
    if (len == 0)
        return KW_PROTO_MORE;
    uint16_t type;
    uint32_t hl, pl;
    int rc = check_head(buf, len, accept, &type, &hl, &pl);
    if (rc != KW_PROTO_OK)
        return rc;
    /* Both lengths are capped, so this sum cannot wrap. */
    size_t total = (size_t)KW_PROTO_HEAD_LEN + hl + pl;
    if (len < total)
        return KW_PROTO_MORE;
    cJSON *header = NULL;
    rc = parse_header(buf + KW_PROTO_HEAD_LEN, hl, &header);
    if (rc < 0)
        return rc;
    out->type = type;
    out->header = header;
    out->payload = pl > 0 ? buf + KW_PROTO_HEAD_LEN + hl : NULL;
    out->payload_len = pl;
    *used = total;
    return KW_PROTO_OK;
}

int kw_proto_parse(const uint8_t *buf, size_t len, kw_msg *out, size_t *used)
{
    return parse_frame(buf, len, ACCEPT_ANY, out, used);
}

int kw_proto_parse_request(const uint8_t *buf, size_t len, kw_msg *out,
                           size_t *used)
{
    return parse_frame(buf, len, ACCEPT_REQUEST, out, used);
}

int kw_proto_parse_reply(const uint8_t *buf, size_t len, kw_msg *out,
                         size_t *used)
{
    return parse_frame(buf, len, ACCEPT_REPLY, out, used);
}

void kw_msg_destroy(kw_msg *m)
{
    if (m == NULL)
        return;
    cJSON_Delete(m->header);
    memset(m, 0, sizeof *m);
}

size_t kw_proto_encode_head(uint8_t hdr[16], uint16_t type,
                            uint32_t header_len, uint32_t payload_len)
{
    if (!kw_proto_is_request(type) && !kw_proto_is_reply(type))
        return 0;
    if (header_len > kw_proto_max_header(type) ||
        payload_len > KW_PROTO_MAX_PAYLOAD)
        return 0;
    if (payload_len > 0 && type != KW_PROTO_RESULT)
        return 0;
    wr32(hdr, KW_PROTO_MAGIC);
    wr16(hdr + 4, KW_PROTO_VERSION);
    wr16(hdr + 6, type);
    wr32(hdr + 8, header_len);
    wr32(hdr + 12, payload_len);
    return KW_PROTO_HEAD_LEN;
}

/* Prints header (NULL: none) and checks that the text would parse back.
 * Returns 0 with *text (free() it, NULL for none) and *len; KW_EINVAL,
 * KW_E2BIG or KW_ENOMEM. */
static int print_header(const cJSON *header, uint32_t cap, char **text,
                        size_t *len)
{
    *text = NULL;
    *len = 0;
    if (header == NULL)
        return 0;
    if (!cJSON_IsObject(header))
        return KW_EINVAL;
    /* The tree first: its walk bounds the depth before cJSON's printer
     * recurses, and it refuses duplicate names, cJSON_Raw items and
     * strings that are not UTF-8, so the printed text needs no lexing. */
    int rc = kw_json_check_out(header, KW_PROTO_MAX_DEPTH, NULL, 0);
    if (rc != 0)
        return rc == KW_EJSON ? KW_EINVAL : rc;
    char *s = cJSON_PrintUnformatted(header);
    if (s == NULL)
        return KW_ENOMEM;
    size_t n = strlen(s);
    rc = n > cap ? KW_E2BIG : 0;
    if (rc != 0) {
        free(s);
        return rc;
    }
    *text = s;
    *len = n;
    return 0;
}

/* Builds fixed header + JSON, followed by payload_len bytes of payload
 * when payload is not NULL, or declaring them only when it is (prefix). */
static int encode(uint16_t type, const cJSON *header, const void *payload,
                  size_t payload_len, uint8_t **out, size_t *out_len)
{
    if (out == NULL || out_len == NULL)
        return KW_EINVAL;
    if (payload_len > 0 && type != KW_PROTO_RESULT)
        return KW_EINVAL;
    if (payload_len > KW_PROTO_MAX_PAYLOAD)
        return KW_E2BIG;
    char *text;
    size_t n;
    int rc = print_header(header, kw_proto_max_header(type), &text, &n);
    if (rc != 0)
        return rc;
    uint8_t head[KW_PROTO_HEAD_LEN];
    if (kw_proto_encode_head(head, type, (uint32_t)n,
                             (uint32_t)payload_len) == 0) {
        free(text);
        return KW_EINVAL;
    }
    size_t total = KW_PROTO_HEAD_LEN + n + (payload ? payload_len : 0);
    uint8_t *f = malloc(total);
    if (f == NULL) {
        free(text);
        return KW_ENOMEM;
    }
    memcpy(f, head, KW_PROTO_HEAD_LEN);
    if (n > 0)
        memcpy(f + KW_PROTO_HEAD_LEN, text, n);
    if (payload != NULL && payload_len > 0)
        memcpy(f + KW_PROTO_HEAD_LEN + n, payload, payload_len);
    free(text);
    *out = f;
    *out_len = total;
    return 0;
}

int kw_proto_encode(uint16_t type, const cJSON *header, const void *payload,
                    size_t payload_len, uint8_t **out, size_t *out_len)
{
    if (payload == NULL && payload_len > 0)
        return KW_EINVAL;
    return encode(type, header, payload, payload_len, out, out_len);
}

int kw_proto_encode_prefix(uint16_t type, const cJSON *header,
                           size_t payload_len, uint8_t **out,
                           size_t *out_len)
{
    return encode(type, header, NULL, payload_len, out, out_len);
}

/* Copies at most KW_PROTO_MAX_ERROR_MSG bytes of msg into a new string,
 * each byte that does not start valid UTF-8 (within the cut) made '?'. */
static char *sanitize_msg(const char *msg)
{
    size_t n = strnlen(msg, KW_PROTO_MAX_ERROR_MSG);
    char *s = malloc(n + 1);
    if (s == NULL)
        return NULL;
    const unsigned char *u = (const unsigned char *)msg;
    for (size_t i = 0; i < n;) {
        size_t k = kw_json_utf8_len(u + i, u + n);
        if (k == 0) {
            s[i++] = '?';
            continue;
        }
        memcpy(s + i, u + i, k);
        i += k;
    }
    s[n] = '\0';
    return s;
}

int kw_proto_error_frame(int code, const char *msg, uint8_t **out,
                         size_t *len)
{
    if (out == NULL || len == NULL)
        return KW_EINVAL;
    char *text = sanitize_msg(msg != NULL ? msg : kw_strerror(code));
    cJSON *h = text != NULL ? cJSON_CreateObject() : NULL;
    int rc = KW_ENOMEM;
    if (h != NULL && cJSON_AddStringToObject(h, "error", text) != NULL &&
        cJSON_AddStringToObject(h, "code", kw_err_name(code)) != NULL)
        rc = kw_proto_encode(KW_PROTO_ERROR, h, NULL, 0, out, len);
    cJSON_Delete(h);
    free(text);
    return rc;
}

/* Writes the escaped form of c into e (at most 5 bytes with the NUL). */
static void escape_byte(uint8_t c, char e[5])
{
    static const char hex[] = "0123456789abcdef";
    const char *named = c == '\n'   ? "\\n"
                        : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t"
                        : c == '\\' ? "\\\\"
                        : c == '"'  ? "\\\""
                                    : NULL;
    if (named != NULL) {
        strcpy(e, named);
    } else if (c >= 0x20 && c < 0x7F) {
        e[0] = (char)c;
        e[1] = '\0';
    } else {
        e[0] = '\\';
        e[1] = 'x';
        e[2] = hex[c >> 4];
        e[3] = hex[c & 15];
        e[4] = '\0';
    }
}

void kw_proto_escape(const uint8_t *buf, size_t len, char *out, size_t cap)
{
    if (out == NULL || cap == 0)
        return;
    size_t n = len < KW_PROTO_ESCAPE_MAX ? len : KW_PROTO_ESCAPE_MAX, o = 0;
    for (size_t i = 0; i < n; i++) {
        char e[5];
        escape_byte(buf[i], e);
        size_t k = strlen(e);
        if (o + k >= cap) {
            out[o] = '\0';
            return;
        }
        memcpy(out + o, e, k);
        o += k;
    }
    if (len > KW_PROTO_ESCAPE_MAX && o + 3 < cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}
