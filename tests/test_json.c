/* test_json.c: strict JSON reading of config files (spec/warmup-keys.md
 * §1): one negative test per rule, and file-level failures; then the
 * shared reader (common/kw_json.h) on its own. */
#include "config_util.h"

#include <math.h>

#include "kw_json.h"
#include "kw_proto.h"

/* ---- §1: strict JSON, one test per rule --------------------------------- */

/* Rejects `{"index_topk": 8, "x": V}` for each V (no pointer required: the
 * text is at fault, not a field). */
static void reject_raw_values(const char *const *vals, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"index_topk\": 8, \"x\": %s}",
                 vals[i]);
        reject(json, NULL);
    }
}

static void accept_raw_values(const char *const *vals, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char json[256];
        kw_config_model m;
        snprintf(json, sizeof json, "{\"index_topk\": 8, \"x\": %s}",
                 vals[i]);
        if (accept(&m, json) == 0)
            kw_config_model_destroy(&m);
    }
}

Test(json, rejects_nan_and_infinity)
{
    static const char *const vals[] = {"NaN", "Infinity", "-Infinity", "nan",
                                       "inf", "-inf", "-NaN"};
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": NaN}", NULL);
    reject("{\"index_topk\": Infinity}", NULL);
}

Test(json, rejects_trailing_data_after_root)
{
    static const char *const tails[] = {" x", "{}", " 1", ",", "]", "}",
                                        "\"\"", " null", "\n{\"a\": 1}"};
    for (size_t i = 0; i < N(tails); i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"index_topk\": 8}%s", tails[i]);
        reject(json, NULL);
    }
    /* Whitespace after the root is not data. */
    kw_config_model m;
    load_ok(&m, "{\"index_topk\": 8}\n\t \r\n", NULL);
    kw_config_model_destroy(&m);
}

Test(json, rejects_duplicate_member_names)
{
    reject("{\"index_topk\": 8, \"index_topk\": 8}", "/index_topk");
    reject("{\"text_config\": {\"index_topk\": 8, \"index_topk\": 9}}",
           "/text_config/index_topk");
    reject("{\"index_topk\": 8, \"q\": {\"w\": {\"k\": 1, \"z\": 0, "
           "\"k\": 2}}}", "/q/w/k");
    reject("{\"index_topk\": 8, \"arr\": [1, {\"k\": 1, \"k\": 1}]}",
           "/arr/1/k");
    reject("{\"index_topk\": 8, \"a/b\": 1, \"a/b\": 2}", "/a~1b");
    /* Equal once the escapes are decoded. */
    reject("{\"index_topk\": 8, \"a\": 1, \"\\u0061\": 2}", "/a");
    /* Not duplicates: other objects, other case. */
    kw_config_model m;
    load_ok(&m, "{\"index_topk\": 8, \"a\": {\"k\": 1}, \"b\": {\"k\": 1}, "
                "\"K\": 1, \"k\": 1}", NULL);
    kw_config_model_destroy(&m);
}

Test(json, rejects_number_with_leading_zero)
{
    static const char *const vals[] = {"01", "-01", "00", "0123", "00.5",
                                       "-00"};
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": 02048}", NULL);
    static const char *const ok[] = {"0", "-0", "0.5", "-0.0", "0e1", "10"};
    accept_raw_values(ok, N(ok));
}

Test(json, rejects_number_without_fraction_digits)
{
    static const char *const vals[] = {"1.", "1.e5", "-1.", "0."};
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": 2048.}", NULL);
}

Test(json, rejects_number_without_integer_part)
{
    static const char *const vals[] = {".5", "-.5", "-", ".e1"};
    reject_raw_values(vals, N(vals));
}

Test(json, rejects_plus_sign)
{
    static const char *const vals[] = {"+1", "+0", "+1e5", "+.5"};
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": +2048}", NULL);
}

Test(json, rejects_exponent_without_digits)
{
    static const char *const vals[] = {"1e", "1e+", "1E-", "1e5.0"};
    reject_raw_values(vals, N(vals));
}

