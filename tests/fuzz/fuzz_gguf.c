/* libFuzzer target for the GGUF reader: any input must either be refused with a one-line message
 * or yield a gguf_file whose every value and tensor range can be walked without leaving the
 * buffer (ASan checks the touches below). Built only with -DFLOE_FUZZ=ON (clang); run by
 * tests/run_fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "format/gguf.h"
#include "base/hparams.h"
#include "model/model_meta.h"
#include "tok/tokenizer.h"

static volatile uint64_t g_sink;

static void touch(const void *p, uint64_t n) {
  if (!n) return;
  const volatile uint8_t *b = p;
  g_sink += b[0] + b[n - 1];
}

static void walk(const gguf_value *v) {
  switch (v->type) {
    case GGUF_TYPE_STRING: touch(v->s.ptr, v->s.len); break;
    case GGUF_TYPE_ARRAY: {
      static const uint8_t sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
      if (v->arr_type == GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < v->n; i++) touch(v->strs[i].ptr, v->strs[i].len);
      } else if (v->arr_type == GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < v->n; i++) {
          if (v->items[i].type != GGUF_TYPE_ARRAY) abort();
          walk(&v->items[i]);
        }
      } else {
        if (v->arr_type > 12 || !sz[v->arr_type]) abort();
        touch(v->data, v->n * sz[v->arr_type]);
        int64_t x;
        double d;
        if (v->n) { gguf_arr_i64(v, v->n - 1, &x); gguf_arr_f64(v, v->n - 1, &d); }
      }
      break;
    }
    default: g_sink += v->u; break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gguf_file *g = NULL;
  char err[512];
  int rc = gguf_open_buffer(data, size, "fuzz.gguf", &g, err, sizeof err);
  if (rc) {
    if (g || rc >= 0 || !err[0] || strchr(err, '\n')) abort();
    return 0;
  }
  char name[256];
  for (uint64_t i = 0; i < g->n_kv; i++) {
    const gguf_kv *kv = &g->kv[i];
    touch(kv->key.ptr, kv->key.len);
    walk(&kv->val);
    /* lookups by name find this entry (names with NUL bytes cannot be asked for) */
    if (kv->key.len < sizeof name && !memchr(kv->key.ptr, 0, kv->key.len)) {
      memcpy(name, kv->key.ptr, kv->key.len);
      name[kv->key.len] = 0;
      if (gguf_find_kv(g, name) != kv) abort();
      uint32_t u32; uint64_t u64; int64_t i64; float f; bool b; gguf_str s;
      gguf_get_u32(g, name, &u32); gguf_get_u64(g, name, &u64); gguf_get_i64(g, name, &i64);
      gguf_get_f32(g, name, &f); gguf_get_bool(g, name, &b); gguf_get_str(g, name, &s);
    }
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const gguf_tensor *t = &g->tensors[i];
    touch(t->name.ptr, t->name.len);
    if (t->data < data || t->data + t->size > data + size || t->size == 0) abort();
    touch(t->data, t->size);
    if (t->name.len < sizeof name && !memchr(t->name.ptr, 0, t->name.len)) {
      memcpy(name, t->name.ptr, t->name.len);
      name[t->name.len] = 0;
      if (gguf_find_tensor(g, name) != t) abort();
    }
  }
  /* the readers layered on the metadata: hparams and the tokenizer must refuse or work */
  floe_hparams hp;
  err[0] = 0;
  if (model_hparams_from_gguf(g, &hp, err, sizeof err) != 0 && (!err[0] || strchr(err, '\n'))) abort();
  tok_vocab *tv = NULL;
  err[0] = 0;
  if (tok_load_gguf(g, &tv, err, sizeof err) == 0) {
    tok_ids ids = {0};
    size_t n = size < 256 ? size : 256;
    if (tok_encode(tv, (const char *)data, n, true, &ids, err, sizeof err) == 0) {
      for (size_t i = 0; i < ids.n; i++) {
        size_t len;
        if (!tok_piece(tv, ids.v[i], &len)) abort(); /* every id encode returns has a piece */
      }
    }
    tok_ids_free(&ids);
    tok_free(tv);
  } else if (!err[0] || strchr(err, '\n')) {
    abort();
  }
  gguf_close(g);
  return 0;
}
