/* bench_coldstart.c: time from request to a launchable kernel in a fresh
 * serving process with a warm kwarmd, through libkwarm.
 *
 * usage: bench_coldstart --socket PATH --digest HEX
 *
 * Run as a new process each time.  Prints JSON: the CUDA context creation
 * (driver load, cuInit, primary context: a cost any CUDA process pays),
 * then connect + get + cuModuleLoadData + cuModuleGetFunction: the part a
 * compile cache is responsible for.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kw_client.h"
#include "kw_cuda.h"
#include "kw_err.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    const char *sock = NULL, *digest = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--socket") == 0)
            sock = argv[i + 1];
        else if (strcmp(argv[i], "--digest") == 0)
            digest = argv[i + 1];
    }
    if (sock == NULL || digest == NULL) {
        fprintf(stderr, "usage: bench_coldstart --socket PATH --digest HEX\n");
        return 2;
    }
    char err[256];
    kw_cuda *cu = NULL;
    kw_client *c = NULL;
    kw_cuda_fn *fn = NULL;
    double t0 = now_ms();
    if (kw_cuda_open(&cu, 0, err, sizeof err) < 0) {
        fprintf(stderr, "bench_coldstart: %s\n", err);
        return 1;
    }
    double t1 = now_ms();
    int rc = kw_client_connect(&c, sock, 5000, err, sizeof err);
    if (rc == 0)
        rc = kw_client_load(c, cu, digest, &fn);
    double t2 = now_ms();
    if (rc < 0)
        fprintf(stderr, "bench_coldstart: %s: %s\n", kw_strerror(rc),
                c ? kw_client_last_error(c) : err);
    else
        printf("{\"context_ms\": %.3f, \"get_and_load_ms\": %.3f}\n", t1 - t0,
               t2 - t1);
    kw_cuda_unload(fn);
    kw_client_close(c);
    kw_cuda_close(cu);
    return rc < 0 ? 1 : 0;
}
