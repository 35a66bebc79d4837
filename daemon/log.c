/* log.c: kwarmd's log lines (log.h says the format). */
#include "log.h"

#include "kw_journal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int kw__log_level = KW_LOG_INFO;
static bool journal; /* set once with kw__log_level */

void kw__log_init(int level)
{
    kw__log_level = level;
    journal = kw_journal_stderr(); /* not a JOURNAL_STREAM inherited by a
                                       kwarmd writing elsewhere */
}

int kw__log_level_from_name(const char *name)
{
    static const struct {
        const char *name;
        int level;
    } names[] = {{"error", KW_LOG_ERR}, {"warn", KW_LOG_WARNING},
                 {"info", KW_LOG_INFO}, {"debug", KW_LOG_DEBUG}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i].name) == 0)
            return names[i].level;
    return -1;
}

static const char *level_name(int level)
{
    return level <= KW_LOG_ERR       ? "error"
           : level == KW_LOG_WARNING ? "warn"
           : level == KW_LOG_INFO    ? "info"
                                     : "debug";
}

/* The line's start: "<N>" for journald, else time, program and level. */
static int prefix(int level, char *buf, size_t cap)
{
    if (journal)
        return snprintf(buf, cap, "<%d>", level);
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    return snprintf(buf, cap, "%s.%03ldZ kwarmd[%d] %s: ", when,
                    ts.tv_nsec / 1000000, (int)getpid(), level_name(level));
}

void kw__log_write(int level, const char *fmt, ...)
{
    char line[2048];
    int n = prefix(level, line, sizeof line);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* cut, still one line */
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nowhere to report a failed log write */
}
