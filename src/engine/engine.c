/* The public API (include/floe.h) on top of the model, tokenizer and sampler.
 *
 * An engine owns the model and the tokenizer; a session owns a model_session plus the token
 * history that is in its cache, so a prompt that extends that history only evaluates the new
 * tokens (prefix reuse: exact, because the cached state is the state those tokens produced).
 * A prompt that leaves the history (agents re-render the last assistant turn: Qwen3 drops its
 * <think> block, Qwen3.5 its "<think>\n" opening) rewinds the session to the common prefix:
 * attention layers exactly there, GatedDeltaNet layers to the largest recurrent-state checkpoint
 * at or before it. Checkpoints are saved while a prompt is evaluated: at its end, at its last two
 * <|im_start|> tokens (where a re-rendered turn starts) and every checkpoint_every tokens. Every
 * op is row-exact (model.h), so a resumed run is bit-identical to a cold one.
 *
 * The prompt is evaluated in steps of at most PREFILL_STEP tokens, asking should_stop between
 * them; a stopped prefill leaves history = the tokens evaluated (and their last logits).
 *
 * Text streaming: generated token bytes go through a small pending buffer. Bytes are released to
 * the callback only when they form whole UTF-8 characters and cannot be the start of a stop
 * string; a stop string found in the text ends generation and is never emitted. */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "experts/experts.h"
#include "floe.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "tok/tokenizer.h"
#include "engine/engine_internal.h"
#include "kernels/cpu/kernels.h"

struct floe_engine {
  model *m;
  tok_vocab *tok;
  int n_threads;
  floe_model_info info;
  floe_engine_params p;
  int32_t im_start; /* "<|im_start|>" (turn starts are checkpointed), -1: none */
  uint64_t budget_used; /* streaming: resident weights + cache + overhead + live sessions */
};

/* Streaming bookkeeping that is not weights, cache or sessions: the store's offset tables, the
 * prediction tables, slot headers (per slot), I/O queues. Counted in the budget. */
#define XS_SLOT_OVERHEAD 2048u
static uint64_t stream_overhead(const model *m) {
  const uint64_t nk = (uint64_t)m->hp.n_layer * (uint64_t)m->hp.n_expert;
  return (8ull << 20) + nk * (XS_MAX_PARTS * 8 + 4 * 4);
}

/* "2.70G" / "310.5M": sizes in messages, in the units --mem-budget takes */
typedef struct szbuf { char s[32]; } szbuf;
static szbuf hsize(uint64_t b) {
  szbuf r;
  if (b >= (1ull << 30)) snprintf(r.s, sizeof r.s, "%.2fG", (double)b / (1024.0 * 1024.0 * 1024.0));
  else snprintf(r.s, sizeof r.s, "%.1fM", (double)b / (1024.0 * 1024.0));
  return r;
}

struct floe_session {
  floe_engine *e;
  model_session *ms;
  int64_t n_ctx;
  int32_t *hist; /* tokens in the cache */
  int64_t n_hist;
  float *last_logits; /* logits after hist (valid when n_hist > 0) */
  int64_t ckpt_every; /* interior checkpoints every this many tokens (0: none) */
  uint64_t acct_bytes; /* counted in the engine's memory budget: model session + checkpoints */
  struct spec *spec;   /* speculative decoding state (engine_mtp.c), NULL until first used */
};

#define PREFILL_STEP MODEL_MAX_BATCH /* one model_eval chunk: no throughput lost by stepping */
#define DEFAULT_CHECKPOINTS 8
#define DEFAULT_CHECKPOINT_EVERY 1024

void floe_engine_params_init(floe_engine_params *p) {
  memset(p, 0, sizeof *p);
  p->prefetch = FLOE_PREFETCH_NEXT;
  p->io_depth = 64;
  p->io_threads = 16;
  p->io_chunk = 512 * 1024;
  p->mtp = -1;
}

void floe_session_params_init(floe_session_params *p) {
  memset(p, 0, sizeof *p);
}

