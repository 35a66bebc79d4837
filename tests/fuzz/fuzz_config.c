/* fuzz_config.c: libFuzzer harness for the config.json loader
 * (jit/config.c, kw_config_load_buffer()).
 *
 * Each input is loaded twice: with pointer NULL (the wrapper search of
 * spec/warmup-keys.md §1) and with a --text-config pointer.  The pointer is
 * taken from the input when it starts with '/' and holds a NUL byte
 * ("<pointer>\0<json>"), so the fuzzer can steer both; otherwise a fixed
 * pointer is used on the whole input.  The buffer is an exact-size heap
 * copy with no terminating NUL, as the loader must not need one.
 */
#include "kw_config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts (a libFuzzer crash) when cond is false: a broken loader contract. */
#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond))                                                       \
            abort();                                                       \
    } while (0)

/* Loads len bytes of buf with pointer and checks the result's invariants:
 * an error leaves *m zeroed with a message, success a usable model. */
static void load_one(const char *buf, size_t len, const char *pointer)
{
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN];
    err[0] = '\0';
    int rc = kw_config_load_buffer(&m, "fuzz.json", buf, len, pointer, err,
                                   sizeof err);
    CHECK(memchr(err, '\0', sizeof err) != NULL);
    if (rc < 0) {
        CHECK(err[0] != '\0' || rc == KW_ENOMEM);
        CHECK(m.path == NULL && m.text_config == NULL &&
              m.compress_ratios == NULL);
        return;
    }
    CHECK(rc == 0);
    CHECK(m.element_size == 2 || m.element_size == 4);
    CHECK((m.compress_ratios == NULL) == (m.ncompress_ratios == 0));
    CHECK(m.ncompress_ratios <= KW_CONFIG_MAX_RATIOS);
    /* The ratio helpers write at most max(ncompress_ratios, 1) + 1 values;
     * an exact-size array lets ASan catch one more. */
    size_t cap = (m.ncompress_ratios > 0 ? m.ncompress_ratios : 1) + 1;
    int64_t *out = calloc(cap, sizeof *out);
    if (out != NULL) {
        CHECK(kw_config_ratios_p(&m, out) <= cap);
        CHECK(kw_config_ratios_s(&m, out) <= cap);
        free(out);
    }
    kw_config_model_destroy(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *pointer = "/text_config";
    const uint8_t *body = data;
    size_t len = size;
    char *ptr = NULL;
    const uint8_t *nul = size > 0 && data[0] == '/'
                             ? memchr(data, '\0', size)
                             : NULL;
    if (nul != NULL) {
        size_t plen = (size_t)(nul - data);
        ptr = malloc(plen + 1);
        if (ptr == NULL)
            return 0;
        memcpy(ptr, data, plen + 1);
        pointer = ptr;
        body = nul + 1;
        len = size - plen - 1;
    }
    char *buf = malloc(len > 0 ? len : 1);
    if (buf != NULL) {
        if (len > 0)
            memcpy(buf, body, len);
        load_one(buf, len, NULL);
        load_one(buf, len, pointer);
        free(buf);
    }
    free(ptr);
    return 0;
}
