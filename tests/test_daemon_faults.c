/* test_daemon_faults.c: kwarmd against bad peers and a hostile start-up:
 * one negative test per framing rule (STYLE rule 27), a half frame left
 * hanging, SIGTERM in the middle of a warmup, a stale socket file, a
 * second daemon on the same socket, a socket path that does not fit.
 *
 * Throughout, a well-behaved client stays connected and must still get
 * PONG for PING after each bad one. */
#include "daemon_util.h"

#include <dirent.h>

#include "kw_cache.h"

TestSuite(daemon_faults, .fini = kwd_cleanup, .timeout = 300);

/* Starts d with extra flags and connects the well-behaved client. */
static void start_with_good(kwd *d, const char *tag, unsigned jobs,
                            const char *const *extra, kwc *good)
{
    kwd_up(d, tag, jobs, extra, good);
    kwc_expect_pong(good, "good client at start");
}

/* ---- one bad frame per framing rule ------------------------------------ */

/* A valid 16-byte head of type with header_len and payload_len. */
static size_t head(uint8_t *buf, uint16_t type, uint32_t hlen, uint32_t plen)
{
    uint32_t v[4] = {KW_PROTO_MAGIC, KW_PROTO_VERSION | ((uint32_t)type << 16),
                     hlen, plen};
    for (size_t i = 0; i < 4; i++)
        for (size_t b = 0; b < 4; b++)
            buf[4 * i + b] = (uint8_t)(v[i] >> (8 * b));
    return KW_PROTO_HEAD_LEN;
}

/* A PING whose JSON header is text (no check of the text). */
static size_t ping_with(uint8_t *buf, const char *text, size_t n)
{
    head(buf, KW_PROTO_PING, (uint32_t)n, 0);
    memcpy(buf + KW_PROTO_HEAD_LEN, text, n);
    return KW_PROTO_HEAD_LEN + n;
}

typedef struct bad_case {
    const char *name;
    const char *code; /* the ERROR frame's "code" */
    size_t (*build)(uint8_t *buf);
} bad_case;

static size_t bad_magic(uint8_t *b)
{
    size_t n = head(b, KW_PROTO_PING, 0, 0);
    memcpy(b, "KWRX", 4);
    return n;
}

static size_t http_request(uint8_t *b) /* refused at its first byte */
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    memcpy(b, req, sizeof req - 1);
    return sizeof req - 1;
}

static size_t bad_version(uint8_t *b)
{
    size_t n = head(b, KW_PROTO_PING, 0, 0);
    b[4] = KW_PROTO_VERSION + 1;
    return n;
}

static size_t unknown_type(uint8_t *b)
{
    return head(b, 99, 0, 0);
}

static size_t reply_type(uint8_t *b) /* a PONG sent to the daemon */
{
    return head(b, KW_PROTO_PONG, 0, 0);
}

static size_t header_over_cap(uint8_t *b)
{
    return head(b, KW_PROTO_PING, KW_PROTO_MAX_HEADER + 1, 0);
}

static size_t request_with_payload(uint8_t *b)
{
    head(b, KW_PROTO_GET, 2, 8);
    memcpy(b + 16, "{}PAYLOAD", 10);
    return 16 + 2 + 8;
}

static size_t header_not_json(uint8_t *b)
{
    return ping_with(b, "hello", 5);
}

static size_t header_not_object(uint8_t *b)
{
    return ping_with(b, "[1,2]", 5);
}

static size_t header_trailing_bytes(uint8_t *b)
{
    return ping_with(b, "{} {}", 5);
}

static size_t header_duplicate_member(uint8_t *b)
{
    return ping_with(b, "{\"a\":1,\"a\":2}", 13);
}

static size_t header_nul_byte(uint8_t *b)
{
    return ping_with(b, "{\"a\":\"x\0y\"}", 11);
}

static size_t header_bad_utf8(uint8_t *b)
{
    return ping_with(b, "{\"a\":\"\xc3\x28\"}", 10);
}

