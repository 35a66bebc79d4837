/* test_cli_operator.c: what an operator meets in the first hour (issue
 * 24): settings that are not in force say so, messages name what is
 * wrong, and one exit-code rule holds for every command: 0 ok, 1 runtime
 * failure, 2 bad input (missing files and paths included).
 */
#include "cli_util.h"

TestSuite(cli_operator, .init = tmp_setup, .fini = tmp_teardown);

/* Expects exit `want` and needle on stderr. */
static void expect_exit(const char *label, const char *const *args, int want,
                        const char *needle)
{
    result r = kwarm(args);
    cr_expect_eq(r.status, want, "[%s] exit %d, want %d: %s", label, r.status,
                 want, r.err);
    cr_expect(needle == NULL || strstr(r.err, needle) != NULL,
              "[%s] stderr lacks \"%s\": %s", label, needle, r.err);
    result_free(&r);
}

/* A cache with nothing in it yet: a get that misses creates it. */
static const char *empty_cache(void)
{
    const char *c = tmp_at("cache");
    cr_assert_eq(mkdir(c, 0700), 0);
    result r = kwarm(ARGS("get", "--family", "dcp_stable_topk", "--fields",
                          "topk=1,num_candidates=1", "--arch", "sm_90",
                          "--cache", c, "-o", tmp_at("k"), "--no-compile"));
    cr_assert_eq(r.status, 1, "%s", r.err);
    result_free(&r);
    return c;
}

/* ---- one exit-code rule ---------------------------------------------------- */

/* Every command that reads a cache directory: a missing one, a file, a
 * directory with no cache and a file that is not LMDB are bad input. */
Test(cli_operator, every_cache_command_gives_2_for_a_path_that_is_no_cache)
{
    cr_assert_eq(mkdir(tmp_at("empty"), 0700), 0);
    cr_assert_eq(mkdir(tmp_at("junk"), 0700), 0);
    free(tmp_file("junk/data.mdb", "not lmdb, just bytes", 20));
    free(tmp_file("file", "x", 1));
    static const char *const cmds[] = {"stats", "ls", "pins", "evict",
                                       "unpin", "resize"};
    static const char *const paths[] = {"missing", "file", "empty", "junk"};
    static const char *const why[] = {"No such file", "not a directory",
                                      "no cache in", "not an LMDB file"};
    for (size_t c = 0; c < N(cmds); c++)
        for (size_t p = 0; p < N(paths); p++) {
            char dir[128];
            snprintf(dir, sizeof dir, "%s", tmp_at(paths[p]));
            const char *const *args =
                strcmp(cmds[c], "evict") == 0 ? ARGS(cmds[c], "--cache", dir, "--unpinned")
                : strcmp(cmds[c], "unpin") == 0 ? ARGS(cmds[c], "--cache", dir, "x")
                : strcmp(cmds[c], "resize") == 0 ? ARGS(cmds[c], "--cache", dir, "2G")
                                                 : ARGS(cmds[c], "--cache", dir);
            expect_bad_input(cmds[c], args, NEEDLES(why[p]));
        }
}

/* --help on every command: exit 0, help on stdout, nothing run. */
Test(cli_operator, every_command_help_exits_0_and_runs_nothing)
{
    static const char *const cmds[] = {"keys", "diff", "misses", "prewarm",
        "get", "stats", "ls", "evict", "pins", "unpin", "resize", "warmup",
        "ping", "verify"};
    for (size_t i = 0; i < N(cmds); i++) {
        result r = kwarm(ARGS(cmds[i], "--help"));
        cr_expect_eq(r.status, 0, "%s --help: exit %d", cmds[i], r.status);
        cr_expect(strncmp(r.out, "usage: kwarm ", 13) == 0, "%s: %s", cmds[i],
                  r.out);
        cr_expect_str_empty(r.err, "%s --help: %s", cmds[i], r.err);
        result_free(&r);
    }
    /* diff ran an empty diff after its help (and printed "A:"). */
    result r = kwarm(ARGS("diff", "--help"));
    cr_expect(strstr(r.out, "\nA: ") == NULL && strstr(r.out, "\nB: ") == NULL,
              "%s", r.out);
    result_free(&r);
}

/* ---- messages -------------------------------------------------------------- */

