/* log.h: kwarmd's log lines on stderr, with the <N> priority prefixes
 * journald reads (sd-daemon(3)); no timestamps, journald adds them. */
#ifndef KW_DAEMON_LOG_H
#define KW_DAEMON_LOG_H

#include <stdio.h>

enum { KW_LOG_ERR = 3, KW_LOG_WARNING = 4, KW_LOG_INFO = 6, KW_LOG_DEBUG = 7 };

#ifndef KW_LOG_MAX
#define KW_LOG_MAX KW_LOG_INFO /* debug lines compile in, cost nothing */
#endif

/* Tests the level before evaluating the arguments (redis serverLog). */
#define KW_LOG(level, ...)                                                  \
    do {                                                                    \
        if ((level) <= KW_LOG_MAX) {                                        \
            fprintf(stderr, "<%d>", (level));                               \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

#endif /* KW_DAEMON_LOG_H */
