/* CUDA runtime helpers (cuda_rt.h): thin wrappers over the CUDA runtime API that turn every
 * cudaError_t into a FLOE_E_* code and a one-line message. The runtime is static (cudart_static),
 * so cudaGetDeviceCount() is the first call that needs a driver: with none it returns an error,
 * which cuda_rt_device_count() maps to 0 devices. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "base/base.h"
}
#include "kernels/cuda/cuda_rt.h"

static int rt_fail(char *err, size_t errlen, cudaError_t e, const char *what) {
  if (err && errlen) snprintf(err, errlen, "CUDA: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return e == cudaErrorMemoryAllocation ? FLOE_E_NOMEM : FLOE_E_UNSUPPORTED;
}

#define RT_TRY(call, what)                                 \
  do {                                                     \
    cudaError_t e_ = (call);                               \
    if (e_ != cudaSuccess) return rt_fail(err, errlen, e_, what); \
  } while (0)

/* The driver loads a module's kernels at their first launch by default (CUDA_MODULE_LOADING=LAZY
 * since CUDA 12.2): a process's first prefill then pays ~50 ms loading its kernels (the 35B-A3B
 * shape's first 512-token prefill 4520 tok/s, a ttft of 113 ms, against 8074 and 63 ms with the
 * kernels loaded at context creation; the default model's 26000-31000 against 78500 tok/s). So
 * unless the user set it, the variable is set to EAGER before the first runtime call, which reads
 * it: the load takes ~0.1 s longer, the first request nothing. */
static void rt_module_eager(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }
static void rt_module_loading(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, rt_module_eager);
}

int cuda_rt_device_count(void) {
  int n = 0;
  rt_module_loading();
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver / no device: not sticky, clear it */
    return 0;
  }
  return n;
}

int cuda_rt_init(int dev, char *err, size_t errlen) {
  const int n = cuda_rt_device_count();
  if (dev < 0 || dev >= n)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA: device %d does not exist (%d device%s found)", dev, n,
                    n == 1 ? "" : "s");
  RT_TRY(cudaSetDevice(dev), "cudaSetDevice");
  RT_TRY(cudaFree(0), "creating the device context");
  return 0;
}

int cuda_rt_device_name(int dev, char *buf, size_t n, char *err, size_t errlen) {
  cudaDeviceProp p;
  RT_TRY(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  snprintf(buf, n, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor, (double)p.totalGlobalMem / (1u << 30));
  return 0;
}

int cuda_rt_device_cc(int dev) {
  int ma = 0, mi = 0;
  if (cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return FLOE_E_UNSUPPORTED;
  }
  return ma * 10 + mi;
}

size_t cuda_rt_l2_bytes(int dev) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return (size_t)v;
}

int cuda_rt_mem_info(size_t *free_b, size_t *total_b, char *err, size_t errlen) {
  RT_TRY(cudaMemGetInfo(free_b, total_b), "cudaMemGetInfo");
  return 0;
}

