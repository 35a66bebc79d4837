/* test_kref.c: the CPU references of kernels/ (kw_kernels.h) against
 * expected values worked out by hand from spec/kernels.md; each test's
 * comment shows the arithmetic.  No GPU, no NVRTC. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kw_err.h"
#include "kw_kernels.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void assert_i32s(const int32_t *got, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "[%zu]: got %d, want %d", i, got[i],
                     want[i]);
}

static void assert_i64s(const int64_t *got, const int64_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "[%zu]: got %lld, want %lld", i,
                     (long long)got[i], (long long)want[i]);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- DCP striping, seen through index_conversion's prefill rows, whose
 * output is owner * workspace_rank_stride + workspace_start + local. ---- */

/* One prefill row of the given positions; out = owner*1000 + ws + l. */
static void ic_prefill_row(int32_t w, int32_t il, const int32_t *pos,
                           int32_t n, int32_t ws, int32_t *out)
{
    int32_t req = 0, preq = 0, cnt = -7;
    kw_k_ic_args a = {
        .block_size = 16, .block_stride_rows = 16,
        .has_prefill_workspace = true, .count_valid = true,
        .dcp_size = w, .dcp_rank = 0, .dcp_interleave = il, .topk = n,
        .num_rows = 1, .num_reqs = 1, .num_prefill = 1, .width = 1,
        .workspace_rank_stride = 1000, .req_id = &req,
        .block_table = &req, .topk_pos = pos, .prefill_req = &preq,
        .workspace_start = &ws, .out = out, .valid_count = &cnt,
    };
    cr_assert_eq(kw_k_ref_index_conversion(&a), 0);
}

Test(kref, dcp_w2_i1_alternates_tokens_between_ranks)
{
    /* I=1, W=2: owner = t % 2, local = t / 2. */
    const int32_t pos[] = {0, 1, 2, 3, 4, 5};
    const int32_t want[] = {0, 1000, 1, 1001, 2, 1002};
    int32_t out[6];
    ic_prefill_row(2, 1, pos, 6, 0, out);
    assert_i32s(out, want, 6);
}

Test(kref, dcp_w4_i16_keeps_runs_of_16_and_wraps_after_64)
{
    /* owner = (t/16)%4, local = (t/64)*16 + t%16:
     * 15 -> (0,15), 16 -> (1,0), 31 -> (1,15), 32 -> (2,0), 63 -> (3,15),
     * 64 -> (0,16), 79 -> (0,31), 80 -> (1,16); plus workspace_start 5. */
    const int32_t pos[] = {0, 15, 16, 31, 32, 63, 64, 79, 80};
    const int32_t want[] = {5, 20, 1005, 1020, 2005, 3020, 21, 36, 1021};
    int32_t out[9];
    ic_prefill_row(4, 16, pos, 9, 5, out);
    assert_i32s(out, want, 9);
}

Test(kref, dcp_w2_i16_run_boundary_at_16_and_32)
{
    /* W=2, I=16: 15 -> (0,15), 16 -> (1,0), 31 -> (1,15), 32 -> (0,16). */
    const int32_t pos[] = {15, 16, 31, 32};
    const int32_t want[] = {15, 1000, 1015, 16};
    int32_t out[4];
    ic_prefill_row(2, 16, pos, 4, 0, out);
    assert_i32s(out, want, 4);
}

/* ---- prefill_chunk_metadata ---- */

/* One request of 3 query tokens at positions 99..101 (seq_len 102), so
 * n = 100, 101, 102 before the DCP share; 4 compressed K rows. */
static void pcm_share_case(int32_t w, int32_t r, int32_t il,
                           const int32_t want_ke[3])
{
    const int32_t qsl[] = {0, 3}, seq[] = {102}, cu_k[] = {0, 4};
    int32_t ks[3], ke[3], t2s[4];
    kw_k_pcm_args a = {
        .compress_ratio = 1, .num_reqs = 1, .query_start_loc = qsl,
        .seq_lens = seq, .cu_k = cu_k, .slice_start = 0, .slice_stop = 3,
        .dcp_rank = r, .dcp_world = w, .dcp_interleave = il,
        .ks = ks, .ke = ke, .token_to_seq = t2s,
    };
    cr_assert_eq(kw_k_ref_prefill_chunk_metadata(&a), 0);
    const int32_t zeros[] = {0, 0, 0, 0};
    assert_i32s(ks, zeros, 3);
    assert_i32s(ke, want_ke, 3);
    assert_i32s(t2s, zeros, 4);
}

