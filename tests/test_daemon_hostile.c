/* test_daemon_hostile.c: kwarmd under hostile, slow and numerous local
 * clients (issue 11).  Throughout, a well-behaved client is served, and
 * kwarmd's descriptors and anonymous memory come back to where they were.
 */
#include "daemon_util.h"
#include "watch_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/resource.h>

/* Each test's daemons are killed and their directories removed. */
TestSuite(hostile, .fini = kwd_cleanup);

#define V32 "deepseek-v3.2-exp.json"

/* ---- what kwarmd holds ---------------------------------------------------- */

static int fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s", path);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Waits (bounded) until kwarmd's descriptors are within 10% of fds0 and
 * its RssAnon within 10% (plus 2 MiB of slack for small heaps) of rss0. */
static void expect_back_to(const kwd *d, int fds0, long rss0, const char *when)
{
    int64_t deadline = kwd_now_ms() + 20000;
    int fds;
    long rss;
    for (;;) {
        fds = fd_count(d->pid);
        rss = kwd_rss_anon_kib(d->pid);
        bool ok = fds <= fds0 + fds0 / 10 + 1 && rss <= rss0 + rss0 / 10 + 2048;
#ifdef __SANITIZE_ADDRESS__
        ok = fds <= fds0 + fds0 / 10 + 1;
#endif
        if (ok || kwd_now_ms() > deadline)
            break;
        kwd_nap_ms(100); /* polling /proc with a deadline: the heap is trimmed
                            after an idle tick */
    }
    cr_expect(fds <= fds0 + fds0 / 10 + 1, "%s: %d descriptors, started at %d",
              when, fds, fds0);
#ifndef __SANITIZE_ADDRESS__
    cr_expect(rss <= rss0 + rss0 / 10 + 2048, "%s: RssAnon %ld KiB, started "
              "at %ld KiB", when, rss, rss0);
#else
    (void)rss; /* ASan's quarantine keeps freed memory: judged unsanitized */
#endif
}

/* A raw connection to sock, non-blocking when nb. */
static int raw_connect(const char *sock, bool nb)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nb ? SOCK_NONBLOCK : 0), 0);
    cr_assert(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock, strlen(sock) + 1);
    int rc;
    while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof sa)) < 0 &&
           (errno == EAGAIN || errno == EINTR))
        kwd_nap_ms(1); /* listen backlog full: retry */
    cr_assert_eq(rc, 0, "connect: %s", strerror(errno));
    return fd;
}

static void raise_nofile(rlim_t want)
{
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want
                                                                        : rl.rlim_max;
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    cr_assert_geq(rl.rlim_cur, want, "open-file limit %llu",
                  (unsigned long long)rl.rlim_cur);
}

/* ---- a client that never reads ------------------------------------------- */

/* A key of V32 made into a 200 KB cubin: the worker's stand-in (set
 * KWARM_TEST_INSTANT_COMPILE=204800 before kwarmd starts), stored through
 * a compiling get.  Returns its digest. */
static void big_cubin(kwc *c, char digest[65])
{
    kwr r = kwd_get_key(c, V32, 2, 0);
    cr_assert_eq(r.payload_len, 204800, "a cubin of %zu bytes", r.payload_len);
    snprintf(digest, 65, "%s", kwr_str(&r, "digest"));
    kwr_free(&r);
}

static void big_instant(void)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "204800", 1), 0);
}

/* Sends up to n copies of frame without reading anything back; stops when
 * the socket stays full for 300 ms (kwarmd stopped reading).  Returns how
 * many were sent whole. */
static size_t flood(int fd, const uint8_t *frame, size_t len, size_t n)
{
    size_t sent = 0, off = 0;
    while (sent < n) {
        ssize_t w = send(fd, frame + off, len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            if (off == len) {
                off = 0;
                sent++;
            }
            continue;
        }
        if (w < 0 && errno != EAGAIN)
            break;
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 300) <= 0)
            break; /* full: the backpressure held */
    }
    return sent;
}

