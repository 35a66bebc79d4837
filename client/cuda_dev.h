/* cuda_dev.h: kw_cuda as a kw_k_dev, the device interface of the kernels/
 * check harness (kw_kernels.h).
 *
 * Not installed: it is the bridge between libkwarm's CUDA loader and the
 * kernels/ module, used by `kwarm verify`, the benchmarks and the tests.
 * The headers a serving process includes (kw_client.h, kw_cuda.h) name
 * nothing of kernels/, jit/ or cache/.  The definition is in cuda.c, beside
 * the handle it reaches into.
 */
#ifndef KW_CUDA_DEV_H
#define KW_CUDA_DEV_H

#include "kw_cuda.h"
#include "kw_kernels.h" /* kw_k_dev */

/* Fills out with device operations on fn's context whose launch launches fn
 * (for the kernels/ checks).  out->ctx is fn: the operations are valid until
 * kw_cuda_unload(fn).  c must be the handle fn was loaded from. */
void kw_cuda_dev_ops(kw_cuda *c, kw_cuda_fn *fn, kw_k_dev *out);

#endif /* KW_CUDA_DEV_H */
