/* Golden vectors from ggml (tests/fixtures/quant/<type>.gguf, see README.md there):
 *  - the compiled tables (src/quant/tables.c) equal tests/fixtures/quant/tables.txt,
 *  - floe_type_info traits match the files (name spelling, block size, bytes),
 *  - quant_dequant_row(q) == deq bit for bit, for all 22 formats,
 *  - quant_dot_ref(q, x) within 1e-5 * sum|deq*x| of dot,
 *  - requantizing src (with imatrix where the file has one) gives q byte for byte, for every
 *    type floe can quantize.
 * The GGUF files are parsed here by a tiny self-contained reader so this test does not depend on
 * src/format. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "quant/tables.h"
#include "test.h"

typedef struct {
  char name[64];
  uint32_t type;
  int64_t ne[4];
  int n_dims;
  const uint8_t *data;
} gt_tensor;

typedef struct {
  uint8_t *buf;
  size_t size;
  char type_name[32];
  int n_tensors;
  gt_tensor t[8];
} gt_file;

typedef struct { const uint8_t *p, *end; int bad; } rd;

static uint64_t rd_n(rd *r, size_t n) {
  uint64_t v = 0;
  if (r->bad || (size_t)(r->end - r->p) < n) { r->bad = 1; return 0; }
  memcpy(&v, r->p, n);
  r->p += n;
  return v;
}

static void rd_str(rd *r, char *out, size_t cap) {
  uint64_t len = rd_n(r, 8);
  if (r->bad || len > (uint64_t)(r->end - r->p)) { r->bad = 1; return; }
  if (out) {
    size_t k = len < cap - 1 ? (size_t)len : cap - 1;
    memcpy(out, r->p, k);
    out[k] = 0;
  }
  r->p += len;
}

static void rd_skip_val(rd *r, uint32_t vt) {
  static const int sz[13] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
  if (vt == 8) { rd_str(r, NULL, 0); return; }
  if (vt == 9) {
    uint32_t et = (uint32_t)rd_n(r, 4);
    uint64_t n = rd_n(r, 8);
    for (uint64_t i = 0; i < n && !r->bad; i++) rd_skip_val(r, et);
    return;
  }
  if (vt > 12) { r->bad = 1; return; }
  rd_n(r, (size_t)sz[vt]);
}

static int gt_load(const char *path, gt_file *f) {
  memset(f, 0, sizeof *f);
  FILE *fp = fopen(path, "rb");
  if (!fp) return -1;
  fseek(fp, 0, SEEK_END);
  f->size = (size_t)ftell(fp);
  fseek(fp, 0, SEEK_SET);
  f->buf = malloc(f->size);
  if (!f->buf || fread(f->buf, 1, f->size, fp) != f->size) { fclose(fp); return -1; }
  fclose(fp);
  rd r = { f->buf, f->buf + f->size, 0 };
  if (rd_n(&r, 4) != 0x46554747u || rd_n(&r, 4) != 3) return -1;
  uint64_t nt = rd_n(&r, 8), nkv = rd_n(&r, 8);
  if (nt > 8) return -1;
  for (uint64_t i = 0; i < nkv && !r.bad; i++) {
    char key[128];
    rd_str(&r, key, sizeof key);
    uint32_t vt = (uint32_t)rd_n(&r, 4);
    if (strcmp(key, "floe.test.type") == 0 && vt == 8) rd_str(&r, f->type_name, sizeof f->type_name);
    else rd_skip_val(&r, vt);
  }
  uint64_t offs[8];
  for (uint64_t i = 0; i < nt && !r.bad; i++) {
    gt_tensor *t = &f->t[i];
    rd_str(&r, t->name, sizeof t->name);
    t->n_dims = (int)rd_n(&r, 4);
    if (t->n_dims < 1 || t->n_dims > 4) return -1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (int d = 0; d < t->n_dims; d++) t->ne[d] = (int64_t)rd_n(&r, 8);
    t->type = (uint32_t)rd_n(&r, 4);
    offs[i] = rd_n(&r, 8);
  }
  if (r.bad) return -1;
  size_t data0 = ((size_t)(r.p - f->buf) + 31) / 32 * 32;
  for (uint64_t i = 0; i < nt; i++) {
    gt_tensor *t = &f->t[i];
    size_t rb = floe_row_bytes(t->type, t->ne[0]);
    if (!rb || data0 + offs[i] + rb * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]) > f->size) return -1;
    t->data = f->buf + data0 + offs[i];
  }
  f->n_tensors = (int)nt;
  return 0;
}

static const gt_tensor *gt_get(const gt_file *f, const char *name) {
  for (int i = 0; i < f->n_tensors; i++)
    if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
  return NULL;
}

/* Re-parse tables.txt and compare every table with the compiled one. */
static void check_tables(void) {
  SECTION("tables.txt vs compiled tables");
  FILE *fp = fopen(test_fixture("quant/tables.txt"), "r");
  CHECK(fp != NULL, "open tables.txt");
  if (!fp) return;
  char line[4096];
  const quant_table_info *cur = NULL;
  int idx = 0, n_tables = 0, mismatches = 0;
  while (fgets(line, sizeof line, fp)) {
    if (line[0] == '#') continue;
    char name[64], et[16];
    int count;
    if (sscanf(line, "table %63s %15s %d", name, et, &count) == 3) {
      cur = NULL;
      for (int i = 0; i < QUANT_TABLES_COUNT; i++)
        if (strcmp(quant_tables[i].name, name) == 0) cur = &quant_tables[i];
      CHECK(cur != NULL, "table %s is compiled in", name);
      if (cur) CHECK(cur->count == count, "table %s count %d == %d", name, cur->count, count);
      idx = 0;
      n_tables++;
      continue;
    }
    if (!cur) continue;
    char *s = line, *e;
    for (;;) {
      long long sv = 0;
      unsigned long long uv = 0;
      if (cur->is_signed) sv = strtoll(s, &e, 0);
      else uv = strtoull(s, &e, 0);
      if (e == s) break;
      s = e;
      if (idx >= cur->count) { mismatches++; continue; }
      uint64_t have = 0;
      if (cur->elem_bytes == 1) have = cur->is_signed ? (uint64_t)(int64_t)((const int8_t *)cur->data)[idx]
                                                      : ((const uint8_t *)cur->data)[idx];
      else if (cur->elem_bytes == 4) have = ((const uint32_t *)cur->data)[idx];
      else have = ((const uint64_t *)cur->data)[idx];
      uint64_t want = cur->is_signed ? (uint64_t)(int64_t)sv : (uint64_t)uv;
      if (have != want) mismatches++;
      idx++;
    }
  }
  fclose(fp);
  CHECK(n_tables == QUANT_TABLES_COUNT, "%d tables in tables.txt, %d compiled", n_tables, QUANT_TABLES_COUNT);
  CHECK(mismatches == 0, "%d table values differ from tables.txt (re-run tools/gen_tables.py)", mismatches);
}

