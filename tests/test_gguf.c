/* GGUF reader/writer round trip: every value type (scalars, strings incl. empty and UTF-8, arrays
 * of every scalar type, string arrays, nested and empty arrays), tensors of several types incl.
 * quantized ones with odd shapes, a non-default alignment, data streamed in awkward chunks
 * (incl. one larger than the writer's 4 MiB buffer); every value and every byte read back.
 * Also: typed getter conversions, writer error paths (temp file never left behind), copying KVs
 * between files, O(1) lookups over thousands of tensors, and the golden quant fixtures. */
#include <errno.h>
#include <math.h>
#include <strings.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"
#include "quant/quant.h"
#include "test.h"

static bool exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}
static uint64_t fsize(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}
static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static bool str_is(gguf_str s, const char *c) { return gguf_str_eq(s, c); }

static const gguf_value *val(const gguf_file *g, const char *key, uint32_t type) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  CHECK(kv != NULL, "key %s present", key);
  if (!kv) return NULL;
  CHECK(kv->val.type == type, "key %s has type %s (got %s)", key, gguf_type_name(type), gguf_type_name(kv->val.type));
  return kv->val.type == type ? &kv->val : NULL;
}

/* Structural equality of two values (for the copy test). */
static bool value_eq(const gguf_value *a, const gguf_value *b) {
  if (a->type != b->type) return false;
  switch (a->type) {
    case GGUF_TYPE_STRING: return a->s.len == b->s.len && memcmp(a->s.ptr, b->s.ptr, a->s.len) == 0;
    case GGUF_TYPE_BOOL: return a->b == b->b;
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: return memcmp(&a->f, &b->f, sizeof a->f) == 0;
    case GGUF_TYPE_ARRAY: break;
    default: return a->u == b->u;
  }
  if (a->arr_type != b->arr_type || a->n != b->n) return false;
  for (uint64_t i = 0; i < a->n; i++) {
    if (a->arr_type == GGUF_TYPE_STRING) {
      if (a->strs[i].len != b->strs[i].len || memcmp(a->strs[i].ptr, b->strs[i].ptr, a->strs[i].len)) return false;
    } else if (a->arr_type == GGUF_TYPE_ARRAY) {
      if (!value_eq(&a->items[i], &b->items[i])) return false;
    }
  }
  if (a->arr_type != GGUF_TYPE_STRING && a->arr_type != GGUF_TYPE_ARRAY && a->n) {
    static const int sz[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return memcmp(a->data, b->data, a->n * sz[a->arr_type]) == 0;
  }
  return true;
}

/* ---------------------------------------------------------------------------------------- */

typedef struct tspec { const char *name; uint32_t type; uint32_t n_dims; int64_t ne[4]; uint64_t size; } tspec;

static tspec g_tensors[] = {
  {"f32.odd", FLOE_TYPE_F32, 2, {7, 3}, 84},
  {"f16.vec", FLOE_TYPE_F16, 1, {5}, 10},
  {"q4_0.m", FLOE_TYPE_Q4_0, 2, {64, 3}, 2 * 18 * 3},
  {"q8_0.3d", FLOE_TYPE_Q8_0, 3, {32, 2, 3}, 34 * 6},
  {"q4_K.m", FLOE_TYPE_Q4_K, 2, {256, 2}, 144 * 2},
  {"bf16.4d", FLOE_TYPE_BF16, 4, {3, 1, 2, 2}, 24},
  {"i8.v", FLOE_TYPE_I8, 1, {13}, 13},
  {"big", FLOE_TYPE_F32, 1, {(1 << 20) + 3}, 4 * ((1 << 20) + 3)},
  {"iq2_xxs.m", FLOE_TYPE_IQ2_XXS, 2, {256, 1}, 66},
};
#define N_TENSORS (sizeof g_tensors / sizeof g_tensors[0])

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127, -1};
static const uint16_t a_u16[] = {0, 65535, 1234};
static const int16_t a_i16[] = {-32768, 32767, -5};
static const uint32_t a_u32[] = {0, 4294967295u, 77};
static const int32_t a_i32[] = {INT32_MIN, INT32_MAX, -3, 0};
static const float a_f32[] = {1.5f, -0.0f, 3.4e38f, 1e-45f};
static const uint8_t a_bool[] = {1, 0, 1};
static const uint64_t a_u64[] = {0, UINT64_MAX, 1ull << 40};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -42};
static const double a_f64[] = {1e300, -2.5, 5e-324};
static const char *const a_str[] = {"", "x", "Grüße", "世界 🌍", "tab\tnl\n"};
static const char *const UTF8 = "Grüße, 世界 🌍";

static gguf_value arr_v(uint32_t et, const void *data, uint64_t n) {
  gguf_value v = {.type = GGUF_TYPE_ARRAY, .arr_type = et, .n = n, .data = data};
  return v;
}

