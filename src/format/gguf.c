/* GGUF v3 reader (mmap, full validation) and streaming writer. See gguf.h for the contract.
 *
 * File layout (ggml/src/gguf.cpp, all little-endian):
 *   "GGUF" u32 version, i64 n_tensors, i64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, i64 ne[n_dims], u32 ggml_type, u64 offset },
 *   zero padding to `alignment`, then the data section; tensor offsets are relative to it and
 *   each is a multiple of the alignment. string = u64 length + bytes (no NUL).
 *   array = u32 element type, u64 n, elements (arrays may nest; ggml itself refuses nesting).
 *
 * Reader strategy: the metadata section is walked twice. The first walk validates every length
 * and type against the bytes actually present and counts the strings and nested array values
 * that need storage; the second walk fills arenas of exactly that size. Every allocation is
 * therefore proportional to bytes that really exist in the file (a hostile count fails the first
 * walk before anything is allocated), and bounded by fixed caps on top of that. After metadata,
 * tensor infos are parsed once; then ranges, alignment, duplicates and overlap are checked.
 * Name lookups use an open-addressing hash (FNV-1a) built at open, so they are O(1).
 *
 * Writer strategy: KVs are serialized into a memory buffer as they are added (metadata is small),
 * tensor infos are kept in an array; the header is emitted on the first data write (or at
 * finish). Data goes through a 4 MiB buffer, and chunks at least that large go straight to
 * write(), so multi-GB files stream at disk speed. Errors are sticky: after the first failure
 * every call returns the same code, so a caller may check only at finish. */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "quant/quant.h"

#define GGUF_MAX_NEST 8              /* arrays of arrays ... at most this deep */
/* Caps on what the file may make us allocate, on top of the rule that every counted thing must
 * be backed by bytes present in the file. Real files: < 100 KVs, < 50k tensors, < 1M strings
 * (tokenizer tokens + merges), nested arrays almost never. Worst cases: 80 MB of KVs, 160 MB of
 * tensor infos, 512 MB of string refs, 64 MB of nested values. */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 21)
#define GGUF_MAX_STRS (1u << 25)   /* elements of string arrays, all arrays together */
#define GGUF_MAX_ITEMS (1u << 20)  /* elements of arrays of arrays, all together */
#define GGUF_MAX_NAME 64             /* ggml's GGML_MAX_NAME, incl. the NUL (writer only) */
#define GGUF_WBUF (4u << 20)

typedef unsigned long long ull;

/* ---- little helpers ---- */

static const uint8_t g_type_size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static bool type_is_scalar(uint32_t t) { return t <= GGUF_TYPE_FLOAT64 && g_type_size[t] != 0; }

const char *gguf_type_name(uint32_t t) {
  static const char *const names[13] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
  return t <= GGUF_TYPE_FLOAT64 ? names[t] : "unknown";
}

bool gguf_str_eq(gguf_str s, const char *c) {
  if (!c) return false;
  size_t n = strlen(c);
  return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | ((uint64_t)ld32(p + 4) << 32); }

static bool is_pow2(uint64_t a) { return a && !(a & (a - 1)); }

/* ---- name index: open addressing over (index + 1), names fetched through a callback ---- */

typedef gguf_str (*name_of_fn)(const void *ctx, uint32_t idx);

typedef struct name_index {
  uint32_t *slots; /* 0 = empty, else index + 1 */
  uint64_t mask;   /* capacity - 1 (capacity a power of two) */
  uint64_t count;
} name_index;

static uint64_t hash_name(const char *p, uint64_t n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
  return h;
}

static int64_t index_find(const name_index *ix, name_of_fn name_of, const void *ctx, const char *p,
                          uint64_t n) {
  if (!ix->slots) return -1;
  for (uint64_t h = hash_name(p, n) & ix->mask;; h = (h + 1) & ix->mask) {
    uint32_t s = ix->slots[h];
    if (!s) return -1;
    gguf_str e = name_of(ctx, s - 1);
    if (e.len == n && (n == 0 || memcmp(e.ptr, p, n) == 0)) return s - 1;
  }
}

/* Inserts idx; returns the index of an existing equal name (a duplicate) or -1. */
static int64_t index_insert(name_index *ix, name_of_fn name_of, const void *ctx, uint32_t idx) {
  gguf_str k = name_of(ctx, idx);
  for (uint64_t h = hash_name(k.ptr, k.len) & ix->mask;; h = (h + 1) & ix->mask) {
    uint32_t s = ix->slots[h];
    if (!s) {
      ix->slots[h] = idx + 1;
      ix->count++;
      return -1;
    }
    gguf_str e = name_of(ctx, s - 1);
    if (e.len == k.len && (k.len == 0 || memcmp(e.ptr, k.ptr, k.len) == 0)) return s - 1;
  }
}

/* Makes room for at least n entries at load <= 1/2, rehashing existing ones. */
static int index_reserve(name_index *ix, name_of_fn name_of, const void *ctx, uint64_t n) {
  uint64_t cap = ix->slots ? ix->mask + 1 : 0;
  if (cap && n * 2 <= cap) return 0;
  uint64_t ncap = 16;
  while (ncap < n * 2) ncap *= 2;
  uint32_t *old = ix->slots;
  ix->slots = calloc(ncap, sizeof *ix->slots);
  if (!ix->slots) { ix->slots = old; return FLOE_E_NOMEM; }
  ix->mask = ncap - 1;
  ix->count = 0;
  for (uint64_t i = 0; i < cap; i++)
    if (old[i]) index_insert(ix, name_of, ctx, old[i] - 1);
  free(old);
  return 0;
}

/* ======================================================================================== */
/*                                        reader                                            */
/* ======================================================================================== */

typedef struct gguf_priv {
  bool owns_map;
  size_t map_len;    /* for floe_unmap_file */
  int fd;            /* the mapped file, kept open to notice it shrinking (-1 for buffers) */
  name_index kv_ix, t_ix;
  gguf_str *strs;    /* arena for all string-array elements */
  gguf_value *items; /* arena for all nested-array elements */
} gguf_priv;

typedef struct reader {
  const uint8_t *p;
  uint64_t size, off; /* invariant: off <= size */
  const char *name;
  char ctx[160]; /* what is being parsed: "header", "key 'x'", "tensor 'y'" */
  char *err;
  size_t errlen;
  bool fill;         /* second walk: store values into the arenas */
  gguf_str *strs;    /* arenas (fill walk) */
  gguf_value *items;
  uint64_t n_strs, n_items; /* used so far */
} reader;

