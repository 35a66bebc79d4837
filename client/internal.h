/* internal.h: what client.c (connection and frame I/O) shares with
 * client_req.c (the requests).  Not installed. */
#ifndef KW_CLIENT_INTERNAL_H
#define KW_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kw_client.h"
#include "kw_proto.h"

struct kw_client {
    int fd;         /* -1 once closed after a failure */
    int timeout_ms; /* per wait; <= 0: none */
    uint8_t *buf;   /* received bytes [0, len) of cap */
    size_t len, cap;
    size_t used; /* bytes of the frame last handed out, dropped next read */
    char path[KW_CLIENT_PATH_MAX];
    char err[KW_CLIENT_ERRLEN];
};

/* What a streamed reply (keys, warmup) gathers from its PROGRESS frames:
 * the items of each frame's array `member`, in order. */
typedef struct stream {
    const char *member;        /* "keys" or "results" */
    cJSON *items;              /* an array, owned */
    kw_client_progress_fn cb;  /* warmup: each frame's header as text */
    void *arg;
} stream;

/* Formats the last-error text of c and returns rc. */
__attribute__((format(printf, 3, 4))) int
kw__client_fail(kw_client *c, int rc, const char *fmt, ...);

/* kw__client_fail(), and closes the connection: after an I/O or protocol
 * failure the stream is at an unknown point, so no later request could be
 * trusted. */
__attribute__((format(printf, 3, 4))) int
kw__client_broken(kw_client *c, int rc, const char *fmt, ...);

/* Sends a request of type with header hdr (NULL: {}) and reads up to its
 * final reply, which must be of type want; PROGRESS frames (keys and
 * warmup only: st not NULL) are gathered into st.  want PROGRESS (st
 * NULL) takes the first PROGRESS or RESULT as the reply.  Returns 0 with *reply
 * set (kw_msg_destroy() it), the daemon's ERROR as a code, or a failure. */
int kw__client_request(kw_client *c, uint16_t type, const cJSON *hdr,
                       uint16_t want, stream *st, kw_msg *reply);

/* ---- kw_ops (ops.c, ops_load.c) -------------------------------------- */

#include <pthread.h>
#include <time.h>

#include "kw_ops.h"

/* One loaded key: its family and fields (the table's key), its kernel. */
typedef struct kw__ops_entry {
    int fam; /* -1: an empty slot */
    int64_t fields[KW_LAUNCH_MAX_FIELDS];
    kw_cuda_fn *fn;    /* NULL with a stand-in device */
    size_t cubin_len;  /* bytes fetched */
    char digest[65];
} kw__ops_entry;

struct kw_ops {
    kw_client *client;     /* owned; used only by loads and misses */
    int timeout_ms;        /* the client's waits (kw_ops_opts.timeout_ms) */
    kw_cuda *cuda;         /* borrowed; NULL with a stand-in device */
    kw_ops_device device;  /* the stand-in, when cuda is NULL */
    kw_launch_deploy deploy;
    char arch[16];
    unsigned sm_count;
    kw_ops_log_fn log;
    void *log_ctx;
    /* lock guards table, cap, count, stats and err; miss_lock serialises
     * misses (a fetch can take a compile's time: lookups go on meanwhile,
     * under lock alone). */
    pthread_mutex_t lock, miss_lock;
    kw__ops_entry *table; /* open addressing, cap a power of two */
    size_t cap, count;
    /* Counters (kw_ops_stats), atomic: the launch path takes no lock for
     * them. */
    _Atomic uint64_t loaded, runtime_misses, capture_misses, launches;
    double load_ms;
    char err[1024];
};

/* Milliseconds of CLOCK_MONOTONIC, for the load's and a miss's times. */
static inline double kw__ops_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Finds (fam, fields) in o's table: the entry, or NULL.  Caller holds
 * o->lock. */
kw__ops_entry *kw__ops_find_locked(kw_ops *o, int fam, const int64_t *fields);

/* Adds a copy of e (growing the table as needed).  KW_ENOMEM.  Caller
 * holds o->lock. */
int kw__ops_insert_locked(kw_ops *o, const kw__ops_entry *e);

/* Fetches (fam, fields) from kwarmd as a runtime miss (compiling it
 * unless compile is false) and loads it into e.  0 or a client / CUDA
 * code, with the reason in err. */
int kw__ops_fetch(kw_ops *o, int fam, const int64_t *fields, bool compile,
                  kw__ops_entry *e, char *err, size_t errlen);

/* Tells kwarmd (its miss audit) that (fam, fields) missed while a stream
 * captured; waits at most 2 s, fetches nothing it keeps. */
void kw__ops_report_capture(kw_ops *o, int fam, const int64_t *fields);

/* Writes the key as JSON fields ({"topk": 2048, "windowed": true}) into
 * buf.  0 or KW_ENOSPC. */
int kw__ops_fields_json(int fam, const int64_t *fields, char *buf,
                        size_t cap);

#endif /* KW_CLIENT_INTERNAL_H */
