/* sources.c: which embedded files a family's source uses: itself and the
 * headers it includes, transitively (kw_kernels.h).
 *
 * A key's digest hashes exactly these files (jit/registry.c) and NVRTC is
 * given exactly these headers (jit/build.c), so a header the scan missed
 * fails the compile instead of going unhashed, and editing a header
 * changes the digests of the families that include it and of no other.
 */
#include "kw_kernels.h"

#include <string.h>

#include "kw_err.h"

/* Whether the line at p (up to end) is `#include "name"`, spaces allowed
 * around the '#' and before the quote. */
static bool line_includes(const char *p, const char *end, const char *name)
{
    size_t n = strlen(name);
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if (p == end || *p++ != '#')
        return false;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if ((size_t)(end - p) < 7 || memcmp(p, "include", 7) != 0)
        return false;
    p += 7;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return (size_t)(end - p) >= n + 2 && p[0] == '"' &&
           memcmp(p + 1, name, n) == 0 && p[n + 1] == '"';
}

bool kw_k_text_includes(const char *text, size_t len, const char *name)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl != NULL ? nl : end;
        if (line_includes(p, eol, name))
            return true;
        p = eol + 1;
    }
    return false;
}

static bool is_header(const char *name)
{
    size_t len = strlen(name);
    return len > 4 && strcmp(name + len - 4, ".cuh") == 0;
}

int kw_k_source_uses(const kw_k_file *files, size_t n, const char *source,
                     bool *use)
{
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        use[i] = strcmp(files[i].name, source) == 0;
        found |= use[i];
    }
    if (!found)
        return KW_ENOFAMILY;
    for (bool grew = true; grew;) { /* to a fixed point: headers nest */
        grew = false;
        for (size_t h = 0; h < n; h++) {
            if (use[h] || !is_header(files[h].name))
                continue;
            for (size_t i = 0; i < n && !use[h]; i++)
                use[h] = use[i] && kw_k_text_includes(files[i].text,
                                                      files[i].len,
                                                      files[h].name);
            grew |= use[h];
        }
    }
    return 0;
}