static int rfail(reader *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rfail(reader *r, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return floe_err(r->err, r->errlen, code, "%s: %s: %s", r->name, r->ctx, msg);
}

static bool has(const reader *r, uint64_t n) { return n <= r->size - r->off; }

static int need(reader *r, uint64_t n, const char *what) {
  if (has(r, n)) return 0;
  return rfail(r, FLOE_E_FORMAT, "truncated: %s (%llu bytes) at offset %llu runs past end of file (%llu bytes)",
               what, (ull)n, (ull)r->off, (ull)r->size);
}

static void set_ctx(reader *r, const char *kind, gguf_str s) {
  char b[96];
  snprintf(r->ctx, sizeof r->ctx, "%s '%s'", kind, floe_show_n(b, sizeof b, s.ptr, s.len));
}

static int read_string(reader *r, gguf_str *out, const char *what) {
  char w[64];
  snprintf(w, sizeof w, "length of %s", what);
  int rc = need(r, 8, w);
  if (rc) return rc;
  uint64_t len = ld64(r->p + r->off);
  if (!has(r, 8) || len > r->size - r->off - 8)
    return rfail(r, FLOE_E_FORMAT, "%s of length %llu at offset %llu runs past end of file (%llu bytes)", what,
                 (ull)len, (ull)r->off, (ull)r->size);
  r->off += 8;
  if (out) { out->ptr = (const char *)r->p + r->off; out->len = len; }
  r->off += len;
  return 0;
}

/* Counts n more arena entries (n is already bounded by the bytes left, so no overflow). */
static int claim(reader *r, uint64_t *used, uint64_t n, uint64_t cap, const char *what) {
  if (*used + n > cap)
    return rfail(r, FLOE_E_FORMAT, "metadata arrays hold more than %llu %s in total (floe's limit)", (ull)cap, what);
  *used += n;
  return 0;
}

/* Parses one value of `type` at r->off. v is NULL in the counting walk. */
static int read_value(reader *r, uint32_t type, int depth, gguf_value *v) {
  if (v) { memset(v, 0, sizeof *v); v->type = type; }
  if (type_is_scalar(type)) {
    char w[48];
    snprintf(w, sizeof w, "%s value", gguf_type_name(type));
    int rc = need(r, g_type_size[type], w);
    if (rc) return rc;
    const uint8_t *q = r->p + r->off;
    if (v) switch (type) {
        case GGUF_TYPE_UINT8: v->u = q[0]; break;
        case GGUF_TYPE_INT8: v->i = (int8_t)q[0]; break;
        case GGUF_TYPE_UINT16: v->u = ld16(q); break;
        case GGUF_TYPE_INT16: v->i = (int16_t)ld16(q); break;
        case GGUF_TYPE_UINT32: v->u = ld32(q); break;
        case GGUF_TYPE_INT32: v->i = (int32_t)ld32(q); break;
        case GGUF_TYPE_UINT64: v->u = ld64(q); break;
        case GGUF_TYPE_INT64: v->i = (int64_t)ld64(q); break;
        case GGUF_TYPE_BOOL: v->b = q[0] != 0; break;
        case GGUF_TYPE_FLOAT32: {
          uint32_t bits = ld32(q);
          float f;
          memcpy(&f, &bits, 4);
          v->f = f;
          break;
        }
        case GGUF_TYPE_FLOAT64: {
          uint64_t bits = ld64(q);
          memcpy(&v->f, &bits, 8);
          break;
        }
      }
    r->off += g_type_size[type];
    return 0;
  }
  if (type == GGUF_TYPE_STRING) return read_string(r, v ? &v->s : NULL, "string");
  if (type != GGUF_TYPE_ARRAY) return rfail(r, FLOE_E_FORMAT, "unknown value type %u at offset %llu", type, (ull)(r->off - 4));

  if (depth >= GGUF_MAX_NEST)
    return rfail(r, FLOE_E_FORMAT, "arrays nested deeper than %d levels at offset %llu", GGUF_MAX_NEST, (ull)r->off);
  int rc = need(r, 12, "array header");
  if (rc) return rc;
  uint32_t et = ld32(r->p + r->off);
  uint64_t n = ld64(r->p + r->off + 4);
  if (et > GGUF_TYPE_FLOAT64)
    return rfail(r, FLOE_E_FORMAT, "unknown value type %u of array elements at offset %llu", et, (ull)r->off);
  r->off += 12;
  if (v) { v->arr_type = et; v->n = n; }
  /* Smallest encoding of one element: scalars their size, a string its 8-byte length, a nested
   * array its 12-byte header. n above (bytes left / that) cannot be in the file. */
  uint64_t min = type_is_scalar(et) ? g_type_size[et] : et == GGUF_TYPE_STRING ? 8 : 12;
  uint64_t left = r->size - r->off;
  if (n > left / min)
    return rfail(r, FLOE_E_FORMAT, "array of %llu %s at offset %llu runs past end of file (%llu bytes)", (ull)n,
                 gguf_type_name(et), (ull)(r->off - 12), (ull)r->size);
  if (type_is_scalar(et)) {
    if (v && n) v->data = r->p + r->off;
    r->off += n * min;
    return 0;
  }
  if (et == GGUF_TYPE_STRING) {
    uint64_t at = r->n_strs;
    if ((rc = claim(r, &r->n_strs, n, GGUF_MAX_STRS, "strings"))) return rc;
    if (v && n) v->strs = r->strs + at;
    for (uint64_t i = 0; i < n; i++)
      if ((rc = read_string(r, v ? &v->strs[i] : NULL, "string array element"))) return rc;
    return 0;
  }
  uint64_t at = r->n_items;
  if ((rc = claim(r, &r->n_items, n, GGUF_MAX_ITEMS, "nested arrays"))) return rc;
  if (v && n) v->items = r->items + at;
  for (uint64_t i = 0; i < n; i++)
    if ((rc = read_value(r, GGUF_TYPE_ARRAY, depth + 1, v ? &v->items[i] : NULL))) return rc;
  return 0;
}

static int read_kvs(reader *r, uint64_t n_kv, gguf_kv *kv) {
  for (uint64_t i = 0; i < n_kv; i++) {
    gguf_str key;
    snprintf(r->ctx, sizeof r->ctx, "kv #%llu", (ull)i);
    int rc = read_string(r, &key, "key");
    if (rc) return rc;
    set_ctx(r, "key", key);
    if ((rc = need(r, 4, "value type"))) return rc;
    uint32_t type = ld32(r->p + r->off);
    r->off += 4;
    if ((rc = read_value(r, type, 0, kv ? &kv[i].val : NULL))) return rc;
    if (kv) kv[i].key = key;
  }
  return 0;
}

static gguf_str kv_name(const void *ctx, uint32_t i) { return ((const gguf_file *)ctx)->kv[i].key; }
static gguf_str tensor_name(const void *ctx, uint32_t i) { return ((const gguf_file *)ctx)->tensors[i].name; }

static int read_tensor_info(reader *r, uint64_t i, gguf_tensor *t) {
  snprintf(r->ctx, sizeof r->ctx, "tensor info #%llu", (ull)i);
  int rc = read_string(r, &t->name, "tensor name");
  if (rc) return rc;
  set_ctx(r, "tensor", t->name);
  if ((rc = need(r, 4, "n_dims"))) return rc;
  t->n_dims = ld32(r->p + r->off);
  r->off += 4;
  if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
    return rfail(r, FLOE_E_FORMAT, "n_dims = %u (must be 1..%d)", t->n_dims, GGUF_MAX_DIMS);
  if ((rc = need(r, 8ull * t->n_dims, "ne"))) return rc;
  for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
    t->ne[d] = 1;
    if (d >= t->n_dims) continue;
    t->ne[d] = (int64_t)ld64(r->p + r->off + 8 * d);
    if (t->ne[d] <= 0) return rfail(r, FLOE_E_FORMAT, "ne[%u] = %lld (must be >= 1)", d, (long long)t->ne[d]);
  }
  r->off += 8ull * t->n_dims;
  if ((rc = need(r, 4, "type"))) return rc;
  t->type = ld32(r->p + r->off);
  r->off += 4;
  if ((rc = need(r, 8, "offset"))) return rc;
  t->offset = ld64(r->p + r->off);
  r->off += 8;

  const floe_type_traits *tt = floe_type_info(t->type);
  if (!tt) return rfail(r, FLOE_E_UNSUPPORTED, "unknown type id %u", t->type);
  /* element count must fit int64 (ggml's int64 ne arithmetic), byte size must fit u64 */
  uint64_t nel = (uint64_t)t->ne[0], rows = 1;
  for (uint32_t d = 1; d < GGUF_MAX_DIMS; d++)
    if (!floe_mul_ok(nel, (uint64_t)t->ne[d], &nel) || nel > INT64_MAX || !floe_mul_ok(rows, (uint64_t)t->ne[d], &rows))
      return rfail(r, FLOE_E_OVERFLOW, "element count overflows int64 (ne = [%lld, %lld, %lld, %lld])",
                   (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
  if (t->ne[0] % tt->blck)
    return rfail(r, FLOE_E_FORMAT, "ne[0] = %lld is not a multiple of the block size %d of type %s",
                 (long long)t->ne[0], tt->blck, tt->name);
  uint64_t row;
  if (!floe_mul_ok((uint64_t)(t->ne[0] / tt->blck), (uint64_t)tt->bytes, &row) || !floe_mul_ok(row, rows, &t->size))
    return rfail(r, FLOE_E_OVERFLOW, "byte size overflows (type %s, ne = [%lld, %lld, %lld, %lld])", tt->name,
                 (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
  return 0;
}

typedef struct span { uint64_t beg, end; uint32_t idx; } span;
static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->beg < y->beg ? -1 : x->beg > y->beg ? 1 : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Validates the whole file in g->map and fills g. */
static int parse(gguf_file *g, char *err, size_t errlen) {
  gguf_priv *pv = g->priv;
  reader r = {.p = g->map, .size = g->map_size, .name = g->path, .err = err, .errlen = errlen};
  char b[96], b2[96];
  int rc;
  snprintf(r.ctx, sizeof r.ctx, "header");
  if ((rc = need(&r, 4, "magic"))) return rc;
  if (memcmp(r.p, "GGUF", 4) != 0) {
    char m[20];
    for (int i = 0; i < 4; i++) snprintf(m + 2 * i, 3, "%02x", r.p[i]);
    return rfail(&r, FLOE_E_FORMAT, "bad magic 0x%s (expected \"GGUF\" = 0x47475546)", m);
  }
  r.off = 4;
  if ((rc = need(&r, 4, "version"))) return rc;
  g->version = ld32(r.p + 4);
  if (g->version != 2 && g->version != 3)
    return rfail(&r, FLOE_E_UNSUPPORTED, "unsupported GGUF version %u%s", g->version,
                 g->version && !(g->version & 0xffff) ? " (a big-endian file?)" : " (floe reads 2 and 3)");
  r.off = 8;
  if ((rc = need(&r, 16, "n_tensors and n_kv"))) return rc;
  g->n_tensors = ld64(r.p + 8);
  g->n_kv = ld64(r.p + 16);
  r.off = 24;
  /* each kv takes >= 13 bytes (8 key length, 4 type, 1 value), each tensor info >= 32 */
  uint64_t a, c, need_min;
  if (!floe_mul_ok(g->n_kv, 13, &a) || !floe_mul_ok(g->n_tensors, 32, &c) || !floe_add_ok(a, c, &need_min) ||
      need_min > r.size - r.off)
    return rfail(&r, FLOE_E_FORMAT,
                 "n_tensors = %llu and n_kv = %llu: more than the file could hold (they need at least %s bytes past "
                 "offset 24; end of file is at %llu)",
                 (ull)g->n_tensors, (ull)g->n_kv,
                 (floe_mul_ok(g->n_kv, 13, &a) && floe_mul_ok(g->n_tensors, 32, &c) && floe_add_ok(a, c, &need_min))
                     ? (snprintf(b, sizeof b, "%llu", (ull)need_min), b)
                     : "2^64",
                 (ull)r.size);
  if (g->n_tensors > GGUF_MAX_TENSORS || g->n_kv > GGUF_MAX_KV)
    return rfail(&r, FLOE_E_FORMAT, "n_tensors = %llu, n_kv = %llu: above floe's limits (%u tensors, %u keys)",
                 (ull)g->n_tensors, (ull)g->n_kv, GGUF_MAX_TENSORS, GGUF_MAX_KV);

  /* metadata: counting walk, allocation, filling walk */
  uint64_t kv_start = r.off;
  if ((rc = read_kvs(&r, g->n_kv, NULL))) return rc;
  uint64_t n_strs = r.n_strs, n_items = r.n_items;
  g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
  pv->strs = calloc(n_strs ? n_strs : 1, sizeof *pv->strs);
  pv->items = calloc(n_items ? n_items : 1, sizeof *pv->items);
  if (!g->kv || !pv->strs || !pv->items) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory for metadata", g->path);
  r.off = kv_start;
  r.fill = true;
  r.strs = pv->strs;
  r.items = pv->items;
  r.n_strs = r.n_items = 0;
  if ((rc = read_kvs(&r, g->n_kv, g->kv))) return rc;
  FLOE_ASSERT(r.n_strs == n_strs && r.n_items == n_items);

  if ((rc = index_reserve(&pv->kv_ix, kv_name, g, g->n_kv)))
    return floe_err(err, errlen, rc, "%s: out of memory for the key index", g->path);
  for (uint64_t i = 0; i < g->n_kv; i++) {
    int64_t d = index_insert(&pv->kv_ix, kv_name, g, (uint32_t)i);
    if (d >= 0)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: duplicate key '%s' (kv #%lld and #%llu)", g->path,
                      floe_show_n(b, sizeof b, g->kv[i].key.ptr, g->kv[i].key.len), (long long)d, (ull)i);
  }

  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  const gguf_kv *al = gguf_find_kv(g, "general.alignment");
  if (al) {
    if (al->val.type != GGUF_TYPE_UINT32)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: key 'general.alignment': type %s, expected u32", g->path,
                      gguf_type_name(al->val.type));
    if (!is_pow2(al->val.u))
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: key 'general.alignment': alignment %llu is not a power of two",
                      g->path, (ull)al->val.u);
    g->alignment = al->val.u;
  }

  /* tensor infos */
  g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
  if (!g->tensors) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory for tensor infos", g->path);
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if ((rc = read_tensor_info(&r, i, &g->tensors[i]))) return rc;
  uint64_t pad = (g->alignment - r.off % g->alignment) % g->alignment;
  if (!floe_add_ok(r.off, pad, &g->data_offset))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: data section offset overflows", g->path);

  if ((rc = index_reserve(&pv->t_ix, tensor_name, g, g->n_tensors)))
    return floe_err(err, errlen, rc, "%s: out of memory for the tensor index", g->path);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    int64_t d = index_insert(&pv->t_ix, tensor_name, g, (uint32_t)i);
    if (d >= 0)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: duplicate tensor name '%s' (tensors #%lld and #%llu)", g->path,
                      floe_show_n(b, sizeof b, g->tensors[i].name.ptr, g->tensors[i].name.len), (long long)d, (ull)i);
  }

  span *sp = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *sp);
  if (!sp) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", g->path);
  rc = 0;
  for (uint64_t i = 0; i < g->n_tensors && !rc; i++) {
    gguf_tensor *t = &g->tensors[i];
    const char *tn = floe_show_n(b, sizeof b, t->name.ptr, t->name.len);
    uint64_t beg, end;
    if (t->offset % g->alignment)
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %llu",
                    g->path, tn, (ull)t->offset, (ull)g->alignment);
    else if (!floe_add_ok(g->data_offset, t->offset, &beg) || !floe_add_ok(beg, t->size, &end))
      rc = floe_err(err, errlen, FLOE_E_FORMAT,
                    "%s: tensor '%s': data at offset %llu + %llu (%llu bytes) lies past end of file (%llu bytes)",
                    g->path, tn, (ull)g->data_offset, (ull)t->offset, (ull)t->size, (ull)g->map_size);
    else if (end > g->map_size)
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': data [%llu, %llu) ends past end of file (%llu bytes)",
                    g->path, tn, (ull)beg, (ull)end, (ull)g->map_size);
    else {
      t->data = g->map + beg;
      sp[i] = (span){beg, end, (uint32_t)i};
    }
  }
  if (!rc && g->n_tensors > 1) {
    qsort(sp, g->n_tensors, sizeof *sp, span_cmp);
    for (uint64_t k = 1; k < g->n_tensors && !rc; k++)
      if (sp[k].beg < sp[k - 1].end) {
        const gguf_tensor *x = &g->tensors[sp[k - 1].idx], *y = &g->tensors[sp[k].idx];
        rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)",
                      g->path, floe_show_n(b, sizeof b, y->name.ptr, y->name.len), (ull)sp[k].beg, (ull)sp[k].end,
                      floe_show_n(b2, sizeof b2, x->name.ptr, x->name.len), (ull)sp[k - 1].beg, (ull)sp[k - 1].end);
      }
  }
  free(sp);
  return rc;
}

