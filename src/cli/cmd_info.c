/* floe info -m MODEL [--tensor NAME]
 *
 * Describes a model file: format, architecture and hyper-parameters, tensor count/types/bytes,
 * routed-expert bytes vs the rest, tokenizer summary. With --tensor, prints that tensor's values
 * dequantized to float32, one per line ("%.9g"), for checking against other tools. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/base.h"
#include "cli/cli.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "base/hparams.h"
#include "model/model_meta.h"
#include "quant/quant.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: floe info -m MODEL [--tensor NAME]\n"
          "  -m, --model MODEL   GGUF file, or HF / MLX safetensors directory\n"
          "  --tensor NAME       print the tensor's values dequantized to float32, one per line\n");
}

static void print_bytes(const char *label, uint64_t b, uint64_t total) {
  printf("%-22s %14llu bytes (%8.3f GiB", label, (unsigned long long)b, (double)b / (1024.0 * 1024 * 1024));
  if (total) printf(", %5.1f %%", 100.0 * (double)b / (double)total);
  printf(")\n");
}

static int dump_tensor(const gguf_file *g, const char *name) {
  const gguf_tensor *t = gguf_find_tensor(g, name);
  if (!t) return cli_fail("%s: no tensor named '%s'", g->path, name);
  const floe_type_traits *tr = floe_type_info(t->type);
  if (!tr || !tr->supported) return cli_fail("%s: tensor '%s': type %u cannot be dequantized", g->path, name, t->type);
  int64_t n0 = t->ne[0], rows = 1;
  for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
  size_t rb = floe_row_bytes(t->type, n0);
  float *buf = malloc((size_t)n0 * sizeof(float));
  if (!buf) return cli_fail("out of memory");
  /* large outputs: a big stdio buffer keeps printf from being the bottleneck */
  static char obuf[1 << 20];
  setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
  for (int64_t r = 0; r < rows; r++) {
    quant_dequant_row(t->type, t->data + (size_t)r * rb, buf, n0);
    for (int64_t j = 0; j < n0; j++) printf("%.9g\n", buf[j]);
  }
  free(buf);
  return fflush(stdout) == 0 ? 0 : cli_fail("write error on stdout");
}

static void print_hparams(const floe_hparams *hp) {
  printf("architecture           %s\n", floe_arch_name(hp->arch));
  printf("vocab                  %lld\n", (long long)hp->n_vocab);
  printf("embedding              %lld\n", (long long)hp->n_embd);
  printf("layers                 %lld (+%lld MTP)\n", (long long)hp->n_layer, (long long)hp->n_mtp);
  printf("context (trained)      %lld\n", (long long)hp->n_ctx_train);
  printf("attention              %lld heads, %lld kv heads, head dim %lld, rope dims %lld, theta %g%s\n",
         (long long)hp->n_head, (long long)hp->n_head_kv, (long long)hp->head_dim, (long long)hp->n_rot,
         (double)hp->rope_theta, hp->attn_gate ? ", output gate" : "");
  printf("experts                %lld, top-%lld, ff %lld, shared ff %lld%s\n", (long long)hp->n_expert,
         (long long)hp->n_expert_used, (long long)hp->n_ff_exp, (long long)hp->n_ff_shexp,
         hp->norm_topk ? ", renormalised" : "");
  if (hp->arch == FLOE_ARCH_QWEN35MOE) {
    const int32_t *s = hp->rope_sections;
    printf("rope sections          [%d, %d, %d, %d]%s\n", s[0], s[1], s[2], s[3],
           model_rope_sections_valid(s, hp->n_rot, hp->head_dim) ? "" : " (not a valid split: llama.cpp rejects or misreads it)");
  }
  int n_rec = 0;
  for (int64_t i = 0; i < hp->n_layer && i < FLOE_MAX_LAYERS; i++) n_rec += hp->recurrent[i];
  if (n_rec) {
    printf("layer pattern          %d GatedDeltaNet + %lld full attention (interval %lld)\n", n_rec,
           (long long)(hp->n_layer - n_rec), (long long)hp->full_attn_interval);
    printf("gated deltanet         %lld key heads, %lld value heads, dk %lld, inner %lld, conv %lld\n",
           (long long)hp->ssm_n_group, (long long)hp->ssm_dt_rank, (long long)hp->ssm_d_state,
           (long long)hp->ssm_d_inner, (long long)hp->ssm_conv_kernel);
  }
  printf("rms eps                %g\n", (double)hp->rms_eps);
}

