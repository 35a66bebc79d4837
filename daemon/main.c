/* main.c: kwarmd's command line and --config file.
 *
 * Options come from one table (common/kw_opt.h, in redis' createIntConfig
 * manner): defaults from kw_daemon_opts_init(), then the --config file,
 * then the flags (getopt_long), each checked by the same row, whose bounds
 * word every message; --help, and from it the man page, are printed from
 * the table too.  A bad option is fatal, printed with the file or flag at
 * fault; exit 2 for bad input, 1 when serving fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_daemon.h"
#include "kw_alloc.h"
#include "kw_err.h"
#include "kw_parse.h"
#include "kw_json.h"
#include "kw_keys.h"
#include "kw_opt.h"
#include "kw_proto.h"
#include "kw_remote.h"
#include "log.h"

/* The text of --help around the option lines the table prints. */
static const char usage_head[] =
    "usage: kwarmd [OPTION]...\n"
    "\n"
    "The kwarm compile-cache daemon: serves compiled kernels to serving\n"
    "processes over a Unix socket (or the one systemd passes), compiling\n"
    "missing ones with NVRTC in --jobs worker processes into an LMDB cache.\n"
    "Every option is also a member of a --config file; flags override it.\n"
    "\n";
static const char usage_tail[] =
    "\nExit status: 0 after a clean stop, 1 when serving fails, 2 for bad\n"
    "input (a flag, a --config file, a missing file).\n";

#define KW__CONFIG_MAX (1u << 20) /* bytes of a --config file */
#define HELP_COL 22               /* where --help's descriptions start */

static int set_socket_mode(void *opts, const char *v)
{
    kw_daemon_opts *o = opts;
    char *end = NULL;
    errno = 0;
    unsigned long m = strtoul(v, &end, 8);
    if (errno != 0 || end == v || *end != '\0' || m > 0777 || (m & 0600) != 0600)
        return KW_EINVAL;
    o->socket_mode = (unsigned)m;
    return 0;
}

/* A uid or gid given as a number or a name. */
static int parse_id(const char *v, bool group, uint64_t *id)
{
    if (kw_parse_u64(v, UINT32_MAX - 1, id) == 0)
        return 0;
    if (group) {
        struct group *g = getgrnam(v);
        *id = g ? g->gr_gid : 0;
        return g ? 0 : KW_EINVAL;
    }
    struct passwd *p = getpwnam(v);
    *id = p ? p->pw_uid : 0;
    return p ? 0 : KW_EINVAL;
}

static int set_allow_uid(void *opts, const char *v)
{
    kw_daemon_opts *o = opts;
    uint64_t id;
    if (o->nallow_uid == KW_DAEMON_MAX_ALLOW || parse_id(v, false, &id) < 0)
        return KW_EINVAL;
    o->allow_uid[o->nallow_uid++] = (uid_t)id;
    return 0;
}

static int set_allow_gid(void *opts, const char *v)
{
    kw_daemon_opts *o = opts;
    uint64_t id;
    if (o->nallow_gid == KW_DAEMON_MAX_ALLOW || parse_id(v, true, &id) < 0)
        return KW_EINVAL;
    o->allow_gid[o->nallow_gid++] = (gid_t)id;
    return 0;
}

/* --remote (issue 6): checked as a URL, then stored like a string. */
static int set_remote(void *opts, const char *v)
{
    kw_daemon_opts *o = opts;
    kw_remote_addr a;
    if (kw_remote_parse_url(v, &a) < 0 || strlen(v) >= sizeof o->remote_url)
        return KW_EINVAL;
    memcpy(o->remote_url, v, strlen(v) + 1);
    return 0;
}

static int set_metrics_listen(void *opts, const char *v)
{
    kw_daemon_opts *o = opts;
    struct sockaddr_storage ss;
    socklen_t len;
    if (kw_daemon_metrics_parse(v, &ss, &len) < 0 ||
        strlen(v) >= sizeof o->metrics_listen)
        return KW_EINVAL;
    memcpy(o->metrics_listen, v, strlen(v) + 1);
    return 0;
}

static int set_log_level(void *opts, const char *v)
{
    kw_daemon_opts *o = opts;
    int level = kw__log_level_from_name(v);
    if (level < 0)
        return KW_EINVAL;
    o->log_level = level;
    return 0;
}

/* --config is read before the other flags (main_table's first pass). */
static int set_config(void *opts, const char *v)
{
    (void)opts;
    (void)v;
    return 0;
}

#define F(field) offsetof(kw_daemon_opts, field), sizeof(((kw_daemon_opts *)0)->field)
#define MS "milliseconds"

