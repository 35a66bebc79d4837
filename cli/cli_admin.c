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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_parse.h"

int kw__cli_parse(const char *cmd, int argc, char **argv,
                  const kw__cli_opt *opts, size_t nopts, const char **pos,
                  const char *usage)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return KW_CLI_OK;
        }
        size_t f = 0;
        while (f < nopts && !(opts[f].value != NULL
                                  ? kw__cli_is(argv[i], opts[f].flag)
                                  : strcmp(argv[i], opts[f].flag) == 0))
            f++;
        if (f < nopts && opts[f].value != NULL) {
            if ((*opts[f].value = kw__cli_value(cmd, argc, argv, &i)) == NULL)
                return KW_CLI_USAGE;
        } else if (f < nopts) {
            *opts[f].set = true;
        } else if (pos != NULL && *pos == NULL && argv[i][0] != '-') {
            *pos = argv[i];
        } else {
            kw__cli_err(cmd, "%s: unknown argument (see kwarm %s --help)",
                        argv[i], cmd);
            return KW_CLI_USAGE;
        }
    }
    return -1;
}

int kw__cli_no_socket(const char *cmd)
{
    kw__cli_err(cmd, "not yet supported through kwarmd; use --cache DIR");
    return KW_CLI_USAGE;
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

static const char pins_usage[] =
    "usage: kwarm pins --cache DIR [--json]\n"
    "\n"
    "Lists the named pin sets of the cache (kwarm prewarm --pin NAME and\n"
    "kwarm warmup --pin NAME record them): name, digests recorded, entries\n"
    "present, their bytes, and when the set was recorded.  Entries of a set\n"
    "are never evicted for size; kwarm unpin NAME releases them.\n"
    "\n"
    "  --cache DIR                the cache directory (works read-only)\n"
    "  --socket PATH              ask kwarmd (not yet supported)\n"
    "  --json                     {\"pins\": [{\"name\", \"digests\", \"entries\",\n"
    "                             \"bytes\", \"created\"}]}\n"
    "  -h, --help                 this text\n";

static int pin_to_json(const kw_cache_pin_info *p, void *arg)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !cJSON_AddItemToArray(arg, o))
        return KW_ENOMEM;
    cJSON_AddStringToObject(o, "name", p->name);
    cJSON_AddNumberToObject(o, "digests", (double)p->digests);
    cJSON_AddNumberToObject(o, "entries", (double)p->entries);
    cJSON_AddNumberToObject(o, "bytes", (double)p->bytes);
    cJSON_AddNumberToObject(o, "created", (double)p->created);
    return 0;
}

/* The pins document of cache c (what a kwarmd "pins" request returns). */
static int pins_doc(kw_cache *c, cJSON **out)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(doc, "pins");
    int rc = arr != NULL ? kw_cache_pins_foreach(c, pin_to_json, arr) : KW_ENOMEM;
    if (rc < 0)
        cJSON_Delete(doc);
    else
        *out = doc;
    return rc;
}

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
    const char *dir = NULL, *sock = NULL;
    bool json = false;
    const kw__cli_opt opts[] = {{"--cache", &dir, NULL},
                                {"--socket", &sock, NULL},
                                {"--json", NULL, &json}};
    int rc = kw__cli_parse("pins", argc, argv, opts, 3, NULL, pins_usage);
    if (rc >= 0)
        return rc;
    if (dir == NULL || sock != NULL)
        return kw__cli_no_socket("pins");
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    if ((rc = kw__cli_cache_open("pins", dir, KW_CLI_READ, &c)) != KW_CLI_OK)
        return rc;
    if ((rc = pins_doc(c, &doc)) < 0)
        kw__cli_err("pins", "%s: %s", dir, kw_strerror(rc));
    else
        kw__cli_print_pins(doc, json);
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc < 0 ? KW_CLI_RUNTIME : KW_CLI_OK;
}

/* ---- unpin --------------------------------------------------------------- */

static const char unpin_usage[] =
    "usage: kwarm unpin --cache DIR NAME [--json]\n"
    "\n"
    "Deletes the pin set NAME.  Its entries stay in the cache but may be\n"
    "evicted for size again (unless another set or a pin holds them).\n"
    "After a rollout: pin the new deployment, then unpin the old one.\n"
    "Exit 1 when there is no such set.\n"
    "\n"
    "  --cache DIR                the cache directory\n"
    "  --socket PATH              ask kwarmd (not yet supported)\n"
    "  --json                     {\"name\", \"digests\", \"entries\", \"bytes\"}:\n"
    "                             the set as it was\n"
    "  -h, --help                 this text\n";

typedef struct find_pin {
    const char *name;
    kw_cache_pin_info found;
    bool hit;
} find_pin;

