/* json.c: reading config and deployment files.
 *
 * The JSON itself is read by common/'s strict reader (kw_json.h), the one
 * the protocol uses too, so a file and a request header holding the same
 * text are judged by the same rules.  What is left here is config-specific:
 * the capped file read, integer fields and the message format.
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
#include "kw_json.h"

void kw__config_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kw_json_verrf(err, errlen, fmt, ap);
    va_end(ap);
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

/* How deep a config or deployment may nest, the root being 1.  Real
 * configs nest a few levels.  Both travel one level down in a kwarmd
 * request header, whose cap is KW_PROTO_MAX_DEPTH (32), so a file that
 * kwarm keys accepts is never refused by kwarm warmup for its depth. */
#define CONFIG_MAX_DEPTH 31u

int kw__config_parse(const char *name, const char *buf, size_t len,
                     cJSON **out, char *err, size_t errlen)
{
    char why[KW_JSON_ERRLEN] = "";
    int rc = kw_json_parse(buf, len, CONFIG_MAX_DEPTH, out, why, sizeof why);
    if (rc == 0 && !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        snprintf(why, sizeof why, "/: the root is not a JSON object");
        rc = KW_EJSON;
    }
    if (rc == KW_EJSON)
        kw__config_errf(err, errlen, "%s: %s", name, why);
    return rc;
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
    return kw_json_pointer_append(buf, cap, token);
}
