/* cli_admin.c: `kwarm pins`, `kwarm unpin` and `kwarm resize` on a cache
 * directory, and the option parser the cache-admin commands share.
 *
 * Each command builds the JSON document a kwarmd request of the same name
 * would reply with, then prints it (--json: as it is), so the --socket
 * forms only have to fetch that document.  Until kwarmd serves those
 * requests, --socket (or no --cache) is refused with exit 2.
 */
#include "cli.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_client.h"
#include "kw_err.h"
#include "kw_warm.h"
#include "kw_parse.h"

/* The flags pins, unpin and resize share: a cache directory, or kwarmd. */
typedef struct admin_opts {
    const char *cache, *socket;
    bool json;
} admin_opts;

#define ADMIN_ROWS(cache_help, json_help)                                    \
    KW__CLI_TEXT(admin_opts, cache, "cache", "DIR", cache_help),             \
    KW__CLI_TEXT(admin_opts, socket, "socket", "PATH",                       \
                 "ask kwarmd instead (its cache)"),                         \
    KW__CLI_SWITCH(admin_opts, json, "json", json_help)

/* Prints the failure rc of an admin request on c.  A read-only kwarmd's
 * refusal may come with no text after "kwarmd: " or after its last ": ";
 * the line then ends with the reason, never with a colon. */
static void daemon_failed(const char *cmd, const kw_client *c, int rc)
{
    char msg[KW_CLIENT_ERRLEN];
    snprintf(msg, sizeof msg, "%s", kw_client_last_error(c));
    size_t n = strlen(msg), full = n;
    while (n > 0 && (msg[n - 1] == ' ' || msg[n - 1] == ':'))
        msg[--n] = '\0';
    if (rc == KW_EROFS)
        kw__cli_err(cmd, "%s: kwarmd's cache is read-only (kwarmd "
                    "--read-only, or it cannot write the directory); ls, "
                    "pins and get work, evict, unpin and resize need a "
                    "writable cache", msg);
    else if (n < full) /* the reason was empty */
        kw__cli_err(cmd, "%s: %s", msg, kw_strerror(rc));
    else
        kw__cli_err(cmd, "%s", msg);
}

int kw__cli_via_daemon(const char *cmd, const char *sock, const char *request,
                       const cJSON *header, cJSON **doc)
{
    kw_client *c = NULL;
    char *hdr = cJSON_PrintUnformatted(header), *res = NULL;
    int rc = kw__cli_connect(cmd, sock, 30000, &c);
    if (rc != KW_CLI_OK) {
        free(hdr);
        return rc;
    }
    rc = hdr ? kw_client_admin(c, request, hdr, &res) : KW_ENOMEM;
    if (rc < 0)
        daemon_failed(cmd, c, rc);
    else if ((*doc = cJSON_Parse(res)) == NULL)
        rc = KW_ENOMEM;
    free(hdr);
    free(res);
    kw_client_close(c);
    /* the caller's error, as with --cache: a bad value, an ambiguous prefix */
    return rc == 0 ? KW_CLI_OK
           : rc == KW_EINVAL || rc == KW_EAMBIGUOUS ? KW_CLI_USAGE
                                                    : KW_CLI_RUNTIME;
}

void kw__cli_print_json(const cJSON *doc)
{
    char *text = cJSON_PrintUnformatted(doc);
    if (text != NULL)
        printf("%s\n", text);
    free(text);
}

void kw__cli_time(uint64_t t, char *buf, size_t cap)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (t == 0 || localtime_r(&tt, &tm) == NULL ||
        strftime(buf, cap, "%Y-%m-%d %H:%M", &tm) == 0)
        snprintf(buf, cap, "-");
}

void kw__cli_size(uint64_t n, char *buf, size_t cap)
{
    static const char units[] = "KMGT";
    double v = (double)n;
    int u = -1;
    while (v >= 1024 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, cap, "%" PRIu64 "B", n);
    else
        snprintf(buf, cap, "%.1f%c", v, units[u]);
}

/* Reads member name of obj as an unsigned count (0 when missing). */
uint64_t kw__cli_u64(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) && v->valuedouble > 0 ? (uint64_t)v->valuedouble : 0;
}

/* ---- pins ---------------------------------------------------------------- */

static const kw_opt pins_rows[] = {ADMIN_ROWS("the cache directory (works read-only)",
                                           "{\"pins\": [{\"name\", \"digests\", \"entries\",\n"
                                           "\"bytes\", \"created\"}]}")};