static int open_common(const uint8_t *map, uint64_t size, size_t map_len, bool owns, const char *name, gguf_file **out,
                       char *err, size_t errlen) {
  gguf_file *g = calloc(1, sizeof *g);
  gguf_priv *pv = calloc(1, sizeof *pv);
  char *path = strdup(name ? name : "(buffer)");
  if (!g || !pv || !path) {
    free(g); free(pv); free(path);
    if (owns) floe_unmap_file(map, map_len);
    return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name ? name : "(buffer)");
  }
  g->path = path;
  g->map = map;
  g->map_size = size;
  g->priv = pv;
  pv->owns_map = owns;
  pv->map_len = map_len;
  pv->fd = -1;
  int rc = parse(g, err, errlen);
  if (rc) {
    gguf_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

int gguf_open(const char *path, gguf_file **out, char *err, size_t errlen) {
  return gguf_open_ex(path, false, out, err, errlen);
}

int gguf_open_ex(const char *path, bool copy, gguf_file **out, char *err, size_t errlen) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return floe_err(err, errlen, FLOE_E_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return floe_err(err, errlen, FLOE_E_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return floe_err(err, errlen, FLOE_E_IO, "%s: not a regular file", path);
  }
  if (st.st_size == 0) {
    close(fd);
    return floe_err(err, errlen, FLOE_E_FORMAT,
                    "%s: header: truncated: magic (4 bytes) at offset 0 runs past end of file (0 bytes)", path);
  }
  const uint8_t *map;
  size_t map_len;
  int rc = floe_map_file(fd, (uint64_t)st.st_size, copy, path, &map, &map_len, err, errlen);
  if (rc) {
    close(fd);
    return rc;
  }
  rc = open_common(map, (uint64_t)st.st_size, map_len, true, path, out, err, errlen);
  if (rc) {
    close(fd);
    return rc;
  }
  ((gguf_priv *)(*out)->priv)->fd = fd;
  return 0;
}

int gguf_check_unchanged(const gguf_file *g, char *err, size_t errlen) {
  const gguf_priv *pv = g->priv;
  if (!pv || pv->fd < 0) return 0;
  struct stat st;
  if (fstat(pv->fd, &st) != 0) return floe_err(err, errlen, FLOE_E_IO, "%s: cannot stat: %s", g->path, strerror(errno));
  if ((uint64_t)st.st_size < g->map_size)
    return floe_err(err, errlen, FLOE_E_IO, "%s: file shrank after it was loaded (%llu bytes, now %llu)", g->path,
                    (unsigned long long)g->map_size, (unsigned long long)st.st_size);
  return 0;
}

int gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file **out, char *err, size_t errlen) {
  *out = NULL;
  static const uint8_t empty[1];
  return open_common(buf ? buf : empty, buf ? size : 0, 0, false, name, out, err, errlen);
}

