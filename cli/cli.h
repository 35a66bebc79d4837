/* cli.h: pieces shared by the kwarm CLI's commands (kw__cli_, not API).
 *
 * The CLI is the one place, with daemon/main.c, that prints and decides
 * exit codes: 0 ok, 1 runtime failure, 2 bad input (docs/design.md).
 */
#ifndef KW_CLI_H
#define KW_CLI_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kw_config.h"
#include "kw_keys.h"
#include "kw_opt.h"

enum { KW_CLI_OK = 0, KW_CLI_RUNTIME = 1, KW_CLI_USAGE = 2 };

/* The model and deployment options every key-deriving command takes. */
typedef struct kw__cli_model {
    const char *model;       /* --model ("-": standard input) */
    char *text;              /* the config read from standard input, or
                                NULL (owned; NUL-terminated) */
    size_t text_len;
    const char *deploy_file; /* --deploy */
    kw_config_deploy dep;    /* flags, then resolved */
    kw_config_model cfg;     /* loaded by kw__cli_model_load() */
} kw__cli_model;

/* kwarm get's flags: parsed by one table whether the key is read from a
 * cache directory (--cache, cli_cache.c) or asked of kwarmd (--socket or
 * neither, cli_daemon.c). */
typedef struct kw__cli_get_opts {
    const char *digest, *family, *fields, *arch, *out;
    const char *cache, *socket;
    const char *where;    /* cache or socket (NULL: the default socket) */
    bool no_compile;
} kw__cli_get_opts;

/* Parses get's flags into o (zeroed first): each flag at most once,
 * --cache or --socket, exactly one way of naming the key, -o checked
 * before any work.  Returns -1 to go on, else an exit code (a message
 * printed, or --help). */
int kw__cli_get_parse(kw__cli_get_opts *o, int argc, char **argv);

/* kwarm stats' flags (cli_cache.c's table). */
typedef struct kw__cli_stats_opts {
    const char *cache, *socket;
    bool json, prometheus;
} kw__cli_stats_opts;

/* A command's option table (cli_opt.c): parsing, --help, and through
 * --help the man page and completion.  usage: the text before the option
 * lines ("usage: ...", what the command does, a blank line); opts: the
 * command's own rows (-h/--help is added); model: takes --model, --deploy
 * and the deployment flags; tail: text after the options, or NULL. */
typedef struct kw__cli_cmd {
    const char *name;
    const char *usage;
    const kw_opt *opts;
    size_t nopts;
    bool model;
    const char *tail;
} kw__cli_cmd;

/* Parses argv[1..] (getopt_long) against cmd's rows, storing each value
 * into its field of opts and the model group into m (NULL when
 * !cmd->model); up to npos positional arguments go to pos[].  A flag is
 * spelled out, given at most once (switches aside), and its value checked
 * against its row.  Returns -1 to go on, else the exit code: 0 after
 * --help, 2 after printing the error (with the nearest flag for a typo).
 * Uses getopt's global state: main thread only. */
int kw__cli_getopt(const kw__cli_cmd *cmd, int argc, char **argv, void *opts,
                   kw__cli_model *m, const char **pos, size_t npos);

/* The --socket row of the commands that talk to kwarmd: a const char *
 * field of the command's options struct. */
#define KW__CLI_SOCKET_ROW(T, field)                                      \
    {.name = "socket", .type = KW_OPT_TEXT, .arg = "PATH",                  \
     .off = offsetof(T, field), .size = sizeof(const char *),            \
     .help = "kwarmd's socket ($KWARM_SOCKET, else\n"                      \
             "$XDG_RUNTIME_DIR/kwarm.sock, or\n"                           \
             "/run/kwarm/kwarm.sock for root)"}

/* A switch row and a text row (a const char * field) of struct T. */
#define KW__CLI_SWITCH(T, field, flag, text)                              \
    {.name = flag, .type = KW_OPT_SWITCH, .off = offsetof(T, field),     \
     .size = sizeof(bool), .help = text}