Test(json, rejects_json5_extensions)
{
    static const char *const vals[] = {
        "0x10", "'a'", "True", "NULL", "undefined", "1 // c", "1 /* c */",
        "[1,]", "{\"a\": 1,}", "{a: 1}", "1_000",
    };
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": 8,}", NULL);
}

Test(json, rejects_raw_control_character_in_string)
{
    static const char *const vals[] = {"\"a\x01z\"", "\"a\tz\"", "\"a\nz\"",
                                       "\"\x1f\"", "\"a\rz\""};
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": 8, \"a\x02\": 1}", NULL);
    /* Escaped control characters and DEL are fine. */
    static const char *const ok[] = {"\"a\\tz\"", "\"a\\nz\"",
                                     "\"\\u0001\"", "\"a\x7fz\""};
    accept_raw_values(ok, N(ok));
}

Test(json, rejects_invalid_utf8)
{
    static const char *const vals[] = {
        "\"\xff\"",                 /* never valid */
        "\"\x80\"",                 /* lone continuation byte */
        "\"\xc0\x80\"",             /* overlong NUL */
        "\"\xc1\xbf\"",             /* overlong */
        "\"\xe0\x80\xaf\"",         /* overlong '/' */
        "\"\xed\xa0\x80\"",         /* UTF-16 surrogate */
        "\"\xe2\x82\"",             /* truncated sequence */
        "\"\xf4\x90\x80\x80\"",     /* above U+10FFFF */
        "\"\xf5\x80\x80\x80\"",     /* above U+10FFFF */
    };
    reject_raw_values(vals, N(vals));
    reject("{\"index_topk\": 8, \"\xfe\": 1}", NULL);
    reject("{\"index_topk\": 8}\xa0", NULL);
    static const char *const ok[] = {"\"\xc3\xa9\"", "\"\xe2\x82\xac\"",
                                     "\"\xf0\x9f\x98\x80\"",
                                     "\"\xf4\x8f\xbf\xbf\""};
    accept_raw_values(ok, N(ok));
}

Test(json, rejects_nul_byte)
{
    static const char a[] = "{\"index_topk\": 8}\0";
    static const char b[] = "{\"index_topk\": 8, \"x\": \"a\0b\"}";
    static const char c[] = "\0{\"index_topk\": 8}";
    static const char d[] = "{\"index_topk\": 8,\0 \"x\": 1}";
    reject_len(a, sizeof a - 1, NULL, NULL, "NUL after the root");
    reject_len(b, sizeof b - 1, NULL, NULL, "NUL in a string");
    reject_len(c, sizeof c - 1, NULL, NULL, "NUL first");
    reject_len(d, sizeof d - 1, NULL, NULL, "NUL between members");
}

Test(json, rejects_truncated_text)
{
    static const char doc[] =
        "{\"text_config\": {\"index_topk\": 2048, \"compress_ratios\": "
        "[4, 128], \"s\": \"a\\u00e9\", \"t\": true, \"n\": null}}";
    kw_config_model m;
    load_ok(&m, doc, NULL);
    kw_config_model_destroy(&m);
    /* Every proper prefix, NUL-terminated at its own length. */
    char buf[sizeof doc];
    for (size_t len = 0; len + 1 < sizeof doc; len++) {
        memcpy(buf, doc, len);
        buf[len] = '\0';
        char what[32];
        snprintf(what, sizeof what, "prefix of %zu bytes", len);
        reject_len(buf, len, NULL, NULL, what);
    }
}

Test(json, rejects_empty_and_whitespace_only_text)
{
    reject_len("", 0, NULL, NULL, "empty");
    reject(" ", NULL);
    reject("\n\t\r  \n", NULL);
}

Test(json, rejects_root_that_is_not_an_object)
{
    static const char *const docs[] = {"[]", "[{\"index_topk\": 8}]", "2048",
                                       "\"x\"", "true", "null"};
    for (size_t i = 0; i < N(docs); i++)
        reject(docs[i], NULL);
}

