/* main.c: kwarmd's command line and --config file.
 *
 * Options come from one table (redis' createIntConfig manner): defaults
 * from kw_daemon_opts_init(), then the --config file, then the flags, each
 * checked by the same setter.  A bad option is fatal, printed with the
 * file or flag at fault; exit 2 for bad input, 1 when serving fails.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_daemon.h"
#include "kw_alloc.h"
#include "kw_err.h"
#include "kw_parse.h"
#include "kw_json.h"
#include "kw_keys.h"
#include "kw_proto.h"
#include "kw_remote.h"
#include "log.h"

static const char usage[] =
    "usage: kwarmd [--socket PATH] [--cache DIR] [--jobs N] [--max-size SIZE]\n"
    "              [--loops N]\n"
    "              [--compile-timeout S] [--compile-memory SIZE]\n"
    "              [--compile-helper PATH]\n"
    "              [--max-output SIZE] [--max-connections N] [--deny-root]\n"
    "              [--max-keys-in-flight N]\n"
    "              [--log-level error|warn|info|debug] [--read-only]\n"
    "              [--allow-uid UID]... [--allow-gid GID]... [--idle-timeout MS]\n"
    "              [--socket-mode MODE]\n"
    "              [--max-held-reads N] [--held-read-timeout MS]\n"
    "              [--remote redis://HOST:PORT[/DB] --remote-key-file F]\n"
    "              [--remote-timeout MS] [--remote-lease MS]\n"
    "              [--metrics-listen HOST:PORT] [--config FILE]\n"
    "\n"
    "The kwarm compile-cache daemon: serves compiled kernels to serving\n"
    "processes over a Unix socket (or the one systemd passes), compiling\n"
    "missing ones with NVRTC in --jobs worker processes into an LMDB cache.\n"
    "\n"
    "  --socket PATH       (/run/kwarm/kwarm.sock; $XDG_RUNTIME_DIR/kwarm.sock\n"
    "                      for a non-root user); created mode 0660\n"
    "  --cache DIR         LMDB cache on local disk (/var/cache/kwarm)\n"
    "  --jobs N            compile worker processes (the cores)\n"
    "  --loops N           threads serving connections, each with its own\n"
    "                      libuv loop (a quarter of the cores, 2 to 8)\n"
    "  --compile-timeout S a compile running longer is killed and fails (120)\n"
    "  --compile-memory SIZE  address space of a compile worker; past it the\n"
    "                      compile fails (4G)\n"
    "  --compile-helper PATH  the kwarm-compile worker program (found beside\n"
    "                      kwarmd, or in ../libexec/kwarm/)\n"
    "  --max-size SIZE     cache size limit, bytes or K/M/G (1G)\n"
    "  --allow-uid UID     a uid (number or name) allowed to connect; repeatable\n"
    "  --allow-gid GID     a gid (number or name) allowed to connect; repeatable\n"
    "                      (default: kwarmd's own uid); root is always allowed\n"
    "  --deny-root         refuse root too\n"
    "  --max-connections N open connections at once; the next one gets an\n"
    "                      error frame and is closed (1024)\n"
    "  --max-output SIZE   replies queued for one connection before kwarmd\n"
    "                      stops reading its requests (16M); a streamed reply\n"
    "                      waits past it; one that reads nothing for\n"
    "                      --idle-timeout is dropped\n"
    "  --max-keys-in-flight N  keys of keys and warmup requests under way in\n"
    "                      the whole daemon (2000000); a request that would\n"
    "                      pass it is refused with an error naming the flag\n"
    "  --idle-timeout MS   close connections silent this long (60000)\n"
    "  --max-held-reads N  hits are written from the cache's map without a\n"
    "                      copy; a reply the socket does not take at once\n"
    "                      holds a read snapshot until written: at most N\n"
    "                      at once (64; past it the rest is copied out)\n"
    "  --held-read-timeout MS  a reply holding a snapshot this long closes\n"
    "                      its connection (5000), so no client that stops\n"
    "                      reading keeps old pages from being reused\n"
    "  --socket-mode MODE  octal mode of a socket kwarmd creates (0660); the\n"
    "                      uid/gid allowlist is checked on every connection\n"
    "  --remote URL        fleet tier: share compiled kernels through Redis\n"
    "  --remote-key-file F fleet HMAC key: 32 bytes, mode 0600; an optional\n"
    "                      line after them is the Redis password (else\n"
    "                      $KWARM_REMOTE_PASSWORD; never on the command line)\n"
    "  --remote-timeout MS timeout of every Redis call (1000)\n"
    "  --remote-lease MS   fleet compile lease, and the longest wait on\n"
    "                      another node compiling the same key (60000)\n"
    "  --read-only         serve the cache's hits, never write it: a miss is\n"
    "                      \"not cached (read-only cache)\" (also chosen, with a\n"
    "                      log line, when the cache is not writable)\n"
    "  --log-level LEVEL   error, warn, info (default) or debug; lines carry an\n"
    "                      RFC 3339 time, or a journald priority under systemd\n"
    "  --metrics-listen HOST:PORT  serve Prometheus metrics at\n"
    "                      http://HOST:PORT/metrics; A.B.C.D:PORT or\n"
    "                      [IPV6]:PORT, numeric (off by default)\n"
    "  --config FILE       JSON object with these names, e.g. {\"jobs\": 4}\n"
    "  --version, --help\n";

#define KW__CONFIG_MAX (1u << 20) /* bytes of a --config file */