Test(hostile, a_client_that_pipelines_gets_and_never_reads_is_bounded_and_dropped)
{
    big_instant();
    kwd d;
    kwc c;
    const char *extra[] = {"--idle-timeout", "3000", NULL};
    kwd_up(&d, "kwh-flood", 1, extra, &c);
    char digest[65];
    big_cubin(&c, digest);
    kwc_expect_pong(&c, "warm");
    long rss0 = kwd_rss_anon_kib(d.pid);
    int fds0 = fd_count(d.pid);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", digest);
    uint8_t *frame;
    size_t len;
    cr_assert_eq(kw_proto_encode(KW_PROTO_GET, g, NULL, 0, &frame, &len), 0);
    int hostile = raw_connect(d.sock, true);
    size_t sent = flood(hostile, frame, len, 20000);
    cr_log_info("the hostile client got %zu of 20000 gets in before kwarmd "
                "stopped reading it", sent);
    cr_expect_lt(sent, 20000, "kwarmd read every request of a client that "
                 "reads nothing");
    /* Well-behaved clients are served meanwhile. */
    for (int i = 0; i < 8; i++) {
        kwc ok;
        kwc_must_open(&ok, d.sock);
        for (int j = 0; j < 20; j++) {
            kwr r = kwc_call(&ok, KW_PROTO_GET, g, NULL);
            kwr_expect_type(&r, KW_PROTO_RESULT, "a good client's get");
            kwr_free(&r);
        }
        kwc_close(&ok);
    }
    long grown = kwd_rss_anon_kib(d.pid) - rss0;
    cr_expect_lt(grown, 64 * 1024, "RssAnon grew by %ld KiB", grown);
    cr_log_info("RssAnon grew by %ld KiB with the hostile client queued", grown);
    /* Nothing leaves for --idle-timeout: dropped, with a log line. */
    int64_t deadline = kwd_now_ms() + 20000;
    char *log = NULL;
    while (free(log), log = kwd_log(d.log), strstr(log, "unread") == NULL) {
        cr_assert(kwd_now_ms() < deadline, "not dropped: %s", log);
        kwd_nap_ms(100); /* polling the log with a deadline */
    }
    free(log);
    close(hostile);
    kwc_close(&c); /* idle past --idle-timeout too: dropped as well */
    kwc_must_open(&c, d.sock);
    kwc_expect_pong(&c, "after the flood");
    expect_back_to(&d, fds0, rss0, "after the hostile client");
    free(frame);
    cJSON_Delete(g);
    kwd_down(&d, &c);
}

Test(hostile, a_slow_reader_gets_every_reply)
{
    big_instant();
    kwd d;
    kwc c;
    const char *extra[] = {"--max-output", "256K", NULL};
    kwd_up(&d, "kwh-slow", 1, extra, &c);
    char digest[65];
    big_cubin(&c, digest);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", digest);
    uint8_t *frame;
    size_t len;
    cr_assert_eq(kw_proto_encode(KW_PROTO_GET, g, NULL, 0, &frame, &len), 0);
    kwc slow;
    kwc_must_open(&slow, d.sock);
    for (int i = 0; i < 40; i++) /* 40 x 200 KB: far over the cap */
        cr_assert_eq(kwc_send_raw(&slow, frame, len), 0);
    for (int i = 0; i < 40; i++) {
        kwr r = kwc_must_recv(&slow, KWD_REPLY_MS);
        kwr_expect_type(&r, KW_PROTO_RESULT, "a slow reader's get");
        kwr_free(&r);
        kwd_nap_ms(20); /* reading slowly is what this test is about */
    }
    kwc_close(&slow);
    free(frame);
    cJSON_Delete(g);
    kwd_down(&d, &c);
}

/* ---- numbers of connections ---------------------------------------------- */

Test(hostile, the_connection_over_the_cap_gets_an_error_frame)
{
    kwd d;
    kwc c;
    const char *extra[] = {"--max-connections", "50", NULL};
    kwd_up(&d, "kwh-cap", 1, extra, &c);
    kwc conns[49];
    for (int i = 0; i < 49; i++) { /* with c: exactly the cap */
        kwc_must_open(&conns[i], d.sock);
        kwc_expect_pong(&conns[i], "under the cap");
    }
    kwc over;
    kwc_must_open(&over, d.sock);
    cr_assert_eq(kwc_send(&over, KW_PROTO_PING, NULL), 0);
    kwr r = kwc_must_recv(&over, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_ERROR, "connection 51");
    cr_expect(strstr(kwr_str(&r, "error"), "too many connections (50)") != NULL,
              "%s", kwr_str(&r, "error"));
    kwr_free(&r);
    cr_expect_eq(kwc_recv(&over, &r, KWD_REPLY_MS), KWC_EOF);
    kwc_close(&over);
    kwc_close(&conns[0]);
    kwc_expect_pong(&c, "at the cap");
    /* One left: the next one is served (the count is not leaked). */
    int64_t deadline = kwd_now_ms() + 5000;
    for (;;) {
        kwc again;
        kwc_must_open(&again, d.sock);
        cr_assert_eq(kwc_send(&again, KW_PROTO_PING, NULL), 0);
        kwr p = kwc_must_recv(&again, KWD_REPLY_MS);
        bool pong = p.type == KW_PROTO_PONG;
        kwr_free(&p);
        kwc_close(&again);
        if (pong)
            break;
        cr_assert(kwd_now_ms() < deadline, "a freed slot was never reused");
        kwd_nap_ms(20); /* the close of conns[0] reaches kwarmd */
    }
    for (int i = 1; i < 49; i++)
        kwc_close(&conns[i]);
    kwd_down(&d, &c);
}

