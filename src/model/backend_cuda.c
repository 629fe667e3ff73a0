/* The CUDA backend: the block operations of backend.h on one NVIDIA GPU, over the kernels of
 * src/kernels/cuda (cuda_mm.h: quantized matmuls and the MoE expert kernels; cuda_ops.h: norms,
 * attention, GatedDeltaNet, routing, embedding, argmax).
 *
 * What it mirrors: each block issues the same matmuls as the CPU's layers.c, with the same choice
 * of input per matrix (quantized activation rows when the matrix shares the layout the CPU
 * quantized for, else the float path), so every quantized matmul row is bit-identical to the
 * CPU's. The other ops follow the CPU's order of float operations where that costs nothing (the
 * attention softmax is split-K: rounding-level differences, cuda_ops.h).
 *
 * Fusion: the residual add of every block is fused with the next block's input norm
 * (cuda_add_rmsnorm after attention / GDN, cuda_moe_combine after the MoE, whose norm is the next
 * layer's attn_norm or, after the last layer, the output norm), so `h` always holds the normed
 * input of the block that comes next; only the embedding needs a norm of its own.
 *
 * CUDA graph: a one-token evaluation (decode) is captured once per session and per kind (with or
 * without logits) and replayed afterwards: the token and position are copied from pinned host
 * memory by the graph's first nodes, every kernel reads them from device memory, and the logits
 * and greedy pick land in pinned memory that eval_end copies out. While a graph is replayed the
 * block calls of the driver do nothing. Speculative decoding records two more kinds per row count
 * n <= KV_KEEP_MAX (FLOE_CUDA_SPEC_GRAPH=0: not recorded): the kept verify chunk (all logits and
 * the hidden states) and the MTP block's evaluation (the last row's logits and every row's normed
 * output); their host inputs and outputs go through pinned staging buffers, like the token. A
 * greedy speculative step is also recorded whole, one graph per (MTP rows, drafts) (cu_spec_greedy,
 * FLOE_CUDA_MTP_FUSED=0: not used).
 *
 * Tiered experts (cu_tier): the host decides at each MoE layer where the selected experts are
 * computed (cu_tier_begin reads the routing back), so a one-token step is recorded as segments
 * cut at those decisions: seg 0 runs from the step's start to layer 0's routing; at layer l
 * either MC(l) (the expert kernels, the combine, and on through layer l + 1's routing, or the
 * logits) or, when the CPU computes some of the layer's experts, M(l) (the expert kernels) then
 * C(l) (the rest, after cu_tier_end has queued the CPU's rows). Each segment is recorded the first
 * time it runs and replayed after that; its kernels read the slot ids and every varying input from
 * device memory, as a whole recorded step does. FLOE_CUDA_TIER_GRAPH=0: tiered steps run eagerly.
 *
 * Memory: the model's device copies (weights, expert stacks with a fixed stride per expert) belong
 * to cu_model (model->dev; uploaded by backend_cuda_load.c); a session's (KV cache, recurrent state,
 * scratch for s->max_batch rows, rope table, graphs) to cu_sess (session->dev). */
#ifdef FLOE_HAVE_CUDA
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_graph.h"
#include "kernels/cuda/cuda_mm.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_rt.h"
#include "kernels/cuda/cuda_spec.h"
#include "model/backend_cuda_internal.h"

#define AB 16 /* attention rows per launch in prefill with k_attn (its split-K scratch grows with the rows) */
#define ATT_SCR_MAX ((size_t)256 << 20) /* the row-group kernel's rows per launch: as many as this scratch holds */
#define LB 16 /* logits rows per launch (the [LB][n_vocab] device buffer) */
/* recorded steps: one token (without logits, with, with logits and its hidden state: a plain step
 * that feeds the MTP), kept verify chunks and MTP evaluations of
 * n = 1..KV_KEEP_MAX rows, the steps run ahead (two: their logits alternate between alog[0] / [1]) */
enum { G_DEC = 0, G_LAZY = 3, G_VER = 4, G_MTP = G_VER + KV_KEEP_MAX, G_AHD = G_MTP + KV_KEEP_MAX, G_N = G_AHD + 2 };
/* recorded multi-session passes of one-token segments (FLOE_CUDA_MULTI_GRAPH=1): the lead keeps
 * MG_N of them in graph slots G_N.., each keyed by its segments' sessions (their uids, in order)
 * and its first logits row; the least recently used is replaced */
#define MG_N 4
/* tiered steps' segments (the header's comment): kinds G_DEC, G_DEC + 1, G_LAZY; ids */
#define SEG_KINDS 3
#define SEG_M(l) (1 + 3 * (int)(l))
#define SEG_C(l) (2 + 3 * (int)(l))
#define SEG_MC(l) (3 + 3 * (int)(l))
#define MG_KMAX LB /* segments of a recorded pass: its logits rows fit the [LB][V] staging */

typedef struct cu_sess {
  void *stream;
  int n_split;
  cuda_attn_shape ash;
  cuda_gdn_shape gsh;
  /* device */
  float *x, *h, *out;          /* [B][E] residual, normed input of the next block, block output */
  float *q, *k, *v, *att;      /* attention */
  float *mix, *z, *b, *a, *raw, *o; /* GDN */
  float *rlog, *selw, *shg;    /* router logits [B][NE], top-k weights [B][K], shared gate logit [B] */
  int32_t *sel;                /* [B][K] */
  float *plog, *pselw;         /* tiered (cu_tier_pf): the next layer's router on this layer's input [NE], its top-k */
  int32_t *psel;               /* [K + 1] the predicted experts of the next layer */
  float *hr, *hs, *yr, *ys;    /* GLU rows routed [B*K][I], shared [B][Is]; down outputs [B*K][E], [B][E] */
  uint8_t *xq[2];              /* quantized activation rows [B][xq_row] (two inputs alive at once) */
  uint8_t *xqd;                /* down inputs [B*K][xq_row] */
  size_t xq_row;
  /* hq[k]: xq[k] holds the rows of h quantized for this layout (a norm quantized them in the same
   * launch, cuda_mm_norm_act / cuda_mm_combine_act), for hq_n rows; NULL: it holds nothing usable */
  const floe_mat *hq[2];
  int64_t hq_n;
  float *logits;               /* [LB][V] */
  int32_t *tok, *pos, *greedy; /* [B], [B] positions pos0 + t, [1] */
  unsigned *route_ctr;         /* cuda_mm_router_route's block counter (0 between launches) */
  void *grp;                   /* a prefill chunk's MoE slots grouped by expert (cuda_mm_moe_group) */
  bool route_fused;            /* one-token steps route in the router's launch (FLOE_CUDA_ROUTE_FUSED=1) */
  void *attn_scr, *amax_scr;
  int64_t arows; /* attention rows per launch (attn_scr holds their split-K parts): AB, or more with the row-group kernel */
  float *rope;                 /* [n_ctx][n_rot] */
  void **kc, **vc;             /* [n_layer] caches (attention layers) */
  float **S, **conv;           /* [n_layer] recurrent state, conv window (GDN layers) */
  size_t s_bytes, conv_bytes;
  /* Kept states of a verify chunk (backend.h keep_begin): kS[l][t] / kconv[l][t], the state after
   * row t, allocated at the first verify. The GDN kernels find every state pointer through tab
   * (device, mirrored in pinned tab_h; tab_at gives the cell): entry 0 of a layer is the current
   * state, entry 1 + t row t's kept one. keep_accept swaps host pointers and the device's cells
   * (cuda_tab_swap), so a recorded step (which captured cells, not pointers) replays on the new state. */
  float *(*kS)[KV_KEEP_MAX], *(*kconv)[KV_KEEP_MAX];
  float **tab, **tab_h;
  int64_t keep_n, keep_alloc;
  uint64_t bytes;
  /* pinned host */
  int32_t *tok_h, *pos_h, *greedy_h;
  float *logits_h;             /* [LB][V] */
  /* the chunk in flight */
  float *dst;                  /* where eval_end copies the logits staged in logits_h */
  int64_t dst_rows;
  bool staged;                 /* logits_h holds dst_rows rows to copy out at eval_end */
  bool want_greedy;
  /* MODEL_EVAL_LAZY (the default; FLOE_CUDA_LAZY_LOGITS=0 off): the chunk's logits row stays in c->logits (lazy);
   * lazy_to: its host buffer, handed to s->lazy_dst at eval_end; lazy_valid: c->logits still holds
   * it (cleared by anything that may write c->logits), for cu_logits_fetch */
  bool lazy, lazy_valid;
  float *lazy_to;
  const float *lazy_src; /* the device row logits_fetch copies: c->logits, or sg_row after a speculative step */
  /* graphs (G_*): one token without / with logits + greedy; kept verify chunks of n rows; MTP
   * evaluations of n rows. gfirst: the first logits row the graph was recorded with. */
  void *graph[G_N + MG_N];
  int64_t gfirst[G_N + MG_N];
  uint64_t uid;                /* this session's number (never reused): recorded passes key on it */
  uint64_t mkey[MG_N][MG_KMAX + 2]; /* [0] segments k, [1] first logits row, then the k uids */
  uint64_t mused[MG_N];        /* the recorded pass's last use (mtick), for the replacement */
  uint64_t mtick;
  bool multi_graph;            /* record one-token multi-session passes (FLOE_CUDA_MULTI_GRAPH=1) */
  bool spec_graph;             /* record verify chunks and MTP evaluations (FLOE_CUDA_SPEC_GRAPH) */
  float *hin_h, *hid_h;        /* pinned [B][E]: the MTP's input rows; hidden / h_out rows staged */
  float *hid_dst;              /* where eval_end copies the hid_rows rows staged in hid_h */
  int64_t hid_rows;
  /* the greedy speculative step in one pass (cu_spec_greedy): a recorded step per (MTP rows n,
   * drafts k); sg_d [SG_INTS] device ints (the verify rows' argmaxes, the accept count), sg_h their
   * pinned copy (with the drafts), sg_row [V] the accepted row's logits; a second recording per
   * (n, k) leaves that row on the device (lazy: a greedy-only caller, model.h lazy_ok) */
  void *sgraph[KV_KEEP_MAX][KV_KEEP_MAX][2];
  int32_t *sg_d, *sg_h;
  float *sg_row;
  /* the step's inputs and outputs moved by one launch each (cuda_copy_parts) through the pinned
   * buffers' device addresses instead of a copy node each (FLOE_CUDA_SPEC_DIRECT=0: the copies) */
  bool spec_direct;
  /* the MTP rows' token embeddings read by their norm pair's launch (cuda_mm_embed_norm_pair_act)
   * instead of a k_embed launch before it: the same values (FLOE_CUDA_MTP_EMBED=0: the two) */
  bool mtp_embed;
  /* the same for the trunk's first norm (cu_embed: cuda_mm_embed_norm_act; FLOE_CUDA_EMBED_NORM=0:
   * k_embed, then the norm) */
  bool embed_norm;
  /* opt-in (FLOE_CUDA_SPEC_AMAX=1, written in session 27, not yet measured): the one-pass step's
   * heads gather their rows' argmaxes in their own launch (cuda_mm_matmul_amax into amk, zeroed by
   * the step's first launch from amk_zero), read by the next draft's norm pair, the verify's first
   * norm and the accept launch (no argmax launch: k + 1 fewer a step). emb_keys: the keys of the
   * last row of the embedding being issued (NULL: its tokens are in c->tok already). */
  bool spec_amax;
  unsigned long long *amk, *amk_zero;
  const unsigned long long *emb_keys;
  int32_t *tok_hd, *pos_hd, *sg_hd;
  float *hin_hd, *hid_hd;
  int capturing;               /* -1 none, else the graph slot being captured */
  /* decoding ahead (backend.h MODEL_EVAL_AHEAD; FLOE_CUDA_AHEAD=0 off): a NOWAIT step signals
   * ev[0] and its pick lands in greedy_h[0]; an ahead step of parity p (graph G_AHD + p) writes its
   * logits to alog[p] (never the buffer of the deferred logits before it), signals ev[1 + p] and
   * its pick lands in greedy_h[1 + p]. pick_slot: the slot whose pick pick_wait collects (-1:
   * none); ahead_slot: the ahead step in flight (-1: none), at ahead_pos; next_pos: the position an
   * ahead step may take now (-1: none: anything else ran); cur_pos0, nowait, ahead: the step being
   * issued. */
  bool ahead_allowed, nowait, ahead;
  int32_t *greedy_hd; /* greedy_h's device address: a one-token step's argmax writes the pick there
                       * itself, no copy node after it (FLOE_CUDA_PICK_DIRECT=0: the copy; NULL) */
  float *alog[2];
  void *ev[3];
  int pick_slot, ahead_slot, apar;
  int64_t ahead_pos, next_pos, cur_pos0;
  /* tiered one-token steps as recorded segments (the header's comment): seg_on: allowed in this
   * session; seg: this step runs as segments (capturing holds its kind's slot); seg_id: the
   * current segment (-1: none), seg_cap: being captured (else replay says whether its graph is
   * replayed); seg_g [SEG_KINDS][seg_n]; seg_rec: a segment of this step was recorded */
  bool seg_on, seg, seg_cap, seg_rec;
  int seg_id;
  int64_t seg_n;
  void **seg_g;
  bool replay;
  bool profile;                /* FLOE_CUDA_PROFILE: no graph, a sync after every block, timed into s->ph */
  bool use_graph;              /* record one-token steps (not FLOE_CUDA_NO_GRAPH, not profiling, not tiered) */
  cu_tier_sess *tier;          /* the tiered experts' staging (cu_model tier) */
  /* rows from which a chunk's MoE groups its slots by expert (FLOE_CUDA_MOE_GROUP_MIN, default 16);
   * below, the per-slot decode kernels (the same bits): a verify of 2..5 rows of the 35B-A3B shape
   * is 25 % faster per slot (H200), where a grouped tile holds one slot of an expert */
  int64_t moe_group_min;
  /* a multi-session pass (cu_multi_begin .. eval_end; this session leads it): the tokens come with
   * embed, the rows' positions with the first attention block (multi_pos: uploaded) */
  bool multi, multi_pos;
  double t_blk;
  int err;
  char msg[256];
} cu_sess;

/* ---- sessions ---- */
/* FLOE_CUDA_TRACE=FILE: the launch trace (pdl.cuh) armed at each session's start and appended to
 * FILE when it is freed ("# session" then a line per launch: cuda_rt_trace_dump); for the in-graph
 * cost of each kernel of a step (scripts/trace_step.py) */
static void trace_dump(void) {
  const char *path = getenv("FLOE_CUDA_TRACE");
  if (!path || !*path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "# session\n");
  cuda_rt_trace_dump(f, NULL, 0);
  fclose(f);
}