static void print_tokenizer(const gguf_file *g) {
  gguf_str model = {0}, pre = {0}, tmpl = {0};
  uint32_t at;
  uint64_t n_tok = 0, n_merges = 0;
  if (gguf_get_str(g, "tokenizer.ggml.model", &model) != 0) {
    printf("tokenizer              none\n");
    return;
  }
  gguf_get_str(g, "tokenizer.ggml.pre", &pre);
  gguf_get_arr(g, "tokenizer.ggml.tokens", &at, &n_tok);
  gguf_get_arr(g, "tokenizer.ggml.merges", &at, &n_merges);
  char sm[64], sp[64];
  printf("tokenizer              %s, pre %s, %llu tokens, %llu merges", floe_show_n(sm, sizeof sm, model.ptr, model.len),
         pre.len ? floe_show_n(sp, sizeof sp, pre.ptr, pre.len) : "-", (unsigned long long)n_tok,
         (unsigned long long)n_merges);
  uint32_t id;
  if (gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &id) == 0) printf(", eos %u", id);
  if (gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id) == 0) printf(", bos %u", id);
  printf(", chat template %s\n", gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0 ? "yes" : "no");
}

/* One float from a plain safetensors element, or NAN for a dtype without a float reading. */
static double st_elem(const st_tensor *t, int64_t i) {
  const uint8_t *p = t->data + (size_t)i * st_dtype_size(t->dtype);
  uint16_t h;
  uint32_t u;
  float f;
  switch (t->dtype) {
    case ST_F32: memcpy(&f, p, 4); return f;
    case ST_F16: memcpy(&h, p, 2); return floe_f16_to_f32(h);
    case ST_BF16: memcpy(&h, p, 2); return floe_bf16_to_f32(h);
    case ST_I8: return (int8_t)p[0];
    case ST_U8: return p[0];
    case ST_U32: memcpy(&u, p, 4); return u;
    case ST_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ST_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
  }
  return 0.0 / 0.0;
}

/* floe info on an HF / MLX directory: config hparams, tensors by dtype, experts vs the rest. */
static int info_dir(const char *dir, const char *tensor) {
  char err[512];
  st_model *st = NULL;
  if (st_model_open(dir, &st, err, sizeof err) != 0) return cli_fail("%s", err);
  if (tensor) {
    const st_tensor *t = st_find(st, tensor);
    if (!t) {
      st_model_close(st);
      return cli_fail("%s: no tensor named '%s'", dir, tensor);
    }
    if (!st_dtype_supported(t->dtype)) {
      st_model_close(st);
      return cli_fail("%s: tensor '%s': dtype %s cannot be printed", dir, tensor, st_dtype_name(t->dtype));
    }
    static char obuf[1 << 20];
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
    for (int64_t i = 0; i < t->n_elements; i++) printf("%.9g\n", st_elem(t, i));
    st_model_close(st);
    return fflush(stdout) == 0 ? 0 : cli_fail("write error on stdout");
  }
  printf("file                   %s\n", dir);
  printf("format                 safetensors, %d shard(s), %zu tensors\n", st_n_shards(st), st_count(st));
  hf_config cfg;
  if (hf_config_load(dir, &cfg, err, sizeof err) != 0) {
    printf("architecture           (%s)\n", err);
  } else {
    print_hparams(&cfg.hp);
    if (cfg.quant.present) {
      printf("quantization           MLX %s, %d bits, group %d, %zu per-module overrides\n", hf_qmode_name(cfg.quant.mode),
             cfg.quant.bits, cfg.quant.group_size, cfg.quant.n_over);
    }
    hf_config_free(&cfg);
  }
  uint64_t total = 0, experts = 0, by_dtype[ST_DTYPE_COUNT] = {0}, n_by_dtype[ST_DTYPE_COUNT] = {0};
  for (size_t i = 0; i < st_count(st); i++) {
    const st_tensor *t = st_tensor_at(st, i);
    total += t->nbytes;
    if (strstr(t->name, ".experts.") || strstr(t->name, ".switch_mlp.")) experts += t->nbytes;
    if (t->dtype >= 0 && t->dtype < ST_DTYPE_COUNT) {
      by_dtype[t->dtype] += t->nbytes;
      n_by_dtype[t->dtype]++;
    }
  }
  print_bytes("tensor data", total, 0);
  print_bytes("  routed experts", experts, total);
  print_bytes("  everything else", total - experts, total);
  for (int d = 0; d < ST_DTYPE_COUNT; d++) {
    if (!n_by_dtype[d]) continue;
    char label[64];
    snprintf(label, sizeof label, "  %-8s x%-5llu", st_dtype_name(d), (unsigned long long)n_by_dtype[d]);
    print_bytes(label, by_dtype[d], total);
  }
  char tp[4096];
  struct stat sb;
  snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
  printf("tokenizer              %s\n", stat(tp, &sb) == 0 ? "tokenizer.json" : "none");
  st_model_close(st);
  return 0;
}

