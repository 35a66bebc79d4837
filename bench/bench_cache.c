/* bench_cache.c: what a cache hit costs, beside what it replaces.
 *
 * usage: bench_cache [--model CONFIG] [--iters N] [--json FILE]
 *
 * Compiles the keys of the model (default DeepSeek-V4-Flash, W = 2: every
 * family) once, stores the cubins in a fresh LMDB cache and in a
 * one-file-per-entry directory (a .cubin plus a .json of metadata per
 * entry, as Triton's and FlashInfer's caches keep them), then times, in
 * one run and on the same cubins, round-robin:
 *   - kwarm hit: kw_cache_get_into (read transaction, copy, XXH3 check);
 *   - file-per-entry hit: open/read/close of the .json and the .cubin;
 *   - memcpy of the same bytes from memory (the floor);
 * beside the compile time of each key (the miss).
 */
#define _XOPEN_SOURCE 700 /* nftw() is XSI */
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "bench_util.h"

typedef struct blob {
    uint8_t digest[KW_KEYS_DIGEST_LEN];
    void *data;
    size_t len;
    double compile_s;
    char path[512], meta[512];
} blob;

/* p-th percentile (0..100) of n sorted samples. */
static double pct(const double *s, size_t n, double p)
{
    size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return s[i < n ? i : n - 1];
}

/* Writes one file; returns 0 or -1. */
static int put_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t n = fwrite(data, 1, len, f);
    return fclose(f) == 0 && n == len ? 0 : -1;
}

/* Compiles every key and stores it in both caches under dir. */
static int populate(const kw_keys_set *set, const char *dir, kw_cache *c,
                    blob *b)
{
    for (size_t i = 0; i < set->nkeys; i++) {
        kw_jit_result r;
        kw_cache_info info = {0};
        bool stored;
        char hex[KW_KEYS_HEX_LEN], meta[256];
        if (kw_keys_compile(&set->keys[i], false, &r) < 0)
            return -1;
        memcpy(b[i].digest, set->keys[i].digest, sizeof b[i].digest);
        b[i].data = r.cubin;
        b[i].len = r.cubin_len;
        b[i].compile_s = r.seconds;
        r.cubin = NULL;
        snprintf(info.entry, sizeof info.entry, "%s", r.lowered_name);
        kw_keys_hex(b[i].digest, hex);
        snprintf(b[i].path, sizeof b[i].path, "%s/files/%s.cubin", dir, hex);
        snprintf(b[i].meta, sizeof b[i].meta, "%s/files/%s.json", dir, hex);
        int n = snprintf(meta, sizeof meta, "{\"name\": \"%s\", \"size\": %zu}",
                         r.lowered_name, b[i].len);
        kw_jit_result_destroy(&r);
        if (kw_cache_put(c, b[i].digest, &info, b[i].data, b[i].len, false,
                         &stored) < 0 ||
            put_file(b[i].path, b[i].data, b[i].len) < 0 ||
            put_file(b[i].meta, meta, (size_t)n) < 0)
            return -1;
    }
    return 0;
}

/* nftw callback removing one entry of the temporary tree. */
static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Reads a whole file into buf (cap bytes); returns bytes read or -1. */
static ssize_t read_file(const char *path, void *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap);
    close(fd);
    return n;
}

enum { M_KWARM, M_FILES, M_MEMCPY, NMETHODS };
static const char *const method_names[NMETHODS] = {
    "kwarm hit (LMDB read + XXH3-128 check)",
    "file-per-entry hit (.json + .cubin)",
    "memcpy of the same bytes (floor)",
};

/* Times one hit of blob b by method m into buf; returns ns or -1. */
static double one_hit(int m, kw_cache *c, const blob *b, uint8_t *buf,
                      size_t cap)
{
    size_t len = 0;
    char meta[512];
    double t0 = bench_now_ns();
    if (m == M_KWARM) {
        if (kw_cache_get_into(c, b->digest, buf, cap, &len, NULL) < 0)
            return -1;
    } else if (m == M_FILES) {
        if (read_file(b->meta, meta, sizeof meta) < 0 ||
            read_file(b->path, buf, cap) != (ssize_t)b->len)
            return -1;
    } else
        memcpy(buf, b->data, b->len);
    double t = bench_now_ns() - t0;
    /* Keep the copy observable so the compiler cannot drop it. */
    if (buf[b->len / 2] != ((const uint8_t *)b->data)[b->len / 2])
        return -1;
    return t;
}