typedef int (*setter)(kw_daemon_opts *o, const char *v);

/* Copies v into a fixed buffer, refusing (never truncating) what does
 * not fit. */
static int set_str(char *dst, size_t cap, const char *v)
{
    if (v[0] == '\0' || strlen(v) >= cap)
        return KW_EINVAL;
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int set_socket(kw_daemon_opts *o, const char *v)
{
    return set_str(o->socket_path, sizeof o->socket_path, v);
}

static int set_cache(kw_daemon_opts *o, const char *v)
{
    return set_str(o->cache_dir, sizeof o->cache_dir, v);
}

static int set_jobs(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 256, &n);
    if (rc == 0 && n == 0)
        rc = KW_EINVAL;
    if (rc == 0)
        o->jobs = (unsigned)n;
    return rc;
}

static int set_max_size(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_size(v, &n);
    if (rc == 0 && n < KW_CACHE_MIN_SIZE)
        rc = KW_EINVAL;
    if (rc == 0)
        o->max_size = n;
    return rc;
}

static int set_idle(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 24ull * 3600 * 1000, &n);
    if (rc == 0 && n < 100)
        rc = KW_EINVAL;
    if (rc == 0)
        o->idle_timeout_ms = (unsigned)n;
    return rc;
}

static int set_socket_mode(kw_daemon_opts *o, const char *v)
{
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

static int set_allow_uid(kw_daemon_opts *o, const char *v)
{
    uint64_t id;
    if (o->nallow_uid == KW_DAEMON_MAX_ALLOW || parse_id(v, false, &id) < 0)
        return KW_EINVAL;
    o->allow_uid[o->nallow_uid++] = (uid_t)id;
    return 0;
}

static int set_allow_gid(kw_daemon_opts *o, const char *v)
{
    uint64_t id;
    if (o->nallow_gid == KW_DAEMON_MAX_ALLOW || parse_id(v, true, &id) < 0)
        return KW_EINVAL;
    o->allow_gid[o->nallow_gid++] = (gid_t)id;
    return 0;
}

/* ---- fleet tier (issue 6) ---- */

static int set_remote(kw_daemon_opts *o, const char *v)
{
    kw_remote_addr a;
    if (kw_remote_parse_url(v, &a) < 0)
        return KW_EINVAL;
    return set_str(o->remote_url, sizeof o->remote_url, v);
}

static int set_remote_key(kw_daemon_opts *o, const char *v)
{
    return set_str(o->remote_key_file, sizeof o->remote_key_file, v);
}

/* Milliseconds in [lo, hi] into *dst. */
static int set_ms(unsigned *dst, const char *v, uint64_t lo, uint64_t hi)
{
    uint64_t n;
    int rc = kw_parse_u64(v, hi, &n);
    if (rc == 0 && n < lo)
        rc = KW_EINVAL;
    if (rc == 0)
        *dst = (unsigned)n;
    return rc;
}

static int set_remote_timeout(kw_daemon_opts *o, const char *v)
{
    return set_ms(&o->remote_timeout_ms, v, 10, 60000);
}

static int set_remote_lease(kw_daemon_opts *o, const char *v)
{
    return set_ms(&o->remote_lease_ms, v, 100, 3600 * 1000);
}

static int set_metrics_listen(kw_daemon_opts *o, const char *v)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (kw_daemon_metrics_parse(v, &ss, &len) < 0)
        return KW_EINVAL;
    return set_str(o->metrics_listen, sizeof o->metrics_listen, v);
}

