/* kw_opt.h: option tables, one per binary or command (issue 24).
 *
 * A table row names an option once: its flag, its type and bounds, the
 * field it sets and its help line.  From the table come the getopt_long
 * parse (kw_opt_next), the value check and the message saying what a
 * value must be (kw_opt_set, kw_opt_describe: the bounds are written
 * nowhere else), and the --help lines (kw_opt_help), from which the build
 * generates the man pages and bash completion (cli/doc/gen-cli-docs.sh).
 *
 * Nothing here prints except kw_opt_help, onto the FILE it is given; the
 * caller words and prints errors and decides the exit code.
 */
#ifndef KW_OPT_H
#define KW_OPT_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum kw_opt_type {
    KW_OPT_SWITCH, /* no value on a command line (sets a bool); in a
                      config file a JSON true or false */
    KW_OPT_UINT,   /* a decimal integer in [min, max], times scale */
    KW_OPT_SIZE,   /* bytes, or K/M/G/T (powers of 1024), in [min, max] */
    KW_OPT_STR,    /* non-empty text shorter than the field (a char[]) */
    KW_OPT_FUNC,   /* checked and stored by the row's set() */
    KW_OPT_TEXT,   /* any text, stored as a const char * into argv (or
                      handed over, offset unused, when size is 0) */
} kw_opt_type;

/* JSON types a config member may have (KW_OPT_FUNC rows say theirs). */
enum { KW_OPT_JSTR = 1, KW_OPT_JNUM = 2, KW_OPT_JBOOL = 4 };

typedef struct kw_opt {
    const char *name;  /* "jobs": the flag --jobs and the config member */
    char short_name;   /* 'o' for -o, else 0 */
    kw_opt_type type;
    const char *arg;   /* the value in --help ("N", "PATH"); NULL: none */
    const char *unit;  /* UINT: "milliseconds"; NULL: "an integer" */
    uint64_t min, max; /* UINT and SIZE bounds, both included */
    uint64_t scale;    /* UINT: the field holds value * scale (0: 1) */
    size_t off, size;  /* the field: offsetof and sizeof (a bool, an
                          unsigned, a uint64_t or a char[]) */
    int (*set)(void *opts, const char *v); /* FUNC: 0 or KW_EINVAL */
    const char *what;  /* FUNC: what a value must be, for messages */
    unsigned json;     /* FUNC: KW_OPT_J* it accepts in a config */
    const char *help;  /* the help text; '\n' starts a continuation line */
} kw_opt;

/* Checks v against o and stores it into the field of opts.  v is "true"
 * or "false" for a switch.  Returns 0 or KW_EINVAL (field untouched). */
int kw_opt_set(const kw_opt *o, void *opts, const char *v);

/* Writes what a value of o must be ("an integer in [1, 256]", "a size in
 * [64K, 16G] (bytes, or K/M/G)") into buf: the one place bounds are
 * worded. */
void kw_opt_describe(const kw_opt *o, char *buf, size_t cap);

/* The JSON types o's config member accepts (KW_OPT_J*). */
unsigned kw_opt_json_types(const kw_opt *o);

/* The row of t[0..n) whose name is name (without "--"), or NULL. */
const kw_opt *kw_opt_find(const kw_opt *t, size_t n, const char *name);

/* Prints t's help lines onto out: "  -o, --name ARG" padded to column col,
 * then the help text, its continuation lines indented to col. */
void kw_opt_help(FILE *out, const kw_opt *t, size_t n, int col);

/* "did you mean": the candidate of cands[0..n) a few edits (insert,
 * delete, substitute, swap two neighbours) from word, or NULL when none is
 * near enough to be a likely typo. */
const char *kw_opt_nearest(const char *word, const char *const *cands,
                           size_t n);

/* The most rows one parse takes (the tables of a command together). */
#define KW_OPT_MAX 64

/* What kw_opt_next returns besides a row's index. */
enum {
    KW_OPT_END = -1,        /* no more arguments */
    KW_OPT_POSITIONAL = -2, /* *value: a positional argument */
    KW_OPT_UNKNOWN = -3,    /* bad: a flag no row names (abbreviations
                               included: a flag is spelled out) */
    KW_OPT_MISSING = -4,    /* bad: a flag whose value is missing */
    KW_OPT_NOVALUE = -5,    /* bad: a switch given "=VALUE" */
};

/* One getopt_long pass over argv.  getopt's state is global, so one
 * parser runs at a time, on the main thread. */
typedef struct kw_opt_parser {
    const kw_opt *t;
    size_t n;
    int argc;
    char **argv;
    struct option longs[KW_OPT_MAX + 1];
    char shorts[3 * KW_OPT_MAX + 4];
    char bad_buf[4];
    int rest;        /* > 0 once getopt is done: the next argv */
    const char *bad; /* the argument at fault after an error */
} kw_opt_parser;

/* Starts a pass over argv[1..argc) against t[0..n) (n <= KW_OPT_MAX).
 * Options and positional arguments come back in their order; "--" ends
 * the options.  Returns 0 or KW_EINVAL (table too large). */
int kw_opt_parser_init(kw_opt_parser *p, const kw_opt *t, size_t n, int argc,
                       char **argv);

/* The next argument: a row's index with *value its value (NULL for a
 * switch), or KW_OPT_END, KW_OPT_POSITIONAL or an error (p->bad set). */
int kw_opt_next(kw_opt_parser *p, const char **value);

#endif /* KW_OPT_H */
