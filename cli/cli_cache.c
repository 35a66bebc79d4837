/* cli_cache.c: `kwarm get` and `kwarm stats` on a cache directory, and
 * what every --cache command shares: opening the directory (read-only
 * where the command only reads) and resolving --digest prefixes. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_jit.h"
#include "kw_parse.h"

#define GO(field) .off = offsetof(kw__cli_get_opts, field), \
                  .size = sizeof(const char *)

/* get's one table: both forms (--cache DIR, or kwarmd at --socket). */
static const kw_opt get_rows[] = {
    {.name = "digest", .type = KW_OPT_TEXT, .arg = "HEX", GO(digest),
     .help = "64 hex digits, or a unique prefix of at least\n"
             "8 (the 16 kwarm keys prints); ambiguous: exit 2"},
    {.name = "family", .type = KW_OPT_TEXT, .arg = "F", GO(family),
     .help = "kernel family, e.g. dcp_stable_topk"},
    {.name = "fields", .type = KW_OPT_TEXT, .arg = "k=v,...", GO(fields),
     .help = "every field of the family (kwarm keys --json)"},
    {.name = "arch", .type = KW_OPT_TEXT, .arg = "sm_XX", GO(arch),
     .help = "target architecture"},
    {.name = "cache", .type = KW_OPT_TEXT, .arg = "DIR", GO(cache),
     .help = "read this cache directory (works read-only)"},
    {.name = "socket", .type = KW_OPT_TEXT, .arg = "PATH", GO(socket),
     .help = "ask kwarmd on PATH ($KWARM_SOCKET, else\n"
             "$XDG_RUNTIME_DIR/kwarm.sock, or\n"
             "/run/kwarm/kwarm.sock for root)"},
    {.name = "output", .short_name = 'o', .type = KW_OPT_TEXT, .arg = "FILE",
     GO(out),
     .help = "where the cubin goes: a regular file is\n"
             "replaced atomically, a device or FIFO written\n"
             "in place (-o /dev/stdout), - is stdout (not a\n"
             "terminal); a directory is refused"},
    KW__CLI_SWITCH(kw__cli_get_opts, no_compile, "no-compile",
                   "never compile a miss"),
};
#undef GO

static const kw__cli_cmd get_cmd = {
    .name = "get",
    .usage =
        "usage: kwarm get (--digest HEX | --family F --fields k=v,... --arch sm_XX)\n"
        "                 --cache DIR -o FILE\n"
        "       kwarm get (...same key...) -o FILE [--socket PATH] [--no-compile]\n"
        "\n"
        "Writes one cubin to FILE and prints its entry point.  The key is its\n"
        "digest, or the family, every field of it and the arch.  With --cache the\n"
        "directory is read directly; otherwise kwarmd is asked.\n"
        "\n"
        "On a miss, a key given by family, fields and arch is compiled (and\n"
        "stored), unless --no-compile or the cache is read-only.  A digest cannot\n"
        "be compiled (it names no fields): a missing digest is an error, exit 1.\n"
        "\n",
    KW__CLI_ROWS(get_rows),
};

static const kw_opt stats_rows[] = {
    KW__CLI_TEXT(kw__cli_stats_opts, cache, "cache", "DIR", "the cache directory"),
    KW__CLI_TEXT(kw__cli_stats_opts, socket, "socket", "PATH",
                 "ask kwarmd on PATH instead"),
    KW__CLI_SWITCH(kw__cli_stats_opts, json, "json",
                   "one JSON object with those fields"),
    KW__CLI_SWITCH(kw__cli_stats_opts, prometheus, "prometheus",
                   "(kwarmd only) the text kwarmd\n--metrics-listen serves"),
};

static const kw__cli_cmd stats_cmd = {
    .name = "stats",
    .usage =
        "usage: kwarm stats --cache DIR [--json]\n"
        "       kwarm stats [--socket PATH] [--json | --prometheus]   (ask kwarmd)\n"
        "\n"
        "Prints the cache's entries, bytes, size limit, hits, misses, compiles,\n"
        "compile failures, evictions, corrupt entries found, pinned entries and\n"
        "bytes, and whether it is read-only.  A cache this user cannot write is\n"
        "read read-only.\n"
        "\n",
    KW__CLI_ROWS(stats_rows),
};

typedef kw__cli_get_opts get_opts; /* where: the --cache directory */

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
    /* The family's own rules, before any compile: a key no kernel accepts
     * is bad input, not a compile failure (issue 24). */
    if (kw__cli_fields_check("get", (int)k->family, k->fields) >= 0)
        return -1;
    if (kw__cli_arch_one("get", k->arch) >= 0)
        return -1;
    return kw_keys_digest(k, k->digest) < 0 ? -1 : 0;
}