static int set_compile_timeout(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 24 * 3600, &n);
    if (rc == 0 && n == 0)
        rc = KW_EINVAL;
    if (rc == 0)
        o->compile_timeout_ms = (unsigned)(n * 1000);
    return rc;
}

static int set_compile_memory(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_size(v, &n);
    if (rc == 0 && n < (64u << 20))
        rc = KW_EINVAL;
    if (rc == 0)
        o->compile_mem_limit = n;
    return rc;
}

static int set_max_output(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_size(v, &n);
    if (rc == 0 && (n < (64u << 10) || n > (1ull << 34)))
        rc = KW_EINVAL;
    if (rc == 0)
        o->max_output = n;
    return rc;
}

static int set_max_keys(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 1ull << 32, &n);
    if (rc == 0 && n == 0)
        rc = KW_EINVAL;
    if (rc == 0)
        o->max_keys_in_flight = n;
    return rc;
}

static int set_loops(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 64, &n);
    if (rc == 0 && n == 0)
        rc = KW_EINVAL;
    if (rc == 0)
        o->loops = (unsigned)n;
    return rc;
}

static int set_max_held(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 128, &n);
    if (rc == 0)
        o->max_held_reads = (unsigned)n;
    return rc;
}

static int set_held_timeout(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 3600 * 1000, &n);
    if (rc == 0 && n < 10)
        rc = KW_EINVAL;
    if (rc == 0)
        o->held_read_timeout_ms = (unsigned)n;
    return rc;
}

static int set_max_connections(kw_daemon_opts *o, const char *v)
{
    uint64_t n;
    int rc = kw_parse_u64(v, 1000000, &n);
    if (rc == 0 && n == 0)
        rc = KW_EINVAL;
    if (rc == 0)
        o->max_connections = (unsigned)n;
    return rc;
}

/* --deny-root takes no value on the command line; in --config it is
 * "deny-root": true or false (JSON booleans). */
static int set_deny_root(kw_daemon_opts *o, const char *v)
{
    if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
        return KW_EINVAL;
    o->deny_root = v[0] == 't';
    return 0;
}

static int set_read_only(kw_daemon_opts *o, const char *v)
{
    if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
        return KW_EINVAL;
    o->read_only = v[0] == 't';
    return 0;
}

static int set_log_level(kw_daemon_opts *o, const char *v)
{
    int level = kw__log_level_from_name(v);
    if (level < 0)
        return KW_EINVAL;
    o->log_level = level;
    return 0;
}

static int set_compile_helper(kw_daemon_opts *o, const char *v)
{
    return set_str(o->compile_helper, sizeof o->compile_helper, v);
}

/* The JSON types a --config member may have: a string, a number (an
 * integer), either (sizes: 1073741824 or "1G"; ids: 0 or "root"), or a
 * boolean.  {"jobs": "4"} is refused, not read as 4. */
enum { CFG_STR = 1, CFG_NUM = 2, CFG_STR_NUM = 3, CFG_BOOL = 4 };

static const struct option_def {
    const char *name; /* flag without "--"; the --config member name */
    setter set;
    const char *what; /* for messages */
    int json;         /* CFG_*: the member's JSON types */
} options[] = {
    {"socket", set_socket, "a path shorter than 108 bytes", CFG_STR},
    {"cache", set_cache, "a directory path", CFG_STR},
    {"jobs", set_jobs, "an integer in [1, 256]", CFG_NUM},
    {"loops", set_loops, "an integer in [1, 64]", CFG_NUM},
    {"compile-timeout", set_compile_timeout, "seconds in [1, 86400]", CFG_NUM},
    {"compile-memory", set_compile_memory,
     "a size of at least 64M (bytes, or K/M/G)", CFG_STR_NUM},
    {"compile-helper", set_compile_helper, "a file path", CFG_STR},
    {"max-output", set_max_output, "a size in [64K, 16G] (bytes, or K/M/G)",
     CFG_STR_NUM},
    {"max-connections", set_max_connections, "an integer in [1, 1000000]",
     CFG_NUM},
    {"max-keys-in-flight", set_max_keys, "an integer in [1, 4294967296]",
     CFG_NUM},
    {"max-held-reads", set_max_held, "an integer in [0, 128]", CFG_NUM},
    {"held-read-timeout", set_held_timeout, "milliseconds in [10, 3600000]",
     CFG_NUM},
    {"deny-root", set_deny_root, "true or false", CFG_BOOL},
    {"log-level", set_log_level, "error, warn, info or debug", CFG_STR},
    {"read-only", set_read_only, "true or false", CFG_BOOL},
    {"max-size", set_max_size, "a size of at least 1M (bytes, or K/M/G)",
     CFG_STR_NUM},
    {"allow-uid", set_allow_uid, "a uid or user name (at most 32)",
     CFG_STR_NUM},
    {"allow-gid", set_allow_gid, "a gid or group name (at most 32)",
     CFG_STR_NUM},
    {"idle-timeout", set_idle, "milliseconds in [100, 86400000]", CFG_NUM},
    {"socket-mode", set_socket_mode,
     "an octal mode like 0660 with 0600 set (a string)", CFG_STR},
    {"remote", set_remote, "redis://HOST:PORT[/DB] (no password in it)",
     CFG_STR},
    {"remote-key-file", set_remote_key, "a file path", CFG_STR},
    {"remote-timeout", set_remote_timeout, "milliseconds in [10, 60000]",
     CFG_NUM},
    {"remote-lease", set_remote_lease, "milliseconds in [100, 3600000]",
     CFG_NUM},
    {"metrics-listen", set_metrics_listen,
     "A.B.C.D:PORT or [IPV6]:PORT (numeric, PORT 1..65535)", CFG_STR},
};
#define NOPTIONS (sizeof options / sizeof options[0])