/* Writes the full test file; the tensor bytes come from `data` (concatenated in order). */
static int write_full(const char *path, uint32_t alignment, const uint8_t *data, uint64_t total) {
  char err[512];
  gguf_writer *w;
  int rc = gguf_writer_open(path, &w, err, sizeof err);
  CHECK(rc == 0, "writer open: %s", err);
  if (rc) return rc;
  if (alignment != GGUF_DEFAULT_ALIGNMENT) gguf_writer_set_alignment(w, alignment);
  gguf_writer_add_str(w, "general.architecture", "test");
  gguf_writer_add_u8(w, "t.u8", 200);
  gguf_value v = {.type = GGUF_TYPE_INT8, .i = -100};
  gguf_writer_add_value(w, "t.i8", &v);
  v = (gguf_value){.type = GGUF_TYPE_UINT16, .u = 60000};
  gguf_writer_add_value(w, "t.u16", &v);
  v = (gguf_value){.type = GGUF_TYPE_INT16, .i = -30000};
  gguf_writer_add_value(w, "t.i16", &v);
  gguf_writer_add_u32(w, "t.u32", 4000000000u);
  gguf_writer_add_i32(w, "t.i32", -2000000000);
  gguf_writer_add_f32(w, "t.f32", 3.25f);
  gguf_writer_add_bool(w, "t.bool", true);
  gguf_writer_add_bool(w, "t.bool0", false);
  gguf_writer_add_str(w, "t.str", "hello");
  gguf_writer_add_str(w, "t.empty", "");
  gguf_writer_add_str(w, "t.utf8", UTF8);
  gguf_writer_add_u64(w, "t.u64", (1ull << 63) + 5);
  v = (gguf_value){.type = GGUF_TYPE_INT64, .i = -(1ll << 62) - 3};
  gguf_writer_add_value(w, "t.i64", &v);
  v = (gguf_value){.type = GGUF_TYPE_FLOAT64, .f = 1e300};
  gguf_writer_add_value(w, "t.f64", &v);
  gguf_writer_add_arr(w, "a.u8", GGUF_TYPE_UINT8, a_u8, 3);
  gguf_writer_add_arr(w, "a.i8", GGUF_TYPE_INT8, a_i8, 4);
  gguf_writer_add_arr(w, "a.u16", GGUF_TYPE_UINT16, a_u16, 3);
  gguf_writer_add_arr(w, "a.i16", GGUF_TYPE_INT16, a_i16, 3);
  gguf_writer_add_arr(w, "a.u32", GGUF_TYPE_UINT32, a_u32, 3);
  gguf_writer_add_arr(w, "a.i32", GGUF_TYPE_INT32, a_i32, 4);
  gguf_writer_add_arr(w, "a.f32", GGUF_TYPE_FLOAT32, a_f32, 4);
  gguf_writer_add_arr(w, "a.bool", GGUF_TYPE_BOOL, a_bool, 3);
  gguf_writer_add_arr(w, "a.u64", GGUF_TYPE_UINT64, a_u64, 3);
  gguf_writer_add_arr(w, "a.i64", GGUF_TYPE_INT64, a_i64, 3);
  gguf_writer_add_arr(w, "a.f64", GGUF_TYPE_FLOAT64, a_f64, 3);
  gguf_writer_add_arr_str(w, "a.str", a_str, 5);
  gguf_writer_add_arr(w, "a.empty", GGUF_TYPE_UINT32, NULL, 0);
  gguf_writer_add_arr_str(w, "a.empty_str", NULL, 0);
  /* nested: [[i32 1,2,3], [], [4]] */
  static const int32_t n1[] = {1, 2, 3}, n3[] = {4};
  gguf_value items[3] = {arr_v(GGUF_TYPE_INT32, n1, 3), arr_v(GGUF_TYPE_INT32, NULL, 0), arr_v(GGUF_TYPE_INT32, n3, 1)};
  v = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_ARRAY, .n = 3, .items = items};
  gguf_writer_add_value(w, "a.nested", &v);
  /* nested strings: [["a", "bc"], [""]] */
  gguf_str s1[2] = {{"a", 1}, {"bc", 2}}, s2[1] = {{"", 0}};
  gguf_value sitems[2] = {{.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_STRING, .n = 2, .strs = s1},
                          {.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_STRING, .n = 1, .strs = s2}};
  v = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_ARRAY, .n = 2, .items = sitems};
  gguf_writer_add_value(w, "a.nested_str", &v);
  /* 8 levels deep (the limit): [[[[[[[[u8 7]]]]]]]] */
  static const uint8_t seven = 7;
  gguf_value deep[8];
  deep[7] = arr_v(GGUF_TYPE_UINT8, &seven, 1);
  for (int d = 6; d >= 0; d--) deep[d] = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_ARRAY, .n = 1, .items = &deep[d + 1]};
  gguf_writer_add_value(w, "a.deep", &deep[0]);
  v = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_ARRAY, .n = 0};
  gguf_writer_add_value(w, "a.empty_nested", &v);

  for (size_t i = 0; i < N_TENSORS; i++)
    gguf_writer_add_tensor(w, g_tensors[i].name, g_tensors[i].type, g_tensors[i].n_dims, g_tensors[i].ne);
  rc = gguf_writer_write_header(w);
  CHECK(rc == 0, "header written: %s", gguf_writer_error(w));
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  CHECK(exists(tmp), "temp file %s exists while writing", tmp);
  /* awkward chunks, crossing tensor boundaries; one chunk larger than the 4 MiB buffer */
  static const size_t chunks[] = {1, 7, 1000, 3, 5u << 20, 65536, 13};
  uint64_t off = 0;
  for (int k = 0; off < total; k++) {
    size_t n = chunks[k % 7];
    if (n > total - off) n = (size_t)(total - off);
    rc = gguf_writer_write_data(w, data + off, n);
    if (rc) break;
    off += n;
  }
  CHECK(rc == 0, "data written: %s", gguf_writer_error(w));
  CHECK(!exists(path), "target does not exist before finish");
  rc = gguf_writer_finish(w);
  CHECK(rc == 0, "finish: %s", gguf_writer_error(NULL));
  CHECK(!exists(tmp), "temp file gone after finish");
  return rc;
}

