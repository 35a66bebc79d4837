/* test_daemon_flags.c: kwarmd's option table (issue 24 points 4 and 6):
 * every bound checked on both sides with the bound in the message, flags
 * spelled out (no getopt abbreviations), "did you mean", files named by a
 * flag that are missing are bad input (2), start-up errors that name
 * kwarmd once, and the --max-size warning on an existing cache (daemon.c). */
#include "daemon_util.h"

TestSuite(daemon_flags, .fini = kwd_cleanup);

/* Runs kwarmd with args (after argv[0]); returns the exit status, *err
 * its stderr (free it). */
static int run_kwarmd(const char *const *args, char **err)
{
    const char *argv[16] = {KW_KWARMD_BIN};
    size_t n = 1;
    for (; args[n - 1] != NULL; n++) {
        cr_assert(n < 15);
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    char *out = NULL;
    int st = kw_test_run(argv, &out, err);
    free(out);
    return st;
}

/* Each numeric flag at its bounds and one past them.  Accepted values get
 * as far as the socket, which cannot be made (exit 1); refused ones exit 2
 * with the flag and the allowed range, worded from the table. */
Test(daemon_flags, every_bound_is_checked_on_both_sides_and_named)
{
    static const struct {
        const char *flag, *value, *range; /* range NULL: accepted */
    } cases[] = {
        {"--jobs", "1", NULL},
        {"--jobs", "0", "[1, 256]"},
        {"--jobs", "256", NULL},
        {"--jobs", "257", "[1, 256]"},
        {"--loops", "64", NULL},
        {"--loops", "65", "[1, 64]"},
        {"--compile-timeout", "86400", NULL},
        {"--compile-timeout", "86401", "seconds in [1, 86400]"},
        {"--compile-memory", "64M", NULL},
        {"--compile-memory", "67108863", "at least 64M"},
        {"--max-output", "64K", NULL},
        {"--max-output", "65535", "[64K, 16G]"},
        {"--max-output", "16G", NULL},
        {"--max-output", "17179869185", "[64K, 16G]"},
        {"--max-size", "1M", NULL},
        {"--max-size", "1048575", "at least 1M"},
        {"--max-connections", "1000000", NULL},
        {"--max-connections", "1000001", "[1, 1000000]"},
        {"--max-keys-in-flight", "4294967296", NULL},
        {"--max-keys-in-flight", "4294967297", "[1, 4294967296]"},
        {"--idle-timeout", "100", NULL},
        {"--idle-timeout", "99", "milliseconds in [100, 86400000]"},
        {"--remote-timeout", "60000", NULL},
        {"--remote-timeout", "60001", "milliseconds in [10, 60000]"},
        {"--remote-lease", "100", NULL},
        {"--remote-lease", "99", "milliseconds in [100, 3600000]"},
        {"--held-read-timeout", "9", "milliseconds in [10, 3600000]"},
    };
    kwd d;
    kwd_init(&d, "kwfl-bounds");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *err = NULL;
        int st = run_kwarmd((const char *const[]){cases[i].flag, cases[i].value,
                                                  "--socket", "/nonexistent-dir/s.sock",
                                                  "--cache", d.cache, NULL},
                            &err);
        cr_expect_eq(st, cases[i].range ? 2 : 1, "%s %s: exit %d: %s",
                     cases[i].flag, cases[i].value, st, err);
        if (cases[i].range)
            cr_expect(strstr(err, cases[i].flag) && strstr(err, cases[i].range),
                      "%s %s: want the flag and \"%s\": %s", cases[i].flag,
                      cases[i].value, cases[i].range, err);
        free(err);
    }
}

/* getopt_long would take "--jo" for --jobs: kwarmd wants flags spelled
 * out, names the nearest for a typo, and takes --flag=VALUE. */
Test(daemon_flags, flags_are_spelled_out_and_typos_get_a_suggestion)
{
    char *err = NULL;
    int st = run_kwarmd((const char *const[]){"--jo", "2", NULL}, &err);
    cr_expect(st == 2 && strstr(err, "--jo: unknown argument"), "exit %d: %s", st, err);
    free(err);
    st = run_kwarmd((const char *const[]){"--jbos", "2", NULL}, &err);
    cr_expect(st == 2 && strstr(err, "did you mean --jobs?"), "exit %d: %s", st, err);
    free(err);
    st = run_kwarmd((const char *const[]){"--jobs=0", NULL}, &err);
    cr_expect(st == 2 && strstr(err, "--jobs: '0' is not an integer in [1, 256]"),
              "exit %d: %s", st, err);
    free(err);
    st = run_kwarmd((const char *const[]){"--read-only=yes", NULL}, &err);
    cr_expect(st == 2 && strstr(err, "--read-only=yes: takes no value"),
              "exit %d: %s", st, err);
    free(err);
    st = run_kwarmd((const char *const[]){"--jobs", NULL}, &err);
    cr_expect(st == 2 && strstr(err, "--jobs: missing value"), "exit %d: %s", st, err);
    free(err);
    st = run_kwarmd((const char *const[]){"serve", NULL}, &err);
    cr_expect(st == 2 && strstr(err, "serve: unknown argument"), "exit %d: %s", st, err);
    free(err);
}