void floe_gen_params_init(floe_gen_params *p) {
  memset(p, 0, sizeof *p);
  p->sampling.top_p = 1.0f;
  p->mtp = -1;
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The device of p->device (FLOE_DEVICE_*): moves the model onto the GPU when asked or when AUTO
 * finds one it fits; AUTO falls back to the CPU with info.device_note saying why. */
static int pick_device(floe_engine *e, const floe_engine_params *p, char *err, size_t errlen) {
  e->info.device = "cpu";
  if (p->device == FLOE_DEVICE_CPU) return 0;
#ifndef FLOE_HAVE_CUDA
  if (p->device == FLOE_DEVICE_CUDA)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "--device cuda: this floe was built without CUDA");
  return 0;
#else
  const bool force = p->device == FLOE_DEVICE_CUDA;
  char why[256] = "";
  const int n = model_cuda_devices();
  int rc = 0;
  if (n <= 0) {
    /* nothing to choose from: AUTO is the CPU without a word (a note on every run of every
     * CPU-only machine would be noise, and stderr's first line is the error of a failed run) */
    if (!force) return 0;
    snprintf(why, sizeof why, "no CUDA device (or no driver)");
  } else if (p->device_index < 0 || p->device_index >= n) {
    snprintf(why, sizeof why, "cuda:%d: there are %d CUDA devices", p->device_index, n);
  } else if (p->mem_budget > 0) {
    snprintf(why, sizeof why, "streamed experts (--mem-budget) run on the CPU");
  } else {
    size_t fr = 0, tot = 0;
    char e2[160];
    if (model_cuda_mem(p->device_index, e->info.gpu_name, sizeof e->info.gpu_name, &fr, &tot, e2, sizeof e2)) {
      snprintf(why, sizeof why, "%s", e2);
    } else {
      const uint64_t need = model_weight_bytes(e->m) + (1ull << 30); /* + KV and scratch */
      e->info.vram_bytes = tot;
      if (!force && need > fr)
        snprintf(why, sizeof why, "the model needs ~%.1f GiB, the GPU has %.1f GiB free", (double)need / (1u << 30),
                 (double)fr / (1u << 30));
      else if ((rc = model_use_backend(e->m, &model_backend_cuda, p->device_index, e2, sizeof e2)))
        snprintf(why, sizeof why, "%s", e2);
      else {
        e->info.device = "cuda";
        return 0;
      }
    }
  }
  e->info.gpu_name[0] = 0;
  e->info.vram_bytes = 0;
  if (force) return floe_err(err, errlen, rc ? rc : FLOE_E_UNSUPPORTED, "--device cuda: %s", why);
  snprintf(e->info.device_note, sizeof e->info.device_note, "running on the CPU: %s", why);
  return 0;
#endif
}

int floe_engine_open(const floe_engine_params *p, floe_engine **out, char *err, size_t errlen) {
  *out = NULL;
  if (!p || !p->model) return floe_err(err, errlen, FLOE_E_INVALID, "no model given");
  floe_engine *e = calloc(1, sizeof *e);
  if (!e) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  floe_thread_progress_set(p->progress, p->progress_user); /* the copy into memory reports through it */
  int rc = model_load_ex(p->model, p->mem_budget > 0 ? FLOE_LOAD_MMAP : p->load, &e->m, err, errlen);
  floe_thread_progress_set(NULL, NULL);
  if (rc) {
    free(e);
    return rc;
  }
  if (e->m->gguf) {
    rc = tok_load_gguf(e->m->gguf, &e->tok, err, errlen);
  } else {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", e->m->path); /* a pack's source directory */
    if (is_dir(e->m->path) && access(path, R_OK) == 0) rc = tok_load_json(path, &e->tok, err, errlen);
    else rc = floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: no tokenizer.json in the model directory", p->model);
  }
  if (rc) {
    model_free(e->m);
    free(e);
    return rc;
  }
  if (tok_n_vocab(e->tok) > e->m->hp.n_vocab) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: tokenizer has %d tokens but the model only %lld logits", p->model,
                  tok_n_vocab(e->tok), (long long)e->m->hp.n_vocab);
    model_free(e->m);
    tok_free(e->tok);
    free(e);
    return rc;
  }
  e->p = *p;
  if (p->mem_budget > 0) { /* streaming: refuse now if resident weights + one layer's top-k cannot fit */
    xs_store *st;
    if ((rc = model_store_open(e->m, p->io_direct, &st, err, errlen)) == 0) {
      const uint64_t K = (uint64_t)e->m->hp.n_expert_used, need = st->resident_bytes + stream_overhead(e->m) +
                                                                      K * (st->slot_bytes + XS_SLOT_OVERHEAD);
      e->info.resident_bytes = st->resident_bytes;
      e->info.expert_slot_bytes = st->slot_bytes;
      if (need > p->mem_budget)
        rc = floe_err(err, errlen, FLOE_E_NOMEM,
                      "memory budget %s is too small: needs at least %s (non-expert weights %s, one layer's "
                      "%llu experts %s, before KV and scratch)",
                      hsize(p->mem_budget).s, hsize(need).s, hsize(st->resident_bytes).s, (unsigned long long)K,
                      hsize(K * st->slot_bytes).s);
      xs_store_close(st);
    }
    if (rc) {
      tok_free(e->tok);
      model_free(e->m);
      free(e);
      return rc;
    }
    e->info.mem_budget = p->mem_budget;
  }
  if ((rc = pick_device(e, p, err, errlen))) {
    tok_free(e->tok);
    model_free(e->m);
    free(e);
    return rc;
  }
  e->im_start = tok_find(e->tok, "<|im_start|>");
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  e->n_threads = p->n_threads > 0 ? p->n_threads : (ncpu > 0 ? (int)ncpu : 1);
  const floe_hparams *hp = &e->m->hp;
  e->info.arch = floe_arch_name(hp->arch);
  e->info.n_vocab = hp->n_vocab;
  e->info.n_embd = hp->n_embd;
  e->info.n_layer = hp->n_layer;
  e->info.n_ctx_train = hp->n_ctx_train;
  e->info.n_expert = hp->n_expert;
  e->info.n_expert_used = hp->n_expert_used;
  e->info.n_mtp = (int)hp->n_mtp;
  e->info.copied = e->m->copied;
  if (e->m->gguf) {
    for (uint64_t i = 0; i < e->m->gguf->n_tensors; i++) {
      const gguf_tensor *t = &e->m->gguf->tensors[i];
      e->info.weight_bytes += t->size;
      if (memmem(t->name.ptr, t->name.len, "_exps.", 6)) e->info.expert_bytes += t->size;
    }
  }
  *out = e;
  return 0;
}

