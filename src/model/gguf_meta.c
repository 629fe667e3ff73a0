/* floe_hparams <-> GGUF metadata, with llama.cpp's key names and value types (converter:
 * gguf-py GGUFWriter.add_* -> u32 for counts and lengths, f32 for eps / freq_base, an int32
 * array for rope.dimension_sections).
 *
 *   general.architecture                 "qwen3moe" | "qwen3next" | "qwen35moe"
 *   {a}.block_count                      trunk + MTP blocks (llama-hparams: n_layer() = block_count - nextn)
 *   {a}.nextn_predict_layers             MTP blocks (absent = 0; older qwen3next files have none)
 *   {a}.context_length, embedding_length, feed_forward_length (absent for qwen35moe)
 *   {a}.attention.head_count, head_count_kv, key_length, value_length, layer_norm_rms_epsilon
 *   {a}.attention.recurrent_layers       optional bool array (block_count) overriding the interval
 *   {a}.rope.freq_base, rope.dimension_count, rope.dimension_sections (qwen35moe, 4 x int32;
 *                                        read as stored, older floe files hold [0,0,0,0]; written
 *                                        as a valid split, see model_rope_sections_valid)
 *   {a}.expert_count, expert_used_count, expert_feed_forward_length, expert_shared_feed_forward_length
 *   {a}.ssm.conv_kernel, ssm.state_size, ssm.group_count, ssm.time_step_rank, ssm.inner_size
 *   {a}.full_attention_interval          (default 4, as llama.cpp) */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/model_meta.h"

static const char *key(char *buf, size_t n, const char *arch, const char *suffix) {
  snprintf(buf, n, "%s.%s", arch, suffix);
  return buf;
}

/* ---- reading ---- */

typedef struct reader {
  const gguf_file *g;
  const char *arch;
  char *err;
  size_t errlen;
} reader;

/* Reads {arch}.suffix as a non-negative integer. required: absence is an error; otherwise
 * *out keeps its default. Returns 0 or a negative FLOE_E_*. */
static int get_int(reader *r, const char *suffix, bool required, int64_t *out) {
  char k[128];
  key(k, sizeof k, r->arch, suffix);
  uint64_t v;
  int rc = gguf_get_u64(r->g, k, &v);
  if (rc == FLOE_E_NOTFOUND) {
    if (!required) return 0;
    return floe_err(r->err, r->errlen, FLOE_E_FORMAT, "%s: missing key %s", r->g->path ? r->g->path : "gguf", k);
  }
  if (rc) return floe_err(r->err, r->errlen, FLOE_E_FORMAT, "%s: key %s is not a non-negative integer",
                          r->g->path ? r->g->path : "gguf", k);
  if (v > ((uint64_t)1 << 40))
    return floe_err(r->err, r->errlen, FLOE_E_FORMAT, "%s: key %s = %llu is absurd", r->g->path ? r->g->path : "gguf",
                    k, (unsigned long long)v);
  *out = (int64_t)v;
  return 0;
}

static int get_float(reader *r, const char *suffix, bool required, float *out) {
  char k[128];
  key(k, sizeof k, r->arch, suffix);
  int rc = gguf_get_f32(r->g, k, out);
  if (rc == FLOE_E_NOTFOUND) {
    if (!required) return 0;
    return floe_err(r->err, r->errlen, FLOE_E_FORMAT, "%s: missing key %s", r->g->path ? r->g->path : "gguf", k);
  }
  if (rc) return floe_err(r->err, r->errlen, FLOE_E_FORMAT, "%s: key %s is not a number", r->g->path ? r->g->path : "gguf", k);
  return 0;
}

int model_hparams_from_gguf(const gguf_file *g, floe_hparams *hp, char *err, size_t errlen) {
  memset(hp, 0, sizeof *hp);
  const char *path = g->path ? g->path : "gguf";
  gguf_str as;
  if (gguf_get_str(g, "general.architecture", &as))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: missing string key general.architecture", path);
  char arch[32];
  if (as.len >= sizeof arch)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: unsupported architecture (name too long)", path);
  memcpy(arch, as.ptr, as.len);
  arch[as.len] = 0;
  hp->arch = floe_arch_from_name(arch);
  if (hp->arch == FLOE_ARCH_UNKNOWN)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED,
                    "%s: unsupported architecture '%s' (floe supports qwen3moe, qwen3next, qwen35moe)", path, arch);
  reader r = {g, arch, err, errlen};
  const bool hybrid = hp->arch != FLOE_ARCH_QWEN3MOE;
  int rc;
