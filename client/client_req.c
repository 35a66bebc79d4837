/* client_req.c: libkwarm's requests (kw_client.h): ping, keys, warmup,
 * admin, misses, get, stats, evict and load, over the connection and
 * frame I/O of client.c (internal.h).
 */
#include "kw_client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_err.h"
#include "kw_json.h"
#include "kw_proto.h"

#include "internal.h"

/* ---- requests ---------------------------------------------------------- */

/* Parses the caller's JSON text (what: its name in messages) into *out by
 * the strict rules of kw_json.h, as kwarm keys and kwarmd read a config:
 * cJSON_Parse() would skip control bytes and read 1e400 as infinity, which
 * it then prints as null.  The object sits one level down in the request
 * header.  0, KW_EJSON, KW_EINVAL (not an object) or KW_ENOMEM. */
static int parse_object(kw_client *c, const char *what, const char *text,
                        cJSON **out)
{
    if (text == NULL)
        return kw__client_fail(c, KW_EINVAL, "%s: NULL", what);
    char why[KW_JSON_ERRLEN];
    int rc = kw_json_parse(text, strlen(text), KW_PROTO_MAX_DEPTH - 1, out,
                           why, sizeof why);
    if (rc == KW_EJSON)
        return kw__client_fail(c, rc, "%s: %s", what, why);
    if (rc < 0)
        return kw__client_fail(c, rc, "%s", kw_strerror(rc));
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return kw__client_fail(c, KW_EINVAL, "%s: not a JSON object", what);
    }
    return 0;
}

/* Prints the header of a RESULT into a new string for the caller. */
static int take_json(kw_client *c, const kw_msg *m, char **out)
{
    char *s = cJSON_PrintUnformatted(m->header);
    if (s == NULL)
        return kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    *out = s;
    return 0;
}

int kw_client_ping(kw_client *c, char *version, size_t cap)
{
    if (c == NULL)
        return KW_EINVAL;
    kw_msg m = {0};
    int rc = kw__client_request(c, KW_PROTO_PING, NULL, KW_PROTO_PONG, NULL, &m);
    if (rc < 0)
        return rc;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m.header, "version");
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    if (version != NULL && strlen(s) >= cap)
        rc = kw__client_fail(c, KW_ENOSPC, "ping: version '%.32s' over %zu bytes", s, cap);
    else if (version != NULL)
        memcpy(version, s, strlen(s) + 1);
    kw_msg_destroy(&m);
    return rc;
}

/* Builds the header of a keys or warmup request. */
static int model_header(kw_client *c, const char *config_json,
                        const char *deployment_json, const char *name,
                        cJSON **out)
{
    cJSON *cfg = NULL, *dep = NULL;
    int rc = parse_object(c, "config", config_json, &cfg);
    if (rc == 0 && deployment_json != NULL)
        rc = parse_object(c, "deployment", deployment_json, &dep);
    if (rc < 0) {
        cJSON_Delete(cfg);
        return rc;
    }
    /* An item belongs to h once added; what was not added is freed here. */
    cJSON *h = cJSON_CreateObject();
    bool ok = h != NULL && cJSON_AddItemToObject(h, "config", cfg);
    if (ok)
        cfg = NULL;
    ok = ok && (dep == NULL || cJSON_AddItemToObject(h, "deployment", dep));
    if (ok)
        dep = NULL;
    ok = ok && (name == NULL || cJSON_AddStringToObject(h, "name", name));
    cJSON_Delete(cfg);
    cJSON_Delete(dep);
    if (!ok) {
        cJSON_Delete(h);
        return kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    }
    *out = h;
    return 0;
}

/* Puts warmup results (which arrive as keys settle) back in key order by
 * their "index": each must be a distinct integer below their count.
 * 0, or -1 when one is not. */