static const struct option_def *find_option(const char *name)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return &options[i];
    return NULL;
}

/* Applies one value of a --config member (a string, a number, or an
 * array of them for the repeatable options); where names FILE:LINE. */
static int config_value(kw_daemon_opts *o, const struct option_def *def,
                        const cJSON *v, const char *where)
{
    char num[32];
    const char *text = NULL;
    if (cJSON_IsString(v) && (def->json & CFG_STR))
        text = v->valuestring;
    else if (cJSON_IsBool(v) && def->json == CFG_BOOL)
        text = cJSON_IsTrue(v) ? "true" : "false";
    else if (cJSON_IsNumber(v) && (def->json & CFG_NUM) &&
             v->valuedouble >= 0 &&
             v->valuedouble < 1e15 && v->valuedouble == (double)(int64_t)v->valuedouble) {
        snprintf(num, sizeof num, "%lld", (long long)v->valuedouble);
        text = num;
    }
    if (text == NULL || def->set(o, text) < 0) {
        fprintf(stderr, "kwarmd: %s: /%s: must be %s\n", where, def->name,
                def->what);
        return KW_EINVAL;
    }
    return 0;
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
        const struct option_def *def = find_option(it->string);
        snprintf(where, sizeof where, "%s:%u", path, member_line(buf, it->string));
        if (def == NULL) {
            fprintf(stderr, "kwarmd: %s: /%s: unknown option\n", where, it->string);
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

/* Applies the flags; --config is read first wherever it stands, so flags
 * override the file.  Returns 0, 1 (help/version printed), or -1. */
static int parse_flags(kw_daemon_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc &&
            load_config(o, argv[++i]) < 0)
            return -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("%s", usage);
            return 1;
        }
        if (strcmp(a, "--version") == 0)
            return print_version() == 0 ? 1 : -1;
        if (strcmp(a, "--deny-root") == 0 || strcmp(a, "--read-only") == 0) {
            *(a[2] == 'd' ? &o->deny_root : &o->read_only) = true; /* no value */
            continue;
        }
        const struct option_def *def = strncmp(a, "--", 2) == 0 ? find_option(a + 2) : NULL;
        bool cfg = strcmp(a, "--config") == 0;
        if ((def == NULL && !cfg) || i + 1 >= argc) {
            fprintf(stderr, "kwarmd: %s: %s (see kwarmd --help)\n", a,
                    def || cfg ? "missing value" : "unknown argument");
            return -1;
        }
        i++;
        if (!cfg && def->set(o, argv[i]) < 0) {
            fprintf(stderr, "kwarmd: %s: '%.64s' is not %s\n", a, argv[i], def->what);
            return -1;
        }
    }
    if (o->remote_url[0] != '\0' && o->remote_key_file[0] == '\0') {
        fprintf(stderr, "kwarmd: --remote needs --remote-key-file (the fleet key)\n");
        return -1;
    }
    return 0;
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
        KW_LOG(KW_LOG_ERR, "kwarmd: %s", err[0] ? err : kw_strerror(rc));
        return 1;
    }
    return 0;
}
