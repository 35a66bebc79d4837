/* test_kcheck.c: the kernel families' registry and the check harness of
 * kernels/ (kw_kernels.h), run on the CPU.  The device here is a CPU
 * STAND-IN: host memory, and a launch that runs the CPU reference
 * (kw_k_cpu_launch) on the "device" copies.  It exercises generation,
 * upload, parameter layout, download and comparison; whether the CUDA
 * kernels themselves are right is checked on a GPU (kwarm verify). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"
#include "kw_kernels.h"

/* ---- the CPU stand-in device ---- */

enum sabotage { RUN_REFERENCE, FLIP_FIRST_OUTPUT, DO_NOTHING };

typedef struct cpu_dev {
    kw_k_family f;
    const int64_t *fields;
    enum sabotage mode;
    int launches;
    uint64_t param1; /* prefill_chunk_metadata's seq_lens, last launch */
    unsigned grid[3], block[3];
} cpu_dev;

static int cpu_alloc(void *ctx, size_t n, uint64_t *dptr)
{
    (void)ctx;
    void *p = malloc(n ? n : 1);
    *dptr = (uint64_t)(uintptr_t)p;
    return p ? 0 : KW_ENOMEM;
}

static void cpu_free(void *ctx, uint64_t dptr)
{
    (void)ctx;
    free((void *)(uintptr_t)dptr);
}

