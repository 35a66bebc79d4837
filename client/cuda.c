/* cuda.c: the CUDA driver, loaded with dlopen (kw_cuda.h).
 *
 * cuda.h and cudaTypedefs.h are used for types only; every entry point is
 * looked up with dlsym under its exact ABI name, which is what cuda.h's
 * macros expand to (cuMemAlloc -> cuMemAlloc_v2, ...).  The legacy names
 * (cuLaunchKernel, cuMemcpyHtoD_v2, not the _ptds/_ptsz variants) put all
 * work on the legacy default stream.  CUresult is turned into KW_ECUDA by
 * check(), which records the call and cuGetErrorName() in the handle.
 */
#include "kw_cuda.h"
#include "cuda_dev.h" /* kw_cuda_dev_ops: the kernels/ adapter */

#include <assert.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"

#define DEFAULT_LIBCUDA "libcuda.so.1"
#define STATIC_SMEM_LIMIT (48u * 1024u) /* above it, opt in per function */

/* Every driver entry point we use: struct field, exported symbol, type.
 * The symbol fixes the ABI version; the type must be the matching PFN. */
#define CUDA_SYMS(XX)                                                        \
    XX(get_error_name, "cuGetErrorName", PFN_cuGetErrorName_v6000)           \
    XX(init, "cuInit", PFN_cuInit_v2000)                                     \
    XX(device_get, "cuDeviceGet", PFN_cuDeviceGet_v2000)                     \
    XX(device_get_count, "cuDeviceGetCount", PFN_cuDeviceGetCount_v2000)     \
    XX(device_get_name, "cuDeviceGetName", PFN_cuDeviceGetName_v2000)        \
    XX(device_get_attribute, "cuDeviceGetAttribute",                         \
       PFN_cuDeviceGetAttribute_v2000)                                       \
    XX(primary_ctx_retain, "cuDevicePrimaryCtxRetain",                       \
       PFN_cuDevicePrimaryCtxRetain_v7000)                                   \
    XX(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2",                  \
       PFN_cuDevicePrimaryCtxRelease_v11000)                                 \
    XX(ctx_set_current, "cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000)        \
    XX(ctx_synchronize, "cuCtxSynchronize", PFN_cuCtxSynchronize_v2000)      \
    XX(module_load_data, "cuModuleLoadData", PFN_cuModuleLoadData_v2000)     \
    XX(module_unload, "cuModuleUnload", PFN_cuModuleUnload_v2000)            \
    XX(module_get_function, "cuModuleGetFunction",                           \
       PFN_cuModuleGetFunction_v2000)                                        \
    XX(func_set_attribute, "cuFuncSetAttribute",                             \
       PFN_cuFuncSetAttribute_v9000)                                         \
    XX(launch_kernel, "cuLaunchKernel", PFN_cuLaunchKernel_v4000)            \
    XX(stream_is_capturing, "cuStreamIsCapturing",                           \
       PFN_cuStreamIsCapturing_v10000)                                       \
    XX(mem_alloc, "cuMemAlloc_v2", PFN_cuMemAlloc_v3020)                     \
    XX(mem_free, "cuMemFree_v2", PFN_cuMemFree_v3020)                        \
    XX(memcpy_htod, "cuMemcpyHtoD_v2", PFN_cuMemcpyHtoD_v3020)               \
    XX(memcpy_dtoh, "cuMemcpyDtoH_v2", PFN_cuMemcpyDtoH_v3020)               \
    XX(memcpy_dtod, "cuMemcpyDtoD_v2", PFN_cuMemcpyDtoD_v3020)               \
    XX(memset_d8, "cuMemsetD8_v2", PFN_cuMemsetD8_v3020)                     \
    XX(event_create, "cuEventCreate", PFN_cuEventCreate_v2000)               \
    XX(event_record, "cuEventRecord", PFN_cuEventRecord_v2000)               \
    XX(event_synchronize, "cuEventSynchronize",                              \
       PFN_cuEventSynchronize_v2000)                                         \
    XX(event_elapsed_time, "cuEventElapsedTime",                             \
       PFN_cuEventElapsedTime_v2000)                                         \
    XX(event_destroy, "cuEventDestroy_v2", PFN_cuEventDestroy_v4000)

