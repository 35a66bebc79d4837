/* test_config.c: reading a model config (jit/kw_config.h, spec §1-§2).
 *
 * Most rules are exercised through kw_config_load_buffer() on inline JSON;
 * file-level rules (missing file, directory, size cap) use a temporary
 * directory made per test and removed by its .fini.  Every rejection checks
 * the return code and that the one-line message names the file and, where a
 * field is at fault, its JSON pointer (the only normative parts, §2).
 */
#include "config_util.h"

/* ---- §1: finding the text config --------------------------------------- */

Test(config, flat_config_is_its_own_text_config)
{
    kw_config_model m;
    load_ok(&m, "{\"index_topk\": 2048, \"max_position_embeddings\": 163840,"
                " \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64}", NULL);
    cr_expect_str_eq(m.text_config, "/");
    cr_expect_str_eq(m.path, NAME);
    cr_expect_eq(m.index_topk, 2048);
    cr_expect(m.has_max_position_embeddings);
    cr_expect_eq(m.max_position_embeddings, 163840);
    cr_expect_eq(m.kv_lora_rank, 512);
    cr_expect_eq(m.qk_rope_head_dim, 64);
    cr_expect_not(m.has_index_kpool);
    cr_expect_eq(m.ncompress_ratios, 0);
    cr_expect_null(m.compress_ratios);
    cr_expect_eq(m.element_size, 2);
    kw_config_model_destroy(&m);
}

Test(config, text_config_wrapper_is_descended)
{
    kw_config_model m;
    load_ok(&m, "{\"model_type\": \"vl\", \"text_config\": {\"index_topk\": "
                "512, \"max_position_embeddings\": 4096}}", NULL);
    cr_expect_str_eq(m.text_config, "/text_config");
    cr_expect_eq(m.index_topk, 512);
    cr_expect_eq(m.max_position_embeddings, 4096);
    kw_config_model_destroy(&m);
}

Test(config, thinker_config_holding_text_config_is_descended_twice)
{
    kw_config_model m;
    load_ok(&m, "{\"thinker_config\": {\"audio_config\": {}, \"text_config\":"
                " {\"index_topk\": 64}}}", NULL);
    cr_expect_str_eq(m.text_config, "/thinker_config/text_config");
    cr_expect_eq(m.index_topk, 64);
    kw_config_model_destroy(&m);
}

Test(config, each_wrapper_name_is_searched)
{
    static const char *const names[] = {
        "thinker_config", "llm_config", "language_config", "text_config",
        "decoder",        "generator",  "text_encoder",
    };
    for (size_t i = 0; i < N(names); i++) {
        char json[256], ptr[64];
        kw_config_model m;
        snprintf(json, sizeof json, "{\"%s\": {\"index_topk\": %zu}}",
                 names[i], i + 10);
        snprintf(ptr, sizeof ptr, "/%s", names[i]);
        if (accept(&m, json) != 0)
            continue;
        cr_expect_str_eq(m.text_config, ptr, "%s", names[i]);
        cr_expect_eq(m.index_topk, (int64_t)(i + 10), "%s", names[i]);
        kw_config_model_destroy(&m);
    }
}

Test(config, wrapper_that_is_null_or_not_an_object_is_ignored)
{
    static const char *const vals[] = {
        "null", "5", "\"x\"", "true", "[]", "[{\"index_topk\": 1}]",
    };
    for (size_t i = 0; i < N(vals); i++) {
        char json[256];
        kw_config_model m;
        snprintf(json, sizeof json,
                 "{\"index_topk\": 77, \"text_config\": %s}", vals[i]);
        if (accept(&m, json) != 0)
            continue;
        cr_expect_str_eq(m.text_config, "/", "%s", json);
        cr_expect_eq(m.index_topk, 77, "%s", json);
        kw_config_model_destroy(&m);
    }
    /* A non-object wrapper beside an object one is no ambiguity. */
    kw_config_model m;
    load_ok(&m, "{\"llm_config\": null, \"decoder\": 3, \"text_config\": "
                "{\"index_topk\": 9}}", NULL);
    cr_expect_str_eq(m.text_config, "/text_config");
    cr_expect_eq(m.index_topk, 9);
    kw_config_model_destroy(&m);
}