static void check_full(const gguf_file *g, uint32_t alignment, const uint8_t *data, uint64_t n_user_kv) {
  const gguf_value *v;
  CHECK(g->version == 3, "version 3");
  CHECK(g->alignment == alignment, "alignment %llu == %u", (unsigned long long)g->alignment, alignment);
  CHECK(g->data_offset % alignment == 0, "data offset %llu aligned", (unsigned long long)g->data_offset);
  const gguf_kv *al = gguf_find_kv(g, "general.alignment");
  if (alignment == GGUF_DEFAULT_ALIGNMENT) {
    CHECK(al == NULL, "no general.alignment key at the default alignment");
    CHECK(g->n_kv == n_user_kv, "n_kv %llu", (unsigned long long)g->n_kv);
  } else {
    CHECK(al && al->val.type == GGUF_TYPE_UINT32 && al->val.u == alignment, "general.alignment = %u (u32)", alignment);
    CHECK(g->n_kv == n_user_kv + 1, "n_kv %llu", (unsigned long long)g->n_kv);
  }
  gguf_str s;
  CHECK(gguf_get_str(g, "general.architecture", &s) == 0 && str_is(s, "test"), "architecture");
  if ((v = val(g, "t.u8", GGUF_TYPE_UINT8))) CHECK(v->u == 200, "u8");
  if ((v = val(g, "t.i8", GGUF_TYPE_INT8))) CHECK(v->i == -100, "i8");
  if ((v = val(g, "t.u16", GGUF_TYPE_UINT16))) CHECK(v->u == 60000, "u16");
  if ((v = val(g, "t.i16", GGUF_TYPE_INT16))) CHECK(v->i == -30000, "i16");
  if ((v = val(g, "t.u32", GGUF_TYPE_UINT32))) CHECK(v->u == 4000000000u, "u32");
  if ((v = val(g, "t.i32", GGUF_TYPE_INT32))) CHECK(v->i == -2000000000, "i32");
  if ((v = val(g, "t.f32", GGUF_TYPE_FLOAT32))) CHECK(v->f == 3.25, "f32");
  if ((v = val(g, "t.bool", GGUF_TYPE_BOOL))) CHECK(v->b == true, "bool true");
  if ((v = val(g, "t.bool0", GGUF_TYPE_BOOL))) CHECK(v->b == false, "bool false");
  if ((v = val(g, "t.str", GGUF_TYPE_STRING))) CHECK(str_is(v->s, "hello"), "string");
  if ((v = val(g, "t.empty", GGUF_TYPE_STRING))) CHECK(v->s.len == 0, "empty string");
  if ((v = val(g, "t.utf8", GGUF_TYPE_STRING))) CHECK(str_is(v->s, UTF8) && v->s.len == strlen(UTF8), "utf-8 string");
  if ((v = val(g, "t.u64", GGUF_TYPE_UINT64))) CHECK(v->u == (1ull << 63) + 5, "u64");
  if ((v = val(g, "t.i64", GGUF_TYPE_INT64))) CHECK(v->i == -(1ll << 62) - 3, "i64");
  if ((v = val(g, "t.f64", GGUF_TYPE_FLOAT64))) CHECK(v->f == 1e300, "f64");

  struct { const char *key; uint32_t et; const void *data; uint64_t n; size_t esz; } arrs[] = {
    {"a.u8", GGUF_TYPE_UINT8, a_u8, 3, 1},       {"a.i8", GGUF_TYPE_INT8, a_i8, 4, 1},
    {"a.u16", GGUF_TYPE_UINT16, a_u16, 3, 2},    {"a.i16", GGUF_TYPE_INT16, a_i16, 3, 2},
    {"a.u32", GGUF_TYPE_UINT32, a_u32, 3, 4},    {"a.i32", GGUF_TYPE_INT32, a_i32, 4, 4},
    {"a.f32", GGUF_TYPE_FLOAT32, a_f32, 4, 4},   {"a.bool", GGUF_TYPE_BOOL, a_bool, 3, 1},
    {"a.u64", GGUF_TYPE_UINT64, a_u64, 3, 8},    {"a.i64", GGUF_TYPE_INT64, a_i64, 3, 8},
    {"a.f64", GGUF_TYPE_FLOAT64, a_f64, 3, 8},
  };
  for (size_t k = 0; k < sizeof arrs / sizeof arrs[0]; k++) {
    uint32_t et;
    uint64_t n;
    v = gguf_get_arr(g, arrs[k].key, &et, &n);
    CHECK(v && et == arrs[k].et && n == arrs[k].n, "%s: array of %llu %s", arrs[k].key, (unsigned long long)arrs[k].n,
          gguf_type_name(arrs[k].et));
    if (v && n == arrs[k].n)
      CHECK(memcmp(v->data, arrs[k].data, n * arrs[k].esz) == 0, "%s: element bytes", arrs[k].key);
  }
  int64_t x;
  double d;
  v = gguf_get_arr(g, "a.i32", NULL, NULL);
  CHECK(v && gguf_arr_i64(v, 0, &x) == 0 && x == INT32_MIN && gguf_arr_i64(v, 2, &x) == 0 && x == -3, "arr_i64 on i32");
  CHECK(v && gguf_arr_i64(v, 4, &x) == FLOE_E_INVALID, "arr_i64 index out of range");
  v = gguf_get_arr(g, "a.i8", NULL, NULL);
  CHECK(v && gguf_arr_i64(v, 0, &x) == 0 && x == -128, "arr_i64 on i8");
  v = gguf_get_arr(g, "a.u16", NULL, NULL);
  CHECK(v && gguf_arr_i64(v, 1, &x) == 0 && x == 65535, "arr_i64 on u16");
  v = gguf_get_arr(g, "a.u64", NULL, NULL);
  CHECK(v && gguf_arr_i64(v, 1, &x) == FLOE_E_FORMAT && gguf_arr_i64(v, 2, &x) == 0 && x == 1ll << 40,
        "arr_i64 on u64 (UINT64_MAX does not fit)");
  v = gguf_get_arr(g, "a.bool", NULL, NULL);
  CHECK(v && gguf_arr_i64(v, 0, &x) == 0 && x == 1 && gguf_arr_i64(v, 1, &x) == 0 && x == 0, "arr_i64 on bool");
  v = gguf_get_arr(g, "a.f32", NULL, NULL);
  CHECK(v && gguf_arr_i64(v, 0, &x) == FLOE_E_FORMAT, "arr_i64 on f32 refused");
  CHECK(v && gguf_arr_f64(v, 0, &d) == 0 && d == 1.5 && gguf_arr_f64(v, 3, &d) == 0 && d == (double)1e-45f, "arr_f64 on f32");
  v = gguf_get_arr(g, "a.f64", NULL, NULL);
  CHECK(v && gguf_arr_f64(v, 2, &d) == 0 && d == 5e-324, "arr_f64 on f64");

  uint32_t et;
  uint64_t n;
  v = gguf_get_arr(g, "a.str", &et, &n);
  CHECK(v && et == GGUF_TYPE_STRING && n == 5, "string array");
  for (uint64_t i = 0; v && i < 5 && n == 5; i++) {
    gguf_str e;
    CHECK(gguf_arr_str(v, i, &e) == 0 && str_is(e, a_str[i]), "a.str[%llu] = '%s'", (unsigned long long)i, a_str[i]);
  }
  v = gguf_get_arr(g, "a.empty", &et, &n);
  CHECK(v && et == GGUF_TYPE_UINT32 && n == 0, "empty u32 array");
  v = gguf_get_arr(g, "a.empty_str", &et, &n);
  CHECK(v && et == GGUF_TYPE_STRING && n == 0, "empty string array");
  v = gguf_get_arr(g, "a.empty_nested", &et, &n);
  CHECK(v && et == GGUF_TYPE_ARRAY && n == 0, "empty array of arrays");
  v = gguf_get_arr(g, "a.nested", &et, &n);
  CHECK(v && et == GGUF_TYPE_ARRAY && n == 3, "nested array");
  if (v && n == 3) {
    CHECK(v->items[0].type == GGUF_TYPE_ARRAY && v->items[0].arr_type == GGUF_TYPE_INT32 && v->items[0].n == 3,
          "nested[0] is i32[3]");
    CHECK(gguf_arr_i64(&v->items[0], 2, &x) == 0 && x == 3, "nested[0][2] == 3");
    CHECK(v->items[1].arr_type == GGUF_TYPE_INT32 && v->items[1].n == 0, "nested[1] empty");
    CHECK(gguf_arr_i64(&v->items[2], 0, &x) == 0 && x == 4 && v->items[2].n == 1, "nested[2] == [4]");
  }
  v = gguf_get_arr(g, "a.nested_str", &et, &n);
  CHECK(v && et == GGUF_TYPE_ARRAY && n == 2, "nested string array");
  if (v && n == 2) {
    CHECK(v->items[0].arr_type == GGUF_TYPE_STRING && v->items[0].n == 2 && str_is(v->items[0].strs[0], "a") &&
              str_is(v->items[0].strs[1], "bc"),
          "nested_str[0] = [a, bc]");
    CHECK(v->items[1].n == 1 && v->items[1].strs[0].len == 0, "nested_str[1] = ['']");
  }
  v = gguf_get_arr(g, "a.deep", &et, &n);
  int depth = 0;
  while (v && v->type == GGUF_TYPE_ARRAY && v->arr_type == GGUF_TYPE_ARRAY && v->n == 1) { v = &v->items[0]; depth++; }
  CHECK(depth == 7 && v && v->arr_type == GGUF_TYPE_UINT8 && v->n == 1 && ((const uint8_t *)v->data)[0] == 7,
        "8-deep nested array read back (depth %d)", depth);

  /* tensors */
  CHECK(g->n_tensors == N_TENSORS, "n_tensors %llu", (unsigned long long)g->n_tensors);
  uint64_t expect_off = 0, doff = 0;
  for (size_t i = 0; i < N_TENSORS && i < g->n_tensors; i++) {
    const tspec *ts = &g_tensors[i];
    const gguf_tensor *t = &g->tensors[i];
    CHECK(str_is(t->name, ts->name), "tensor %zu is '%s'", i, ts->name);
    CHECK(gguf_find_tensor(g, ts->name) == t, "find_tensor('%s')", ts->name);
    CHECK(t->type == ts->type && t->n_dims == ts->n_dims, "%s: type %u, n_dims %u", ts->name, t->type, t->n_dims);
    bool ne_ok = true;
    for (int k = 0; k < 4; k++) ne_ok &= t->ne[k] == (k < (int)ts->n_dims ? ts->ne[k] : 1);
    CHECK(ne_ok, "%s: ne", ts->name);
    CHECK(t->size == ts->size, "%s: size %llu == %llu", ts->name, (unsigned long long)t->size,
          (unsigned long long)ts->size);
    CHECK(t->offset == expect_off && t->offset % alignment == 0, "%s: offset %llu (expected %llu, aligned)", ts->name,
          (unsigned long long)t->offset, (unsigned long long)expect_off);
    CHECK(t->data == g->map + g->data_offset + t->offset, "%s: data pointer", ts->name);
    CHECK(memcmp(t->data, data + doff, ts->size) == 0, "%s: every byte equal", ts->name);
    /* the padding the writer inserted is zeros */
    bool pad0 = true;
    for (uint64_t j = t->size; j < align_up(t->size, alignment); j++) pad0 &= t->data[j] == 0;
    CHECK(pad0, "%s: padding is zero", ts->name);
    expect_off = align_up(t->offset + t->size, alignment);
    doff += ts->size;
  }
  CHECK(g->map_size == g->data_offset + expect_off, "file size %llu == data offset + padded data %llu",
        (unsigned long long)g->map_size, (unsigned long long)(g->data_offset + expect_off));
  bool hdr_pad0 = true;
  const gguf_tensor *last = &g->tensors[g->n_tensors - 1];
  const uint8_t *hdr_end = (const uint8_t *)last->name.ptr + last->name.len + 4 + 8 * last->n_dims + 4 + 8;
  for (const uint8_t *p = hdr_end; p < g->map + g->data_offset; p++) hdr_pad0 &= *p == 0;
  CHECK(hdr_pad0 && (uint64_t)(g->map + g->data_offset - hdr_end) < alignment, "header padding is zero and short");
}

