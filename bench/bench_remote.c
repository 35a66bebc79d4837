/* bench_remote.c: a remote-tier hit (Redis on loopback: fetch, HMAC and
 * checksum verification) beside the compile it replaces, in one run.
 *
 * usage: bench_remote [--model CONFIG] [--iters N] [--json FILE]
 *
 * Starts its own redis-server on a loopback port, compiles the model's keys
 * (default DeepSeek-V3.2, W = 2: every family), writes each signed entry
 * with kw_remote_put, then times kw_remote_get round-robin.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "kw_err.h"
#include "kw_remote.h"

/* Starts redis-server on port; returns its pid. */
static pid_t start_redis(unsigned port)
{
    char p[16];
    snprintf(p, sizeof p, "%u", port);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
    return pid;
}

int main(int argc, char **argv)
{
    if (bench_help(argc, argv, "usage: bench_remote [--model CONFIG] [--iters N] [--json FILE]"))
        return 0;
    const char *model = "tests/fixtures/deepseek-v3.2-exp.json", *json = NULL;
    size_t iters = 5000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--iters") == 0)
            iters = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--json") == 0)
            json = argv[i + 1];
    }
    kw_keys_set set;
    kw_remote_opts o = {.addr = {.host = "127.0.0.1", .port = 20000 + (unsigned)getpid() % 20000}};
    kw_remote *r = NULL;
    char err[256];
    if (iters == 0 || bench_derive(model, "2", "all", &set) < 0)
        return 2;
    memset(o.key, 7, sizeof o.key);
    pid_t redis = start_redis(o.addr.port);
    if (kw_remote_open(&r, &o, err, sizeof err) < 0) {
        fprintf(stderr, "bench_remote: %s\n", err);
        return 1;
    }
    double *cs = calloc(set.nkeys, sizeof *cs), *hs = calloc(iters, sizeof *hs);
    size_t bytes = 0;
    for (size_t i = 0; i < set.nkeys; i++) {
        kw_jit_result res;
        kw_cache_info info = {.family = "bench", .arch = "sm_90", .nvrtc = "13.0"};
        if (kw_keys_compile(&set.keys[i], false, &res) < 0)
            return 1;
        snprintf(info.entry, sizeof info.entry, "%s", res.lowered_name);
        cs[i] = res.seconds * 1e6;
        bytes += res.cubin_len;
        /* The first puts may meet a server still starting: retry (bounded). */
        int rc = KW_EREMOTE;
        for (int t = 0; t < 200 && rc == KW_EREMOTE; t++) {
            rc = kw_remote_put(r, set.keys[i].digest, &info, res.cubin, res.cubin_len);
            if (rc == KW_EREMOTE)
                nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        }
        kw_jit_result_destroy(&res);
        if (rc < 0) {
            fprintf(stderr, "bench_remote: put: %s\n", kw_strerror(rc));
            return 1;
        }
    }
    for (size_t i = 0; i < iters; i++) {
        void *blob = NULL;
        size_t len;
        double t0 = bench_now_ns();
        int rc = kw_remote_get(r, set.keys[i % set.nkeys].digest, &blob, &len, NULL);
        hs[i] = (bench_now_ns() - t0) / 1e3;
        free(blob);
        if (rc < 0) {
            fprintf(stderr, "bench_remote: get: %s\n", kw_strerror(rc));
            return 1;
        }
    }
    qsort(cs, set.nkeys, sizeof *cs, bench_cmp_double);
    qsort(hs, iters, sizeof *hs, bench_cmp_double);
    double h50 = hs[iters / 2], h99 = hs[iters * 99 / 100];
    double c50 = cs[set.nkeys / 2], c99 = cs[set.nkeys * 99 / 100];
    printf("%zu cubins of %.1f KB on average, %zu remote hits\n\n", set.nkeys,
           bytes / 1024.0 / set.nkeys, iters);
    printf("%-48s %10s %10s\n", "", "p50 us", "p99 us");
    printf("%-48s %10.0f %10.0f\n", "remote hit (Redis GET, HMAC + XXH3 check)", h50, h99);
    printf("%-48s %10.0f %10.0f\n", "NVRTC compile (what it replaces)", c50, c99);
    if (json != NULL) {
        FILE *f = fopen(json, "w");
        if (f != NULL) {
            fprintf(f, "{\"cubins\": %zu, \"avg_kb\": %.1f, \"remote_hit_us\": {\"p50\": %.1f, "
                    "\"p99\": %.1f}, \"compile_us\": {\"p50\": %.0f, \"p99\": %.0f}}\n",
                    set.nkeys, bytes / 1024.0 / set.nkeys, h50, h99, c50, c99);
            fclose(f);
        }
    }
    kw_remote_close(r);
    kill(redis, SIGTERM);
    waitpid(redis, NULL, 0);
    free(cs);
    free(hs);
    kw_keys_set_destroy(&set);
    return 0;
}
