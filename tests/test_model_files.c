/* A model file that shrinks after it was loaded gives a clear error on the next evaluation, not
 * a crash (SIGBUS on the vanished pages) or garbage: GGUF and safetensors. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "floe.h"
#include "kv/kv.h"
#include "model/model.h"
#include "test.h"

static int copy_file(const char *src, const char *dst) {
  FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
  if (!a || !b) {
    if (a) fclose(a);
    if (b) fclose(b);
    return -1;
  }
  char buf[1 << 16];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, k, b);
  fclose(a);
  return fclose(b);
}

/* Opens MODEL, evaluates a few tokens, shrinks `victim` to half, evaluates again. */
static void shrink_case(const char *label, const char *model_path, const char *victim) {
  char err[512] = "";
  model *m = NULL;
  model_session *s = NULL;
  int rc = model_load(model_path, &m, err, sizeof err);
  CHECK(rc == 0, "%s: load: %s", label, err);
  if (rc) return;
  rc = model_session_new(m, 64, KV_F32, 1, &s, err, sizeof err);
  CHECK(rc == 0, "%s: session: %s", label, err);
  if (rc) {
    model_free(m);
    return;
  }
  int32_t ids[3] = {1, 2, 3};
  rc = model_eval(s, ids, 3, NULL, false, err, sizeof err);
  CHECK(rc == 0, "%s: eval before the shrink: %s", label, err);
  struct stat st;
  stat(victim, &st);
  CHECK(truncate(victim, st.st_size / 2) == 0, "%s: truncate the file", label);
  rc = model_eval(s, ids, 3, NULL, false, err, sizeof err);
  CHECK(rc == FLOE_E_IO, "%s: eval after the shrink fails with FLOE_E_IO (rc %d)", label, rc);
  CHECK(strstr(err, "shrank") != NULL && strstr(err, victim) != NULL, "%s: message names the file: %s", label, err);
  model_session_free(s);
  model_free(m);
}

int main(void) {
  SECTION("GGUF shrinks after load");
  const char *g = test_tmp("shrink.gguf");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "'%s' synth --preset tiny-qwen3moe --seed 3 -o '%s' >/dev/null 2>&1",
           getenv("FLOE_BIN") ? getenv("FLOE_BIN") : "build/bin/floe", g);
  CHECK(system(cmd) == 0, "synth a tiny model");
  shrink_case("gguf", g, g);
  unlink(g);

  SECTION("safetensors shard shrinks after load");
  const char *dir = test_tmp("shrink_hf");
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
  CHECK(system(cmd) == 0, "make a scratch model directory");
  char src[4096], dst[4096];
  const char *files[] = {"config.json", "model.safetensors", "generation_config.json"};
  for (int i = 0; i < 3; i++) {
    snprintf(src, sizeof src, "%s", test_fixture("models/qwen3moe/"));
    strncat(src, files[i], sizeof src - strlen(src) - 1);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    if (i < 2) CHECK(copy_file(src, dst) == 0, "copy %s", files[i]);
    else copy_file(src, dst);
  }
  snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
  shrink_case("safetensors", dir, dst);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  system(cmd);
  return TEST_DONE();
}