Test(kref, prefill_share_w4_i16_gives_rank2_the_partial_run)
{
    /* n=100: base = 100/16/4*16 = 16, rem = 36; rank 2: 16 + clamp(36-32)
     * = 20 (tokens 32..47 and 96..99).  n=101 -> 21, n=102 -> 22. */
    const int32_t want[] = {20, 21, 22};
    pcm_share_case(4, 2, 16, want);
}

Test(kref, prefill_share_w4_i16_gives_rank3_only_full_runs)
{
    /* rank 3: 16 + clamp(36-48, 0, 16) = 16 for n = 100..102. */
    const int32_t want[] = {16, 16, 16};
    pcm_share_case(4, 3, 16, want);
}

Test(kref, prefill_share_w2_i1_rounds_up_on_rank0_down_on_rank1)
{
    /* W=2, I=1: rank 0 holds ceil(n/2), rank 1 floor(n/2). */
    const int32_t r0[] = {50, 51, 51}, r1[] = {50, 50, 51};
    pcm_share_case(2, 0, 1, r0);
    pcm_share_case(2, 1, 1, r1);
}

Test(kref, prefill_metadata_slices_queries_and_skips_empty_requests)
{
    /* Requests: b0 queries 0..1 (seq 10, start_pos 8), b1 none (seq 4),
     * b2 queries 2..4 (seq 7, start_pos 4); ratio 4.  Slice [1, 4):
     * q1 = b0 j1: n = (8+1+1)/4 = 2 -> [0, 2); q2 = b2 j0: n = 5/4 = 1 ->
     * [cu_k[2], +1) = [2, 3); q3 = b2 j1: n = 6/4 = 1 -> [2, 3).
     * K rows 0,1 belong to b0, row 2 to b2 (b1 has none). */
    const int32_t qsl[] = {0, 2, 2, 5}, seq[] = {10, 4, 7};
    const int32_t cu_k[] = {0, 2, 2, 3};
    int32_t ks[3], ke[3], t2s[3];
    kw_k_pcm_args a = {
        .compress_ratio = 4, .num_reqs = 3, .query_start_loc = qsl,
        .seq_lens = seq, .cu_k = cu_k, .slice_start = 1, .slice_stop = 4,
        .dcp_rank = 0, .dcp_world = 1, .dcp_interleave = 1,
        .ks = ks, .ke = ke, .token_to_seq = t2s,
    };
    cr_assert_eq(kw_k_ref_prefill_chunk_metadata(&a), 0);
    const int32_t want_ks[] = {0, 2, 2}, want_ke[] = {2, 3, 3};
    const int32_t want_t2s[] = {0, 0, 2};
    assert_i32s(ks, want_ks, 3);
    assert_i32s(ke, want_ke, 3);
    assert_i32s(t2s, want_t2s, 3);
}

Test(kref, prefill_metadata_rejects_slice_past_queries_and_bad_offsets)
{
    const int32_t qsl[] = {0, 2}, seq[] = {5}, cu_k[] = {0, 1};
    const int32_t bad_cu[] = {0, -1};
    int32_t ks[4], ke[4], t2s[1];
    kw_k_pcm_args a = {
        .compress_ratio = 1, .num_reqs = 1, .query_start_loc = qsl,
        .seq_lens = seq, .cu_k = cu_k, .slice_start = 0, .slice_stop = 3,
        .dcp_world = 1, .dcp_interleave = 1,
        .ks = ks, .ke = ke, .token_to_seq = t2s,
    };
    cr_assert_eq(kw_k_ref_prefill_chunk_metadata(&a), KW_EINVAL);
    a.slice_stop = 2;
    cr_assert_eq(kw_k_ref_prefill_chunk_metadata(&a), 0);
    a.cu_k = bad_cu;
    cr_assert_eq(kw_k_ref_prefill_chunk_metadata(&a), KW_EINVAL);
    a.cu_k = cu_k;
    a.dcp_rank = 1; /* rank must be below the world */
    cr_assert_eq(kw_k_ref_prefill_chunk_metadata(&a), KW_EINVAL);
}

/* ---- compressed_slot_mapping ---- */

