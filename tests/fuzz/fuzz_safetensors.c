/* libFuzzer target for the safetensors reader: an input starting with '{' is a
 * model.safetensors.index.json text (st_index_parse), anything else a whole .safetensors file
 * (st_model_open_buffer, the same validation as st_model_open). After a successful open every
 * tensor's bytes are read, so ASan flags any pointer the validation let outside the buffer.
 *
 * The reader's source is compiled into this file so that it carries libFuzzer coverage and ASan
 * even though libfloe itself is built without them; the linker then takes no safetensors.o from
 * libfloe. Seeds: tests/fixtures/st (files and the index json). */
#include "../../src/format/safetensors.c"

static int count_entry(const char *tensor, const char *shard, void *ctx) {
  size_t *n = ctx;
  *n += strlen(tensor) + strlen(shard) > 0;
  if (strchr(shard, '/') || strstr(shard, "..")) __builtin_trap(); /* must have been rejected */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256];
  if (size > 0 && data[0] == '{') {
    size_t n = 0;
    st_index_parse((const char *)data, size, "fuzz.index.json", count_entry, &n, err, sizeof err);
    return 0;
  }
  st_model *m = NULL;
  if (st_model_open_buffer(data, size, "fuzz.safetensors", &m, err, sizeof err) != 0) {
    if (m) __builtin_trap(); /* failure leaves *out NULL */
    return 0;
  }
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < st_count(m); i++) {
    const st_tensor *t = st_tensor_at(m, i);
    if (st_find(m, t->name) != t) __builtin_trap();
    if (t->data < data || t->data + t->nbytes > data + size) __builtin_trap();
    if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
    if (t->nbytes != (uint64_t)t->n_elements * st_dtype_size(t->dtype)) __builtin_trap();
  }
  (void)sink;
  (void)st_meta(m, "format");
  st_model_close(m);
  return 0;
}
