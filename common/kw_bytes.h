/* kw_bytes.h: fixed-width little-endian integers in byte buffers, the same
 * on every host.  The cache's records, the fleet tier's entries, the key
 * digest's canonical encoding and the compile pool's pipe frames are all
 * defined in these terms. */
#ifndef KW_BYTES_H
#define KW_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* Writes the low n bytes of v at p, least significant first. */
static inline void kw_le_put(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Reads n bytes at p, least significant first. */
static inline uint64_t kw_le_get(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

static inline void kw_le16_put(uint8_t *p, uint16_t v) { kw_le_put(p, v, 2); }
static inline void kw_le32_put(uint8_t *p, uint32_t v) { kw_le_put(p, v, 4); }
static inline void kw_le64_put(uint8_t *p, uint64_t v) { kw_le_put(p, v, 8); }
static inline uint16_t kw_le16_get(const uint8_t *p) { return (uint16_t)kw_le_get(p, 2); }
static inline uint32_t kw_le32_get(const uint8_t *p) { return (uint32_t)kw_le_get(p, 4); }
static inline uint64_t kw_le64_get(const uint8_t *p) { return kw_le_get(p, 8); }

#endif /* KW_BYTES_H */
