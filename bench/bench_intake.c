/* bench_intake.c: fair intake (issue 23, point 2).  The latency of a
 * one-key get that misses (and compiles) while a warmup of about a
 * million keys is being looked up, beside the same get on an idle kwarmd.
 * warm's one intake thread takes the jobs in turn, KW_WARM_CHUNK (256)
 * keys of one at a time, so the get's lookup waits for at most one chunk
 * of the big warmup, not for all of its lookups.  Aim: within 2x.
 *
 * usage: bench_intake --kwarmd PATH [--dcp W] [--runs R] [--gets G]
 *                     [--json FILE]
 *
 * The cache is filled directly through the cache API with every key of
 * DeepSeek-V4-Flash at DCP world W (default 80000: about 960,000 keys) on
 * sm_90 and sm_100, each a 256-byte stand-in cubin, so the warmup is all
 * hits: its cost is the intake's lookups (each read and checked) and the
 * streaming of its results, which a reader thread drains as fast as it
 * comes.  Compiles are instant (KWARM_TEST_INSTANT_COMPILE), so the get's
 * latency is kwarmd's queueing, not NVRTC.  Each of R runs (default 5)
 * times G gets (default 50) of keys nobody cached, on an idle kwarmd and
 * then while the warmup is being looked up (the warmup started, its first
 * results streamed, its RESULT not yet sent when the last get ended: a run
 * where it was is reported as not overlapped).  A table and, with --json,
 * a JSON document give each run's median and p99 and the median of the
 * runs' medians.  Exit 1 when a get fails or no run overlapped.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_client.h"
#include "kw_config.h"
#include "kw_keys.h"
#include "kw_proto.h"

#include "bench_util.h"

#define MODEL "tests/fixtures/deepseek-v4-flash.json"
#define MAX_RUNS 32
#define MAX_GETS 1000

static const char usage_text[] =
    "usage: bench_intake --kwarmd PATH [--dcp W] [--runs R] [--gets G] "
    "[--json FILE]";

typedef struct opts {
    const char *bin, *json;
    int dcp, runs, gets;
} opts;

/* The keys of the model at DCP world dcp on sm_90 and sm_100. */
static int derive(const char *model, int dcp, kw_keys_set *set)
{
    char w[16];
    snprintf(w, sizeof w, "%d", dcp);
    return bench_derive_arch(model, w, NULL, "sm_90,sm_100", set);
}

static void info_of(const kw_keys_key *k, kw_cache_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->family, sizeof info->family, "%s",
             kw_keys_family_name(k->family));
    info->nfields = (uint32_t)kw_keys_nfields(k->family);
    memcpy(info->fields, k->fields, info->nfields * sizeof k->fields[0]);
    snprintf(info->arch, sizeof info->arch, "%s", k->arch);
    snprintf(info->entry, sizeof info->entry, "kw_test_entry");
    snprintf(info->nvrtc, sizeof info->nvrtc, "13.0");
}

/* Puts every key of set into a new cache at dir, 4096 to a transaction. */
static int fill(const char *dir, const kw_keys_set *set)
{
    char err[256];
    kw_cache *c = NULL;
    kw_cache_opts co = {.dir = dir, .max_size = 4ull << 30};
    if (kw_cache_open(&c, &co, err, sizeof err) < 0) {
        fprintf(stderr, "intake: %s\n", err);
        return -1;
    }
    enum { BATCH = 4096 };
    static kw_cache_item items[BATCH];
    static kw_cache_info infos[BATCH];
    static int rcs[BATCH];
    static uint8_t blob[256];
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < set->nkeys; i += BATCH) {
        size_t n = set->nkeys - i < BATCH ? set->nkeys - i : BATCH;
        for (size_t j = 0; j < n; j++) {
            info_of(&set->keys[i + j], &infos[j]);
            items[j] = (kw_cache_item){set->keys[i + j].digest, &infos[j], blob,
                                       sizeof blob, false, false};
        }
        rc = kw_cache_put_many(c, items, n, rcs);
    }
    kw_cache_close(c);
    return rc;
}

/* ---- the warmup, on a raw connection, drained by a thread ------------- */

typedef struct warmup {
    int fd;
    pthread_t th;
    _Atomic long frames;   /* PROGRESS frames read */
    _Atomic bool over;     /* its final frame came (or the socket closed) */
} warmup;

