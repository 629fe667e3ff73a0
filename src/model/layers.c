/* Shared layer math for the Qwen MoE family: RMSNorm, partial NeoX RoPE, (gated) attention over
 * the KV cache, the GatedDeltaNet recurrence, softmax/top-k MoE with the shared expert.
 * The math follows /work/shared/reference/qwen-models.md §2 (HF transformers 5.17 eager, float32).
 *
 * Row-exactness (see model.h): every function here processes the n rows of a chunk with per-row
 * arithmetic that is the same as for n = 1. Matmuls go through kern_matmul (row-exact); the GDN
 * state is advanced token by token (never HF's chunked form); attention row t reads the cache
 * positions 0..pos_t in order; each token's expert outputs are summed in ascending expert order. */
#include <math.h>
#include <string.h>

#include "model/model.h"

/* ---- matmul over the session's threads ---- */
typedef struct mm_job {
  const floe_mat *W;
  int64_t nb, ldx, ldy;
  const float *X;
  float *Y;
} mm_job;

static void mm_rows(const mm_job *j, int64_t r0, int64_t r1) {
  for (int64_t b = 0; b < j->nb; b += 16) {
    int nb = (int)(j->nb - b < 16 ? j->nb - b : 16);
    kern_matmul(j->W, nb, j->X + b * j->ldx, j->ldx, NULL, 0, j->Y + b * j->ldy, j->ldy, r0, r1);
  }
}

static void mm_worker(void *ctx, int ith, int nth) {
  const mm_job *j = ctx;
  int64_t r0, r1;
  floe_split_range(j->W->rows, 16, ith, nth, &r0, &r1);
  if (r1 > r0) mm_rows(j, r0, r1);
}

void layer_matmul(model_session *s, const floe_mat *W, int64_t nb, const float *X, int64_t ldx, float *Y,
                  int64_t ldy) {
  if (nb <= 0) return;
  mm_job j = { W, nb, ldx, ldy, X, Y };
  if (s->pool && floe_pool_size(s->pool) > 1 && W->rows >= 64)
    floe_pool_run(s->pool, mm_worker, &j);
  else
    mm_rows(&j, 0, W->rows);
}

/* ---- elementwise ---- */
static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf(float x) { return x / (1.0f + expf(-x)); }
static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch threshold 20 */

/* HF: x * rsqrt(mean(x^2) + eps), then times the weight (1+w folded in for zero-centred norms). */
void layer_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
  float r = 1.0f / sqrtf(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

/* NeoX rotation of dims [0, n_rot) of one head: pairs (j, j + n_rot/2). HF computes
 * inv_freq = 1/theta^(2i/R) and cos/sin of pos*inv_freq in float32. */
static void rope_head(float *x, int64_t n_rot, float theta, int64_t pos) {
  int64_t h = n_rot / 2;
  for (int64_t j = 0; j < h; j++) {
    float inv = 1.0f / powf(theta, (float)(2 * j) / (float)n_rot);
    float ang = (float)pos * inv;
    float c = cosf(ang), sn = sinf(ang);
    float a = x[j], b = x[j + h];
    x[j] = a * c - b * sn;
    x[j + h] = b * c + a * sn;
  }
}

/* ---- full attention ---- */
void layer_attention(model_session *s, int64_t l, float *x, int64_t n, int64_t pos0, bool gated) {
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const model_layer *L = &m->layers[l];
  const int64_t E = hp->n_embd, nh = hp->n_head, nkv = hp->n_head_kv, hd = hp->head_dim;
  const int64_t qdim = nh * hd * (gated ? 2 : 1), kvd = nkv * hd;
  const float eps = hp->rms_eps, scale = (float)(1.0 / sqrt((double)hd));

  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, L->attn_norm, E, eps, s->h + t * E);
  layer_matmul(s, &L->wq, n, s->h, E, s->q, qdim);
  layer_matmul(s, &L->wk, n, s->h, E, s->k, kvd);
  layer_matmul(s, &L->wv, n, s->h, E, s->v, kvd);

  for (int64_t t = 0; t < n; t++) {
    float *q = s->q + t * qdim, *k = s->k + t * kvd;
    for (int64_t hh = 0; hh < nh; hh++) {
      float *qh = q + hh * hd * (gated ? 2 : 1);
      layer_rmsnorm(qh, L->q_norm, hd, eps, qh);
      rope_head(qh, hp->n_rot, hp->rope_theta, pos0 + t);
    }
    for (int64_t hh = 0; hh < nkv; hh++) {
      layer_rmsnorm(k + hh * hd, L->k_norm, hd, eps, k + hh * hd);
      rope_head(k + hh * hd, hp->n_rot, hp->rope_theta, pos0 + t);
    }
    kv_put(&s->kv, l, pos0 + t, k, s->v + t * kvd);
  }

  const int64_t grp = nh / nkv;
  for (int64_t t = 0; t < n; t++) {
    const int64_t np = pos0 + t + 1; /* causal: positions 0..pos */
    float *o = s->att + t * nh * hd;
    for (int64_t hh = 0; hh < nh; hh++) {
      const float *qh = s->q + t * qdim + hh * hd * (gated ? 2 : 1);
      const int64_t kh = hh / grp;
      float mx = -INFINITY;
      for (int64_t p = 0; p < np; p++) {
        const float *kr = kv_k_row(&s->kv, l, p, s->kvtmp) + kh * hd;
        float d = 0.0f;
        for (int64_t i = 0; i < hd; i++) d += qh[i] * kr[i];
        d *= scale;
        s->scores[p] = d;
        if (d > mx) mx = d;
      }
      float sum = 0.0f;
      for (int64_t p = 0; p < np; p++) {
        s->scores[p] = expf(s->scores[p] - mx);
        sum += s->scores[p];
      }
      float *oh = o + hh * hd;
      memset(oh, 0, (size_t)hd * sizeof(float));
      for (int64_t p = 0; p < np; p++) {
        const float w = s->scores[p] / sum;
        const float *vr = kv_v_row(&s->kv, l, p, s->kvtmp) + kh * hd;
        for (int64_t i = 0; i < hd; i++) oh[i] += w * vr[i];
      }
      if (gated) {
        const float *g = qh + hd;
        for (int64_t i = 0; i < hd; i++) oh[i] *= sigmoidf(g[i]);
      }
    }
  }
  layer_matmul(s, &L->wo, n, s->att, nh * hd, s->out, E);
  for (int64_t i = 0; i < n * E; i++) x[i] += s->out[i];
}

