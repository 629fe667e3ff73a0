/* floe quantize (quantize_model): same-type copies are byte-identical, requantized tensors equal
 * the reference quantizer applied to the exactly dequantized source, mixed expert / output types
 * land where asked, every writable type round trips, a lower-precision source is refused unless
 * forced (and nothing is left behind), metadata is copied (rope sections fixed), bad input fails
 * cleanly. Models come from `floe synth` (FLOE_BIN). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert.h"
#include "format/gguf.h"
#include "model/model_meta.h"
#include "quant/quant.h"
#include "test.h"

static const char *bin;

static bool synth(const char *preset, const char *type, const char *path) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "\"%s\" synth --preset %s --type %s --seed 3 -o \"%s\" >/dev/null", bin, preset, type, path);
  return system(cmd) == 0;
}

static int quantize(const char *in, const char *out, int type, int expert, int output, bool force, char *err, size_t n) {
  quantize_opts o = {.in_path = in, .out_path = out, .type = type, .expert_type = expert, .output_type = output,
                     .force = force, .n_threads = 2};
  return quantize_model(&o, NULL, err, n);
}

static const gguf_tensor *tensor(const gguf_file *g, const char *name) { return gguf_find_tensor(g, name); }

/* Every tensor of b is a's tensor of the same name, shape and (when same_type) bytes. */
static void same_tensors(const gguf_file *a, const gguf_file *b, const char *what) {
  size_t bad = 0;
  for (uint64_t i = 0; i < a->n_tensors; i++) {
    char nm[128];
    snprintf(nm, sizeof nm, "%.*s", (int)a->tensors[i].name.len, a->tensors[i].name.ptr);
    const gguf_tensor *t = tensor(b, nm);
    if (!t || t->type != a->tensors[i].type || t->size != a->tensors[i].size ||
        memcmp(t->data, a->tensors[i].data, t->size))
      bad++;
  }
  CHECK(a->n_tensors == b->n_tensors && bad == 0, "%s: %llu tensors byte-identical (%zu differ)", what,
        (unsigned long long)a->n_tensors, bad);
}

/* The requantized tensor equals quantize(dequantize(source)) row by row. */
static void check_requant(const gguf_file *src, const gguf_file *dst, const char *name) {
  const gguf_tensor *s = tensor(src, name), *d = tensor(dst, name);
  if (!s || !d) {
    CHECK(0, "%s present in both", name);
    return;
  }
  const int64_t cols = s->ne[0], rows = (int64_t)(s->size / floe_row_bytes(s->type, cols));
  const size_t orow = floe_row_bytes(d->type, cols);
  float *x = malloc((size_t)cols * sizeof *x);
  uint8_t *q = malloc(orow);
  size_t bad = 0;
  for (int64_t r = 0; r < rows; r++) {
    quant_dequant_row(s->type, s->data + (size_t)r * floe_row_bytes(s->type, cols), x, cols);
    quant_quantize_row(d->type, x, q, cols, NULL);
    if (memcmp(q, d->data + (size_t)r * orow, orow)) bad++;
  }
  CHECK(bad == 0, "%s %s -> %s: %lld rows equal the reference requantization (%zu differ)", name,
        floe_type_info(s->type)->name, floe_type_info(d->type)->name, (long long)rows, bad);
  free(x);
  free(q);
}

