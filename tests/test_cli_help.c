/* test_cli_help.c: every option a command takes is in its --help (issue 12
 * point 10).
 *
 * The parsers are probed as a black box: every flag-like word of the CLI's
 * sources and of every command's help is given alone to every command
 * (`kwarm CMD --flag`).  A command that does not answer "--flag: unknown
 * argument" took the flag, so its --help must name it.  The commands are
 * those `kwarm --help` lists; KWARM_SOCKET points nowhere, so a command
 * that goes on to connect fails at once.
 */
#include <dirent.h>

#include "cli_util.h"

#define CLI_DIR KW_FIXTURES "/../../cli"
#define MAX_WORDS 256

typedef struct words {
    char *w[MAX_WORDS];
    size_t n;
} words;

static void add_word(words *ws, const char *s, size_t len)
{
    for (size_t i = 0; i < ws->n; i++)
        if (strlen(ws->w[i]) == len && strncmp(ws->w[i], s, len) == 0)
            return;
    cr_assert(ws->n < MAX_WORDS, "too many flags");
    ws->w[ws->n++] = strndup(s, len);
}

static void words_free(words *ws)
{
    for (size_t i = 0; i < ws->n; i++)
        free(ws->w[i]);
    ws->n = 0;
}

static bool flag_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
}

/* Adds every "--word" and "-x" (a single letter) of text to ws.  A flag
 * starts after a character that cannot be inside a word. */
static void scan_flags(words *ws, const char *text)
{
    for (const char *p = text; *p != '\0'; p++) {
        if (*p != '-' || (p > text && (flag_char(p[-1]) || p[-1] == '_' ||
                                       (p[-1] >= 'A' && p[-1] <= 'Z'))))
            continue;
        size_t len = 1;
        if (p[1] == '-' && p[2] >= 'a' && p[2] <= 'z') {
            len = 2;
            while (flag_char(p[len]))
                len++;
            while (p[len - 1] == '-')
                len--;
        } else if (p[1] >= 'a' && p[1] <= 'z' && !flag_char(p[2])) {
            len = 2;
        }
        if (len >= 2)
            add_word(ws, p, len);
        p += len - 1;
    }
}

/* True when text names flag as a whole word. */
static bool names_flag(const char *text, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = text; (p = strstr(p, flag)) != NULL; p++)
        if ((p == text || !flag_char(p[-1])) && !flag_char(p[n]))
            return true;
    return false;
}

/* The commands `kwarm --help` lists under "Commands:". */
static void commands(words *cmds, char **usage)
{
    result r = kwarm(ARGS("--help"));
    cr_assert_eq(r.status, 0);
    const char *p = strstr(r.out, "Commands:\n");
    cr_assert_not_null(p, "%s", r.out);
    for (p += 10; strncmp(p, "  ", 2) == 0; p = strchr(p, '\n') + 1) {
        const char *name = p + 2;
        add_word(cmds, name, strcspn(name, " "));
    }
    *usage = strdup(r.out);
    result_free(&r);
}

/* Every flag-like word of the CLI's C sources. */
static void source_flags(words *ws)
{
    DIR *d = opendir(CLI_DIR);
    cr_assert_not_null(d, "%s: %s", CLI_DIR, strerror(errno));
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n < 3 || strcmp(e->d_name + n - 2, ".c") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CLI_DIR, e->d_name);
        char *text = kw_test_read_file(path, NULL);
        cr_assert_not_null(text, "%s", path);
        /* Only inside string literals: "-" '-' in code are not flags. */
        for (char *q = text; (q = strchr(q, '"')) != NULL;) {
            char *end = strchr(q + 1, '"');
            if (end == NULL)
                break;
            *end = '\0';
            scan_flags(ws, q + 1);
            q = end + 1;
        }
        free(text);
    }
    closedir(d);
}

Test(cli_help, kwarm_help_lists_version_and_help)
{
    words cmds = {0};
    char *usage = NULL;
    commands(&cmds, &usage);
    cr_expect(names_flag(usage, "--version"), "kwarm --help lacks --version");
    cr_expect(names_flag(usage, "--help"), "kwarm --help lacks --help");
    cr_expect_geq(cmds.n, 12, "only %zu commands listed", cmds.n);
    result r = kwarm(ARGS("--version"));
    cr_expect(r.status == 0 && strncmp(r.out, "kwarm ", 6) == 0, "%s", r.out);
    result_free(&r);
    free(usage);
    words_free(&cmds);
}