static int sort_by_index(cJSON *items)
{
    int n = cJSON_GetArraySize(items);
    cJSON **slot = calloc((size_t)n + 1, sizeof *slot);
    if (slot == NULL)
        return -1;
    int rc = 0;
    while (rc == 0 && items->child != NULL) {
        cJSON *it = cJSON_DetachItemViaPointer(items, items->child);
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(it, "index");
        double v = cJSON_IsNumber(ix) ? ix->valuedouble : -1;
        if (v < 0 || v >= n || v != (double)(int)v || slot[(int)v] != NULL) {
            cJSON_Delete(it);
            rc = -1;
        } else {
            slot[(int)v] = it;
        }
    }
    for (int i = 0; i < n; i++)
        if (slot[i] != NULL)
            cJSON_AddItemToArray(items, slot[i]);
    free(slot);
    return rc;
}

/* Puts the streamed items back into the RESULT: keys as "keys" (after
 * checking "count"), warmup results as "manifest".  0 or a code. */
static int assemble(kw_client *c, uint16_t type, kw_msg *m, stream *st)
{
    if (type == KW_PROTO_KEYS) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(m->header, "count");
        if (!cJSON_IsNumber(n) ||
            n->valuedouble != (double)cJSON_GetArraySize(st->items))
            return kw__client_broken(c, KW_EPROTO, "keys: kwarmd streamed %d keys but "
                          "counted another number", cJSON_GetArraySize(st->items));
        cJSON_DeleteItemFromObjectCaseSensitive(m->header, "count");
    }
    if (type == KW_PROTO_WARMUP && sort_by_index(st->items) < 0)
        return kw__client_broken(c, KW_EPROTO, "warmup: kwarmd streamed results without "
                      "a valid \"index\"");
    if (!cJSON_AddItemToObject(m->header, type == KW_PROTO_KEYS ? "keys" : "manifest",
                               st->items))
        return kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    st->items = NULL;
    return 0;
}

/* keys and warmup: one request with a model header (plus "pin" when pin is
 * not NULL); the streamed items and the RESULT become one document. */
static int model_request(kw_client *c, uint16_t type, const char *config_json,
                         const char *deployment_json, const char *name,
                         const char *pin, stream *st, char **out)
{
    if (c == NULL || out == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "NULL reply pointer") : KW_EINVAL;
    cJSON *h = NULL;
    kw_msg m = {0};
    st->items = cJSON_CreateArray();
    int rc = st->items ? model_header(c, config_json, deployment_json, name, &h)
                       : kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0 && pin != NULL && cJSON_AddStringToObject(h, "pin", pin) == NULL)
        rc = kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0)
        rc = kw__client_request(c, type, h, KW_PROTO_RESULT, st, &m);
    cJSON_Delete(h);
    if (rc == 0)
        rc = assemble(c, type, &m, st);
    if (rc == 0)
        rc = take_json(c, &m, out);
    cJSON_Delete(st->items);
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_keys(kw_client *c, const char *config_json,
                   const char *deployment_json, const char *name,
                   char **reply_json)
{
    stream st = {"keys", NULL, NULL, NULL};
    return model_request(c, KW_PROTO_KEYS, config_json, deployment_json, name,
                         NULL, &st, reply_json);
}

int kw_client_warmup(kw_client *c, const char *config_json,
                     const char *deployment_json, const char *name,
                     kw_client_progress_fn cb, void *arg, char **result_json)
{
    stream st = {"results", NULL, cb, arg};
    return model_request(c, KW_PROTO_WARMUP, config_json, deployment_json,
                         name, NULL, &st, result_json);
}

int kw_client_warmup_pin(kw_client *c, const char *config_json,
                         const char *deployment_json, const char *name,
                         const char *pin, kw_client_progress_fn cb, void *arg,
                         char **result_json)
{
    stream st = {"results", NULL, cb, arg};
    if (pin == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "warmup: NULL pin name") : KW_EINVAL;
    return model_request(c, KW_PROTO_WARMUP, config_json, deployment_json,
                         name, pin, &st, result_json);
}