/* Builds {"index_topk": 8, "x": OPEN*depth 1 CLOSE*depth}. */
static char *nested_json(size_t depth, const char *open, const char *close)
{
    size_t lo = strlen(open), lc = strlen(close);
    char *json = malloc(64 + depth * (lo + lc));
    cr_assert_not_null(json);
    size_t k = (size_t)sprintf(json, "{\"index_topk\": 8, \"x\": ");
    for (size_t i = 0; i < depth; i++, k += lo)
        memcpy(json + k, open, lo);
    json[k++] = '1';
    for (size_t i = 0; i < depth; i++, k += lc)
        memcpy(json + k, close, lc);
    strcpy(json + k, "}");
    return json;
}

Test(json, rejects_deep_nesting_cleanly)
{
    char *json = nested_json(2000, "[", "]");
    reject_len(json, strlen(json), NULL, NULL, "2000 arrays");
    free(json);
    json = nested_json(2000, "{\"a\": ", "}");
    reject_len(json, strlen(json), NULL, NULL, "2000 objects");
    free(json);
    /* 31 levels with the root, what a kwarmd request can carry one level
     * down, still load; 32 do not. */
    json = nested_json(15, "{\"a\": [", "]}");
    kw_config_model m;
    if (accept(&m, json) == 0)
        kw_config_model_destroy(&m);
    free(json);
    json = nested_json(31, "[", "]");
    reject_len(json, strlen(json), NULL, NULL, "32 levels");
    free(json);
}

/* Only space, tab, LF and CR separate tokens: cJSON alone would skip any
 * byte <= 0x20 as whitespace. */
Test(json, rejects_control_byte_between_tokens)
{
    static const char *const docs[] = {
        "{\"index_topk\":\x01 8}", "\x0b{\"index_topk\": 8}",
        "{\"index_topk\": 8}\x0c", "{\"index_topk\": 8,\x1f\"x\": 1}",
        "{\x7f\"index_topk\": 8}", "{\"index_topk\": 8}\x1b",
    };
    for (size_t i = 0; i < N(docs); i++)
        reject(docs[i], NULL);
}

Test(json, rejects_byte_order_mark)
{
    reject("\xef\xbb\xbf{\"index_topk\": 8}", NULL);
    reject("{\"index_topk\": 8}\xef\xbb\xbf", NULL);
    reject("{\xef\xbb\xbf\"index_topk\": 8}", NULL);
}

/* RFC grammar, but no double holds the value: refused as JSON, with the
 * pointer, not read as infinity by one reader and a range error by
 * another. */
Test(json, rejects_number_that_overflows_a_double)
{
    reject("{\"index_topk\": 8, \"x\": 1e400}", "/x");
    reject("{\"index_topk\": 8, \"x\": [1, -1e400]}", "/x/1");
    reject("{\"index_topk\": 8, \"max_position_embeddings\": 1e400}",
           "/max_position_embeddings");
    reject("{\"index_topk\": 8, \"x\": 2E+309}", "/x");
    static const char *const ok[] = {"1e-400", "1.7976931348623157e308",
                                     "-4.9e-324"};
    accept_raw_values(ok, N(ok));
}

Test(json, member_names_are_case_sensitive)
{
    reject("{\"Index_topk\": 8}", "/");
    reject("{\"INDEX_TOPK\": 8}", "/");
    kw_config_model m;
    load_ok(&m, "{\"index_topk\": 2, \"Text_Config\": {\"index_topk\": 1}, "
                "\"Max_Position_Embeddings\": \"junk\"}", NULL);
    cr_expect_str_eq(m.text_config, "/");
    cr_expect_eq(m.index_topk, 2);
    cr_expect_not(m.has_max_position_embeddings);
    kw_config_model_destroy(&m);
}

/* An escaped NUL is part of a member name (RFC 8259 §7): the member
 * "index_topk\u0000x" is not index_topk, and "text_config\u0000" is no
 * wrapper.  Either reading the name whole or refusing \u0000 in names (an
 * RFC 8259 §9 limit) satisfies this; taking the name up to the NUL does
 * not.  Found by this suite: names are cut at the NUL. */