static size_t header_too_deep(uint8_t *b)
{
    char text[2 * (KW_PROTO_MAX_DEPTH + 1) + 8];
    size_t n = 0;
    text[n++] = '{';
    memcpy(text + n, "\"a\":", 4);
    n += 4;
    for (size_t i = 0; i < KW_PROTO_MAX_DEPTH; i++) /* depth 33 */
        text[n++] = '[';
    for (size_t i = 0; i < KW_PROTO_MAX_DEPTH; i++)
        text[n++] = ']';
    text[n++] = '}';
    return ping_with(b, text, n);
}

static size_t random_garbage(uint8_t *b)
{
    uint64_t x = 0x9E3779B97F4A7C15ull; /* xorshift64: the same every run */
    for (size_t i = 0; i < 4096; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (uint8_t)x;
    }
    if (b[0] == 'K')
        b[0] = 'k';
    return 4096;
}

static const bad_case cases[] = {
    {"bad magic", "KW_EPROTO", bad_magic},
    {"HTTP request", "KW_EPROTO", http_request},
    {"bad version", "KW_EVERSION", bad_version},
    {"unknown type", "KW_EPROTO", unknown_type},
    {"reply type", "KW_EPROTO", reply_type},
    {"header_len over the cap", "KW_E2BIG", header_over_cap},
    {"request with a payload", "KW_EPROTO", request_with_payload},
    {"header not JSON", "KW_EPROTO", header_not_json},
    {"header not an object", "KW_EPROTO", header_not_object},
    {"bytes after the header object", "KW_EPROTO", header_trailing_bytes},
    {"member name twice", "KW_EPROTO", header_duplicate_member},
    {"NUL byte in the header", "KW_EPROTO", header_nul_byte},
    {"invalid UTF-8 in the header", "KW_EPROTO", header_bad_utf8},
    {"nesting over KW_PROTO_MAX_DEPTH", "KW_EPROTO", header_too_deep},
    {"4 KiB of random garbage", "KW_EPROTO", random_garbage},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* Sends case k on a new connection: exactly one ERROR frame with the
 * case's code, then EOF; the good client is still served. */
static void send_bad(const char *sock, const bad_case *k, kwc *good)
{
    uint8_t buf[8192];
    size_t n = k->build(buf);
    kwc bad;
    kwc_must_open(&bad, sock);
    cr_assert_eq(kwc_send_raw(&bad, buf, n), 0, "[%s] send", k->name);
    kwr r;
    int rc = kwc_recv(&bad, &r, 5000);
    cr_assert_eq(rc, 0, "[%s] no ERROR frame: %d (%s)", k->name, rc,
                 rc == KWC_EOF ? "EOF" : kw_strerror(rc));
    kwr_expect_type(&r, KW_PROTO_ERROR, k->name);
    cr_expect_str_eq(kwr_str(&r, "code"), k->code, "[%s] code", k->name);
    cr_expect(kwr_str(&r, "error")[0] != '\0', "[%s] no error text", k->name);
    kwr_free(&r);
    rc = kwc_recv(&bad, &r, 5000);
    if (rc == 0)
        kwr_free(&r);
    cr_expect_eq(rc, KWC_EOF, "[%s] after the ERROR frame: %s, want EOF",
                 k->name, rc == 0 ? "another frame" : kw_strerror(rc));
    kwc_close(&bad);
    kwc_expect_pong(good, k->name);
}

/* One case on its own daemon: counted once in protocol_errors. */
static void one_case(const char *name)
{
    const bad_case *k = NULL;
    for (size_t i = 0; i < NCASES; i++)
        if (strcmp(cases[i].name, name) == 0)
            k = &cases[i];
    cr_assert_not_null(k, "no case %s", name);
    kwd d;
    kwc good;
    start_with_good(&d, "kwf-bad", 2, NULL, &good);
    send_bad(d.sock, k, &good);
    cr_expect_eq(kwc_stat(&good, "protocol_errors"), 1, "[%s]", name);
    cr_expect_eq(kwc_stat(&good, "connections"), 1, "[%s] bad one still open", name);
    kwd_down(&d, &good);
}

Test(daemon_faults, refuses_bad_magic) { one_case("bad magic"); }
Test(daemon_faults, refuses_http_at_first_byte) { one_case("HTTP request"); }
Test(daemon_faults, refuses_bad_version) { one_case("bad version"); }
Test(daemon_faults, refuses_unknown_type) { one_case("unknown type"); }
Test(daemon_faults, refuses_reply_type_as_request) { one_case("reply type"); }
Test(daemon_faults, refuses_header_len_over_cap) { one_case("header_len over the cap"); }
Test(daemon_faults, refuses_request_with_payload) { one_case("request with a payload"); }
Test(daemon_faults, refuses_header_not_json) { one_case("header not JSON"); }
Test(daemon_faults, refuses_header_not_object) { one_case("header not an object"); }
Test(daemon_faults, refuses_bytes_after_header_object)
{
    one_case("bytes after the header object");
}
Test(daemon_faults, refuses_duplicate_member) { one_case("member name twice"); }
Test(daemon_faults, refuses_nul_in_header) { one_case("NUL byte in the header"); }
Test(daemon_faults, refuses_invalid_utf8) { one_case("invalid UTF-8 in the header"); }
Test(daemon_faults, refuses_nesting_over_max_depth)
{
    one_case("nesting over KW_PROTO_MAX_DEPTH");
}
Test(daemon_faults, refuses_random_garbage) { one_case("4 KiB of random garbage"); }

/* Every case, one after another on one daemon: each is counted. */
Test(daemon_faults, counts_every_protocol_error)
{
    kwd d;
    kwc good;
    start_with_good(&d, "kwf-all", 2, NULL, &good);
    for (size_t i = 0; i < NCASES; i++)
        send_bad(d.sock, &cases[i], &good);
    cr_expect_eq(kwc_stat(&good, "protocol_errors"), NCASES);
    cr_expect_eq(kwc_stat(&good, "requests"), NCASES + 3,
                 "only the good client's: a ping per case, the first ping, two stats");
    kwd_down(&d, &good);
}

/* The cap is inclusive: a header of exactly KW_PROTO_MAX_HEADER bytes (a
 * frame of KW_PROTO_MAX_REQUEST, the whole read buffer) is served. */
Test(daemon_faults, serves_a_header_of_exactly_the_cap)
{
    kwd d;
    kwc good, big;
    start_with_good(&d, "kwf-cap", 2, NULL, &good);
    kwc_must_open(&big, d.sock);
    static char text[KW_PROTO_MAX_HEADER];
    static const char pre[] = "{\"pad\":\"";
    memcpy(text, pre, sizeof pre - 1);
    memset(text + sizeof pre - 1, 'x', sizeof text - (sizeof pre - 1) - 2);
    memcpy(text + sizeof text - 2, "\"}", 2);
    static uint8_t frame[KW_PROTO_MAX_REQUEST];
    size_t n = ping_with(frame, text, sizeof text);
    cr_assert_eq(n, KW_PROTO_MAX_REQUEST);
    cr_assert_eq(kwc_send_raw(&big, frame, n), 0);
    kwr r = kwc_must_recv(&big, 5000);
    kwr_expect_type(&r, KW_PROTO_PONG, "PING with a header at the cap");
    kwr_free(&r);
    kwc_expect_pong(&big, "the same connection afterwards");
    kwc_expect_pong(&good, "good client");
    cr_expect_eq(kwc_stat(&good, "protocol_errors"), 0);
    kwc_close(&big);
    kwd_down(&d, &good);
}

/* A client that leaves in the middle of its warmup: its compiles finish
 * (another warmup joins them, each key compiled once) and the daemon
 * serves on and stops cleanly (ASan watches the connection's lifetime). */
Test(daemon_faults, client_gone_mid_warmup_is_harmless)
{
    kwd d;
    kwc good, gone;
    start_with_good(&d, "kwf-gone", 2, NULL, &good);
    cJSON *hdr = kwd_model_hdr("deepseek-v3.2-exp.json", 0);
    kwc_must_open(&gone, d.sock);
    cr_assert_eq(kwc_send(&gone, KW_PROTO_WARMUP, hdr), 0);
    kwr r = kwc_must_recv(&gone, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_PROGRESS, "first frame");
    kwr_free(&r);
    kwc_close(&gone); /* with compiles queued for it */
    kwc_expect_pong(&good, "after a client left mid-warmup");
    size_t np = 0;
    r = kwc_call(&good, KW_PROTO_WARMUP, hdr, &np);
    kwr_expect_type(&r, KW_PROTO_RESULT, "warmup joining the orphaned compiles");
    int n = kwd_count_keys("deepseek-v3.2-exp.json", 0);
    cr_expect_eq(kwr_num(&r, "keys"), n);
    cr_expect_eq(kwr_num(&r, "failed"), 0);
    cr_expect_eq(np, (size_t)n);
    kwr_free(&r);
    cr_expect_eq(kwc_stat(&good, "compiles_started"), n);
    cr_expect_eq(kwc_stat(&good, "compiles_inflight"), 0);
    cr_expect_eq(kwc_stat(&good, "connections"), 1);
    cJSON_Delete(hdr);
    kwd_down(&d, &good);
}

/* Replies the client never reads, then a close: the daemon's writes fail
 * (EPIPE, not SIGPIPE) and it serves on. */
Test(daemon_faults, client_gone_before_reading_its_replies)
{
    kwd d;
    kwc good, rude;
    start_with_good(&d, "kwf-rude", 2, NULL, &good);
    for (int round = 0; round < 20; round++) {
        kwc_must_open(&rude, d.sock);
        for (int i = 0; i < 8; i++)
            cr_assert_eq(kwc_send(&rude, KW_PROTO_STATS, NULL), 0);
        kwc_close(&rude);
    }
    kwc_expect_pong(&good, "after 20 rude clients");
    kwd_down(&d, &good);
}

/* The idle timeout is for silent clients, not for one waiting on a long
 * warmup (--jobs 1: 26 compiles take seconds, --idle-timeout 300 ms). */
Test(daemon_faults, idle_timeout_spares_a_long_warmup)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwf-idlewarm", 1, (const char *const[]){"--idle-timeout", "300", NULL},
           &c);
    cJSON *hdr = kwd_model_hdr("deepseek-v3.2-exp.json", 0);
    int64_t t0 = kwd_now_ms();
    size_t np = 0;
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, hdr, &np);
    kwr_expect_type(&r, KW_PROTO_RESULT, "long warmup");
    int n = kwd_count_keys("deepseek-v3.2-exp.json", 0);
    cr_expect_eq(kwr_num(&r, "compiled"), n);
    cr_expect_eq(np, (size_t)n);
    cr_expect_gt(kwd_now_ms() - t0, 300, "the warmup was too quick to tell");
    kwr_free(&r);
    kwc_expect_pong(&c, "right after the warmup");
    cJSON_Delete(hdr);
    kwd_down(&d, &c);
}