/* True when path starts as an LMDB data file does: the meta page's magic
 * 0xBEEFC0DE, little-endian, after the 16-byte page header (lmdb's
 * mdb.c, MDB_MAGIC).  Only to word the error of a file that is not one. */
static bool looks_like_lmdb(const char *path)
{
    unsigned char b[20];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, b, sizeof b);
    if (fd >= 0)
        close(fd);
    if (n < 0)
        return true; /* unreadable: let kw_cache_open say why */
    return n == (ssize_t)sizeof b && b[16] == 0xde && b[17] == 0xc0 &&
           b[18] == 0xef && b[19] == 0xbe;
}

/* What kw__cli_cache_open checks before LMDB sees dir: a path that is
 * missing, not a directory, holds no cache (for a command that does not
 * create one) or holds a file LMDB cannot read is bad input, exit 2, named
 * in words rather than as an mdb_env_open code.  -1 to go on. */
static int dir_check(const char *cmd, const char *dir, kw__cli_access how)
{
    struct stat st;
    char data[4096];
    if (stat(dir, &st) < 0) {
        int e = errno;
        kw__cli_err(cmd, "--cache: %s: %s", dir, strerror(e));
        return e == EACCES ? KW_CLI_RUNTIME : KW_CLI_USAGE;
    }
    if (!S_ISDIR(st.st_mode)) {
        kw__cli_err(cmd, "--cache: %s: not a directory", dir);
        return KW_CLI_USAGE;
    }
    if (access(dir, R_OK | X_OK) < 0) {
        kw__cli_err(cmd, "--cache: %s: %s (this user, uid %u, cannot read "
                    "the directory)", dir, strerror(errno), (unsigned)getuid());
        return KW_CLI_RUNTIME;
    }
    int n = snprintf(data, sizeof data, "%s/data.mdb", dir);
    if (n < 0 || (size_t)n >= sizeof data) {
        kw__cli_err(cmd, "--cache: %.64s...: path too long", dir);
        return KW_CLI_USAGE;
    }
    bool have = stat(data, &st) == 0;
    if (!have && errno == ENOENT && how != KW_CLI_READ_WRITE) {
        kw__cli_err(cmd, "--cache: no cache in %s (no data.mdb; kwarm "
                    "prewarm --cache %s creates one)", dir, dir);
        return KW_CLI_USAGE;
    }
    if (have && !looks_like_lmdb(data)) {
        kw__cli_err(cmd, "--cache: %s is not an LMDB file, so %s is not a "
                    "kwarm cache", data, dir);
        return KW_CLI_USAGE;
    }
    return -1;
}

int kw__cli_cache_open(const char *cmd, const char *dir, kw__cli_access how,
                       kw_cache **c)
{
    kw_cache_opts co = {.dir = dir, .read_only = how == KW_CLI_READ,
                        .auto_read_only = how == KW_CLI_READ_WRITE};
    char err[512];
    int rc = dir_check(cmd, dir, how);
    if (rc >= 0)
        return rc;
    rc = kw_cache_open(c, &co, err, sizeof err);
    if (rc < 0) {
        kw__cli_err(cmd, "--cache: %s", err);
        return KW_CLI_RUNTIME;
    }
    return KW_CLI_OK;
}

/* Prints the candidates of an ambiguous prefix, one per line, after the
 * error line (kw__cli_err keeps a message on one line). */
static void print_candidates(const char *cmd, const char *hex, char *list)
{
    size_t n = 0;
    for (const char *p = list; *p != '\0'; p++)
        n += *p == '\n';
    n += list[0] != '\0' && list[strlen(list) - 1] != '\n';
    kw__cli_err(cmd, "--digest %.64s: ambiguous prefix, %zu%s cached digests "
                "start with it:", hex, n, n >= 8 ? " or more" : "");
    for (char *save = NULL, *d = strtok_r(list, "\n", &save); d != NULL;
         d = strtok_r(NULL, "\n", &save))
        fprintf(stderr, "  %s\n", d);
}

int kw__cli_digest_resolve(const char *cmd, kw_cache *c, const char *hex,
                           uint8_t out[KW_CACHE_DIGEST_LEN])
{
    size_t n = strlen(hex), got = 0;
    if (n == 2 * KW_CACHE_DIGEST_LEN &&
        sodium_hex2bin(out, KW_CACHE_DIGEST_LEN, hex, n, NULL, &got, NULL) == 0 &&
        got == KW_CACHE_DIGEST_LEN)
        return -1;
    char cand[8 * KW_CACHE_HEX_LEN + 1] = "";
    int rc = c != NULL ? kw_cache_find_prefix(c, hex, out, cand, sizeof cand)
                       : KW_EINVAL;
    switch (rc) {
    case 0:
        return -1;
    case KW_EAMBIGUOUS:
        print_candidates(cmd, hex, cand);
        return KW_CLI_USAGE;
    case KW_ENOTFOUND:
        kw__cli_err(cmd, "--digest %.64s: no cached digest starts with it", hex);
        return KW_CLI_RUNTIME;
    case KW_EINVAL:
        kw__cli_err(cmd, "--digest: '%.72s' is not %d to 64 hex digits", hex,
                    KW_CACHE_PREFIX_MIN);
        return KW_CLI_USAGE;
    default:
        kw__cli_err(cmd, "--digest %.64s: %s: %s", hex, kw_strerror(rc),
                    kw_cache_last_error(c));
        return KW_CLI_RUNTIME;
    }
}