static void cu_session_free(model_session *s) {
  cu_sess *c = s->dev;
  if (!c) return;
  if (c->stream) cuda_rt_stream_sync(c->stream, NULL, 0);
  trace_dump();
  for (int i = 0; i < G_N + MG_N; i++) cuda_graph_destroy(c->graph[i]);
  if (c->seg_g)
    for (int64_t i = 0; i < SEG_KINDS * c->seg_n; i++) cuda_graph_destroy(c->seg_g[i]);
  free(c->seg_g);
  for (int i = 0; i < KV_KEEP_MAX; i++)
    for (int j = 0; j < KV_KEEP_MAX; j++) cuda_graph_destroy(c->sgraph[i][j][0]), cuda_graph_destroy(c->sgraph[i][j][1]);
  cuda_rt_free(c->sg_d);
  cuda_rt_free(c->sg_row);
  cuda_rt_free(c->amk);
  cuda_rt_free(c->amk_zero);
  cuda_rt_free(c->alog[0]);
  cuda_rt_free(c->alog[1]);
  for (int i = 0; i < 3; i++) cuda_rt_event_destroy(c->ev[i]);
  cuda_rt_host_free(c->sg_h);
  cuda_rt_host_free(c->hin_h);
  cuda_rt_host_free(c->hid_h);
  cu_tier_sess_close(c->tier);
  void *dev[] = { c->x, c->h, c->out, c->q, c->k, c->v, c->att, c->mix, c->z, c->b, c->a, c->raw, c->o,
                  c->rlog, c->selw, c->shg, c->sel, c->hr, c->hs, c->yr, c->ys, c->xq[0], c->xq[1], c->xqd,
                  c->logits, c->tok, c->pos, c->greedy, c->attn_scr, c->amax_scr, c->rope };
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) cuda_rt_free(dev[i]);
  const int64_t NL = ((const cu_model *)s->m->dev)->n_l;
  for (int64_t l = 0; l < NL; l++) {
    if (c->kc) cuda_rt_free(c->kc[l]);
    if (c->vc) cuda_rt_free(c->vc[l]);
    if (c->S) cuda_rt_free(c->S[l]);
    if (c->conv) cuda_rt_free(c->conv[l]);
    for (int t = 0; t < KV_KEEP_MAX; t++) {
      if (c->kS) cuda_rt_free(c->kS[l][t]);
      if (c->kconv) cuda_rt_free(c->kconv[l][t]);
    }
  }
  free(c->kS);
  free(c->kconv);
  cuda_rt_free(c->tab);
  cuda_rt_host_free(c->tab_h);
  free(c->kc);
  free(c->vc);
  free(c->S);
  free(c->conv);
  cuda_rt_host_free(c->tok_h);
  cuda_rt_host_free(c->pos_h);
  cuda_rt_host_free(c->greedy_h);
  cuda_rt_host_free(c->logits_h);
  if (c->stream) cuda_rt_stream_destroy(c->stream);
  free(c);
  s->dev = NULL;
}

static int dalloc(cu_sess *c, void *pp, size_t n, char *err, size_t errlen) {
  void **p = pp;
  if (cuda_rt_malloc(p, n ? n : 16, err, errlen)) return FLOE_E_NOMEM;
  c->bytes += n;
  return 0;
}

static size_t act_bytes_of(const dmat *W) { return W->h && W->h->data ? cuda_mm_act_bytes(&W->d) : 0; }

/* The state table (cu_sess tab): [2][n_l][1 + KV_KEEP_MAX] cells, S then conv. */
static size_t tab_bytes(const model_session *s) {
  return (size_t)(2 * ((const cu_model *)s->m->dev)->n_l * (1 + KV_KEEP_MAX)) * sizeof(float *);
}

/* The device cell of layer l's S (conv false) or conv window (conv true): t = 0 the current
 * state, t = 1 + r row r's kept state. */
static float *const *tab_at(const model_session *s, bool conv, int64_t l, int64_t t) {
  const cu_sess *c = s->dev;
  const int64_t NL = ((const cu_model *)s->m->dev)->n_l;
  return c->tab + ((conv ? NL : 0) + l) * (1 + KV_KEEP_MAX) + t;
}

/* Writes the host pointers into tab_h and enqueues its copy to tab. The stream is idle first (a
 * previous copy from tab_h may still be pending otherwise). */
static int tab_upload(model_session *s) {
  cu_sess *c = s->dev;
  const int64_t NL = ((const cu_model *)s->m->dev)->n_l;
  if (cuda_rt_stream_sync(c->stream, NULL, 0)) return FLOE_E_IO;
  for (int k = 0; k < 2; k++)
    for (int64_t l = 0; l < NL; l++) {
      float **row = c->tab_h + (k * NL + l) * (1 + KV_KEEP_MAX);
      row[0] = k ? c->conv[l] : c->S[l];
      for (int t = 0; t < KV_KEEP_MAX; t++) row[1 + t] = k ? c->kconv[l][t] : c->kS[l][t];
    }
  return cuda_rt_h2d_async(c->tab, c->tab_h, tab_bytes(s), c->stream) ? FLOE_E_IO : 0;
}

/* Prefill chunk rows of a session (s->max_batch). Larger chunks give each routed expert's weights
 * more rows a launch (the grouped MoE kernels fill their slot tiles) and cut the per-chunk launches;
 * the rows themselves are computed as before (row-exact), so the chunk never changes a bit.
 * FLOE_CUDA_CHUNK=N (MODEL_MAX_BATCH..CU_CHUNK_MAX) sets it; the default is CU_CHUNK_DEF, at most
 * the context. Only resident sessions (tiered: the expert pool is sized for MODEL_MAX_BATCH rows)
 * and only while the extra scratch (row_bytes a row) takes at most an eighth of the device memory
 * left after the KV cache (kv_bytes): each session has its own, so later sessions of a server
 * that has filled the device get smaller chunks. */
#define CU_CHUNK_MAX 8192
#ifndef CU_CHUNK_DEF
#define CU_CHUNK_DEF 4096 /* 35B-A3B prefill of 4096 tokens on the H200: 5355 tok/s in chunks of 512, 6790 */
#endif
static int64_t cu_chunk_rows(bool resident, int64_t n_ctx, size_t row_bytes, size_t kv_bytes) {
  const char *e = getenv("FLOE_CUDA_CHUNK");
  int64_t want = e && *e ? atoll(e) : CU_CHUNK_DEF;
  if (want > CU_CHUNK_MAX) want = CU_CHUNK_MAX;
  if (want > n_ctx) want = n_ctx; /* no evaluation is longer than the context */
  if (!resident || want <= MODEL_MAX_BATCH) return MODEL_MAX_BATCH;
  size_t fr = 0, tot = 0;
  if (cuda_rt_mem_info(&fr, &tot, NULL, 0)) return MODEL_MAX_BATCH;
  const size_t avail = fr > kv_bytes ? fr - kv_bytes : 0;
  while (want > MODEL_MAX_BATCH && (size_t)(want - MODEL_MAX_BATCH) * row_bytes > avail / 8) want /= 2;
  return want > MODEL_MAX_BATCH ? want : MODEL_MAX_BATCH;
}