void floe_engine_close(floe_engine *e) {
  if (!e) return;
  tok_free(e->tok);
  model_free(e->m);
  free(e);
}

void floe_engine_info(const floe_engine *e, floe_model_info *out) {
  *out = e->info;
  out->decode_bytes = layer_decode_bytes(e->m);
}

int floe_engine_check(const floe_engine *e, char *err, size_t errlen) {
  /* the same test every evaluation makes before it touches the weights */
  if (e->m->gguf && gguf_check_unchanged(e->m->gguf, err, errlen)) return FLOE_E_IO;
  if (e->m->st && st_model_check_unchanged(e->m->st, err, errlen)) return FLOE_E_IO;
  return 0;
}

#define RBW_MAX_THREADS 256
typedef struct rbw_job {
  const uint8_t *p;
  size_t n;
  uint64_t sink[RBW_MAX_THREADS];
} rbw_job;

static void rbw_worker(void *ctx, int ith, int nth) {
  rbw_job *j = ctx;
  int64_t a, b;
  floe_split_range((int64_t)(j->n / 4096), 1, ith, nth, &a, &b);
  const size_t lo = (size_t)a * 4096, hi = ith == nth - 1 ? j->n : (size_t)b * 4096;
  j->sink[ith] = kern_read_xor(j->p + lo, hi - lo);
}

int floe_engine_read_bandwidth(const floe_engine *e, int n_threads, int passes, double *gbps, char *err, size_t errlen) {
  const model *m = e->m;
  if (!m->copied || !m->gguf || m->xs || m->pack)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED,
                    "read bandwidth: the weights are not one resident GGUF copy (mapped, streamed or a pack)");
  if (n_threads < 1 || n_threads > RBW_MAX_THREADS || passes < 1)
    return floe_err(err, errlen, FLOE_E_INVALID, "read bandwidth: threads must be 1..%d and passes >= 1", RBW_MAX_THREADS);
  floe_pool *pool = floe_pool_create(n_threads);
  if (!pool) return floe_err(err, errlen, FLOE_E_NOMEM, "read bandwidth: cannot start %d threads", n_threads);
  rbw_job j = { .p = m->gguf->map, .n = (size_t)m->gguf->map_size };
  double best = 0;
  for (int i = 0; i < passes; i++) {
    const double t0 = floe_time_s();
    floe_pool_run(pool, rbw_worker, &j);
    const double dt = floe_time_s() - t0;
    if (dt > 0 && (double)j.n / dt / 1e9 > best) best = (double)j.n / dt / 1e9;
  }
  floe_pool_free(pool);
  *gbps = best;
  return 0;
}

void floe_session_stats_get(const floe_session *s, floe_session_stats *out) {
  const double *ph = s->ms->ph;
  memset(out, 0, sizeof *out);
  out->attn_s = ph[MODEL_PH_ATTN];
  out->gdn_s = ph[MODEL_PH_GDN];
  out->router_s = ph[MODEL_PH_ROUTER];
  out->experts_s = ph[MODEL_PH_EXPERTS];
  out->lm_head_s = ph[MODEL_PH_LMHEAD];
  out->other_s = ph[MODEL_PH_OTHER];
  out->n_tokens = s->ms->n_eval_tok;
  out->prefetch_precision = out->prefetch_recall = -1;
  spec_stats(s->spec, out);
  const xstream *x = s->e->m->xs;
  if (!x) return;
  xs_stats st;
  xs_stats_get(x, &st);
  out->bytes_read = st.bytes_read;
  out->reads = st.reads;
  out->expert_hits = st.hits + st.inflight_hits;
  out->expert_misses = st.misses;
  out->prefetch_issued = st.pf_issued;
  out->prefetch_used = st.pf_used;
  out->prefetch_wasted = st.pf_wasted;
  out->io_wait_s = st.io_wait_s;
  out->disk_busy_s = st.disk_busy_s;
  out->serial_s = st.serial_s;
  out->prefault_s = st.prefault_s;
  if (st.pred_n[0]) out->prefetch_precision = (double)st.pred_hit[0] / (double)st.pred_n[0];
  if (st.actual_n[0]) out->prefetch_recall = (double)st.pred_hit[0] / (double)st.actual_n[0];
}

