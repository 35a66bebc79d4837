/* test_deploy.c: deployments from flags and --deploy files, and their
 * resolution against a model (jit/kw_config.h, spec §2).
 *
 * Expected values come from §2's table and rules: defaults, bounds, the
 * block_size lcm, the 2^24 cap under DCP.  Rejections check the code and
 * that the message names the flag, or the --deploy file and pointer.
 */


#include "deploy_util.h"

#include <cjson/cJSON.h>

/* ---- defaults and flag names -------------------------------------------- */

Test(deploy, init_sets_spec_defaults)
{
    kw_config_deploy d;
    memset(&d, 0x5a, sizeof d);
    kw_config_deploy_init(&d);
    cr_expect_eq(d.dcp_world, 1);
    cr_expect_eq(d.dcp_rank, KW_CONFIG_RANK_ALL);
    cr_expect_eq(d.dcp_interleave, 1);
    cr_expect_eq(d.pcp, 1);
    cr_expect_eq(d.max_num_batched_tokens, 8192);
    cr_expect_eq(d.max_num_seqs, 256);
    cr_expect_eq(d.block_size, 0, "derived later");
    cr_expect_eq(d.max_model_len, 0, "derived later");
    cr_expect_eq(d.block_stride_rows, 0, "derived later");
    cr_expect_eq(d.narch, 1);
    cr_expect_str_eq(d.arch[0], "sm_90");
    cr_expect_null(d.text_config);
    cr_expect_eq(d.given, 0);
    cr_expect_str_eq(d.source, "");
    kw_config_deploy_destroy(&d);
    kw_config_deploy_destroy(NULL);
}

Test(deploy, resolve_applies_defaults_for_flat_model)
{
    kw_config_deploy d = resolve_ok(FLAT, NOFLAGS);
    cr_expect_eq(d.block_size, 64);
    cr_expect_eq(d.max_model_len, 163840);
    cr_expect_eq(d.block_stride_rows, 64);
    cr_expect_eq(d.dcp_world, 1);
    cr_expect_eq(d.dcp_rank, KW_CONFIG_RANK_ALL);
    cr_expect_eq(d.dcp_interleave, 1);
    cr_expect_eq(d.pcp, 1);
    cr_expect_eq(d.max_num_batched_tokens, 8192);
    cr_expect_eq(d.max_num_seqs, 256);
    kw_config_deploy_destroy(&d);
}

Test(deploy, flag_names_map_to_fields_and_back)
{
    static const struct {
        const char *flag, *name;
        kw_config_field f;
    } map[] = {
        {"--dcp-world", "dcp_world", KW_CONFIG_DCP_WORLD},
        {"--dcp-rank", "dcp_rank", KW_CONFIG_DCP_RANK},
        {"--dcp-interleave", "dcp_interleave", KW_CONFIG_DCP_INTERLEAVE},
        {"--pcp", "pcp", KW_CONFIG_PCP},
        {"--max-num-batched-tokens", "max_num_batched_tokens",
         KW_CONFIG_MAX_NUM_BATCHED_TOKENS},
        {"--max-num-seqs", "max_num_seqs", KW_CONFIG_MAX_NUM_SEQS},
        {"--block-size", "block_size", KW_CONFIG_BLOCK_SIZE},
        {"--max-model-len", "max_model_len", KW_CONFIG_MAX_MODEL_LEN},
        {"--block-stride-rows", "block_stride_rows",
         KW_CONFIG_BLOCK_STRIDE_ROWS},
        {"--arch", "arch", KW_CONFIG_ARCH},
        {"--text-config", "text_config", KW_CONFIG_TEXT_CONFIG},
    };
    for (size_t i = 0; i < N(map); i++) {
        cr_expect_eq(kw_config_flag_field(map[i].flag), (int)map[i].f, "%s",
                     map[i].flag);
        cr_expect_str_eq(kw_config_field_flag(map[i].f), map[i].flag);
        cr_expect_str_eq(kw_config_field_name(map[i].f), map[i].name);
    }
    static const char *const not_flags[] = {"--dcp_world", "dcp-world",
                                            "--DCP-WORLD", "--dcp-worl",
                                            "--model", "--deploy", ""};
    for (size_t i = 0; i < N(not_flags); i++)
        cr_expect_eq(kw_config_flag_field(not_flags[i]), -1, "%s",
                     not_flags[i]);
}