/* Every flag of --help is one kwarmd takes: none answers "unknown
 * argument" (--help is printed from the parser's own table). */
Test(daemon_flags, every_flag_of_help_is_taken)
{
    const char *argv[] = {KW_KWARMD_BIN, "--help", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    free(err);
    size_t n = 0;
    for (const char *p = out; (p = strstr(p, "\n  --")) != NULL; p += 3) {
        char flag[64];
        snprintf(flag, sizeof flag, "%.*s", (int)strcspn(p + 3, " \n"), p + 3);
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "--version") == 0)
            continue;
        char *e = NULL;
        run_kwarmd((const char *const[]){flag, NULL}, &e);
        cr_expect(strstr(e, "unknown argument") == NULL, "%s: %s", flag, e);
        free(e);
        n++;
    }
    cr_expect_geq(n, 25, "only %zu flags in kwarmd --help:\n%s", n, out);
    free(out);
}

/* A missing --remote-key-file is bad input like a missing --config. */
Test(daemon_flags, missing_files_exit_2_and_are_named)
{
    kwd d;
    kwd_init(&d, "kwfl-files");
    char missing[300], *err = NULL;
    snprintf(missing, sizeof missing, "%s/no-such-file", d.dir);
    int st = run_kwarmd((const char *const[]){"--remote", "redis://127.0.0.1:1",
                                              "--remote-key-file", missing,
                                              "--socket", d.sock, "--cache",
                                              d.cache, NULL},
                        &err);
    cr_expect(st == 2 && strstr(err, missing), "--remote-key-file: exit %d: %s", st, err);
    free(err);
    st = run_kwarmd((const char *const[]){"--config", missing, "--socket", d.sock,
                                          NULL},
                    &err);
    cr_expect(st == 2 && strstr(err, missing), "--config: exit %d: %s", st, err);
    free(err);
    cr_expect_neq(access(d.sock, F_OK), 0, "a refused kwarmd made its socket");
}

/* "kwarmd[PID] error: kwarmd: ..." named it twice. */
Test(daemon_flags, a_start_up_error_names_kwarmd_once)
{
    kwd d;
    kwd_init(&d, "kwfl-once");
    char *err = NULL;
    int st = run_kwarmd((const char *const[]){"--socket", "/nonexistent-dir/s.sock",
                                              "--cache", d.cache, NULL},
                        &err);
    cr_expect_eq(st, 1, "exit %d: %s", st, err);
    const char *line = strstr(err, "error: ");
    cr_assert_not_null(line, "%s", err);
    size_t n = 0;
    for (const char *p = err; (p = strstr(p, "kwarmd")) != NULL; p++)
        n++;
    cr_expect_eq(n, 1, "\"kwarmd\" %zu times: %s", n, err);
    cr_expect(strstr(line, "--socket") != NULL, "%s", err);
    free(err);
}

/* Occurrences of needle in d's log so far. */
static size_t log_count(const kwd *d, const char *needle)
{
    char *log = kwd_log(d->log);
    size_t n = 0;
    for (const char *p = log; (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(log);
    return n;
}

/* The stored limit of an existing cache wins; kwarmd says so, naming
 * both, whenever --max-size differs from it, and only then. */
Test(daemon_flags, max_size_on_an_existing_cache_of_another_limit_warns)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwfl-maxsize", 1, (const char *const[]){"--max-size", "64M", NULL},
           &c);
    cr_expect_eq(kwc_stat(&c, "max_size"), 64 << 20);
    kwd_down(&d, &c);
    cr_expect_eq(log_count(&d, "not applied"), 0, "a new cache takes --max-size");
    kwd_start(&d, 1, (const char *const[]){"--max-size", "128M", NULL});
    kwc_must_open(&c, d.sock);
    cr_expect_eq(kwc_stat(&c, "max_size"), 64 << 20, "the stored limit is in force");
    kwd_down(&d, &c);
    cr_expect_eq(log_count(&d, "--max-size 134217728 not applied"), 1);
    cr_expect_eq(log_count(&d, "limit of 67108864 bytes"), 1);
    char named[400];
    snprintf(named, sizeof named, "not applied: cache %s already", d.cache);
    cr_expect_eq(log_count(&d, named), 1, "the warning names the cache");
    kwd_start(&d, 1, (const char *const[]){"--max-size", "64M", NULL});
    kwc_must_open(&c, d.sock);
    kwd_down(&d, &c);
    kwd_start(&d, 1, NULL);
    kwc_must_open(&c, d.sock);
    kwd_down(&d, &c);
    cr_expect_eq(log_count(&d, "not applied"), 1,
                 "warned with the same limit, or with none given");
}