/* Ratio 4, 2 states per page, W = 1.  b0: positions 0..3 (tokens 0..3),
 * b1: positions 12..15 (tokens 4..7); tokens 8, 9 are padding.  Only
 * positions 3 and 15 finish a state: state 0 -> page bt[0][0] = 5, slot
 * 5*2+0 = 10; state 3 -> block 1, offset 1 -> page bt[1][1] = 3, slot 7. */
static int csm_w1(int64_t slot3, int32_t seq1, int64_t out[10])
{
    const int32_t qsl[] = {0, 4, 8}, seq[] = {4, seq1};
    const int32_t bt[] = {5, 9, 7, 3};
    int64_t slots[10] = {10, 11, 12, slot3, 14, 15, 16, 17, -1, -1};
    kw_k_csm_args a = {
        .compress_ratio = 4, .dcp_world = 1, .dcp_rank = 0,
        .dcp_interleave = 1, .num_tokens = 10, .num_reqs = 2, .width = 2,
        .block_size = 2, .slot_mapping = slots, .query_start_loc = qsl,
        .seq_lens = seq, .block_table = bt, .out = out,
    };
    return kw_k_ref_compressed_slot_mapping(&a);
}

Test(kref, slot_mapping_writes_state_finishing_tokens_only)
{
    int64_t out[10];
    const int64_t want[] = {-1, -1, -1, 10, -1, -1, -1, 7, -1, -1};
    cr_assert_eq(csm_w1(13, 16, out), 0);
    assert_i64s(out, want, 10);
}

Test(kref, slot_mapping_without_dcp_drops_padding_slots)
{
    int64_t out[10];
    const int64_t want[] = {-1, -1, -1, -1, -1, -1, -1, 7, -1, -1};
    cr_assert_eq(csm_w1(-1, 16, out), 0);
    assert_i64s(out, want, 10);
}

Test(kref, slot_mapping_drops_blocks_past_the_table_width)
{
    /* b1 at positions 16..19: position 19 is state 4, block 2 >= width 2. */
    int64_t out[10];
    const int64_t want[] = {-1, -1, -1, 10, -1, -1, -1, -1, -1, -1};
    cr_assert_eq(csm_w1(13, 20, out), 0);
    assert_i64s(out, want, 10);
}

Test(kref, slot_mapping_under_dcp_keeps_own_states_and_ignores_slots)
{
    /* Ratio 2, W=2, R=1, I=1, 2 states per page; positions 0..15, every
     * own slot -1 (DCP: another rank's marker, ignored).  Odd positions
     * finish states 0..7; v = state % 4 is rank 1's when odd; local state
     * (state/4)*2 + v/2: 1->0, 3->1, 5->2, 7->3; pages bt = {4, 6}:
     * 4*2+0, 4*2+1, 6*2+0, 6*2+1 at positions 3, 7, 11, 15. */
    const int32_t qsl[] = {0, 16}, seq[] = {16}, bt[] = {4, 6};
    int64_t slots[16], out[16];
    for (int i = 0; i < 16; i++)
        slots[i] = -1;
    kw_k_csm_args a = {
        .compress_ratio = 2, .dcp_world = 2, .dcp_rank = 1,
        .dcp_interleave = 1, .num_tokens = 16, .num_reqs = 1, .width = 2,
        .block_size = 2, .slot_mapping = slots, .query_start_loc = qsl,
        .seq_lens = seq, .block_table = bt, .out = out,
    };
    cr_assert_eq(kw_k_ref_compressed_slot_mapping(&a), 0);
    const int64_t want[] = {-1, -1, -1, 8,  -1, -1, -1, 9,
                            -1, -1, -1, 12, -1, -1, -1, 13};
    assert_i64s(out, want, 16);
}

Test(kref, slot_mapping_under_dcp_interleave2_stripes_state_pairs)
{
    /* Ratio 1, W=2, R=1, I=2, 4 states per page: states 2,3 and 6,7 are
     * rank 1's; local (s/8)*4 + (v/4)*2 + v%2 = 0, 1, 2, 3; page 3:
     * slots 12..15. */
    const int32_t qsl[] = {0, 8}, seq[] = {8}, bt[] = {3};
    int64_t slots[8] = {0}, out[8];
    kw_k_csm_args a = {
        .compress_ratio = 1, .dcp_world = 2, .dcp_rank = 1,
        .dcp_interleave = 2, .num_tokens = 8, .num_reqs = 1, .width = 1,
        .block_size = 4, .slot_mapping = slots, .query_start_loc = qsl,
        .seq_lens = seq, .block_table = bt, .out = out,
    };
    cr_assert_eq(kw_k_ref_compressed_slot_mapping(&a), 0);
    const int64_t want[] = {-1, -1, 12, 13, -1, -1, 14, 15};
    assert_i64s(out, want, 8);
}

