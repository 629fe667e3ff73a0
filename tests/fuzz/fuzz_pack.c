/* libFuzzer target for the expert pack reader (xpack_open): any experts.floepack content is
 * refused with a one-line message or opens with an index that stays inside the file. The reader
 * takes a directory, so each input is written to a scratch directory under /dev/shm (or $TMPDIR).
 * Built only with -DFLOE_FUZZ=ON (clang); run by tests/run_fuzz.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "experts/experts.h"

static char g_dir[256];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(g_dir, sizeof g_dir, "%s/floe-fuzz-pack.%d", base, (int)getpid());
    mkdir(g_dir, 0700);
  }
  char path[320];
  snprintf(path, sizeof path, "%s/experts.floepack", g_dir);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  char err[512] = "";
  xpack *p = NULL;
  int rc = xpack_open(g_dir, &p, err, sizeof err);
  if (rc) {
    if (p || rc >= 0 || !err[0] || strchr(err, '\n')) abort();
    return 0;
  }
  const uint8_t *map;
  uint64_t msize;
  const char *src;
  const uint64_t *ck;
  xpack_map(p, &map, &msize, &src, &ck);
  if (!src || msize != size) abort();
  xpack_close(p);
  return 0;
}
