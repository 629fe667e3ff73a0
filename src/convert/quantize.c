/* floe quantize: one GGUF model file -> another with different block types (convert.h says what
 * is written). The input is mapped, never loaded whole: tensors are converted in chunks of rows on
 * a thread pool and streamed to the GGUF writer, which writes a temporary file and renames it when
 * every byte is in. Everything (types, row lengths, the precision of the source) is checked before
 * the output file is created, so a refusal leaves nothing behind.
 *
 * Ownership: quantize_model owns everything it allocates and frees it on every path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "convert/convert.h"
#include "format/gguf.h"
#include "model/model_meta.h"
#include "quant/quant.h"

/* Rows per chunk are chosen so a chunk's output stays near this size. */
#define CHUNK_BYTES ((size_t)32 << 20)

typedef struct qplan {
  const gguf_tensor *t;
  char name[MODEL_TENSOR_NAME_MAX + 32];
  uint32_t type;  /* output type */
  bool copy;      /* byte-for-byte */
  bool fallback;
  int64_t cols, rows;
  size_t out_bytes;
} qplan;

static double bits_per_weight(uint32_t type) {
  const floe_type_traits *t = floe_type_info(type);
  return t ? 8.0 * (double)t->bytes / (double)t->blck : 0;
}

typedef struct qjob {
  const qplan *p;
  int64_t row0, nrows;
  uint8_t *out;
  float *scratch; /* n_threads * cols */
  int rc;
} qjob;

static void qworker(void *ctx, int ith, int nth) {
  qjob *j = ctx;
  const qplan *p = j->p;
  const size_t in_row = floe_row_bytes(p->t->type, p->cols), out_row = floe_row_bytes(p->type, p->cols);
  float *x = j->scratch + (size_t)ith * (size_t)p->cols;
  for (int64_t r = ith; r < j->nrows; r += nth) {
    const int64_t row = j->row0 + r;
    quant_dequant_row(p->t->type, p->t->data + (size_t)row * in_row, x, p->cols);
    if (quant_quantize_row(p->type, x, j->out + (size_t)r * out_row, p->cols, NULL)) j->rc = FLOE_E_UNSUPPORTED;
  }
}

/* Which matrices get which type: from the architecture's tensor list by name. */
static const model_tensor_desc *lookup(const model_tensor_desc *d, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(d[i].name, name)) return &d[i];
  return NULL;
}

static int plan_all(const quantize_opts *o, const gguf_file *g, const floe_hparams *hp, qplan *pl, char *err,
                    size_t errlen) {
  model_tensor_desc *d = NULL;
  size_t nd = 0;
  int rc = model_tensor_list(hp, &d, &nd, err, errlen);
  if (rc) return rc;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    qplan *p = &pl[i];
    p->t = &g->tensors[i];
    snprintf(p->name, sizeof p->name, "%.*s", (int)p->t->name.len, p->t->name.ptr);
    p->cols = p->t->ne[0];
    p->rows = 1;
    for (uint32_t k = 1; k < p->t->n_dims; k++) p->rows *= p->t->ne[k];
    const model_tensor_desc *m = lookup(d, nd, p->name);
    p->type = p->t->type;
    p->copy = true;
    if (m && !(m->flags & (MODEL_TF_VECTOR | MODEL_TF_F32))) {
      int t = o->type;
      if (m->flags & (MODEL_TF_EXPERTS | MODEL_TF_SHEXP)) t = o->expert_type >= 0 ? o->expert_type : o->type;
      else if (m->kind == MODEL_K_OUTPUT) t = o->output_type >= 0 ? o->output_type : o->type;
      p->type = (uint32_t)t;
      if (!floe_row_bytes(p->type, p->cols)) {
        p->type = convert_fallback_type(p->type, p->cols);
        p->fallback = true;
      }
      p->copy = p->type == p->t->type;
    }
    if (!p->copy) {
      const floe_type_traits *st = floe_type_info(p->t->type);
      if (!st || !st->supported) {
        rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: tensor %s: floe cannot read its type %s", o->in_path, p->name,
                      st ? st->name : "(unknown)");
        break;
      }
      const double sb = bits_per_weight(p->t->type), tb = bits_per_weight(p->type);
      if (st->quantized && sb < tb && !o->force) {
        rc = floe_err(err, errlen, FLOE_E_INVALID,
                      "%s: tensor %s is %s (%.2f bits/weight), lower precision than the requested %s (%.2f): "
                      "requantizing cannot restore it (--force to do it anyway)",
                      o->in_path, p->name, st->name, sb, floe_type_info(p->type)->name, tb);
        break;
      }
    }
    p->out_bytes = p->copy ? (size_t)p->t->size : floe_row_bytes(p->type, p->cols) * (size_t)p->rows;
  }
  free(d);
  return rc;
}

