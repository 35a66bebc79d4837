/* gen.c: random inputs for the request-indexed families' checks.  Each
 * generator adds the kernel's parameters in order (kw_kernels.h), picks
 * runtime scalars inside the classes the key names, and mixes edge cases
 * (empty requests, -1 entries, blocks past the table, padding tokens)
 * into otherwise plausible data. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <stdlib.h>

#define ADD_IN(c, name, type, n, p)                                        \
    kw__k_case_buf((c), (name), (type), (size_t)(n), false, (void **)(p))
#define ADD_OUT(c, name, type, n, p)                                       \
    kw__k_case_buf((c), (name), (type), (size_t)(n), true, (void **)(p))

int64_t kw__k_rep_pick(kw__k_rng *g, int64_t rep, int64_t lo, int64_t hi)
{
    if (lo < 0)
        lo = 0;
    if (lo > hi)
        return -1;
    if (rep == 1)
        return lo <= 1 && 1 <= hi ? 1 : -1;
    if (rep == 16) {
        int64_t a = (lo + 15) / 16, b = hi / 16;
        return a <= b ? 16 * kw__k_rand_in(g, a, b) : -1;
    }
    for (int tries = 0; tries < 64; tries++) {
        int64_t v = kw__k_rand_in(g, lo, hi);
        if (v != 1 && v % 16 != 0)
            return v;
    }
    for (int64_t v = lo; v <= hi; v++)
        if (v != 1 && v % 16 != 0)
            return v;
    return -1;
}

/* Splits total tokens over n requests (about 1 in 8 empty) into
 * query_start_loc qsl[0..n], and gives each request a context so that
 * seq_lens[b] = q_len + context, with context in [0, max_len - q_len]. */
static void split_requests(kw__k_rng *g, int64_t total, int32_t n,
                           int64_t max_len, int32_t *qsl, int32_t *seq_lens)
{
    int64_t *w = malloc((size_t)n * sizeof(*w)), sum = 0;
    for (int32_t b = 0; b < n; b++) {
        int64_t x = kw__k_chance(g, 125) ? 0 : kw__k_rand_in(g, 1, 1000);
        sum += x;
        if (w)
            w[b] = x;
    }
    int64_t given = 0, acc = 0;
    qsl[0] = 0;
    for (int32_t b = 0; b < n; b++) {
        /* Cumulative rounding keeps sum(q_len) == total exactly. */
        acc += w ? w[b] : 1;
        int64_t upto = sum > 0 && w ? total * acc / sum
                                    : total * (b + 1) / n;
        int64_t q_len = upto - given;
        given = upto;
        qsl[b + 1] = (int32_t)given;
        int64_t room = max_len > q_len ? max_len - q_len : 0;
        seq_lens[b] = (int32_t)(q_len + kw__k_rand_in(g, 0, room));
    }
    free(w);
}

/* The DCP geometry of a prefill_chunk_metadata key: values in the classes
 * of dcp_world (f[3]), dcp_rank (f[2]) and dcp_interleave (f[4]). */
static int pcm_geometry(kw__k_rng *g, const int64_t *f, int32_t *w,
                        int32_t *r, int32_t *il)
{
    int64_t wv = f[3] == 2 ? kw__k_rep_pick(g, 2, f[2] == 2 ? 3 : 2, 9)
                           : (f[3] == 16 ? 16 : 1);
    int64_t rv = kw__k_rep_pick(g, f[2], 0, wv - 1);
    int64_t iv = f[4] == 16 ? 16 * kw__k_rand_in(g, 1, 2)
                            : kw__k_rep_pick(g, f[4], 1, 8);
    if (rv < 0 || iv < 0)
        return KW_EINVAL; /* e.g. world class 1 with rank class 1 */
    *w = (int32_t)wv, *r = (int32_t)rv, *il = (int32_t)iv;
    return 0;
}

/* Compressed K rows of each request: usually this rank's share of its
 * compressed length, sometimes none. */
static void pcm_fill_cu_k(kw__k_rng *g, const int32_t *seq_lens, int32_t n,
                          int32_t ratio, int32_t w, int32_t r, int32_t il,
                          int32_t *cu_k)
{
    cu_k[0] = 0;
    for (int32_t b = 0; b < n; b++) {
        uint32_t k = kw__k_dcp_share((uint32_t)(seq_lens[b] / ratio),
                                     (uint32_t)r, (uint32_t)w, (uint32_t)il);
        cu_k[b + 1] = cu_k[b] + (kw__k_chance(g, 100) ? 0 : (int32_t)k);
    }
}

