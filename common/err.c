/* err.c: messages and names for kw_err.h codes. */
#include "kw_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *kw_strerror(int err)
{
    switch (err) {
#define XX(name, code, msg) \
    case (code):            \
        return (msg);
        KW_ERR_MAP(XX)
#undef XX
    default:
        break;
    }
    if (err < 0 && err > -1000)
        return strerror(-err);
    return err == 0 ? "success" : "unknown error";
}

const char *kw_err_name(int err)
{
    switch (err) {
#define XX(name, code, msg) \
    case (code):            \
        return "KW_" #name;
        KW_ERR_MAP(XX)
#undef XX
    default:
        break;
    }
    if (err < 0 && err > -1000)
        return "ESYS"; /* an errno; kw_strerror() names it */
    return err == 0 ? "OK" : "EUNKNOWN";
}

int kw_err_fmt(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}
