/* gen_dcp.c: random inputs for the DCP gather families' checks: scores
 * with NaNs (of both signs and several payloads), infinities, -0.0 next to
 * +0.0 and ties; ids with duplicates and invalid values. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* A score: mostly a plausible logit, sometimes a special value or a tie
 * (multiples of 1/4 in [-2, 2]); `special` is the per-mille of specials. */
static float rand_score(kw__k_rng *g, unsigned special)
{
    if (kw__k_chance(g, special)) {
        static const uint32_t sp[] = {
            0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffbadbadu, /* NaNs */
            0x80000000u, 0x00000000u, 0x7f800000u, 0xff800000u, /* 0s, infs */
            0x00000001u, 0x80000001u,                           /* denormals */
        };
        return bits_float(sp[kw__k_rand(g) % (sizeof(sp) / sizeof(sp[0]))]);
    }
    if (kw__k_chance(g, 200))
        return (float)kw__k_rand_in(g, -8, 8) / 4.0f;
    /* Sum of four uniforms: bell-shaped, like real logits. */
    double x = 0;
    for (int i = 0; i < 4; i++)
        x += (double)(kw__k_rand(g) >> 11) / 9007199254740992.0;
    return (float)((x - 2.0) * 3.0);
}

/* Distinct 32-byte sectors of logits that one row's gathers touch, the
 * least DRAM must read for them.  stamp has a slot per sector of a row
 * (plus one), marked with `mark` once counted. */
static size_t pack_sectors(const int32_t *row, int32_t topk, int32_t start,
                           int64_t base, int32_t cols, uint32_t *stamp,
                           uint32_t mark)
{
    size_t n = 0;
    for (int32_t k = 0; k < topk; k++) {
        int64_t col = (int64_t)row[k] + start;
        if (row[k] < 0 || col >= cols)
            continue;
        size_t sec = (size_t)(((base + col) >> 3) - (base >> 3));
        if (stamp[sec] != mark) {
            stamp[sec] = mark;
            n++;
        }
    }
    return n;
}

int kw__k_gen_pack(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int64_t *f = c->fields;
    const bool has_rs = f[3];
    const int32_t topk = (int32_t)f[4];
    const int32_t rows = (int32_t)s->rows, cols = (int32_t)s->cols;
    float *logits, *out;
    int32_t *pos, *rs;
    int rc;
    if ((rc = kw__k_case_buf(c, "logits", KW__K_F32, (size_t)rows * cols, false,
                             (void **)&logits)) < 0 ||
        (rc = kw__k_case_buf(c, "topk_local", KW__K_I32, (size_t)rows * topk,
                             false, (void **)&pos)) < 0 ||
        (rc = kw__k_case_buf(c, "row_starts", KW__K_I32, has_rs ? rows : 0,
                             false, (void **)&rs)) < 0)
        return rc;
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        logits[i] = rand_score(g, 40);
    uint32_t *stamp = calloc((size_t)cols / 8 + 2, sizeof(*stamp));
    if (!stamp)
        return KW_ENOMEM;
    size_t sectors = 0;
    for (int32_t r = 0; r < rows; r++) {
        int32_t start = has_rs && !kw__k_chance(g, 200)
                            ? (int32_t)kw__k_rand_in(g, 0, cols / 4) : 0;
        if (has_rs)
            rs[r] = start;
        int32_t *row = pos + (size_t)r * topk;
        for (int32_t k = 0; k < topk; k++) {
            /* -1, past the row (p + start >= cols), or inside it */
            if (kw__k_chance(g, 80) || cols - start <= 0)
                row[k] = -1;
            else if (kw__k_chance(g, 40))
                row[k] = (int32_t)kw__k_rand_in(g, cols - start, cols + 16);
            else
                row[k] = (int32_t)kw__k_rand_in(g, 0, cols - start - 1);
        }
        sectors += pack_sectors(row, topk, start, (int64_t)r * cols, cols,
                                stamp, (uint32_t)r + 1);
    }
    free(stamp);
    kw__k_case_int(c, rows);
    kw__k_case_int(c, cols);
    if ((rc = kw__k_case_buf(c, "packed", KW__K_F32, (size_t)rows * topk * 2,
                             true, (void **)&out)) < 0)
        return rc;
    /* Positions read, pairs written, and the gathered scores in whole
     * 32-byte sectors (a DRAM read moves no less). */
    c->bytes = (size_t)rows * ((size_t)topk * 12 + (has_rs ? 4 : 0)) +
               sectors * 32;
    return 0;
}

