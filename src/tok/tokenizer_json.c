/* The one reader of Hugging Face tokenizer.json files. The runtime tokenizer (tok_load_json,
 * tokenizer.c) and the GGUF writers (synth_vocab_from_tokenizer_json: floe convert, floe synth
 * --tokenizer) both take their tokens, types, merges and special ids from tok_json_parse, so a
 * model read from its HF directory and the GGUF floe writes from it agree token for token. The
 * rules (tokenizer.h says them once) follow llama.cpp's converter, whose GGUFs floe must match.
 *
 * Ownership: a tok_json keeps the parsed cJSON trees; every string it points to lives in them
 * (or in its own small arrays) until tok_json_free. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tok/tokenizer.h"

#define TOKJ_MAX_VOCAB (1 << 24) /* sanity bound on ids from files */

/* The Split patterns as they appear in Qwen's tokenizer.json files. */
static const char *const JSON_RE_QWEN2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const JSON_RE_QWEN35 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool tok_text_looks_control(const char *s, size_t n) {
  return n >= 4 && s[0] == '<' && s[1] == '|' && s[n - 2] == '|' && s[n - 1] == '>';
}

/* A Split pre-tokenizer (possibly inside a Sequence) and its regex: TOK_PRE_* or -1 with why. */
static int json_pre_type(const cJSON *root, const char *name, char *why, size_t whylen) {
  const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
  const cJSON *list = NULL;
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pt, "type");
  if (cJSON_IsString(ty) && strcmp(ty->valuestring, "Sequence") == 0) list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
  const cJSON *it = list ? list->child : pt;
  for (; it; it = list ? it->next : NULL) {
    const cJSON *t2 = cJSON_GetObjectItemCaseSensitive(it, "type");
    if (cJSON_IsString(t2) && strcmp(t2->valuestring, "Split") == 0) {
      const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(it, "pattern"), "Regex");
      if (!cJSON_IsString(re)) break;
      if (strcmp(re->valuestring, JSON_RE_QWEN2) == 0) return TOK_PRE_QWEN2;
      if (strcmp(re->valuestring, JSON_RE_QWEN35) == 0) return TOK_PRE_QWEN35;
      char s1[64];
      snprintf(why, whylen, "%s: pre-tokenizer regex '%s...' is not Qwen's", name, floe_show(s1, sizeof s1, re->valuestring));
      return -1;
    }
    if (!list) break;
  }
  snprintf(why, whylen, "%s: no Split regex pre-tokenizer found (only Qwen's byte-level BPE is supported)", name);
  return -1;
}

/* A non-negative integer id below the bound, else -1. */
static int64_t json_id(const cJSON *j) {
  if (!cJSON_IsNumber(j)) return -1;
  const double d = j->valuedouble;
  if (!(d >= 0 && d < TOKJ_MAX_VOCAB) || d != (double)(int64_t)d) return -1;
  return (int64_t)d;
}

/* A tokenizer_config.json special-token entry: "text" or {"content": "text"}. */
static const char *special_text(const cJSON *j) {
  if (cJSON_IsString(j)) return j->valuestring;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
  return cJSON_IsString(c) ? c->valuestring : NULL;
}

typedef struct text_id { const char *s; int32_t id; } text_id;
static int cmp_text(const void *a, const void *b) {
  const text_id *x = a, *y = b;
  const int c = strcmp(x->s, y->s);
  return c ? c : (x->id > y->id) - (x->id < y->id);
}

/* Id of the token with exactly this text among the named ones, -1 if none (linear: used a few
 * times per load). */
static int32_t find_text(const tok_json *j, const char *s) {
  if (!s) return -1;
  for (int32_t i = j->n - 1; i >= 0; i--) /* added tokens sit at the end */
    if (j->text[i] && !strcmp(j->text[i], s)) return i;
  return -1;
}

void tok_json_free(tok_json *j) {
  if (!j) return;
  free(j->text);
  free(j->type);
  free(j->merges);
  free(j->chat_template);
  cJSON_Delete((cJSON *)j->root);
  memset(j, 0, sizeof *j);
}

static void sibling(char *out, size_t n, const char *path, const char *name) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(out, n, "%s", name);
  else snprintf(out, n, "%.*s/%s", (int)(slash - path), path, name);
}

