/* kw_client.h: libkwarm, the blocking C client of kwarmd (prefix kw_client_).
 *
 * A serving process (or the kwarm CLI) connects to kwarmd's Unix socket and
 * asks for compile keys, warmups, cubins and statistics.  Every request is
 * one round trip on the wire format of kw_proto.h; the API speaks JSON text
 * (strings in, strings out) so callers need no cJSON types.
 *
 * Return codes: 0, or a negative code of kw_err.h.  Three kinds:
 *   - the daemon answered with an ERROR frame: its "code" name mapped back
 *     (KW_ENOTFOUND, KW_ECONFIG, KW_EDEPLOY, KW_ENVRTC, KW_EINVAL, ...; a
 *     name this library does not know gives KW_EPROTO, the daemon's system
 *     errors ("ESYS") give -EIO).  The connection stays usable.
 *   - I/O or protocol failure: -errno (-ECONNRESET when kwarmd closed the
 *     connection, -ETIMEDOUT, -EPIPE, ...), KW_EPROTO / KW_E2BIG for a reply
 *     that breaks the protocol.  The connection is then closed: every later
 *     request on it returns -ENOTCONN; connect again.
 *   - the caller's input: KW_EINVAL (NULL, not 64 hex digits, a JSON text
 *     that is not an object), KW_EJSON (JSON text that does not parse),
 *     KW_E2BIG (a request over KW_PROTO_MAX_HEADER), KW_ENOMEM.  Nothing is
 *     sent and the connection stays usable.
 * In every case kw_client_last_error() holds text that says what failed
 * (the daemon's may span lines: an NVRTC log).
 *
 * Threads: a kw_client is not thread-safe; use one per thread, or lock
 * around every call on a shared one.  Distinct kw_clients may be used from
 * distinct threads at once.  kw_proto.h's caveat about cJSON's process-wide
 * error pointer applies.  Nothing here installs signal handlers: writes use
 * MSG_NOSIGNAL, so a daemon that goes away gives -EPIPE, not SIGPIPE.
 *
 * Timeouts: the timeout given to kw_client_connect() (or set later) bounds
 * the connect and each wait for the daemon (to accept bytes, or to send the
 * next ones), not a whole request: a warmup streams its results as keys
 * settle, and kwarmd sends a PROGRESS frame with no results when a warmup
 * has been silent for 2 s (a heartbeat, while a compile is slow), so a
 * timeout of a few seconds is enough once the keys are derived (a
 * deployment of 100,000 keys takes under a second).  A get that compiles
 * gets no heartbeat: it needs a timeout above the longest compile plus its
 * queueing.  A timeout <= 0 waits forever.
 */
#ifndef KW_CLIENT_H
#define KW_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* serving processes in C++ link the C library */
#endif

#include "kw_cuda.h"

/* Bytes of the longest socket path (sockaddr_un.sun_path, NUL included). */
#define KW_CLIENT_PATH_MAX 108
/* Bytes kw_client_last_error() holds, NUL included (longer text is cut). */
#define KW_CLIENT_ERRLEN 1024

typedef struct kw_client kw_client; /* one connection to kwarmd */

/* Connects to the kwarmd socket at path (NULL: kw_client_default_socket()),
 * waiting at most timeout_ms (<= 0: forever) for the daemon to accept.
 * Returns 0 with *out set; -errno of socket()/connect() (-ENOENT: no
 * socket there; -ECONNREFUSED: nobody listening; -EACCES), -ETIMEDOUT,
 * -ENAMETOOLONG (a path that does not fit sun_path is refused, never cut),
 * KW_EINVAL (NULL out or empty path), KW_ENOMEM.  On error *out is
 * untouched and, when err is not NULL, one line naming the path is written
 * to err (errlen bytes, NUL-terminated). */
int kw_client_connect(kw_client **out, const char *path, int timeout_ms,
                      char *err, size_t errlen);

/* Closes the connection and frees c.  NULL is a no-op. */
void kw_client_close(kw_client *c);

/* Changes the timeout of c's later waits (<= 0: forever). */
void kw_client_set_timeout(kw_client *c, int timeout_ms);

/* The socket path c connected to; borrowed, valid until kw_client_close(). */
const char *kw_client_path(const kw_client *c);

/* Writes the default socket path into buf (cap bytes): $KWARM_SOCKET when
 * set and not empty; else /run/kwarm/kwarm.sock for root; else
 * $XDG_RUNTIME_DIR/kwarm.sock when that variable is set and not empty;
 * else /run/kwarm/kwarm.sock.  Returns buf, or NULL when the path does not
 * fit in cap bytes (nothing is cut; KW_CLIENT_PATH_MAX always suffices for
 * a path connect could use).  Reads the environment: not safe against a
 * concurrent setenv(). */
const char *kw_client_default_socket(char *buf, size_t cap);