void gguf_close(gguf_file *g) {
  if (!g) return;
  gguf_priv *pv = g->priv;
  if (pv) {
    if (pv->owns_map && g->map) floe_unmap_file(g->map, pv->map_len);
    if (pv->fd >= 0) close(pv->fd);
    free(pv->kv_ix.slots);
    free(pv->t_ix.slots);
    free(pv->strs);
    free(pv->items);
    free(pv);
  }
  free(g->kv);
  free(g->tensors);
  free(g->path);
  free(g);
}

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
  if (!g || !key) return NULL;
  int64_t i = index_find(&((const gguf_priv *)g->priv)->kv_ix, kv_name, g, key, strlen(key));
  return i < 0 ? NULL : &g->kv[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name) {
  if (!g || !name) return NULL;
  int64_t i = index_find(&((const gguf_priv *)g->priv)->t_ix, tensor_name, g, name, strlen(name));
  return i < 0 ? NULL : &g->tensors[i];
}

/* ---- typed getters ---- */

static bool type_is_unsigned(uint32_t t) {
  return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_UINT64;
}
static bool type_is_signed(uint32_t t) {
  return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

/* An integer value as (negative?, magnitude-ish) pair: returns false if not an integer type. */
static bool value_int(const gguf_value *v, bool *neg, uint64_t *u, int64_t *i) {
  if (type_is_unsigned(v->type)) { *neg = false; *u = v->u; *i = (int64_t)v->u; return true; }
  if (type_is_signed(v->type)) { *neg = v->i < 0; *u = (uint64_t)v->i; *i = v->i; return true; }
  return false;
}

int gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return FLOE_E_NOTFOUND;
  bool neg;
  uint64_t u;
  int64_t i;
  if (!value_int(&kv->val, &neg, &u, &i) || neg) return FLOE_E_FORMAT;
  *out = u;
  return 0;
}