static int read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads frames to the final one, dropping them. */
static void *drain_main(void *arg)
{
    warmup *w = arg;
    static _Thread_local uint8_t skip[1 << 16];
    uint8_t head[KW_PROTO_HEAD_LEN];
    while (read_full(w->fd, head, sizeof head) == 0) {
        uint16_t type = (uint16_t)(head[6] | head[7] << 8);
        uint64_t len = (uint64_t)(head[8] | head[9] << 8 | head[10] << 16 |
                                  (uint32_t)head[11] << 24) +
                       (uint64_t)(head[12] | head[13] << 8 | head[14] << 16 |
                                  (uint32_t)head[15] << 24);
        for (uint64_t left = len; left > 0;) {
            size_t n = left < sizeof skip ? (size_t)left : sizeof skip;
            if (read_full(w->fd, skip, n) < 0)
                goto out;
            left -= n;
        }
        if (type != KW_PROTO_PROGRESS)
            break;
        atomic_fetch_add(&w->frames, 1);
    }
out:
    atomic_store(&w->over, true);
    return NULL;
}

/* Sends the warmup of cfg at DCP world dcp on a new connection to sock and
 * starts draining it; 0 or -1. */
static int warmup_start(warmup *w, const char *sock, const cJSON *cfg, int dcp)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    memset(w, 0, sizeof *w);
    w->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (w->fd < 0 || connect(w->fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        return -1;
    cJSON *h = cJSON_CreateObject(), *dep = cJSON_AddObjectToObject(h, "deployment");
    cJSON_AddItemToObject(h, "config", cJSON_Duplicate(cfg, 1));
    cJSON_AddStringToObject(h, "name", "config.json");
    cJSON_AddNumberToObject(dep, "dcp_world", dcp);
    cJSON_AddStringToObject(dep, "arch", "sm_90,sm_100");
    uint8_t *frame = NULL;
    size_t len = 0;
    int rc = kw_proto_encode(KW_PROTO_WARMUP, h, NULL, 0, &frame, &len);
    cJSON_Delete(h);
    if (rc < 0 || write(w->fd, frame, len) != (ssize_t)len) {
        free(frame);
        return -1;
    }
    free(frame);
    return pthread_create(&w->th, NULL, drain_main, w) == 0 ? 0 : -1;
}

/* Ends the warmup: closing its connection cancels it in kwarmd. */
static void warmup_stop(warmup *w)
{
    shutdown(w->fd, SHUT_RDWR);
    pthread_join(w->th, NULL);
    close(w->fd);
}

/* ---- the gets ------------------------------------------------------------ */

/* Times g gets of keys nobody cached, each compiled; ms[i] their
 * latencies.  The keys are compressed_slot_mapping's with compress_ratio
 * base + i (a field that takes any positive value) and valid values
 * elsewhere, on sm_80: kwarmd refuses fields no kernel takes before any
 * compile.  0 or the first failure's code. */
static int time_gets(kw_client *c, int base, int g, double *ms)
{
    for (int i = 0; i < g; i++) {
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "compress_ratio", base + i);
        cJSON_AddNumberToObject(f, "triton_block_size", 32);
        cJSON_AddNumberToObject(f, "block_size", 1);
        cJSON_AddNumberToObject(f, "dcp_world_size", 1);
        cJSON_AddNumberToObject(f, "dcp_rank", 0);
        cJSON_AddNumberToObject(f, "cp_kv_cache_interleave_size", 1);
        char *fields = cJSON_PrintUnformatted(f);
        cJSON_Delete(f);
        kw_client_kernel out = {0};
        double t0 = bench_now_ns();
        int rc = kw_client_get_key(c, "compressed_slot_mapping", fields,
                                   "sm_80", true, &out);
        ms[i] = (bench_now_ns() - t0) / 1e6;
        free(fields);
        kw_client_kernel_destroy(&out);
        if (rc < 0) {
            fprintf(stderr, "intake: get: %s\n", kw_client_last_error(c));
            return rc;
        }
    }
    return 0;
}

static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

typedef struct run {
    double idle_p50, idle_p99, busy_p50, busy_p99;
    long frames_before, frames_after;
    bool overlapped;
} run;

