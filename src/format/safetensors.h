/* safetensors reader: one file, a sharded model directory (model.safetensors.index.json), or a
 * caller-owned buffer (fuzzer, tests).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"__metadata__": {str: str}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}}
 * then the data section; offsets are relative to its start (file offset 8 + N).
 *
 * st_model_open() maps every shard read-only and validates everything before returning: header
 * length against the file size (and ST_MAX_HEADER), JSON syntax (trailing bytes may only be
 * whitespace, which writers use as padding), field presence and types, dtype names, shapes (at most
 * ST_MAX_DIMS dims, each an integer >= 0, element count and byte size overflow-checked), byte size
 * == end - begin exactly, begin <= end <= data size, no two non-empty ranges overlapping, names
 * unique across all shards. For a sharded model every weight_map entry must exist in the shard it
 * names, and shard names must be plain file names in the same directory (no '/', '\\', "..").
 * After a successful open every st_tensor's data points inside a mapping and holds nbytes bytes.
 * Gaps between tensors and bytes after the last one are allowed (the Rust crate is stricter).
 * Data pointers are NOT necessarily aligned (N need not be a multiple of 8): read with memcpy or
 * unaligned loads.
 *
 * Errors are one line naming the file, the tensor and the problem, e.g.
 *   x.safetensors: tensor 'w': data_offsets [0, 100) hold 100 bytes but shape [4, 8] of BF16 needs 64
 *
 * Memory: the st_model owns the mappings, the tensor table and all strings (names, metadata);
 * all are freed by st_model_close(). Tensors are listed shard by shard, in header order. */
#ifndef FLOE_SAFETENSORS_H
#define FLOE_SAFETENSORS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum st_dtype {
  ST_F32 = 0, ST_F16, ST_BF16, ST_U8, ST_I8, ST_U32, ST_I32, ST_I64,
  /* listed and mapped, but no compute path reads them */
  ST_F64, ST_I16, ST_U16, ST_U64, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2,
  ST_DTYPE_COUNT
};

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* bytes of header JSON accepted */

typedef struct st_tensor {
  const char *name;             /* NUL-terminated, owned by the model */
  int dtype;                    /* enum st_dtype */
  int n_dims;                   /* 0 (scalar) .. ST_MAX_DIMS */
  int64_t shape[ST_MAX_DIMS];   /* safetensors order: row-major, shape[n_dims-1] contiguous; unused = 1 */
  int64_t n_elements;           /* product of shape (1 for a scalar) */
  const uint8_t *data;          /* inside the shard's mapping; unaligned in general */
  uint64_t nbytes;              /* n_elements * st_dtype_size(dtype) */
  uint64_t offset;              /* begin, relative to the shard's data section */
  int shard;                    /* index into the model's shards */
} st_tensor;

typedef struct st_model st_model;

/* Opens a model from a directory (model.safetensors.index.json, else model.safetensors), a
 * *.safetensors file, or an index *.json file. On failure returns a negative FLOE_E_* and *out is
 * NULL. */
int st_model_open(const char *dir_or_file, st_model **out, char *err, size_t errlen);
/* copy: read every shard into huge-page memory instead of mapping it (floe_map_file) */
int st_model_open_ex(const char *dir_or_file, bool copy, st_model **out, char *err, size_t errlen);
/* Same validation on one caller-owned buffer holding a whole .safetensors file (fuzzer, tests);
 * buf must outlive the model. name is used in messages. */
int st_model_open_buffer(const void *buf, size_t size, const char *name, st_model **out, char *err,
                         size_t errlen);
void st_model_close(st_model *m);
/* FLOE_E_IO ("file shrank after it was loaded") when a mapped shard is now shorter than its
 * mapping: reading its vanished pages would fault. Cheap (one fstat per shard). */
int st_model_check_unchanged(const st_model *m, char *err, size_t errlen);

const st_tensor *st_find(const st_model *m, const char *name); /* NULL when absent */
size_t st_count(const st_model *m);
const st_tensor *st_tensor_at(const st_model *m, size_t i);    /* i < st_count() */
/* __metadata__ value for key (first shard that has it), NULL when absent. */
const char *st_meta(const st_model *m, const char *key);
int st_n_shards(const st_model *m);
const char *st_shard_path(const st_model *m, int shard);

const char *st_dtype_name(int dtype);       /* "BF16", ...; "?" when out of range */
int st_dtype_from_name(const char *name);   /* -1 when unknown */
size_t st_dtype_size(int dtype);            /* bytes per element; 0 when out of range */
bool st_dtype_supported(int dtype);         /* has a compute path: F32 F16 BF16 U8 I8 U32 I32 I64 */

/* Parses the JSON text of a model.safetensors.index.json: calls fn(tensor, shard, ctx) for each
 * weight_map entry after checking the value is a string and a plain file name. A non-zero return
 * from fn stops the walk and is returned. Exposed for the fuzzer. */
typedef int (*st_index_fn)(const char *tensor, const char *shard, void *ctx);
int st_index_parse(const char *json, size_t len, const char *name, st_index_fn fn, void *ctx,
                   char *err, size_t errlen);
#endif