/* ---- GatedDeltaNet ---- */
void layer_gdn(model_session *s, int64_t l, float *x, int64_t n) {
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const model_layer *L = &m->layers[l];
  const int64_t E = hp->n_embd, Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
  const int64_t dv = hp->ssm_d_inner / Nv, r = Nv / Nk, K = hp->ssm_conv_kernel;
  const int64_t kd = Nk * dk, vd = Nv * dv, C = 2 * kd + vd;
  const float eps = hp->rms_eps, qscale = (float)(1.0 / sqrt((double)dk));

  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, L->attn_norm, E, eps, s->h + t * E);
  const int64_t gq = 2 * dk + 2 * r * dv, gb = 2 * r;
  if (L->qkvz_grouped) {
    /* HF Qwen3-Next in_proj_qkvz: per key head g: [q(dk) | k(dk) | v(r*dv) | z(r*dv)] */
    layer_matmul(s, &L->ssm_qkvz, n, s->h, E, s->raw, Nk * gq);
    for (int64_t t = 0; t < n; t++) {
      const float *rw = s->raw + t * Nk * gq;
      float *mix = s->mix + t * C, *z = s->z + t * vd;
      for (int64_t g = 0; g < Nk; g++) {
        const float *p = rw + g * gq;
        memcpy(mix + g * dk, p, (size_t)dk * 4);
        memcpy(mix + kd + g * dk, p + dk, (size_t)dk * 4);
        memcpy(mix + 2 * kd + g * r * dv, p + 2 * dk, (size_t)(r * dv) * 4);
        memcpy(z + g * r * dv, p + 2 * dk + r * dv, (size_t)(r * dv) * 4);
      }
    }
  } else {
    layer_matmul(s, &L->ssm_qkv, n, s->h, E, s->mix, C);
    layer_matmul(s, &L->ssm_z, n, s->h, E, s->z, vd);
  }
  if (L->ba_grouped) {
    /* per key head g: [b(r) | a(r)] */
    layer_matmul(s, &L->ssm_ba, n, s->h, E, s->raw2, Nk * gb);
    for (int64_t t = 0; t < n; t++) {
      const float *rb = s->raw2 + t * Nk * gb;
      for (int64_t g = 0; g < Nk; g++) {
        memcpy(s->b + t * Nv + g * r, rb + g * gb, (size_t)r * 4);
        memcpy(s->a + t * Nv + g * r, rb + g * gb + r, (size_t)r * 4);
      }
    }
  } else {
    layer_matmul(s, &L->ssm_b, n, s->h, E, s->b, Nv);
    layer_matmul(s, &L->ssm_alpha, n, s->h, E, s->a, Nv);
  }

  float *conv = s->kv.conv[l], *S0 = s->kv.ssm[l];
  for (int64_t t = 0; t < n; t++) {
    float *mix = s->mix + t * C; /* raw input; replaced by the conv output below */
    float *c = s->raw;           /* [C] scratch (raw is free after the unpack) */
    /* causal depthwise conv over [state_0 .. state_{K-2}, mix], oldest first, then SiLU */
    for (int64_t ch = 0; ch < C; ch++) {
      const float *w = L->conv_w + ch * K;
      float acc = 0.0f;
      for (int64_t j = 0; j < K - 1; j++) acc += w[j] * conv[j * C + ch];
      acc += w[K - 1] * mix[ch];
      c[ch] = siluf(acc);
    }
    memmove(conv, conv + C, (size_t)((K - 2) * C) * 4);
    memcpy(conv + (K - 2) * C, mix, (size_t)C * 4);

    float *q = c, *k = c + kd, *v = c + 2 * kd;
    for (int64_t g = 0; g < Nk; g++) { /* L2 norm (eps 1e-6), q scaled by dk^-0.5 */
      float sq = 0.0f, sk = 0.0f;
      for (int64_t i = 0; i < dk; i++) sq += q[g * dk + i] * q[g * dk + i];
      for (int64_t i = 0; i < dk; i++) sk += k[g * dk + i] * k[g * dk + i];
      float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
      for (int64_t i = 0; i < dk; i++) {
        q[g * dk + i] = (q[g * dk + i] * rq) * qscale;
        k[g * dk + i] = k[g * dk + i] * rk;
      }
    }
    float *o = s->o + t * vd;
    const float *bt = s->b + t * Nv, *at = s->a + t * Nv, *zt = s->z + t * vd;
    for (int64_t hv = 0; hv < Nv; hv++) {
      const int64_t kh = m->v_tiled ? hv % Nk : hv / r;
      const float *kk = k + kh * dk, *qq = q + kh * dk, *vv = v + hv * dv;
      const float beta = sigmoidf(bt[hv]);
      const float decay = expf(L->ssm_a[hv] * softplusf(at[hv] + L->dt_bias[hv]));
      float *S = S0 + hv * dk * dv, *oh = o + hv * dv;
      float *kv = s->kvtmp; /* [dv] */
      for (int64_t i = 0; i < dk * dv; i++) S[i] *= decay;
      for (int64_t j = 0; j < dv; j++) kv[j] = 0.0f;
      for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) kv[j] += S[i * dv + j] * kk[i];
      for (int64_t j = 0; j < dv; j++) kv[j] = (vv[j] - kv[j]) * beta; /* delta */
      for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) S[i * dv + j] += kk[i] * kv[j];
      for (int64_t j = 0; j < dv; j++) oh[j] = 0.0f;
      for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) oh[j] += S[i * dv + j] * qq[i];
      /* gated RMSNorm per value head: (w * (o * rsqrt(mean(o^2)+eps))) * silu(z) */
      float ss = 0.0f;
      for (int64_t j = 0; j < dv; j++) ss += oh[j] * oh[j];
      const float rr = 1.0f / sqrtf(ss / (float)dv + eps);
      const float *zh = zt + hv * dv;
      for (int64_t j = 0; j < dv; j++) oh[j] = (L->ssm_norm[j] * (oh[j] * rr)) * siluf(zh[j]);
    }
  }
  layer_matmul(s, &L->ssm_out, n, s->o, vd, s->out, E);
  for (int64_t i = 0; i < n * E; i++) x[i] += s->out[i];
}