Test(config, rejects_two_wrappers_as_ambiguous_naming_both)
{
    const char *json = "{\"text_config\": {\"index_topk\": 1}, "
                       "\"llm_config\": {\"index_topk\": 2}}";
    reject(json, "/text_config");
    reject(json, "/llm_config");
    /* The same one level down. */
    json = "{\"thinker_config\": {\"text_config\": {\"index_topk\": 1}, "
           "\"decoder\": {\"index_topk\": 2}}}";
    reject(json, "/thinker_config/text_config");
    reject(json, "/thinker_config/decoder");
}

Test(config, four_wrapper_descents_are_followed)
{
    kw_config_model m;
    load_ok(&m, "{\"llm_config\": {\"language_config\": {\"decoder\": "
                "{\"generator\": {\"index_topk\": 4}}}}}", NULL);
    cr_expect_str_eq(m.text_config,
                     "/llm_config/language_config/decoder/generator");
    cr_expect_eq(m.index_topk, 4);
    kw_config_model_destroy(&m);
}

Test(config, rejects_fifth_wrapper_descent)
{
    reject("{\"llm_config\": {\"language_config\": {\"decoder\": "
           "{\"generator\": {\"text_encoder\": {\"index_topk\": 5}}}}}}",
           "/llm_config/language_config/decoder/generator/text_encoder");
}

/* ---- §1 step 1: --text-config ------------------------------------------ */

static const char composite[] =
    "{\"index_topk\": 1, \"text_config\": {\"index_topk\": 2}, "
    "\"a\": {\"b\": {\"index_topk\": 3}, \"arr\": [{\"index_topk\": 4}], "
    "\"s\": \"str\", \"n\": null, \"num\": 5}, "
    "\"x/y\": {\"p~q\": {\"index_topk\": 6}}, "
    "\"~1\": {\"index_topk\": 7}}";

Test(config, explicit_empty_or_slash_pointer_selects_root)
{
    static const char *const ptrs[] = {"", "/"};
    for (size_t i = 0; i < N(ptrs); i++) {
        kw_config_model m;
        load_ok(&m, composite, ptrs[i]);
        cr_expect_str_eq(m.text_config, "/", "pointer '%s'", ptrs[i]);
        cr_expect_eq(m.index_topk, 1, "pointer '%s'", ptrs[i]);
        kw_config_model_destroy(&m);
    }
}

Test(config, explicit_pointer_selects_nested_object)
{
    kw_config_model m;
    load_ok(&m, composite, "/a/b");
    cr_expect_str_eq(m.text_config, "/a/b");
    cr_expect_eq(m.index_topk, 3);
    kw_config_model_destroy(&m);
    /* It overrides the wrapper search, ambiguity included. */
    load_ok(&m, "{\"text_config\": {\"index_topk\": 1}, \"llm_config\": "
                "{\"index_topk\": 2}}", "/llm_config");
    cr_expect_str_eq(m.text_config, "/llm_config");
    cr_expect_eq(m.index_topk, 2);
    kw_config_model_destroy(&m);
}

Test(config, explicit_pointer_decodes_tilde_escapes)
{
    kw_config_model m;
    load_ok(&m, composite, "/x~1y/p~0q");
    cr_expect_str_eq(m.text_config, "/x~1y/p~0q");
    cr_expect_eq(m.index_topk, 6);
    kw_config_model_destroy(&m);
    /* "~01" is "~1" (RFC 6901 decodes ~0 last), not "/". */
    load_ok(&m, composite, "/~01");
    cr_expect_eq(m.index_topk, 7);
    kw_config_model_destroy(&m);
}

Test(config, rejects_explicit_pointer_to_missing_member)
{
    static const char *const ptrs[] = {"/nope", "/a/nope", "/a/b/c",
                                       "/x/y/p~0q", "/x~1y/p~1q"};
    for (size_t i = 0; i < N(ptrs); i++)
        reject_len(composite, strlen(composite), ptrs[i], ptrs[i], ptrs[i]);
}

