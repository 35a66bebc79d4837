"""kwarm: kwarmd's kernels for serving processes.

    import kwarm.torch                      # needs torch; registers torch.ops.kwarm.*
    dep = kwarm.torch.load("config.json", {"dcp_world": 2, "dcp_rank": 1})
    topk_pos = torch.ops.kwarm.indexer_topk(logits, None, None, rows, stride, row_end)

This package itself imports nothing beyond the standard library:
kwarm._lib is libkwarm through ctypes, kwarm.torch the torch custom ops on
top of it.  The protocol client is the module kwarm_client.
"""
__version__ = "0.2.0"
