/* cli_check.c: input the CLI refuses before it does any work (issue 24).
 *
 * Each check prints one line naming the flag, field or arch at fault and
 * what is allowed, and returns KW_CLI_USAGE; -1 means "go on".  They use
 * the rules of the modules that own them (cache/'s pin names, jit/'s
 * NVRTC archs, launch/'s key fields), so the CLI never holds a second copy
 * of a bound that could drift, except the description of each field kind
 * in rule_of(), which tests/test_cli_check.c probes on both sides of every
 * bound.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "kw_cache.h"
#include "kw_jit.h"
#include "kw_launch.h"

int kw__cli_pin_check(const char *cmd, const char *pin)
{
    if (pin == NULL || kw_cache_pin_name_valid(pin))
        return -1;
    kw__cli_err(cmd, "--pin '%.80s': not a pin set name (1 to %d characters "
                "of A-Z a-z 0-9 . _ : @ + -)", pin, KW_CACHE_MAX_PIN_NAME);
    return KW_CLI_USAGE;
}

/* Writes the archs the linked NVRTC builds cubins for into buf, as
 * "sm_75, sm_80, ...".  Probes kw_jit_arch_valid() over every sm_NN and
 * sm_NNN: only on the error path, so its cost does not matter. */
static void supported_archs(char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int n = 10; n < 1000; n++) {
        char arch[16];
        snprintf(arch, sizeof arch, "sm_%d", n);
        if (!kw_jit_arch_valid(arch))
            continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", arch);
        if (w < 0 || (size_t)w >= cap - used)
            break;
        used += (size_t)w;
    }
}

int kw__cli_arch_one(const char *cmd, const char *arch)
{
    if (kw_jit_arch_valid(arch))
        return -1;
    char list[512];
    int major = 0, minor = 0;
    supported_archs(list, sizeof list);
    kw_jit_version(&major, &minor);
    kw__cli_err(cmd, "--arch %.16s: NVRTC %d.%d cannot build it; it builds %s "
                "(each with 'a' from sm_90 on, 'f' from sm_100 on)", arch,
                major, minor, list[0] ? list : "none");
    return KW_CLI_USAGE;
}

int kw__cli_arch_check(const char *cmd, const kw_config_deploy *d)
{
    for (size_t i = 0; i < d->narch; i++)
        if (kw__cli_arch_one(cmd, d->arch[i]) >= 0)
            return KW_CLI_USAGE;
    return -1;
}

/* What a field of kind k may hold: [lo, hi] in steps of step (0: only
 * the listed values of `text`), as launch/kw_launch.h documents each kind.
 * Used only to name the field once kw_launch_fields_check() has refused
 * the key, so a drift from launch/ could misname a field but never refuse
 * a key launch/ accepts. */
typedef struct kind_rule {
    int64_t lo, hi, step;
    const char *text;
} kind_rule;

static kind_rule rule_of(kw_launch_kind k)
{
    switch (k) {
    case KW_LAUNCH_F_REP: return (kind_rule){1, 16, 0, "1, 2 or 16"};
    case KW_LAUNCH_F_BOOL: return (kind_rule){0, 1, 1, "true or false"};
    case KW_LAUNCH_F_POS: return (kind_rule){1, INT32_MAX, 1, "an integer in [1, 2^31)"};
    case KW_LAUNCH_F_NONNEG: return (kind_rule){0, INT32_MAX, 1, "an integer in [0, 2^31)"};
    case KW_LAUNCH_F_THREADS: return (kind_rule){32, 1024, 32, "a multiple of 32 in [32, 1024]"};
    case KW_LAUNCH_F_WARPS: return (kind_rule){1, 32, 1, "an integer in [1, 32]"};
    case KW_LAUNCH_F_HEADS: return (kind_rule){1, 256, 1, "an integer in [1, 256]"};
    case KW_LAUNCH_F_HDIM: return (kind_rule){32, 512, 32, "a multiple of 32 in [32, 512]"};
    case KW_LAUNCH_F_NEXTN: return (kind_rule){1, 8, 1, "an integer in [1, 8]"};
    case KW_LAUNCH_F_TOPK: return (kind_rule){1, 1 << 20, 1, "an integer in [1, 2^20]"};
    }
    return (kind_rule){0, -1, 1, "a valid value"};
}

static bool rule_holds(kind_rule r, int64_t v)
{
    if (r.step == 0) /* REP */
        return v == 1 || v == 2 || v == 16;
    return v >= r.lo && v <= r.hi && (v - r.lo) % r.step == 0;
}

int kw__cli_fields_check(const char *cmd, int fam, const int64_t *fields)
{
    if (kw_launch_fields_check(fam, fields) == 0)
        return -1;
    size_t n = kw_launch_nfields(fam);
    for (size_t i = 0; i < n; i++) {
        kind_rule r = rule_of(kw_launch_field_kind(fam, i));
        if (rule_holds(r, fields[i]))
            continue;
        kw__cli_err(cmd, "--fields: %s=%lld: must be %s",
                    kw_launch_field_name(fam, i), (long long)fields[i], r.text);
        return KW_CLI_USAGE;
    }
    kw__cli_err(cmd, "--fields: these %s fields name no kernel together (a "
                "rank must be below its world; an indexer_logits key that is "
                "not paged has page_rows 0 and next_n 1, a paged one "
                "page_rows of at least 1)", kw_launch_family_name(fam));
    return KW_CLI_USAGE;
}