Test(config, rejects_explicit_pointer_to_non_object)
{
    /* A string, null, a number, an array, an array element (no indices). */
    static const char *const ptrs[] = {"/a/s", "/a/n", "/a/num", "/a/arr",
                                       "/a/arr/0", "/index_topk"};
    for (size_t i = 0; i < N(ptrs); i++)
        reject_len(composite, strlen(composite), ptrs[i], ptrs[i], ptrs[i]);
}

Test(config, rejects_malformed_explicit_pointer)
{
    static const char *const ptrs[] = {"a", "text_config", "/~2", "/a~",
                                       "/~", "/x~1y/p~q"};
    for (size_t i = 0; i < N(ptrs); i++) {
        kw_config_model m;
        char err[KW_CONFIG_ERRLEN] = "";
        int rc = kw_config_load_buffer(&m, NAME, composite, strlen(composite),
                                       ptrs[i], err, sizeof err);
        cr_expect(rc < 0, "'%s' accepted", ptrs[i]);
        cr_expect(strstr(err, ptrs[i]) != NULL ||
                      strstr(err, "--text-config") != NULL,
                  "'%s' not named: %s", ptrs[i], err);
        kw_config_model_destroy(&m);
    }
}

/* ---- §1 step 3: settings only from the text config --------------------- */

Test(config, rejects_text_config_without_index_topk_even_when_root_has_one)
{
    const char *json = "{\"index_topk\": 2048, \"max_position_embeddings\": "
                       "1024, \"text_config\": {\"kv_lora_rank\": 512}}";
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(&m, NAME, json, strlen(json), NULL, err,
                                   sizeof err);
    cr_expect_eq(rc, KW_ECONFIG);
    cr_expect(strstr(err, NAME) != NULL, "%s", err);
    cr_expect(strstr(err, "no index_topk in text config at /text_config") !=
                  NULL, "%s", err);
    kw_config_model_destroy(&m);
    /* Flat: the root is the text config, reported as "/". */
    reject("{\"model_type\": \"llama\"}", "/");
}

Test(config, index_topk_null_means_absent)
{
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    const char *json = "{\"index_topk\": null}";
    int rc = kw_config_load_buffer(&m, NAME, json, strlen(json), NULL, err,
                                   sizeof err);
    cr_expect_eq(rc, KW_ECONFIG);
    cr_expect(strstr(err, "no index_topk") != NULL, "%s", err);
    kw_config_model_destroy(&m);
}

Test(config, root_settings_of_composite_config_are_ignored)
{
    kw_config_model m;
    load_ok(&m, "{\"index_topk\": 1, \"compress_ratios\": [4, 128], "
                "\"index_kpool\": 32, \"max_position_embeddings\": 7, "
                "\"kv_lora_rank\": 1, \"qk_rope_head_dim\": 1, "
                "\"vision_config\": {\"index_topk\": 3, \"index_kpool\": 8}, "
                "\"text_config\": {\"index_topk\": 2048, "
                "\"max_position_embeddings\": 163840, \"kv_lora_rank\": 512}}",
            NULL);
    cr_expect_str_eq(m.text_config, "/text_config");
    cr_expect_eq(m.index_topk, 2048);
    cr_expect_eq(m.ncompress_ratios, 0);
    cr_expect_not(m.has_index_kpool);
    cr_expect_eq(m.max_position_embeddings, 163840);
    cr_expect_eq(m.kv_lora_rank, 512);
    cr_expect_eq(m.qk_rope_head_dim, 0);
    kw_config_model_destroy(&m);
}

Test(config, fixture_composite_config_reads_its_text_config)
{
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, KW_FIXTURES "/composite-text-config.json",
                            NULL, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_str_eq(m.path, KW_FIXTURES "/composite-text-config.json");
    cr_expect_str_eq(m.text_config, "/text_config");
    cr_expect_eq(m.index_topk, 2048);
    kw_config_model_destroy(&m);
}

/* ---- §2: field validation ---------------------------------------------- */