static const kw__cli_cmd pins_cmd = {
    .name = "pins",
    .usage =
        "usage: kwarm pins --cache DIR [--json]\n"
        "\n"
        "Lists the named pin sets of the cache (kwarm prewarm --pin NAME and\n"
        "kwarm warmup --pin NAME record them): name, digests recorded, entries\n"
        "present, their bytes, and when the set was recorded.  Entries of a set\n"
        "are never evicted for size; kwarm unpin NAME releases them.\n"
        "\n",
    KW__CLI_ROWS(pins_rows),
};

void kw__cli_print_pins(const cJSON *doc, bool json)
{
    if (json) {
        kw__cli_print_json(doc);
        return;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, "pins"), *p;
    if (cJSON_GetArraySize(arr) == 0) {
        printf("no pin sets\n");
        return;
    }
    printf("%-24s %8s %8s %8s  %s\n", "NAME", "DIGESTS", "ENTRIES", "BYTES",
           "CREATED");
    cJSON_ArrayForEach(p, arr) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(p, "name");
        char size[16], when[32];
        kw__cli_size(kw__cli_u64(p, "bytes"), size, sizeof size);
        kw__cli_time(kw__cli_u64(p, "created"), when, sizeof when);
        printf("%-24s %8" PRIu64 " %8" PRIu64 " %8s  %s\n",
               cJSON_IsString(name) ? name->valuestring : "?",
               kw__cli_u64(p, "digests"), kw__cli_u64(p, "entries"), size, when);
    }
}

int kw__cli_pins(int argc, char **argv)
{
    admin_opts o = {0};
    int rc = kw__cli_getopt(&pins_cmd, argc, argv, &o, NULL, NULL, 0);
    const char *dir = o.cache, *sock = o.socket;
    bool json = o.json;
    if (rc >= 0)
        return rc;
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    if (dir == NULL) { /* through kwarmd */
        cJSON *h = cJSON_CreateObject();
        rc = kw__cli_via_daemon("pins", sock, "pins", h, &doc);
        cJSON_Delete(h);
        if (rc == KW_CLI_OK)
            kw__cli_print_pins(doc, json);
        cJSON_Delete(doc);
        return rc;
    }
    if ((rc = kw__cli_cache_open("pins", dir, KW_CLI_READ, &c)) != KW_CLI_OK)
        return rc;
    if ((rc = kw_warm_pins(c, &doc)) < 0)
        kw__cli_err("pins", "%s: %s", dir, kw_strerror(rc));
    else
        kw__cli_print_pins(doc, json);
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc < 0 ? KW_CLI_RUNTIME : KW_CLI_OK;
}

/* ---- unpin --------------------------------------------------------------- */

static const kw_opt unpin_rows[] = {ADMIN_ROWS("the cache directory",
                                            "{\"name\", \"digests\", \"entries\", \"bytes\"}:\n"
                                            "the set as it was")};

static const kw__cli_cmd unpin_cmd = {
    .name = "unpin",
    .usage =
        "usage: kwarm unpin --cache DIR NAME [--json]\n"
        "\n"
        "Deletes the pin set NAME.  Its entries stay in the cache but may be\n"
        "evicted for size again (unless another set or a pin holds them).\n"
        "After a rollout: pin the new deployment, then unpin the old one.\n"
        "Exit 1 when there is no such set.\n"
        "\n",
    KW__CLI_ROWS(unpin_rows),
};