void floe_session_stats_reset(floe_session *s) {
  memset(s->ms->ph, 0, sizeof s->ms->ph);
  s->ms->n_eval_tok = 0;
  spec_stats_reset(s->spec);
  if (s->e->m->xs) xs_stats_reset(s->e->m->xs);
}

void floe_engine_layer_stats(const floe_engine *e, int64_t l, uint64_t *hits, uint64_t *misses) {
  *hits = *misses = 0;
  if (!e->m->xs || l < 0 || l >= xs_store_of(e->m->xs)->n_layer) return; /* l == n_layer: the MTP block */
  const xs_layer_stats *ls = xs_layer_stats_of(e->m->xs);
  *hits = ls[l].hits;
  *misses = ls[l].misses;
}

/* Streaming: the first session sizes the expert cache from what is left of the budget; later
 * sessions must fit in what the cache left. */
static int session_budget(floe_engine *e, floe_session *s, char *err, size_t errlen) {
  const uint64_t B = e->p.mem_budget, sb = s->acct_bytes;
  if (e->m->xs) {
    if (e->budget_used + sb > B)
      return floe_err(err, errlen, FLOE_E_NOMEM, "memory budget %s: no room for another session of %s (%s in use)",
                      hsize(B).s, hsize(sb).s, hsize(e->budget_used).s);
    e->budget_used += sb;
    return 0;
  }
  const uint64_t K = (uint64_t)e->m->hp.n_expert_used, slot = e->info.expert_slot_bytes + XS_SLOT_OVERHEAD;
  const uint64_t fixed = e->info.resident_bytes + stream_overhead(e->m) + sb;
  if (fixed + K * slot > B)
    return floe_err(err, errlen, FLOE_E_NOMEM,
                    "memory budget %s is too small: needs at least %s (non-expert weights %s, KV and scratch "
                    "%s with state checkpoints, one layer's %llu experts %s)",
                    hsize(B).s, hsize(fixed + K * slot).s, hsize(e->info.resident_bytes).s, hsize(sb).s,
                    (unsigned long long)K, hsize(K * e->info.expert_slot_bytes).s);
  const uint64_t n_slots = (B - fixed) / slot;
  xs_params xp = { 0 };
  xp.cache_bytes = n_slots * e->info.expert_slot_bytes;
  xp.io_kind = e->p.io == FLOE_IO_PREAD ? XIO_PREAD : e->p.io == FLOE_IO_URING ? XIO_URING : XIO_AUTO;
  xp.direct = e->p.io_direct;
  xp.policy = e->p.cache_policy == FLOE_CACHE_LFU ? XS_POLICY_LFU : XS_POLICY_LRU;
  xp.prefetch = (e->p.prefetch & FLOE_PREFETCH_NEXT ? XS_PF_NEXT : 0) | (e->p.prefetch & FLOE_PREFETCH_PREV ? XS_PF_PREV : 0) |
                (e->p.prefetch & FLOE_PREFETCH_RESID ? XS_PF_RESID : 0);
  xp.depth = e->p.io_depth;
  xp.threads = e->p.io_threads;
  xp.chunk = e->p.io_chunk;
  xp.verify = e->p.io_verify;
  xp.no_prefault = e->p.io_no_prefault;
  int rc = model_stream_start(e->m, &xp, err, errlen);
  if (rc) return rc;
  e->info.cache_bytes = xp.cache_bytes;
  e->info.cache_slots = (int64_t)n_slots;
  e->budget_used = fixed + n_slots * slot;
  return 0;
}

const tok_vocab *engine_tok(const floe_engine *e) { return e->tok; }
int engine_arch(const floe_engine *e) { return e->m->hp.arch; }

int floe_tokenize(const floe_engine *e, const char *text, size_t len, bool parse_special, int32_t **ids, size_t *n,
                  char *err, size_t errlen) {
  tok_ids a = {0};
  int rc = tok_encode(e->tok, text, len, parse_special, &a, err, errlen);
  if (rc) {
    tok_ids_free(&a);
    return rc;
  }
  *ids = a.v;
  *n = a.n;
  return 0;
}

const char *floe_token_piece(const floe_engine *e, int32_t id, size_t *len) { return tok_piece(e->tok, id, len); }
bool floe_token_is_eog(const floe_engine *e, int32_t id) { return tok_is_eog(e->tok, id); }
int32_t floe_token_find(const floe_engine *e, const char *text) { return tok_find(e->tok, text); }