Test(cli_operator, get_o_empty_or_in_a_missing_directory_is_bad_input)
{
    const char *c = empty_cache();
    expect_bad_input("-o ''", ARGS("get", "--digest", "0123456789abcdef",
                     "--cache", c, "-o", ""), NEEDLES("-o", "empty path"));
    expect_bad_input("-o missing/x", ARGS("get", "--digest", "0123456789abcdef",
                     "--cache", c, "-o", tmp_at("nodir/k")),
                     NEEDLES("nodir/k", "directory does not exist"));
}

Test(cli_operator, stats_json_and_prometheus_conflict)
{
    expect_bad_input("stats", ARGS("stats", "--socket", tmp_at("s"), "--json",
                     "--prometheus"), NEEDLES("--json and --prometheus"));
    expect_bad_input("stats", ARGS("stats", "--socket", tmp_at("s"),
                     "--prometheus", "--json"), NEEDLES("--json and --prometheus"));
    expect_bad_input("stats", ARGS("stats", "--cache", tmp_at("c"), "--prometheus"),
                     NEEDLES("--prometheus: asks kwarmd", "give one"));
    expect_bad_input("stats", ARGS("stats", "--cache", tmp_at("c"), "--socket",
                     tmp_at("s")), NEEDLES("--socket: asks kwarmd", "give one"));
}

Test(cli_operator, a_socket_path_that_is_a_file_is_not_a_socket)
{
    free(tmp_file("plain", "x", 1));
    static const char *const cmds[] = {"ping", "stats", "ls", "pins"};
    for (size_t i = 0; i < N(cmds); i++)
        expect_bad_input(cmds[i], ARGS(cmds[i], "--socket", tmp_at("plain")),
                         NEEDLES("plain", "not a socket"));
}

Test(cli_operator, no_daemon_says_how_to_start_one)
{
    static const char *const cmds[] = {"ping", "stats", "ls", "pins"};
    for (size_t i = 0; i < N(cmds); i++)
        expect_exit(cmds[i], ARGS(cmds[i], "--socket", tmp_at("none.sock")), 1,
                    "is it running? Start one with kwarmd --socket");
}

Test(cli_operator, max_model_len_message_fits_whether_it_was_given)
{
    expect_bad_input("given", ARGS("keys", "--model", V32, "--dcp-world", "2",
                     "--max-model-len", "20000000"),
                     NEEDLES("--max-model-len", "give a --max-model-len of at "
                             "most 16777216"));
}

Test(cli_operator, ls_pinned_names_a_missing_pin_set)
{
    const char *c = empty_cache();
    expect_exit("ls --pinned", ARGS("ls", "--cache", c, "--pinned", "TYPO"), 1,
                "--pinned TYPO: no such pin set");
}

/* ---- settings that are not in force ---------------------------------------- */

Test(cli_operator, deploy_takes_the_deployment_keys_json_prints)
{
    result r = kwarm(ARGS("keys", "--model", V32, "--dcp-world", "2", "--arch",
                          "sm_90,sm_100", "--json"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *doc = cJSON_Parse(r.out);
    char *dep = cJSON_PrintUnformatted(cJSON_GetObjectItem(doc, "deployment"));
    char *path = tmp_file("dep.json", dep, strlen(dep));
    result r2 = kwarm(ARGS("keys", "--model", V32, "--deploy", path, "--json"));
    cr_expect_eq(r2.status, 0, "%s", r2.err);
    cr_expect_str_eq(r2.out, r.out, "--deploy of keys --json's deployment "
                     "derives other keys");
    result_free(&r2);
    free(path);
    free(dep);
    cJSON_Delete(doc);
    result_free(&r);
    /* An array that holds anything but arch names is still refused. */
    char *bad = tmp_file("bad.json", "{\"arch\": [\"sm_90\", 7]}", 22);
    expect_bad_input("arch [7]", ARGS("keys", "--model", V32, "--deploy", bad),
                     NEEDLES("/arch"));
    free(bad);
}

Test(cli_operator, prewarm_says_a_max_size_the_cache_does_not_take)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    const char *c = empty_cache(); /* stored limit: the default 1G */
    result r = kwarm(ARGS("prewarm", "--model", V32, "--cache", c,
                          "--max-size", "2G", "--quiet", "--jobs", "2"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, "--max-size 2147483648 not applied") != NULL &&
              strstr(r.err, "1073741824") != NULL, "%s", r.err);
    result_free(&r);
    /* The limit in force, given again: no warning. */
    r = kwarm(ARGS("prewarm", "--model", V32, "--cache", c, "--max-size", "1G",
                   "--quiet", "--jobs", "2"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, "--max-size") == NULL, "%s", r.err);
    result_free(&r);
}

Test(cli_operator, prewarm_says_the_fleet_tier_was_unreachable)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    char key[32];
    memset(key, 7, sizeof key);
    char *kf = tmp_file("fleet.key", key, sizeof key);
    cr_assert_eq(chmod(kf, 0600), 0);
    /* Port 1 on loopback: nothing listens, every call fails at once. */
    result r = kwarm(ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"),
                          "--remote", "redis://127.0.0.1:1", "--remote-key-file",
                          kf, "--quiet", "--jobs", "2"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, "--remote redis://127.0.0.1:1: unreachable") != NULL &&
              strstr(r.err, "compiled locally") != NULL, "%s", r.err);
    result_free(&r);
    free(kf);
}

