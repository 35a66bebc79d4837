/* ref_dcp.c: CPU references of the DCP gather families, written from
 * spec/kernels.md.  The top-k reference sorts with a comparator that reads
 * like the spec (score, then id, then position) instead of the kernel's
 * packed radix keys, so the two implementations check each other. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int kw_k_ref_dcp_pack_topk_candidates(const kw_k_pack_args *a)
{
    if (!a || a->dcp_world < 1 || a->dcp_interleave < 1 || a->dcp_rank < 0 ||
        a->dcp_rank >= a->dcp_world || a->topk < 1 || a->num_rows < 0 ||
        a->cols < 0)
        return KW_EINVAL;
    if (a->num_rows > 0 && (!a->topk_local || !a->packed ||
                            (a->cols > 0 && !a->logits) ||
                            (a->has_row_starts && !a->row_starts)))
        return KW_EINVAL;
    const float ninf = -INFINITY;
    for (int32_t r = 0; r < a->num_rows; r++) {
        int64_t rs = a->has_row_starts ? a->row_starts[r] : 0;
        const float *lrow = a->logits + (size_t)r * (size_t)a->cols;
        for (int32_t k = 0; k < a->topk; k++) {
            size_t e = (size_t)r * (size_t)a->topk + (size_t)k;
            int32_t p = a->topk_local[e];
            float *o = a->packed + 2 * e;
            if (p < 0 || p + rs < 0 || p + rs >= a->cols) {
                o[0] = ninf;
                o[1] = -1.0f;
                continue;
            }
            memcpy(&o[0], &lrow[p + rs], sizeof(float)); /* bits, NaNs too */
            uint32_t g = kw__k_dcp_global((uint32_t)p, (uint32_t)a->dcp_rank,
                                          (uint32_t)a->dcp_world,
                                          (uint32_t)a->dcp_interleave);
            o[1] = (float)kw__k_i32(g);
        }
    }
    return 0;
}

typedef struct cand {
    float score;
    int32_t id;
    int32_t pos;
} cand;

/* The spec's order, best first: higher score (NaN below every number,
 * -0.0 equal to +0.0, which == already gives), then lower id, then lower
 * position.  Positions are distinct, so the order is total. */
static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    bool na = isnan(a->score), nb = isnan(b->score);
    if (na != nb)
        return na ? 1 : -1;
    if (!na && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    return a->pos < b->pos ? -1 : (a->pos > b->pos);
}

/* Integral and in [0, 2^31): NaN fails every comparison. */
static bool id_valid(float id)
{
    return id >= 0.0f && id < 2147483648.0f && id == truncf(id);
}

int kw_k_ref_dcp_stable_topk(const kw_k_topk_args *a)
{
    if (!a || a->topk < 1 || a->num_candidates < 1 || a->num_rows < 0)
        return KW_EINVAL;
    if (a->num_rows == 0)
        return 0;
    if (!a->gathered || !a->out)
        return KW_EINVAL;
    cand *c = malloc((size_t)a->num_candidates * sizeof(*c));
    if (!c)
        return KW_ENOMEM;
    for (int32_t r = 0; r < a->num_rows; r++) {
        const float *g =
            a->gathered + (size_t)r * (size_t)a->num_candidates * 2;
        int32_t n = 0;
        for (int32_t i = 0; i < a->num_candidates; i++) {
            if (!id_valid(g[2 * i + 1]))
                continue;
            c[n++] = (cand){g[2 * i], (int32_t)g[2 * i + 1], i};
        }
        qsort(c, (size_t)n, sizeof(*c), cand_cmp);
        int32_t *o = a->out + (size_t)r * (size_t)a->topk;
        for (int32_t k = 0; k < a->topk; k++)
            o[k] = k < n ? c[k].id : -1;
    }
    free(c);
    return 0;
}