int32_t floe_argmax(const float *logits, size_t n) { return n > 0 && n <= INT32_MAX ? (int32_t)kern_argmax(logits, (int64_t)n) : 0; }

int32_t floe_session_argmax(const floe_session *s) {
  if (s->n_hist == 0) return -1;
  if (s->ms->greedy >= 0) return (int32_t)s->ms->greedy; /* found while the logits were computed */
  return floe_argmax(s->last_logits, (size_t)s->e->m->hp.n_vocab);
}

int floe_session_new(floe_engine *e, const floe_session_params *p, floe_session **out, char *err, size_t errlen) {
  *out = NULL;
  floe_session_params def;
  if (!p) {
    floe_session_params_init(&def);
    p = &def;
  }
  floe_session *s = calloc(1, sizeof *s);
  if (!s) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  s->e = e;
  int rc = model_session_new(e->m, p->n_ctx, p->kv_f32 ? KV_F32 : KV_BF16, e->n_threads, &s->ms, err, errlen);
  if (rc) {
    free(s);
    return rc;
  }
  model_session_set_exact(s->ms, p->exact_act);
  const int n_ckpt = p->n_checkpoints == 0 ? DEFAULT_CHECKPOINTS : p->n_checkpoints < 0 ? 0 : p->n_checkpoints;
  s->ckpt_every = p->checkpoint_every == 0 ? DEFAULT_CHECKPOINT_EVERY : p->checkpoint_every < 0 ? 0 : p->checkpoint_every;
  if ((rc = model_session_set_ckpt_max(s->ms, n_ckpt, err, errlen))) {
    model_session_free(s->ms);
    free(s);
    return rc;
  }
  /* checkpoint buffers are allocated on first use but counted now, so a budget holds them all */
  s->acct_bytes = s->ms->bytes + (uint64_t)s->ms->max_ckpt * model_session_ckpt_bytes(s->ms);
  if (e->p.mem_budget > 0 && (rc = session_budget(e, s, err, errlen))) {
    model_session_free(s->ms);
    free(s);
    return rc;
  }
  s->n_ctx = s->ms->kv.n_ctx;
  s->hist = malloc((size_t)s->n_ctx * sizeof *s->hist);
  s->last_logits = malloc((size_t)e->m->hp.n_vocab * sizeof(float));
  if (!s->hist || !s->last_logits) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory for a context of %lld tokens", (long long)s->n_ctx);
    floe_session_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void floe_session_free(floe_session *s) {
  if (!s) return;
  if (s->ms && s->e->m->xs && s->e->budget_used >= s->acct_bytes) s->e->budget_used -= s->acct_bytes;
  model_session_free(s->ms);
  spec_free(s->spec);
  free(s->hist);
  free(s->last_logits);
  free(s);
}

int64_t floe_session_n_ctx(const floe_session *s) { return s->n_ctx; }
int64_t floe_session_n_past(const floe_session *s) { return s->n_hist; }

void floe_session_reset(floe_session *s) {
  model_session_reset(s->ms);
  spec_rewound(s->spec, 0);
  s->n_hist = 0;
}

/* floe_session_eval's bookkeeping around spec_eval (the MTP's rows are fed as well). */
static int session_eval_spec(floe_session *s, const int32_t *ids, int64_t n, char *err, size_t errlen) {
  int rc = spec_eval(s->spec, s->ms, ids, n, s->last_logits, err, errlen);
  if (rc) {
    floe_session_reset(s);
    return rc;
  }
  memcpy(s->hist + s->n_hist, ids, (size_t)n * sizeof *ids);
  s->n_hist += n;
  return 0;
}

/* Length of the common prefix of the history and prompt[0..n). */
static int64_t common_prefix(const floe_session *s, const int32_t *prompt, size_t n) {
  const int64_t lim = s->n_hist < (int64_t)n ? s->n_hist : (int64_t)n;
  int64_t c = 0;
  while (c < lim && s->hist[c] == prompt[c]) c++;
  return c;
}

/* Where a prompt resumes: the whole history when it is a prefix of the prompt (the last logits
 * are then the history's), else the largest restorable position <= the common prefix and
 * < n (the last prompt token's logits must be computed). */
static int64_t resume_pos(const floe_session *s, int64_t c, size_t n, bool apply) {
  if (c == s->n_hist) return c;
  const int64_t want = c < (int64_t)n - 1 ? c : (int64_t)n - 1;
  return apply ? model_session_rewind(s->ms, want) : model_session_rewind_pos(s->ms, want);
}

int64_t floe_session_reusable(const floe_session *s, const int32_t *prompt, size_t n) {
  if (!prompt || n == 0) return 0;
  return resume_pos(s, common_prefix(s, prompt, n), n, false);
}

int floe_session_checkpoints(const floe_session *s, int64_t *pos, int cap) {
  return model_session_ckpt_list(s->ms, pos, cap);
}

int floe_session_eval(floe_session *s, const int32_t *ids, size_t n, float *logits, bool all_logits, char *err,
                      size_t errlen) {
  if (n == 0) return floe_err(err, errlen, FLOE_E_INVALID, "nothing to evaluate");
  int64_t nv = s->e->m->hp.n_vocab;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= nv)
      return floe_err(err, errlen, FLOE_E_INVALID, "token id %d out of range [0, %lld)", ids[i], (long long)nv);
  if (s->n_hist + (int64_t)n > s->n_ctx)
    return floe_err(err, errlen, FLOE_E_CONTEXT, "%lld tokens do not fit the context of %lld (%lld in use)",
                    (long long)n, (long long)s->n_ctx, (long long)s->n_hist);
  /* the last position's logits always land in last_logits (floe_session_argmax, generation) */
  float *dst = all_logits && logits ? logits : s->last_logits;
  int rc = model_eval(s->ms, ids, (int64_t)n, dst, all_logits && logits, err, errlen);
  if (rc) {
    floe_session_reset(s); /* state is undefined after a failed eval */
    return rc;
  }
  spec_forget_hidden(s->spec); /* evaluated without hidden states: the next MTP row has no input */
  if (all_logits && logits) memcpy(s->last_logits, logits + (n - 1) * (size_t)nv, (size_t)nv * sizeof(float));
  else if (logits) memcpy(logits, s->last_logits, (size_t)nv * sizeof(float));
  memcpy(s->hist + s->n_hist, ids, n * sizeof *ids);
  s->n_hist += (int64_t)n;
  return 0;
}

