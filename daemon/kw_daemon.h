/* kw_daemon.h: kwarmd, the compile-cache daemon (prefix kw_daemon_).
 *
 * Serves the wire protocol of client/kw_proto.h on a Unix socket: ping,
 * keys and warmup (both streamed in bounded frames, then counts), get (by
 * digest or family + fields + arch, compiling on a miss unless told not
 * to), stats and evict.  One libuv loop thread owns every connection and
 * does frame I/O only; keys, warmup, stats and evict run on job threads,
 * and every compile goes through the warm pipeline (warm/kw_warm.h) to
 * worker processes.
 */
#ifndef KW_DAEMON_H
#define KW_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#define KW_DAEMON_MAX_ALLOW 32 /* --allow-uid / --allow-gid entries */

/* What kwarmd runs with: defaults from kw_daemon_opts_init(), then the
 * --config file, then flags (daemon/main.c). */
typedef struct kw_daemon_opts {
    char socket_path[108];     /* sun_path's size; longer is refused */
    char cache_dir[4096];
    unsigned jobs;             /* compile worker processes; default: the cores */
    unsigned compile_timeout_ms; /* per compile; default 120 s */
    uint64_t compile_mem_limit;  /* bytes per worker; default 4 GiB */
    char compile_helper[4096];   /* kwarm-compile; "": found beside kwarmd */
    uint64_t max_size;         /* cache size limit in bytes, for a cache
                                  created now (0: not given, 1 GiB); an
                                  existing cache keeps its stored limit,
                                  and kwarmd warns when this differs */
    unsigned idle_timeout_ms;  /* a silent connection is closed after it */
    uint64_t max_output;       /* reply bytes queued per connection before
                                  kwarmd stops reading it, and the budget
                                  of each streamed reply: its producer
                                  waits past it (16 MiB) */
    unsigned max_connections;  /* open connections; the next is refused */
    uint64_t max_keys_in_flight; /* keys of keys/warmup requests under way
                                  over the whole daemon (2,000,000); a
                                  request that would pass it is refused
                                  with an error naming the flag */
    unsigned loops;            /* threads serving connections (a quarter
                                  of the cores, 2 to 8) */
    unsigned max_held_reads;   /* replies written from the cache's map that
                                  may hold a read snapshot at once (64);
                                  past it a reply's unsent rest is copied */
    unsigned held_read_timeout_ms; /* a reply holding a snapshot longer
                                  closes its connection (5000) */
    bool deny_root;            /* refuse uid 0 too (root is allowed by
                                  default, whatever the allowlist) */
    int log_level;             /* syslog-style: 3 error .. 7 debug (6) */
    bool read_only;            /* serve hits only, never write the cache
                                  (also chosen when it is not writable) */
    uid_t allow_uid[KW_DAEMON_MAX_ALLOW];
    size_t nallow_uid;         /* none of either: the daemon's own uid */
    gid_t allow_gid[KW_DAEMON_MAX_ALLOW];
    size_t nallow_gid;
    unsigned socket_mode;      /* 0660 */
    /* Fleet tier (cache/kw_remote.h); remote_url "" : none. */
    char remote_url[256];      /* redis://HOST:PORT[/DB] */
    char remote_key_file[4096]; /* 32-byte fleet key [+ password line] */
    unsigned remote_timeout_ms; /* per Redis call; 0: the default */
    unsigned remote_lease_ms;   /* fleet compile lease; 0: the default */
    /* Prometheus endpoint: "A.B.C.D:PORT" or "[IPV6]:PORT"; "": off. */
    char metrics_listen[64];
} kw_daemon_opts;

/* Parses a --metrics-listen value (numeric A.B.C.D:PORT or [IPV6]:PORT,
 * PORT 1..65535) into *out and *len.  0 or KW_EINVAL. */
int kw_daemon_metrics_parse(const char *v, struct sockaddr_storage *out,
                            socklen_t *len);

/* Fills the defaults (socket /run/kwarm/kwarm.sock, or
 * $XDG_RUNTIME_DIR/kwarm.sock for a non-root user; cache
 * /var/cache/kwarm, or $XDG_CACHE_HOME/kwarm). */
void kw_daemon_opts_init(kw_daemon_opts *o);

/* Runs kwarmd until SIGTERM or SIGINT: takes the socket from systemd
 * (sd_listen_fds) or binds it, opens the cache, starts the warm pipeline,
 * notifies systemd READY=1.  On a signal: stops accepting, cancels queued
 * compiles and finishes running ones, closes connections and the cache.
 * Returns 0 after a clean stop, or a negative code with a one-line
 * reason in err (socket in use, cache unusable...). */
int kw_daemon_run(const kw_daemon_opts *o, char *err, size_t errlen);

#endif /* KW_DAEMON_H */
