/* kw_test_util.h: generic helpers shared by every criterion suite.
 *
 * Linked into each tests/test_*.c executable.  Keep it generic: files,
 * subprocesses, binary formats; nothing that knows one module's internals.
 */
#ifndef KW_TEST_UTIL_H
#define KW_TEST_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reads a whole file into a new NUL-terminated buffer (free() it) and stores
 * its size, without the NUL, in *len when len is not NULL.  Returns NULL when
 * the file cannot be read or memory runs out (errno says which). */
char *kw_test_read_file(const char *path, size_t *len);

/* Runs argv[0] (looked up in PATH when it has no '/') with argv, stdin from
 * /dev/null and the current environment, and waits for it.  Its stdout and
 * stderr are captured into new NUL-terminated strings stored in *out and
 * *err (free() them); either pointer may be NULL to discard that stream.
 * Returns the exit status (0..255), or -1 when the program was killed by a
 * signal or could not be started (*err then says why). */
int kw_test_run(const char *const argv[], char **out, char **err);

/* Runs the kwarm built beside the tests (KW_KWARM_BIN) with args (after
 * argv[0], NULL-terminated, at most 30); as kw_test_run(). */
int kw_test_kwarm(const char *const *args, char **out, char **err);

/* kw_test_run() in a background thread: start it, do other things, then
 * collect its exit status, stdout and stderr with kw_test_wait().  argv
 * must stay valid until then. */
typedef struct kw_test_proc {
    pthread_t thread;
    const char *const *argv;
    char *out, *err;
    int status;
} kw_test_proc;
int kw_test_spawn(const char *const argv[], kw_test_proc *p);
int kw_test_wait(kw_test_proc *p, char **out, char **err);

/* The e_machine of a 64-bit little-endian ELF image (190 is EM_CUDA), or -1
 * when buf is not one or its header is truncated. */
int kw_test_elf_machine(const uint8_t *buf, size_t len);

/* True when the 64-bit ELF image has a symbol called name in a symbol table
 * (SHT_SYMTAB, else SHT_DYNSYM) whose string table is the section named by
 * the symbol table's sh_link.  Every offset is bounds-checked, so a truncated
 * or corrupt image gives false, never a read out of bounds. */
bool kw_test_elf_has_symbol(const uint8_t *buf, size_t len, const char *name);

/* Makes a fresh directory /tmp/kw-test-TAG-XXXXXX, its path in buf (cap
 * bytes).  Returns 0, or -1 with errno set. */
int kw_test_mkdtemp(char *buf, size_t cap, const char *tag);

/* Removes dir and everything under it; a missing dir is fine. */
void kw_test_rmtree(const char *dir);

/* Writes len bytes of data to dir/name, its path in path (cap bytes).
 * Returns 0, or -1 with errno set. */
int kw_test_write_file(const char *dir, const char *name, const void *data,
                       size_t len, char *path, size_t cap);

/* Copies the kwarmd and kwarm-compile just built into dir/bin (made mode
 * 0755, files 0755), the kwarmd path in out (cap bytes), for a test that
 * runs kwarmd as another user: the build tree may lie under a directory
 * that user cannot enter (root's 0700 home), and kwarmd finds its worker
 * beside itself.  dir must be reachable by that user.  Returns 0, or -1
 * with errno set. */
int kw_test_stage_kwarmd(const char *dir, char *out, size_t cap);

/* True when err names the JSON pointer ptr as a whole, not as a piece of a
 * longer pointer ("/index_topk" must not match "/text_config/index_topk"). */
bool kw_test_names_pointer(const char *err, const char *ptr);

#endif /* KW_TEST_UTIL_H */