/* One run: g gets idle, then g gets while a warmup is looked up. */
static int one_run(const opts *o, kw_client *c, const char *sock,
                   const cJSON *cfg, int r, run *out)
{
    static double ms[MAX_GETS];
    int rc = time_gets(c, 100000 + 2 * r * o->gets, o->gets, ms);
    if (rc < 0)
        return rc;
    out->idle_p99 = quantile(ms, o->gets, 0.99);
    out->idle_p50 = quantile(ms, o->gets, 0.50);
    warmup w;
    if (warmup_start(&w, sock, cfg, o->dcp) < 0) {
        fprintf(stderr, "intake: warmup: %s\n", strerror(errno));
        return -1;
    }
    /* Bounded: until its first results stream (lookups are under way). */
    for (int i = 0; i < 60000 && atomic_load(&w.frames) == 0 &&
                    !atomic_load(&w.over); i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    out->frames_before = atomic_load(&w.frames);
    rc = time_gets(c, 100000 + (2 * r + 1) * o->gets, o->gets, ms);
    out->frames_after = atomic_load(&w.frames);
    out->overlapped = out->frames_before > 0 && !atomic_load(&w.over);
    warmup_stop(&w);
    out->busy_p99 = quantile(ms, o->gets, 0.99);
    out->busy_p50 = quantile(ms, o->gets, 0.50);
    return rc;
}

static int parse(opts *o, int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--kwarmd") == 0)
            o->bin = argv[i + 1];
        else if (strcmp(argv[i], "--dcp") == 0)
            o->dcp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0)
            o->runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--gets") == 0)
            o->gets = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--json") == 0)
            o->json = argv[i + 1];
        else
            break;
    }
    if (o->bin == NULL || o->dcp < 1 || o->runs < 1 || o->runs > MAX_RUNS ||
        o->gets < 2 || o->gets > MAX_GETS || argc % 2 == 0) {
        fprintf(stderr, "%s\n", usage_text);
        return 2;
    }
    return 0;
}

/* Prints the table and writes the JSON; true when a run overlapped. */
static bool report(const opts *o, size_t nkeys, const run *runs)
{
    double idle[MAX_RUNS], busy[MAX_RUNS];
    int n = 0;
    printf("get miss (compiled, instant) while a %zu-key all-hit warmup is "
           "looked up; ms\n", nkeys);
    printf("| run | idle p50 | idle p99 | busy p50 | busy p99 | overlapped |\n"
           "| ---: | ---: | ---: | ---: | ---: | --- |\n");
    cJSON *doc = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(doc, "runs");
    for (int r = 0; r < o->runs; r++) {
        const run *x = &runs[r];
        printf("| %d | %.3f | %.3f | %.3f | %.3f | %s |\n", r + 1, x->idle_p50,
               x->idle_p99, x->busy_p50, x->busy_p99, x->overlapped ? "yes" : "no");
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "idle_p50_ms", x->idle_p50);
        cJSON_AddNumberToObject(j, "idle_p99_ms", x->idle_p99);
        cJSON_AddNumberToObject(j, "busy_p50_ms", x->busy_p50);
        cJSON_AddNumberToObject(j, "busy_p99_ms", x->busy_p99);
        cJSON_AddBoolToObject(j, "overlapped", x->overlapped);
        cJSON_AddItemToArray(arr, j);
        if (x->overlapped) {
            idle[n] = x->idle_p50;
            busy[n++] = x->busy_p50;
        }
    }
    double mi = n ? quantile(idle, n, 0.5) : 0, mb = n ? quantile(busy, n, 0.5) : 0;
    printf("median of the overlapped runs' p50: idle %.3f ms, busy %.3f ms, "
           "ratio %.2f (aim <= 2)\n", mi, mb, mi > 0 ? mb / mi : 0);
    cJSON_AddNumberToObject(doc, "keys", (double)nkeys);
    cJSON_AddNumberToObject(doc, "idle_p50_ms", mi);
    cJSON_AddNumberToObject(doc, "busy_p50_ms", mb);
    cJSON_AddNumberToObject(doc, "ratio", mi > 0 ? mb / mi : 0);
    char *text = cJSON_Print(doc);
    FILE *f = o->json ? fopen(o->json, "w") : NULL;
    if (f != NULL && text != NULL)
        fprintf(f, "%s\n", text);
    if (f != NULL)
        fclose(f);
    free(text);
    cJSON_Delete(doc);
    return n > 0;
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, usage_text))
        return 0;
    opts o = {.dcp = 80000, .runs = 5, .gets = 50};
    if (parse(&o, argc, argv) != 0)
        return 2;
    setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    char *text = bench_slurp(MODEL);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    kw_keys_set set = {0};
    bench_tmp tmp;
    if (cfg == NULL || bench_tmp_make(&tmp, "intake") < 0 ||
        derive(MODEL, o.dcp, &set) < 0 || fill(tmp.cache, &set) < 0) {
        fprintf(stderr, "intake: set-up failed (run from the repository root)\n");
        return 1;
    }
    size_t nkeys = set.nkeys;
    kw_keys_set_destroy(&set);
    kw_client *c = NULL;
    pid_t pid = bench_start_kwarmd(o.bin, tmp.sock, tmp.cache, "2", NULL, &c);
    static run runs[MAX_RUNS];
    int rc = pid < 0 ? -1 : 0;
    for (int r = 0; rc == 0 && r < o.runs; r++)
        rc = one_run(&o, c, tmp.sock, cfg, r, &runs[r]);
    bool ok = rc == 0 && report(&o, nkeys, runs);
    kw_client_close(c);
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    cJSON_Delete(cfg);
    bench_tmp_remove(&tmp);
    return ok ? 0 : 1;
}