Test(json, member_name_with_escaped_nul_is_not_the_setting)
{
    reject("{\"index_topk\\u0000x\": 2048}", NULL);
    const char *json = "{\"index_topk\": 8, \"text_config\\u0000\": "
                       "{\"index_topk\": 9}}";
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(&m, NAME, json, strlen(json), NULL, err,
                                   sizeof err);
    if (rc == 0) {
        cr_expect_str_eq(m.text_config, "/");
        cr_expect_eq(m.index_topk, 8);
    } else {
        cr_expect_eq(rc, KW_ECONFIG, "%s", err);
    }
    kw_config_model_destroy(&m);
}

/* The message is one line even when the member name at fault holds an
 * escaped newline.  Found by this suite. */
Test(json, error_message_stays_one_line_for_name_with_newline)
{
    reject("{\"index_topk\": 8, \"a\\nb\": 1, \"a\\nb\": 2}", NULL);
    reject("{\"index_topk\": 8, \"q\\n\": {\"k\": 1, \"k\": 2}}", NULL);
}

/* kw_config_load_buffer() reads len bytes of buf; what follows them is not
 * part of the text.  Found by this suite: the byte at buf[len] is read. */
Test(json, load_buffer_reads_only_len_bytes)
{
    static const char text[] = "{\"index_topk\": 8}garbage";
    size_t len = strlen("{\"index_topk\": 8}");
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(&m, NAME, text, len, NULL, err,
                                   sizeof err);
    cr_expect_eq(rc, 0, "rc %d: %s", rc, err);
    if (rc == 0)
        cr_expect_eq(m.index_topk, 8);
    kw_config_model_destroy(&m);
}

/* ---- files -------------------------------------------------------------- */

Test(json, load_reads_a_file_and_keeps_its_path, .init = tmp_setup,
     .fini = tmp_teardown)
{
    const char doc[] = "{\"llm_config\": {\"index_topk\": 256}}\n";
    const char *path = tmp_file("c.json", doc, strlen(doc));
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, path, NULL, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect_str_eq(m.path, path);
    cr_expect_str_eq(m.text_config, "/llm_config");
    cr_expect_eq(m.index_topk, 256);
    kw_config_model_destroy(&m);
}

Test(json, load_names_the_path_for_bad_content, .init = tmp_setup,
     .fini = tmp_teardown)
{
    const char doc[] = "{\"text_config\": {\"index_topk\": 0}}";
    const char *path = tmp_file("bad.json", doc, strlen(doc));
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, path, NULL, err, sizeof err);
    cr_expect_eq(rc, KW_ECONFIG);
    cr_expect(strstr(err, path) != NULL, "%s", err);
    cr_expect(kw_test_names_pointer(err, "/text_config/index_topk"), "%s", err);
    kw_config_model_destroy(&m);
}

Test(json, load_reports_missing_file, .init = tmp_setup,
     .fini = tmp_teardown)
{
    char path[256];
    snprintf(path, sizeof path, "%s/absent.json", tmpdir);
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, path, NULL, err, sizeof err);
    cr_expect_eq(rc, -ENOENT);
    cr_expect(strstr(err, path) != NULL, "%s", err);
    cr_expect_null(m.path);
    kw_config_model_destroy(&m);
}

Test(json, load_rejects_directory, .init = tmp_setup, .fini = tmp_teardown)
{
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, tmpdir, NULL, err, sizeof err);
    cr_expect_eq(rc, -EISDIR, "rc %d: %s", rc, err);
    cr_expect(strstr(err, tmpdir) != NULL, "%s", err);
    kw_config_model_destroy(&m);
}

/* A valid document padded with spaces to size bytes. */
static char *padded_doc(size_t size)
{
    const char head[] = "{\"index_topk\": 8}";
    char *buf = malloc(size);
    cr_assert_not_null(buf);
    memset(buf, ' ', size);
    memcpy(buf, head, strlen(head));
    return buf;
}

Test(json, load_rejects_file_over_16_mib, .init = tmp_setup,
     .fini = tmp_teardown)
{
    size_t size = (size_t)KW_CONFIG_MAX_FILE + 1;
    char *doc = padded_doc(size);
    const char *path = tmp_file("big.json", doc, size);
    free(doc);
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, path, NULL, err, sizeof err);
    cr_expect_eq(rc, -EFBIG, "rc %d: %s", rc, err);
    cr_expect(strstr(err, path) != NULL, "%s", err);
    kw_config_model_destroy(&m);
}