int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out) {
  uint64_t u;
  int rc = gguf_get_u64(g, key, &u);
  if (rc) return rc;
  if (u > UINT32_MAX) return FLOE_E_FORMAT;
  *out = (uint32_t)u;
  return 0;
}

int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return FLOE_E_NOTFOUND;
  bool neg;
  uint64_t u;
  int64_t i;
  if (!value_int(&kv->val, &neg, &u, &i)) return FLOE_E_FORMAT;
  if (type_is_unsigned(kv->val.type) && u > INT64_MAX) return FLOE_E_FORMAT;
  *out = i;
  return 0;
}

int gguf_get_f32(const gguf_file *g, const char *key, float *out) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return FLOE_E_NOTFOUND;
  const gguf_value *v = &kv->val;
  if (v->type == GGUF_TYPE_FLOAT32 || v->type == GGUF_TYPE_FLOAT64) *out = (float)v->f;
  else if (type_is_unsigned(v->type)) *out = (float)v->u; /* e.g. rope.freq_base written as an integer */
  else if (type_is_signed(v->type)) *out = (float)v->i;
  else return FLOE_E_FORMAT;
  return 0;
}

int gguf_get_bool(const gguf_file *g, const char *key, bool *out) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return FLOE_E_NOTFOUND;
  if (kv->val.type != GGUF_TYPE_BOOL) return FLOE_E_FORMAT;
  *out = kv->val.b;
  return 0;
}

int gguf_get_str(const gguf_file *g, const char *key, gguf_str *out) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return FLOE_E_NOTFOUND;
  if (kv->val.type != GGUF_TYPE_STRING) return FLOE_E_FORMAT;
  *out = kv->val.s;
  return 0;
}

const gguf_value *gguf_get_arr(const gguf_file *g, const char *key, uint32_t *arr_type, uint64_t *n) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  bool ok = kv && kv->val.type == GGUF_TYPE_ARRAY;
  if (arr_type) *arr_type = ok ? kv->val.arr_type : 0;
  if (n) *n = ok ? kv->val.n : 0;
  return ok ? &kv->val : NULL;
}

int gguf_arr_i64(const gguf_value *v, uint64_t i, int64_t *out) {
  if (!v || v->type != GGUF_TYPE_ARRAY) return FLOE_E_INVALID;
  if (i >= v->n) return FLOE_E_INVALID;
  uint32_t t = v->arr_type;
  if (!type_is_signed(t) && !type_is_unsigned(t) && t != GGUF_TYPE_BOOL) return FLOE_E_FORMAT;
  const uint8_t *q = (const uint8_t *)v->data + i * g_type_size[t];
  switch (t) {
    case GGUF_TYPE_UINT8: *out = q[0]; break;
    case GGUF_TYPE_BOOL: *out = q[0] != 0; break;
    case GGUF_TYPE_INT8: *out = (int8_t)q[0]; break;
    case GGUF_TYPE_UINT16: *out = ld16(q); break;
    case GGUF_TYPE_INT16: *out = (int16_t)ld16(q); break;
    case GGUF_TYPE_UINT32: *out = ld32(q); break;
    case GGUF_TYPE_INT32: *out = (int32_t)ld32(q); break;
    case GGUF_TYPE_INT64: *out = (int64_t)ld64(q); break;
    case GGUF_TYPE_UINT64:
      if (ld64(q) > INT64_MAX) return FLOE_E_FORMAT;
      *out = (int64_t)ld64(q);
      break;
  }
  return 0;
}

int gguf_arr_f64(const gguf_value *v, uint64_t i, double *out) {
  if (!v || v->type != GGUF_TYPE_ARRAY || i >= v->n) return FLOE_E_INVALID;
  const uint8_t *q = (const uint8_t *)v->data + i * g_type_size[v->arr_type <= 12 ? v->arr_type : 0];
  if (v->arr_type == GGUF_TYPE_FLOAT32) {
    uint32_t bits = ld32(q);
    float f;
    memcpy(&f, &bits, 4);
    *out = f;
    return 0;
  }
  if (v->arr_type == GGUF_TYPE_FLOAT64) {
    uint64_t bits = ld64(q);
    memcpy(out, &bits, 8);
    return 0;
  }
  int64_t x;
  int rc = gguf_arr_i64(v, i, &x);
  if (rc) return rc;
  *out = (double)x;
  return 0;
}

int gguf_arr_str(const gguf_value *v, uint64_t i, gguf_str *out) {
  if (!v || v->type != GGUF_TYPE_ARRAY || i >= v->n) return FLOE_E_INVALID;
  if (v->arr_type != GGUF_TYPE_STRING) return FLOE_E_FORMAT;
  *out = v->strs[i];
  return 0;
}

/* ======================================================================================== */
/*                                        writer                                            */
/* ======================================================================================== */

typedef struct wtensor {
  char *name;
  uint32_t type, n_dims;
  int64_t ne[GGUF_MAX_DIMS];
  uint64_t size, offset;
} wtensor;

struct gguf_writer {
  char *path, *tmp;
  int fd;
  uint32_t alignment;
  int status; /* sticky: first error code */
  char err[512];
  /* serialized KVs */
  uint8_t *kv;
  size_t kv_len, kv_cap;
  uint64_t n_kv;
  char **keys;
  uint64_t keys_cap;
  name_index key_ix;
  /* tensor infos */
  wtensor *t;
  uint64_t n_t, t_cap;
  name_index t_ix;
  /* streaming state */
  bool header_done;
  uint64_t cur, cur_done; /* tensor being written, bytes of it written */
  uint8_t *buf;
  size_t buf_len;
  uint64_t written; /* bytes handed to the file (incl. buffered) */
};

static _Thread_local char g_last_err[512];

