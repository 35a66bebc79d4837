/* test_cli.c: `kwarm` and `kwarm keys` as a black box (spec §1-§2, §6).
 *
 * Every case runs the built kwarm (KW_KWARM_BIN) through kw_test_run and
 * looks only at its exit status, stdout and stderr: 0 ok, 2 bad input with
 * exactly one stderr line naming the file and pointer or the flag, nothing
 * on stdout.  `--json` output is parsed with cJSON and compared, as sets,
 * with tests/fixtures/expected/NAME.DEPLOY.json.
 */
#include <dirent.h>

#include "cli_util.h"

/* kw_test_run() stores an empty NUL-terminated string for a stream that
 * stayed empty.  Found by this suite: the buffer is allocated, then EOF
 * arrives and no NUL is written (kwarm() above works around it). */
Test(cli, run_helper_gives_empty_string_for_silent_stream)
{
    const char *const argv[] = {"/bin/sh", "-c", "exit 3", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(kw_test_run(argv, &out, &err), 3);
    cr_assert_not_null(out);
    cr_assert_not_null(err);
    cr_expect_eq(out[0], '\0', "stdout is not an empty string");
    cr_expect_eq(err[0], '\0', "stderr is not an empty string");
    free(out);
    free(err);
}

/* ---- help and usage ----------------------------------------------------- */

Test(cli, help_exits_0_and_prints_usage)
{
    const char *const *cases[] = {ARGS("--help"), ARGS("-h")};
    for (size_t i = 0; i < N(cases); i++) {
        result r = kwarm(cases[i]);
        cr_expect_eq(r.status, 0, "%s", cases[i][0]);
        cr_expect(strstr(r.out, "usage") != NULL, "%s: %s", cases[i][0],
                  r.out);
        cr_expect(strstr(r.out, "keys") != NULL, "commands not listed");
        cr_expect_str_empty(r.err);
        result_free(&r);
    }
}

Test(cli, keys_help_exits_0_and_lists_flags)
{
    result r = kwarm(ARGS("keys", "--help"));
    cr_expect_eq(r.status, 0);
    cr_expect_str_empty(r.err);
    static const char *const words[] = {
        "usage",          "--model",          "--json",
        "--deploy",       "--text-config",    "--dcp-world",
        "--dcp-rank",     "--dcp-interleave", "--pcp",
        "--max-num-batched-tokens", "--max-num-seqs", "--block-size",
        "--max-model-len", "--block-stride-rows", "--arch",
    };
    for (size_t i = 0; i < N(words); i++)
        cr_expect(strstr(r.out, words[i]) != NULL, "help lacks %s",
                  words[i]);
    result_free(&r);
}

Test(cli, rejects_unknown_command)
{
    expect_bad_input("unknown command", ARGS("frobnicate"),
                     NEEDLES("frobnicate"));
    expect_bad_input("flag as command", ARGS("--model"), NEEDLES("--model"));
}

Test(cli, rejects_unknown_flag)
{
    expect_bad_input("unknown flag", ARGS("keys", "--model", V32, "--bogus"),
                     NEEDLES("--bogus"));
    expect_bad_input("flag prefix", ARGS("keys", "--model", V32,
                                         "--dcp-worl", "2"),
                     NEEDLES("--dcp-worl"));
    expect_bad_input("positional", ARGS("keys", "--model", V32, "extra"),
                     NEEDLES("extra"));
    expect_bad_input("json with value", ARGS("keys", "--model", V32,
                                             "--json=1"),
                     NEEDLES("--json"));
}

Test(cli, good_run_exits_0_with_no_stderr)
{
    result r = kwarm(ARGS("keys", "--model", V32));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect_str_empty(r.err);
    cr_expect(strlen(r.out) > 0);
    result_free(&r);
}

/* ---- bad inputs: fixtures, files, flags --------------------------------- */

/* The pointer each bad fixture must name, when one field is at fault. */
static const char *bad_fixture_pointer(const char *name)
{
    static const struct {
        const char *file, *ptr;
    } known[] = {
        {"topk-negative.json", "/text_config/index_topk"},
        {"topk-string.json", "/index_topk"},
        {"dense-model.json", "index_topk"},
    };
    for (size_t i = 0; i < N(known); i++)
        if (strcmp(known[i].file, name) == 0)
            return known[i].ptr;
    return NULL;
}

Test(cli, every_bad_fixture_exits_2_with_one_line)
{
    DIR *dir = opendir(KW_FIXTURES "/bad");
    cr_assert_not_null(dir, "%s", strerror(errno));
    size_t seen = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/bad/%s", KW_FIXTURES, e->d_name);
        const char *ptr = bad_fixture_pointer(e->d_name);
        expect_bad_input(e->d_name, ARGS("keys", "--model", path, "--json"),
                         ptr ? NEEDLES(path, ptr) : NEEDLES(path));
        seen++;
    }
    closedir(dir);
    cr_expect(seen >= 4, "only %zu bad fixtures", seen);
}

