/* test_cli_check.c: bad input is refused before any work, with exit 2 and
 * one line naming the flag, field or arch and what is allowed (issue 24,
 * point 2 of "done when").  Each rule is probed on both sides of its
 * bound: the value just inside goes on to the next step (a miss, a
 * missing cache), the value just outside is refused.
 */
#include "cli_util.h"

#include "kw_jit.h"

TestSuite(cli_check, .init = tmp_setup, .fini = tmp_teardown);

/* ---- --pin --------------------------------------------------------------- */

Test(cli_check, a_bad_pin_name_is_refused_before_any_compile)
{
    static const char *const bad[] = {"", "a b/c", "x\ty",
        "0123456789012345678901234567890123456789012345678901234567890123X"};
    for (size_t i = 0; i < N(bad); i++) {
        /* The cache need not exist: the pin is refused first, so nothing
         * was created, derived or compiled. */
        expect_bad_input("prewarm --pin", ARGS("prewarm", "--model", V32,
                         "--cache", tmp_at("c"), "--pin", bad[i]),
                         NEEDLES("--pin", "not a pin set name"));
        struct stat st;
        cr_expect(stat(tmp_at("c"), &st) < 0, "prewarm created its cache");
        expect_bad_input("warmup --pin", ARGS("warmup", "--model", V32,
                         "--socket", tmp_at("no.sock"), "--pin", bad[i]),
                         NEEDLES("--pin", "not a pin set name"));
    }
}

Test(cli_check, a_good_pin_name_goes_on_to_the_next_step)
{
    /* 64 characters of the allowed set: accepted, so the command goes on
     * and fails at the next step (no kwarmd), which is not about --pin. */
    static const char *const good[] = {"v4-w8.2026:12@a+b_c",
        "0123456789012345678901234567890123456789012345678901234567890123"};
    for (size_t i = 0; i < N(good); i++) {
        result r = kwarm(ARGS("warmup", "--model", V32, "--socket",
                              tmp_at("no.sock"), "--pin", good[i]));
        cr_expect_eq(r.status, 1, "exit %d: %s", r.status, r.err);
        cr_expect(strstr(r.err, "--pin") == NULL, "%s", r.err);
        result_free(&r);
    }
}

/* ---- --arch -------------------------------------------------------------- */

/* The lowest sm_NN the linked NVRTC builds. */
static int lowest_arch(void)
{
    for (int n = 10; n < 1000; n++) {
        char a[16];
        snprintf(a, sizeof a, "sm_%d", n);
        if (kw_jit_arch_valid(a))
            return n;
    }
    cr_assert_fail("NVRTC lists no arch");
    return 0;
}

Test(cli_check, an_arch_nvrtc_cannot_build_is_refused_by_every_command)
{
    char below[16], lowest[16];
    int lo = lowest_arch();
    snprintf(below, sizeof below, "sm_%d", lo - 1);
    snprintf(lowest, sizeof lowest, "sm_%d", lo);
    /* Each command with what it needs besides: the arch is refused
     * before the cache is created or kwarmd is asked. */
    const char *const *cases[][2] = {
        {ARGS("keys", "--model", V32, "--arch", "sm_35"),
         ARGS("keys", "--model", V32, "--arch", below)},
        {ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"), "--arch", "sm_35"),
         ARGS("prewarm", "--model", V32, "--cache", tmp_at("c"), "--arch", below)},
        {ARGS("warmup", "--model", V32, "--socket", "/nonexistent/s",
              "--arch", "sm_35"),
         ARGS("warmup", "--model", V32, "--socket", "/nonexistent/s",
              "--arch", below)},
        {ARGS("diff", "--model", V32, "--against", V32, "--arch", "sm_35"),
         ARGS("diff", "--model", V32, "--arch", below, "--against", V32)},
    };
    for (size_t i = 0; i < N(cases); i++) {
        expect_bad_input(cases[i][0][0], cases[i][0],
                         NEEDLES("--arch sm_35", "cannot build", lowest));
        expect_bad_input(cases[i][1][0], cases[i][1], NEEDLES(below));
    }
    struct stat st;
    cr_expect(stat(tmp_at("c"), &st) < 0, "prewarm created its cache");
    result r = kwarm(ARGS("keys", "--model", V32, "--arch", lowest));
    cr_expect_eq(r.status, 0, "keys --arch %s: %s", lowest, r.err);
    result_free(&r);
    expect_bad_input("get --arch", ARGS("get", "--family", "dcp_stable_topk",
                     "--fields", "topk=1,num_candidates=1", "--arch", "sm_35",
                     "--cache", tmp_at("c"), "-o", tmp_at("k")),
                     NEEDLES("--arch sm_35", "cannot build"));
}

/* ---- get --fields --------------------------------------------------------- */

typedef struct field_case {
    const char *family, *good, *bad, *field;
} field_case;

/* One case per kind of field, each just inside and just outside its
 * bound (launch/kw_launch.h). */
