/* opt.c: option tables (kw_opt.h): checks, messages, help, getopt_long. */
#include "kw_opt.h"

#include <string.h>

#include "kw_err.h"
#include "kw_parse.h"

/* Stores n into the unsigned field of size bytes at dst. */
static int store_uint(void *dst, size_t size, uint64_t n)
{
    if (size == sizeof(unsigned) && n <= UINT32_MAX) {
        unsigned u = (unsigned)n;
        memcpy(dst, &u, sizeof u);
        return 0;
    }
    if (size == sizeof(uint64_t)) {
        memcpy(dst, &n, sizeof n);
        return 0;
    }
    return KW_EINVAL;
}

int kw_opt_set(const kw_opt *o, void *opts, const char *v)
{
    char *dst = (char *)opts + o->off;
    uint64_t n = 0, scale = o->scale ? o->scale : 1;
    switch (o->type) {
    case KW_OPT_SWITCH:
        if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
            return KW_EINVAL;
        *(bool *)dst = v[0] == 't';
        return 0;
    case KW_OPT_UINT:
        if (kw_parse_u64(v, o->max, &n) < 0 || n < o->min)
            return KW_EINVAL;
        return store_uint(dst, o->size, n * scale);
    case KW_OPT_SIZE:
        if (kw_parse_size(v, &n) < 0 || n < o->min || (o->max && n > o->max))
            return KW_EINVAL;
        return store_uint(dst, o->size, n);
    case KW_OPT_STR:
        /* refused, never truncated */
        if (v[0] == '\0' || strlen(v) >= o->size)
            return KW_EINVAL;
        memcpy(dst, v, strlen(v) + 1);
        return 0;
    case KW_OPT_TEXT:
        if (o->size == sizeof(const char *))
            memcpy(dst, &v, sizeof v);
        return 0;
    case KW_OPT_FUNC:
        return o->set(opts, v);
    }
    return KW_EINVAL;
}

/* n as the shortest exact size: "64K", "16G", or bytes. */
static void size_text(uint64_t n, char *buf, size_t cap)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (u < 3 && n >= 1024 && n % 1024 == 0) {
        n /= 1024;
        u++;
    }
    snprintf(buf, cap, "%llu%.*s", (unsigned long long)n, u >= 0, u >= 0 ? units + u : "");
}

void kw_opt_describe(const kw_opt *o, char *buf, size_t cap)
{
    char lo[32], hi[32];
    switch (o->type) {
    case KW_OPT_SWITCH:
        snprintf(buf, cap, "true or false");
        return;
    case KW_OPT_UINT:
        snprintf(buf, cap, "%s in [%llu, %llu]", o->unit ? o->unit : "an integer",
                 (unsigned long long)o->min, (unsigned long long)o->max);
        return;
    case KW_OPT_SIZE:
        size_text(o->min, lo, sizeof lo);
        size_text(o->max, hi, sizeof hi);
        if (o->max)
            snprintf(buf, cap, "a size in [%s, %s] (bytes, or K/M/G)", lo, hi);
        else
            snprintf(buf, cap, "a size of at least %s (bytes, or K/M/G)", lo);
        return;
    case KW_OPT_STR:
        snprintf(buf, cap, "%s shorter than %zu bytes", o->what ? o->what : "text",
                 o->size);
        return;
    case KW_OPT_TEXT:
    case KW_OPT_FUNC:
        snprintf(buf, cap, "%s", o->what ? o->what : "a value");
        return;
    }
}

unsigned kw_opt_json_types(const kw_opt *o)
{
    switch (o->type) {
    case KW_OPT_SWITCH:
        return KW_OPT_JBOOL;
    case KW_OPT_UINT:
        return KW_OPT_JNUM;
    case KW_OPT_SIZE:
        return KW_OPT_JNUM | KW_OPT_JSTR; /* 1073741824 or "1G" */
    case KW_OPT_STR:
    case KW_OPT_TEXT:
        return KW_OPT_JSTR;
    case KW_OPT_FUNC:
        return o->json;
    }
    return 0;
}

const kw_opt *kw_opt_find(const kw_opt *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return &t[i];
    return NULL;
}

void kw_opt_help(FILE *out, const kw_opt *t, size_t n, int col)
{
    for (size_t i = 0; i < n; i++) {
        char left[96];
        int len = snprintf(left, sizeof left, "  %s%c%s--%s%s%s",
                           t[i].short_name ? "-" : "",
                           t[i].short_name ? t[i].short_name : ' ',
                           t[i].short_name ? ", " : "", t[i].name,
                           t[i].arg ? " " : "", t[i].arg ? t[i].arg : "");
        /* "  -o, --x" or "  --x": drop the blank of an absent short flag */
        if (!t[i].short_name)
            memmove(left + 2, left + 3, strlen(left + 3) + 1), len--;
        fprintf(out, "%s%*s", left, len < col ? col - len : 2, "");
        for (const char *h = t[i].help ? t[i].help : ""; *h != '\0';) {
            size_t l = strcspn(h, "\n");
            fprintf(out, "%.*s\n", (int)l, h);
            h += l;
            if (*h == '\n' && *++h != '\0')
                fprintf(out, "%*s", col, "");
        }
        if (t[i].help == NULL || t[i].help[0] == '\0')
            fputc('\n', out);
    }
}

