/* test_jit.c: NVRTC compile of one kernel instantiation (jit/kw_jit.h).
 * Needs NVRTC and the toolkit headers, no GPU. */
#include <criterion/criterion.h>
#include <elf.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kw_err.h"
#include "kw_jit.h"
#include "kw_test_util.h"

#define EM_CUDA_MACHINE 190

static const char tiny_src[] =
    "template <int N, int M, bool B>\n"
    "__global__ void kw_k_foo(int *out)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    out[i] = B ? N * i + M : -1;\n"
    "}\n";

static kw_jit_req tiny_req(const char *name_expr, const char *arch)
{
    kw_jit_req req = {
        .source = tiny_src,
        .source_name = "tiny.cu",
        .name_expr = name_expr,
        .arch = arch,
    };
    return req;
}

Test(jit, sm90_cubin_is_cuda_elf_holding_the_lowered_name)
{
    kw_jit_req req = tiny_req("kw_k_foo<16, 1, true>", "sm_90");
    kw_jit_result res;
    int rc = kw_jit_compile(&req, &res);
    cr_assert_eq(rc, 0, "rc %d, log: %s", rc, res.log ? res.log : "");
    cr_assert(res.cubin_len > 64);
    cr_assert_eq(memcmp(res.cubin, "\x7f" "ELF", 4), 0);
    cr_assert_eq(res.cubin[4], 2, "not ELFCLASS64");
    cr_assert_eq(kw_test_elf_machine(res.cubin, res.cubin_len),
                 EM_CUDA_MACHINE);
    cr_assert_not_null(res.lowered_name);
    cr_assert_str_eq(res.lowered_name, "_Z8kw_k_fooILi16ELi1ELb1EEvPi");
    cr_assert(kw_test_elf_has_symbol(res.cubin, res.cubin_len,
                                     res.lowered_name));
    cr_assert_not(kw_test_elf_has_symbol(res.cubin, res.cubin_len,
                                         "kw_k_no_such_kernel"));
    cr_assert_null(res.ptx, "PTX only when asked");
    cr_assert(res.seconds > 0.0);
    kw_jit_result_destroy(&res);
}

Test(jit, elf_helpers_reject_truncated_or_foreign_images)
{
    kw_jit_req req = tiny_req("kw_k_foo<1, 2, false>", "sm_90");
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), 0);
    /* Every prefix, copied to a buffer of exactly its size, is a bounds test:
     * no read may leave it (ASan checks).  A header-only prefix cannot hold
     * the symbol, and once the tables it needs fit, longer prefixes find it
     * too. */
    bool found_before = false;
    for (size_t len = 0; len <= res.cubin_len; len++) {
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, res.cubin, len);
        bool found = kw_test_elf_has_symbol(copy, len, res.lowered_name);
        free(copy);
        if (len <= sizeof(Elf64_Ehdr))
            cr_assert_not(found, "found in a %zu-byte prefix", len);
        cr_assert(found || !found_before, "lost at %zu bytes", len);
        found_before = found;
    }
    cr_assert(found_before, "the whole image holds the symbol");
    Elf64_Ehdr eh;
    memcpy(&eh, res.cubin, sizeof(eh));
    /* A section header table pointing past the end is refused. */
    eh.e_shoff = res.cubin_len;
    memcpy(res.cubin, &eh, sizeof(eh));
    cr_assert_not(kw_test_elf_has_symbol(res.cubin, res.cubin_len,
                                         res.lowered_name));
    cr_assert_eq(kw_test_elf_machine((const uint8_t *)"\x7f" "ELF", 4), -1);
    cr_assert_eq(kw_test_elf_machine((const uint8_t *)tiny_src,
                                     sizeof(tiny_src)), -1);
    kw_jit_result_destroy(&res);
}

Test(jit, broken_source_returns_envrtc_with_log_naming_the_line)
{
    kw_jit_req req = {
        .source = "__global__ void kw_k_bad(int *p)\n"
                  "{\n"
                  "    p[0] = kw_undefined_thing;\n"
                  "}\n",
        .source_name = "broken.cu",
        .arch = "sm_90",
    };
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), KW_ENVRTC);
    cr_assert_not_null(res.log);
    cr_assert_not_null(strstr(res.log, "broken.cu(3)"), "log: %s", res.log);
    cr_assert_not_null(strstr(res.log, "kw_undefined_thing"));
    cr_assert_not_null(strstr(res.log, "NVRTC_ERROR_COMPILATION"));
    cr_assert_null(res.cubin);
    cr_assert_null(res.lowered_name);
    kw_jit_result_destroy(&res);
    kw_jit_result_destroy(&res); /* idempotent */
    kw_jit_result_destroy(NULL);
}

