/* json.c: strict reading of config and deployment files.
 *
 * cJSON parses leniently in a few ways the spec forbids: leading zeros,
 * "1." and raw control characters in strings are accepted, duplicate
 * member names are kept, and a NUL byte ends the text early.  One lexical
 * pass below rejects those before cJSON builds the tree, and a walk of the
 * tree rejects duplicate names, so the tree we read is the RFC 8259 one.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kw_config.h"
#include "kw_err.h"

void kw__config_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    /* One line, whatever names or values the input held. */
    for (char *p = err; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
}

/* Reads fd to its end into a growing buffer, refusing more than the cap. */
static int read_all(int fd, char **buf, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *p = malloc(cap + 1);
    if (p == NULL)
        return KW_ENOMEM;
    for (;;) {
        if (n == cap) {
            if (cap > KW_CONFIG_MAX_FILE) {
                free(p);
                return -EFBIG;
            }
            char *q = realloc(p, cap * 2 + 1);
            if (q == NULL) {
                free(p);
                return KW_ENOMEM;
            }
            p = q;
            cap *= 2;
        }
        ssize_t r = read(fd, p + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = -errno;
            free(p);
            return e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > KW_CONFIG_MAX_FILE) {
        free(p);
        return -EFBIG;
    }
    p[n] = '\0';
    *buf = p;
    *len = n;
    return 0;
}

int kw__config_read_file(const char *path, char **buf, size_t *len, char *err,
                         size_t errlen)
{
    int fd;
    do
        fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int e = -errno;
        kw__config_errf(err, errlen, "%s: %s", path, strerror(-e));
        return e;
    }
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : 0;
    if (rc == 0 && S_ISDIR(st.st_mode))
        rc = -EISDIR;
    if (rc == 0 && S_ISREG(st.st_mode) && st.st_size > KW_CONFIG_MAX_FILE)
        rc = -EFBIG;
    if (rc == 0)
        rc = read_all(fd, buf, len);
    close(fd);
    if (rc == -EFBIG)
        kw__config_errf(err, errlen, "%s: file is larger than %u bytes", path,
                        KW_CONFIG_MAX_FILE);
    else if (rc < 0)
        kw__config_errf(err, errlen, "%s: %s", path, kw_strerror(rc));
    return rc;
}

/* Length of the valid UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end)
{
    if (p[0] < 0x80)
        return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (p[0] >= 0xC2 && p[0] <= 0xDF)
        n = 2;
    else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        n = 3;
        lo = p[0] == 0xE0 ? 0xA0 : 0x80;
        hi = p[0] == 0xED ? 0x9F : 0xBF;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        n = 4;
        lo = p[0] == 0xF0 ? 0x90 : 0x80;
        hi = p[0] == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if ((size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* Length of the RFC 8259 number at p, or 0 when the text there is not one:
 * -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static size_t number_len(const char *p, const char *end)
{
    const char *q = p;
    if (q < end && *q == '-')
        q++;
    if (q >= end || *q < '0' || *q > '9')
        return 0;
    if (*q == '0')
        q++;
    else
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    if (q < end && *q == '.') {
        const char *d = ++q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == d)
            return 0;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        const char *d = q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == d)
            return 0;
    }
    /* A number runs up to a delimiter; "01" or "1.2.3" stop early. */
    if (q < end && (*q == '.' || (*q >= '0' && *q <= '9') || *q == 'e' ||
                    *q == 'E' || *q == '+' || *q == '-'))
        return 0;
    return (size_t)(q - p);
}

/* Reports the line and column of offset off in buf. */
static void err_at(char *err, size_t errlen, const char *name,
                   const char *buf, size_t off, const char *what)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (buf[i] == '\n') {
            line++;
            col = 1;
        } else
            col++;
    }
    kw__config_errf(err, errlen, "%s: line %zu column %zu: %s", name, line,
                    col, what);
}

/* The lexical pass described at the top of this file.  Returns the offset
 * of the first offending byte and sets *what, or returns len when clean. */