int kw__k_gen_pcm(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int64_t *f = c->fields;
    int32_t w, r, il, *qsl, *seq, *cu_k, *out;
    int rc = pcm_geometry(g, f, &w, &r, &il);
    if (rc < 0)
        return rc;
    /* A slice inside the class of each end; an empty one when the classes
     * allow nothing else (start class 2 with stop class 1). */
    int64_t start = kw__k_rep_pick(g, f[0], 0, 40);
    int64_t stop = kw__k_rep_pick(g, f[1], start + 1, start + 1 + s->rows);
    if (stop < 0)
        stop = kw__k_rep_pick(g, f[1], 0, start + 16);
    if (start < 0 || stop < 0)
        return KW_EINVAL;
    int64_t total_q = s->rows > stop ? s->rows : stop;
    int32_t nreq = s->batch > 0 ? (int32_t)s->batch : 1;
    int64_t rows = stop > start ? stop - start : 0;
    if ((rc = ADD_IN(c, "query_start_loc", KW__K_I32, nreq + 1, &qsl)) < 0 ||
        (rc = ADD_IN(c, "seq_lens", KW__K_I32, nreq, &seq)) < 0 ||
        (rc = ADD_IN(c, "cu_k", KW__K_I32, nreq + 1, &cu_k)) < 0)
        return rc;
    c->bufs[1].misalign = f[7] ? 0 : 4; /* uncompressed_seq_lens_aligned */
    split_requests(g, total_q, nreq, s->max_len, qsl, seq);
    pcm_fill_cu_k(g, seq, nreq, (int32_t)f[6], w, r, il, cu_k);
    int32_t total_k = cu_k[nreq];
    const int32_t ints[] = {nreq, (int32_t)start, (int32_t)stop, r, w, il,
                            total_k};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        kw__k_case_int(c, ints[i]);
    if ((rc = ADD_OUT(c, "ks", KW__K_I32, rows, &out)) < 0 ||
        (rc = ADD_OUT(c, "ke", KW__K_I32, rows, &out)) < 0 ||
        (rc = ADD_OUT(c, "token_to_seq", KW__K_I32, total_k, &out)) < 0)
        return rc;
    c->bytes = (size_t)(rows * 8 + (int64_t)total_k * 4 + (3 * nreq + 2) * 4);
    return 0;
}

/* Block-table width for requests up to max_len tokens: enough pages for
 * every state this rank stores, or (half the time, on small shapes) a
 * quarter fewer so that some blocks fall past the table. */
static int32_t table_width(kw__k_rng *g, int64_t states, int64_t per_page,
                           bool small)
{
    int64_t need = states / per_page + 1;
    if (small && kw__k_chance(g, 500))
        need = need * 3 / 4;
    return (int32_t)(need < 1 ? 1 : need);
}

static void fill_pages(kw__k_rng *g, int32_t *bt, size_t n, int32_t max_page)
{
    for (size_t i = 0; i < n; i++)
        bt[i] = kw__k_chance(g, 10) ? -1
                                    : (int32_t)kw__k_rand_in(g, 0, max_page);
}

/* The runtime block_size (states per page) of a compressed_slot_mapping
 * key, in the class of f[2]. */
static int32_t csm_block_size(kw__k_rng *g, const int64_t *f)
{
    if (f[2] == 16)
        return 16 * (int32_t)kw__k_rand_in(g, 1, 2);
    return (int32_t)kw__k_rep_pick(g, f[2], 1, 12);
}

int kw__k_gen_csm(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int64_t *f = c->fields;
    const int32_t ratio = (int32_t)f[0], w = (int32_t)f[3];
    int64_t *slots;
    int32_t *qsl, *seq, *bt, bs = csm_block_size(g, f);
    int32_t ntok = (int32_t)s->rows;
    int32_t nreq = s->batch > 0 ? (int32_t)s->batch : 1;
    int64_t used = ntok - ntok / 32 - (ntok > 4 ? kw__k_rand_in(g, 0, 3) : 0);
    int rc;
    if ((rc = ADD_IN(c, "slot_mapping", KW__K_I64, ntok, &slots)) < 0 ||
        (rc = ADD_IN(c, "query_start_loc", KW__K_I32, nreq + 1, &qsl)) < 0 ||
        (rc = ADD_IN(c, "seq_lens", KW__K_I32, nreq, &seq)) < 0)
        return rc;
    split_requests(g, used, nreq, s->max_len, qsl, seq);
    int64_t longest = 0;
    for (int32_t b = 0; b < nreq; b++)
        longest = seq[b] > longest ? seq[b] : longest;
    int32_t width = table_width(g, longest / ratio, (int64_t)bs * w,
                                ntok < 100000);
    size_t nbt = (size_t)nreq * width;
    if ((rc = ADD_IN(c, "block_table", KW__K_I32, nbt, &bt)) < 0)
        return rc;
    fill_pages(g, bt, nbt, 1 << 20);
    for (int32_t t = 0; t < ntok; t++)
        slots[t] = t >= used || kw__k_chance(g, 80)
                       ? -1 : kw__k_rand_in(g, 0, (int64_t)1 << 40);
    kw__k_case_int(c, ntok);
    kw__k_case_int(c, nreq);
    kw__k_case_int(c, width);
    kw__k_case_int(c, bs);
    int64_t *out;
    if ((rc = ADD_OUT(c, "out", KW__K_I64, ntok, &out)) < 0)
        return rc;
    /* slot_mapping is read (W == 1) only at tokens that finish a state:
     * counted in 32-byte sectors, the least DRAM moves. */
    int64_t sparse = ((int64_t)ntok / ratio + 1) * 32;
    int64_t slot_rd = w > 1 ? 0 : (sparse < 8LL * ntok ? sparse : 8LL * ntok);
    c->bytes = (size_t)(8LL * ntok + slot_rd + (2LL * nreq + 1) * 4);
    return 0;
}