/* ---- index_conversion, decode rows ---- */

typedef struct ic_case {
    int32_t w, r, bs, stride, width, topk;
    const int32_t *bt, *pos;
    bool compact;
} ic_case;

static int ic_decode(const ic_case *k, int32_t *out, int32_t *cnt)
{
    int32_t req = 0;
    kw_k_ic_args a = {
        .block_size = k->bs, .block_stride_rows = k->stride,
        .count_valid = true, .compact_to_front = k->compact,
        .dcp_size = k->w, .dcp_rank = k->r, .dcp_interleave = 1,
        .topk = k->topk, .num_rows = 1, .num_reqs = 1, .width = k->width,
        .req_id = &req, .block_table = k->bt, .topk_pos = k->pos,
        .out = out, .valid_count = cnt,
    };
    return kw_k_ref_index_conversion(&a);
}

/* W=1, block 4, stride 10, pages {7, 2, 5}: 0 -> 7*10+0 = 70, 5 -> block
 * 1 off 1 -> 21, 11 -> block 2 off 3 -> 53, 12 -> block 3 >= width -> -1,
 * -1 -> -1, 3 -> 73. */
static const int32_t ic_bt[] = {7, 2, 5};
static const int32_t ic_pos[] = {0, 5, 11, 12, -1, 3};

Test(kref, index_conversion_maps_pages_with_block_stride_rows)
{
    ic_case k = {1, 0, 4, 10, 3, 6, ic_bt, ic_pos, false};
    int32_t out[6], cnt = -1;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t want[] = {70, 21, 53, -1, -1, 73};
    assert_i32s(out, want, 6);
    cr_assert_eq(cnt, 4);
}

Test(kref, index_conversion_compacts_valid_entries_in_order)
{
    ic_case k = {1, 0, 4, 10, 3, 6, ic_bt, ic_pos, true};
    int32_t out[6], cnt = -1;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t want[] = {70, 21, 53, 73, -1, -1};
    assert_i32s(out, want, 6);
    cr_assert_eq(cnt, 4);
}

Test(kref, index_conversion_keeps_duplicate_positions_when_compacting)
{
    /* block 4 stride 4, pages {10, 20}: 5 -> 20*4+1 = 81 twice, 1 -> 41. */
    const int32_t bt[] = {10, 20}, pos[] = {5, -1, 5, 1};
    ic_case k = {1, 0, 4, 4, 2, 4, bt, pos, true};
    int32_t out[4], cnt = -1;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t want[] = {81, 81, 41, -1};
    assert_i32s(out, want, 4);
    cr_assert_eq(cnt, 3);
}

Test(kref, index_conversion_decode_under_dcp_drops_other_ranks)
{
    /* W=2, R=1, I=1, block 2, stride 2, pages {4, 9}: odd t is rank 1's
     * with l = t/2: 1 -> 8, 3 -> 9, 5 -> 18, 7 -> 19; even t -> -1. */
    const int32_t bt[] = {4, 9}, pos[] = {0, 1, 2, 3, 5, 7};
    ic_case k = {2, 1, 2, 2, 2, 6, bt, pos, false};
    int32_t out[6], cnt = -1;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t want[] = {-1, 8, -1, 9, 18, 19};
    assert_i32s(out, want, 6);
    cr_assert_eq(cnt, 4);
    k.compact = true;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t packed[] = {8, 9, 18, 19, -1, -1};
    assert_i32s(out, packed, 6);
}

Test(kref, index_conversion_empty_row_counts_zero)
{
    const int32_t pos[] = {-1, -1, -1};
    ic_case k = {1, 0, 4, 4, 3, 3, ic_bt, pos, true};
    int32_t out[3], cnt = -1;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t want[] = {-1, -1, -1};
    assert_i32s(out, want, 3);
    cr_assert_eq(cnt, 0);
}