/* ---- generation ---- */

/* Length of the longest prefix of buf[0..n) made of complete UTF-8 characters (invalid bytes count
 * as complete single characters, so nothing is held forever). */
static size_t utf8_complete(const char *buf, size_t n) {
  size_t i = n, back = 0;
  while (i > 0 && back < 4) {
    unsigned char c = (unsigned char)buf[i - 1];
    if ((c & 0xc0) != 0x80) { /* a lead byte or ASCII at i-1 */
      size_t need = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
      return (n - (i - 1) >= need) ? n : i - 1;
    }
    i--;
    back++;
  }
  return n;
}

typedef struct textbuf { char *p; size_t n, cap; } textbuf;

static int textbuf_add(textbuf *b, const char *d, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = 0;
  return 0;
}

/* log-softmax of the chosen token and the top-n alternatives. */
static float logprob_of(const float *logits, int64_t nv, int32_t id, int n_top, int32_t *top_ids, float *top_lp) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < nv; i++)
    if (logits[i] > mx) mx = logits[i];
  double sum = 0;
  for (int64_t i = 0; i < nv; i++) sum += exp((double)logits[i] - mx);
  double lse = mx + log(sum);
  for (int k = 0; k < n_top; k++) {
    top_ids[k] = -1;
    top_lp[k] = -INFINITY;
  }
  for (int64_t i = 0; i < nv && n_top > 0; i++) {
    float v = logits[i];
    if (top_ids[n_top - 1] >= 0 && !(v > top_lp[n_top - 1])) continue;
    int k = n_top - 1;
    while (k > 0 && (top_ids[k - 1] < 0 || v > top_lp[k - 1])) {
      top_ids[k] = top_ids[k - 1];
      top_lp[k] = top_lp[k - 1];
      k--;
    }
    top_ids[k] = (int32_t)i;
    top_lp[k] = v;
  }
  for (int k = 0; k < n_top; k++)
    if (top_ids[k] >= 0) top_lp[k] = (float)(top_lp[k] - lse);
  return (float)(logits[id] - lse);
}

/* Evaluates prompt[from..n) (the session holds prompt[0..from)), saving checkpoints: TURN at
 * the prompt's end and at its last two <|im_start|> tokens (the state before each), INTERIOR at
 * multiples of ckpt_every. Steps end at those positions and at multiples of PREFILL_STEP. */
