/* hits.c: the encoded reply headers of recent hits, one table per serving
 * loop (kw__hits_; loop thread only, so no lock).
 *
 * A hit's reply header is {digest, family, arch, entry, size, compiled:
 * false}: the same every time an entry is served, yet building it with
 * cJSON and printing it (cJSON prints every number through sprintf and
 * sscanf) was the largest part of a loop's work per hit.  The table is
 * direct-mapped by digest; a slot is used only when the digest, the size
 * and the three strings all match the entry just borrowed, so an entry
 * compiled again (a new size or entry name) gets a new header.
 */
#include "conn.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"

#define SLOTS 1024 /* a power of two */

struct kw__hits {
    struct slot {
        uint8_t digest[KW_KEYS_DIGEST_LEN];
        uint64_t size;
        char family[sizeof ((kw_cache_info *)0)->family];
        char arch[sizeof ((kw_cache_info *)0)->arch];
        char entry[sizeof ((kw_cache_info *)0)->entry];
        uint8_t *frame; /* owned; NULL: an empty slot */
        size_t len;
    } slot[SLOTS];
};

static struct slot *slot_of(kw__hits *h, const uint8_t *digest)
{
    return &h->slot[(digest[0] | (unsigned)digest[1] << 8) & (SLOTS - 1)];
}

static bool same(const struct slot *s, const uint8_t *digest,
                 const kw_cache_info *info, uint64_t size)
{
    return s->frame != NULL && s->size == size &&
           memcmp(s->digest, digest, sizeof s->digest) == 0 &&
           strcmp(s->family, info->family) == 0 &&
           strcmp(s->arch, info->arch) == 0 &&
           strcmp(s->entry, info->entry) == 0;
}

const uint8_t *kw__hits_get(kw__loop *l, const uint8_t *digest,
                            const kw_cache_info *info, uint64_t size,
                            size_t *len)
{
    struct slot *s = l->hits ? slot_of(l->hits, digest) : NULL;
    if (s == NULL || !same(s, digest, info, size))
        return NULL;
    *len = s->len;
    return s->frame;
}

void kw__hits_put(kw__loop *l, const uint8_t *digest, const kw_cache_info *info,
                  uint64_t size, const uint8_t *frame, size_t len)
{
    if (l->hits == NULL && (l->hits = kw_calloc(1, sizeof *l->hits)) == NULL)
        return; /* out of memory: headers are built each time */
    struct slot *s = slot_of(l->hits, digest);
    uint8_t *copy = kw_malloc(len);
    if (copy == NULL)
        return;
    memcpy(copy, frame, len);
    free(s->frame);
    memcpy(s->digest, digest, sizeof s->digest);
    s->size = size;
    memcpy(s->family, info->family, sizeof s->family);
    memcpy(s->arch, info->arch, sizeof s->arch);
    memcpy(s->entry, info->entry, sizeof s->entry);
    s->frame = copy;
    s->len = len;
}

void kw__hits_free(kw__loop *l)
{
    for (size_t i = 0; l->hits != NULL && i < SLOTS; i++)
        free(l->hits->slot[i].frame);
    free(l->hits);
    l->hits = NULL;
}
