"""One valid call of every kwarm op, shared by the CPU tests
(test_torch_ops.py) and the GPU script (gpu_ops.py).

calls(topk, W, device) gives, per op, the arguments of
torch.ops.kwarm.NAME_out in the C order (launch/kw_launch.h), as a list
of (name, value), with zero-filled tensors of the right dtype and shape
(the CPU stand-in never reads them), and EXPECTED the outputs' dtype and
shape as the allocating form returns them, written out here independently
of kwarm.torch's own table.
"""
import torch

I32, I64, F32, U8 = torch.int32, torch.int64, torch.float32, torch.uint8

# Small shapes inside the classes DeepSeek-V3.2 / V4-Flash warm: widths
# that are multiples of 16 (block_table_stride 16), page_rows of a
# deployment's decode key, compress_ratio 1 (V3.2's ratios_p).
ROWS = 3


def calls(topk, W, device="cpu", page_rows=64, heads=64, head_dim=128,
          compress_ratio=1, slot_ratio=4):
    z = lambda shape, dt: torch.zeros(shape, dtype=dt, device=device)
    v = lambda vals: torch.tensor(vals, dtype=I32, device=device)
    r = ROWS
    width = 16
    return {
        "prefill_chunk_metadata": [
            ("query_start_loc", v([0, 3, 5])), ("seq_lens", v([10, 7])),
            ("cu_k", v([0, 5, 9])), ("num_reqs", 2), ("slice_start", 0),
            ("slice_stop", 5), ("total_k", 9), ("ks", z((5,), I32)),
            ("ke", z((5,), I32)), ("token_to_seq", z((9,), I32)),
            ("compress_ratio", compress_ratio), ("dcp_local", False)],
        "compressed_slot_mapping": [
            ("slot_mapping", z((5,), I64)), ("query_start_loc", v([0, 3, 5])),
            ("seq_lens", v([10, 7])), ("block_table", z((2, width), I32)),
            ("num_tokens", 5), ("num_reqs", 2), ("width", width),
            ("block_size", 16), ("out", z((5,), I64)),
            ("compress_ratio", slot_ratio), ("dcp_local", False)],
        "index_conversion": [
            ("req_id", z((r,), I32)), ("block_table", z((2, width), I32)),
            ("topk_pos", z((r, topk), I32)), ("prefill_req", None),
            ("workspace_start", None), ("num_rows", r), ("num_reqs", 2),
            ("num_prefill", 0), ("width", width), ("workspace_rank_stride", 0),
            ("out", z((r, topk), I32)), ("valid_count", z((r,), I32)),
            ("compact_to_front", True), ("dcp_local", True)],
        "dcp_pack_topk_candidates": [
            ("logits", z((r, 100), F32)), ("topk_local", z((r, topk), I32)),
            ("row_starts", None), ("num_rows", r), ("cols", 100),
            ("packed", z((r, topk, 2), F32))],
        "dcp_stable_topk": [
            ("gathered", z((r, topk * W, 2), F32)), ("num_rows", r),
            ("out", z((r, topk), I32))],
        "indexer_logits": [
            ("q", z((4, heads, head_dim), U8)), ("w", z((4, heads), F32)),
            ("k", z((10, head_dim), U8)), ("k_scale", z((10,), F32)),
            ("ks", z((4,), I32)), ("ke", z((4,), I32)), ("num_rows", 4),
            ("num_k", 10), ("stride", 16), ("logits", z((4, 16), F32)),
            ("heads", heads), ("head_dim", head_dim)],
        "indexer_topk": [
            ("logits", z((r, 100), F32)), ("ks", None), ("ke", None),
            ("num_rows", r), ("stride", 100), ("topk_pos", z((r, topk), I32)),
            ("row_end", z((r,), I32))],
        "indexer_logits_paged": [
            ("q", z((2, heads, head_dim), U8)), ("w", z((2, heads), F32)),
            ("k_pages", z((4, page_rows, head_dim), U8)),
            ("k_scale_pages", z((4, page_rows), F32)),
            ("block_table", z((2, width), I32)), ("row_end", z((2,), I32)),
            ("num_reqs", 2), ("width", width), ("max_rows", 128),
            ("logits", z((2, 128), F32)), ("page_rows", page_rows),
            ("next_n", 1), ("heads", heads), ("head_dim", head_dim)],
    }


def expected(topk, W):
    """Per op, [(dtype, shape)] of the allocating form's outputs for
    calls(), with_valid_count true."""
    r = ROWS
    return {
        "prefill_chunk_metadata": [(I32, (5,)), (I32, (5,)), (I32, (9,))],
        "compressed_slot_mapping": [(I64, (5,))],
        "index_conversion": [(I32, (r, topk)), (I32, (r,))],
        "dcp_pack_topk_candidates": [(F32, (r, topk, 2))],
        "dcp_stable_topk": [(I32, (r, topk))],
        "indexer_logits": [(F32, (4, 16))],
        "indexer_topk": [(I32, (r, topk))],
        "indexer_logits_paged": [(F32, (2, 128))],
    }


def alloc_args(op_args, kinds):
    """The allocating form's arguments from the out form's: outputs
    dropped, an optional output becomes with_NAME (true when given)."""
    out = []
    for (name, value), (_, kind) in zip(op_args, kinds):
        if kind == 1:        # OUT
            continue
        if kind == 3:        # OPT_OUT
            out.append(value is not None)
        else:
            out.append(value)
    return out