/* Every kwarmd option, in --help's order: flags, --config members, help
 * and man page come from here, and so do the bounds in every message. */
static const kw_opt options[] = {
    {"socket", 0, KW_OPT_STR, "PATH", NULL, 0, 0, 0, F(socket_path), NULL,
     "a path", 0,
     "(/run/kwarm/kwarm.sock; $XDG_RUNTIME_DIR/kwarm.sock\n"
     "for a non-root user); created mode 0660"},
    {"cache", 0, KW_OPT_STR, "DIR", NULL, 0, 0, 0, F(cache_dir), NULL,
     "a directory path", 0, "LMDB cache on local disk (/var/cache/kwarm)"},
    {"jobs", 0, KW_OPT_UINT, "N", NULL, 1, 256, 0, F(jobs), NULL, NULL, 0,
     "compile worker processes (the cores)"},
    {"loops", 0, KW_OPT_UINT, "N", NULL, 1, 64, 0, F(loops), NULL, NULL, 0,
     "threads serving connections, each with its own\n"
     "libuv loop (a quarter of the cores, 2 to 8)"},
    {"compile-timeout", 0, KW_OPT_UINT, "S", "seconds", 1, 86400, 1000,
     F(compile_timeout_ms), NULL, NULL, 0,
     "a compile running longer is killed and fails (120)"},
    {"compile-memory", 0, KW_OPT_SIZE, "SIZE", NULL, 64u << 20, 0, 0,
     F(compile_mem_limit), NULL, NULL, 0,
     "address space of a compile worker; past it the\n"
     "compile fails (4G)"},
    {"compile-helper", 0, KW_OPT_STR, "PATH", NULL, 0, 0, 0, F(compile_helper),
     NULL, "a file path", 0,
     "the kwarm-compile worker program (found beside\n"
     "kwarmd, or in ../libexec/kwarm/)"},
    {"max-size", 0, KW_OPT_SIZE, "SIZE", NULL, KW_CACHE_MIN_SIZE, 0, 0,
     F(max_size), NULL, NULL, 0,
     "cache size limit, bytes or K/M/G (1G); on an\n"
     "existing cache of another limit, a warning says\n"
     "which one is in force"},
    {"allow-uid", 0, KW_OPT_FUNC, "UID", NULL, 0, 0, 0, 0, 0, set_allow_uid,
     "a uid or user name (at most 32)", KW_OPT_JSTR | KW_OPT_JNUM,
     "a uid (number or name) allowed to connect; repeatable"},
    {"allow-gid", 0, KW_OPT_FUNC, "GID", NULL, 0, 0, 0, 0, 0, set_allow_gid,
     "a gid or group name (at most 32)", KW_OPT_JSTR | KW_OPT_JNUM,
     "a gid (number or name) allowed to connect; repeatable\n"
     "(default: kwarmd's own uid); root is always allowed"},
    {"deny-root", 0, KW_OPT_SWITCH, NULL, NULL, 0, 0, 0, F(deny_root), NULL,
     NULL, 0, "refuse root too"},
    {"max-connections", 0, KW_OPT_UINT, "N", NULL, 1, 1000000, 0,
     F(max_connections), NULL, NULL, 0,
     "open connections at once; the next one gets an\n"
     "error frame and is closed (1024)"},
    {"max-output", 0, KW_OPT_SIZE, "SIZE", NULL, 64u << 10, 1ull << 34, 0,
     F(max_output), NULL, NULL, 0,
     "replies queued for one connection before kwarmd\n"
     "stops reading its requests (16M); a streamed reply\n"
     "waits past it; one that reads nothing for\n"
     "--idle-timeout is dropped"},
    {"max-keys-in-flight", 0, KW_OPT_UINT, "N", NULL, 1, 1ull << 32, 0,
     F(max_keys_in_flight), NULL, NULL, 0,
     "keys of keys and warmup requests under way in\n"
     "the whole daemon (2000000); a request that would\n"
     "pass it is refused with an error naming the flag"},
    {"idle-timeout", 0, KW_OPT_UINT, "MS", MS, 100, 24ull * 3600 * 1000, 0,
     F(idle_timeout_ms), NULL, NULL, 0,
     "close connections silent this long (60000)"},
    {"max-held-reads", 0, KW_OPT_UINT, "N", NULL, 0, 128, 0, F(max_held_reads),
     NULL, NULL, 0,
     "hits are written from the cache's map without a\n"
     "copy; a reply the socket does not take at once\n"
     "holds a read snapshot until written: at most N\n"
     "at once (64; past it the rest is copied out)"},
    {"held-read-timeout", 0, KW_OPT_UINT, "MS", MS, 10, 3600 * 1000, 0,
     F(held_read_timeout_ms), NULL, NULL, 0,
     "a reply holding a snapshot this long closes\n"
     "its connection (5000), so no client that stops\n"
     "reading keeps old pages from being reused"},
    {"socket-mode", 0, KW_OPT_FUNC, "MODE", NULL, 0, 0, 0, 0, 0, set_socket_mode,
     "an octal mode like 0660 with 0600 set (a string)", KW_OPT_JSTR,
     "octal mode of a socket kwarmd creates (0660); the\n"
     "uid/gid allowlist is checked on every connection"},
    {"remote", 0, KW_OPT_FUNC, "URL", NULL, 0, 0, 0, 0, 0, set_remote,
     "redis://HOST:PORT[/DB] (no password in it)", KW_OPT_JSTR,
     "fleet tier: share compiled kernels through Redis\n"
     "(redis://HOST:PORT[/DB]; needs --remote-key-file)"},
    {"remote-key-file", 0, KW_OPT_STR, "F", NULL, 0, 0, 0, F(remote_key_file),
     NULL, "a file path", 0,
     "fleet HMAC key: 32 bytes, mode 0600; an optional\n"
     "line after them is the Redis password (else\n"
     "$KWARM_REMOTE_PASSWORD; never on the command line)"},
    {"remote-timeout", 0, KW_OPT_UINT, "MS", MS, 10, 60000, 0,
     F(remote_timeout_ms), NULL, NULL, 0, "timeout of every Redis call (1000)"},
    {"remote-lease", 0, KW_OPT_UINT, "MS", MS, 100, 3600 * 1000, 0,
     F(remote_lease_ms), NULL, NULL, 0,
     "fleet compile lease, and the longest wait on\n"
     "another node compiling the same key (60000)"},
    {"read-only", 0, KW_OPT_SWITCH, NULL, NULL, 0, 0, 0, F(read_only), NULL,
     NULL, 0,
     "serve the cache's hits, never write it: a miss is\n"
     "\"not cached (read-only cache)\" (also chosen, with a\n"
     "log line, when the cache is not writable)"},
    {"log-level", 0, KW_OPT_FUNC, "LEVEL", NULL, 0, 0, 0, 0, 0, set_log_level,
     "error, warn, info or debug", KW_OPT_JSTR,
     "error, warn, info (default) or debug; lines carry an\n"
     "RFC 3339 time, or a journald priority under systemd"},
    {"metrics-listen", 0, KW_OPT_FUNC, "HOST:PORT", NULL, 0, 0, 0, 0, 0,
     set_metrics_listen, "A.B.C.D:PORT or [IPV6]:PORT (numeric, PORT 1..65535)",
     KW_OPT_JSTR,
     "serve Prometheus metrics at\n"
     "http://HOST:PORT/metrics; A.B.C.D:PORT or\n"
     "[IPV6]:PORT, numeric (off by default)"},
    {"config", 0, KW_OPT_FUNC, "FILE", NULL, 0, 0, 0, 0, 0, set_config,
     "a file path", 0, "JSON object with these names, e.g. {\"jobs\": 4}"},
    {"version", 0, KW_OPT_SWITCH, NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "print the version and what enters a key's digest"},
    {"help", 'h', KW_OPT_SWITCH, NULL, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0,
     "this text"},
};
#define NOPTIONS (sizeof options / sizeof options[0])
/* The rows after the last --config member: command-line only. */
#define NCONFIG (NOPTIONS - 3)