/* Malformed or invalid config texts; ptr is the pointer that must be named
 * (NULL when the text, not a field, is at fault). */
#define NUL_TEXT "{\"index_topk\": 8, \"x\": \"a\0\"}"
#define GARBAGE "\x7f" "ELF\x02\x01\x01\0\0\xff\xfe\x00\x10\x80\x01"
static const struct bad_text {
    const char *label, *text;
    size_t len; /* 0: strlen(text) */
    const char *ptr;
} bad_texts[] = {
    {"NaN", "{\"index_topk\": NaN}", 0, NULL},
    {"Infinity", "{\"index_topk\": 8, \"x\": Infinity}", 0, NULL},
    {"-Infinity", "{\"index_topk\": 8, \"x\": -Infinity}", 0, NULL},
    {"trailing data", "{\"index_topk\": 8} {}", 0, NULL},
    {"duplicate", "{\"index_topk\": 8, \"index_topk\": 8}", 0,
     "/index_topk"},
    {"nested duplicate",
     "{\"text_config\": {\"index_topk\": 8, \"x\": 1, \"x\": 2}}", 0,
     "/text_config/x"},
    {"leading zero", "{\"index_topk\": 08}", 0, NULL},
    {"1.", "{\"index_topk\": 8, \"x\": 1.}", 0, NULL},
    {".5", "{\"index_topk\": 8, \"x\": .5}", 0, NULL},
    {"+1", "{\"index_topk\": 8, \"x\": +1}", 0, NULL},
    {"control char", "{\"index_topk\": 8, \"x\": \"a\x01\"}", 0, NULL},
    {"invalid UTF-8", "{\"index_topk\": 8, \"x\": \"\xc0\xaf\"}", 0, NULL},
    {"NUL byte", NUL_TEXT, sizeof NUL_TEXT - 1, NULL},
    {"truncated", "{\"index_topk\": 8, \"x\": [1, 2", 0, NULL},
    {"empty", "", 0, NULL},
    {"whitespace only", " \n\t ", 0, NULL},
    {"root array", "[{\"index_topk\": 8}]", 0, NULL},
    {"root number", "2048", 0, NULL},
    {"1e400", "{\"index_topk\": 1e400}", 0, "/index_topk"},
    {"topk zero", "{\"index_topk\": 0}", 0, "/index_topk"},
    {"topk fraction", "{\"index_topk\": 2048.5}", 0, "/index_topk"},
    {"topk bool", "{\"index_topk\": true}", 0, "/index_topk"},
    {"topk null", "{\"index_topk\": null}", 0, "index_topk"},
    {"ratio element", "{\"index_topk\": 8, \"compress_ratios\": [4, -1]}", 0,
     "/compress_ratios/1"},
    {"ratios not array", "{\"index_topk\": 8, \"compress_ratios\": 4}", 0,
     "/compress_ratios"},
    {"kpool range", "{\"index_topk\": 8, \"index_kpool\": 65537}", 0,
     "/index_kpool"},
    {"mpe zero", "{\"index_topk\": 8, \"max_position_embeddings\": 0}", 0,
     "/max_position_embeddings"},
    {"lora range", "{\"index_topk\": 8, \"kv_lora_rank\": 65537}", 0,
     "/kv_lora_rank"},
    {"rope fraction", "{\"index_topk\": 8, \"qk_rope_head_dim\": 0.5}", 0,
     "/qk_rope_head_dim"},
    {"dtype not string", "{\"index_topk\": 8, \"torch_dtype\": 4}", 0,
     "/torch_dtype"},
    {"ambiguous", "{\"text_config\": {\"index_topk\": 8}, \"decoder\": "
                  "{\"index_topk\": 8}}", 0, "/decoder"},
    {"no topk in text config", "{\"index_topk\": 8, \"text_config\": {}}",
     0, "/text_config"},
    {"binary garbage", GARBAGE, sizeof GARBAGE - 1, NULL},
};