#define TRY(x) do { if ((rc = (x))) return rc; } while (0)
  int64_t block_count = 0;
  TRY(get_int(&r, "block_count", true, &block_count));
  TRY(get_int(&r, "nextn_predict_layers", false, &hp->n_mtp));
  if (hp->n_mtp >= block_count)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s.nextn_predict_layers %lld >= block_count %lld", path, arch,
                    (long long)hp->n_mtp, (long long)block_count);
  if (block_count > FLOE_MAX_LAYERS)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s.block_count %lld exceeds FLOE_MAX_LAYERS (%d)", path, arch,
                    (long long)block_count, FLOE_MAX_LAYERS);
  hp->n_layer = block_count - hp->n_mtp;
  TRY(get_int(&r, "context_length", true, &hp->n_ctx_train));
  TRY(get_int(&r, "embedding_length", true, &hp->n_embd));
  TRY(get_int(&r, "feed_forward_length", false, &hp->n_ff));
  TRY(get_int(&r, "attention.head_count", true, &hp->n_head));
  TRY(get_int(&r, "attention.head_count_kv", true, &hp->n_head_kv));
  if (hp->n_head < 1) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s.attention.head_count is 0", path, arch);
  hp->head_dim = hp->n_embd / hp->n_head; /* llama.cpp's default when key_length is absent */
  TRY(get_int(&r, "attention.key_length", false, &hp->head_dim));
  int64_t v_len = hp->head_dim;
  TRY(get_int(&r, "attention.value_length", false, &v_len));
  if (v_len != hp->head_dim)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: value_length %lld != key_length %lld", path, (long long)v_len,
                    (long long)hp->head_dim);
  TRY(get_float(&r, "attention.layer_norm_rms_epsilon", true, &hp->rms_eps));
  hp->rope_theta = 10000.0f;
  TRY(get_float(&r, "rope.freq_base", false, &hp->rope_theta));
  hp->n_rot = hp->head_dim;
  TRY(get_int(&r, "rope.dimension_count", false, &hp->n_rot));
  if (hp->arch == FLOE_ARCH_QWEN35MOE) {
    static const int32_t def_sections[4] = {11, 11, 10, 0};
    memcpy(hp->rope_sections, def_sections, sizeof def_sections);
    char k[128];
    uint32_t at;
    uint64_t n;
    const gguf_value *v = gguf_get_arr(g, key(k, sizeof k, arch, "rope.dimension_sections"), &at, &n);
    if (v) {
      if (n < 3 || n > 4 || at == GGUF_TYPE_STRING || at == GGUF_TYPE_ARRAY)
        return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s must be 3 or 4 integers", path, k);
      for (uint64_t i = 0; i < 4; i++) {
        int64_t s = 0;
        if (i < n && gguf_arr_i64(v, i, &s)) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s[%llu] unreadable", path, k, (unsigned long long)i);
        if (s < 0 || s > 4096) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s[%llu] out of range", path, k, (unsigned long long)i);
        hp->rope_sections[i] = (int32_t)s;
      }
    }
  }
  TRY(get_int(&r, "expert_count", true, &hp->n_expert));
  TRY(get_int(&r, "expert_used_count", true, &hp->n_expert_used));
  TRY(get_int(&r, "expert_feed_forward_length", true, &hp->n_ff_exp));
  TRY(get_int(&r, "expert_shared_feed_forward_length", false, &hp->n_ff_shexp));
  hp->norm_topk = true; /* llama.cpp hard-codes norm_w=true for all three */
  hp->attn_gate = hybrid;
  if (hybrid) {
    TRY(get_int(&r, "ssm.conv_kernel", true, &hp->ssm_conv_kernel));
    TRY(get_int(&r, "ssm.state_size", true, &hp->ssm_d_state));
    TRY(get_int(&r, "ssm.group_count", true, &hp->ssm_n_group));
    TRY(get_int(&r, "ssm.time_step_rank", true, &hp->ssm_dt_rank));
    TRY(get_int(&r, "ssm.inner_size", true, &hp->ssm_d_inner));
    hp->full_attn_interval = 4;
    TRY(get_int(&r, "full_attention_interval", false, &hp->full_attn_interval));
    if (hp->full_attn_interval < 1)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s.full_attention_interval is 0", path, arch);
    char k[128];
    uint32_t at;
    uint64_t n;
    const gguf_value *v = gguf_get_arr(g, key(k, sizeof k, arch, "attention.recurrent_layers"), &at, &n);
    if (v) {
      if (n != (uint64_t)block_count || at == GGUF_TYPE_STRING || at == GGUF_TYPE_ARRAY || at == GGUF_TYPE_FLOAT32 ||
          at == GGUF_TYPE_FLOAT64)
        return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s must be %lld booleans", path, k, (long long)block_count);
      for (int64_t i = 0; i < hp->n_layer; i++) {
        int64_t b = 0;
        if (at == GGUF_TYPE_BOOL) b = ((const uint8_t *)v->data)[i] != 0;
        else if (gguf_arr_i64(v, (uint64_t)i, &b))
          return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %s[%lld] unreadable", path, k, (long long)i);
        hp->recurrent[i] = b != 0;
      }
    } else {
      model_hparams_set_pattern(hp);
    }
    /* The layer pattern must match the tensors. Some converters write full_attention_interval 4
     * for a config that only lists layer_types; say so here rather than fail later on a missing
     * tensor. */
    if (g->n_tensors > 0) {
      for (int64_t i = 0; i < hp->n_layer; i++) {
        char tn[64];
        snprintf(tn, sizeof tn, "blk.%lld.attn_q.weight", (long long)i);
        const bool has_attn = gguf_find_tensor(g, tn) != NULL;
        snprintf(tn, sizeof tn, "blk.%lld.ssm_a", (long long)i);
        const bool has_ssm = gguf_find_tensor(g, tn) != NULL;
        if (has_attn == has_ssm) continue; /* neither or both: left to the tensor binding */
        if (has_ssm != hp->recurrent[i])
          return floe_err(err, errlen, FLOE_E_FORMAT,
                          "%s: layer pattern mismatch: the metadata (%s.full_attention_interval %lld%s) makes layer "
                          "%lld %s, but its tensors are %s (the converter did not record the config's layer_types)",
                          path, arch, (long long)hp->full_attn_interval, v ? ", attention.recurrent_layers" : "",
                          (long long)i, hp->recurrent[i] ? "GatedDeltaNet" : "full attention",
                          has_ssm ? "GatedDeltaNet" : "full attention");
      }
    }
  }
  /* Vocabulary size: explicit key, else the token list, else the embedding rows. */
  hp->n_vocab = 0;
  TRY(get_int(&r, "vocab_size", false, &hp->n_vocab));
  if (!hp->n_vocab) {
    uint32_t at;
    uint64_t n;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &at, &n) && n > 0) hp->n_vocab = (int64_t)n;
  }
  const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
  if (te) {
    if (te->n_dims != 2 || te->ne[0] != hp->n_embd)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: token_embd.weight is not {%lld, n_vocab}", path, (long long)hp->n_embd);
    if (!hp->n_vocab) hp->n_vocab = te->ne[1];
    else if (te->ne[1] != hp->n_vocab)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: token_embd.weight has %lld rows but the vocabulary has %lld tokens",
                      path, (long long)te->ne[1], (long long)hp->n_vocab);
  }
  if (!hp->n_vocab)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: vocabulary size unknown (no tokenizer.ggml.tokens, no token_embd)", path);
  hp->tied_embeddings = g->n_tensors > 0 && !gguf_find_tensor(g, "output.weight");
