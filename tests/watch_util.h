/* watch_util.h: what a test watches while kwarmd works: its anonymous
 * resident memory, and a well-behaved client that pings throughout and
 * records each latency.  Header-only, for test_daemon_budget,
 * test_daemon_scale and test_daemon_hostile (include daemon_util.h
 * first). */
#ifndef WATCH_UTIL_H
#define WATCH_UTIL_H

#include <stdatomic.h>
#include <stdlib.h>

/* RssAnon of pid in KiB (anonymous resident memory: the heap, not the
 * LMDB map, whose pages belong to the page cache); -1 when pid is gone.
 * Asserts nothing: the pinger's thread calls it too. */
static inline long kwd_rss_anon_try(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "RssAnon: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* The same, asserting that pid is there. */
static inline long kwd_rss_anon_kib(pid_t pid)
{
    long kib = kwd_rss_anon_try(pid);
    cr_assert(kib >= 0, "no RssAnon for pid %d", (int)pid);
    return kib;
}

/* True when the machine's load (the 1-minute average) is past its cores:
 * the scheduler, not kwarmd, then decides when a client runs, and a
 * test's latency bounds are relaxed (issue 23, point 7). */
static inline bool kwd_machine_loaded(void)
{
    double load = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &load) != 1)
            load = 0;
        fclose(f);
    }
    return load > (double)sysconf(_SC_NPROCESSORS_ONLN);
}

#define KWD_PINGS_MAX 200000

/* A client on sock that pings until stop (or KWD_PINGS_MAX pings), each
 * answered within 1 s, pace_ms apart (0: back to back; a pace, not a
 * synchronisation).  failed: 1 could not connect, 2 a ping went
 * unanswered, 4 an answer was not PONG.  With rss_pid set, RssAnon of
 * that process is sampled before every ping and its largest value kept
 * in rss_peak (KiB): a peak between two samples of a test's own thread
 * is then seen too.  calloc it: lat is large. */
typedef struct kwd_pinger {
    const char *sock;
    long pace_ms;
    pid_t rss_pid;
    _Atomic long rss_peak;
    _Atomic bool stop;
    double lat[KWD_PINGS_MAX]; /* ms */
    size_t n;
    int failed;
} kwd_pinger;

/* The pinger's thread (pthread_create(..., kwd_ping_main, p)). */
static inline void *kwd_ping_main(void *arg)
{
    kwd_pinger *p = arg;
    kwc c;
    if (kwc_open(&c, p->sock) != 0) {
        p->failed = 1;
        return NULL;
    }
    while (!atomic_load(&p->stop) && p->n < KWD_PINGS_MAX) {
        struct timespec a, b;
        kwr r;
        long rss = p->rss_pid > 0 ? kwd_rss_anon_try(p->rss_pid) : -1;
        if (rss > atomic_load(&p->rss_peak))
            atomic_store(&p->rss_peak, rss);
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (kwc_send(&c, KW_PROTO_PING, NULL) != 0 || kwc_recv(&c, &r, 1000) != 0) {
            p->failed = 2;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        p->failed |= r.type != KW_PROTO_PONG ? 4 : 0;
        kwr_free(&r);
        p->lat[p->n++] = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
        if (p->pace_ms > 0)
            kwd_nap_ms(p->pace_ms);
    }
    kwc_close(&c);
    return NULL;
}

static inline int kwd_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The 99th percentile of the pinger's latencies in ms (sorts them). */
static inline double kwd_pinger_p99(kwd_pinger *p)
{
    qsort(p->lat, p->n, sizeof *p->lat, kwd_cmp_double);
    return p->n ? p->lat[(p->n * 99) / 100] : 0;
}

#endif /* WATCH_UTIL_H */