Test(cli, malformed_config_files_exit_2_naming_file_and_pointer,
     .init = tmp_setup, .fini = tmp_teardown)
{
    for (size_t i = 0; i < N(bad_texts); i++) {
        const struct bad_text *b = &bad_texts[i];
        char name[32];
        snprintf(name, sizeof name, "case%zu.json", i);
        char *path = tmp_file(name, b->text, b->len ? b->len
                                                    : strlen(b->text));
        expect_bad_input(b->label, ARGS("keys", "--model", path, "--json"),
                         b->ptr ? NEEDLES(path, b->ptr) : NEEDLES(path));
        free(path);
    }
}

/* Builds {"index_topk": 8, "x": [[[...1...]]]} nested depth deep. */
static char *deep_text(size_t depth, size_t *len)
{
    char *s = malloc(64 + 2 * depth);
    cr_assert_not_null(s);
    size_t k = (size_t)sprintf(s, "{\"index_topk\": 8, \"x\": ");
    memset(s + k, '[', depth);
    k += depth;
    s[k++] = '1';
    memset(s + k, ']', depth);
    k += depth;
    strcpy(s + k, "}");
    *len = k + 1;
    return s;
}

Test(cli, deep_or_huge_or_missing_files_exit_2, .init = tmp_setup,
     .fini = tmp_teardown)
{
    size_t len;
    char *text = deep_text(2000, &len);
    char *path = tmp_file("deep.json", text, len);
    free(text);
    expect_bad_input("2000 deep", ARGS("keys", "--model", path),
                     NEEDLES(path));
    free(path);
    /* Over 16 MiB, though valid JSON. */
    size_t size = (size_t)KW_CONFIG_MAX_FILE + 1;
    text = malloc(size);
    cr_assert_not_null(text);
    memset(text, ' ', size);
    memcpy(text, "{\"index_topk\": 8}", 17);
    path = tmp_file("big.json", text, size);
    free(text);
    expect_bad_input("over 16 MiB", ARGS("keys", "--model", path),
                     NEEDLES(path));
    free(path);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/absent.json", tmpdir);
    expect_bad_input("missing file", ARGS("keys", "--model", missing),
                     NEEDLES(missing));
    expect_bad_input("directory", ARGS("keys", "--model", tmpdir),
                     NEEDLES(tmpdir));
    expect_bad_input("no --model", ARGS("keys", "--json"),
                     NEEDLES("--model"));
}

Test(cli, unused_fields_are_still_validated, .init = tmp_setup,
     .fini = tmp_teardown)
{
    /* max_position_embeddings is not needed with --max-model-len, but is
     * checked all the same (§2). */
    const char text[] = "{\"index_topk\": 8, \"max_position_embeddings\": 0}";
    char *path = tmp_file("c.json", text, strlen(text));
    expect_bad_input("unused mpe", ARGS("keys", "--model", path,
                                        "--max-model-len", "4096"),
                     NEEDLES(path, "/max_position_embeddings"));
    free(path);
}