/* ---- progress ---------------------------------------------------------------- */

Test(cli_operator, progress_lines_split_hits_and_compiles_with_the_time)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    result r = kwarm(ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"),
                          "--jobs", "2"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, "prewarm: 26/26 keys settled (0 hits, 26 compiled, "
                            "0 failed; ") != NULL, "%s", r.err);
    cr_expect(strstr(r.out, "26 compiled, 0 hits, 0 remote hits, 0 failed, 0 "
                            "cancelled in") != NULL, "%s", r.out);
    result_free(&r);
    r = kwarm(ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"), "--jobs", "2"));
    cr_expect(strstr(r.err, "prewarm: 26/26 keys settled (26 hits, 0 compiled, "
                            "0 failed; ") != NULL, "%s", r.err);
    result_free(&r);
}

/* ---- help and "did you mean" --------------------------------------------------- */

Test(cli_operator, help_cmd_prints_that_commands_help)
{
    static const char *const cmds[] = {"prewarm", "get", "stats", "warmup"};
    for (size_t i = 0; i < N(cmds); i++) {
        result a = kwarm(ARGS("help", cmds[i]));
        result b = kwarm(ARGS(cmds[i], "--help"));
        cr_expect_eq(a.status, 0, "help %s: %s", cmds[i], a.err);
        cr_expect_str_eq(a.out, b.out, "kwarm help %s differs from --help",
                         cmds[i]);
        result_free(&a);
        result_free(&b);
    }
    result r = kwarm(ARGS("help"));
    cr_expect(r.status == 0 && strstr(r.out, "Commands:") != NULL, "%s", r.out);
    result_free(&r);
    expect_bad_input("help typo", ARGS("help", "prewram"),
                     NEEDLES("'prewram'", "did you mean 'prewarm'"));
}

Test(cli_operator, a_mistyped_command_or_flag_gets_did_you_mean)
{
    expect_bad_input("prewram", ARGS("prewram"), NEEDLES("did you mean 'prewarm'"));
    expect_bad_input("stast", ARGS("stast"), NEEDLES("did you mean 'stats'"));
    expect_bad_input("far", ARGS("zzzzzzzz"), NEEDLES("unknown command"));
    result r = kwarm(ARGS("zzzzzzzz"));
    cr_expect(strstr(r.err, "did you mean") == NULL, "%s", r.err);
    result_free(&r);
    expect_bad_input("--cahce", ARGS("prewarm", "--model", V32, "--cahce", "x"),
                     NEEDLES("--cahce: unknown argument", "did you mean --cache?"));
    expect_bad_input("--dcp-wrld", ARGS("keys", "--dcp-wrld", "2"),
                     NEEDLES("did you mean --dcp-world?"));
    expect_bad_input("--pined", ARGS("ls", "--pined", "x"),
                     NEEDLES("did you mean --pinned?"));
    expect_bad_input("--sockt", ARGS("ping", "--sockt", "x"),
                     NEEDLES("did you mean --socket?"));
    expect_bad_input("--bogus", ARGS("keys", "--bogus"),
                     NEEDLES("--bogus: unknown argument (see kwarm keys --help)"));
}

/* ---- --model - and --compile-memory ------------------------------------------ */

/* Runs `kwarm ARGS... < file` through /bin/sh; stdout in *out. */
static int kwarm_stdin(const char *file, const char *args, char **out,
                       char **err)
{
    char script[512];
    snprintf(script, sizeof script, "exec \"$0\" %s < \"$1\"", args);
    const char *argv[] = {"/bin/sh", "-c", script, KW_KWARM_BIN, file, NULL};
    return kw_test_run(argv, out, err);
}

