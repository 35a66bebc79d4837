/* gen_indexer.c: random inputs for the indexer families' checks: fp8
 * bytes over the whole e4m3 range (NaN excluded), signed weights, empty
 * and full windows, windows shorter than top-k, ties, -0.0 and NaN
 * scores, and rows of one repeated value (the top-k's slow path). */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ADD_IN(c, name, type, n, p)                                        \
    kw__k_case_buf((c), (name), (type), (size_t)(n), false, (void **)(p))
#define ADD_OUT(c, name, type, n, p)                                       \
    kw__k_case_buf((c), (name), (type), (size_t)(n), true, (void **)(p))

/* An e4m3 byte that is not NaN; zeros one time in 16. */
static uint8_t rand_fp8(kw__k_rng *g)
{
    if (kw__k_chance(g, 62))
        return kw__k_chance(g, 500) ? 0x80 : 0;
    uint8_t b;
    do
        b = (uint8_t)kw__k_rand(g);
    while ((b & 0x7f) == 0x7f);
    return b;
}

static float rand_unit(kw__k_rng *g)
{
    return (float)((double)(kw__k_rand(g) >> 11) / 9007199254740992.0);
}

static int fill_qw(kw_k_case *c, kw__k_rng *g, int64_t nq, int H, int D)
{
    uint8_t *q;
    float *w;
    int rc;
    if ((rc = ADD_IN(c, "q", KW__K_U8, nq * H * D, &q)) < 0 ||
        (rc = ADD_IN(c, "w", KW__K_F32, nq * H, &w)) < 0)
        return rc;
    for (int64_t i = 0; i < nq * H * D; i++)
        q[i] = rand_fp8(g);
    for (int64_t i = 0; i < nq * H; i++)
        w[i] = kw__k_chance(g, 50) ? 0.0f : 2.0f * rand_unit(g) - 1.0f;
    return 0;
}

static int fill_k(kw_k_case *c, kw__k_rng *g, int64_t rows, int D)
{
    uint8_t *k;
    float *sc;
    int rc;
    if ((rc = ADD_IN(c, "k", KW__K_U8, rows * D, &k)) < 0 ||
        (rc = ADD_IN(c, "k_scale", KW__K_F32, rows, &sc)) < 0)
        return rc;
    for (int64_t i = 0; i < rows * D; i++)
        k[i] = rand_fp8(g);
    for (int64_t i = 0; i < rows; i++)
        sc[i] = 0.001f + rand_unit(g);
    return 0;
}

/* Prefill windows: causal from a chunk start, empty, full, or random. */
static void prefill_windows(kw__k_rng *g, int32_t T, int32_t N, int32_t *ks,
                            int32_t *ke)
{
    for (int32_t t = 0; t < T; t++) {
        int64_t kind = kw__k_rand_in(g, 0, 9);
        if (kind == 0) { /* empty */
            ks[t] = ke[t] = (int32_t)kw__k_rand_in(g, 0, N);
        } else if (kind == 1) { /* everything */
            ks[t] = 0;
            ke[t] = N;
        } else if (kind < 6) { /* causal: the last T rows end at N */
            ks[t] = 0;
            int64_t e = (int64_t)N - T + t + 1;
            ke[t] = (int32_t)(e < 0 ? 0 : e > N ? N : e);
        } else {
            ks[t] = (int32_t)kw__k_rand_in(g, 0, N);
            ke[t] = (int32_t)kw__k_rand_in(g, ks[t], N);
        }
    }
}

static int gen_prefill(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int H = (int)c->fields[0], D = (int)c->fields[1];
    const int32_t T = (int32_t)s->rows, N = (int32_t)s->cols;
    const int32_t stride = N + (int32_t)kw__k_rand_in(g, 0, 3);
    int32_t *ks, *ke;
    float *out;
    int rc;
    if ((rc = fill_qw(c, g, T, H, D)) < 0 || (rc = fill_k(c, g, N, D)) < 0 ||
        (rc = ADD_IN(c, "ks", KW__K_I32, T, &ks)) < 0 ||
        (rc = ADD_IN(c, "ke", KW__K_I32, T, &ke)) < 0)
        return rc;
    prefill_windows(g, T, N, ks, ke);
    kw__k_case_int(c, T);
    kw__k_case_int(c, N);
    kw__k_case_int(c, stride);
    if ((rc = ADD_OUT(c, "logits", KW__K_F32, (int64_t)T * stride, &out)) < 0)
        return rc;
    c->bytes = (size_t)T * H * (D + 4) + (size_t)N * (D + 4) +
               (size_t)T * N * 4;
    return 0;
}

/* Decode: pages shuffled over the pool, row_end per query near the
 * request's length (speculative queries see one more row each), with
 * empty and full requests mixed in. */
