/* floe_map_file: the mapped and the copied (huge-page) views hold the file's bytes; errors. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "test.h"

static void check_size(uint64_t size) {
  SECTION("file of %llu bytes", (unsigned long long)size);
  uint8_t *d = malloc(size);
  floe_rng r;
  floe_rng_seed(&r, size);
  for (uint64_t i = 0; i < size; i++) d[i] = (uint8_t)floe_rng_u64(&r);
  const char *path = test_tmp("mapfile.bin");
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(d, 1, size, f) == size && fclose(f) == 0, "wrote %s", path);
  int fd = open(path, O_RDONLY);
  char err[256];
  for (int copy = 0; copy < 2; copy++) {
    const uint8_t *map;
    size_t len;
    int rc = floe_map_file(fd, size, copy, path, &map, &len, err, sizeof err);
    CHECK(rc == 0, "copy %d: %s", copy, rc ? err : "ok");
    if (rc) continue;
    CHECK(memcmp(map, d, size) == 0, "copy %d: same bytes", copy);
    CHECK(len >= size, "copy %d: length %zu >= %llu", copy, len, (unsigned long long)size);
    if (copy) CHECK(((uintptr_t)map & ((2u << 20) - 1)) == 0 && len % (2u << 20) == 0, "copy: 2 MiB aligned");
    floe_unmap_file(map, len);
  }
  /* the file is shorter than asked for: the copy notices */
  const uint8_t *map;
  size_t len;
  int rc = floe_map_file(fd, size + 4096, true, path, &map, &len, err, sizeof err);
  CHECK(rc == FLOE_E_IO && strstr(err, "shrank") && strstr(err, "mapfile.bin") && !map, "short file: %s", err);
  close(fd);
  remove(path);
  free(d);
}

int main(void) {
  check_size(1);
  check_size((3u << 20) + 12345);
  check_size((130u << 20) + 7); /* >= 4 chunks: the threaded reader */
  SECTION("errors");
  char err[256];
  const uint8_t *map;
  size_t len;
  CHECK(floe_map_file(-1, 100, true, "bad", &map, &len, err, sizeof err) == FLOE_E_IO && strstr(err, "bad"),
        "bad fd: %s", err);
  CHECK(floe_map_file(-1, 0, false, "empty", &map, &len, err, sizeof err) == FLOE_E_IO, "empty: %s", err);
  CHECK(!floe_copy_fits(UINT64_MAX / 2), "an absurd size does not fit");
  return TEST_DONE();
}
