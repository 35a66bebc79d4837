/* internal.h: what launch/'s files share (kw__launch_*), not API. */
#ifndef KW_LAUNCH_INTERNAL_H
#define KW_LAUNCH_INTERNAL_H

#include "kw_err.h"
#include "kw_launch.h"

/* Per-op parts of the contract; a is the call's argument array, f the
 * key's fields.  dispatch and check return 0 or KW_EINVAL with a message
 * in err; grid writes the grid (before the driver's limits are checked);
 * params appends the kernel's parameters. */
typedef int (*kw__launch_dispatch_fn)(const kw_launch_deploy *d,
                                      const int64_t *a, int64_t *f,
                                      char *err, size_t errlen);
typedef int (*kw__launch_check_fn)(const kw_launch_deploy *d,
                                   const int64_t *f, const int64_t *a,
                                   char *err, size_t errlen);
typedef void (*kw__launch_grid_fn)(const int64_t *f, const int64_t *a,
                                   unsigned sm_count, uint64_t grid[3]);
typedef void (*kw__launch_params_fn)(const int64_t *f,
                                     const kw_launch_deploy *d,
                                     const int64_t *a, kw_launch_params *p);

#define KW__LAUNCH_OP(name)                                                \
    int kw__launch_dispatch_##name(const kw_launch_deploy *d,              \
                                   const int64_t *a, int64_t *f,           \
                                   char *err, size_t errlen);              \
    int kw__launch_check_##name(const kw_launch_deploy *d,                 \
                                const int64_t *f, const int64_t *a,        \
                                char *err, size_t errlen);                 \
    void kw__launch_params_##name(const int64_t *f,                        \
                                  const kw_launch_deploy *d,               \
                                  const int64_t *a, kw_launch_params *p);
KW__LAUNCH_OP(pcm)
KW__LAUNCH_OP(csm)
KW__LAUNCH_OP(ic)
KW__LAUNCH_OP(pack)
KW__LAUNCH_OP(stable)
KW__LAUNCH_OP(logits)
KW__LAUNCH_OP(itopk)
KW__LAUNCH_OP(paged)
#undef KW__LAUNCH_OP

void kw__launch_grid_pcm(const int64_t *f, const int64_t *a, unsigned sm,
                         uint64_t grid[3]);
void kw__launch_grid_csm(const int64_t *f, const int64_t *a, unsigned sm,
                         uint64_t grid[3]);
void kw__launch_grid_ic(const int64_t *f, const int64_t *a, unsigned sm,
                        uint64_t grid[3]);
void kw__launch_grid_pack(const int64_t *f, const int64_t *a, unsigned sm,
                          uint64_t grid[3]);
void kw__launch_grid_stable(const int64_t *f, const int64_t *a, unsigned sm,
                            uint64_t grid[3]);
void kw__launch_grid_logits(const int64_t *f, const int64_t *a, unsigned sm,
                            uint64_t grid[3]);
void kw__launch_grid_itopk(const int64_t *f, const int64_t *a, unsigned sm,
                           uint64_t grid[3]);
void kw__launch_grid_paged(const int64_t *f, const int64_t *a, unsigned sm,
                           uint64_t grid[3]);

/* Writes the message into err (errlen bytes; err may be NULL) and returns
 * KW_EINVAL. */
#define kw__launch_fail(err, errlen, ...) \
    kw_err_fmt((err), (errlen), KW_EINVAL, __VA_ARGS__)

/* Appends a 64-bit pointer / a 32-bit int parameter to p. */
void kw__launch_ptr(kw_launch_params *p, int64_t v);
void kw__launch_int(kw_launch_params *p, int64_t v);

/* The DCP geometry (world, rank, interleave) a call runs in: (1, 0, 1)
 * with dcp_local, else d's. */
void kw__launch_geo(const kw_launch_deploy *d, bool local, int64_t geo[3]);

/* Whether v is one of list[0..n); when not, a message naming the
 * argument and the allowed values is written to err and KW_EINVAL
 * returned. */
int kw__launch_one_of(const char *op, const char *arg, int64_t v,
                      const int64_t *list, size_t n, char *err,
                      size_t errlen);

/* Requires a[i] (a pointer) to be non-zero when count > 0. */
int kw__launch_need(const char *op, const char *arg, int64_t ptr,
                    int64_t count, char *err, size_t errlen);

/* Requires want == got for a size the key fixes. */
int kw__launch_same(const char *op, const char *arg, int64_t got,
                    int64_t want, const char *why, char *err, size_t errlen);

/* The grid of the kernels that give each block a contiguous range of
 * tiles of 4 items per thread (gen.c's ranged_grid). */
uint64_t kw__launch_ranged_grid(int64_t items, unsigned threads);

#endif /* KW_LAUNCH_INTERNAL_H */
