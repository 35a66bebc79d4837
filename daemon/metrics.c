/* metrics.c: the Prometheus text of kwarmd's counters, and the HTTP
 * server (libmicrohttpd) that serves it at /metrics.
 *
 * Names follow the Prometheus conventions: a kwarm_ prefix, the unit in
 * the name, _total on counters, one HELP and TYPE line each.  Every value
 * comes from the same place as the `kwarm stats --json` member README.md
 * pairs it with, so the two agree.  libmicrohttpd runs its own thread
 * (epoll, not select: kwarmd's fds go past FD_SETSIZE with many clients);
 * its handler only reads atomics and calls thread-safe stats functions.
 */
#include "metrics.h"

#include "internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "kw_err.h"
#include "kw_parse.h"
#include "log.h"

#define HTTP_CONN_LIMIT 32     /* scrapers at once; more are refused */
#define HTTP_TIMEOUT_S 10      /* an idle HTTP connection is closed */
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Get latency bounds, seconds: a hit is tens of microseconds, a get that
 * compiles takes seconds. */
static const double get_bounds[KW__GET_BUCKETS] = {
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05,
    0.25, 1, 5, 30};

static const char *const req_names[KW__REQ_TYPES] = {
    "ping", "keys", "warmup", "get", "stats", "evict", "misses", "ls", "pins", "unpin", "resize"};
/* A new request type must be named here, or its requests go uncounted and
 * the metrics' sum stops matching `requests`. */
_Static_assert(KW_PROTO_RESIZE == KW__REQ_TYPES, "name every request type");

void kw__metrics_request(kw__daemon *d, uint16_t type, bool ok)
{
    if (type >= 1 && type <= KW__REQ_TYPES)
        atomic_fetch_add(&d->mc.requests[type - 1][ok ? 0 : 1], 1);
}

void kw__metrics_get(kw__daemon *d, uint64_t ns)
{
    size_t b = 0;
    while (b < KW__GET_BUCKETS && (double)ns / 1e9 > get_bounds[b])
        b++;
    atomic_fetch_add(&d->mc.get_buckets[b], 1);
    atomic_fetch_add(&d->mc.get_ns, ns);
}

/* ---- the text ----------------------------------------------------------- */

