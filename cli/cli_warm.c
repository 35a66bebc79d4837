/* cli_warm.c: what `kwarm prewarm` and `kwarm warmup` print while keys
 * settle and after: a progress bar on a terminal, a progress line at most
 * every KW__CLI_PROGRESS_S seconds otherwise (CI logs), each with the
 * hits, compiles and failures so far, the time taken and an estimate of
 * the time left; and each failed key with its NVRTC log. */
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
    p->start = p->last = mono_s();
}

/* "H hits, C compiled, F failed[, X cancelled], E s[, about R s left]"
 * into buf.  The time left is the pace so far applied to the keys left:
 * rough while hits and compiles mix, but it moves the right way. */
static void describe(const kw__cli_progress *p, size_t done, size_t n,
                     const kw__cli_tally *t, char *buf, size_t cap)
{
    double el = mono_s() - p->start;
    int w = snprintf(buf, cap, "%zu hits, %zu compiled, %zu failed", t->hits,
                     t->compiled, t->failed);
    if (w > 0 && (size_t)w < cap && t->cancelled > 0)
        w += snprintf(buf + w, cap - (size_t)w, ", %zu cancelled", t->cancelled);
    if (w > 0 && (size_t)w < cap)
        w += snprintf(buf + w, cap - (size_t)w, "; %.1f s", el);
    if (w > 0 && (size_t)w < cap && done > 0 && done < n && el >= 1.0)
        snprintf(buf + w, cap - (size_t)w, ", about %.0f s left",
                 el * (double)(n - done) / (double)done + 0.5);
}

void kw__cli_progress_show(kw__cli_progress *p, size_t done, size_t n,
                           const kw__cli_tally *t)
{
    if (p->quiet)
        return;
    static const kw__cli_tally none;
    char what[160];
    describe(p, done, n, t ? t : &none, what, sizeof what);
    if (p->tty) {
        int width = 30, fill = done >= n || n == 0 ? width
                                                   : (int)(done * (size_t)width / n);
        fprintf(stderr, "\r%s [%.*s%*s] %zu/%zu  %s\033[K", p->label, fill,
                "##############################", width - fill, "", done, n,
                what);
        if (done >= n)
            fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    double now = mono_s();
    if (done < n && now - p->last < KW__CLI_PROGRESS_S)
        return;
    p->last = now;
    fprintf(stderr, "%s: %zu/%zu keys settled (%s)\n", p->label, done, n, what);
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
