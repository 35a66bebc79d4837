/* kw_proto.h: the kwarmd wire format (prefix kw_proto_).
 *
 * One frame, every integer little-endian:
 *
 *   offset  size  field
 *        0     4  magic        "KWRM" (KW_PROTO_MAGIC read as u32 LE)
 *        4     2  version      KW_PROTO_VERSION
 *        6     2  type         enum kw_proto_type
 *        8     4  header_len   <= KW_PROTO_MAX_HEADER
 *       12     4  payload_len  <= KW_PROTO_MAX_PAYLOAD; 0 unless type is
 *                              KW_PROTO_RESULT
 *       16     header_len bytes of JSON: one object, UTF-8 (RFC 8259, read
 *                              strictly, see kw_proto_parse); 0 bytes = {}
 *        .     payload_len bytes of binary payload (a cubin)
 *
 * Requests (client to daemon) carry no payload.  Each gets zero or more
 * KW_PROTO_PROGRESS frames, then exactly one final reply: KW_PROTO_PONG
 * (to ping), KW_PROTO_RESULT or KW_PROTO_ERROR, whose header is
 * {"error": "<text>", "code": "<kw_err_name()>"}.  A peer that receives a
 * bad frame sends one error frame and closes without reading further.
 *
 * Everything here is pure: no I/O, no logging, no global state of ours.
 * The functions are reentrant and may run on any thread on distinct
 * buffers, with one caveat inherited from cJSON: every cJSON parse stores
 * a process-wide error pointer (cJSON_GetErrorPtr), so concurrent parses
 * race on that write.  kwarm never reads it; ThreadSanitizer will still
 * report it.  cJSON allocates through its global hooks (cJSON_InitHooks).
 */
#ifndef KW_PROTO_H
#define KW_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define KW_PROTO_MAGIC 0x4D52574Bu /* "KWRM" */
/* Version 2 (kwarm 0.2): keys and warmup stream their keys and per-key
 * results in PROGRESS frames and end with a counts-only RESULT; reply
 * headers may reach KW_PROTO_MAX_REPLY_HEADER. */
#define KW_PROTO_VERSION 2u
#define KW_PROTO_HEAD_LEN 16u /* the fixed header */

/* Caps, each checked from the fixed header before the body is awaited or
 * anything is allocated for it. */
#define KW_PROTO_MAX_HEADER (64u * 1024u)  /* JSON header bytes, requests */
/* JSON header bytes of a reply: a PROGRESS frame of a warmup may carry the
 * NVRTC logs (64 KiB each) of failed keys. */
#define KW_PROTO_MAX_REPLY_HEADER (1024u * 1024u)
#define KW_PROTO_MAX_PAYLOAD (64u * 1024u * 1024u) /* payload (replies) */
#define KW_PROTO_MAX_FRAME \
    (KW_PROTO_HEAD_LEN + KW_PROTO_MAX_REPLY_HEADER + KW_PROTO_MAX_PAYLOAD)
/* The largest request frame (requests carry no payload): the per-connection
 * read buffer cap for kwarmd. */
#define KW_PROTO_MAX_REQUEST (KW_PROTO_HEAD_LEN + KW_PROTO_MAX_HEADER)
/* Nesting of arrays and objects in a JSON header, the root object being
 * depth 1.  Checked before cJSON runs, so cJSON's recursion stays shallow. */
#define KW_PROTO_MAX_DEPTH 32u
/* kw_proto_escape() reads at most this many input bytes ... */
#define KW_PROTO_ESCAPE_MAX 64u
/* ... and never needs more than this many output bytes: 4 per byte
 * ("\xNN"), "..." when input was left out, and the NUL. */
#define KW_PROTO_ESCAPE_CAP (4u * KW_PROTO_ESCAPE_MAX + 3u + 1u)
/* The "error" text of kw_proto_error_frame() is cut to this many bytes. */
#define KW_PROTO_MAX_ERROR_MSG 1024u

/* Return codes of kw_proto_parse() and kw_proto_peek() besides the negative
 * kw_err.h codes. */
#define KW_PROTO_OK 0
#define KW_PROTO_MORE 1 /* a valid prefix: call again with more bytes */