static int match_pin(const kw_cache_pin_info *p, void *arg)
{
    find_pin *f = arg;
    if (strcmp(p->name, f->name) != 0)
        return 0;
    f->found = *p;
    f->hit = true;
    return 1;
}

/* Removes set name from c; *doc gets the set as it was. */
static int unpin_doc(kw_cache *c, const char *name, cJSON **doc)
{
    find_pin f = {.name = name};
    int rc = kw_cache_pins_foreach(c, match_pin, &f);
    if (rc >= 0 && !f.hit)
        rc = KW_ENOTFOUND;
    if (rc >= 0)
        rc = kw_cache_unpin_set(c, name);
    if (rc < 0)
        return rc;
    *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(*doc, "name", name);
    cJSON_AddNumberToObject(*doc, "digests", (double)f.found.digests);
    cJSON_AddNumberToObject(*doc, "entries", (double)f.found.entries);
    cJSON_AddNumberToObject(*doc, "bytes", (double)f.found.bytes);
    return 0;
}

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
    const char *dir = NULL, *sock = NULL, *name = NULL;
    bool json = false;
    const kw__cli_opt opts[] = {{"--cache", &dir, NULL},
                                {"--socket", &sock, NULL},
                                {"--json", NULL, &json}};
    int rc = kw__cli_parse("unpin", argc, argv, opts, 3, &name, unpin_usage);
    if (rc >= 0)
        return rc;
    if (name == NULL) {
        kw__cli_err("unpin", "NAME: required (see kwarm unpin --help)");
        return KW_CLI_USAGE;
    }
    if (dir == NULL || sock != NULL)
        return kw__cli_no_socket("unpin");
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    if ((rc = kw__cli_cache_open("unpin", dir, KW_CLI_WRITE, &c)) != KW_CLI_OK)
        return rc;
    rc = unpin_doc(c, name, &doc);
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

static const char resize_usage[] =
    "usage: kwarm resize --cache DIR SIZE [--json]\n"
    "\n"
    "Stores a new size limit in the cache: every later opener (prewarm,\n"
    "kwarmd, get) uses it.  A cache over the new limit is trimmed at once,\n"
    "least recently used first, never a pinned entry; exit 1, changing\n"
    "nothing, when the pinned entries alone exceed SIZE.\n"
    "\n"
    "  SIZE                       bytes, or with K/M/G/T (1024-based), at\n"
    "                             least 1M\n"
    "  --cache DIR                the cache directory\n"
    "  --socket PATH              ask kwarmd (not yet supported)\n"
    "  --json                     {\"max_size\", \"previous\", \"evicted\",\n"
    "                             \"entries\", \"bytes\"}\n"
    "  -h, --help                 this text\n";

/* Resizes c to size; *doc gets what changed. */
static int resize_doc(kw_cache *c, uint64_t size, cJSON **doc)
{
    kw_cache_stats before, after;
    int rc = kw_cache_stats_get(c, &before);
    if (rc == 0)
        rc = kw_cache_resize(c, size);
    if (rc == 0)
        rc = kw_cache_stats_get(c, &after);
    if (rc < 0)
        return rc;
    *doc = cJSON_CreateObject();
    cJSON_AddNumberToObject(*doc, "max_size", (double)after.max_size);
    cJSON_AddNumberToObject(*doc, "previous", (double)before.max_size);
    cJSON_AddNumberToObject(*doc, "evicted",
                            (double)(after.evictions - before.evictions));
    cJSON_AddNumberToObject(*doc, "entries", (double)after.entries);
    cJSON_AddNumberToObject(*doc, "bytes", (double)after.bytes);
    return 0;
}

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
    const char *dir = NULL, *sock = NULL, *text = NULL;
    bool json = false;
    const kw__cli_opt opts[] = {{"--cache", &dir, NULL},
                                {"--socket", &sock, NULL},
                                {"--json", NULL, &json}};
    int rc = kw__cli_parse("resize", argc, argv, opts, 3, &text, resize_usage);
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
    if (dir == NULL || sock != NULL)
        return kw__cli_no_socket("resize");
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    if ((rc = kw__cli_cache_open("resize", dir, KW_CLI_WRITE, &c)) != KW_CLI_OK)
        return rc;
    if ((rc = resize_doc(c, size, &doc)) < 0)
        kw__cli_err("resize", "%s: %s%s%s", dir, kw_strerror(rc),
                    kw_cache_last_error(c)[0] ? ": " : "",
                    kw_cache_last_error(c));
    else
        kw__cli_print_resize(doc, dir, json);
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc < 0 ? KW_CLI_RUNTIME : KW_CLI_OK;
}
