/* handlers.h: daemon/'s request handlers (kw__run_, kw__heartbeat_,
 * kw__daemon_upcalls; not API), above the job threads and streams
 * (jobs.h).
 *
 * The dispatcher (dispatch.c) serves ping and a get that hits on the loop
 * and hands everything else to a job thread or to warm; it is the top of
 * this layer, over each request's handler (requests.c, warmup.c,
 * admin.c, misses.c), the warmup heartbeat (heartbeat.c) and the keys of
 * requests (reqkey.c), which call no file above them.  The lower layers
 * reach it only through the kw__upcalls that kw__daemon_upcalls() fills.
 */
#ifndef KW_DAEMON_HANDLERS_H
#define KW_DAEMON_HANDLERS_H

#include "jobs.h"

/* Fills d->up with the dispatcher's entry points (dispatch.c). */
void kw__daemon_upcalls(kw__daemon *d);

/* Derives the keys of a keys or warmup request's model and deployment,
 * packed (kw_keys_derive_packed: about 3 bytes a key, and no digest
 * computed, so a request the budget of keys in flight refuses costs
 * little); 0, or a code with the message in err (requests.c). */
int kw__req_keys(const cJSON *h, kw_config_model *m, kw_config_deploy *d,
                 kw_keys_packed *set, char *err, size_t errlen);

/* Reads the key of a get ({"digest": HEX, a full digest or a unique
 * prefix of 8 or more digits of a cached one}, or family, fields and
 * arch) into k; *have_key says whether k is a whole key (compilable).  0
 * or a code with the message in err (reqkey.c). */
int kw__req_get_key(kw_cache *c, const cJSON *h, kw_keys_key *k,
                    bool *have_key, char *err, size_t errlen);

/* The same for an evict: the digest alone. */
int kw__req_digest(kw_cache *c, const cJSON *h,
                   uint8_t digest[KW_KEYS_DIGEST_LEN], char *err,
                   size_t errlen);

/* The job handlers (requests.c, warmup.c), on a job thread. */
/* keys and ls stream with yields: they return true when they yielded
 * (their state in r->state), and are run again to go on. */
bool kw__run_keys(kw__req *r);
bool kw__run_ls(kw__req *r);
void kw__run_stats(kw__req *r);
void kw__run_evict(kw__req *r);
void kw__run_warmup(kw__req *r);
void kw__run_misses(kw__req *r);
void kw__run_pins(kw__req *r);
void kw__run_unpin(kw__req *r);
void kw__run_resize(kw__req *r);
/* evict {"match": {...}, "force"?} (admin.c); kw__run_evict hands over. */
void kw__run_evict_match(kw__req *r, const cJSON *match);

/* Heartbeats of silent warmups (heartbeat.c), on the loop thread: init
 * sets up l's timer (closed with the loop's handles); begin and end
 * bracket a warmup request.  The outbox counts each of r's posted items
 * as the loop takes it (hb_pending, hb_last: stream.c). */
void kw__heartbeat_init(kw__loop *l);
void kw__heartbeat_begin(kw__req *r);
void kw__heartbeat_end(kw__req *r);

#endif /* KW_DAEMON_HANDLERS_H */