static int gen_decode(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int H = (int)c->fields[0], D = (int)c->fields[1];
    const int32_t PR = (int32_t)c->fields[3], NN = (int32_t)c->fields[4];
    const int32_t B = (int32_t)s->batch, max_rows = (int32_t)s->cols;
    const int32_t width = (int32_t)((max_rows + PR - 1) / PR +
                                    kw__k_rand_in(g, 0, 2));
    const int64_t pages = (int64_t)B * width + 3;
    int32_t *bt, *re;
    float *out;
    int rc;
    if ((rc = fill_qw(c, g, (int64_t)B * NN, H, D)) < 0 ||
        (rc = fill_k(c, g, pages * PR, D)) < 0 ||
        (rc = ADD_IN(c, "block_table", KW__K_I32, (int64_t)B * width, &bt)) < 0 ||
        (rc = ADD_IN(c, "row_end", KW__K_I32, (int64_t)B * NN, &re)) < 0)
        return rc;
    for (int64_t i = 0; i < (int64_t)B * width; i++)
        bt[i] = (int32_t)i;
    for (int64_t i = (int64_t)B * width - 1; i > 0; i--) { /* shuffle */
        int64_t j = kw__k_rand_in(g, 0, i);
        int32_t t = bt[i];
        bt[i] = bt[j];
        bt[j] = t;
    }
    size_t krows = 0;
    for (int32_t b = 0; b < B; b++) {
        int64_t kind = kw__k_rand_in(g, 0, 7);
        int64_t len = kind == 0 ? 0 : kind == 1 ? max_rows
                                    : kw__k_rand_in(g, 0, max_rows);
        int64_t top = 0;
        for (int32_t i = 0; i < NN; i++) {
            int64_t e = len - (NN - 1 - i);
            re[(int64_t)b * NN + i] = (int32_t)(e < 0 ? 0 : e);
            top = e > top ? e : top;
        }
        krows += (size_t)top;
    }
    kw__k_case_int(c, B);
    kw__k_case_int(c, width);
    kw__k_case_int(c, max_rows);
    if ((rc = ADD_OUT(c, "logits", KW__K_F32, (int64_t)B * NN * max_rows,
                      &out)) < 0)
        return rc;
    c->bytes = krows * (D + 4) + (size_t)B * NN * (H * (D + 4) + max_rows * 4);
    return 0;
}

int kw__k_gen_logits(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    if (s->rows > (1 << 24) || s->batch > (1 << 16))
        return KW_EINVAL;
    return c->fields[2] ? gen_decode(c, s, g) : gen_prefill(c, s, g);
}

/* A bell-shaped logit in (-6, 6), finite, ties as rare as for floats. */
static float bell_logit(kw__k_rng *g)
{
    double x = 0;
    for (int i = 0; i < 4; i++)
        x += rand_unit(g);
    return (float)((x - 2.0) * 3.0);
}

/* A logit: mostly bell-shaped, sometimes a tie (quarters in [-2, 2]),
 * -0.0, +0.0, +-inf or a NaN of either sign. */
static float rand_logit(kw__k_rng *g)
{
    static const uint32_t sp[] = {0x7fc00000u, 0xffc00000u, 0x80000000u,
                                  0x00000000u, 0x7f800000u, 0xff800000u};
    float f;
    if (kw__k_chance(g, 30)) {
        memcpy(&f, &sp[kw__k_rand(g) % 6], 4);
        return f;
    }
    if (kw__k_chance(g, 200))
        return (float)kw__k_rand_in(g, -8, 8) / 4.0f;
    return bell_logit(g);
}

/* A ReLU-weighted score: +0.0 or -0.0 (97%), else |logit|. */
static float plateau_logit(kw__k_rng *g)
{
    if (!kw__k_chance(g, 30))
        return kw__k_chance(g, 500) ? 0.0f : -0.0f;
    return fabsf(rand_logit(g));
}

int kw__k_gen_itopk(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int32_t topk = (int32_t)c->fields[0];
    const bool win = c->fields[1] != 0;
    const int32_t rows = (int32_t)s->rows, cols = (int32_t)s->cols;
    float *lg;
    int32_t *a, *b = NULL, *out;
    int rc;
    if ((rc = ADD_IN(c, "logits", KW__K_F32, (int64_t)rows * cols, &lg)) < 0 ||
        (rc = ADD_IN(c, win ? "ks" : "row_end", KW__K_I32, rows, &a)) < 0 ||
        (rc = ADD_IN(c, "ke", KW__K_I32, win ? rows : 0, &b)) < 0)
        return rc;
    for (int32_t r = 0; r < rows; r++) {
        float *row = lg + (int64_t)r * cols;
        int64_t kind = kw__k_rand_in(g, 0, 7);
        float same = rand_logit(g);
        /* kind 0: one repeated value; kind 4: a ReLU plateau, mostly
         * +0.0 and -0.0 (one tie), the rest positive; kind 5: bell-shaped
         * only, as the indexer's own scores (no infinity widens the
         * winners' range, so indexer_topk sorts them by bucket) */
        for (int32_t i = 0; i < cols; i++)
            row[i] = kind == 0 ? same
                     : kind == 4 ? plateau_logit(g)
                     : kind == 5 ? bell_logit(g)
                                 : rand_logit(g);
        int32_t st = win && kind != 1 ? (int32_t)kw__k_rand_in(g, 0, cols) : 0;
        int32_t en = kind == 1 ? cols /* the whole row */
                     : kind == 2 ? st /* empty */
                     : kind == 3 ? (int32_t)(st + kw__k_rand_in(
                                       g, 0, topk < cols - st ? topk : cols - st))
                                 : (int32_t)kw__k_rand_in(g, st, cols);
        a[r] = win ? st : en;
        if (win)
            b[r] = en;
    }
    kw__k_case_int(c, rows);
    kw__k_case_int(c, cols);
    if ((rc = ADD_OUT(c, "topk_pos", KW__K_I32, (int64_t)rows * topk, &out)) < 0)
        return rc;
    c->bytes = (size_t)rows * ((size_t)cols * 4 + (size_t)topk * 4 + 8);
    return 0;
}