static int wfail(gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int wfail(gguf_writer *w, int code, const char *fmt, ...) {
  if (w->status) return w->status;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  w->status = floe_err(w->err, sizeof w->err, code, "%s: %s", w->path, msg);
  return w->status;
}

const char *gguf_writer_error(const gguf_writer *w) { return w ? w->err : g_last_err; }

static gguf_str wkey_name(const void *ctx, uint32_t i) {
  const char *k = ((const gguf_writer *)ctx)->keys[i];
  return (gguf_str){k, strlen(k)};
}
static gguf_str wtensor_name(const void *ctx, uint32_t i) {
  const char *k = ((const gguf_writer *)ctx)->t[i].name;
  return (gguf_str){k, strlen(k)};
}

int gguf_writer_open(const char *path, gguf_writer **out, char *err, size_t errlen) {
  *out = NULL;
  if (!path || !*path) return floe_err(err, errlen, FLOE_E_INVALID, "gguf writer: empty path");
  gguf_writer *w = calloc(1, sizeof *w);
  size_t tl = strlen(path) + 32;
  if (w) {
    w->path = strdup(path);
    w->tmp = malloc(tl);
    w->buf = malloc(GGUF_WBUF);
  }
  if (!w || !w->path || !w->tmp || !w->buf) {
    if (w) { free(w->path); free(w->tmp); free(w->buf); }
    free(w);
    return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", path);
  }
  snprintf(w->tmp, tl, "%s.tmp.%ld", path, (long)getpid());
  w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    int rc = floe_err(err, errlen, FLOE_E_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    free(w->path); free(w->tmp); free(w->buf); free(w);
    return rc;
  }
  w->alignment = GGUF_DEFAULT_ALIGNMENT;
  *out = w;
  return 0;
}

void gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment) {
  if (!w || w->status) return;
  if (w->header_done) { wfail(w, FLOE_E_INVALID, "alignment set after the header was written"); return; }
  if (!is_pow2(alignment)) { wfail(w, FLOE_E_INVALID, "alignment %u is not a power of two", alignment); return; }
  w->alignment = alignment;
}

/* ---- KV serialization ---- */

static int kv_put(gguf_writer *w, const void *p, size_t n) {
  if (w->status) return w->status;
  if (n > SIZE_MAX - w->kv_len) return wfail(w, FLOE_E_OVERFLOW, "metadata too large");
  if (w->kv_len + n > w->kv_cap) {
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < w->kv_len + n) {
      if (cap > SIZE_MAX / 2) return wfail(w, FLOE_E_OVERFLOW, "metadata too large");
      cap *= 2;
    }
    uint8_t *nb = realloc(w->kv, cap);
    if (!nb) return wfail(w, FLOE_E_NOMEM, "out of memory for metadata");
    w->kv = nb;
    w->kv_cap = cap;
  }
  if (n) memcpy(w->kv + w->kv_len, p, n);
  w->kv_len += n;
  return 0;
}
static int kv_u32(gguf_writer *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  return kv_put(w, b, 4);
}
static int kv_u64(gguf_writer *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  return kv_put(w, b, 8);
}
static int kv_str(gguf_writer *w, const char *p, uint64_t n) {
  int rc = kv_u64(w, n);
  return rc ? rc : kv_put(w, p, n);
}

/* Registers key (NUL-terminated copy), writes it and the type tag. */
static int add_key(gguf_writer *w, const char *key, uint32_t type) {
  if (w->status) return w->status;
  if (!key) return wfail(w, FLOE_E_INVALID, "NULL key");
  if (w->header_done) return wfail(w, FLOE_E_INVALID, "key '%s' added after the header was written", key);
  if (strcmp(key, "general.alignment") == 0)
    return wfail(w, FLOE_E_INVALID, "key 'general.alignment' must be a power-of-two u32 (use gguf_writer_set_alignment)");
  if (w->n_kv >= GGUF_MAX_KV - 1) return wfail(w, FLOE_E_INVALID, "too many keys");
  if (index_find(&w->key_ix, wkey_name, w, key, strlen(key)) >= 0)
    return wfail(w, FLOE_E_INVALID, "duplicate key '%s'", key);
  if (w->n_kv == w->keys_cap) {
    uint64_t cap = w->keys_cap ? w->keys_cap * 2 : 64;
    char **nk = realloc(w->keys, cap * sizeof *nk);
    if (!nk) return wfail(w, FLOE_E_NOMEM, "out of memory");
    w->keys = nk;
    w->keys_cap = cap;
  }
  char *k = strdup(key);
  if (!k) return wfail(w, FLOE_E_NOMEM, "out of memory");
  if (index_reserve(&w->key_ix, wkey_name, w, w->n_kv + 1)) { free(k); return wfail(w, FLOE_E_NOMEM, "out of memory"); }
  w->keys[w->n_kv] = k;
  index_insert(&w->key_ix, wkey_name, w, (uint32_t)w->n_kv);
  w->n_kv++;
  int rc = kv_str(w, key, strlen(key));
  return rc ? rc : kv_u32(w, type);
}

static int add_scalar(gguf_writer *w, const char *key, uint32_t type, uint64_t bits) {
  int rc = add_key(w, key, type);
  if (rc) return rc;
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(bits >> (8 * i));
  return kv_put(w, b, g_type_size[type]);
}

int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v) { return add_scalar(w, key, GGUF_TYPE_UINT8, v); }
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v) {
  return add_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v);
}
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v) {
  if (w && key && strcmp(key, "general.alignment") == 0) {
    gguf_writer_set_alignment(w, v);
    return w->status;
  }
  return add_scalar(w, key, GGUF_TYPE_UINT32, v);
}
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v) { return add_scalar(w, key, GGUF_TYPE_UINT64, v); }
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  return add_scalar(w, key, GGUF_TYPE_FLOAT32, bits);
}
int gguf_writer_add_bool(gguf_writer *w, const char *key, bool v) { return add_scalar(w, key, GGUF_TYPE_BOOL, v ? 1 : 0); }
int gguf_writer_add_str(gguf_writer *w, const char *key, const char *v) {
  if (!v) return wfail(w, FLOE_E_INVALID, "key '%s': NULL string", key ? key : "(null)");
  int rc = add_key(w, key, GGUF_TYPE_STRING);
  return rc ? rc : kv_str(w, v, strlen(v));
}

int gguf_writer_add_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
  if (w->status) return w->status;
  if (!type_is_scalar(elem_type))
    return wfail(w, FLOE_E_INVALID, "key '%s': gguf_writer_add_arr takes a scalar element type, not %s",
                 key ? key : "(null)", gguf_type_name(elem_type));
  uint64_t bytes;
  if (!floe_mul_ok(n, g_type_size[elem_type], &bytes) || bytes > SIZE_MAX)
    return wfail(w, FLOE_E_OVERFLOW, "key '%s': array too large", key ? key : "(null)");
  if (n && !data) return wfail(w, FLOE_E_INVALID, "key '%s': NULL array data", key ? key : "(null)");
  int rc = add_key(w, key, GGUF_TYPE_ARRAY);
  if (!rc) rc = kv_u32(w, elem_type);
  if (!rc) rc = kv_u64(w, n);
  /* The host is little-endian (x86-64), so packed host values are the file encoding. */
  return rc ? rc : kv_put(w, data, (size_t)bytes);
}

int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
  if (w->status) return w->status;
  if (n && !strs) return wfail(w, FLOE_E_INVALID, "key '%s': NULL string array", key ? key : "(null)");
  for (uint64_t i = 0; i < n; i++)
    if (!strs[i]) return wfail(w, FLOE_E_INVALID, "key '%s': NULL string at index %llu", key ? key : "(null)", (ull)i);
  int rc = add_key(w, key, GGUF_TYPE_ARRAY);
  if (!rc) rc = kv_u32(w, GGUF_TYPE_STRING);
  if (!rc) rc = kv_u64(w, n);
  for (uint64_t i = 0; i < n && !rc; i++) rc = kv_str(w, strs[i], strlen(strs[i]));
  return rc;
}