static const char *k_files[] = { "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k",
                                 "q5_k", "q6_k", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
                                 "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "mxfp4", "f16", "bf16" };

static void check_file(const char *stem) {
  char rel[64];
  snprintf(rel, sizeof rel, "quant/%s.gguf", stem);
  gt_file f;
  int rc = gt_load(test_fixture(rel), &f);
  CHECK(rc == 0, "%s: load", rel);
  if (rc) { free(f.buf); return; }
  const gt_tensor *src = gt_get(&f, "src"), *q = gt_get(&f, "q"), *deq = gt_get(&f, "deq");
  const gt_tensor *x = gt_get(&f, "x"), *dot = gt_get(&f, "dot"), *imat = gt_get(&f, "imatrix");
  CHECK(src && q && deq && x && dot, "%s: has src, q, deq, x, dot", stem);
  if (!(src && q && deq && x && dot)) { free(f.buf); return; }
  SECTION("%s (type %u%s)", f.type_name, q->type, imat ? ", imatrix" : "");
  const floe_type_traits *tt = floe_type_info(q->type);
  CHECK(tt != NULL, "%s: type %u known", stem, q->type);
  if (!tt) { free(f.buf); return; }
  CHECK(strcmp(tt->name, f.type_name) == 0, "%s: name '%s' == ggml's '%s'", stem, tt->name, f.type_name);
  CHECK(floe_type_from_name(f.type_name) == (int)q->type, "%s: from_name", stem);
  CHECK(tt->supported, "%s: supported", stem);
  const int64_t n = q->ne[0], rows = q->ne[1];
  const size_t rb = floe_row_bytes(q->type, n);
  float *out = malloc((size_t)n * sizeof(float));
  const float *xs = (const float *)x->data;
  int bit_mismatch = 0, dot_bad = 0, q_mismatch_rows = 0;
  double worst_dot = 0;
  uint8_t *qq = malloc(rb);
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *qrow = q->data + r * rb;
    const float *drow = (const float *)deq->data + r * n;
    quant_dequant_row(q->type, qrow, out, n);
    if (memcmp(out, drow, (size_t)n * sizeof(float)) != 0) {
      bit_mismatch++;
      for (int64_t j = 0; j < n; j++)
        if (memcmp(&out[j], &drow[j], 4)) {
          printf("  %s row %lld elem %lld: got %.9g want %.9g\n", stem, (long long)r, (long long)j, out[j], drow[j]);
          break;
        }
    }
    double S = 0;
    for (int64_t j = 0; j < n; j++) S += fabs((double)drow[j] * xs[j]);
    const float d = quant_dot_ref(q->type, qrow, xs, n);
    const double err = fabs((double)d - ((const float *)dot->data)[r]);
    if (err > 1e-5 * S) dot_bad++;
    if (S > 0 && err / S > worst_dot) worst_dot = err / S;
    if (quant_can_quantize(q->type)) {
      const float *srow = (const float *)src->data + r * n;
      memset(qq, 0xAA, rb);
      CHECK(quant_quantize_row(q->type, srow, qq, n, imat ? (const float *)imat->data : NULL) == 0, "%s quantize", stem);
      if (memcmp(qq, qrow, rb) != 0) {
        q_mismatch_rows++;
        for (size_t k = 0; k < rb; k++)
          if (qq[k] != qrow[k]) {
            printf("  %s row %lld: first differing byte %zu (block %zu, offset %zu): got %02x want %02x\n", stem,
                   (long long)r, k, k / (size_t)tt->bytes, k % (size_t)tt->bytes, qq[k], qrow[k]);
            break;
          }
      }
    }
  }
  CHECK(bit_mismatch == 0, "%s: dequant bit-exact (%d of %lld rows differ)", stem, bit_mismatch, (long long)rows);
  CHECK(dot_bad == 0, "%s: dot_ref within 1e-5*S (%d rows out; worst %.2e*S)", stem, dot_bad, worst_dot);
  if (quant_can_quantize(q->type))
    CHECK(q_mismatch_rows == 0, "%s: requantized src == q byte for byte (%d rows differ)", stem, q_mismatch_rows);
  else
    CHECK(quant_quantize_row(q->type, (const float *)src->data, qq, n, NULL) == FLOE_E_UNSUPPORTED,
          "%s: no quantizer -> FLOE_E_UNSUPPORTED", stem);
  free(qq);
  free(out);
  free(f.buf);
}