int kw_client_warmup_detached(kw_client *c, const char *config_json,
                              const char *deployment_json, const char *name,
                              const char *pin, char **accepted_json)
{
    if (c == NULL || accepted_json == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "NULL reply pointer") : KW_EINVAL;
    cJSON *h = NULL;
    kw_msg m = {0};
    int rc = model_header(c, config_json, deployment_json, name, &h);
    if (rc == 0 && ((pin != NULL && cJSON_AddStringToObject(h, "pin", pin) == NULL) ||
                    cJSON_AddBoolToObject(h, "detach", 1) == NULL))
        rc = kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    /* want PROGRESS: the first frame is the answer (or a RESULT) */
    if (rc == 0)
        rc = kw__client_request(c, KW_PROTO_WARMUP, h, KW_PROTO_PROGRESS, NULL, &m);
    cJSON_Delete(h);
    if (rc == 0)
        rc = take_json(c, &m, accepted_json);
    kw_msg_destroy(&m);
    if (rc == 0) /* the stream goes on: no later request could read its own */
        kw__client_broken(c, 0, "warmup: detached; the connection was closed "
                          "(kwarmd goes on warming)");
    return rc;
}

int kw_client_admin(kw_client *c, const char *what, const char *header_json,
                    char **reply_json)
{
    static const struct {
        const char *name;
        uint16_t type;
    } types[] = {{"ls", KW_PROTO_LS}, {"evict", KW_PROTO_EVICT},
                 {"pins", KW_PROTO_PINS}, {"unpin", KW_PROTO_UNPIN},
                 {"resize", KW_PROTO_RESIZE}};
    uint16_t type = 0;
    for (size_t i = 0; what != NULL && i < sizeof types / sizeof *types; i++)
        if (strcmp(what, types[i].name) == 0)
            type = types[i].type;
    if (c == NULL || reply_json == NULL || type == 0)
        return c ? kw__client_fail(c, KW_EINVAL, "admin: unknown request '%.16s'",
                        what ? what : "(null)") : KW_EINVAL;
    cJSON *h = NULL;
    int rc = parse_object(c, "admin request", header_json, &h);
    if (rc < 0) /* a NULL header_json included: KW_EINVAL */
        return rc;
    stream st = {"entries", cJSON_CreateArray(), NULL, NULL};
    kw_msg m = {0};
    if (rc == 0 && st.items == NULL)
        rc = kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0)
        rc = kw__client_request(c, type, h, KW_PROTO_RESULT, &st, &m);
    /* ls streams its entries, evict by criteria the removed ones. */
    const char *member = type == KW_PROTO_LS ? "entries" : "removed";
    bool streamed = type == KW_PROTO_LS ||
                    (type == KW_PROTO_EVICT &&
                     cJSON_GetObjectItemCaseSensitive(h, "match") != NULL);
    if (rc == 0 && streamed && !cJSON_AddItemToObject(m.header, member, st.items))
        rc = kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    else if (rc == 0 && streamed)
        st.items = NULL;
    if (rc == 0)
        rc = take_json(c, &m, reply_json);
    cJSON_Delete(h);
    cJSON_Delete(st.items);
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_misses(kw_client *c, uint64_t since_s, char **result_json)
{
    if (c == NULL || result_json == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "NULL reply pointer") : KW_EINVAL;
    stream st = {"misses", cJSON_CreateArray(), NULL, NULL};
    cJSON *h = cJSON_CreateObject();
    kw_msg m = {0};
    int rc = st.items && h && cJSON_AddNumberToObject(h, "since", (double)since_s)
                 ? 0 : kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0)
        rc = kw__client_request(c, KW_PROTO_MISSES, h, KW_PROTO_RESULT, &st, &m);
    cJSON_Delete(h);
    if (rc == 0 && !cJSON_AddItemToObject(m.header, "misses", st.items))
        rc = kw__client_fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    else if (rc == 0)
        st.items = NULL;
    if (rc == 0)
        rc = take_json(c, &m, result_json);
    cJSON_Delete(st.items);
    kw_msg_destroy(&m);
    return rc;
}