/* ---- a half frame, then silence ---------------------------------------- */

Test(daemon_faults, closes_a_half_frame_after_the_idle_timeout)
{
    kwd d;
    kwc good, half;
    start_with_good(&d, "kwf-half", 2,
                    (const char *const[]){"--idle-timeout", "300", NULL}, &good);
    kwc_must_open(&half, d.sock);
    uint8_t frame[16];
    head(frame, KW_PROTO_PING, 0, 0);
    int64_t t0 = kwd_now_ms();
    cr_assert_eq(kwc_send_raw(&half, frame, 10), 0);
    /* The good client pings every 50 ms (it would idle out too), and is
     * answered while the half frame waits for its timeout. */
    int rc = -ETIMEDOUT;
    size_t pings = 0;
    while (kwd_now_ms() - t0 < 5000) {
        kwc_expect_pong(&good, "while a half frame is pending");
        pings++;
        kwr r;
        rc = kwc_recv(&half, &r, 50);
        if (rc == 0)
            kwr_free(&r);
        if (rc != -ETIMEDOUT)
            break;
    }
    int64_t waited = kwd_now_ms() - t0;
    cr_expect_eq(rc, KWC_EOF, "half frame: %s after %lld ms, want EOF",
                 rc == 0 ? "a frame" : kw_strerror(rc), (long long)waited);
    cr_expect_geq(waited, 250, "closed after %lld ms, before the timeout",
                  (long long)waited);
    cr_expect_geq(pings, 3);
    kwc_close(&half);
    kwc_expect_pong(&good, "after the half frame was closed");
    cr_expect_eq(kwc_stat(&good, "protocol_errors"), 0, "idleness is no error");
    cr_expect_eq(kwc_stat(&good, "connections"), 1);
    kwd_down(&d, &good);
}

