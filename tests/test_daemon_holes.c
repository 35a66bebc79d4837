/* test_daemon_holes.c: the smaller holes of issue 23, one test each:
 * client text escaped in the log, SIGHUP logged and ignored, the miss
 * audit's records written before they count as written, flushes that
 * never overlap, kw_client_admin
 * with a NULL header, and --config through the strict reader. */
#include "daemon_util.h"

#include "kw_client.h"

#include <poll.h>
#include <sys/stat.h>

TestSuite(holes, .fini = kwd_cleanup, .timeout = 120);

#define V32 "deepseek-v3.2-exp.json"

/* A warmup whose text config sits under a member named with a newline and
 * a forged journald priority: the log line names it escaped. */
Test(holes, control_bytes_of_client_text_are_escaped_in_the_log)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-esc", 1, NULL, &c);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddItemToObject(cfg, "x\n<0>forged", kwd_fixture(V32));
    cJSON *h = cJSON_CreateObject();
    cJSON_AddItemToObject(h, "config", cfg);
    cJSON_AddStringToObject(h, "text_config", "/x\n<0>forged");
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, h, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "a warmup of the nested config");
    kwr_free(&r);
    cJSON_Delete(h);
    kwd_down(&d, &c);
    char *log = kwd_log(d.log);
    cr_expect(strstr(log, "\n<0>") == NULL, "a forged log line:\n%s", log);
    cr_expect(strstr(log, "x\\n<0>forged") != NULL, "not escaped:\n%s", log);
    free(log);
}

/* SIGHUP: a log line, and kwarmd goes on serving (closing the terminal of
 * a `kwarmd &` sent it, and killed it with a stale socket). */
Test(holes, sighup_is_logged_and_ignored)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-hup", 1, NULL, &c);
    cr_assert_eq(kill(d.pid, SIGHUP), 0);
    int64_t deadline = kwd_now_ms() + 5000;
    for (;;) { /* polls the log for the line, within a deadline */
        char *log = kwd_log(d.log);
        bool seen = strstr(log, "SIGHUP") != NULL;
        free(log);
        if (seen)
            break;
        cr_assert(kwd_now_ms() < deadline, "no log line for SIGHUP");
        kwd_nap_ms(10);
    }
    kwc_expect_pong(&c, "after SIGHUP");
    kwd_down(&d, &c);
}

/* The miss audit's file cannot be written for a while (a directory stands
 * at its path): the records are not marked written, and once the path is
 * free a later flush writes them. */
Test(holes, audit_records_count_as_written_only_once_they_are)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-audit", 1, NULL, &c);
    char path[300];
    snprintf(path, sizeof path, "%s/misses.jsonl", d.cache);
    unlink(path);
    cr_assert_eq(mkdir(path, 0700), 0, "mkdir %s", path);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", "0123456789abcdef0123456789abcdef"
                                         "0123456789abcdef0123456789abcdef");
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "a miss");
    kwr_free(&r);
    cJSON_Delete(g);
    int64_t deadline = kwd_now_ms() + 10000;
    for (;;) { /* a flush (every 2 s) tried and failed */
        char *log = kwd_log(d.log);
        bool failed = strstr(log, "miss audit: cannot write") != NULL;
        free(log);
        if (failed)
            break;
        cr_assert(kwd_now_ms() < deadline, "no flush failed");
        kwd_nap_ms(50);
    }
    cr_assert_eq(rmdir(path), 0);
    for (;;) { /* the next flush writes the record */
        char *text = kw_test_read_file(path, NULL);
        bool there = text != NULL && strstr(text, "0123456789abcdef") != NULL;
        free(text);
        if (there)
            break;
        cr_assert(kwd_now_ms() < deadline + 10000, "the record was lost");
        kwd_nap_ms(50);
    }
    kwd_down(&d, &c);
}

/* The next event of kwarmd's flush test hook, within ms. */
static char flush_event(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, ms), 1, "no flush event within %d ms", ms);
    char ev = 0;
    cr_assert_eq(read(fd, &ev, 1), 1);
    return ev;
}