static int cpu_h2d(void *ctx, uint64_t dst, const void *src, size_t n)
{
    (void)ctx;
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

static int cpu_d2h(void *ctx, void *dst, uint64_t src, size_t n)
{
    (void)ctx;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* Index of a parameter that is always a non-empty output. */
static int main_output(kw_k_family f)
{
    static const int idx[KW_K_NFAMILIES] = {12, 8, 10, 5, 2, 9, 5};
    return idx[f];
}

/* The bit a sabotaged launch flips in its first output: bit 0, except for
 * indexer_logits, whose outputs are compared within a tolerance that a
 * flipped low mantissa bit may stay inside; an exponent bit never does. */
static uint32_t flip_bit(kw_k_family f)
{
    return f == KW_K_INDEXER_LOGITS ? 1u << 30 : 1u;
}

static int cpu_launch(void *ctx, const unsigned grid[3],
                      const unsigned block[3], unsigned shmem, void **args)
{
    cpu_dev *d = ctx;
    cr_assert_eq(shmem, kw_k_shmem_bytes(d->f, d->fields));
    memcpy(d->grid, grid, sizeof(d->grid));
    memcpy(d->block, block, sizeof(d->block));
    if (d->f == KW_K_PREFILL_CHUNK_METADATA) /* seq_lens, a pointer */
        d->param1 = *(const uint64_t *)args[1];
    d->launches++;
    if (d->mode == DO_NOTHING)
        return 0;
    int rc = kw_k_cpu_launch(d->f, d->fields, args);
    if (rc == 0 && d->mode == FLIP_FIRST_OUTPUT) {
        uint32_t *out = (uint32_t *)(uintptr_t) *
                        (const uint64_t *)args[main_output(d->f)];
        out[0] ^= flip_bit(d->f);
    }
    return rc;
}

static int cpu_sync(void *ctx)
{
    (void)ctx;
    return 0;
}

static kw_k_dev cpu_dev_ops(cpu_dev *d)
{
    return (kw_k_dev){.ctx = d, .alloc = cpu_alloc, .free = cpu_free,
                      .h2d = cpu_h2d, .d2h = cpu_d2h,
                      .launch = cpu_launch, .sync = cpu_sync};
}

/* Keys from tests/fixtures/expected (plus a few made-up corners). */
static const int64_t k_pcm[][8] = {
    {16, 16, 2, 2, 1, 1024, 1, 0}, {1, 2, 16, 1, 1, 1024, 128, 1},
    {2, 1, 1, 2, 1, 1024, 4, 0},   {16, 2, 2, 16, 16, 1024, 32, 1},
    {1, 16, 16, 2, 2, 1024, 4, 0},
};
static const int64_t k_csm[][6] = {
    {4, 1024, 16, 1, 0, 1}, {128, 1024, 1, 1, 0, 1}, {128, 1024, 2, 8, 7, 1},
    {4, 1024, 16, 2, 1, 2}, {32, 1024, 2, 4, 3, 8},
};
static const int64_t k_ic[][13] = {
    {64, 64, 128, 0, 4, 0, 0, 0, 1, 0, 1, 2048, 16},
    {64, 64, 2048, 1, 8, 0, 1, 1, 1, 0, 1, 2048, 16},
    {256, 256, 512, 1, 8, 1, 1, 1, 8, 7, 1, 512, 16},
    {128, 4096, 2048, 1, 8, 0, 1, 0, 2, 1, 1, 2048, 16},
    {64, 64, 128, 0, 4, 1, 1, 1, 4, 2, 16, 999, 2},   /* topk % 4 != 0 */
    {16, 16, 128, 0, 4, 0, 1, 1, 1, 0, 1, 3, 1},      /* width class 1 */
};
static const int64_t k_pack[][6] = {
    {3, 8, 1, 0, 2048, 512}, {0, 2, 1, 1, 512, 512}, {1, 4, 16, 1, 7, 512},
};
static const int64_t k_topk[][2] = {
    {512, 1024}, {512, 4096}, {2048, 4096}, {8, 3}, {5000, 10000},
};
/* heads, head_dim, paged, page_rows, next_n */
static const int64_t k_logits[][5] = {
    {64, 128, 0, 0, 1}, {5, 64, 1, 3, 3}, {32, 128, 1, 1, 2},
};
/* topk, windowed: the fixtures' two, one, and past the fast path's 4096 */
static const int64_t k_itopk[][2] = {
    {2048, 1}, {512, 0}, {1, 1}, {5000, 0},
};

/* Runs one key at one preset through the stand-in; returns the result. */
static kw_k_check_result run_key(kw_k_family f, const int64_t *fields,
                                 const kw_k_shape *shape, uint64_t seed,
                                 enum sabotage mode, int *rc_out)
{
    cpu_dev d = {.f = f, .fields = fields, .mode = mode};
    kw_k_dev dev = cpu_dev_ops(&d);
    kw_k_case *c = NULL;
    kw_k_check_result res = {0};
    int rc = kw_k_case_new(&c, f, fields, shape, seed);
    cr_assert_eq(rc, 0, "%s: case_new %d", kw_k_family_name(f), rc);
    cr_assert_eq(kw_k_case_upload(c, &dev), 0);
    cr_assert_eq(kw_k_case_launch(c, &dev), 0);
    *rc_out = kw_k_case_compare(c, &dev, &res);
    kw_k_case_free(c, &dev);
    return res;
}

static void run_all(kw_k_family f, const int64_t *keys, size_t nkeys,
                    size_t stride)
{
    for (int p = KW_K_PRESET_EDGE; p <= KW_K_PRESET_MEDIUM; p++) {
        kw_k_shape shape;
        cr_assert_eq(kw_k_shape_preset(f, (kw_k_preset)p, &shape), 0);
        for (size_t k = 0; k < nkeys; k++) {
            for (uint64_t seed = 1; seed <= 3; seed++) {
                int rc;
                kw_k_check_result res = run_key(f, keys + k * stride, &shape,
                                                seed, RUN_REFERENCE, &rc);
                cr_assert_eq(rc, 0, "%s key %zu preset %d seed %llu: rc %d",
                             kw_k_family_name(f), k, p,
                             (unsigned long long)seed, rc);
                cr_assert_eq(res.mismatches, 0);
            }
        }
    }
}

#define RUN_ALL(f, keys) run_all((f), &(keys)[0][0], \
                                 sizeof(keys) / sizeof((keys)[0]), \
                                 sizeof((keys)[0]) / sizeof((keys)[0][0]))

Test(kcheck, stand_in_matches_reference_for_prefill_chunk_metadata)
{
    RUN_ALL(KW_K_PREFILL_CHUNK_METADATA, k_pcm);
}

Test(kcheck, stand_in_matches_reference_for_compressed_slot_mapping)
{
    RUN_ALL(KW_K_COMPRESSED_SLOT_MAPPING, k_csm);
}

Test(kcheck, stand_in_matches_reference_for_index_conversion)
{
    RUN_ALL(KW_K_INDEX_CONVERSION, k_ic);
}

Test(kcheck, stand_in_matches_reference_for_dcp_pack_topk_candidates)
{
    RUN_ALL(KW_K_DCP_PACK_TOPK_CANDIDATES, k_pack);
}

Test(kcheck, stand_in_matches_reference_for_dcp_stable_topk)
{
    RUN_ALL(KW_K_DCP_STABLE_TOPK, k_topk);
}

Test(kcheck, stand_in_matches_reference_for_indexer_logits)
{
    RUN_ALL(KW_K_INDEXER_LOGITS, k_logits);
}

Test(kcheck, stand_in_matches_reference_for_indexer_topk)
{
    RUN_ALL(KW_K_INDEXER_TOPK, k_itopk);
}

Test(kcheck, compare_reports_a_single_flipped_output)
{
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        const int64_t *keys[] = {k_pcm[0], k_csm[2], k_ic[1], k_pack[0],
                                 k_topk[0], k_logits[0], k_itopk[0]};
        kw_k_shape shape;
        cr_assert_eq(kw_k_shape_preset((kw_k_family)f, KW_K_PRESET_EDGE,
                                       &shape), 0);
        int rc;
        kw_k_check_result res = run_key((kw_k_family)f, keys[f], &shape, 7,
                                        FLIP_FIRST_OUTPUT, &rc);
        cr_assert_eq(rc, KW_EMISMATCH, "family %d rc %d", f, rc);
        cr_assert_eq(res.mismatches, 1);
        cr_assert_eq(res.first_index, 0);
        cr_assert_eq((uint64_t)(res.expected ^ res.got),
                     (uint64_t)flip_bit((kw_k_family)f));
        cr_assert_not_null(res.output);
    }
}

