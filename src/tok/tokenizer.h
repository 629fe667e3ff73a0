/* Byte-level BPE tokenizer as Qwen uses it (Qwen2/2.5/3, Qwen3-MoE, Qwen3-Next, Qwen3.5/3.6).
 *
 * Loaded from GGUF metadata (tokenizer.ggml.model = "gpt2", tokens, token_type, merges "a b",
 * tokenizer.ggml.pre = "qwen2" | "qwen35", special ids, chat_template) or from an HF
 * tokenizer.json (model.vocab, model.merges as "a b" strings or [a, b] pairs, added_tokens, the
 * Split regex of pre_tokenizer to tell qwen2 from qwen35).
 *
 * Encoding (tok_encode):
 *   1. added tokens are split out of the text first, leftmost-longest: USER_DEFINED ones
 *      (<think>, <tool_call>, ...: HF "added tokens" with special=false) always, CONTROL ones
 *      (<|im_start|>, <|im_end|>, ...) only when parse_special is true (llama.cpp semantics;
 *      a user message rendered with parse_special=false can never forge a control token);
 *   2. each remaining fragment is pre-tokenized with Qwen's regex (PCRE2, UTF + UCP; \s is the
 *      Unicode White_Space set, as in HF tokenizers and llama.cpp); bytes of invalid UTF-8 that
 *      no alternative matches become their own pre-token, so any byte string round-trips;
 *   3. each pre-token is BPE-merged over raw bytes: repeatedly the lowest-rank adjacent pair,
 *      leftmost first (HF tokenizers' Word::merge_all), with a heap: O(n log n) per pre-token.
 *   No NFC normalization is applied (llama.cpp does not either). Qwen's tokenizer.json declares an
 *   NFC normalizer, so text that is not in NFC (e.g. "e" + U+0301) tokenizes differently from HF
 *   transformers; NFC text (nearly all real text) is unaffected.
 *
 * Pieces (tok_piece) are raw bytes: byte-level tokens are decoded through the GPT-2 byte<->unicode
 * map at load time; added tokens are their literal text.
 *
 * Thread safety: a loaded tok_vocab is immutable; encode/decode may run concurrently.
 * Memory: tok_vocab owns everything (it copies what it needs out of the GGUF mapping). */
#ifndef FLOE_TOKENIZER_H
#define FLOE_TOKENIZER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "format/gguf.h"

typedef struct tok_vocab tok_vocab;

/* llama.cpp / GGUF token types (tokenizer.ggml.token_type). */
enum tok_type {
  TOK_TYPE_UNDEFINED = 0, TOK_TYPE_NORMAL = 1, TOK_TYPE_UNKNOWN = 2, TOK_TYPE_CONTROL = 3,
  TOK_TYPE_USER_DEFINED = 4, TOK_TYPE_UNUSED = 5, TOK_TYPE_BYTE = 6,
};

enum tok_pre { TOK_PRE_QWEN2 = 0, TOK_PRE_QWEN35 = 1 };

/* A growable array of token ids (zero-initialise; free with tok_ids_free). */
typedef struct tok_ids { int32_t *v; size_t n, cap; } tok_ids;
void tok_ids_free(tok_ids *a);

/* A growable byte buffer, always NUL-terminated after a successful append. */
typedef struct tok_buf { char *p; size_t n, cap; } tok_buf;
void tok_buf_free(tok_buf *b);
int tok_buf_append(tok_buf *b, const void *data, size_t n);

/* GPT-2 bytes_to_unicode(): the code point that spells byte b in a byte-level vocabulary
 * (printable Latin-1 bytes themselves, the other 68 U+0100.. in increasing byte order). */
uint32_t tok_byte_codepoint(uint8_t b);
/* The byte-level spelling of raw bytes s[0..n): UTF-8, NUL-terminated, malloc'ed (every code
 * point is < 0x800, so at most 2n + 1 bytes); NULL when out of memory. */
char *tok_bytelevel_encode(const char *s, size_t n);

/* ---- tokenizer.json (tokenizer_json.c) ----
 * The one parser of HF tokenizer.json files, behind tok_load_json and the GGUF writers
 * (synth_vocab_from_tokenizer_json), so both read a file under one rule set:
 *   - model.type "BPE" when present; model.vocab an object of ids; model.merges (optional) "a b"
 *     strings or [a, b] pairs; added_tokens (optional) entries with id and content;
 *   - ids are integers in [0, 2^24); n = 1 + the largest id; ids nobody names are holes (NULL
 *     text, TOK_TYPE_UNDEFINED; the loaders fill them with "[PAD<id>]", UNUSED, as llama.cpp's
 *     converter does);
 *   - an added token may repeat its own vocab entry (same id and text); two texts on one id, two
 *     ids for one text, or an id twice in model.vocab are errors;
 *   - types: vocab entries NORMAL; added tokens CONTROL when "special": true or when the text
 *     looks like <|...|> (llama.cpp's converter does the same), else USER_DEFINED (<think>,
 *     <tool_call>, ...: split out of any text, never only with parse_special);
 *   - eos: tokenizer_config.json's eos_token (a string or {"content": ...}) when it names a
 *     token, else <|im_end|>, else <|endoftext|>; pad: pad_token, else <|endoftext|>; bos:
 *     bos_token, else <|endoftext|> (never added: add_bos_token is false for Qwen); -1 if none;
 *   - pre: TOK_PRE_* of the Split pre-tokenizer's regex, -1 (pre_why says why) when it is not
 *     one of Qwen's; the chat template from tokenizer_config.json, else chat_template.jinja.
 * tokenizer_config.json and chat_template.jinja are read beside `path` (NULL: none). */