/* True when s is 64 hex digits. */
static bool is_digest(const char *s)
{
    return s != NULL && strlen(s) == 64 &&
           strspn(s, "0123456789abcdefABCDEF") == 64;
}

/* 64 hex digits, or a prefix of 8 or more that kwarmd resolves. */
static bool is_digest_or_prefix(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n >= 8 && n <= 64 && strspn(s, "0123456789abcdefABCDEF") == n;
}

/* Copies the string member name of h into dst (cap bytes); false when it
 * is missing, not a string or does not fit. */
static bool copy_member(const cJSON *h, const char *name, char *dst,
                        size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, name);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return false;
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return true;
}

/* Fills *out from a get's RESULT: the header's strings and a copy of the
 * payload, which must be a non-empty cubin of the declared "size". */
static int fill_kernel(kw_client *c, const kw_msg *m, kw_client_kernel *out)
{
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(m->header, "size");
    const cJSON *comp = cJSON_GetObjectItemCaseSensitive(m->header, "compiled");
    if (!copy_member(m->header, "entry", out->entry, sizeof out->entry) ||
        !copy_member(m->header, "family", out->family, sizeof out->family) ||
        !copy_member(m->header, "arch", out->arch, sizeof out->arch) ||
        !copy_member(m->header, "digest", out->digest, sizeof out->digest) ||
        !cJSON_IsNumber(size) || size->valuedouble != (double)m->payload_len ||
        m->payload_len == 0)
        return kw__client_broken(c, KW_EPROTO, "get: kwarmd's reply lacks entry, family, "
                      "arch, digest or a cubin of its \"size\"");
    out->cubin = malloc(m->payload_len);
    if (out->cubin == NULL)
        return kw__client_fail(c, KW_ENOMEM, "get: %s", kw_strerror(KW_ENOMEM));
    memcpy(out->cubin, m->payload, m->payload_len);
    out->len = m->payload_len;
    out->compiled = cJSON_IsTrue(comp);
    return 0;
}

/* Sends a get with header h and fills *out (zeroed on error). */
static int get_request(kw_client *c, const cJSON *h, kw_client_kernel *out)
{
    kw_msg m = {0};
    int rc = kw__client_request(c, KW_PROTO_GET, h, KW_PROTO_RESULT, NULL, &m);
    if (rc == 0)
        rc = fill_kernel(c, &m, out);
    kw_msg_destroy(&m);
    if (rc < 0)
        kw_client_kernel_destroy(out);
    return rc;
}

int kw_client_get(kw_client *c, const char *digest_hex, bool compile,
                  kw_client_kernel *out)
{
    if (c == NULL || out == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "get: NULL kernel") : KW_EINVAL;
    memset(out, 0, sizeof *out);
    if (!is_digest_or_prefix(digest_hex))
        return kw__client_fail(c, KW_EINVAL, "get: digest is not 64 hex digits nor a "
                    "prefix of at least 8");
    cJSON *h = cJSON_CreateObject();
    int rc = KW_ENOMEM;
    if (h != NULL && cJSON_AddStringToObject(h, "digest", digest_hex) &&
        cJSON_AddBoolToObject(h, "compile", compile))
        rc = get_request(c, h, out);
    else
        kw__client_fail(c, rc, "get: %s", kw_strerror(rc));
    cJSON_Delete(h);
    return rc;
}

/* Builds the header of a get by family, fields (taken) and arch; NULL on
 * OOM, with fields freed. */
