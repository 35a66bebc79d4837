/* bench_flood.c: well-behaved clients beside one that never reads (issue 11).
 *
 * usage: bench_flood [--seconds S] [--clients N] [--json FILE]
 *
 * Starts kwarmd (from beside this program) with a stand-in compile that
 * answers 200 KB cubins at once (KWARM_TEST_INSTANT_COMPILE=204800), stores
 * one key, then measures N clients (default 8) doing gets of it for S
 * seconds (default 5): first alone, then while a hostile client has
 * pipelined up to 20,000 gets of that 200 KB cubin without reading a byte.
 * Prints the get p50/p99 of both phases, their ratio (aim: p99 within 2x),
 * and how much kwarmd's anonymous resident memory grew (aim: under 64 MiB),
 * as a table and JSON.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <poll.h>

#include <cjson/cJSON.h>

#include "bench_util.h"
#include "kw_client.h"
#include "kw_proto.h"

#define MAX_SAMPLES 400000

typedef struct phase {
    const char *sock, *digest;
    double deadline;
    double *lat; /* ms, shared: index taken atomically */
    _Atomic size_t n;
    _Atomic int failed;
} phase;

static void *getter(void *arg)
{
    phase *p = arg;
    kw_client *c = NULL;
    if (kw_client_connect(&c, p->sock, 10000, NULL, 0) < 0) {
        atomic_store(&p->failed, 1);
        return NULL;
    }
    while (bench_now_ns() < p->deadline) {
        kw_client_kernel k = {0};
        double t0 = bench_now_ns();
        if (kw_client_get(c, p->digest, false, &k) < 0)
            atomic_store(&p->failed, 1);
        double ms = (bench_now_ns() - t0) / 1e6;
        kw_client_kernel_destroy(&k);
        size_t i = atomic_fetch_add(&p->n, 1);
        if (i < MAX_SAMPLES)
            p->lat[i] = ms;
    }
    kw_client_close(c);
    return NULL;
}

/* Runs nclients getters for secs; fills p50/p99 (ms). */
static int run_phase(phase *p, int nclients, double secs, double *p50, double *p99)
{
    pthread_t th[64];
    atomic_store(&p->n, 0);
    p->deadline = bench_now_ns() + secs * 1e9;
    for (int i = 0; i < nclients; i++)
        pthread_create(&th[i], NULL, getter, p);
    for (int i = 0; i < nclients; i++)
        pthread_join(th[i], NULL);
    size_t n = atomic_load(&p->n);
    n = n < MAX_SAMPLES ? n : MAX_SAMPLES;
    qsort(p->lat, n, sizeof *p->lat, bench_cmp_double);
    *p50 = n ? p->lat[n / 2] : 0;
    *p99 = n ? p->lat[n * 99 / 100] : 0;
    return atomic_load(&p->failed) || n == 0 ? -1 : 0;
}

/* The hostile client: up to 20,000 pipelined gets, never a read; returns
 * its fd (kept open) and how many went in before kwarmd stopped reading. */
static int flood(const char *sock, const char *digest, size_t *sent)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", digest);
    uint8_t *f = NULL;
    size_t len = 0, off = 0;
    *sent = 0;
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        kw_proto_encode(KW_PROTO_GET, g, NULL, 0, &f, &len) < 0)
        return -1;
    while (*sent < 20000) {
        ssize_t w = send(fd, f + off, len - off, MSG_NOSIGNAL);
        if (w > 0 && (off += (size_t)w) == len) {
            off = 0;
            (*sent)++;
        } else if (w <= 0) {
            struct pollfd p = {fd, POLLOUT, 0};
            if (poll(&p, 1, 500) <= 0)
                break; /* kwarmd stopped reading: the cap holds */
        }
    }
    free(f);
    cJSON_Delete(g);
    return fd;
}

static long rss_anon(pid_t pid)
{
    char path[64], line[256];
    long kb = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* Stores one key through a compiling get; its digest into out. */
static int store_one(kw_client *c, char out[65])
{
    kw_client_kernel k = {0};
    int rc = kw_client_get_key(c, "dcp_stable_topk", "{\"topk\": 2048, \"num_candidates\": 4096}",
                               "sm_90", true, &k);
    if (rc == 0)
        snprintf(out, 65, "%s", k.digest);
    kw_client_kernel_destroy(&k);
    return rc;
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, "usage: bench_flood [--seconds S] [--clients N] [--json FILE]"))
        return 0;
    double secs = 5;
    int nclients = 8;
    const char *json = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--seconds") == 0)
            secs = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--clients") == 0)
            nclients = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--json") == 0)
            json = argv[i + 1];
    }
    if (secs <= 0 || nclients < 1 || nclients > 64) {
        fprintf(stderr, "usage: bench_flood [--seconds S] [--clients N<=64] [--json FILE]\n");
        return 2;
    }
    char kwarmd[4200], digest[65];
    bench_tmp t;
    bench_sibling("kwarmd", kwarmd, sizeof kwarmd);
    setenv("KWARM_TEST_INSTANT_COMPILE", "204800", 1);
    if (bench_tmp_make(&t, "flood") < 0)
        return 1;
    const char *sock = t.sock;
    kw_client *c = NULL;
    pid_t pid = bench_start_kwarmd(kwarmd, sock, t.cache, "1", NULL, &c);
    if (pid < 0 || store_one(c, digest) < 0) {
        fprintf(stderr, "bench_flood: set-up failed\n");
        return 1;
    }
    phase p = {.sock = sock, .digest = digest,
               .lat = malloc(MAX_SAMPLES * sizeof(double))};
    double a50, a99, b50, b99;
    size_t sent = 0;
    int rc = run_phase(&p, nclients, secs, &a50, &a99);
    long rss0 = rss_anon(pid);
    int hostile = rc == 0 ? flood(sock, digest, &sent) : -1;
    if (hostile < 0 || run_phase(&p, nclients, secs, &b50, &b99) < 0)
        rc = -1;
    long grown = rss_anon(pid) - rss0;
    double ratio = a99 > 0 ? b99 / a99 : 0;
    printf("%d clients getting a 200 KB cubin for %.0f s each phase\n", nclients, secs);
    printf("  phase            p50 ms   p99 ms\n");
    printf("  alone          %8.3f %8.3f\n", a50, a99);
    printf("  beside a flood %8.3f %8.3f   (%zu gets pipelined, never read)\n",
           b50, b99, sent);
    printf("  p99 ratio %.2fx (aim <= 2x: %s); RssAnon grew %ld KiB (aim < 65536: %s)\n",
           ratio, ratio <= 2 ? "met" : "NOT met", grown,
           grown < 65536 ? "met" : "NOT met");
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"clients\": %d, \"seconds\": %.0f, \"alone_p50_ms\": %.4f, "
                    "\"alone_p99_ms\": %.4f, \"flood_p50_ms\": %.4f, \"flood_p99_ms\": "
                    "%.4f, \"p99_ratio\": %.3f, \"flood_gets_in\": %zu, "
                    "\"rss_anon_growth_kb\": %ld}\n", nclients, secs, a50, a99, b50,
                    b99, ratio, sent, grown);
            fclose(f);
        }
    }
    if (hostile >= 0)
        close(hostile);
    free(p.lat);
    kw_client_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return bench_tmp_remove(&t) == 0 && rc == 0 ? 0 : 1;
}