static int prefill(floe_session *s, const int32_t *prompt, int64_t n, int64_t from, const floe_gen_params *p,
                   void *user, bool use_mtp, bool *stopped, char *err, size_t errlen) {
  int64_t turn[3] = { n, -1, -1 }; /* the prompt end and the last two turn starts at or after from */
  for (int64_t i = n - 1, k = 1; i >= from && k < 3 && s->e->im_start >= 0; i--)
    if (prompt[i] == s->e->im_start) turn[k++] = i;
  const bool ckpt = s->ms->max_ckpt > 0;
  for (int64_t pos = from;;) {
    if (ckpt && pos > 0) { /* best effort: a checkpoint that cannot be allocated is skipped */
      if (pos == turn[0] || pos == turn[1] || pos == turn[2]) model_session_checkpoint(s->ms, MODEL_CKPT_TURN);
      else if (pos > from && s->ckpt_every > 0 && pos % s->ckpt_every == 0)
        model_session_checkpoint(s->ms, MODEL_CKPT_INTERIOR);
    }
    if (pos >= n) return 0;
    if (p->should_stop && p->should_stop(user)) {
      *stopped = true;
      return 0;
    }
    int64_t next = (pos / PREFILL_STEP + 1) * PREFILL_STEP;
    if (next > n) next = n;
    for (int k = 1; k < 3; k++)
      if (turn[k] > pos && turn[k] < next) next = turn[k];
    if (ckpt && s->ckpt_every > 0) {
      const int64_t b = (pos / s->ckpt_every + 1) * s->ckpt_every;
      if (b < next) next = b;
    }
    int rc = use_mtp ? session_eval_spec(s, prompt + pos, next - pos, err, errlen)
                     : floe_session_eval(s, prompt + pos, (size_t)(next - pos), NULL, false, err, errlen);
    if (rc) return rc;
    pos = next;
  }
}

