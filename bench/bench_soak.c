/* bench_soak.c: many concurrent clients mixing get, warmup and stats against a
 * real kwarmd for a while: no request may fail, and the daemon's resident
 * memory and open descriptors must come back to their starting level.
 *
 * usage: bench_soak --kwarmd PATH [--loops N] [--clients N] [--seconds S]
 *                   [--rounds R] [--hostile] [--json FILE]
 *
 * The daemon starts on a fresh cache, DeepSeek-V3.2 (W = 2) is warmed once,
 * and the whole mix below runs for a first SOAK_WARM_S seconds; "before" is
 * read from /proc/PID (RssAnon, entries of fd/) once the daemon is idle
 * after it, so that the tables kwarmd fills up to a fixed size (the miss
 * audit's ring, the cache's hint and pending-hit tables, each loop's
 * reply headers, LMDB's page lists) count as its footprint, not as growth.
 * Then N clients (default 200), one thread and connection each, loop for
 * S seconds (default 120) over: get of a random key (90%), warmup of the
 * config (5%), stats (5%); they disconnect, a last stats request settles
 * the daemon, and "after" is read.  The RssAnon right after start is
 * printed too.
 *
 * --hostile (issue 11) adds, for the same time: a warmup of a new
 * 5,000-key deployment every minute (compiles made instant by the test
 * hook, so they cost kwarmd's own work only) with an evict of one of its
 * keys after each; and the hostile clients of tests/test_daemon_hostile.c
 * in a loop: one that pipelines gets and never reads, a slow reader, one
 * sending random bytes, 100 idle connections, and connects and
 * disconnects at full speed; and (issue 23) clients that send a keys
 * request of 4,000 ranks, an all-hit warmup, an ls and a misses and never
 * read them.  The well-behaved clients must still see no
 * failed request.  Exit 1 on any failed request (in either pass) or on
 * growth from "before" to "after" beyond 8 MiB of anonymous resident
 * memory or by any descriptor.
 *
 * --rounds R (default 1) runs the S seconds R times, reading the daemon's
 * usage once it is idle after each round, so a long soak shows whether
 * memory levels off (a leak grows every round) rather than only where it
 * ended; "after" is the last round's.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_util.h"
#include "kw_client.h"
#include "kw_err.h"

#define MODEL "tests/fixtures/deepseek-v3.2-exp.json"
#define SOAK_WARM_S 15.0 /* the first pass, before "before" */
#define SOAK_RSS_KB (8 * 1024) /* growth allowed over the run */
#define SOAK_MAX_ROUNDS 100

typedef struct shared {
    const char *sock;
    char *config;          /* the config file's text */
    char (*digests)[65];
    size_t ndigests;
    double deadline;
    int world; /* the next DCP world of the big warmups */
    _Atomic uint64_t gets, warmups, stats, failed;
    _Atomic uint64_t big_warmups, evicts, hostile_conns;
} shared;


/* Anonymous resident KiB (the heap: what a leak grows; file-backed pages
 * of the LMDB map and libraries are the page cache's) and open
 * descriptors of pid, from /proc. */
static void proc_usage(pid_t pid, long *rss_kb, long *fds)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    *rss_kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "RssAnon:", 8) == 0)
            *rss_kb = strtol(line + 8, NULL, 10);
    if (f)
        fclose(f);
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    *fds = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        *fds += e->d_name[0] != '.';
    if (d)
        closedir(d);
}

#include "soak_hostile.h"