static int cu_session_init(model_session *s, int n_threads, char *err, size_t errlen) {
  (void)n_threads;
  const model *m = s->m;
  const cu_model *cm = m->dev;
  const floe_hparams *hp = &m->hp;
  cu_sess *c = calloc(1, sizeof *c);
  if (!c) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  s->dev = c;
  c->capturing = -1;
  c->pick_slot = c->ahead_slot = -1;
  c->ahead_pos = c->next_pos = -1;
  c->profile = getenv("FLOE_CUDA_PROFILE") != NULL;
  /* tiered experts: the host decides per layer where each expert is computed, so no step is one
   * fixed graph; one-token steps are recorded in segments between those decisions */
  c->use_graph = !c->profile && getenv("FLOE_CUDA_NO_GRAPH") == NULL && !cm->tier;
  const char *tg = getenv("FLOE_CUDA_TIER_GRAPH");
  c->seg_on = !c->profile && getenv("FLOE_CUDA_NO_GRAPH") == NULL && cm->tier && !(tg && tg[0] == '0');
  c->seg_id = -1;
  if (c->seg_on) {
    c->seg_n = 1 + 3 * hp->n_layer;
    c->seg_g = calloc((size_t)(SEG_KINDS * c->seg_n), sizeof *c->seg_g);
    if (!c->seg_g) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  const char *gm = getenv("FLOE_CUDA_MOE_GROUP_MIN");
  c->moe_group_min = gm && atoll(gm) > 1 ? atoll(gm) : 16;
  const char *sg = getenv("FLOE_CUDA_SPEC_GRAPH");
  c->spec_graph = c->use_graph && !(sg && sg[0] == '0');
  const char *mf = getenv("FLOE_CUDA_MTP_FUSED"); /* 0: greedy steps composed of the block steps (A/B) */
  s->spec_fused = !(mf && mf[0] == '0');
  int rc = cuda_rt_init(cm->dev, err, errlen);
  if (rc || (rc = cuda_rt_stream_create(&c->stream, err, errlen))) return rc;
  /* a caller that needs only the greedy pick leaves the logits on the device (MODEL_EVAL_LAZY:
   * ~1 MB a token less over PCIe and through the host; 35B decode +4.2 % on the H200);
   * FLOE_CUDA_LAZY_LOGITS=0 copies every row out as before */
  const char *lz = getenv("FLOE_CUDA_LAZY_LOGITS");
  s->lazy_allowed = !(lz && lz[0] == '0');
  /* greedy decoding runs the next step before the host reads the pick (model.c eval_ahead):
   * recorded one-token steps only; FLOE_CUDA_AHEAD=0 waits for each pick as before */
  const char *ah = getenv("FLOE_CUDA_AHEAD");
  c->ahead_allowed = c->use_graph && s->lazy_allowed && !(ah && ah[0] == '0');
  const char *tr = getenv("FLOE_CUDA_TRACE");
  if (tr && *tr && (rc = cuda_rt_trace_start(err, errlen))) return rc;
  const int64_t E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used;
  const int64_t nh = hp->n_head, hd = hp->head_dim, qdim = nh * hd * 2, kvd = hp->n_head_kv * hd;
  const int64_t Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state, vd = hp->ssm_d_inner;
  const int64_t C = 2 * Nk * dk + vd, I = hp->n_ff_exp, Is = hp->n_ff_shexp, V = hp->n_vocab;
  const int64_t n_ctx = s->kv.n_ctx;
  /* attention shape: the split count scales with the context (parts past a row's length exit) */
  bool has_attn = false, has_gdn = false;
  for (int64_t l = 0; l < hp->n_layer; l++) has_attn |= !hp->recurrent[l], has_gdn |= hp->recurrent[l];
  c->n_split = (int)(n_ctx / 512);
  if (c->n_split > 128) c->n_split = 128;
  c->ash = (cuda_attn_shape){ (int)nh, (int)hp->n_head_kv, (int)hd, (int)hp->n_rot, hp->attn_gate ? 1 : 0,
                              s->kv.kv_type == KV_BF16, n_ctx, hp->rms_eps, c->n_split };
  /* at most one wave of a decode row's blocks (cuda_attn_split_hint: 66 parts on the H200 for 2 KV
   * heads, 240 -> 258 tok/s at 128K against 128); FLOE_CUDA_ATTN_SPLIT=N: at most N parts instead
   * (A/B). A session's decode and prefill rows share it, so its rows stay bit-identical to each
   * other whatever it is. */
  const char *sp = getenv("FLOE_CUDA_ATTN_SPLIT");
  const int split_max = sp && atoi(sp) > 0 ? atoi(sp) : has_attn ? cuda_attn_split_hint(&c->ash, 0) : 0;
  /* FLOE_CUDA_ATTN_MIN_SPLIT=N (A/B): at least N parts, so that rows of a short session (under 1024
   * positions: one part) run their 128-position tiles side by side (parts past a row's length exit) */
  const char *smin = getenv("FLOE_CUDA_ATTN_MIN_SPLIT");
  if (smin && atoi(smin) > c->n_split) c->n_split = atoi(smin) < 128 ? atoi(smin) : 128;
  if (split_max > 0 && c->n_split > split_max) c->n_split = split_max;
  if (c->n_split < 1) c->n_split = 1;
  c->ash.n_split = c->n_split;
  c->gsh = (cuda_gdn_shape){ (int)Nk, (int)Nv, (int)dk, Nv ? (int)(vd / Nv) : 0, (int)hp->ssm_conv_kernel,
                             m->v_tiled ? 1 : 0, hp->rms_eps, 1 /* gdn_rows: a projection before each step */ };
  if (has_attn && (rc = cuda_attn_check(&c->ash, err, errlen))) return rc;
  if (has_gdn && (rc = cuda_gdn_check(&c->gsh, err, errlen))) return rc;
  /* quantized activation rows: the largest any matrix needs */
  size_t xr = 64;
  for (int64_t l = 0; l < cm->n_l; l++) {
    const cu_layer *L = &cm->L[l];
    const dmat *all[] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->qkv, &L->z, &L->b, &L->a, &L->ssm_out, &L->router,
                          &L->sh_gate, &L->sh_up, &L->sh_down, &L->sh_gate_inp, &L->gate, &L->up, &L->down };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      size_t ab = act_bytes_of(all[i]);
      if (ab > xr) xr = ab;
    }
  }
  if (act_bytes_of(&cm->output) > xr) xr = act_bytes_of(&cm->output);
  if (act_bytes_of(&cm->mtp_fc) > xr) xr = act_bytes_of(&cm->mtp_fc);
  c->xq_row = (xr + 255) / 256 * 256;
  const int64_t ffm = I > Is ? I : Is;
  /* the rows of one model_eval chunk (s->max_batch; the scratch below holds that many) */
  const size_t row_bytes = (size_t)(4 * E + qdim + 2 * kvd + nh * hd + 2 * C + 2 * vd + 2 * Nv + NE + 2 * (K + 1) + 3 +
                                    (K + 1) * ffm + Is + (K + 1) * E) * 4 + (size_t)(K + 3) * c->xq_row;
  size_t kv_total = 0; /* the KV cache, allocated below */
  for (int64_t l = 0; l < cm->n_l; l++)
    if (l >= hp->n_layer || !hp->recurrent[l]) kv_total += (size_t)(n_ctx * kvd) * (s->kv.kv_type == KV_BF16 ? 2 : 4) * 2;
  s->max_batch = cu_chunk_rows(!cm->tier, n_ctx, row_bytes, kv_total);
  const int64_t B = s->max_batch;
  /* prefill attention: the row-group kernel covers a whole chunk in one launch where its scratch
   * fits ATT_SCR_MAX (at long contexts, with many split parts a row, several launches of fewer rows) */
  c->arows = AB;
  if (has_attn && cuda_attn_rows_used(B)) {
    c->arows = B;
    while (c->arows > AB && cuda_attn_scratch_bytes(&c->ash, c->arows) > ATT_SCR_MAX) c->arows -= AB;
  }
  /* the stacks' expert count the MoE grouping may see (tiered: the pool's slots, grouped only up
   * to CUDA_MM_GROUP_MAX_EXPERT) */
  int grp_experts = (int)NE + 1;
  if (cm->tier && cm->n_l > 0) {
    const int32_t ns = cm->L[0].gate.d.n_expert;
    grp_experts = ns <= CUDA_MM_GROUP_MAX_EXPERT ? ns : 1;
  }
  struct { void *p; size_t n; } parts[] = {
    { &c->x, B * E * 4 }, { &c->h, B * E * 4 }, { &c->out, B * E * 4 }, { &c->q, (B * qdim + 2 * kvd) * 4 },
    { &c->k, B * kvd * 4 }, { &c->v, B * kvd * 4 }, { &c->att, B * nh * hd * 4 }, { &c->mix, (B * C + vd + 2 * Nv) * 4 },
    { &c->z, B * vd * 4 }, { &c->b, (B + 1) * Nv * 4 }, { &c->a, B * Nv * 4 }, { &c->raw, B * C * 4 },
    { &c->o, B * vd * 4 }, { &c->rlog, (B * NE + 1) * 4 }, { &c->selw, B * (K + 1) * 4 }, { &c->shg, B * 4 },
    { &c->sel, B * (K + 1) * 4 }, { &c->hr, B * (K + 1) * ffm * 4 }, { &c->hs, B * (Is > 0 ? Is : 1) * 4 },
    { &c->yr, B * (K + 1) * E * 4 }, { &c->ys, B * E * 4 }, { &c->xq[0], (size_t)B * c->xq_row },
    { &c->xq[1], (size_t)B * c->xq_row }, { &c->xqd, (size_t)(B * (K + 1)) * c->xq_row }, { &c->logits, LB * V * 4 },
    { &c->tok, B * 4 }, { &c->pos, B * 4 }, { &c->greedy, 16 }, { &c->route_ctr, 16 },
    { &c->grp, NE > 0 ? cuda_mm_moe_group_bytes(B * (K + 1), grp_experts) : 16 },
    { &c->attn_scr, has_attn ? cuda_attn_scratch_bytes(&c->ash, c->arows) : 16 },
    { &c->amax_scr, cuda_argmax_rows_scratch_bytes(V, KV_KEEP_MAX) }, { &c->rope, has_attn ? (size_t)(n_ctx * hp->n_rot * 4) : 16 },
    { &c->plog, (NE + 1) * 4 }, { &c->pselw, (K + 1) * 4 }, { &c->psel, (K + 1) * 4 },
    { &c->alog[0], c->ahead_allowed ? V * 4 : 16 }, { &c->alog[1], c->ahead_allowed ? V * 4 : 16 },
  };
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if ((rc = dalloc(c, parts[i].p, parts[i].n, err, errlen))) return rc;
  static uint64_t uids;
  c->uid = __atomic_add_fetch(&uids, 1, __ATOMIC_RELAXED);
  const char *mg = getenv("FLOE_CUDA_MULTI_GRAPH"); /* opt-in until the H200 has run test_multi with it */
  c->multi_graph = mg && mg[0] == '1';
  /* opt-in (FLOE_CUDA_ROUTE_FUSED=1): it passes test_cuda_mm on the H200 but measured no gain
   * there (248.5 vs 251.8 tok/s, 35B-A3B shape) */
  const char *rf = getenv("FLOE_CUDA_ROUTE_FUSED");
  c->route_fused = rf && rf[0] == '1';
  if ((rc = cuda_rt_memset_async(c->route_ctr, 0, 16, c->stream)) ||
      (rc = cuda_rt_memset_async(c->attn_scr, 0, has_attn ? cuda_attn_scratch_bytes(&c->ash, c->arows) : 16, c->stream)) ||
      (rc = cuda_rt_memset_async(c->amax_scr, 0, cuda_argmax_rows_scratch_bytes(V, KV_KEEP_MAX), c->stream)))
    return floe_err(err, errlen, FLOE_E_IO, "cuda: cannot clear the scratch");
  if (has_attn) { /* the CPU's rope table bits, one row per position */
    float *cs = malloc((size_t)(n_ctx * hp->n_rot) * sizeof(float));
    if (!cs) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    for (int64_t p = 0; p < n_ctx; p++) layer_rope_table(cs + p * hp->n_rot, hp->n_rot, hp->rope_theta, p);
    rc = cuda_rt_h2d(c->rope, cs, (size_t)(n_ctx * hp->n_rot) * sizeof(float), err, errlen);
    free(cs);
    if (rc) return rc;
  }
  const int64_t NL = cm->n_l; /* the MTP block's attention cache at index n_layer */
  c->kc = calloc((size_t)NL, sizeof *c->kc);
  c->vc = calloc((size_t)NL, sizeof *c->vc);
  c->S = calloc((size_t)NL, sizeof *c->S);
  c->conv = calloc((size_t)NL, sizeof *c->conv);
  c->kS = calloc((size_t)NL, sizeof *c->kS);
  c->kconv = calloc((size_t)NL, sizeof *c->kconv);
  if (!c->kc || !c->vc || !c->S || !c->conv || !c->kS || !c->kconv)
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  const size_t kvb = (size_t)(n_ctx * kvd) * (s->kv.kv_type == KV_BF16 ? 2 : 4);
  c->s_bytes = (size_t)(Nv * dk * c->gsh.dv) * 4;
  c->conv_bytes = (size_t)((hp->ssm_conv_kernel - 1) * C) * 4;
  for (int64_t l = 0; l < NL; l++) {
    if (!hp->recurrent[l]) {
      if ((rc = dalloc(c, &c->kc[l], kvb, err, errlen)) || (rc = dalloc(c, &c->vc[l], kvb, err, errlen))) return rc;
    } else {
      if ((rc = dalloc(c, &c->S[l], c->s_bytes, err, errlen)) ||
          (rc = dalloc(c, &c->conv[l], c->conv_bytes, err, errlen)))
        return rc;
      cuda_rt_memset_async(c->S[l], 0, c->s_bytes, c->stream);
      cuda_rt_memset_async(c->conv[l], 0, c->conv_bytes, c->stream);
    }
  }
  if ((rc = cuda_rt_host_alloc((void **)&c->tok_h, B * 4, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&c->pos_h, B * 4, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&c->greedy_h, 16, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&c->logits_h, (size_t)(LB * V) * 4, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&c->tab_h, tab_bytes(s), err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&c->hin_h, (size_t)(B * E) * 4, err, errlen)) ||
      (rc = cuda_rt_host_alloc((void **)&c->hid_h, (size_t)(B * E) * 4, err, errlen)) ||
      (rc = dalloc(c, &c->tab, tab_bytes(s), err, errlen)))
    return rc;
  if ((rc = tab_upload(s))) return floe_err(err, errlen, rc, "cuda: cannot upload the state table");
  for (int i = 0; i < 3 && c->ahead_allowed; i++)
    if ((rc = cuda_rt_event_create(&c->ev[i], err, errlen))) return rc;
  const char *sd = getenv("FLOE_CUDA_SPEC_DIRECT");
  c->spec_direct = !(sd && sd[0] == '0');
  const char *me = getenv("FLOE_CUDA_MTP_EMBED");
  c->mtp_embed = !(me && me[0] == '0');
  const char *en = getenv("FLOE_CUDA_EMBED_NORM");
  c->embed_norm = !(en && en[0] == '0');
  const char *sa = getenv("FLOE_CUDA_SPEC_AMAX");
  c->spec_amax = sa && sa[0] == '1';
  c->tok_hd = cuda_rt_host_dev_ptr(c->tok_h);
  c->pos_hd = cuda_rt_host_dev_ptr(c->pos_h);
  c->hin_hd = cuda_rt_host_dev_ptr(c->hin_h);
  c->hid_hd = cuda_rt_host_dev_ptr(c->hid_h);
  const char *pd = getenv("FLOE_CUDA_PICK_DIRECT");
  c->greedy_hd = pd && pd[0] == '0' ? NULL : cuda_rt_host_dev_ptr(c->greedy_h);
  if (cm->tier && (rc = cu_tier_sess_open(cm->tier, n_threads, B, (int)K + 1, c->xq_row, &c->tier, err, errlen)))
    return rc;
  if ((rc = cuda_rt_stream_sync(c->stream, err, errlen))) return rc;
  s->bytes = c->bytes;
  return 0;
}

static void cu_state_reset(model_session *s) {
  cu_sess *c = s->dev;
  for (int64_t l = 0; l < s->m->hp.n_layer; l++)
    if (c->S[l]) {
      cuda_rt_memset_async(c->S[l], 0, c->s_bytes, c->stream);
      cuda_rt_memset_async(c->conv[l], 0, c->conv_bytes, c->stream);
    }
  cuda_rt_stream_sync(c->stream, NULL, 0);
}

/* Checkpoints: a device copy of every recurrent layer's S and conv window (layout as kv.c's). */
static size_t cu_ckpt_bytes(const model_session *s) {
  const cu_sess *c = s->dev;
  size_t n = 0;
  for (int64_t l = 0; l < s->m->hp.n_layer; l++)
    if (c->S[l]) n += c->s_bytes + c->conv_bytes;
  return n;
}

static int cu_ckpt_copy(model_session *s, kv_ckpt *ck, bool save) {
  cu_sess *c = s->dev;
  uint8_t *d = (uint8_t *)ck->data;
  for (int64_t l = 0; l < s->m->hp.n_layer; l++) {
    if (!c->S[l]) continue;
    if (save) {
      cuda_rt_d2d_async(d, c->S[l], c->s_bytes, c->stream);
      cuda_rt_d2d_async(d + c->s_bytes, c->conv[l], c->conv_bytes, c->stream);
    } else {
      cuda_rt_d2d_async(c->S[l], d, c->s_bytes, c->stream);
      cuda_rt_d2d_async(c->conv[l], d + c->s_bytes, c->conv_bytes, c->stream);
    }
    d += c->s_bytes + c->conv_bytes;
  }
  return cuda_rt_stream_sync(c->stream, NULL, 0) ? FLOE_E_IO : 0;
}

static int cu_ckpt_save(model_session *s, kv_ckpt *ck) {
  const size_t nb = cu_ckpt_bytes(s);
  if (!ck->data && cuda_rt_malloc((void **)&ck->data, nb ? nb : 16, NULL, 0)) {
    ck->data = NULL;
    return FLOE_E_NOMEM;
  }
  int rc = cu_ckpt_copy(s, ck, true);
  if (!rc) ck->pos = s->kv.n_past;
  return rc;
}

static void cu_ckpt_restore(model_session *s, const kv_ckpt *ck) { cu_ckpt_copy(s, (kv_ckpt *)ck, false); }

static void cu_ckpt_free(model_session *s, kv_ckpt *ck) {
  (void)s;
  cuda_rt_free(ck->data);
  ck->data = NULL;
  ck->pos = -1;
}

/* ---- kept states (speculative verify, backend.h keep_begin / keep_accept) ----
 * Why a table and a swap: a verify chunk keeps every row's state so that accepting a rows costs
 * no copy of the state (it is ~2 MiB a layer for the 35B shape, ~60 MiB a step); the accepted
 * row's buffer simply becomes the current one. The one-token step is a recorded CUDA graph whose
 * kernel arguments are fixed at capture: had it captured S[l] itself, every swap would leave the
 * graph updating a buffer that is no longer the current one (and re-recording costs a capture
 * and instantiation per step). So the GDN kernels read the state pointers from device cells
 * (tab) that the graph captured; a swap rewrites the cells (one small copy). */
_Static_assert(KV_KEEP_MAX <= 8, "cuda_gdn_*_p keep at most 8 rows");

static int cu_keep_begin(model_session *s, int64_t n) {
  cu_sess *c = s->dev;
  const model *m = s->m;
  if (n < 0 || n > KV_KEEP_MAX) return FLOE_E_INVALID;
  if (n > c->keep_alloc) { /* the first verify chunk this long: its rows' buffers, once */
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
      if (!c->S[l]) continue;
      for (int64_t t = c->keep_alloc; t < n; t++)
        if ((!c->kS[l][t] && dalloc(c, &c->kS[l][t], c->s_bytes, NULL, 0)) ||
            (!c->kconv[l][t] && dalloc(c, &c->kconv[l][t], c->conv_bytes, NULL, 0)))
          return FLOE_E_NOMEM; /* freed by session_free */
    }
    c->keep_alloc = n;
    s->bytes = c->bytes;
    if (tab_upload(s)) return FLOE_E_IO;
  }
  c->keep_n = n;
  return 0;
}

static void cu_keep_accept(model_session *s, int64_t a) {
  cu_sess *c = s->dev;
  FLOE_ASSERT(a >= 0 && a <= c->keep_n);
  c->keep_n = 0;
  if (a == 0) return; /* the state before the chunk was never written */
  for (int64_t l = 0; l < s->m->hp.n_layer; l++) {
    if (!c->S[l]) continue;
    float *p = c->S[l];
    c->S[l] = c->kS[l][a - 1];
    c->kS[l][a - 1] = p;
    p = c->conv[l];
    c->conv[l] = c->kconv[l][a - 1];
    c->kconv[l][a - 1] = p;
  }
  /* the device's cells follow in stream order: nothing waits (a step run ahead may still be
   * writing the state it makes current) */
  cuda_tab_swap(c->tab, 2 * ((const cu_model *)s->m->dev)->n_l, 1 + KV_KEEP_MAX, (int)a, c->stream);
}

/* ---- blocks ---- */
/* The quantized rows of X (n rows, ldx) for matrices of lay's layout, in buffer slot: NULL when the
 * CPU would take the float path (exact mode, or a type without a quantized path). run false: only
 * where they are (nothing enqueued). */