Test(json, load_accepts_file_of_exactly_16_mib, .init = tmp_setup,
     .fini = tmp_teardown)
{
    size_t size = KW_CONFIG_MAX_FILE;
    char *doc = padded_doc(size);
    const char *path = tmp_file("max.json", doc, size);
    free(doc);
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load(&m, path, NULL, err, sizeof err);
    cr_expect_eq(rc, 0, "rc %d: %s", rc, err);
    kw_config_model_destroy(&m);
}

Test(json, model_destroy_accepts_null_and_zeroed)
{
    kw_config_model m;
    memset(&m, 0, sizeof m);
    kw_config_model_destroy(NULL);
    kw_config_model_destroy(&m);
    kw_config_model_destroy(&m);
}

/* ---- §4 ratio lists (read off the model) -------------------------------- */

/* Loads json and compares ratios_p and ratios_s with the expected lists. */
static void expect_ratios(const char *json, const int64_t *p, size_t np,
                          const int64_t *s, size_t ns)
{
    kw_config_model m;
    int64_t out[KW_CONFIG_MAX_RATIOS + 1];
    load_ok(&m, json, NULL);
    size_t n = kw_config_ratios_p(&m, out);
    cr_expect_eq(n, np, "ratios_p count of %s", json);
    for (size_t i = 0; i < n && i < np; i++)
        cr_expect_eq(out[i], p[i], "ratios_p[%zu] of %s", i, json);
    n = kw_config_ratios_s(&m, out);
    cr_expect_eq(n, ns, "ratios_s count of %s", json);
    for (size_t i = 0; i < n && i < ns; i++)
        cr_expect_eq(out[i], s[i], "ratios_s[%zu] of %s", i, json);
    kw_config_model_destroy(&m);
}

Test(json, ratio_lists_follow_spec)
{
    /* §7's example: [0,0,4,128,0] and kpool 32. */
    expect_ratios("{\"index_topk\": 8, \"compress_ratios\": [0, 0, 4, 128, 0],"
                  " \"index_kpool\": 32}",
                  (int64_t[]){1, 4, 128, 32}, 4, (int64_t[]){4, 128, 32}, 3);
    expect_ratios("{\"index_topk\": 8}", (int64_t[]){1}, 1, NULL, 0);
    expect_ratios("{\"index_topk\": 8, \"index_kpool\": 0}", (int64_t[]){1}, 1,
                  NULL, 0);
    expect_ratios("{\"index_topk\": 8, \"index_kpool\": 32}",
                  (int64_t[]){1, 32}, 2, (int64_t[]){32}, 1);
    expect_ratios("{\"index_topk\": 8, \"compress_ratios\": [4, 4, 1], "
                  "\"index_kpool\": 4}",
                  (int64_t[]){4, 1}, 2, (int64_t[]){4}, 1);
}

/* ---- the shared reader (kw_json.h) -------------------------------------- */

/* kw_json_parse() of json with max_depth; the message goes to err. */
static int jparse(const char *json, size_t len, unsigned depth, char *err)
{
    cJSON *root = NULL;
    err[0] = '\0';
    int rc = kw_json_parse(json, len, depth, &root, err, KW_JSON_ERRLEN);
    cr_assert(rc == 0 || root == NULL, "tree set on error");
    cJSON_Delete(root);
    return rc;
}

Test(json_reader, messages_name_line_column_and_byte)
{
    char err[KW_JSON_ERRLEN];
    const char *bad = "{\"a\": 1,\n \x01\"b\": 2}";
    cr_assert_eq(jparse(bad, strlen(bad), 8, err), KW_EJSON);
    cr_expect_str_eq(err, "line 2 column 2 (byte 10): control byte between "
                          "tokens");
    cr_assert_eq(jparse("\xef\xbb\xbf{}", 5, 8, err), KW_EJSON);
    cr_expect_str_eq(err, "line 1 column 1 (byte 0): byte-order mark");
    cr_assert_eq(jparse("{\"a\": 01}", 9, 8, err), KW_EJSON);
    cr_expect_str_eq(err, "line 1 column 7 (byte 6): malformed number");
    cr_assert_eq(jparse("{\"a\": 1", 7, 8, err), KW_EJSON);
    cr_expect(strstr(err, "truncated JSON") != NULL, "%s", err);
    /* Any root type: the callers say which they want. */
    cr_expect_eq(jparse("[1, \"a\"]", 8, 8, err), 0, "%s", err);
    cr_expect_eq(jparse(" 2 ", 3, 8, err), 0, "%s", err);
}

