/* The CUDA backend's model upload (backend.h model_init / model_fini; backend_cuda.c has the
 * sessions and blocks): every weight the blocks read, copied once into device memory owned by
 * cu_model (backend_cuda_internal.h).
 *
 * What is uploaded how: plain matrices as they are; the matrices a one-token step reads together
 * (q|k|v; the GatedDeltaNet's q|k|v|z|b|a, else qkv|z and b|a; router|shared-expert gate) joined
 * into one device matrix with the parts as views into it; Qwen3-Next's grouped GDN projections with their rows permuted into the order the
 * kernels read; the routed experts as one stack per projection and layer (expert e at data + e *
 * expert_stride), the shared expert as expert n_expert of the stacks where it has their layout.
 * With model.gpu_mem the routed stacks are not uploaded: they are views of the VRAM expert pool
 * (cuda_tier.c). A type without a CUDA kernel is refused with the tensor's name. */
#ifdef FLOE_HAVE_CUDA
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_rt.h"
#include "model/backend_cuda_internal.h"

static void *cu_alloc(cu_model *cm, size_t n, char *err, size_t errlen) {
  if (cm->n_alloc == cm->cap_alloc) {
    size_t cap = cm->cap_alloc ? cm->cap_alloc * 2 : 256;
    void **a = realloc(cm->allocs, cap * sizeof *a);
    if (!a) {
      floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      return NULL;
    }
    cm->allocs = a;
    cm->cap_alloc = cap;
  }
  void *p = NULL;
  if (cuda_rt_malloc(&p, n ? n : 16, err, errlen)) return NULL;
  cm->allocs[cm->n_alloc++] = p;
  cm->bytes += n;
  return p;
}

static float *up_vec(cu_model *cm, const float *v, int64_t n, char *err, size_t errlen) {
  if (!v) return NULL;
  float *d = cu_alloc(cm, (size_t)n * sizeof(float), err, errlen);
  if (d && cuda_rt_h2d(d, v, (size_t)n * sizeof(float), err, errlen)) return NULL;
  return d;
}

static const char *type_name(uint32_t t) {
  const floe_type_traits *tr = floe_type_info(t);
  return t == FLOE_TYPE_MLX ? "mlx" : tr ? tr->name : "unknown";
}

/* n matrices W[0..n) of one shape (n > 1: an expert stack) into one device allocation; perm: NULL,
 * or the source row of each destination row (rows of the first n_perm rows; grouped GDN). */
static int up_stack(cu_model *cm, const floe_mat *W, int n, const floe_mat *extra, const int64_t *perm, int64_t prow0,
                    int64_t nrows, dmat *out, const char *what, int64_t l, char *err, size_t errlen);

static int up_mats(cu_model *cm, const floe_mat *W, int n, const int64_t *perm, int64_t prow0, int64_t nrows,
                   dmat *out, const char *what, int64_t l, char *err, size_t errlen) {
  return up_stack(cm, W, n, NULL, perm, prow0, nrows, out, what, l, err, errlen);
}

