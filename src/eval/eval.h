/* Model evaluation files: the log-probabilities of a perplexity run ("logits file"), stored so a
 * later run of another quantization of the same model can be compared with it (KL divergence,
 * top-1 agreement, perplexity difference), as `floe perplexity --save-logits / --kld-base` do.
 *
 * Format (version 1, every integer little-endian, no padding):
 *
 *   offset  size  field
 *   0       8     magic "FLOELGP1"
 *   8       4     u32 version (1)
 *   12      4     u32 n_vocab   (1 .. 2^24)
 *   16      4     u32 n_ctx     window length in tokens (4 .. 2^24)
 *   20      4     u32 n_chunks  windows (>= 1)
 *   24      4     u32 first     first scored position of a window (1 .. n_ctx - 2); floe writes n_ctx / 2
 *   28      4     u32 reserved (0)
 *   32      4 * n_chunks * n_ctx          i32 token ids of every window, in order, each in [0, n_vocab)
 *   ...     4 * n_chunks * n_scored * n_vocab   f32 rows, n_scored = n_ctx - 1 - first per window:
 *                 row j of window c is log_softmax of the logits at position first + j, which
 *                 predict the token at position first + j + 1.
 *
 * The file's size must be exactly that. Rows are natural-log probabilities: finite and <= 0 (a row
 * read is checked). Files are written to "<path>.tmp.<pid>" and renamed when complete.
 *
 * Ownership: an eval_logits reader owns its mapping (eval_logits_open) or borrows the caller's
 * buffer (eval_logits_open_buffer, which must outlive it). */
#ifndef FLOE_EVAL_H
#define FLOE_EVAL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVAL_LOGITS_MAGIC "FLOELGP1"
#define EVAL_LOGITS_VERSION 1u
#define EVAL_LOGITS_HEADER 32u

typedef struct eval_logits_hdr {
  uint32_t version, n_vocab, n_ctx, n_chunks, first;
} eval_logits_hdr;

/* Scored positions per window. */
static inline uint32_t eval_logits_n_scored(const eval_logits_hdr *h) { return h->n_ctx - 1 - h->first; }
/* Total file size for h; 0 on overflow or out-of-range fields. */
uint64_t eval_logits_file_size(const eval_logits_hdr *h);

typedef struct eval_logits eval_logits;
/* Maps path and validates header, size and token ids. Errors name the path. */
int eval_logits_open(const char *path, eval_logits **out, char *err, size_t errlen);
/* The same checks on a buffer the caller keeps alive; name is used in messages. */
int eval_logits_open_buffer(const uint8_t *buf, size_t len, const char *name, eval_logits **out, char *err,
                            size_t errlen);
void eval_logits_close(eval_logits *l);
const eval_logits_hdr *eval_logits_header(const eval_logits *l);
/* Token ids of window c (n_ctx of them), or NULL when c is out of range. */
const int32_t *eval_logits_tokens(const eval_logits *l, uint32_t c);
/* Row j of window c (n_vocab floats; possibly unaligned, hence copied into out), checked to be
 * finite and <= 0. FLOE_E_INVALID for an index out of range, FLOE_E_FORMAT for a bad row. */
int eval_logits_row(const eval_logits *l, uint32_t c, uint32_t j, float *out, char *err, size_t errlen);

typedef struct eval_logits_writer eval_logits_writer;
/* Creates "<path>.tmp.<pid>" and writes the header and tokens (n_chunks * n_ctx ids). */
int eval_logits_create(const char *path, const eval_logits_hdr *h, const int32_t *tokens, eval_logits_writer **out,
                       char *err, size_t errlen);
/* Appends the next row (n_vocab floats), in file order. */
int eval_logits_write_row(eval_logits_writer *w, const float *row, char *err, size_t errlen);
/* Checks that every row was written, flushes, closes and renames into place; frees w either way. */
int eval_logits_finish(eval_logits_writer *w, char *err, size_t errlen);
/* Removes the temporary file and frees w (NULL is fine). */
void eval_logits_abort(eval_logits_writer *w);

/* log_softmax of n logits, computed in double, rounded to float into out; returns the argmax
 * (lowest index on ties). Non-finite logits give FLOE_E_FORMAT-worthy rows: the caller checks the
 * return of eval_row_ok. */
int32_t eval_log_softmax(const float *logits, size_t n, float *out);
/* True when every value is finite and <= 0 (a log-probability row). */
bool eval_row_ok(const float *row, size_t n);
/* KL(base || cur) = sum exp(base) * (base - cur), in double. */
double eval_kld(const float *base, const float *cur, size_t n);
/* Index of the largest value, lowest on ties. */
int32_t eval_argmax(const float *row, size_t n);

/* Running mean with its standard error. */
typedef struct eval_acc {
  double sum, sum2;
  int64_t n;
} eval_acc;
static inline void eval_acc_add(eval_acc *a, double x) { a->sum += x, a->sum2 += x * x, a->n++; }
double eval_acc_mean(const eval_acc *a);
/* Standard error of the mean: sqrt(sample variance / n); 0 for n < 2. */
double eval_acc_err(const eval_acc *a);
#endif
