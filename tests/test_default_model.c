/* The embedded default model (models/default.gguf, issue 6) against HF transformers.
 *
 * models/default.gguf is `floe convert --type q8_0` of the BF16 checkpoint tools/train/train.py
 * trained. The golden references (tests/fixtures/default_model/golden.json) are HF transformers'
 * Qwen3_5MoeForCausalLM run on the DEQUANTIZED shipped weights (float32, eager attention and
 * experts; tools/train/reference.py): for 5 held-out prompts, the prompt ids of the HF tokenizer,
 * HF's greedy 64-token continuation through its cache, and from one full forward over prompt +
 * continuation the top-5 logits and the top-2 margin at every position.
 *
 * Checks (exact float path: floe_session_params.exact_act, F32 KV cache):
 *  - the file: <= 30 MB, qwen35moe, 8 layers + 1 MTP block, >= 32 experts, top-k >= 4;
 *  - floe's tokenizer gives HF's prompt ids;
 *  - one batch over prompt + HF's continuation: at every position floe's logits of HF's top-5 ids
 *    within LOGIT_TOL of HF's, and floe's argmax is HF's (unless HF's top-2 margin < MARGIN);
 *  - greedy decode from the prompt, one token at a time: HF's 64 tokens, token for token (a
 *    difference is accepted only where HF's own top-2 margin is below MARGIN, i.e. a float-noise
 *    tie; none happens with the shipped file).
 *
 * `test_default_model --make-refs HF_DIR OUT_DIR` (tools/train/README.md) writes what the GPU run of
 * reference.py needs: OUT_DIR/q8_compact.safetensors (every HF tensor as the Q8_0 GGUF holds it:
 * int8 codes + fp16 block scales widened to F32, other tensors F32, so HF's weights are floe's
 * exactly), OUT_DIR/deq_f32/ (the same values as a plain F32 HF directory, for the local check that
 * floe gives bit-identical logits on it and on the GGUF) and copies of config/tokenizer/prompts. */
#include <cjson/cJSON.h>

#include "floe.h"
#include "model_ref_util.h"
#include "test.h"

#define LOGIT_TOL 2e-3 /* |floe - HF| on logits of |x| <= ~25 (measured: see the output) */
#define MARGIN 1e-3
#define MAX_FILE_BYTES (30u << 20)

/* ---------------------------------------------------------------------------------------------
 * --make-refs */

static int copy_to(const char *src_dir, const char *dst_dir, const char *name) {
  char a[1200], b[1200];
  snprintf(a, sizeof a, "%s/%s", src_dir, name);
  snprintf(b, sizeof b, "%s/%s", dst_dir, name);
  if (ru_copy_file(a, b)) {
    printf("copy %s: failed\n", a);
    return -1;
  }
  return 0;
}

