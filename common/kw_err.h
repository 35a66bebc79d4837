/* kw_err.h: error codes and messages shared by every kwarm module.
 *
 * A fallible function returns int: 0 on success or a negative code.  OS
 * errors pass through as -errno; kwarm's own codes are <= -1000 (the range
 * LMDB uses for its own), defined once below with their messages.
 */
#ifndef KW_ERR_H
#define KW_ERR_H

#define KW_ERR_MAP(XX)                                                     \
    XX(EPROTO, -1001, "malformed request")                                 \
    XX(E2BIG, -1002, "request exceeds protocol limit")                     \
    XX(ENVRTC, -1003, "kernel compilation failed")                         \
    XX(ECUDA, -1004, "CUDA driver call failed")                            \
    XX(ENODRIVER, -1005, "no CUDA driver")                                 \
    XX(ECACHE, -1006, "cache failure")                                     \
    XX(ECORRUPT, -1007, "cache entry failed its integrity check")          \
    XX(ENOTFOUND, -1008, "not found")                                      \
    XX(EINVAL, -1009, "invalid argument")                                  \
    XX(ENOMEM, -1010, "out of memory")                                     \
    XX(EJSON, -1011, "malformed JSON")                                     \
    XX(ECONFIG, -1012, "invalid model config")                             \
    XX(EDEPLOY, -1013, "invalid deployment")                               \
    XX(ENOSPC, -1014, "buffer too small")                                  \
    XX(EMISMATCH, -1015, "kernel output differs from its reference")       \
    XX(ENOFAMILY, -1016, "unknown kernel family")                          \
    XX(EREMOTE, -1017, "remote cache (Redis) unavailable or failed")      \
    XX(EROFS, -1018, "not cached (read-only cache)")                       \
    XX(EAMBIGUOUS, -1019, "ambiguous digest prefix")                       \
    XX(EVERSION, -1020, "protocol version mismatch")                       \
    XX(EPINNED, -1021, "pinned entries not removed")                      \
    XX(ECAPTURE, -1022, "kernel not loaded while its stream captures a CUDA graph") \
    XX(EDISKFULL, -1023, "no space left on the cache's disk")

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
#define XX(name, code, msg) KW_##name = (code),
    KW_ERR_MAP(XX)
#undef XX
};

/* Returns a static message for err (a KW_* code or -errno); never NULL. */
const char *kw_strerror(int err);

/* Returns the code's symbolic name ("KW_ENVRTC", "ENOENT"); never NULL. */
const char *kw_err_name(int err);

/* Formats a message into err (errlen bytes; nothing when err is NULL or
 * errlen 0) and returns rc: `return kw_err_fmt(err, n, KW_EINVAL, ...)`
 * for the functions that report both a code and a message. */
int kw_err_fmt(char *err, size_t errlen, int rc, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* KW_ERR_H */