static void test_copy_and_meta(void) {
  SECTION("same type: byte-identical tensors, metadata copied");
  const char *a = test_tmp("q_src_q8.gguf"), *b = test_tmp("q_out.gguf");
  char err[512] = "";
  CHECK(synth("tiny-qwen35moe", "q8_0", a), "synth q8_0");
  int rc = quantize(a, b, FLOE_TYPE_Q8_0, -1, -1, false, err, sizeof err);
  CHECK(rc == 0, "quantize q8_0 -> q8_0 (%s)", err);
  gguf_file *ga = NULL, *gb = NULL;
  if (gguf_open(a, &ga, err, sizeof err) || gguf_open(b, &gb, err, sizeof err)) {
    CHECK(0, "open: %s", err);
    goto out;
  }
  same_tensors(ga, gb, "q8_0 -> q8_0");
  size_t missing = 0;
  for (uint64_t i = 0; i < ga->n_kv; i++) {
    char k[256];
    snprintf(k, sizeof k, "%.*s", (int)ga->kv[i].key.len, ga->kv[i].key.ptr);
    const gguf_kv *kv = gguf_find_kv(gb, k);
    if (!kv || kv->val.type != ga->kv[i].val.type) missing++;
  }
  CHECK(missing == 0, "every key of the source is in the output with its type (%zu missing)", missing);
  uint32_t ft = 0;
  CHECK(gguf_get_u32(gb, "general.file_type", &ft) == 0 && ft == 7, "general.file_type 7 (MOSTLY_Q8_0): %u", ft);
  uint32_t at;
  uint64_t n;
  const gguf_value *tok = gguf_get_arr(gb, "tokenizer.ggml.tokens", &at, &n);
  CHECK(tok && n == 1024, "tokenizer copied (%llu tokens)", (unsigned long long)n);
out:
  if (ga) gguf_close(ga);
  if (gb) gguf_close(gb);
}

static void test_mixed(void) {
  SECTION("mixed types: experts q3_K, output q6_K, the rest q8_0, from f32");
  const char *a = test_tmp("q_src_f32.gguf"), *b = test_tmp("q_mixed.gguf");
  char err[512] = "";
  CHECK(synth("tiny-qwen35moe", "f32", a), "synth f32");
  quantize_stats st;
  quantize_opts o = {.in_path = a, .out_path = b, .type = FLOE_TYPE_Q8_0, .expert_type = FLOE_TYPE_Q3_K,
                     .output_type = FLOE_TYPE_Q6_K, .n_threads = 3};
  int rc = quantize_model(&o, &st, err, sizeof err);
  CHECK(rc == 0 && st.n_requantized > 0 && st.n_copied > 0 && st.n_requantized + st.n_copied == st.n_tensors,
        "quantize (%s): %llu requantized, %llu copied", err, (unsigned long long)st.n_requantized,
        (unsigned long long)st.n_copied);
  gguf_file *ga = NULL, *gb = NULL;
  if (gguf_open(a, &ga, err, sizeof err) || gguf_open(b, &gb, err, sizeof err)) {
    CHECK(0, "open: %s", err);
    goto out;
  }
  floe_hparams hp;
  CHECK(model_hparams_from_gguf(gb, &hp, err, sizeof err) == 0, "output hparams read (%s)", err);
  model_tensor_desc *d = NULL;
  size_t nd = 0;
  model_tensor_list(&hp, &d, &nd, err, sizeof err);
  size_t wrong = 0;
  for (size_t i = 0; i < nd; i++) {
    const gguf_tensor *t = tensor(gb, d[i].name);
    uint32_t want = FLOE_TYPE_Q8_0;
    if (d[i].flags & (MODEL_TF_VECTOR | MODEL_TF_F32)) want = FLOE_TYPE_F32;
    else if (d[i].flags & (MODEL_TF_EXPERTS | MODEL_TF_SHEXP)) want = FLOE_TYPE_Q3_K;
    else if (d[i].kind == MODEL_K_OUTPUT) want = FLOE_TYPE_Q6_K;
    if (!t || t->type != want) {
      if (wrong++ < 3) printf("  %s: %s, want %s\n", d[i].name, t ? floe_type_info(t->type)->name : "missing",
                              floe_type_info(want)->name);
    }
  }
  CHECK(nd == gb->n_tensors && wrong == 0, "every tensor has its asked type (%zu wrong of %zu)", wrong, nd);
  free(d);
  check_requant(ga, gb, "blk.0.ffn_down_exps.weight");
  check_requant(ga, gb, "blk.3.attn_q.weight");
  check_requant(ga, gb, "output.weight");
  check_requant(ga, gb, "blk.1.ffn_gate_shexp.weight");
  const gguf_tensor *ta = tensor(ga, "blk.0.attn_norm.weight"), *tb = tensor(gb, "blk.0.attn_norm.weight");
  CHECK(ta && tb && tb->type == FLOE_TYPE_F32 && !memcmp(ta->data, tb->data, ta->size), "norms copied as f32");

  SECTION("requantize down from q8_0 (allowed)");
  const char *c = test_tmp("q_q4.gguf");
  rc = quantize(test_tmp("q_src_q8.gguf"), c, FLOE_TYPE_Q4_K, -1, -1, false, err, sizeof err);
  CHECK(rc == 0, "q8_0 -> q4_K (%s)", err);
  gguf_file *gc = NULL, *g8 = NULL;
  if (!rc && !gguf_open(c, &gc, err, sizeof err) && !gguf_open(test_tmp("q_src_q8.gguf"), &g8, err, sizeof err))
    check_requant(g8, gc, "blk.2.ffn_up_exps.weight");
  if (gc) gguf_close(gc);
  if (g8) gguf_close(g8);
out:
  if (ga) gguf_close(ga);
  if (gb) gguf_close(gb);
}