/* block_table_stride's runtime width: near `need`, in class rep. */
static int32_t ic_width(int64_t rep, int64_t need)
{
    if (rep == 1)
        return 1;
    if (rep == 16)
        return (int32_t)((need + 15) / 16 * 16);
    if (need <= 2)
        return 2;
    return (int32_t)(need % 16 == 0 ? need + 1 : need);
}

/* One row of top-k positions: empty (all -1), or mostly positions inside
 * a random request length with -1s, duplicates and a few positions past
 * the block table (up to max_len * 5/4). */
static void ic_fill_row(kw__k_rng *g, int32_t *row, int32_t topk,
                        int64_t max_len)
{
    bool empty = kw__k_chance(g, 40);
    int64_t len = kw__k_rand_in(g, 1, max_len);
    for (int32_t k = 0; k < topk; k++) {
        int64_t v;
        if (empty || kw__k_chance(g, 100))
            v = -1;
        else if (k > 0 && kw__k_chance(g, 50))
            v = row[k - 1];
        else if (kw__k_chance(g, 30))
            v = kw__k_rand_in(g, max_len, max_len + max_len / 4);
        else
            v = kw__k_rand_in(g, 0, len - 1);
        row[k] = (int32_t)v;
    }
}

/* prefill_req (-1 for about 70% of rows) and workspace_start. */
static void ic_fill_prefill(kw__k_rng *g, int32_t *preq, int32_t nrows,
                            int32_t *ws, int32_t nprefill)
{
    for (int32_t r = 0; r < nrows; r++)
        preq[r] = kw__k_chance(g, 300)
                      ? (int32_t)kw__k_rand_in(g, 0, nprefill - 1) : -1;
    for (int32_t p = 0; p < nprefill; p++)
        ws[p] = (int32_t)kw__k_rand_in(g, 0, 1 << 20);
}

int kw__k_gen_ic(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    const int64_t *f = c->fields;
    const int32_t bs = (int32_t)f[0], stride = (int32_t)f[1];
    const bool has_ws = f[5], count = f[6];
    const int32_t w = (int32_t)f[8], topk = (int32_t)f[11];
    const int32_t nrows = (int32_t)s->rows;
    const int32_t nreq = s->batch > 0 ? (int32_t)s->batch : 1;
    const int32_t nprefill = has_ws ? (nreq + 3) / 4 : 0;
    const int64_t max_len = s->max_len > 0 ? s->max_len : 1;
    int32_t width = ic_width(f[12], table_width(g, max_len, (int64_t)bs * w,
                                                nrows < 4096));
    int32_t *req, *bt, *pos, *preq, *ws, *out;
    int rc;
    const size_t nbt = (size_t)nreq * width, npos = (size_t)nrows * topk;
    if ((rc = ADD_IN(c, "req_id", KW__K_I32, nrows, &req)) < 0 ||
        (rc = ADD_IN(c, "block_table", KW__K_I32, nbt, &bt)) < 0 ||
        (rc = ADD_IN(c, "topk_pos", KW__K_I32, npos, &pos)) < 0 ||
        (rc = ADD_IN(c, "prefill_req", KW__K_I32, has_ws ? nrows : 0,
                     &preq)) < 0 ||
        (rc = ADD_IN(c, "workspace_start", KW__K_I32, nprefill, &ws)) < 0)
        return rc;
    /* Pages small enough that page * stride + offset stays in int32. */
    int64_t max_page = (INT32_MAX - (int64_t)bs) / stride;
    fill_pages(g, bt, nbt,
               (int32_t)(max_page < (1 << 15) ? max_page : (1 << 15)));
    for (int32_t r = 0; r < nrows; r++) {
        req[r] = (int32_t)kw__k_rand_in(g, 0, nreq - 1);
        ic_fill_row(g, pos + (size_t)r * topk, topk, max_len);
    }
    if (has_ws)
        ic_fill_prefill(g, preq, nrows, ws, nprefill);
    /* A rank stride that keeps owner * stride + start + l in int32. */
    int64_t room = (INT32_MAX - (1LL << 21) - 2 * max_len) / w;
    int64_t ws_stride = kw__k_rand_in(g, 1, room < 1 << 20 ? room : 1 << 20);
    const int32_t ints[] = {nrows, nreq, nprefill, width, (int32_t)ws_stride};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        kw__k_case_int(c, ints[i]);
    if ((rc = ADD_OUT(c, "out", KW__K_I32, npos, &out)) < 0 ||
        (rc = ADD_OUT(c, "valid_count", KW__K_I32, count ? nrows : 0,
                      &out)) < 0)
        return rc;
    c->bytes = (size_t)nrows * ((size_t)topk * 8 + 4 + (has_ws ? 4 : 0) +
                                (count ? 4 : 0));
    return 0;
}
