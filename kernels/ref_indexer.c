/* ref_indexer.c: CPU references of the indexer families (spec/kernels.md,
 * indexer_logits and indexer_topk): the logits accumulated in double, the
 * top-k by a full sort in the spec's order. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The exact value of an fp8 e4m3 byte (S.EEEE.MMM, bias 7, no infinity,
 * S.1111.111 is NaN). */
static double fp8_value(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7)
        return NAN;
    v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}

/* One score and its absolute-value bound: query qv (H x D doubles, decoded),
 * weights w, K row kr (D bytes) and its scale. */
static float score(const kw_k_logits_args *a, const double *qv,
                   const float *w, const uint8_t *kr, float scale, double *m)
{
    const int H = a->heads, D = a->head_dim;
    double kv[512], sum = 0, mag = 0;
    for (int d = 0; d < D; d++)
        kv[d] = fp8_value(kr[d]);
    for (int h = 0; h < H; h++) {
        double dot = 0, adot = 0;
        for (int d = 0; d < D; d++) {
            dot += qv[h * D + d] * kv[d];
            adot += fabs(qv[h * D + d] * kv[d]);
        }
        sum += (double)w[h] * (dot > 0 ? dot : 0);
        mag += fabs((double)w[h]) * adot;
    }
    if (m)
        *m = fabs((double)scale) * mag;
    return (float)((double)scale * sum);
}

/* Decodes the H x D bytes of one query into qv. */
static void decode_query(const kw_k_logits_args *a, int64_t i, double *qv)
{
    const int64_t n = (int64_t)a->heads * a->head_dim;
    for (int64_t j = 0; j < n; j++)
        qv[j] = fp8_value(a->q[i * n + j]);
}

static bool prefill_ok(const kw_k_logits_args *a)
{
    if (a->num_rows < 0 || a->num_k < 0 || a->stride < a->num_k ||
        (a->num_rows > 0 && (!a->ks || !a->ke)))
        return false;
    for (int32_t t = 0; t < a->num_rows; t++)
        if (a->ks[t] < 0 || a->ks[t] > a->ke[t] || a->ke[t] > a->num_k)
            return false;
    return true;
}

static int ref_prefill(const kw_k_logits_args *a, double *qv, double *mag)
{
    const int D = a->head_dim;
    if (!prefill_ok(a))
        return KW_EINVAL;
    for (int32_t t = 0; t < a->num_rows; t++) {
        float *out = a->logits + (int64_t)t * a->stride;
        double *m = mag ? mag + (int64_t)t * a->stride : NULL;
        decode_query(a, t, qv);
        for (int32_t n = 0; n < a->num_k; n++) {
            if (m)
                m[n] = 0;
            if (n < a->ks[t] || n >= a->ke[t]) {
                out[n] = -INFINITY;
                continue;
            }
            out[n] = score(a, qv, a->w + (int64_t)t * a->heads,
                           a->k + (int64_t)n * D, a->k_scale[n],
                           m ? &m[n] : NULL);
        }
    }
    return 0;
}

static bool decode_ok(const kw_k_logits_args *a)
{
    int64_t q = (int64_t)a->num_reqs * a->next_n;
    if (a->num_reqs < 0 || a->width < 0 || a->max_rows < 0 || a->page_rows < 1 ||
        (q > 0 && (!a->row_end || !a->block_table)))
        return false;
    for (int64_t i = 0; i < q; i++)
        if (a->row_end[i] < 0 || a->row_end[i] > a->max_rows ||
            a->row_end[i] > (int64_t)a->width * a->page_rows)
            return false;
    for (int64_t i = 0; i < (int64_t)a->num_reqs * a->width; i++)
        if (a->block_table[i] < 0 ||
            (a->num_pages >= 0 && a->block_table[i] >= a->num_pages))
            return false;
    return true;
}

static int ref_decode(const kw_k_logits_args *a, double *qv, double *mag)
{
    const int D = a->head_dim, PR = a->page_rows;
    if (!decode_ok(a))
        return KW_EINVAL;
    for (int64_t i = 0; i < (int64_t)a->num_reqs * a->next_n; i++) {
        const int32_t *bt = a->block_table + (i / a->next_n) * a->width;
        float *out = a->logits + i * a->max_rows;
        double *m = mag ? mag + i * a->max_rows : NULL;
        decode_query(a, i, qv);
        for (int32_t j = 0; j < a->max_rows; j++) {
            if (m)
                m[j] = 0;
            if (j >= a->row_end[i]) {
                out[j] = -INFINITY;
                continue;
            }
            int64_t slot = (int64_t)bt[j / PR] * PR + j % PR;
            out[j] = score(a, qv, a->w + i * a->heads, a->k + slot * D,
                           a->k_scale[slot], m ? &m[j] : NULL);
        }
    }
    return 0;
}

int kw_k_ref_indexer_logits(const kw_k_logits_args *a, double *mag)
{
    if (!a || a->heads < 1 || a->heads > 256 || a->head_dim < 32 ||
        a->head_dim > 512 || a->head_dim % 32 != 0 || !a->logits ||
        (!a->paged && (!a->q || !a->w || !a->k || !a->k_scale) &&
         a->num_rows > 0))
        return KW_EINVAL;
    double *qv = malloc((size_t)a->heads * a->head_dim * sizeof *qv);
    if (!qv)
        return KW_ENOMEM;
    int rc = a->paged ? ref_decode(a, qv, mag) : ref_prefill(a, qv, mag);
    free(qv);
    return rc;
}

/* ---- indexer_topk ---- */

/* A score's rank key: larger is better, NaN lowest, -0.0 as +0.0. */
static uint32_t mono(float s)
{
    uint32_t u;
    if (isnan(s))
        return 0;
    memcpy(&u, &s, 4);
    if (u == 0x80000000u)
        u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Sorts (key << 32 | ~pos) descending: higher key, then lower position. */
static int cmp_desc(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a < b) - (a > b);
}

int kw_k_ref_indexer_topk(const kw_k_itopk_args *a)
{
    if (!a || a->topk < 1 || a->num_rows < 0 || a->stride < 0 ||
        (a->num_rows > 0 && (!a->logits || !a->topk_pos ||
                             (a->windowed ? !a->ks || !a->ke : !a->row_end))))
        return KW_EINVAL;
    for (int32_t r = 0; r < a->num_rows; r++) {
        int32_t s = a->windowed ? a->ks[r] : 0;
        int32_t e = a->windowed ? a->ke[r] : a->row_end[r];
        if (s < 0 || e < s || e > a->stride)
            return KW_EINVAL;
    }
    uint64_t *keys = malloc(((size_t)a->stride + 1) * sizeof *keys);
    if (!keys)
        return KW_ENOMEM;
    for (int32_t r = 0; r < a->num_rows; r++) {
        int32_t s = a->windowed ? a->ks[r] : 0;
        int32_t e = a->windowed ? a->ke[r] : a->row_end[r];
        const float *row = a->logits + (int64_t)r * a->stride + s;
        int32_t *out = a->topk_pos + (int64_t)r * a->topk;
        int32_t len = e - s;
        for (int32_t i = 0; i < len; i++)
            keys[i] = (uint64_t)mono(row[i]) << 32 | (0xffffffffu - (uint32_t)i);
        qsort(keys, (size_t)len, sizeof *keys, cmp_desc);
        for (int32_t i = 0; i < a->topk; i++)
            out[i] = i < len ? (int32_t)(0xffffffffu - (uint32_t)keys[i]) : -1;
    }
    free(keys);
    return 0;
}