static const uint8_t *act_at(model_session *s, int slot, const dmat *lay, int64_t n, const float *X, int64_t ldx,
                             size_t *stride, bool run) {
  cu_sess *c = s->dev;
  *stride = 0;
  if (!s->act_q) return NULL;
  const size_t ab = cuda_mm_act_bytes(&lay->d);
  if (!ab) return NULL;
  *stride = ab;
  if (!run) return c->xq[slot]; /* a replayed segment quantizes (or not) as recorded */
  if (X == c->h && c->hq[slot] && c->hq_n == n && layer_same_act(c->hq[slot], lay->h))
    return c->xq[slot]; /* quantized by the norm that wrote h */
  cuda_mm_act_quantize(&lay->d, n, X, ldx, c->xq[slot], ab, c->stream);
  c->hq[slot] = X == c->h ? lay->h : NULL;
  c->hq_n = n;
  return c->xq[slot];
}
static const uint8_t *act(model_session *s, int slot, const dmat *lay, int64_t n, const float *X, int64_t ldx,
                          size_t *stride) {
  return act_at(s, slot, lay, n, X, ldx, stride, true);
}

/* The act() call that reads h first after the norm that writes it: the attention / GDN block of
 * layer l (moe false), the MoE block of layer l (moe true: the router's layout when it has one,
 * else the experts'), or the output head (l == n_layer). NULL: the float path (exact mode). */
static const dmat *next_act(model_session *s, int64_t l, bool moe, int *slot) {
  const cu_model *cm = s->m->dev;
  const floe_hparams *hp = &s->m->hp;
  const dmat *lay;
  if (l >= hp->n_layer) {
    *slot = 1;
    lay = &cm->output;
  } else if (moe) {
    const cu_layer *L = &cm->L[l];
    const bool qr = act_bytes_of(&L->router) > 0;
    *slot = qr ? 0 : 1;
    lay = qr ? &L->router : &L->gate;
  } else {
    *slot = 0;
    lay = hp->recurrent[l] ? &cm->L[l].qkv : &cm->L[l].wq;
  }
  return s->act_q && act_bytes_of(lay) ? lay : NULL;
}

/* h = rmsnorm(x (+= delta)) * w, n rows (delta NULL: no add), quantized in the same launch for
 * the next_act(l_next, moe) consumer; or, when y is not NULL, the MoE combine of y (K slots,
 * weights wts, shared expert sh / shl) into x first. */
/* emb (not NULL, delta and y NULL): x's rows are first set to the token embedding rows of c->tok in
 * the norm's launch (cuda_mm_embed_norm_act) */
static void h_norm_at(model_session *s, float *x, const float *delta, const float *w, int64_t n, const dmat *lay,
                      int slot, const float *y, const float *wts, int K, const float *sh, const float *shl,
                      const cuda_mat *emb) {
  cu_sess *c = s->dev;
  const floe_hparams *hp = &s->m->hp;
  c->hq[0] = c->hq[1] = NULL;
  const cuda_mat *W = lay ? &lay->d : NULL;
  void *xq = lay ? c->xq[slot] : NULL;
  const size_t xs = lay ? cuda_mm_act_bytes(W) : 0;
  if (y)
    cuda_mm_combine_act(W, x, y, wts, K, sh, shl, w, c->h, hp->rms_eps, n, hp->n_embd, xq, xs, c->stream);
  else if (emb)
    cuda_mm_embed_norm_act(W, emb->type, emb->data, emb->row_bytes, emb->rows, c->tok, c->emb_keys, x, w, c->h, n,
                           hp->n_embd, hp->rms_eps, xq, xs, c->stream);
  else
    cuda_mm_norm_act(W, x, delta, w, c->h, n, hp->n_embd, hp->rms_eps, xq, xs, c->stream);
  if (lay) {
    c->hq[slot] = lay->h;
    c->hq_n = n;
  }
}
static void h_norm(model_session *s, float *x, const float *delta, const float *w, int64_t n, int64_t l_next, bool moe,
                   const float *y, const float *wts, int K, const float *sh, const float *shl) {
  int slot = 0;
  const dmat *lay = next_act(s, l_next, moe, &slot);
  h_norm_at(s, x, delta, w, n, lay, slot, y, wts, K, sh, shl, NULL);
}

/* The MTP block's input norm (layer n_layer, full attention), quantized in the same launch for
 * its attention's first matmul as next_act quantizes a trunk attention layer's input (next_act's
 * l = n_layer is the output head: the last trunk layer's combine asks for that one). */
static void h_norm_mtp(model_session *s, float *x, int64_t n) {
  const cu_model *cm = s->m->dev;
  const cu_layer *L = &cm->L[s->m->hp.n_layer];
  const dmat *lay = s->act_q && act_bytes_of(&L->wq) ? &L->wq : NULL;
  h_norm_at(s, x, NULL, L->attn_norm, n, lay, 0, NULL, NULL, 0, NULL, NULL, NULL);
}

/* Y = W X through the input prepared for layout lay (quantized when W shares it), else float. */
static void mm(model_session *s, const dmat *W, int64_t n, const float *X, int64_t ldx, const floe_mat *lay,
               const uint8_t *xq, size_t xs, float *Y, int64_t ldy) {
  cu_sess *c = s->dev;
  const bool q = xq && lay && layer_same_act(W->h, lay);
  cuda_mm_matmul(&W->d, n, X, ldx, q ? xq : NULL, q ? xs : 0, Y, ldy, c->stream);
}

/* A few rows (a verify, a small batch) through a joined matrix in one launch, its parts into their
 * own buffers (cuda_mm_matmul_parts; s2 = rows: two parts): false when cat is not joined or n is
 * not a few rows, and the caller takes the parts one by one. A chunk keeps the separate launches. */
#define FEW_ROWS_MAX 15
static bool mm_parts4(model_session *s, const dmat *cat, int64_t n, const float *X, int64_t ldx, const floe_mat *lay,
                      const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t s1, float *Y2, int64_t ldy2,
                      int64_t s2, float *Y3, int64_t ldy3, int64_t s3, float *Y4, int64_t ldy4) {
  cu_sess *c = s->dev;
  if (n < 2 || n > FEW_ROWS_MAX || !cat->d.data) return false;
  const bool q = xq && lay && layer_same_act(cat->h, lay);
  cuda_mm_matmul_parts(&cat->d, n, X, ldx, q ? xq : NULL, q ? xs : 0, Y, ldy, s1, Y2, ldy2, s2, Y3, ldy3, s3, Y4,
                       ldy4, c->stream);
  return true;
}
/* two or three parts (s2 = rows: two) */
static bool mm_parts(model_session *s, const dmat *cat, int64_t n, const float *X, int64_t ldx, const floe_mat *lay,
                     const uint8_t *xq, size_t xs, float *Y, int64_t ldy, int64_t s1, float *Y2, int64_t ldy2,
                     int64_t s2, float *Y3, int64_t ldy3) {
  return mm_parts4(s, cat, n, X, ldx, lay, xq, xs, Y, ldy, s1, Y2, ldy2, s2, Y3, ldy3, cat->d.rows, NULL, 0);
}

/* layer_matmul: a matrix with its own input layout */
static void mm_own(model_session *s, const dmat *W, int64_t n, const float *X, int64_t ldx, float *Y, int64_t ldy) {
  size_t xs;
  const uint8_t *xq = act(s, 1, W, n, X, ldx, &xs);
  mm(s, W, n, X, ldx, W->h, xq, xs, Y, ldy);
}

/* Y = W X for a block's output matrix (ssm_out, wo): through the rows the block's kernels already
 * quantized into xq[1] for W (done: every launch of the block did, xs their stride), else mm_own */
static void out_mm(model_session *s, const dmat *W, int64_t n, const float *X, int64_t ldx, bool done, size_t xs,
                   float *Y, int64_t ldy) {
  cu_sess *c = s->dev;
  if (!done) {
    mm_own(s, W, n, X, ldx, Y, ldy);
    return;
  }
  c->hq[1] = NULL; /* xq[1] holds X's rows, not h's */
  mm(s, W, n, X, ldx, W->h, c->xq[1], xs, Y, ldy);
}

/* The state of an evaluation in flight, cleared at its start (multi: a multi-session pass) */
static void eval_reset(cu_sess *c, bool multi) {
  c->lazy = c->lazy_valid = false;
  c->lazy_to = NULL;
  c->staged = false;
  c->dst = NULL;
  c->hid_dst = NULL;
  c->want_greedy = false;
  c->replay = false;
  c->nowait = c->ahead = false;
  c->next_pos = -1;
  c->capturing = -1;
  c->err = 0;
  c->multi = multi;
  c->multi_pos = false;
  c->seg = c->seg_cap = c->seg_rec = false;
  c->seg_id = -1;
}

/* Starts a chunk: tokens and positions staged (pinned) and uploaded; slot >= 0: the recorded
 * step of that slot serves it (replayed when recorded, else recorded now). */
static float *begin_chunk(model_session *s, const int32_t *tokens, int64_t n, int64_t pos0, int slot) {
  cu_sess *c = s->dev;
  const bool ahead = slot >= G_AHD && slot < G_AHD + 2; /* the token and position come from the device */
  const bool lazy_valid = c->lazy_valid;
  eval_reset(c, false);
  if (ahead) c->lazy_valid = lazy_valid; /* it writes alog[apar], not the deferred logits */
  if (!ahead) { /* (a NOWAIT step before an ahead one may not have copied its own yet) */
    memcpy(c->tok_h, tokens, (size_t)n * sizeof *tokens);
    for (int64_t t = 0; t < n; t++) c->pos_h[t] = (int32_t)(pos0 + t);
  }
  if (slot >= 0 && c->graph[slot]) {
    c->replay = true;
    c->capturing = slot;
    return c->x;
  }
  if (slot >= 0 && cuda_graph_begin(c->stream, c->msg, sizeof c->msg) == 0) c->capturing = slot;
  if (ahead) {
    cuda_step_next(c->greedy, c->tok, c->pos, c->stream);
  } else {
    cuda_rt_h2d_async(c->tok, c->tok_h, (size_t)n * 4, c->stream);
    cuda_rt_h2d_async(c->pos, c->pos_h, (size_t)n * 4, c->stream);
  }
  if (c->profile) {
    cuda_rt_stream_sync(c->stream, NULL, 0);
    c->t_blk = floe_time_s();
  }
  return c->x;
}

/* ---- tiered steps in recorded segments (the header's comment) ---- */
static void **seg_cell(cu_sess *c, int id) {
  const int kind = c->capturing == G_LAZY ? 2 : c->capturing - G_DEC;
  return c->seg_g + (size_t)kind * (size_t)c->seg_n + (size_t)id;
}

/* The rest of the step runs eagerly, as without segments (an error, or a capture refused); a
 * capture in progress is dropped. */
static void seg_abort(cu_sess *c) {
  if (c->seg_cap) {
    void *x = NULL;
    char m[8];
    cuda_graph_end(c->stream, &x, m, sizeof m);
    cuda_graph_destroy(x);
  }
  c->seg = c->seg_cap = false;
  c->seg_id = -1;
  c->capturing = -1;
  c->replay = false;
}

/* Segment id starts: replayed when recorded (the blocks then enqueue nothing), else captured. */
static void seg_open(model_session *s, int id) {
  cu_sess *c = s->dev;
  if (id < 0 || id >= c->seg_n) {
    seg_abort(c);
    return;
  }
  c->seg_id = id;
  if (*seg_cell(c, id)) {
    c->replay = true;
    return;
  }
  c->replay = false;
  if (cuda_graph_begin(c->stream, c->msg, sizeof c->msg) == 0) {
    c->seg_cap = true;
    return;
  }
  seg_abort(c);
  c->seg_on = false; /* capture refused: this session runs its tiered steps eagerly */
}

/* The current segment ends: its capture becomes its graph (not kept when the step failed), and the
 * graph is launched. 0, or -1 with c->err set (the rest of the step then runs eagerly). */
static int seg_cut(model_session *s) {
  cu_sess *c = s->dev;
  if (c->seg_id < 0) return 0;
  void **g = seg_cell(c, c->seg_id);
  int rec = 0;
  c->seg_id = -1;
  c->replay = false;
  if (c->seg_cap) {
    c->seg_cap = false;
    void *x = NULL;
    if (cuda_graph_end(c->stream, &x, c->msg, sizeof c->msg)) c->err = FLOE_E_IO;
    if (c->err) {
      cuda_graph_destroy(x);
      seg_abort(c);
      return -1;
    }
    *g = x;
    rec = 1;
    c->seg_rec = true;
  }
  if (cuda_graph_launch(*g, c->stream, c->msg, sizeof c->msg)) {
    c->err = FLOE_E_IO;
    seg_abort(c);
    return -1;
  }
  cu_tier_count_graphs(c->tier, rec, 1);
  return 0;
}

/* ---- decoding ahead (backend.h MODEL_EVAL_NOWAIT / MODEL_EVAL_AHEAD) ---- */
/* Whether this session runs steps ahead at all (pos < 0), or an ahead step may take position pos
 * now: right after a NOWAIT step or an accepted ahead step at pos - 1, its pick not collected. */
static bool ahead_ready(const cu_sess *c, int64_t pos) {
  if (!c->ahead_allowed || !c->use_graph || c->seg_on || c->tier || c->multi) return false;
  return pos < 0 || (c->pick_slot >= 0 && c->ahead_slot < 0 && c->next_pos == pos);
}

/* A lazy evaluation's logits row (the one launched last into c->logits) becomes the deferred one */
static void lazy_handover(model_session *s) {
  cu_sess *c = s->dev;
  if (!c->lazy_to) return;
  s->lazy_dst = c->lazy_to;
  c->lazy_src = c->logits;
  c->lazy_valid = true;
}

static float *cu_eval_begin(model_session *s, const int32_t *tokens, int64_t n, int64_t pos0, int flags) {
  cu_sess *c = s->dev;
  int slot = -1;
  const bool one = c->use_graph || c->seg_on; /* one-token steps are recorded (whole or in segments) */
  if (c->keep_n) { /* a kept verify chunk: recorded per row count when it asks for all it can */
    if (c->spec_graph && n == c->keep_n && flags == (MODEL_EVAL_LOGITS | MODEL_EVAL_HIDDEN)) slot = G_VER + (int)n - 1;
  } else if (n == 1 && !(flags & MODEL_EVAL_HIDDEN) && one) { /* decode, per kind */
    slot = G_DEC + ((flags & MODEL_EVAL_LOGITS) ? 1 : 0);
  } else if (n == 1 && flags == (MODEL_EVAL_LOGITS | MODEL_EVAL_HIDDEN) && c->spec_graph) {
    slot = G_DEC + 2;
  }
  const int lazy1 = MODEL_EVAL_LOGITS | MODEL_EVAL_LAZY;
  if (!c->keep_n && n == 1 && (flags == lazy1 || flags == (lazy1 | MODEL_EVAL_NOWAIT)) && one) slot = G_LAZY;
  /* a step run ahead: its logits go to the alog buffer the deferred ones are not in */
  const int apar = c->lazy_valid && c->lazy_src == c->alog[0] ? 1 : 0;
  if (c->keep_n == 1 && n == 1 && flags == (lazy1 | MODEL_EVAL_NOWAIT | MODEL_EVAL_AHEAD) && ahead_ready(c, pos0))
    slot = G_AHD + apar;
  const bool nowait = (flags & MODEL_EVAL_NOWAIT) && (slot == G_LAZY || slot == G_AHD + apar) && !c->seg_on;
  float *x;
  if (c->seg_on && (slot == G_DEC || slot == G_DEC + 1 || slot == G_LAZY)) {
    x = begin_chunk(s, tokens, n, pos0, -1); /* the token and position copied before segment 0 */
    c->seg = true;
    c->capturing = slot;
    seg_open(s, 0);
  } else {
    x = begin_chunk(s, tokens, n, pos0, slot);
  }
  c->lazy = (flags & MODEL_EVAL_LAZY) != 0;
  if ((flags & MODEL_EVAL_NOWAIT) && !nowait) { /* the model asks only after ahead_ok: never here */
    c->err = FLOE_E_INVALID;
    snprintf(c->msg, sizeof c->msg, "a step that cannot run ahead was asked to");
  }
  c->nowait = nowait;
  c->ahead = slot == G_AHD + apar;
  c->apar = apar;
  c->cur_pos0 = pos0;
  return x;
}

