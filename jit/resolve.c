/* resolve.c: the model-dependent defaults and cross-field rules of §2. */
#include "kw_config.h"

#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "kw_err.h"

/* Names the input a field came from: its flag, or the --deploy file and
 * pointer; for a derived value, what it was derived from. */
static const char *where(const kw_config_deploy *d, kw_config_field f,
                         char *buf, size_t cap)
{
    if (d->source[0] != '\0' && (d->given & (1u << f)))
        snprintf(buf, cap, "%s: /%s", d->source, kw_config_field_name(f));
    else
        snprintf(buf, cap, "%s", kw_config_field_flag(f));
    return buf;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Derives the default block_size: lcm(64, r*I for r in ratios_s), or -1
 * when it would exceed 2^31 - 1. */
static int64_t default_block_size(const int64_t *rs, size_t n, int64_t il)
{
    int64_t l = 64;
    for (size_t i = 0; i < n; i++) {
        int64_t t = rs[i] * il; /* <= 65536 * (2^31 - 1): fits */
        int64_t g = gcd64(l, t);
        if (t / g > KW__INT_MAX / l)
            return -1;
        l = l / g * t;
    }
    return l;
}

/* Checks a given block_size against ratios_s and the interleave. */
static int check_block_size(const kw_config_deploy *d, const int64_t *rs,
                            size_t n, int64_t il, char *err, size_t errlen)
{
    char w[320];
    for (size_t i = 0; i < n; i++) {
        if (d->block_size % rs[i] != 0) {
            kw__config_errf(err, errlen, "%s: %lld is not a multiple of "
                            "compress ratio %lld", where(d, KW_CONFIG_BLOCK_SIZE,
                            w, sizeof w), (long long)d->block_size,
                            (long long)rs[i]);
            return KW_EDEPLOY;
        }
        if ((d->block_size / rs[i]) % il != 0) {
            kw__config_errf(err, errlen, "%s: %lld / ratio %lld is not a "
                            "multiple of dcp_interleave %lld", where(d,
                            KW_CONFIG_BLOCK_SIZE, w, sizeof w),
                            (long long)d->block_size, (long long)rs[i],
                            (long long)il);
            return KW_EDEPLOY;
        }
    }
    return 0;
}

/* Settles block_size: the derived default, or a checked given value. */
static int resolve_block_size(kw_config_deploy *d, const kw_config_model *m,
                              char *err, size_t errlen)
{
    int64_t rs[KW_CONFIG_MAX_RATIOS + 1];
    size_t n = kw_config_ratios_s(m, rs);
    int64_t il = d->dcp_world > 1 ? d->dcp_interleave : 1;
    char w[320];
    if (d->block_size == 0) {
        d->block_size = default_block_size(rs, n, il);
        if (d->block_size < 0) {
            kw__config_errf(err, errlen, "%s: the default (lcm of 64 and "
                            "ratio x interleave) exceeds 2^31-1; pass one",
                            kw_config_field_flag(KW_CONFIG_BLOCK_SIZE));
            return KW_EDEPLOY;
        }
    } else if (check_block_size(d, rs, n, il, err, errlen) < 0)
        return KW_EDEPLOY;
    if (d->dcp_world > 1 && d->block_size % il != 0) {
        kw__config_errf(err, errlen, "%s: %lld does not divide block_size %lld",
                        where(d, KW_CONFIG_DCP_INTERLEAVE, w, sizeof w),
                        (long long)il, (long long)d->block_size);
        return KW_EDEPLOY;
    }
    return 0;
}

/* Settles max_model_len from the flag or max_position_embeddings. */
static int resolve_model_len(kw_config_deploy *d, const kw_config_model *m,
                             char *err, size_t errlen)
{
    char w[320];
    bool given = d->max_model_len != 0;
    if (!given && !m->has_max_position_embeddings) {
        kw__config_errf(err, errlen, "%s: no max_position_embeddings in text "
                        "config at %s; pass --max-model-len", m->path,
                        m->text_config);
        return KW_ECONFIG;
    }
    if (!given)
        d->max_model_len = m->max_position_embeddings;
    if (d->dcp_world > 1 && d->max_model_len > (1LL << 24)) {
        if (given)
            where(d, KW_CONFIG_MAX_MODEL_LEN, w, sizeof w);
        else
            snprintf(w, sizeof w, "%s: %s/max_position_embeddings", m->path,
                     m->text_config[1] ? m->text_config : "");
        kw__config_errf(err, errlen, "%s: max_model_len %lld exceeds 2^24 "
                        "with dcp_world > 1 (token ids travel as fp32); %s "
                        "--max-model-len of at most 16777216", w,
                        (long long)d->max_model_len, given ? "give a" : "pass");
        return given ? KW_EDEPLOY : KW_ECONFIG;
    }
    return 0;
}

int kw_config_resolve(kw_config_deploy *d, const kw_config_model *m,
                      char *err, size_t errlen)
{
    char w[320];
    if (d->dcp_rank != KW_CONFIG_RANK_ALL && d->dcp_rank >= d->dcp_world) {
        kw__config_errf(err, errlen, "%s: rank %lld is not below dcp_world "
                        "%lld", where(d, KW_CONFIG_DCP_RANK, w, sizeof w),
                        (long long)d->dcp_rank, (long long)d->dcp_world);
        return KW_EDEPLOY;
    }
    if (d->dcp_world == 1)
        d->dcp_interleave = 1; /* ignored without DCP (§2) */
    int rc = resolve_block_size(d, m, err, errlen);
    if (rc == 0)
        rc = resolve_model_len(d, m, err, errlen);
    if (rc == 0 && d->block_stride_rows == 0)
        d->block_stride_rows = d->block_size;
    return rc;
}