/* ---- integer flags: one test per rejection rule ------------------------- */

Test(deploy, integer_flags_reject_zero) { int_flags_reject("0"); }
Test(deploy, integer_flags_reject_negative)
{
    int_flags_reject("-1");
    int_flags_reject("-8");
}
Test(deploy, integer_flags_reject_above_int_max)
{
    int_flags_reject("2147483648");
    int_flags_reject("18446744073709551617");
}
Test(deploy, integer_flags_reject_trailing_garbage)
{
    int_flags_reject("8x");
    int_flags_reject("8 ");
    int_flags_reject("8.0");
    int_flags_reject("1e3");
}
Test(deploy, integer_flags_reject_empty) { int_flags_reject(""); }
Test(deploy, integer_flags_reject_leading_space_or_sign)
{
    int_flags_reject(" 8");
    int_flags_reject("+8");
    int_flags_reject("\t8");
}
Test(deploy, integer_flags_reject_hex) { int_flags_reject("0x8"); }

Test(deploy, integer_flags_accept_int_max)
{
    for (size_t i = 0; i < N(int_fields); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        const char *flag = kw_config_field_flag(int_fields[i]);
        int rc = set_one(&d, int_fields[i], "2147483647", err);
        cr_expect_eq(rc, 0, "%s: %s", flag, err);
        cr_expect_eq(*int_slot(&d, int_fields[i]), 2147483647, "%s", flag);
        cr_expect(d.given & (1u << int_fields[i]), "%s not marked given",
                  flag);
        kw_config_deploy_destroy(&d);
        /* Each is also valid through resolution against a flat model. */
        kw_config_deploy r =
            resolve_ok(FLAT, F(flag, "2147483647"));
        if (int_fields[i] != KW_CONFIG_DCP_INTERLEAVE)
            cr_expect_eq(*int_slot(&r, int_fields[i]), 2147483647, "%s",
                         flag);
        kw_config_deploy_destroy(&r);
    }
}

Test(deploy, integer_flags_accept_plain_decimal)
{
    kw_config_deploy d = resolve_ok(
        FLAT, F("--dcp-world", "4", "--dcp-rank", "3", "--dcp-interleave", "8",
                "--pcp", "2", "--max-num-batched-tokens", "16",
                "--max-num-seqs", "32", "--block-size", "128",
                "--max-model-len", "8192", "--block-stride-rows", "4096"));
    cr_expect_eq(d.dcp_world, 4);
    cr_expect_eq(d.dcp_rank, 3);
    cr_expect_eq(d.dcp_interleave, 8);
    cr_expect_eq(d.pcp, 2);
    cr_expect_eq(d.max_num_batched_tokens, 16);
    cr_expect_eq(d.max_num_seqs, 32);
    cr_expect_eq(d.block_size, 128);
    cr_expect_eq(d.max_model_len, 8192);
    cr_expect_eq(d.block_stride_rows, 4096);
    kw_config_deploy_destroy(&d);
}

/* ---- --dcp-rank --------------------------------------------------------- */

Test(deploy, dcp_rank_accepts_all_and_ranks)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    cr_expect_eq(set_one(&d, KW_CONFIG_DCP_RANK, "all", err), 0, "%s", err);
    cr_expect_eq(d.dcp_rank, KW_CONFIG_RANK_ALL);
    cr_expect_eq(set_one(&d, KW_CONFIG_DCP_RANK, "0", err), 0, "%s", err);
    cr_expect_eq(d.dcp_rank, 0);
    cr_expect_eq(set_one(&d, KW_CONFIG_DCP_RANK, "2147483647", err), 0);
    cr_expect_eq(d.dcp_rank, 2147483647);
    d = resolve_ok(FLAT, F("--dcp-world", "8", "--dcp-rank", "7"));
    cr_expect_eq(d.dcp_rank, 7);
    d = resolve_ok(FLAT, F("--dcp-rank", "0"));
    cr_expect_eq(d.dcp_rank, 0);
}

Test(deploy, dcp_rank_rejects_malformed_values)
{
    static const char *const vals[] = {"-1", "2147483648", "8x", "", " 8",
                                       "0x8", "ALL", "al", "all ", "+1"};
    for (size_t i = 0; i < N(vals); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        int rc = set_one(&d, KW_CONFIG_DCP_RANK, vals[i], err);
        cr_expect_eq(rc, KW_EDEPLOY, "'%s' accepted", vals[i]);
        cr_expect(names_flag(err, "--dcp-rank"), "'%s': %s", vals[i], err);
    }
}