int main(int argc, char **argv)
{
    const char *model = "tests/fixtures/deepseek-v4-flash.json", *json = NULL;
    size_t iters = 20000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model = argv[i + 1];
        else if (strcmp(argv[i], "--iters") == 0)
            iters = (size_t)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--json") == 0)
            json = argv[i + 1];
    }
    if (argc % 2 == 0 || iters == 0) {
        fprintf(stderr, "usage: bench_cache [--model CONFIG] [--iters N] [--json FILE]\n");
        return 2;
    }
    kw_keys_set set;
    char dir[] = "/tmp/kw-bench-cache-XXXXXX", files[600], err[512];
    if (bench_derive(model, "2", "all", &set) < 0 || mkdtemp(dir) == NULL)
        return 1;
    snprintf(files, sizeof files, "%s/files", dir);
    mkdir(files, 0700);
    snprintf(files, sizeof files, "%s/lmdb", dir);
    kw_cache_opts co = {.dir = files};
    kw_cache *c = NULL;
    blob *b = calloc(set.nkeys, sizeof *b);
    size_t cap = KW_CACHE_MAX_BLOB;
    uint8_t *buf = malloc(cap);
    if (b == NULL || buf == NULL || kw_cache_open(&c, &co, err, sizeof err) < 0 ||
        populate(&set, dir, c, b) < 0) {
        fprintf(stderr, "bench_cache: setup failed: %s\n", err);
        return 1;
    }
    double *s[NMETHODS];
    for (int m = 0; m < NMETHODS; m++) {
        s[m] = malloc(iters * sizeof *s[m]);
        for (size_t i = 0; i < set.nkeys; i++) /* warm the page cache */
            one_hit(m, c, &b[i], buf, cap);
        for (size_t i = 0; i < iters; i++)
            if ((s[m][i] = one_hit(m, c, &b[i % set.nkeys], buf, cap)) < 0) {
                fprintf(stderr, "bench_cache: %s failed\n", method_names[m]);
                return 1;
            }
        qsort(s[m], iters, sizeof *s[m], bench_cmp_double);
    }
    double *cs = malloc(set.nkeys * sizeof *cs), bytes = 0;
    for (size_t i = 0; i < set.nkeys; i++) {
        cs[i] = b[i].compile_s * 1e9;
        bytes += (double)b[i].len;
    }
    qsort(cs, set.nkeys, sizeof *cs, bench_cmp_double);
    printf("%zu cubins of %.1f KB on average, %zu hits each way\n\n", set.nkeys,
           bytes / set.nkeys / 1024, iters);
    printf("%-42s %12s %12s %10s\n", "", "p50 us", "p99 us", "vs kwarm");
    for (int m = 0; m < NMETHODS; m++)
        printf("%-42s %12.2f %12.2f %9.1fx\n", method_names[m],
               pct(s[m], iters, 50) / 1e3, pct(s[m], iters, 99) / 1e3,
               pct(s[m], iters, 50) / pct(s[M_KWARM], iters, 50));
    printf("%-42s %12.0f %12.0f %9.0fx\n", "NVRTC compile (the miss)",
           pct(cs, set.nkeys, 50) / 1e3, pct(cs, set.nkeys, 99) / 1e3,
           pct(cs, set.nkeys, 50) / pct(s[M_KWARM], iters, 50));
    FILE *f = json ? fopen(json, "w") : NULL;
    if (f != NULL) {
        fprintf(f, "{\"cubins\": %zu, \"avg_kb\": %.1f, \"iters\": %zu",
                set.nkeys, bytes / set.nkeys / 1024, iters);
        const char *keys[NMETHODS] = {"kwarm_hit", "file_per_entry", "memcpy"};
        for (int m = 0; m < NMETHODS; m++)
            fprintf(f, ", \"%s_us\": {\"p50\": %.3f, \"p99\": %.3f}", keys[m],
                    pct(s[m], iters, 50) / 1e3, pct(s[m], iters, 99) / 1e3);
        fprintf(f, ", \"compile_us\": {\"p50\": %.0f, \"p99\": %.0f}}\n",
                pct(cs, set.nkeys, 50) / 1e3, pct(cs, set.nkeys, 99) / 1e3);
        fclose(f);
    }
    kw_cache_close(c);
    return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : 1;
}