static cJSON *key_header(const char *family, cJSON *fields, const char *arch,
                         bool compile)
{
    cJSON *h = cJSON_CreateObject();
    if (h == NULL || !cJSON_AddItemToObject(h, "fields", fields)) {
        cJSON_Delete(fields);
        cJSON_Delete(h);
        return NULL;
    }
    if (!cJSON_AddStringToObject(h, "family", family) ||
        !cJSON_AddStringToObject(h, "arch", arch) ||
        !cJSON_AddBoolToObject(h, "compile", compile)) {
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

int kw_client_get_key(kw_client *c, const char *family,
                      const char *fields_json, const char *arch, bool compile,
                      kw_client_kernel *out)
{
    return kw_client_get_key_as_miss(c, family, fields_json, arch, compile,
                                     NULL, out);
}

int kw_client_get_key_as_miss(kw_client *c, const char *family,
                              const char *fields_json, const char *arch,
                              bool compile, const char *miss,
                              kw_client_kernel *out)
{
    if (c == NULL || out == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "get: NULL kernel") : KW_EINVAL;
    memset(out, 0, sizeof *out);
    if (family == NULL || arch == NULL)
        return kw__client_fail(c, KW_EINVAL, "get: NULL family or arch");
    cJSON *fields = NULL;
    int rc = parse_object(c, "fields", fields_json, &fields);
    if (rc < 0)
        return rc;
    if (miss && strcmp(miss, "runtime") != 0 && strcmp(miss, "capture") != 0) {
        cJSON_Delete(fields);
        return kw__client_fail(c, KW_EINVAL, "get: miss must be \"runtime\" "
                               "or \"capture\", not \"%.32s\"", miss);
    }
    cJSON *h = key_header(family, fields, arch, compile);
    if (h != NULL && miss && !cJSON_AddStringToObject(h, "miss", miss)) {
        cJSON_Delete(h);
        h = NULL;
    }
    if (h == NULL)
        return kw__client_fail(c, KW_ENOMEM, "get: %s", kw_strerror(KW_ENOMEM));
    rc = get_request(c, h, out);
    cJSON_Delete(h);
    return rc;
}

void kw_client_kernel_destroy(kw_client_kernel *k)
{
    if (k == NULL)
        return;
    free(k->cubin);
    memset(k, 0, sizeof *k);
}

int kw_client_stats(kw_client *c, char **reply_json)
{
    if (c == NULL || reply_json == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "stats: NULL reply pointer") : KW_EINVAL;
    kw_msg m = {0};
    int rc = kw__client_request(c, KW_PROTO_STATS, NULL, KW_PROTO_RESULT, NULL, &m);
    if (rc == 0)
        rc = take_json(c, &m, reply_json);
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_evict(kw_client *c, const char *digest_hex, bool *evicted)
{
    if (c == NULL)
        return KW_EINVAL;
    if (!is_digest(digest_hex))
        return kw__client_fail(c, KW_EINVAL, "evict: digest is not 64 hex digits");
    cJSON *h = cJSON_CreateObject();
    if (h == NULL || cJSON_AddStringToObject(h, "digest", digest_hex) == NULL) {
        cJSON_Delete(h);
        return kw__client_fail(c, KW_ENOMEM, "evict: %s", kw_strerror(KW_ENOMEM));
    }
    kw_msg m = {0};
    int rc = kw__client_request(c, KW_PROTO_EVICT, h, KW_PROTO_RESULT, NULL, &m);
    cJSON_Delete(h);
    if (rc == 0 && evicted != NULL)
        *evicted = cJSON_IsTrue(
            cJSON_GetObjectItemCaseSensitive(m.header, "evicted"));
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_load(kw_client *c, kw_cuda *cuda, const char *digest_hex,
                   kw_cuda_fn **fn)
{
    if (c == NULL || cuda == NULL || fn == NULL)
        return c ? kw__client_fail(c, KW_EINVAL, "load: NULL cuda or fn") : KW_EINVAL;
    kw_client_kernel k = {0};
    int rc = kw_client_get(c, digest_hex, false, &k);
    if (rc < 0)
        return rc;
    rc = kw_cuda_load(cuda, k.cubin, k.len, k.entry, fn);
    if (rc < 0)
        kw__client_fail(c, rc, "load %.16s (%s): %s", k.digest, k.entry,
             rc == KW_ENOMEM ? kw_strerror(rc) : kw_cuda_last_error(cuda));
    kw_client_kernel_destroy(&k);
    return rc;
}
