/* test_opt.c: common/kw_opt.h, the option tables both binaries parse
 * with (issue 24): each check on both sides of its bound, the wording of
 * bounds, and the getopt_long pass (order, "--", spelled-out flags). */
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>

#include "kw_err.h"
#include "kw_opt.h"

typedef struct o {
    unsigned n;
    uint64_t size, ms;
    char name[8];
    bool sw;
    const char *text;
} o;

#define F(field) .off = offsetof(o, field), .size = sizeof(((o *)0)->field)
static const kw_opt rows[] = {
    {.name = "n", .type = KW_OPT_UINT, .arg = "N", .min = 1, .max = 256, F(n)},
    {.name = "size", .type = KW_OPT_SIZE, .min = 64 << 10, .max = 1ull << 34,
     F(size)},
    {.name = "secs", .type = KW_OPT_UINT, .unit = "seconds", .min = 1,
     .max = 10, .scale = 1000, F(ms)},
    {.name = "name", .type = KW_OPT_STR, .what = "a name", F(name)},
    {.name = "sw", .short_name = 's', .type = KW_OPT_SWITCH, F(sw)},
    {.name = "text", .short_name = 't', .type = KW_OPT_TEXT, F(text)},
};
#define NROWS (sizeof rows / sizeof rows[0])

Test(opt, each_type_is_checked_on_both_sides_of_its_bounds)
{
    o v = {0};
    cr_expect_eq(kw_opt_set(&rows[0], &v, "1"), 0);
    cr_expect_eq(kw_opt_set(&rows[0], &v, "256"), 0);
    cr_expect_eq(v.n, 256);
    cr_expect_eq(kw_opt_set(&rows[0], &v, "0"), KW_EINVAL);
    cr_expect_eq(kw_opt_set(&rows[0], &v, "257"), KW_EINVAL);
    cr_expect_eq(kw_opt_set(&rows[0], &v, "0x10"), KW_EINVAL);
    cr_expect_eq(v.n, 256, "a refused value changed the field");
    cr_expect_eq(kw_opt_set(&rows[1], &v, "64K"), 0);
    cr_expect_eq(kw_opt_set(&rows[1], &v, "65535"), KW_EINVAL);
    cr_expect_eq(kw_opt_set(&rows[1], &v, "16G"), 0);
    cr_expect_eq(kw_opt_set(&rows[1], &v, "17179869185"), KW_EINVAL);
    cr_expect_eq(kw_opt_set(&rows[2], &v, "10"), 0);
    cr_expect_eq(v.ms, 10000, "seconds are stored scaled");
    cr_expect_eq(kw_opt_set(&rows[3], &v, "1234567"), 0);
    cr_expect_eq(kw_opt_set(&rows[3], &v, "12345678"), KW_EINVAL, "truncated");
    cr_expect_eq(kw_opt_set(&rows[3], &v, ""), KW_EINVAL);
    cr_expect_str_eq(v.name, "1234567");
    cr_expect_eq(kw_opt_set(&rows[4], &v, "true"), 0);
    cr_expect(v.sw);
    cr_expect_eq(kw_opt_set(&rows[4], &v, "yes"), KW_EINVAL);
}

Test(opt, bounds_are_worded_from_the_row)
{
    char buf[128];
    kw_opt_describe(&rows[0], buf, sizeof buf);
    cr_expect_str_eq(buf, "an integer in [1, 256]");
    kw_opt_describe(&rows[1], buf, sizeof buf);
    cr_expect_str_eq(buf, "a size in [64K, 16G] (bytes, or K/M/G)");
    kw_opt_describe(&rows[2], buf, sizeof buf);
    cr_expect_str_eq(buf, "seconds in [1, 10]");
    kw_opt row = rows[1];
    row.max = 0;
    kw_opt_describe(&row, buf, sizeof buf);
    cr_expect_str_eq(buf, "a size of at least 64K (bytes, or K/M/G)");
    kw_opt_describe(&rows[3], buf, sizeof buf);
    cr_expect_str_eq(buf, "a name shorter than 8 bytes");
}

/* Runs one pass; writes "i:VALUE" per row, "p:VALUE" per positional and
 * "e:BAD" for an error (which ends it) into out. */
static void pass(char **argv, int argc, char *out, size_t cap)
{
    kw_opt_parser p;
    cr_assert_eq(kw_opt_parser_init(&p, rows, NROWS, argc, argv), 0);
    out[0] = '\0';
    const char *v;
    for (int r; (r = kw_opt_next(&p, &v)) != KW_OPT_END;) {
        size_t n = strlen(out);
        if (r >= 0)
            snprintf(out + n, cap - n, "%s:%s ", rows[r].name, v ? v : "-");
        else if (r == KW_OPT_POSITIONAL)
            snprintf(out + n, cap - n, "p:%s ", v);
        else {
            snprintf(out + n, cap - n, "e%d:%s", r, p.bad);
            return;
        }
    }
}

#define PASS(out, ...)                                                        \
    do {                                                                      \
        char *av[] = {"cmd", __VA_ARGS__, NULL};                              \
        pass(av, (int)(sizeof av / sizeof *av) - 1, out, sizeof out);         \
    } while (0)

Test(opt, the_pass_keeps_order_and_wants_flags_spelled_out)
{
    char out[256];
    PASS(out, "a", "--n", "3", "-s", "--size=64K", "b", "-t", "x", "--", "--n");
    cr_expect_str_eq(out, "p:a n:3 sw:- size:64K p:b text:x p:--n ");
    PASS(out, "--si", "64K"); /* getopt alone would take it for --size */
    cr_expect_str_eq(out, "e-3:--si");
    PASS(out, "--n");
    cr_expect_str_eq(out, "e-4:--n");
    PASS(out, "--sw=1");
    cr_expect_str_eq(out, "e-5:--sw=1");
    PASS(out, "-x");
    cr_expect_str_eq(out, "e-3:-x");
    PASS(out, "-t");
    cr_expect_str_eq(out, "e-4:-t");
    /* a second parser starts over (getopt's state is global) */
    PASS(out, "--n", "5");
    cr_expect_str_eq(out, "n:5 ");
}

Test(opt, nearest_names_a_likely_typo_only)
{
    const char *c[] = {"--jobs", "--json", "--cache"};
    cr_expect_str_eq(kw_opt_nearest("--jbos", c, 3), "--jobs");
    cr_expect_str_eq(kw_opt_nearest("--cahce", c, 3), "--cache");
    cr_expect_null(kw_opt_nearest("--frobnicate", c, 3));
    cr_expect_null(kw_opt_nearest("--json", c, 3), "an exact name is no typo");
}