Test(deploy, rejects_dcp_rank_not_below_dcp_world)
{
    resolve_rejects(FLAT, F("--dcp-world", "2", "--dcp-rank", "2"),
                    "--dcp-rank");
    resolve_rejects(FLAT, F("--dcp-world", "4", "--dcp-rank", "9"),
                    "--dcp-rank");
    resolve_rejects(FLAT, F("--dcp-rank", "1"), "--dcp-rank");
}

/* ---- flags given twice -------------------------------------------------- */

Test(deploy, rejects_flag_given_twice)
{
    for (int f = 0; f < KW_CONFIG_NFIELDS; f++) {
        const char *v = f == KW_CONFIG_ARCH          ? "sm_90"
                        : f == KW_CONFIG_TEXT_CONFIG ? "/"
                                                     : "1";
        const char *flag = kw_config_field_flag((kw_config_field)f);
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        cr_expect_eq(set_one(&d, (kw_config_field)f, v, err), 0, "%s", flag);
        err[0] = '\0';
        int rc = kw_config_deploy_set_flag(&d, (kw_config_field)f, v, err,
                                           sizeof err);
        cr_expect_eq(rc, KW_EDEPLOY, "%s twice: rc %d", flag, rc);
        cr_expect(names_flag(err, flag), "%s twice: %s", flag, err);
        kw_config_deploy_destroy(&d);
    }
}

/* ---- --arch ------------------------------------------------------------- */

/* Sets --arch to v and compares the list with want (n entries). */
static void arch_ok(const char *v, const char *const *want, size_t n)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    int rc = set_one(&d, KW_CONFIG_ARCH, v, err);
    cr_expect_eq(rc, 0, "--arch %s: %s", v, err);
    if (rc != 0)
        return;
    cr_expect_eq(d.narch, n, "--arch %s", v);
    for (size_t i = 0; i < n && i < d.narch; i++)
        cr_expect_str_eq(d.arch[i], want[i], "--arch %s [%zu]", v, i);
    kw_config_deploy_destroy(&d);
}

Test(deploy, arch_list_is_parsed_and_deduplicated_in_order)
{
    arch_ok("sm_90", (const char *[]){"sm_90"}, 1);
    arch_ok("sm_90,sm_100", (const char *[]){"sm_90", "sm_100"}, 2);
    arch_ok("sm_90,sm_90", (const char *[]){"sm_90"}, 1);
    arch_ok("sm_100,sm_90,sm_100,sm_90",
            (const char *[]){"sm_100", "sm_90"}, 2);
    arch_ok("sm_90a,sm_100f,sm_120",
            (const char *[]){"sm_90a", "sm_100f", "sm_120"}, 3);
    arch_ok("sm_90,sm_90a", (const char *[]){"sm_90", "sm_90a"}, 2);
}

Test(deploy, rejects_malformed_arch)
{
    static const char *const vals[] = {
        "sm_9",    "sm_1000", "sm_90b",  "",          "sm_90,",
        ",sm_90",  "compute_90", "SM_90", "sm90",     "sm_90,,sm_100",
        " sm_90",  "sm_90 ",  "sm_90aa", "sm_9a",     "sm_a0",
        "sm_90,sm_9",
    };
    for (size_t i = 0; i < N(vals); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        int rc = set_one(&d, KW_CONFIG_ARCH, vals[i], err);
        cr_expect_eq(rc, KW_EDEPLOY, "--arch '%s' accepted", vals[i]);
        cr_expect(names_flag(err, "--arch"), "'%s': %s", vals[i], err);
        kw_config_deploy_destroy(&d);
    }
}

/* ---- --deploy files ----------------------------------------------------- */