/* FLOE_CUDA_PROFILE: the block's time (synchronized) into phase ph. */
static void prof(model_session *s, int ph) {
  cu_sess *c = s->dev;
  if (!c->profile) return;
  cuda_rt_stream_sync(c->stream, NULL, 0);
  const double t = floe_time_s();
  s->ph[ph] += t - c->t_blk;
  c->t_blk = t;
}

static void cu_embed(model_session *s, const int32_t *tokens, int64_t n, float *x) {
  cu_sess *c = s->dev;
  if (c->multi) /* a chunk's tokens were staged by begin_chunk; a pass's come here (a replayed
                   pass's recorded copy reads them from tok_h) */
    memcpy(c->tok_h, tokens, (size_t)n * sizeof *tokens);
  if (c->replay) return;
  if (c->multi) cuda_rt_h2d_async(c->tok, c->tok_h, (size_t)n * 4, c->stream);
  const model *m = s->m;
  const cu_model *cm = m->dev;
  const int64_t E = m->hp.n_embd;
  const cuda_mat *T = &cm->tok_embd.d;
  const bool ek = cuda_embed_check(T->type, E, NULL, 0) == 0;
  if (ek && c->embed_norm) { /* the rows written and normed by one launch */
    int slot = 0;
    const dmat *lay = next_act(s, 0, false, &slot);
    h_norm_at(s, x, NULL, cm->L[0].attn_norm, n, lay, slot, NULL, NULL, 0, NULL, NULL, T);
    prof(s, MODEL_PH_OTHER);
    return;
  }
  if (ek)
    cuda_embed_rows(T->type, T->data, T->row_bytes, T->rows, E, c->tok, n, x, c->stream);
  else
    cuda_mm_dequant_rows(T, c->tok, n, x, E, c->stream);
  h_norm(s, x, NULL, cm->L[0].attn_norm, n, 0, false, NULL, NULL, 0, NULL, NULL);
  prof(s, MODEL_PH_OTHER);
}

/* After a block: x += out, h = the next block's normed input (this layer's ffn_norm). */
static void residual(model_session *s, int64_t l, float *x, int64_t n) {
  cu_sess *c = s->dev;
  const cu_model *cm = s->m->dev;
  h_norm(s, x, c->out, cm->L[l].ffn_norm, n, l, true, NULL, NULL, 0, NULL, NULL);
}

/* The attention block over the rows of k sessions (r: each one's rows [off, off + n) of the pass;
 * one session: its own chunk): the projections and the output matrix over all N rows in lead's
 * scratch, the cache part per session on its own KV cache, rope table and split-K scratch, all on
 * lead's stream; positions from lead's pos (the chunk's, or the pass's: attention_multi). */
static void attn_rows(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N, bool gated) {
  cu_sess *c = lead->dev;
  if (c->replay) return;
  const model *m = lead->m;
  const floe_hparams *hp = &m->hp;
  const cu_layer *L = &((const cu_model *)m->dev)->L[l];
  const int64_t E = hp->n_embd, nh = hp->n_head, hd = hp->head_dim, kvd = hp->n_head_kv * hd;
  const int64_t qdim = nh * hd * (gated ? 2 : 1);
  size_t xs;
  const uint8_t *xq = act(lead, 0, &L->wq, N, c->h, E, &xs);
  float *q = c->q, *kk = c->k, *v = c->v;
  int64_t ldq = qdim, ldk = kvd; /* one row through the joined matrix: q | k | v adjacent */
  if (N == 1 && L->cat_qkv.d.data) {
    mm(lead, &L->cat_qkv, N, c->h, E, L->wq.h, xq, xs, q, qdim + 2 * kvd);
    kk = q + qdim;
    v = kk + kvd;
    ldq = ldk = qdim + 2 * kvd;
  } else if (!mm_parts(lead, &L->cat_qkv, N, c->h, E, L->wq.h, xq, xs, q, qdim, qdim, kk, kvd, qdim + kvd, v, kvd)) {
    mm(lead, &L->wq, N, c->h, E, L->wq.h, xq, xs, q, qdim);
    mm(lead, &L->wk, N, c->h, E, L->wq.h, xq, xs, kk, kvd);
    mm(lead, &L->wv, N, c->h, E, L->wq.h, xq, xs, v, kvd);
  }
  /* att quantized for wo by the attention's own launches where they can (cuda_attn_q), else by mm_own */
  cuda_act_out qo = { NULL, NULL, 0 };
  if (lead->act_q && act_bytes_of(&L->wo)) qo = (cuda_act_out){ &L->wo.d, NULL, act_bytes_of(&L->wo) };
  bool all_q = qo.W != NULL;
  for (int i = 0; i < k; i++) {
    cu_sess *cs = r[i].s->dev;
    const int64_t o = r[i].off, n = r[i].n;
    float *qi = q + o * ldq, *ki = kk + o * ldk, *vi = v + o * ldk, *att = c->att + o * nh * hd;
    const int32_t *pos = c->pos + o;
    cuda_attn_shape sh = cs->ash;
    sh.gated = gated ? 1 : 0;
    if (cs->arows > AB || cuda_attn_rows_used(n)) {
      /* the row-group kernel: every row's K/V into the cache first (a row reads only positions up
       * to its own), then the attention of up to arows rows a launch */
      cuda_attn_prep(&sh, qi, ki, vi, L->q_norm, L->k_norm, cs->rope, cs->kc[l], cs->vc[l], pos, n, c->stream);
      for (int64_t t0 = 0; t0 < n; t0 += cs->arows) {
        const int64_t nb = n - t0 < cs->arows ? n - t0 : cs->arows;
        qo.xq = c->xq[1] + (size_t)(o + t0) * qo.xs;
        all_q &= cuda_attn_q(&sh, qi + t0 * qdim, cs->kc[l], cs->vc[l], pos + t0, nb, att + t0 * nh * hd,
                             cs->attn_scr, qo.W ? &qo : NULL, c->stream) != 0;
      }
    } else
      for (int64_t t0 = 0; t0 < n; t0 += AB) {
        const int64_t nb = n - t0 < AB ? n - t0 : AB;
        cuda_attn_prep(&sh, qi + t0 * qdim, ki + t0 * kvd, vi + t0 * kvd, L->q_norm, L->k_norm, cs->rope, cs->kc[l],
                       cs->vc[l], pos + t0, nb, c->stream);
        qo.xq = c->xq[1] + (size_t)(o + t0) * qo.xs;
        all_q &= cuda_attn_q(&sh, qi + t0 * qdim, cs->kc[l], cs->vc[l], pos + t0, nb, att + t0 * nh * hd,
                             cs->attn_scr, qo.W ? &qo : NULL, c->stream) != 0;
      }
  }
  out_mm(lead, &L->wo, N, c->att, nh * hd, all_q, qo.xs, c->out, E);
  residual(lead, l, x, N);
  prof(lead, MODEL_PH_ATTN);
}

static void cu_attention(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0, bool gated) {
  (void)pos0; /* the chunk's positions are in c->pos (begin_chunk) */
  const model_rows r = { s, 0, n };
  attn_rows(s, &r, 1, l, x, n, gated);
}

/* The GatedDeltaNet block over the rows of k sessions (as attn_rows): the projections and ssm_out
 * over all N rows in lead's scratch, the conv + recurrence per session on its own states (kept
 * per row only in a single session's verify chunk), all on lead's stream. */
static void gdn_rows(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t N) {
  cu_sess *c = lead->dev;
  if (c->replay) return;
  const model *m = lead->m;
  const floe_hparams *hp = &m->hp;
  const cu_layer *L = &((const cu_model *)m->dev)->L[l];
  const int64_t E = hp->n_embd, Nv = hp->ssm_dt_rank, vd = hp->ssm_d_inner;
  const int64_t C = 2 * hp->ssm_n_group * hp->ssm_d_state + vd;
  const floe_mat *lay = L->lay_gdn;
  size_t xs;
  /* the CPU: q|k|v and z from one matrix (grouped) or two, b and a likewise; each quantized iff
   * its source matrix shares the layout of the first (L->*.h is that source) */
  const uint8_t *xq = act(lead, 0, &L->qkv, N, c->h, E, &xs);
  float *mix = c->mix, *z = c->z, *b = c->b, *a = c->a;
  /* one token: the joined matrices in one launch (all four where they are one matrix), the parts
   * adjacent in the output row; a few rows: all four parts into their buffers in one launch */
  bool ba_done = false;
  if (N == 1 && L->cat_gdn.d.data) {
    mm(lead, &L->cat_gdn, N, c->h, E, lay, xq, xs, mix, C + vd + 2 * Nv);
    z = mix + C;
    b = z + vd;
    a = b + Nv;
  } else if (N > 1 && mm_parts4(lead, &L->cat_gdn, N, c->h, E, lay, xq, xs, mix, C, C, z, vd, C + vd, b, Nv,
                                C + vd + Nv, a, Nv)) {
    ba_done = true;
  } else if (N == 1 && L->cat_qkvz.d.data) {
    mm(lead, &L->cat_qkvz, N, c->h, E, lay, xq, xs, mix, C + vd);
    z = mix + C;
  } else if (!mm_parts(lead, &L->cat_qkvz, N, c->h, E, lay, xq, xs, mix, C, C, z, vd, C + vd, NULL, 0)) {
    mm(lead, &L->qkv, N, c->h, E, lay, xq, xs, mix, C);
    mm(lead, &L->z, N, c->h, E, lay, xq, xs, z, vd);
  }
  if ((N == 1 && L->cat_gdn.d.data) || ba_done) {
    /* b and a came with q|k|v|z */
  } else if (N == 1 && L->cat_ba.d.data) {
    mm(lead, &L->cat_ba, N, c->h, E, lay, xq, xs, b, 2 * Nv);
    a = b + Nv;
  } else if (!mm_parts(lead, &L->cat_ba, N, c->h, E, lay, xq, xs, b, Nv, Nv, a, Nv, 2 * Nv, NULL, 0)) {
    mm(lead, &L->b, N, c->h, E, lay, xq, xs, b, Nv);
    mm(lead, &L->a, N, c->h, E, lay, xq, xs, a, Nv);
  }
  /* the states through the table's cells (a recorded step follows keep_accept's swaps); a kept
   * chunk writes row t's states into their own buffers (keep_begin). Rows of one session are
   * consecutive in mix / z / b / a / o (N == 1: z is mix's tail, one row). */
  /* o quantized for ssm_out by the step's own launch where it can (cuda_gdn_step_q), else by mm_own */
  cuda_act_out qo = { NULL, NULL, 0 };
  if (lead->act_q && act_bytes_of(&L->ssm_out)) qo = (cuda_act_out){ &L->ssm_out.d, NULL, act_bytes_of(&L->ssm_out) };
  bool all_q = qo.W != NULL;
  for (int i = 0; i < k; i++) {
    model_session *si = r[i].s;
    const int64_t o = r[i].off;
    const bool kp = k == 1 && c->keep_n > 0;
    qo.xq = c->xq[1] + (size_t)o * qo.xs;
    all_q &= cuda_gdn_step_q(&c->gsh, mix + o * C, L->conv_wt, tab_at(si, true, l, 0),
                             kp ? tab_at(si, true, l, 1) : NULL, c->raw, z + o * vd, b + o * Nv, a + o * Nv,
                             L->dt_bias, L->ssm_a, L->ssm_norm, tab_at(si, false, l, 0),
                             kp ? tab_at(si, false, l, 1) : NULL, c->o + o * vd, r[i].n, qo.W ? &qo : NULL,
                             c->stream) != 0;
  }
  out_mm(lead, &L->ssm_out, N, c->o, vd, all_q, qo.xs, c->out, E);
  residual(lead, l, x, N);
  prof(lead, MODEL_PH_GDN);
}

static void cu_gdn(model_session *s, int64_t l, float *x, int64_t n) {
  const model_rows r = { s, 0, n };
  gdn_rows(s, &r, 1, l, x, n);
}

/* ---- several sessions in one pass (backend.h multi_begin; FLOE_CUDA_MULTI=0: one after another) ----
 * lead's scratch holds the pass's N rows; the blocks' per-session parts (KV caches, recurrent
 * states, rope tables) are the segments' own, on lead's stream. Not recorded as a graph. */
static bool cu_multi_ok(const model_session *lead) {
  (void)lead;
  const char *e = getenv("FLOE_CUDA_MULTI");
  return !(e && e[0] == '0');
}

/* The recorded-pass slot of segments r (one row each) with logits from row first: replayed when
 * recorded, else recorded now into the least recently used slot; -1: not recordable (rows of more
 * than one token, too many segments, recording off). */
static int multi_slot(cu_sess *c, const model_rows *r, int k, int64_t first, bool *found) {
  *found = false;
  if (!c->multi_graph || !c->use_graph || k < 2 || k > MG_KMAX) return -1;
  uint64_t key[MG_KMAX + 2] = { (uint64_t)k, (uint64_t)first };
  for (int i = 0; i < k; i++) {
    if (r[i].n != 1) return -1;
    key[2 + i] = ((const cu_sess *)r[i].s->dev)->uid;
  }
  for (int j = 0; j < MG_N; j++)
    if (c->graph[G_N + j] && memcmp(c->mkey[j], key, (size_t)(k + 2) * sizeof key[0]) == 0) {
      c->mused[j] = ++c->mtick;
      *found = true;
      return G_N + j;
    }
  int lru = -1; /* an empty slot, else the least recently used */
  for (int j = 0; j < MG_N && lru < 0; j++)
    if (!c->graph[G_N + j]) lru = j;
  if (lru < 0) {
    lru = 0;
    for (int j = 1; j < MG_N; j++)
      if (c->mused[j] < c->mused[lru]) lru = j;
  }
  cuda_graph_destroy(c->graph[G_N + lru]);
  c->graph[G_N + lru] = NULL;
  memcpy(c->mkey[lru], key, (size_t)(k + 2) * sizeof key[0]);
  c->mused[lru] = ++c->mtick;
  return G_N + lru;
}