/* A flush held by the test hook (KWARMD_TEST_FLUSH_FIFOS): the timer's
 * ticks meanwhile start no second flush ('K': skipped, never 'S'), the
 * loop serves on, and once the flush is let go the next tick starts
 * one again. */
Test(holes, a_flush_that_runs_long_is_never_joined_by_a_second)
{
    char dir[128], ev_path[160], hold_path[160];
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "kwh-flush"), 0);
    snprintf(ev_path, sizeof ev_path, "%s/events", dir);
    snprintf(hold_path, sizeof hold_path, "%s/hold", dir);
    cr_assert_eq(mkfifo(ev_path, 0600), 0);
    cr_assert_eq(mkfifo(hold_path, 0600), 0);
    int ev = open(ev_path, O_RDWR | O_CLOEXEC), hold = open(hold_path, O_RDWR | O_CLOEXEC);
    cr_assert(ev >= 0 && hold >= 0);
    cr_assert_eq(setenv("KWARMD_TEST_FLUSH_FIFOS", dir, 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-flush-d", 1, NULL, &c);
    cr_assert_eq(unsetenv("KWARMD_TEST_FLUSH_FIFOS"), 0);
    cr_assert_eq(flush_event(ev, 10000), 'S', "the first tick starts a flush");
    for (int tick = 0; tick < 2; tick++) /* held: the next ticks skip */
        cr_assert_eq(flush_event(ev, 10000), 'K',
                     "tick %d started a flush beside the one held", tick + 2);
    kwc_expect_pong(&c, "while a flush is held");
    cr_assert_eq(write(hold, "x", 1), 1); /* let the held flush go */
    char e;
    while ((e = flush_event(ev, 10000)) == 'K') /* a tick before it ended */
        ;
    cr_expect_eq(e, 'S', "a tick after it ended starts the next");
    char many[64];
    memset(many, 'x', sizeof many); /* every later flush, the stop's too */
    cr_assert_eq(write(hold, many, sizeof many), (ssize_t)sizeof many);
    kwd_down(&d, &c);
    close(ev);
    close(hold);
    unlink(ev_path);
    unlink(hold_path);
    rmdir(dir);
}

/* libkwarm's admin call with no header: KW_EINVAL, no crash; evict's
 * streamed-or-not is read from the parsed request, not from the text. */
Test(holes, client_admin_with_a_null_header_is_einval)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-admin", 1, NULL, &c);
    kw_client *k = NULL;
    char err[256];
    cr_assert_eq(kw_client_connect(&k, d.sock, 5000, err, sizeof err), 0, "%s", err);
    char *reply = NULL;
    cr_expect_eq(kw_client_admin(k, "evict", NULL, &reply), KW_EINVAL);
    cr_expect_null(reply);
    /* "match" as a string value, not a member: not a streamed evict */
    cr_expect_lt(kw_client_admin(k, "evict", "{\"digest\":\"\\\"match\\\"\"}",
                                 &reply), 0);
    free(reply);
    reply = NULL;
    cr_expect_eq(kw_client_admin(k, "ls", "{}", &reply), 0);
    cr_expect_not_null(reply);
    free(reply);
    kw_client_close(k);
    kwd_down(&d, &c);
}

/* kwarmd --config FILE: exit 2 and one line naming the file, the line
 * and the option (or the reader's line and column). */
