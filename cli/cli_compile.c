/* cli_compile.c: compiling many keys on worker threads, with progress.
 *
 * Workers take the next key index from an atomic counter, so a slow key
 * (a CUB sort) never holds up the others; the caller's thread draws the
 * progress line while it waits.
 */
#include "cli.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kw_err.h"

typedef struct pool {
    const kw_keys_key *keys;
    size_t n;
    kw_jit_result *res;
    int *rc;
    kw__cli_done_fn done_fn; /* called on the worker after each compile */
    void *arg;
    _Atomic size_t next; /* next key to take */
    pthread_mutex_t lock; /* guards done; cond signals each change */
    pthread_cond_t cond;
    size_t done;
} pool;

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            return NULL;
        p->rc[i] = kw_keys_compile(&p->keys[i], false, &p->res[i]);
        if (p->done_fn != NULL)
            p->done_fn(i, p->arg);
        pthread_mutex_lock(&p->lock);
        p->done++;
        pthread_cond_signal(&p->cond);
        pthread_mutex_unlock(&p->lock);
    }
}

/* Draws "label: done/n" on stderr, in place, when stderr is a terminal. */
static void progress(const char *label, size_t done, size_t n, bool tty)
{
    if (!tty)
        return;
    int width = 30, fill = n ? (int)(done * (size_t)width / n) : width;
    fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu", label, fill,
            "##############################", width - fill, "", done, n);
    if (done == n)
        fputc('\n', stderr);
    fflush(stderr);
}

int kw__cli_compile_all(const kw_keys_key *keys, size_t n, unsigned jobs,
                        kw_jit_result *res, int *rc, const char *label,
                        kw__cli_done_fn done_fn, void *arg)
{
    pool p = {.keys = keys, .n = n, .res = res, .rc = rc, .done_fn = done_fn,
              .arg = arg,
              .lock = PTHREAD_MUTEX_INITIALIZER,
              .cond = PTHREAD_COND_INITIALIZER};
    pthread_t tids[KW_CLI_MAX_JOBS];
    unsigned started = 0;
    bool tty = isatty(STDERR_FILENO);
    if (jobs == 0)
        jobs = 1;
    if (jobs > KW_CLI_MAX_JOBS)
        jobs = KW_CLI_MAX_JOBS;
    atomic_init(&p.next, 0);
    for (; started < jobs && started < n; started++)
        if (pthread_create(&tids[started], NULL, worker, &p) != 0)
            break;
    if (started == 0 && n > 0)
        worker(&p); /* no thread could start: compile here */
    pthread_mutex_lock(&p.lock);
    while (started > 0 && p.done < n) {
        progress(label, p.done, n, tty);
        pthread_cond_wait(&p.cond, &p.lock);
    }
    pthread_mutex_unlock(&p.lock);
    for (unsigned t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    progress(label, n, n, tty);
    return 0;
}

unsigned kw__cli_default_jobs(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > KW_CLI_MAX_JOBS ? KW_CLI_MAX_JOBS : (unsigned)n;
}