static int make_compact(const char *hf_dir, const char *out_path, const char *deq_dir) {
  char err[256];
  hf_config cfg;
  st_model *st = NULL, *deq = NULL;
  st_writer *w = NULL;
  if (hf_config_load(hf_dir, &cfg, err, sizeof err) || st_model_open(hf_dir, &st, err, sizeof err) ||
      st_model_open(deq_dir, &deq, err, sizeof err)) {
    printf("%s: %s\n", hf_dir, err);
    return -1;
  }
  int rc = st_writer_open(out_path, &w, err, sizeof err);
  int64_t n_q8 = 0, n_other = 0, n_mismatch = 0;
  for (size_t i = 0; i < st_count(st) && !rc; i++) {
    const st_tensor *t = st_tensor_at(st, i);
    float *v = ru_floats(t, 0, t->n_elements);
    if (!v) {
      rc = -1;
      break;
    }
    const int ty = ru_gguf_type(t->name, t, FLOE_TYPE_Q8_0);
    const int64_t cols = t->shape[t->n_dims - 1], rows = t->n_elements / cols;
    const bool tiled = cfg.hp.arch == FLOE_ARCH_QWEN35MOE && ru_ends(t->name, "linear_attn.out_proj.weight") &&
                       cfg.hp.ssm_n_group != cfg.hp.ssm_dt_rank;
    float *deqv = NULL;
    if (ty == FLOE_TYPE_Q8_0 && !tiled) {
      const size_t rb = floe_row_bytes(FLOE_TYPE_Q8_0, cols);
      const int64_t nb = cols / 32;
      uint8_t *blk = malloc(rb);
      int8_t *codes = malloc((size_t)t->n_elements);
      float *scales = malloc((size_t)(rows * nb) * sizeof(float));
      deqv = malloc((size_t)t->n_elements * sizeof(float));
      for (int64_t r = 0; r < rows; r++) {
        quant_quantize_row(FLOE_TYPE_Q8_0, v + r * cols, blk, cols, NULL);
        for (int64_t b = 0; b < nb; b++) {
          const uint8_t *p = blk + b * 34; /* block_q8_0: fp16 d, 32 x int8 */
          const float d = floe_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
          scales[r * nb + b] = d;
          for (int j = 0; j < 32; j++) {
            const int8_t q = (int8_t)p[2 + j];
            codes[r * cols + b * 32 + j] = q;
            deqv[r * cols + b * 32 + j] = d * (float)q;
          }
        }
      }
      char sn[600];
      snprintf(sn, sizeof sn, "%s.__scale", t->name);
      const int64_t sshape[2] = { rows, nb };
      rc = st_writer_add(w, t->name, ST_I8, t->n_dims, t->shape, codes, err, sizeof err);
      if (!rc) rc = st_writer_add(w, sn, ST_F32, 2, sshape, scales, err, sizeof err);
      free(blk);
      free(codes);
      free(scales);
      n_q8++;
    } else {
      /* F32 tensors, or another type (F16 fallback, tiled rows): the F32 directory holds the values */
      const st_tensor *dt = st_find(deq, t->name);
      deqv = dt ? ru_floats(dt, 0, t->n_elements) : NULL;
      if (!deqv) {
        printf("%s: not in the F32 directory\n", t->name);
        rc = -1;
      } else {
        rc = st_writer_add(w, t->name, ST_F32, t->n_dims, t->shape, deqv, err, sizeof err);
      }
      n_other++;
    }
    /* the compact values must be the F32 directory's (ru_make_gguf_deq), bit for bit */
    const st_tensor *dt = st_find(deq, t->name);
    float *ref = dt ? ru_floats(dt, 0, t->n_elements) : NULL;
    if (!ref || !deqv || memcmp(ref, deqv, (size_t)t->n_elements * sizeof(float))) n_mismatch++;
    free(ref);
    free(deqv);
    free(v);
  }
  if (rc) st_writer_abort(w);
  else rc = st_writer_finish(w, err, sizeof err);
  if (rc) printf("%s: %s\n", out_path, err);
  printf("compact: %lld Q8_0 tensors, %lld others, %lld differ from the F32 directory\n", (long long)n_q8,
         (long long)n_other, (long long)n_mismatch);
  st_model_close(st);
  st_model_close(deq);
  hf_config_free(&cfg);
  return rc || n_mismatch ? -1 : 0;
}

