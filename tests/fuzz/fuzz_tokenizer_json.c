/* libFuzzer target for the HF tokenizer.json reader (tok_load_json_buffer): any input is refused
 * with a one-line message or yields a vocabulary that can encode and decode without leaving its
 * tables (ASan). Built only with -DFLOE_FUZZ=ON (clang); run by tests/run_fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tok/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512] = "";
  tok_vocab *tv = NULL;
  int rc = tok_load_json_buffer((const char *)data, size, "fuzz-tokenizer.json", &tv, err, sizeof err);
  if (rc) {
    if (tv || rc >= 0 || !err[0] || strchr(err, '\n')) abort();
    return 0;
  }
  static const char *texts[] = {"def f(x):\n    return x  # é 🦙", "<|im_start|>user\nhi<|im_end|>", "   \t\n", "x"};
  for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
    tok_ids ids = {0};
    if (tok_encode(tv, texts[k], strlen(texts[k]), k == 1, &ids, err, sizeof err) == 0) {
      for (size_t i = 0; i < ids.n; i++) {
        size_t len;
        if (!tok_piece(tv, ids.v[i], &len)) abort();
      }
    }
    tok_ids_free(&ids);
  }
  int32_t n = tok_n_vocab(tv);
  for (int32_t id = -1; id <= n; id += (n > 64 ? n / 64 : 1)) {
    size_t len;
    tok_piece(tv, id, &len);
    tok_token_type(tv, id);
    tok_is_eog(tv, id);
  }
  tok_free(tv);
  return 0;
}