static float *cu_multi_begin(model_session *lead, const model_rows *r, int k, int64_t n, int64_t first) {
  (void)n;
  cu_sess *c = lead->dev;
  eval_reset(c, true);
  if (c->profile) {
    cuda_rt_stream_sync(c->stream, NULL, 0);
    c->t_blk = floe_time_s();
  }
  bool found = false;
  const int slot = multi_slot(c, r, k, first, &found);
  if (slot >= 0 && found) { /* replayed at eval_end: the blocks only stage tokens and positions */
    c->replay = true;
    c->capturing = slot;
  } else if (slot >= 0 && cuda_graph_begin(c->stream, c->msg, sizeof c->msg) == 0) {
    c->capturing = slot; /* eval_end ends the recording and launches it */
  }
  return c->x;
}

/* the pass's positions: segment i's rows at its session's n_past, n_past + 1, ... */
static void multi_positions(model_session *lead, const model_rows *r, int k) {
  cu_sess *c = lead->dev;
  if (c->multi_pos) return;
  int64_t N = 0;
  for (int i = 0; i < k; i++) {
    for (int64_t t = 0; t < r[i].n; t++) c->pos_h[r[i].off + t] = (int32_t)(r[i].s->kv.n_past + t);
    if (r[i].off + r[i].n > N) N = r[i].off + r[i].n;
  }
  if (!c->replay) cuda_rt_h2d_async(c->pos, c->pos_h, (size_t)N * 4, c->stream); /* else the recorded copy */
  c->multi_pos = true;
}

static void cu_attention_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t n,
                               bool gated) {
  multi_positions(lead, r, k);
  attn_rows(lead, r, k, l, x, n, gated);
}

static void cu_gdn_multi(model_session *lead, const model_rows *r, int k, int64_t l, float *x, int64_t n) {
  gdn_rows(lead, r, k, l, x, n);
}

/* The routing of n tokens from c->rlog into c->sel / c->selw; shg: the shared expert's gate logits
 * when it is slot K of the stack (id n_expert), else NULL. */
static void moe_route(model_session *s, int64_t n, const float *shg) {
  cu_sess *c = s->dev;
  const floe_hparams *hp = &s->m->hp;
  const int NE = (int)hp->n_expert, K = (int)hp->n_expert_used, nt = hp->norm_topk ? 1 : 0;
  if (shg) cuda_moe_route_sh(c->rlog, n, NE, K, nt, shg, NE, c->sel, c->selw, c->stream);
  else cuda_moe_route(c->rlog, n, NE, K, nt, c->sel, c->selw, c->stream);
}

static void cu_moe(model_session *s, int64_t l, float *x, int64_t n) {
  cu_sess *c = s->dev;
  if (c->replay && !c->seg) return; /* a segmented step comes here for the host decisions */
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const cu_model *cm = m->dev;
  const cu_layer *L = &cm->L[l];
  const model_layer *H = &m->layers[l];
  const int64_t E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used, I = hp->n_ff_exp, Is = hp->n_ff_shexp;
  /* run: enqueue this part's kernels (a replayed segment has them) */
  bool run = !c->replay;
  size_t xs_r, xs_e;
  const uint8_t *xq_r = act_at(s, 0, &L->router, n, c->h, E, &xs_r, run), *xq_e;
  const floe_mat *lay_e = &H->exp_gate[0];
  if (xq_r && layer_same_act(lay_e, &H->router)) {
    xq_e = xq_r;
    xs_e = xs_r;
  } else {
    xq_e = act_at(s, 1, &L->gate, n, c->h, E, &xs_e, run);
  }
  float *shg = c->shg;
  const bool q_rt = xq_r != NULL; /* a quantized router takes the quantized path (two launches) */
  /* one token, float router: logits, shared gate logit and routing in one launch */
  const dmat *rt1 = L->sh_in_stack ? &L->cat_rt : Is == 0 ? &L->router : NULL;
  /* (not in a segmented step: whether it ran decides shg, which a replayed segment must know) */
  const bool fused = n == 1 && c->route_fused && !c->seg && !q_rt && rt1 && rt1->d.data;
  if (n == 1 && L->cat_rt.d.data && !fused) shg = c->rlog + NE; /* as the branches below */
  const bool qe = xq_e && layer_same_act(&H->exp_up[0], lay_e);
  /* one token, resident: the routing may go into the gate+up launch (cuda_mm_moe_gate_up_route),
   * which reads the shared expert's gate logit at rlog[NE] */
  const bool defer = run && n == 1 && !fused && !c->tier && qe && (!L->sh_in_stack || shg == c->rlog + NE);
  bool deferred = false;
  if (!run) {
  } else if (fused && cuda_mm_router_route(&rt1->d, c->h, c->rlog, (int)NE, (int)K, hp->norm_topk ? 1 : 0,
                                  L->sh_in_stack ? (int)NE : -1, c->sel, c->selw, c->route_ctr, c->stream) == 0) {
    shg = c->shg;
    prof(s, MODEL_PH_ROUTER);
  } else if (L->sh_in_stack) {
    if (n == 1 && L->cat_rt.d.data) {
      mm(s, &L->cat_rt, n, c->h, E, &H->router, xq_r, xs_r, c->rlog, NE + 1);
      shg = c->rlog + NE;
    } else if (!mm_parts(s, &L->cat_rt, n, c->h, E, &H->router, xq_r, xs_r, c->rlog, NE, NE, shg, 1, NE + 1, NULL, 0)) {
      mm(s, &L->router, n, c->h, E, &H->router, xq_r, xs_r, c->rlog, NE);
      mm(s, &L->sh_gate_inp, n, c->h, E, &H->router, xq_r, xs_r, shg, 1);
    }
    if (defer) deferred = true;
    else moe_route(s, n, shg);
    prof(s, MODEL_PH_ROUTER);
  } else {
    if (n == 1 && L->cat_rt.d.data) {
      mm(s, &L->cat_rt, n, c->h, E, &H->router, xq_r, xs_r, c->rlog, NE + 1);
      shg = c->rlog + NE;
    } else if (Is == 0 ||
               !mm_parts(s, &L->cat_rt, n, c->h, E, &H->router, xq_r, xs_r, c->rlog, NE, NE, shg, 1, NE + 1, NULL, 0)) {
      mm(s, &L->router, n, c->h, E, &H->router, xq_r, xs_r, c->rlog, NE);
      if (Is > 0) mm(s, &L->sh_gate_inp, n, c->h, E, &H->router, xq_r, xs_r, shg, 1);
    }
    if (defer) deferred = true;
    else moe_route(s, n, NULL);
    prof(s, MODEL_PH_ROUTER);
  }
  /* the combine's norm: the next layer's input norm; after the last layer the output norm, after
   * the MTP block (l = n_layer) its own norm (mtp_end / sg_mtp read that h, quantized for the head) */
  const float *next = l + 1 < hp->n_layer ? cm->L[l + 1].attn_norm : l >= hp->n_layer ? cm->mtp_norm : cm->output_norm;
  /* several tokens: the slots grouped by expert, each expert's weights read once per tile of slots
   * (decode keeps the per-slot kernels: one token has one slot per expert) */
  const int ks = L->sh_in_stack ? (int)K + 1 : (int)K;
  /* ids: the experts' places in the stacks (tiered: pool slots, cuda_tier.c) */
  const int32_t *ids = c->sel;
  /* tiered, one token, cu_tier_pf: the next layer's experts predicted by its router on this
   * layer's input (the CPU's XS_PF_NEXT: 84 % precision on the synth shapes), so the tier copies
   * them ahead while this layer computes; the prediction moves bytes only, never a result */
  const int32_t *pred = NULL;
  if (c->tier && n == 1 && l + 1 < hp->n_layer && cu_tier_pf(cm->tier)) {
    const cu_layer *L1 = &cm->L[l + 1];
    const model_layer *H1 = &m->layers[l + 1];
    if (L1->router.d.data && (!xq_r || layer_same_act(&H1->router, &H->router))) {
      if (run) {
        mm(s, &L1->router, 1, c->h, E, &H->router, xq_r, xs_r, c->plog, NE);
        cuda_moe_route(c->plog, 1, (int)NE, (int)K, hp->norm_topk ? 1 : 0, c->psel, c->pselw, c->stream);
      }
      pred = c->psel;
    }
  }
  if (c->tier) { /* the host decides: a segmented step's segment ends here */
    if (c->seg) {
      if (seg_cut(s)) return; /* c->err */
      if (l >= hp->n_layer) seg_abort(c);
    }
    if (cu_tier_begin(c->tier, l, c->sel, pred, n, ks, L->sh_in_stack, c->h, qe ? xq_e : NULL, qe ? xs_e : 0,
                      qe && n == 1, c->stream, &ids, c->msg, sizeof c->msg)) {
      c->err = FLOE_E_IO;
      seg_abort(c);
      return;
    }
    if (c->seg) seg_open(s, cu_tier_cpu_jobs(c->tier) ? SEG_M(l) : SEG_MC(l));
  }
  run = !c->replay;
  if (run) {
    void *grp = NULL;
    if (n > 1 && n >= c->moe_group_min && qe && L->gate.d.n_expert <= CUDA_MM_GROUP_MAX_EXPERT &&
        cuda_mm_moe_group_useful(&L->gate.d, &L->up.d, &L->down.d)) {
      cuda_mm_moe_group(ids, n * ks, L->gate.d.n_expert, c->grp, c->stream);
      grp = c->grp;
    }
    /* with sh_in_stack the shared expert is slot K of K + 1 in the same launches; a deferred
     * routing runs in the gate+up launch, or here before it where that launch does not apply */
    if (!deferred || cuda_mm_moe_gate_up_route(&L->gate.d, &L->up.d, c->rlog, (int)NE, (int)K, hp->norm_topk ? 1 : 0,
                                               L->sh_in_stack ? (int)NE : -1, c->sel, c->selw, xq_e, c->hr, I,
                                               c->stream) != 0) {
      if (deferred) moe_route(s, n, L->sh_in_stack ? shg : NULL);
      cuda_mm_moe_gate_up_grp(&L->gate.d, &L->up.d, n, ks, ids, grp, c->h, E, qe ? xq_e : NULL, qe ? xs_e : 0, c->hr,
                              I, c->stream);
    }
    if (!L->sh_in_stack && Is > 0) {
      const bool qs = xq_e && layer_same_act(&H->sh_gate, lay_e) && layer_same_act(&H->sh_up, lay_e);
      cuda_mm_moe_gate_up(&L->sh_gate.d, &L->sh_up.d, n, 1, NULL, c->h, E, qs ? xq_e : NULL, qs ? xs_e : 0, c->hs,
                          Is, c->stream);
    }
    cuda_mm_moe_down_grp(&L->down.d, n, ks, ids, grp, c->hr, I, c->xqd, c->xq_row, c->yr, E, c->stream);
    if (!L->sh_in_stack && Is > 0)
      cuda_mm_moe_down(&L->sh_down.d, n, 1, NULL, c->hs, Is, c->xq[1], c->xq_row, c->ys, E, c->stream);
  }
  if (!L->sh_in_stack && Is > 0) c->hq[1] = NULL; /* xq[1] was the scratch */
  if (c->tier) { /* the CPU's rows are queued after the expert kernels (a segment M ends first) */
    const bool cut = c->seg && c->seg_id == SEG_M(l);
    if (cut && seg_cut(s)) return;
    if (cu_tier_end(c->tier, c->yr, c->stream, c->msg, sizeof c->msg)) {
      c->err = FLOE_E_IO;
      seg_abort(c);
      return;
    }
    if (cut) seg_open(s, SEG_C(l));
  }
  if (!c->replay) {
    const bool shx = !L->sh_in_stack && Is > 0; /* the shared expert apart */
    h_norm(s, x, NULL, next, n, l + 1, false, c->yr, c->selw, shx ? (int)K : ks, shx ? c->ys : NULL,
           shx ? shg : NULL);
  }
  prof(s, MODEL_PH_EXPERTS);
}

/* Logits of rows [first, n): h holds their output-normed rows (the last MoE's combine). */
static void cu_logits(model_session *s, const float *x, int64_t first, int64_t n, float *logits, bool greedy) {
  (void)x;
  cu_sess *c = s->dev;
  const model *m = s->m;
  const cu_model *cm = m->dev;
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
  if (c->replay) { /* the recorded step computes them; eval_end copies them out */
    if (first != c->gfirst[c->capturing] && !c->err) { /* recorded for other rows: refuse, never mix */
      c->err = FLOE_E_INVALID;
      snprintf(c->msg, sizeof c->msg, "a recorded step replayed for logits from row %lld (recorded: %lld)",
               (long long)first, (long long)c->gfirst[c->capturing]);
    }
    c->dst = logits;
    c->dst_rows = n - first;
    c->staged = !c->lazy;
    c->want_greedy = greedy;
    if (c->lazy) c->lazy_to = logits;
    return;
  }
  if (c->capturing >= 0) c->gfirst[c->capturing] = first;
  /* a step run ahead: its logits beside the deferred ones, its pick in its own pinned cell */
  float *lg = c->ahead ? c->alog[c->apar] : c->logits;
  for (int64_t r0 = first; r0 < n; r0 += LB) {
    const int64_t nb = n - r0 < LB ? n - r0 : LB;
    mm_own(s, &cm->output, nb, c->h + r0 * E, E, lg, V);
    if (greedy && r0 + nb == n) {
      const int cell = c->ahead ? 1 + c->apar : 0;
      if (c->greedy_hd && nb == 1 && n - first == 1) { /* a one-token step: the launch writes the pinned cell */
        cuda_argmax_to(lg, V, c->greedy, c->greedy_hd + cell, c->amax_scr, c->stream);
      } else {
        cuda_argmax(lg + (nb - 1) * V, V, c->greedy, c->amax_scr, c->stream);
        cuda_rt_d2h_async(c->greedy_h + cell, c->greedy, 4, c->stream);
      }
      c->want_greedy = true;
    }
    if (c->lazy && greedy && nb == 1) { /* the row stays in c->logits until fetched */
      c->lazy_to = logits + (r0 - first) * V;
      continue;
    }
    cuda_rt_d2h_async(c->logits_h, c->logits, (size_t)(nb * V) * 4, c->stream);
    if (c->capturing >= 0) { /* one row: copied out after the replay */
      c->dst = logits + (r0 - first) * V;
      c->dst_rows = nb;
      c->staged = true;
      continue;
    }
    if (cuda_rt_stream_sync(c->stream, c->msg, sizeof c->msg)) {
      c->err = FLOE_E_IO;
      return;
    }
    prof(s, MODEL_PH_LMHEAD);
    memcpy(logits + (r0 - first) * V, c->logits_h, (size_t)(nb * V) * 4);
  }
}

