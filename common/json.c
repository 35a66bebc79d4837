/* json.c: the strict JSON reader (kw_json.h, whose top comment lists the
 * rules).  The lexical pass bounds what cJSON sees; the tree walk catches
 * what only a parsed tree shows (names equal once unescaped, a number whose
 * value overflowed). */
#include "kw_json.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"

/* Bytes of a JSON pointer in a message; a longer one is cut. */
#define POINTER_CAP 1024

void kw_json_verrf(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err == NULL || errlen == 0)
        return;
    vsnprintf(err, errlen, fmt, ap);
    for (char *p = err; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
}

static void errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kw_json_verrf(err, errlen, fmt, ap);
    va_end(ap);
}

size_t kw_json_utf8_len(const unsigned char *p, const unsigned char *end)
{
    if (p[0] < 0x80)
        return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (p[0] >= 0xC2 && p[0] <= 0xDF) {
        n = 2;
    } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        n = 3;
        lo = p[0] == 0xE0 ? 0xA0 : 0x80; /* overlong */
        hi = p[0] == 0xED ? 0x9F : 0xBF; /* surrogates */
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        n = 4;
        lo = p[0] == 0xF0 ? 0x90 : 0x80; /* overlong */
        hi = p[0] == 0xF4 ? 0x8F : 0xBF; /* above U+10FFFF */
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* Length of the rule-4 number at p, or 0 when the text there is not one.
 * A number must end at a delimiter, so "01" and "1.2.3" are refused rather
 * than split into two tokens. */
static size_t number_len(const unsigned char *p, const unsigned char *end)
{
    const unsigned char *q = p;
    if (q < end && *q == '-')
        q++;
    if (q >= end || !is_digit(*q))
        return 0;
    if (*q == '0')
        q++;
    else
        while (q < end && is_digit(*q))
            q++;
    if (q < end && *q == '.') {
        const unsigned char *d = ++q;
        while (q < end && is_digit(*q))
            q++;
        if (q == d)
            return 0;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        const unsigned char *d = q;
        while (q < end && is_digit(*q))
            q++;
        if (q == d)
            return 0;
    }
    if (q < end && (*q == '.' || is_digit(*q) || *q == 'e' || *q == 'E' ||
                    *q == '+' || *q == '-'))
        return 0;
    return (size_t)(q - p);
}

/* Rules 1 and 3: length of the string element at s[i], or 0 with *what. */
static size_t string_elem_len(const unsigned char *s, size_t i, size_t len,
                              const char **what)
{
    if (s[i] == 0) {
        *what = "NUL byte";
        return 0;
    }
    if (s[i] < 0x20) {
        *what = "raw control character in a string";
        return 0;
    }
    if (s[i] != '\\') {
        size_t n = kw_json_utf8_len(s + i, s + len);
        if (n == 0)
            *what = "invalid UTF-8";
        return n;
    }
    if (len - i >= 6 && memcmp(s + i, "\\u0000", 6) == 0) {
        *what = "\\u0000 in a string";
        return 0;
    }
    if (i + 1 == len)
        return 1; /* truncated: cJSON reports it */
    if (s[i + 1] > 0x20 && s[i + 1] < 0x7F)
        return 2;
    *what = "backslash before a control or non-ASCII byte";
    return 0;
}

/* Rules 2, 4 (grammar) and 5 outside strings: bytes consumed at s[i], or 0
 * with *what. */
static size_t token_len(const unsigned char *s, size_t i, size_t len,
                        unsigned *depth, unsigned max_depth, const char **what)
{
    unsigned char c = s[i];
    if (c == 0) {
        *what = "NUL byte";
        return 0;
    }
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        *what = "control byte between tokens";
        return 0;
    }
    if (c >= 0x7F) {
        *what = i == 0 && len >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0
                    ? "byte-order mark"
                    : "non-ASCII byte outside a string";
        return 0;
    }
    if (c == '[' || c == '{') {
        if (++*depth > max_depth) {
            *what = "nesting too deep";
            return 0;
        }
    } else if ((c == ']' || c == '}') && *depth > 0) {
        --*depth;
    } else if (c == '-' || is_digit(c)) {
        size_t n = number_len(s + i, s + len);
        if (n == 0)
            *what = "malformed number";
        return n;
    }
    return 1;
}

