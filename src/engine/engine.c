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
 * Generation is a state machine (floe_gen): the prompt in chunks of at most one model_eval chunk
 * (model.h max_batch: 512 tokens on the CPU, up to FLOE_CUDA_CHUNK on a GPU; smaller when a
 * server steps it beside others), asking should_stop between them (a stopped prefill leaves
 * history = the tokens evaluated, and their last logits), then one token per step.
 * floe_gen_step steps several generations of distinct sessions together and evaluates their rows
 * in one batched pass (model_eval_multi); floe_generate steps one alone.
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
  uint64_t budget_reserved; /* part of budget_used kept for sessions still to come (budget_sessions) */
  uint64_t vram_free0;      /* the GPU's free memory before the model was loaded onto it */
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
  bool from_reserve;   /* its budget came from budget_reserved (returned there when freed) */
};

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
  if (p->gpu_mem && p->device == FLOE_DEVICE_CPU)
    return floe_err(err, errlen, FLOE_E_INVALID, "--gpu-mem needs the CUDA device, not --device cpu");
  if (p->device == FLOE_DEVICE_CPU) return 0;
#ifndef FLOE_HAVE_CUDA
  if (p->device == FLOE_DEVICE_CUDA || p->gpu_mem)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: this floe was built without CUDA",
                    p->gpu_mem ? "--gpu-mem" : "--device cuda");
  return 0;