int kw__cli_get_parse(kw__cli_get_opts *o, int argc, char **argv)
{
    *o = (kw__cli_get_opts){0};
    int rc = kw__cli_getopt(&get_cmd, argc, argv, o, NULL, NULL, 0);
    if (rc >= 0)
        return rc;
    if (o->cache != NULL && o->socket != NULL) {
        kw__cli_err("get", "--cache and --socket: give one (a directory, or "
                    "kwarmd)");
        return KW_CLI_USAGE;
    }
    o->where = o->cache ? o->cache : o->socket;
    bool by_key = o->family || o->fields || o->arch;
    const char *missing = o->out == NULL ? "-o"
                          : (o->digest != NULL) == by_key ? "--digest or --family/--fields/--arch"
                          : by_key && !(o->family && o->fields && o->arch) ? "--family, --fields and --arch"
                          : NULL;
    if (missing != NULL) {
        kw__cli_err("get", "%s: required (see kwarm get --help)", missing);
        return KW_CLI_USAGE;
    }
    return kw__cli_output_check("get", o->out); /* -1: go on */
}

/* Compiles key k after a miss, stores it in c and writes it to -o.  An
 * exit code. */
static int get_compile(const get_opts *o, kw_cache *c, const kw_keys_key *k)
{
    kw_jit_result res;
    int rc = kw_keys_compile(k, false, &res);
    if (rc < 0) {
        kw_cache_count(c, KW_CACHE_COMPILE_FAILURES, 1);
        kw__cli_err("get", "%s %s: %s%s%s", o->family, o->arch,
                    kw_strerror(rc), res.log ? ": " : "", res.log ? res.log : "");
        kw_jit_result_destroy(&res);
        return KW_CLI_RUNTIME;
    }
    kw_cache_info info = {.nfields = (uint32_t)kw_keys_nfields(k->family),
                          .compile_seconds = res.seconds};
    int major = 0, minor = 0;
    kw_jit_version(&major, &minor);
    snprintf(info.family, sizeof info.family, "%s", kw_keys_family_name(k->family));
    snprintf(info.arch, sizeof info.arch, "%s", k->arch);
    snprintf(info.entry, sizeof info.entry, "%s", res.lowered_name ? res.lowered_name : "");
    snprintf(info.nvrtc, sizeof info.nvrtc, "%d.%d", major, minor);
    memcpy(info.fields, k->fields, info.nfields * sizeof k->fields[0]);
    /* counted as a compile in the transaction that stores it */
    kw_cache_item it = {.digest = k->digest, .info = &info, .blob = res.cubin,
                        .len = res.cubin_len, .compiled = true};
    if (kw_cache_put_many(c, &it, 1, &rc) < 0)
        rc = KW_ENOMEM;
    if (rc < 0) /* the cubin is still good: write it, say why it is not kept */
        kw__cli_err("get", "compiled, but not stored in %s: %s: %s", o->where,
                    kw_strerror(rc), kw_cache_last_error(c));
    else
        fprintf(stderr, "kwarm get: not cached: compiled in %.2f s and stored "
                "in %s\n", res.seconds, o->where);
    rc = kw__cli_put_cubin("get", o->out, res.cubin, res.cubin_len, info.family,
                           info.arch, info.entry);
    kw_jit_result_destroy(&res);
    return rc;
}

/* Says why a miss is not compiled; returns the exit code (1). */
static int get_miss(const get_opts *o, kw_cache *c, const char *hex)
{
    if (o->digest != NULL)
        kw__cli_err("get", "%.16s: not cached in %s; a digest cannot be "
                    "compiled: give the key as --family, --fields and --arch "
                    "(kwarm keys --json lists them), or run kwarm prewarm",
                    hex, o->where);
    else
        kw__cli_err("get", "%s %.16s: not cached in %s%s", o->family, hex,
                    o->where, kw_cache_is_read_only(c) ? " (read-only cache)"
                                                       : " (--no-compile)");
    return KW_CLI_RUNTIME;
}

/* Fetches key k (digest set) from the open cache into o->out, compiling
 * a miss of a key given by fields when it may. */
