/* loops.h: the top of daemon/ below its life cycle (daemon.c): the serving
 * loops (loops.c) and the listening socket (listen.c) (kw__loops_,
 * kw__daemon_listen; not API), over the request handlers (handlers.h).
 */
#ifndef KW_DAEMON_LOOPS_H
#define KW_DAEMON_LOOPS_H

#include "handlers.h"

/* Starts the --loops serving loops (threads); 0 or a code with err. */
int kw__loops_start(kw__daemon *d, char *err, size_t errlen);
/* Hands an accepted socket to the next loop (main loop). */
void kw__loops_hand(kw__daemon *d, int fd);
/* Tells every loop to stop (close_all: to close every connection now). */
void kw__loops_tell(kw__daemon *d, bool close_all);
/* Joins the loop threads and closes their loops (after a stop, or to undo
 * a failed start: close_first tells them to stop). */
void kw__loops_join(kw__daemon *d, bool close_first);

/* Starts listening: the systemd socket or a new one at opts->socket_path
 * (listen.c); accepted peers go to kw__loops_hand. */
int kw__daemon_listen(kw__daemon *d, char *err, size_t errlen);

#endif /* KW_DAEMON_LOOPS_H */