Test(deploy, deploy_file_reads_every_snake_case_name, .init = tmp_setup,
     .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    int rc = load_text(&d,
                       "{\"dcp_world\": 4, \"dcp_rank\": 3, "
                       "\"dcp_interleave\": 2, \"pcp\": 2, "
                       "\"max_num_batched_tokens\": 512, "
                       "\"max_num_seqs\": 64, \"block_size\": 256, "
                       "\"max_model_len\": 65536, "
                       "\"block_stride_rows\": 1024, "
                       "\"arch\": \"sm_100,sm_90a\"}",
                       err, &path);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(d.dcp_world, 4);
    cr_expect_eq(d.dcp_rank, 3);
    cr_expect_eq(d.dcp_interleave, 2);
    cr_expect_eq(d.pcp, 2);
    cr_expect_eq(d.max_num_batched_tokens, 512);
    cr_expect_eq(d.max_num_seqs, 64);
    cr_expect_eq(d.block_size, 256);
    cr_expect_eq(d.max_model_len, 65536);
    cr_expect_eq(d.block_stride_rows, 1024);
    cr_expect_eq(d.narch, 2);
    cr_expect_str_eq(d.arch[0], "sm_100");
    cr_expect_str_eq(d.arch[1], "sm_90a");
    cr_expect_str_eq(d.source, path);
    kw_config_deploy_destroy(&d);
}

Test(deploy, deploy_file_rejects_unknown_name, .init = tmp_setup,
     .fini = tmp_teardown)
{
    file_rejects("{\"dcp_worlds\": 2}", "/dcp_worlds");
    file_rejects("{\"dcp-world\": 2}", "/dcp-world");
    file_rejects("{\"DCP_WORLD\": 2}", "/DCP_WORLD");
    file_rejects("{\"dcp_world\": 2, \"model\": \"x.json\"}", "/model");
    file_rejects("{\"pcp\": 1, \"a/b\": 1}", "/a~1b");
}

Test(deploy, deploy_file_integer_rule, .init = tmp_setup,
     .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    int rc = load_text(&d, "{\"block_size\": 2048.0, "
                           "\"max_num_seqs\": 2147483647.0, "
                           "\"dcp_world\": 2e1}", err, &path);
    cr_expect_eq(rc, 0, "%s", err);
    cr_expect_eq(d.block_size, 2048);
    cr_expect_eq(d.max_num_seqs, 2147483647);
    cr_expect_eq(d.dcp_world, 20);
    kw_config_deploy_destroy(&d);
    static const char *const bad[] = {"2.5", "\"2\"", "true", "[]", "{}",
                                      "0", "-1", "2147483648", "1e400"};
    for (size_t i = 0; i < N(bad); i++) {
        char text[128];
        snprintf(text, sizeof text, "{\"pcp\": 1, \"block_size\": %s}",
                 bad[i]);
        file_rejects(text, "/block_size");
    }
    file_rejects("{\"dcp_interleave\": 0.5}", "/dcp_interleave");
    file_rejects("{\"max_model_len\": \"4096\"}", "/max_model_len");
}

Test(deploy, deploy_file_null_means_absent, .init = tmp_setup,
     .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    int rc = load_text(&d, "{\"dcp_world\": null, \"dcp_rank\": null, "
                           "\"block_size\": null, \"max_model_len\": null, "
                           "\"block_stride_rows\": null, \"arch\": null, "
                           "\"max_num_seqs\": null}", err, &path);
    cr_assert_eq(rc, 0, "%s", err);
    kw_config_model m;
    model(&m, V4);
    rc = kw_config_resolve(&d, &m, err, sizeof err);
    cr_expect_eq(rc, 0, "%s", err);
    cr_expect_eq(d.dcp_world, 1);
    cr_expect_eq(d.dcp_rank, KW_CONFIG_RANK_ALL);
    cr_expect_eq(d.max_num_seqs, 256);
    cr_expect_eq(d.block_size, 128, "derived from ratios {4, 128}");
    cr_expect_eq(d.max_model_len, 1048576);
    cr_expect_eq(d.block_stride_rows, 128);
    cr_expect_eq(d.narch, 1);
    cr_expect_str_eq(d.arch[0], "sm_90");
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
}