static bool temp_left(const char *out) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "ls \"%s\".tmp.* >/dev/null 2>&1", out);
  return system(cmd) == 0;
}

static void test_refuse(void) {
  SECTION("lower-precision source refused unless forced");
  const char *a = test_tmp("q_q4.gguf"), *b = test_tmp("q_up.gguf");
  char err[512] = "";
  unlink(b);
  int rc = quantize(a, b, FLOE_TYPE_Q8_0, -1, -1, false, err, sizeof err);
  CHECK(rc == FLOE_E_INVALID && strstr(err, "q4_K") && strstr(err, "--force"), "q4_K -> q8_0 refused: %s", err);
  CHECK(access(b, F_OK) != 0 && !temp_left(b), "nothing written");
  rc = quantize(a, b, FLOE_TYPE_Q8_0, -1, -1, true, err, sizeof err);
  CHECK(rc == 0 && access(b, F_OK) == 0 && !temp_left(b), "with force: written (%s)", rc ? err : "");
  rc = quantize(a, b, FLOE_TYPE_Q2_K, -1, -1, false, err, sizeof err);
  CHECK(rc == 0, "q4_K -> q2_K allowed (%s)", rc ? err : "");

  SECTION("bad input");
  rc = quantize(test_tmp("does_not_exist.gguf"), b, FLOE_TYPE_Q8_0, -1, -1, false, err, sizeof err);
  CHECK(rc == FLOE_E_IO && strstr(err, "does_not_exist"), "missing input: %s", err);
  const char *junk = test_tmp("q_junk.gguf");
  FILE *f = fopen(junk, "wb");
  if (f) {
    fputs("this is not a gguf file at all, just text", f);
    fclose(f);
  }
  rc = quantize(junk, b, FLOE_TYPE_Q8_0, -1, -1, false, err, sizeof err);
  CHECK(rc == FLOE_E_FORMAT, "not a GGUF: %s", err);
  rc = quantize(a, b, FLOE_TYPE_IQ2_XXS, -1, -1, false, err, sizeof err);
  CHECK(rc == FLOE_E_INVALID, "a type floe cannot write: %s", err);
  rc = quantize(a, test_tmp("no_such_dir/out.gguf"), FLOE_TYPE_Q2_K, -1, -1, false, err, sizeof err);
  CHECK(rc == FLOE_E_IO, "unwritable output: %s", err);
}

