/* test_cli_ro_daemon.c: what kwarm prints against a read-only kwarmd
 * (issue 24): a refused resize or evict ends with the reason, never with
 * "kwarmd: " and nothing after it, and a warmup's misses are "not
 * cached", not "keys failed to compile".
 */
#include "daemon_util.h"

TestSuite(cli_ro_daemon, .fini = kwd_cleanup);

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"

/* Runs kwarm args; returns its exit status, stderr in *err (free it). */
static int run(const char *const *args, char **err)
{
    char *out = NULL;
    int st = kw_test_kwarm(args, &out, err);
    free(out);
    return st;
}

/* A kwarmd --read-only on a cache of one key (made by a get that
 * compiled it, instantly: KWARM_TEST_INSTANT_COMPILE). */
static void ro_daemon(kwd *d)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd_init(d, "kwro-cli");
    char k[300];
    snprintf(k, sizeof k, "%s/k", d->dir);
    cr_assert_eq(mkdir(d->cache, 0700), 0);
    const char *pw[] = {"prewarm", "--model", V32, "--dcp-world", "2",
                        "--cache", d->cache, "--quiet", "--jobs", "1", NULL};
    char *err = NULL;
    cr_assert_eq(run(pw, &err), 0, "%s", err);
    free(err);
    kwd_start(d, 1, (const char *const[]){"--read-only", NULL});
}

Test(cli_ro_daemon, refused_writes_end_with_the_reason)
{
    kwd d;
    ro_daemon(&d);
    const char *const *cmds[] = {
        (const char *const[]){"resize", "--socket", d.sock, "2G", NULL},
        (const char *const[]){"evict", "--socket", d.sock, "--unpinned", NULL}};
    for (size_t i = 0; i < 2; i++) {
        char *err = NULL;
        int st = run(cmds[i], &err);
        cr_expect_eq(st, 1, "%s: %s", cmds[i][0], err);
        size_t n = strlen(err);
        cr_expect(n > 2 && strcmp(err + n - 2, ":\n") != 0 &&
                  strcmp(err + n - 3, ": \n") != 0,
                  "%s ends with a colon: %s", cmds[i][0], err);
        cr_expect(strstr(err, "read-only") != NULL, "%s: %s", cmds[i][0], err);
        /* kwarmd's reply carries the cache's own reason */
        cr_expect(strstr(err, d.cache) != NULL, "%s: %s", cmds[i][0], err);
        free(err);
    }
    kwd_stop(&d);
}

Test(cli_ro_daemon, a_warmup_of_misses_is_not_a_compile_failure)
{
    kwd d;
    ro_daemon(&d);
    const char *w[] = {"warmup", "--model", V32, "--socket", d.sock, "--quiet",
                       NULL};
    char *err = NULL;
    cr_expect_eq(run(w, &err), 1, "%s", err);
    cr_expect(strstr(err, "failed to compile") == NULL &&
              strstr(err, " failed: ") == NULL, "%s", err);
    cr_expect(strstr(err, " keys not cached: kwarmd's cache is read-only") !=
              NULL, "%s", err);
    free(err);
    kwd_stop(&d);
}

/* The README says stats --socket shows read_only: it printed only the
 * numbers (issue 24). */
Test(cli_ro_daemon, stats_through_kwarmd_says_read_only)
{
    kwd d;
    ro_daemon(&d);
    const char *st[] = {"stats", "--socket", d.sock, NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_kwarm(st, &out, &err), 0, "%s", err);
    const char *p = strstr(out, "  read_only ");
    cr_expect(p != NULL && strncmp(p + 12 + strspn(p + 12, " "), "true\n", 5) == 0,
              "%s", out);
    free(out);
    free(err);
    kwd_stop(&d);
}

/* ls --pinned NAME of no set, through kwarmd: said as unpin says it, exit
 * 1, not "0 entries" (issue 24). */
Test(cli_ro_daemon, ls_pinned_through_kwarmd_names_a_missing_set)
{
    kwd d;
    ro_daemon(&d);
    const char *ls[] = {"ls", "--socket", d.sock, "--pinned", "TYPO", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_kwarm(ls, &out, &err), 1, "%s", err);
    cr_expect(strstr(err, "--pinned TYPO: no such pin set") != NULL, "%s", err);
    cr_expect(strstr(out, "0 entries") == NULL, "%s", out);
    free(out);
    free(err);
    kwd_stop(&d);
}