/* up_mats with one more matrix of the same layout (extra, may be NULL) as expert n of the stack. */
static int up_stack(cu_model *cm, const floe_mat *W, int n, const floe_mat *extra, const int64_t *perm, int64_t prow0,
                    int64_t nrows, dmat *out, const char *what, int64_t l, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->h = W;
  if (!W || !W->data) return 0;
  char e2[160];
  if (cuda_mm_type_supported(W->type, W->cols, &W->mlx, e2, sizeof e2))
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "layer %lld %s: type %s has no CUDA kernel (%s)", (long long)l,
                    what, type_name(W->type), e2);
  const int64_t rows = perm ? nrows : W->rows;
  const size_t mb = (size_t)rows * W->row_bytes, sb = (size_t)rows * W->sb_row_bytes;
  cuda_mat *d = &out->d;
  d->type = W->type;
  d->rows = rows;
  d->cols = W->cols;
  d->row_bytes = W->row_bytes;
  d->mlx = W->mlx;
  d->sb_row_bytes = W->sb_row_bytes;
  const int nt = n + (extra ? 1 : 0);
  d->n_expert = nt;
  d->expert_stride = nt > 1 ? mb : 0;
  d->sb_expert_stride = nt > 1 ? sb : 0;
  uint8_t *dd = cu_alloc(cm, mb * (size_t)nt, err, errlen);
  if (!dd) return FLOE_E_NOMEM;
  d->data = dd;
  uint8_t *ds = NULL, *db = NULL;
  if (W->type == FLOE_TYPE_MLX) {
    if (!(ds = cu_alloc(cm, sb * (size_t)nt, err, errlen)) || !(db = cu_alloc(cm, sb * (size_t)nt, err, errlen)))
      return FLOE_E_NOMEM;
    d->scales = ds;
    d->biases = db;
  }
  uint8_t *tmp = NULL;
  if (perm && !(tmp = malloc(mb > sb ? mb : sb))) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  int rc = 0;
  for (int e = 0; e < nt && !rc; e++) {
    const floe_mat *M = e < n ? &W[e] : extra;
    struct { const void *src; size_t rb; uint8_t *dst; } part[3] = {
      { M->data, M->row_bytes, dd + (size_t)e * mb }, { M->scales, M->sb_row_bytes, ds ? ds + (size_t)e * sb : NULL },
      { M->biases, M->sb_row_bytes, db ? db + (size_t)e * sb : NULL } };
    for (int p = 0; p < 3 && !rc; p++) {
      if (!part[p].dst) continue;
      const uint8_t *src = part[p].src;
      if (perm) {
        for (int64_t r = 0; r < rows; r++)
          memcpy(tmp + (size_t)r * part[p].rb, src + (size_t)(perm[prow0 + r]) * part[p].rb, part[p].rb);
        src = tmp;
      }
      rc = cuda_rt_h2d(part[p].dst, src, (size_t)rows * part[p].rb, err, errlen);
    }
  }
  free(tmp);
  return rc;
}

/* A view of rows [r0, r0 + rows) of D (a plain matrix, not an expert stack) with host source h. */
static dmat view_rows(const dmat *D, int64_t r0, int64_t rows, const floe_mat *h) {
  dmat v = *D;
  v.h = h;
  v.d.rows = rows;
  v.d.data = (const uint8_t *)D->d.data + (size_t)r0 * D->d.row_bytes;
  return v;
}

/* Uploads the n matrices P[i] (their host sources W[i]) as one device matrix of their rows stacked,
 * when they can be read as one: the same non-MLX type and width (so the same input layout too);
 * then P[i] become views into it and *cat the whole. Otherwise uploads each on its own and leaves
 * cat empty. perm/prow: as up_mats (every part from one permuted source W[0]). */
static int up_join(cu_model *cm, const floe_mat *const *W, int n, const int64_t *perm, const int64_t *prow0,
                   const int64_t *nrows, dmat *const *P, dmat *cat, const char *what, int64_t l, char *err,
                   size_t errlen) {
  memset(cat, 0, sizeof *cat);
  bool ok = true;
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (!W[i] || !W[i]->data || W[i]->type == FLOE_TYPE_MLX || W[i]->type != W[0]->type ||
        W[i]->cols != W[0]->cols || W[i]->row_bytes != W[0]->row_bytes)
      ok = false;
    else total += perm ? nrows[i] : W[i]->rows;
  }
  if (!ok) {
    for (int i = 0; i < n; i++) {
      int rc = up_mats(cm, W[i], 1, perm, perm ? prow0[i] : 0, perm ? nrows[i] : 0, P[i], what, l, err, errlen);
      if (rc) return rc;
    }
    return 0;
  }
  int64_t *pm = NULL;
  floe_mat big = *W[0];
  if (!perm) { /* stack the sources in host memory (an upload staging copy) */
    uint8_t *buf = malloc((size_t)total * W[0]->row_bytes);
    if (!buf) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
      memcpy(buf + off, W[i]->data, (size_t)W[i]->rows * W[i]->row_bytes);
      off += (size_t)W[i]->rows * W[i]->row_bytes;
    }
    big.data = buf;
    big.rows = total;
    int rc = up_mats(cm, &big, 1, NULL, 0, 0, cat, what, l, err, errlen);
    free(buf);
    if (rc) return rc;
  } else { /* one permuted source: its parts' row lists joined */
    if (!(pm = malloc((size_t)total * sizeof *pm))) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    int64_t k = 0;
    for (int i = 0; i < n; i++)
      for (int64_t r = 0; r < nrows[i]; r++) pm[k++] = perm[prow0[i] + r];
    int rc = up_mats(cm, W[0], 1, pm, 0, total, cat, what, l, err, errlen);
    free(pm);
    if (rc) return rc;
  }
  cat->h = W[0];
  int64_t r0 = 0;
  for (int i = 0; i < n; i++) {
    const int64_t rows = perm ? nrows[i] : W[i]->rows;
    *P[i] = view_rows(cat, r0, rows, W[i]);
    r0 += rows;
  }
  return 0;
}

