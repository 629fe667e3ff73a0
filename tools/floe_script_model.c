/* floe_script_model: writes a tiny but valid qwen3moe / qwen35moe GGUF whose greedy output is a
 * scripted text, chosen by "trigger" tokens in the prompt. Used by the server tests to make a real
 * model really generate <think> blocks and Qwen3 JSON / Qwen3.5 XML tool calls.
 *
 *   floe_script_model --arch qwen3moe|qwen35moe -o OUT.gguf [--template FILE.jinja]
 *                     --script 'TRIGGER=TEXT' [--script ...]
 *
 * TRIGGER is the exact text of a special token of the vocabulary (e.g. "<tool_response>",
 * "<|box_start|>"); TEXT may use \n \t \\ escapes. Scripts listed first win when several
 * triggers are in the prompt. Without a trigger the model answers <|im_end|> at once.
 *
 * How (the forward pass of src/model/layers.c with weights chosen by hand, all F32):
 *   - The vocabulary is floe synth's generated one plus one new NORMAL token per piece of each
 *     script (pieces of 2..6 bytes, each a string no other token has, so BPE never produces them
 *     from text but their pieces decode to the script). Each script is a chain of distinct tokens.
 *   - Embedding of token t: 1 at dim 0 (a constant "bias" dim), plus 1 at the state dim of t
 *     (its own dim for script tokens, one shared GEN dim for every other token), plus 1 at dim
 *     1+b when t is the trigger of script b.
 *   - Every layer output is zero (attention / GDN out projections, experts' and shared expert's
 *     down projections) except one full-attention layer: head 0's query reads dim 0 (the same
 *     for every token); keys read the trigger dims in the rotation-free last two dims of the head,
 *     direction (cos, sin) of an angle that grows with the script index, so after q/k RMSNorm
 *     (weights 4) the trigger of the first-listed script scores 128, the next 102, ... and
 *     other tokens 0; values copy the trigger dims and the output projection writes them to dim
 *     8+b. So the last position carries "which trigger is in the prompt".
 *   - lm_head: a script token's state dim votes (30) for the next token of its script (the last
 *     piece votes for <|im_end|>); dim 8+b votes (5) for the first piece of script b; the GEN dim
 *     votes (1) for <|im_end|>. After the final RMSNorm each present dim is ~sqrt(256/3), so the
 *     chain wins by a wide margin at every step and the result does not depend on rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "format/gguf.h"
#include "model/model_meta.h"
#include "quant/quant.h"
#include "tok/synth_vocab.h"
#include "tok/tokenizer.h"

#define MAX_SCRIPTS 5
#define D_ONE 0
#define D_TRIG 1 /* 1..MAX_SCRIPTS */
#define D_F 8    /* 8..8+MAX_SCRIPTS-1: attention output */
#define D_GEN 16
#define D_STATE 17

static int fail(const char *fmt, const char *a) {
  fprintf(stderr, "floe_script_model: ");
  fprintf(stderr, fmt, a);
  fputc('\n', stderr);
  return 1;
}

static char *unescape(const char *s) {
  char *o = malloc(strlen(s) + 1), *p = o;
  if (!o) return NULL;
  for (; *s; s++) {
    if (*s == '\\' && s[1]) {
      s++;
      *p++ = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s;
    } else *p++ = *s;
  }
  *p = 0;
  return o;
}

static int64_t find_token(const synth_vocab *v, const char *s) {
  for (uint64_t i = 0; i < v->n; i++)
    if (!strcmp(v->tokens[i], s)) return (int64_t)i;
  return -1;
}

static int add_token(synth_vocab *v, char *s) {
  char **t = realloc(v->tokens, (v->n + 1) * sizeof *t);
  if (!t) return -1;
  v->tokens = t;
  int32_t *ty = realloc(v->types, (v->n + 1) * sizeof *ty);
  if (!ty) return -1;
  v->types = ty;
  v->tokens[v->n] = s;
  v->types[v->n] = SYNTH_TOK_NORMAL;
  v->n++;
  return 0;
}

typedef struct script {
  int64_t trigger;
  int64_t *toks; /* piece tokens, then <|im_end|> */
  size_t n;
} script;

