/* test_cuda.c: the dlopen'ed CUDA driver (client/kw_cuda.h).
 * The no-driver tests run everywhere; the GPU tests skip themselves when
 * kw_cuda_open() reports KW_ENODRIVER. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_dev.h" /* kw_cuda, kw_cuda_dev_ops */
#include "kw_err.h"
#include "kw_jit.h"
#include "kw_keys.h"

/* Opens kw_cuda with KW_LIBCUDA set to lib and expects KW_ENODRIVER with a
 * message that mentions "libcuda" and want; *out must stay untouched. */
static void expect_no_driver(const char *lib, const char *want)
{
    cr_assert_eq(setenv("KW_LIBCUDA", lib, 1), 0);
    kw_cuda *c = (kw_cuda *)&c; /* a sentinel that must survive */
    char err[256];
    cr_assert_eq(kw_cuda_open(&c, 0, err, sizeof(err)), KW_ENODRIVER,
                 "%s: %s", lib, err);
    cr_assert_eq(c, (kw_cuda *)&c, "*out touched on error");
    cr_assert_not_null(strstr(err, "libcuda"), "%s", err);
    cr_assert_not_null(strstr(err, want), "%s", err);
}

Test(cuda, open_without_driver_returns_enodriver_naming_libcuda)
{
    unsetenv("KW_LIBCUDA");
    kw_cuda *c = NULL;
    char err[256];
    int rc = kw_cuda_open(&c, 0, err, sizeof(err));
    if (rc == 0) {
        kw_cuda_close(c);
        cr_skip_test("a CUDA driver is present");
    }
    cr_assert_eq(rc, KW_ENODRIVER, "%d: %s", rc, err);
    cr_assert_not_null(strstr(err, "libcuda"), "%s", err);
}

Test(cuda, kw_libcuda_pointing_nowhere_returns_enodriver)
{
    expect_no_driver("/nonexistent/libcuda.so.1", "/nonexistent");
}

Test(cuda, kw_libcuda_pointing_at_libm_returns_enodriver)
{
    expect_no_driver("libm.so.6", "not a CUDA driver");
}

Test(cuda, kw_libcuda_pointing_at_a_non_library_returns_enodriver)
{
    expect_no_driver(KW_FIXTURES "/glm-5.2.json", "dlopen");
}

Test(cuda, toolkit_stub_library_fails_cuinit_with_enodriver)
{
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (access(stub, R_OK) != 0)
        cr_skip_test("no %s", stub);
    expect_no_driver(stub, "cuInit: CUDA_ERROR_STUB_LIBRARY");
}

Test(cuda, null_arguments_and_handles_are_safe)
{
    char err[8] = "x";
    cr_assert_eq(kw_cuda_open(NULL, 0, err, sizeof(err)), KW_EINVAL);
    kw_cuda_close(NULL);
    kw_cuda_unload(NULL);
    kw_cuda_timer_free(NULL);
    cr_assert_not_null(kw_cuda_last_error(NULL));
    char buf[32];
    kw_cuda_last_error_copy(NULL, buf, sizeof(buf));
    cr_assert_str_eq(buf, "no CUDA handle");
    /* an error text longer than the buffer is truncated, NUL-terminated */
    cr_assert_eq(setenv("KW_LIBCUDA", "/nonexistent/libcuda.so.1", 1), 0);
    kw_cuda *c = NULL;
    cr_assert_eq(kw_cuda_open(&c, 0, err, sizeof(err)), KW_ENODRIVER);
    cr_assert_eq(strlen(err), sizeof(err) - 1);
}

/* ---- GPU tests: each opens device 0 or skips ------------------------- */

static kw_cuda *open_gpu(void)
{
    unsetenv("KW_LIBCUDA");
    kw_cuda *c = NULL;
    char err[256];
    int rc = kw_cuda_open(&c, 0, err, sizeof(err));
    if (rc == KW_ENODRIVER)
        cr_skip_test("no CUDA driver");
    cr_assert_eq(rc, 0, "kw_cuda_open: %s: %s", kw_err_name(rc), err);
    return c;
}

