/* test_daemon_scale.c: kwarmd at the sizes fleets reach (issue 10).
 *
 * Replies of any size stream in bounded frames; a warmup of over 10,000
 * keys completes (compiles made instant by the kwarm-compile test hook
 * KWARM_TEST_INSTANT_COMPILE, so CI stays fast); SIGTERM with about
 * 100,000 keys queued exits 0 within 5 s and reports them cancelled, its
 * grace extended while a client reads and closed at its cap; the
 * loop keeps answering pings while a 20,000-key warmup is submitted and
 * while an evict waits for another process's LMDB writer lock.
 */
#include "daemon_util.h"
#include "watch_util.h"

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>

/* Each test's daemons are killed and their directories removed. */
TestSuite(scale, .fini = kwd_cleanup);

#define V4 "deepseek-v4-flash.json"

/* A model header for fixture with deployment {dcp_world, arch}. */
static cJSON *model_hdr(const char *fixture, int dcp, const char *arch)
{
    cJSON *h = kwd_model_hdr(fixture, 0);
    cJSON_DeleteItemFromObjectCaseSensitive(h, "deployment");
    cJSON *dep = cJSON_AddObjectToObject(h, "deployment");
    cJSON_AddNumberToObject(dep, "dcp_world", dcp);
    cJSON_AddStringToObject(dep, "arch", arch);
    return h;
}

/* Reads a streamed reply to its end: items into *items (may be NULL),
 * frames that carry items counted; every PROGRESS frame within the caps. */
static kwr read_stream(kwc *c, cJSON *items, size_t *nframes, size_t *nitems)
{
    size_t frames = 0, n = 0;
    for (;;) {
        kwr r = kwc_must_recv(c, KWD_REPLY_MS);
        if (r.type != KW_PROTO_PROGRESS) {
            *nframes = frames;
            *nitems = n;
            return r;
        }
        cJSON *tmp = cJSON_CreateArray();
        size_t k = kwc_take_items(&r, items ? items : tmp);
        /* 0 items: a warmup's heartbeat, sent after 2 s without a frame
         * (a loaded machine's derivation or plan can take that long). */
        frames += k > 0;
        cr_assert(k <= 256, "a PROGRESS frame of %zu items", k);
        n += k;
        cJSON_Delete(tmp);
        kwr_free(&r);
    }
}

/* Sets the instant-compile hook for the kwarmd (and kwarm-compile) this
 * test process starts. */
static void instant(void)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
}

/* ---- streamed replies --------------------------------------------------- */

Test(scale, keys_reply_of_any_size_is_streamed_and_complete)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-keys", 1, NULL, &c);
    /* 432 keys used to fail ("reply could not be encoded"); 12,636 too. */
    const int worlds[] = {8, 1024};
    for (size_t i = 0; i < 2; i++) {
        cJSON *h = model_hdr(V4, worlds[i], "sm_90,sm_100");
        size_t frames, n;
        cJSON *keys = cJSON_CreateArray();
        cr_assert_eq(kwc_send(&c, KW_PROTO_KEYS, h), 0);
        kwr r = read_stream(&c, keys, &frames, &n);
        kwr_expect_type(&r, KW_PROTO_RESULT, "keys");
        cr_expect_eq(kwr_num(&r, "count"), (double)n, "count vs streamed keys");
        cr_expect_eq(frames, (n + 255) / 256, "frames of 256 keys");
        cr_expect(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(r.hdr, "settings")),
                  "the RESULT keeps the document's settings");
        /* The same digests as `kwarm keys` prints for that deployment. */
        char w[16];
        snprintf(w, sizeof w, "%d", worlds[i]);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V4);
        const char *argv[] = {KW_KWARM_BIN, "keys", "--model", path, "--json",
                              "--dcp-world", w, "--arch", "sm_90,sm_100", NULL};
        char *out = NULL, *err = NULL;
        cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
        cJSON *doc = cJSON_Parse(out);
        cJSON *want = kwd_digests(cJSON_GetObjectItemCaseSensitive(doc, "keys"));
        cJSON *got = kwd_digests(keys);
        cr_expect_eq(cJSON_GetArraySize(got), cJSON_GetArraySize(want));
        cr_expect(kwd_same_set(got, want), "streamed keys differ from kwarm keys");
        cr_expect(n > (i == 0 ? 400u : 10000u), "%zu keys", n);
        cJSON_Delete(got);
        cJSON_Delete(want);
        cJSON_Delete(doc);
        free(out);
        free(err);
        kwr_free(&r);
        cJSON_Delete(keys);
        cJSON_Delete(h);
    }
    kwd_down(&d, &c);
}