Test(config, index_topk_accepts_integers_in_range)
{
    cr_expect_eq(accept_value("index_topk", "1", get_topk), 1);
    cr_expect_eq(accept_value("index_topk", "1048576", get_topk), 1048576);
    cr_expect_eq(accept_value("index_topk", "2048.0", get_topk), 2048);
    cr_expect_eq(accept_value("index_topk", "2.048e3", get_topk), 2048);
    cr_expect_eq(accept_value("index_topk", "20480E-1", get_topk), 2048);
}

Test(config, rejects_index_topk_out_of_range_or_not_an_integer)
{
    static const char *const vals[] = {
        "0",    "-5",   "1048577", "2048.5", "\"2048\"", "true",
        "false", "[]", "{}",      "1e400",  "-1e400",   "0.5",
    };
    reject_values("index_topk", vals, N(vals));
}

Test(config, compress_ratios_accepts_integers_and_empty)
{
    kw_config_model m;
    load_ok(&m, "{\"index_topk\": 8, \"compress_ratios\": [0, 65536, 4.0, 1]}",
            NULL);
    cr_assert_eq(m.ncompress_ratios, 4);
    cr_expect_eq(m.compress_ratios[0], 0);
    cr_expect_eq(m.compress_ratios[1], 65536);
    cr_expect_eq(m.compress_ratios[2], 4);
    cr_expect_eq(m.compress_ratios[3], 1);
    kw_config_model_destroy(&m);
    static const char *const empty[] = {
        "{\"index_topk\": 8, \"compress_ratios\": []}",
        "{\"index_topk\": 8, \"compress_ratios\": null}",
        "{\"index_topk\": 8}",
    };
    for (size_t i = 0; i < N(empty); i++) {
        if (accept(&m, empty[i]) != 0)
            continue;
        cr_expect_eq(m.ncompress_ratios, 0, "%s", empty[i]);
        kw_config_model_destroy(&m);
    }
}

Test(config, rejects_compress_ratios_that_is_not_an_array)
{
    static const char *const vals[] = {"4", "\"4,128\"", "{}", "true",
                                       "{\"0\": 4}"};
    reject_values("compress_ratios", vals, N(vals));
}

/* Builds {"index_topk": 8, "compress_ratios": [4, 4, ... n times]}. */
static char *ratios_json(size_t n)
{
    char *json = malloc(64 + 3 * n);
    cr_assert_not_null(json);
    size_t k = (size_t)sprintf(json, "{\"index_topk\": 8, "
                                     "\"compress_ratios\": [");
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(json + k, "%s4", i ? "," : "");
    strcpy(json + k, "]}");
    return json;
}

Test(config, compress_ratios_accepts_4096_entries)
{
    char *json = ratios_json(KW_CONFIG_MAX_RATIOS);
    kw_config_model m;
    if (accept(&m, json) == 0) {
        cr_expect_eq(m.ncompress_ratios, 4096);
        kw_config_model_destroy(&m);
    }
    free(json);
}

Test(config, rejects_compress_ratios_over_4096_entries)
{
    char *json = ratios_json(KW_CONFIG_MAX_RATIOS + 1);
    reject_len(json, strlen(json), NULL, "/compress_ratios", "4097 ratios");
    free(json);
}

Test(config, rejects_compress_ratio_element_out_of_range_or_not_integer)
{
    static const char *const vals[] = {"-1", "65537", "1.5", "\"4\"", "null",
                                       "true", "[]", "{}"};
    for (size_t i = 0; i < N(vals); i++) {
        char json[256];
        /* The bad element is the third, so the pointer ends in /2. */
        snprintf(json, sizeof json,
                 "{\"index_topk\": 8, \"compress_ratios\": [4, 128, %s, 4]}",
                 vals[i]);
        reject(json, "/compress_ratios/2");
        snprintf(json, sizeof json,
                 "{\"text_config\": {\"index_topk\": 8, "
                 "\"compress_ratios\": [%s]}}", vals[i]);
        reject(json, "/text_config/compress_ratios/0");
    }
}

Test(config, index_kpool_accepts_0_to_65536_and_null)
{
    cr_expect_eq(accept_value("index_kpool", "0", get_kpool), 0);
    cr_expect_eq(accept_value("index_kpool", "65536", get_kpool), 65536);
    cr_expect_eq(accept_value("index_kpool", "32.0", get_kpool), 32);
    cr_expect_eq(accept_value("index_kpool", "null", get_kpool), -1);
}

