/* test_daemon_budget.c: every streamed reply within its budget (issue
 * 23).  Clients that send a request whose reply grows with it (keys, an
 * all-hit warmup, ls) and never read: kwarmd's anonymous memory follows
 * its caps (--max-output per stream, --max-keys-in-flight over the
 * daemon), not how fast they read, while a well-behaved client's pings
 * are answered throughout.  The stream is intact: a non-reader that
 * finally reads gets every item and the RESULT.
 */
#include "daemon_util.h"
#include "watch_util.h"
#include "kw_warm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/ioctl.h>

TestSuite(budget, .fini = kwd_cleanup, .timeout = 600);

#define V4 "deepseek-v4-flash.json"
#define V32 "deepseek-v3.2-exp.json"
#define GROWTH_KIB (64 * 1024) /* the bound on RssAnon growth */
/* The bound on the well-behaved client's ping p99: 5 ms.  Under
 * ASan (every allocation of the loop slowed), or on a machine whose load
 * is past its cores (the scheduler, not kwarmd, then decides when the
 * pinger runs: issue 23, point 7), the bound is 20 ms. */
static double ping_bound_ms(void)
{
#ifdef __SANITIZE_ADDRESS__
    return 20.0;
#else
    return kwd_machine_loaded() ? 20.0 : 5.0;
#endif
}

/* ---- a well-behaved client, pinging throughout ---------------------------- */


/* ---- non-readers ---------------------------------------------------------- */

/* Bytes queued for reading on fd. */
static int pending(int fd)
{
    int n = 0;
    cr_assert_eq(ioctl(fd, FIONREAD, &n), 0);
    return n;
}

/* Waits until every one of fds[0..n) has bytes waiting and none got more
 * for 500 ms (the producers stopped on their budget); returns kwarmd's
 * RssAnon then.  A bounded poll of state, not a sleep standing in for an
 * event. */
static long wait_parked(const kwd *d, const int *fds, size_t n)
{
    int64_t deadline = kwd_now_ms() + 120000, still_since = kwd_now_ms();
    long last_total = -1;
    for (;;) {
        long total = 0;
        bool all = true;
        for (size_t i = 0; i < n; i++) {
            int p = pending(fds[i]);
            total += p;
            all = all && p > 0;
        }
        if (total != last_total || !all)
            still_since = kwd_now_ms();
        last_total = total;
        if (all && kwd_now_ms() - still_since >= 500) {
            long rss = kwd_rss_anon_kib(d->pid);
            cr_log_info("settled: RssAnon %ld KiB, %ld bytes unread", rss,
                        total);
            return rss;
        }
        cr_assert(kwd_now_ms() < deadline, "the streams never settled");
        kwd_nap_ms(20);
    }
}

/* A keys/warmup header for V4 at DCP world dcp on sm_90 and sm_100. */
static cJSON *v4_hdr(int dcp)
{
    cJSON *h = kwd_model_hdr(V4, 0);
    cJSON_DeleteItemFromObjectCaseSensitive(h, "deployment");
    cJSON *dep = cJSON_AddObjectToObject(h, "deployment");
    cJSON_AddNumberToObject(dep, "dcp_world", dcp);
    cJSON_AddStringToObject(dep, "arch", "sm_90,sm_100");
    return h;
}

/* Reads one frame of c's streamed reply: true for the final frame, put
 * in *fin; else its items are added to *n. */
static bool drain_step(kwc *c, size_t *n, kwr *fin)
{
    kwr r = kwc_must_recv(c, KWD_REPLY_MS);
    if (r.type != KW_PROTO_PROGRESS) {
        *fin = r;
        return true;
    }
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(r.hdr, "keys");
    if (a == NULL)
        a = cJSON_GetObjectItemCaseSensitive(r.hdr, "results");
    if (a == NULL)
        a = cJSON_GetObjectItemCaseSensitive(r.hdr, "entries");
    *n += (size_t)cJSON_GetArraySize(a);
    kwr_free(&r);
    return false;
}

/* Reads c's streamed reply to its end; returns the items and the final
 * frame in *fin. */
static size_t drain(kwc *c, kwr *fin)
{
    size_t n = 0;
    while (!drain_step(c, &n, fin))
        ;
    return n;
}

/* Reads the streamed replies of cs[0..k) to their ends, a frame of each
 * in turn: n[i] gets the items of cs[i], fin[i] its final frame.  Not one
 * after the other, so that no stream is left unread for long while the
 * others are read (reading three 480,000-key streams in ASan on a loaded
 * machine takes minutes). */