Test(jit, unknown_name_expression_returns_envrtc)
{
    kw_jit_req req = tiny_req("kw_k_missing<1>", "sm_90");
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), KW_ENVRTC);
    cr_assert_not_null(res.log);
    kw_jit_result_destroy(&res);
}

Test(jit, bad_option_returns_envrtc_naming_the_call)
{
    const char *extra[] = {"--no-such-option"};
    kw_jit_req req = tiny_req("kw_k_foo<1, 1, true>", "sm_90");
    req.extra_opts = extra;
    req.nextra = 1;
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), KW_ENVRTC);
    cr_assert_not_null(strstr(res.log, "nvrtcCompileProgram"), "%s", res.log);
    kw_jit_result_destroy(&res);
}

Test(jit, bad_arch_returns_einval_with_a_reason)
{
    const char *bad[] = {"sm_9", "sm_1000", "compute_90", "sm_90x", "sm_",
                         "SM_90", "sm_50", "sm_80a", "sm_90f", "sm_90 ", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_not(kw_jit_arch_valid(bad[i]), "%s", bad[i]);
        kw_jit_req req = tiny_req(NULL, bad[i]);
        kw_jit_result res;
        cr_assert_eq(kw_jit_compile(&req, &res), KW_EINVAL, "%s", bad[i]);
        cr_assert_not_null(res.log);
        cr_assert_not_null(strstr(res.log, "arch"), "%s", res.log);
        kw_jit_result_destroy(&res);
    }
    kw_jit_req req = tiny_req(NULL, NULL);
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), KW_EINVAL);
    kw_jit_result_destroy(&res);
    cr_assert_eq(kw_jit_compile(NULL, &res), KW_EINVAL);
    cr_assert_eq(kw_jit_compile(&req, NULL), KW_EINVAL);
}