Test(cli_help, every_flag_a_command_takes_is_in_its_help)
{
    setenv("KWARM_SOCKET", "/nonexistent/kwarm-help-test.sock", 1);
    words cmds = {0}, flags = {0};
    char *usage = NULL, *help[MAX_WORDS] = {0};
    commands(&cmds, &usage);
    source_flags(&flags);
    for (size_t c = 0; c < cmds.n; c++) {
        result r = kwarm(ARGS(cmds.w[c], "--help"));
        cr_assert_eq(r.status, 0, "kwarm %s --help: exit %d", cmds.w[c], r.status);
        scan_flags(&flags, r.out);
        help[c] = strdup(r.out);
        result_free(&r);
    }
    cr_assert_geq(flags.n, 20, "only %zu flags found", flags.n);
    size_t probed = 0, missing = 0;
    for (size_t c = 0; c < cmds.n; c++)
        for (size_t f = 0; f < flags.n; f++) {
            if (names_flag(help[c], flags.w[f]))
                continue; /* listed: nothing to prove */
            result r = kwarm(ARGS(cmds.w[c], flags.w[f]));
            char unknown[128];
            snprintf(unknown, sizeof unknown, "%s: unknown argument", flags.w[f]);
            bool taken = strstr(r.err, unknown) == NULL;
            result_free(&r);
            probed++;
            if (taken) {
                cr_log_error("kwarm %s takes %s but its --help does not list it",
                             cmds.w[c], flags.w[f]);
                missing++;
            }
        }
    cr_expect_eq(missing, 0, "%zu options missing from help texts (%zu probed)",
                 missing, probed);
    for (size_t c = 0; c < cmds.n; c++)
        free(help[c]);
    free(usage);
    words_free(&cmds);
    words_free(&flags);
}

/* ---- completion and man pages (issue 24) ------------------------------- */

/* The words the generated completion offers after `kwarm CMD`: the
 * quoted list on its line "        CMD) words=\"...\" ;;" (free it). */
static char *completion_words(const char *bash, const char *cmd)
{
    char key[64];
    snprintf(key, sizeof key, "\n        %s) words=\"", cmd);
    const char *p = strstr(bash, key);
    cr_assert_not_null(p, "the completion has no case for %s", cmd);
    p += strlen(key);
    return strndup(p, strcspn(p, "\""));
}

/* The bash completion and the man pages are generated from the --help
 * texts at build time; this holds them to the parsers themselves: after
 * `kwarm CMD`, completion offers a flag exactly when CMD takes it. */
Test(cli_help, completion_offers_exactly_the_flags_each_command_takes)
{
    setenv("KWARM_SOCKET", "/nonexistent/kwarm-help-test.sock", 1);
    char *bash = kw_test_read_file(KW_DOC_DIR "/kwarm.bash", NULL);
    cr_assert_not_null(bash, "%s/kwarm.bash: %s", KW_DOC_DIR, strerror(errno));
    words cmds = {0}, flags = {0};
    char *usage = NULL;
    commands(&cmds, &usage);
    source_flags(&flags);
    size_t wrong = 0;
    for (size_t c = 0; c < cmds.n; c++) {
        char *offered = completion_words(bash, cmds.w[c]);
        words off = {0};
        scan_flags(&off, offered);
        for (size_t f = 0; f < off.n; f++)
            scan_flags(&flags, off.w[f]); /* probe what it offers too */
        for (size_t f = 0; f < flags.n; f++) {
            result r = kwarm(ARGS(cmds.w[c], flags.w[f]));
            char unknown[128];
            snprintf(unknown, sizeof unknown, "%s: unknown argument", flags.w[f]);
            bool taken = strstr(r.err, unknown) == NULL;
            result_free(&r);
            if (taken != names_flag(offered, flags.w[f])) {
                cr_log_error("kwarm %s %s: %s, but completion %s it", cmds.w[c],
                             flags.w[f], taken ? "taken" : "refused",
                             taken ? "lacks" : "offers");
                wrong++;
            }
        }
        words_free(&off);
        free(offered);
    }
    cr_expect_eq(wrong, 0, "%zu flags where completion and parser disagree",
                 wrong);
    /* The command names, and each command's section in the man page. */
    char *man = kw_test_read_file(KW_DOC_DIR "/kwarm.1", NULL);
    char *mand = kw_test_read_file(KW_DOC_DIR "/kwarmd.8", NULL);
    cr_assert(man && mand, "man pages missing from %s", KW_DOC_DIR);
    const char *top = strstr(bash, "compgen -W \"");
    cr_assert_not_null(top, "no command list in the completion");
    char *list = strndup(top + 12, strcspn(top + 12, "\""));
    for (size_t c = 0; c < cmds.n; c++) {
        char ss[64];
        snprintf(ss, sizeof ss, "\n.SS kwarm %s\n.nf\nusage: kwarm %s", cmds.w[c],
                 cmds.w[c]);
        cr_expect(strstr(man, ss) != NULL, "kwarm.1 lacks the help of %s",
                  cmds.w[c]);
        cr_expect(names_flag(list, cmds.w[c]), "completion lacks command %s: %s",
                  cmds.w[c], list);
    }
    free(list);
    cr_expect(strstr(mand, "--socket PATH") != NULL && strstr(mand, ".TH KWARMD 8"),
              "kwarmd.8 is not kwarmd's help");
    free(man);
    free(mand);
    free(bash);
    free(usage);
    words_free(&cmds);
    words_free(&flags);
}

