/* cli_cache.c: `kwarm get` and `kwarm stats` on a cache directory. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_parse.h"

static const char get_usage[] =
    "usage: kwarm get (--digest HEX | --family F --fields k=v,... --arch sm_XX)\n"
    "                 --cache DIR -o FILE\n"
    "       kwarm get (...same key...) -o FILE [--socket PATH] [--no-compile]\n"
    "\n"
    "Writes one cached cubin to FILE (atomically) and prints its entry point.\n"
    "The key is its 64-hex-digit digest (as kwarm keys prints it), or the\n"
    "family, every field of it and the arch. With --cache the directory is\n"
    "read directly; otherwise kwarmd is asked (--socket, $KWARM_SOCKET, or\n"
    "the default socket), which compiles a missing key unless --no-compile.\n"
    "Exit 1 when it is not cached.\n"
    "\n"
    "  -h, --help                 this text\n";

static const char stats_usage[] =
    "usage: kwarm stats --cache DIR [--json]\n"
    "       kwarm stats [--socket PATH] [--json]   (ask kwarmd)\n"
    "\n"
    "Prints the cache's entries, bytes, size limit, hits, misses, compiles,\n"
    "compile failures, evictions and corrupt entries found.\n"
    "\n"
    "  --json                     one JSON object with those fields\n"
    "  -h, --help                 this text\n";

typedef struct get_opts {
    const char *digest, *family, *fields, *arch, *cache, *out;
} get_opts;

/* Sets field `name` of k from text v (an integer, or true/false for a
 * boolean field); seen marks fields already given. */
static int set_field(kw_keys_key *k, unsigned *seen, const char *name,
                     const char *v)
{
    for (size_t i = 0; i < kw_keys_nfields(k->family); i++) {
        if (strcmp(kw_keys_field_name(k->family, i), name) != 0)
            continue;
        if (*seen & (1u << i)) {
            kw__cli_err("get", "--fields: %s given twice", name);
            return -1;
        }
        *seen |= 1u << i;
        if (kw_keys_field_is_bool(k->family, i) &&
            (strcmp(v, "true") == 0 || strcmp(v, "false") == 0)) {
            k->fields[i] = v[0] == 't';
            return 0;
        }
        if (kw_parse_i64(v, INT64_MIN, INT64_MAX, &k->fields[i]) == 0)
            return 0;
        kw__cli_err("get", "--fields: %s: '%.32s' is not an integer%s", name,
                    v, kw_keys_field_is_bool(k->family, i) ? " or true/false" : "");
        return -1;
    }
    kw__cli_err("get", "--fields: %s is not a field of %s", name,
                kw_keys_family_name(k->family));
    return -1;
}

/* Builds the key of --family/--fields/--arch and its digest. */
static int key_from_flags(const get_opts *o, kw_keys_key *k)
{
    char buf[1024];
    unsigned seen = 0;
    memset(k, 0, sizeof *k);
    if (kw_keys_family_from_name(o->family, &k->family) < 0) {
        kw__cli_err("get", "--family: '%.48s' is not a kernel family", o->family);
        return -1;
    }
    if (snprintf(buf, sizeof buf, "%s", o->fields) >= (int)sizeof buf ||
        snprintf(k->arch, sizeof k->arch, "%s", o->arch) >= (int)sizeof k->arch) {
        kw__cli_err("get", "--fields or --arch: too long");
        return -1;
    }
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv != NULL;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL) {
            kw__cli_err("get", "--fields: '%.48s' is not name=value", kv);
            return -1;
        }
        *eq = '\0';
        if (set_field(k, &seen, kv, eq + 1) < 0)
            return -1;
    }
    size_t nf = kw_keys_nfields(k->family);
    for (size_t i = 0; i < nf; i++)
        if (!(seen & (1u << i))) {
            kw__cli_err("get", "--fields: %s missing (a %s key has %zu fields)",
                        kw_keys_field_name(k->family, i),
                        kw_keys_family_name(k->family), nf);
            return -1;
        }
    return kw_keys_digest(k, k->digest) < 0 ? -1 : 0;
}


/* Opens an existing cache directory for cmd; prints the error and
 * returns an exit code on failure. */
static int open_existing(const char *cmd, const char *dir, bool read_only,
                         kw_cache **c)
{
    kw_cache_opts co = {.dir = dir, .read_only = read_only};
    char err[512];
    if (access(dir, F_OK) < 0) {
        kw__cli_err(cmd, "--cache: %s: %s", dir, strerror(errno));
        return KW_CLI_USAGE;
    }
    if (kw_cache_open(c, &co, err, sizeof err) < 0) {
        kw__cli_err(cmd, "--cache: %s", err);
        return KW_CLI_RUNTIME;
    }
    return KW_CLI_OK;
}

