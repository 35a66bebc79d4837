/* test_resolve.c: the model-dependent defaults and cross-field rules of a
 * deployment (spec/warmup-keys.md §2, kw_config_resolve()). */
#include "deploy_util.h"

/* ---- resolution rules --------------------------------------------------- */

Test(resolve, interleave_is_ignored_without_dcp)
{
    /* W = 1: I is taken as 1, so it neither raises nor constrains the
     * block size. */
    kw_config_deploy d = resolve_ok(V4, F("--dcp-interleave", "16"));
    cr_expect_eq(d.dcp_interleave, 1);
    cr_expect_eq(d.block_size, 128, "lcm(64, 4, 128)");
    kw_config_deploy_destroy(&d);
    d = resolve_ok(FLAT, F("--dcp-interleave", "3", "--block-size", "64"));
    cr_expect_eq(d.dcp_interleave, 1);
    cr_expect_eq(d.block_size, 64);
    kw_config_deploy_destroy(&d);
}

Test(resolve, rejects_interleave_not_dividing_block_size_under_dcp)
{
    /* Named as the interleave or the block size: either input is at
     * fault. */
    const char *const *cases[] = {
        F("--dcp-world", "2", "--dcp-interleave", "3", "--block-size", "64"),
        F("--dcp-world", "2", "--dcp-interleave", "128"),
        F("--dcp-world", "4", "--dcp-interleave", "48", "--block-size", "64"),
    };
    for (size_t i = 0; i < N(cases); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        int rc = resolve(FLAT, cases[i], &d, err);
        cr_expect_eq(rc, KW_EDEPLOY, "case %zu: rc %d", i, rc);
        cr_expect(names_flag(err, "--dcp-interleave") ||
                      names_flag(err, "--block-size"),
                  "case %zu: %s", i, err);
        kw_config_deploy_destroy(&d);
    }
    kw_config_deploy d = resolve_ok(
        FLAT, F("--dcp-world", "2", "--dcp-interleave", "32"));
    cr_expect_eq(d.block_size, 64);
    cr_expect_eq(d.dcp_interleave, 32);
    kw_config_deploy_destroy(&d);
}

Test(resolve, default_block_size_is_lcm_of_64_and_ratio_times_interleave)
{
    const struct {
        const char *model;
        const char *const *fv;
        int64_t want;
    } cases[] = {
        {V4, NOFLAGS, 128},
        {KPOOL32, NOFLAGS, 64},
        {KPOOL32, F("--dcp-world", "2", "--dcp-interleave", "16"), 512},
        {V4, F("--dcp-world", "4", "--dcp-interleave", "8"), 1024},
        {"{\"index_topk\": 8, \"max_position_embeddings\": 64, "
         "\"compress_ratios\": [3]}", NOFLAGS, 192},
        {"{\"index_topk\": 8, \"max_position_embeddings\": 64, "
         "\"compress_ratios\": [48]}",
         F("--dcp-world", "2", "--dcp-interleave", "2"), 192},
        {"{\"index_topk\": 8, \"max_position_embeddings\": 64, "
         "\"compress_ratios\": [0, 1], \"index_kpool\": 1}", NOFLAGS, 64},
        {"{\"index_topk\": 8, \"max_position_embeddings\": 64, "
         "\"compress_ratios\": [4], \"index_kpool\": 6}", NOFLAGS, 192},
    };
    for (size_t i = 0; i < N(cases); i++) {
        kw_config_deploy d = resolve_ok(cases[i].model, cases[i].fv);
        cr_expect_eq(d.block_size, cases[i].want, "case %zu: %lld", i,
                     (long long)d.block_size);
        cr_expect_eq(d.block_stride_rows, cases[i].want, "case %zu", i);
        kw_config_deploy_destroy(&d);
    }
}

Test(resolve, given_block_size_is_kept_when_valid)
{
    kw_config_deploy d = resolve_ok(V4, F("--block-size", "256"));
    cr_expect_eq(d.block_size, 256);
    cr_expect_eq(d.block_stride_rows, 256);
    kw_config_deploy_destroy(&d);
    /* Below the default is fine when the rules hold: 32 / 4 = 8. */
    d = resolve_ok(KPOOL32, F("--block-size", "32"));
    cr_expect_eq(d.block_size, 32);
    kw_config_deploy_destroy(&d);
    d = resolve_ok(V4, F("--dcp-world", "2", "--dcp-interleave", "32",
                         "--block-size", "4096"));
    cr_expect_eq(d.block_size, 4096);
    kw_config_deploy_destroy(&d);
}

Test(resolve, rejects_block_size_not_multiple_of_a_ratio)
{
    resolve_rejects(V4, F("--block-size", "64"), "--block-size");
    resolve_rejects(V4, F("--block-size", "130"), "--block-size");
    resolve_rejects(KPOOL32, F("--block-size", "48"), "--block-size");
    resolve_rejects("{\"index_topk\": 8, \"max_position_embeddings\": 64, "
                    "\"compress_ratios\": [3]}", F("--block-size", "64"),
                    "--block-size");
}