typedef struct cuda_api {
#define XX(field, sym, type) type field;
    CUDA_SYMS(XX)
#undef XX
} cuda_api;

struct kw_cuda {
    void *lib;          /* dlopen handle (RTLD_NODELETE) */
    cuda_api api;       /* resolved entry points; constant after open */
    CUdevice dev;
    CUcontext ctx;      /* retained primary context, NULL until retained */
    pthread_mutex_t lock; /* guards err */
    char err[256];      /* last failure, "" when none */
};

struct kw_cuda_fn {
    kw_cuda *c; /* borrowed: the handle the module was loaded into */
    CUmodule mod;
    CUfunction fn;
    _Atomic unsigned shmem_max; /* dynamic shared memory opted in so far */
};

struct kw_cuda_timer {
    kw_cuda *c;
    CUevent start, stop;
};

/* Records a formatted failure in c->err under c's lock. */
static void set_error(kw_cuda *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&c->lock);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    pthread_mutex_unlock(&c->lock);
    va_end(ap);
}

/* Names a CUresult.  cuGetErrorName comes first; the fallbacks are the
 * codes cuInit returns from drivers that cannot name them (the toolkit's
 * stub library answers every call with CUDA_ERROR_STUB_LIBRARY). */
static const char *cu_name(const kw_cuda *c, CUresult r)
{
    const char *name = NULL;
    if (c->api.get_error_name(r, &name) == CUDA_SUCCESS && name)
        return name;
    switch (r) {
    case CUDA_ERROR_NOT_INITIALIZED:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY:
        return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_NO_DEVICE:
        return "CUDA_ERROR_NO_DEVICE";
    default:
        return "unnamed CUresult";
    }
}

/* Returns 0 for CUDA_SUCCESS; otherwise records "call: CUDA_ERROR_..." and
 * returns KW_ECUDA.  The one place CUresult becomes a kw_err.h code. */
static int check(kw_cuda *c, CUresult r, const char *call)
{
    if (r == CUDA_SUCCESS)
        return 0;
    set_error(c, "%s: %s (%d)", call, cu_name(c, r), (int)r);
    return KW_ECUDA;
}

/* dlopens the driver named by KW_LIBCUDA (default libcuda.so.1) and
 * resolves every entry point.  RTLD_NODELETE keeps it mapped after
 * dlclose(), since an initialised driver cannot be safely unloaded.
 * Returns 0 or KW_ENODRIVER (reason in c->err). */
static int load_driver(kw_cuda *c)
{
    const char *path = getenv("KW_LIBCUDA");
    if (!path || !*path)
        path = DEFAULT_LIBCUDA;
    c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!c->lib) {
        const char *why = dlerror();
        set_error(c, "libcuda: dlopen(%s) failed: %s", path,
                  why ? why : "unknown error");
        return KW_ENODRIVER;
    }
    void *sym;
#define XX(field, name, type)                                                \
    if (!(sym = dlsym(c->lib, name))) {                                      \
        set_error(c, "libcuda: %s has no %s: not a CUDA driver", path,       \
                  name);                                                     \
        return KW_ENODRIVER;                                                 \
    }                                                                        \
    memcpy(&c->api.field, &sym, sizeof(sym)); /* POSIX: same size */
    CUDA_SYMS(XX)
#undef XX
    return 0;
}

/* cuInit, then the device and its primary context, made current.  Returns
 * 0, KW_ENODRIVER (cuInit failed), KW_EINVAL (no such device), KW_ECUDA. */
static int init_device(kw_cuda *c, int device)
{
    int rc = check(c, c->api.init(0), "cuInit");
    if (rc < 0) {
        char why[sizeof(c->err)];
        memcpy(why, c->err, sizeof(why));
        set_error(c, "libcuda: no usable CUDA device: %s", why);
        return KW_ENODRIVER;
    }
    int count = 0;
    if ((rc = check(c, c->api.device_get_count(&count), "cuDeviceGetCount")))
        return rc;
    if (device < 0 || device >= count) {
        set_error(c, "libcuda: device %d out of range (%d devices)", device,
                  count);
        return KW_EINVAL;
    }
    if ((rc = check(c, c->api.device_get(&c->dev, device), "cuDeviceGet")))
        return rc;
    rc = check(c, c->api.primary_ctx_retain(&c->ctx, c->dev),
               "cuDevicePrimaryCtxRetain");
    if (rc < 0) {
        c->ctx = NULL;
        return rc;
    }
    return check(c, c->api.ctx_set_current(c->ctx), "cuCtxSetCurrent");
}

