/* bench_daemon.c: get-hit latency and throughput over kwarmd's socket,
 * beside two floors measured in the same run: the direct LMDB read
 * (kw_cache_get_into) and a bare libuv echo server, in its own process,
 * that answers each request with the very frame kwarmd sends for it
 * (kept in memory, one per cubin) over the same kind of socket.
 *
 * usage: bench_daemon --kwarmd PATH [--seconds S] [--runs R] [--json FILE]
 *
 * For cubins of about 4 KB, 50 KB and 200 KB (random bytes stored under
 * random digests in a fresh cache that kwarmd then serves): p50/p99 of a
 * persistent client's gets, and requests per second with 1, 8 and 64
 * clients (one thread each, each with its own connection), S seconds
 * each.  R runs; in each, kwarmd and the echo are measured one after the
 * other, the first alternating between runs.  Every ratio to the echo is
 * printed as the median and the best of the runs beside issue 14's aim.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_proto.h"
#include "bench_util.h"

#define NBLOBS 32
#define LAT_ITERS 20000

static const size_t sizes[] = {4 * 1024, 50 * 1024, 200 * 1024};
static const int client_counts[] = {1, 8, 64};

static int unix_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return -1;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int write_all(int fd, const void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, (const char *)p + off, n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t r = recv(fd, (char *)p + off, n - off, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        off += (size_t)r;
    }
    return 0;
}

/* One request/reply: sends req, reads one whole reply frame into buf
 * (cap bytes) and returns its payload length, or -1. */
static ssize_t round_trip(int fd, const uint8_t *req, size_t req_len,
                          uint8_t *buf, size_t cap)
{
    uint16_t type;
    uint32_t hl, pl;
    if (write_all(fd, req, req_len) < 0 || read_all(fd, buf, 16) < 0 ||
        kw_proto_peek(buf, 16, &type, &hl, &pl) < 0 || 16 + hl + pl > cap ||
        read_all(fd, buf + 16, hl + pl) < 0 || type != KW_PROTO_RESULT)
        return -1;
    return (ssize_t)pl;
}

/* A GET request frame for digest (hex). */
static uint8_t *get_request(const uint8_t *digest, size_t *len)
{
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "digest", hex);
    cJSON_AddFalseToObject(h, "compile");
    uint8_t *out = NULL;
    kw_proto_encode(KW_PROTO_GET, h, NULL, 0, &out, len);
    cJSON_Delete(h);
    return out;
}

/* ---- the bare echo floor: a libuv server answering every request frame
 * with the frame kwarmd sent for the same request, prepared in memory --- */

typedef struct echo {
    uv_loop_t loop;
    uv_pipe_t server;
    uv_signal_t stop;
    /* kwarmd's reply to the GET of each digest, in digest order: the
     * echo answers every request with the frame kwarmd sent for it */
    uint8_t *const *replies;
    const size_t *lens;
    char (*hex)[65];
} echo;

typedef struct echo_conn {
    uv_pipe_t pipe;
    echo *e;
    uint8_t buf[KW_PROTO_MAX_REQUEST];
    size_t len;
} echo_conn;

static void echo_free(uv_handle_t *h)
{
    free(h->data);
}

static void echo_alloc(uv_handle_t *h, size_t s, uv_buf_t *b)
{
    echo_conn *c = h->data;
    (void)s;
    *b = uv_buf_init((char *)c->buf + c->len, (unsigned)(sizeof c->buf - c->len));
}

static void echo_written(uv_write_t *w, int status)
{
    (void)status;
    free(w);
}

static void echo_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    echo_conn *c = s->data;
    (void)b;
    if (n < 0) {
        uv_close((uv_handle_t *)s, echo_free);
        return;
    }
    c->len += (size_t)n;
    for (;;) {
        kw_msg m;
        size_t used;
        if (kw_proto_parse_request(c->buf, c->len, &m, &used) != KW_PROTO_OK)
            return;
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(m.header, "digest");
        size_t i = 0;
        while (i + 1 < NBLOBS && cJSON_IsString(d) &&
               strcmp(d->valuestring, c->e->hex[i]) != 0)
            i++;
        kw_msg_destroy(&m);
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
        uv_write_t *w = malloc(sizeof *w);
        uv_buf_t out = uv_buf_init((char *)c->e->replies[i], (unsigned)c->e->lens[i]);
        uv_write(w, s, &out, 1, echo_written);
    }
}