/* ---- MoE ---- */
void layer_moe(model_session *s, int64_t l, float *x, int64_t n) {
  const model *m = s->m;
  const floe_hparams *hp = &m->hp;
  const model_layer *L = &m->layers[l];
  const int64_t E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used, I = hp->n_ff_exp;

  for (int64_t t = 0; t < n; t++) layer_rmsnorm(x + t * E, L->ffn_norm, E, hp->rms_eps, s->h + t * E);
  layer_matmul(s, &L->router, n, s->h, E, s->rlog, NE);

  /* softmax (f32) -> top-k -> renormalise; selections kept in ascending expert order, which is
   * the order HF's eager experts loop adds them in. */
  for (int64_t t = 0; t < n; t++) {
    float *p = s->rlog + t * NE;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t e = 0; e < NE; e++) mx = p[e] > mx ? p[e] : mx;
    for (int64_t e = 0; e < NE; e++) {
      p[e] = expf(p[e] - mx);
      sum += p[e];
    }
    for (int64_t e = 0; e < NE; e++) p[e] /= sum;
    int32_t *sel = s->sel + t * K;
    float *w = s->selw + t * K;
    for (int64_t j = 0; j < K; j++) { /* j-th largest; ties go to the lower index */
      int64_t best = -1;
      for (int64_t e = 0; e < NE; e++) {
        bool taken = false;
        for (int64_t u = 0; u < j; u++) taken |= sel[u] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      sel[j] = (int32_t)best;
      w[j] = p[best];
    }
    if (hp->norm_topk) {
      float ws = 0.0f;
      for (int64_t j = 0; j < K; j++) ws += w[j];
      for (int64_t j = 0; j < K; j++) w[j] /= ws;
    }
    for (int64_t j = 1; j < K; j++) /* insertion sort by expert index */
      for (int64_t u = j; u > 0 && sel[u - 1] > sel[u]; u--) {
        int32_t ti = sel[u]; sel[u] = sel[u - 1]; sel[u - 1] = ti;
        float tw = w[u]; w[u] = w[u - 1]; w[u - 1] = tw;
      }
  }

  /* each expert: gather the rows that chose it (16 at a time), gate/up, SiLU-GLU, down */
  for (int64_t e = 0; e < NE; e++) {
    int64_t rows[16], slots[16];
    int64_t cnt = 0;
    for (int64_t t = 0; t <= n; t++) {
      bool flush = (t == n) || cnt == 16;
      if (flush && cnt > 0) {
        for (int64_t i = 0; i < cnt; i++) memcpy(s->ein + i * E, s->h + rows[i] * E, (size_t)E * 4);
        layer_matmul(s, &L->exp_gate[e], cnt, s->ein, E, s->eg, I);
        layer_matmul(s, &L->exp_up[e], cnt, s->ein, E, s->eu, I);
        for (int64_t i = 0; i < cnt * I; i++) s->eg[i] = siluf(s->eg[i]) * s->eu[i];
        layer_matmul(s, &L->exp_down[e], cnt, s->eg, I, s->eout, E);
        for (int64_t i = 0; i < cnt; i++) {
          const float w = s->selw[rows[i] * K + slots[i]];
          float *dst = s->contrib + (rows[i] * K + slots[i]) * E;
          for (int64_t d = 0; d < E; d++) dst[d] = s->eout[i * E + d] * w;
        }
        cnt = 0;
      }
      if (t == n) break;
      for (int64_t j = 0; j < K; j++)
        if (s->sel[t * K + j] == e) {
          rows[cnt] = t;
          slots[cnt] = j;
          cnt++;
        }
    }
  }
  for (int64_t t = 0; t < n; t++) {
    float *y = s->y + t * E;
    memset(y, 0, (size_t)E * 4);
    for (int64_t j = 0; j < K; j++) {
      const float *c = s->contrib + (t * K + j) * E;
      for (int64_t d = 0; d < E; d++) y[d] += c[d];
    }
  }
  if (hp->n_ff_shexp > 0) {
    const int64_t Is = hp->n_ff_shexp;
    for (int64_t b = 0; b < n; b += 16) {
      int64_t nb = n - b < 16 ? n - b : 16;
      layer_matmul(s, &L->sh_gate, nb, s->h + b * E, E, s->eg, Is);
      layer_matmul(s, &L->sh_up, nb, s->h + b * E, E, s->eu, Is);
      for (int64_t i = 0; i < nb * Is; i++) s->eg[i] = siluf(s->eg[i]) * s->eu[i];
      layer_matmul(s, &L->sh_down, nb, s->eg, Is, s->eout, E);
      layer_matmul(s, &L->sh_gate_inp, nb, s->h + b * E, E, s->shg, 1);
      for (int64_t i = 0; i < nb; i++) {
        const float g = sigmoidf(s->shg[i]);
        float *y = s->y + (b + i) * E;
        for (int64_t d = 0; d < E; d++) y[d] += g * s->eout[i * E + d];
      }
    }
  }
  for (int64_t i = 0; i < n * E; i++) x[i] += s->y[i];
}
