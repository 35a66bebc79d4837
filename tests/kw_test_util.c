/* kw_test_util.c: generic helpers shared by every criterion suite. */
#define _XOPEN_SOURCE 700 /* nftw() is XSI */
#include "kw_test_util.h"

#include <ctype.h>
#include <elf.h>
#include <errno.h>
#include <ftw.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

char *kw_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        char *p = realloc(buf, cap * 2);
        if (!p) {
            free(buf);
            errno = ENOMEM;
        }
        buf = p;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
        errno = EIO;
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* A growing NUL-terminated capture buffer for one pipe. */
typedef struct capture {
    int fd; /* read end, -1 once at EOF */
    char *buf;
    size_t len, cap;
} capture;

/* Reads what is available on c->fd into c->buf; closes fd at EOF or error.
 * Returns -1 when memory runs out. */
static int capture_read(capture *c)
{
    if (c->cap - c->len < 4096) {
        size_t ncap = c->cap ? c->cap * 2 : 8192;
        char *p = realloc(c->buf, ncap);
        if (!p)
            return -1;
        c->buf = p;
        c->cap = ncap;
        c->buf[c->len] = '\0'; /* an empty stream reads as "" */
    }
    ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len - 1);
    if (n < 0 && errno == EINTR)
        return 0;
    if (n <= 0) {
        close(c->fd);
        c->fd = -1;
        return 0;
    }
    c->len += (size_t)n;
    c->buf[c->len] = '\0';
    return 0;
}

/* Drains both pipes until EOF on each, with poll so that neither fills up
 * while the child blocks writing to the other. */