static void drain_all(kwc *cs, size_t k, size_t *n, kwr *fin)
{
    bool over[8] = {false};
    cr_assert(k <= 8);
    for (size_t left = k; left > 0;)
        for (size_t i = 0; i < k; i++)
            if (!over[i] && drain_step(&cs[i], &n[i], &fin[i])) {
                over[i] = true;
                left--;
            }
}

/* Warms h (V4 at a DCP world of the scene) on c, whose kwarmd compiles
 * with the instant stand-in; returns the key count. */
static double warm_all(kwc *c, const cJSON *h)
{
    cr_assert_eq(kwc_send(c, KW_PROTO_WARMUP, h), 0);
    kwr fin;
    drain(c, &fin);
    kwr_expect_type(&fin, KW_PROTO_RESULT, "the first warmup");
    double keys = kwr_num(&fin, "keys");
    cr_assert(keys >= 19000, "%g keys", keys);
    cr_log_info("the cache holds %g keys", keys);
    kwr_free(&fin);
    return keys;
}

typedef struct scene {
    kwd d;
    kwc good;
    kwd_pinger *p;
    pthread_t th;
    long rss0;
} scene;

/* Takes kwarmd's RssAnon as the scene's start and starts the pinger,
 * which samples RssAnon before each of its pings (the peak). */
static void scene_ping(scene *s)
{
    s->rss0 = kwd_rss_anon_kib(s->d.pid);
    s->p = calloc(1, sizeof *s->p);
    cr_assert_not_null(s->p);
    s->p->sock = s->d.sock;
    s->p->pace_ms = 1; /* ~1000 pings/s */
    s->p->rss_pid = s->d.pid;
    s->p->rss_peak = s->rss0;
    cr_assert_eq(pthread_create(&s->th, NULL, kwd_ping_main, s->p), 0);
}

/* kwarmd's options in a scene: extra (NULL-terminated, at most 4) and
 * --idle-timeout 10 minutes.  Its clients read nothing until the test
 * reads them, which on a loaded machine under ASan is more than the
 * default 60 s after a stream parked (eight 480,000-key derivations share
 * the cores first): the default would drop them (the rule
 * test_daemon_hostile tests), and the test would read an EOF. */
static const char *const *scene_args(const char *args[8],
                                     const char *const *extra)
{
    size_t n = 0;
    for (; extra != NULL && extra[n] != NULL; n++) {
        cr_assert(n < 5);
        args[n] = extra[n];
    }
    args[n++] = "--idle-timeout";
    args[n++] = "600000";
    args[n] = NULL;
    return args;
}

static void scene_up(scene *s, const char *tag, const char *const *extra)
{
    const char *args[8];
    kwd_up(&s->d, tag, 1, scene_args(args, extra), &s->good);
    kwc_expect_pong(&s->good, "start");
    scene_ping(s);
}

/* A scene on a cache that already holds every key of h: filled by a first
 * kwarmd with the instant stand-in compiler, then served by a second one
 * started on it, so the scene starts from a kwarmd that has done nothing
 * (the filling warmup's own heap, hundreds of MB at 480,000 keys, is not
 * the scene's start).  Returns the keys the cache holds. */
static double scene_up_filled(scene *s, const char *tag,
                              const char *const *extra, const cJSON *h)
{
    const char *args[8];
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "64", 1), 0);
    kwd_up(&s->d, tag, 1, scene_args(args, extra), &s->good);
    double keys = warm_all(&s->good, h);
    kwd_down(&s->d, &s->good);
    kwd_start(&s->d, 1, args);
    kwc_must_open(&s->good, s->d.sock);
    kwc_expect_pong(&s->good, "restart on the filled cache");
    scene_ping(s);
    return keys;
}

/* Stops the pinger and checks the well-behaved client was served and
 * the growth, settled and at its peak, stayed within GROWTH_KIB. */