Test(kcheck, compare_flags_every_output_a_kernel_never_wrote)
{
    kw_k_shape shape;
    cr_assert_eq(kw_k_shape_preset(KW_K_DCP_STABLE_TOPK, KW_K_PRESET_EDGE,
                                   &shape), 0);
    int rc;
    kw_k_check_result res = run_key(KW_K_DCP_STABLE_TOPK, k_topk[0], &shape,
                                    2, DO_NOTHING, &rc);
    cr_assert_eq(rc, KW_EMISMATCH);
    cr_assert_eq(res.checked, (uint64_t)shape.rows * 512);
    cr_assert_eq(res.mismatches, res.checked);
    cr_assert_str_eq(res.output, "out");
}

/* seq_lens (parameter 1) sits 4 bytes past a 16-byte boundary unless the
 * key promises alignment. */
static uint64_t seq_lens_misalignment(int64_t aligned)
{
    int64_t fields[8] = {16, 16, 16, 1, 1, 1024, 4, aligned};
    cpu_dev d = {.f = KW_K_PREFILL_CHUNK_METADATA, .fields = fields};
    kw_k_dev dev = cpu_dev_ops(&d);
    kw_k_shape shape;
    kw_k_case *c;
    kw_k_check_result res;
    cr_assert_eq(kw_k_shape_preset(d.f, KW_K_PRESET_EDGE, &shape), 0);
    cr_assert_eq(kw_k_case_new(&c, d.f, fields, &shape, 3), 0);
    cr_assert_eq(kw_k_case_upload(c, &dev), 0);
    cr_assert_eq(kw_k_case_launch(c, &dev), 0);
    cr_assert_eq(kw_k_case_compare(c, &dev, &res), 0);
    kw_k_case_free(c, &dev);
    return d.param1 % 16;
}

Test(kcheck, seq_lens_is_misaligned_unless_the_key_promises_alignment)
{
    cr_assert_eq(seq_lens_misalignment(0), 4);
    cr_assert_eq(seq_lens_misalignment(1), 0);
}