/* The lexical pass: the offset of the first refused byte with *what set,
 * or len when the text is clean. */
static size_t lex(const unsigned char *s, size_t len, unsigned max_depth,
                  const char **what)
{
    bool in_str = false;
    unsigned depth = 0;
    for (size_t i = 0; i < len;) {
        size_t n;
        if (in_str) {
            n = string_elem_len(s, i, len, what);
            if (n == 1 && s[i] == '"')
                in_str = false;
        } else if (s[i] == '"') {
            n = 1;
            in_str = true;
        } else {
            n = token_len(s, i, len, &depth, max_depth, what);
        }
        if (n == 0)
            return i;
        i += n;
    }
    return len;
}

/* Reports what at offset off of buf as line, column and byte. */
static void err_at(char *err, size_t errlen, const char *buf, size_t off,
                   const char *what, unsigned max_depth)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (buf[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    if (strcmp(what, "nesting too deep") == 0)
        errf(err, errlen, "line %zu column %zu (byte %zu): nesting deeper "
             "than %u levels", line, col, off, max_depth);
    else
        errf(err, errlen, "line %zu column %zu (byte %zu): %s", line, col,
             off, what);
}

int kw_json_check_text(const char *buf, size_t len, unsigned max_depth,
                       char *err, size_t errlen)
{
    const char *what = NULL;
    size_t bad = lex((const unsigned char *)buf, len, max_depth, &what);
    if (bad == len)
        return 0;
    err_at(err, errlen, buf, bad, what, max_depth);
    return KW_EJSON;
}

int kw_json_pointer_append(char *buf, size_t cap, const char *token)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap)
        return KW_ENOSPC;
    buf[n++] = '/';
    for (const char *p = token; *p != '\0'; p++) {
        const char *esc = *p == '~' ? "~0" : *p == '/' ? "~1" : NULL;
        size_t k = esc != NULL ? 2 : 1;
        if (n + k >= cap) {
            buf[n] = '\0';
            return KW_ENOSPC;
        }
        if (esc != NULL)
            memcpy(buf + n, esc, 2);
        else
            buf[n] = *p;
        n += k;
    }
    buf[n] = '\0';
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The name used twice among node's members (NULL when none): compared
 * pairwise when there are few, found by sorting when there are many, so
 * 10^4 members stay O(n log n); KW_ENOMEM through *rc. */