/* ---- SIGTERM in the middle of a warmup ---------------------------------- */

typedef struct digests {
    uint8_t (*d)[KW_CACHE_DIGEST_LEN];
    size_t n, cap;
} digests;

static int collect(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                   const kw_cache_info *info, void *arg)
{
    digests *ds = arg;
    (void)info;
    if (ds->n == ds->cap) {
        ds->cap = ds->cap ? 2 * ds->cap : 64;
        ds->d = realloc(ds->d, ds->cap * sizeof *ds->d);
        if (ds->d == NULL)
            return 1;
    }
    memcpy(ds->d[ds->n++], digest, KW_CACHE_DIGEST_LEN);
    return 0;
}

Test(daemon_faults, sigterm_mid_warmup_exits_0_and_leaves_a_sound_cache)
{
    kwd d;
    kwc c;
    start_with_good(&d, "kwf-term", 1, NULL, &c);
    cJSON *hdr = kwd_model_hdr("deepseek-v4-flash.json", 8);
    cr_assert_eq(kwc_send(&c, KW_PROTO_WARMUP, hdr), 0);
    cJSON_Delete(hdr);
    kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_PROGRESS, "first frame of the warmup");
    int total = kwd_count_keys("deepseek-v4-flash.json", 8);
    cr_expect_eq(kwr_num(&r, "total"), total);
    char first[65];
    const cJSON *res0 = cJSON_GetArrayItem(
        cJSON_GetObjectItemCaseSensitive(r.hdr, "results"), 0);
    snprintf(first, sizeof first, "%s", cJSON_GetStringValue(
                 cJSON_GetObjectItemCaseSensitive(res0, "digest")));
    kwr_free(&r);
    int64_t t0 = kwd_now_ms();
    cr_assert_eq(kill(d.pid, SIGTERM), 0);
    kwd_expect_exit0(&d, 5000);
    int64_t took = kwd_now_ms() - t0;
    /* The client sees its connection end (frames before that are fine). */
    int rc;
    while ((rc = kwc_recv(&c, &r, 5000)) == 0)
        kwr_free(&r);
    cr_expect(rc == KWC_EOF || rc == -ECONNRESET, "client after stop: %s",
              kw_strerror(rc));
    kwc_close(&c);
    cr_expect_neq(access(d.sock, F_OK), 0, "socket file left behind");

    kw_cache *cache = NULL;
    kw_cache_opts co = {.dir = d.cache, .read_only = true};
    char err[256] = "";
    cr_assert_eq(kw_cache_open(&cache, &co, err, sizeof err), 0, "%s", err);
    digests ds = {0};
    cr_assert_eq(kw_cache_foreach(cache, collect, &ds), 0);
    cr_expect_geq(ds.n, 1, "the compile behind the first PROGRESS is stored");
    cr_expect_lt(ds.n, (size_t)total, "the warmup was not cut short (%lld ms)",
                 (long long)took);
    bool have_first = false;
    for (size_t i = 0; i < ds.n; i++) {
        void *blob = NULL;
        size_t len = 0;
        char hex[65];
        for (size_t b = 0; b < KW_CACHE_DIGEST_LEN; b++)
            snprintf(hex + 2 * b, 3, "%02x", ds.d[i][b]);
        have_first = have_first || strcmp(hex, first) == 0;
        cr_expect_eq(kw_cache_get(cache, ds.d[i], &blob, &len, NULL), 0,
                     "entry %s does not verify", hex);
        free(blob);
    }
    cr_expect(have_first, "first PROGRESS digest %s not in the cache", first);
    free(ds.d);
    kw_cache_close(cache);
}