int cuda_rt_malloc(void **p, size_t n, char *err, size_t errlen) {
  *p = NULL;
  cudaError_t e = cudaMalloc(p, n ? n : 1);
  if (e != cudaSuccess) {
    *p = NULL;
    if (err && errlen) snprintf(err, errlen, "CUDA: cannot allocate %zu bytes of device memory: %s", n, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return FLOE_E_NOMEM;
  }
  return 0;
}

void cuda_rt_free(void *p) {
  if (p) cudaFree(p);
}

int cuda_rt_host_alloc(void **p, size_t n, char *err, size_t errlen) {
  *p = NULL;
  cudaError_t e = cudaMallocHost(p, n ? n : 1);
  if (e != cudaSuccess) {
    *p = NULL;
    if (err && errlen) snprintf(err, errlen, "CUDA: cannot allocate %zu bytes of pinned host memory: %s", n, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return FLOE_E_NOMEM;
  }
  return 0;
}

void *cuda_rt_host_dev_ptr(void *p) {
  void *d = NULL;
  if (!p || cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return d;
}

void cuda_rt_host_free(void *p) {
  if (p) cudaFreeHost(p);
}

int cuda_rt_host_register(void *p, size_t n, char *err, size_t errlen) {
  /* page-lock [p, p + n) rounded out to whole pages (the range may start and end inside pages) */
  const uintptr_t pg = 4096, a = (uintptr_t)p & ~(pg - 1), b = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);
  cudaError_t e = cudaHostRegister((void *)a, b - a, cudaHostRegisterReadOnly);
  if (e != cudaSuccess) { /* drivers without read-only registration: plain (the memory is only read) */
    (void)cudaGetLastError();
    e = cudaHostRegister((void *)a, b - a, cudaHostRegisterDefault);
  }
  if (e != cudaSuccess) {
    if (err && errlen) snprintf(err, errlen, "CUDA: cannot page-lock %zu bytes of host memory: %s", n, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return FLOE_E_UNSUPPORTED;
  }
  return 0;
}

void cuda_rt_host_unregister(void *p) {
  if (p) {
    cudaHostUnregister((void *)((uintptr_t)p & ~(uintptr_t)4095));
    (void)cudaGetLastError();
  }
}

static int rt_code(cudaError_t e) { return e == cudaSuccess ? 0 : FLOE_E_UNSUPPORTED; }

int cuda_rt_h2d_async(void *dst, const void *src, size_t n, void *stream) {
  return rt_code(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, (cudaStream_t)stream));
}
int cuda_rt_d2h_async(void *dst, const void *src, size_t n, void *stream) {
  return rt_code(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
}
int cuda_rt_d2d_async(void *dst, const void *src, size_t n, void *stream) {
  return rt_code(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
}
int cuda_rt_memset_async(void *dst, int byte, size_t n, void *stream) {
  return rt_code(cudaMemsetAsync(dst, byte, n, (cudaStream_t)stream));
}

int cuda_rt_h2d(void *dst, const void *src, size_t n, char *err, size_t errlen) {
  RT_TRY(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "copy to the device");
  return 0;
}
int cuda_rt_d2h(void *dst, const void *src, size_t n, char *err, size_t errlen) {
  RT_TRY(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "copy from the device");
  return 0;
}

int cuda_rt_stream_create(void **stream, char *err, size_t errlen) {
  cudaStream_t s = NULL;
  *stream = NULL;
  RT_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  *stream = s;
  return 0;
}
void cuda_rt_stream_destroy(void *stream) {
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
}
int cuda_rt_stream_sync(void *stream, char *err, size_t errlen) {
  RT_TRY(cudaStreamSynchronize((cudaStream_t)stream), "stream synchronize");
  return 0;
}
int cuda_rt_device_sync(char *err, size_t errlen) {
  RT_TRY(cudaDeviceSynchronize(), "device synchronize");
  return 0;
}

int cuda_rt_event_create(void **ev, char *err, size_t errlen) {
  cudaEvent_t e = NULL;
  *ev = NULL;
  RT_TRY(cudaEventCreate(&e), "cudaEventCreate");
  *ev = e;
  return 0;
}
void cuda_rt_event_destroy(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
int cuda_rt_event_record(void *ev, void *stream) { return rt_code(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream)); }
int cuda_rt_stream_wait_event(void *stream, void *ev) {
  return rt_code(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)ev, 0));
}
int cuda_rt_event_sync(void *ev, char *err, size_t errlen) {
  RT_TRY(cudaEventSynchronize((cudaEvent_t)ev), "event synchronize");
  return 0;
}
int cuda_rt_event_ms(void *start, void *stop, float *ms, char *err, size_t errlen) {
  RT_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)stop), "cudaEventElapsedTime");
  return 0;
}

int cuda_rt_check(const char *what, char *err, size_t errlen) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  return rt_fail(err, errlen, e, what ? what : "kernel");
}

/* pdl.cuh: programmatic dependent launch on sm_90 and later, unless FLOE_CUDA_NO_PDL is set.
 * Decided once, for the device current at the first launch. */
extern "C" int cuda_rt_pdl(void) {
  static int on = -1;
  if (on < 0) {
    int dev = 0, ma = 0;
    on = getenv("FLOE_CUDA_NO_PDL") == NULL && cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && ma >= 9;
    (void)cudaGetLastError();
  }
  return on;
}