Test(kcheck, launch_geometry_follows_the_key)
{
    const int64_t *ic = k_ic[0], *topk_big = k_topk[4];
    kw_k_shape shape = {.rows = 10, .batch = 2, .max_len = 100};
    cpu_dev d = {.f = KW_K_INDEX_CONVERSION, .fields = ic};
    kw_k_dev dev = cpu_dev_ops(&d);
    kw_k_case *c;
    cr_assert_eq(kw_k_case_new(&c, d.f, ic, &shape, 1), 0);
    cr_assert_eq(kw_k_case_upload(c, &dev), 0);
    cr_assert_eq(kw_k_case_launch(c, &dev), 0);
    cr_assert_eq(kw_k_case_launch(c, &dev), 0); /* repeatable, for timing */
    cr_assert_eq(d.launches, 2);
    cr_assert_eq(d.grid[0], 10);
    cr_assert_eq(d.block[0], 128);
    /* rows * (topk * (4 in + 4 out) + 4 for req_id) */
    cr_assert_eq(kw_k_case_bytes(c), 10 * (2048 * 8 + 4));
    kw_k_case_free(c, &dev);
    cr_assert_eq(kw_k_block_threads(KW_K_DCP_STABLE_TOPK, topk_big), 1024);
    cr_assert_eq(kw_k_block_threads(KW_K_DCP_STABLE_TOPK, k_topk[1]), 512);
    cr_assert_eq(kw_k_block_threads(KW_K_INDEX_CONVERSION, k_ic[1]), 256);
}

Test(kcheck, case_new_rejects_keys_no_runtime_value_satisfies)
{
    /* dcp_world class 1 means W = 1, so rank class 1 (R = 1) is empty. */
    const int64_t pcm[8] = {16, 16, 1, 1, 1, 1024, 1, 0};
    kw_k_shape shape;
    kw_k_case *c = NULL;
    cr_assert_eq(kw_k_shape_preset(KW_K_PREFILL_CHUNK_METADATA,
                                   KW_K_PRESET_EDGE, &shape), 0);
    cr_assert_eq(kw_k_case_new(&c, KW_K_PREFILL_CHUNK_METADATA, pcm, &shape,
                               1), KW_EINVAL);
    cr_assert_null(c);
    shape.rows = -1;
    cr_assert_eq(kw_k_case_new(&c, KW_K_PREFILL_CHUNK_METADATA, k_pcm[0],
                               &shape, 1), KW_EINVAL);
}

/* ---- registry ---- */

Test(kcheck, family_names_round_trip_and_unknown_is_enofamily)
{
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        kw_k_family got;
        cr_assert_eq(kw_k_family_from_name(kw_k_family_name((kw_k_family)f),
                                           &got), 0);
        cr_assert_eq(got, (kw_k_family)f);
    }
    kw_k_family got = KW_K_NFAMILIES;
    cr_assert_eq(kw_k_family_from_name("dense_attention", &got), KW_ENOFAMILY);
    cr_assert_eq(got, KW_K_NFAMILIES);
    cr_assert_null(kw_k_family_name(KW_K_NFAMILIES));
}

Test(kcheck, fields_follow_the_spec_order)
{
    cr_assert_eq(kw_k_nfields(KW_K_PREFILL_CHUNK_METADATA), 8);
    cr_assert_eq(kw_k_nfields(KW_K_COMPRESSED_SLOT_MAPPING), 6);
    cr_assert_eq(kw_k_nfields(KW_K_INDEX_CONVERSION), 13);
    cr_assert_eq(kw_k_nfields(KW_K_DCP_PACK_TOPK_CANDIDATES), 6);
    cr_assert_eq(kw_k_nfields(KW_K_DCP_STABLE_TOPK), 2);
    cr_assert_str_eq(kw_k_field_name(KW_K_PREFILL_CHUNK_METADATA, 7),
                     "uncompressed_seq_lens_aligned");
    cr_assert_str_eq(kw_k_field_name(KW_K_COMPRESSED_SLOT_MAPPING, 5),
                     "cp_kv_cache_interleave_size");
    cr_assert_str_eq(kw_k_field_name(KW_K_INDEX_CONVERSION, 12),
                     "block_table_stride");
    cr_assert_str_eq(kw_k_field_name(KW_K_DCP_PACK_TOPK_CANDIDATES, 3),
                     "has_row_starts");
    cr_assert_str_eq(kw_k_field_name(KW_K_DCP_STABLE_TOPK, 1),
                     "num_candidates");
    cr_assert_null(kw_k_field_name(KW_K_DCP_STABLE_TOPK, 2));
}