static void scene_check(scene *s, long rss, const char *what)
{
    atomic_store(&s->p->stop, true);
    pthread_join(s->th, NULL);
    double q = kwd_pinger_p99(s->p);
    long peak = atomic_load(&s->p->rss_peak);
    peak = peak > rss ? peak : rss;
    cr_log_info("%s: RssAnon %ld KiB at start, %ld KiB settled (+%ld), peak "
                "%ld KiB (+%ld); %zu pings, p99 %.3f ms", what, s->rss0, rss,
                rss - s->rss0, peak, peak - s->rss0, s->p->n, q);
    cr_expect_eq(s->p->failed, 0, "%s: a ping failed", what);
    cr_expect(s->p->n >= 100, "%s: only %zu pings", what, s->p->n);
    double bound = ping_bound_ms();
    cr_expect(q < bound, "%s: ping p99 %.3f ms (bound %.0f ms)", what, q, bound);
#ifndef __SANITIZE_ADDRESS__
    cr_expect(rss - s->rss0 < GROWTH_KIB, "%s: RssAnon grew by %ld KiB",
              what, rss - s->rss0);
    cr_expect(peak - s->rss0 < GROWTH_KIB, "%s: RssAnon peaked %ld KiB "
              "over its start", what, peak - s->rss0);
#endif
    free(s->p);
}

/* Sends request type with hdr on n new connections that do not read. */
static void send_all(scene *s, kwc *cs, size_t n, uint16_t type, const cJSON *hdr)
{
    for (size_t i = 0; i < n; i++) {
        kwc_must_open(&cs[i], s->d.sock);
        cr_assert_eq(kwc_send(&cs[i], type, hdr), 0);
    }
}

/* One client asks for about 500,000 keys and never reads, at kwarmd's
 * defaults (but scene_args()'s --idle-timeout).  The growth is the
 * packed key set (about 3 bytes a key: 1.3 MB), the stream's budget
 * (--max-output, 16 MiB) and the derivation's peak. */
Test(budget, a_500000_key_keys_request_unread_stays_within_the_budget)
{
    scene s;
    scene_up(&s, "kwb-keys", NULL);
    cJSON *h = v4_hdr(40000);
    kwc c;
    send_all(&s, &c, 1, KW_PROTO_KEYS, h);
    long rss = wait_parked(&s.d, &c.fd, 1);
    scene_check(&s, rss, "one unread keys request");
    kwr fin;
    size_t n = drain(&c, &fin);
    kwr_expect_type(&fin, KW_PROTO_RESULT, "keys, read at last");
    cr_expect_eq(kwr_num(&fin, "count"), (double)n, "every key arrived");
    cr_expect(n >= 450000, "%zu keys", n);
    kwr_free(&fin);
    kwc_close(&c);
    cJSON_Delete(h);
    kwd_down(&s.d, &s.good);
}

/* Eight clients ask for about 500,000 keys each at once and never read,
 * at kwarmd's defaults (but --idle-timeout): the budget of keys in
 * flight (2,000,000) admits four and refuses the others with an error
 * naming it; the four streams together hold at most --max-output
 * (KW__STREAMS_TOTAL), not a budget each. */
Test(budget, eight_unread_keys_requests_are_bounded_by_the_keys_in_flight)
{
    scene s;
    scene_up(&s, "kwb-keys8", NULL);
    cJSON *h = v4_hdr(40000);
    kwc c[8];
    int fds[8];
    send_all(&s, c, 8, KW_PROTO_KEYS, h);
    for (size_t i = 0; i < 8; i++)
        fds[i] = c[i].fd;
    long rss = wait_parked(&s.d, fds, 8);
    scene_check(&s, rss, "eight unread keys requests");
    size_t n[8] = {0}, results = 0, refused = 0;
    kwr fin[8];
    drain_all(c, 8, n, fin);
    for (size_t i = 0; i < 8; i++) {
        if (fin[i].type == KW_PROTO_RESULT &&
            kwr_num(&fin[i], "count") == (double)n[i])
            results++;
        if (fin[i].type == KW_PROTO_ERROR &&
            strstr(kwr_str(&fin[i], "error"), "--max-keys-in-flight") != NULL)
            refused++;
        kwr_free(&fin[i]);
        kwc_close(&c[i]);
    }
    cr_log_info("%zu admitted, %zu refused", results, refused);
    cr_expect_eq(results, 4, "2,000,000 keys in flight admit four, whole");
    cr_expect_eq(refused, 4, "the others refused, naming the budget");
    cJSON_Delete(h);
    kwd_down(&s.d, &s.good);
}

/* The DCP world of the all-hit warmup and ls scenes: 1600 (about 20,000
 * keys) in make test; KWARM_TEST_BUDGET_DCP=40000 runs them at the
 * issue's size (about 480,000 keys: a few minutes, so opt-in). */