Test(hostile, five_thousand_idle_connections_and_a_good_client)
{
    raise_nofile(12000);
    kwd d;
    kwc c;
    const char *extra[] = {"--max-connections", "6000", NULL};
    kwd_up(&d, "kwh-idle", 1, extra, &c);
    int fds0 = fd_count(d.pid);
    long rss0 = kwd_rss_anon_kib(d.pid);
    int *fd = malloc(5000 * sizeof *fd);
    for (int i = 0; i < 5000; i++)
        fd[i] = raw_connect(d.sock, false);
    kwc_expect_pong(&c, "beside 5000 idle connections");
    /* The main loop accepts, a serving loop takes: counted once taken. */
    int64_t deadline = kwd_now_ms() + 20000;
    double conns;
    while ((conns = kwc_stat(&c, "connections")) < 5001 && kwd_now_ms() < deadline)
        kwd_nap_ms(10); /* polling a counter with a deadline */
    cr_expect_geq(conns, 5001);
    for (int i = 0; i < 5000; i++)
        close(fd[i]);
    free(fd);
    expect_back_to(&d, fds0, rss0, "after 5000 idle connections");
    kwc_expect_pong(&c, "after them");
    kwd_down(&d, &c);
}

Test(hostile, a_hundred_thousand_connects_and_disconnects)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-churn", 1, NULL, &c);
    int fds0 = fd_count(d.pid);
    long rss0 = kwd_rss_anon_kib(d.pid);
    for (int i = 0; i < 100000; i++)
        close(raw_connect(d.sock, false));
    kwc_expect_pong(&c, "after 100000 connects");
    expect_back_to(&d, fds0, rss0, "after 100000 connects");
    kwd_down(&d, &c);
}

/* ---- garbage ---------------------------------------------------------------- */

Test(hostile, random_bytes_at_full_speed_are_refused_and_others_served)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-noise", 1, NULL, &c);
    int fds0 = fd_count(d.pid);
    long rss0 = kwd_rss_anon_kib(d.pid);
    uint8_t junk[65536];
    unsigned seed = 12345;
    for (int k = 0; k < 50; k++) {
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)rand_r(&seed);
        junk[0] = (uint8_t)'K' + (k % 2); /* half start like a magic */
        int fd = raw_connect(d.sock, true);
        flood(fd, junk, sizeof junk, 4);
        close(fd);
        if (k % 10 == 0)
            kwc_expect_pong(&c, "amid the noise");
    }
    kwc_expect_pong(&c, "after the noise");
    cr_expect_geq(kwc_stat(&c, "protocol_errors"), 25);
    expect_back_to(&d, fds0, rss0, "after the noise");
    kwd_down(&d, &c);
}