Test(kref, index_conversion_counts_outputs_not_entries)
{
    /* Page -1, block 4, stride 4: t=3 -> -4+3 = -1 (counts as empty),
     * t=2 -> -2 (a value, counted). */
    const int32_t bt[] = {-1}, pos[] = {3, 2};
    ic_case k = {1, 0, 4, 4, 1, 2, bt, pos, true};
    int32_t out[2], cnt = -1;
    cr_assert_eq(ic_decode(&k, out, &cnt), 0);
    const int32_t want[] = {-2, -1};
    assert_i32s(out, want, 2);
    cr_assert_eq(cnt, 1);
}

Test(kref, index_conversion_mixes_decode_and_prefill_rows)
{
    /* W=2, R=0, I=1, block 2, stride 2, page {6}; row 0 decode (req 0):
     * 0 -> 12, 1 -> -1 (rank 1's), 2 -> 13; row 1 prefill (preq 1,
     * start 300, rank stride 1000): 0 -> 300, 1 -> 1300, 2 -> 301. */
    const int32_t req[] = {0, 0}, preq[] = {-1, 1}, ws[] = {100, 300};
    const int32_t bt[] = {6}, pos[] = {0, 1, 2, 0, 1, 2};
    int32_t out[6], cnt[2];
    kw_k_ic_args a = {
        .block_size = 2, .block_stride_rows = 2,
        .has_prefill_workspace = true, .count_valid = true,
        .dcp_size = 2, .dcp_rank = 0, .dcp_interleave = 1, .topk = 3,
        .num_rows = 2, .num_reqs = 1, .num_prefill = 2, .width = 1,
        .workspace_rank_stride = 1000, .req_id = req, .block_table = bt,
        .topk_pos = pos, .prefill_req = preq, .workspace_start = ws,
        .out = out, .valid_count = cnt,
    };
    cr_assert_eq(kw_k_ref_index_conversion(&a), 0);
    const int32_t want[] = {12, -1, 13, 300, 1300, 301}, want_cnt[] = {2, 3};
    assert_i32s(out, want, 6);
    assert_i32s(cnt, want_cnt, 2);
}

Test(kref, index_conversion_rejects_request_outside_block_table)
{
    const int32_t bt[] = {1}, pos[] = {0};
    int32_t req = 1, out[1], cnt;
    kw_k_ic_args a = {
        .block_size = 4, .block_stride_rows = 4, .count_valid = true,
        .dcp_size = 1, .dcp_interleave = 1, .topk = 1, .num_rows = 1,
        .num_reqs = 1, .width = 1, .req_id = &req, .block_table = bt,
        .topk_pos = pos, .out = out, .valid_count = &cnt,
    };
    cr_assert_eq(kw_k_ref_index_conversion(&a), KW_EINVAL);
}

/* ---- dcp_pack_topk_candidates ---- */

Test(kref, pack_copies_score_bits_and_globalises_ids)
{
    /* W=2, R=1, I=1: global(l) = 2l + 1.  p=1 -> (-0.0, 3), p=2 -> (the
     * NaN's exact bits, 5), -1 and p=4 (>= cols) -> (-inf, -1),
     * p=0 -> (0.5, 1). */
    const float logits[] = {0.5f, -0.0f, bitsf(0x7fc00123u), 2.0f};
    const int32_t pos[] = {1, 2, -1, 4, 0};
    float out[10];
    kw_k_pack_args a = {
        .dcp_rank = 1, .dcp_world = 2, .dcp_interleave = 1, .topk = 5,
        .num_rows = 1, .cols = 4, .logits = logits, .topk_local = pos,
        .packed = out,
    };
    cr_assert_eq(kw_k_ref_dcp_pack_topk_candidates(&a), 0);
    const uint32_t want[] = {0x80000000u, fbits(3.0f), 0x7fc00123u,
                             fbits(5.0f), 0xff800000u, fbits(-1.0f),
                             0xff800000u, fbits(-1.0f), fbits(0.5f),
                             fbits(1.0f)};
    for (size_t i = 0; i < N_OF(want); i++)
        cr_assert_eq(fbits(out[i]), want[i], "[%zu]: %08x", i, fbits(out[i]));
}