static int scene_dcp(void)
{
    const char *v = getenv("KWARM_TEST_BUDGET_DCP");
    int dcp = v != NULL ? atoi(v) : 0;
    return dcp > 0 ? dcp : 1600;
}

/* k clients send an all-hit warmup of about 20,000 keys (480,348 at
 * KWARM_TEST_BUDGET_DCP=40000) and never read: their warm jobs pause at
 * the budget (the lookups stop: warm_hits stays far below k x the keys),
 * each holding its keys packed (about 20 bytes a key with its guard),
 * and one that reads at last gets every result. */
static void unread_warmups(size_t k, const char *tag)
{
    scene s;
    cJSON *h = v4_hdr(scene_dcp());
    double keys = scene_up_filled(&s, tag, (const char *const[]){
                                      "--max-output", "64K", NULL}, h);
    double hits0 = kwc_stat(&s.good, "warm_hits");
    kwc c[8];
    int fds[8];
    send_all(&s, c, k, KW_PROTO_WARMUP, h);
    for (size_t i = 0; i < k; i++)
        fds[i] = c[i].fd;
    /* A warmup derives, checks its plan and protects its keys before its
     * first lookup, and a heartbeat may come first: its stream is settled
     * only once its lookups began (a bounded poll of a counter). */
    int64_t deadline = kwd_now_ms() + 120000;
    while (kwc_stat(&s.good, "warm_hits") - hits0 < KW_WARM_CHUNK) {
        cr_assert(kwd_now_ms() < deadline, "no lookup began");
        kwd_nap_ms(20);
    }
    long rss = wait_parked(&s.d, fds, k);
    double looked = kwc_stat(&s.good, "warm_hits") - hits0;
    cr_log_info("%g of %g lookups made while nobody read", looked, k * keys);
    cr_expect(looked < k * keys / 2, "the warm jobs did not pause: %g hits",
              looked);
    char what[64];
    snprintf(what, sizeof what, "%zu unread all-hit warmup%s", k, k > 1 ? "s" : "");
    scene_check(&s, rss, what);
    kwr fin;
    size_t n = drain(&c[0], &fin);
    kwr_expect_type(&fin, KW_PROTO_RESULT, "the warmup read at last");
    cr_expect_eq((double)n, keys, "every result arrived");
    cr_expect_eq(kwr_num(&fin, "hits"), keys);
    kwr_free(&fin);
    for (size_t i = 0; i < k; i++)
        kwc_close(&c[i]);
    cJSON_Delete(h);
    kwd_down(&s.d, &s.good);
}

Test(budget, one_unread_all_hit_warmup_pauses_its_lookups)
{
    unread_warmups(1, "kwb-warm1");
}

Test(budget, eight_unread_all_hit_warmups_pause_their_lookups)
{
    unread_warmups(8, "kwb-warm");
}

/* Eight clients list a cache of about 20,000 entries and never read: the
 * listing is read a page at a time as the stream drains, so the memory
 * does not follow the cache's size; one that reads gets every entry. */
Test(budget, eight_unread_ls_of_a_large_cache_stay_within_the_budget)
{
    scene s;
    cJSON *h = v4_hdr(scene_dcp());
    double keys = scene_up_filled(&s, "kwb-ls", (const char *const[]){
                                      "--max-output", "64K", NULL}, h);
    kwc c[8];
    int fds[8];
    send_all(&s, c, 8, KW_PROTO_LS, NULL);
    for (size_t i = 0; i < 8; i++)
        fds[i] = c[i].fd;
    long rss = wait_parked(&s.d, fds, 8);
    scene_check(&s, rss, "eight unread ls");
#ifndef __SANITIZE_ADDRESS__ /* ASan's quarantine keeps freed memory */
    cr_expect(rss - s.rss0 < 16 * 1024, "ls grew by %ld KiB: not paged",
              rss - s.rss0);
#endif
    kwr fin;
    size_t n = drain(&c[0], &fin);
    kwr_expect_type(&fin, KW_PROTO_RESULT, "ls read at last");
    cr_expect_eq((double)n, keys, "every entry arrived");
    cr_expect_eq(kwr_num(&fin, "count"), keys);
    kwr_free(&fin);
    for (size_t i = 0; i < 8; i++)
        kwc_close(&c[i]);
    cJSON_Delete(h);
    kwd_down(&s.d, &s.good);
}