Test(scale, warmup_of_over_10000_keys_streams_every_result)
{
    instant();
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-10k", 2, NULL, &c);
    cJSON *h = model_hdr(V4, 1024, "sm_90,sm_100");
    for (int round = 0; round < 2; round++) {
        size_t frames, n;
        cJSON *res = cJSON_CreateArray();
        cr_assert_eq(kwc_send(&c, KW_PROTO_WARMUP, h), 0);
        kwr r = read_stream(&c, res, &frames, &n);
        kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
        double keys = kwr_num(&r, "keys");
        cr_expect(keys > 10000, "%g keys", keys);
        cr_expect_eq((double)n, keys, "one streamed result per key");
        cr_expect(cJSON_GetObjectItemCaseSensitive(r.hdr, "manifest") == NULL,
                  "the RESULT carries counts only");
        double want_done = round == 0 ? kwr_num(&r, "compiled") : kwr_num(&r, "hits");
        cr_expect_eq(want_done, keys, "round %d: %g compiled, %g hits", round,
                     kwr_num(&r, "compiled"), kwr_num(&r, "hits"));
        cr_expect_eq(kwr_num(&r, "failed") + kwr_num(&r, "cancelled"), 0);
        cJSON *dg = kwd_digests(res);
        cr_expect_eq(cJSON_GetArraySize(dg), (int)keys);
        cJSON_Delete(dg);
        kwr_free(&r);
        cJSON_Delete(res);
    }
    kwc_expect_pong(&c, "after two large warmups");
    cJSON_Delete(h);
    kwd_down(&d, &c);
}

/* ---- SIGTERM with ~100,000 keys queued ---------------------------------- */

/* Polls STATS until warm_keys reaches want (the warmup's keys are all in
 * the pipeline), within a deadline. */
static void wait_submitted(const char *sock, double want)
{
    kwc s;
    kwc_must_open(&s, sock);
    int64_t deadline = kwd_now_ms() + 60000;
    double got = 0;
    while ((got = kwc_stat(&s, "warm_keys")) < want) {
        cr_assert(kwd_now_ms() < deadline, "only %g of %g keys submitted", got,
                  want);
        kwd_nap_ms(20); /* polling a counter, with a deadline */
    }
    kwc_close(&s);
}

/* The DCP world of the SIGTERM test and the keys it waits to see
 * submitted: about 100,000 keys.  Under ASan the instrumented `kwarm`
 * client reads the cancelled results several times slower than kwarmd
 * sends them, and on a loaded 2-core machine it had not read them all
 * when kwarmd's stop grace ended (issue 23 point 7): there the test runs
 * at a quarter of the size; the normal build holds kwarmd to 100,000. */
#ifdef __SANITIZE_ADDRESS__
#define TERM_WORLD "2048"
#define TERM_SUBMITTED 22000
#else
#define TERM_WORLD "8192"
#define TERM_SUBMITTED 90000
#endif

/* kwarmd's stop grace (daemon/internal.h): KW__STOP_GRACE_MS, extended a
 * second at a time while clients read, up to KW__STOP_MAX_MS. */
#define STOP_GRACE_MS 3000
#define STOP_MAX_MS 15000

/* The bound on the stop of a SIGTERM test: 5 s (issue 23), or past
 * kwarmd's cap on a machine whose load is past its cores, where a client
 * that reads on is let finish (issue 23, point 7). */
static int term_bound_ms(void)
{
    return kwd_machine_loaded() ? STOP_MAX_MS + 2000 : 5000;
}