/* Pings the daemon.  When version is not NULL, copies its version string
 * into it (cap bytes, NUL-terminated).  Returns 0, KW_ENOSPC when the
 * version does not fit in cap (nothing copied), or a code above. */
int kw_client_ping(kw_client *c, char *version, size_t cap);

/* The compile keys of a model: the document of `kwarm keys --json`.
 *   config_json      the text of the model's config.json (a JSON object)
 *   deployment_json  NULL, or a JSON object with the snake_case fields of a
 *                    --deploy file ({"dcp_world": 2, "arch": "sm_90,sm_100",
 *                    "text_config": "/thinker_config", ...})
 *   name             NULL, or the file name kwarmd shows in messages and in
 *                    the document's "model" (default "config.json")
 * On 0, *reply_json is a new NUL-terminated string (free() it).  A bad model
 * or deployment gives the daemon's KW_ECONFIG / KW_EDEPLOY, with the JSON
 * path at fault in kw_client_last_error().  *reply_json untouched on error. */
int kw_client_keys(kw_client *c, const char *config_json,
                   const char *deployment_json, const char *name,
                   char **reply_json);

/* Called for each PROGRESS frame of a warmup with its JSON header
 * {"done": D, "total": T, "results": [{"index" (the key's place in the
 * deployment's keys), "digest", "family", "arch",
 * "status": "hit"|"remote_hit"|"compiled"|"failed"|"cancelled", and for a
 * failed key "error" and "log" (the NVRTC log, at most 64 KiB)}, ...]}:
 * up to 256 results a frame.  progress_json is borrowed for the call. */
typedef void (*kw_client_progress_fn)(const char *progress_json, void *arg);

/* Warms the daemon's cache for a model (arguments as kw_client_keys()):
 * every key not cached is compiled, cb (may be NULL) is called per
 * PROGRESS frame as keys settle, and on 0 *result_json is a new string
 * (free() it): {"keys", "hits", "remote_hits", "compiled", "failed",
 * "cancelled", "seconds", "manifest": [every result, in key order]}.  Keys
 * that fail to compile, or are cancelled because kwarmd stopped, do not
 * make the call fail: check "failed" and "cancelled".  *result_json
 * untouched on error. */
int kw_client_warmup(kw_client *c, const char *config_json,
                     const char *deployment_json, const char *name,
                     kw_client_progress_fn cb, void *arg, char **result_json);

/* As kw_client_warmup(), then, once every key is cached, records the
 * deployment's digests in kwarmd's cache as the pin set `pin` (never
 * evicted for size until `kwarm unpin`); the result gains "pinned": true,
 * or false when a key failed or the set could not be recorded.  Before
 * anything is compiled kwarmd checks that the deployment fits beside the
 * pinned entries, and fails the call with KW_ENOSPC otherwise. */
int kw_client_warmup_pin(kw_client *c, const char *config_json,
                         const char *deployment_json, const char *name,
                         const char *pin, kw_client_progress_fn cb, void *arg,
                         char **result_json);

/* Starts a warmup that kwarmd finishes whatever this client does
 * ("detach": true in the request): kwarmd checks the model, deployment
 * and pin (pin may be NULL; as kw_client_warmup_pin()) and starts
 * compiling; the call returns at its first frame, with *accepted_json a
 * new string (free() it): that PROGRESS header ({"done", "total",
 * "results"}), or the RESULT when the warmup ended at once.  The
 * connection is then closed, leaving the rest of the stream to kwarmd
 * (kw_client_last_error() says so; connect again for more requests): its
 * cache, stats and log tell the outcome.  Bad input fails as
 * kw_client_warmup() does, with nothing started. */
int kw_client_warmup_detached(kw_client *c, const char *config_json,
                              const char *deployment_json, const char *name,
                              const char *pin, char **accepted_json);

/* One kernel fetched from the daemon.  Initialise to {0}; the cubin is
 * owned by the struct: kw_client_kernel_destroy() frees it. */
typedef struct kw_client_kernel {
    uint8_t *cubin;  /* len bytes of CUDA ELF (for cuModuleLoadData) */
    size_t len;
    char entry[256]; /* the lowered entry name, for cuModuleGetFunction */
    char family[48];
    char arch[16];
    char digest[65]; /* lowercase hex */
    bool compiled;   /* compiled for this request (a miss) */
} kw_client_kernel;

/* Fetches the cubin of the key whose digest is digest_hex: 64 hex digits,
 * or a prefix of at least 8 that one cached digest starts (an ambiguous
 * one is KW_EAMBIGUOUS, the candidates in kw_client_last_error()).
 * A digest names no key the daemon could compile, so a miss is always
 * KW_ENOTFOUND; compile is sent for symmetry and ignored by kwarmd today.
 * Returns 0 with *out filled (any previous contents are overwritten, not
 * freed), or a code above with *out zeroed. */
int kw_client_get(kw_client *c, const char *digest_hex, bool compile,
                  kw_client_kernel *out);

