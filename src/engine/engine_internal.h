/* Engine internals shared by the files of src/engine (not part of the public API). */
#ifndef FLOE_ENGINE_INTERNAL_H
#define FLOE_ENGINE_INTERNAL_H
#include "floe.h"
#include "tok/tokenizer.h"

const tok_vocab *engine_tok(const floe_engine *e);
int engine_arch(const floe_engine *e); /* enum floe_arch */

/* ---- speculative decoding with the MTP head (engine_mtp.c) ----
 * A session's spec state: the MTP rows not yet run (pending: position, token after it, the trunk's
 * normed hidden state there), the trunk's normed hidden state at the last evaluated position, the
 * verify buffers, the automatic choice of k and the counters. Every function accepts NULL where a
 * session never used MTP. */
typedef struct model_session model_session;
typedef struct sampler sampler;
typedef struct spec spec;
int spec_new(model_session *ms, spec **out, char *err, size_t errlen);
void spec_free(spec *sp);
void spec_stats(const spec *sp, floe_session_stats *out);
void spec_stats_reset(spec *sp);
/* The session advanced without hidden states (or was rewound): the next MTP row has no input. */
void spec_forget_hidden(spec *sp);
/* The session was rewound to n_past: pending rows at positions >= n_past - 1 are dropped. */
void spec_rewound(spec *sp, int64_t n_past);
/* model_eval of n tokens that also feeds the MTP's rows (their hidden states); the last
 * position's logits into last_logits. On error the session state is undefined (caller resets). */
int spec_eval(spec *sp, model_session *ms, const int32_t *ids, int64_t n, float *last_logits, char *err, size_t errlen);
/* Drafts per step for the next step: forced (1..4) or, forced < 0, the automatic choice; at most
 * room (positions left in the context minus one). */
int spec_choose_k(spec *sp, int forced, int64_t room);
/* The automatic choice itself: the k in 0..kmax with the most expected tokens per second, given
 * the measured cost of a step with k drafts (cost[0]: a plain decode step; <= 0: unknown, never
 * chosen) and the conditional acceptance alpha[j] of draft position j (expected tokens of a step:
 * 1 + sum_i prod_{j<=i} alpha_j). Ties go to the smaller k. */
int spec_best_k(const double *cost, const double *alpha, int kmax);
/* k drafts' expected tokens per second relative to a plain step's, from the same cost[] and
 * alpha[] (0 when cost[k] or cost[0] is unknown): below SPEC_PRUNE (0.9) k loses clearly. */
double spec_rate_rel(const double *cost, const double *alpha, int k);
/* Tests only: every step's cost is taken as cost[k] (5 values, seconds) instead of its measured
 * wall time, so the automatic choice is deterministic; NULL: measure again. Process-wide. */
void spec_test_pin_costs(const double *cost);
/* One speculative step: the session holds n_past tokens and `id` (sampled from last_logits) is the
 * next one. Drafts k tokens with the MTP, verifies [id, drafts] in one trunk pass, keeps the
 * accepted rows. Out: the accepted drafts acc[0..*n_acc) (the session then holds id + them),
 * their logits rows (*acc_logits: row i predicted acc[i]), last_logits = the logits after the last
 * kept row, *forced = the next token when the sampling rule resampled (else -1: sample
 * last_logits as usual). smp: the request's sampler (greedy or not). row_logits: the caller reads
 * *acc_logits (log-probabilities); otherwise a greedy step may run as one device pass
 * (model_spec_greedy), which brings back the last kept row's logits only. */
int spec_step(spec *sp, model_session *ms, sampler *smp, int32_t id, int k, float *last_logits, int32_t *acc,
              int *n_acc, const float **acc_logits, int32_t *forced, bool row_logits, char *err, size_t errlen);
#endif