Test(scale, sigterm_with_100000_keys_queued_cancels_them_and_exits_0_in_5s)
{
    /* Every worker hangs on the first family's keys, so the rest stays
     * queued until the signal. */
    cr_assert_eq(setenv("KWARM_TEST_HANG_FAMILY", "prefill_chunk_metadata", 1), 0);
    kwd d;
    kwd_init(&d, "kwd-term");
    kwd_start(&d, 2, NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, V4);
    const char *argv[] = {KW_KWARM_BIN, "warmup", "--model", path,
                          "--dcp-world", TERM_WORLD, "--arch", "sm_90,sm_100",
                          "--socket", d.sock, NULL};
    kw_test_proc p;
    cr_assert_eq(kw_test_spawn(argv, &p), 0);
    wait_submitted(d.sock, TERM_SUBMITTED);
    int64_t t0 = kwd_now_ms();
    cr_assert_eq(kill(d.pid, SIGTERM), 0);
    kwd_expect_exit0(&d, term_bound_ms());
    int64_t ms = kwd_now_ms() - t0;
    char *out = NULL, *err = NULL;
    int st = kw_test_wait(&p, &out, &err);
    cr_expect_eq(st, 1, "kwarm warmup exit %d: %s", st, err);
    cr_expect(strstr(err, "kwarmd stopped: ") != NULL &&
              strstr(err, " keys cancelled") != NULL, "stderr: %s", err);
    cr_expect(strstr(err, "failed to compile") == NULL, "cancelled keys are not "
              "failures: %s", err);
    /* The last progress line counts them too (issue 24: it said "N/N keys
     * settled" and nothing of the cancelled). */
    const char *last = NULL;
    for (const char *q = err; (q = strstr(q, " keys settled (")) != NULL; q++)
        last = q;
    char line[256] = "";
    if (last != NULL)
        snprintf(line, sizeof line, "%.*s", (int)strcspn(last, "\n"), last);
    cr_expect(strstr(line, " cancelled;") != NULL,
              "the last progress line does not count the cancelled keys: %s",
              last ? line : err);
    cr_log_info("kwarmd exited %lld ms after SIGTERM", (long long)ms);
    free(out);
    free(err);
}

/* ---- the stop grace: extended while clients read, up to its cap -------- */

/* Starts d with every worker hung (all keys stay queued), sends c a
 * warmup of about 100,000 keys, waits until they are submitted and sends
 * SIGTERM; returns when it did. */
static int64_t term_scene(kwd *d, kwc *c, const char *tag)
{
    cr_assert_eq(setenv("KWARM_TEST_HANG_FAMILY", "prefill_chunk_metadata", 1), 0);
    kwd_init(d, tag);
    kwd_start(d, 2, NULL);
    kwc_must_open(c, d->sock);
    cJSON *h = model_hdr(V4, atoi(TERM_WORLD), "sm_90,sm_100");
    cr_assert_eq(kwc_send(c, KW_PROTO_WARMUP, h), 0);
    cJSON_Delete(h);
    wait_submitted(d->sock, TERM_SUBMITTED);
    int64_t t0 = kwd_now_ms();
    cr_assert_eq(kill(d->pid, SIGTERM), 0);
    return t0;
}

/* Reads c's stream one frame every pace_ms (a slow client, not a wait
 * for an event) until its final frame, the connection's end or stop_ms
 * of reading; returns the final frame's type (0: none came) and the
 * results read in *n. */
static uint16_t paced_read(kwc *c, int pace_ms, int64_t stop_ms, size_t *n)
{
    int64_t end = kwd_now_ms() + stop_ms;
    *n = 0;
    while (kwd_now_ms() < end) {
        kwr r;
        if (kwc_recv(c, &r, KWD_REPLY_MS) != 0)
            return 0; /* closed */
        uint16_t type = r.type;
        if (type == KW_PROTO_PROGRESS)
            *n += (size_t)cJSON_GetArraySize(
                cJSON_GetObjectItemCaseSensitive(r.hdr, "results"));
        kwr_free(&r);
        if (type != KW_PROTO_PROGRESS)
            return type;
        kwd_nap_ms(pace_ms);
    }
    return 0;
}

static bool log_has(const kwd *d, const char *what)
{
    char *log = kwd_log(d->log);
    bool yes = strstr(log, what) != NULL;
    free(log);
    return yes;
}