static size_t lex_check(const char *buf, size_t len, const char **what)
{
    const unsigned char *u = (const unsigned char *)buf, *end = u + len;
    int in_str = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_len(u + i, end);
        if (u[i] == 0 || n == 0) {
            *what = u[i] == 0 ? "NUL byte in JSON text" : "invalid UTF-8";
            return i;
        }
        if (in_str) {
            if (u[i] < 0x20) {
                *what = "control character in string";
                return i;
            }
            if (u[i] == '\\' && len - i >= 6 && memcmp(buf + i, "\\u0000", 6) == 0) {
                /* cJSON keeps strings NUL-terminated: "a\u0000b" would
                 * silently read as "a". */
                *what = "\\u0000 in a string is not supported";
                return i;
            }
            if (u[i] == '\\')
                n = i + 1 < len ? 2 : 1;
            else if (u[i] == '"')
                in_str = 0;
        } else if (u[i] == '"') {
            in_str = 1;
        } else if (u[i] == '-' || (u[i] >= '0' && u[i] <= '9')) {
            n = number_len(buf + i, buf + len);
            if (n == 0) {
                *what = "malformed number";
                return i;
            }
        }
        i += n;
    }
    return len;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Finds an object member name used twice anywhere under node, writing the
 * pointer of the second use into ptr.  Returns 1 when found, 0 when none,
 * KW_ENOMEM.  cJSON caps nesting at 1000 levels, which bounds the recursion. */
static int find_duplicate(const cJSON *node, char *ptr, size_t cap)
{
    size_t n = 0, base = strlen(ptr);
    for (const cJSON *c = node->child; c != NULL; c = c->next)
        n++;
    if (cJSON_IsObject(node) && n > 1) {
        const char **names = malloc(n * sizeof *names);
        if (names == NULL)
            return KW_ENOMEM;
        size_t i = 0;
        for (const cJSON *c = node->child; c != NULL; c = c->next)
            names[i++] = c->string;
        qsort(names, n, sizeof *names, cmp_names);
        const char *dup = NULL;
        for (i = 1; i < n && dup == NULL; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                dup = names[i];
        if (dup != NULL)
            kw__config_ptr_append(ptr, cap, dup);
        free(names);
        if (dup != NULL)
            return 1;
    }
    size_t idx = 0;
    for (const cJSON *c = node->child; c != NULL; c = c->next, idx++) {
        char tok[32];
        snprintf(tok, sizeof tok, "%zu", idx);
        kw__config_ptr_append(ptr, cap, cJSON_IsObject(node) ? c->string : tok);
        int rc = find_duplicate(c, ptr, cap);
        if (rc != 0)
            return rc;
        ptr[base] = '\0';
    }
    return 0;
}

int kw__config_parse(const char *name, const char *buf, size_t len,
                     cJSON **out, char *err, size_t errlen)
{
    const char *what = NULL;
    size_t bad = lex_check(buf, len, &what);
    if (bad < len) {
        err_at(err, errlen, name, buf, bad, what);
        return KW_EJSON;
    }
    /* cJSON wants a terminating NUL inside the length it is given when it
     * must check that nothing trails the root; buf need not have one. */
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
        if (off > len)
            off = len;
        err_at(err, errlen, name, buf, off,
               off >= len ? "truncated JSON" : "malformed JSON");
        return KW_EJSON;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        kw__config_errf(err, errlen, "%s: /: the root is not a JSON object",
                        name);
        return KW_EJSON;
    }
    char ptr[KW_CONFIG_MAX_POINTER] = "";
    int rc = find_duplicate(root, ptr, sizeof ptr);
    if (rc != 0) {
        cJSON_Delete(root);
        if (rc < 0)
            return rc;
        kw__config_errf(err, errlen, "%s: %s: duplicate member name", name,
                        ptr);
        return KW_EJSON;
    }
    *out = root;
    return 0;
}

/* Names a JSON value's type for messages. */
static const char *type_name(const cJSON *it)
{
    if (cJSON_IsString(it))
        return "a string";
    if (cJSON_IsBool(it))
        return "a boolean";
    if (cJSON_IsArray(it))
        return "an array";
    if (cJSON_IsObject(it))
        return "an object";
    return "null";
}

int kw__config_int(const cJSON *item, const char *name, const char *ptr,
                   int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t errlen)
{
    char got[64];
    if (!cJSON_IsNumber(item))
        snprintf(got, sizeof got, "got %s", type_name(item));
    else if (!isfinite(item->valuedouble) ||
             item->valuedouble != floor(item->valuedouble))
        snprintf(got, sizeof got, "got %.17g", item->valuedouble);
    else if (item->valuedouble < (double)lo || item->valuedouble > (double)hi)
        snprintf(got, sizeof got, "got %.0f", item->valuedouble);
    else {
        *out = (int64_t)item->valuedouble;
        return 0;
    }
    kw__config_errf(err, errlen, "%s: %s: must be an integer in [%lld, %lld], "
                    "%s", name, ptr, (long long)lo, (long long)hi, got);
    return KW_ECONFIG;
}

int kw__config_ptr_append(char *buf, size_t cap, const char *token)
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
