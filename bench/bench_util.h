/* bench_util.h: what the benchmarks share: deriving a model's keys under
 * a DCP world, a monotonic clock, sorting samples. */
#ifndef KW_BENCH_UTIL_H
#define KW_BENCH_UTIL_H

#include <stdio.h>
#include <time.h>

#include "kw_config.h"
#include "kw_keys.h"

/* Derives the keys of model under DCP world `world` and rank `rank`
 * ("all" or a number); prints the error and returns it on failure. */
static inline int bench_derive(const char *model, const char *world,
                               const char *rank, kw_keys_set *set)
{
    char err[KW_CONFIG_ERRLEN] = "";
    kw_config_model m;
    kw_config_deploy d;
    kw_config_deploy_init(&d);
    int rc = kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_WORLD, world, err, sizeof err);
    if (rc == 0)
        rc = kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_RANK, rank, err, sizeof err);
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

#endif /* KW_BENCH_UTIL_H */