static const char gpu_src[] =
    "template <int N, int M>\n"
    "__global__ void kw_k_affine(int *out, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) out[i] = N * i + M;\n"
    "}\n"
    "extern \"C\" __global__ void kw_k_smem(int *out)\n"
    "{\n"
    "    extern __shared__ int buf[];\n"
    "    int words = 100 * 1024 / 4;\n"
    "    for (int i = threadIdx.x; i < words; i += blockDim.x) buf[i] = i;\n"
    "    __syncthreads();\n"
    "    out[threadIdx.x] = buf[words - 1 - threadIdx.x];\n"
    "}\n"
    "extern \"C\" __global__ void kw_k_trap(void) { __trap(); }\n";

/* Writes "sm_<major><minor>" for c's device into arch. */
static void device_arch(kw_cuda *c, char *arch, size_t cap)
{
    int major = 0, minor = 0;
    cr_assert_eq(kw_cuda_device_info(c, NULL, 0, &major, &minor, NULL), 0);
    snprintf(arch, cap, "sm_%d%d", major, minor);
}

/* Compiles gpu_src for c's device and loads entry (a name expression for
 * the template, or an extern "C" name). */
static kw_cuda_fn *load_gpu_fn(kw_cuda *c, const char *expr)
{
    char arch[16];
    device_arch(c, arch, sizeof(arch));
    bool templ = strchr(expr, '<') != NULL;
    kw_jit_req req = {.source = gpu_src, .source_name = "gpu.cu",
                      .name_expr = templ ? expr : NULL, .arch = arch};
    kw_jit_result res;
    int rc = kw_jit_compile(&req, &res);
    cr_assert_eq(rc, 0, "%s: %s", arch, res.log ? res.log : "");
    kw_cuda_fn *fn = NULL;
    rc = kw_cuda_load(c, res.cubin, res.cubin_len,
                      templ ? res.lowered_name : expr, &fn);
    cr_assert_eq(rc, 0, "%s", kw_cuda_last_error(c));
    kw_jit_result_destroy(&res);
    return fn;
}

Test(cuda, gpu_device_info_reports_name_and_capability)
{
    kw_cuda *c = open_gpu();
    char name[128];
    int major = 0, minor = -1, sms = 0;
    cr_assert_eq(kw_cuda_device_info(c, name, sizeof(name), &major, &minor,
                                     &sms), 0);
    cr_assert(strlen(name) > 0);
    cr_assert(major >= 7 && minor >= 0 && sms > 0, "%d.%d %d", major, minor,
              sms);
    cr_log_info("device 0: %s, sm_%d%d, %d SMs", name, major, minor, sms);
    kw_cuda_close(c);
}