/* kill -9 in the middle of a warmup, then a restart on the same socket and
 * cache: no torn entry, and the same warmup completes (issue 7). */
Test(daemon_faults, kill_9_mid_warmup_then_restart_completes_the_warmup)
{
    kwd d;
    kwc c;
    start_with_good(&d, "kwf-kill9", 1, NULL, &c);
    cJSON *hdr = kwd_model_hdr("glm-5-next-kpool.json", 2);
    cr_assert_eq(kwc_send(&c, KW_PROTO_WARMUP, hdr), 0);
    kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_PROGRESS, "first frame of the warmup");
    double total = kwr_num(&r, "total");
    kwr_free(&r);
    cr_assert_eq(kill(d.pid, SIGKILL), 0);
    int st = 0;
    cr_assert(kwd_wait_exit(d.pid, 5000, &st), "kwarmd outlived SIGKILL");
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    d.pid = 0;
    kwc_close(&c);

    /* The stale socket is replaced, the dead daemon's cache lock is gone
     * with it, and LMDB clears its reader slot. */
    kwd_start(&d, 1, NULL);
    kwc_must_open(&c, d.sock);
    cr_assert_eq(kwc_send(&c, KW_PROTO_WARMUP, hdr), 0);
    for (;;) {
        r = kwc_must_recv(&c, 120000);
        if (r.type != KW_PROTO_PROGRESS)
            break;
        kwr_free(&r);
    }
    kwr_expect_type(&r, KW_PROTO_RESULT, "warmup after the restart");
    cr_expect_eq(kwr_num(&r, "keys"), total);
    cr_expect_eq(kwr_num(&r, "failed"), 0);
    cr_expect_eq(kwr_num(&r, "compiled") + kwr_num(&r, "hits"), total);
    cr_expect_gt(kwr_num(&r, "hits"), 0, "nothing survived the kill");
    kwr_free(&r);
    cJSON_Delete(hdr);
    kwd_down(&d, &c);

    kw_cache *cache = NULL;
    kw_cache_opts co = {.dir = d.cache, .read_only = true};
    char err[256] = "";
    cr_assert_eq(kw_cache_open(&cache, &co, err, sizeof err), 0, "%s", err);
    digests ds = {0};
    cr_assert_eq(kw_cache_foreach(cache, collect, &ds), 0);
    cr_expect_eq(ds.n, (size_t)total);
    for (size_t i = 0; i < ds.n; i++) {
        void *blob = NULL;
        size_t len = 0;
        cr_expect_eq(kw_cache_get(cache, ds.d[i], &blob, &len, NULL), 0,
                     "entry %zu is torn", i);
        free(blob);
    }
    free(ds.d);
    kw_cache_close(cache);
}