#define KW__CLI_TEXT(T, field, flag, argname, text)                       \
    {.name = flag, .type = KW_OPT_TEXT, .arg = argname,                     \
     .off = offsetof(T, field), .size = sizeof(const char *), .help = text}

/* --jobs N: compile threads, 1..KW_CLI_MAX_JOBS, into an unsigned. */
#define KW__CLI_JOBS(T, field, text)                                         \
    {.name = "jobs", .type = KW_OPT_UINT, .arg = "N", .min = 1,             \
     .max = KW_CLI_MAX_JOBS, .off = offsetof(T, field),                     \
     .size = sizeof(unsigned), .help = text}

/* The .opts and .nopts of a kw__cli_cmd from a static array of rows. */
#define KW__CLI_ROWS(rows) .opts = rows, .nopts = sizeof rows / sizeof rows[0]

/* Prints cmd's --help from its rows on stdout; returns KW_CLI_OK. */
int kw__cli_help(const kw__cli_cmd *cmd);

/* Initialises a for parsing. */
void kw__cli_model_init(kw__cli_model *a);

/* Loads --deploy, the config (--model -: read from standard input, which
 * must not be a terminal, into a->text) and resolves the deployment.
 * Prints one error line and returns KW_CLI_USAGE on bad input, else
 * KW_CLI_OK. */
int kw__cli_model_load(kw__cli_model *a, const char *cmd);

/* Frees what a owns. */
void kw__cli_model_destroy(kw__cli_model *a);

