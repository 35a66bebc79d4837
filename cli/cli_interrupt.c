/* cli_interrupt.c: Ctrl-C (SIGINT) and SIGTERM during a long command
 * (prewarm): the first one stops the work, so the command can say it was
 * interrupted and with what counts; a second one ends the process at once,
 * as if nothing caught the first.
 *
 * The signals are blocked in the calling thread before the work's threads
 * start (they inherit the mask) and taken by one thread in sigwait(), so
 * the stop runs in a normal thread, not in a signal handler.
 */
#include "cli.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

/* The set caught: SIGINT and SIGTERM. */
static void caught_set(sigset_t *s)
{
    sigemptyset(s);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGTERM);
}

/* The waiting thread: takes one signal, records it, runs the armed stop,
 * then lets a second signal take its default action (kill the process). */
static void *wait_main(void *arg)
{
    kw__cli_interrupt *in = arg;
    sigset_t set;
    caught_set(&set);
    int sig = 0;
    while (sigwait(&set, &sig) != 0)
        ;
    /* Never cancelled inside the stop (it may wait on the work's locks):
     * kw__cli_interrupt_stop() cancels only at sigwait() or pause(). */
    int old;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    pthread_mutex_lock(&in->mu);
    in->sig = sig;
    if (in->stop != NULL)
        in->stop(in->arg);
    pthread_mutex_unlock(&in->mu);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL); /* only this thread takes it */
    pthread_setcancelstate(old, NULL);
    for (;;)
        pause();
    return NULL;
}

int kw__cli_interrupt_start(kw__cli_interrupt *in)
{
    sigset_t set;
    caught_set(&set);
    *in = (kw__cli_interrupt){.mu = PTHREAD_MUTEX_INITIALIZER};
    if (pthread_sigmask(SIG_BLOCK, &set, &in->old) != 0)
        return -1;
    if (pthread_create(&in->thread, NULL, wait_main, in) != 0) {
        pthread_sigmask(SIG_SETMASK, &in->old, NULL);
        return -1;
    }
    in->started = true;
    return 0;
}

void kw__cli_interrupt_arm(kw__cli_interrupt *in, void (*stop)(void *),
                           void *arg)
{
    if (!in->started)
        return;
    pthread_mutex_lock(&in->mu);
    in->stop = stop;
    in->arg = arg;
    if (stop != NULL && in->sig != 0) /* caught before it was armed */
        stop(arg);
    pthread_mutex_unlock(&in->mu);
}

int kw__cli_interrupt_stop(kw__cli_interrupt *in)
{
    if (!in->started)
        return 0;
    pthread_cancel(in->thread); /* sigwait() and pause() are cancellation
                                   points */
    pthread_join(in->thread, NULL);
    pthread_sigmask(SIG_SETMASK, &in->old, NULL);
    in->started = false;
    return in->sig;
}