int kw_cuda_open(kw_cuda **out, int device, char *err, size_t errcap)
{
    if (err && errcap)
        err[0] = '\0';
    if (!out)
        return KW_EINVAL;
    kw_cuda *c = calloc(1, sizeof(*c));
    if (!c) {
        if (err && errcap)
            snprintf(err, errcap, "libcuda: out of memory");
        return KW_ENOMEM;
    }
    int rc = pthread_mutex_init(&c->lock, NULL);
    if (rc) {
        free(c);
        return -rc;
    }
    if ((rc = load_driver(c)) == 0)
        rc = init_device(c, device);
    if (rc < 0) {
        if (err && errcap)
            snprintf(err, errcap, "%s", c->err);
        kw_cuda_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kw_cuda_close(kw_cuda *c)
{
    if (!c)
        return;
    if (c->ctx)
        (void)c->api.primary_ctx_release(c->dev);
    if (c->lib)
        dlclose(c->lib);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

const char *kw_cuda_last_error(const kw_cuda *c)
{
    return c ? c->err : "no CUDA handle";
}

void kw_cuda_last_error_copy(kw_cuda *c, char *buf, size_t cap)
{
    if (!buf || !cap)
        return;
    if (!c) {
        snprintf(buf, cap, "no CUDA handle");
        return;
    }
    pthread_mutex_lock(&c->lock);
    snprintf(buf, cap, "%s", c->err);
    pthread_mutex_unlock(&c->lock);
}

int kw_cuda_device_info(kw_cuda *c, char *name, size_t cap, int *cc_major,
                        int *cc_minor, int *sm_count)
{
    static const struct {
        CUdevice_attribute attr;
        size_t slot;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 1},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 2},
    };
    int *outs[3] = {cc_major, cc_minor, sm_count};
    int rc;
    if (name && cap) {
        int len = cap > 1024 ? 1024 : (int)cap;
        rc = check(c, c->api.device_get_name(name, len, c->dev),
                   "cuDeviceGetName");
        if (rc < 0)
            return rc;
        name[cap - 1] = '\0';
    }
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        if (!outs[attrs[i].slot])
            continue;
        rc = check(c, c->api.device_get_attribute(outs[attrs[i].slot],
                                                  attrs[i].attr, c->dev),
                   "cuDeviceGetAttribute");
        if (rc < 0)
            return rc;
    }
    return 0;
}

int kw_cuda_make_current(kw_cuda *c)
{
    return check(c, c->api.ctx_set_current(c->ctx), "cuCtxSetCurrent");
}

/* True when [off, off + size) lies inside len bytes. */
static bool in_bounds(uint64_t off, uint64_t size, size_t len)
{
    return off <= len && size <= len - off;
}

/* True when a 64-bit ELF image keeps its program and section header tables
 * and every section with file contents inside len bytes.  The driver trusts
 * these offsets, so a truncated cubin must be refused before it sees it. */
static bool elf_fits(const uint8_t *img, size_t len)
{
    Elf64_Ehdr eh;
    if (len < sizeof(eh))
        return false;
    memcpy(&eh, img, sizeof(eh));
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        (eh.e_shnum && eh.e_shentsize != sizeof(Elf64_Shdr)) ||
        !in_bounds(eh.e_shoff, (uint64_t)eh.e_shnum * eh.e_shentsize, len) ||
        !in_bounds(eh.e_phoff, (uint64_t)eh.e_phnum * eh.e_phentsize, len))
        return false;
    for (size_t i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, img + eh.e_shoff + i * sizeof(sh), sizeof(sh));
        if (sh.sh_type != SHT_NOBITS &&
            !in_bounds(sh.sh_offset, sh.sh_size, len))
            return false;
    }
    return true;
}