int main(int argc, char **argv) {
  const char *arch = NULL, *out = NULL, *tmpl_path = NULL;
  const char *specs[MAX_SCRIPTS];
  int n_scripts = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = argv[++i];
    else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--template") && i + 1 < argc) tmpl_path = argv[++i];
    else if (!strcmp(argv[i], "--script") && i + 1 < argc && n_scripts < MAX_SCRIPTS) specs[n_scripts++] = argv[++i];
    else return fail("bad argument '%s'", argv[i]);
  }
  if (!arch || !out || !n_scripts) return fail("%s", "usage: --arch qwen3moe|qwen35moe -o OUT --script 'TRIGGER=TEXT'");
  bool q35 = !strcmp(arch, "qwen35moe");
  if (!q35 && strcmp(arch, "qwen3moe")) return fail("unknown arch '%s'", arch);

  char err[512];
  floe_hparams hp;
  if (model_preset(q35 ? "tiny-qwen35moe" : "tiny-qwen3moe", &hp, err, sizeof err)) return fail("%s", err);
  if (!q35 && model_hparams_truncate(&hp, 1, err, sizeof err)) return fail("%s", err);
  synth_vocab v = {0};
  if (synth_vocab_generate(1024, &v, err, sizeof err)) return fail("%s", err);
  if (tmpl_path) {
    char *t;
    if (floe_read_file(tmpl_path, (size_t)16 << 20, &t, NULL, err, sizeof err)) return fail("%s", err);
    free(v.chat_template);
    v.chat_template = t;
  }
  const int64_t im_end = find_token(&v, "<|im_end|>");
  if (im_end < 0) return fail("%s", "no <|im_end|> in the vocabulary");

  /* scripts -> new tokens */
  script sc[MAX_SCRIPTS] = {{0}};
  static const int lens[] = {3, 5, 2, 4, 6};
  int li = 0;
  for (int s = 0; s < n_scripts; s++) {
    const char *eq = strchr(specs[s], '=');
    if (!eq || eq == specs[s]) return fail("--script needs TRIGGER=TEXT, got '%s'", specs[s]);
    char *trig = strndup(specs[s], (size_t)(eq - specs[s]));
    sc[s].trigger = find_token(&v, trig);
    if (sc[s].trigger < 0) return fail("trigger '%s' is not a token", trig);
    free(trig);
    char *text = unescape(eq + 1);
    size_t tl = strlen(text);
    sc[s].toks = calloc(tl + 1, sizeof *sc[s].toks);
    size_t *starts = calloc(tl + 1, sizeof *starts); /* byte offset of each piece */
    for (size_t pos = 0; pos < tl;) {
      size_t len = (size_t)lens[li++ % 5];
      char *enc = NULL;
      for (;; len++) {
        if (pos + len > tl) len = tl - pos;
        free(enc);
        enc = tok_bytelevel_encode(text + pos, len);
        if (find_token(&v, enc) < 0) break;
        if (pos + len == tl) {
          /* the tail is an existing token: merge it into the previous pieces until unique */
          while (find_token(&v, enc) >= 0) {
            free(enc);
            if (!sc[s].n) return fail("cannot make unique tokens for '%s'", eq + 1);
            free(v.tokens[--v.n]);
            pos = starts[--sc[s].n];
            len = tl - pos;
            enc = tok_bytelevel_encode(text + pos, len);
          }
          break;
        }
      }
      starts[sc[s].n] = pos;
      sc[s].toks[sc[s].n++] = (int64_t)v.n;
      if (add_token(&v, enc)) return fail("%s", "out of memory");
      pos += len;
    }
    free(starts);
    sc[s].toks[sc[s].n++] = im_end;
    free(text);
  }
  const int64_t n_base = 1024, n_new = (int64_t)v.n - n_base;
  hp.n_vocab = (int64_t)v.n;
  const int64_t E = hp.n_embd, hd = hp.head_dim;
  if (D_STATE + n_new > E) return fail("%s", "scripts too long for the embedding width");
  if (model_hparams_validate(&hp, err, sizeof err)) return fail("%s", err);

  model_tensor_desc *d = NULL;
  size_t nt = 0;
  if (model_tensor_list(&hp, &d, &nt, err, sizeof err)) return fail("%s", err);
  int64_t att_layer = -1; /* the first full-attention layer */
  for (int64_t l = 0; l < hp.n_layer && att_layer < 0; l++)
    if (!hp.recurrent[l]) att_layer = l;
  if (att_layer < 0) return fail("%s", "no full-attention layer");

  gguf_writer *w;
  if (gguf_writer_open(out, &w, err, sizeof err)) return fail("%s", err);
  model_hparams_to_gguf(w, &hp);
  gguf_writer_add_str(w, "general.name", "floe scripted test model");
  synth_vocab_to_gguf(w, &v, q35 ? "qwen35" : "qwen2");
  for (size_t i = 0; i < nt; i++) gguf_writer_add_tensor(w, d[i].name, FLOE_TYPE_F32, d[i].n_dims, d[i].ne);
  const float gate = q35 ? 0.5f : 1.0f; /* sigmoid(0) of the output gate */
  const float vmag = sqrtf((float)E / 3.0f);
  for (size_t i = 0; i < nt; i++) {
    const model_tensor_desc *t = &d[i];
    size_t n = (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    float *x = calloc(n, sizeof *x);
    if (!x) return fail("%s", "out of memory");
    const int64_t ne0 = t->ne[0];
    const bool att = t->layer == att_layer;
    if (t->flags & MODEL_TF_NORM) for (size_t k = 0; k < n; k++) x[k] = 1.0f;
    switch (t->kind) {
    case MODEL_K_SSM_A: for (size_t k = 0; k < n; k++) x[k] = -1.0f; break;
    case MODEL_K_SSM_NORM: for (size_t k = 0; k < n; k++) x[k] = 1.0f; break;
    case MODEL_K_TOKEN_EMBD:
      for (int64_t tok = 0; tok < hp.n_vocab; tok++) {
        float *row = x + tok * ne0;
        row[D_ONE] = 1.0f;
        if (tok >= n_base) row[D_STATE + (tok - n_base)] = 1.0f;
        else row[D_GEN] = 1.0f;
        for (int s = 0; s < n_scripts; s++)
          if (sc[s].trigger == tok) row[D_TRIG + s] = 1.0f;
      }
      break;
    case MODEL_K_OUTPUT:
      x[im_end * ne0 + D_GEN] = 1.0f;
      for (int s = 0; s < n_scripts; s++) {
        x[sc[s].toks[0] * ne0 + D_F + s] = 5.0f;
        for (size_t k = 0; k + 1 < sc[s].n; k++) x[sc[s].toks[k + 1] * ne0 + D_STATE + (sc[s].toks[k] - n_base)] = 30.0f;
      }
      break;
    case MODEL_K_ATTN_Q:
      if (att) x[(hd - 1) * ne0 + D_ONE] = 1.0f; /* head 0 (its q half when gated), last dim */
      break;
    case MODEL_K_ATTN_K:
      if (att)
        for (int s = 0; s < n_scripts; s++) {
          const float c = 1.0f - 0.2f * (float)s, sn = sqrtf(1.0f - c * c);
          x[(hd - 1) * ne0 + D_TRIG + s] = c;
          x[(hd - 2) * ne0 + D_TRIG + s] = sn;
        }
      break;
    case MODEL_K_ATTN_V:
      if (att)
        for (int s = 0; s < n_scripts; s++) x[s * ne0 + D_TRIG + s] = 1.0f;
      break;
    case MODEL_K_ATTN_OUT:
      if (att)
        for (int s = 0; s < n_scripts; s++) x[(D_F + s) * ne0 + s] = 1.0f / (vmag * gate);
      break;
    case MODEL_K_ATTN_Q_NORM:
      if (att) x[hd - 1] = 4.0f;
      break;
    case MODEL_K_ATTN_K_NORM:
      if (att) x[hd - 1] = x[hd - 2] = 4.0f;
      break;
    default: break;
    }
    int rc = gguf_writer_write_data(w, x, n * sizeof *x);
    free(x);
    if (rc) break;
  }
  if (gguf_writer_finish_err(w, err, sizeof err)) return fail("%s", err);
  printf("%s: %s, %lld tokens (%lld script pieces), %d scripts\n", out, arch, (long long)hp.n_vocab, (long long)n_new,
         n_scripts);
  for (int s = 0; s < n_scripts; s++) free(sc[s].toks);
  free(d);
  synth_vocab_free(&v);
  return 0;
}