Test(deploy, deploy_file_dcp_rank_is_all_or_an_integer, .init = tmp_setup,
     .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    cr_expect_eq(load_text(&d, "{\"dcp_rank\": \"all\"}", err, &path), 0,
                 "%s", err);
    cr_expect_eq(d.dcp_rank, KW_CONFIG_RANK_ALL);
    cr_expect_eq(load_text(&d, "{\"dcp_world\": 2, \"dcp_rank\": 1.0}", err,
                           &path), 0, "%s", err);
    cr_expect_eq(d.dcp_rank, 1);
    cr_expect_eq(load_text(&d, "{\"dcp_rank\": 0}", err, &path), 0, "%s",
                 err);
    cr_expect_eq(d.dcp_rank, 0);
    file_rejects("{\"dcp_rank\": \"ALL\"}", "/dcp_rank");
    file_rejects("{\"dcp_rank\": \"1\"}", "/dcp_rank");
    file_rejects("{\"dcp_rank\": -1}", "/dcp_rank");
    file_rejects("{\"dcp_rank\": true}", "/dcp_rank");
}

Test(deploy, deploy_file_arch_is_a_checked_list, .init = tmp_setup,
     .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    cr_expect_eq(load_text(&d, "{\"arch\": \"sm_90,sm_100,sm_90\"}", err,
                           &path), 0, "%s", err);
    cr_expect_eq(d.narch, 2);
    file_rejects("{\"arch\": \"sm_9\"}", "/arch");
    file_rejects("{\"arch\": \"\"}", "/arch");
    file_rejects("{\"arch\": \"sm_90,\"}", "/arch");
    file_rejects("{\"arch\": 90}", "/arch");
}

Test(deploy, deploy_file_must_be_strict_json_object, .init = tmp_setup,
     .fini = tmp_teardown)
{
    file_rejects("{\"dcp_world\": 2, \"dcp_world\": 2}", "/dcp_world");
    file_rejects("{\"dcp_world\": 2} x", NULL);
    file_rejects("{\"dcp_world\": NaN}", NULL);
    file_rejects("{\"dcp_world\": 02}", NULL);
    file_rejects("[{\"dcp_world\": 2}]", NULL);
    file_rejects("", NULL);
    file_rejects("{\"dcp_world\": 2", NULL);
}

Test(deploy, deploy_file_that_cannot_be_read_is_rejected, .init = tmp_setup,
     .fini = tmp_teardown)
{
    char path[256];
    snprintf(path, sizeof path, "%s/absent.json", tmpdir);
    const char *const paths[] = {path, tmpdir};
    for (size_t i = 0; i < N(paths); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN] = "";
        kw_config_deploy_init(&d);
        int rc = kw_config_deploy_load(&d, paths[i], err, sizeof err);
        cr_expect(rc < 0, "%s accepted", paths[i]);
        cr_expect(strstr(err, paths[i]) != NULL, "%s: %s", paths[i], err);
        kw_config_deploy_destroy(&d);
    }
}

Test(deploy, rejects_flags_combined_with_deploy_file, .init = tmp_setup,
     .fini = tmp_teardown)
{
    const char *path = tmp_file("d.json", "{\"dcp_world\": 2}");
    char err[KW_CONFIG_ERRLEN] = "";
    /* A flag, then the file. */
    kw_config_deploy d;
    kw_config_deploy_init(&d);
    cr_assert_eq(kw_config_deploy_set_flag(&d, KW_CONFIG_PCP, "2", err,
                                           sizeof err), 0);
    int rc = kw_config_deploy_load(&d, path, err, sizeof err);
    cr_expect_eq(rc, KW_EDEPLOY);
    cr_expect(names_flag(err, "--deploy") || names_flag(err, "--pcp"), "%s",
              err);
    kw_config_deploy_destroy(&d);
    /* The file, then a flag (even one the file does not set). */
    static const kw_config_field later[] = {KW_CONFIG_DCP_WORLD,
                                            KW_CONFIG_BLOCK_SIZE,
                                            KW_CONFIG_ARCH};
    for (size_t i = 0; i < N(later); i++) {
        kw_config_deploy_init(&d);
        cr_assert_eq(kw_config_deploy_load(&d, path, err, sizeof err), 0,
                     "%s", err);
        const char *flag = kw_config_field_flag(later[i]);
        rc = kw_config_deploy_set_flag(
            &d, later[i], later[i] == KW_CONFIG_ARCH ? "sm_90" : "64", err,
            sizeof err);
        cr_expect_eq(rc, KW_EDEPLOY, "%s after --deploy", flag);
        cr_expect(names_flag(err, flag), "%s: %s", flag, err);
        kw_config_deploy_destroy(&d);
    }
    /* Two files. */
    kw_config_deploy_init(&d);
    cr_assert_eq(kw_config_deploy_load(&d, path, err, sizeof err), 0);
    cr_expect_eq(kw_config_deploy_load(&d, path, err, sizeof err),
                 KW_EDEPLOY);
    kw_config_deploy_destroy(&d);
}