static void check_traits(void) {
  SECTION("type traits");
  CHECK(floe_type_info(FLOE_TYPE_Q4_K) && floe_type_info(FLOE_TYPE_Q4_K)->bytes == 144, "q4_K 144 bytes");
  CHECK(floe_type_info(5) == NULL && floe_type_info(31) == NULL && floe_type_info(1000) == NULL, "unknown ids -> NULL");
  CHECK(floe_row_bytes(FLOE_TYPE_Q4_K, 512) == 288, "row bytes q4_K 512");
  CHECK(floe_row_bytes(FLOE_TYPE_Q4_K, 100) == 0, "row bytes q4_K 100 (not a multiple) -> 0");
  CHECK(floe_row_bytes(FLOE_TYPE_F32, 7) == 28, "row bytes f32 7");
  CHECK(floe_row_bytes(FLOE_TYPE_Q8_0, INT64_MAX / 2 + 31) == 0, "row bytes: not a multiple -> 0");
  CHECK(floe_row_bytes(FLOE_TYPE_F64, INT64_MAX) == 0, "row bytes overflow -> 0");
  CHECK(floe_type_from_name("Q4_K") == FLOE_TYPE_Q4_K && floe_type_from_name("iq4_xs") == FLOE_TYPE_IQ4_XS &&
            floe_type_from_name("F16") == FLOE_TYPE_F16 && floe_type_from_name("nope") == -1,
        "type_from_name");
  CHECK(floe_type_info(FLOE_TYPE_I32) && !floe_type_info(FLOE_TYPE_I32)->supported, "i32 known, not supported");
}

int main(void) {
  check_traits();
  check_tables();
  for (size_t i = 0; i < sizeof k_files / sizeof k_files[0]; i++) check_file(k_files[i]);
  return TEST_DONE();
}
