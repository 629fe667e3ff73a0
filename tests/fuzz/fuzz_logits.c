/* libFuzzer target for the logits-file reader of `floe perplexity --kld-base`
 * (eval_logits_open_buffer): any input is refused with a one-line message, or opens with a header
 * whose every token and row lies inside the input (ASan), and each row read is either refused
 * with one line or a log-probability row. Built only with -DFLOE_FUZZ=ON (clang); run by
 * tests/run_fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* a copy of exactly size bytes, so ASan sees any read past the end */
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  char err[512] = "";
  eval_logits *l = NULL;
  int rc = eval_logits_open_buffer(buf, size, "fuzz.lgp", &l, err, sizeof err);
  if (rc) {
    if (l || rc >= 0 || !err[0] || strchr(err, '\n')) abort();
    free(buf);
    return 0;
  }
  const eval_logits_hdr *h = eval_logits_header(l);
  if (eval_logits_file_size(h) != size) abort();
  float *row = malloc(4ull * h->n_vocab);
  const uint32_t ns = eval_logits_n_scored(h);
  for (uint32_t c = 0; c <= h->n_chunks; c++) {
    const int32_t *t = eval_logits_tokens(l, c);
    if ((c < h->n_chunks) != (t != NULL)) abort();
    for (uint32_t i = 0; t && i < h->n_ctx; i++)
      if (t[i] < 0 || (uint32_t)t[i] >= h->n_vocab) abort();
    for (uint32_t j = 0; j <= ns && j < 64; j++) {
      err[0] = 0;
      rc = eval_logits_row(l, c, j, row, err, sizeof err);
      if (rc == 0 ? !eval_row_ok(row, h->n_vocab) : (!err[0] || strchr(err, '\n'))) abort();
      if (rc == 0 && (c >= h->n_chunks || j >= ns)) abort();
    }
  }
  free(row);
  eval_logits_close(l);
  free(buf);
  return 0;
}