static void head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One metric without labels. */
static void one(FILE *f, const char *name, const char *type, const char *help,
                uint64_t v)
{
    head(f, name, type, help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

/* A histogram from per-bucket counts (nb bounds, then +Inf); its _count
 * is the buckets' total, so the two always agree. */
static void histogram(FILE *f, const char *name, const char *help,
                      const double *bound, size_t nb, const uint64_t *bucket,
                      double sum)
{
    uint64_t cum = 0;
    head(f, name, "histogram", help);
    for (size_t i = 0; i < nb; i++) {
        cum += bucket[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bound[i],
                (unsigned long long)cum);
    }
    cum += bucket[nb];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n",
            name, (unsigned long long)cum, name, sum, name,
            (unsigned long long)cum);
}

/* The loop's own counters: requests, connections, refusals. */
static void loop_metrics(FILE *f, kw__daemon *d)
{
    head(f, "kwarm_build_info", "gauge", "kwarmd's version (always 1)");
    fprintf(f, "kwarm_build_info{version=\"%s\"} 1\n", d->version);
    head(f, "kwarm_requests_total", "counter",
         "Requests answered, by type; result error: an error reply, or a "
         "get whose client left before its compile ended");
    for (size_t t = 0; t < KW__REQ_TYPES; t++)
        for (size_t ok = 0; ok < 2; ok++)
            fprintf(f, "kwarm_requests_total{type=\"%s\",result=\"%s\"} %llu\n",
                    req_names[t], ok == 0 ? "ok" : "error",
                    (unsigned long long)atomic_load(&d->mc.requests[t][ok]));
    one(f, "kwarm_protocol_errors_total", "counter",
        "Connections closed for a malformed frame",
        atomic_load(&d->protocol_errors));
    head(f, "kwarm_refused_connections_total", "counter",
         "Connections refused: by the uid/gid check, or over --max-connections");
    fprintf(f, "kwarm_refused_connections_total{reason=\"peer\"} %llu\n"
            "kwarm_refused_connections_total{reason=\"full\"} %llu\n",
            (unsigned long long)atomic_load(&d->refused),
            (unsigned long long)atomic_load(&d->refused_full));
    one(f, "kwarm_connections", "gauge", "Open client connections",
        atomic_load(&d->nconns));
    one(f, "kwarm_held_reads", "gauge", "Replies being written straight "
        "from the cache's map, each holding a read snapshot",
        atomic_load(&d->nheld));
    one(f, "kwarm_held_read_timeouts_total", "counter", "Connections closed "
        "because a reply held a snapshot past --held-read-timeout",
        atomic_load(&d->held_expired));
    one(f, "kwarm_held_reads_copied_total", "counter", "Replies whose unsent "
        "rest was copied out because --max-held-reads snapshots were held",
        atomic_load(&d->held_copied));
    uint64_t b[KW__GET_BUCKETS + 1];
    for (size_t i = 0; i <= KW__GET_BUCKETS; i++)
        b[i] = atomic_load(&d->mc.get_buckets[i]);
    histogram(f, "kwarm_get_duration_seconds",
              "Gets from request to reply (hits, and misses that compiled)",
              get_bounds, KW__GET_BUCKETS, b,
              (double)atomic_load(&d->mc.get_ns) / 1e9);
}

/* The cache's entries, sizes and persistent counters. */
static void cache_metrics(FILE *f, const kw_cache_stats *st)
{
    one(f, "kwarm_cache_entries", "gauge", "Cached entries", st->entries);
    one(f, "kwarm_cache_bytes", "gauge", "Cubin bytes cached", st->bytes);
    one(f, "kwarm_cache_max_bytes", "gauge", "The cache's size limit",
        st->max_size);
    one(f, "kwarm_cache_pinned_entries", "gauge", "Entries pinned", st->pinned_entries);
    one(f, "kwarm_cache_pinned_bytes", "gauge", "Cubin bytes pinned", st->pinned_bytes);
    one(f, "kwarm_cache_hits_total", "counter",
        "Lookups that found a verified entry (kept across restarts)", st->hits);
    one(f, "kwarm_cache_misses_total", "counter",
        "Lookups that found none (kept across restarts)", st->misses);
    one(f, "kwarm_cache_evictions_total", "counter",
        "Entries evicted for size (kept across restarts)", st->evictions);
    one(f, "kwarm_cache_corrupt_total", "counter",
        "Entries that failed their checksum and were removed", st->corrupt);
}

/* Seconds since the epoch at which this process started: its start time
 * in clock ticks after boot (/proc/self/stat field 22) plus the boot
 * time (/proc/stat btime), as Prometheus' client libraries compute it.
 * 0 when /proc cannot tell. */
static double start_time_seconds(void)
{
    char buf[1024];
    unsigned long long ticks = 0, btime = 0;
    FILE *f = fopen("/proc/self/stat", "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    /* fields after the command name, which may hold spaces: from ')' */
    const char *p = strrchr(buf, ')');
    for (int field = 2; p != NULL && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (p == NULL || sscanf(p, " %llu", &ticks) != 1)
        return 0;
    if ((f = fopen("/proc/stat", "re")) == NULL)
        return 0;
    while (fgets(buf, sizeof buf, f) != NULL &&
           sscanf(buf, "btime %llu", &btime) != 1)
        ;
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    return btime && hz > 0 ? (double)btime + (double)ticks / (double)hz : 0;
}

/* Resident bytes (/proc/self/statm's second field, in pages); 0 when
 * unknown. */
static uint64_t resident_bytes(void)
{
    unsigned long long size = 0, pages = 0;
    FILE *f = fopen("/proc/self/statm", "re");
    int got = f ? fscanf(f, "%llu %llu", &size, &pages) : 0;
    if (f)
        fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return got == 2 && page > 0 ? pages * (uint64_t)page : 0;
}

/* Open file descriptors: the entries of /proc/self/fd, less the one
 * opendir holds while counting. */
static uint64_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    uint64_t n = 0;
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n > 0 ? n - 1 : 0;
}

/* The standard process_* series of Prometheus' client libraries, so the
 * usual dashboards and alerts (restarts, memory, fd leaks) work. */
static void process_metrics(FILE *f)
{
    head(f, "process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds");
    fprintf(f, "process_start_time_seconds %.2f\n", start_time_seconds());
    one(f, "process_resident_memory_bytes", "gauge",
        "Resident memory size in bytes", resident_bytes());
    one(f, "process_open_fds", "gauge", "Number of open file descriptors",
        open_fds());
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        one(f, "process_max_fds", "gauge",
            "Maximum number of open file descriptors", (uint64_t)rl.rlim_cur);
}

/* The warm pipeline: keys, compiles by family and result, gauges. */
static void warm_metrics(FILE *f, kw__daemon *d, const kw_warm_stats *ws)
{
    one(f, "kwarm_warm_keys_total", "counter",
        "Keys submitted to the warm pipeline", ws->keys);
    one(f, "kwarm_warm_hits_total", "counter", "Of those, found locally", ws->hits);
    one(f, "kwarm_warm_misses_total", "counter", "Of those, not found locally",
        ws->misses);
    one(f, "kwarm_warm_joined_total", "counter",
        "Misses that joined a flight under way", ws->joined);
    one(f, "kwarm_warm_cancelled_total", "counter", "Keys reported cancelled",
        ws->cancelled);
    head(f, "kwarm_compiles_total", "counter",
         "Flights by family and result: compiled and stored, failed, or "
         "resolved by the fleet tier");
    static const char *const res[3] = {"compiled", "failed", "remote_hit"};
    for (size_t fam = 0; fam < KW_K_NFAMILIES; fam++) {
        const uint64_t v[3] = {ws->family_compiles[fam], ws->family_failures[fam],
                               ws->family_remote_hits[fam]};
        for (size_t i = 0; i < 3; i++)
            fprintf(f, "kwarm_compiles_total{family=\"%s\",result=\"%s\"} %llu\n",
                    kw_keys_family_name((kw_k_family)fam), res[i],
                    (unsigned long long)v[i]);
    }
    one(f, "kwarm_store_failures_total", "counter",
        "Compiled, but the put into the cache failed", ws->store_failures);
    one(f, "kwarm_compiles_queued", "gauge", "Flights waiting for a worker",
        ws->queued);
    one(f, "kwarm_compile_workers_busy", "gauge", "Flights on a worker now",
        ws->compiling);
    one(f, "kwarm_compile_workers", "gauge", "Compile worker processes (--jobs)",
        d->opts->jobs);
    one(f, "kwarm_warm_jobs_active", "gauge", "Jobs with results to come",
        ws->jobs_active);
    histogram(f, "kwarm_compile_duration_seconds",
              "Worker compiles that ran to an end, compiled or failed",
              kw_warm_compile_bounds(), KW_WARM_COMPILE_BUCKETS,
              ws->compile_buckets, ws->compile_seconds);
}

/* The fleet tier's calls (zeros without one). */
static void remote_metrics(FILE *f, const kw_remote_stats *rs)
{
    head(f, "kwarm_remote_operations_total", "counter",
         "Fleet tier (Redis) calls by op and result; op any: calls of any "
         "kind that failed");
    fprintf(f, "kwarm_remote_operations_total{op=\"fetch\",result=\"hit\"} %llu\n"
            "kwarm_remote_operations_total{op=\"fetch\",result=\"miss\"} %llu\n"
            "kwarm_remote_operations_total{op=\"fetch\",result=\"refused\"} %llu\n"
            "kwarm_remote_operations_total{op=\"put\",result=\"ok\"} %llu\n"
            "kwarm_remote_operations_total{op=\"any\",result=\"error\"} %llu\n",
            (unsigned long long)rs->hits, (unsigned long long)rs->misses,
            (unsigned long long)rs->refused, (unsigned long long)rs->puts,
            (unsigned long long)rs->errors);
}

int kw__metrics_format(kw__daemon *d, const kw_cache_stats *st,
                       const kw_warm_stats *ws, const kw_remote_stats *rs,
                       char **out, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return KW_ENOMEM;
    loop_metrics(f, d);
    cache_metrics(f, st);
    warm_metrics(f, d, ws);
    remote_metrics(f, rs);
    process_metrics(f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(buf);
        return KW_ENOMEM;
    }
    *out = buf;
    *len = n;
    return 0;
}

int kw__metrics_text(kw__daemon *d, char **out, size_t *len)
{
    kw_cache_stats st;
    kw_warm_stats ws;
    kw_remote_stats rs = {0}; /* zeros without a fleet tier */
    int rc = kw_warm_cache_stats(d->warm, &st);
    if (rc < 0)
        return rc;
    kw_warm_stats_get(d->warm, &ws);
    if (d->remote != NULL)
        kw_remote_stats_get(d->remote, &rs);
    return kw__metrics_format(d, &st, &ws, &rs, out, len);
}

/* ---- the address -------------------------------------------------------- */

int kw_daemon_metrics_parse(const char *v, struct sockaddr_storage *out,
                            socklen_t *len)
{
    char host[INET6_ADDRSTRLEN];
    const char *end, *port;
    bool v6 = v[0] == '[';
    if (v6) {
        end = strstr(v, "]:");
        port = end ? end + 2 : NULL;
        v++;
    } else {
        end = strrchr(v, ':');
        port = end ? end + 1 : NULL;
    }
    uint64_t p = 0;
    if (end == NULL || end == v || (size_t)(end - v) >= sizeof host ||
        kw_parse_u64(port, 65535, &p) < 0 || p == 0)
        return KW_EINVAL;
    memcpy(host, v, (size_t)(end - v));
    host[end - v] = '\0';
    memset(out, 0, sizeof *out);
    if (v6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)out;
        s->sin6_family = AF_INET6;
        s->sin6_port = htons((uint16_t)p);
        *len = sizeof *s;
        return inet_pton(AF_INET6, host, &s->sin6_addr) == 1 ? 0 : KW_EINVAL;
    }
    struct sockaddr_in *s = (struct sockaddr_in *)out;
    s->sin_family = AF_INET;
    s->sin_port = htons((uint16_t)p);
    *len = sizeof *s;
    return inet_pton(AF_INET, host, &s->sin_addr) == 1 ? 0 : KW_EINVAL;
}

/* The listening socket, bound here rather than by libmicrohttpd so that a
 * failure is reported with its errno ("Address already in use").  Returns
 * the fd, or -errno with the reason in err. */
static int bind_metrics(const char *v, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    if (kw_daemon_metrics_parse(v, &ss, &sl) < 0) {
        snprintf(err, errlen, "--metrics-listen: '%.64s' is not "
                 "A.B.C.D:PORT or [IPV6]:PORT", v);
        return KW_EINVAL;
    }
    int one = 1, fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ss.ss_family == AF_INET6 &&
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) < 0) {
        close(fd);
        fd = -1;
    }
    /* SO_REUSEADDR: a restart may rebind while old connections linger in
     * TIME_WAIT; a live listener still makes bind fail. */
    if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
                    bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 64) < 0)) {
        int e = errno;
        close(fd);
        errno = e;
        fd = -1;
    }
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "--metrics-listen %s: %s", v, strerror(e));
        return -e;
    }
    return fd;
}