Test(json_reader, messages_name_the_pointer_for_tree_faults)
{
    char err[KW_JSON_ERRLEN];
    const char *dup = "{\"a\": [{\"k~/\": 1, \"k~/\": 2}]}";
    cr_assert_eq(jparse(dup, strlen(dup), 8, err), KW_EJSON);
    cr_expect_str_eq(err, "/a/0/k~0~1: duplicate member name");
    const char *big = "{\"a\": {\"b\": 1e400}}";
    cr_assert_eq(jparse(big, strlen(big), 8, err), KW_EJSON);
    cr_expect_str_eq(err, "/a/b: number out of the range of a double");
    /* A name holding an escaped newline still gives one line. */
    const char *nl = "{\"a\\nb\": 1, \"a\\nb\": 2}";
    cr_assert_eq(jparse(nl, strlen(nl), 8, err), KW_EJSON);
    cr_expect(strchr(err, '\n') == NULL, "%s", err);
}

/* Builds OPEN*depth CLOSE*depth with "{}" innermost: depth + 1 levels. */
static char *nest_objects(unsigned depth)
{
    char *s = malloc(8 * (size_t)depth + 3);
    cr_assert_not_null(s);
    size_t k = 0;
    for (unsigned i = 0; i < depth; i++, k += 6)
        memcpy(s + k, "{\"a\": ", 6);
    memcpy(s + k, "{}", 2);
    k += 2;
    for (unsigned i = 0; i < depth; i++)
        s[k++] = '}';
    s[k] = '\0';
    return s;
}

Test(json_reader, depth_cap_is_a_parameter)
{
    char err[KW_JSON_ERRLEN];
    char *s = nest_objects(4); /* 5 levels */
    cr_expect_eq(jparse(s, strlen(s), 5, err), 0, "%s", err);
    cr_expect_eq(jparse(s, strlen(s), 4, err), KW_EJSON);
    cr_expect(strstr(err, "nesting deeper than 4 levels") != NULL, "%s", err);
    free(s);
    s = nest_objects(100000); /* far past cJSON's 1000, refused first */
    cr_expect_eq(jparse(s, strlen(s), 1000, err), KW_EJSON);
    free(s);
}

Test(json_reader, reads_only_len_bytes)
{
    char err[KW_JSON_ERRLEN];
    cr_expect_eq(jparse("{\"a\": 1}\x01garbage", 8, 4, err), 0, "%s", err);
    cr_expect_eq(jparse("{\"a\": 12", 7, 4, err), KW_EJSON);
}

Test(json_reader, check_tree_judges_trees_built_in_memory)
{
    char err[KW_JSON_ERRLEN];
    cJSON *o = cJSON_CreateObject();
    cr_assert_not_null(o);
    cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), 0);
    cJSON_AddNumberToObject(o, "n", HUGE_VAL);
    cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), KW_EJSON);
    cr_expect_str_eq(err, "/n: number out of the range of a double");
    cJSON_DeleteItemFromObject(o, "n");
    cJSON_AddNumberToObject(o, "n", 1);
    cJSON_AddNumberToObject(o, "n", 2);
    cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), KW_EJSON);
    cr_expect_str_eq(err, "/n: duplicate member name");
    cJSON_Delete(o);
    o = cJSON_CreateObject();
    cJSON_AddRawToObject(o, "r", "1");
    cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), KW_EJSON);
    cJSON_Delete(o);
    /* A deep tree is cut at the cap, not walked to its end. */
    cJSON *root = cJSON_CreateArray(), *cur = root;
    for (int i = 0; i < 100000; i++) {
        cJSON *next = cJSON_CreateArray();
        cJSON_AddItemToArray(cur, next);
        cur = next;
    }
    cr_expect_eq(kw_json_check_tree(root, 32, err, sizeof err), KW_EJSON);
    cr_expect(strstr(err, "nesting deeper than 32 levels") != NULL, "%s", err);
    /* cJSON_Delete recurses; unlink level by level to free it. */
    while (root != NULL) {
        cJSON *child = cJSON_DetachItemFromArray(root, 0);
        cJSON_Delete(root);
        root = child;
    }
}