Test(kcheck, name_expr_renders_the_template_instantiation)
{
    char buf[160];
    cr_assert_eq(kw_k_name_expr(KW_K_INDEX_CONVERSION, k_ic[0], buf,
                                sizeof(buf)), 0);
    cr_assert_str_eq(buf, "kw_k_index_conversion<64,64,128,false,4,false,"
                          "false,false,1,0,1,2048,16>");
    cr_assert_eq(kw_k_name_expr(KW_K_PREFILL_CHUNK_METADATA, k_pcm[1], buf,
                                sizeof(buf)), 0);
    cr_assert_str_eq(buf, "kw_k_prefill_chunk_metadata<1,2,16,1,1,1024,128,"
                          "true>");
    cr_assert_eq(kw_k_name_expr(KW_K_DCP_STABLE_TOPK, k_topk[0], buf,
                                sizeof(buf)), 0);
    cr_assert_str_eq(buf, "kw_k_dcp_stable_topk<512,1024>");
}

Test(kcheck, name_expr_reports_enospc_when_the_buffer_is_short)
{
    char buf[31]; /* "kw_k_dcp_stable_topk<512,1024>" needs 31 with NUL */
    cr_assert_eq(kw_k_name_expr(KW_K_DCP_STABLE_TOPK, k_topk[0], buf, 30),
                 KW_ENOSPC);
    cr_assert_str_eq(buf, "");
    cr_assert_eq(kw_k_name_expr(KW_K_DCP_STABLE_TOPK, k_topk[0], buf, 31), 0);
}

Test(kcheck, fields_check_rejects_values_no_kernel_accepts)
{
    int64_t f[13];
    memcpy(f, k_ic[0], sizeof(f));
    cr_assert_eq(kw_k_fields_check(KW_K_INDEX_CONVERSION, f), 0);
    f[12] = 3; /* not a class */
    cr_assert_eq(kw_k_fields_check(KW_K_INDEX_CONVERSION, f), KW_EINVAL);
    f[12] = 16, f[3] = 2; /* not a boolean */
    cr_assert_eq(kw_k_fields_check(KW_K_INDEX_CONVERSION, f), KW_EINVAL);
    f[3] = 0, f[9] = 1; /* rank 1 of world 1 */
    cr_assert_eq(kw_k_fields_check(KW_K_INDEX_CONVERSION, f), KW_EINVAL);
    f[9] = 0, f[4] = 33; /* 1056 threads */
    cr_assert_eq(kw_k_fields_check(KW_K_INDEX_CONVERSION, f), KW_EINVAL);
    const int64_t pack[6] = {0, 2, 1, 0, 512, 500}; /* not whole warps */
    cr_assert_eq(kw_k_fields_check(KW_K_DCP_PACK_TOPK_CANDIDATES, pack),
                 KW_EINVAL);
    const int64_t topk[2] = {0, 16};
    cr_assert_eq(kw_k_fields_check(KW_K_DCP_STABLE_TOPK, topk), KW_EINVAL);
    cr_assert_eq(kw_k_fields_check(KW_K_NFAMILIES, topk), KW_ENOFAMILY);
}

Test(kcheck, every_family_source_is_embedded_with_the_shared_header)
{
    bool header = false;
    for (size_t i = 0; i < kw_k_nfiles; i++)
        header |= strcmp(kw_k_files[i].name, "kw_k_dcp.cuh") == 0;
    cr_assert(header);
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        const char *src = kw_k_source_name((kw_k_family)f);
        const char *entry = kw_k_entry_name((kw_k_family)f);
        bool found = false;
        for (size_t i = 0; i < kw_k_nfiles; i++)
            if (strcmp(kw_k_files[i].name, src) == 0)
                found = strstr(kw_k_files[i].text, entry) != NULL;
        cr_assert(found, "%s does not define %s", src, entry);
    }
}