Test(kref, pack_offsets_by_row_start_and_drops_past_cols)
{
    /* W=4, R=2, I=16, row start 2, cols 40, logits[c] = c:
     * p=0 -> (logits[2], 32); p=17 -> (logits[19], 64+32+1 = 97);
     * p=37 -> (logits[39], 2*64+32+5 = 165); p=38 -> 40 >= cols. */
    float logits[40];
    for (int i = 0; i < 40; i++)
        logits[i] = (float)i;
    const int32_t pos[] = {0, 17, 37, 38}, rs[] = {2};
    float out[8];
    kw_k_pack_args a = {
        .dcp_rank = 2, .dcp_world = 4, .dcp_interleave = 16,
        .has_row_starts = true, .topk = 4, .num_rows = 1, .cols = 40,
        .logits = logits, .topk_local = pos, .row_starts = rs,
        .packed = out,
    };
    cr_assert_eq(kw_k_ref_dcp_pack_topk_candidates(&a), 0);
    const float want[] = {2, 32, 19, 97, 39, 165, -INFINITY, -1};
    for (size_t i = 0; i < N_OF(want); i++)
        cr_assert_eq(fbits(out[i]), fbits(want[i]), "[%zu]", i);
}

/* ---- dcp_stable_topk ---- */

/* Runs one row of n (score, id) pairs and checks its topk ids. */
static void topk_row(const float *pairs, int32_t n, int32_t topk,
                     const int32_t *want)
{
    int32_t out[16];
    kw_k_topk_args a = {.topk = topk, .num_candidates = n, .num_rows = 1,
                        .gathered = pairs, .out = out};
    cr_assert_eq(kw_k_ref_dcp_stable_topk(&a), 0);
    assert_i32s(out, want, (size_t)topk);
}

Test(kref, stable_topk_orders_by_score_descending)
{
    const float c[] = {1.0f, 5, 3.0f, 2, 2.0f, 9};
    const int32_t want[] = {2, 9};
    topk_row(c, 3, 2, want);
}

Test(kref, stable_topk_breaks_score_ties_by_lower_id)
{
    const float c[] = {1.0f, 7, 1.0f, 3, 1.0f, 5};
    const int32_t want[] = {3, 5, 7};
    topk_row(c, 3, 3, want);
}

Test(kref, stable_topk_treats_negative_zero_as_zero)
{
    /* (+0.0, 4) and (-0.0, 1) tie on score, so id 1 comes first. */
    const float c[] = {0.0f, 4, -0.0f, 1};
    const int32_t want[] = {1, 4};
    topk_row(c, 2, 2, want);
}

Test(kref, stable_topk_ranks_nan_below_negative_infinity)
{
    /* NaNs of either sign tie with each other (then id decides) and sit
     * below -inf. */
    const float c[] = {bitsf(0xffc00000u), 1, NAN, 0, -INFINITY, 9,
                       -1e30f, 8};
    const int32_t want[] = {8, 9, 0, 1};
    topk_row(c, 4, 4, want);
}

Test(kref, stable_topk_skips_invalid_ids_and_pads_with_minus_one)
{
    /* ids -1, 0.5, NaN and 3e9 are invalid; -0.0 is id 0. */
    const float c[] = {5.0f, -1, 4.0f, 0.5f, 3.0f, NAN, 2.5f, 3e9f,
                       2.0f, 7, 1.0f, -0.0f};
    const int32_t want[] = {7, 0, -1, -1};
    topk_row(c, 6, 4, want);
}

Test(kref, stable_topk_keeps_duplicate_ids_as_separate_candidates)
{
    const float c[] = {2.0f, 4, 1.0f, 3, 2.0f, 4};
    const int32_t want[] = {4, 4, 3};
    topk_row(c, 3, 3, want);
}

Test(kref, stable_topk_pads_when_candidates_are_fewer_than_topk)
{
    /* Two rows of 2 candidates, topk 3. */
    const float c[] = {1.0f, 2, 3.0f, 1, -1.0f, 6, -2.0f, 5};
    int32_t out[6];
    kw_k_topk_args a = {.topk = 3, .num_candidates = 2, .num_rows = 2,
                        .gathered = c, .out = out};
    cr_assert_eq(kw_k_ref_dcp_stable_topk(&a), 0);
    const int32_t want[] = {1, 2, -1, 6, 5, -1};
    assert_i32s(out, want, 6);
}

