/* parse.c: checked decimal parsing for flags and protocol fields. */
#include "kw_parse.h"

#include <errno.h>
#include <ctype.h>
#include <stddef.h>
#include <string.h>

#include "kw_err.h"

/* Accumulates the digits of s into *out, refusing anything but [0-9]+ and
 * any value above max.  Overflow is detected before it happens. */
static int parse_digits(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (s == NULL || *s == '\0')
        return KW_EINVAL;
    for (const char *p = s; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return KW_EINVAL;
        unsigned d = (unsigned)(*p - '0');
        if (v > (max - d) / 10)
            return -ERANGE;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int kw_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    return parse_digits(s, max, out);
}

int kw_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (s == NULL || min > max)
        return KW_EINVAL;
    int neg = s[0] == '-';
    uint64_t mag;
    /* The magnitude bound covers INT64_MIN, whose magnitude is max + 1. */
    int rc = parse_digits(s + neg, (uint64_t)INT64_MAX + (uint64_t)neg, &mag);
    if (rc == KW_EINVAL)
        return rc;
    if (rc < 0)
        return -ERANGE;
    int64_t v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    if (v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

int kw_parse_size(const char *s, uint64_t *out)
{
    static const char units[] = "KMGT";
    char digits[32];
    size_t n = s != NULL ? strlen(s) : 0;
    unsigned shift = 0;
    if (n == 0 || n >= sizeof digits)
        return KW_EINVAL;
    const char *u = strchr(units, toupper((unsigned char)s[n - 1]));
    if (u != NULL && *u != '\0') {
        shift = 10 * (unsigned)(u - units + 1);
        n--;
    }
    memcpy(digits, s, n);
    digits[n] = '\0';
    uint64_t v;
    int rc = parse_digits(digits, UINT64_MAX >> shift, &v);
    if (rc < 0)
        return rc;
    *out = v << shift;
    return 0;
}