/* Parses get's flags into o; returns -1 to go on, else an exit code. */
static int get_parse(get_opts *o, int argc, char **argv)
{
    struct {
        const char *flag;
        const char **slot;
    } flags[] = {{"--digest", &o->digest}, {"--family", &o->family},
                 {"--fields", &o->fields}, {"--arch", &o->arch},
                 {"--cache", &o->cache},   {"-o", &o->out}};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(get_usage, stdout);
            return KW_CLI_OK;
        }
        size_t f = 0;
        while (f < sizeof flags / sizeof *flags && !kw__cli_is(argv[i], flags[f].flag))
            f++;
        if (f == sizeof flags / sizeof *flags) {
            kw__cli_err("get", "%s: unknown argument (see kwarm get --help)", argv[i]);
            return KW_CLI_USAGE;
        }
        if ((*flags[f].slot = kw__cli_value("get", argc, argv, &i)) == NULL)
            return KW_CLI_USAGE;
    }
    bool by_key = o->family || o->fields || o->arch;
    const char *missing = o->cache == NULL ? "--cache" : o->out == NULL ? "-o"
                          : (o->digest != NULL) == by_key ? "--digest or --family/--fields/--arch"
                          : by_key && !(o->family && o->fields && o->arch) ? "--family, --fields and --arch"
                          : NULL;
    if (missing != NULL) {
        kw__cli_err("get", "%s: required (see kwarm get --help)", missing);
        return KW_CLI_USAGE;
    }
    return kw__cli_output_check("get", o->out);
}

/* Fetches digest from the cache into o->out. */
static int get_fetch(const get_opts *o, const uint8_t *digest)
{
    kw_cache *c = NULL;
    kw_cache_info info;
    void *blob = NULL;
    size_t len = 0;
    char hex[KW_KEYS_HEX_LEN];
    kw_keys_hex(digest, hex);
    int rc = open_existing("get", o->cache, false, &c);
    if (rc != KW_CLI_OK)
        return rc;
    rc = kw_cache_get(c, digest, &blob, &len, &info);
    if (rc == 0)
        rc = kw__cli_put_cubin("get", o->out, blob, len, info.family,
                               info.arch, info.entry);
    else {
        kw__cli_err("get", "%s: %s in %s", hex, rc == KW_ENOTFOUND ?
                    "not cached" : kw_strerror(rc), o->cache);
        rc = KW_CLI_RUNTIME;
    }
    free(blob);
    kw_cache_close(c);
    return rc;
}

/* True when argv names a cache directory: the command then works on it
 * directly, else it asks kwarmd over the socket. */
static bool has_cache_flag(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (kw__cli_is(argv[i], "--cache"))
            return true;
    return false;
}

int kw__cli_get(int argc, char **argv)
{
    get_opts o = {0};
    if (!has_cache_flag(argc, argv) && !(argc == 2 && (strcmp(argv[1], "-h") == 0 ||
                                                        strcmp(argv[1], "--help") == 0)))
        return kw__cli_get_socket(argc, argv);
    kw_keys_key k;
    int rc = get_parse(&o, argc, argv);
    if (rc >= 0)
        return rc;
    if (o.digest != NULL) {
        size_t n = 0;
        if (strlen(o.digest) != 2 * KW_KEYS_DIGEST_LEN ||
            sodium_hex2bin(k.digest, sizeof k.digest, o.digest,
                           strlen(o.digest), NULL, &n, NULL) != 0 ||
            n != KW_KEYS_DIGEST_LEN) {
            kw__cli_err("get", "--digest: not 64 hex digits");
            return KW_CLI_USAGE;
        }
    } else if (key_from_flags(&o, &k) < 0)
        return KW_CLI_USAGE;
    return get_fetch(&o, k.digest);
}

void kw__cli_print_stats(const kw_cache_stats *st, const char *dir, bool json)
{
    const char *names[] = {"entries", "bytes", "max_size", "hits", "misses",
                           "compiles", "compile_failures", "evictions",
                           "corrupt"};
    uint64_t v[] = {st->entries, st->bytes, st->max_size, st->hits,
                    st->misses, st->compiles, st->compile_failures,
                    st->evictions, st->corrupt};
    if (!json)
        printf("cache %s\n", dir);
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        if (json)
            printf("%s\"%s\": %llu", i ? ", " : "{", names[i],
                   (unsigned long long)v[i]);
        else
            printf("  %-17s %llu\n", names[i], (unsigned long long)v[i]);
    }
    if (json)
        printf("}\n");
}

int kw__cli_stats(int argc, char **argv)
{
    const char *dir = NULL;
    if (!has_cache_flag(argc, argv) && !(argc == 2 && (strcmp(argv[1], "-h") == 0 ||
                                                        strcmp(argv[1], "--help") == 0)))
        return kw__cli_stats_socket(argc, argv);
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(stats_usage, stdout);
            return KW_CLI_OK;
        } else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (kw__cli_is(argv[i], "--cache")) {
            if ((dir = kw__cli_value("stats", argc, argv, &i)) == NULL)
                return KW_CLI_USAGE;
        } else {
            kw__cli_err("stats", "%s: unknown argument (see kwarm stats --help)",
                        argv[i]);
            return KW_CLI_USAGE;
        }
    }
    if (dir == NULL) {
        kw__cli_err("stats", "--cache: required (see kwarm stats --help)");
        return KW_CLI_USAGE;
    }
    kw_cache *c = NULL;
    kw_cache_stats st;
    int rc = open_existing("stats", dir, true, &c);
    if (rc != KW_CLI_OK)
        return rc;
    rc = kw_cache_stats_get(c, &st);
    if (rc == 0)
        kw__cli_print_stats(&st, dir, json);
    else
        kw__cli_err("stats", "%s: %s", dir, kw_strerror(rc));
    kw_cache_close(c);
    return rc == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
}