/* An invalid id: negative, fractional, NaN, infinite or >= 2^31. */
static float bad_id(kw__k_rng *g)
{
    static const uint32_t bad[] = {
        0xbf800000u, /* -1.0 */ 0x3f000000u, /* 0.5 */
        0x7fc00000u, /* NaN */  0x7f800000u, /* inf */
        0xc0400000u, /* -3.0 */ 0x4f400000u, /* 3221225472.0 */
    };
    return bits_float(bad[kw__k_rand(g) % (sizeof(bad) / sizeof(bad[0]))]);
}

enum row_style { ROW_PLAIN, ROW_TIES, ROW_SPARSE, ROW_INVALID };

/* Fills one row of n (score, id) pairs in the given style. */
static void topk_fill_row(kw__k_rng *g, float *row, int32_t n, int32_t topk,
                          enum row_style st)
{
    /* Sparse rows keep fewer valid candidates than topk. */
    int64_t keep = topk > 1 ? kw__k_rand_in(g, 0, topk - 1) : 0;
    for (int32_t i = 0; i < n; i++) {
        float *p = row + 2 * (size_t)i;
        switch (st) {
        case ROW_PLAIN:
            p[0] = rand_score(g, 5);
            p[1] = kw__k_chance(g, 20)
                       ? -1.0f : (float)kw__k_rand_in(g, 0, (1 << 24) - 1);
            if (p[1] < 0)
                p[0] = -INFINITY; /* what the pack writes for an empty slot */
            break;
        case ROW_TIES: /* few distinct scores and ids: duplicates galore */
            p[0] = kw__k_chance(g, 150) ? rand_score(g, 1000)
                                        : (float)kw__k_rand_in(g, -2, 2) / 2.0f;
            p[1] = kw__k_chance(g, 100) ? bad_id(g)
                                        : (float)kw__k_rand_in(g, 0, 63);
            if (p[1] == 0.0f && kw__k_chance(g, 500))
                p[1] = -0.0f; /* a valid id 0 */
            break;
        case ROW_SPARSE:
            p[0] = rand_score(g, 100);
            p[1] = kw__k_rand_in(g, 0, n - 1) < keep
                       ? (float)kw__k_rand_in(g, 0, 1 << 20) : bad_id(g);
            break;
        case ROW_INVALID:
            p[0] = rand_score(g, 100);
            p[1] = bad_id(g);
            break;
        }
    }
}

int kw__k_gen_topk(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int32_t topk = (int32_t)c->fields[0], n = (int32_t)c->fields[1];
    const int32_t rows = (int32_t)s->rows;
    float *in;
    int32_t *out;
    int rc;
    if ((rc = kw__k_case_buf(c, "gathered", KW__K_F32, (size_t)rows * n * 2,
                             false, (void **)&in)) < 0)
        return rc;
    /* Large cases are benchmarks: keep them mostly plain, so they measure
     * realistic data; small ones lean on the edge cases. */
    const unsigned odd = (size_t)rows * n >= (1u << 20) ? 60 : 500;
    for (int32_t r = 0; r < rows; r++) {
        enum row_style st = ROW_PLAIN;
        if (kw__k_chance(g, odd))
            st = (enum row_style)kw__k_rand_in(g, ROW_TIES, ROW_INVALID);
        topk_fill_row(g, in + (size_t)r * n * 2, n, topk, st);
    }
    kw__k_case_int(c, rows);
    if ((rc = kw__k_case_buf(c, "out", KW__K_I32, (size_t)rows * topk, true,
                             (void **)&out)) < 0)
        return rc;
    c->bytes = (size_t)rows * ((size_t)n * 8 + (size_t)topk * 4);
    return 0;
}
