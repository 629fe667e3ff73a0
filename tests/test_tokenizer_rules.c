/* One tokenizer.json parser, one rule set: the runtime tokenizer (tok_load_json) and the GGUF
 * writers' reader (synth_vocab_from_tokenizer_json) read the same file into the same token
 * types and special ids (tokenizer.h states the rules):
 *   - an added token is CONTROL when "special": true or when it looks like <|...|>, else
 *     USER_DEFINED; USER_DEFINED ones are split out of any text, CONTROL ones only with
 *     parse_special;
 *   - eos = tokenizer_config.json's eos_token (string or {"content"}) when it names a token, else
 *     <|im_end|>, else <|endoftext|>; pad and bos likewise with <|endoftext|>;
 *   - two ids for one text, or two texts on one id, are refused by both.
 * The base vocabulary is tests/fixtures/fuzz/tok_seed_small.json (256 byte-level tokens, a few
 * merges, Qwen's pre-tokenizer); its added tokens are replaced per case. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "tok/synth_vocab.h"
#include "tok/tokenizer.h"

static char *g_base; /* the seed file's text */

/* Writes DIR/tokenizer.json with `added` (a JSON array) as added_tokens, and DIR/
 * tokenizer_config.json with `cfg` (or removes it); returns the tokenizer.json path. */
static const char *write_case(const char *added, const char *cfg) {
  static char path[4200];
  char dir[4096], cp[4200];
  snprintf(dir, sizeof dir, "%s", test_tmp("tok_rules"));
  char cmd[8300];
  snprintf(cmd, sizeof cmd, "mkdir -p \"%s\" && rm -f \"%s/tokenizer_config.json\"", dir, dir);
  if (system(cmd) != 0) return NULL;
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  cJSON *root = cJSON_Parse(g_base), *a = cJSON_Parse(added);
  if (!root || !a) return NULL;
  cJSON_ReplaceItemInObjectCaseSensitive(root, "added_tokens", a);
  char *txt = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  FILE *f = fopen(path, "w");
  if (!f || !txt) return NULL;
  fputs(txt, f);
  fclose(f);
  free(txt);
  if (cfg) {
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
    f = fopen(cp, "w");
    if (!f) return NULL;
    fputs(cfg, f);
    fclose(f);
  }
  return path;
}

#define ADDED                                                                                    \
  "[{\"id\":260,\"content\":\"<|endoftext|>\",\"special\":true},"                                 \
  "{\"id\":261,\"content\":\"<|im_start|>\",\"special\":true},"                                   \
  "{\"id\":262,\"content\":\"<|im_end|>\",\"special\":true},"                                     \
  "{\"id\":263,\"content\":\"<|fim_prefix|>\",\"special\":false},"                                \
  "{\"id\":264,\"content\":\"<think>\",\"special\":false},"                                       \
  "{\"id\":266,\"content\":\"<tool_call>\",\"special\":true}]"

/* Both loaders on one file: the same types for every id below n, and the same eos / pad / bos. */
static void both(const char *what, const char *path, int32_t want_eos, int32_t want_pad, int32_t want_bos) {
  char err[512];
  tok_vocab *t = NULL;
  synth_vocab v;
  const int r1 = tok_load_json(path, &t, err, sizeof err);
  CHECK(r1 == 0, "%s: tok_load_json: %s", what, r1 ? err : "ok");
  const int r2 = synth_vocab_from_tokenizer_json(path, 300, &v, err, sizeof err);
  CHECK(r2 == 0, "%s: synth_vocab_from_tokenizer_json: %s", what, r2 ? err : "ok");
  if (r1 || r2) {
    tok_free(t);
    if (!r2) synth_vocab_free(&v);
    return;
  }
  int diff = 0;
  for (int32_t i = 0; i < tok_n_vocab(t); i++) diff += tok_token_type(t, i) != v.types[i];
  CHECK(diff == 0, "%s: the two loaders agree on every token type (%d differ)", what, diff);
  CHECK(tok_eos(t) == want_eos && v.eos == want_eos, "%s: eos %d (runtime %d, GGUF writer %lld)", what, want_eos, tok_eos(t),
        (long long)v.eos);
  CHECK(tok_pad(t) == want_pad && v.pad == want_pad, "%s: pad %d (runtime %d, GGUF writer %lld)", what, want_pad, tok_pad(t),
        (long long)v.pad);
  CHECK(tok_bos(t) == want_bos && v.bos == want_bos, "%s: bos %d (runtime %d, GGUF writer %lld)", what, want_bos, tok_bos(t),
        (long long)v.bos);
  CHECK(tok_n_vocab(t) == 267 && v.n == 300 && !strcmp(v.tokens[265], "[PAD265]") && tok_token_type(t, 265) == TOK_TYPE_UNUSED &&
            v.types[299] == SYNTH_TOK_UNUSED,
        "%s: holes and padding are [PAD<id>], UNUSED", what);
  tok_free(t);
  synth_vocab_free(&v);
}