Test(cli, bad_flags_exit_2_naming_the_flag, .init = tmp_setup,
     .fini = tmp_teardown)
{
    static const struct {
        const char *label;
        const char *args[10];
        const char *flag;
    } cases[] = {
        {"world 0", {"--dcp-world", "0"}, "--dcp-world"},
        {"world -1", {"--dcp-world", "-1"}, "--dcp-world"},
        {"world 2^31", {"--dcp-world", "2147483648"}, "--dcp-world"},
        {"world 8x", {"--dcp-world", "8x"}, "--dcp-world"},
        {"world empty", {"--dcp-world", ""}, "--dcp-world"},
        {"world space", {"--dcp-world", " 8"}, "--dcp-world"},
        {"world hex", {"--dcp-world", "0x8"}, "--dcp-world"},
        {"world =", {"--dcp-world=0"}, "--dcp-world"},
        {"world twice", {"--dcp-world", "2", "--dcp-world", "2"},
         "--dcp-world"},
        {"pcp 0", {"--pcp", "0"}, "--pcp"},
        {"seqs junk", {"--max-num-seqs", "many"}, "--max-num-seqs"},
        {"tokens neg", {"--max-num-batched-tokens", "-8"},
         "--max-num-batched-tokens"},
        {"stride 0", {"--block-stride-rows", "0"}, "--block-stride-rows"},
        {"rank = world", {"--dcp-world", "2", "--dcp-rank", "2"},
         "--dcp-rank"},
        {"rank junk", {"--dcp-rank", "any"}, "--dcp-rank"},
        {"arch short", {"--arch", "sm_9"}, "--arch"},
        {"arch long", {"--arch", "sm_1000"}, "--arch"},
        {"arch suffix", {"--arch", "sm_90b"}, "--arch"},
        {"arch empty", {"--arch", ""}, "--arch"},
        {"arch comma", {"--arch", "sm_90,"}, "--arch"},
        {"arch compute", {"--arch", "compute_90"}, "--arch"},
        {"missing value", {"--max-model-len"}, "--max-model-len"},
        {"len over 2^24 under dcp",
         {"--dcp-world", "2", "--max-model-len", "16777217"},
         "--max-model-len"},
        {"model twice", {"--model", V32}, "--model"},
        {"text-config missing", {"--text-config", "/nope"}, "/nope"},
        {"text-config malformed", {"--text-config", "nope"}, "nope"},
        {"text-config twice", {"--text-config", "", "--text-config", "/"},
         "--text-config"},
    };
    for (size_t i = 0; i < N(cases); i++) {
        const char *args[16] = {"keys", "--model", V32};
        size_t n = 3;
        for (size_t j = 0; cases[i].args[j] != NULL; j++)
            args[n++] = cases[i].args[j];
        args[n] = NULL;
        expect_bad_input(cases[i].label, args, NEEDLES(cases[i].flag));
    }
    /* Rules that need a model with compress ratios (V4: {4, 128}). */
    expect_bad_input("block size vs ratio",
                     ARGS("keys", "--model", V4, "--block-size", "64"),
                     NEEDLES("--block-size"));
    expect_bad_input("block size / ratio vs interleave",
                     ARGS("keys", "--model", V4, "--dcp-world", "2",
                          "--dcp-interleave", "4", "--block-size", "256"),
                     NEEDLES("--block-size"));
}

Test(cli, deploy_file_errors_exit_2_naming_file_and_pointer,
     .init = tmp_setup, .fini = tmp_teardown)
{
    const char unknown[] = "{\"dcp_world\": 2, \"dcp_wrold\": 2}";
    char *path = tmp_file("unknown.json", unknown, strlen(unknown));
    expect_bad_input("deploy unknown", ARGS("keys", "--model", V32,
                                            "--deploy", path),
                     NEEDLES(path, "/dcp_wrold"));
    free(path);
    const char frac[] = "{\"block_size\": 2.5}";
    path = tmp_file("frac.json", frac, strlen(frac));
    expect_bad_input("deploy fraction", ARGS("keys", "--model", V32,
                                             "--deploy", path),
                     NEEDLES(path, "/block_size"));
    free(path);
    const char good[] = "{\"dcp_world\": 2}";
    path = tmp_file("good.json", good, strlen(good));
    expect_bad_input("deploy + flag", ARGS("keys", "--model", V32,
                                           "--deploy", path, "--pcp", "2"),
                     NEEDLES("--"));
    expect_bad_input("flag + deploy", ARGS("keys", "--model", V32, "--pcp",
                                           "2", "--deploy", path),
                     NEEDLES("--"));
    expect_bad_input("deploy twice", ARGS("keys", "--model", V32,
                                          "--deploy", path, "--deploy",
                                          path),
                     NEEDLES("--deploy"));
    /* The file's values take part in resolution: rank 5 of world 2. */
    free(path);
    const char rank[] = "{\"dcp_world\": 2, \"dcp_rank\": 5}";
    path = tmp_file("rank.json", rank, strlen(rank));
    expect_bad_input("deploy rank", ARGS("keys", "--model", V32, "--deploy",
                                         path),
                     NEEDLES(path, "/dcp_rank"));
    free(path);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/absent.json", tmpdir);
    expect_bad_input("deploy missing", ARGS("keys", "--model", V32,
                                            "--deploy", missing),
                     NEEDLES(missing));
}