#undef F
#undef MS

/* Applies one value of a --config member (a string, a number, or an
 * array of them for the repeatable options); where names FILE:LINE. */
static int config_value(kw_daemon_opts *o, const kw_opt *def, const cJSON *v,
                        const char *where)
{
    char num[32], what[160];
    const char *text = NULL;
    unsigned types = kw_opt_json_types(def);
    if (cJSON_IsString(v) && (types & KW_OPT_JSTR))
        text = v->valuestring;
    else if (cJSON_IsBool(v) && (types & KW_OPT_JBOOL))
        text = cJSON_IsTrue(v) ? "true" : "false";
    else if (cJSON_IsNumber(v) && (types & KW_OPT_JNUM) &&
             v->valuedouble >= 0 &&
             v->valuedouble < 1e15 && v->valuedouble == (double)(int64_t)v->valuedouble) {
        snprintf(num, sizeof num, "%lld", (long long)v->valuedouble);
        text = num;
    }
    if (text == NULL || kw_opt_set(def, o, text) < 0) {
        kw_opt_describe(def, what, sizeof what);
        fprintf(stderr, "kwarmd: %s: /%s: must be %s%s\n", where, def->name,
                what, types == KW_OPT_JNUM ? " (a JSON number)" : "");
        return KW_EINVAL;
    }
    return 0;
}