static int make_refs(const char *hf_dir, const char *out) {
  char deq[900], cpath[1100];
  mkdir(out, 0755);
  snprintf(deq, sizeof deq, "%s/deq_f32", out);
  if (ru_make_gguf_deq(hf_dir, deq, FLOE_TYPE_Q8_0)) return 1;
  printf("wrote %s\n", deq);
  snprintf(cpath, sizeof cpath, "%s/q8_compact.safetensors", out);
  if (make_compact(hf_dir, cpath, deq)) return 1;
  printf("wrote %s\n", cpath);
  static const char *const files[] = { "config.json", "tokenizer.json", "tokenizer_config.json", "prompts.json",
                                        "heldout_eval_u16.bin" };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
    if (copy_to(hf_dir, out, files[i])) return 1;
  copy_to(hf_dir, deq, "tokenizer.json");
  copy_to(hf_dir, deq, "tokenizer_config.json");
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * the test */

static int argmax_f(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return (int)b;
}

static int32_t *json_ints(const cJSON *a, int64_t *n) {
  *n = cJSON_GetArraySize(a);
  int32_t *v = malloc((size_t)(*n + 1) * sizeof *v);
  for (int64_t i = 0; i < *n; i++) v[i] = cJSON_GetArrayItem(a, (int)i)->valueint;
  return v;
}

static void check_prompt_hf_deq(floe_engine *e, const cJSON *p, int pi, int64_t V, double *worst) {
  char err[256];
  const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(p, "text"));
  int64_t T, G;
  int32_t *toks = json_ints(cJSON_GetObjectItem(p, "tokens"), &T);
  int32_t *gen = json_ints(cJSON_GetObjectItem(p, "greedy"), &G);
  const cJSON *top_ids = cJSON_GetObjectItem(p, "top_ids"), *top_vals = cJSON_GetObjectItem(p, "top_vals");
  const cJSON *margin = cJSON_GetObjectItem(p, "margin");
  const int64_t n = T + G;
  CHECK(text && T > 0 && G == 64 && cJSON_GetArraySize(top_ids) == n && cJSON_GetArraySize(margin) == n,
        "prompt %d: reference complete (%lld prompt tokens, %lld greedy, %d positions)", pi, (long long)T,
        (long long)G, cJSON_GetArraySize(top_ids));
  if (!text || cJSON_GetArraySize(top_ids) != n || cJSON_GetArraySize(margin) != n) goto out;

  /* tokenizer */
  int32_t *ids = NULL;
  size_t nid = 0;
  int rc = floe_tokenize(e, text, strlen(text), false, &ids, &nid, err, sizeof err);
  CHECK(rc == 0 && (int64_t)nid == T && !memcmp(ids, toks, (size_t)T * sizeof *ids),
        "prompt %d: floe's tokenizer gives HF's %lld ids (got %zu%s)", pi, (long long)T, nid, rc ? err : "");
  free(ids);

  floe_session_params sp;
  floe_session_params_init(&sp);
  sp.n_ctx = 512;
  sp.kv_f32 = true;
  sp.exact_act = true;
  floe_session *s = NULL;
  rc = floe_session_new(e, &sp, &s, err, sizeof err);
  CHECK(rc == 0, "prompt %d: session: %s", pi, rc ? err : "ok");
  if (rc) goto out;

  /* one batch over prompt + HF's continuation */
  int32_t *seq = malloc((size_t)n * sizeof *seq);
  memcpy(seq, toks, (size_t)T * sizeof *seq);
  memcpy(seq + T, gen, (size_t)G * sizeof *seq);
  float *lg = malloc((size_t)(n * V) * sizeof(float));
  rc = floe_session_eval(s, seq, (size_t)n, lg, true, err, sizeof err);
  CHECK(rc == 0, "prompt %d: batch eval: %s", pi, rc ? err : "ok");
  if (!rc) {
    double maxd = 0;
    int64_t am_same = 0, am_tie = 0;
    for (int64_t i = 0; i < n; i++) {
      const cJSON *ri = cJSON_GetArrayItem(top_ids, (int)i), *rv = cJSON_GetArrayItem(top_vals, (int)i);
      for (int k = 0; k < cJSON_GetArraySize(ri); k++) {
        const int id = cJSON_GetArrayItem(ri, k)->valueint;
        const double d = fabs((double)lg[i * V + id] - cJSON_GetArrayItem(rv, k)->valuedouble);
        maxd = fmax(maxd, isnan(d) ? INFINITY : d);
      }
      const int a = argmax_f(lg + i * V, V);
      if (a == cJSON_GetArrayItem(ri, 0)->valueint) am_same++;
      else if (cJSON_GetArrayItem(margin, (int)i)->valuedouble < MARGIN) am_tie++;
    }
    printf("  prompt %d: %lld positions, max|logit - HF| over HF's top-5 = %.3g, argmax equal %lld (+%lld ties)\n", pi,
           (long long)n, maxd, (long long)am_same, (long long)am_tie);
    *worst = fmax(*worst, maxd);
    CHECK(maxd <= LOGIT_TOL, "prompt %d: top-5 logits within %.0e of HF (got %.3g)", pi, LOGIT_TOL, maxd);
    CHECK(am_same + am_tie == n, "prompt %d: argmax equal to HF's at every position (%lld/%lld)", pi,
          (long long)am_same, (long long)n);
  }

  /* greedy: prompt, then floe's own argmax one token at a time; floe_session_argmax (found by the
   * threads while computing a decode step's logits, or over the last logits after a prompt) must
   * name the same token as the argmax of the copied logits */
  floe_session_reset(s);
  CHECK(floe_session_argmax(s) == -1, "prompt %d: floe_session_argmax of an empty session is -1", pi);
  float *l1 = malloc((size_t)V * sizeof(float));
  rc = floe_session_eval(s, toks, (size_t)T, l1, false, err, sizeof err);
  int64_t i = 0, sa_bad = 0, sa_n = 0;
  double m_div = 0;
  for (; i < G && rc == 0; i++) {
    int32_t t = argmax_f(l1, V);
    sa_bad += floe_session_argmax(s) != t;
    sa_n++;
    if (t != gen[i]) {
      m_div = cJSON_GetArrayItem(margin, (int)(T - 1 + i))->valuedouble;
      break;
    }
    rc = floe_session_eval(s, &t, 1, l1, false, err, sizeof err);
  }
  CHECK(sa_n > 1 && sa_bad == 0, "prompt %d: floe_session_argmax equals the argmax of the logits (%lld of %lld differ)",
        pi, (long long)sa_bad, (long long)sa_n);
  /* all_logits without a buffer: the last position's logits are still computed for the session */
  floe_session_reset(s);
  int rc2 = floe_session_eval(s, toks, (size_t)T, NULL, true, err, sizeof err);
  const int32_t sa_null = floe_session_argmax(s);
  floe_session_reset(s);
  if (!rc2) rc2 = floe_session_eval(s, toks, (size_t)T, l1, false, err, sizeof err);
  CHECK(rc2 == 0 && sa_null == argmax_f(l1, V), "prompt %d: eval(NULL, all_logits) leaves the last logits (%d vs %d)",
        pi, sa_null, argmax_f(l1, V));
  printf("  prompt %d: greedy %lld/%lld tokens equal to HF's\n", pi, (long long)i, (long long)G);
  CHECK(rc == 0 && (i == G || m_div < MARGIN),
        "prompt %d: greedy continuation equal to HF's token for token (%lld/%lld; HF margin at the first "
        "difference %.3g)", pi, (long long)i, (long long)G, m_div);
  free(l1);
  free(lg);
  free(seq);
  floe_session_free(s);
out:
  free(toks);
  free(gen);
}


