/* cli_warm.c: what `kwarm prewarm` and `kwarm warmup` print while keys
 * settle and after: a progress bar on a terminal, a progress line at most
 * every KW__CLI_PROGRESS_S seconds otherwise (CI logs), and each failed
 * key with its NVRTC log. */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void kw__cli_progress_init(kw__cli_progress *p, const char *label, bool quiet)
{
    p->label = label;
    p->tty = isatty(STDERR_FILENO);
    p->quiet = quiet;
    p->last = mono_s();
}

void kw__cli_progress_show(kw__cli_progress *p, size_t done, size_t n)
{
    if (p->quiet)
        return;
    if (p->tty) {
        int width = 30, fill = done >= n || n == 0 ? width
                                                   : (int)(done * (size_t)width / n);
        fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu", p->label, fill,
                "##############################", width - fill, "", done, n);
        if (done >= n)
            fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    double t = mono_s();
    if (done < n && t - p->last < KW__CLI_PROGRESS_S)
        return;
    p->last = t;
    fprintf(stderr, "%s: %zu/%zu keys settled\n", p->label, done, n);
}

void kw__cli_print_failure(const char *cmd, const char *family,
                           const char *arch, const char *hex, const char *error,
                           const char *log)
{
    kw__cli_err(cmd, "%s %s %.16s failed: %s", family, arch, hex, error);
    if (log == NULL || log[0] == '\0')
        return;
    size_t n = strlen(log);
    fprintf(stderr, "%s%s", log, log[n - 1] == '\n' ? "" : "\n");
}