static void test_every_type(void) {
  SECTION("every type floe writes, as --type and --expert-type, from f32");
  const char *a = test_tmp("q_src_f32.gguf"), *b = test_tmp("q_every.gguf");
  int n = 0, ok = 0;
  for (int t = 0; t < FLOE_TYPE_COUNT_GGML; t++) {
    if (!convert_type_ok(t)) continue;
    n++;
    char err[512] = "";
    int rc = quantize(a, b, t, t, -1, true, err, sizeof err);
    gguf_file *g = NULL;
    floe_hparams hp;
    bool good = rc == 0 && gguf_open(b, &g, err, sizeof err) == 0 && model_hparams_from_gguf(g, &hp, err, sizeof err) == 0;
    const gguf_tensor *e = good ? tensor(g, "blk.0.ffn_gate_exps.weight") : NULL;
    const gguf_tensor *q = good ? tensor(g, "blk.3.attn_q.weight") : NULL;
    good = good && e && q && e->type == (uint32_t)t && q->type == (uint32_t)t;
    if (g) gguf_close(g);
    if (good) ok++;
    else printf("  type %s: %s\n", floe_type_info((uint32_t)t)->name, err);
  }
  CHECK(n >= 16 && ok == n, "%d of %d writable types quantize and read back with the asked type", ok, n);
}

/* Writes a copy of src whose qwen35moe.rope.dimension_sections is [0,0,0,0], as older floe
 * versions wrote it. */
static int zero_sections_copy(const char *src, const char *dst) {
  gguf_file *g;
  gguf_writer *w;
  char err[256];
  if (gguf_open(src, &g, err, sizeof err)) return -1;
  if (gguf_writer_open(dst, &w, err, sizeof err)) { gguf_close(g); return -1; }
  for (uint64_t i = 0; i < g->n_kv; i++)
    if (!gguf_str_eq(g->kv[i].key, "qwen35moe.rope.dimension_sections")) gguf_writer_add_kv(w, &g->kv[i]);
  static const int32_t z[4] = {0, 0, 0, 0};
  gguf_writer_add_arr(w, "qwen35moe.rope.dimension_sections", GGUF_TYPE_INT32, z, 4);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    char nm[128];
    snprintf(nm, sizeof nm, "%.*s", (int)g->tensors[i].name.len, g->tensors[i].name.ptr);
    gguf_writer_add_tensor(w, nm, g->tensors[i].type, g->tensors[i].n_dims, g->tensors[i].ne);
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) gguf_writer_write_data(w, g->tensors[i].data, g->tensors[i].size);
  int rc = gguf_writer_finish(w);
  gguf_close(g);
  return rc;
}

static void test_sections(void) {
  SECTION("an old [0,0,0,0] rope.dimension_sections is written as a valid split");
  char err[512] = "";
  const char *old = test_tmp("q_old_sections.gguf"), *b = test_tmp("q_sections.gguf");
  CHECK(zero_sections_copy(test_tmp("q_src_q8.gguf"), old) == 0, "old-style copy written");
  int rc = quantize(old, b, FLOE_TYPE_Q8_0, -1, -1, false, err, sizeof err);
  CHECK(rc == 0, "q8_0 -> q8_0 (%s)", err);
  gguf_file *g = NULL, *g0 = NULL;
  floe_hparams hp;
  if (!rc && !gguf_open(b, &g, err, sizeof err) && !model_hparams_from_gguf(g, &hp, err, sizeof err)) {
    CHECK(model_rope_sections_valid(hp.rope_sections, hp.n_rot, hp.head_dim) && hp.rope_sections[0] == 3 &&
              hp.rope_sections[1] == 3 && hp.rope_sections[2] == 2 && hp.rope_sections[3] == 0,
          "sections [%d,%d,%d,%d]: the canonical split of %lld pairs", hp.rope_sections[0], hp.rope_sections[1],
          hp.rope_sections[2], hp.rope_sections[3], (long long)hp.n_rot / 2);
    if (!gguf_open(old, &g0, err, sizeof err)) same_tensors(g0, g, "tensors of the old file");
  }
  if (g) gguf_close(g);
  if (g0) gguf_close(g0);
}

int main(void) {
  bin = getenv("FLOE_BIN");
  if (!bin) {
    printf("FLOE_BIN not set\n0 passed, 1 failed\n");
    return 1;
  }
  test_copy_and_meta();
  test_mixed();
  test_refuse();
  test_every_type();
  test_sections();
  return TEST_DONE();
}