int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--make-refs")) return make_refs(argv[2], argv[3]);
  char model_path[1200], err[256];
  snprintf(model_path, sizeof model_path, "%s", test_fixture("../../models/default.gguf"));
  if (argc == 2) snprintf(model_path, sizeof model_path, "%s", argv[1]);

  SECTION("models/default.gguf: the file");
  struct stat sb;
  CHECK(stat(model_path, &sb) == 0 && sb.st_size > 0 && (uint64_t)sb.st_size <= MAX_FILE_BYTES,
        "%s exists, <= 30 MB (%lld bytes)", model_path, (long long)(stat(model_path, &sb) ? -1 : sb.st_size));
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = model_path;
  ep.n_threads = 2;
  floe_engine *e = NULL;
  int rc = floe_engine_open(&ep, &e, err, sizeof err);
  CHECK(rc == 0, "open: %s", rc ? err : "ok");
  if (rc) return TEST_DONE();
  floe_model_info mi;
  floe_engine_info(e, &mi);
  CHECK(!strcmp(mi.arch, "qwen35moe") && mi.n_layer >= 8 && mi.n_mtp == 1 && mi.n_expert >= 32 &&
            mi.n_expert_used >= 4,
        "qwen35moe, %lld layers + %d MTP, %lld experts top-%lld", (long long)mi.n_layer, mi.n_mtp,
        (long long)mi.n_expert, (long long)mi.n_expert_used);
  CHECK(floe_token_find(e, "<|im_start|>") >= 0 && floe_token_find(e, "<think>") >= 0 &&
            floe_token_find(e, "</tool_call>") >= 0 && floe_token_is_eog(e, floe_token_find(e, "<|endoftext|>")),
        "ChatML / thinking / tool-call tokens present, <|endoftext|> ends generation");

  SECTION("the weights' own read bandwidth (floe_engine_read_bandwidth)");
  {
    double g = -1;
    char e2[256] = "";
    if (mi.copied) {
      rc = floe_engine_read_bandwidth(e, 2, 2, &g, err, sizeof err);
      CHECK(rc == 0 && g > 0, "read the copied weights: %s, %.2f GB/s", rc ? err : "ok", g);
    } else {
      rc = floe_engine_read_bandwidth(e, 2, 2, &g, err, sizeof err);
      CHECK(rc == FLOE_E_UNSUPPORTED && strstr(err, "not one resident GGUF copy"), "mapped weights: unsupported (%s)", err);
    }
    CHECK(floe_engine_read_bandwidth(e, 0, 2, &g, e2, sizeof e2) == FLOE_E_INVALID && strstr(e2, "threads must be"),
          "0 threads: %s", e2);
    CHECK(floe_engine_read_bandwidth(e, 2, 0, &g, e2, sizeof e2) == FLOE_E_INVALID, "0 passes: %s", e2);
  }

  SECTION("greedy continuations and logits vs HF transformers on the dequantized Q8_0 weights (golden.json)");
  size_t jl = 0;
  char *js = test_read_all(test_fixture("default_model/golden.json"), &jl);
  cJSON *g = js ? cJSON_Parse(js) : NULL;
  CHECK(g != NULL, "golden.json readable");
  const cJSON *prompts = g ? cJSON_GetObjectItem(g, "prompts") : NULL;
  CHECK(cJSON_GetArraySize(prompts) == 5, "5 held-out prompts (%d)", cJSON_GetArraySize(prompts));
  double worst = 0;
  int pi = 0;
  const cJSON *p;
  cJSON_ArrayForEach(p, prompts) {
    CHECK(cJSON_GetObjectItem(p, "top_ids") != NULL, "prompt %d: HF's top-5 logits on the dequantized weights", pi);
    if (cJSON_GetObjectItem(p, "top_ids")) check_prompt_hf_deq(e, p, pi, mi.n_vocab, &worst);
    pi++;
  }
  printf("  worst max|logit - HF| = %.3g\n", worst);
  cJSON_Delete(g);
  free(js);
  floe_engine_close(e);
  return TEST_DONE();
}