static int32_t encode_one(const tok_vocab *t, const char *s, bool parse_special, size_t *n) {
  tok_ids ids = {0};
  char err[256];
  int32_t r = -1;
  if (tok_encode(t, s, strlen(s), parse_special, &ids, err, sizeof err) == 0 && ids.n) r = ids.v[0];
  *n = ids.n;
  tok_ids_free(&ids);
  return r;
}

int main(void) {
  g_base = test_read_all(test_fixture("fuzz/tok_seed_small.json"), NULL);
  CHECK(g_base != NULL, "read the seed tokenizer.json");
  if (!g_base) return TEST_DONE();
  char err[512];

  SECTION("token types");
  const char *p = write_case(ADDED, NULL);
  tok_vocab *t = NULL;
  CHECK(p && tok_load_json(p, &t, err, sizeof err) == 0, "load: %s", err);
  if (t) {
    CHECK(tok_token_type(t, 260) == TOK_TYPE_CONTROL && tok_token_type(t, 262) == TOK_TYPE_CONTROL, "special: true -> CONTROL");
    CHECK(tok_token_type(t, 263) == TOK_TYPE_CONTROL, "<|fim_prefix|> with special: false -> CONTROL (looks like <|...|>)");
    CHECK(tok_token_type(t, 264) == TOK_TYPE_USER_DEFINED, "<think> with special: false -> USER_DEFINED");
    CHECK(tok_token_type(t, 266) == TOK_TYPE_CONTROL, "<tool_call> with special: true -> CONTROL");
    CHECK(tok_token_type(t, 100) == TOK_TYPE_NORMAL, "vocab entries NORMAL");
    size_t n;
    CHECK(encode_one(t, "<think>", false, &n) == 264 && n == 1, "USER_DEFINED split out without parse_special");
    CHECK(encode_one(t, "<|im_end|>", true, &n) == 262 && n == 1, "CONTROL split out with parse_special");
    CHECK(encode_one(t, "<|im_end|>", false, &n) != 262 && n > 1, "CONTROL not split out without parse_special");
    CHECK(tok_is_eog(t, 262) && tok_is_eog(t, 260) && !tok_is_eog(t, 261), "end of generation: <|im_end|>, <|endoftext|>");
    tok_free(t);
  }

  SECTION("special ids: the same in both loaders");
  both("no tokenizer_config.json", write_case(ADDED, NULL), 262, 260, 260);
  both("eos_token as a string", write_case(ADDED, "{\"eos_token\":\"<|endoftext|>\"}"), 260, 260, 260);
  both("eos_token as {content}, pad and bos named",
       write_case(ADDED, "{\"eos_token\":{\"content\":\"<|im_end|>\"},\"pad_token\":\"<|im_start|>\",\"bos_token\":\"<|im_start|>\"}"),
       262, 261, 261);
  both("eos_token naming no token: the fallback", write_case(ADDED, "{\"eos_token\":\"</s>\",\"bos_token\":null}"), 262, 260, 260);
  both("no <|im_end|>: eos <|endoftext|>",
       write_case("[{\"id\":260,\"content\":\"<|endoftext|>\",\"special\":true},{\"id\":266,\"content\":\"<think>\",\"special\":false}]", NULL),
       260, 260, 260);

  SECTION("conflicts refused by both");
  const char *bad[] = {
    "[{\"id\":260,\"content\":\"<|a|>\",\"special\":true},{\"id\":261,\"content\":\"<|a|>\",\"special\":true}]",
    "[{\"id\":260,\"content\":\"<|a|>\",\"special\":true},{\"id\":260,\"content\":\"<|b|>\",\"special\":true}]",
    "[{\"id\":100,\"content\":\"<|a|>\",\"special\":true}]",
    "[{\"id\":-1,\"content\":\"<|a|>\",\"special\":true}]",
  };
  const char *why[] = {"one text on two ids", "two texts on one id", "an added token over another vocab entry", "a negative id"};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    p = write_case(bad[k], NULL);
    t = NULL;
    synth_vocab v;
    const int r1 = p ? tok_load_json(p, &t, err, sizeof err) : 0;
    CHECK(r1 < 0 && !t && !strchr(err, '\n'), "%s: runtime refuses: %s", why[k], err);
    const int r2 = p ? synth_vocab_from_tokenizer_json(p, 300, &v, err, sizeof err) : 0;
    CHECK(r2 < 0 && !strchr(err, '\n'), "%s: GGUF writer refuses: %s", why[k], err);
    tok_free(t);
  }
  free(g_base);
  return TEST_DONE();
}
