/* flashinfer_topk.cu: a C entry point to FlashInfer's top-k over ragged
 * rows (the call flashinfer.top_k_ragged_transform makes), so that
 * bench/indexer_peer.py times it beside kwarm's indexer_topk on the same
 * logits.  Built by bench/flashinfer_build.sh against the headers of a
 * FlashInfer wheel; nothing of FlashInfer is in the repository.
 *
 * Row i's top-k is taken over [0, lengths[i]) of row i (row stride
 * max_len) and written as indices + offsets[i] (offsets 0 here). */
#include <flashinfer/sampling.cuh> /* topk.cuh uses its math:: */
#include <flashinfer/topk.cuh>

extern "C" int kw_fi_topk_ragged(float *in, int *out, const int *offsets,
                                 int *lengths, unsigned rows, unsigned k,
                                 unsigned max_len, void *row_states,
                                 int deterministic, int tie_break,
                                 void *stream)
{
    cudaError_t e = flashinfer::sampling::TopKRaggedTransformDispatch<float, int>(
        in, out, offsets, lengths, nullptr, rows, k, max_len,
        (flashinfer::sampling::RadixRowState *)row_states, deterministic != 0,
        (flashinfer::sampling::TopKTieBreak)tie_break, (cudaStream_t)stream,
        false);
    return (int)e;
}
