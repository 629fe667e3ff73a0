/* KV cache + recurrent state: see kv.h. */
#include "kv/kv.h"

#include <string.h>

#include "base/base.h"

/* Buffers of 2 MiB or more on huge pages (floe_huge_alloc): the recurrent state (2 MiB a layer
 * for Qwen3.5-35B) and K/V are re-read every token after the whole weight stream has evicted
 * their page-table entries from the TLBs and caches; on 4 KiB pages every 4 KiB of state cost a
 * page walk from memory. */
static void *zalloc(size_t n, size_t *total) {
  void *p = floe_huge_alloc(n ? n : 64);
  if (p) {
    memset(p, 0, n);
    *total += n;
  }
  return p;
}

static size_t ssm_bytes(const kv_state *kv) { return (size_t)(kv->ssm_n * kv->ssm_dk * kv->ssm_dv) * 4; }
static size_t conv_bytes(const kv_state *kv) { return (size_t)((kv->conv_k - 1) * kv->conv_c) * 4; }

int kv_init_dims(kv_state *kv, const floe_hparams *hp, int64_t n_ctx, int kv_type, char *err, size_t errlen) {
  memset(kv, 0, sizeof *kv);
  if (n_ctx < 1 || hp->n_layer < 1 || hp->n_layer > FLOE_MAX_LAYERS || (kv_type != KV_F32 && kv_type != KV_BF16))
    return floe_err(err, errlen, FLOE_E_INVALID, "kv: bad context %lld or layer count %lld", (long long)n_ctx,
                    (long long)hp->n_layer);
  kv->kv_type = kv_type;
  kv->n_ctx = n_ctx;
  kv->n_layer = hp->n_layer;
  kv->n_head_kv = hp->n_head_kv;
  kv->head_dim = hp->head_dim;
  kv->ssm_n = hp->ssm_dt_rank;
  kv->ssm_dk = hp->ssm_d_state;
  kv->ssm_dv = hp->ssm_dt_rank > 0 ? hp->ssm_d_inner / hp->ssm_dt_rank : 0;
  kv->conv_k = hp->ssm_conv_kernel;
  kv->conv_c = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
  for (int64_t l = 0; l < hp->n_layer; l++) {
    kv->rec[l] = hp->recurrent[l];
    if (hp->recurrent[l] && (kv->conv_k < 2 || kv->ssm_n < 1)) {
      memset(kv, 0, sizeof *kv);
      return floe_err(err, errlen, FLOE_E_INVALID, "kv: recurrent layer %lld without GDN sizes", (long long)l);
    }
  }
  return 0;
}

int kv_init(kv_state *kv, const floe_hparams *hp, int64_t n_ctx, int kv_type, char *err, size_t errlen) {
  int rc = kv_init_dims(kv, hp, n_ctx, kv_type, err, errlen);
  if (rc) return rc;
  size_t esz = kv_type == KV_F32 ? 4 : 2;
  for (int64_t l = 0; l < hp->n_layer; l++) {
    uint64_t n;
    if (!hp->recurrent[l]) {
      if (!floe_mul_ok((uint64_t)n_ctx, (uint64_t)(hp->n_head_kv * hp->head_dim), &n) || !floe_mul_ok(n, esz, &n))
        goto overflow;
      kv->k[l] = zalloc(n, &kv->bytes);
      kv->v[l] = zalloc(n, &kv->bytes);
      if (!kv->k[l] || !kv->v[l]) goto nomem;
    } else {
      if (!floe_mul_ok((uint64_t)kv->ssm_n * kv->ssm_dk, (uint64_t)kv->ssm_dv * 4, &n)) goto overflow;
      kv->ssm[l] = zalloc(n, &kv->bytes);
      if (!floe_mul_ok((uint64_t)(kv->conv_k - 1), (uint64_t)kv->conv_c * 4, &n)) goto overflow;
      kv->conv[l] = zalloc(n, &kv->bytes);
      if (!kv->ssm[l] || !kv->conv[l]) goto nomem;
    }
  }
  if (hp->n_mtp > 0) { /* the MTP block's own attention cache, at index n_layer */
    const int64_t l = hp->n_layer;
    uint64_t n;
    if (l >= FLOE_MAX_LAYERS) goto overflow;
    if (!floe_mul_ok((uint64_t)n_ctx, (uint64_t)(hp->n_head_kv * hp->head_dim), &n) || !floe_mul_ok(n, esz, &n))
      goto overflow;
    kv->k[l] = zalloc(n, &kv->bytes);
    kv->v[l] = zalloc(n, &kv->bytes);
    if (!kv->k[l] || !kv->v[l]) goto nomem;
  }
  return 0;
overflow:
  kv_free(kv);
  return floe_err(err, errlen, FLOE_E_OVERFLOW, "kv: cache size overflows (n_ctx %lld)", (long long)n_ctx);
nomem:
  kv_free(kv);
  return floe_err(err, errlen, FLOE_E_NOMEM, "kv: cannot allocate the cache for %lld positions", (long long)n_ctx);
}

void kv_free(kv_state *kv) {
  for (int64_t l = 0; l < FLOE_MAX_LAYERS; l++) {
    floe_aligned_free(kv->k[l]);
    floe_aligned_free(kv->v[l]);
    floe_aligned_free(kv->ssm[l]);
    floe_aligned_free(kv->conv[l]);
    for (int t = 0; t < KV_KEEP_MAX; t++) {
      floe_aligned_free(kv->keep_ssm[l][t]);
      floe_aligned_free(kv->keep_conv[l][t]);
    }
  }
  memset(kv, 0, sizeof *kv);
}

