/* bench_util.h: what the benchmarks share: deriving a model's keys under
 * a DCP world, a monotonic clock, sorting samples. */
#ifndef KW_BENCH_UTIL_H
#define KW_BENCH_UTIL_H

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kw_client.h"

#include "kw_config.h"
#include "kw_keys.h"

/* True, after printing usage on stdout, when an argument is --help or -h:
 * the caller exits 0 without measuring anything. */
static inline int bench_help(int argc, char **argv, const char *usage)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("%s\n", usage);
            return 1;
        }
    return 0;
}

/* Derives the keys of model under DCP world `world`, rank `rank` ("all"
 * or a number) and the --arch list `arch` (NULL: each of rank and arch
 * left at its default); prints the error and returns it on failure. */
static inline int bench_derive_arch(const char *model, const char *world,
                                    const char *rank, const char *arch,
                                    kw_keys_set *set)
{
    char err[KW_CONFIG_ERRLEN] = "";
    kw_config_model m;
    kw_config_deploy d;
    kw_config_deploy_init(&d);
    int rc = kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_WORLD, world, err, sizeof err);
    if (rc == 0 && rank != NULL)
        rc = kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_RANK, rank, err, sizeof err);
    if (rc == 0 && arch != NULL)
        rc = kw_config_deploy_set_flag(&d, KW_CONFIG_ARCH, arch, err, sizeof err);
    if (rc == 0 && (rc = kw_config_load(&m, model, NULL, err, sizeof err)) == 0) {
        rc = kw_config_resolve(&d, &m, err, sizeof err);
        if (rc == 0)
            rc = kw_keys_derive(&m, &d, set, err, sizeof err);
        kw_config_model_destroy(&m);
    }
    kw_config_deploy_destroy(&d);
    if (rc < 0)
        fprintf(stderr, "bench: %s\n", err);
    return rc;
}

static inline int bench_derive(const char *model, const char *world,
                               const char *rank, kw_keys_set *set)
{
    return bench_derive_arch(model, world, rank, NULL, set);
}

static inline double bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A file's text (at most 1 MiB, NUL-terminated; free() it), or NULL. */
static inline char *bench_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = f ? calloc(1, 1 << 20) : NULL;
    if (buf != NULL && fread(buf, 1, (1 << 20) - 1, f) == 0 && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    return buf;
}

/* The path of program `name` beside this bench's own executable (the
 * build tree keeps kwarm, kwarmd and the benches together). */
static inline void bench_sibling(const char *name, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = '\0';
    snprintf(out, cap, "%s/%s", n > 0 ? self : ".", name);
}

/* Turns NVRTC's own compile cache off for this process (and the compile
 * helpers it starts, which have it off anyway): NVRTC 13 keeps compiles
 * in the driver's compute cache where a driver runs, so on a GPU host a
 * bench that compiles the same keys twice would time cache hits (64 keys:
 * 0.84 s against 6.5 s on the H200 host).  A bench of compile cost must
 * time compiles. */
static inline void bench_real_compiles(void)
{
    setenv("CUDA_CACHE_DISABLE", "1", 1);
}

/* A fresh directory under /tmp for one run: dir, and inside it the paths
 * a kwarmd or a cache of the run is given. */
typedef struct bench_tmp {
    char dir[64], sock[96], cache[96];
} bench_tmp;

/* Makes /tmp/kw-TAG-XXXXXX; prints why and returns -1 when it cannot. */
static inline int bench_tmp_make(bench_tmp *t, const char *tag)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/kw-%s-XXXXXX", tag);
    if (mkdtemp(t->dir) == NULL) {
        perror(t->dir);
        return -1;
    }
    snprintf(t->sock, sizeof t->sock, "%s/s.sock", t->dir);
    snprintf(t->cache, sizeof t->cache, "%s/cache", t->dir);
    return 0;
}

/* Removes dir and all in it (none there is fine); 0 or -1. */
static inline int bench_rmtree(const char *dir)
{
    char cmd[PATH_MAX + 16];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= (int)sizeof cmd)
        return -1;
    return system(cmd) == 0 ? 0 : -1;
}

/* Removes the run's directory and all in it; 0 or -1. */
static inline int bench_tmp_remove(const bench_tmp *t)
{
    return bench_rmtree(t->dir);
}

/* Starts kwarmd (bin) on sock and cache with --jobs jobs, --loops loops
 * (NULL: kwarmd's default) and stderr to /dev/null, and connects *c once
 * it accepts (bounded wait).  Returns the pid, or -1. */
static inline pid_t bench_start_kwarmd(const char *bin, const char *sock,
                                       const char *cache, const char *jobs,
                                       const char *loops, kw_client **c)
{
    char err[256];
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen("/dev/null", "w", stderr) == NULL)
            _exit(127);
        execl(bin, bin, "--socket", sock, "--cache", cache, "--jobs", jobs,
              loops ? "--loops" : (char *)NULL, loops, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; pid > 0 && i < 1000; i++) { /* bounded: until it accepts */
        if (kw_client_connect(c, sock, 60000, err, sizeof err) == 0)
            return pid;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    if (pid > 0)
        kill(pid, SIGKILL);
    return -1;
}

#endif /* KW_BENCH_UTIL_H */