Test(hostile, oversized_lengths_and_deep_json_get_one_error_frame)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-caps", 1, NULL, &c);
    /* header_len and payload_len far over their caps. */
    const uint32_t lens[][2] = {{0xFFFFFFFFu, 0}, {16, 0xFFFFFFFFu},
                                {KW_PROTO_MAX_HEADER + 1, 0}};
    const char *codes[] = {"KW_E2BIG", "KW_EPROTO", "KW_E2BIG"};
    for (size_t i = 0; i < 3; i++) {
        uint8_t h[16];
        cr_assert_eq(kw_proto_encode_head(h, KW_PROTO_PING, 0, 0), 16);
        memcpy(h + 8, &lens[i][0], 4);
        memcpy(h + 12, &lens[i][1], 4);
        kwc bad;
        kwc_must_open(&bad, d.sock);
        cr_assert_eq(kwc_send_raw(&bad, h, 16), 0);
        kwr r = kwc_must_recv(&bad, KWD_REPLY_MS);
        kwr_expect_type(&r, KW_PROTO_ERROR, "oversized length");
        cr_expect_str_eq(kwr_str(&r, "code"), codes[i], "case %zu", i);
        kwr_free(&r);
        kwc_close(&bad);
    }
    /* Valid JSON nested 64 levels deep (the cap is 32). */
    char json[200];
    size_t n = 0;
    for (int i = 0; i < 64; i++)
        json[n++] = '[';
    for (int i = 0; i < 64; i++)
        json[n++] = ']';
    char obj[220];
    int on = snprintf(obj, sizeof obj, "{\"a\":%.*s}", (int)n, json);
    uint8_t f[256];
    cr_assert_eq(kw_proto_encode_head(f, KW_PROTO_PING, (uint32_t)on, 0), 16);
    memcpy(f + 16, obj, (size_t)on);
    kwc deep;
    kwc_must_open(&deep, d.sock);
    cr_assert_eq(kwc_send_raw(&deep, f, 16 + (size_t)on), 0);
    kwr r = kwc_must_recv(&deep, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_ERROR, "64 levels");
    kwr_free(&r);
    cr_expect_eq(kwc_recv(&deep, &r, KWD_REPLY_MS), KWC_EOF);
    kwc_close(&deep);
    kwc_expect_pong(&c, "after the caps");
    kwd_down(&d, &c);
}

/* ---- caps per connection and per request ---------------------------------- */

Test(hostile, a_thousand_pipelined_requests_are_served_one_at_a_time_in_order)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-pipe", 1, NULL, &c);
    uint8_t *all = malloc(1000 * 32), *f;
    size_t n = 0, len;
    for (int i = 0; i < 1000; i++) {
        uint16_t t = i % 2 ? KW_PROTO_STATS : KW_PROTO_PING;
        cr_assert_eq(kw_proto_encode(t, NULL, NULL, 0, &f, &len), 0);
        memcpy(all + n, f, len);
        n += len;
        free(f);
    }
    cr_assert_eq(kwc_send_raw(&c, all, n), 0);
    for (int i = 0; i < 1000; i++) {
        kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
        kwr_expect_type(&r, i % 2 ? KW_PROTO_RESULT : KW_PROTO_PONG, "in order");
        kwr_free(&r);
    }
    free(all);
    kwd_down(&d, &c);
}

Test(hostile, a_request_over_the_key_limit_is_refused_with_its_count)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-keys", 1, NULL, &c);
    cJSON *h = kwd_model_hdr("deepseek-v4-flash.json", 0);
    cJSON_DeleteItemFromObjectCaseSensitive(h, "deployment");
    cJSON *dep = cJSON_AddObjectToObject(h, "deployment");
    cJSON_AddNumberToObject(dep, "dcp_world", 600000);
    cJSON_AddStringToObject(dep, "arch", "sm_90,sm_100");
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, h, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "1.2 million keys");
    cr_expect(strstr(kwr_str(&r, "error"), "1200000 keys") != NULL &&
              strstr(kwr_str(&r, "error"), "1048576") != NULL, "%s",
              kwr_str(&r, "error"));
    kwr_free(&r);
    kwc_expect_pong(&c, "after the refusal");
    cJSON_Delete(h);
    kwd_down(&d, &c);
}

/* ---- who may connect --------------------------------------------------------- */

Test(hostile, a_refused_client_reads_the_reason_20_times_out_of_20)
{
    kwd d;
    kwd_init(&d, "kwh-deny");
    const char *extra[] = {"--deny-root", NULL};
    kwd_start(&d, 1, extra);
    const char *argv[] = {KW_KWARM_BIN, "stats", "--socket", d.sock, NULL};
    for (int i = 0; i < 20; i++) {
        char *out = NULL, *err = NULL;
        int st = kw_test_run(argv, &out, &err);
        cr_expect_eq(st, 1, "attempt %d: exit %d", i, st);
        cr_expect(strstr(err, "uid 0 gid 0 not allowed") != NULL,
                  "attempt %d: %s", i, err);
        free(out);
        free(err);
    }
    kwc c;
    kwc_must_open(&c, d.sock); /* stopping needs no request */
    kwd_down(&d, &c);
}