#else
  const bool force = p->device == FLOE_DEVICE_CUDA || p->gpu_mem;
  char why[300] = "";
  const int n = model_cuda_devices();
  int rc = 0;
  if (n <= 0) {
    /* nothing to choose from: AUTO is the CPU without a word (a note on every run of every
     * CPU-only machine would be noise, and stderr's first line is the error of a failed run) */
    if (!force) return 0;
    snprintf(why, sizeof why, "no CUDA device (or no driver)");
  } else if (p->device_index < 0 || p->device_index >= n) {
    snprintf(why, sizeof why, "cuda:%d: there are %d CUDA devices", p->device_index, n);
  } else if (p->mem_budget > 0 && !p->gpu_mem) {
    snprintf(why, sizeof why, "streamed experts (--mem-budget) need --gpu-mem on the GPU");
  } else {
    size_t fr = 0, tot = 0;
    char e2[240];
    if (model_cuda_mem(p->device_index, e->info.gpu_name, sizeof e->info.gpu_name, &fr, &tot, e2, sizeof e2)) {
      snprintf(why, sizeof why, "%s", e2);
    } else {
      /* + KV and scratch; with gpu_mem, what it allows (the experts beyond stay in host memory) */
      const uint64_t need = p->gpu_mem ? p->gpu_mem : model_weight_bytes(e->m) + (1ull << 30);
      e->info.vram_bytes = tot;
      e->vram_free0 = fr;
      e->m->gpu_mem = p->gpu_mem;
      if (p->gpu_mem && need > fr)
        snprintf(why, sizeof why, "--gpu-mem %.1f GiB: the GPU has %.1f GiB free", (double)need / (1u << 30),
                 (double)fr / (1u << 30));
      else if (!force && need > fr)
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
  e->m->gpu_mem = 0;
  if (force)
    return floe_err(err, errlen, rc ? rc : FLOE_E_UNSUPPORTED, "%s: %s", p->gpu_mem ? "--gpu-mem" : "--device cuda",
                    why);
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
  e->info.lanes_bytes = model_pack_lanes(e->m); /* the CPU's copy, repacked (nothing on the GPU) */
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
  out->vram_used_bytes = 0;
#ifdef FLOE_HAVE_CUDA
  size_t fr = 0, tot = 0;
  char name[8], msg[64];
  if (e->info.device && !strcmp(e->info.device, "cuda") &&
      model_cuda_mem(e->p.device_index, name, sizeof name, &fr, &tot, msg, sizeof msg) == 0 && fr < e->vram_free0)
    out->vram_used_bytes = e->vram_free0 - fr;
#endif
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
  model_tier_stats ts;
  if (model_tier_stats_get(s->e->m, &ts) == 0) {
    out->tier_on = true;
    out->tier_pinned = ts.pinned;
    out->tier_pool_bytes = ts.pool_bytes;
    out->tier_slots = ts.slots;
    out->tier_lookups = ts.lookups;
    out->tier_hits = ts.hits;
    out->tier_copies = ts.copies;
    out->tier_cpu = ts.cpu;
    out->tier_h2d_bytes = ts.h2d_bytes;
    out->tier_pf_issued = ts.pf_issued;
    out->tier_pf_used = ts.pf_used;
    out->tier_graph_launches = ts.graph_launches;
    out->tier_wait_s = ts.wait_s;
    out->tier_cpu_s = ts.cpu_s;
    out->tier_pcie_gbps = ts.pcie_gbps;
    out->tier_cpu_expert_s = ts.cpu_expert_s;
    out->tier_gpu_gbps = ts.gpu_gbps;
  }
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
  model_tier_stats_reset(s->e->m);
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
static int session_budget(floe_engine *e, floe_session *s, int more, char *err, size_t errlen) {
  const uint64_t B = e->p.mem_budget, sb = s->acct_bytes;
  if (e->m->xs && e->budget_reserved >= sb) { /* room the first session kept for this one */
    e->budget_reserved -= sb;
    s->from_reserve = true;
    return 0;
  }
  if (e->m->xs) {
    if (e->budget_used + sb > B)
      return floe_err(err, errlen, FLOE_E_NOMEM, "memory budget %s: no room for another session of %s (%s in use)",
                      hsize(B).s, hsize(sb).s, hsize(e->budget_used).s);
    e->budget_used += sb;
    return 0;
  }
  const uint64_t K = (uint64_t)e->m->hp.n_expert_used, slot = e->info.expert_slot_bytes + XS_SLOT_OVERHEAD;
  const uint64_t fixed = e->info.resident_bytes + stream_overhead(e->m) + sb * (uint64_t)(1 + (more > 0 ? more : 0));
  if (fixed + K * slot > B)
    return floe_err(err, errlen, FLOE_E_NOMEM,
                    "memory budget %s is too small: needs at least %s (non-expert weights %s, KV and scratch "
                    "%s with state checkpoints for %d session%s, one layer's %llu experts %s)",
                    hsize(B).s, hsize(fixed + K * slot).s, hsize(e->info.resident_bytes).s,
                    hsize(sb * (uint64_t)(1 + (more > 0 ? more : 0))).s, 1 + (more > 0 ? more : 0), more > 0 ? "s" : "",
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
  e->budget_reserved = sb * (uint64_t)(more > 0 ? more : 0);
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
  if (model_logits_sync(s->ms, NULL, 0)) return -1; /* deferred logits (model.h lazy_ok) */
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
  if (p->share_threads && (p->share_threads->e != e ||
                            (rc = model_session_share_pool(s->ms, p->share_threads->ms, err, errlen)))) {
    if (!rc) rc = floe_err(err, errlen, FLOE_E_INVALID, "share_threads: a session of another engine");
    model_session_free(s->ms);
    free(s);
    return rc;
  }
  if (e->p.mem_budget > 0 && (rc = session_budget(e, s, p->budget_sessions, err, errlen))) {
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
  if (s->ms && s->e->m->xs && s->from_reserve) s->e->budget_reserved += s->acct_bytes;
  else if (s->ms && s->e->m->xs && s->e->budget_used >= s->acct_bytes) s->e->budget_used -= s->acct_bytes;
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
  /* no logits asked for: the caller needs at most the greedy pick (floe_session_argmax), so the
   * backend may leave them on the device; every reader of last_logits fetches them first */
  s->ms->lazy_ok = logits == NULL;
  /* one token without logits: greedy decoding (floe bench's loop), so the device may start the
   * step for its pick at once (model.h ahead_ok; any other next use only waits for that step) */
  s->ms->ahead_ok = logits == NULL && n == 1;
  int rc = model_eval(s->ms, ids, (int64_t)n, dst, all_logits && logits, err, errlen);
  s->ms->lazy_ok = s->ms->ahead_ok = false;
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

/* ---- generation as a state machine (floe_gen): floe_generate runs one, a server steps many ----
 * A generation first evaluates its prompt in chunks (PREFILL), then alternates: choose the next
 * token from the last logits and emit its text (DECODE), evaluate it. A step does one chunk or one
 * token per generation; floe_gen_step evaluates the rows of all generations of the step in one
 * batched pass (model_eval_multi). Every op being row-exact, a generation's tokens do not depend
 * on what is stepped beside it or on the chunk size. */
enum { GEN_PREFILL = 0, GEN_DECODE, GEN_DONE };

struct floe_gen {
  floe_session *s;
  floe_gen_params p;         /* the caller's; its stop strings must outlive the generation */
  floe_token_cb cb;
  void *user;
  int32_t *prompt;           /* a copy */
  int64_t n_prompt;
  int phase;                 /* GEN_* */
  int64_t pos;               /* prefill: the next prompt position to evaluate */
  int64_t turn[3];           /* the prompt end and its last two turn starts (checkpointed) */
  sampler *smp;
  int mtp_k;                 /* drafts per step: -1 automatic */
  bool use_mtp;
  textbuf pend;              /* generated bytes not yet released (UTF-8, stop strings) */
  size_t max_stop;
  /* speculative steps: drafts the trunk accepted are already in the session and are emitted one
   * by one before the next token is chosen; forced: the sampling rule's token */
  int32_t acc[4], forced;
  int n_acc, acc_i;
  const float *acc_lg;
  int32_t top_ids[20];
  float top_lp[20];
  floe_gen_result r;
  double t0, t1;
  int rc;
  bool res_valid;            /* r is the result (false after a failed prefill, as floe_generate did) */
  char err[384];
};

/* Ends a generation: the text held back for a stop string that never came is flushed when it ran
 * out of tokens, and the decode time is taken. */
static void gen_finish(floe_gen *g, int finish) {
  g->r.finish = finish;
  if (g->rc == 0 && finish == FLOE_FINISH_LENGTH && g->pend.n && g->cb) {
    floe_token_event ev = {0};
    ev.id = -1;
    ev.text = g->pend.p;
    ev.text_len = g->pend.n;
    g->cb(g->user, &ev);
  }
  if (g->phase == GEN_DECODE) g->r.decode_s = floe_time_s() - g->t1;
  g->phase = GEN_DONE;
}

static void gen_fail(floe_gen *g, int rc, const char *err) {
  g->rc = rc;
  snprintf(g->err, sizeof g->err, "%s", err);
  g->res_valid = g->phase == GEN_DECODE;
  if (g->phase == GEN_DECODE) g->r.decode_s = floe_time_s() - g->t1;
  g->phase = GEN_DONE;
}

int floe_gen_begin(floe_session *s, const int32_t *prompt, size_t n_prompt, const floe_gen_params *p,
                   floe_token_cb cb, void *user, floe_gen **out, char *err, size_t errlen) {
  *out = NULL;
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
  for (size_t i = 0; i < n_prompt; i++) /* before touching the session: a bad id must not cost the cache */
    if (prompt[i] < 0 || prompt[i] >= nv)
      return floe_err(err, errlen, FLOE_E_INVALID, "token id %d out of range [0, %lld)", prompt[i], (long long)nv);
  const int mtp_k = p->mtp >= 0 ? p->mtp : s->e->p.mtp; /* -1: automatic */
  if (mtp_k > 4) return floe_err(err, errlen, FLOE_E_INVALID, "mtp must be -1 (auto), 0 (off) or 1..4 (got %d)", mtp_k);
  floe_gen *g = calloc(1, sizeof *g);
  if (!g || !(g->prompt = malloc(n_prompt * sizeof *g->prompt))) {
    free(g);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  memcpy(g->prompt, prompt, n_prompt * sizeof *prompt);
  g->s = s;
  g->p = *p;
  g->cb = cb;
  g->user = user;
  g->n_prompt = (int64_t)n_prompt;
  g->mtp_k = mtp_k;
  g->use_mtp = mtp_k != 0 && model_mtp_runs(s->e->m);
  g->forced = -1;
  for (size_t i = 0; i < p->n_stop; i++)
    if (strlen(p->stop[i]) > g->max_stop) g->max_stop = strlen(p->stop[i]);
  sampler_params sp = sampler_default_params();
  sp.temperature = p->sampling.temperature;
  sp.top_k = p->sampling.top_k;
  sp.top_p = p->sampling.top_p;
  sp.min_p = p->sampling.min_p;
  sp.seed = p->sampling.seed;
  int rc = sampler_new(&sp, (int32_t)nv, &g->smp, err, errlen);
  /* automatic k only for greedy requests: the choice follows measured step times, and a sampled
   * request's random draws depend on the k of each step, so a seed would no longer reproduce its
   * sample (a forced k keeps it reproducible) */
  if (!rc && g->use_mtp && mtp_k < 0 && !sampler_greedy(g->smp)) g->use_mtp = false;
  if (!rc && g->use_mtp && !s->spec) rc = spec_new(s->ms, &s->spec, err, errlen);
  if (rc) {
    sampler_free(g->smp);
    free(g->prompt);
    free(g);
    return rc;
  }
  /* prefix reuse: resume at the common prefix (or the restorable position before it) */
  g->r.n_prompt = g->n_prompt;
  g->t0 = floe_time_s();
  const int64_t keep = resume_pos(s, common_prefix(s, prompt, n_prompt), n_prompt, true);
  if (keep != s->n_hist) spec_rewound(s->spec, keep);
  s->n_hist = keep;
  g->r.n_reused = keep;
  g->pos = keep;
  g->turn[0] = g->n_prompt;
  g->turn[1] = g->turn[2] = -1;
  for (int64_t i = g->n_prompt - 1, k = 1; i >= keep && k < 3 && s->e->im_start >= 0; i--)
    if (prompt[i] == s->e->im_start) g->turn[k++] = i;
  g->phase = GEN_PREFILL;
  *out = g;
  return 0;
}

/* Prefill bookkeeping at g->pos: the checkpoints due there (TURN at the prompt's end and at its
 * last two <|im_start|> tokens, the state before each; INTERIOR at multiples of ckpt_every), then
 * the end of the next chunk (*next), which stops at those positions and at multiples of `chunk`.
 * Returns false when the prefill is over (done, or stopped by should_stop: the generation ends
 * CANCELLED, the session keeps the tokens evaluated so far). */
static bool gen_prefill_next(floe_gen *g, int64_t chunk, int64_t *next) {
  floe_session *s = g->s;
  const int64_t pos = g->pos, n = g->n_prompt;
  const bool ckpt = s->ms->max_ckpt > 0;
  if (ckpt && pos > 0) { /* best effort: a checkpoint that cannot be allocated is skipped */
    if (pos == g->turn[0] || pos == g->turn[1] || pos == g->turn[2]) model_session_checkpoint(s->ms, MODEL_CKPT_TURN);
    else if (pos > g->r.n_reused && s->ckpt_every > 0 && pos % s->ckpt_every == 0)
      model_session_checkpoint(s->ms, MODEL_CKPT_INTERIOR);
  }
  if (pos >= n) {
    g->t1 = floe_time_s();
    g->r.prefill_s = g->t1 - g->t0;
    g->phase = GEN_DECODE;
    return false;
  }
  if (g->p.should_stop && g->p.should_stop(g->user)) {
    g->r.prefill_s = floe_time_s() - g->t0;
    g->phase = GEN_DONE; /* floe_generate's contract: a stopped prefill returns 0, finish CANCELLED */
    g->r.finish = FLOE_FINISH_CANCELLED;
    return false;
  }
  int64_t e = (pos / chunk + 1) * chunk;
  if (e > n) e = n;
  for (int k = 1; k < 3; k++)
    if (g->turn[k] > pos && g->turn[k] < e) e = g->turn[k];
  if (ckpt && s->ckpt_every > 0) {
    const int64_t b = (pos / s->ckpt_every + 1) * s->ckpt_every;
    if (b < e) e = b;
  }
  *next = e;
  return true;
}

/* Whether the generation reads only the greedy pick of its logits (no sampling, no logprobs, no
 * MTP): then an evaluation may leave them on the device (model.h lazy_ok). */
static bool gen_greedy_only(const floe_gen *g) {
  return sampler_greedy(g->smp) && !g->p.logprobs && !g->p.n_top_logprobs && !g->use_mtp;
}

/* Chooses the next token of a decoding generation and emits its text. Returns true when the
 * token must now be evaluated (*id), false when it needs no evaluation (an accepted draft, already
 * in the session) or the generation ended. */
static bool gen_pick(floe_gen *g, int32_t *id_out) {
  floe_session *s = g->s;
  const floe_gen_params *p = &g->p;
  const int64_t nv = s->e->m->hp.n_vocab;
  if (p->max_tokens > 0 && g->r.n_gen >= p->max_tokens) {
    gen_finish(g, FLOE_FINISH_LENGTH);
    return false;
  }
  if (!gen_greedy_only(g)) { /* the logits themselves are read: a deferred row comes over now */
    char err[256];
    const int rc = model_logits_sync(s->ms, err, sizeof err);
    if (rc) {
      gen_fail(g, rc, err);
      return false;
    }
  }
  int32_t id;
  const float *lg = s->last_logits; /* the logits the token was chosen from */
  const bool drafted = g->acc_i < g->n_acc; /* an accepted draft: already in the session */
  if (drafted) {
    lg = g->acc_lg + (size_t)g->acc_i * (size_t)nv;
    id = g->acc[g->acc_i++];
  } else if (g->forced >= 0) {
    id = g->forced;
    g->forced = -1;
  } else {
    id = sampler_greedy(g->smp) ? floe_session_argmax(s) : sampler_sample(g->smp, s->last_logits);
  }
  floe_token_event ev = {0};
  ev.id = id;
  if (p->logprobs || p->n_top_logprobs) {
    ev.logprob = logprob_of(lg, nv, id, p->n_top_logprobs, g->top_ids, g->top_lp);
    ev.n_top = p->n_top_logprobs;
    ev.top_ids = g->top_ids;
    ev.top_logprobs = g->top_lp;
  }
  g->r.n_gen++;
  int finish = FLOE_FINISH_NONE;
  textbuf *pend = &g->pend;
  const bool eog = tok_is_eog(s->e->tok, id);
  if (!eog) {
    size_t plen;
    const char *piece = tok_piece(s->e->tok, id, &plen);
    if (piece && textbuf_add(pend, piece, plen)) {
      gen_fail(g, FLOE_E_NOMEM, "out of memory");
      return false;
    }
  }
  /* decide what text this token releases */
  const size_t complete = eog ? pend->n : utf8_complete(pend->p ? pend->p : "", pend->n);
  size_t release = complete;
  for (size_t i = 0; i < p->n_stop && pend->n; i++) {
    const char *hit = memmem(pend->p, pend->n, p->stop[i], strlen(p->stop[i]));
    if (hit && (size_t)(hit - pend->p) <= release) {
      release = (size_t)(hit - pend->p);
      finish = FLOE_FINISH_STOP;
    }
  }
  if (finish != FLOE_FINISH_STOP && !eog && g->max_stop) {
    /* hold back a tail that could still grow into a stop string */
    for (size_t i = 0; i < p->n_stop; i++) {
      const size_t sl = strlen(p->stop[i]);
      for (size_t k = sl - 1; k > 0; k--) {
        if (k <= release && !memcmp(pend->p + release - k, p->stop[i], k)) {
          release -= k;
          break;
        }
      }
    }
  }
  if (eog) finish = FLOE_FINISH_STOP;
  ev.text = pend->p ? pend->p : "";
  ev.text_len = release;
  if (g->cb && g->cb(g->user, &ev) && finish == FLOE_FINISH_NONE) finish = FLOE_FINISH_CANCELLED;
  if (release) {
    memmove(pend->p, pend->p + release, pend->n - release);
    pend->n -= release;
    pend->p[pend->n] = 0;
  }
  if (finish != FLOE_FINISH_NONE) {
    gen_finish(g, finish);
    return false;
  }
  if (drafted) return false;
  if (s->n_hist >= s->n_ctx) {
    gen_finish(g, FLOE_FINISH_LENGTH);
    return false;
  }
  *id_out = id;
  return true;
}

/* One speculative step of a generation decoding alone (engine_mtp.c). */
static void gen_spec_step(floe_gen *g, int32_t id) {
  floe_session *s = g->s;
  char err[384];
  const int k = spec_choose_k(s->spec, g->mtp_k, s->n_ctx - s->n_hist - 1);
  const bool row_logits = g->p.logprobs || g->p.n_top_logprobs;
  /* greedy-only: the step's last logits may stay on the device (model.h lazy_ok), the next token
   * being the argmax found with them (floe_session_argmax); a step rewrites them, and the model
   * fetches deferred ones that an evaluation would overwrite first (model_logits_settle) */
  const bool lazy = sampler_greedy(g->smp) && !row_logits;
  int rc = lazy ? 0 : model_logits_sync(s->ms, err, sizeof err);
  s->ms->lazy_ok = lazy;
  if (!rc)
    rc = spec_step(s->spec, s->ms, g->smp, id, k, s->last_logits, g->acc, &g->n_acc, &g->acc_lg, &g->forced,
                   row_logits, err, sizeof err);
  s->ms->lazy_ok = false;
  if (rc) {
    floe_session_reset(s); /* state is undefined after a failed step */
    gen_fail(g, rc, err);
    return;
  }
  s->hist[s->n_hist++] = id;
  for (int i = 0; i < g->n_acc; i++) s->hist[s->n_hist++] = g->acc[i];
  g->acc_i = 0;
}

bool floe_gen_done(const floe_gen *g) { return g->phase == GEN_DONE; }
bool floe_gen_prefilling(const floe_gen *g) { return g->phase == GEN_PREFILL && g->pos < g->n_prompt; }

int floe_gen_step(floe_gen *const *gens, int n, int64_t prefill_chunk, floe_step_info *info) {
  floe_step_info dummy;
  if (!info) info = &dummy;
  memset(info, 0, sizeof *info);
  if (n < 1) return 0;
  int active = 0;
  for (int i = 0; i < n; i++) active += gens[i]->phase != GEN_DONE;
  model_seg seg[n];
  floe_gen *sg[n];
  int32_t tok[n];
  int64_t to[n]; /* prefill: the chunk's end */
  int k = 0;
  for (int i = 0; i < n; i++) {
    floe_gen *g = gens[i];
    floe_session *s = g->s;
    if (g->phase == GEN_PREFILL) {
      int64_t next;
      /* at most one model_eval chunk of this session (model.h max_batch) */
      const int64_t cap = s->ms->max_batch;
      if (gen_prefill_next(g, prefill_chunk < 1 || prefill_chunk > cap ? cap : prefill_chunk, &next)) {
        if (g->use_mtp && active == 1) { /* alone: feed the MTP's rows too (spec_eval) */
          if (next - g->pos > info->rows) info->rows = next - g->pos, info->sessions = 1;
          info->rows_total += next - g->pos;
          char e2[384];
          int rc = session_eval_spec(s, g->prompt + g->pos, next - g->pos, e2, sizeof e2);
          if (rc) gen_fail(g, rc, e2);
          else g->pos = next;
          continue;
        }
        to[k] = next;
        seg[k] = (model_seg){ s->ms, g->prompt + g->pos, next - g->pos, s->last_logits };
        s->ms->lazy_ok = gen_greedy_only(g);
        sg[k++] = g;
        continue;
      }
      if (g->phase != GEN_DECODE) continue; /* stopped */
    }
    if (g->phase != GEN_DECODE || !gen_pick(g, &tok[i])) continue;
    if (g->use_mtp && active == 1) {
      const int64_t n0 = s->n_hist;
      gen_spec_step(g, tok[i]);
      info->rows_total += s->n_hist - n0;
      if (info->rows < s->n_hist - n0) info->rows = s->n_hist - n0, info->sessions = 1;
      continue;
    }
    to[k] = -1;
    seg[k] = (model_seg){ s->ms, &tok[i], 1, s->last_logits };
    s->ms->lazy_ok = gen_greedy_only(g);
    /* greedy, and this step's pick will be evaluated in turn unless it ends the generation: the
     * device may start that step before the host reads the pick (model.h ahead_ok) */
    s->ms->ahead_ok = gen_greedy_only(g) && (g->p.max_tokens <= 0 || g->r.n_gen < g->p.max_tokens);
    sg[k++] = g;
  }
  if (k == 0) return 0;
  char err[384];
  int64_t rows = 0;
  int segs = 0;
  int rc = model_eval_multi(seg, k, &rows, &segs, err, sizeof err);
  for (int i = 0; i < k; i++) seg[i].s->lazy_ok = seg[i].s->ahead_ok = false;
  if (rows > info->rows) info->rows = rows, info->sessions = segs;
  for (int i = 0; i < k && !rc; i++) info->rows_total += seg[i].n;
  for (int i = 0; i < k; i++) {
    floe_gen *g = sg[i];
    floe_session *s = g->s;
    if (rc) { /* the pass's states are undefined: every session of it starts over */
      floe_session_reset(s);
      gen_fail(g, rc, err);
      continue;
    }
    spec_forget_hidden(s->spec); /* evaluated without hidden states: the next MTP row has no input */
    memcpy(s->hist + s->n_hist, seg[i].tokens, (size_t)seg[i].n * sizeof(int32_t));
    s->n_hist += seg[i].n;
    if (to[i] >= 0) g->pos = to[i];
  }
  return 0;
}

int floe_gen_end(floe_gen *g, floe_gen_result *res, char *err, size_t errlen) {
  if (!g) return 0;
  const int rc = g->rc;
  if (rc) floe_err(err, errlen, rc, "%s", g->err);
  if (res && (rc == 0 || g->res_valid)) *res = g->r;
  free(g->pend.p);
  sampler_free(g->smp);
  free(g->prompt);
  free(g);
  return rc;
}

int floe_generate(floe_session *s, const int32_t *prompt, size_t n_prompt, const floe_gen_params *p,
                  floe_token_cb cb, void *user, floe_gen_result *res, char *err, size_t errlen) {
  floe_gen *g;
  int rc = floe_gen_begin(s, prompt, n_prompt, p, cb, user, &g, err, errlen);
  if (rc) return rc;
  while (!floe_gen_done(g)) floe_gen_step(&g, 1, 0, NULL);
  return floe_gen_end(g, res, err, errlen);
}