Test(resolve, rejects_block_size_per_ratio_not_multiple_of_interleave)
{
    /* 64 / 4 = 16 compressed states are not a multiple of I = 32, though
     * I divides 64 itself. */
    resolve_rejects("{\"index_topk\": 8, \"max_position_embeddings\": 64, "
                    "\"compress_ratios\": [4]}",
                    F("--dcp-world", "2", "--dcp-interleave", "32",
                      "--block-size", "64"),
                    "--block-size");
    resolve_rejects(V4, F("--dcp-world", "2", "--dcp-interleave", "4",
                          "--block-size", "256"),
                    "--block-size");
    kw_config_deploy d = resolve_ok(
        "{\"index_topk\": 8, \"max_position_embeddings\": 64, "
        "\"compress_ratios\": [4]}",
        F("--dcp-world", "2", "--dcp-interleave", "32", "--block-size",
          "128"));
    cr_expect_eq(d.block_size, 128);
    kw_config_deploy_destroy(&d);
}

Test(resolve, block_size_from_deploy_file_is_named_by_file_and_pointer,
     .init = tmp_setup, .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    cr_assert_eq(load_text(&d, "{\"block_size\": 64}", err, &path), 0);
    kw_config_model m;
    model(&m, V4);
    int rc = kw_config_resolve(&d, &m, err, sizeof err);
    cr_expect_eq(rc, KW_EDEPLOY);
    cr_expect(strstr(err, path) != NULL, "%s", err);
    cr_expect(kw_test_names_pointer(err, "/block_size"), "%s", err);
    kw_config_deploy_destroy(&d);
    cr_assert_eq(load_text(&d, "{\"dcp_world\": 2, \"dcp_rank\": 5}", err,
                           &path), 0);
    rc = kw_config_resolve(&d, &m, err, sizeof err);
    cr_expect_eq(rc, KW_EDEPLOY);
    cr_expect(strstr(err, path) != NULL, "%s", err);
    cr_expect(kw_test_names_pointer(err, "/dcp_rank"), "%s", err);
    kw_config_deploy_destroy(&d);
    kw_config_model_destroy(&m);
}

Test(resolve, max_model_len_defaults_to_max_position_embeddings)
{
    kw_config_deploy d = resolve_ok(FLAT, NOFLAGS);
    cr_expect_eq(d.max_model_len, 163840);
    kw_config_deploy_destroy(&d);
    d = resolve_ok(FLAT, F("--max-model-len", "4096"));
    cr_expect_eq(d.max_model_len, 4096);
    kw_config_deploy_destroy(&d);
    /* Given, it needs no max_position_embeddings. */
    d = resolve_ok("{\"index_topk\": 8}", F("--max-model-len", "1000"));
    cr_expect_eq(d.max_model_len, 1000);
    kw_config_deploy_destroy(&d);
}

Test(resolve, rejects_missing_max_model_len)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    int rc = resolve("{\"index_topk\": 8, \"max_position_embeddings\": null}",
                     NOFLAGS, &d, err);
    cr_expect(rc == KW_ECONFIG || rc == KW_EDEPLOY, "rc %d", rc);
    cr_expect(names_flag(err, "--max-model-len") ||
                  strstr(err, "max_position_embeddings") != NULL,
              "%s", err);
    kw_config_deploy_destroy(&d);
}

Test(resolve, rejects_max_model_len_over_2_pow_24_under_dcp)
{
    resolve_rejects(FLAT, F("--dcp-world", "2", "--max-model-len",
                            "16777217"), "--max-model-len");
    /* From the model: named by its pointer. */
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    int rc = resolve("{\"text_config\": {\"index_topk\": 8, "
                     "\"max_position_embeddings\": 16777217}}",
                     F("--dcp-world", "2"), &d, err);
    cr_expect(rc < 0, "accepted");
    cr_expect(kw_test_names_pointer(err, "/text_config/max_position_embeddings"),
              "%s", err);
    kw_config_deploy_destroy(&d);
    /* 2^24 itself is allowed; without DCP there is no cap. */
    d = resolve_ok(FLAT, F("--dcp-world", "2", "--max-model-len",
                           "16777216"));
    cr_expect_eq(d.max_model_len, 16777216);
    kw_config_deploy_destroy(&d);
    d = resolve_ok(FLAT, F("--max-model-len", "2147483647"));
    cr_expect_eq(d.max_model_len, 2147483647);
    kw_config_deploy_destroy(&d);
    d = resolve_ok("{\"index_topk\": 8, \"max_position_embeddings\": "
                   "2147483647}", NOFLAGS);
    cr_expect_eq(d.max_model_len, 2147483647);
    kw_config_deploy_destroy(&d);
}

Test(resolve, block_stride_rows_defaults_to_block_size)
{
    kw_config_deploy d = resolve_ok(V4, NOFLAGS);
    cr_expect_eq(d.block_stride_rows, d.block_size);
    cr_expect_eq(d.block_stride_rows, 128);
    kw_config_deploy_destroy(&d);
    d = resolve_ok(V4, F("--block-size", "512"));
    cr_expect_eq(d.block_stride_rows, 512);
    kw_config_deploy_destroy(&d);
    d = resolve_ok(V4, F("--block-stride-rows", "4096"));
    cr_expect_eq(d.block_stride_rows, 4096);
    cr_expect_eq(d.block_size, 128);
    kw_config_deploy_destroy(&d);
}
