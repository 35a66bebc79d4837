/* test_client.c: libkwarm (kw_client.h) and the kwarm commands that talk
 * to kwarmd (ping, warmup, get --socket, stats --socket), black-box
 * against a real kwarmd started per test on a socket in a temporary
 * directory (memcached's new_memcached()).  Compiles need NVRTC only, so
 * this suite runs on hosts without a GPU. */
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "cli_util.h" /* criterion, libc, cJSON, kw_err.h, kw_test_util.h */
#include "kw_client.h"
#include "kw_proto.h"

#define COMPOSITE KW_FIXTURES "/composite-text-config.json"
#define NO_DIGEST "0000000000000000000000000000000000000000000000000000000000000000"

static char sock[128], cache[128];
static pid_t daemon_pid = -1;

/* ---- the daemon ---------------------------------------------------------- */

/* Starts kwarmd on tmpdir/s.sock with its log in tmpdir/kwarmd.log. */
static void spawn_daemon(void)
{
    char log[128];
    snprintf(log, sizeof log, "%s/kwarmd.log", tmpdir);
    daemon_pid = fork();
    cr_assert(daemon_pid >= 0, "fork: %s", strerror(errno));
    if (daemon_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* no kwarmd outlives a crash */
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execl(KW_KWARMD_BIN, "kwarmd", "--socket", sock, "--cache", cache,
              "--jobs", "2", (char *)NULL);
        _exit(127);
    }
}

/* Waits (bounded) until kwarmd accepts a connection. */
static void wait_ready(void)
{
    for (int i = 0; i < 400; i++) {
        kw_client *c = NULL;
        if (kw_client_connect(&c, sock, 200, NULL, 0) == 0) {
            kw_client_close(c);
            return;
        }
        int st;
        cr_assert_eq(waitpid(daemon_pid, &st, WNOHANG), 0,
                     "kwarmd exited before accepting");
        nanosleep(&(struct timespec){0, 25 * 1000 * 1000}, NULL);
    }
    cr_assert_fail("kwarmd did not accept on %s within 10 s", sock);
}

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(tmpdir, sizeof tmpdir, "client"), 0,
                 "mkdtemp: %s", strerror(errno));
    snprintf(sock, sizeof sock, "%s/s.sock", tmpdir);
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    spawn_daemon();
    wait_ready();
}

/* Stops kwarmd with SIGTERM and expects a clean exit 0. */
static void stop_daemon(void)
{
    int st = 0;
    cr_assert_eq(kill(daemon_pid, SIGTERM), 0);
    cr_assert_eq(waitpid(daemon_pid, &st, 0), daemon_pid);
    daemon_pid = -1;
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "kwarmd did not exit 0 (status 0x%x)", st);
}

/* Kills a daemon a failed test left running; removes the directory. */
static void teardown(void)
{
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGKILL);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = -1;
    }
    kw_test_rmtree(tmpdir);
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 300);

/* ---- helpers ------------------------------------------------------------- */

static kw_client *conn(void)
{
    kw_client *c = NULL;
    char err[256];
    int rc = kw_client_connect(&c, sock, 10000, err, sizeof err);
    cr_assert_eq(rc, 0, "connect: %s", err);
    return c;
}

/* The composite fixture's text (free it). */
static char *config_text(void)
{
    char *t = kw_test_read_file(COMPOSITE, NULL);
    cr_assert_not_null(t);
    return t;
}

/* The keys document of the composite fixture, through the daemon. */
static cJSON *daemon_keys(kw_client *c)
{
    char *cfg = config_text(), *reply = NULL;
    int rc = kw_client_keys(c, cfg, NULL, "composite.json", &reply);
    cr_assert_eq(rc, 0, "keys: %s", kw_client_last_error(c));
    cJSON *doc = cJSON_Parse(reply);
    cr_assert_not_null(doc);
    free(reply);
    free(cfg);
    return doc;
}

/* Member name of obj as a string / number (asserted). */
static const char *str(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    cr_assert(cJSON_IsString(v), "no string %s", name);
    return v->valuestring;
}

static long num(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    cr_assert(cJSON_IsNumber(v), "no number %s", name);
    return (long)v->valuedouble;
}

/* The "keys" array of a document, asserted non-empty. */
static const cJSON *keys_of(const cJSON *doc)
{
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    cr_assert(cJSON_IsArray(k) && cJSON_GetArraySize(k) > 0);
    return k;
}