static void echo_accept(uv_stream_t *srv, int status)
{
    echo *e = srv->data;
    echo_conn *c = calloc(1, sizeof *c);
    if (status < 0 || c == NULL) {
        free(c);
        return;
    }
    c->e = e;
    uv_pipe_init(&e->loop, &c->pipe, 0);
    c->pipe.data = c;
    if (uv_accept(srv, (uv_stream_t *)&c->pipe) == 0)
        uv_read_start((uv_stream_t *)&c->pipe, echo_alloc, echo_read);
    else
        uv_close((uv_handle_t *)&c->pipe, echo_free);
}

static void echo_on_stop(uv_signal_t *s, int signum)
{
    (void)signum;
    uv_stop(s->loop);
}

/* The echo server's process: serves path until SIGTERM. */
static void echo_main(const char *path, const echo *proto)
{
    echo e = *proto;
    uv_loop_init(&e.loop);
    uv_pipe_init(&e.loop, &e.server, 0);
    e.server.data = &e;
    uv_signal_init(&e.loop, &e.stop);
    uv_signal_start(&e.stop, echo_on_stop, SIGTERM);
    if (uv_pipe_bind(&e.server, path) < 0 ||
        uv_listen((uv_stream_t *)&e.server, 128, echo_accept) < 0)
        _exit(1);
    uv_run(&e.loop, UV_RUN_DEFAULT);
    _exit(0);
}