static const char *duplicate_name(const cJSON *node, int *rc)
{
    size_t n = 0;
    for (const cJSON *c = node->child; c != NULL; c = c->next)
        n++;
    if (n < 2)
        return NULL;
    if (n <= 16) { /* a reply or request header: no allocation */
        for (const cJSON *a = node->child; a != NULL; a = a->next)
            for (const cJSON *b = a->next; b != NULL; b = b->next)
                if (strcmp(a->string ? a->string : "",
                           b->string ? b->string : "") == 0)
                    return b->string ? b->string : "";
        return NULL;
    }
    const char **names = malloc(n * sizeof *names);
    if (names == NULL) {
        *rc = KW_ENOMEM;
        return NULL;
    }
    size_t i = 0;
    for (const cJSON *c = node->child; c != NULL; c = c->next)
        names[i++] = c->string != NULL ? c->string : "";
    qsort(names, n, sizeof *names, cmp_names);
    const char *dup = NULL;
    for (i = 1; i < n && dup == NULL; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            dup = names[i];
    free(names);
    return dup;
}

/* True when the C string s is valid UTF-8 throughout. */
static bool utf8_ok(const char *s)
{
    const unsigned char *u = (const unsigned char *)s, *end = u + strlen(s);
    while (u < end) {
        size_t k = kw_json_utf8_len(u, end);
        if (k == 0)
            return false;
        u += k;
    }
    return true;
}

/* Puts "/token" (escaped) in front of the pointer in ptr. */
static void pointer_prepend(char *ptr, const char *token)
{
    char head[POINTER_CAP] = "";
    kw_json_pointer_append(head, sizeof head, token);
    size_t h = strlen(head), t = strlen(ptr);
    if (h + t >= POINTER_CAP)
        t = POINTER_CAP - 1 - h;
    memmove(ptr + h, ptr, t);
    memcpy(ptr, head, h);
    ptr[h + t] = '\0';
}

/* What is wrong with node itself (not its children), or NULL; strings:
 * names and strings must be valid UTF-8 too. */
static const char *node_fault(const cJSON *node, unsigned depth,
                              unsigned max_depth, bool strings)
{
    if (cJSON_IsRaw(node) || cJSON_IsInvalid(node))
        return "raw or invalid item";
    if (cJSON_IsNumber(node) && !isfinite(node->valuedouble))
        return "number out of the range of a double";
    if ((cJSON_IsArray(node) || cJSON_IsObject(node)) && depth > max_depth)
        return "nesting too deep";
    if (strings && ((node->string && !utf8_ok(node->string)) ||
                    (cJSON_IsString(node) && !utf8_ok(node->valuestring))))
        return "string that is not valid UTF-8";
    return NULL;
}

/* Judges node (at depth) and everything under it.  Returns 0, or
 * KW_EJSON / KW_ENOMEM with *what set and ptr naming the value at fault
 * below node (built on the way back up: nothing is formatted when all is
 * well).  The depth check bounds the recursion. */
static int check_node(const cJSON *node, unsigned depth, unsigned max_depth,
                      bool strings, char *ptr, const char **what)
{
    if ((*what = node_fault(node, depth, max_depth, strings)) != NULL)
        return KW_EJSON;
    int rc = 0;
    const char *dup = cJSON_IsObject(node) ? duplicate_name(node, &rc) : NULL;
    if (rc != 0 || dup != NULL) {
        if (dup != NULL)
            kw_json_pointer_append(ptr, POINTER_CAP, dup);
        *what = rc != 0 ? "out of memory" : "duplicate member name";
        return rc != 0 ? rc : KW_EJSON;
    }
    size_t idx = 0;
    for (const cJSON *c = node->child; c != NULL; c = c->next, idx++) {
        if ((rc = check_node(c, depth + 1, max_depth, strings, ptr, what)) == 0)
            continue;
        char tok[32];
        snprintf(tok, sizeof tok, "%zu", idx);
        pointer_prepend(ptr, cJSON_IsObject(node) && c->string ? c->string : tok);
        return rc;
    }
    return 0;
}

static int check_tree(const cJSON *root, unsigned max_depth, bool strings,
                      char *err, size_t errlen)
{
    if (root == NULL) {
        errf(err, errlen, "/: no value");
        return KW_EJSON;
    }
    char ptr[POINTER_CAP] = "";
    const char *what = NULL;
    int rc = check_node(root, 1, max_depth, strings, ptr, &what);
    if (rc == KW_EJSON && strcmp(what, "nesting too deep") == 0)
        errf(err, errlen, "%s: nesting deeper than %u levels", ptr, max_depth);
    else if (rc == KW_EJSON)
        errf(err, errlen, "%s: %s", ptr[0] ? ptr : "/", what);
    return rc;
}

int kw_json_check_tree(const cJSON *root, unsigned max_depth, char *err,
                       size_t errlen)
{
    return check_tree(root, max_depth, false, err, errlen);
}

int kw_json_check_out(const cJSON *root, unsigned max_depth, char *err,
                      size_t errlen)
{
    return check_tree(root, max_depth, true, err, errlen);
}

int kw_json_parse(const char *buf, size_t len, unsigned max_depth,
                  cJSON **out, char *err, size_t errlen)
{
    int rc = kw_json_check_text(buf, len, max_depth, err, errlen);
    if (rc != 0)
        return rc;
    /* cJSON checks "nothing after the root" by finding a NUL inside the
     * length it is given; buf need not have one, so parse a copy. */
    char *text = malloc(len + 1);
    if (text == NULL)
        return KW_ENOMEM;
    memcpy(text, buf, len);
    text[len] = '\0';
    const char *stop = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &stop, 1);
    size_t off = stop != NULL && stop >= text ? (size_t)(stop - text) : 0;
    free(text);
    if (root == NULL) {
        /* cJSON returns NULL for running out of memory as for bad syntax;
         * the text passed the lexical pass, so syntax is the likelier. */
        off = off > len ? len : off;
        err_at(err, errlen, buf, off,
               off >= len ? "truncated JSON" : "malformed JSON", max_depth);
        return KW_EJSON;
    }
    rc = kw_json_check_tree(root, max_depth, err, errlen);
    if (rc != 0) {
        cJSON_Delete(root);
        return rc;
    }
    *out = root;
    return 0;
}