/* Accepts a cubin whose ELF structure fits in len, or PTX text with its NUL
 * inside len.  Fatbins are refused: their length is not checkable here. */
static bool image_ok(const void *image, size_t len)
{
    static const uint8_t fatbin_magic[4] = {0x50, 0xed, 0x55, 0xba};
    const uint8_t *img = image;
    if (len >= SELFMAG && memcmp(img, ELFMAG, SELFMAG) == 0)
        return elf_fits(img, len);
    if (len >= 4 && memcmp(img, fatbin_magic, 4) == 0)
        return false;
    return len > 0 && memchr(img, '\0', len) != NULL;
}

int kw_cuda_load(kw_cuda *c, const void *image, size_t len, const char *entry,
                 kw_cuda_fn **out)
{
    if (!c || !image || !entry || !out)
        return KW_EINVAL;
    if (!image_ok(image, len)) {
        set_error(c, "kw_cuda_load: not a complete cubin or PTX image "
                     "(%zu bytes)", len);
        return KW_EINVAL;
    }
    kw_cuda_fn *f = calloc(1, sizeof(*f));
    if (!f)
        return KW_ENOMEM;
    f->c = c;
    int rc = check(c, c->api.module_load_data(&f->mod, image),
                   "cuModuleLoadData");
    if (rc < 0) {
        free(f);
        return rc;
    }
    rc = check(c, c->api.module_get_function(&f->fn, f->mod, entry),
               "cuModuleGetFunction");
    if (rc < 0) {
        kw_cuda_unload(f);
        return rc;
    }
    *out = f;
    return 0;
}

void kw_cuda_unload(kw_cuda_fn *f)
{
    if (!f)
        return;
    if (f->mod)
        (void)check(f->c, f->c->api.module_unload(f->mod), "cuModuleUnload");
    free(f);
}

int kw_cuda_launch(kw_cuda_fn *f, const unsigned grid[3],
                   const unsigned block[3], unsigned shmem, void **args)
{
    return kw_cuda_launch_on(f, grid, block, shmem, args, 0);
}