void kw__cli_print_unpin(const cJSON *doc, bool json)
{
    if (json) {
        kw__cli_print_json(doc);
        return;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
    printf("unpinned %s: %" PRIu64 " entries, %" PRIu64 " bytes no longer held "
           "by it\n", cJSON_IsString(name) ? name->valuestring : "?",
           kw__cli_u64(doc, "entries"), kw__cli_u64(doc, "bytes"));
}

int kw__cli_unpin(int argc, char **argv)
{
    admin_opts o = {0};
    const char *name = NULL;
    int rc = kw__cli_getopt(&unpin_cmd, argc, argv, &o, NULL, &name, 1);
    const char *dir = o.cache, *sock = o.socket;
    bool json = o.json;
    if (rc >= 0)
        return rc;
    if (name == NULL) {
        kw__cli_err("unpin", "NAME: required (see kwarm unpin --help)");
        return KW_CLI_USAGE;
    }
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    if (dir == NULL) { /* through kwarmd */
        cJSON *h = cJSON_CreateObject();
        cJSON_AddStringToObject(h, "name", name);
        rc = kw__cli_via_daemon("unpin", sock, "unpin", h, &doc);
        cJSON_Delete(h);
        if (rc == KW_CLI_OK)
            kw__cli_print_unpin(doc, json);
        cJSON_Delete(doc);
        return rc;
    }
    if ((rc = kw__cli_cache_open("unpin", dir, KW_CLI_WRITE, &c)) != KW_CLI_OK)
        return rc;
    rc = kw_warm_unpin(c, name, &doc);
    if (rc == KW_ENOTFOUND || rc == KW_EINVAL)
        kw__cli_err("unpin", "%.80s: no such pin set in %s (kwarm pins lists "
                    "them)", name, dir);
    else if (rc < 0)
        kw__cli_err("unpin", "%s: %s %s", dir, kw_strerror(rc),
                    kw_cache_last_error(c));
    else
        kw__cli_print_unpin(doc, json);
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc < 0 ? KW_CLI_RUNTIME : KW_CLI_OK;
}

/* ---- resize -------------------------------------------------------------- */

static const kw_opt resize_rows[] = {ADMIN_ROWS("the cache directory",
                                             "{\"max_size\", \"previous\", \"evicted\",\n"
                                             "\"entries\", \"bytes\"}")};

static const kw__cli_cmd resize_cmd = {
    .name = "resize",
    .usage =
        "usage: kwarm resize --cache DIR SIZE [--json]\n"
        "\n"
        "Stores a new size limit in the cache: every later opener (prewarm,\n"
        "kwarmd, get) uses it.  A cache over the new limit is trimmed at once,\n"
        "least recently used first, never a pinned entry; exit 1, changing\n"
        "nothing, when the pinned entries alone exceed SIZE.\n"
        "\n"
        "  SIZE                       bytes, or with K/M/G/T (1024-based), at\n"
        "                             least 1M\n",
    KW__CLI_ROWS(resize_rows),
};

void kw__cli_print_resize(const cJSON *doc, const char *where, bool json)
{
    if (json) {
        kw__cli_print_json(doc);
        return;
    }
    printf("%s: max_size %" PRIu64 " (was %" PRIu64 "); %" PRIu64 " entries "
           "evicted; now %" PRIu64 " entries, %" PRIu64 " bytes\n", where,
           kw__cli_u64(doc, "max_size"), kw__cli_u64(doc, "previous"),
           kw__cli_u64(doc, "evicted"), kw__cli_u64(doc, "entries"),
           kw__cli_u64(doc, "bytes"));
}

int kw__cli_resize(int argc, char **argv)
{
    admin_opts o = {0};
    const char *text = NULL;
    int rc = kw__cli_getopt(&resize_cmd, argc, argv, &o, NULL, &text, 1);
    const char *dir = o.cache, *sock = o.socket;
    bool json = o.json;
    if (rc >= 0)
        return rc;
    uint64_t size = 0;
    if (text == NULL || kw_parse_size(text, &size) < 0 ||
        size < KW_CACHE_MIN_SIZE || size > KW_CACHE_MAX_SIZE) {
        kw__cli_err("resize", "SIZE: %s%.32s%s (bytes or K/M/G/T, 1M to 16T)",
                    text ? "'" : "required", text ? text : "",
                    text ? "' is not a size" : "");
        return KW_CLI_USAGE;
    }
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    if (dir == NULL) { /* through kwarmd */
        cJSON *h = cJSON_CreateObject();
        cJSON_AddNumberToObject(h, "max_size", (double)size);
        rc = kw__cli_via_daemon("resize", sock, "resize", h, &doc);
        cJSON_Delete(h);
        if (rc == KW_CLI_OK)
            kw__cli_print_resize(doc, sock ? sock : "kwarmd", json);
        cJSON_Delete(doc);
        return rc;
    }
    if ((rc = kw__cli_cache_open("resize", dir, KW_CLI_WRITE, &c)) != KW_CLI_OK)
        return rc;
    if ((rc = kw_warm_resize(c, size, &doc)) < 0)
        kw__cli_err("resize", "%s: %s%s%s", dir, kw_strerror(rc),
                    kw_cache_last_error(c)[0] ? ": " : "",
                    kw_cache_last_error(c));
    else
        kw__cli_print_resize(doc, dir, json);
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc < 0 ? KW_CLI_RUNTIME : KW_CLI_OK;
}