Test(cuda, gpu_launch_of_compiled_template_writes_expected_values)
{
    kw_cuda *c = open_gpu();
    kw_cuda_fn *fn = load_gpu_fn(c, "kw_k_affine<3, 7>");
    enum { N = 1000 };
    uint64_t d = 0;
    cr_assert_eq(kw_cuda_alloc(c, N * sizeof(int), &d), 0);
    cr_assert_eq(kw_cuda_memset(c, d, 0xff, N * sizeof(int)), 0);
    int n = N;
    void *args[] = {&d, &n};
    unsigned grid[3] = {(N + 255) / 256, 1, 1}, block[3] = {256, 1, 1};
    cr_assert_eq(kw_cuda_launch(fn, grid, block, 0, args), 0);
    cr_assert_eq(kw_cuda_sync(c), 0, "%s", kw_cuda_last_error(c));
    int *host = malloc(N * sizeof(int));
    cr_assert_eq(kw_cuda_d2h(c, host, d, N * sizeof(int)), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(host[i], 3 * i + 7, "out[%d] = %d", i, host[i]);
    free(host);
    kw_cuda_free(c, d);
    kw_cuda_unload(fn);
    kw_cuda_close(c);
}

Test(cuda, gpu_launch_above_48k_dynamic_smem_sets_the_attribute)
{
    kw_cuda *c = open_gpu();
    kw_cuda_fn *fn = load_gpu_fn(c, "kw_k_smem");
    uint64_t d = 0;
    cr_assert_eq(kw_cuda_alloc(c, 128 * sizeof(int), &d), 0);
    void *args[] = {&d};
    unsigned grid[3] = {1, 1, 1}, block[3] = {128, 1, 1};
    cr_assert_eq(kw_cuda_launch(fn, grid, block, 100 * 1024, args), 0, "%s",
                 kw_cuda_last_error(c));
    cr_assert_eq(kw_cuda_sync(c), 0, "%s", kw_cuda_last_error(c));
    int host[128];
    cr_assert_eq(kw_cuda_d2h(c, host, d, sizeof(host)), 0);
    for (int i = 0; i < 128; i++)
        cr_assert_eq(host[i], 100 * 1024 / 4 - 1 - i);
    kw_cuda_free(c, d);
    kw_cuda_unload(fn);
    kw_cuda_close(c);
}

Test(cuda, gpu_bad_images_and_entries_are_refused_with_a_reason)
{
    kw_cuda *c = open_gpu();
    kw_cuda_fn *fn = NULL;
    static const char junk[] = "this is not a cubin";
    cr_assert_eq(kw_cuda_load(c, junk, sizeof(junk), "k", &fn), KW_ECUDA);
    cr_assert_not_null(strstr(kw_cuda_last_error(c), "cuModuleLoadData"));
    cr_assert_eq(kw_cuda_load(c, junk, 4, "k", &fn), KW_EINVAL, "no NUL");

    char arch[16];
    device_arch(c, arch, sizeof(arch));
    kw_jit_req req = {.source = gpu_src, .arch = arch};
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), 0);
    cr_assert_eq(kw_cuda_load(c, res.cubin, res.cubin_len / 2, "kw_k_smem",
                              &fn), KW_EINVAL, "truncated cubin");
    cr_assert_eq(kw_cuda_load(c, res.cubin, res.cubin_len, "kw_k_nope", &fn),
                 KW_ECUDA);
    cr_assert_not_null(strstr(kw_cuda_last_error(c), "cuModuleGetFunction"));
    cr_assert_null(fn);
    kw_jit_result_destroy(&res);
    kw_cuda_close(c);
}

Test(cuda, gpu_trapping_kernel_is_reported_by_sync)
{
    kw_cuda *c = open_gpu();
    kw_cuda_fn *fn = load_gpu_fn(c, "kw_k_trap");
    unsigned one[3] = {1, 1, 1};
    int rc = kw_cuda_launch(fn, one, one, 0, NULL);
    if (rc == 0)
        rc = kw_cuda_sync(c);
    cr_assert_eq(rc, KW_ECUDA);
    cr_assert_not_null(strstr(kw_cuda_last_error(c), "CUDA_ERROR"), "%s",
                       kw_cuda_last_error(c));
    /* the context is now unusable; the process ends with the test */
    kw_cuda_unload(fn);
    kw_cuda_close(c);
}

/* Device buffers of one prefill indexer_logits launch: T queries whose
 * windows are all N rows of zero bytes; slots follow the kernel's
 * parameters (q, w, k, k_scale, ks, ke, -, -, -, logits). */
static void logits_buffers(kw_cuda *c, uint64_t *d, int t, int n)
{
    const size_t bytes[] = {(size_t)t * 64 * 128, (size_t)t * 64 * 4,
                            (size_t)n * 128, (size_t)n * 4, (size_t)t * 4,
                            (size_t)t * 4, (size_t)t * n * 4};
    const int slot[] = {0, 1, 2, 3, 4, 5, 9};
    for (int i = 0; i < 7; i++) {
        cr_assert_eq(kw_cuda_alloc(c, bytes[i], &d[slot[i]]), 0);
        cr_assert_eq(kw_cuda_memset(c, d[slot[i]], 0, bytes[i]), 0);
    }
    int ke[64];
    for (int i = 0; i < t; i++)
        ke[i] = n;
    cr_assert_eq(kw_cuda_h2d(c, d[5], ke, (size_t)t * 4), 0);
}