/* One client: its own connection, the mix above until the deadline. */
static void *client(void *arg)
{
    shared *s = arg;
    kw_client *c = NULL;
    char err[256];
    unsigned seed = (unsigned)(uintptr_t)&c;
    if (kw_client_connect(&c, s->sock, 30000, err, sizeof err) < 0) {
        atomic_fetch_add(&s->failed, 1);
        return NULL;
    }
    while (bench_now_ns() < s->deadline) {
        int r = rand_r(&seed) % 100, rc;
        const char *what = r < 90 ? "get" : r < 95 ? "warmup" : "stats";
        if (r < 90) {
            kw_client_kernel k = {0};
            rc = kw_client_get(c, s->digests[rand_r(&seed) % s->ndigests], false, &k);
            kw_client_kernel_destroy(&k);
            atomic_fetch_add(&s->gets, 1);
        } else if (r < 95) {
            char *res = NULL;
            rc = kw_client_warmup(c, s->config, "{\"dcp_world\": 2}", "soak.json",
                                  NULL, NULL, &res);
            free(res);
            atomic_fetch_add(&s->warmups, 1);
        } else {
            char *res = NULL;
            rc = kw_client_stats(c, &res);
            free(res);
            atomic_fetch_add(&s->stats, 1);
        }
        if (rc == 0)
            continue;
        if (atomic_fetch_add(&s->failed, 1) < 5)
            fprintf(stderr, "soak: a %s failed: %s\n", what, kw_client_last_error(c));
        /* A failure closes the connection: count it once, go on anew. */
        kw_client_close(c);
        c = NULL;
        if (kw_client_connect(&c, s->sock, 30000, err, sizeof err) < 0) {
            atomic_fetch_add(&s->failed, 1);
            return NULL;
        }
    }
    kw_client_close(c);
    return NULL;
}

/* Reads the warmup result's manifest digests into s. */
static int manifest(shared *s, const char *result)
{
    cJSON *doc = cJSON_Parse(result), *man = cJSON_GetObjectItem(doc, "manifest");
    int n = cJSON_GetArraySize(man), i = 0;
    s->digests = calloc((size_t)n + 1, sizeof *s->digests);
    for (const cJSON *k = man ? man->child : NULL; k; k = k->next, i++)
        snprintf(s->digests[i], 65, "%s", cJSON_GetObjectItem(k, "digest")->valuestring);
    s->ndigests = (size_t)i;
    cJSON_Delete(doc);
    return i > 0 ? 0 : -1;
}

/* Connections the daemon reports (our own included), or -1. */
static long daemon_connections(kw_client *c)
{
    char *res = NULL;
    long n = -1;
    if (kw_client_stats(c, &res) == 0) {
        cJSON *doc = cJSON_Parse(res);
        const cJSON *v = cJSON_GetObjectItem(doc, "connections");
        n = cJSON_IsNumber(v) ? (long)v->valuedouble : -1;
        cJSON_Delete(doc);
    }
    free(res);
    return n;
}

/* Streamed requests whose clients never read (issue 23), round after
 * round while the soak lasts: a keys request of a big deployment, an
 * all-hit warmup of the config, an ls and a misses, each on its own
 * connection, held 3 s unread and dropped.  kwarmd must keep each reply
 * within its stream's budget (--max-output) and serve everyone else. */
static void *soak_unread_streams(void *arg)
{
    shared *s = arg;
    cJSON *keys = cJSON_CreateObject(), *warm = cJSON_CreateObject();
    cJSON_AddItemToObject(keys, "config", cJSON_Parse(s->config));
    cJSON_AddItemToObject(cJSON_AddObjectToObject(keys, "deployment"),
                          "dcp_world", cJSON_CreateNumber(4000));
    cJSON_AddItemToObject(warm, "config", cJSON_Parse(s->config));
    const struct { uint16_t type; const cJSON *h; } reqs[] = {
        {KW_PROTO_KEYS, keys}, {KW_PROTO_WARMUP, warm}, {KW_PROTO_LS, NULL},
        {KW_PROTO_MISSES, NULL}};
    uint8_t *frame[4] = {NULL};
    size_t len[4] = {0};
    for (int i = 0; i < 4; i++)
        if (kw_proto_encode(reqs[i].type, reqs[i].h, NULL, 0, &frame[i], &len[i]) < 0)
            goto out;
    while (bench_now_ns() < s->deadline) {
        int fd[4];
        for (int i = 0; i < 4; i++) {
            fd[i] = soak_connect(s->sock, true);
            if (fd[i] >= 0)
                soak_push(fd[i], frame[i], len[i], 200);
        }
        nanosleep(&(struct timespec){3, 0}, NULL); /* unread, on purpose */
        for (int i = 0; i < 4; i++)
            if (fd[i] >= 0)
                close(fd[i]);
        atomic_fetch_add(&s->hostile_conns, 4);
    }
out:
    for (int i = 0; i < 4; i++)
        free(frame[i]);
    cJSON_Delete(keys);
    cJSON_Delete(warm);
    return NULL;
}