/* ---- issue 15: indexer_logits and indexer_topk ---------------------------
 * e4m3 bytes used below: 0x38 = 1.0, 0x40 = 2.0, 0x30 = 0.5, 0xb8 = -1.0,
 * 0x01 = 2^-9 (the smallest subnormal), 0x7e = 448 (the largest). */

Test(kref, logits_prefill_sums_weighted_relu_heads_times_scale)
{
    /* H = 2, D = 32; head 0 = (1, 1, 0...), head 1 = (-1, 0...); w = (2, 3).
     * row 0 = (2, 0.5, 0...), scale 0.5: 0.5 * (2 * 2.5 + 3 * relu(-2)) = 2.5
     * row 1 = (-1, 0...), scale 2: 2 * (2 * relu(-1) + 3 * 1) = 6
     * row 2 is outside the window [0, 2): -inf; column 3 (past N) untouched */
    uint8_t q[64] = {0}, k[96] = {0};
    q[0] = q[1] = 0x38;
    q[32] = 0xb8;
    k[0] = 0x40;
    k[1] = 0x30;
    k[32] = 0xb8;
    k[64] = 0x38;
    const float w[2] = {2, 3}, sc[3] = {0.5f, 2, 1};
    const int32_t ks[1] = {0}, ke[1] = {2};
    float out[4] = {7, 7, 7, 7};
    double mag[4];
    kw_k_logits_args a = {.heads = 2, .head_dim = 32, .next_n = 1, .q = q,
                          .w = w, .k = k, .k_scale = sc, .ks = ks, .ke = ke,
                          .num_rows = 1, .num_k = 3, .stride = 4,
                          .num_pages = -1, .logits = out};
    cr_assert_eq(kw_k_ref_indexer_logits(&a, mag), 0);
    cr_assert_float_eq(out[0], 2.5f, 0);
    cr_assert_float_eq(out[1], 6.0f, 0);
    cr_assert(isinf(out[2]) && out[2] < 0);
    cr_assert_float_eq(out[3], 7.0f, 0);
    /* m: 0.5 * (2 * 2.5 + 3 * 2) = 5.5 and 2 * (2 * 1 + 3 * 1) = 10 */
    cr_assert_float_eq(mag[0], 5.5, 0);
    cr_assert_float_eq(mag[1], 10.0, 0);
    cr_assert_float_eq(mag[2], 0.0, 0);
}

Test(kref, logits_decode_fp8_exactly_including_subnormals)
{
    /* 2^-9 * 448 = 0.875 */
    uint8_t q[32] = {0x01}, k[32] = {0x7e};
    const float w[1] = {1}, sc[1] = {1};
    const int32_t ks[1] = {0}, ke[1] = {1};
    float out[1];
    kw_k_logits_args a = {.heads = 1, .head_dim = 32, .next_n = 1, .q = q,
                          .w = w, .k = k, .k_scale = sc, .ks = ks, .ke = ke,
                          .num_rows = 1, .num_k = 1, .stride = 1,
                          .num_pages = -1, .logits = out};
    cr_assert_eq(kw_k_ref_indexer_logits(&a, NULL), 0);
    cr_assert_float_eq(out[0], 0.875f, 0);
}

Test(kref, logits_paged_walks_the_block_table_per_request)
{
    /* page_rows 2, block_table [1, 0]; page 0 = (1, 2), page 1 = (0.5, -1)
     * in dimension 0, so rows 0..3 score 0.5, relu(-1) = 0, 1, 2.
     * Two queries (next_n 2) see 3 and 4 rows. */
    uint8_t q[64] = {0}, k[128] = {0};
    q[0] = q[32] = 0x38;
    k[0] = 0x38;
    k[32] = 0x40;
    k[64] = 0x30;
    k[96] = 0xb8;
    const float w[2] = {1, 1}, sc[4] = {1, 1, 1, 1};
    const int32_t bt[2] = {1, 0}, re[2] = {3, 4};
    float out[8];
    kw_k_logits_args a = {.heads = 1, .head_dim = 32, .paged = true,
                          .page_rows = 2, .next_n = 2, .q = q, .w = w, .k = k,
                          .k_scale = sc, .block_table = bt, .row_end = re,
                          .num_reqs = 1, .width = 2, .max_rows = 4,
                          .num_pages = 2, .logits = out};
    cr_assert_eq(kw_k_ref_indexer_logits(&a, NULL), 0);
    const float want[8] = {0.5f, 0, 1, -INFINITY, 0.5f, 0, 1, 2};
    for (int i = 0; i < 8; i++)
        cr_assert_eq(fbits(out[i]), fbits(want[i]), "[%d]: %g", i, out[i]);
}