/* Staged in pinned memory (a recorded step copies there), copied out by eval_end. */
static void cu_hidden(model_session *s, const float *x, int64_t first, int64_t n, float *dst) {
  cu_sess *c = s->dev;
  const int64_t E = s->m->hp.n_embd;
  if (!c->replay) cuda_rt_d2h_async(c->hid_h, x + first * E, (size_t)((n - first) * E) * 4, c->stream);
  c->hid_dst = dst;
  c->hid_rows = n - first;
}

static int cu_eval_end(model_session *s, int64_t n, char *err, size_t errlen);

/* ---- the MTP block (backend.h mtp_begin / mtp_end; mtp.c has the math) ----
 * The same operations as mtp.c's host path: embedding row, the two norms into the halves of a
 * [n][2E] concat row (one norm launch per half row: the norm kernel writes contiguous rows), the
 * fc through mm_own (layer_matmul's input choice), then layer n_layer's attention and MoE (the
 * driver calls them), then the block's final norm and the output head (cu_logits). A draft's
 * evaluation (n <= KV_KEEP_MAX rows, the last row's logits, every row's output) is a recorded
 * step per n: h is staged in pinned hin_h, the outputs in hid_h / logits_h. */
/* The MTP block's input rows: the embedding rows of c->tok (into emb) and h rows hd, each normed
 * into its half of the [n][2E] concat rows cat (one norm launch per half row: the norm kernel
 * writes contiguous rows). */
static size_t mtp_concat(model_session *s, const float *hd, int64_t n, float *emb, float *cat) {
  cu_sess *c = s->dev;
  const cu_model *cm = s->m->dev;
  const int64_t E = s->m->hp.n_embd;
  const float eps = s->m->hp.rms_eps;
  const cuda_mat *T = &cm->tok_embd.d;
  /* the concat rows quantized for mtp_fc in the same launch where the norms' kernel can (xq[1]) */
  const dmat *F = s->act_q && act_bytes_of(&cm->mtp_fc) ? &cm->mtp_fc : NULL;
  const size_t xs = F ? cuda_mm_act_bytes(&F->d) : 0;
  const bool ek = cuda_embed_check(T->type, E, NULL, 0) == 0;
  if (ek && c->mtp_embed) /* the embedding rows read by the norms' launch */
    return cuda_mm_embed_norm_pair_act(F ? &F->d : NULL, T->type, T->data, T->row_bytes, T->rows, c->tok,
                                       c->emb_keys, cm->mtp_enorm, hd, cm->mtp_hnorm, cat, n, E, eps,
                                       F ? c->xq[1] : NULL, xs, c->stream)
               ? xs
               : 0;
  if (ek)
    cuda_embed_rows(T->type, T->data, T->row_bytes, T->rows, E, c->tok, n, emb, c->stream);
  else
    cuda_mm_dequant_rows(T, c->tok, n, emb, E, c->stream);
  return cuda_mm_norm_pair_act(F ? &F->d : NULL, emb, cm->mtp_enorm, hd, cm->mtp_hnorm, cat, n, E, eps,
                               F ? c->xq[1] : NULL, xs, c->stream)
             ? xs
             : 0;
}

/* x = mtp_fc cat (n rows of 2E): through the quantized rows mtp_concat left in xq[1] (xs: their
 * stride, 0: none), else quantized here */
static void mtp_fc_mm(model_session *s, int64_t n, const float *cat, float *x, size_t xs) {
  cu_sess *c = s->dev;
  const cu_model *cm = s->m->dev;
  const int64_t E = s->m->hp.n_embd;
  c->hq[0] = c->hq[1] = NULL; /* xq[1] holds cat's rows, not h's */
  if (xs) mm(s, &cm->mtp_fc, n, cat, 2 * E, cm->mtp_fc.h, c->xq[1], xs, x, E);
  else mm_own(s, &cm->mtp_fc, n, cat, 2 * E, x, E);
}

static float *cu_mtp_begin(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0,
                           int64_t first, int flags) {
  const model *m = s->m;
  const int64_t E = m->hp.n_embd;
  cu_sess *c = s->dev;
  /* recorded: the draft's form (the last row's logits and every row's output), n <= KV_KEEP_MAX */
  const bool rec = c->spec_graph && n <= KV_KEEP_MAX && first == n - 1 &&
                   flags == (MODEL_EVAL_LOGITS | MODEL_EVAL_HIDDEN);
  float *x = begin_chunk(s, tok, n, pos0, rec ? G_MTP + (int)n - 1 : -1); /* tokens and positions */
  memcpy(c->hin_h, h, (size_t)(n * E) * sizeof(float));
  if (c->replay) return x;
  /* scratch: embedding rows in ys [B][E], h in out [B][E], the concat rows in yr ([B*(K+1)][E],
   * at least [B][2E]: model_mtp_eval checks 2n <= B*K) */
  float *emb = c->ys, *hd = c->out, *cat = c->yr;
  cuda_rt_h2d_async(hd, c->hin_h, (size_t)(n * E) * sizeof(float), c->stream);
  const size_t cxs = mtp_concat(s, hd, n, emb, cat);
  mtp_fc_mm(s, n, cat, x, cxs); /* (h is about to change: hq cleared there) */
  /* the block's attention input, quantized in the same launch for its first matmul (as a layer's
   * input norm: h_norm) */
  h_norm_mtp(s, x, n);
  prof(s, MODEL_PH_OTHER);
  return x;
}

static int cu_mtp_end(model_session *s, float *x, int64_t n, int64_t first, float *logits, float *h_out, char *err,
                      size_t errlen) {
  cu_sess *c = s->dev;
  const model *m = s->m;
  const int64_t E = m->hp.n_embd;
  /* the MoE's combine left h = mtp_norm(x) (its "next" norm for l = n_layer), quantized for the head */
  if (!c->replay && h_out) cuda_rt_d2h_async(c->hid_h, c->h, (size_t)(n * E) * sizeof(float), c->stream);
  if (h_out) {
    c->hid_dst = h_out;
    c->hid_rows = n;
  }
  if (logits && n - first > 0) cu_logits(s, x, first, n, logits, false); /* rows of h */
  return cu_eval_end(s, n, err, errlen);
}

/* ---- the greedy speculative step in one pass (backend.h spec_greedy) ----
 * Why: composed of the steps above, a step with k drafts is k + 1 recorded steps, each followed by
 * a host round trip (a draft's logits come back for the host's argmax, which is the next MTP row's
 * token; the verify's logits for the accept count). Here the whole step is ONE recorded step per
 * (MTP rows n, drafts k), with the same launches in the same order, so every output has the bits
 * of the composed step: the MTP rows (mtp_begin / mtp_end's operations), each draft's argmax
 * written straight into the next row's token slot, the next row's h read from the normed output
 * where mtp_end left it, then the verify chunk (eval_begin .. logits: embed, the arch's layers on
 * the kept states, every row's logits), the argmax of each verify row, the accept count and the
 * accepted row's logits (cuda_spec_accept), and the copies to pinned memory. The host stages the
 * tokens, positions and MTP input rows in pinned memory (the graph's first nodes copy them), so
 * the step replays at every position.
 * The step's device ints (c->tok, c->pos, staged from tok_h / pos_h):
 *   tok[0..n)  the MTP rows' tokens (tok[n-1] = x_P)  pos[0..n)        their positions pos0..
 *   tok[n]     x_P, verify row 0                       pos[n..n+k-1)    drafts 2..k's MTP rows, P..
 *   tok[n+j]   d_j (its argmax writes it)              pos[n+k-1..n+2k] the verify rows, P..P+k
 * sg_d: amax of verify row i at i, the accept count at SG_ACC; sg_h: the drafts at 0.., then
 * sg_d's copy at SG_AMAX. */
enum { SG_ACC = KV_KEEP_MAX, SG_AMAX = 16, SG_INTS = 32 };

enum { AMK_DRAFT0 = 0, AMK_VERIFY0 = 8, AMK_ROWS = AMK_VERIFY0 + KV_KEEP_MAX };
#define AMK_BYTES ((size_t)AMK_ROWS * CUDA_AMK_ROW * 8)

/* row r of the keys K (NULL: none) */
static unsigned long long *amk_row(unsigned long long *K, int r) { return K ? K + (size_t)r * CUDA_AMK_ROW : NULL; }

/* The head of n rows X (h) into c->logits with each row's argmax gathered into keys (c->amk rows):
 * the caller checked cuda_mm_amax_ok (sg_amax_ok); a launch that does not happen is the session's
 * error, not a silent fallback (the readers expect the keys). */
static void sg_head_amax(model_session *s, int64_t n, const float *X, unsigned long long *keys) {
  cu_sess *c = s->dev;
  const cu_model *cm = s->m->dev;
  const int64_t E = s->m->hp.n_embd, V = s->m->hp.n_vocab;
  size_t xs;
  const uint8_t *xq = act(s, 1, &cm->output, n, X, E, &xs);
  if (!cuda_mm_matmul_amax(&cm->output.d, n, xq, xs, c->logits, V, keys, c->stream) && !c->err) {
    c->err = FLOE_E_IO;
    snprintf(c->msg, sizeof c->msg, "the speculative step's head did not gather its argmax (%lld rows)", (long long)n);
  }
}

/* The MTP block on n rows (tokens tokd, positions posd: device; h rows hd: device) as mtp_begin /
 * mtp_end compute them, then the last row's logits and their argmax into *draft (device); with
 * keys_out the argmax is gathered into those keys instead (the next reader writes *draft), and
 * keys_in (not NULL) are the keys of the last row's token, read by the norm pair. */
static void sg_mtp(model_session *s, int32_t *tokd, int32_t *posd, const float *hd, int64_t n, int32_t *draft,
                   const unsigned long long *keys_in, unsigned long long *keys_out) {
  cu_sess *c = s->dev;
  const model *m = s->m;
  const cu_model *cm = m->dev;
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab, l = m->hp.n_layer;
  int32_t *tok0 = c->tok, *pos0 = c->pos;
  c->tok = tokd;
  c->pos = posd;
  float *x = c->x, *emb = c->ys, *cat = c->yr;
  c->emb_keys = keys_in;
  const size_t cxs = mtp_concat(s, hd, n, emb, cat);
  c->emb_keys = NULL;
  mtp_fc_mm(s, n, cat, x, cxs);
  h_norm_mtp(s, x, n);
  cu_attention(s, l, x, n, 0, true);
  cu_moe(s, l, x, n); /* its combine leaves h = mtp_norm(x), quantized for the head */
  if (keys_out) {
    sg_head_amax(s, 1, c->h + (n - 1) * E, keys_out);
  } else {
    mm_own(s, &cm->output, 1, c->h + (n - 1) * E, E, c->logits, V);
    cuda_argmax(c->logits, V, draft, c->amax_scr, c->stream);
  }
  c->tok = tok0;
  c->pos = pos0;
}

/* Whether a step with k drafts gathers its heads' argmaxes in their launches (c->spec_amax): its
 * keys allocated, both embeddings read by the norms, and the head's launches of 1 and k + 1 rows
 * the ones that gather them */
static bool sg_amax_ok(model_session *s, int k) {
  cu_sess *c = s->dev;
  const cu_model *cm = s->m->dev;
  const cuda_mat *T = &cm->tok_embd.d;
  return c->spec_amax && c->amk && c->amk_zero && c->mtp_embed && c->embed_norm && s->act_q &&
         act_bytes_of(&cm->output) && cuda_embed_check(T->type, s->m->hp.n_embd, NULL, 0) == 0 &&
         k + 1 <= KV_KEEP_MAX && cuda_mm_amax_ok(&cm->output.d, 1) && cuda_mm_amax_ok(&cm->output.d, k + 1);
}

/* Every launch and copy of one step (recorded, or issued directly without graphs); lazy: the
 * accepted row's logits stay in sg_row. */