/* What bash itself completes, through the generated function. */
Test(cli_help, bash_completes_commands_and_flags)
{
    const char *script =
        "source \"$0\"; "
        "COMP_WORDS=(kwarm prew); COMP_CWORD=1; _kwarm; echo \"1:${COMPREPLY[*]}\"; "
        "COMP_WORDS=(kwarm prewarm --ca); COMP_CWORD=2; _kwarm; echo \"2:${COMPREPLY[*]}\"; "
        "COMP_WORDS=(kwarm ls --pin); COMP_CWORD=2; _kwarm; echo \"3:${COMPREPLY[*]}\"; "
        "COMP_WORDS=(kwarm help wa); COMP_CWORD=2; _kwarm; echo \"4:${COMPREPLY[*]}\"";
    const char *argv[] = {"/bin/bash", "-c", script, KW_DOC_DIR "/kwarm.bash", NULL};
    char *out = NULL, *err = NULL;
    if (access("/bin/bash", X_OK) != 0)
        cr_skip_test("no /bin/bash");
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "1:prewarm\n") != NULL, "%s", out);
    cr_expect(strstr(out, "2:--cache\n") != NULL, "%s", out);
    cr_expect(strstr(out, "3:--pinned\n") != NULL, "%s", out);
    cr_expect(strstr(out, "4:warmup\n") != NULL, "%s", out);
    free(out);
    free(err);
}

/* ---- the option tables (issue 24) ------------------------------------- */

#include "kw_config.h"

/* The deployment flags are jit/'s (kw_config_field_flag), routed by the
 * CLI's model rows: every one of them is taken by each key-deriving
 * command and named in its help, so a field added to jit/ without a row
 * fails here rather than being refused as "unknown argument". */
Test(cli_help, every_deployment_field_has_a_row_in_each_model_command)
{
    static const char *const cmds[] = {"keys", "diff", "prewarm", "warmup",
                                       "verify"};
    for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
        result h = kwarm(ARGS(cmds[c], "--help"));
        cr_assert_eq(h.status, 0, "kwarm %s --help", cmds[c]);
        for (int f = 0; f < KW_CONFIG_NFIELDS; f++) {
            const char *flag = kw_config_field_flag((kw_config_field)f);
            cr_expect(names_flag(h.out, flag), "kwarm %s --help lacks %s",
                      cmds[c], flag);
            result r = kwarm(ARGS(cmds[c], flag));
            char unknown[128];
            snprintf(unknown, sizeof unknown, "%s: unknown argument", flag);
            cr_expect(strstr(r.err, unknown) == NULL, "kwarm %s %s: %s", cmds[c],
                      flag, r.err);
            result_free(&r);
        }
        result_free(&h);
    }
}

/* getopt_long takes any unambiguous prefix of a long flag; kwarm wants
 * it spelled out (a typo must not select a flag silently), takes
 * --flag=VALUE, and refuses a value given twice. */
Test(cli_help, flags_are_spelled_out_and_given_once)
{
    const char *m = KW_FIXTURES "/deepseek-v3.2-exp.json";
    result r = kwarm(ARGS("keys", "--model", m, "--js"));
    cr_expect(r.status == 2 && strstr(r.err, "--js: unknown argument"), "%s", r.err);
    result_free(&r);
    r = kwarm(ARGS("keys", "--model", m, "--jsno"));
    cr_expect(r.status == 2 && strstr(r.err, "--jsno: unknown argument; did you "
                                             "mean --json?"), "%s", r.err);
    result_free(&r);
    r = kwarm(ARGS("keys", "--model=" KW_FIXTURES "/deepseek-v3.2-exp.json",
                   "--dcp-world=2", "--json"));
    cr_expect(r.status == 0 && strstr(r.out, "\"dcp_world\":2"), "%s", r.err);
    result_free(&r);
    r = kwarm(ARGS("prewarm", "--model", m, "--cache", "/tmp/a", "--cache", "/tmp/b"));
    cr_expect(r.status == 2 && strstr(r.err, "--cache: given more than once"),
              "%s", r.err);
    result_free(&r);
    r = kwarm(ARGS("keys", "--model", m, "--json=yes"));
    cr_expect(r.status == 2 && strstr(r.err, "--json=yes: takes no value"),
              "%s", r.err);
    result_free(&r);
    r = kwarm(ARGS("prewarm", "--model", m, "--cache", "/tmp/a", "--jobs", "0"));
    cr_expect(r.status == 2 &&
                  strstr(r.err, "--jobs: '0' is not an integer in [1, 256]"),
              "%s", r.err);
    result_free(&r);
}
