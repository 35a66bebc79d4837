/* compiler.h: kwarmd's compile service (kw__compiler_, daemon-internal).
 *
 * Compiles run on dedicated worker threads, never on the loop thread nor
 * on libuv's shared pool (fs and DNS use it).  A request for a key that is
 * already being compiled joins that compile (single-flight): N requests
 * for one missing key cause one compile.  Workers store the cubin in the
 * cache themselves, so LMDB writes stay off the loop thread; results come
 * back through a mutex-protected queue and one uv_async_t whose callback
 * drains the whole queue (sends coalesce).
 *
 * Every function except the workers' own runs on the loop thread.
 */
#ifndef KW_DAEMON_COMPILER_H
#define KW_DAEMON_COMPILER_H

#include <stdint.h>

#include <uv.h>

#include "kw_cache.h"
#include "kw_keys.h"
#include "kw_remote.h"

typedef struct kw__compiler kw__compiler;

/* rc of a compile callback when the fleet tier had the entry: it is now in
 * the local cache and nothing was compiled. */
#define KW__COMPILE_FETCHED 1

/* Called on the loop thread when the compile a request joined is over:
 * rc is 0 (compiled; the entry is now in the cache), KW__COMPILE_FETCHED
 * (fetched from the fleet tier into the cache) or a negative code; log is
 * the NVRTC log on failure (borrowed for the call), else NULL. */
typedef void (*kw__compile_cb)(int rc, const char *log, void *arg);

/* Starts `jobs` worker threads compiling into cache.  remote (borrowed,
 * may be NULL: no fleet tier) must outlive the compiler: before compiling
 * a key a worker asks the fleet (kw_remote_begin: fetch, or the fleet's
 * lease, or a bounded wait on its holder), and after a compile it writes
 * the entry back (kw_remote_end).  Returns 0 or a negative code; *out
 * untouched on error. */
int kw__compiler_start(kw__compiler **out, uv_loop_t *loop, kw_cache *cache,
                       kw_remote *remote, unsigned jobs);

/* Asks for key k to be compiled into the cache; cb(arg) is called once,
 * later, on the loop thread (never from inside this call).  Returns 0, or
 * KW_ENOMEM / -ECANCELED (stopping) without calling cb. */
int kw__compiler_submit(kw__compiler *c, const kw_keys_key *k,
                        kw__compile_cb cb, void *arg);

/* Compiles started so far (one per distinct key in flight at a time),
 * less the keys the fleet tier resolved without a compile (known once
 * their flight completes). */
uint64_t kw__compiler_started(const kw__compiler *c);

/* Keys queued or compiling now. */
size_t kw__compiler_inflight(const kw__compiler *c);

/* Stops: queued keys are cancelled (their callbacks get -ECANCELED),
 * compiles under way finish and are stored, workers are joined, the async
 * handle is closed; done() is called on the loop thread once everything is
 * released.  Run the loop until then. */
void kw__compiler_stop(kw__compiler *c, void (*done)(void *arg), void *arg);

#endif /* KW_DAEMON_COMPILER_H */