#undef TRY
  char verr[384];
  if ((rc = model_hparams_validate(hp, verr, sizeof verr))) return floe_err(err, errlen, rc, "%s: %s", path, verr);
  return 0;
}

/* ---- qwen35moe rope sections ---- */

bool model_rope_sections_valid(const int32_t sec[4], int64_t n_rot, int64_t head_dim) {
  int64_t sum = 0;
  for (int i = 0; i < 4; i++) {
    if (sec[i] < 0) return false;
    sum += sec[i];
  }
  if (sum <= 0 || sum > head_dim) return false; /* ggml asserts both */
  for (int64_t i = 0; i < n_rot / 2; i++) {
    const int64_t s = i % sum;
    const bool t = s % 3 == 0 && s < 3 * (int64_t)sec[0];
    const bool h = s % 3 == 1 && s < 3 * (int64_t)sec[1];
    const bool w = s % 3 == 2 && s < 3 * (int64_t)sec[2];
    if (!t && !h && !w) return false;
  }
  return true;
}

void model_rope_sections_canonical(int64_t n_rot, int32_t sec[4]) {
  const int64_t p = n_rot / 2;
  sec[0] = (int32_t)((p + 2) / 3);
  sec[1] = (int32_t)((p + 1) / 3);
  sec[2] = (int32_t)(p / 3);
  sec[3] = 0;
}

