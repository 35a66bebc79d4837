/* cli_suggest.c: "did you mean" for a mistyped command or flag.
 *
 * The candidates are the words the user could have meant: the command
 * table of kwarm_main.c, or the flags a command's --help names (the help
 * is what tests/test_cli_help.c proves complete against each parser, so
 * no second list of flags is kept here).
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "kw_opt.h"

const char *kw__cli_nearest(const char *word, const char *const *cands,
                            size_t n)
{
    return kw_opt_nearest(word, cands, n);
}

/* The flag of help nearest to arg (its name before any '='), into buf;
 * false when none is near.  Flags are the "--word" and "-x" tokens of
 * the help text. */
static bool nearest_flag(const char *arg, const char *help, char *buf,
                         size_t cap)
{
    enum { MAXF = 128 };
    char name[48], flags[MAXF][48];
    const char *cands[MAXF];
    size_t n = 0;
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, "="), arg);
    for (const char *p = help; help && n < MAXF && (p = strchr(p, '-')) != NULL; p++) {
        if (p > help && (p[-1] == '-' || (p[-1] >= 'a' && p[-1] <= 'z')))
            continue; /* inside a word: not a flag's start */
        size_t len = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (len < 2 || len >= sizeof flags[0])
            continue;
        snprintf(flags[n], sizeof flags[n], "%.*s", (int)len, p);
        cands[n] = flags[n];
        n++;
    }
    const char *near = kw_opt_nearest(name, cands, n);
    if (near != NULL)
        snprintf(buf, cap, "%s", near);
    return near != NULL;
}

int kw__cli_unknown(const char *cmd, const char *arg, const char *help,
                    const char *more_help)
{
    char flag[48];
    bool near = arg[0] == '-' &&
                (nearest_flag(arg, help, flag, sizeof flag) ||
                 nearest_flag(arg, more_help, flag, sizeof flag));
    if (near)
        kw__cli_err(cmd, "%s: unknown argument; did you mean %s? (see kwarm "
                    "%s --help)", arg, flag, cmd);
    else
        kw__cli_err(cmd, "%s: unknown argument (see kwarm %s --help)", arg, cmd);
    return KW_CLI_USAGE;
}