Test(config, rejects_index_kpool_out_of_range_or_not_integer)
{
    static const char *const vals[] = {"-1", "65537", "1.5", "\"4\"", "true",
                                       "[4]"};
    reject_values("index_kpool", vals, N(vals));
}

Test(config, max_position_embeddings_accepts_1_to_int_max_and_null)
{
    cr_expect_eq(accept_value("max_position_embeddings", "1", get_mpe), 1);
    cr_expect_eq(accept_value("max_position_embeddings", "2147483647",
                              get_mpe), 2147483647);
    cr_expect_eq(accept_value("max_position_embeddings", "163840.0",
                              get_mpe), 163840);
    cr_expect_eq(accept_value("max_position_embeddings", "null", get_mpe),
                 -1);
}

Test(config, rejects_max_position_embeddings_out_of_range_or_not_integer)
{
    static const char *const vals[] = {"0",     "-1",     "2147483648",
                                       "1.5",   "\"1\"", "false",
                                       "1e400", "[1]"};
    reject_values("max_position_embeddings", vals, N(vals));
}

Test(config, kv_lora_rank_and_qk_rope_head_dim_accept_0_to_65536)
{
    cr_expect_eq(accept_value("kv_lora_rank", "0", get_lora), 0);
    cr_expect_eq(accept_value("kv_lora_rank", "65536", get_lora), 65536);
    cr_expect_eq(accept_value("kv_lora_rank", "null", get_lora), 0);
    cr_expect_eq(accept_value("qk_rope_head_dim", "0", get_rope), 0);
    cr_expect_eq(accept_value("qk_rope_head_dim", "65536", get_rope), 65536);
    cr_expect_eq(accept_value("qk_rope_head_dim", "64.0", get_rope), 64);
    cr_expect_eq(accept_value("qk_rope_head_dim", "null", get_rope), 0);
}

Test(config, rejects_kv_lora_rank_and_qk_rope_head_dim_out_of_range)
{
    static const char *const vals[] = {"-1",   "65537", "0.5", "\"1\"",
                                       "false", "{}",    "-1e400"};
    reject_values("kv_lora_rank", vals, N(vals));
    reject_values("qk_rope_head_dim", vals, N(vals));
}

static int64_t get_heads(const kw_config_model *m)
{
    return m->has_index_n_heads ? m->index_n_heads : -1;
}

static int64_t get_hdim(const kw_config_model *m)
{
    return m->has_index_head_dim ? m->index_head_dim : -1;
}

/* Issue 15: the indexer_logits shape (§2). */
Test(config, index_n_heads_accepts_1_to_256_and_null)
{
    cr_expect_eq(accept_value("index_n_heads", "1", get_heads), 1);
    cr_expect_eq(accept_value("index_n_heads", "256", get_heads), 256);
    cr_expect_eq(accept_value("index_n_heads", "64.0", get_heads), 64);
    cr_expect_eq(accept_value("index_n_heads", "null", get_heads), -1);
}

Test(config, rejects_index_n_heads_out_of_range_or_not_integer)
{
    static const char *const vals[] = {"0", "-1", "257", "1.5", "\"64\"",
                                       "true"};
    reject_values("index_n_heads", vals, N(vals));
}

Test(config, index_head_dim_accepts_multiples_of_32_to_512_and_null)
{
    cr_expect_eq(accept_value("index_head_dim", "32", get_hdim), 32);
    cr_expect_eq(accept_value("index_head_dim", "128", get_hdim), 128);
    cr_expect_eq(accept_value("index_head_dim", "512.0", get_hdim), 512);
    cr_expect_eq(accept_value("index_head_dim", "null", get_hdim), -1);
}

Test(config, rejects_index_head_dim_not_a_multiple_of_32_or_out_of_range)
{
    static const char *const vals[] = {"0", "16", "100", "129", "544",
                                       "-32", "64.5", "\"128\"", "[128]"};
    reject_values("index_head_dim", vals, N(vals));
}