/* ---- start-up: the socket path ------------------------------------------ */

Test(daemon_faults, replaces_a_stale_socket_file)
{
    kwd d;
    kwc c;
    kwd_init(&d, "kwf-stale");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, d.sock, strlen(d.sock) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd); /* the file stays: a daemon that died without cleaning up */
    struct stat st;
    cr_assert(stat(d.sock, &st) == 0 && S_ISSOCK(st.st_mode));
    kwd_start(&d, 2, NULL);
    kwc_must_open(&c, d.sock);
    kwc_expect_pong(&c, "on a replaced stale socket");
    kwd_down(&d, &c);
}

/* Runs a kwarmd expected to refuse to start: returns its exit status and
 * its stderr (free() it); asserts it exited within 20 s, never sent
 * READY=1, and reported no sanitizer error. */
static int refused_start(kwd *d, const char *const *args, char **log)
{
    char path[300];
    snprintf(path, sizeof path, "%s/refused.log", d->dir);
    pid_t pid = kwd_spawn(d, args, path);
    int st = 0;
    cr_assert(kwd_wait_exit(pid, 20000, &st), "kwarmd did not refuse to start");
    cr_assert(WIFEXITED(st), "kwarmd killed by signal %d", WTERMSIG(st));
    char msg[256];
    ssize_t n = recv(d->notify_fd, msg, sizeof msg, MSG_DONTWAIT);
    cr_expect(n < 0 && errno == EAGAIN, "a refused kwarmd sent a notification");
    kwd_assert_clean_log(path);
    *log = kwd_log(path);
    return WEXITSTATUS(st);
}