static void test_roundtrip(uint32_t alignment) {
  SECTION("round trip, alignment %u", alignment);
  uint64_t total = 0;
  for (size_t i = 0; i < N_TENSORS; i++) total += g_tensors[i].size;
  uint8_t *data = malloc(total);
  floe_rng rng;
  floe_rng_seed(&rng, 1234 + alignment);
  for (uint64_t i = 0; i < total; i++) data[i] = (uint8_t)floe_rng_u64(&rng);
  char name[64];
  snprintf(name, sizeof name, "gguf_rt_%u.gguf", alignment);
  const char *path = test_tmp(name);
  unlink(path);
  if (write_full(path, alignment, data, total) == 0) {
    gguf_file *g;
    char err[512];
    int rc = gguf_open(path, &g, err, sizeof err);
    CHECK(rc == 0, "open: %s", err);
    if (rc == 0) {
      CHECK(fsize(path) == g->map_size, "mapped the whole file");
      check_full(g, alignment, data, 34);

      /* the same through gguf_open_buffer */
      gguf_file *gb;
      rc = gguf_open_buffer(g->map, g->map_size, "buf.gguf", &gb, err, sizeof err);
      CHECK(rc == 0, "open_buffer: %s", err);
      if (rc == 0) {
        CHECK(strcmp(gb->path, "buf.gguf") == 0, "buffer name kept");
        check_full(gb, alignment, data, 34);
        gguf_close(gb);
      }

      /* copy every KV and tensor into a second file through add_kv (nested values included) */
      const char *path2 = test_tmp("gguf_rt_copy.gguf");
      gguf_writer *w;
      rc = gguf_writer_open(path2, &w, err, sizeof err);
      for (uint64_t i = 0; i < g->n_kv; i++) gguf_writer_add_kv(w, &g->kv[i]);
      for (uint64_t i = 0; i < g->n_tensors; i++) {
        char tn[128];
        snprintf(tn, sizeof tn, "%.*s", (int)g->tensors[i].name.len, g->tensors[i].name.ptr);
        gguf_writer_add_tensor(w, tn, g->tensors[i].type, g->tensors[i].n_dims, g->tensors[i].ne);
      }
      for (uint64_t i = 0; i < g->n_tensors; i++) gguf_writer_write_data(w, g->tensors[i].data, g->tensors[i].size);
      rc = gguf_writer_finish_err(w, err, sizeof err);
      CHECK(rc == 0, "copy written: %s", err);
      gguf_file *g2;
      rc = gguf_open(path2, &g2, err, sizeof err);
      CHECK(rc == 0, "copy opened: %s", err);
      if (rc == 0) {
        CHECK(g2->n_kv == g->n_kv && g2->alignment == g->alignment, "copy: same n_kv and alignment");
        bool all = true;
        for (uint64_t i = 0; i < g->n_kv; i++) {
          char k[256];
          snprintf(k, sizeof k, "%.*s", (int)g->kv[i].key.len, g->kv[i].key.ptr);
          const gguf_kv *kv2 = gguf_find_kv(g2, k);
          all &= kv2 && value_eq(&g->kv[i].val, &kv2->val);
        }
        CHECK(all, "copy: every value equal (incl. nested)");
        CHECK(g2->map_size == g->map_size && memcmp(g2->map, g->map, g->map_size) == 0,
              "copy: byte-identical file (deterministic writer)");
        gguf_close(g2);
      }
      unlink(path2);
      gguf_close(g);
    }
  }
  unlink(path);
  free(data);
}