/* Compiles k (its arch: c's device's) and loads its kernel. */
static kw_cuda_fn *load_v32_prefill(kw_cuda *c, kw_keys_key *k)
{
    device_arch(c, k->arch, sizeof(k->arch));
    kw_jit_result r;
    cr_assert_eq(kw_keys_compile(k, false, &r), 0, "%s", r.log ? r.log : "");
    kw_cuda_fn *fn = NULL;
    cr_assert_eq(kw_cuda_load(c, r.cubin, r.cubin_len, r.lowered_name, &fn),
                 0, "%s", kw_cuda_last_error(c));
    kw_jit_result_destroy(&r);
    return fn;
}

/* DeepSeek-V3.2's prefill logits key (64 heads of 128) launched with half
 * the threads kw_k_block_threads() gives: its stage barriers count on
 * every warpgroup, so without the kernel's own check it would wait
 * forever (the timeout fails the test); with it the launch fails. */
Test(cuda, gpu_indexer_logits_short_of_threads_fails_not_hangs,
     .timeout = 60)
{
    kw_cuda *c = open_gpu();
    kw_keys_key k = {.family = KW_K_INDEXER_LOGITS,
                     .fields = {64, 128, 0, 0, 1}};
    kw_cuda_fn *fn = load_v32_prefill(c, &k);
    enum { T = 8, N = 4096 };
    uint64_t d[10] = {0};
    logits_buffers(c, d, T, N);
    int t = T, n = N, stride = N;
    void *args[] = {&d[0], &d[1], &d[2], &d[3], &d[4],
                    &d[5], &t,    &n,    &stride, &d[9]};
    unsigned threads = kw_k_block_threads(k.family, k.fields);
    unsigned grid[3] = {1, 1, 1}, block[3] = {threads, 1, 1};
    unsigned shmem = kw_k_shmem_bytes(k.family, k.fields);
    /* the right size runs (so the failure below is the size's) */
    cr_assert_eq(kw_cuda_launch(fn, grid, block, shmem, args), 0);
    cr_assert_eq(kw_cuda_sync(c), 0, "%s", kw_cuda_last_error(c));
    block[0] = threads / 2;
    int rc = kw_cuda_launch(fn, grid, block, shmem, args);
    if (rc == 0)
        rc = kw_cuda_sync(c);
    cr_assert_eq(rc, KW_ECUDA, "%u threads of %u: rc %d", threads / 2,
                 threads, rc);
    cr_assert_not_null(strstr(kw_cuda_last_error(c), "CUDA_ERROR"), "%s",
                       kw_cuda_last_error(c));
    /* the context is now unusable; the process ends with the test */
    kw_cuda_unload(fn);
    kw_cuda_close(c);
}

/* Random inputs of a prefill logits launch of T queries over N rows,
 * stride N + 3: fp8 bytes that are never NaN (e4m3's 0x7f, 0xff), row
 * scales and weights in (0, 1), and windows of every kind: empty, whole,
 * causal, random, and the two mirrored chunks of context parallelism. */