/* Expects the digests of two key lists (objects with "digest") equal. */
static void expect_same_digests(const cJSON *a, const cJSON *b)
{
    cr_assert_eq(cJSON_GetArraySize(a), cJSON_GetArraySize(b));
    for (int i = 0; i < cJSON_GetArraySize(a); i++)
        cr_expect_str_eq(str(cJSON_GetArrayItem(a, i), "digest"),
                         str(cJSON_GetArrayItem(b, i), "digest"), "key %d", i);
}

/* Fetches key (an element of a keys document) by family/fields/arch. */
static int get_key(kw_client *c, const cJSON *key, bool compile,
                   kw_client_kernel *k)
{
    char *fields = cJSON_PrintUnformatted(
        cJSON_GetObjectItemCaseSensitive(key, "fields"));
    int rc = kw_client_get_key(c, str(key, "family"), fields,
                               str(key, "arch"), compile, k);
    free(fields);
    return rc;
}

/* Compiles the first key of the composite fixture; returns its document
 * (the whole keys document, to free) and the key in *key. */
static cJSON *compile_first(kw_client *c, const cJSON **key)
{
    cJSON *doc = daemon_keys(c);
    kw_client_kernel k = {0};
    *key = cJSON_GetArrayItem(keys_of(doc), 0);
    cr_assert_eq(get_key(c, *key, true, &k), 0, "get_key: %s",
                 kw_client_last_error(c));
    kw_client_kernel_destroy(&k);
    return doc;
}

/* The daemon's stats, parsed. */
static cJSON *stats(kw_client *c)
{
    char *s = NULL;
    cr_assert_eq(kw_client_stats(c, &s), 0, "%s", kw_client_last_error(c));
    cJSON *doc = cJSON_Parse(s);
    cr_assert_not_null(doc);
    free(s);
    return doc;
}

/* ---- the library ---------------------------------------------------------- */

Test(client, ping_returns_the_daemon_version)
{
    kw_client *c = conn();
    char v[64], tiny[2];
    cr_assert_eq(kw_client_ping(c, v, sizeof v), 0, "%s",
                 kw_client_last_error(c));
    cr_expect(v[0] >= '0' && v[0] <= '9' && strchr(v, '.'), "version '%s'", v);
    cr_expect_eq(kw_client_ping(c, tiny, sizeof tiny), KW_ENOSPC);
    cr_expect_eq(kw_client_ping(c, NULL, 0), 0, "still connected");
    cr_expect_str_eq(kw_client_path(c), sock);
    kw_client_close(c);
    stop_daemon();
}

