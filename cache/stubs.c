/* stubs.c: placeholders for the API being implemented (kw_cache.h); each
 * returns -ENOSYS until its real file lands. */
#include "kw_cache.h"

#include <errno.h>

#include "internal.h"

bool kw_cache_is_read_only(const kw_cache *c) { return c && c->read_only; }
int kw_cache_resize(kw_cache *c, uint64_t m) { (void)c; (void)m; return -ENOSYS; }
int kw_cache_borrow(kw_cache *c, const uint8_t d[KW_CACHE_DIGEST_LEN],
                    kw_cache_view *v, kw_cache_info *i)
{ (void)c; (void)d; (void)v; (void)i; return -ENOSYS; }
void kw_cache_release(kw_cache_view *v) { (void)v; }
int kw_cache_pin_set(kw_cache *c, const char *n,
                     const uint8_t (*d)[KW_CACHE_DIGEST_LEN], size_t k)
{ (void)c; (void)n; (void)d; (void)k; return -ENOSYS; }
int kw_cache_unpin_set(kw_cache *c, const char *n) { (void)c; (void)n; return -ENOSYS; }
int kw_cache_pins_foreach(kw_cache *c, kw_cache_pin_fn f, void *a)
{ (void)c; (void)f; (void)a; return -ENOSYS; }
int kw_cache_pin_names(kw_cache *c, const uint8_t d[KW_CACHE_DIGEST_LEN],
                       char *b, size_t cap, size_t *n)
{ (void)c; (void)d; (void)b; (void)cap; (void)n; return -ENOSYS; }
int kw_cache_protect(kw_cache *c, const uint8_t (*d)[KW_CACHE_DIGEST_LEN],
                     size_t n, kw_cache_guard **o)
{ (void)c; (void)d; (void)n; (void)o; return -ENOSYS; }
void kw_cache_unprotect(kw_cache_guard *g) { (void)g; }
int kw_cache_plan_get(kw_cache *c, const uint8_t (*d)[KW_CACHE_DIGEST_LEN],
                      size_t n, kw_cache_plan *p)
{ (void)c; (void)d; (void)n; (void)p; return -ENOSYS; }
int kw_cache_find_prefix(kw_cache *c, const char *h, uint8_t o[KW_CACHE_DIGEST_LEN],
                         char *cand, size_t cap)
{ (void)c; (void)h; (void)o; (void)cand; (void)cap; return -ENOSYS; }
