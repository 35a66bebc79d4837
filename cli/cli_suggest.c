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

/* Edit distance (insert, delete, substitute, swap two neighbours) between
 * a and b, capped at 9: only small ones matter. */
static size_t distance(const char *a, const char *b)
{
    enum { MAX = 40 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAX || m >= MAX)
        return 9;
    size_t d[MAX + 1][MAX + 1];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            size_t best = sub < del ? sub : del;
            best = ins < best ? ins : best;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m] < 9 ? d[n][m] : 9;
}

/* True when a distance this small makes `word` a likely typo of a
 * candidate of its length: 1 for short words, up to a third of it. */
static bool close_enough(size_t dist, const char *word)
{
    size_t n = strlen(word), allowed = n <= 4 ? 1 : n / 3;
    return dist > 0 && dist <= (allowed > 3 ? 3 : allowed);
}

const char *kw__cli_nearest(const char *word, const char *const *cands,
                            size_t n)
{
    const char *best = NULL;
    size_t best_d = 9;
    for (size_t i = 0; i < n; i++) {
        size_t d = distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    return best && close_enough(best_d, word) ? best : NULL;
}

/* The flag of help nearest to arg (its name before any '='), into buf;
 * false when none is near.  Flags are the "--word" and "-x" tokens of
 * the help text. */
static bool nearest_flag(const char *arg, const char *help, char *buf,
                         size_t cap)
{
    char name[48];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, "="), arg);
    size_t best_d = 9;
    for (const char *p = help; help && (p = strchr(p, '-')) != NULL; p++) {
        if (p > help && (p[-1] == '-' || (p[-1] >= 'a' && p[-1] <= 'z')))
            continue; /* inside a word: not a flag's start */
        size_t len = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
        char flag[48];
        if (len < 2 || len >= sizeof flag)
            continue;
        snprintf(flag, sizeof flag, "%.*s", (int)len, p);
        size_t d = distance(name, flag);
        if (d < best_d) {
            best_d = d;
            snprintf(buf, cap, "%s", flag);
        }
    }
    return close_enough(best_d, name);
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