Test(kcheck, include_lines_are_found_with_any_spacing_and_only_as_directives)
{
    static const char t[] = "int x;\n  #  include   \"a.cuh\"\n"
                            "// #include \"b.cuh\"\n#include \"c.cuh\" // why\n"
                            "#include <d.cuh>\n#include \"e.cuhx\"\n#include \"f.cuh\"";
    cr_assert(kw_k_text_includes(t, sizeof t - 1, "a.cuh"));
    cr_assert_not(kw_k_text_includes(t, sizeof t - 1, "b.cuh"), "a comment");
    cr_assert(kw_k_text_includes(t, sizeof t - 1, "c.cuh"));
    cr_assert_not(kw_k_text_includes(t, sizeof t - 1, "d.cuh"), "<> is the toolkit's");
    cr_assert_not(kw_k_text_includes(t, sizeof t - 1, "e.cuh"), "another name");
    cr_assert(kw_k_text_includes(t, sizeof t - 1, "f.cuh"), "last line, no newline");
    cr_assert_not(kw_k_text_includes(t, sizeof t - 2, "f.cuh"), "cut short");
}

/* A source uses itself and what it includes, through nested headers; no
 * other header (so editing one changes only its includers' digests). */
Test(kcheck, a_source_uses_exactly_the_headers_it_includes)
{
#define F(n, t) {n, t, sizeof t - 1}
    static const kw_k_file files[] = {
        F("a.cu", "#include \"x.cuh\"\n"), F("b.cu", "int b;\n"),
        F("x.cuh", "#include \"y.cuh\"\n"), F("y.cuh", "int y;\n"),
        F("z.cuh", "#include \"x.cuh\"\n")};
#undef F
    bool use[5];
    cr_assert_eq(kw_k_source_uses(files, 5, "a.cu", use), 0);
    cr_assert(use[0] && !use[1] && use[2] && use[3] && !use[4]);
    cr_assert_eq(kw_k_source_uses(files, 5, "b.cu", use), 0);
    cr_assert(!use[0] && use[1] && !use[2] && !use[3] && !use[4]);
    cr_assert_eq(kw_k_source_uses(files, 5, "c.cu", use), KW_ENOFAMILY);
    /* the embedded sources: each family's headers, and no other */
    bool u[KW_K_MAX_FILES];
    cr_assert_leq(kw_k_nfiles, KW_K_MAX_FILES);
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        cr_assert_eq(kw_k_source_uses(kw_k_files, kw_k_nfiles,
                                      kw_k_source_name((kw_k_family)f), u), 0);
        for (size_t i = 0; i < kw_k_nfiles; i++) {
            bool il = strcmp(kw_k_files[i].name, "kw_k_il_ptx.cuh") == 0;
            if (il)
                cr_expect_eq(u[i], f == KW_K_INDEXER_LOGITS, "%s uses %s: %d",
                             kw_k_source_name((kw_k_family)f), kw_k_files[i].name, u[i]);
            if (strcmp(kw_k_files[i].name, "kw_k_dcp.cuh") == 0)
                cr_expect_eq(u[i], f <= KW_K_DCP_PACK_TOPK_CANDIDATES,
                             "%s uses %s: %d", kw_k_source_name((kw_k_family)f),
                             kw_k_files[i].name, u[i]);
        }
    }
}

Test(kcheck, presets_grow_from_edge_to_production)
{
    for (int i = 0; i < KW_K_NFAMILIES; i++) {
        kw_k_family f = (kw_k_family)i;
        kw_k_shape e, m, p;
        cr_assert_eq(kw_k_shape_preset(f, KW_K_PRESET_EDGE, &e), 0);
        cr_assert_eq(kw_k_shape_preset(f, KW_K_PRESET_MEDIUM, &m), 0);
        cr_assert_eq(kw_k_shape_preset(f, KW_K_PRESET_PRODUCTION, &p), 0);
        cr_assert(e.rows < m.rows && m.rows <= p.rows);
    }
    kw_k_shape p;
    cr_assert_eq(kw_k_shape_preset(KW_K_INDEX_CONVERSION,
                                   KW_K_PRESET_PRODUCTION, &p), 0);
    cr_assert_eq(p.rows, 65536);
    cr_assert_eq(kw_k_shape_preset(KW_K_DCP_STABLE_TOPK, 3, &p), KW_EINVAL);
}