int kw_cuda_launch_on(kw_cuda_fn *f, const unsigned grid[3],
                      const unsigned block[3], unsigned shmem, void **args,
                      uintptr_t stream)
{
    if (!f || !grid || !block)
        return KW_EINVAL;
    kw_cuda *c = f->c;
    int rc;
    /* The opt-in is a driver call: made once per size, not per launch. */
    if (shmem > STATIC_SMEM_LIMIT && shmem > f->shmem_max) {
        CUfunction_attribute attr =
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        rc = check(c, c->api.func_set_attribute(f->fn, attr, (int)shmem),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
        if (rc < 0)
            return rc;
        f->shmem_max = shmem;
    }
    return check(c, c->api.launch_kernel(f->fn, grid[0], grid[1], grid[2],
                                         block[0], block[1], block[2], shmem,
                                         (CUstream)stream, args, NULL),
                 "cuLaunchKernel");
}

int kw_cuda_stream_capturing(kw_cuda *c, uintptr_t stream, bool *out)
{
    if (!c || !out)
        return KW_EINVAL;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    int rc = check(c, c->api.stream_is_capturing((CUstream)stream, &st),
                   "cuStreamIsCapturing");
    /* A legacy-stream query while another stream captures fails with
     * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: that too is "capturing". */
    *out = rc < 0 || st != CU_STREAM_CAPTURE_STATUS_NONE;
    return 0;
}

int kw_cuda_alloc(kw_cuda *c, size_t n, uint64_t *dptr)
{
    if (!c || !dptr || n == 0)
        return KW_EINVAL;
    CUdeviceptr p = 0;
    int rc = check(c, c->api.mem_alloc(&p, n), "cuMemAlloc");
    if (rc == 0)
        *dptr = (uint64_t)p;
    return rc;
}

void kw_cuda_free(kw_cuda *c, uint64_t dptr)
{
    if (c && dptr)
        (void)check(c, c->api.mem_free((CUdeviceptr)dptr), "cuMemFree");
}

int kw_cuda_h2d(kw_cuda *c, uint64_t dst, const void *src, size_t n)
{
    return check(c, c->api.memcpy_htod((CUdeviceptr)dst, src, n),
                 "cuMemcpyHtoD");
}

int kw_cuda_d2h(kw_cuda *c, void *dst, uint64_t src, size_t n)
{
    return check(c, c->api.memcpy_dtoh(dst, (CUdeviceptr)src, n),
                 "cuMemcpyDtoH");
}

int kw_cuda_d2d(kw_cuda *c, uint64_t dst, uint64_t src, size_t n)
{
    return check(c, c->api.memcpy_dtod((CUdeviceptr)dst, (CUdeviceptr)src, n),
                 "cuMemcpyDtoD");
}

int kw_cuda_memset(kw_cuda *c, uint64_t dst, uint8_t byte, size_t n)
{
    return check(c, c->api.memset_d8((CUdeviceptr)dst, byte, n),
                 "cuMemsetD8");
}

int kw_cuda_sync(kw_cuda *c)
{
    return check(c, c->api.ctx_synchronize(), "cuCtxSynchronize");
}

int kw_cuda_timer_new(kw_cuda *c, kw_cuda_timer **out)
{
    if (!c || !out)
        return KW_EINVAL;
    kw_cuda_timer *t = calloc(1, sizeof(*t));
    if (!t)
        return KW_ENOMEM;
    t->c = c;
    int rc = check(c, c->api.event_create(&t->start, CU_EVENT_DEFAULT),
                   "cuEventCreate");
    if (rc == 0)
        rc = check(c, c->api.event_create(&t->stop, CU_EVENT_DEFAULT),
                   "cuEventCreate");
    if (rc < 0) {
        kw_cuda_timer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kw_cuda_timer_free(kw_cuda_timer *t)
{
    if (!t)
        return;
    if (t->start)
        (void)t->c->api.event_destroy(t->start);
    if (t->stop)
        (void)t->c->api.event_destroy(t->stop);
    free(t);
}

int kw_cuda_timer_start(kw_cuda_timer *t)
{
    return check(t->c, t->c->api.event_record(t->start, NULL),
                 "cuEventRecord");
}

int kw_cuda_timer_stop_ms(kw_cuda_timer *t, float *ms)
{
    kw_cuda *c = t->c;
    int rc = check(c, c->api.event_record(t->stop, NULL), "cuEventRecord");
    if (rc == 0)
        rc = check(c, c->api.event_synchronize(t->stop), "cuEventSynchronize");
    if (rc == 0)
        rc = check(c, c->api.event_elapsed_time(ms, t->start, t->stop),
                   "cuEventElapsedTime");
    return rc;
}

/* kw_k_dev adapters: ctx is the kw_cuda_fn given to kw_cuda_dev_ops(). */
static int ops_alloc(void *ctx, size_t n, uint64_t *dptr)
{
    return kw_cuda_alloc(((kw_cuda_fn *)ctx)->c, n, dptr);
}

static void ops_free(void *ctx, uint64_t dptr)
{
    kw_cuda_free(((kw_cuda_fn *)ctx)->c, dptr);
}

static int ops_h2d(void *ctx, uint64_t dst, const void *src, size_t n)
{
    return kw_cuda_h2d(((kw_cuda_fn *)ctx)->c, dst, src, n);
}

static int ops_d2h(void *ctx, void *dst, uint64_t src, size_t n)
{
    return kw_cuda_d2h(((kw_cuda_fn *)ctx)->c, dst, src, n);
}

static int ops_launch(void *ctx, const unsigned grid[3],
                      const unsigned block[3], unsigned shmem, void **args)
{
    return kw_cuda_launch(ctx, grid, block, shmem, args);
}

static int ops_sync(void *ctx)
{
    return kw_cuda_sync(((kw_cuda_fn *)ctx)->c);
}

void kw_cuda_dev_ops(kw_cuda *c, kw_cuda_fn *fn, kw_k_dev *out)
{
    assert(fn && fn->c == c && out);
    (void)c; /* fn knows its handle; c only names which one it must be */
    *out = (kw_k_dev){
        .ctx = fn,
        .alloc = ops_alloc,
        .free = ops_free,
        .h2d = ops_h2d,
        .d2h = ops_d2h,
        .launch = ops_launch,
        .sync = ops_sync,
    };
}