Test(client, keys_match_kwarm_keys_json)
{
    kw_client *c = conn();
    cJSON *mine = daemon_keys(c);
    result r = kwarm(ARGS("keys", "--model", COMPOSITE, "--json"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *cli = cJSON_Parse(r.out);
    cr_assert_not_null(cli);
    expect_same_digests(keys_of(mine), keys_of(cli));
    cr_expect_str_eq(str(mine, "model"), "composite.json");
    cJSON_Delete(mine);
    cJSON_Delete(cli);
    result_free(&r);

    /* A deployment object changes the keys exactly as the flags do. */
    char *cfg = config_text(), *reply = NULL;
    cr_assert_eq(kw_client_keys(c, cfg, "{\"dcp_world\": 2, \"arch\": "
                 "\"sm_90,sm_100\"}", NULL, &reply), 0, "%s",
                 kw_client_last_error(c));
    r = kwarm(ARGS("keys", "--model", COMPOSITE, "--json", "--dcp-world", "2",
                   "--arch", "sm_90,sm_100"));
    mine = cJSON_Parse(reply);
    cli = cJSON_Parse(r.out);
    cr_assert(mine && cli);
    expect_same_digests(keys_of(mine), keys_of(cli));
    cJSON_Delete(mine);
    cJSON_Delete(cli);
    result_free(&r);
    free(reply);
    free(cfg);
    kw_client_close(c);
    stop_daemon();
}

/* Counts the results streamed in PROGRESS frames (calls: results, not
 * frames) and checks each names a key with a status; beats: frames with
 * no results (kwarmd's heartbeat while a compile runs past 2 s). */
typedef struct progress_log {
    int calls, frames, beats;
    long last_done, total;
} progress_log;

static void on_progress(const char *json, void *arg)
{
    progress_log *p = arg;
    cJSON *h = cJSON_Parse(json);
    cr_assert_not_null(h, "progress is not JSON: %s", json);
    p->frames++;
    cr_expect_geq(num(h, "done"), p->last_done, "\"done\" went back: %s", json);
    p->last_done = num(h, "done");
    p->total = num(h, "total");
    const cJSON *e, *res = cJSON_GetObjectItemCaseSensitive(h, "results");
    cr_assert(cJSON_IsArray(res), "%s", json);
    p->beats += cJSON_GetArraySize(res) == 0;
    cJSON_ArrayForEach(e, res) {
        p->calls++;
        cr_expect_eq(strlen(str(e, "digest")), 64);
        const char *st = str(e, "status");
        cr_expect(strcmp(st, "compiled") == 0 || strcmp(st, "hit") == 0, "%s", st);
    }
    cr_expect(p->frames - p->beats <= p->calls, "more frames than results");
    cJSON_Delete(h);
}

/* Runs a warmup of the composite fixture; returns its parsed result.  Its
 * keys compile for real, taking seconds each under ASan on a loaded CI
 * machine; kwarmd's heartbeats (every 2 to 2.5 s of silence) keep each
 * wait short, and 30 s leaves room for a starved loop thread. */
static cJSON *warmup(kw_client *c, progress_log *p)
{
    char *cfg = config_text(), *res = NULL;
    kw_client_set_timeout(c, 30000);
    int rc = kw_client_warmup(c, cfg, NULL, NULL, on_progress, p, &res);
    kw_client_set_timeout(c, 10000);
    cr_assert_eq(rc, 0, "warmup: %s", kw_client_last_error(c));
    cJSON *doc = cJSON_Parse(res);
    cr_assert_not_null(doc);
    free(res);
    free(cfg);
    return doc;
}

Test(client, warmup_manifest_is_the_keys_with_one_progress_per_key)
{
    kw_client *c = conn();
    cJSON *keys = daemon_keys(c);
    int n = cJSON_GetArraySize(keys_of(keys));
    progress_log p = {0};
    cJSON *res = warmup(c, &p);
    expect_same_digests(keys_of(keys),
                        cJSON_GetObjectItemCaseSensitive(res, "manifest"));
    cr_expect_eq(num(res, "keys"), n);
    cr_expect_eq(num(res, "compiled"), n);
    cr_expect_eq(num(res, "failed"), 0);
    cr_expect_eq(p.calls, n, "progress called %d times for %d keys", p.calls, n);
    cr_expect_eq(p.last_done, n);
    cr_expect_eq(p.total, n);
    cJSON_Delete(res);

    /* Warm again: every key is a hit, still one progress each. */
    p = (progress_log){0};
    res = warmup(c, &p);
    cr_expect_eq(num(res, "hits"), n);
    cr_expect_eq(num(res, "compiled"), 0);
    cr_expect_eq(p.calls, n);
    cJSON_Delete(res);
    cJSON_Delete(keys);
    kw_client_close(c);
    stop_daemon();
}

Test(client, get_by_digest_returns_the_same_cuda_elf_twice)
{
    kw_client *c = conn();
    const cJSON *key;
    cJSON *doc = compile_first(c, &key);
    kw_client_kernel a = {0}, b = {0};
    cr_assert_eq(kw_client_get(c, str(key, "digest"), false, &a), 0, "%s",
                 kw_client_last_error(c));
    cr_assert_eq(kw_client_get(c, str(key, "digest"), false, &b), 0);
    cr_expect_eq(kw_test_elf_machine(a.cubin, a.len), 190, "not a CUDA ELF");
    cr_assert_eq(a.len, b.len);
    cr_expect_eq(memcmp(a.cubin, b.cubin, a.len), 0);
    cr_expect_str_eq(a.digest, str(key, "digest"));
    cr_expect_str_eq(a.family, str(key, "family"));
    cr_expect_str_eq(a.arch, str(key, "arch"));
    cr_expect(a.entry[0] != '\0' && !a.compiled);
    cr_expect(kw_test_elf_has_symbol(a.cubin, a.len, a.entry),
              "entry %s not in the cubin", a.entry);
    kw_client_kernel_destroy(&a);
    kw_client_kernel_destroy(&b);
    cr_expect_null(a.cubin);
    kw_client_kernel_destroy(NULL);
    cJSON_Delete(doc);
    kw_client_close(c);
    stop_daemon();
}

Test(client, get_of_an_unknown_digest_is_not_found)
{
    kw_client *c = conn();
    kw_client_kernel k = {0};
    cr_expect_eq(kw_client_get(c, NO_DIGEST, false, &k), KW_ENOTFOUND);
    cr_expect_null(k.cubin);
    cr_expect(strlen(kw_client_last_error(c)) > 0);
    cr_expect_eq(kw_client_get(c, NO_DIGEST, true, &k), KW_ENOTFOUND,
                 "a digest alone cannot be compiled");
    cr_expect_eq(kw_client_get(c, "abc", false, &k), KW_EINVAL);
    cr_expect_eq(kw_client_ping(c, NULL, 0), 0, "connection still usable");
    kw_client_close(c);
    stop_daemon();
}

Test(client, get_key_compiles_on_a_miss_only_when_asked)
{
    kw_client *c = conn();
    cJSON *doc = daemon_keys(c);
    const cJSON *key = cJSON_GetArrayItem(keys_of(doc), 1);
    kw_client_kernel k = {0};
    cr_expect_eq(get_key(c, key, false, &k), KW_ENOTFOUND);
    cr_assert_eq(get_key(c, key, true, &k), 0, "%s", kw_client_last_error(c));
    cr_expect(k.compiled);
    cr_expect_str_eq(k.digest, str(key, "digest"));
    cr_expect_eq(kw_test_elf_machine(k.cubin, k.len), 190);
    kw_client_kernel_destroy(&k);
    cr_assert_eq(get_key(c, key, true, &k), 0);
    cr_expect(!k.compiled, "second get is a hit");
    kw_client_kernel_destroy(&k);
    /* The daemon refuses an unknown family or a missing field. */
    cr_expect_eq(kw_client_get_key(c, "no_such_family", "{}", "sm_90", true,
                                   &k), KW_EINVAL);
    cr_expect_eq(kw_client_get_key(c, str(key, "family"), "{}", "sm_90", true,
                                   &k), KW_EINVAL);
    cr_expect(strstr(kw_client_last_error(c), "/fields/") != NULL, "%s",
              kw_client_last_error(c));
    cr_expect_eq(kw_client_get_key(c, str(key, "family"), "[1]", "sm_90",
                                   true, &k), KW_EINVAL);
    cJSON_Delete(doc);
    kw_client_close(c);
    stop_daemon();
}

Test(client, stats_count_entries_and_requests)
{
    kw_client *c = conn();
    cJSON *st = stats(c);
    cr_expect_eq(num(st, "entries"), 0);
    long req0 = num(st, "requests");
    num(st, "connections");
    num(st, "compiles_inflight");
    cJSON_Delete(st);
    const cJSON *key;
    cJSON *doc = compile_first(c, &key);
    st = stats(c);
    cr_expect_eq(num(st, "entries"), 1);
    cr_expect_geq(num(st, "compiles"), 1);
    cr_expect_gt(num(st, "bytes"), 0);
    cr_expect_gt(num(st, "requests"), req0);
    cJSON_Delete(st);
    cJSON_Delete(doc);
    kw_client_close(c);
    stop_daemon();
}

Test(client, evict_removes_an_entry_once)
{
    kw_client *c = conn();
    const cJSON *key;
    cJSON *doc = compile_first(c, &key);
    bool ev = false;
    kw_client_kernel k = {0};
    cr_assert_eq(kw_client_evict(c, str(key, "digest"), &ev), 0, "%s",
                 kw_client_last_error(c));
    cr_expect(ev);
    cr_expect_eq(kw_client_get(c, str(key, "digest"), false, &k),
                 KW_ENOTFOUND);
    cr_assert_eq(kw_client_evict(c, str(key, "digest"), &ev), 0);
    cr_expect(!ev, "nothing left to evict");
    cr_expect_eq(kw_client_evict(c, "xyz", &ev), KW_EINVAL);
    cJSON_Delete(doc);
    kw_client_close(c);
    stop_daemon();
}

Test(client, bad_requests_fail_and_keep_the_connection)
{
    kw_client *c = conn();
    char *reply = NULL;
    cr_expect_eq(kw_client_keys(c, "{not json", NULL, NULL, &reply), KW_EJSON);
    cr_expect_eq(kw_client_keys(c, "[1, 2]", NULL, NULL, &reply), KW_EINVAL);
    char *bad = kw_test_read_file(KW_FIXTURES "/bad/topk-string.json", NULL);
    cr_assert_not_null(bad);
    cr_expect_eq(kw_client_keys(c, bad, NULL, "bad.json", &reply),
                 KW_ECONFIG);
    cr_expect(strstr(kw_client_last_error(c), "index_topk") != NULL, "%s",
              kw_client_last_error(c));
    char *cfg = config_text();
    cr_expect_eq(kw_client_keys(c, cfg, "{\"dcp_world\": 0}", NULL, &reply),
                 KW_EDEPLOY, "%s", kw_client_last_error(c));
    cr_expect_null(reply);
    /* Over the 64 KiB header cap: refused before anything is sent. */
    size_t big = KW_PROTO_MAX_HEADER + 16;
    char *huge = malloc(big + 16);
    cr_assert_not_null(huge);
    int n = snprintf(huge, big, "{\"pad\": \"");
    memset(huge + n, 'x', big - (size_t)n);
    strcpy(huge + big, "\"}");
    cr_expect_eq(kw_client_keys(c, huge, NULL, NULL, &reply), KW_E2BIG);
    cr_expect_eq(kw_client_ping(c, NULL, 0), 0, "connection still usable");
    free(huge);
    free(cfg);
    free(bad);
    kw_client_close(c);
    stop_daemon();
}

Test(client, a_daemon_that_goes_away_gives_errors_not_signals)
{
    kw_client *c = conn();
    cr_assert_eq(kw_client_ping(c, NULL, 0), 0);
    stop_daemon();
    int rc = kw_client_ping(c, NULL, 0);
    cr_expect(rc == -EPIPE || rc == -ECONNRESET, "rc %d (%s)", rc,
              kw_client_last_error(c));
    cr_expect_eq(kw_client_ping(c, NULL, 0), -ENOTCONN);
    kw_client_close(c);
}

Test(client, connect_fails_cleanly_without_a_daemon)
{
    kw_client *c = (kw_client *)&c; /* must stay untouched */
    kw_client *const sentinel = c;
    char err[256], path[160];
    snprintf(path, sizeof path, "%s/missing.sock", tmpdir);
    cr_expect_eq(kw_client_connect(&c, path, 1000, err, sizeof err), -ENOENT);
    cr_expect_eq(c, sentinel);
    cr_expect(strstr(err, path) != NULL, "%s", err);
    /* A socket file with nobody listening. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(path, sizeof path, "%s/dead.sock", tmpdir);
    cr_assert_lt(strlen(path), sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_expect_eq(kw_client_connect(&c, path, 1000, NULL, 0), -ECONNREFUSED);
    close(fd);
    char longp[300];
    memset(longp, 'a', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    cr_expect_eq(kw_client_connect(&c, longp, 1000, err, sizeof err),
                 -ENAMETOOLONG, "a long path is refused, never cut");
    cr_expect_eq(kw_client_connect(&c, "", 1000, err, sizeof err), KW_EINVAL);
    cr_expect_eq(kw_client_connect(NULL, path, 1000, err, sizeof err),
                 KW_EINVAL);
    cr_expect_eq(c, sentinel);
    cr_expect_str_eq(kw_client_last_error(NULL), "");
    kw_client_close(NULL);
    stop_daemon();
}

Test(client, default_socket_prefers_kwarm_socket)
{
    char buf[KW_CLIENT_PATH_MAX], tiny[4];
    cr_assert_eq(setenv("KWARM_SOCKET", sock, 1), 0);
    cr_expect_str_eq(kw_client_default_socket(buf, sizeof buf), sock);
    cr_expect_null(kw_client_default_socket(tiny, sizeof tiny));
    kw_client *c = NULL;
    cr_assert_eq(kw_client_connect(&c, NULL, 1000, NULL, 0), 0);
    cr_expect_eq(kw_client_ping(c, NULL, 0), 0);
    kw_client_close(c);
    unsetenv("KWARM_SOCKET");
    cr_assert_eq(setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1), 0);
    cr_expect_str_eq(kw_client_default_socket(buf, sizeof buf),
                     getuid() == 0 ? "/run/kwarm/kwarm.sock"
                                   : "/run/user/4242/kwarm.sock");
    unsetenv("XDG_RUNTIME_DIR");
    cr_expect_str_eq(kw_client_default_socket(buf, sizeof buf),
                     "/run/kwarm/kwarm.sock");
    stop_daemon();
}

Test(client, gpu_load_gives_a_launchable_function)
{
    kw_cuda *cuda = NULL;
    char err[256];
    if (kw_cuda_open(&cuda, 0, err, sizeof err) < 0) {
        stop_daemon();
        kw_test_rmtree(tmpdir); /* .fini does not run after a skip */
        cr_skip_test("no GPU: %s", err);
    }
    kw_client *c = conn();
    const cJSON *key;
    cJSON *doc = compile_first(c, &key);
    kw_cuda_fn *fn = NULL;
    cr_assert_eq(kw_client_load(c, cuda, str(key, "digest"), &fn), 0, "%s",
                 kw_client_last_error(c));
    cr_expect_not_null(fn);
    kw_cuda_unload(fn);
    fn = NULL;
    cr_expect_eq(kw_client_load(c, cuda, NO_DIGEST, &fn), KW_ENOTFOUND);
    cr_expect_null(fn);
    cJSON_Delete(doc);
    kw_client_close(c);
    kw_cuda_close(cuda);
    stop_daemon();
}

/* ---- a scripted fake daemon: every rule of reply parsing ----------------- */

typedef struct canned { /* one reply; close_after: hang up after it */
    const char *bytes;
    size_t len;
    bool close_after;
} canned;

/* Writes a 16-byte head, wrong fields included (kw_proto refuses those). */
static void head(char *h, uint32_t magic, uint16_t type, uint32_t hl,
                 uint32_t pl)
{
    uint32_t w[4] = {magic, (uint32_t)KW_PROTO_VERSION | (uint32_t)type << 16,
                     hl, pl}; /* the host is little-endian, like the wire */
    memcpy(h, w, 16);
}

/* Writes a frame of type with JSON header json into buf; its length. */
static size_t frame(char *buf, uint16_t type, const char *json)
{
    head(buf, KW_PROTO_MAGIC, type, (uint32_t)strlen(json), 0);
    memcpy(buf + 16, json, strlen(json));
    return 16 + strlen(json);
}

/* Reads one request from fd (only pings are sent here: 16 bytes, one
 * send); false at EOF. */
static bool read_request(int fd)
{
    uint8_t buf[256];
    return read(fd, buf, sizeof buf) > 0;
}

/* Forks a server on tmpdir/fake.sock that answers requests with r[0..n)
 * in turn, then stays silent until the client hangs up. */
static pid_t fake_daemon(const canned *r, size_t n, char *path, size_t cap)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(path, cap, "%s/fake.sock", tmpdir);
    unlink(path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert(bind(ls, (struct sockaddr *)&a, sizeof a) == 0 && listen(ls, 1) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = accept(ls, NULL, NULL);
        for (size_t i = 0; i < n && read_request(fd); i++)
            if (write(fd, r[i].bytes, r[i].len) != (ssize_t)r[i].len || r[i].close_after)
                _exit(0);
        while (read_request(fd))
            ;
        _exit(0);
    }
    close(ls);
    return pid;
}

/* Pings a fake daemon that answers reply; expects rc, then expects the
 * connection closed (-ENOTCONN) or, when kept, a second ping to work. */
static void expect_reply(const char *label, canned reply, int want, bool kept)
{
    char path[160], pong[64];
    canned script[2] = {reply, {pong, frame(pong, KW_PROTO_PONG,
                                            "{\"version\":\"9\"}"), false}};
    pid_t pid = fake_daemon(script, 2, path, sizeof path);
    kw_client *c = NULL;
    cr_assert_eq(kw_client_connect(&c, path, 300, NULL, 0), 0);
    int rc = kw_client_ping(c, NULL, 0);
    cr_expect_eq(rc, want, "[%s] rc %d (%s), want %d", label, rc,
                 kw_client_last_error(c), want);
    cr_expect(strlen(kw_client_last_error(c)) > 0, "[%s] no error text", label);
    cr_expect_eq(kw_client_ping(c, NULL, 0), kept ? 0 : -ENOTCONN, "[%s]", label);
    kw_client_close(c);
    waitpid(pid, NULL, 0);
}

Test(client, refuses_every_malformed_reply)
{
    char f[8][64];
    head(f[0], 0x50545448u /* "HTTP" */, KW_PROTO_PONG, 0, 0);
    head(f[1], KW_PROTO_MAGIC, KW_PROTO_RESULT, KW_PROTO_MAX_REPLY_HEADER + 1, 0);
    head(f[2], KW_PROTO_MAGIC, KW_PROTO_RESULT, 0, KW_PROTO_MAX_PAYLOAD + 1);
    head(f[3], KW_PROTO_MAGIC, KW_PROTO_PONG, 0, 4);
    head(f[4], KW_PROTO_MAGIC, KW_PROTO_PING, 0, 0);    /* a request type */
    head(f[5], KW_PROTO_MAGIC, KW_PROTO_RESULT, 0, 0);  /* result to ping */
    head(f[6], KW_PROTO_MAGIC, KW_PROTO_PROGRESS, 0, 0); /* not a warmup */
    frame(f[7], KW_PROTO_PONG, "{x}");
    expect_reply("magic", (canned){f[0], 16, false}, KW_EPROTO, false);
    char v1[16];
    head(v1, KW_PROTO_MAGIC, KW_PROTO_PONG, 0, 0);
    v1[4] = 1; /* protocol version 1 */
    expect_reply("version", (canned){v1, 16, false}, KW_EVERSION, false);
    expect_reply("header cap", (canned){f[1], 16, false}, KW_E2BIG, false);
    expect_reply("payload cap", (canned){f[2], 16, false}, KW_E2BIG, false);
    expect_reply("payload on pong", (canned){f[3], 16, false}, KW_EPROTO, false);
    expect_reply("request type", (canned){f[4], 16, false}, KW_EPROTO, false);
    expect_reply("wrong type", (canned){f[5], 16, false}, KW_EPROTO, false);
    expect_reply("stray progress", (canned){f[6], 16, false}, KW_EPROTO, false);
    expect_reply("bad json", (canned){f[7], 19, false}, KW_EPROTO, false);
    expect_reply("cut short", (canned){f[7], 17, true}, -ECONNRESET, false);
    expect_reply("silence", (canned){f[7], 0, false}, -ETIMEDOUT, false);
    char e[2][96];
    size_t n0 = frame(e[0], KW_PROTO_ERROR, "{\"error\":\"boom\",\"code\":\"KW_ENOTFOUND\"}");
    size_t n1 = frame(e[1], KW_PROTO_ERROR, "{\"error\":\"boom\",\"code\":\"KW_EHUH\"}");
    expect_reply("error", (canned){e[0], n0, false}, KW_ENOTFOUND, true);
    expect_reply("unknown code", (canned){e[1], n1, false}, KW_EPROTO, true);
    stop_daemon();
}

/* ---- the CLI ---------------------------------------------------------------- */

Test(client, cli_ping)
{
    result r = kwarm(ARGS("ping", "--socket", sock));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strncmp(r.out, "kwarmd ", 7) == 0 && strstr(r.out, sock) &&
              lines(r.out) == 1, "%s", r.out);
    result_free(&r);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.sock", tmpdir);
    r = kwarm(ARGS("ping", "--socket", missing));
    cr_expect_eq(r.status, 1, "unreachable is a runtime failure");
    cr_expect(lines(r.err) == 1 && strstr(r.err, missing), "%s", r.err);
    result_free(&r);
    expect_bad_input("ping extra", ARGS("ping", "--bogus"),
                     NEEDLES("--bogus"));
    r = kwarm(ARGS("ping", "--help"));
    cr_expect(r.status == 0 && strstr(r.out, "--socket"));
    result_free(&r);
    stop_daemon();
}

