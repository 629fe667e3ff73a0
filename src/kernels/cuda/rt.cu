/* Minimal CUDA runtime wrapper: see cuda_rt.h. */
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "base/base.h"
}
#include "kernels/cuda/cuda_rt.h"

extern "C" int cuda_rt_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) { /* no driver / no device: clear the sticky error */
    cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" int cuda_rt_init(int dev, char *name, size_t name_len, char *err, size_t errlen) {
  cudaError_t e = cudaSetDevice(dev);
  if (e != cudaSuccess) return floe_err(err, errlen, FLOE_E_IO, "cuda: device %d: %s", dev, cudaGetErrorString(e));
  if (name && name_len) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) == cudaSuccess) snprintf(name, name_len, "%s", p.name);
    else snprintf(name, name_len, "?");
  }
  return 0;
}

extern "C" void *cuda_rt_malloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    return NULL;
  }
  return p;
}
extern "C" void cuda_rt_free(void *p) {
  if (p) cudaFree(p);
}
extern "C" int cuda_rt_memcpy_htod(void *dst, const void *src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : FLOE_E_IO;
}
extern "C" int cuda_rt_memcpy_dtoh(void *dst, const void *src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : FLOE_E_IO;
}
extern "C" int cuda_rt_memset(void *dst, int byte, size_t bytes) {
  return cudaMemset(dst, byte, bytes) == cudaSuccess ? 0 : FLOE_E_IO;
}
extern "C" int cuda_rt_sync(char *err, size_t errlen) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) return floe_err(err, errlen, FLOE_E_IO, "cuda: %s", cudaGetErrorString(e));
  return 0;
}
extern "C" void *cuda_rt_event_new(void) {
  cudaEvent_t ev = NULL;
  if (cudaEventCreate(&ev) != cudaSuccess) return NULL;
  return (void *)ev;
}
extern "C" void cuda_rt_event_free(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}
extern "C" void cuda_rt_event_record(void *ev, void *stream) { cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream); }
extern "C" float cuda_rt_event_ms(void *start, void *end) {
  float ms = -1.0f;
  if (cudaEventSynchronize((cudaEvent_t)end) != cudaSuccess) return -1.0f;
  if (cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end) != cudaSuccess) return -1.0f;
  return ms;
}