static void bad_config(const char *tag, const char *text, size_t len,
                       const char *want)
{
    kwd d;
    kwd_init(&d, tag);
    char path[300];
    cr_assert_eq(kw_test_write_file(d.dir, "c.json", text, len, path, sizeof path), 0);
    const char *argv[] = {KW_KWARMD_BIN, "--config", path, "--socket", d.sock,
                          "--cache", d.cache, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_expect_eq(st, 2, "[%s] exit %d: %s", tag, st, err);
    cr_expect(strstr(err, path) != NULL, "[%s] the file is not named: %s", tag, err);
    cr_expect(strstr(err, want) != NULL, "[%s] want \"%s\": %s", tag, want, err);
    free(out);
    free(err);
    kwd_forget(&d);
}

/* A get naming an arch NVRTC cannot build, or fields no kernel takes, is
 * refused with one ERROR naming the member, and nothing is compiled. */
static void bad_get(kwc *c, const char *arch, int topk, const char *want)
{
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "family", "indexer_topk");
    cJSON *f = cJSON_AddObjectToObject(g, "fields");
    cJSON_AddNumberToObject(f, "topk", topk);
    cJSON_AddBoolToObject(f, "windowed", 0);
    cJSON_AddStringToObject(g, "arch", arch);
    kwr r = kwc_call(c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, want);
    const char *msg = kwr_str(&r, "error");
    cr_expect(strstr(msg, want) != NULL, "want \"%s\": %s", want, msg);
    kwr_free(&r);
    cJSON_Delete(g);
}

Test(holes, a_get_kwarmd_cannot_compile_is_refused_before_any_compile)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwh-badget", 1, NULL, &c);
    bad_get(&c, "sm_35", 2048, "/arch: sm_35");
    bad_get(&c, "sm_90", -1, "/fields: no indexer_topk kernel");
    bad_get(&c, "sm_90", 0, "/fields: no indexer_topk kernel");
    cr_expect_eq(kwc_stat(&c, "compiles_started"), 0);
    kwc_expect_pong(&c, "after three refused gets");
    kwd_down(&d, &c);
}

/* The other side: each JSON type where its member takes it. */
Test(holes, a_config_of_the_right_types_starts_kwarmd)
{
    static const char ok[] =
        "{\"jobs\": 2, \"max-size\": \"64M\", \"max-output\": 1048576,\n"
        " \"read-only\": false, \"log-level\": \"info\", "
        "\"socket-mode\": \"0600\"}\n";
    kwd d;
    kwc c;
    kwd_init(&d, "kwh-ok");
    char path[300];
    cr_assert_eq(kw_test_write_file(d.dir, "c.json", ok, sizeof ok - 1, path,
                                    sizeof path), 0);
    const char *extra[] = {"--config", path, NULL};
    kwd_start(&d, 1, extra);
    kwc_must_open(&c, d.sock);
    kwc_expect_pong(&c, "kwarmd started from a typed --config");
    kwd_down(&d, &c);
}

Test(holes, config_goes_through_the_strict_reader)
{
    static const char dup[] = "{\n  \"jobs\": 2,\n  \"jobs\": 3\n}\n";
    bad_config("kwh-dup", dup, sizeof dup - 1, "jobs");
    static const char bom[] = "\xef\xbb\xbf{\"jobs\": 2}";
    bad_config("kwh-bom", bom, sizeof bom - 1, "line 1");
    static const char badv[] = "{\n  \"loops\": 2,\n  \"jobs\": \"many\"\n}\n";
    bad_config("kwh-val", badv, sizeof badv - 1, ":3: /jobs: must be");
    /* Each member has its JSON type: no number in a string, no boolean
     * in a string, no mode as a (decimal) number. */
    static const char snum[] = "{\n  \"jobs\": \"4\"\n}\n";
    bad_config("kwh-snum", snum, sizeof snum - 1, ":2: /jobs: must be an integer");
    static const char sbool[] = "{\"read-only\": \"true\"}";
    bad_config("kwh-sbool", sbool, sizeof sbool - 1, "/read-only: must be true or false");
    static const char nmode[] = "{\"socket-mode\": 660}";
    bad_config("kwh-nmode", nmode, sizeof nmode - 1, "/socket-mode: must be");
    static const char unk[] = "{\n\n  \"frobnicate\": 1\n}\n";
    bad_config("kwh-unk", unk, sizeof unk - 1, ":3: /frobnicate: unknown option");
    size_t big = (1u << 20) + 10;
    char *text = malloc(big);
    cr_assert_not_null(text);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    bad_config("kwh-big", text, big, "larger than");
    free(text);
}