int floe_generate(floe_session *s, const int32_t *prompt, size_t n_prompt, const floe_gen_params *p,
                  floe_token_cb cb, void *user, floe_gen_result *res, char *err, size_t errlen) {
  floe_gen_result r = {0};
  floe_gen_params def;
  if (!p) {
    floe_gen_params_init(&def);
    p = &def;
  }
  if (n_prompt == 0) return floe_err(err, errlen, FLOE_E_INVALID, "empty prompt");
  if ((int64_t)n_prompt > s->n_ctx)
    return floe_err(err, errlen, FLOE_E_CONTEXT, "prompt has %zu tokens but the context holds %lld", n_prompt,
                    (long long)s->n_ctx);
  if (p->n_top_logprobs < 0 || p->n_top_logprobs > 20)
    return floe_err(err, errlen, FLOE_E_INVALID, "top_logprobs must be in [0, 20] (got %d)", p->n_top_logprobs);
  for (size_t i = 0; i < p->n_stop; i++)
    if (!p->stop[i] || !p->stop[i][0]) return floe_err(err, errlen, FLOE_E_INVALID, "empty stop string");

  const int64_t nv = s->e->m->hp.n_vocab;
  sampler_params sp = sampler_default_params();
  sp.temperature = p->sampling.temperature;
  sp.top_k = p->sampling.top_k;
  sp.top_p = p->sampling.top_p;
  sp.min_p = p->sampling.min_p;
  sp.seed = p->sampling.seed;
  const int mtp_k = p->mtp >= 0 ? p->mtp : s->e->p.mtp; /* -1: automatic */
  if (mtp_k > 4) return floe_err(err, errlen, FLOE_E_INVALID, "mtp must be -1 (auto), 0 (off) or 1..4 (got %d)", mtp_k);
  sampler *smp;
  int rc = sampler_new(&sp, (int32_t)nv, &smp, err, errlen);
  if (rc) return rc;
  /* automatic k only for greedy requests: the choice follows measured step times, and a sampled
   * request's random draws depend on the k of each step, so a seed would no longer reproduce its
   * sample (a forced k keeps it reproducible) */
  const bool use_mtp = mtp_k != 0 && (mtp_k > 0 || sampler_greedy(smp)) && model_has_mtp(s->e->m) &&
                       s->e->m->be == &model_backend_cpu;
  if (use_mtp && !s->spec && (rc = spec_new(s->ms, &s->spec, err, errlen))) {
    sampler_free(smp);
    return rc;
  }

  /* prefix reuse: resume at the common prefix (or the restorable position before it) */
  r.n_prompt = (int64_t)n_prompt;
  double t0 = floe_time_s();
  for (size_t i = 0; i < n_prompt; i++) /* before touching the session: a bad id must not cost the cache */
    if (prompt[i] < 0 || prompt[i] >= nv) {
      sampler_free(smp);
      return floe_err(err, errlen, FLOE_E_INVALID, "token id %d out of range [0, %lld)", prompt[i], (long long)nv);
    }
  const int64_t keep = resume_pos(s, common_prefix(s, prompt, n_prompt), n_prompt, true);
  if (keep != s->n_hist) spec_rewound(s->spec, keep);
  s->n_hist = keep;
  r.n_reused = keep;
  bool stopped = false;
  rc = prefill(s, prompt, (int64_t)n_prompt, keep, p, user, use_mtp, &stopped, err, errlen);
  double t1 = floe_time_s();
  r.prefill_s = t1 - t0;
  if (rc || stopped) {
    sampler_free(smp);
    r.finish = FLOE_FINISH_CANCELLED;
    if (res && !rc) *res = r;
    return rc;
  }

  textbuf pend = {0};
  int32_t top_ids[20];
  float top_lp[20];
  int finish = FLOE_FINISH_NONE;
  size_t max_stop = 0;
  for (size_t i = 0; i < p->n_stop; i++)
    if (strlen(p->stop[i]) > max_stop) max_stop = strlen(p->stop[i]);

  /* speculative steps (engine_mtp.c): drafts the trunk accepted are already in the session and
   * are emitted one by one before the next token is chosen; forced: the sampling rule's token */
  int32_t acc[4], forced = -1;
  int n_acc = 0, acc_i = 0;
  const float *acc_lg = NULL;
  while (finish == FLOE_FINISH_NONE) {
    if (p->max_tokens > 0 && r.n_gen >= p->max_tokens) {
      finish = FLOE_FINISH_LENGTH;
      break;
    }
    int32_t id;
    const float *lg = s->last_logits; /* the logits the token was chosen from */
    const bool drafted = acc_i < n_acc; /* an accepted draft: already in the session */
    if (drafted) {
      lg = acc_lg + (size_t)acc_i * (size_t)nv;
      id = acc[acc_i++];
    } else if (forced >= 0) {
      id = forced;
      forced = -1;
    } else {
      id = sampler_greedy(smp) ? floe_session_argmax(s) : sampler_sample(smp, s->last_logits);
    }
    floe_token_event ev = {0};
    ev.id = id;
    if (p->logprobs || p->n_top_logprobs) {
      ev.logprob = logprob_of(lg, nv, id, p->n_top_logprobs, top_ids, top_lp);
      ev.n_top = p->n_top_logprobs;
      ev.top_ids = top_ids;
      ev.top_logprobs = top_lp;
    }
    r.n_gen++;
    bool eog = tok_is_eog(s->e->tok, id);
    if (!eog) {
      size_t plen;
      const char *piece = tok_piece(s->e->tok, id, &plen);
      if (piece && textbuf_add(&pend, piece, plen)) {
        rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
        break;
      }
    }
    /* decide what text this token releases */
    size_t complete = eog ? pend.n : utf8_complete(pend.p ? pend.p : "", pend.n);
    size_t release = complete;
    for (size_t i = 0; i < p->n_stop && pend.n; i++) {
      const char *hit = memmem(pend.p, pend.n, p->stop[i], strlen(p->stop[i]));
      if (hit && (size_t)(hit - pend.p) <= release) {
        release = (size_t)(hit - pend.p);
        finish = FLOE_FINISH_STOP;
      }
    }
    if (finish != FLOE_FINISH_STOP && !eog && max_stop) {
      /* hold back a tail that could still grow into a stop string */
      for (size_t i = 0; i < p->n_stop; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t k = sl - 1; k > 0; k--) {
          if (k <= release && !memcmp(pend.p + release - k, p->stop[i], k)) {
            release -= k;
            break;
          }
        }
      }
    }
    if (eog) finish = FLOE_FINISH_STOP;
    ev.text = pend.p ? pend.p : "";
    ev.text_len = release;
    if (cb && cb(user, &ev)) {
      if (finish == FLOE_FINISH_NONE) finish = FLOE_FINISH_CANCELLED;
    }
    if (release) {
      memmove(pend.p, pend.p + release, pend.n - release);
      pend.n -= release;
      pend.p[pend.n] = 0;
    }
    if (finish != FLOE_FINISH_NONE) break;
    if (drafted) continue;
    if (s->n_hist >= s->n_ctx) {
      finish = FLOE_FINISH_LENGTH;
      break;
    }
    if (use_mtp) {
      const int k = spec_choose_k(s->spec, mtp_k, s->n_ctx - s->n_hist - 1);
      rc = spec_step(s->spec, s->ms, smp, id, k, s->last_logits, acc, &n_acc, &acc_lg, &forced, err, errlen);
      if (rc) {
        floe_session_reset(s); /* state is undefined after a failed step */
        break;
      }
      s->hist[s->n_hist++] = id;
      for (int i = 0; i < n_acc; i++) s->hist[s->n_hist++] = acc[i];
      acc_i = 0;
    } else {
      rc = floe_session_eval(s, &id, 1, NULL, false, err, errlen);
    }
    if (rc) break;
  }
  /* flush text held back for a stop string that never came */
  if (rc == 0 && finish == FLOE_FINISH_LENGTH && pend.n && cb) {
    floe_token_event ev = {0};
    ev.id = -1;
    ev.text = pend.p;
    ev.text_len = pend.n;
    cb(user, &ev);
  }
  free(pend.p);
  sampler_free(smp);
  r.finish = finish;
  r.decode_s = floe_time_s() - t1;
  if (res) *res = r;
  return rc;
}