static int get_fetch(const get_opts *o, kw_cache *c, const kw_keys_key *k)
{
    kw_cache_info info;
    void *blob = NULL;
    size_t len = 0;
    char hex[KW_KEYS_HEX_LEN];
    kw_keys_hex(k->digest, hex);
    int rc = kw_cache_get(c, k->digest, &blob, &len, &info);
    if (rc == 0)
        rc = kw__cli_put_cubin("get", o->out, blob, len, info.family,
                               info.arch, info.entry);
    else if ((rc == KW_ENOTFOUND || rc == KW_ECORRUPT) && o->digest == NULL &&
             !o->no_compile && !kw_cache_is_read_only(c))
        rc = get_compile(o, c, k);
    else if (rc == KW_ENOTFOUND)
        rc = get_miss(o, c, hex);
    else {
        kw__cli_err("get", "%.16s: %s in %s", hex, kw_strerror(rc), o->where);
        rc = KW_CLI_RUNTIME;
    }
    free(blob);
    return rc;
}

int kw__cli_get(int argc, char **argv)
{
    get_opts o;
    int rc = kw__cli_get_parse(&o, argc, argv);
    if (rc >= 0)
        return rc;
    if (o.cache == NULL)
        return kw__cli_get_socket(&o);
    kw_keys_key k;
    kw_cache *c = NULL;
    if (o.digest == NULL && key_from_flags(&o, &k) < 0)
        return KW_CLI_USAGE;
    if (o.digest != NULL && strspn(o.digest, "0123456789abcdefABCDEF") !=
                                strlen(o.digest))
        return kw__cli_digest_resolve("get", NULL, o.digest, k.digest);
    if ((rc = kw__cli_cache_open("get", o.where, KW_CLI_READ_WRITE, &c)) != KW_CLI_OK)
        return rc;
    if (o.digest == NULL ||
        (rc = kw__cli_digest_resolve("get", c, o.digest, k.digest)) < 0)
        rc = get_fetch(&o, c, &k);
    kw_cache_close(c);
    return rc;
}

void kw__cli_print_stats(const kw_cache_stats *st, const char *dir, bool json)
{
    const char *names[] = {"entries", "bytes", "max_size", "hits", "misses",
                           "compiles", "compile_failures", "evictions",
                           "corrupt", "pinned_entries", "pinned_bytes"};
    uint64_t v[] = {st->entries, st->bytes, st->max_size, st->hits,
                    st->misses, st->compiles, st->compile_failures,
                    st->evictions, st->corrupt, st->pinned_entries,
                    st->pinned_bytes};
    if (!json)
        printf("cache %s%s\n", dir, st->read_only ? " (read-only)" : "");
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        if (json)
            printf("%s\"%s\": %llu", i ? ", " : "{", names[i],
                   (unsigned long long)v[i]);
        else
            printf("  %-17s %llu\n", names[i], (unsigned long long)v[i]);
    }
    if (json)
        printf(", \"read_only\": %s}\n", st->read_only ? "true" : "false");
    else
        printf("  %-17s %s\n", "read_only", st->read_only ? "true" : "false");
}

/* True when this process may write the cache in dir (its directory and
 * data file; access() also says EROFS on a read-only mount). */
static bool writable(const char *dir)
{
    char data[4096];
    int n = snprintf(data, sizeof data, "%s/data.mdb", dir);
    return access(dir, W_OK) == 0 && n > 0 && (size_t)n < sizeof data &&
           (access(data, W_OK) == 0 || errno == ENOENT);
}

int kw__cli_stats(int argc, char **argv)
{
    kw__cli_stats_opts o = {0};
    int rc = kw__cli_getopt(&stats_cmd, argc, argv, &o, NULL, NULL, 0);
    if (rc >= 0)
        return rc;
    if (o.cache == NULL)
        return kw__cli_stats_socket(&o);
    if (o.prometheus || o.socket) {
        kw__cli_err("stats", "%s: asks kwarmd, and --cache reads a directory: "
                    "give one (kwarm stats --socket PATH --prometheus)",
                    o.socket ? "--socket" : "--prometheus");
        return KW_CLI_USAGE;
    }
    const char *dir = o.cache;
    bool json = o.json;
    kw_cache *c = NULL;
    kw_cache_stats st;
    rc = kw__cli_cache_open("stats", dir, KW_CLI_READ, &c);
    if (rc != KW_CLI_OK)
        return rc;
    rc = kw_cache_stats_get(c, &st);
    if (rc == 0) {
        /* The handle is read-only by choice (stats never writes, so it has
         * no side effect such as a trim); report whether the cache could
         * be written by this user, as kwarmd's stats would. */
        st.read_only = !writable(dir);
        kw__cli_print_stats(&st, dir, json);
    }
    else
        kw__cli_err("stats", "%s: %s", dir, kw_strerror(rc));
    kw_cache_close(c);
    return rc == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
}