static void logits_random(kw_cuda *c, uint64_t *d, int T, int N)
{
    const size_t n8[] = {(size_t)T * 64 * 128, (size_t)N * 128};
    const int s8[] = {0, 2};
    uint32_t x = 12345;
    for (int b = 0; b < 2; b++) {
        unsigned char *h = malloc(n8[b]);
        for (size_t i = 0; i < n8[b]; i++) {
            x = x * 1664525u + 1013904223u;
            h[i] = (unsigned char)(x >> 24);
            if ((h[i] & 0x7f) == 0x7f)
                h[i] ^= 1;
        }
        cr_assert_eq(kw_cuda_h2d(c, d[s8[b]], h, n8[b]), 0);
        free(h);
    }
    const size_t nf[] = {(size_t)T * 64, (size_t)N};
    const int sf[] = {1, 3};
    for (int b = 0; b < 2; b++) {
        float *h = malloc(nf[b] * 4);
        for (size_t i = 0; i < nf[b]; i++) {
            x = x * 1664525u + 1013904223u;
            h[i] = (float)((x >> 8) + 1) / 16777217.0f;
        }
        cr_assert_eq(kw_cuda_h2d(c, d[sf[b]], h, nf[b] * 4), 0);
        free(h);
    }
    int ks[64], ke[64];
    for (int t = 0; t < T; t++) {
        x = x * 1664525u + 1013904223u;
        int kind = t % 5, r = (int)(x >> 8) % N;
        ks[t] = kind == 3 ? r / 2 : 0;
        ke[t] = kind == 0   ? r / 2
                : kind == 1 ? N
                : kind == 2 ? N - T + t + 1
                : kind == 3 ? r / 2 + (int)(x % (uint32_t)(N - r / 2))
                            : (t < T / 2 ? N / 8 : N - N / 8) + t;
        if (kind == 0)
            ks[t] = ke[t]; /* empty */
    }
    cr_assert_eq(kw_cuda_h2d(c, d[4], ks, (size_t)T * 4), 0);
    cr_assert_eq(kw_cuda_h2d(c, d[5], ke, (size_t)T * 4), 0);
}

/* The prefill split (grid y, launch/'s prefill_split) changes which block
 * computes and fills which columns, never a value: every split writes
 * the same bits as one block per query group, every column included
 * (the output is poisoned before each launch). */
Test(cuda, gpu_indexer_logits_split_over_grid_y_writes_the_same_bits,
     .timeout = 120)
{
    kw_cuda *c = open_gpu();
    kw_keys_key k = {.family = KW_K_INDEXER_LOGITS,
                     .fields = {64, 128, 0, 0, 1}};
    kw_cuda_fn *fn = load_v32_prefill(c, &k);
    enum { T = 40, N = 40000, STRIDE = N + 3 };
    uint64_t d[10] = {0};
    logits_buffers(c, d, T, STRIDE);
    logits_random(c, d, T, N);
    int t = T, n = N, stride = STRIDE;
    void *args[] = {&d[0], &d[1], &d[2], &d[3], &d[4],
                    &d[5], &t,    &n,    &stride, &d[9]};
    unsigned qb = kw_k_logits_queries(k.family, k.fields);
    unsigned block[3] = {kw_k_block_threads(k.family, k.fields), 1, 1};
    unsigned shmem = kw_k_shmem_bytes(k.family, k.fields);
    const size_t bytes = (size_t)T * STRIDE * 4;
    float *want = malloc(bytes), *got = malloc(bytes);
    static const unsigned ys[] = {1, 2, 3, 4, 7, 20, 141};
    for (size_t i = 0; i < sizeof(ys) / sizeof(ys[0]); i++) {
        unsigned grid[3] = {(T + qb - 1) / qb, ys[i], 1};
        cr_assert_eq(kw_cuda_memset(c, d[9], 0x7f, bytes), 0);
        cr_assert_eq(kw_cuda_launch(fn, grid, block, shmem, args), 0);
        cr_assert_eq(kw_cuda_sync(c), 0, "%s", kw_cuda_last_error(c));
        cr_assert_eq(kw_cuda_d2h(c, i ? got : want, d[9], bytes), 0);
        if (i == 0)
            continue;
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < (size_t)T * STRIDE; j++)
            if ((j % STRIDE) < N && memcmp(&got[j], &want[j], 4) != 0 && !bad++)
                first = j;
        cr_assert_eq(bad, 0, "split %u: %zu values differ, first at query "
                     "%zu row %zu", ys[i], bad, first / STRIDE, first % STRIDE);
    }
    free(want);
    free(got);
    for (int i = 0; i < 10; i++)
        kw_cuda_free(c, d[i]);
    kw_cuda_unload(fn);
    kw_cuda_close(c);
}

