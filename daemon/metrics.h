/* metrics.h: kwarmd's Prometheus metrics (kw__metrics_; not API).
 *
 * `--metrics-listen HOST:PORT` serves GET /metrics in the text exposition
 * format (0.0.4) from libmicrohttpd's own thread; `kwarm stats
 * --prometheus` gets the same text through a stats request.  The text is
 * built from the sources `kwarm stats --json` reads (the cache's, warm's
 * and the fleet tier's thread-safe stats calls) and from the loop's
 * counters, which are _Atomic for this: the HTTP thread never touches a uv
 * handle or connection state.
 */
#ifndef KW_DAEMON_METRICS_H
#define KW_DAEMON_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kw__daemon;



/* Counts a request of type that ended, ok or not (loop thread). */
void kw__metrics_request(struct kw__daemon *d, uint16_t type, bool ok);

/* Counts a get that ended after ns nanoseconds (loop thread). */
void kw__metrics_get(struct kw__daemon *d, uint64_t ns);

/* The metrics text of these snapshots and the loop's counters now
 * (malloc'd, NUL-terminated, length in *len); any thread.  0 or
 * KW_ENOMEM.  The stats request uses it to send the text of the same
 * snapshots as its numbers. */
struct kw_cache_stats;
struct kw_warm_stats;
struct kw_remote_stats;
int kw__metrics_format(struct kw__daemon *d, const struct kw_cache_stats *st,
                       const struct kw_warm_stats *ws,
                       const struct kw_remote_stats *rs, char **out,
                       size_t *len);

/* The metrics text now (malloc'd, NUL-terminated, length in *len).  Any
 * thread: reads atomics and calls the thread-safe stats functions (the
 * cache's may wait for a flush).  0, KW_ENOMEM, or the cache's code. */
int kw__metrics_text(struct kw__daemon *d, char **out, size_t *len);

/* Starts the HTTP server when opts->metrics_listen is set (binding that
 * address exactly); 0, or a code with a reason naming the flag in err. */
int kw__metrics_start(struct kw__daemon *d, char *err, size_t errlen);

/* Stops the HTTP server and waits for its thread: no handler runs after
 * it returns.  Call before the warm pipeline or the cache closes.
 * Idempotent. */
void kw__metrics_stop(struct kw__daemon *d);

#endif /* KW_DAEMON_METRICS_H */