Test(config, fields_are_validated_in_nested_text_config_with_its_pointer)
{
    reject("{\"llm_config\": {\"index_topk\": 8, \"index_kpool\": -1}}",
           "/llm_config/index_kpool");
    reject("{\"thinker_config\": {\"text_config\": {\"index_topk\": 8, "
           "\"max_position_embeddings\": 0}}}",
           "/thinker_config/text_config/max_position_embeddings");
    /* Under an explicit pointer, the pointer is the prefix, escapes kept. */
    const char *json = "{\"x/y\": {\"index_topk\": 0}}";
    reject_len(json, strlen(json), "/x~1y", "/x~1y/index_topk", json);
}

/* ---- §2: element size --------------------------------------------------- */

/* Loads json and returns its element size, or -1 when it is rejected. */
static int element_size(const char *json)
{
    kw_config_model m;
    if (accept(&m, json) != 0)
        return -1;
    int e = m.element_size;
    kw_config_model_destroy(&m);
    return e;
}

Test(config, element_size_is_4_for_float32_else_2)
{
    cr_expect_eq(element_size("{\"index_topk\": 8}"), 2);
    cr_expect_eq(element_size("{\"index_topk\": 8, \"torch_dtype\": "
                              "\"float32\"}"), 4);
    cr_expect_eq(element_size("{\"index_topk\": 8, \"dtype\": \"float32\"}"),
                 4);
    static const char *const others[] = {"bfloat16", "float16", "float64",
                                          "Float32", "float32 ", ""};
    for (size_t i = 0; i < N(others); i++) {
        char json[128];
        snprintf(json, sizeof json,
                 "{\"index_topk\": 8, \"torch_dtype\": \"%s\"}", others[i]);
        cr_expect_eq(element_size(json), 2, "%s", json);
    }
}

Test(config, element_size_follows_vllm_dtype_order)
{
    /* {root torch_dtype, root dtype, text torch_dtype, text dtype}: the
     * first string decides; "-" leaves the member out, "null" is absent. */
    static const struct {
        const char *v[4];
        int want;
    } cases[] = {
        {{"float32", "bfloat16", "bfloat16", "bfloat16"}, 4},
        {{"bfloat16", "float32", "float32", "float32"}, 2},
        {{"-", "float32", "bfloat16", "bfloat16"}, 4},
        {{"-", "bfloat16", "float32", "float32"}, 2},
        {{"-", "-", "float32", "bfloat16"}, 4},
        {{"-", "-", "bfloat16", "float32"}, 2},
        {{"-", "-", "-", "float32"}, 4},
        {{"null", "float32", "bfloat16", "-"}, 4},
        {{"null", "null", "null", "float32"}, 4},
        {{"null", "null", "null", "null"}, 2},
    };
    static const char *const keys[4] = {"torch_dtype", "dtype", "torch_dtype",
                                        "dtype"};
    for (size_t c = 0; c < N(cases); c++) {
        char root[256] = "", text[256] = "", json[768];
        for (int i = 0; i < 4; i++) {
            const char *v = cases[c].v[i];
            if (strcmp(v, "-") == 0)
                continue;
            char *dst = i < 2 ? root : text;
            size_t k = strlen(dst);
            if (strcmp(v, "null") == 0)
                snprintf(dst + k, 256 - k, "\"%s\": null, ", keys[i]);
            else
                snprintf(dst + k, 256 - k, "\"%s\": \"%s\", ", keys[i], v);
        }
        snprintf(json, sizeof json,
                 "{%s\"text_config\": {%s\"index_topk\": 8}}", root, text);
        cr_expect_eq(element_size(json), cases[c].want, "%s", json);
    }
}

Test(config, rejects_non_string_dtype)
{
    reject("{\"index_topk\": 8, \"torch_dtype\": 4}", "/torch_dtype");
    reject("{\"index_topk\": 8, \"dtype\": true}", "/dtype");
    reject("{\"text_config\": {\"index_topk\": 8, \"torch_dtype\": {}}}",
           "/text_config/torch_dtype");
    reject("{\"text_config\": {\"index_topk\": 8, \"dtype\": [\"float32\"]}}",
           "/text_config/dtype");
}
