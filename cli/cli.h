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
#include <stdint.h>

#include "kw_config.h"
#include "kw_keys.h"

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

/* Reads the value of the flag at argv[*i] ("--x v" or "--x=v"); advances
 * *i past it.  Prints an error and returns NULL when it is missing. */
const char *kw__cli_value(const char *cmd, int argc, char **argv, int *i);

/* Returns true when argv[i]'s name (before any '=') equals name. */
bool kw__cli_is(const char *arg, const char *name);

/* kwarm get's flags: parsed by one function whether the key is read from
 * a cache directory (--cache, cli_cache.c) or asked of kwarmd (--socket,
 * cli_daemon.c). */
typedef struct kw__cli_get_opts {
    const char *digest, *family, *fields, *arch, *out;
    const char *where;    /* the value of --cache or --socket, or NULL */
    bool no_compile;
} kw__cli_get_opts;

/* Parses get's flags into o (zeroed first).  where_flag is "--cache"
 * (then required) or "--socket" (optional).  Each flag at most once,
 * exactly one way of naming the key, -o checked before any work.  Returns
 * -1 to go on, else an exit code (a message printed). */
int kw__cli_get_parse(kw__cli_get_opts *o, int argc, char **argv,
                      const char *where_flag);

/* Initialises a for parsing. */
void kw__cli_model_init(kw__cli_model *a);

/* Consumes argv[*i] when it is --model, --deploy or a deployment flag.
 * Returns 1 when consumed, 0 when it is none of those, or KW_CLI_USAGE
 * negated (-2) after printing the error. */
int kw__cli_model_arg(kw__cli_model *a, const char *cmd, int argc, char **argv,
                      int *i);

/* Loads --deploy, the config (--model -: read from standard input, which
 * must not be a terminal, into a->text) and resolves the deployment.
 * Prints one error line and returns KW_CLI_USAGE on bad input, else
 * KW_CLI_OK. */
int kw__cli_model_load(kw__cli_model *a, const char *cmd);

/* Frees what a owns. */
void kw__cli_model_destroy(kw__cli_model *a);

/* The help text for the deployment flags, shared by every command. */
extern const char kw__cli_deploy_help[];

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

/* Reads the value of the flag at argv[*i] (its name, before any '=', names
 * it in errors) into *out: an integer in [1, max], described as `what` ("an
 * integer", "a number of seconds").  Prints the error and returns -1 when
 * it is missing or bad. */
int kw__cli_count(const char *cmd, int argc, char **argv, int *i,
                  const char *what, unsigned max, unsigned *out);

/* kw__cli_count() for --jobs: 1..KW_CLI_MAX_JOBS. */
int kw__cli_jobs(const char *cmd, int argc, char **argv, int *i, unsigned *jobs);

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

/* True when argv[1..] holds flag (as "flag" or "flag=..."). */
bool kw__cli_has_flag(int argc, char **argv, const char *flag);

/* True when argv[1..] holds -h or --help. */
bool kw__cli_wants_help(int argc, char **argv);

/* One option of a cache-admin command (kw__cli_parse): a flag that takes
 * a value (value set) or a switch (set set). */
typedef struct kw__cli_opt {
    const char *flag;
    const char **value;
    bool *set;
} kw__cli_opt;

/* Parses argv[1..] against opts; at most one positional argument goes to
 * *pos (pos NULL: none allowed).  -h/--help prints usage.  Returns -1 to go
 * on, else the exit code (after printing the error). */
int kw__cli_parse(const char *cmd, int argc, char **argv,
                  const kw__cli_opt *opts, size_t nopts, const char **pos,
                  const char *usage);

/* Bounds the connect, and every wait of the short requests (ping, stats).
 * Compiling gets and warmups then wait as long as a compile takes. */
#define KW_CLI_TIMEOUT_MS 10000

/* What the kwarmd commands share (cli_daemon.c).  kw__cli_socket_help: the
 * --socket lines of their help.  kw__cli_print_usage: usage, then those
 * lines and -h, then (model) the deployment flags, on stdout; returns
 * KW_CLI_OK.  kw__cli_request_failed: prints the failure rc of a request
 * on c; returns its exit code (2 when kwarmd refused the input).
 * kw__cli_socket_arg: reads --socket's value at argv[*i] into *path; 1
 * when argv[*i] is --socket, 0 when not, -KW_CLI_USAGE after printing. */
struct kw_client;
extern const char kw__cli_socket_help[];
int kw__cli_print_usage(const char *usage, bool model);
int kw__cli_request_failed(const char *cmd, const struct kw_client *c, int rc);
int kw__cli_socket_arg(const char *cmd, int argc, char **argv, int *i,
                       const char **path);

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

/* "did you mean" (cli_suggest.c).  kw__cli_nearest: the candidate of
 * cands[0..n) a few edits from word, or NULL.  kw__cli_unknown: prints
 * "ARG: unknown argument" for cmd, naming the flag of help or more_help
 * (either may be NULL) nearest to arg when one is near; returns
 * KW_CLI_USAGE. */
const char *kw__cli_nearest(const char *word, const char *const *cands,
                            size_t n);
int kw__cli_unknown(const char *cmd, const char *arg, const char *help,
                    const char *more_help);

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
 * kw__cli_stats hand over to the _socket forms when no --cache is given;
 * those take the same argv (argv[0] is the command name). */
int kw__cli_ping(int argc, char **argv);
int kw__cli_warmup(int argc, char **argv);
int kw__cli_get_socket(int argc, char **argv);
int kw__cli_stats_socket(int argc, char **argv);

#endif /* KW_CLI_H */