Test(cuda, gpu_event_timer_measures_a_device_copy)
{
    kw_cuda *c = open_gpu();
    size_t n = 256u << 20;
    uint64_t a = 0, b = 0;
    cr_assert_eq(kw_cuda_alloc(c, n, &a), 0);
    cr_assert_eq(kw_cuda_alloc(c, n, &b), 0);
    cr_assert_eq(kw_cuda_memset(c, a, 0x5a, n), 0);
    kw_cuda_timer *t = NULL;
    cr_assert_eq(kw_cuda_timer_new(c, &t), 0);
    float ms = -1.0f;
    cr_assert_eq(kw_cuda_timer_start(t), 0);
    cr_assert_eq(kw_cuda_d2d(c, b, a, n), 0);
    cr_assert_eq(kw_cuda_timer_stop_ms(t, &ms), 0, "%s", kw_cuda_last_error(c));
    cr_assert(ms > 0.0f && ms < 10000.0f, "%f ms", (double)ms);
    cr_log_info("d2d %zu MiB: %.3f ms, %.0f GB/s (read + write)", n >> 20,
                (double)ms, 2.0 * (double)n / ((double)ms * 1e6));
    unsigned char probe[16];
    cr_assert_eq(kw_cuda_d2h(c, probe, b + n - 16, 16), 0);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(probe[i], 0x5a);
    kw_cuda_timer_free(t);
    kw_cuda_free(c, a);
    kw_cuda_free(c, b);
    kw_cuda_close(c);
}

Test(cuda, gpu_dev_ops_run_the_loaded_function)
{
    kw_cuda *c = open_gpu();
    kw_cuda_fn *fn = load_gpu_fn(c, "kw_k_affine<2, -1>");
    kw_k_dev dev;
    kw_cuda_dev_ops(c, fn, &dev);
    cr_assert_eq(dev.ctx, fn);
    enum { N = 64 };
    uint64_t d = 0;
    cr_assert_eq(dev.alloc(dev.ctx, N * sizeof(int), &d), 0);
    int host[N] = {0};
    cr_assert_eq(dev.h2d(dev.ctx, d, host, sizeof(host)), 0);
    int n = N;
    void *args[] = {&d, &n};
    unsigned grid[3] = {1, 1, 1}, block[3] = {N, 1, 1};
    cr_assert_eq(dev.launch(dev.ctx, grid, block, 0, args), 0);
    cr_assert_eq(dev.sync(dev.ctx), 0);
    cr_assert_eq(dev.d2h(dev.ctx, host, d, sizeof(host)), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(host[i], 2 * i - 1);
    dev.free(dev.ctx, d);
    kw_cuda_unload(fn);
    kw_cuda_close(c);
}

/* A worker thread makes the context current, then uses device memory. */
static void *worker(void *arg)
{
    kw_cuda *c = arg;
    uint64_t d = 0;
    intptr_t rc = kw_cuda_make_current(c);
    if (rc == 0)
        rc = kw_cuda_alloc(c, 4096, &d);
    if (rc == 0)
        rc = kw_cuda_memset(c, d, 1, 4096);
    kw_cuda_free(c, d);
    return (void *)rc;
}

Test(cuda, gpu_worker_thread_uses_the_context_after_make_current)
{
    kw_cuda *c = open_gpu();
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, worker, c), 0);
    void *ret = (void *)1;
    cr_assert_eq(pthread_join(th, &ret), 0);
    cr_assert_eq((intptr_t)ret, 0, "%s", kw_cuda_last_error(c));
    kw_cuda_close(c);
}