/* Runs the mix for secs: nclients clients, and with hostile the big
 * warmups and the hostile clients; returns once all have disconnected
 * and kwarmd counts only c's connection (bounded wait). */
static void run_mix(shared *s, kw_client *c, int nclients, double secs,
                    bool hostile)
{
    pthread_t *t = calloc((size_t)nclients, sizeof *t), extra[3];
    s->deadline = bench_now_ns() + secs * 1e9;
    for (int i = 0; t != NULL && i < nclients; i++)
        pthread_create(&t[i], NULL, client, s);
    if (hostile) {
        pthread_create(&extra[0], NULL, soak_big_warmups, s);
        pthread_create(&extra[1], NULL, soak_hostile, s);
        pthread_create(&extra[2], NULL, soak_unread_streams, s);
    }
    for (int i = 0; t != NULL && i < nclients; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; hostile && i < 3; i++)
        pthread_join(extra[i], NULL);
    free(t);
    for (int i = 0; i < 500 && daemon_connections(c) != 1; i++) /* bounded settle */
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
}

/* Reads kwarmd's usage once it is idle: it returns its idle heap on a
 * timer tick (2 s), so after two ticks, then (bounded) until it is within
 * the aim. */
static void settle(pid_t pid, long rss0, long fds0, long *rss, long *fds)
{
    nanosleep(&(struct timespec){5, 0}, NULL);
    for (int i = 0; i < 100; i++) {
        proc_usage(pid, rss, fds);
        if (*rss - rss0 <= SOAK_RSS_KB && *fds <= fds0)
            break;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
}

typedef struct soak_opts {
    const char *bin, *json, *loops;
    int nclients, rounds;
    double secs;
    bool hostile;
} soak_opts;

/* kwarmd's usage: at start, after the first pass, after each round. */
typedef struct soak_usage {
    long rss_start, fds_start, rss0, fds0;
    long rss[SOAK_MAX_ROUNDS], fds[SOAK_MAX_ROUNDS];
} soak_usage;

static const char soak_usage_text[] =
    "usage: bench_soak --kwarmd PATH [--loops N] [--clients N] "
    "[--seconds S] [--rounds R] [--hostile] [--json FILE]";

/* Parses argv into o; 0, or 2 after printing the usage. */
static int parse(soak_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--hostile") == 0) {
            o->hostile = true;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--kwarmd") == 0)
            o->bin = argv[i + 1];
        else if (strcmp(argv[i], "--clients") == 0)
            o->nclients = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            o->secs = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--json") == 0)
            o->json = argv[i + 1];
        else if (strcmp(argv[i], "--loops") == 0)
            o->loops = argv[i + 1];
        else if (strcmp(argv[i], "--rounds") == 0)
            o->rounds = atoi(argv[i + 1]);
    }
    if (o->bin == NULL || o->nclients < 1 || o->nclients > 4096 || o->secs <= 0 ||
        o->rounds < 1 || o->rounds > SOAK_MAX_ROUNDS) {
        fprintf(stderr, "%s\n", soak_usage_text);
        return 2;
    }
    return 0;
}

