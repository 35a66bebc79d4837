/* cli_util.h: running the kwarm binary from the CLI suites (test_cli.c,
 * test_cli_json.c) and a temporary directory for input files. */
#ifndef KW_TEST_CLI_UTIL_H
#define KW_TEST_CLI_UTIL_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "kw_test_util.h"



#define N(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_ARGS 24

/* ---- running kwarm ------------------------------------------------------ */

typedef struct result {
    int status;
    char *out, *err;
} result;

static inline void result_free(result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Strips the one-byte end marker from a captured stream; false when it is
 * missing (the stream was cut short). */
static inline bool strip_marker(char *s)
{
    size_t n = strlen(s);
    if (n == 0 || s[n - 1] != '#')
        return false;
    s[n - 1] = '\0';
    return true;
}

/* Runs kwarm with the NULL-terminated args (argv[1..]).
 *
 * kwarm runs under /bin/sh, which appends one '#' to stdout and to stderr
 * after it exits and passes its exit status on.  Neither stream is then
 * ever empty: kw_test_run() hands back an unterminated buffer for a stream
 * that stayed empty (capture_read() allocates, then meets EOF without
 * writing the NUL), so an empty stream could not be checked directly. */
static inline result kwarm(const char *const *args)
{
    static const char script[] =
        "\"$0\" \"$@\"; s=$?; printf '#'; printf '#' >&2; exit $s";
    const char *argv[MAX_ARGS + 5] = {"/bin/sh", "-c", script,
                                      KW_KWARM_BIN};
    size_t n = 0;
    while (args[n] != NULL) {
        cr_assert(n < MAX_ARGS, "too many arguments");
        argv[n + 4] = args[n];
        n++;
    }
    argv[n + 4] = NULL;
    result r = {0, NULL, NULL};
    r.status = kw_test_run(argv, &r.out, &r.err);
    cr_assert_not_null(r.out);
    cr_assert_not_null(r.err);
    cr_assert(strip_marker(r.out) && strip_marker(r.err),
              "output cut short (exit %d): %s", r.status, r.err);
    return r;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Number of '\n' in s. */
static inline size_t lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Expects exit 2, nothing on stdout and exactly one stderr line that holds
 * every needle (NULL-terminated).  label names the case. */
static inline void expect_bad_input(const char *label, const char *const *args,
                             const char *const *needles)
{
    result r = kwarm(args);
    cr_expect_eq(r.status, 2, "[%s] exit %d, want 2; stderr: %s", label,
                 r.status, r.err);
    cr_expect_str_empty(r.out, "[%s] stdout not empty", label);
    size_t len = strlen(r.err);
    cr_expect(lines(r.err) == 1 && len > 1 && r.err[len - 1] == '\n',
              "[%s] stderr is not exactly one line: \"%s\"", label, r.err);
    for (size_t i = 0; needles[i] != NULL; i++)
        cr_expect(strstr(r.err, needles[i]) != NULL,
                  "[%s] stderr lacks \"%s\": %s", label, needles[i], r.err);
    result_free(&r);
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_NEEDLES ((const char *const[]){NULL})

/* ---- temporary directory ------------------------------------------------ */

static char tmpdir[64];

static inline void tmp_setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(tmpdir, sizeof tmpdir, "cli"), 0,
                 "mkdtemp: %s", strerror(errno));
}

/* Removes the temporary directory and everything in it. */
static inline void tmp_teardown(void)
{
    kw_test_rmtree(tmpdir);
}

/* tmpdir/name, in one of 4 static buffers (one argument list may name up
 * to 4 such paths). */
static inline const char *tmp_at(const char *name)
{
    static char path[4][128];
    static unsigned next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", tmpdir, name);
    return p;
}

/* Writes len bytes to tmpdir/name; returns a new path string (free it). */
static inline char *tmp_file(const char *name, const char *data, size_t len)
{
    size_t cap = strlen(tmpdir) + strlen(name) + 2;
    char *path = malloc(cap);
    cr_assert_not_null(path);
    cr_assert_eq(kw_test_write_file(tmpdir, name, data, len, path, cap), 0,
                 "%s: %s", path, strerror(errno));
    return path;
}

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"
#define V4 KW_FIXTURES "/deepseek-v4-flash.json"

#endif /* KW_TEST_CLI_UTIL_H */