/* What a client reading its cancellations at a pace saw: the final
 * frame's type (0: the connection ended first), the results read, and
 * when the reading and kwarmd's exit (0) came, in ms after SIGTERM. */
typedef struct paced {
    uint16_t fin;
    size_t n;
    int64_t read_ms, exit_ms;
} paced;

/* A client on d that takes about total_ms to read its cancellations
 * (pace_ms 0: it reads none); kwarmd must exit 0. */
static paced paced_scene(kwd *d, const char *tag, int total_ms)
{
    kwc c;
    paced o = {0};
    int64_t t0 = term_scene(d, &c, tag);
    if (total_ms > 0)
        o.fin = paced_read(&c, (int)(total_ms / (TERM_SUBMITTED / 256)),
                           2 * STOP_MAX_MS, &o.n);
    o.read_ms = kwd_now_ms() - t0;
    kwd_expect_exit0(d, STOP_MAX_MS + 5000);
    o.exit_ms = kwd_now_ms() - t0;
    cr_log_info("%s: %zu results read in %lld ms, kwarmd gone %lld ms after "
                "SIGTERM", tag, o.n, (long long)o.read_ms, (long long)o.exit_ms);
    kwc_close(&c);
    return o;
}

/* A client that reads its cancellations slower than the grace allows
 * (about 6 s), but steadily: its connection stays open past the grace
 * until its last frame, and kwarmd exits 0 after. */
Test(scale, the_stop_grace_extends_while_a_client_reads_its_cancellations)
{
    kwd d;
    paced o = paced_scene(&d, "kwd-grace", 6000);
    cr_expect_eq(o.fin, KW_PROTO_RESULT, "the stream ended without its RESULT");
    cr_expect_gt(o.read_ms, STOP_GRACE_MS, "the reading ended within the "
                 "grace: the test did not reach the extension");
    cr_expect_not(log_has(&d, "closing them"), "a reading client was closed");
}

/* A client that reads nothing after the signal: closed once the grace
 * (and the one second its socket buffer filled in) is over, not held to
 * the cap. */
Test(scale, the_stop_grace_is_not_extended_for_a_client_that_reads_nothing)
{
    kwd d;
    paced o = paced_scene(&d, "kwd-grace-none", 0);
    cr_expect_lt(o.exit_ms, STOP_MAX_MS - 4000, "held for a client that reads "
                 "nothing");
    cr_expect(log_has(&d, "(no progress); closing them"), "no such log line");
}

/* A client that reads on, too slowly to finish before the cap (about
 * 40 s): closed at the cap, KW__STOP_MAX_MS after the signal. */
Test(scale, the_stop_grace_ends_at_its_cap_for_a_client_that_reads_on)
{
    kwd d;
    paced o = paced_scene(&d, "kwd-grace-cap", 40000);
    cr_expect_eq(o.fin, 0, "the stream ended (%u) before the cap", o.fin);
    cr_expect_geq(o.read_ms, STOP_MAX_MS - 1000, "closed before the cap");
    cr_expect(log_has(&d, "(still reading at the cap); closing them"),
              "no such log line");
}

/* ---- the loop thread stays responsive ------------------------------------ */


Test(scale, pings_are_answered_while_20000_keys_are_submitted)
{
    instant();
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-ping", 2, NULL, &c);
    kwd_pinger *p = calloc(1, sizeof *p);
    p->sock = d.sock;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, kwd_ping_main, p), 0);
    cJSON *h = model_hdr(V4, 1600, "sm_90,sm_100"); /* about 20,000 keys */
    size_t frames, n;
    cr_assert_eq(kwc_send(&c, KW_PROTO_WARMUP, h), 0);
    kwr r = read_stream(&c, NULL, &frames, &n);
    atomic_store(&p->stop, true);
    pthread_join(th, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
    cr_expect(kwr_num(&r, "keys") >= 19000, "%g keys", kwr_num(&r, "keys"));
    cr_expect_eq(p->failed, 0, "a ping went unanswered for 1 s (or failed)");
    cr_expect(p->n >= 10, "only %zu pings during the warmup", p->n);
    cr_log_info("%zu pings during a %g-key warmup: p99 %.3f ms", p->n,
                kwr_num(&r, "keys"), kwd_pinger_p99(p));
    kwr_free(&r);
    cJSON_Delete(h);
    free(p);
    kwd_down(&d, &c);
}