/* pdl.cuh: bit 0, kernels load the model's constants they need (norm and conv weights) and, where
 * the caller allows it (cuda_gdn_shape.pre_state), the recurrent states before griddepcontrol.wait;
 * bit 1, k_norm / k_combine let the next kernel be scheduled only once their row is loaded. The
 * same bits every way. Bit 0 is the default (H200, 35B-A3B decode +3.1 %, bench/results.tsv);
 * FLOE_CUDA_PREW=0 / 2 / 3 at the first launch, or cuda_rt_set_prew (tests), sets others. */
static int g_prew = -1;
extern "C" void cuda_rt_set_prew(int bits) { g_prew = bits & 3; }
extern "C" int cuda_rt_prew(void) {
  if (g_prew < 0) {
    const char *e = getenv("FLOE_CUDA_PREW");
    g_prew = e && e[0] ? atoi(e) & 3 : 1;
  }
  return g_prew;
}

/* ---- the launch trace (pdl.cuh; built with -DFLOE_CUDA_TRACE=ON) ---- */
#ifdef FLOE_CUDA_TRACE
extern "C" int cuda_rt_trace_built(void) { return 1; }
#define TRACE_TU_MAX 64
static int (*g_trace_set[TRACE_TU_MAX])(unsigned long long *); /* zero-initialized: no order issue */
static int g_trace_n_set;
static unsigned long long *g_trace_buf;

extern "C" void cuda_rt_trace_register(int (*set)(unsigned long long *)) {
  if (g_trace_n_set < TRACE_TU_MAX) g_trace_set[g_trace_n_set++] = set;
}

extern "C" int cuda_rt_trace_start(char *err, size_t errlen) {
  const size_t bytes = (1 + 2 * (size_t)CUDA_RT_TRACE_N) * sizeof(unsigned long long);
  if (!g_trace_buf) {
    RT_TRY(cudaMalloc((void **)&g_trace_buf, bytes), "cudaMalloc (launch trace)");
    int ok = 0; /* a unit whose kernels never read the pointer may have lost the symbol: skipped */
    for (int i = 0; i < g_trace_n_set; i++) {
      if (g_trace_set[i](g_trace_buf) == 0) ok++;
      else (void)cudaGetLastError();
    }
    if (!ok) return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "CUDA: cannot set the launch trace's pointer");
  }
  RT_TRY(cudaMemset(g_trace_buf, 0, bytes), "cudaMemset (launch trace)");
  return 0;
}

extern "C" int cuda_rt_trace_dump(FILE *f, char *err, size_t errlen) {
  if (!g_trace_buf) return 0;
  const size_t words = 1 + 2 * (size_t)CUDA_RT_TRACE_N;
  unsigned long long *h = (unsigned long long *)malloc(words * sizeof *h);
  if (!h) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(h, g_trace_buf, words * sizeof *h, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    free(h);
    return rt_fail(err, errlen, e, "reading the launch trace");
  }
  const unsigned long long n = h[0], first = n > CUDA_RT_TRACE_N ? n - CUDA_RT_TRACE_N : 0;
  for (unsigned long long i = first; i < n; i++) {
    const unsigned long long *r = h + 1 + 2 * (i % CUDA_RT_TRACE_N);
    fprintf(f, "%llu %llu %llu %llu %llu %llu\n", i, r[0], r[1] & 0xFFFFFF, (r[1] >> 24) & 0xFFFF, (r[1] >> 40) & 0xFF,
            r[1] >> 48);
  }
  free(h);
  return 0;
}
#else
extern "C" int cuda_rt_trace_built(void) { return 0; }
extern "C" int cuda_rt_trace_start(char *err, size_t errlen) {
  return floe_err(err, errlen, FLOE_E_UNSUPPORTED,
                  "FLOE_CUDA_TRACE: this build records no launches (configure with -DFLOE_CUDA_TRACE=ON)");
}
extern "C" int cuda_rt_trace_dump(FILE *f, char *err, size_t errlen) {
  (void)f, (void)err, (void)errlen;
  return 0;
}
#endif
