/* log.h: kwarmd's log lines on stderr (kw__log_, daemon-internal).
 *
 * Under journald (JOURNAL_STREAM set, as systemd sets it for the service)
 * each line starts with a "<N>" priority prefix that journald reads
 * (sd-daemon(3)) and carries no time, journald adds it.  Anywhere else a
 * line starts with an RFC 3339 UTC timestamp and the level:
 *   2026-11-30T19:05:01.123Z kwarmd[4242] warn: ...
 * --log-level error|warn|info|debug (default info) drops the lines below
 * it; KW_LOG tests the level before evaluating its arguments (redis
 * serverLog).  Each line is written with one write, so lines of several
 * threads never interleave.
 */
#ifndef KW_DAEMON_LOG_H
#define KW_DAEMON_LOG_H

#include <stdbool.h>

enum { KW_LOG_ERR = 3, KW_LOG_WARNING = 4, KW_LOG_INFO = 6, KW_LOG_DEBUG = 7 };

/* Set once by kw__log_init() in main, before any thread starts. */
extern int kw__log_level;

/* Reads JOURNAL_STREAM and sets the level (a KW_LOG_* value). */
void kw__log_init(int level);

/* Parses "error", "warn", "info" or "debug"; -1 for anything else. */
int kw__log_level_from_name(const char *name);

/* Writes one line (no newline in fmt). */
void kw__log_write(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define KW_LOG(level, ...)                                                  \
    do {                                                                    \
        if ((level) <= kw__log_level)                                       \
            kw__log_write((level), __VA_ARGS__);                            \
    } while (0)

#endif /* KW_DAEMON_LOG_H */