/* A child process holding the cache's LMDB writer lock until it reads a
 * byte from *release (the write end is the parent's). */
static pid_t hold_writer(const char *cache, int *release)
{
    int go[2], ready[2];
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        MDB_env *env;
        MDB_txn *txn;
        char c = 0;
        if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 16) != 0 ||
            mdb_env_open(env, cache, 0, 0600) != 0 ||
            mdb_txn_begin(env, NULL, 0, &txn) != 0)
            _exit(1);
        if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) < 0)
            _exit(1);
        mdb_txn_abort(txn);
        mdb_env_close(env);
        _exit(0);
    }
    char c;
    close(go[0]);
    close(ready[1]);
    cr_assert_eq(read(ready[0], &c, 1), 1, "the writer child failed");
    close(ready[0]);
    *release = go[1];
    return pid;
}

Test(scale, pings_are_answered_while_an_evict_waits_for_the_writer_lock)
{
    instant();
    kwd d;
    kwc c, e;
    kwd_up(&d, "kwd-evict", 1, NULL, &c);
    cJSON *wh = kwd_model_hdr("deepseek-v3.2-exp.json", 0);
    kwr w = kwc_call(&c, KW_PROTO_WARMUP, wh, NULL);
    cJSON_Delete(wh);
    kwr_expect_type(&w, KW_PROTO_RESULT, "warmup");
    const cJSON *first = cJSON_GetArrayItem(
        cJSON_GetObjectItemCaseSensitive(w.hdr, "manifest"), 0);
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "digest", cJSON_GetStringValue(
                                cJSON_GetObjectItemCaseSensitive(first, "digest")));
    int release;
    pid_t holder = hold_writer(d.cache, &release);
    kwc_must_open(&e, d.sock);
    cr_assert_eq(kwc_send(&e, KW_PROTO_EVICT, ev), 0); /* blocks on the lock */
    kwd_pinger *p = calloc(1, sizeof *p);
    p->sock = d.sock;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, kwd_ping_main, p), 0);
    kwr none;
    int rc = kwc_recv(&e, &none, 500); /* no reply while the lock is held */
    cr_expect_eq(rc, -ETIMEDOUT, "the evict answered while the writer held "
                 "the lock");
    atomic_store(&p->stop, true);
    pthread_join(th, NULL);
    cr_expect_eq(p->failed, 0, "a ping went unanswered for 1 s");
    cr_expect(p->n >= 10, "only %zu pings while the evict waited", p->n);
    cr_log_info("%zu pings while an evict waited for the writer lock: p99 %.3f ms",
                p->n, kwd_pinger_p99(p));
    cr_assert_eq(write(release, "g", 1), 1);
    close(release);
    int st;
    cr_assert_eq(waitpid(holder, &st, 0), holder);
    kwr r = kwc_must_recv(&e, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_RESULT, "evict");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r.hdr, "evicted")));
    kwr_free(&r);
    kwr_free(&w);
    cJSON_Delete(ev);
    free(p);
    kwc_close(&e);
    kwd_down(&d, &c);
}

/* ---- protocol version ----------------------------------------------------- */

Test(scale, another_protocol_version_gets_an_error_naming_both)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-ver", 1, NULL, &c);
    uint8_t f[16] = {'K', 'W', 'R', 'M', 1, 0, KW_PROTO_PING, 0};
    cr_assert_eq(kwc_send_raw(&c, f, sizeof f), 0);
    kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_ERROR, "version 1 ping");
    const char *msg = kwr_str(&r, "error");
    cr_expect(strstr(msg, "version 1") && strstr(msg, "version 2"), "%s", msg);
    cr_expect_str_eq(kwr_str(&r, "code"), "KW_EVERSION");
    kwr_free(&r);
    kwr eof;
    cr_expect_eq(kwc_recv(&c, &eof, KWD_REPLY_MS), KWC_EOF, "closed after");
    kwc_close(&c);
    kwc_must_open(&c, d.sock);
    kwd_down(&d, &c);
}