/* The one-line rule holds when the input itself carries a newline: a JSON
 * member name with an escaped "\n", a flag value, a pointer.  Found by this
 * suite: the raw newline is copied into the message. */
Test(cli, error_stays_one_line_when_input_holds_newline, .init = tmp_setup,
     .fini = tmp_teardown)
{
    const char dup[] = "{\"index_topk\": 8, \"a\\nb\": 1, \"a\\nb\": 2}";
    char *path = tmp_file("dup.json", dup, strlen(dup));
    expect_bad_input("duplicate name with newline",
                     ARGS("keys", "--model", path), NEEDLES(path));
    free(path);
    const char dep[] = "{\"dcp\\nworld\": 2}";
    path = tmp_file("dep.json", dep, strlen(dep));
    expect_bad_input("deploy name with newline",
                     ARGS("keys", "--model", V32, "--deploy", path),
                     NEEDLES(path));
    free(path);
    expect_bad_input("flag value with newline",
                     ARGS("keys", "--model", V32, "--dcp-world", "8\n"),
                     NEEDLES("--dcp-world"));
    expect_bad_input("arch with newline",
                     ARGS("keys", "--model", V32, "--arch", "sm_90\nsm_100"),
                     NEEDLES("--arch"));
    expect_bad_input("pointer with newline",
                     ARGS("keys", "--model", V32, "--text-config", "/a\nb"),
                     NO_NEEDLES);
}

/* ---- kwarm verify without a GPU (issue 3) ------------------------------- */

#include "kw_cuda.h"

/* True when this host has a usable CUDA driver. */
static bool have_gpu(void)
{
    kw_cuda *c = NULL;
    char err[256];
    if (kw_cuda_open(&c, 0, err, sizeof err) < 0)
        return false;
    kw_cuda_close(c);
    return true;
}

Test(cli, verify_without_gpu_exits_1_with_one_line_naming_libcuda)
{
    if (have_gpu())
        cr_skip_test("a CUDA driver is present; the GPU path runs instead");
    const char *args[] = {"verify", "--model",
                          KW_FIXTURES "/deepseek-v3.2-exp.json", NULL};
    result r = kwarm(args);
    cr_expect_eq(r.status, 1, "exit %d; stderr: %s", r.status, r.err);
    cr_expect_eq(lines(r.err), 1, "stderr: %s", r.err);
    cr_expect(strstr(r.err, "libcuda") != NULL, "stderr: %s", r.err);
    result_free(&r);
}

Test(cli, verify_checks_its_input_before_looking_for_a_gpu)
{
    const char *args[] = {"verify", "--model",
                          KW_FIXTURES "/bad/topk-string.json", NULL};
    const char *needles[] = {"topk-string.json", "/index_topk", NULL};
    expect_bad_input("verify bad model", args, needles);
    const char *jobs[] = {"verify", "--model", KW_FIXTURES "/glm-5.2.json",
                          "--jobs", "0", NULL};
    const char *jneedles[] = {"--jobs", NULL};
    expect_bad_input("verify --jobs 0", jobs, jneedles);
}

Test(cli, verify_help_exits_0)
{
    const char *args[] = {"verify", "--help", NULL};
    result r = kwarm(args);
    cr_expect_eq(r.status, 0);
    cr_expect(strstr(r.out, "--jobs") != NULL && strstr(r.out, "--dcp-world") != NULL);
    result_free(&r);
}
