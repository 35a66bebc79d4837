/* kw_json.h: the one strict JSON reader (prefix kw_json_).
 *
 * Config files, deployment files and protocol headers are all read here,
 * under one set of rules, so no two readers in kwarm can disagree on what a
 * text means.  cJSON builds the tree; it is lenient where RFC 8259 is not
 * (leading zeros, "1.", raw control characters, any byte <= 0x20 skipped as
 * whitespace, a byte-order mark skipped, duplicate names kept, NaN printed
 * as null, strings cut at "\u0000"), so a lexical pass runs before it and a
 * walk of the tree after it.  A text is accepted only when:
 *
 *   1. it is valid UTF-8 (RFC 3629: no overlong forms, no surrogates,
 *      nothing above U+10FFFF) and holds no NUL byte;
 *   2. outside strings, every byte is JSON whitespace (space, tab, LF, CR)
 *      or ASCII punctuation, digits and letters of a token: no other control
 *      byte between tokens, no byte-order mark, no stray UTF-8;
 *   3. inside strings, no raw control character (< 0x20), no "\u0000"
 *      (cJSON strings end at a NUL, so "a\u0000b" would read as "a"), and a
 *      backslash only before printable ASCII (cJSON judges the escape);
 *   4. numbers follow the RFC grammar -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?
 *      [0-9]+)? and end at a delimiter, and their value fits a double:
 *      1e400 is refused (1e-400, which rounds to 0, is not);
 *   5. arrays and objects nest at most max_depth levels, the root being 1,
 *      checked before cJSON recurses;
 *   6. the grammar holds (cJSON) and nothing but whitespace follows the
 *      root (of any type: each caller says which it wants, and how it
 *      reports another);
 *   7. no object has two members of one name (compared after unescaping).
 *
 * Error messages are one line (control characters become '?') and name
 * where the fault is: "line L column C (byte B): what" for rules 1-6, or
 * the JSON pointer of the value at fault, "/a/0/b: what", for 4's range and
 * 7.  The caller prefixes the file or peer name.
 *
 * Pure code: no I/O, no globals of ours; reentrant on distinct buffers (the
 * cJSON error-pointer caveat of kw_proto.h applies).
 */
#ifndef KW_JSON_H
#define KW_JSON_H

#include <stdarg.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/* Room for one error line of kw_json_parse(). */
#define KW_JSON_ERRLEN 512

/* Parses len bytes of buf (no terminating NUL needed; nothing past len is
 * read) by the rules above.  Returns 0 with *out a new tree that the caller
 * frees with cJSON_Delete(); KW_EJSON with the reason in err (errlen bytes,
 * err may be NULL); KW_ENOMEM.  *out is untouched on error. */
int kw_json_parse(const char *buf, size_t len, unsigned max_depth,
                  cJSON **out, char *err, size_t errlen);

/* Rules 1-5 alone (the lexical pass) over len bytes of buf, e.g. over text
 * that cJSON printed.  Returns 0 or KW_EJSON with the reason in err. */
int kw_json_check_text(const char *buf, size_t len, unsigned max_depth,
                       char *err, size_t errlen);

/* The tree rules on a tree built in memory, before it is printed: nesting
 * within max_depth (checked as it descends, so any tree is safe), no
 * duplicate member names, only finite numbers, no cJSON_Raw or invalid
 * items (printed verbatim, nothing could vouch for them).  The root may be
 * of any type.  Returns 0, KW_EJSON with the pointer at fault in err, or
 * KW_ENOMEM. */
int kw_json_check_tree(const cJSON *root, unsigned max_depth, char *err,
                       size_t errlen);

/* The tree rules, and every member name and string valid UTF-8: the text
 * cJSON prints from a tree that passes obeys rules 1-5 (cJSON strings hold
 * no NUL, and its printer escapes what JSON requires), so an encoder need
 * not lex its own output again.  Returns as kw_json_check_tree(). */
int kw_json_check_out(const cJSON *root, unsigned max_depth, char *err,
                      size_t errlen);

/* Length of the valid UTF-8 sequence at p (rule 1) that ends by end, or 0
 * when there is none.  p < end. */
size_t kw_json_utf8_len(const unsigned char *p, const unsigned char *end);

/* Formats one error line into err (errlen bytes; err NULL or errlen 0:
 * nothing), each control character of the result made '?', so a message
 * quoting names or values from the input stays one line.  The formatter of
 * every kw_json message, shared with config messages. */
void kw_json_verrf(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Appends "/" and the JSON-pointer escape of token (~ as ~0, / as ~1) to
 * the NUL-terminated pointer in buf (cap bytes).  Returns 0, or KW_ENOSPC
 * with buf holding as much as fit. */
int kw_json_pointer_append(char *buf, size_t cap, const char *token);

#endif /* KW_JSON_H */