int cmd_info(int argc, char **argv) {
  const char *model = NULL, *tensor = NULL;
  for (int i = 0; i < argc; i++) {
    if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) {
      model = argv[++i];
    } else if (!strcmp(argv[i], "--tensor") && i + 1 < argc) {
      tensor = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "floe info: unknown or incomplete option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!model) {
    usage(stderr);
    return 2;
  }
  struct stat sb;
  if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode)) return info_dir(model, tensor);
  char err[512];
  gguf_file *g = NULL;
  if (gguf_open(model, &g, err, sizeof err) != 0) return cli_fail("%s", err);
  int rc = 0;
  if (tensor) {
    rc = dump_tensor(g, tensor);
    gguf_close(g);
    return rc;
  }
  printf("file                   %s\n", model);
  printf("format                 GGUF v%u, %llu metadata keys, %llu tensors, alignment %llu\n", g->version,
         (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, (unsigned long long)g->alignment);
  gguf_str name;
  char shown[128];
  if (gguf_get_str(g, "general.name", &name) == 0)
    printf("name                   %s\n", floe_show_n(shown, sizeof shown, name.ptr, name.len));

  floe_hparams hp;
  gguf_str arch;
  if (gguf_get_str(g, "general.architecture", &arch) != 0) {
    printf("architecture           (none: not a model file)\n");
  } else if (model_hparams_from_gguf(g, &hp, err, sizeof err) != 0) {
    printf("architecture           %s (%s)\n", floe_show_n(shown, sizeof shown, arch.ptr, arch.len), err);
  } else {
    print_hparams(&hp);
  }

  /* bytes per type, and routed experts vs everything else */
  uint64_t by_type[FLOE_TYPE_COUNT_GGML] = {0}, n_by_type[FLOE_TYPE_COUNT_GGML] = {0};
  uint64_t total = 0, experts = 0, mtp = 0;
  char mtp_prefix[32] = "";
  if (g->n_tensors && arch.len && model_hparams_from_gguf(g, &hp, err, sizeof err) == 0 && hp.n_mtp > 0)
    snprintf(mtp_prefix, sizeof mtp_prefix, "blk.%lld.", (long long)hp.n_layer);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const gguf_tensor *t = &g->tensors[i];
    total += t->size;
    if (t->type < FLOE_TYPE_COUNT_GGML) {
      by_type[t->type] += t->size;
      n_by_type[t->type]++;
    }
    char nm[256];
    floe_show_n(nm, sizeof nm, t->name.ptr, t->name.len);
    if (strstr(nm, "_exps.")) experts += t->size;
    if (mtp_prefix[0] && !strncmp(nm, mtp_prefix, strlen(mtp_prefix))) mtp += t->size;
  }
  print_bytes("tensor data", total, 0);
  print_bytes("  routed experts", experts, total);
  print_bytes("  everything else", total - experts, total);
  if (mtp) print_bytes("  of which MTP block", mtp, total);
  for (uint32_t ty = 0; ty < FLOE_TYPE_COUNT_GGML; ty++) {
    if (!n_by_type[ty]) continue;
    const floe_type_traits *tr = floe_type_info(ty);
    char label[64];
    snprintf(label, sizeof label, "  %-8s x%-5llu", tr ? tr->name : "?", (unsigned long long)n_by_type[ty]);
    print_bytes(label, by_type[ty], total);
  }
  print_tokenizer(g);
  gguf_close(g);
  return rc;
}