int tok_json_parse(const char *json, size_t len, const char *name, const char *path, tok_json *j, char *err,
                   size_t errlen) {
  memset(j, 0, sizeof *j);
  j->eos = j->pad = j->bos = -1;
  char nm[200];
  floe_show(nm, sizeof nm, name);
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (!root) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: not valid JSON", nm);
  j->root = root;
  int rc = 0;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE") != 0)) {
    rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: model.type is not BPE", nm);
    goto fail;
  }
  if (!cJSON_IsObject(vocab) || (merges && !cJSON_IsArray(merges)) || (added && !cJSON_IsArray(added))) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: model.vocab (object), model.merges or added_tokens (arrays) malformed or missing", nm);
    goto fail;
  }
  j->pre = json_pre_type(root, nm, j->pre_why, sizeof j->pre_why);
  /* n = 1 + the largest id */
  int64_t n = 0;
  for (const cJSON *e = vocab->child; e; e = e->next) {
    const int64_t id = json_id(e);
    if (id < 0 || !e->string) {
      char s1[48];
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: vocab entry '%s' has a bad id", nm,
                    e->string ? floe_show(s1, sizeof s1, e->string) : "?");
      goto fail;
    }
    if (id + 1 > n) n = id + 1;
  }
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
    const int64_t id = json_id(cJSON_GetObjectItemCaseSensitive(a, "id"));
    if (id < 0 || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(a, "content"))) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: an added_tokens entry lacks a valid id or content", nm);
      goto fail;
    }
    if (id + 1 > n) n = id + 1;
  }
  j->n = (int32_t)n;
  j->text = calloc((size_t)(n ? n : 1), sizeof *j->text);
  j->type = calloc((size_t)(n ? n : 1), 1);
  if (!j->text || !j->type) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", nm);
    goto fail;
  }
  for (const cJSON *e = vocab->child; e; e = e->next) {
    const int64_t id = json_id(e);
    if (j->text[id]) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: id %lld appears twice in model.vocab", nm, (long long)id);
      goto fail;
    }
    j->text[id] = e->string;
    j->type[id] = TOK_TYPE_NORMAL;
  }
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
    const int64_t id = json_id(cJSON_GetObjectItemCaseSensitive(a, "id"));
    const char *c = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
    const bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
    /* an added token may repeat its own vocab entry (same id, same text): it becomes added */
    if (j->text[id] && (j->type[id] != TOK_TYPE_NORMAL || strcmp(j->text[id], c))) {
      char s1[48], s2[48];
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: id %lld used by both '%s' and '%s'", nm, (long long)id,
                    floe_show(s1, sizeof s1, j->text[id]), floe_show(s2, sizeof s2, c));
      goto fail;
    }
    j->text[id] = c;
    j->type[id] = special || tok_text_looks_control(c, strlen(c)) ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
  }
  /* one token per text: tok_find, the GGUF's token list and llama.cpp's loader rely on it */
  {
    text_id *ord = malloc((size_t)(n ? n : 1) * sizeof *ord);
    if (!ord) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", nm);
      goto fail;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < j->n; i++)
      if (j->text[i]) ord[k++] = (text_id){j->text[i], i};
    qsort(ord, (size_t)k, sizeof *ord, cmp_text);
    for (int32_t i = 1; i < k && !rc; i++)
      if (!strcmp(ord[i].s, ord[i - 1].s)) {
        char s1[48];
        rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: token '%s' appears twice (ids %d and %d)", nm,
                      floe_show(s1, sizeof s1, ord[i].s), ord[i - 1].id, ord[i].id);
      }
    free(ord);
    if (rc) goto fail;
  }
  /* merges: "a b" strings or [a, b] pairs, in rank order */
  const int n_merges = merges ? cJSON_GetArraySize(merges) : 0;
  if (n_merges > TOKJ_MAX_VOCAB * 4) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: %d merges is absurd", nm, n_merges);
    goto fail;
  }
  j->merges = calloc((size_t)(n_merges ? n_merges : 1), sizeof *j->merges);
  if (!j->merges) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", nm);
    goto fail;
  }
  for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next) {
    tok_json_merge *mg = &j->merges[j->n_merges];
    if (cJSON_IsString(m)) {
      const char *s = m->valuestring, *sp = strchr(s, ' ');
      if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
        char s1[48];
        rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %d '%s' is not of the form 'a b'", nm, j->n_merges,
                      floe_show(s1, sizeof s1, s));
        goto fail;
      }
      mg->a = s, mg->na = (size_t)(sp - s), mg->b = sp + 1, mg->nb = strlen(sp + 1);
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
               cJSON_IsString(m->child->next)) {
      mg->a = m->child->valuestring, mg->na = strlen(mg->a);
      mg->b = m->child->next->valuestring, mg->nb = strlen(mg->b);
    } else {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: merge %d is neither \"a b\" nor [a, b]", nm, j->n_merges);
      goto fail;
    }
    j->n_merges++;
  }
  /* special ids and the chat template: tokenizer_config.json (and chat_template.jinja) beside path */
  cJSON *cfg = NULL;
  if (path) {
    char p[4096], ignored[256]; /* both files are optional: a missing or unreadable one is skipped */
    char *cfg_text = NULL;
    size_t cl = 0;
    sibling(p, sizeof p, path, "tokenizer_config.json");
    floe_read_file(p, (size_t)64 << 20, &cfg_text, &cl, ignored, sizeof ignored);
    cfg = cfg_text ? cJSON_ParseWithLength(cfg_text, cl) : NULL;
    free(cfg_text);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(tmpl)) j->chat_template = strdup(tmpl->valuestring);
    if (!j->chat_template) {
      sibling(p, sizeof p, path, "chat_template.jinja");
      floe_read_file(p, (size_t)16 << 20, &j->chat_template, NULL, ignored, sizeof ignored);
    }
  }
  j->eos = find_text(j, special_text(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token")));
  if (j->eos < 0) j->eos = find_text(j, "<|im_end|>");
  if (j->eos < 0) j->eos = find_text(j, "<|endoftext|>");
  j->pad = find_text(j, special_text(cJSON_GetObjectItemCaseSensitive(cfg, "pad_token")));
  if (j->pad < 0) j->pad = find_text(j, "<|endoftext|>");
  j->bos = find_text(j, special_text(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token")));
  if (j->bos < 0) j->bos = find_text(j, "<|endoftext|>");
  cJSON_Delete(cfg);
  return 0;
fail:
  tok_json_free(j);
  return rc;
}
