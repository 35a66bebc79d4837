/* kw_ops.h: a deployment's kernels as operations (prefix kw_ops_).
 *
 * What a serving process turns on: kw_ops_load() warms the deployment
 * through kwarmd (compiling what is missing), fetches every key of this
 * process's rank and loads it into the current CUDA context, all before
 * any graph capture.  kw_ops_run() then takes one call's arguments
 * (device pointers and sizes, kw_launch.h), dispatches them to the key
 * that serves them, checks them against that key and launches its kernel
 * on the caller's stream.  docs/spec/launch.md is the contract in prose.
 *
 * A call whose key is not loaded is a runtime miss:
 *   - outside graph capture it is fetched from kwarmd (which compiles it
 *     and records the miss, with this process's pid, in its miss audit),
 *     loaded, counted and reported once through opts.log;
 *   - while the stream captures, kw_ops_run() returns KW_ECAPTURE with
 *     the key and the deployment setting that would have warmed it in
 *     kw_ops_last_error(), tells kwarmd (its miss audit records a
 *     "capture" miss; nothing is compiled, the wait is at most 2 s), and
 *     loads nothing.
 *
 * Threads: kw_ops_run() may be called from any thread that has the
 * handle's context current (kw_cuda_make_current()); lookups take one
 * mutex, misses another, so a miss never stalls the other calls' lookups
 * for longer than an insert.  kw_ops_last_error() is per handle: read it
 * with kw_ops_last_error_copy() when threads share a handle.
 */
#ifndef KW_OPS_H
#define KW_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kw_cuda.h"
#include "kw_launch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kw_ops kw_ops;

/* A stand-in for the GPU (tests, dry runs on hosts without a driver):
 * launch runs the key's kernel (args as cuLaunchKernel's kernelParams),
 * capturing says whether stream is capturing a graph. */
typedef struct kw_ops_device {
    void *ctx;
    int (*launch)(void *ctx, int fam, const int64_t *fields,
                  const kw_launch_geo *geo, void **args, uintptr_t stream);
    int (*capturing)(void *ctx, uintptr_t stream, bool *out);
} kw_ops_device;

/* Receives one line per event worth a log line (a runtime miss, once per
 * key); line is borrowed for the call. */
typedef void (*kw_ops_log_fn)(void *ctx, const char *line);

typedef struct kw_ops_opts {
    const char *socket;          /* NULL: kw_client_default_socket() */
    int timeout_ms;              /* each wait on kwarmd; 0: 60 s; < 0: none */
    const char *config_json;     /* the model's config.json, as text */
    const char *deployment_json; /* NULL, or a --deploy object naming one
                                    rank ("dcp_rank": R when dcp_world > 1) */
    const char *name;            /* NULL: "config.json" (for messages) */
    kw_cuda *cuda;               /* the device to load into (its context
                                    current on this thread); NULL: device */
    const char *arch;            /* NULL: the device's, sm_<major><minor> */
    const kw_ops_device *device; /* used when cuda is NULL (arch required) */
    bool no_warmup;              /* fetch only: do not compile misses */
    kw_ops_log_fn log;           /* NULL: no log lines */
    void *log_ctx;
} kw_ops_opts;

/* Connects to kwarmd, reads the deployment's keys, fetches and loads
 * every key of opts->arch into opts->cuda (or records its cubin's size
 * when a stand-in device is given); when kwarmd lacks some, warms the
 * deployment (it compiles them; with no_warmup the load fails with
 * KW_ENOTFOUND naming the first) and fetches those.  So a warm kwarmd
 * costs a keys request and one get per key.  Returns 0 with *out
 * set, or: KW_EINVAL (a missing option; a deployment of several ranks
 * with dcp_rank "all"; an arch the deployment does not list), KW_ECONFIG
 * / KW_EDEPLOY (the daemon's verdict on the model or deployment), KW_ENVRTC
 * (a key failed to compile), a client code (kw_client.h) or KW_ECUDA.  On
 * error *out is untouched and one line saying what failed (naming the
 * option, key or JSON path) is written to err (errlen bytes, may be
 * NULL). */
int kw_ops_load(kw_ops **out, const kw_ops_opts *opts, char *err,
                size_t errlen);

/* Unloads every kernel and closes the connection.  Synchronise first if
 * a launch may still run.  NULL is a no-op. */
void kw_ops_free(kw_ops *o);

/* Runs op on stream (a CUstream; 0 is the legacy default stream):
 * dispatch, lookup, checks, geometry, launch (asynchronous).  Returns 0;
 * KW_EINVAL when the call is wrong (kw_launch_dispatch() and
 * kw_launch_check(): the argument and its allowed values in
 * kw_ops_last_error()); KW_ECAPTURE for a runtime miss while stream
 * captures; a fetch's code for a runtime miss kwarmd cannot serve; or
 * KW_ECUDA from the launch.  Nothing is launched unless it returns 0. */
int kw_ops_run(kw_ops *o, kw_launch_op op, const kw_launch_call *call,
               uintptr_t stream);

/* The key (fields) kw_ops_run() would launch for call, and whether it is
 * loaded.  0 or KW_EINVAL, as kw_launch_dispatch(). */
int kw_ops_dispatch(kw_ops *o, kw_launch_op op, const kw_launch_call *call,
                    int64_t *fields, bool *loaded);

/* The deployment's settings as dispatch reads them; borrowed, valid until
 * kw_ops_free(). */
const kw_launch_deploy *kw_ops_deploy(const kw_ops *o);

/* Reads the deployment dispatch needs from a keys document (`kwarm keys
 * --json`, kw_client_keys()): its settings (index_topk, the indexer's
 * heads, the compress ratios) and resolved deployment.  The document's
 * dcp_rank must be one rank (or dcp_world 1).  0, or KW_EPROTO /
 * KW_EINVAL / KW_E2BIG with the member at fault in err. */
int kw_ops_deploy_from_keys(const char *keys_json, kw_launch_deploy *d,
                            char *err, size_t errlen);

/* The arch loaded (sm_90); borrowed, valid until kw_ops_free(). */
const char *kw_ops_arch(const kw_ops *o);

typedef struct kw_ops_stats {
    uint64_t loaded;         /* keys loaded (at load time and since) */
    uint64_t runtime_misses; /* calls whose key was fetched after load */
    uint64_t capture_misses; /* calls refused while their stream captured */
    uint64_t launches;       /* kernels launched (empty calls excluded) */
    double load_ms;          /* kw_ops_load(): warmup, fetch and load */
} kw_ops_stats;

/* Counters of o (a snapshot). */
void kw_ops_stats_get(kw_ops *o, kw_ops_stats *out);

/* Walks the loaded keys: fn(ctx, family, fields, digest hex) for each;
 * returns how many.  Not while another thread may miss. */
size_t kw_ops_each(kw_ops *o,
                   void (*fn)(void *ctx, int fam, const int64_t *fields,
                              const char *digest),
                   void *ctx);

/* The text of the last failure on o ("" when none); borrowed, valid until
 * the next call on o from any thread.  _copy copies it under o's lock. */
const char *kw_ops_last_error(const kw_ops *o);
void kw_ops_last_error_copy(kw_ops *o, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KW_OPS_H */