/* Waits (bounded) until something accepts on sock; 0, or -1. */
static int wait_accepting(const char *sock)
{
    for (int i = 0; i < 500; i++) {
        int fd = unix_connect(sock);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* Starts the echo server, in its own process as kwarmd is (so neither
 * gets cheaper thread switches with the clients), at path answering as
 * proto says; its pid, or -1. */
static pid_t echo_start(const char *path, const echo *proto)
{
    pid_t pid = fork();
    if (pid == 0)
        echo_main(path, proto);
    if (pid > 0 && wait_accepting(path) < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

static void echo_stop(pid_t pid, const char *path)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    unlink(path);
}

/* ---- measurements ----------------------------------------------------- */

typedef struct target {
    const char *path;   /* socket, or NULL for the direct LMDB read */
    kw_cache *cache;    /* for the direct read */
    uint8_t (*digests)[32];
    uint8_t **reqs;     /* GET frames, one per digest */
    size_t *req_lens;
    size_t n;
} target;

typedef struct tp_arg {
    const target *t;
    double deadline;
    uint64_t done;
    int failed;
} tp_arg;

/* One get through t: over the socket, or straight from LMDB. */
static int one_get(const target *t, int fd, size_t i, uint8_t *buf, size_t cap)
{
    size_t len;
    if (t->path == NULL)
        return kw_cache_get_into(t->cache, t->digests[i % t->n], buf, cap, &len, NULL);
    return round_trip(fd, t->reqs[i % t->n], t->req_lens[i % t->n], buf, cap) < 0 ? -1 : 0;
}

static void *tp_thread(void *arg)
{
    tp_arg *a = arg;
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    int fd = a->t->path ? unix_connect(a->t->path) : 0;
    if (fd < 0 || buf == NULL)
        a->failed = 1;
    for (size_t i = 0; !a->failed && bench_now_ns() < a->deadline; i++) {
        if (one_get(a->t, fd, i, buf, cap) < 0)
            a->failed = 1;
        else
            a->done++;
    }
    if (a->t->path && fd >= 0)
        close(fd);
    free(buf);
    return NULL;
}

/* Requests per second with `clients` threads for `secs` seconds. */
static double throughput(const target *t, int clients, double secs)
{
    pthread_t tid[64];
    tp_arg a[64];
    double t0 = bench_now_ns(), total = 0;
    for (int i = 0; i < clients; i++) {
        a[i] = (tp_arg){t, t0 + secs * 1e9, 0, 0};
        pthread_create(&tid[i], NULL, tp_thread, &a[i]);
    }
    for (int i = 0; i < clients; i++) {
        pthread_join(tid[i], NULL);
        total += (double)a[i].done;
        if (a[i].failed)
            return -1;
    }
    return total / ((bench_now_ns() - t0) / 1e9);
}

/* p50 and p99 of a persistent client's gets, in microseconds. */
static int latency(const target *t, double *p50, double *p99)
{
    static double s[LAT_ITERS];
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    int fd = t->path ? unix_connect(t->path) : 0, rc = fd < 0 ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < LAT_ITERS + 1000; i++) {
        double t0 = bench_now_ns();
        rc = one_get(t, fd, i, buf, cap);
        if (i >= 1000) /* the first thousand warm up */
            s[i - 1000] = (bench_now_ns() - t0) / 1e3;
    }
    if (t->path && fd >= 0)
        close(fd);
    free(buf);
    qsort(s, LAT_ITERS, sizeof *s, bench_cmp_double);
    *p50 = s[LAT_ITERS / 2];
    *p99 = s[LAT_ITERS * 99 / 100];
    return rc;
}

/* ---- set-up and report ----------------------------------------------- */

/* Fills a new cache at dir with NBLOBS random blobs of each size. */
static int populate(const char *dir, uint8_t digests[][NBLOBS][32])
{
    kw_cache_opts o = {.dir = dir};
    kw_cache *c = NULL;
    char err[256];
    if (kw_cache_open(&c, &o, err, sizeof err) < 0)
        return -1;
    uint8_t *blob = malloc(sizes[2]);
    for (size_t s = 0; s < 3; s++)
        for (size_t i = 0; i < NBLOBS; i++) {
            kw_cache_info info = {.family = "bench", .arch = "sm_90", .entry = "kw_bench"};
            for (size_t b = 0; b < sizes[s]; b++)
                blob[b] = (uint8_t)rand();
            for (size_t b = 0; b < 32; b++)
                digests[s][i][b] = (uint8_t)rand();
            if (kw_cache_put(c, digests[s][i], &info, blob, sizes[s], true, NULL) < 0)
                return -1;
        }
    free(blob);
    kw_cache_close(c);
    return 0;
}

/* kwarmd's exact reply frame for one GET: what the echo floor sends back
 * for that request. */
static uint8_t *sample_reply(const char *sock, const uint8_t *req, size_t req_len,
                             size_t *len)
{
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    int fd = unix_connect(sock);
    ssize_t pl = fd >= 0 ? round_trip(fd, req, req_len, buf, cap) : -1;
    if (fd >= 0)
        close(fd);
    uint16_t type;
    uint32_t hl, plen;
    if (pl < 0 || kw_proto_peek(buf, 16, &type, &hl, &plen) < 0) {
        free(buf);
        return NULL;
    }
    *len = 16 + hl + plen;
    return buf;
}

typedef struct result {
    double p50, p99, rps[3];
} result;

static int measure(const target *t, double secs, result *r)
{
    if (latency(t, &r->p50, &r->p99) < 0)
        return -1;
    for (int c = 0; c < 3; c++)
        if ((r->rps[c] = throughput(t, client_counts[c], secs)) < 0)
            return -1;
    return 0;
}

/* One size in one run: kwarmd and the echo floor (r[0], r[1]; which goes
 * first alternates between runs, so drift favours neither), and the
 * direct LMDB read (r[2]) in the first run only. */
static int bench_size(const char *ksock, const char *esock, kw_cache *cache,
                      uint8_t (*digests)[32], double secs, int run,
                      result r[3])
{
    uint8_t *reqs[NBLOBS], *replies[NBLOBS] = {0};
    size_t lens[NBLOBS], reply_lens[NBLOBS];
    char hex[NBLOBS][65];
    int rc = 0;
    for (size_t i = 0; i < NBLOBS; i++) {
        reqs[i] = get_request(digests[i], &lens[i]);
        for (int b = 0; b < 32; b++)
            snprintf(hex[i] + 2 * b, 3, "%02x", digests[i][b]);
        replies[i] = sample_reply(ksock, reqs[i], lens[i], &reply_lens[i]);
        rc = replies[i] == NULL ? -1 : rc;
    }
    target k = {ksock, NULL, digests, reqs, lens, NBLOBS};
    target l = {NULL, cache, digests, reqs, lens, NBLOBS};
    target e = {esock, NULL, digests, reqs, lens, NBLOBS};
    echo proto = {.replies = replies, .lens = reply_lens, .hex = hex};
    pid_t srv = rc == 0 ? echo_start(esock, &proto) : -1;
    rc = srv < 0 ? -1 : 0;
    const target *first = run % 2 ? &e : &k, *second = run % 2 ? &k : &e;
    if (rc == 0)
        rc = measure(first, secs, &r[run % 2]) < 0 ||
             measure(second, secs, &r[1 - run % 2]) < 0 ||
             (run == 0 && measure(&l, secs, &r[2]) < 0) ? -1 : 0;
    if (srv > 0)
        echo_stop(srv, esock);
    for (size_t i = 0; i < NBLOBS; i++)
        free(replies[i]);
    for (size_t i = 0; i < NBLOBS; i++)
        free(reqs[i]);
    return rc;
}

/* ---- report: ratios against the echo, median and best of the runs ---- */

#define MAX_RUNS 15
#define NRATIOS 5 /* p50, p99, throughput at 1, 8 and 64 clients */

static const char *const ratio_names[NRATIOS] = {
    "latency p50 kwarmd/echo", "latency p99 kwarmd/echo",
    "throughput  1 client  kwarmd/echo", "throughput  8 clients kwarmd/echo",
    "throughput 64 clients kwarmd/echo"};
static const char *const ratio_keys[NRATIOS] = {"p50", "p99", "rps_1", "rps_8",
                                                "rps_64"};
/* issue 14 point 3: latency at most, throughput at least */
static const double ratio_aims[NRATIOS] = {1.2, 1.5, 0.85, 0.85, 0.85};

static double ratio_of(const result r[3], int i)
{
    if (i == 0)
        return r[0].p50 / r[1].p50;
    if (i == 1)
        return r[0].p99 / r[1].p99;
    return r[0].rps[i - 2] / r[1].rps[i - 2];
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The median over the runs of one field (f) of target `which`. */
static double median_field(const result (*r)[3], int runs, int which,
                           double (*f)(const result *))
{
    double v[MAX_RUNS];
    for (int i = 0; i < runs; i++)
        v[i] = f(&r[i][which]);
    return median_of(v, runs);
}

static double f_p50(const result *r) { return r->p50; }
static double f_p99(const result *r) { return r->p99; }
static double f_rps1(const result *r) { return r->rps[0]; }
static double f_rps8(const result *r) { return r->rps[1]; }
static double f_rps64(const result *r) { return r->rps[2]; }

static double (*const fields[5])(const result *) = {f_p50, f_p99, f_rps1,
                                                    f_rps8, f_rps64};

static void print_size(FILE *json, size_t size, const result (*r)[3],
                       int runs, bool first)
{
    static const char *const names[3] = {"kwarmd get hit", "bare echo (floor)",
                                          "direct LMDB read (floor)"};
    static const char *const keys[3] = {"kwarmd", "echo", "lmdb"};
    printf("\ncubin %zu KB, median of %d runs   p50 us   p99 us   req/s 1 client"
           "   8 clients  64 clients\n", size / 1024, runs);
    if (json)
        fprintf(json, "%s\n {\"size\": %zu", first ? "" : ",", size);
    for (int i = 0; i < 3; i++) {
        double m[5];
        for (int f = 0; f < 5; f++)
            m[f] = median_field(r, i == 2 ? 1 : runs, i, fields[f]);
        printf("%-34s %8.1f %8.1f %16.0f %11.0f %11.0f\n", names[i], m[0], m[1],
               m[2], m[3], m[4]);
        if (json)
            fprintf(json, ", \"%s\": {\"p50_us\": %.2f, \"p99_us\": %.2f, "
                    "\"rps\": [%.0f, %.0f, %.0f]}", keys[i], m[0], m[1], m[2],
                    m[3], m[4]);
    }
    printf("%-34s %6s %8s %8s  %s\n", "ratio", "aim", "median", "best", "met");
    if (json)
        fprintf(json, ", \"ratios\": {");
    for (int i = 0; i < NRATIOS; i++) {
        double v[MAX_RUNS];
        for (int k = 0; k < runs; k++)
            v[k] = ratio_of(r[k], i);
        double med = median_of(v, runs);
        bool lower = i < 2; /* latency: lower is better */
        double best = lower ? v[0] : v[runs - 1];
        bool met = lower ? med <= ratio_aims[i] : med >= ratio_aims[i];
        printf("%-34s %s%4.2f %7.2fx %7.2fx  %s\n", ratio_names[i],
               lower ? "<=" : ">=", ratio_aims[i], med, best, met ? "yes" : "no");
        if (json)
            fprintf(json, "%s\"%s\": {\"aim\": \"%s %.2f\", \"median\": %.3f, "
                    "\"best\": %.3f, \"met\": %s}", i ? ", " : "", ratio_keys[i],
                    lower ? "<=" : ">=", ratio_aims[i], med, best,
                    met ? "true" : "false");
    }
    if (json)
        fprintf(json, "}}");
}

static const char usage_text[] =
    "usage: bench_daemon --kwarmd PATH [--loops N] [--seconds S] [--runs R]\n"
    "                    [--json FILE]\n"
    "  gets of cached 4, 50 and 200 KB cubins through kwarmd against a bare\n"
    "  libuv echo of the same frames; R runs (5, at most 15), ratios as the\n"
    "  median and the best of the runs beside issue 14's aims";

static int parse_args(int argc, char **argv, const char **bin, double *secs,
                      int *runs, const char **json, const char **loops)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--kwarmd") == 0)
            *bin = argv[i + 1];
        else if (strcmp(argv[i], "--loops") == 0)
            *loops = argv[i + 1];
        else if (strcmp(argv[i], "--seconds") == 0)
            *secs = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0)
            *runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--json") == 0)
            *json = argv[i + 1];
        else
            return -1;
    }
    return *bin == NULL || *secs <= 0 || *runs < 1 || *runs > MAX_RUNS ||
           argc % 2 == 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, usage_text))
        return 0;
    const char *bin = NULL, *json_path = NULL, *loops = NULL;
    double secs = 1;
    int runs = 5;
    if (parse_args(argc, argv, &bin, &secs, &runs, &json_path, &loops) < 0) {
        fprintf(stderr, "%s\n", usage_text);
        return 2;
    }
    bench_tmp t;
    char esock[128];
    static uint8_t digests[3][NBLOBS][32];
    static result res[3][MAX_RUNS][3];
    if (bench_tmp_make(&t, "bench-daemon") < 0)
        return 1;
    const char *cache = t.cache, *ksock = t.sock;
    snprintf(esock, sizeof esock, "%s/e.sock", t.dir);
    srand(1);
    kw_client *kc = NULL; /* only proves kwarmd accepts */
    pid_t pid = populate(cache, digests) == 0
                    ? bench_start_kwarmd(bin, ksock, cache, "2", loops, &kc) : -1;
    kw_client_close(kc);
    kw_cache_opts co = {.dir = cache, .read_only = true};
    kw_cache *c = NULL;
    char err[256];
    if (pid < 0 || kw_cache_open(&c, &co, err, sizeof err) < 0) {
        fprintf(stderr, "bench_daemon: set-up failed\n");
        return 1;
    }
    int rc = 0;
    for (int run = 0; rc == 0 && run < runs; run++) {
        for (size_t s = 0; rc == 0 && s < 3; s++)
            rc = bench_size(ksock, esock, c, digests[s], secs, run, res[s][run]);
        fprintf(stderr, "bench_daemon: run %d of %d done\n", run + 1, runs);
    }
    FILE *json = json_path && rc == 0 ? fopen(json_path, "w") : NULL;
    if (json)
        fprintf(json, "{\"clients\": [1, 8, 64], \"runs\": %d, \"loops\": \"%s\", "
                "\"sizes\": [", runs, loops ? loops : "default");
    for (size_t s = 0; rc == 0 && s < 3; s++)
        print_size(json, sizes[s], (const result (*)[3])res[s], runs, s == 0);
    if (json) {
        fprintf(json, "]}\n");
        fclose(json);
    }
    kw_cache_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    if (rc < 0)
        fprintf(stderr, "bench_daemon: a measurement failed\n");
    return rc < 0 || bench_tmp_remove(&t) < 0 ? 1 : 0;
}