static int capture_both(capture *c)
{
    while (c[0].fd >= 0 || c[1].fd >= 0) {
        struct pollfd p[2] = {{c[0].fd, POLLIN, 0}, {c[1].fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        for (int i = 0; i < 2; i++) {
            if (p[i].revents && capture_read(&c[i]) < 0)
                return -1;
        }
    }
    return 0;
}

/* Hands a capture's text to *dst (an empty string when nothing came), or
 * frees it when dst is NULL. */
static void capture_give(capture *c, char **dst)
{
    if (c->fd >= 0)
        close(c->fd);
    if (!dst) {
        free(c->buf);
        return;
    }
    *dst = c->buf ? c->buf : calloc(1, 1);
}

/* Marks both ends of a pipe close-on-exec, so that a child spawned by
 * another thread at the same time does not hold them open (dup2 in the
 * child clears the flag on fds 1 and 2).  Returns 0 or -1 (errno set). */
static int cloexec(const int p[2])
{
    for (int i = 0; i < 2; i++) {
        if (fcntl(p[i], F_SETFD, FD_CLOEXEC) < 0)
            return -1;
    }
    return 0;
}

/* Starts argv with stdout/stderr on the write ends of the two pipes. */
static int spawn(const char *const argv[], int pout[2], int perr[2],
                 pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc)
        return rc;
    if (!(rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null",
                                                O_RDONLY, 0)) &&
        !(rc = posix_spawn_file_actions_adddup2(&fa, pout[1], 1)) &&
        !(rc = posix_spawn_file_actions_adddup2(&fa, perr[1], 2)))
        rc = posix_spawnp(pid, argv[0], &fa, NULL, (char *const *)argv,
                          environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

int kw_test_run(const char *const argv[], char **out, char **err)
{
    int pout[2] = {-1, -1}, perr[2] = {-1, -1};
    capture c[2] = {{-1, NULL, 0, 0}, {-1, NULL, 0, 0}};
    pid_t pid = -1;
    int rc = 0, status = -1;
    if (pipe(pout) < 0 || pipe(perr) < 0 || cloexec(pout) || cloexec(perr))
        rc = errno;
    else
        rc = spawn(argv, pout, perr, &pid);
    for (int i = 0; i < 2; i++) {
        int *p = i ? perr : pout;
        if (p[1] >= 0)
            close(p[1]);
        c[i].fd = p[0];
    }
    if (rc == 0 && capture_both(c) < 0)
        rc = ENOMEM;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    capture_give(&c[0], out);
    capture_give(&c[1], err);
    if (rc && err && *err) {
        char msg[256];
        snprintf(msg, sizeof(msg), "kw_test_run: %s: %s\n",
                 argv[0], strerror(rc));
        free(*err);
        *err = strdup(msg);
    }
    if (rc || pid <= 0 || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

int kw_test_kwarm(const char *const *args, char **out, char **err)
{
    const char *argv[32] = {KW_KWARM_BIN};
    size_t n = 1;
    for (; args[n - 1] != NULL && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    return kw_test_run(argv, out, err);
}

static void *proc_main(void *arg)
{
    kw_test_proc *p = arg;
    p->status = kw_test_run(p->argv, &p->out, &p->err);
    return NULL;
}

int kw_test_spawn(const char *const argv[], kw_test_proc *p)
{
    memset(p, 0, sizeof *p);
    p->argv = argv;
    return pthread_create(&p->thread, NULL, proc_main, p) == 0 ? 0 : -1;
}

int kw_test_wait(kw_test_proc *p, char **out, char **err)
{
    pthread_join(p->thread, NULL);
    *out = p->out ? p->out : strdup("");
    *err = p->err ? p->err : strdup("");
    return p->status;
}

/* Copies the ELF header out of buf when it is a 64-bit little-endian ELF
 * whose header fits; false otherwise.  memcpy avoids unaligned reads. */
static bool elf_header(const uint8_t *buf, size_t len, Elf64_Ehdr *eh)
{
    if (!buf || len < sizeof(*eh))
        return false;
    memcpy(eh, buf, sizeof(*eh));
    return memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
           eh->e_ident[EI_CLASS] == ELFCLASS64 &&
           eh->e_ident[EI_DATA] == ELFDATA2LSB;
}

int kw_test_elf_machine(const uint8_t *buf, size_t len)
{
    Elf64_Ehdr eh;
    return elf_header(buf, len, &eh) ? (int)eh.e_machine : -1;
}

/* True when [off, off + size) lies inside a buffer of len bytes. */
static bool in_bounds(uint64_t off, uint64_t size, size_t len)
{
    return off <= len && size <= len - off;
}

/* Copies section header i into *sh, bounds-checked. */
static bool elf_section(const uint8_t *buf, size_t len, const Elf64_Ehdr *eh,
                        size_t i, Elf64_Shdr *sh)
{
    if (eh->e_shentsize != sizeof(*sh) || i >= eh->e_shnum)
        return false;
    uint64_t off = eh->e_shoff + (uint64_t)i * sizeof(*sh);
    if (off < eh->e_shoff || !in_bounds(off, sizeof(*sh), len))
        return false;
    memcpy(sh, buf + off, sizeof(*sh));
    return true;
}

/* Searches the symbols of symbol table `symtab` for name, resolving names
 * through its linked string table. */
static bool symtab_has(const uint8_t *buf, size_t len, const Elf64_Ehdr *eh,
                       const Elf64_Shdr *symtab, const char *name)
{
    Elf64_Shdr strtab;
    if (!elf_section(buf, len, eh, symtab->sh_link, &strtab) ||
        strtab.sh_type != SHT_STRTAB ||
        !in_bounds(strtab.sh_offset, strtab.sh_size, len) ||
        !in_bounds(symtab->sh_offset, symtab->sh_size, len))
        return false;
    const char *str = (const char *)buf + strtab.sh_offset;
    size_t nlen = strlen(name);
    size_t nsym = symtab->sh_size / sizeof(Elf64_Sym);
    for (size_t i = 0; i < nsym; i++) {
        Elf64_Sym sym;
        memcpy(&sym, buf + symtab->sh_offset + i * sizeof(sym), sizeof(sym));
        /* the name and its NUL must both lie inside the string table */
        if (sym.st_name < strtab.sh_size &&
            nlen < strtab.sh_size - sym.st_name &&
            memcmp(str + sym.st_name, name, nlen + 1) == 0)
            return true;
    }
    return false;
}

bool kw_test_elf_has_symbol(const uint8_t *buf, size_t len, const char *name)
{
    Elf64_Ehdr eh;
    if (!name || !elf_header(buf, len, &eh))
        return false;
    const uint32_t types[2] = {SHT_SYMTAB, SHT_DYNSYM};
    for (int t = 0; t < 2; t++) {
        for (size_t i = 0; i < eh.e_shnum; i++) {
            Elf64_Shdr sh;
            if (!elf_section(buf, len, &eh, i, &sh))
                return false;
            if (sh.sh_type == types[t] &&
                symtab_has(buf, len, &eh, &sh, name))
                return true;
        }
    }
    return false;
}

int kw_test_mkdtemp(char *buf, size_t cap, const char *tag)
{
    if (snprintf(buf, cap, "/tmp/kw-test-%s-XXXXXX", tag) >= (int)cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(buf) != NULL ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

void kw_test_rmtree(const char *dir)
{
    if (dir != NULL && dir[0] != '\0')
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int kw_test_write_file(const char *dir, const char *name, const void *data,
                       size_t len, char *path, size_t cap)
{
    if (snprintf(path, cap, "%s/%s", dir, name) >= (int)cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t n = fwrite(data, 1, len, f);
    return fclose(f) == 0 && n == len ? 0 : -1;
}

/* Copies the file at from to to, mode 0755 (whatever the umask). */
static int copy_exe(const char *from, const char *to)
{
    size_t len = 0;
    char *buf = kw_test_read_file(from, &len);
    if (buf == NULL)
        return -1;
    int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
    bool ok = fd >= 0 && write(fd, buf, len) == (ssize_t)len;
    ok = fd >= 0 && close(fd) == 0 && ok;
    free(buf);
    return ok && chmod(to, 0755) == 0 ? 0 : -1;
}

int kw_test_stage_kwarmd(const char *dir, char *out, size_t cap)
{
    char bin[PATH_MAX], helper[PATH_MAX + 16];
    if (snprintf(bin, sizeof bin, "%s/bin", dir) >= (int)sizeof bin ||
        snprintf(out, cap, "%s/kwarmd", bin) >= (int)cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(helper, sizeof helper, "%s/kwarm-compile", bin);
    if ((mkdir(bin, 0755) < 0 && errno != EEXIST) || chmod(bin, 0755) < 0)
        return -1;
    return copy_exe(KW_KWARMD_BIN, out) < 0 ||
                   copy_exe(KW_COMPILE_HELPER_BIN, helper) < 0 ? -1 : 0;
}

bool kw_test_names_pointer(const char *err, const char *ptr)
{
    size_t n = strlen(ptr);
    for (const char *p = strstr(err, ptr); p; p = strstr(p + 1, ptr)) {
        bool start = p == err || strchr(" '\"`:(=", p[-1]) != NULL;
        char c = p[n];
        bool end = !(isalnum((unsigned char)c) || c == '_' || c == '/' ||
                     c == '~');
        if (start && end)
            return true;
    }
    return false;
}
