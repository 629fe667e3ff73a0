/* libFuzzer target for the HF / MLX config.json reader: parses the input as JSON text, then checks
 * the invariants every successful parse promises (ranges, divisibility, pattern) and runs
 * quantization lookups for every override and a few other module paths.
 *
 * The reader's source is compiled into this file so that it carries libFuzzer coverage and ASan
 * even though libfloe itself is built without them. Seeds: tests/fixtures/configs. */
#include "../../src/format/hf_config.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256];
  hf_config c;
  if (hf_config_parse((const char *)data, size, "fuzz.json", &c, err, sizeof err) != 0) {
    if (c.quant.over || c.quant.n_over) __builtin_trap(); /* failure frees everything */
    return 0;
  }
  const floe_hparams *h = &c.hp;
  if (h->n_layer < 1 || h->n_layer > FLOE_MAX_LAYERS || h->n_head % h->n_head_kv ||
      h->n_expert_used > h->n_expert || h->n_rot > h->head_dim || h->n_rot % 2 || h->n_embd < 1)
    __builtin_trap();
  if (h->arch != FLOE_ARCH_QWEN3MOE && (h->ssm_dt_rank % h->ssm_n_group || h->ssm_d_inner < 1)) __builtin_trap();
  if (h->full_attn_interval > 0)
    for (int64_t i = 0; i < h->n_layer; i++)
      if (h->recurrent[i] != ((i + 1) % h->full_attn_interval != 0)) __builtin_trap();
  int bits, group;
  bool q;
  for (size_t i = 0; i < c.quant.n_over; i++) {
    hf_quant_for(&c.quant, c.quant.over[i].module, &bits, &group, &q);
    if (q != c.quant.over[i].quantized) __builtin_trap();
  }
  hf_quant_for(&c.quant, "model.layers.0.mlp.gate", &bits, &group, &q);
  hf_quant_for(&c.quant, "", &bits, &group, &q);
  hf_config_free(&c);
  return 0;
}