/* A part of a joined matrix: nrows rows of W, row i from W's row perm[i] (perm NULL: W's rows in
 * order, nrows == W->rows). */
typedef struct join_part {
  const floe_mat *W;
  const int64_t *perm;
  int64_t nrows;
} join_part;

/* The GatedDeltaNet's four input projections q|k|v, z, b, a (parts p[0..3], each from its own
 * source, permuted or not) as ONE device matrix, so a one-token step reads them in one launch;
 * P[i] become views into it and *cat the whole. *joined false (and nothing uploaded) where they
 * cannot be read as one: types or widths differ, or MLX; the caller then joins them in pairs. */
static int up_join_gdn(cu_model *cm, const join_part *p, dmat *const *P, dmat *cat, bool *joined, int64_t l,
                       char *err, size_t errlen) {
  memset(cat, 0, sizeof *cat);
  *joined = false;
  const floe_mat *W0 = p[0].W;
  int64_t total = 0;
  for (int i = 0; i < 4; i++) {
    const floe_mat *W = p[i].W;
    if (!W || !W->data || W->type == FLOE_TYPE_MLX || W->type != W0->type || W->cols != W0->cols ||
        W->row_bytes != W0->row_bytes || (!p[i].perm && p[i].nrows != W->rows))
      return 0;
    total += p[i].nrows;
  }
  const size_t rb = W0->row_bytes;
  uint8_t *buf = malloc((size_t)total * rb);
  if (!buf) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  size_t off = 0;
  for (int i = 0; i < 4; i++)
    for (int64_t r = 0; r < p[i].nrows; r++, off += rb)
      memcpy(buf + off, p[i].W->data + (size_t)(p[i].perm ? p[i].perm[r] : r) * rb, rb);
  floe_mat big = *W0;
  big.data = buf;
  big.rows = total;
  int rc = up_mats(cm, &big, 1, NULL, 0, 0, cat, "ssm_in + ssm_ba", l, err, errlen);
  free(buf);
  if (rc) return rc;
  cat->h = W0;
  int64_t r0 = 0;
  for (int i = 0; i < 4; i++) {
    *P[i] = view_rows(cat, r0, p[i].nrows, p[i].W);
    r0 += p[i].nrows;
  }
  *joined = true;
  return 0;
}

/* The four GDN projections in one matrix (above): on by default; FLOE_CUDA_JOIN_GDN=0 keeps
 * q|k|v|z and b|a as two (the same bits: each output row is the same dot product). */
static bool join_gdn_on(void) {
  const char *e = getenv("FLOE_CUDA_JOIN_GDN");
  return !(e && e[0] == '0');
}

/* a and b can share one device stack: same type, shape and row layout (MLX: same bits, group,
 * scale type) */
static bool same_layout(const floe_mat *a, const floe_mat *b) {
  return a->data && b->data && a->type == b->type && a->rows == b->rows && a->cols == b->cols &&
         a->row_bytes == b->row_bytes && a->sb_row_bytes == b->sb_row_bytes &&
         (a->type != FLOE_TYPE_MLX || (a->mlx.bits == b->mlx.bits && a->mlx.group == b->mlx.group &&
                                       a->mlx.sb_type == b->mlx.sb_type));
}

/* The MTP block's own matrices (its layer n_layer is uploaded with the trunk's). */
static int up_mtp(cu_model *cm, const model *m, char *err, size_t errlen) {
  const int64_t E = m->hp.n_embd;
  int rc = up_mats(cm, &m->mtp.fc, 1, NULL, 0, 0, &cm->mtp_fc, "nextn.eh_proj", m->hp.n_layer, err, errlen);
  if (rc) return rc;
  if (!(cm->mtp_enorm = up_vec(cm, m->mtp.enorm, E, err, errlen)) ||
      !(cm->mtp_hnorm = up_vec(cm, m->mtp.hnorm, E, err, errlen)) ||
      !(cm->mtp_norm = up_vec(cm, m->mtp.norm, E, err, errlen)))
    return FLOE_E_NOMEM;
  return 0;
}