/* Writes the payload of v (no type tag; arrays include their element type and count). */
static int put_value(gguf_writer *w, const char *key, const gguf_value *v, int depth) {
  int rc;
  if (type_is_scalar(v->type)) {
    uint64_t bits = 0;
    switch (v->type) {
      case GGUF_TYPE_FLOAT32: {
        float f = (float)v->f;
        uint32_t b32;
        memcpy(&b32, &f, 4);
        bits = b32;
        break;
      }
      case GGUF_TYPE_FLOAT64: memcpy(&bits, &v->f, 8); break;
      case GGUF_TYPE_BOOL: bits = v->b ? 1 : 0; break;
      default: bits = v->u; break; /* signed values: two's complement, truncated to width */
    }
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(bits >> (8 * i));
    return kv_put(w, b, g_type_size[v->type]);
  }
  if (v->type == GGUF_TYPE_STRING) {
    if (v->s.len && !v->s.ptr) return wfail(w, FLOE_E_INVALID, "key '%s': NULL string", key);
    return kv_str(w, v->s.ptr, v->s.len);
  }
  if (v->type != GGUF_TYPE_ARRAY) return wfail(w, FLOE_E_INVALID, "key '%s': unknown value type %u", key, v->type);
  if (depth >= GGUF_MAX_NEST)
    return wfail(w, FLOE_E_INVALID, "key '%s': arrays nested deeper than %d levels", key, GGUF_MAX_NEST);
  if (v->arr_type > GGUF_TYPE_FLOAT64)
    return wfail(w, FLOE_E_INVALID, "key '%s': unknown array element type %u", key, v->arr_type);
  if ((rc = kv_u32(w, v->arr_type)) || (rc = kv_u64(w, v->n))) return rc;
  if (type_is_scalar(v->arr_type)) {
    uint64_t bytes;
    if (!floe_mul_ok(v->n, g_type_size[v->arr_type], &bytes) || bytes > SIZE_MAX)
      return wfail(w, FLOE_E_OVERFLOW, "key '%s': array too large", key);
    if (v->n && !v->data) return wfail(w, FLOE_E_INVALID, "key '%s': NULL array data", key);
    return kv_put(w, v->data, (size_t)bytes);
  }
  if (v->n && !(v->arr_type == GGUF_TYPE_STRING ? (const void *)v->strs : (const void *)v->items))
    return wfail(w, FLOE_E_INVALID, "key '%s': NULL array elements", key);
  for (uint64_t i = 0; i < v->n; i++) {
    if (v->arr_type == GGUF_TYPE_STRING) {
      if (v->strs[i].len && !v->strs[i].ptr) return wfail(w, FLOE_E_INVALID, "key '%s': NULL string", key);
      rc = kv_str(w, v->strs[i].ptr, v->strs[i].len);
    } else {
      if (v->items[i].type != GGUF_TYPE_ARRAY)
        return wfail(w, FLOE_E_INVALID, "key '%s': element %llu of an array of arrays has type %s", key, (ull)i,
                     gguf_type_name(v->items[i].type));
      rc = put_value(w, key, &v->items[i], depth + 1);
    }
    if (rc) return rc;
  }
  return 0;
}

int gguf_writer_add_value(gguf_writer *w, const char *key, const gguf_value *v) {
  if (w->status) return w->status;
  if (!v) return wfail(w, FLOE_E_INVALID, "key '%s': NULL value", key ? key : "(null)");
  if (key && v->type == GGUF_TYPE_UINT32 && strcmp(key, "general.alignment") == 0)
    return gguf_writer_add_u32(w, key, (uint32_t)v->u);
  int rc = add_key(w, key, v->type);
  return rc ? rc : put_value(w, key, v, 0);
}

int gguf_writer_add_kv(gguf_writer *w, const gguf_kv *kv) {
  if (w->status) return w->status;
  if (!kv || (kv->key.len && !kv->key.ptr)) return wfail(w, FLOE_E_INVALID, "NULL kv");
  if (memchr(kv->key.ptr ? kv->key.ptr : "", 0, kv->key.len))
    return wfail(w, FLOE_E_INVALID, "key with an embedded NUL byte");
  char *k = malloc(kv->key.len + 1);
  if (!k) return wfail(w, FLOE_E_NOMEM, "out of memory");
  if (kv->key.len) memcpy(k, kv->key.ptr, kv->key.len);
  k[kv->key.len] = 0;
  int rc = gguf_writer_add_value(w, k, &kv->val);
  free(k);
  return rc;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne) {
  if (w->status) return w->status;
  if (!name || !*name) return wfail(w, FLOE_E_INVALID, "empty tensor name");
  if (w->header_done) return wfail(w, FLOE_E_INVALID, "tensor '%s' added after the header was written", name);
  if (strlen(name) >= GGUF_MAX_NAME)
    return wfail(w, FLOE_E_INVALID, "tensor '%s': name is %zu bytes, llama.cpp allows at most %d", name, strlen(name),
                 GGUF_MAX_NAME - 1);
  if (n_dims < 1 || n_dims > GGUF_MAX_DIMS || !ne)
    return wfail(w, FLOE_E_INVALID, "tensor '%s': n_dims = %u (must be 1..%d)", name, n_dims, GGUF_MAX_DIMS);
  const floe_type_traits *tt = floe_type_info(type);
  if (!tt) return wfail(w, FLOE_E_UNSUPPORTED, "tensor '%s': unknown type id %u", name, type);
  wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
  uint64_t nel = 1, rows = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    t.ne[d] = ne[d];
    if (ne[d] <= 0) return wfail(w, FLOE_E_INVALID, "tensor '%s': ne[%u] = %lld (must be >= 1)", name, d, (long long)ne[d]);
    if (!floe_mul_ok(nel, (uint64_t)ne[d], &nel) || nel > INT64_MAX || (d && !floe_mul_ok(rows, (uint64_t)ne[d], &rows)))
      return wfail(w, FLOE_E_OVERFLOW, "tensor '%s': element count overflows int64", name);
  }
  if (t.ne[0] % tt->blck)
    return wfail(w, FLOE_E_INVALID, "tensor '%s': ne[0] = %lld is not a multiple of the block size %d of type %s", name,
                 (long long)t.ne[0], tt->blck, tt->name);
  uint64_t row;
  if (!floe_mul_ok((uint64_t)(t.ne[0] / tt->blck), (uint64_t)tt->bytes, &row) || !floe_mul_ok(row, rows, &t.size))
    return wfail(w, FLOE_E_OVERFLOW, "tensor '%s': byte size overflows", name);
  if (w->n_t >= GGUF_MAX_TENSORS) return wfail(w, FLOE_E_INVALID, "too many tensors");
  if (index_find(&w->t_ix, wtensor_name, w, name, strlen(name)) >= 0)
    return wfail(w, FLOE_E_INVALID, "duplicate tensor name '%s'", name);
  if (w->n_t == w->t_cap) {
    uint64_t cap = w->t_cap ? w->t_cap * 2 : 256;
    wtensor *nt = realloc(w->t, cap * sizeof *nt);
    if (!nt) return wfail(w, FLOE_E_NOMEM, "out of memory");
    w->t = nt;
    w->t_cap = cap;
  }
  if (!(t.name = strdup(name))) return wfail(w, FLOE_E_NOMEM, "out of memory");
  w->t[w->n_t] = t;
  if (index_reserve(&w->t_ix, wtensor_name, w, w->n_t + 1)) { free(t.name); return wfail(w, FLOE_E_NOMEM, "out of memory"); }
  index_insert(&w->t_ix, wtensor_name, w, (uint32_t)w->n_t);
  w->n_t++;
  return 0;
}

