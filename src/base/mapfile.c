/* Read-only views of whole model files: a file mapping, or a copy in anonymous memory backed by
 * 2 MiB transparent huge pages.
 *
 * Why the copy: a file mapping is backed by 4 KiB page-cache pages, so streaming the weights of a
 * decoded token (0.57 GB on the 35B-A3B shape cut to 8 layers) takes one TLB miss, and a page walk
 * whose page-table lines are themselves out of cache, every 4 KiB. Long streams hide it (the output
 * matrix ran at 97 % of the bandwidth) but a decode is ~60 short parallel regions of 0.3-5 MB each,
 * and there the walks were measured at 10-20 % of the time (bench/results.tsv, 2026-11-30: same
 * file, copied into huge pages: 39.5-40.7 -> 42.1-46.9 tok/s). The copy costs memory (the whole
 * file stays resident, like llama.cpp --no-mmap) and load time (a parallel pread, ~1-2 GB/s from
 * disk, several GB/s from the page cache). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"

#define HUGE_2M ((size_t)2 << 20)
#define COPY_CHUNK ((uint64_t)32 << 20)
#define COPY_THREADS 4

typedef struct copy_job {
  int fd;
  uint8_t *dst;
  uint64_t size;
  uint64_t next; /* next chunk offset (atomic) */
  uint64_t done; /* bytes read (atomic) */
  int err;       /* first errno (atomic), or -1 for a short read */
} copy_job;

static __thread floe_progress_fn thread_progress;
static __thread void *thread_progress_user;

void floe_thread_progress_set(floe_progress_fn fn, void *user) {
  thread_progress = fn;
  thread_progress_user = user;
}

void floe_thread_progress(uint64_t done, uint64_t total) {
  if (thread_progress) thread_progress(thread_progress_user, done, total);
}

/* report: the calling thread, which owns the progress hook (a thread-local) */
static void copy_run(copy_job *j, bool report) {
  for (;;) {
    const uint64_t o = __atomic_fetch_add(&j->next, COPY_CHUNK, __ATOMIC_RELAXED);
    if (o >= j->size || __atomic_load_n(&j->err, __ATOMIC_RELAXED)) break;
    const uint64_t end = o + COPY_CHUNK < j->size ? o + COPY_CHUNK : j->size;
    for (uint64_t p = o; p < end;) {
      const ssize_t r = pread(j->fd, j->dst + p, (size_t)(end - p), (off_t)p);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        int e = r < 0 ? errno : -1, zero = 0;
        __atomic_compare_exchange_n(&j->err, &zero, e, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        return;
      }
      p += (uint64_t)r;
    }
    const uint64_t d = __atomic_add_fetch(&j->done, end - o, __ATOMIC_RELAXED);
    if (report) floe_thread_progress(d, j->size);
  }
}

static void *copy_worker(void *arg) {
  copy_run(arg, false);
  return NULL;
}

int floe_map_file(int fd, uint64_t size, bool copy, const char *path, const uint8_t **map, size_t *map_len,
                  char *err, size_t errlen) {
  *map = NULL;
  *map_len = 0;
  if (size == 0 || size > (uint64_t)SIZE_MAX - 2 * HUGE_2M)
    return floe_err(err, errlen, FLOE_E_IO, "%s: cannot map %llu bytes", path, (unsigned long long)size);
  if (!copy) {
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return floe_err(err, errlen, FLOE_E_IO, "%s: mmap failed: %s", path, strerror(errno));
    *map = p;
    *map_len = (size_t)size;
    return 0;
  }
  /* 2 MiB-aligned: map one huge page more, then trim the unaligned head and the tail */
  const size_t len = ((size_t)size + HUGE_2M - 1) & ~(HUGE_2M - 1);
  uint8_t *raw = mmap(NULL, len + HUGE_2M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return floe_err(err, errlen, FLOE_E_NOMEM, "%s: cannot allocate %llu bytes to load the model into memory (--mmap maps it instead)",
                    path, (unsigned long long)size);
  uint8_t *a = (uint8_t *)(((uintptr_t)raw + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
  if (a > raw) munmap(raw, (size_t)(a - raw));
  if (raw + len + HUGE_2M > a + len) munmap(a + len, (size_t)(raw + len + HUGE_2M - (a + len)));
  madvise(a, len, MADV_HUGEPAGE); /* best effort: THP may be "madvise" only, or off */
  copy_job j = { fd, a, size, 0, 0, 0 };
  pthread_t th[COPY_THREADS];
  int nt = 0;
  const int want = size >= 4 * COPY_CHUNK ? COPY_THREADS : 1;
  for (; nt < want - 1; nt++)
    if (pthread_create(&th[nt], NULL, copy_worker, &j)) break;
  copy_run(&j, true);
  for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
  if (!j.err) floe_thread_progress(size, size);
  if (j.err) {
    munmap(a, len);
    if (j.err < 0)
      return floe_err(err, errlen, FLOE_E_IO, "%s: file shrank while it was read (%llu bytes expected)", path,
                      (unsigned long long)size);
    return floe_err(err, errlen, FLOE_E_IO, "%s: read failed: %s", path, strerror(j.err));
  }
  mprotect(a, len, PROT_READ); /* a read-only view, like the mapping */
  *map = a;
  *map_len = len;
  return 0;
}

void floe_unmap_file(const uint8_t *map, size_t map_len) {
  if (map && map_len) munmap((void *)map, map_len);
}

/* MemAvailable of /proc/meminfo in bytes, 0 when unknown */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
}

/* transparent huge pages for anonymous memory not switched off */
static bool thp_usable(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return false;
  char buf[128] = "";
  const bool ok = fgets(buf, sizeof buf, f) && !strstr(buf, "[never]");
  fclose(f);
  return ok;
}

bool floe_copy_fits(uint64_t bytes) {
  if (!thp_usable()) return false;
  const uint64_t avail = mem_available(), margin = avail / 5 > ((uint64_t)2 << 30) ? avail / 5 : (uint64_t)2 << 30;
  return avail > margin && bytes <= avail - margin;
}