void cu_model_fini(model *m) {
  cu_model *cm = m->dev;
  if (!cm) return;
  cu_tier_close(cm->tier);
  for (size_t i = 0; i < cm->n_alloc; i++) cuda_rt_free(cm->allocs[i]);
  free(cm->allocs);
  free(cm->L);
  free(cm);
  m->dev = NULL;
}

/* Device memory kept out of the expert pool for the sessions (KV cache and scratch of a 512-row
 * chunk at a few thousand positions; more context needs a smaller pool: --gpu-mem is the cap of
 * weights + pool, the sessions' bytes are reported apart). */
#define TIER_SESSION_RESERVE ((uint64_t)1536 << 20)

/* The VRAM expert pool (cuda_tier.c) in what model.gpu_mem leaves after the other weights, and
 * every layer's expert stacks pointed at it. */
static int tier_open(model *m, cu_model *cm, char *err, size_t errlen) {
  bool *sh = calloc((size_t)cm->n_l, sizeof *sh);
  if (!sh) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  for (int64_t l = 0; l < cm->n_l; l++) sh[l] = cm->L[l].sh_in_stack;
  const uint64_t used = cm->bytes + TIER_SESSION_RESERVE;
  int rc;
  if (m->gpu_mem <= used)
    rc = floe_err(err, errlen, FLOE_E_NOMEM,
                  "of %.2f GiB the non-expert weights take %.2f GiB and the sessions %.2f GiB, leaving nothing for "
                  "the expert pool (it needs at least %.2f GiB)",
                  (double)m->gpu_mem / (1u << 30), (double)cm->bytes / (1u << 30),
                  (double)TIER_SESSION_RESERVE / (1u << 30), (double)cu_tier_min_bytes(m, cm->n_l, sh) / (1u << 30));
  else
    rc = cu_tier_open(m, cm->n_l, m->gpu_mem - used, sh, &cm->tier, err, errlen);
  free(sh);
  if (rc) return rc;
  for (int64_t l = 0; l < cm->n_l; l++) {
    cu_layer *L = &cm->L[l];
    cu_tier_views(cm->tier, l, &L->gate.d, &L->up.d, &L->down.d);
  }
  return 0;
}

