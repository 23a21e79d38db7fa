// Does a copy submitted from a second host thread wait while the main thread sits in a
// synchronous pageable cudaMemcpy behind a kernel that spins waiting for the host? That is the
// NCCL net plugin's situation: NCCL's proxy thread copies the bytes NCCL's kernel waits for,
// while the application's thread does `.item()` / `.cpu()` after the collective. A watchdog
// releases the kernel after 5 s, so a blocked copy shows as "BLOCKED at stage N".
//
// Build and run (docs/results/2026-11-22-nccl-plugin.md, session 8):
//   nvcc -O2 -o /tmp/probe scripts/device/copy_during_sync_probe.cu -lcuda
//   CTX=primary COPY=dtoh /tmp/probe v p    # copy in the primary context: blocks
//   CTX=own COPY=dtoh /tmp/probe v p        # copy in a context of its own: does not
// Arguments: `v` allocates the device buffer with cuMemCreate (NCCL's default), `n` with
// cuMemAlloc; the second picks what the main thread does meanwhile: `p` pageable cudaMemcpy,
// `d` cudaDeviceSynchronize, `s` cudaStreamSynchronize, `n` nothing.
// Env: COPY=dtoh|dtod|generic (cuMemcpyDtoHAsync, DtoD through the registered host buffer's
// device pointer, cuMemcpyAsync), CTX=primary|own.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <thread>
#include <atomic>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorString(r, &s); printf("%s failed: %s\n", #x, s); exit(1);} } while (0)
#define RK(x) do { cudaError_t r = (x); if (r != cudaSuccess) { printf("%s failed: %s\n", #x, cudaGetErrorString(r)); exit(1);} } while (0)
__global__ void spin(volatile int* flag) { while (*flag == 0) { } }
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int vmm = argc > 1 && argv[1][0] == 'v';
  char mode = argc > 2 ? argv[2][0] : 'n';  // n: main thread joins; d: cudaDeviceSynchronize; s: cudaStreamSynchronize(k)
  RK(cudaSetDevice(0));
  RK(cudaFree(0));
  size_t len = 1 << 20;
  // shared-memory host region, registered like the plugin's bounce pool
  int fd = open("/dev/shm/rep-test", O_RDWR | O_CREAT | O_TRUNC, 0600); ftruncate(fd, 16 << 20);
  char* host = (char*)mmap(0, 16 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); unlink("/dev/shm/rep-test");
  CK(cuMemHostRegister(host, 16 << 20, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr dev;
  if (vmm) {
    CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    size_t gran; CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t sz = ((len + gran - 1) / gran) * gran; CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, sz, &prop, 0)); CK(cuMemAddressReserve(&dev, sz, 0, 0, 0)); CK(cuMemMap(dev, sz, 0, h, 0));
    CUmemAccessDesc acc = {}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CK(cuMemSetAccess(dev, sz, &acc, 1));
  } else { CK(cuMemAlloc(&dev, len)); }
  { CUcontext owner = nullptr; CUresult r = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, dev);
    printf("allocation %s: CU_POINTER_ATTRIBUTE_CONTEXT -> %d, %p\n", vmm ? "vmm" : "cuMemAlloc", (int)r, (void*)owner); }
  int* flag; RK(cudaHostAlloc(&flag, 4, cudaHostAllocMapped)); *flag = 0;
  int* dflag; RK(cudaHostGetDevicePointer(&dflag, flag, 0));
  cudaStream_t k; RK(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking));
  CUstream s_primary; CK(cuStreamCreate(&s_primary, CU_STREAM_NON_BLOCKING));
  spin<<<1, 1, 0, k>>>(dflag);
  RK(cudaGetLastError());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::atomic<int> stage{0};
  std::thread watchdog([&] { std::this_thread::sleep_for(std::chrono::seconds(5)); if (stage.load() < 9) { printf("BLOCKED at stage %d; releasing the kernel\n", stage.load()); fflush(stdout); } *(volatile int*)flag = 1; });
  CUcontext ctx; CK(cuCtxGetCurrent(&ctx));
  std::thread worker([&] {
    CK(cuCtxSetCurrent(ctx));
    CUstream s = s_primary;
    if (getenv("CTX") && getenv("CTX")[0] == 'o') {  // a context of our own on the same device
      CUcontext own;
#if CUDA_VERSION >= 13000
      CK(cuCtxCreate(&own, nullptr, 0, 0));
#else
      CK(cuCtxCreate(&own, 0, 0));
#endif
      CK(cuCtxSetCurrent(own));
      CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      printf("worker: own context %p (primary %p)\n", (void*)own, (void*)ctx);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the main thread is in its sync by now
    double t0 = now(); stage = 1;
    CUdeviceptr base; size_t sz; CK(cuMemGetAddressRange(&base, &sz, dev)); stage = 2;
    const char* kind = getenv("COPY") ? getenv("COPY") : "dtoh";
    CUdeviceptr hostdev; CK(cuMemHostGetDevicePointer(&hostdev, host, 0));
    if (kind[0] == 'd' && kind[3] == 'd') { CK(cuMemcpyDtoDAsync(hostdev, dev, len, s)); }
    else if (kind[0] == 'g') { CK(cuMemcpyAsync((CUdeviceptr)host, dev, len, s)); }
    else { CK(cuMemcpyDtoHAsync(host, dev, len, s)); }
    stage = 3;
    double t1 = now();
    CUevent e; CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)); CK(cuEventRecord(e, s)); stage = 4;
    while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) { if (now() - t0 > 4) { printf("DtoH event not done after 4 s\n"); break; } }
    double t2 = now(); stage = 5;
    if (kind[0] == 'd' && kind[3] == 'd') { CK(cuMemcpyDtoDAsync(dev, hostdev, len, s)); }
    else if (kind[0] == 'g') { CK(cuMemcpyAsync(dev, (CUdeviceptr)host, len, s)); }
    else { CK(cuMemcpyHtoDAsync(dev, host, len, s)); }
    CK(cuEventRecord(e, s)); stage = 6;
    while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) { if (now() - t0 > 4) { printf("HtoD event not done after 4 s\n"); break; } }
    double t3 = now(); stage = 9;
    printf("[%s ctx=%s] %s: DtoH submit %.1f us, done %.1f us; HtoD done %.1f us, kernel still spinning: %d\n", kind, getenv("CTX") ? getenv("CTX") : "primary", vmm ? "vmm" : "cuMemAlloc",
           (t1 - t0) * 1e6, (t2 - t0) * 1e6, (t3 - t2) * 1e6, cudaStreamQuery(k) == cudaErrorNotReady);
  });
  if (mode == 'p') {
    cudaEvent_t ev; RK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); RK(cudaEventRecord(ev, k));
    RK(cudaStreamWaitEvent(0, ev, 0));
    static char pageable[4096]; double a = now();
    RK(cudaMemcpy(pageable, (void*)dev, 4096, cudaMemcpyDeviceToHost));
    printf("main: pageable cudaMemcpy returned after %.2f s\n", now() - a);
  }
  if (mode == 'd') { double a = now(); RK(cudaDeviceSynchronize()); printf("main: cudaDeviceSynchronize returned after %.2f s\n", now() - a); }
  if (mode == 's') { double a = now(); RK(cudaStreamSynchronize(k)); printf("main: cudaStreamSynchronize returned after %.2f s\n", now() - a); }
  worker.join();
  *(volatile int*)flag = 1;
  RK(cudaStreamSynchronize(k));
  watchdog.detach();
  printf("ok\n");
  return 0;
}