/* ---- the HTTP server ---------------------------------------------------- */

/* libmicrohttpd's own messages go to kwarmd's log. */
static void http_log(void *cls, const char *fmt, va_list ap)
{
    char line[256];
    (void)cls;
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    KW_LOG(KW_LOG_WARNING, "metrics: %s", line);
}

/* Queues a response of status with text (copied); text/plain. */
static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status,
                                  const char *text)
{
    struct MHD_Response *res = MHD_create_response_from_buffer(
        strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (res == NULL)
        return MHD_NO;
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(res, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result r = MHD_queue_response(conn, status, res);
    MHD_destroy_response(res);
    return r;
}

/* MHD's access handler: GET or HEAD /metrics; 404 and 405 otherwise.
 * The first call only sees the headers; the answer is queued on the next
 * (once any body, which is ignored, has been read). */
static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_len, void **state)
{
    kw__daemon *d = cls;
    (void)version;
    (void)upload;
    if (*state == NULL) {
        *state = d; /* any non-NULL: the headers were seen */
        return MHD_YES;
    }
    if (*upload_len != 0) {
        *upload_len = 0;
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics\n");
    if (strcmp(url, "/metrics") != 0)
        return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found: GET /metrics\n");
    char *text = NULL;
    size_t len = 0;
    int rc = kw__metrics_text(d, &text, &len);
    if (rc < 0)
        return reply_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, kw_strerror(rc));
    struct MHD_Response *res =
        MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (res == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(res, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    enum MHD_Result r = MHD_queue_response(conn, MHD_HTTP_OK, res);
    MHD_destroy_response(res);
    return r;
}

int kw__metrics_start(kw__daemon *d, char *err, size_t errlen)
{
    const char *v = d->opts->metrics_listen;
    if (v[0] == '\0')
        return 0; /* off by default */
    int fd = bind_metrics(v, err, errlen);
    if (fd < 0)
        return fd;
    d->httpd = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        on_http, d, MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL, /* first */
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_LIMIT,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_TIMEOUT_S, MHD_OPTION_END);
    if (d->httpd == NULL) {
        close(fd);
        snprintf(err, errlen, "--metrics-listen %s: the HTTP server did not "
                 "start", v);
        return KW_ENOMEM;
    }
    KW_LOG(KW_LOG_INFO, "metrics: http://%s/metrics", v);
    return 0;
}

void kw__metrics_stop(kw__daemon *d)
{
    if (d->httpd == NULL)
        return;
    MHD_stop_daemon(d->httpd); /* joins its thread, closes the socket */
    d->httpd = NULL;
}