Test(cli_operator, model_dash_reads_the_config_from_stdin)
{
    char *out = NULL, *err = NULL;
    cr_expect_eq(kwarm_stdin(V32, "keys --model - --json", &out, &err), 0, "%s",
                 err);
    cJSON *a = cJSON_Parse(out);
    free(out);
    free(err);
    result r = kwarm(ARGS("keys", "--model", V32, "--json"));
    cJSON *b = cJSON_Parse(r.out);
    cr_assert(a && b, "not JSON");
    cr_expect(cJSON_Compare(cJSON_GetObjectItem(a, "keys"),
                            cJSON_GetObjectItem(b, "keys"), true),
              "--model - derives other keys than --model FILE");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(a, "model")),
                     "<stdin>");
    cJSON_Delete(a);
    cJSON_Delete(b);
    result_free(&r);
    /* Empty input is a config that is not there; two reads of one stdin
     * are refused. */
    cr_expect_eq(kwarm_stdin("/dev/null", "keys --model -", &out, &err), 2);
    cr_expect(strstr(err, "<stdin>") != NULL, "%s", err);
    free(out);
    free(err);
    cr_expect_eq(kwarm_stdin(V32, "diff --model - --against -", &out, &err), 2);
    cr_expect(strstr(err, "standard input holds one config") != NULL, "%s", err);
    free(out);
    free(err);
}

Test(cli_operator, prewarm_takes_compile_memory_as_kwarmd_does)
{
    expect_bad_input("63M", ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"),
                     "--compile-memory", "63M"),
                     NEEDLES("--compile-memory", "at least 64M"));
    /* 64M of address space: NVRTC cannot even start, so every key fails
     * with the reason; the limit reached the workers. */
    result r = kwarm(ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"),
                          "--compile-memory", "64M", "--jobs", "1", "--quiet"));
    cr_expect_eq(r.status, 1, "%s", r.err);
    cr_expect(strstr(r.out, "26 failed") != NULL, "%s", r.out);
    result_free(&r);
}

/* The exit-code rule over every command `kwarm --help` lists: an unknown
 * flag and a missing --model file are bad input (2), one line each. */
Test(cli_operator, every_command_gives_2_for_an_unknown_flag_or_a_missing_file)
{
    setenv("KWARM_SOCKET", "/nonexistent/kwarm-operator.sock", 1);
    result h = kwarm(ARGS("--help"));
    const char *p = strstr(h.out, "Commands:\n");
    cr_assert_not_null(p);
    size_t n = 0;
    for (p += 10; strncmp(p, "  ", 2) == 0; p = strchr(p, '\n') + 1) {
        char cmd[32];
        snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(p + 2, " "), p + 2);
        expect_bad_input(cmd, ARGS(cmd, "--no-such-flag"),
                         NEEDLES("--no-such-flag: unknown argument"));
        n++;
    }
    cr_expect_geq(n, 14, "only %zu commands", n);
    result_free(&h);
    const char *missing = "/nonexistent/config.json";
    const char *const *cases[] = {
        ARGS("keys", "--model", missing),
        ARGS("diff", "--model", missing, "--against", V32),
        ARGS("diff", "--model", V32, "--against", missing),
        ARGS("prewarm", "--model", missing, "--cache", tmp_at("c")),
        ARGS("warmup", "--model", missing),
        ARGS("verify", "--model", missing),
        ARGS("keys", "--model", V32, "--deploy", missing)};
    for (size_t i = 0; i < N(cases); i++)
        expect_bad_input(cases[i][0], cases[i], NEEDLES("/nonexistent/config.json"));
}

/* On a terminal (script(1) gives it one) the bar carries the same split
 * and the time. */
Test(cli_operator, the_progress_bar_on_a_terminal_splits_and_times_too)
{
    if (access("/usr/bin/script", X_OK) != 0)
        cr_skip_test("no script(1) to give kwarm a terminal");
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s prewarm --model %s --cache %s --jobs 2 "
             "--json", KW_KWARM_BIN, V32, tmp_at("c"));
    const char *argv[] = {"/usr/bin/script", "-q", "-e", "-c", cmd,
                          "/dev/null", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "] 26/26  0 hits, 26 compiled, 0 failed; ") != NULL,
              "%s", out);
    free(out);
    free(err);
}
