/* deploy.c: the deployment dispatch reads, and the checks every op's
 * dispatch and check share. */
#include "kw_launch.h"

#include "internal.h"
#include "kw_err.h"

#include <stdio.h>

int kw_launch_deploy_check(const kw_launch_deploy *d, char *err,
                           size_t errlen)
{
    if (!d)
        return kw__launch_fail(err, errlen, "deployment: NULL");
    const struct {
        const char *name;
        int64_t v;
    } pos[] = {{"index_topk", d->index_topk},
               {"dcp_world", d->dcp_world},
               {"dcp_interleave", d->dcp_interleave},
               {"pcp", d->pcp},
               {"max_num_batched_tokens", d->max_num_batched_tokens},
               {"max_num_seqs", d->max_num_seqs},
               {"block_size", d->block_size},
               {"block_stride_rows", d->block_stride_rows},
               {"max_model_len", d->max_model_len}};
    for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++)
        if (pos[i].v < 1 || pos[i].v > INT32_MAX)
            return kw__launch_fail(err, errlen,
                                   "deployment %s: %lld is outside "
                                   "[1, 2^31 - 1]",
                                   pos[i].name, (long long)pos[i].v);
    if (d->dcp_rank < 0 || d->dcp_rank >= d->dcp_world)
        return kw__launch_fail(err, errlen,
                               "deployment dcp_rank: %lld is outside [0, %lld)"
                               " (one rank per process)",
                               (long long)d->dcp_rank,
                               (long long)d->dcp_world);
    if (d->num_speculative_tokens < 0 || d->num_speculative_tokens > 7)
        return kw__launch_fail(err, errlen,
                               "deployment num_speculative_tokens: %lld is "
                               "outside [0, 7]",
                               (long long)d->num_speculative_tokens);
    if (d->nratios_p > KW_LAUNCH_MAX_RATIOS ||
        d->nratios_s > KW_LAUNCH_MAX_RATIOS)
        return kw__launch_fail(err, errlen,
                               "deployment: more than %d compress ratios",
                               KW_LAUNCH_MAX_RATIOS);
    if (d->index_n_heads < 0 || d->index_head_dim < 0)
        return kw__launch_fail(err, errlen,
                               "deployment index_n_heads/index_head_dim: "
                               "negative");
    return 0;
}

int64_t kw_launch_table_width(const kw_launch_deploy *d)
{
    int64_t per = d->block_size * d->dcp_world; /* < 2^62 */
    int64_t n = (d->max_model_len + per - 1) / per;
    int64_t g = 128, b = d->block_size;
    while (b != 0) {
        int64_t t = g % b;
        g = b;
        b = t;
    }
    int64_t mult = 128 / g;
    return (n + mult - 1) / mult * mult;
}

void kw__launch_geo(const kw_launch_deploy *d, bool local, int64_t geo[3])
{
    geo[0] = local ? 1 : d->dcp_world;
    geo[1] = local ? 0 : d->dcp_rank;
    geo[2] = local || d->dcp_world == 1 ? 1 : d->dcp_interleave;
}

int kw__launch_one_of(const char *op, const char *arg, int64_t v,
                      const int64_t *list, size_t n, char *err,
                      size_t errlen)
{
    char allowed[160] = "";
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (list[i] == v)
            return 0;
        int w = snprintf(allowed + len, sizeof(allowed) - len, "%s%lld",
                         i ? ", " : "", (long long)list[i]);
        if (w > 0 && (size_t)w < sizeof(allowed) - len)
            len += (size_t)w;
    }
    if (n == 0)
        return kw__launch_fail(err, errlen,
                               "%s %s: %lld, but the model has none", op,
                               arg, (long long)v);
    return kw__launch_fail(err, errlen, "%s %s: %lld is not one of (%s)",
                           op, arg, (long long)v, allowed);
}

int kw__launch_need(const char *op, const char *arg, int64_t ptr,
                    int64_t count, char *err, size_t errlen)
{
    if (count > 0 && ptr == 0)
        return kw__launch_fail(err, errlen,
                               "%s %s: a NULL pointer where %lld elements "
                               "are read or written",
                               op, arg, (long long)count);
    return 0;
}

int kw__launch_same(const char *op, const char *arg, int64_t got,
                    int64_t want, const char *why, char *err, size_t errlen)
{
    if (got == want)
        return 0;
    return kw__launch_fail(err, errlen, "%s %s: %lld, but %s is %lld", op,
                           arg, (long long)got, why, (long long)want);
}

uint64_t kw__launch_ranged_grid(int64_t items, unsigned threads)
{
    /* At least 16 tiles per block, so per-block set-up is paid rarely, yet
     * at least 256 blocks when there are that many tiles (about two per
     * SM on an H200), so mid-sized calls fill the GPU. */
    uint64_t tiles = ((uint64_t)items + 4 * threads - 1) / (4 * threads);
    uint64_t grid = (tiles + 15) / 16;
    if (grid < 256)
        grid = tiles < 256 ? tiles : 256;
    return grid;
}