static void test_getters(void) {
  SECTION("typed getters");
  const char *path = test_tmp("gguf_getters.gguf");
  char err[512];
  gguf_writer *w;
  CHECK(gguf_writer_open(path, &w, err, sizeof err) == 0, "open");
  gguf_writer_add_u8(w, "u8", 200);
  gguf_writer_add_i32(w, "neg", -5);
  gguf_writer_add_i32(w, "pos", 5);
  gguf_writer_add_u64(w, "big", 1ull << 40);
  gguf_writer_add_u64(w, "huge", UINT64_MAX);
  gguf_writer_add_f32(w, "f", 0.5f);
  gguf_value v = {.type = GGUF_TYPE_FLOAT64, .f = 0.25};
  gguf_writer_add_value(w, "d", &v);
  gguf_writer_add_bool(w, "b", true);
  gguf_writer_add_str(w, "s", "str");
  gguf_writer_add_arr(w, "arr", GGUF_TYPE_UINT8, "ab", 2);
  CHECK(gguf_writer_finish(w) == 0, "finish: %s", gguf_writer_error(NULL));
  gguf_file *g;
  int rc = gguf_open(path, &g, err, sizeof err);
  CHECK(rc == 0, "open: %s", err);
  if (rc) return;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  int64_t i64 = 0;
  float f = 0;
  bool b = false;
  gguf_str s;
  CHECK(gguf_get_u32(g, "u8", &u32) == 0 && u32 == 200, "u32 from u8");
  CHECK(gguf_get_u32(g, "pos", &u32) == 0 && u32 == 5, "u32 from positive i32");
  CHECK(gguf_get_u32(g, "neg", &u32) == FLOE_E_FORMAT, "u32 from negative i32 refused");
  CHECK(gguf_get_u32(g, "big", &u32) == FLOE_E_FORMAT, "u32 from 2^40 refused");
  CHECK(gguf_get_u64(g, "big", &u64) == 0 && u64 == 1ull << 40, "u64");
  CHECK(gguf_get_u64(g, "neg", &u64) == FLOE_E_FORMAT, "u64 from negative refused");
  CHECK(gguf_get_i64(g, "neg", &i64) == 0 && i64 == -5, "i64 from i32");
  CHECK(gguf_get_i64(g, "huge", &i64) == FLOE_E_FORMAT, "i64 from UINT64_MAX refused");
  CHECK(gguf_get_i64(g, "u8", &i64) == 0 && i64 == 200, "i64 from u8");
  CHECK(gguf_get_f32(g, "f", &f) == 0 && f == 0.5f, "f32");
  CHECK(gguf_get_f32(g, "d", &f) == 0 && f == 0.25f, "f32 from f64");
  CHECK(gguf_get_f32(g, "pos", &f) == 0 && f == 5.0f, "f32 from integer");
  CHECK(gguf_get_f32(g, "s", &f) == FLOE_E_FORMAT, "f32 from string refused");
  CHECK(gguf_get_bool(g, "b", &b) == 0 && b, "bool");
  CHECK(gguf_get_bool(g, "u8", &b) == FLOE_E_FORMAT, "bool from u8 refused");
  CHECK(gguf_get_str(g, "s", &s) == 0 && str_is(s, "str"), "string");
  CHECK(gguf_get_str(g, "u8", &s) == FLOE_E_FORMAT, "string from u8 refused");
  CHECK(gguf_get_u32(g, "f", &u32) == FLOE_E_FORMAT, "u32 from f32 refused");
  CHECK(gguf_get_u32(g, "arr", &u32) == FLOE_E_FORMAT, "u32 from array refused");
  CHECK(gguf_get_u32(g, "missing", &u32) == FLOE_E_NOTFOUND, "absent key: NOTFOUND");
  CHECK(gguf_get_str(g, "missing", &s) == FLOE_E_NOTFOUND, "absent string: NOTFOUND");
  uint32_t et = 99;
  uint64_t n = 99;
  CHECK(gguf_get_arr(g, "missing", &et, &n) == NULL && et == 0 && n == 0, "absent array: NULL/0");
  CHECK(gguf_get_arr(g, "u8", &et, &n) == NULL, "scalar is not an array");
  CHECK(gguf_find_kv(g, "u") == NULL && gguf_find_kv(g, "u88") == NULL, "prefix/extension of a key is not found");
  CHECK(g->n_tensors == 0 && g->data_offset % 32 == 0, "file without tensors");
  gguf_close(g);
  unlink(path);
}