Test(hostile, unreadable_peer_credentials_refuse_the_client)
{
    cr_assert_eq(setenv("KWARMD_TEST_PEERCRED_FAIL", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-creds", 1, NULL, &c);
    cr_assert_eq(kwc_send(&c, KW_PROTO_PING, NULL), 0);
    kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_ERROR, "ping without credentials");
    cr_expect(strstr(kwr_str(&r, "error"), "credentials") != NULL, "%s",
              kwr_str(&r, "error"));
    kwr_free(&r);
    kwd_down(&d, &c);
}

Test(hostile, an_allocation_failure_gets_an_error_frame_and_kwarmd_goes_on)
{
    cr_assert_eq(setenv("KWARMD_TEST_FAIL_ALLOC", "stats", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-oom", 1, NULL, &c);
    for (int i = 0; i < 3; i++) {
        kwr r = kwc_call(&c, KW_PROTO_STATS, NULL, NULL);
        kwr_expect_type(&r, KW_PROTO_ERROR, "stats without memory");
        cr_expect_str_eq(kwr_str(&r, "code"), "KW_ENOMEM");
        kwr_free(&r);
        kwc_expect_pong(&c, "after a failed stats");
    }
    cJSON *h0 = kwd_model_hdr(V32, 0);
    kwr r = kwc_call(&c, KW_PROTO_KEYS, h0, NULL);
    cJSON_Delete(h0);
    kwr_expect_type(&r, KW_PROTO_RESULT, "keys, untouched by the hook");
    kwr_free(&r);
    kwd_down(&d, &c);
}

/* ---- start-up errors say what happened ------------------------------------ */

/* Runs kwarmd with args as uid (0: as we are); returns its exit status
 * and stderr. */
static int kwarmd_once(uid_t uid, const char *const *args, char **err,
                       const char *stage_dir)
{
    /* Another uid runs a copy in stage_dir: the build tree may lie in
     * root's 0700 home, where that user cannot reach it (issue 24). */
    static char staged[512];
    const char *exe = KW_KWARMD_BIN;
    if (uid != 0) {
        cr_assert_eq(kw_test_stage_kwarmd(stage_dir, staged, sizeof staged),
                     0, "staging kwarmd: %s", strerror(errno));
        exe = staged;
    }
    const char *argv[16] = {exe};
    size_t n = 1;
    for (; args[n - 1] != NULL && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    if (uid == 0) {
        char *out = NULL;
        int st = kw_test_run(argv, &out, err);
        free(out);
        return st;
    }
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (dup2(pipefd[1], 2) < 0 || setgroups(0, NULL) < 0 ||
            setgid(uid) < 0 || setuid(uid) < 0)
            _exit(126);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    char buf[4096];
    ssize_t got = 0, r;
    while ((r = read(pipefd[0], buf + got, sizeof buf - 1 - (size_t)got)) > 0)
        got += r;
    buf[got] = '\0';
    close(pipefd[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    *err = strdup(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(hostile, a_socket_directory_missing_or_unwritable_is_named)
{
    char dir[128], sock[256], cache[256];
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "kwh-sockdir"), 0);
    cr_assert_eq(chmod(dir, 0755), 0);
    snprintf(sock, sizeof sock, "%s/nodir/x/k.sock", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    const char *missing[] = {"--socket", sock, "--cache", cache, NULL};
    char *err = NULL;
    cr_expect_eq(kwarmd_once(0, missing, &err, NULL), 1);
    cr_expect(strstr(err, "no such directory") != NULL, "%s", err);
    free(err);
    if (geteuid() != 0) /* the unwritable case needs another uid */
        cr_skip_test("not root: cannot run kwarmd as nobody");
    /* nobody: its cache is its own, the socket's directory is root's 0755. */
    struct passwd *pw = getpwnam("nobody");
    cr_assert_not_null(pw);
    char ncache[256];
    snprintf(ncache, sizeof ncache, "%s/ncache", dir);
    cr_assert_eq(mkdir(ncache, 0700), 0);
    cr_assert_eq(chown(ncache, pw->pw_uid, pw->pw_gid), 0);
    snprintf(sock, sizeof sock, "%s/k.sock", dir);
    const char *unwritable[] = {"--socket", sock, "--cache", ncache, NULL};
    cr_expect_eq(kwarmd_once(pw->pw_uid, unwritable, &err, dir), 1);
    cr_expect(strstr(err, "permission denied") != NULL, "%s", err);
    free(err);
    kw_test_rmtree(dir);
}