static const field_case field_cases[] = {
    {"dcp_stable_topk", "topk=1,num_candidates=16384",
     "topk=-1,num_candidates=16384", "topk=-1"},
    {"dcp_stable_topk", "topk=1,num_candidates=16384",
     "topk=0,num_candidates=16384", "topk=0"},
    {"indexer_topk", "topk=1048576,windowed=true",
     "topk=1048577,windowed=true", "topk=1048577"},
    {"indexer_logits", "heads=256,head_dim=128,paged=true,page_rows=64,next_n=8",
     "heads=257,head_dim=128,paged=true,page_rows=64,next_n=8", "heads=257"},
    {"indexer_logits", "heads=64,head_dim=32,paged=true,page_rows=64,next_n=1",
     "heads=64,head_dim=48,paged=true,page_rows=64,next_n=1", "head_dim=48"},
    {"indexer_logits", "heads=64,head_dim=128,paged=true,page_rows=64,next_n=8",
     "heads=64,head_dim=128,paged=true,page_rows=64,next_n=9", "next_n=9"},
    {"indexer_topk", "topk=2048,windowed=1", "topk=2048,windowed=2",
     "windowed=2"},
    {"compressed_slot_mapping",
     "compress_ratio=4,triton_block_size=1024,block_size=16,dcp_world_size=2,"
     "dcp_rank=1,cp_kv_cache_interleave_size=1",
     "compress_ratio=4,triton_block_size=1056,block_size=16,dcp_world_size=2,"
     "dcp_rank=1,cp_kv_cache_interleave_size=1", "triton_block_size=1056"},
    {"compressed_slot_mapping",
     "compress_ratio=4,triton_block_size=128,block_size=16,dcp_world_size=2,"
     "dcp_rank=1,cp_kv_cache_interleave_size=1",
     "compress_ratio=4,triton_block_size=128,block_size=15,dcp_world_size=2,"
     "dcp_rank=1,cp_kv_cache_interleave_size=1", "block_size=15"},
};

Test(cli_check, get_fields_names_the_field_and_what_it_allows)
{
    cr_assert_eq(mkdir(tmp_at("c"), 0700), 0);
    for (size_t i = 0; i < N(field_cases); i++) {
        const field_case *fc = &field_cases[i];
        /* With --cache and through kwarmd alike (no daemon runs: the key
         * is refused before any connect). */
        expect_bad_input(fc->field, ARGS("get", "--family", fc->family,
                         "--fields", fc->bad, "--arch", "sm_90", "--cache",
                         tmp_at("c"), "-o", tmp_at("k")),
                         NEEDLES("--fields", fc->field, "must be"));
        expect_bad_input(fc->field, ARGS("get", "--family", fc->family,
                         "--fields", fc->bad, "--arch", "sm_90", "--socket",
                         tmp_at("no.sock"), "-o", tmp_at("k")),
                         NEEDLES("--fields", fc->field, "must be"));
        /* Just inside: a miss the cache cannot serve, exit 1. */
        result r = kwarm(ARGS("get", "--family", fc->family, "--fields",
                              fc->good, "--arch", "sm_90", "--cache", tmp_at("c"),
                              "-o", tmp_at("k"), "--no-compile"));
        cr_expect_eq(r.status, 1, "[%s] exit %d: %s", fc->good, r.status, r.err);
        cr_expect(strstr(r.err, "not cached") != NULL, "%s", r.err);
        result_free(&r);
    }
}

Test(cli_check, fields_that_fail_only_together_are_refused_as_such)
{
    cr_assert_eq(mkdir(tmp_at("c"), 0700), 0);
    expect_bad_input("rank", ARGS("get", "--family", "compressed_slot_mapping",
                     "--fields", "compress_ratio=4,triton_block_size=128,"
                     "block_size=16,dcp_world_size=2,dcp_rank=2,"
                     "cp_kv_cache_interleave_size=1", "--arch", "sm_90",
                     "--cache", tmp_at("c"), "-o", tmp_at("k")),
                     NEEDLES("name no kernel together", "rank"));
    expect_bad_input("prefill", ARGS("get", "--family", "indexer_logits",
                     "--fields", "heads=64,head_dim=128,paged=false,"
                     "page_rows=64,next_n=1", "--arch", "sm_90", "--cache",
                     tmp_at("c"), "-o", tmp_at("k")),
                     NEEDLES("name no kernel together", "page_rows 0"));
}

/* A refused key is bad input: nothing compiled, nothing counted. */
Test(cli_check, a_refused_key_is_not_a_compile_failure)
{
    cr_assert_eq(mkdir(tmp_at("c"), 0700), 0);
    result r = kwarm(ARGS("get", "--family", "dcp_stable_topk", "--fields",
                          "topk=1,num_candidates=16384", "--arch", "sm_90",
                          "--cache", tmp_at("c"), "-o", tmp_at("k"), "--no-compile"));
    cr_assert_eq(r.status, 1, "%s", r.err); /* a miss; the cache exists now */
    result_free(&r);
    expect_bad_input("topk", ARGS("get", "--family", "dcp_stable_topk",
                     "--fields", "topk=-1,num_candidates=16384", "--arch",
                     "sm_90", "--cache", tmp_at("c"), "-o", tmp_at("k")),
                     NEEDLES("topk=-1"));
    r = kwarm(ARGS("stats", "--cache", tmp_at("c"), "--json"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *st = cJSON_Parse(r.out);
    cr_assert_not_null(st, "%s", r.out);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(st, "compile_failures");
    cr_expect(cJSON_IsNumber(f) && f->valuedouble == 0, "%s", r.out);
    cJSON_Delete(st);
    result_free(&r);
}