Test(client, cli_warmup)
{
    kw_client *c = conn();
    cJSON *keys = daemon_keys(c);
    int n = cJSON_GetArraySize(keys_of(keys));
    kw_client_close(c);
    result r = kwarm(ARGS("warmup", "--model", COMPOSITE, "--socket", sock));
    cr_expect_eq(r.status, 0, "%s", r.err);
    char want[96];
    snprintf(want, sizeof want, "warmup: %d keys: %d compiled, 0 hits, 0 "
             "remote hits, 0 failed", n, n);
    cr_expect(strstr(r.out, want) != NULL, "%s", r.out);
    result_free(&r);
    r = kwarm(ARGS("warmup", "--model", COMPOSITE, "--socket", sock, "--json"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cJSON *res = cJSON_Parse(r.out);
    cr_assert_not_null(res, "%s", r.out);
    cr_expect_eq(num(res, "hits"), n);
    expect_same_digests(keys_of(keys),
                        cJSON_GetObjectItemCaseSensitive(res, "manifest"));
    cJSON_Delete(res);
    result_free(&r);
    expect_bad_input("warmup bad config",
                     ARGS("warmup", "--model", KW_FIXTURES "/bad/topk-string.json",
                          "--socket", sock),
                     NEEDLES("index_topk"));
    expect_bad_input("warmup no model", ARGS("warmup", "--socket", sock),
                     NEEDLES("--model"));
    cJSON_Delete(keys);
    stop_daemon();
}

/* Builds "k=v,..." from a key's "fields" object into buf. */
static void fields_arg(const cJSON *key, char *buf, size_t cap)
{
    const cJSON *f;
    size_t used = 0;
    buf[0] = '\0';
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(key, "fields")) {
        int w = cJSON_IsBool(f)
                    ? snprintf(buf + used, cap - used, "%s%s=%s", used ? "," : "",
                               f->string, cJSON_IsTrue(f) ? "true" : "false")
                    : snprintf(buf + used, cap - used, "%s%s=%lld",
                               used ? "," : "", f->string,
                               (long long)f->valuedouble);
        cr_assert(w > 0 && (size_t)w < cap - used);
        used += (size_t)w;
    }
}

Test(client, cli_get)
{
    kw_client *c = conn();
    cJSON *doc = daemon_keys(c);
    const cJSON *key = cJSON_GetArrayItem(keys_of(doc), 2);
    char fields[1024], out[160];
    fields_arg(key, fields, sizeof fields);
    snprintf(out, sizeof out, "%s/k.cubin", tmpdir);
    result r = kwarm(ARGS("get", "--family", str(key, "family"), "--fields",
                          fields, "--arch", str(key, "arch"), "-o", out,
                          "--socket", sock));
    cr_expect_eq(r.status, 0, "compile on a miss: %s", r.err);
    cr_expect(strstr(r.out, "bytes") && strstr(r.out, "entry "), "%s", r.out);
    result_free(&r);
    kw_client_kernel k = {0};
    cr_assert_eq(kw_client_get(c, str(key, "digest"), false, &k), 0);
    unlink(out);
    r = kwarm(ARGS("get", "--digest", str(key, "digest"), "-o", out,
                   "--socket", sock));
    cr_expect_eq(r.status, 0, "%s", r.err);
    char want[512];
    snprintf(want, sizeof want, "%s: %zu bytes, %s %s, entry %s\n", out, k.len,
             k.family, k.arch, k.entry);
    cr_expect_str_eq(r.out, want);
    size_t len = 0;
    char *file = kw_test_read_file(out, &len);
    cr_assert_not_null(file);
    cr_expect(len == k.len && memcmp(file, k.cubin, len) == 0);
    free(file);
    result_free(&r);
    r = kwarm(ARGS("get", "--digest", NO_DIGEST, "-o", out, "--socket", sock));
    cr_expect_eq(r.status, 1, "not cached is a runtime failure");
    cr_expect_eq(lines(r.err), 1, "%s", r.err);
    result_free(&r);
    expect_bad_input("get bad digest", ARGS("get", "--digest", "12", "-o", out,
                                            "--socket", sock),
                     NEEDLES("--digest"));
    expect_bad_input("get no -o", ARGS("get", "--digest", NO_DIGEST, "--socket",
                                       sock), NEEDLES("-o"));
    expect_bad_input("get bad field", ARGS("get", "--family", str(key, "family"),
                                           "--fields", "nope=1", "--arch",
                                           "sm_90", "-o", out, "--socket", sock),
                     NEEDLES("nope"));
    kw_client_kernel_destroy(&k);
    cJSON_Delete(doc);
    kw_client_close(c);
    stop_daemon();
}

Test(client, cli_stats)
{
    result r = kwarm(ARGS("stats", "--socket", sock, "--json"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cJSON *st = cJSON_Parse(r.out);
    cr_assert_not_null(st, "%s", r.out);
    cr_expect_eq(num(st, "entries"), 0);
    num(st, "requests");
    cJSON_Delete(st);
    result_free(&r);
    r = kwarm(ARGS("stats", "--socket", sock));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, "entries") && strstr(r.out, "compiles_started") &&
              strstr(r.out, sock), "%s", r.out);
    result_free(&r);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.sock", tmpdir);
    r = kwarm(ARGS("stats", "--socket", missing));
    cr_expect_eq(r.status, 1);
    result_free(&r);
    stop_daemon();
}