/* ---- "did you mean" ---- */

/* Edit distance (insert, delete, substitute, swap two neighbours) between
 * a and b, capped at 9: only small ones matter. */
static size_t distance(const char *a, const char *b)
{
    enum { MAX = 40 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAX || m >= MAX)
        return 9;
    size_t d[MAX + 1][MAX + 1];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            size_t best = sub < del ? sub : del;
            best = ins < best ? ins : best;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m] < 9 ? d[n][m] : 9;
}

/* True when a distance this small makes `word` a likely typo of a
 * candidate of its length: 1 for short words, up to a third of it. */
static bool close_enough(size_t dist, const char *word)
{
    size_t n = strlen(word), allowed = n <= 4 ? 1 : n / 3;
    return dist > 0 && dist <= (allowed > 3 ? 3 : allowed);
}

const char *kw_opt_nearest(const char *word, const char *const *cands,
                           size_t n)
{
    const char *best = NULL;
    size_t best_d = 9;
    for (size_t i = 0; i < n; i++) {
        size_t d = distance(word, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    return best && close_enough(best_d, word) ? best : NULL;
}

int kw_opt_parser_init(kw_opt_parser *p, const kw_opt *t, size_t n, int argc,
                       char **argv)
{
    if (n > KW_OPT_MAX)
        return KW_EINVAL;
    memset(p, 0, sizeof *p);
    p->t = t;
    p->n = n;
    p->argc = argc;
    p->argv = argv;
    /* '-': positional arguments in order; ':': a missing value is ':' */
    size_t s = 0;
    p->shorts[s++] = '-';
    p->shorts[s++] = ':';
    for (size_t i = 0; i < n; i++) {
        bool value = t[i].type != KW_OPT_SWITCH;
        p->longs[i] = (struct option){t[i].name, value ? required_argument
                                                       : no_argument,
                                      NULL, 256 + (int)i};
        if (t[i].short_name) {
            p->shorts[s++] = t[i].short_name;
            if (value)
                p->shorts[s++] = ':';
        }
    }
    p->longs[n] = (struct option){0};
    optind = 0; /* glibc: start over, re-reading the option string */
    opterr = 0;
    return 0;
}

/* The row index of short flag c, or -1. */
static int short_row(const kw_opt_parser *p, int c)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->t[i].short_name && p->t[i].short_name == c)
            return (int)i;
    return -1;
}

/* Points p->bad at "-c". */
static const char *short_text(kw_opt_parser *p, int c)
{
    p->bad_buf[0] = '-';
    p->bad_buf[1] = (char)c;
    p->bad_buf[2] = '\0';
    return p->bad_buf;
}

int kw_opt_next(kw_opt_parser *p, const char **value)
{
    if (p->rest > 0) { /* after "--": positional arguments only */
        *value = p->rest < p->argc ? p->argv[p->rest++] : NULL;
        return *value ? KW_OPT_POSITIONAL : KW_OPT_END;
    }
    /* getopt_long takes an unambiguous prefix ("--jo" for --jobs): a
     * flag must be spelled out, so a long flag is looked up first. */
    const char *a = optind > 0 && optind < p->argc ? p->argv[optind] : NULL;
    if (optind == 0 && p->argc > 1)
        a = p->argv[1];
    bool is_long = a && a[0] == '-' && a[1] == '-' && a[2] != '\0';
    if (is_long) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(a + 2, "="), a + 2);
        if (kw_opt_find(p->t, p->n, name) == NULL) {
            p->bad = a;
            return KW_OPT_UNKNOWN;
        }
    }
    int idx = -1, c = getopt_long(p->argc, p->argv, p->shorts, p->longs, &idx);
    *value = optarg;
    if (c == -1) {
        p->rest = optind;
        return kw_opt_next(p, value);
    }
    if (c == 1)
        return KW_OPT_POSITIONAL;
    if (c >= 256)
        return c - 256;
    if (c == ':' || c == '?') {
        int row = optopt >= 256 ? optopt - 256 : short_row(p, optopt);
        p->bad = is_long ? a : short_text(p, optopt);
        if (c == ':')
            return KW_OPT_MISSING;
        return is_long && row >= 0 ? KW_OPT_NOVALUE : KW_OPT_UNKNOWN;
    }
    int row = short_row(p, c);
    return row >= 0 ? row : KW_OPT_UNKNOWN;
}
