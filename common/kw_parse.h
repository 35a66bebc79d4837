/* kw_parse.h: checked number parsing (memcached's safe_strtoul, stricter).
 *
 * Plain decimal only: an optional '-' (signed variant), then digits.  No
 * whitespace, '+', hex, octal prefix interpretation or trailing bytes, so a
 * flag such as "--dcp-world 0x2" or "8 " is rejected instead of guessed.
 */
#ifndef KW_PARSE_H
#define KW_PARSE_H

#include <stdint.h>

/* Parses s as a decimal integer in [min, max] into *out.
 * Returns 0, KW_EINVAL (not a plain decimal integer) or -ERANGE (outside
 * [min, max], overflow included).  *out is untouched on error. */
int kw_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);

/* Unsigned form of kw_parse_i64 with min 0 and the given max. */
int kw_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* Parses a size: plain decimal bytes, or digits followed by one of K, M,
 * G, T (powers of 1024, either case), e.g. "512M".  Returns 0, KW_EINVAL
 * or -ERANGE (over 2^64 - 1); *out untouched on error. */
int kw_parse_size(const char *s, uint64_t *out);

#endif /* KW_PARSE_H */