typedef struct tok_json_merge { const char *a, *b; size_t na, nb; } tok_json_merge;
typedef struct tok_json {
  int32_t n;                /* 1 + the largest id */
  const char **text;        /* [n] byte-level spelling (vocab) or literal text (added); NULL: hole */
  uint8_t *type;            /* [n] enum tok_type; TOK_TYPE_UNDEFINED for holes */
  tok_json_merge *merges;   /* [n_merges] in rank order */
  int32_t n_merges;
  int32_t eos, pad, bos;    /* -1: none */
  int pre;                  /* enum tok_pre, or -1 */
  char pre_why[400];
  char *chat_template;      /* malloc'ed or NULL */
  void *root;               /* the parsed JSON (cJSON); owns the strings above */
} tok_json;
int tok_json_parse(const char *json, size_t len, const char *name, const char *path, tok_json *j, char *err,
                   size_t errlen);
void tok_json_free(tok_json *j);
/* Looks like <|...|>. */
bool tok_text_looks_control(const char *s, size_t n);

/* ---- loading ---- */
int tok_load_gguf(const gguf_file *g, tok_vocab **out, char *err, size_t errlen);
int tok_load_json(const char *path, tok_vocab **out, char *err, size_t errlen);
/* Same as tok_load_json from memory; `name` is used in messages. */
int tok_load_json_buffer(const char *json, size_t len, const char *name, tok_vocab **out, char *err,
                         size_t errlen);
void tok_free(tok_vocab *t);

/* ---- properties ---- */
int32_t tok_n_vocab(const tok_vocab *t);
int tok_pre_type(const tok_vocab *t);               /* enum tok_pre */
int tok_token_type(const tok_vocab *t, int32_t id); /* enum tok_type; -1 if out of range */
int32_t tok_bos(const tok_vocab *t);                /* -1 when none */
int32_t tok_eos(const tok_vocab *t);
int32_t tok_pad(const tok_vocab *t);
/* End of generation: eos, eot, <|im_end|>, <|endoftext|> (those present). */
bool tok_is_eog(const tok_vocab *t, int32_t id);
/* The chat template text from GGUF (tokenizer.chat_template) or NULL. */
const char *tok_chat_template(const tok_vocab *t);

/* Raw bytes of a token (not NUL-terminated; *len set). NULL when id is out of range. */
const char *tok_piece(const tok_vocab *t, int32_t id, size_t *len);
/* Id of the token whose text is exactly `text` (added tokens first: "<|im_end|>", "<think>",
 * "<tool_call>", ...; then byte-level tokens by their raw bytes). -1 when none. */
int32_t tok_find(const tok_vocab *t, const char *text);

/* ---- encode ---- */
/* Appends the ids of text[0..len) to *out. Fails only on allocation or regex engine errors. */
int tok_encode(const tok_vocab *t, const char *text, size_t len, bool parse_special, tok_ids *out,
               char *err, size_t errlen);

/* ---- decode ---- */
/* Appends the raw bytes of ids to *out (no UTF-8 repair: decode(encode(x)) == x byte for byte).
 * Ids out of range fail with FLOE_E_INVALID. skip_special drops CONTROL tokens. */
int tok_decode(const tok_vocab *t, const int32_t *ids, size_t n, bool skip_special, tok_buf *out,
               char *err, size_t errlen);

/* Streaming detokenizer: pushes one token at a time and emits only complete, valid UTF-8. An
 * incomplete multi-byte sequence at the end of a piece is held back until the next piece completes
 * it. Bytes that can no longer become valid UTF-8 are emitted as U+FFFD (one per maximal invalid
 * subpart, as Python's errors="replace"); tok_stream_flush turns a still-incomplete tail into
 * U+FFFD at the end. Output is therefore always valid UTF-8. */
typedef struct tok_stream { uint8_t pend[4]; int npend; } tok_stream;
void tok_stream_init(tok_stream *s);
int tok_stream_push(tok_stream *s, const tok_vocab *t, int32_t id, tok_buf *out, char *err, size_t errlen);
/* Same over arbitrary bytes (the core of tok_stream_push). */
int tok_stream_bytes(tok_stream *s, const char *data, size_t n, tok_buf *out);
int tok_stream_flush(tok_stream *s, tok_buf *out);
#endif
