/* Byte-level BPE vocabularies for synthetic models (`floe synth`): generated, or read from a
 * Hugging Face tokenizer.json, then written as llama.cpp's "gpt2" tokenizer keys.
 *
 * A generated vocabulary of n tokens is a valid byte-level BPE: ids 0..255 are the GPT-2
 * byte->unicode characters (in bytes_to_unicode() order, as in Qwen's vocab), then tokens made
 * by a deterministic list of merges (common English and Python words, each built left to right
 * so every merge joins two existing tokens into a new token, then pairs of tokens), then the
 * Qwen special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, ..., <think>, </think>) typed
 * CONTROL or USER_DEFINED as in Qwen's tokenizer, then "[PAD<id>]" tokens (UNUSED) up to n.
 *
 * Memory: a synth_vocab owns all its strings; synth_vocab_free() releases them. */
#ifndef FLOE_SYNTH_VOCAB_H
#define FLOE_SYNTH_VOCAB_H
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"

/* llama.cpp token types (tokenizer.ggml.token_type). */
enum synth_token_type {
  SYNTH_TOK_NORMAL = 1, SYNTH_TOK_UNKNOWN = 2, SYNTH_TOK_CONTROL = 3,
  SYNTH_TOK_USER_DEFINED = 4, SYNTH_TOK_UNUSED = 5, SYNTH_TOK_BYTE = 6,
};

typedef struct synth_vocab {
  uint64_t n;            /* tokens (= n_vocab) */
  char **tokens;         /* [n] UTF-8, NUL-terminated */
  int32_t *types;        /* [n] enum synth_token_type */
  uint64_t n_merges;
  char **merges;         /* [n_merges] "left right" */
  int64_t bos, eos, pad; /* token ids, -1 = none */
  char *chat_template;   /* Jinja, never NULL after a successful build */
} synth_vocab;

/* Generates a vocabulary of exactly n_vocab tokens (n_vocab >= 512). */
int synth_vocab_generate(int64_t n_vocab, synth_vocab *v, char *err, size_t errlen);
/* Reads model.vocab, model.merges ("a b" strings or [a, b] pairs) and added_tokens of a HF
 * tokenizer.json, padded to n_vocab; an id >= n_vocab is an error. The chat template and the
 * eos/pad tokens come from tokenizer_config.json (or chat_template.jinja) beside it when present. */
int synth_vocab_from_tokenizer_json(const char *path, int64_t n_vocab, synth_vocab *v, char *err, size_t errlen);
/* Writes tokenizer.ggml.{model="gpt2", pre, tokens, token_type, merges, bos/eos/padding ids,
 * add_bos_token=false} and tokenizer.chat_template. pre is "qwen2" or "qwen35". */
int synth_vocab_to_gguf(gguf_writer *w, const synth_vocab *v, const char *pre);
void synth_vocab_free(synth_vocab *v);
#endif