/* ---- writing ---- */

int model_hparams_to_gguf(gguf_writer *w, const floe_hparams *hp) {
  char e[256];
  int rc = model_hparams_validate(hp, e, sizeof e);
  if (rc) return rc;
  const char *a = floe_arch_name(hp->arch);
  const bool hybrid = hp->arch != FLOE_ARCH_QWEN3MOE;
  char k[128];
#define U32(suffix, v) do { if ((rc = gguf_writer_add_u32(w, key(k, sizeof k, a, suffix), (uint32_t)(v)))) return rc; } while (0)
#define F32(suffix, v) do { if ((rc = gguf_writer_add_f32(w, key(k, sizeof k, a, suffix), (v)))) return rc; } while (0)
  if ((rc = gguf_writer_add_str(w, "general.architecture", a))) return rc;
  U32("block_count", hp->n_layer + hp->n_mtp);
  U32("context_length", hp->n_ctx_train);
  U32("embedding_length", hp->n_embd);
  if (hp->n_ff > 0) U32("feed_forward_length", hp->n_ff);
  U32("attention.head_count", hp->n_head);
  U32("attention.head_count_kv", hp->n_head_kv);
  U32("attention.key_length", hp->head_dim);
  U32("attention.value_length", hp->head_dim);
  F32("attention.layer_norm_rms_epsilon", hp->rms_eps);
  F32("rope.freq_base", hp->rope_theta);
  U32("rope.dimension_count", hp->n_rot);
  if (hp->arch == FLOE_ARCH_QWEN35MOE) {
    int32_t sec[4];
    memcpy(sec, hp->rope_sections, sizeof sec);
    if (!model_rope_sections_valid(sec, hp->n_rot, hp->head_dim)) model_rope_sections_canonical(hp->n_rot, sec);
    if ((rc = gguf_writer_add_arr(w, key(k, sizeof k, a, "rope.dimension_sections"), GGUF_TYPE_INT32, sec, 4)))
      return rc;
  }
  U32("expert_count", hp->n_expert);
  U32("expert_used_count", hp->n_expert_used);
  U32("expert_feed_forward_length", hp->n_ff_exp);
  if (hp->n_ff_shexp > 0) U32("expert_shared_feed_forward_length", hp->n_ff_shexp);
  if (hybrid) {
    U32("ssm.conv_kernel", hp->ssm_conv_kernel);
    U32("ssm.state_size", hp->ssm_d_state);
    U32("ssm.group_count", hp->ssm_n_group);
    U32("ssm.time_step_rank", hp->ssm_dt_rank);
    U32("ssm.inner_size", hp->ssm_d_inner);
    U32("full_attention_interval", hp->full_attn_interval);
    /* A pattern that the interval rule does not describe is written explicitly. */
    floe_hparams std = *hp;
    model_hparams_set_pattern(&std);
    if (memcmp(std.recurrent, hp->recurrent, sizeof hp->recurrent)) {
      uint8_t flags[FLOE_MAX_LAYERS] = {0};
      for (int64_t i = 0; i < hp->n_layer; i++) flags[i] = hp->recurrent[i];
      if ((rc = gguf_writer_add_arr(w, key(k, sizeof k, a, "attention.recurrent_layers"), GGUF_TYPE_BOOL, flags,
                                    (uint64_t)(hp->n_layer + hp->n_mtp))))
        return rc;
    }
  }
  if (hp->n_mtp > 0) U32("nextn_predict_layers", hp->n_mtp);
#undef U32
#undef F32
  return 0;
}