Test(jit, arch_valid_accepts_real_and_feature_archs)
{
    const char *good[] = {"sm_80", "sm_90", "sm_90a", "sm_100", "sm_100a",
                          "sm_100f", "sm_120f"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_assert(kw_jit_arch_valid(good[i]), "%s", good[i]);
}

Test(jit, feature_arch_sm_100f_compiles)
{
    kw_jit_req req = tiny_req("kw_k_foo<2, 0, true>", "sm_100f");
    kw_jit_result res;
    int rc = kw_jit_compile(&req, &res);
    cr_assert_eq(rc, 0, "log: %s", res.log ? res.log : "");
    cr_assert_eq(kw_test_elf_machine(res.cubin, res.cubin_len),
                 EM_CUDA_MACHINE);
    kw_jit_result_destroy(&res);
}

Test(jit, ptx_on_request_contains_the_entry)
{
    kw_jit_req req = tiny_req("kw_k_foo<4, 0, true>", "sm_90");
    req.want_ptx = true;
    kw_jit_result res;
    cr_assert_eq(kw_jit_compile(&req, &res), 0);
    cr_assert_not_null(res.ptx);
    cr_assert_eq(res.ptx_len, strlen(res.ptx));
    cr_assert_not_null(strstr(res.ptx, ".entry"));
    cr_assert_not_null(strstr(res.ptx, res.lowered_name));
    cr_assert_not_null(strstr(res.ptx, ".target sm_90"));
    kw_jit_result_destroy(&res);
}

Test(jit, named_header_resolves_include)
{
    kw_jit_header hdr = {"kw_scale.cuh",
                         "#define KW_SCALE 7\n"
                         "extern \"C\" __global__ void kw_k_scale(int *p)"
                         " { p[threadIdx.x] *= KW_SCALE; }\n"};
    kw_jit_req req = {
        .source = "#include \"kw_scale.cuh\"\n",
        .headers = &hdr,
        .nheaders = 1,
        .arch = "sm_80",
    };
    kw_jit_result res;
    int rc = kw_jit_compile(&req, &res);
    cr_assert_eq(rc, 0, "log: %s", res.log ? res.log : "");
    cr_assert_null(res.lowered_name, "no name expression, no lowered name");
    cr_assert(kw_test_elf_has_symbol(res.cubin, res.cubin_len, "kw_k_scale"));
    kw_jit_result_destroy(&res);
}

Test(jit, default_opts_start_with_the_arch)
{
    size_t n = kw_jit_default_opts("sm_90a", NULL, 0);
    cr_assert(n >= 4 && n < 16);
    const char *opts[16] = {0};
    cr_assert_eq(kw_jit_default_opts("sm_90a", opts, 16), n);
    cr_assert_str_eq(opts[0], "--gpu-architecture");
    cr_assert_str_eq(opts[1], "sm_90a");
    bool std17 = false, cccl = false;
    for (size_t i = 2; i < n; i++) {
        std17 |= strcmp(opts[i], "-std=c++17") == 0;
        cccl |= strncmp(opts[i], "-I", 2) == 0 && strstr(opts[i], "/cccl");
    }
    cr_assert(std17 && cccl);
    /* a short array gets a prefix, the count stays the same */
    const char *two[2];
    cr_assert_eq(kw_jit_default_opts("sm_90", two, 2), n);
    cr_assert_str_eq(two[1], "sm_90");
}

Test(jit, version_is_the_linked_nvrtc)
{
    int major = 0, minor = -1;
    cr_assert_eq(kw_jit_version(&major, &minor), 0);
    cr_assert(major >= 12, "NVRTC %d.%d", major, minor);
    cr_assert(minor >= 0);
}

/* One compile per thread, each of a different instantiation. */
typedef struct compile_job {
    int n;
    int rc;
    bool has_symbol;
} compile_job;

static void *compile_thread(void *arg)
{
    compile_job *job = arg;
    char expr[64];
    snprintf(expr, sizeof(expr), "kw_k_foo<%d, %d, true>", job->n, job->n);
    kw_jit_req req = tiny_req(expr, "sm_90");
    kw_jit_result res;
    job->rc = kw_jit_compile(&req, &res);
    if (job->rc == 0)
        job->has_symbol = kw_test_elf_has_symbol(res.cubin, res.cubin_len,
                                                 res.lowered_name);
    kw_jit_result_destroy(&res);
    return NULL;
}

Test(jit, four_threads_compile_at_once)
{
    pthread_t th[4];
    compile_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (compile_job){.n = i + 3};
        cr_assert_eq(pthread_create(&th[i], NULL, compile_thread, &jobs[i]),
                     0);
    }
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(pthread_join(th[i], NULL), 0);
        cr_assert_eq(jobs[i].rc, 0, "thread %d: %d", i, jobs[i].rc);
        cr_assert(jobs[i].has_symbol, "thread %d", i);
    }
}

Test(jit, cub_block_radix_sort_compiles_through_cccl_include_path)
{
    kw_jit_req req = {
        .source =
            "#include <cub/block/block_radix_sort.cuh>\n"
            "template <int THREADS, int ITEMS>\n"
            "__global__ void kw_k_sort(unsigned *keys)\n"
            "{\n"
            "    using Sort = cub::BlockRadixSort<unsigned, THREADS, ITEMS>;\n"
            "    __shared__ typename Sort::TempStorage tmp;\n"
            "    unsigned k[ITEMS];\n"
            "    for (int i = 0; i < ITEMS; i++)\n"
            "        k[i] = keys[threadIdx.x * ITEMS + i];\n"
            "    Sort(tmp).Sort(k);\n"
            "    for (int i = 0; i < ITEMS; i++)\n"
            "        keys[threadIdx.x * ITEMS + i] = k[i];\n"
            "}\n",
        .source_name = "sort.cu",
        .name_expr = "kw_k_sort<128, 4>",
        .arch = "sm_90",
    };
    kw_jit_result res;
    int rc = kw_jit_compile(&req, &res);
    cr_assert_eq(rc, 0, "log: %s", res.log ? res.log : "");
    cr_assert(kw_test_elf_has_symbol(res.cubin, res.cubin_len,
                                     res.lowered_name));
    cr_log_info("cub kernel: %.3f s, %zu-byte cubin", res.seconds,
                res.cubin_len);
    kw_jit_result_destroy(&res);
}
