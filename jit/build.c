/* build.c: rendering a compile key into an NVRTC request, and compiling it.
 *
 * The family's kernel is one template whose parameters are the key's fields
 * in order (kernels/), so a key renders to a name expression such as
 * "kw_k_dcp_stable_topk<2048, 16384>"; the program is kernels/<family>.cu
 * with the kernels/ headers it includes (kw_k_source_uses, the same files
 * its digest hashes) supplied as NVRTC named headers.
 */
#include "kw_keys.h"

#include <string.h>

#include "kw_err.h"

int kw_keys_jit_req(const kw_keys_key *k, kw_keys_build *b, kw_jit_req *req)
{
    memset(b, 0, sizeof *b);
    memset(req, 0, sizeof *req);
    if ((unsigned)k->family >= KW_K_NFAMILIES)
        return KW_ENOFAMILY;
    int rc = kw_k_name_expr(k->family, k->fields, b->name_expr,
                            sizeof b->name_expr);
    if (rc < 0)
        return rc;
    const char *src_name = kw_k_source_name(k->family);
    const kw_k_file *src = NULL;
    bool use[KW_K_MAX_FILES];
    if (kw_k_nfiles > KW_K_MAX_FILES)
        return KW_ENOSPC;
    if (kw_k_source_uses(kw_k_files, kw_k_nfiles, src_name, use) < 0)
        return KW_ENOFAMILY; /* the build embedded no source for it */
    for (size_t i = 0; i < kw_k_nfiles; i++) {
        const char *n = kw_k_files[i].name;
        if (!use[i])
            continue;
        if (strcmp(n, src_name) == 0)
            src = &kw_k_files[i];
        else if (b->nheaders < KW_KEYS_MAX_HEADERS) {
            b->headers[b->nheaders].name = n;
            b->headers[b->nheaders++].text = kw_k_files[i].text;
        } else
            return KW_ENOSPC;
    }
    req->source = src->text;
    req->source_name = src->name;
    req->headers = b->headers;
    req->nheaders = b->nheaders;
    req->name_expr = b->name_expr;
    if (kw_k_compile_arch(k->family, k->arch, b->arch, sizeof b->arch) < 0)
        return KW_ENOSPC;
    req->arch = b->arch; /* sm_90a for an sm_90 indexer_logits key */
    return 0;
}

int kw_keys_compile(const kw_keys_key *k, bool want_ptx, kw_jit_result *res)
{
    kw_keys_build b;
    kw_jit_req req;
    memset(res, 0, sizeof *res);
    int rc = kw_keys_jit_req(k, &b, &req);
    if (rc < 0)
        return rc;
    req.want_ptx = want_ptx;
    return kw_jit_compile(&req, res);
}