Test(daemon_faults, refuses_a_second_daemon_on_the_socket)
{
    kwd d;
    kwc good;
    start_with_good(&d, "kwf-second", 2, NULL, &good);
    char cache2[300], *log = NULL;
    snprintf(cache2, sizeof cache2, "%s/cache2", d.dir);
    int st = refused_start(&d, (const char *const[]){"--socket", d.sock, "--cache",
                                                     cache2, "--jobs", "1", NULL},
                           &log);
    cr_expect_eq(st, 1, "second kwarmd: exit %d: %s", st, log);
    cr_expect(strstr(log, "another kwarmd") != NULL && strstr(log, d.sock) != NULL,
              "stderr should name the socket and another kwarmd: %s", log);
    free(log);
    kwc_expect_pong(&good, "first daemon, old connection");
    kwc c;
    kwc_must_open(&c, d.sock); /* the socket file is still the first's */
    kwc_expect_pong(&c, "first daemon, new connection");
    kwc_close(&c);
    kwd_down(&d, &good);
}

Test(daemon_faults, refuses_a_second_daemon_on_the_cache)
{
    kwd d;
    kwc good;
    start_with_good(&d, "kwf-samecache", 2, NULL, &good);
    char sock2[300], *log = NULL;
    snprintf(sock2, sizeof sock2, "%s/second.sock", d.dir);
    int st = refused_start(&d, (const char *const[]){"--socket", sock2, "--cache",
                                                     d.cache, "--jobs", "1", NULL},
                           &log);
    cr_expect_eq(st, 1, "second kwarmd: exit %d: %s", st, log);
    cr_expect(strstr(log, "another kwarmd") != NULL && strstr(log, d.cache) != NULL,
              "stderr should name the cache and another kwarmd: %s", log);
    free(log);
    cr_expect_neq(access(sock2, F_OK), 0, "the refused daemon left its socket");
    kwc_expect_pong(&good, "first daemon after the refusal");
    kwd_down(&d, &good);
}

/* True when dir holds an entry whose name starts with prefix. */
static bool dir_has_prefix(const char *dir, const char *prefix)
{
    DIR *dp = opendir(dir);
    cr_assert_not_null(dp);
    bool found = false;
    for (struct dirent *e; (e = readdir(dp)) != NULL;)
        found = found || strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(dp);
    return found;
}

/* A path of exactly len bytes under dir: dir/aaaa... */
static void long_path(char *out, size_t cap, const char *dir, size_t len)
{
    size_t n = (size_t)snprintf(out, cap, "%s/", dir);
    cr_assert(len < cap && n < len);
    memset(out + n, 'a', len - n);
    out[len] = '\0';
}

Test(daemon_faults, refuses_a_socket_path_over_107_bytes)
{
    kwd d;
    kwd_init(&d, "kwf-long");
    char path[200], cache[300], *log = NULL;
    long_path(path, sizeof path, d.dir, 108); /* sun_path has no room for NUL */
    snprintf(cache, sizeof cache, "%s/cache", d.dir);
    int st = refused_start(&d, (const char *const[]){"--socket", path, "--cache",
                                                     cache, "--jobs", "1", NULL},
                           &log);
    cr_expect(st == 2 || st == 1, "exit %d: %s", st, log);
    cr_expect(strstr(log, "--socket") != NULL, "stderr should name --socket: %s",
              log);
    cr_expect(!dir_has_prefix(d.dir, "aaaa"), "a (truncated) socket was created");
    free(log);
}