int cu_model_init(model *m, int dev, char *err, size_t errlen) {
  const floe_hparams *hp = &m->hp;
  const int n_dev = model_cuda_devices();
  if (n_dev <= 0) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "no CUDA device");
  if (dev < 0 || dev >= n_dev)
    return floe_err(err, errlen, FLOE_E_INVALID, "cuda:%d: there are %d CUDA devices", dev, n_dev);
  int rc;
  int64_t *perm = NULL, *permb = NULL; /* the grouped GDN row orders of the layer in hand */
  if ((rc = cuda_rt_init(dev, err, errlen)) || (rc = cuda_mm_init(err, errlen))) return rc;
  cu_model *cm = calloc(1, sizeof *cm);
  if (!cm) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  m->dev = cm;
  cm->dev = dev;
  cuda_rt_device_name(dev, cm->name, sizeof cm->name, NULL, 0);
  cm->n_l = hp->n_layer + (m->mtp.on ? 1 : 0);
  cm->L = calloc((size_t)cm->n_l, sizeof *cm->L);
  if (!cm->L) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto fail;
  }
  const int64_t E = hp->n_embd, Nk = hp->ssm_n_group, Nv = hp->ssm_dt_rank, dk = hp->ssm_d_state;
  const int64_t vd = hp->ssm_d_inner, dv = Nv ? vd / Nv : 0, r = Nk ? Nv / Nk : 0, kd = Nk * dk, C = 2 * kd + vd;
  if ((rc = up_mats(cm, &m->tok_embd, 1, NULL, 0, 0, &cm->tok_embd, "token_embd", -1, err, errlen)) ||
      (rc = up_mats(cm, &m->output, 1, NULL, 0, 0, &cm->output, "output", -1, err, errlen)))
    goto fail;
  if (!(cm->output_norm = up_vec(cm, m->output_norm, E, err, errlen))) {
    rc = FLOE_E_NOMEM;
    goto fail;
  }
  for (int64_t l = 0; l < cm->n_l; l++) { /* l == n_layer: the MTP block's attention + MoE */
    const model_layer *H = &m->layers[l];
    cu_layer *L = &cm->L[l];
    if (!(L->attn_norm = up_vec(cm, H->attn_norm, E, err, errlen)) ||
        !(L->ffn_norm = up_vec(cm, H->ffn_norm, E, err, errlen))) {
      rc = FLOE_E_NOMEM;
      goto fail;
    }
    if (!hp->recurrent[l]) {
      const floe_mat *src[3] = { &H->wq, &H->wk, &H->wv };
      dmat *dst[3] = { &L->wq, &L->wk, &L->wv };
      if ((rc = up_join(cm, src, 3, NULL, NULL, NULL, dst, &L->cat_qkv, "attn_q/k/v", l, err, errlen)) ||
          (rc = up_mats(cm, &H->wo, 1, NULL, 0, 0, &L->wo, "attn_output", l, err, errlen)))
        goto fail;
      if (!(L->q_norm = up_vec(cm, H->q_norm, hp->head_dim, err, errlen)) ||
          !(L->k_norm = up_vec(cm, H->k_norm, hp->head_dim, err, errlen))) {
        rc = FLOE_E_NOMEM;
        goto fail;
      }
    } else {
      /* the row orders: grouped sources (Qwen3-Next) have their rows permuted into q of all key
       * heads | k | v, then z (ssm_in: per key head g [q(dk) | k(dk) | v(r*dv) | z(r*dv)]), and b of
       * all value heads, then a (ssm_ba: per key head [b(r) | a(r)]) */
      const int64_t gq = 2 * dk + 2 * r * dv;
      if (H->qkvz_grouped && !(perm = malloc((size_t)(C + vd) * sizeof *perm))) {
        rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
        goto fail;
      }
      if (H->ba_grouped && !(permb = malloc((size_t)(2 * Nv) * sizeof *permb))) {
        rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
        goto fail;
      }
      if (perm) {
        for (int64_t i = 0; i < kd; i++) perm[i] = (i / dk) * gq + i % dk;
        for (int64_t i = 0; i < kd; i++) perm[kd + i] = (i / dk) * gq + dk + i % dk;
        for (int64_t i = 0; i < vd; i++) perm[2 * kd + i] = (i / (r * dv)) * gq + 2 * dk + i % (r * dv);
        for (int64_t i = 0; i < vd; i++) perm[C + i] = (i / (r * dv)) * gq + 2 * dk + r * dv + i % (r * dv);
      }
      if (permb) {
        for (int64_t i = 0; i < Nv; i++) permb[i] = (i / r) * 2 * r + i % r;
        for (int64_t i = 0; i < Nv; i++) permb[Nv + i] = (i / r) * 2 * r + r + i % r;
      }
      const floe_mat *sq = perm ? &H->ssm_qkvz : &H->ssm_qkv, *sz = perm ? &H->ssm_qkvz : &H->ssm_z;
      const floe_mat *sb = permb ? &H->ssm_ba : &H->ssm_b, *sa = permb ? &H->ssm_ba : &H->ssm_alpha;
      L->lay_gdn = sq;
      L->src_ba = permb ? &H->ssm_ba : NULL;
      const join_part jp[4] = { { sq, perm, perm ? C : sq->rows }, { sz, perm ? perm + C : NULL, perm ? vd : sz->rows },
                                { sb, permb, permb ? Nv : sb->rows }, { sa, permb ? permb + Nv : NULL, permb ? Nv : sa->rows } };
      dmat *dst4[4] = { &L->qkv, &L->z, &L->b, &L->a };
      bool joined = false;
      if (join_gdn_on() && (rc = up_join_gdn(cm, jp, dst4, &L->cat_gdn, &joined, l, err, errlen))) goto fail;
      if (joined) { /* the pairs as views of the whole: the few-row launches take them */
        L->cat_qkvz = view_rows(&L->cat_gdn, 0, jp[0].nrows + jp[1].nrows, sq);
        L->cat_ba = view_rows(&L->cat_gdn, jp[0].nrows + jp[1].nrows, jp[2].nrows + jp[3].nrows, sb);
      } else {
        const floe_mat *src[2] = { sq, sz }, *srcb[2] = { sb, sa };
        dmat *dst[2] = { &L->qkv, &L->z }, *dstb[2] = { &L->b, &L->a };
        const int64_t p0[2] = { 0, C }, pn[2] = { C, vd }, p0b[2] = { 0, Nv }, pnb[2] = { Nv, Nv };
        if ((rc = up_join(cm, src, 2, perm, p0, pn, dst, &L->cat_qkvz, perm ? "ssm_in" : "attn_qkv/attn_gate", l, err,
                          errlen)) ||
            (rc = up_join(cm, srcb, 2, permb, p0b, pnb, dstb, &L->cat_ba, permb ? "ssm_ba" : "ssm_beta/ssm_alpha", l,
                          err, errlen)))
          goto fail;
      }
      free(perm);
      free(permb);
      perm = permb = NULL;
      if (rc || (rc = up_mats(cm, &H->ssm_out, 1, NULL, 0, 0, &L->ssm_out, "ssm_out", l, err, errlen))) goto fail;
      const int64_t K = hp->ssm_conv_kernel;
      if (!(L->conv_wt = up_vec(cm, H->conv_wt, K * C, err, errlen)) ||
          !(L->dt_bias = up_vec(cm, H->dt_bias, Nv, err, errlen)) ||
          !(L->ssm_a = up_vec(cm, H->ssm_a, Nv, err, errlen)) ||
          !(L->ssm_norm = up_vec(cm, H->ssm_norm, dv, err, errlen))) {
        rc = FLOE_E_NOMEM;
        goto fail;
      }
    }
    if (hp->n_ff_shexp > 0) {
      const floe_mat *src[2] = { &H->router, &H->sh_gate_inp };
      dmat *dst[2] = { &L->router, &L->sh_gate_inp };
      rc = up_join(cm, src, 2, NULL, NULL, NULL, dst, &L->cat_rt, "ffn_gate_inp(_shexp)", l, err, errlen);
    } else {
      rc = up_mats(cm, &H->router, 1, NULL, 0, 0, &L->router, "ffn_gate_inp", l, err, errlen);
    }
    L->sh_in_stack = hp->n_ff_shexp > 0 && same_layout(&H->sh_gate, &H->exp_gate[0]) &&
                     same_layout(&H->sh_up, &H->exp_up[0]) && same_layout(&H->sh_down, &H->exp_down[0]);
    const int NEx = (int)hp->n_expert;
    if (!rc && m->gpu_mem) { /* tiered: the pool's views are set below */
      L->gate.h = &H->exp_gate[0];
      L->up.h = &H->exp_up[0];
      L->down.h = &H->exp_down[0];
    } else if (rc ||
        (rc = up_stack(cm, H->exp_gate, NEx, L->sh_in_stack ? &H->sh_gate : NULL, NULL, 0, 0, &L->gate, "ffn_gate_exps",
                       l, err, errlen)) ||
        (rc = up_stack(cm, H->exp_up, NEx, L->sh_in_stack ? &H->sh_up : NULL, NULL, 0, 0, &L->up, "ffn_up_exps", l, err,
                       errlen)) ||
        (rc = up_stack(cm, H->exp_down, NEx, L->sh_in_stack ? &H->sh_down : NULL, NULL, 0, 0, &L->down,
                       "ffn_down_exps", l, err, errlen)))
      goto fail;
    if (hp->n_ff_shexp > 0 && !L->sh_in_stack &&
        ((rc = up_mats(cm, &H->sh_gate, 1, NULL, 0, 0, &L->sh_gate, "ffn_gate_shexp", l, err, errlen)) ||
         (rc = up_mats(cm, &H->sh_up, 1, NULL, 0, 0, &L->sh_up, "ffn_up_shexp", l, err, errlen)) ||
         (rc = up_mats(cm, &H->sh_down, 1, NULL, 0, 0, &L->sh_down, "ffn_down_shexp", l, err, errlen))))
      goto fail;
  }
  if (m->mtp.on && (rc = up_mtp(cm, m, err, errlen))) goto fail;
  if (m->gpu_mem && (rc = tier_open(m, cm, err, errlen))) goto fail;
  return 0;
fail:
  free(perm);
  free(permb);
  cu_model_fini(m);
  return rc;
}
#endif