/* Fetches the cubin of a key given as family name, fields (a JSON object
 * with every field of the family, e.g. {"block_size": 64, "single_tile":
 * true, ...}) and arch ("sm_90").  With compile, a miss is compiled first
 * (the call waits for it; KW_ENVRTC with the NVRTC log in
 * kw_client_last_error() when it fails); without, a miss is KW_ENOTFOUND.
 * An unknown family or a missing field is KW_EINVAL from the daemon.
 * *out as in kw_client_get(). */
int kw_client_get_key(kw_client *c, const char *family,
                      const char *fields_json, const char *arch, bool compile,
                      kw_client_kernel *out);

/* As kw_client_get_key(), for a serving process whose own loaded set
 * lacked the key: miss is "runtime" (the call is served: compile as
 * asked) or "capture" (the call was refused while its stream captured a
 * CUDA graph; pass compile false).  kwarmd records the get in its miss
 * audit (`kwarm misses`) with that kind and this process's pid even when
 * its cache holds the key.  KW_EINVAL for another miss; else as
 * kw_client_get_key(). */
int kw_client_get_key_as_miss(kw_client *c, const char *family,
                              const char *fields_json, const char *arch,
                              bool compile, const char *miss,
                              kw_client_kernel *out);

/* Frees k's cubin and zeroes *k.  NULL is a no-op. */
void kw_client_kernel_destroy(kw_client_kernel *k);

/* The daemon's statistics as a new JSON string (free() it): the cache's
 * fields (entries, bytes, max_size, hits, misses, compiles,
 * compile_failures, evictions, corrupt) and the daemon's counters
 * (connections, requests, compiles_started, compiles_inflight,
 * protocol_errors, refused).  *reply_json untouched on error. */
int kw_client_stats(kw_client *c, char **reply_json);

/* Removes the entry digest_hex from the daemon's cache; *evicted (may be
 * NULL) says whether there was one.  A missing entry is not an error. */
int kw_client_evict(kw_client *c, const char *digest_hex, bool *evicted);

/* The cache administration requests behind `kwarm ls`, `evict`, `pins`,
 * `unpin` and `resize --socket`: what is "ls", "evict", "pins", "unpin"
 * or "resize", header_json its JSON object:
 *   ls      {"family"?, "pinned"?: NAME}        -> {"entries", "count", "bytes"}
 *   evict   {"match": {"digest"? (a unique prefix of >= 8 hex digits),
 *            "family"?, "unpinned"?, "before"? (Unix s)}, "force"?}
 *                                               -> {"entries", "removed", "count", "bytes"}
 *   pins    {}                                  -> {"pins": [...]}
 *   unpin   {"name"}                            -> {"name", "digests", "entries", "bytes"}
 *   resize  {"max_size"}                        -> {"max_size", "previous", "evicted", ...}
 * The replies are the documents `--json` prints for --cache.  On 0,
 * *reply_json is a new string (free() it). */
int kw_client_admin(kw_client *c, const char *what, const char *header_json,
                    char **reply_json);

/* The miss audit: the gets kwarmd could not answer from its cache in
 * the last since_s seconds (0: every one it keeps, up to 10,000).  On 0,
 * *result_json is a new string (free() it): {"count", "since", "misses":
 * [{"time", "uid", "pid", "digest", "outcome": "compiled" | "failed" |
 * "not compiled" | "remote_hit" | "cancelled" | "cached" (a serving
 * process's miss the cache answered), "kind"?: "runtime" | "capture" (a
 * serving process's own miss, kw_client_get_key_as_miss()), "key"?:
 * {"family", "arch",
 * "fields", "digest"}, "nearest": null | {"digest", "differ": [{"field",
 * "requested", "cached"}], "pins": [...]}}]}, oldest first.  "nearest" is
 * the cached key of the same family and arch with the fewest differing
 * fields. */
int kw_client_misses(kw_client *c, uint64_t since_s, char **result_json);

/* The text of the last failure on c ("" when none yet): the daemon's
 * ERROR text (an NVRTC log may span lines), or the I/O or protocol
 * failure.  Borrowed: valid until the next call on c.  NULL c gives "". */
const char *kw_client_last_error(const kw_client *c);

/* For serving processes: fetches digest_hex (kw_client_get()) and loads it
 * with kw_cuda_load() into cuda's context (the calling thread must have it
 * current: see kw_cuda.h), returning a launchable function in *fn
 * (kw_cuda_unload() it before kw_cuda_close()).  Returns 0, a code of
 * kw_client_get(), or kw_cuda_load()'s KW_EINVAL / KW_ECUDA with the
 * driver's text copied into kw_client_last_error().  *fn untouched on
 * error. */
int kw_client_load(kw_client *c, kw_cuda *cuda, const char *digest_hex,
                   kw_cuda_fn **fn);

#ifdef __cplusplus
}
#endif

#endif /* KW_CLIENT_H */