static void sg_issue(model_session *s, int64_t n, int k, bool lazy) {
  cu_sess *c = s->dev;
  const model *m = s->m;
  const cu_model *cm = m->dev;
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab, P = s->kv.n_past, nv = k + 1;
  int32_t *T = c->tok, *Pd = c->pos;
  const bool dir = c->spec_direct && c->tok_hd && c->pos_hd && c->hin_hd && c->sg_hd && c->hid_hd;
  const bool ak = dir && sg_amax_ok(s, k); /* its keys zeroed by the copy-in launch */
  unsigned long long *K = ak ? c->amk : NULL;
  if (dir) {
    const cuda_copy_part in[4] = { { c->tok_hd, T, (size_t)(n + 1) * 4 },
                                   { c->pos_hd, Pd, (size_t)(n + 2 * k) * 4 },
                                   { c->hin_hd, c->out, (size_t)(n * E) * 4 },
                                   { c->amk_zero, c->amk, ak ? AMK_BYTES : 0 } };
    cuda_copy_parts(in, 4, c->stream);
  } else {
    cuda_rt_h2d_async(T, c->tok_h, (size_t)(n + 1) * 4, c->stream);
    cuda_rt_h2d_async(Pd, c->pos_h, (size_t)(n + 2 * k) * 4, c->stream);
    cuda_rt_h2d_async(c->out, c->hin_h, (size_t)(n * E) * 4, c->stream);
  }
  /* draft 1 from the last row; with keys, draft j's argmax gathered into row AMK_DRAFT0 + j - 1 */
  sg_mtp(s, T, Pd, c->out, n, T + n + 1, NULL, amk_row(K, AMK_DRAFT0));
  for (int j = 2; j <= k; j++) /* draft j: (d_{j-1}, g_{j-1}) at P + j - 2; g is row 0 of h now (row n-1 at j = 2) */
    sg_mtp(s, T + n + j - 1, Pd + n + j - 2, c->h + (j == 2 ? n - 1 : 0) * E, 1, T + n + j,
           amk_row(K, AMK_DRAFT0 + j - 2), amk_row(K, AMK_DRAFT0 + j - 1));
  /* the verify chunk: model_verify's eval of [x_P, d_1..d_k], every row's logits */
  int32_t *tok0 = c->tok, *pos0 = c->pos;
  c->tok = T + n;
  c->pos = Pd + n + k - 1;
  c->emb_keys = amk_row(K, AMK_DRAFT0 + k - 1); /* d_k, the last row */
  cu_embed(s, NULL, nv, c->x);
  c->emb_keys = NULL;
  for (int64_t l = 0; l < m->hp.n_layer; l++) {
    m->arch->mixer(s, l, c->x, nv, P);
    m->arch->ffn(s, l, c->x, nv);
  }
  if (K) {
    unsigned long long *kv = amk_row(K, AMK_VERIFY0);
    sg_head_amax(s, nv, c->h, kv);
    if (cuda_spec_accept_keys(T + n + 1, kv, c->sg_d, k, c->sg_d + SG_ACC, c->logits, V, c->sg_row, c->stream) &&
        !c->err) {
      c->err = FLOE_E_INVALID;
      snprintf(c->msg, sizeof c->msg, "the speculative step's accept launch takes at most 64 drafts (%d)", k);
    }
  } else {
    mm_own(s, &cm->output, nv, c->h, E, c->logits, V);
    cuda_argmax_rows(c->logits, V, V, (int)nv, c->sg_d, c->amax_scr, c->stream);
    cuda_spec_accept(T + n + 1, c->sg_d, k, c->sg_d + SG_ACC, c->logits, V, c->sg_row, c->stream);
  }
  if (dir) {
    const cuda_copy_part out[3] = { { T + n + 1, c->sg_hd, (size_t)k * 4 },
                                    { c->sg_d, c->sg_hd + SG_AMAX, (size_t)(SG_INTS - SG_AMAX) * 4 },
                                    { c->x, c->hid_hd, (size_t)(nv * E) * 4 } };
    cuda_copy_parts(out, 3, c->stream);
  } else {
    cuda_rt_d2h_async(c->sg_h, T + n + 1, (size_t)k * 4, c->stream);
    cuda_rt_d2h_async(c->sg_h + SG_AMAX, c->sg_d, (size_t)(SG_INTS - SG_AMAX) * 4, c->stream);
    cuda_rt_d2h_async(c->hid_h, c->x, (size_t)(nv * E) * 4, c->stream);
  }
  if (!lazy) cuda_rt_d2h_async(c->logits_h, c->sg_row, (size_t)V * 4, c->stream);
  c->tok = tok0;
  c->pos = pos0;
}

static int cu_spec_greedy(model_session *s, const int32_t *tok, const float *h, int64_t n, int64_t pos0, int k,
                          int32_t *draft, int32_t *amax, int64_t *acc, float *hidden, float *logits, char *err,
                          size_t errlen) {
  cu_sess *c = s->dev;
  const model *m = s->m;
  const int64_t E = m->hp.n_embd, V = m->hp.n_vocab, P = s->kv.n_past;
  if (k < 1 || k + 1 > KV_KEEP_MAX || k + 1 > LB || n < 1 || n > KV_KEEP_MAX || pos0 + n != P)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda speculative step: %d drafts after %lld rows", k, (long long)n);
  int rc;
  if (!c->sg_d && ((rc = dalloc(c, &c->sg_d, SG_INTS * 4, err, errlen)) ||
                   (rc = dalloc(c, &c->sg_row, (size_t)V * 4, err, errlen)) ||
                   (rc = cuda_rt_host_alloc((void **)&c->sg_h, SG_INTS * 4, err, errlen))))
    return rc; /* freed by session_free */
  if (!c->sg_hd) c->sg_hd = cuda_rt_host_dev_ptr(c->sg_h);
  if (c->spec_amax && !c->amk &&
      ((rc = dalloc(c, &c->amk, AMK_BYTES, err, errlen)) || (rc = dalloc(c, &c->amk_zero, AMK_BYTES, err, errlen)) ||
       (cuda_rt_memset_async(c->amk_zero, 0, AMK_BYTES, c->stream) &&
        (rc = floe_err(err, errlen, FLOE_E_IO, "cuda: cannot clear the argmax keys")))))
    return rc; /* freed by session_free */
  s->bytes = c->bytes;
  if ((rc = cu_keep_begin(s, k + 1))) return floe_err(err, errlen, rc, "cuda speculative step: no kept states");
  c->replay = false;
  c->capturing = -1;
  c->err = 0;
  c->staged = false;
  c->dst = NULL;
  c->hid_dst = NULL;
  c->want_greedy = false;
  c->lazy = c->lazy_valid = false; /* c->logits is rewritten */
  c->lazy_to = NULL;
  memcpy(c->tok_h, tok, (size_t)n * sizeof *tok);
  c->tok_h[n] = tok[n - 1];
  for (int64_t t = 0; t < n; t++) c->pos_h[t] = (int32_t)(pos0 + t);
  for (int j = 0; j < k - 1; j++) c->pos_h[n + j] = (int32_t)(P + j);
  for (int i = 0; i <= k; i++) c->pos_h[n + k - 1 + i] = (int32_t)(P + i);
  memcpy(c->hin_h, h, (size_t)(n * E) * sizeof(float));
  /* a greedy-only caller reads no logits: the accepted row stays on the device until fetched */
  const bool lazy = logits && s->lazy_ok && s->lazy_allowed;
  void **g = &c->sgraph[n - 1][k][lazy];
  if (*g) {
    rc = cuda_graph_launch(*g, c->stream, err, errlen);
  } else if (c->spec_graph && cuda_graph_begin(c->stream, c->msg, sizeof c->msg) == 0) {
    sg_issue(s, n, k, lazy);
    rc = cuda_graph_end(c->stream, g, err, errlen);
    if (!rc) {
      s->n_recorded++;
      rc = cuda_graph_launch(*g, c->stream, err, errlen);
    }
  } else {
    sg_issue(s, n, k, lazy);
  }
  if (!rc && cuda_rt_stream_sync(c->stream, err, errlen)) rc = FLOE_E_IO;
  if (!rc && (rc = cuda_rt_check("speculative step", err, errlen))) rc = FLOE_E_IO;
  if (!rc && c->err) rc = floe_err(err, errlen, c->err, "cuda: %s", c->msg);
  const int32_t a = c->sg_h[SG_AMAX + SG_ACC];
  if (!rc && (a < 0 || a > k)) rc = floe_err(err, errlen, FLOE_E_IO, "cuda speculative step: accept count %d", a);
  if (rc) {
    cu_keep_accept(s, 0);
    return rc;
  }
  for (int j = 0; j < k; j++) draft[j] = c->sg_h[j];
  for (int i = 0; i <= k; i++) amax[i] = c->sg_h[SG_AMAX + i];
  *acc = a;
  if (hidden) memcpy(hidden, c->hid_h, (size_t)((k + 1) * E) * sizeof(float));
  if (logits && lazy) {
    s->lazy_dst = logits;
    c->lazy_src = c->sg_row;
    c->lazy_valid = true;
  } else if (logits) {
    memcpy(logits, c->logits_h, (size_t)V * sizeof(float));
  }
  return 0;
}

/* eval_end of a NOWAIT step, launched (rc: how that went): its event recorded, nothing waits. A
 * plain one's pick is pending and its logits are the deferred ones; an ahead one waits for
 * ahead_end. */
static int nowait_end(model_session *s, int rc, char *err, size_t errlen) {
  cu_sess *c = s->dev;
  const int slot = c->ahead ? 1 + c->apar : 0;
  if (!rc && cuda_rt_event_record(c->ev[slot], c->stream)) rc = floe_err(err, errlen, FLOE_E_IO, "cuda: event record");
  if (!rc && (rc = cuda_rt_check("decode step", err, errlen))) rc = FLOE_E_IO;
  if (!rc && c->err) rc = floe_err(err, errlen, c->err, "cuda: %s", c->msg);
  if (rc) {
    cuda_rt_stream_sync(c->stream, NULL, 0);
    return rc;
  }
  if (c->ahead) {
    c->ahead_slot = slot;
    c->ahead_pos = c->cur_pos0;
    return 0;
  }
  c->pick_slot = 0;
  c->next_pos = c->cur_pos0 + 1;
  lazy_handover(s);
  return 0;
}

static bool cu_ahead_ok(const model_session *s, int64_t pos) {
  const cu_sess *c = s->dev;
  return ahead_ready(c, pos) && (pos < 0 || !c->keep_n);
}

static int cu_pick_wait(model_session *s, char *err, size_t errlen) {
  cu_sess *c = s->dev;
  const int slot = c->pick_slot;
  if (slot < 0) return floe_err(err, errlen, FLOE_E_INVALID, "cuda: no step's pick is pending");
  c->pick_slot = -1;
  if (cuda_rt_event_sync(c->ev[slot], err, errlen)) return FLOE_E_IO;
  if (cuda_rt_check("decode step", err, errlen)) return FLOE_E_IO;
  s->greedy = c->greedy_h[slot];
  return 0;
}

static int cu_ahead_end(model_session *s, bool accept, char *err, size_t errlen) {
  cu_sess *c = s->dev;
  const int slot = c->ahead_slot;
  if (slot < 1 || c->keep_n != 1) return floe_err(err, errlen, FLOE_E_INVALID, "cuda: no step runs ahead");
  c->ahead_slot = -1;
  c->next_pos = -1;
  if (!accept) { /* the step finishes; its kept state is never made current */
    const int rc = cuda_rt_stream_sync(c->stream, err, errlen) ? FLOE_E_IO : 0;
    cu_keep_accept(s, 0);
    return rc;
  }
  cu_keep_accept(s, 1); /* queued behind the step */
  c->pick_slot = slot;
  c->next_pos = c->ahead_pos + 1;
  c->lazy_src = c->alog[slot - 1];
  c->lazy_valid = true;
  return 0;
}

static int cu_eval_end(model_session *s, int64_t n, char *err, size_t errlen) {
  (void)n;
  cu_sess *c = s->dev;
  int rc = 0;
  c->multi = false;
  if (c->seg) { /* the last segment (a failure sets c->err) */
    seg_cut(s);
    if (c->seg_rec) s->n_recorded++;
    seg_abort(c);
  } else {
    if (c->capturing >= 0 && !c->replay) {
      void *g = NULL;
      rc = cuda_graph_end(c->stream, &g, err, errlen);
      if (!rc) c->graph[c->capturing] = g;
      s->n_recorded++;
    }
    if (!rc && c->capturing >= 0) rc = cuda_graph_launch(c->graph[c->capturing], c->stream, err, errlen);
  }
  if (c->nowait) return nowait_end(s, rc, err, errlen);
  if (!rc && cuda_rt_stream_sync(c->stream, err, errlen)) rc = FLOE_E_IO;
  if (!rc && c->tier) cu_tier_done(c->tier); /* the copies have landed: the expert-cache slots go back */
  if (!rc && (rc = cuda_rt_check("decode step", err, errlen))) rc = FLOE_E_IO;
  if (!rc && c->err) rc = floe_err(err, errlen, c->err, "cuda: %s", c->msg);
  if (rc) return rc;
  if (c->staged && c->dst) memcpy(c->dst, c->logits_h, (size_t)(c->dst_rows * s->m->hp.n_vocab) * 4);
  if (c->hid_dst) memcpy(c->hid_dst, c->hid_h, (size_t)(c->hid_rows * s->m->hp.n_embd) * 4);
  if (c->want_greedy) s->greedy = c->greedy_h[0];
  lazy_handover(s); /* the logits row stays on the device until model_logits_sync */
  return 0;
}

/* backend.h logits_fetch: the row a lazy evaluation left in c->logits */
static int cu_logits_fetch(model_session *s, float *dst, char *err, size_t errlen) {
  cu_sess *c = s->dev;
  if (!c->lazy_valid)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda: the deferred logits were overwritten before they were read");
  if (cuda_rt_stream_sync(c->stream, err, errlen)) return FLOE_E_IO; /* a NOWAIT step's (model.c drops an ahead one first) */
  return cuda_rt_d2h(dst, c->lazy_src, (size_t)s->m->hp.n_vocab * sizeof(float), err, errlen) ? FLOE_E_IO : 0;
}

const model_backend model_backend_cuda = {
  .name = "cuda",
  .device = MODEL_DEV_CUDA,
  .model_init = cu_model_init,
  .model_fini = cu_model_fini,
  .session_init = cu_session_init,
  .session_free = cu_session_free,
  .state_reset = cu_state_reset,
  .ckpt_bytes = cu_ckpt_bytes,
  .ckpt_save = cu_ckpt_save,
  .ckpt_restore = cu_ckpt_restore,
  .ckpt_free = cu_ckpt_free,
  .eval_begin = cu_eval_begin,
  .eval_end = cu_eval_end,
  .embed = cu_embed,
  .attention = cu_attention,
  .gdn = cu_gdn,
  .moe = cu_moe,
  .logits = cu_logits,
  .logits_fetch = cu_logits_fetch,
  .hidden = cu_hidden,
  .keep_begin = cu_keep_begin,
  .keep_accept = cu_keep_accept,
  .mtp_begin = cu_mtp_begin,
  .mtp_end = cu_mtp_end,
  .spec_greedy = cu_spec_greedy,
  .ahead_ok = cu_ahead_ok,
  .pick_wait = cu_pick_wait,
  .ahead_end = cu_ahead_end,
  .multi_ok = cu_multi_ok,
  .multi_begin = cu_multi_begin,
  .attention_multi = cu_attention_multi,
  .gdn_multi = cu_gdn_multi,
};

int model_tier_stats_get(const model *m, model_tier_stats *out) {
  memset(out, 0, sizeof *out);
  const cu_model *cm = m->be == &model_backend_cuda ? m->dev : NULL;
  if (!cm || !cm->tier) return FLOE_E_UNSUPPORTED;
  cu_tier_stats(cm->tier, out);
  return 0;
}

void model_tier_stats_reset(const model *m) {
  const cu_model *cm = m->be == &model_backend_cuda ? m->dev : NULL;
  if (cm && cm->tier) cu_tier_stats_reset(cm->tier);
}

static int g_n_dev = -1;

int model_cuda_devices(void) {
  if (g_n_dev < 0) g_n_dev = cuda_rt_device_count();
  return g_n_dev;
}

int model_cuda_mem(int dev, char *name, size_t name_len, size_t *free_b, size_t *total_b, char *err, size_t errlen) {
  int rc = cuda_rt_init(dev, err, errlen);
  if (!rc) rc = cuda_rt_device_name(dev, name, name_len, err, errlen);
  if (!rc) rc = cuda_rt_mem_info(free_b, total_b, err, errlen);
  return rc;
}
#endif