Test(json_reader, check_tree_names_the_nested_value_at_fault)
{
    char err[KW_JSON_ERRLEN];
    cJSON *o = cJSON_Parse("{\"a\": [1, {\"b/c\": [0, 0, {}]}]}");
    cr_assert_not_null(o);
    cJSON *deep = cJSON_GetArrayItem(cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(o, "a"), 1), "b/c"), 2);
    cJSON_AddNumberToObject(deep, "x", NAN);
    cr_expect_eq(kw_json_check_tree(o, 8, err, sizeof err), KW_EJSON);
    cr_expect_str_eq(err, "/a/1/b~1c/2/x: number out of the range of a double");
    cJSON_Delete(o);
    /* Duplicates among few members (pairwise) and many (sorted). */
    for (int n = 2; n <= 40; n += 38) {
        o = cJSON_CreateObject();
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "m%d", i);
            cJSON_AddNumberToObject(o, name, i);
        }
        cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), 0, "%d: %s", n, err);
        cJSON_AddNumberToObject(o, "m1", 0);
        cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), KW_EJSON);
        cr_expect_str_eq(err, "/m1: duplicate member name");
        cJSON_Delete(o);
    }
}

Test(json_reader, check_out_refuses_strings_that_are_not_utf8)
{
    char err[KW_JSON_ERRLEN];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ok", "caf\xc3\xa9");
    cr_expect_eq(kw_json_check_out(o, 4, err, sizeof err), 0, "%s", err);
    cJSON *arr = cJSON_AddArrayToObject(o, "list");
    cJSON_AddItemToArray(arr, cJSON_CreateString("\xc3("));
    cr_expect_eq(kw_json_check_tree(o, 4, err, sizeof err), 0,
                 "check_tree looks at structure only");
    cr_expect_eq(kw_json_check_out(o, 4, err, sizeof err), KW_EJSON);
    cr_expect_str_eq(err, "/list/0: string that is not valid UTF-8");
    cJSON_Delete(o);
    o = cJSON_CreateObject();
    cJSON_AddTrueToObject(o, "\xed\xa0\x80"); /* a surrogate, in a name */
    cr_expect_eq(kw_json_check_out(o, 4, err, sizeof err), KW_EJSON);
    /* The encoder relies on it: such a header is refused, not sent. */
    uint8_t *f = NULL;
    size_t len = 0;
    cr_expect_eq(kw_proto_encode(KW_PROTO_RESULT, o, NULL, 0, &f, &len), KW_EINVAL);
    cr_expect_null(f);
    cJSON_Delete(o);
}

Test(json_reader, pointer_append_escapes_and_reports_overflow)
{
    char buf[16] = "";
    cr_expect_eq(kw_json_pointer_append(buf, sizeof buf, "a/b~c"), 0);
    cr_expect_str_eq(buf, "/a~1b~0c");
    cr_expect_eq(kw_json_pointer_append(buf, sizeof buf, "0123456789"),
                 KW_ENOSPC);
    cr_expect_lt(strlen(buf), sizeof buf);
}

Test(json_reader, utf8_len_follows_rfc_3629)
{
    const unsigned char *s = (const unsigned char *)"\xf0\x9f\x98\x80";
    cr_expect_eq(kw_json_utf8_len(s, s + 4), 4u);
    cr_expect_eq(kw_json_utf8_len(s, s + 3), 0u); /* cut by end */
    s = (const unsigned char *)"\xed\xa0\x80";      /* surrogate */
    cr_expect_eq(kw_json_utf8_len(s, s + 3), 0u);
    s = (const unsigned char *)"\xc0\x80"; /* overlong */
    cr_expect_eq(kw_json_utf8_len(s, s + 2), 0u);
}