enum kw_proto_type {
    /* Requests. */
    KW_PROTO_PING = 1,
    KW_PROTO_KEYS = 2,
    KW_PROTO_WARMUP = 3,
    KW_PROTO_GET = 4,
    KW_PROTO_STATS = 5,
    KW_PROTO_EVICT = 6,
    KW_PROTO_MISSES = 7, /* the miss audit: streamed like keys */
    KW_PROTO_LS = 8,     /* cache entries: streamed like keys */
    KW_PROTO_PINS = 9,
    KW_PROTO_UNPIN = 10,
    KW_PROTO_RESIZE = 11,
    /* Replies. */
    KW_PROTO_PONG = 64,
    KW_PROTO_RESULT = 65,   /* final reply; the only type with a payload */
    KW_PROTO_PROGRESS = 66, /* streamed before the final reply of keys,
                               warmup, misses, ls and evict by criteria;
                               one with an empty array is a warmup's
                               heartbeat, sent after 2 s without a frame */
    KW_PROTO_ERROR = 67,    /* final reply: {"error": ..., "code": ...} */
};

/* One parsed frame.  header is owned by the kw_msg; payload is borrowed
 * from the buffer given to kw_proto_parse() (see there). */
typedef struct kw_msg {
    uint16_t type;          /* enum kw_proto_type */
    cJSON *header;          /* a JSON object, never NULL after parsing */
    const uint8_t *payload; /* NULL when payload_len is 0 */
    size_t payload_len;
} kw_msg;

/* Validates the fixed header at the start of buf without reading the body,
 * for a reader deciding how much to buffer.  The fields are checked in wire
 * order as soon as their bytes are present, so a stream that starts "GET "
 * is refused at its first byte:
 *   magic                                KW_EPROTO (close without reading on)
 *   version other than KW_PROTO_VERSION  KW_EVERSION (kw_proto_frame_version()
 *                                        tells which; answer with an error
 *                                        frame naming both, then close)
 *   type unknown                         KW_EPROTO
 *   header_len > kw_proto_max_header()   KW_E2BIG
 *   payload_len > 0 and type is not
 *     KW_PROTO_RESULT (all requests)     KW_EPROTO
 *   payload_len > KW_PROTO_MAX_PAYLOAD   KW_E2BIG
 * Returns KW_PROTO_OK with the three fields stored (any pointer may be
 * NULL), KW_PROTO_MORE when fewer than KW_PROTO_HEAD_LEN bytes are present
 * and none of them is wrong, or one of the errors above; outputs untouched
 * unless KW_PROTO_OK.  The whole frame is then KW_PROTO_HEAD_LEN +
 * header_len + payload_len bytes, which cannot overflow a size_t. */
int kw_proto_peek(const uint8_t *buf, size_t len, uint16_t *type,
                  uint32_t *header_len, uint32_t *payload_len);

/* Parses the one frame at the start of buf (len bytes; buf may be NULL when
 * len is 0).  Bytes after the frame are left alone: call again at buf +
 * *used for the next one.
 *
 * Returns KW_PROTO_OK with *out filled and *used set to the frame's length;
 * KW_PROTO_MORE when buf holds a valid prefix of a frame (nothing is
 * allocated for a body that has not arrived); any error of kw_proto_peek();
 * KW_EPROTO when the JSON header is not one strict RFC 8259 object (the
 * rules of kwarm's one JSON reader, which config files follow too): invalid
 * syntax or UTF-8, truncated, not an object, bytes other than whitespace
 * after it, a NUL byte or "\u0000", a raw control character, a leading zero
 * or other non-RFC number, a number no double holds (1e400), a byte-order
 * mark, a member name used twice in one object, or nesting deeper than
 * KW_PROTO_MAX_DEPTH; KW_ENOMEM.  *out
 * and *used are untouched unless KW_PROTO_OK.
 *
 * Lifetimes: out->header is a new cJSON tree owned by *out; release it with
 * kw_msg_destroy().  out->payload points into buf: valid while buf's bytes
 * stay where they are, so copy it out before the buffer is compacted,
 * reallocated or freed.
 *
 * Accepts requests and replies alike; a daemon or a client should use the
 * _request or _reply form instead. */
int kw_proto_parse(const uint8_t *buf, size_t len, kw_msg *out, size_t *used);

/* kw_proto_parse() for kwarmd: a reply type is refused with KW_EPROTO as
 * soon as the type field arrives, so a client cannot make the daemon
 * buffer a 64 MiB "result".  With this form no frame exceeds
 * KW_PROTO_MAX_REQUEST bytes. */
