/* kw_cuda.h: the CUDA driver, loaded with dlopen (prefix kw_cuda_).
 *
 * Nothing links against libcuda: kw_cuda_open() loads libcuda.so.1 (or the
 * file named by the environment variable KW_LIBCUDA) at run time, so every
 * binary also runs on hosts with no GPU and no driver, where kw_cuda_open()
 * returns KW_ENODRIVER and says why.  A kw_cuda is the loaded driver plus the
 * retained primary context of one device; CUresult never leaves this module.
 *
 * Threads: a kw_cuda may be shared by threads.  The driver works on the
 * calling thread's current context, so the thread that opens the handle has
 * it current and every other thread calls kw_cuda_make_current() once before
 * its first call.  Work goes to the legacy default stream, in call order per
 * context.  The error text (kw_cuda_last_error) is per handle, not per
 * thread: threads that share a handle read it with kw_cuda_last_error_copy().
 *
 * Lifetimes: unload every kw_cuda_fn, free every kw_cuda_timer and device
 * allocation before kw_cuda_close() of the handle they came from.
 */
#ifndef KW_CUDA_H
#define KW_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kw_cuda kw_cuda;             /* driver + primary context */
typedef struct kw_cuda_fn kw_cuda_fn;       /* loaded module + one entry */
typedef struct kw_cuda_timer kw_cuda_timer; /* a pair of CUDA events */

/* Loads the driver, initialises it and makes the primary context of device
 * (0-based) current on the calling thread.  On failure *out is untouched and,
 * when err is not NULL, a one-line reason is written to err (errcap bytes,
 * always NUL-terminated), e.g. "libcuda: dlopen(libcuda.so.1): ...".
 * Returns 0; KW_ENODRIVER when the library cannot be loaded, is not a CUDA
 * driver (an entry point is missing) or cuInit fails (no device, driver too
 * old); KW_EINVAL when device is out of range; KW_ECUDA when the context
 * cannot be retained; KW_ENOMEM. */
int kw_cuda_open(kw_cuda **out, int device, char *err, size_t errcap);

/* Releases the primary context and the handle.  NULL is a no-op.  The library
 * stays mapped: an initialised driver runs threads of its own and is not
 * safe to unload (it is opened with RTLD_NODELETE). */
void kw_cuda_close(kw_cuda *c);

/* The text of the most recent failure on c, e.g. "cuModuleLoadData:
 * CUDA_ERROR_INVALID_IMAGE"; "" when none.  Borrowed: valid until the next
 * failing call on c, and only meaningful while one thread uses c. */
const char *kw_cuda_last_error(const kw_cuda *c);

/* Copies that text into buf (cap bytes, NUL-terminated) under c's lock. */
void kw_cuda_last_error_copy(kw_cuda *c, char *buf, size_t cap);

/* Name (NUL-terminated, truncated to cap), compute capability and number of
 * SMs of c's device.  Any output pointer may be NULL.  0 or KW_ECUDA. */
int kw_cuda_device_info(kw_cuda *c, char *name, size_t cap, int *cc_major,
                        int *cc_minor, int *sm_count);

/* Makes c's context current on the calling thread.  0 or KW_ECUDA. */
int kw_cuda_make_current(kw_cuda *c);

/* Loads an image with cuModuleLoadData and looks up entry in it.  The image
 * is a cubin (ELF, whose headers must lie inside len bytes) or NUL-terminated
 * PTX text within len bytes; fatbins are refused.  The driver copies the
 * image: it may be freed after the call.  Returns 0 with *out set, KW_EINVAL
 * (malformed image, NULL argument), KW_ECUDA (the driver refused the image
 * or has no such entry; see kw_cuda_last_error), KW_ENOMEM. */
int kw_cuda_load(kw_cuda *c, const void *image, size_t len, const char *entry,
                 kw_cuda_fn **out);

/* Unloads the module.  NULL is a no-op.  Synchronise first if a launch of it
 * may still be running. */
void kw_cuda_unload(kw_cuda_fn *f);

/* Launches f on the default stream, asynchronously.  args is the
 * cuLaunchKernel kernelParams array (one pointer per kernel parameter).  When
 * shmem exceeds 48 KiB, the function's max-dynamic-shared-memory attribute is
 * raised to shmem first, as the driver requires.  0 or KW_ECUDA (KW_EINVAL
 * for a NULL f, grid or block). */
int kw_cuda_launch(kw_cuda_fn *f, const unsigned grid[3],
                   const unsigned block[3], unsigned shmem, void **args);

/* As kw_cuda_launch(), on stream (a CUstream; 0 is the legacy default
 * stream).  The shared-memory opt-in is made once per function and
 * size, so a launch costs one driver call. */
int kw_cuda_launch_on(kw_cuda_fn *f, const unsigned grid[3],
                      const unsigned block[3], unsigned shmem, void **args,
                      uintptr_t stream);

/* Whether stream is capturing a CUDA graph (*out).  A query the driver
 * refuses because another stream captures counts as capturing: nothing
 * may be loaded then either.  0, or KW_EINVAL for a NULL argument. */
int kw_cuda_stream_capturing(kw_cuda *c, uintptr_t stream, bool *out);

/* Device memory: n bytes at *dptr.  0 or KW_ECUDA (n == 0: KW_EINVAL). */
int kw_cuda_alloc(kw_cuda *c, size_t n, uint64_t *dptr);

/* Frees what kw_cuda_alloc() returned; 0 is a no-op. */
void kw_cuda_free(kw_cuda *c, uint64_t dptr);

/* Synchronous copies of n bytes (and a byte fill); 0 or KW_ECUDA. */
int kw_cuda_h2d(kw_cuda *c, uint64_t dst, const void *src, size_t n);
int kw_cuda_d2h(kw_cuda *c, void *dst, uint64_t src, size_t n);
int kw_cuda_d2d(kw_cuda *c, uint64_t dst, uint64_t src, size_t n);
int kw_cuda_memset(kw_cuda *c, uint64_t dst, uint8_t byte, size_t n);

/* Waits for all work of c's context; reports a failed kernel.  0/KW_ECUDA. */
int kw_cuda_sync(kw_cuda *c);

/* A GPU timer: two events recorded on the default stream around the work to
 * time.  new/free pair; free accepts NULL.  0, KW_ECUDA or KW_ENOMEM. */
int kw_cuda_timer_new(kw_cuda *c, kw_cuda_timer **out);
void kw_cuda_timer_free(kw_cuda_timer *t);
int kw_cuda_timer_start(kw_cuda_timer *t);

/* Records the stop event, waits for it, and stores the milliseconds since
 * the last kw_cuda_timer_start() in *ms.  0 or KW_ECUDA. */
int kw_cuda_timer_stop_ms(kw_cuda_timer *t, float *ms);

#endif /* KW_CUDA_H */