/* ---- issue 15: num_speculative_tokens (§2) -------------------------------- */

Test(deploy, num_speculative_tokens_defaults_to_0_and_accepts_0_to_7)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    kw_config_deploy_init(&d);
    cr_expect_eq(d.num_speculative_tokens, 0);
    kw_config_deploy_destroy(&d);
    cr_assert_eq(kw_config_flag_field("--num-speculative-tokens"),
                 KW_CONFIG_NUM_SPECULATIVE_TOKENS);
    cr_expect_str_eq(kw_config_field_name(KW_CONFIG_NUM_SPECULATIVE_TOKENS),
                     "num_speculative_tokens");
    static const char *const ok[] = {"0", "1", "7"};
    for (size_t i = 0; i < N(ok); i++) {
        cr_expect_eq(set_one(&d, KW_CONFIG_NUM_SPECULATIVE_TOKENS, ok[i], err),
                     0, "%s: %s", ok[i], err);
        cr_expect_eq(d.num_speculative_tokens, ok[i][0] - '0');
        kw_config_deploy_destroy(&d);
    }
}

Test(deploy, num_speculative_tokens_flag_rejects_8_naming_the_flag)
{
    static const char *const bad[] = {"8", "-1", "2147483647", "1.0", "x", ""};
    for (size_t i = 0; i < N(bad); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        int rc = set_one(&d, KW_CONFIG_NUM_SPECULATIVE_TOKENS, bad[i], err);
        cr_expect_eq(rc, KW_EDEPLOY, "'%s': rc %d", bad[i], rc);
        cr_expect(names_flag(err, "--num-speculative-tokens"), "'%s': %s",
                  bad[i], err);
        kw_config_deploy_destroy(&d);
    }
}

Test(deploy, deploy_file_num_speculative_tokens, .init = tmp_setup,
     .fini = tmp_teardown)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    int rc = load_text(&d, "{\"num_speculative_tokens\": 3.0}", err, &path);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_eq(d.num_speculative_tokens, 3);
    kw_config_deploy_destroy(&d);
    rc = load_text(&d, "{\"num_speculative_tokens\": 0}", err, &path);
    cr_assert_eq(rc, 0, "%s", err);
    kw_config_deploy_destroy(&d);
    file_rejects("{\"num_speculative_tokens\": 8}", "/num_speculative_tokens");
    file_rejects("{\"num_speculative_tokens\": -1}", "/num_speculative_tokens");
    file_rejects("{\"num_speculative_tokens\": 1.5}", "/num_speculative_tokens");
    file_rejects("{\"num_speculative_tokens\": \"1\"}",
                 "/num_speculative_tokens");
}

/* The given fields round-trip through kw_config_deploy_given_json(), the
 * speculative tokens included (how kwarm hands a deployment to kwarmd). */
Test(deploy, given_fields_round_trip_through_json)
{
    kw_config_deploy d, back;
    char err[KW_CONFIG_ERRLEN];
    flags(&d, F("--dcp-world", "4", "--dcp-rank", "all",
                "--num-speculative-tokens", "3", "--arch", "sm_90,sm_100",
                "--block-stride-rows", "4096"));
    cJSON *obj = NULL;
    cr_assert_eq(kw_config_deploy_given_json(&d, &obj), 0);
    cr_assert_eq(cJSON_GetArraySize(obj), 5);
    kw_config_deploy_init(&back);
    cr_assert_eq(kw_config_deploy_from_json(&back, obj, "req", err,
                                            sizeof err), 0, "%s", err);
    cr_expect_eq(back.dcp_world, 4);
    cr_expect_eq(back.dcp_rank, KW_CONFIG_RANK_ALL);
    cr_expect_eq(back.num_speculative_tokens, 3);
    cr_expect_eq(back.block_stride_rows, 4096);
    cr_expect_eq(back.narch, 2);
    cr_expect_str_eq(back.arch[1], "sm_100");
    cr_expect_eq(back.given, d.given);
    cJSON_Delete(obj);
    kw_config_deploy_destroy(&back);
    kw_config_deploy_destroy(&d);
}
