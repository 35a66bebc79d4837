/* kw_journal.h: whether stderr is journald's own stream. */
#ifndef KW_JOURNAL_H
#define KW_JOURNAL_H

#include <stdbool.h>

/* True when fd 2 is the stream systemd named in JOURNAL_STREAM
 * ("device:inode", sd_journal_stream_fd(3)), so lines written there may
 * start with a "<N>" priority prefix.  A process that inherited the
 * variable but writes elsewhere (a shell of a unit, a redirect, a pipe
 * to a parent) gets false. */
bool kw_journal_stderr(void);

#endif /* KW_JOURNAL_H */