static int write_meta(gguf_writer *w, const gguf_file *g, const floe_hparams *hp, const quantize_opts *o, bool any_quant) {
  char skey[128];
  snprintf(skey, sizeof skey, "%s.rope.dimension_sections", floe_arch_name(hp->arch));
  const bool fix_sections =
      hp->arch == FLOE_ARCH_QWEN35MOE && !model_rope_sections_valid(hp->rope_sections, hp->n_rot, hp->head_dim);
  bool have_qv = false;
  int rc = 0;
  for (uint64_t i = 0; i < g->n_kv && !rc; i++) {
    const gguf_kv *kv = &g->kv[i];
    if (gguf_str_eq(kv->key, "general.file_type") || gguf_str_eq(kv->key, "general.alignment")) continue;
    if (fix_sections && gguf_str_eq(kv->key, skey)) continue;
    if (gguf_str_eq(kv->key, "general.quantization_version")) have_qv = true;
    rc = gguf_writer_add_kv(w, kv);
  }
  if (!rc && fix_sections) {
    int32_t sec[4];
    model_rope_sections_canonical(hp->n_rot, sec);
    rc = gguf_writer_add_arr(w, skey, GGUF_TYPE_INT32, sec, 4);
  }
  if (!rc) rc = gguf_writer_add_u32(w, "general.file_type", convert_file_type((uint32_t)o->type));
  if (!rc && any_quant && !have_qv) rc = gguf_writer_add_u32(w, "general.quantization_version", 2);
  return rc;
}

int quantize_model(const quantize_opts *o, quantize_stats *stats, char *err, size_t errlen) {
  quantize_stats st = {0};
  if (!o->in_path || !o->out_path) return floe_err(err, errlen, FLOE_E_INVALID, "quantize: input and output paths are required");
  const int types[3] = {o->type, o->expert_type, o->output_type};
  for (int k = 0; k < 3; k++)
    if ((k == 0 || types[k] >= 0) && !convert_type_ok(types[k]))
      return floe_err(err, errlen, FLOE_E_INVALID, "quantize: floe cannot write type %d", types[k]);
  gguf_file *g = NULL;
  int rc = gguf_open(o->in_path, &g, err, errlen);
  if (rc) return rc;
  floe_hparams hp;
  qplan *pl = NULL;
  gguf_writer *w = NULL;
  floe_pool *pool = NULL;
  uint8_t *buf = NULL;
  float *scratch = NULL;
  if ((rc = model_hparams_from_gguf(g, &hp, err, errlen))) goto done;
  pl = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *pl);
  if (!pl) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "quantize: out of memory"); goto done; }
  if ((rc = plan_all(o, g, &hp, pl, err, errlen))) goto done;

  int64_t max_cols = 1;
  uint64_t total = 0;
  bool any_quant = false;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    if (pl[i].cols > max_cols) max_cols = pl[i].cols;
    total += pl[i].out_bytes;
    any_quant = any_quant || floe_type_info(pl[i].type)->quantized;
  }
  const int nth = o->n_threads > 0 ? o->n_threads : 1;
  pool = floe_pool_create(nth);
  buf = malloc(CHUNK_BYTES + (size_t)max_cols * 8);
  scratch = malloc((size_t)nth * (size_t)max_cols * sizeof *scratch);
  if (!pool || !buf || !scratch) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "quantize: out of memory"); goto done; }

  if ((rc = gguf_writer_open(o->out_path, &w, err, errlen))) goto done;
  gguf_writer_set_alignment(w, (uint32_t)g->alignment);
  if ((rc = write_meta(w, g, &hp, o, any_quant))) goto fail_w;
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if ((rc = gguf_writer_add_tensor(w, pl[i].name, pl[i].type, pl[i].t->n_dims, pl[i].t->ne))) goto fail_w;

  uint64_t done_bytes = 0;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const qplan *p = &pl[i];
    st.n_tensors++;
    st.bytes_in += p->t->size;
    st.bytes_out += p->out_bytes;
    if (p->fallback) st.n_fallback++;
    if (p->copy) {
      st.n_copied++;
      /* in slices, so the progress moves on big tensors too */
      for (uint64_t off = 0; off < p->t->size; off += CHUNK_BYTES) {
        const size_t n = p->t->size - off < CHUNK_BYTES ? (size_t)(p->t->size - off) : CHUNK_BYTES;
        if ((rc = gguf_writer_write_data(w, p->t->data + off, n))) goto fail_w;
        done_bytes += n;
        if (o->progress) o->progress(o->progress_user, done_bytes, total);
      }
    } else {
      st.n_requantized++;
      const size_t out_row = floe_row_bytes(p->type, p->cols);
      int64_t chunk = (int64_t)(CHUNK_BYTES / out_row);
      if (chunk < 1) chunk = 1;
      for (int64_t r0 = 0; r0 < p->rows; r0 += chunk) {
        qjob j = {p, r0, p->rows - r0 < chunk ? p->rows - r0 : chunk, buf, scratch, 0};
        floe_pool_run(pool, qworker, &j);
        if (j.rc) {
          rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "quantize: tensor %s: cannot quantize to %s", p->name,
                        floe_type_info(p->type)->name);
          goto fail_w;
        }
        if ((rc = gguf_writer_write_data(w, buf, (size_t)j.nrows * out_row))) goto fail_w;
        done_bytes += (size_t)j.nrows * out_row;
        if (o->progress) o->progress(o->progress_user, done_bytes, total);
      }
    }
    if (o->verbose)
      fprintf(stderr, "%-40s %-8s -> %-8s %s%s\n", p->name, floe_type_info(p->t->type)->name,
              floe_type_info(p->type)->name, p->copy ? "copied" : "requantized", p->fallback ? " (row-length fallback)" : "");
  }
  rc = gguf_writer_finish_err(w, err, errlen);
  w = NULL;
  goto done;
fail_w:
  if (w) {
    const char *m = gguf_writer_error(w);
    if (m && *m) floe_err(err, errlen, rc, "%s", m);
    gguf_writer_abort(w);
    w = NULL;
  }
done:
  free(scratch);
  free(buf);
  if (pool) floe_pool_free(pool);
  free(pl);
  gguf_close(g);
  if (stats) *stats = st;
  return rc;
}