/* Expects the sticky writer error `code` with `sub` in the message; no file left behind. */
static void expect_writer_fail(gguf_writer *w, const char *path, int code, const char *sub, const char *what) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  char err[512] = "";
  int rc = gguf_writer_finish_err(w, err, sizeof err);
  CHECK(rc == code && strstr(err, sub) && strstr(err, path), "%s: rc %d (want %d), '%s' (want '%s')", what, rc, code,
        err, sub);
  CHECK(strcmp(gguf_writer_error(NULL), err) == 0, "%s: gguf_writer_error(NULL) keeps the message", what);
  CHECK(!exists(path) && !exists(tmp), "%s: neither target nor temp file left", what);
}

static void test_writer_errors(void) {
  SECTION("writer errors");
  const char *path = test_tmp("gguf_werr.gguf");
  unlink(path);
  char err[512];
  gguf_writer *w;
  static const int64_t ne8[] = {8, 2}, ne33[] = {33}, ne0[] = {4, 0}, ne32[] = {32};
  uint8_t bytes[256] = {0};

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_u32(w, "k", 1);
  CHECK(gguf_writer_add_str(w, "k", "again") == FLOE_E_INVALID, "duplicate key refused");
  CHECK(gguf_writer_add_u32(w, "other", 2) == FLOE_E_INVALID, "errors are sticky");
  CHECK(strstr(gguf_writer_error(w), "duplicate key 'k'") != NULL, "message: %s", gguf_writer_error(w));
  expect_writer_fail(w, path, FLOE_E_INVALID, "duplicate key 'k'", "duplicate key");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_F32, 2, ne8);
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_F16, 1, ne32);
  expect_writer_fail(w, path, FLOE_E_INVALID, "duplicate tensor name 't'", "duplicate tensor");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "t", 4, 1, ne32);
  expect_writer_fail(w, path, FLOE_E_UNSUPPORTED, "unknown type id 4", "unknown tensor type");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_Q8_0, 1, ne33);
  expect_writer_fail(w, path, FLOE_E_INVALID, "not a multiple of the block size 32", "ne0 not a block multiple");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_F32, 5, (const int64_t[]){1, 1, 1, 1, 1});
  expect_writer_fail(w, path, FLOE_E_INVALID, "n_dims = 5", "n_dims 5");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_F32, 2, ne0);
  expect_writer_fail(w, path, FLOE_E_INVALID, "ne[1] = 0", "ne 0");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_F32, 2, (const int64_t[]){1ll << 40, 1ll << 30});
  expect_writer_fail(w, path, FLOE_E_OVERFLOW, "overflows", "element count overflow");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "0123456789012345678901234567890123456789012345678901234567890123", FLOE_TYPE_F32, 1, ne32);
  expect_writer_fail(w, path, FLOE_E_INVALID, "llama.cpp allows at most 63", "64-byte tensor name");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_set_alignment(w, 3);
  expect_writer_fail(w, path, FLOE_E_INVALID, "alignment 3 is not a power of two", "alignment 3");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_set_alignment(w, 0);
  expect_writer_fail(w, path, FLOE_E_INVALID, "alignment 0", "alignment 0");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_str(w, "general.alignment", "64");
  expect_writer_fail(w, path, FLOE_E_INVALID, "general.alignment", "general.alignment as a string");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "a", FLOE_TYPE_F32, 2, ne8);
  gguf_writer_add_tensor(w, "b", FLOE_TYPE_F32, 1, ne32);
  gguf_writer_write_data(w, bytes, 64 + 100);
  expect_writer_fail(w, path, FLOE_E_INVALID, "tensor 'b': 100 of 128 bytes written", "short data");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "a", FLOE_TYPE_F32, 2, ne8);
  CHECK(gguf_writer_write_data(w, bytes, 65) == FLOE_E_INVALID, "too much data refused");
  expect_writer_fail(w, path, FLOE_E_INVALID, "past the end of the last tensor", "too much data");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "a", FLOE_TYPE_F32, 2, ne8);
  gguf_writer_write_data(w, bytes, 10);
  CHECK(gguf_writer_add_u32(w, "late", 1) == FLOE_E_INVALID, "key after header refused");
  expect_writer_fail(w, path, FLOE_E_INVALID, "after the header", "key after header");

  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_write_header(w);
  gguf_writer_set_alignment(w, 64);
  expect_writer_fail(w, path, FLOE_E_INVALID, "alignment set after the header", "alignment after header");

  /* 9 levels of nesting: one more than the reader accepts */
  gguf_writer_open(path, &w, err, sizeof err);
  static const uint8_t one = 1;
  gguf_value deep[9];
  deep[8] = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_UINT8, .n = 1, .data = &one};
  for (int d = 7; d >= 0; d--) deep[d] = (gguf_value){.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_ARRAY, .n = 1, .items = &deep[d + 1]};
  gguf_writer_add_value(w, "deep", &deep[0]);
  expect_writer_fail(w, path, FLOE_E_INVALID, "nested deeper than 8", "9-deep nesting");

  /* general.alignment through add_u32 sets the alignment */
  gguf_writer_open(path, &w, err, sizeof err);
  CHECK(gguf_writer_add_u32(w, "general.alignment", 128) == 0, "add_u32(general.alignment) accepted");
  gguf_writer_add_tensor(w, "a", FLOE_TYPE_F32, 2, ne8);
  gguf_writer_add_tensor(w, "b", FLOE_TYPE_F32, 1, ne32);
  gguf_writer_write_data(w, bytes, 64);
  gguf_writer_write_data(w, bytes, 128);
  CHECK(gguf_writer_finish(w) == 0, "finish: %s", gguf_writer_error(NULL));
  gguf_file *g;
  int rc = gguf_open(path, &g, err, sizeof err);
  CHECK(rc == 0 && g->alignment == 128 && g->n_kv == 1 && g->tensors[1].offset == 128 && g->data_offset % 128 == 0,
        "alignment 128 via add_u32: %s", rc ? err : "ok");
  if (!rc) gguf_close(g);

  /* an existing file is replaced only at finish; abort leaves it intact */
  uint64_t before = fsize(path);
  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_tensor(w, "a", FLOE_TYPE_F32, 2, ne8);
  gguf_writer_write_data(w, bytes, 20);
  gguf_writer_abort(w);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  CHECK(fsize(path) == before && !exists(tmp), "abort: old file intact, temp removed");
  unlink(path);

  CHECK(gguf_writer_open("/nonexistent-dir/x.gguf", &w, err, sizeof err) == FLOE_E_IO && strstr(err, "cannot create"),
        "writer open in a missing directory: %s", err);
  CHECK(gguf_open("/nonexistent-dir/x.gguf", &g, err, sizeof err) == FLOE_E_IO && g == NULL &&
            strstr(err, "/nonexistent-dir/x.gguf"),
        "reader open of a missing file: %s", err);
}