/* Prints the outcome (and writes the JSON); true when it met the aim. */
static bool report(const soak_opts *o, const shared *s, const soak_usage *u)
{
    long rss1 = u->rss[o->rounds - 1], fds1 = u->fds[o->rounds - 1];
    uint64_t total = s->gets + s->warmups + s->stats;
    bool ok = s->failed == 0 && fds1 <= u->fds0 && rss1 - u->rss0 <= SOAK_RSS_KB;
    printf("soak: %d clients for %.0f s: %llu requests (%llu gets, %llu warmups, %llu stats), "
           "%llu failed (with the first pass)\n", o->nclients, o->secs * o->rounds,
           (unsigned long long)total, (unsigned long long)s->gets,
           (unsigned long long)s->warmups, (unsigned long long)s->stats,
           (unsigned long long)s->failed);
    if (o->hostile)
        printf("beside them: %llu warmups of about 5,000 new keys, %llu evicts, "
               "%llu hostile connections\n", (unsigned long long)s->big_warmups,
               (unsigned long long)s->evicts, (unsigned long long)s->hostile_conns);
    printf("kwarmd at start: %ld KiB anonymous resident, %ld fds; after the first "
           "%.0f s: %ld KiB, %ld fds;\nafter the run: %ld KiB, %ld fds (aim: growth of at most "
           "%d KiB and no descriptor above the first pass): %s\n",
           u->rss_start, u->fds_start, SOAK_WARM_S, u->rss0, u->fds0, rss1, fds1,
           SOAK_RSS_KB, ok ? "ok" : "FAILED");
    for (int r = 0; o->rounds > 1 && r < o->rounds; r++)
        printf("round %d (%.0f s): %ld KiB, %ld fds\n", r + 1, o->secs, u->rss[r], u->fds[r]);
    FILE *f = o->json ? fopen(o->json, "w") : NULL;
    if (f) {
        fprintf(f, "{\"clients\": %d, \"seconds\": %.0f, \"rounds\": %d, \"requests\": %llu, "
                "\"failed\": %llu, \"rss_anon_kb\": [%ld, %ld, %ld], \"fds\": [%ld, %ld, %ld], "
                "\"round_rss_anon_kb\": [", o->nclients, o->secs, o->rounds,
                (unsigned long long)total, (unsigned long long)s->failed, u->rss_start,
                u->rss0, rss1, u->fds_start, u->fds0, fds1);
        for (int r = 0; r < o->rounds; r++)
            fprintf(f, "%s%ld", r ? ", " : "", u->rss[r]);
        fprintf(f, "]}\n");
        fclose(f);
    }
    return ok;
}

/* The first pass, then the rounds, reading kwarmd's usage between. */
static void soak(const soak_opts *o, shared *s, kw_client *c, pid_t pid, soak_usage *u)
{
    proc_usage(pid, &u->rss_start, &u->fds_start);
    s->world = 400;
    run_mix(s, c, o->nclients, SOAK_WARM_S, o->hostile);
    nanosleep(&(struct timespec){5, 0}, NULL); /* 2 ticks of the idle trim */
    proc_usage(pid, &u->rss0, &u->fds0);
    /* count the run alone, but failures of both passes */
    s->gets = s->warmups = s->stats = s->big_warmups = s->evicts = s->hostile_conns = 0;
    for (int r = 0; r < o->rounds; r++) {
        run_mix(s, c, o->nclients, o->secs, o->hostile);
        settle(pid, u->rss0, u->fds0, &u->rss[r], &u->fds[r]);
        if (o->rounds > 1)
            fprintf(stderr, "soak: round %d of %d: %ld KiB anonymous resident, "
                    "%ld fds\n", r + 1, o->rounds, u->rss[r], u->fds[r]);
    }
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, soak_usage_text))
        return 0;
    soak_opts o = {.nclients = 200, .rounds = 1, .secs = 120};
    int rc = parse(&o, argc, argv);
    if (rc != 0)
        return rc;
    if (o.hostile) /* the 5,000-key warmups cost kwarmd's work, not NVRTC's */
        setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1);
    bench_tmp tmp;
    shared s = {.sock = tmp.sock, .config = bench_slurp(MODEL)};
    kw_client *c = NULL;
    char *res = NULL;
    if (s.config == NULL) {
        fprintf(stderr, "soak: cannot read %s: run from the repository root\n", MODEL);
        return 1;
    }
    if (bench_tmp_make(&tmp, "soak") < 0)
        return 1;
    pid_t pid = bench_start_kwarmd(o.bin, tmp.sock, tmp.cache, "2", o.loops, &c);
    if (pid < 0 || kw_client_warmup(c, s.config, "{\"dcp_world\": 2}", "soak.json",
                                    NULL, NULL, &res) < 0 || manifest(&s, res) < 0) {
        fprintf(stderr, "soak: set-up failed\n");
        return 1;
    }
    free(res);
    soak_usage u;
    soak(&o, &s, c, pid, &u);
    bool ok = report(&o, &s, &u);
    kw_client_close(c);
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    ok = bench_tmp_remove(&tmp) == 0 && ok;
    return ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
