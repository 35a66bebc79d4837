/* cli.h: pieces shared by the kwarm CLI's commands (kw__cli_, not API).
 *
 * The CLI is the one place, with daemon/main.c, that prints and decides
 * exit codes: 0 ok, 1 runtime failure, 2 bad input (DESIGN.md).
 */
#ifndef KW_CLI_H
#define KW_CLI_H

#include <stdbool.h>

#include "kw_config.h"
#include "kw_keys.h"

enum { KW_CLI_OK = 0, KW_CLI_RUNTIME = 1, KW_CLI_USAGE = 2 };

/* The model and deployment options every key-deriving command takes. */
typedef struct kw__cli_model {
    const char *model;       /* --model */
    const char *deploy_file; /* --deploy */
    kw_config_deploy dep;    /* flags, then resolved */
    kw_config_model cfg;     /* loaded by kw__cli_model_load() */
} kw__cli_model;

/* Reads the value of the flag at argv[*i] ("--x v" or "--x=v"); advances
 * *i past it.  Prints an error and returns NULL when it is missing. */
const char *kw__cli_value(const char *cmd, int argc, char **argv, int *i);

/* Returns true when argv[i]'s name (before any '=') equals name. */
bool kw__cli_is(const char *arg, const char *name);

/* Initialises a for parsing. */
void kw__cli_model_init(kw__cli_model *a);

/* Consumes argv[*i] when it is --model, --deploy or a deployment flag.
 * Returns 1 when consumed, 0 when it is none of those, or KW_CLI_USAGE
 * negated (-2) after printing the error. */
int kw__cli_model_arg(kw__cli_model *a, const char *cmd, int argc, char **argv,
                      int *i);

/* Loads --deploy, the config and resolves the deployment.  Prints one
 * error line and returns KW_CLI_USAGE on bad input, else KW_CLI_OK. */
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

/* Reads the value of --jobs at argv[*i] into *jobs (1..KW_CLI_MAX_JOBS).
 * Prints the error and returns -1 when it is missing or bad. */
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

/* The commands. */
int kw__cli_keys(int argc, char **argv);
int kw__cli_verify(int argc, char **argv);
int kw__cli_prewarm(int argc, char **argv);
int kw__cli_get(int argc, char **argv);
int kw__cli_stats(int argc, char **argv);

/* The commands that talk to kwarmd (cli_daemon.c).  kw__cli_get and
 * kw__cli_stats hand over to the _socket forms when no --cache is given;
 * those take the same argv (argv[0] is the command name). */
int kw__cli_ping(int argc, char **argv);
int kw__cli_warmup(int argc, char **argv);
int kw__cli_get_socket(int argc, char **argv);
int kw__cli_stats_socket(int argc, char **argv);

#endif /* KW_CLI_H */
