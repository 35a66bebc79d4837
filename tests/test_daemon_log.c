/* test_daemon_log.c: what kwarmd says, and how (issue 13 points 3 and 5):
 * RFC 3339 lines off journald and priority prefixes under it,
 * --log-level, a line per warmup and per refused client, and the
 * --version of both programs. */
#include "daemon_util.h"

#include <fcntl.h>
#include <regex.h>
#include <sys/stat.h>

/* Each test's daemons are killed and their directories removed. */
TestSuite(daemon_log, .fini = kwd_cleanup);

#define V32 "deepseek-v3.2-exp.json"

static bool matches(const char *text, const char *pattern)
{
    regex_t re;
    cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NEWLINE), 0);
    bool m = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return m;
}

static void instant(void)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
}

Test(daemon_log, lines_carry_an_rfc3339_time_and_a_level_off_journald)
{
    instant();
    cr_assert_eq(unsetenv("JOURNAL_STREAM"), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwl-time", 1, NULL, &c);
    cJSON *h0 = kwd_model_hdr(V32, 0);
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, h0, NULL);
    cJSON_Delete(h0);
    kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
    double n = kwr_num(&r, "keys");
    kwr_free(&r);
    kwd_down(&d, &c);
    char *log = kwd_log(d.log);
    cr_expect(matches(log, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                           "\\.[0-9]{3}Z kwarmd\\[[0-9]+\\] info: listening on "),
              "%s", log);
    char want[256];
    snprintf(want, sizeof want, "info: warmup from uid 0 pid [0-9]+: text config "
             "\"/\": %.0f keys: 0 hits, 0 remote hits, %.0f compiled, 0 failed, "
             "0 cancelled in [0-9.]+ s", n, n);
    cr_expect(matches(log, want), "no warmup line like %s in:\n%s", want, log);
    cr_expect(!matches(log, "^<[0-9]>"), "journald prefixes off journald: %s", log);
    free(log);
}

/* A JOURNAL_STREAM naming the file kwarmd's stderr is (as systemd names
 * its stream): journald's format. */
static void journal_is_the_log(const kwd *d)
{
    int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st;
    cr_assert(fd >= 0 && fstat(fd, &st) == 0, "%s", d->log);
    close(fd);
    char js[64];
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    cr_assert_eq(setenv("JOURNAL_STREAM", js, 1), 0);
}

/* An inherited JOURNAL_STREAM naming another stream than stderr (a
 * kwarmd started from a shell of a unit, its stderr redirected) keeps
 * the terminal's format. */
Test(daemon_log, a_journal_stream_that_is_not_stderr_is_ignored)
{
    cr_assert_eq(setenv("JOURNAL_STREAM", "8:12345", 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwl-nojournal", 1, NULL, &c);
    kwd_down(&d, &c);
    cr_assert_eq(unsetenv("JOURNAL_STREAM"), 0);
    char *log = kwd_log(d.log);
    cr_expect(!matches(log, "^<[0-9]>"), "prefixed: %s", log);
    cr_expect(matches(log, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T.* kwarmd\\[[0-9]+\\] info: "
                           "listening on "), "%s", log);
    free(log);
}

Test(daemon_log, under_journald_lines_start_with_their_priority)
{
    kwd d;
    kwc c;
    kwd_init(&d, "kwl-journal");
    journal_is_the_log(&d);
    kwd_start(&d, 1, (const char *const[]){"--deny-root", NULL});
    kwc_must_open(&c, d.sock);
    cr_assert_eq(kwc_send(&c, KW_PROTO_PING, NULL), 0);
    kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_ERROR, "root refused");
    kwr_free(&r);
    kwd_down(&d, &c);
    char *log = kwd_log(d.log);
    cr_expect(matches(log, "^<6>listening on "), "%s", log);
    cr_expect(matches(log, "^<4>refused a client: uid 0 gid 0 not allowed"),
              "one line per refused client: %s", log);
    cr_expect(!matches(log, "^[0-9]{4}-"), "timestamps under journald: %s", log);
    free(log);
}

Test(daemon_log, log_level_drops_the_lines_below_it)
{
    cr_assert_eq(unsetenv("JOURNAL_STREAM"), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwl-level", 1, (const char *const[]){"--log-level", "warn", NULL},
           &c);
    kwc_expect_pong(&c, "quiet kwarmd");
    kwd_down(&d, &c);
    char *log = kwd_log(d.log);
    cr_expect(strstr(log, " info: ") == NULL, "info lines at warn: %s", log);
    free(log);
    kwd_init(&d, "kwl-badlevel");
    const char *args[] = {"--socket", d.sock, "--cache", d.cache, "--log-level",
                          "loud", NULL};
    pid_t pid = kwd_spawn(&d, args, d.log);
    int st = 0;
    cr_assert(kwd_wait_exit(pid, 10000, &st));
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status 0x%x", st);
    log = kwd_log(d.log);
    cr_expect(strstr(log, "--log-level") != NULL, "%s", log);
    free(log);
}

Test(daemon_log, version_names_everything_that_enters_a_digest)
{
    const char *bins[] = {KW_KWARM_BIN, KW_KWARMD_BIN};
    char *outs[2];
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {bins[i], "--version", NULL};
        char *err = NULL;
        cr_assert_eq(kw_test_run(argv, &outs[i], &err), 0, "%s", err);
        free(err);
        cr_expect(matches(outs[i], "^kwarmd? [0-9]+\\.[0-9]+\\.[0-9]+$") &&
                  matches(outs[i], "^key schema [0-9]+$") &&
                  matches(outs[i], "^NVRTC [0-9]+\\.[0-9]+$") &&
                  matches(outs[i], "^kernel sources [0-9a-f]{16}$") &&
                  matches(outs[i], "^protocol 2$"), "%s", outs[i]);
    }
    /* The two programs agree on all but their names. */
    cr_expect_str_eq(strchr(outs[0], '\n'), strchr(outs[1], '\n'));
    free(outs[0]);
    free(outs[1]);
}