/* The flag names of the first n rows, for kw_opt_nearest. */
static size_t option_names(const char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        names[i] = options[i].name;
    return n;
}

/* Prints an unknown --config member, with the nearest option's name. */
static void unknown_member(const char *where, const char *name)
{
    const char *names[NOPTIONS];
    const char *near = kw_opt_nearest(name, names, option_names(names, NCONFIG));
    fprintf(stderr, "kwarmd: %s: /%s: unknown option%s%s%s\n", where, name,
            near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
}

/* The line of text on which member name's key is (1 when not found): the
 * strict reader refused duplicate names, so a top-level key is unique. */
static unsigned member_line(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; (p = strchr(p, '"')) != NULL; p++) {
        const char *q = p + 1 + n;
        if (strncmp(p + 1, name, n) != 0 || *q != '"')
            continue;
        for (q++; *q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'; q++)
            ;
        if (*q != ':')
            continue;
        unsigned line = 1;
        for (const char *c = text; c < p; c++)
            line += *c == '\n';
        return line;
    }
    return 1;
}

/* Reads all of path (at most KW__CONFIG_MAX bytes) into *buf, NUL-ended. */
static int read_config(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *b = f ? kw_malloc(KW__CONFIG_MAX + 1) : NULL;
    size_t n = b ? fread(b, 1, KW__CONFIG_MAX + 1, f) : 0;
    int e = errno;
    if (f)
        fclose(f);
    if (b == NULL) {
        fprintf(stderr, "kwarmd: --config %s: %s\n", path, strerror(f ? ENOMEM : e));
        return KW_EINVAL;
    }
    if (n > KW__CONFIG_MAX) {
        fprintf(stderr, "kwarmd: --config %s: larger than %u bytes\n", path,
                KW__CONFIG_MAX);
        free(b);
        return KW_EINVAL;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/* Reads --config FILE: a JSON object whose members are option names,
 * through common/'s strict reader (a byte-order mark, a duplicate option
 * or a trailing byte is refused); every error names the file, the line
 * and the option. */
static int load_config(kw_daemon_opts *o, const char *path)
{
    char *buf = NULL, why[KW_JSON_ERRLEN], where[4200];
    size_t n = 0;
    cJSON *root = NULL;
    if (read_config(path, &buf, &n) < 0)
        return KW_EINVAL;
    int rc = kw_json_parse(buf, n, 8, &root, why, sizeof why);
    if (rc < 0)
        fprintf(stderr, "kwarmd: --config %s: %s\n", path,
                rc == KW_EJSON ? why : kw_strerror(rc));
    else if (!cJSON_IsObject(root))
        fprintf(stderr, "kwarmd: --config %s: line 1: not a JSON object\n", path);
    rc = rc == 0 && cJSON_IsObject(root) ? 0 : KW_EINVAL;
    for (const cJSON *it = root ? root->child : NULL; rc == 0 && it; it = it->next) {
        const kw_opt *def = kw_opt_find(options, NCONFIG, it->string);
        snprintf(where, sizeof where, "%s:%u", path, member_line(buf, it->string));
        if (def == NULL) {
            unknown_member(where, it->string);
            rc = KW_EINVAL;
        } else if (cJSON_IsArray(it)) {
            for (const cJSON *e = it->child; rc == 0 && e; e = e->next)
                rc = config_value(o, def, e, where);
        } else
            rc = config_value(o, def, it, where);
    }
    cJSON_Delete(root);
    free(buf);
    return rc;
}

/* --version: everything that enters a key's digest, and the protocol. */
static int print_version(void)
{
    int major = 0, minor = 0;
    uint8_t src[KW_KEYS_DIGEST_LEN];
    char hex[KW_KEYS_HEX_LEN];
    if (kw_jit_version(&major, &minor) < 0 || kw_keys_sources_digest(src) < 0) {
        fprintf(stderr, "kwarmd: --version: the NVRTC version query failed\n");
        return -1;
    }
    kw_keys_hex(src, hex);
    printf("kwarmd %s\nkey schema %d\nNVRTC %d.%d\nkernel sources %.16s\n"
           "protocol %u\n", KW_VERSION, KW_KEYS_SCHEMA, major, minor, hex,
           KW_PROTO_VERSION);
    return 0;
}

/* Prints the error r of kw_opt_next (or of a value v it gave for row
 * r >= 0) as one line naming the flag; returns -1. */
static int flag_error(const kw_opt_parser *p, int r, const char *v)
{
    char what[160], near[80] = "";
    if (r >= 0) {
        kw_opt_describe(&options[r], what, sizeof what);
        fprintf(stderr, "kwarmd: --%s: '%.64s' is not %s (see kwarmd --help)\n",
                options[r].name, v, what);
        return -1;
    }
    if (r == KW_OPT_POSITIONAL) {
        fprintf(stderr, "kwarmd: %.64s: unknown argument (see kwarmd --help)\n", v);
        return -1;
    }
    if (r == KW_OPT_UNKNOWN && p->bad[0] == '-' && p->bad[1] == '-') {
        const char *names[NOPTIONS];
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(p->bad + 2, "="), p->bad + 2);
        const char *n = kw_opt_nearest(name, names, option_names(names, NOPTIONS));
        if (n != NULL)
            snprintf(near, sizeof near, "; did you mean --%s?", n);
    }
    fprintf(stderr, "kwarmd: %.64s: %s%s (see kwarmd --help)\n", p->bad,
            r == KW_OPT_MISSING   ? "missing value"
            : r == KW_OPT_NOVALUE ? "takes no value"
                                  : "unknown argument",
            near);
    return -1;
}

/* Prints --help: the table's lines between the head and the tail. */
static int print_help(void)
{
    fputs(usage_head, stdout);
    kw_opt_help(stdout, options, NOPTIONS, HELP_COL);
    fputs(usage_tail, stdout);
    return 1;
}

/* Reads every --config FILE of argv, wherever it stands, so that the
 * flags (parse_flags' second pass) override the file.  0 or -1. */
static int config_pass(kw_daemon_opts *o, int argc, char **argv)
{
    kw_opt_parser p;
    const char *v;
    kw_opt_parser_init(&p, options, NOPTIONS, argc, argv);
    for (int r; (r = kw_opt_next(&p, &v)) != KW_OPT_END;) {
        if (r < 0 && r != KW_OPT_POSITIONAL)
            return flag_error(&p, r, v);
        if (r >= 0 && options[r].set == set_config && load_config(o, v) < 0)
            return -1;
    }
    return 0;
}

/* A file named by a flag that cannot be read is bad input (exit 2, as a
 * missing --config is), found before anything starts: the key file is
 * read again, and checked in full, when the fleet tier opens. */
static int check_files(const kw_daemon_opts *o)
{
    if (o->remote_key_file[0] == '\0')
        return 0;
    int fd = open(o->remote_key_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "kwarmd: --remote-key-file %s: %s\n", o->remote_key_file,
                strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

/* Applies the flags after the --config files.  Returns 0, 1 (help or
 * version printed), or -1 after printing the error. */
static int parse_flags(kw_daemon_opts *o, int argc, char **argv)
{
    if (config_pass(o, argc, argv) < 0)
        return -1;
    kw_opt_parser p;
    const char *v;
    kw_opt_parser_init(&p, options, NOPTIONS, argc, argv);
    for (int r; (r = kw_opt_next(&p, &v)) != KW_OPT_END;) {
        if (r < 0)
            return flag_error(&p, r, v);
        const kw_opt *def = &options[r];
        if (strcmp(def->name, "help") == 0)
            return print_help();
        if (strcmp(def->name, "version") == 0)
            return print_version() == 0 ? 1 : -1;
        if (def->set == set_config)
            continue; /* read by config_pass */
        if (kw_opt_set(def, o, def->type == KW_OPT_SWITCH ? "true" : v) < 0)
            return flag_error(&p, r, v);
    }
    if (o->remote_url[0] != '\0' && o->remote_key_file[0] == '\0') {
        fprintf(stderr, "kwarmd: --remote needs --remote-key-file (the fleet key)\n");
        return -1;
    }
    return check_files(o);
}

int main(int argc, char **argv)
{
    kw_daemon_opts o;
    char err[1024] = "";
    kw_daemon_opts_init(&o);
    int rc = parse_flags(&o, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    kw__log_init(o.log_level);
    rc = kw_daemon_run(&o, err, sizeof err);
    if (rc < 0) {
        /* the log line names kwarmd already (log.h) */
        KW_LOG(KW_LOG_ERR, "%s", err[0] ? err : kw_strerror(rc));
        return 1;
    }
    return 0;
}