static void test_many_tensors(void) {
  SECTION("3000 tensors: hash lookups");
  enum { N = 3000 };
  const char *path = test_tmp("gguf_many.gguf");
  char err[512];
  gguf_writer *w;
  CHECK(gguf_writer_open(path, &w, err, sizeof err) == 0, "open");
  for (int i = 0; i < N; i++) {
    char name[64], key[64];
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", i);
    gguf_writer_add_tensor(w, name, FLOE_TYPE_F32, 1, (const int64_t[]){1 + i % 5});
    if (i % 10 == 0) {
      snprintf(key, sizeof key, "k.%d", i);
      gguf_writer_add_u32(w, key, (uint32_t)i);
    }
  }
  for (int i = 0; i < N; i++) {
    float x[5] = {(float)i, (float)i, (float)i, (float)i, (float)i};
    gguf_writer_write_data(w, x, sizeof(float) * (1 + i % 5));
  }
  CHECK(gguf_writer_finish(w) == 0, "finish: %s", gguf_writer_error(NULL));
  gguf_file *g;
  int rc = gguf_open(path, &g, err, sizeof err);
  CHECK(rc == 0, "open: %s", err);
  if (rc) return;
  int found = 0, kv_found = 0;
  double t0 = floe_time_s();
  for (int i = 0; i < N; i++) {
    char name[64], key[64];
    snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", i);
    const gguf_tensor *t = gguf_find_tensor(g, name);
    float x;
    if (t) memcpy(&x, t->data + 4 * (i % 5), 4);
    found += t && t->ne[0] == 1 + i % 5 && x == (float)i;
    snprintf(key, sizeof key, "k.%d", i);
    uint32_t u;
    kv_found += i % 10 == 0 ? gguf_get_u32(g, key, &u) == 0 && u == (uint32_t)i : gguf_find_kv(g, key) == NULL;
  }
  double dt = floe_time_s() - t0;
  CHECK(found == N, "all %d tensors found with their data (%d)", N, found);
  CHECK(kv_found == N, "keys found / absent as written");
  CHECK(gguf_find_tensor(g, "blk.3000.ffn_up_exps.weight") == NULL && gguf_find_tensor(g, "") == NULL, "absent names");
  CHECK(dt < 0.5, "%d lookups took %.3f ms", 2 * N, dt * 1e3);
  gguf_close(g);
  unlink(path);
}