/* ---- file output ---- */

static int write_all(gguf_writer *w, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(w->fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return wfail(w, FLOE_E_IO, "write failed: %s", strerror(errno));
    }
    if (k == 0) return wfail(w, FLOE_E_IO, "write failed: wrote 0 bytes");
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static int flush_buf(gguf_writer *w) {
  if (w->status) return w->status;
  int rc = write_all(w, w->buf, w->buf_len);
  w->buf_len = 0;
  return rc;
}

static int out(gguf_writer *w, const void *p, size_t n) {
  if (w->status) return w->status;
  if (!n) return 0;
  w->written += n;
  if (w->buf_len + n <= GGUF_WBUF) {
    memcpy(w->buf + w->buf_len, p, n);
    w->buf_len += n;
    return 0;
  }
  int rc = flush_buf(w);
  if (rc) return rc;
  if (n >= GGUF_WBUF) return write_all(w, p, n);
  memcpy(w->buf, p, n);
  w->buf_len = n;
  return 0;
}

static int out_zeros(gguf_writer *w, uint64_t n) {
  static const uint8_t zeros[4096];
  while (n) {
    size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
    int rc = out(w, zeros, k);
    if (rc) return rc;
    n -= k;
  }
  return 0;
}

static int out_u32(gguf_writer *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  return out(w, b, 4);
}
static int out_u64(gguf_writer *w, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  return out(w, b, 8);
}
static uint64_t pad_to(uint64_t x, uint64_t a) { return (a - x % a) % a; }

int gguf_writer_write_header(gguf_writer *w) {
  if (w->status) return w->status;
  if (w->header_done) return 0;
  /* offsets: each tensor aligned, padded to the alignment (ggml's layout) */
  uint64_t off = 0;
  for (uint64_t i = 0; i < w->n_t; i++) {
    w->t[i].offset = off;
    if (!floe_add_ok(off, w->t[i].size, &off) || !floe_add_ok(off, pad_to(off, w->alignment), &off))
      return wfail(w, FLOE_E_OVERFLOW, "total tensor data size overflows");
  }
  bool write_align = w->alignment != GGUF_DEFAULT_ALIGNMENT;
  out(w, "GGUF", 4);
  out_u32(w, 3);
  out_u64(w, w->n_t);
  out_u64(w, w->n_kv + (write_align ? 1 : 0));
  out(w, w->kv, w->kv_len);
  if (write_align) {
    static const char k[] = "general.alignment";
    out_u64(w, sizeof k - 1);
    out(w, k, sizeof k - 1);
    out_u32(w, GGUF_TYPE_UINT32);
    out_u32(w, w->alignment);
  }
  for (uint64_t i = 0; i < w->n_t; i++) {
    const wtensor *t = &w->t[i];
    size_t nl = strlen(t->name);
    out_u64(w, nl);
    out(w, t->name, nl);
    out_u32(w, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) out_u64(w, (uint64_t)t->ne[d]);
    out_u32(w, t->type);
    out_u64(w, t->offset);
  }
  out_zeros(w, pad_to(w->written, w->alignment));
  w->header_done = true;
  /* Zero-byte tensors cannot exist (ne >= 1), so nothing to skip here. */
  return w->status;
}

int gguf_writer_write_data(gguf_writer *w, const void *data, size_t n) {
  if (w->status) return w->status;
  int rc = gguf_writer_write_header(w);
  if (rc) return rc;
  const uint8_t *p = data;
  while (n) {
    if (w->cur >= w->n_t)
      return wfail(w, FLOE_E_INVALID, "write_data: %zu bytes past the end of the last tensor", n);
    wtensor *t = &w->t[w->cur];
    uint64_t left = t->size - w->cur_done;
    size_t k = n < left ? n : (size_t)left;
    if ((rc = out(w, p, k))) return rc;
    p += k;
    n -= k;
    w->cur_done += k;
    if (w->cur_done == t->size) {
      if ((rc = out_zeros(w, pad_to(t->size, w->alignment)))) return rc;
      w->cur++;
      w->cur_done = 0;
    }
  }
  return 0;
}

static void writer_free(gguf_writer *w) {
  for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
  for (uint64_t i = 0; i < w->n_t; i++) free(w->t[i].name);
  free(w->keys);
  free(w->t);
  free(w->key_ix.slots);
  free(w->t_ix.slots);
  free(w->kv);
  free(w->buf);
  free(w->path);
  free(w->tmp);
  free(w);
}

void gguf_writer_abort(gguf_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  unlink(w->tmp);
  writer_free(w);
}

int gguf_writer_finish_err(gguf_writer *w, char *err, size_t errlen) {
  if (!w) return floe_err(err, errlen, FLOE_E_INVALID, "gguf writer: NULL");
  if (!w->status) gguf_writer_write_header(w);
  if (!w->status && w->cur < w->n_t)
    wfail(w, FLOE_E_INVALID, "tensor '%s': %llu of %llu bytes written (%llu of %llu tensors complete)",
          w->t[w->cur].name, (ull)w->cur_done, (ull)w->t[w->cur].size, (ull)w->cur, (ull)w->n_t);
  if (!w->status) flush_buf(w);
  if (!w->status && fsync(w->fd) != 0) wfail(w, FLOE_E_IO, "fsync failed: %s", strerror(errno));
  if (w->fd >= 0 && close(w->fd) != 0 && !w->status) wfail(w, FLOE_E_IO, "close failed: %s", strerror(errno));
  w->fd = -1;
  if (!w->status && rename(w->tmp, w->path) != 0)
    wfail(w, FLOE_E_IO, "cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
  if (!w->status) {
    /* make the rename durable: fsync the directory (best effort) */
    char *dir = strdup(w->path);
    if (dir) {
      char *slash = strrchr(dir, '/');
      const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
      int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) { fsync(dfd); close(dfd); }
      free(dir);
    }
  }
  int rc = w->status;
  if (rc) {
    unlink(w->tmp);
    snprintf(g_last_err, sizeof g_last_err, "%s", w->err);
    if (err && errlen) snprintf(err, errlen, "%s", w->err);
  }
  writer_free(w);
  return rc;
}

int gguf_writer_finish(gguf_writer *w) { return gguf_writer_finish_err(w, NULL, 0); }