int kv_keep_begin(kv_state *kv, int64_t n) {
  if (n < 0 || n > KV_KEEP_MAX) return FLOE_E_INVALID;
  for (int64_t t = kv->keep_alloc; t < n; t++) {
    for (int64_t l = 0; l < kv->n_layer; l++) {
      if (!kv->rec[l]) continue;
      if (!kv->keep_ssm[l][t]) kv->keep_ssm[l][t] = zalloc(ssm_bytes(kv), &kv->bytes);
      if (!kv->keep_conv[l][t]) kv->keep_conv[l][t] = zalloc(conv_bytes(kv), &kv->bytes);
      if (!kv->keep_ssm[l][t] || !kv->keep_conv[l][t]) return FLOE_E_NOMEM; /* freed by kv_free */
    }
    kv->keep_alloc = t + 1;
  }
  kv->keep_n = n;
  return 0;
}

void kv_keep_accept(kv_state *kv, int64_t a) {
  FLOE_ASSERT(a >= 0 && a <= kv->keep_n);
  if (a > 0)
    for (int64_t l = 0; l < kv->n_layer; l++) {
      if (!kv->rec[l]) continue;
      float *p = kv->ssm[l];
      kv->ssm[l] = kv->keep_ssm[l][a - 1];
      kv->keep_ssm[l][a - 1] = p;
      p = kv->conv[l];
      kv->conv[l] = kv->keep_conv[l][a - 1];
      kv->keep_conv[l][a - 1] = p;
    }
  kv->keep_n = 0;
}

float *kv_ssm_in(const kv_state *kv, int64_t l, int64_t t) { return kv->keep_n && t > 0 ? kv->keep_ssm[l][t - 1] : kv->ssm[l]; }
float *kv_ssm_out(const kv_state *kv, int64_t l, int64_t t) { return kv->keep_n ? kv->keep_ssm[l][t] : kv->ssm[l]; }
float *kv_conv_in(const kv_state *kv, int64_t l, int64_t t) { return kv->keep_n && t > 0 ? kv->keep_conv[l][t - 1] : kv->conv[l]; }
float *kv_conv_out(const kv_state *kv, int64_t l, int64_t t) { return kv->keep_n ? kv->keep_conv[l][t] : kv->conv[l]; }

void kv_reset(kv_state *kv) {
  for (int64_t l = 0; l < kv->n_layer; l++) {
    if (kv->ssm[l]) memset(kv->ssm[l], 0, ssm_bytes(kv));
    if (kv->conv[l]) memset(kv->conv[l], 0, conv_bytes(kv));
  }
  kv->n_past = 0;
}

size_t kv_ckpt_bytes(const kv_state *kv) {
  size_t n = 0;
  for (int64_t l = 0; l < kv->n_layer; l++)
    if (kv->rec[l]) n += ssm_bytes(kv) + conv_bytes(kv);
  return n;
}

/* Layout of a checkpoint: for each recurrent layer in order, S then the conv window. */
int kv_ckpt_save(const kv_state *kv, kv_ckpt *c) {
  const size_t nb = kv_ckpt_bytes(kv);
  if (!c->data && !(c->data = floe_aligned_alloc(64, nb ? nb : 64))) return FLOE_E_NOMEM;
  uint8_t *d = (uint8_t *)c->data;
  for (int64_t l = 0; l < kv->n_layer; l++) {
    if (!kv->ssm[l]) continue;
    memcpy(d, kv->ssm[l], ssm_bytes(kv));
    d += ssm_bytes(kv);
    memcpy(d, kv->conv[l], conv_bytes(kv));
    d += conv_bytes(kv);
  }
  c->pos = kv->n_past;
  return 0;
}

void kv_ckpt_restore(kv_state *kv, const kv_ckpt *c) {
  FLOE_ASSERT(c->data && c->pos >= 0 && c->pos <= kv->n_past);
  const uint8_t *d = (const uint8_t *)c->data;
  for (int64_t l = 0; l < kv->n_layer; l++) {
    if (!kv->ssm[l]) continue;
    memcpy(kv->ssm[l], d, ssm_bytes(kv));
    d += ssm_bytes(kv);
    memcpy(kv->conv[l], d, conv_bytes(kv));
    d += conv_bytes(kv);
  }
  kv->n_past = c->pos;
}

void kv_ckpt_free(kv_ckpt *c) {
  floe_aligned_free(c->data);
  c->data = NULL;
  c->pos = -1;
}

/* head-major: head kh of position pos at (kh * n_ctx + pos) * head_dim */
static void put_row(const kv_state *kv, void *base, int64_t pos, const float *x) {
  const int64_t hd = kv->head_dim;
  for (int64_t kh = 0; kh < kv->n_head_kv; kh++) {
    const size_t off = (size_t)(kh * kv->n_ctx + pos) * (size_t)hd;
    if (kv->kv_type == KV_F32) {
      memcpy((float *)base + off, x + kh * hd, (size_t)hd * 4);
    } else {
      uint16_t *d = (uint16_t *)base + off;
      for (int64_t i = 0; i < hd; i++) d[i] = floe_f32_to_bf16(x[kh * hd + i]);
    }
  }
}

void kv_put(const kv_state *kv, int64_t l, int64_t pos, const float *krow, const float *vrow) {
  FLOE_ASSERT(kv->k[l] && pos >= 0 && pos < kv->n_ctx);
  put_row(kv, kv->k[l], pos, krow);
  put_row(kv, kv->v[l], pos, vrow);
}

const void *kv_head_rows(const kv_state *kv, int64_t l, bool v, int64_t kh) {
  const size_t esz = kv->kv_type == KV_F32 ? 4 : 2;
  return (const char *)(v ? kv->v[l] : kv->k[l]) + (size_t)(kh * kv->n_ctx) * (size_t)kv->head_dim * esz;
}