Test(kref, logits_rejects_bad_windows_and_tables)
{
    uint8_t q[32] = {0}, k[64] = {0};
    const float w[1] = {1}, sc[2] = {1, 1};
    int32_t ks[1] = {1}, ke[1] = {0};
    float out[4];
    kw_k_logits_args a = {.heads = 1, .head_dim = 32, .next_n = 1, .q = q,
                          .w = w, .k = k, .k_scale = sc, .ks = ks, .ke = ke,
                          .num_rows = 1, .num_k = 2, .stride = 2,
                          .num_pages = -1, .logits = out};
    cr_assert_eq(kw_k_ref_indexer_logits(&a, NULL), KW_EINVAL); /* ke < ks */
    ks[0] = 0;
    ke[0] = 3;
    cr_assert_eq(kw_k_ref_indexer_logits(&a, NULL), KW_EINVAL); /* ke > N */
    ke[0] = 2;
    a.stride = 1;
    cr_assert_eq(kw_k_ref_indexer_logits(&a, NULL), KW_EINVAL); /* stride */
    a.stride = 2;
    a.head_dim = 48;
    cr_assert_eq(kw_k_ref_indexer_logits(&a, NULL), KW_EINVAL);
    const int32_t bt[1] = {0}, re[1] = {3};
    kw_k_logits_args p = {.heads = 1, .head_dim = 32, .paged = true,
                          .page_rows = 2, .next_n = 1, .q = q, .w = w, .k = k,
                          .k_scale = sc, .block_table = bt, .row_end = re,
                          .num_reqs = 1, .width = 1, .max_rows = 4,
                          .num_pages = 1, .logits = out};
    /* row_end 3 > width * page_rows = 2 */
    cr_assert_eq(kw_k_ref_indexer_logits(&p, NULL), KW_EINVAL);
}

static float fnan(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

Test(kref, itopk_orders_ties_by_position_nan_last_and_pads)
{
    /* Window [1, 8) of the row: 3, 3, 2, NaN, -0.0, 0.0, -inf at positions
     * 0..6.  Ties by lower position, -0.0 equals +0.0, -inf above NaN. */
    const float row[8] = {1, 3, 3, 2, NAN, -0.0f, 0.0f, -INFINITY};
    const int32_t ks[1] = {1}, ke[1] = {8};
    int32_t out[9];
    kw_k_itopk_args a = {.topk = 9, .windowed = true, .num_rows = 1,
                         .stride = 8, .logits = row, .ks = ks, .ke = ke,
                         .topk_pos = out};
    cr_assert_eq(kw_k_ref_indexer_topk(&a), 0);
    const int32_t want[9] = {0, 1, 2, 4, 5, 6, 3, -1, -1};
    assert_i32s(out, want, 9);
}

Test(kref, itopk_row_end_mode_and_empty_windows)
{
    /* Row 0 sees [0, 3) with top-2; row 1 an empty window: all -1.  NaNs of
     * both signs rank alike, by position. */
    const float lg[8] = {fnan(0xffc00000u), 5, NAN, 9, 1, 2, 3, 4};
    const int32_t re[2] = {3, 0};
    int32_t out[4];
    kw_k_itopk_args a = {.topk = 2, .num_rows = 2, .stride = 4, .logits = lg,
                         .row_end = re, .topk_pos = out};
    cr_assert_eq(kw_k_ref_indexer_topk(&a), 0);
    const int32_t want[4] = {1, 0, -1, -1};
    assert_i32s(out, want, 4);
}

Test(kref, itopk_rejects_windows_outside_the_row)
{
    const float lg[4] = {0};
    int32_t ks[1] = {0}, ke[1] = {5}, out[1];
    kw_k_itopk_args a = {.topk = 1, .windowed = true, .num_rows = 1,
                         .stride = 4, .logits = lg, .ks = ks, .ke = ke,
                         .topk_pos = out};
    cr_assert_eq(kw_k_ref_indexer_topk(&a), KW_EINVAL);
    ks[0] = 3;
    ke[0] = 2;
    cr_assert_eq(kw_k_ref_indexer_topk(&a), KW_EINVAL);
}