/* Prints "kwarm CMD: MESSAGE" to stderr. */
void kw__cli_err(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Most compile threads a command starts. */
#define KW_CLI_MAX_JOBS 256

/* Called on a worker thread right after key i compiled (rc[i] set). */
typedef void (*kw__cli_done_fn)(size_t i, void *arg);

/* Compiles keys[0..n) on `jobs` threads into res[i] / rc[i] (kw_keys_
 * compile's code), calling done_fn (may be NULL) after each, and drawing a
 * progress bar labelled label on stderr when it is a terminal.  Every res[i]
 * is the caller's to destroy (destroying it in done_fn is fine).  Returns
 * 0. */
int kw__cli_compile_all(const kw_keys_key *keys, size_t n, unsigned jobs,
                        kw_jit_result *res, int *rc, const char *label,
                        kw__cli_done_fn done_fn, void *arg);

/* The online processors, capped at KW_CLI_MAX_JOBS: the --jobs default. */
unsigned kw__cli_default_jobs(void);

/* Derives the keys of a loaded model; prints the error and returns an exit
 * code on failure, KW_CLI_OK on success. */
int kw__cli_derive(kw__cli_model *a, const char *cmd, kw_keys_set *set);

/* Prints cache statistics as "name value" lines, or one JSON object. */
struct kw_cache_stats;
void kw__cli_print_stats(const struct kw_cache_stats *st, const char *dir,
                         bool json);

/* Progress of a long command (cli_warm.c): a bar on a terminal, else a
 * line at most every KW__CLI_PROGRESS_S seconds; nothing when quiet.
 * Each shows the keys settled so far by result (t, NULL: none yet), the
 * time since kw__cli_progress_init() and an estimate of the time left. */
#define KW__CLI_PROGRESS_S 2.0
typedef struct kw__cli_progress {
    const char *label;
    bool tty, quiet;
    double start, last; /* monotonic: started, and the last line printed */
} kw__cli_progress;
typedef struct kw__cli_tally {
    size_t hits, compiled, failed, cancelled; /* hits: remote ones too */
} kw__cli_tally;
void kw__cli_progress_init(kw__cli_progress *p, const char *label, bool quiet);
void kw__cli_progress_show(kw__cli_progress *p, size_t done, size_t n,
                           const kw__cli_tally *t);

/* Ctrl-C and SIGTERM during a long command (cli_interrupt.c).  start
 * blocks both in the calling thread (threads started after inherit it)
 * and starts a thread that takes the first one: it records it and calls
 * the stop armed with arm (stop(arg), at once when the signal came before
 * arm; NULL disarms); a second signal then kills the process.  stop ends
 * the thread, restores the mask and returns the signal caught, or 0.
 * start returns 0 or -1 (then nothing is caught). */
typedef struct kw__cli_interrupt {
    pthread_t thread;
    bool started;
    sigset_t old;
    pthread_mutex_t mu; /* guards sig, stop, arg */
    int sig;
    void (*stop)(void *);
    void *arg;
} kw__cli_interrupt;
int kw__cli_interrupt_start(kw__cli_interrupt *in);
void kw__cli_interrupt_arm(kw__cli_interrupt *in, void (*stop)(void *),
                           void *arg);
int kw__cli_interrupt_stop(kw__cli_interrupt *in);

/* Prints one failed key: "kwarm CMD: FAMILY ARCH DIGEST16 failed: ERROR",
 * then its NVRTC log (may be NULL) as is. */
void kw__cli_print_failure(const char *cmd, const char *family,
                           const char *arch, const char *hex, const char *error,
                           const char *log);

/* Writes len bytes to path through a temporary file and rename(), so a
 * reader never sees half a cubin.  Returns 0 or -errno. */
int kw__cli_write_atomic(const char *path, const void *data, size_t len);

/* `-o PATH` of kwarm get (cli_output.c).  A regular or absent PATH is
 * written atomically; a character device or FIFO in place; "-" is stdout,
 * refused when it is a terminal; a directory is refused.
 * kw__cli_output_check() checks PATH before any work: prints the refusal
 * and returns its exit code, else -1.  kw__cli_put_cubin() writes the
 * cubin and prints the summary line (on stderr when the cubin went to
 * stdout); returns an exit code. */
int kw__cli_output_check(const char *cmd, const char *path);
int kw__cli_put_cubin(const char *cmd, const char *path, const void *data,
                      size_t len, const char *family, const char *arch,
                      const char *entry);

/* How a --cache command opens the directory (kw__cli_cache_open). */
typedef enum kw__cli_access {
    KW_CLI_READ,       /* never writes: works on a cache it cannot write */
    KW_CLI_READ_WRITE, /* records hits, compiles misses; read-only when the
                          directory cannot be written (auto_read_only) */
    KW_CLI_WRITE,      /* must write (evict, unpin, resize) */
} kw__cli_access;

/* Opens an existing cache directory for cmd.  Prints the error and
 * returns its exit code (2: no such directory, 1: cannot open), else
 * KW_CLI_OK with *c set. */
struct kw_cache;
int kw__cli_cache_open(const char *cmd, const char *dir, kw__cli_access how,
                       struct kw_cache **c);

/* Resolves a --digest value: 64 hex digits as they are, or a unique
 * prefix of at least 8 found in c (c may be NULL: then only 64 digits).
 * Returns -1 with out set, else the exit code after printing why: 2 for a
 * value that is not hex or an ambiguous prefix (the candidates follow the
 * error line, one per line), 1 when no cached digest starts with it. */
int kw__cli_digest_resolve(const char *cmd, struct kw_cache *c,
                           const char *hex, uint8_t out[32]);

/* Bounds the connect, and every wait of the short requests (ping, stats).
 * Compiling gets and warmups then wait as long as a compile takes. */
#define KW_CLI_TIMEOUT_MS 10000

/* Prints the failure rc of a request on c (cli_daemon.c); returns its
 * exit code (2 when kwarmd refused the input). */
struct kw_client;
int kw__cli_request_failed(const char *cmd, const struct kw_client *c, int rc);

/* Connects to kwarmd at path (NULL: the default socket) for cmd.  Prints
 * why not, saying "not a socket" for a path that is something else (exit
 * 2) and how to start kwarmd when nothing listens there (exit 1); returns
 * the exit code, else KW_CLI_OK with *c set (the caller closes it). */
int kw__cli_connect(const char *cmd, const char *path, int timeout_ms,
                    struct kw_client **c);

/* Sends the admin request `request` (ls, evict, pins, unpin, resize)
 * with header to kwarmd at sock (NULL: the default socket) and returns its
 * reply document in *doc (the caller's).  Prints why on failure.  Returns
 * an exit code. */
struct cJSON;
int kw__cli_via_daemon(const char *cmd, const char *sock, const char *request,
                       const struct cJSON *header, struct cJSON **doc);

/* Printing the documents of ls, evict, pins, unpin and resize.  Each takes
 * the JSON a kwarmd request of that name returns (--json prints it as it
 * is), so --cache and --socket print alike. */
struct cJSON;
void kw__cli_print_json(const struct cJSON *doc);
void kw__cli_print_ls(const struct cJSON *doc, bool json);
void kw__cli_print_evict(const struct cJSON *doc, bool json);
void kw__cli_print_pins(const struct cJSON *doc, bool json);
void kw__cli_print_unpin(const struct cJSON *doc, bool json);
void kw__cli_print_resize(const struct cJSON *doc, const char *where, bool json);

/* Unix seconds as local "YYYY-MM-DD HH:MM" ("-" for 0), bytes as "13.7K",
 * and member name of obj as a count (0 when missing or not a number). */
void kw__cli_time(uint64_t t, char *buf, size_t cap);
void kw__cli_size(uint64_t n, char *buf, size_t cap);
uint64_t kw__cli_u64(const struct cJSON *obj, const char *name);

/* Parses an age such as "90s", "30m", "1h", "7d" or "2w" into seconds;
 * -1 when it is not one (cli_ls.c). */
int64_t kw__cli_age(const char *s);

/* Input refused before any work (cli_check.c).  Each prints one line
 * naming the flag, field or arch and what is allowed and returns
 * KW_CLI_USAGE, else -1.  kw__cli_pin_check: a --pin name (NULL: none
 * given, fine).  kw__cli_arch_check: every --arch of d against the archs
 * the linked NVRTC builds (kw__cli_arch_one: one arch).  kw__cli_fields_check: a key's fields
 * (kw_launch_nfields(fam) values) against launch/'s rules, naming the
 * first field out of its range. */
int kw__cli_pin_check(const char *cmd, const char *pin);
int kw__cli_arch_check(const char *cmd, const kw_config_deploy *d);
int kw__cli_arch_one(const char *cmd, const char *arch);
int kw__cli_fields_check(const char *cmd, int fam, const int64_t *fields);


/* The commands. */
int kw__cli_keys(int argc, char **argv);
int kw__cli_diff(int argc, char **argv);
int kw__cli_misses(int argc, char **argv);
int kw__cli_verify(int argc, char **argv);
int kw__cli_prewarm(int argc, char **argv);
int kw__cli_get(int argc, char **argv);
int kw__cli_stats(int argc, char **argv);
int kw__cli_ls(int argc, char **argv);
int kw__cli_evict(int argc, char **argv);
int kw__cli_pins(int argc, char **argv);
int kw__cli_unpin(int argc, char **argv);
int kw__cli_resize(int argc, char **argv);

/* The commands that talk to kwarmd (cli_daemon.c, cli_warmup.c).  kw__cli_get and
 * kw__cli_stats hand over to the _socket forms, with the options they
 * parsed, when no --cache is given. */
int kw__cli_ping(int argc, char **argv);
int kw__cli_warmup(int argc, char **argv);
int kw__cli_get_socket(const kw__cli_get_opts *o);
int kw__cli_stats_socket(const kw__cli_stats_opts *o);

#endif /* KW_CLI_H */