Test(daemon_faults, serves_a_socket_path_of_exactly_107_bytes)
{
    kwd d;
    kwc c;
    kwd_init(&d, "kwf-107");
    long_path(d.sock, sizeof d.sock, d.dir, 107);
    kwd_start(&d, 2, NULL);
    struct stat st;
    cr_assert_eq(stat(d.sock, &st), 0, "no socket at the 107-byte path");
    cr_expect(S_ISSOCK(st.st_mode));
    kwc_must_open(&c, d.sock);
    kwc_expect_pong(&c, "107-byte socket path");
    kwd_down(&d, &c);
}

Test(daemon_faults, refuses_a_regular_file_at_the_socket_path)
{
    kwd d;
    kwd_init(&d, "kwf-file");
    char path[300], *log = NULL;
    cr_assert_eq(kw_test_write_file(d.dir, "s.sock", "x", 1, path, sizeof path), 0);
    int st = refused_start(&d, (const char *const[]){"--socket", d.sock, "--cache",
                                                     d.cache, "--jobs", "1", NULL},
                           &log);
    cr_expect_eq(st, 1, "exit %d: %s", st, log);
    cr_expect(strstr(log, d.sock) != NULL, "stderr should name the path: %s", log);
    char *text = kw_test_read_file(path, NULL);
    cr_expect(text != NULL && strcmp(text, "x") == 0, "the file was replaced");
    free(text);
    free(log);
}

/* ---- a protocol error ends the reading (issue 23) ----------------------- */

/* Lines of d's log holding needle. */
static int log_count(const kwd *d, const char *needle)
{
    char *s = kwd_log(d->log);
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    free(s);
    return n;
}

/* 50 connections each send 128 KiB of garbage in 128 writes (so that
 * some reach kwarmd in later reads than the first): each gets exactly one
 * ERROR frame and then the end of the connection, and kwarmd logs and
 * counts exactly one protocol error for each. */
Test(daemon_faults, a_garbage_stream_gets_one_error_frame_then_the_end)
{
    kwd d;
    kwc good;
    start_with_good(&d, "kwf-garb", 1, NULL, &good);
    uint8_t chunk[4096];
    random_garbage(chunk);
    int fl;
    for (int i = 0; i < 50; i++) {
        kwc bad;
        kwc_must_open(&bad, d.sock);
        fl = fcntl(bad.fd, F_GETFL);
        fcntl(bad.fd, F_SETFL, fl | O_NONBLOCK);
        for (int k = 0; k < 128; k++) /* a full or closed socket: fine */
            if (send(bad.fd, chunk, 1024, MSG_NOSIGNAL) < 0 && errno != EAGAIN)
                break;
        fcntl(bad.fd, F_SETFL, fl);
        kwr r;
        int rc = kwc_recv(&bad, &r, 5000);
        cr_assert_eq(rc, 0, "[%d] no ERROR frame: %d", i, rc);
        kwr_expect_type(&r, KW_PROTO_ERROR, "garbage");
        cr_expect_str_eq(kwr_str(&r, "code"), "KW_EPROTO");
        kwr_free(&r);
        rc = kwc_recv(&bad, &r, 5000);
        if (rc == 0)
            kwr_free(&r);
        /* Bytes never read make the close a reset: the end either way. */
        cr_expect(rc == KWC_EOF || rc == -ECONNRESET,
                  "[%d] after the ERROR frame: %s, want the end", i,
                  rc == 0 ? "another frame" : kw_strerror(rc));
        kwc_close(&bad);
    }
    cr_expect_eq(kwc_stat(&good, "protocol_errors"), 50);
    cr_expect_eq(log_count(&d, "; closing (input: "), 50,
                 "one log line per garbage connection");
    kwd_down(&d, &good);
}