int kw_proto_parse_request(const uint8_t *buf, size_t len, kw_msg *out,
                           size_t *used);

/* kw_proto_parse() for the client: a request type is refused with
 * KW_EPROTO as soon as the type field arrives. */
int kw_proto_parse_reply(const uint8_t *buf, size_t len, kw_msg *out,
                         size_t *used);

/* Frees m's header and zeroes *m; the payload (borrowed) is not touched.
 * NULL and a zeroed kw_msg are no-ops. */
void kw_msg_destroy(kw_msg *m);

/* Encodes one frame into a new buffer (*out, free() it; *out_len bytes).
 * header may be NULL, which sends {} as zero header bytes; otherwise it is
 * printed unformatted and must be an object that kw_proto_parse() would
 * accept back (valid UTF-8 strings, unique member names, nesting within
 * KW_PROTO_MAX_DEPTH).  payload (payload_len bytes) is copied; it may be
 * NULL when payload_len is 0.
 * Returns 0; KW_EINVAL (unknown type, header not an object or not
 * re-parsable, a payload on any type but KW_PROTO_RESULT, NULL pointers);
 * KW_E2BIG (printed header over KW_PROTO_MAX_HEADER or payload_len over
 * KW_PROTO_MAX_PAYLOAD); KW_ENOMEM.  *out, *out_len untouched on error. */
int kw_proto_encode(uint16_t type, const cJSON *header, const void *payload,
                    size_t payload_len, uint8_t **out, size_t *out_len);

/* As kw_proto_encode(), but stops after the JSON header: the frame declares
 * payload_len bytes that the caller sends right after *out itself (writev),
 * so a cubin is never copied.  Same returns. */
int kw_proto_encode_prefix(uint16_t type, const cJSON *header,
                           size_t payload_len, uint8_t **out,
                           size_t *out_len);

/* Writes the 16-byte fixed header for already-printed JSON of header_len
 * bytes and a payload of payload_len bytes.  The caller vouches for the
 * JSON itself.  Returns KW_PROTO_HEAD_LEN, or 0 (hdr untouched) when
 * kw_proto_peek() would refuse the result: unknown type, a length over its
 * cap, a payload on a type other than KW_PROTO_RESULT. */
size_t kw_proto_encode_head(uint8_t hdr[16], uint16_t type,
                            uint32_t header_len, uint32_t payload_len);

/* Encodes a KW_PROTO_ERROR frame {"error": msg, "code": kw_err_name(code)}
 * into a new buffer (*out, free() it; *len bytes).  msg NULL means
 * kw_strerror(code).  msg is cut to KW_PROTO_MAX_ERROR_MSG bytes and each
 * byte that is not valid UTF-8 becomes '?', so any text (a path, escaped
 * input) can be sent.  Returns 0, KW_EINVAL (NULL out or len), KW_ENOMEM. */
int kw_proto_error_frame(int code, const char *msg, uint8_t **out,
                         size_t *len);

/* Writes a printable, NUL-terminated rendering of the first
 * KW_PROTO_ESCAPE_MAX bytes of buf into out (cap bytes) for a log line:
 * printable ASCII as is, backslash and double quote escaped, \n \r \t, and
 * any other byte as \xNN; "..." follows when len > KW_PROTO_ESCAPE_MAX.
 * Output that does not fit in cap stops before the escape that would not
 * fit (KW_PROTO_ESCAPE_CAP always fits).  cap 0 writes nothing; buf may be
 * NULL when len is 0. */
void kw_proto_escape(const uint8_t *buf, size_t len, char *out, size_t cap);

/* The lowercase name of a type ("ping", "result"), or "unknown"; static. */
const char *kw_proto_type_name(uint16_t type);

/* True for the eleven request types. */
bool kw_proto_is_request(uint16_t type);

/* The cap on header_len for frames of type: KW_PROTO_MAX_HEADER for
 * requests (and unknown types), KW_PROTO_MAX_REPLY_HEADER for replies. */
uint32_t kw_proto_max_header(uint16_t type);

/* The version field of the frame at buf (0 when fewer than 6 bytes), for
 * the message of a KW_EVERSION. */
unsigned kw_proto_frame_version(const uint8_t *buf, size_t len);

/* True for the four reply types. */
bool kw_proto_is_reply(uint16_t type);

#endif /* KW_PROTO_H */