static void test_golden_quant(void) {
  SECTION("golden quant fixtures (tests/fixtures/quant)");
  static const char *const files[] = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k",
                                      "q5_k", "q6_k", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
                                      "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "mxfp4", "f16", "bf16"};
  static const char *const with_imatrix[] = {"iq2_xxs", "iq2_xs", "iq1_s", "iq3_xxs", "iq2_s", "iq1_m"};
  uint8_t *src0 = NULL, *x0 = NULL;
  int n_ok = 0;
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    char name[64];
    snprintf(name, sizeof name, "quant/%s.gguf", files[f]);
    const char *path = test_fixture(name);
    gguf_file *g;
    char err[512];
    int rc = gguf_open(path, &g, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", files[f], err);
    if (rc) continue;
    bool ok = g->version == 3 && g->alignment == 32 && gguf_find_kv(g, "general.alignment") == NULL;
    gguf_str ts, prov;
    uint32_t seed = 0;
    ok &= gguf_get_str(g, "floe.test.type", &ts) == 0 && gguf_get_u32(g, "floe.test.seed", &seed) == 0 && seed == 1 &&
          gguf_get_str(g, "floe.test.ggml", &prov) == 0 && prov.len > 0;
    char tname[32] = "";
    if (ok) snprintf(tname, sizeof tname, "%.*s", (int)ts.len, ts.ptr);
    ok &= strcasecmp(tname, files[f]) == 0;
    int type = floe_type_from_name(tname);
    const floe_type_traits *tt = type >= 0 ? floe_type_info((uint32_t)type) : NULL;
    CHECK(ok && tt, "%s: metadata (floe.test.type = '%s', seed %u, v%u, alignment %llu)", files[f], tname, seed,
          g->version, (unsigned long long)g->alignment);
    if (!tt) { gguf_close(g); continue; }
    struct { const char *n; uint32_t type; uint32_t nd; int64_t ne0, ne1; } want[] = {
      {"src", FLOE_TYPE_F32, 2, 512, 8}, {"q", (uint32_t)type, 2, 512, 8}, {"deq", FLOE_TYPE_F32, 2, 512, 8},
      {"x", FLOE_TYPE_F32, 1, 512, 1},   {"dot", FLOE_TYPE_F32, 1, 8, 1},
    };
    bool shapes = true;
    for (int k = 0; k < 5; k++) {
      const gguf_tensor *t = gguf_find_tensor(g, want[k].n);
      shapes &= t && t->type == want[k].type && t->n_dims == want[k].nd && t->ne[0] == want[k].ne0 &&
                t->ne[1] == want[k].ne1 && t->ne[2] == 1 && t->ne[3] == 1;
      if (t && k == 1) shapes &= t->size == 8 * floe_row_bytes((uint32_t)type, 512);
    }
    bool want_imx = false;
    for (size_t k = 0; k < 6; k++) want_imx |= strcmp(files[f], with_imatrix[k]) == 0;
    const gguf_tensor *imx = gguf_find_tensor(g, "imatrix");
    shapes &= want_imx ? (imx && imx->type == FLOE_TYPE_F32 && imx->ne[0] == 512 && imx->n_dims == 1) : imx == NULL;
    shapes &= g->n_tensors == (want_imx ? 6u : 5u);
    CHECK(shapes, "%s: tensor names, types and shapes%s", files[f], want_imx ? " (with imatrix)" : "");
    /* same seed: src and x identical across files */
    const gguf_tensor *src = gguf_find_tensor(g, "src"), *x = gguf_find_tensor(g, "x");
    if (src && x) {
      if (!src0) {
        src0 = malloc(src->size);
        x0 = malloc(x->size);
        memcpy(src0, src->data, src->size);
        memcpy(x0, x->data, x->size);
      } else {
        CHECK(memcmp(src0, src->data, src->size) == 0 && memcmp(x0, x->data, x->size) == 0,
              "%s: src and x identical to the first file's", files[f]);
      }
      /* sanity: finite values */
      bool finite = true;
      for (uint64_t j = 0; j < src->size / 4; j++) {
        float v;
        memcpy(&v, src->data + 4 * j, 4);
        finite &= isfinite(v);
      }
      CHECK(finite, "%s: src is finite", files[f]);
    }
    /* ggml wrote these files: rewriting them through floe's writer must give the same bytes
     * (same KV/tensor-info encoding, offsets, header and tensor padding as ggml's gguf.cpp) */
    const char *rw = test_tmp("gguf_golden_rewrite.gguf");
    gguf_writer *w;
    rc = gguf_writer_open(rw, &w, err, sizeof err);
    for (uint64_t i = 0; !rc && i < g->n_kv; i++) gguf_writer_add_kv(w, &g->kv[i]);
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++) {
      char tn[128];
      snprintf(tn, sizeof tn, "%.*s", (int)g->tensors[i].name.len, g->tensors[i].name.ptr);
      gguf_writer_add_tensor(w, tn, g->tensors[i].type, g->tensors[i].n_dims, g->tensors[i].ne);
    }
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++) gguf_writer_write_data(w, g->tensors[i].data, g->tensors[i].size);
    if (!rc) rc = gguf_writer_finish_err(w, err, sizeof err);
    gguf_file *g2 = NULL;
    if (!rc) rc = gguf_open(rw, &g2, err, sizeof err);
    CHECK(rc == 0 && g2->map_size == g->map_size && memcmp(g2->map, g->map, g->map_size) == 0,
          "%s: floe's writer reproduces ggml's file byte for byte%s%s", files[f], rc ? ": " : "", rc ? err : "");
    if (g2) gguf_close(g2);
    unlink(rw);
    n_ok++;
    gguf_close(g);
  }
  CHECK(n_ok == 22, "all 22 golden files opened (%d)", n_ok);
  free(src0);
  free(x0);
}

static void test_version2(void) {
  SECTION("GGUF v2 is accepted for reading");
  const char *path = test_tmp("gguf_v2.gguf");
  char err[512];
  gguf_writer *w;
  gguf_writer_open(path, &w, err, sizeof err);
  gguf_writer_add_str(w, "general.name", "v2");
  gguf_writer_add_tensor(w, "t", FLOE_TYPE_F32, 1, (const int64_t[]){3});
  gguf_writer_write_data(w, (const float[]){1, 2, 3}, 12);
  CHECK(gguf_writer_finish(w) == 0, "finish");
  FILE *f = fopen(path, "rb");
  uint8_t buf[512];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (f) fclose(f);
  buf[4] = 2;
  gguf_file *g;
  int rc = gguf_open_buffer(buf, n, "v2.gguf", &g, err, sizeof err);
  CHECK(rc == 0 && g->version == 2 && g->n_tensors == 1, "v2 opened: %s", rc ? err : "ok");
  if (!rc) gguf_close(g);
  unlink(path);
}

int main(void) {
  test_roundtrip(64);
  test_roundtrip(32);
  test_roundtrip(1);
  test_getters();
  test_writer_errors();
  test_many_tensors();
  test_version2();
  test_golden_quant();
  return TEST_DONE();
}
