// The CUDA runtime probe (cuda/runtime.h). Compiled in every build; without ATTN_HAVE_CUDA it reports no device.
#include "cuda/runtime.h"

#include <mutex>
#include <string>

#if ATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attn::cuda {

bool built_with_cuda() {
#if ATTN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

RuntimeProbe run_probe() {
  RuntimeProbe p;
#if ATTN_HAVE_CUDA
  // The static runtime loads the driver (libcuda.so.1) on first use; without one the call fails with
  // cudaErrorInsufficientDriver, without a GPU with cudaErrorNoDevice: both are answers, not faults.
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    p.device_count = 0;
    p.error = e != cudaSuccess ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)
                               : std::string("the runtime reports 0 devices");
    (void)cudaGetLastError();  // leave no error behind for later runtime calls
  } else {
    p.device_count = n;
  }
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  if (cudaRuntimeGetVersion(&p.runtime_version) != cudaSuccess) p.runtime_version = 0;
  (void)cudaGetLastError();
#else
  p.error = "attn was built without CUDA (configure with -DATTN_CUDA=ON where nvcc is installed)";
#endif
  return p;
}

}  // namespace

const RuntimeProbe& probe() {
  static std::once_flag once;
  static RuntimeProbe result;
  std::call_once(once, [] { result = run_probe(); });
  return result;
}

int device_count() { return probe().device_count; }

Status require_device() {
  const RuntimeProbe& p = probe();
  if (p.device_count > 0) return Status::Ok();
  return Status::Unsupported("device", "no CUDA device (" + p.error + ")");
}

Status copy_to_host(void* dst, const void* src, std::size_t bytes, int device, void* stream) {
  if (Status s = require_device(); !s) return s;
  if (device < 0 || device >= device_count())
    return Status::Invalid("device", "cuda:" + std::to_string(device) + "; expected a device index below " +
                                         std::to_string(device_count()));
  if (bytes == 0) return Status::Ok();
#if ATTN_HAVE_CUDA
  int previous = 0;
  (void)cudaGetDevice(&previous);
  cudaError_t e = cudaSetDevice(device);
  auto* s = static_cast<cudaStream_t>(stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  (void)cudaSetDevice(previous);
  if (e != cudaSuccess) {
    const std::string what = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();
    return Status::Invalid("device", "reading " + std::to_string(bytes) + " bytes from cuda:" + std::to_string(device) +
                                         " failed (" + what + "); expected device memory of that device");
  }
  return Status::Ok();
#else
  (void)dst, (void)src, (void)stream;
  return require_device();
#endif
}

std::optional<DeviceInfo> device_info(int index) {
  if (index < 0 || index >= device_count()) return std::nullopt;
#if ATTN_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  DeviceInfo d;
  d.index = index;
  d.name = prop.name;
  d.sm_major = prop.major;
  d.sm_minor = prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  d.global_memory = prop.totalGlobalMem;
  d.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  return d;
#else
  return std::nullopt;
#endif
}

Status DeviceBuffer::create(int device, const void* src, std::size_t bytes, DeviceBuffer* out) {
  if (Status s = require_device(); !s) return s;
  if (device < 0 || device >= device_count())
    return Status::Invalid("device", "cuda:" + std::to_string(device) + "; expected a device index below " +
                                         std::to_string(device_count()));
  *out = DeviceBuffer();
#if ATTN_HAVE_CUDA
  int previous = 0;
  (void)cudaGetDevice(&previous);
  cudaError_t e = cudaSetDevice(device);
  void* p = nullptr;
  if (e == cudaSuccess) e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e == cudaSuccess && src != nullptr && bytes > 0) e = cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
  (void)cudaSetDevice(previous);
  if (e != cudaSuccess) {
    if (p != nullptr) (void)cudaFree(p);
    (void)cudaGetLastError();
    return Status::OutOfMemory("device", "allocating " + std::to_string(bytes) + " bytes on cuda:" +
                                             std::to_string(device) + " failed (" + cudaGetErrorName(e) + ")");
  }
  out->data_ = p, out->bytes_ = bytes, out->device_ = device;
  return Status::Ok();
#else
  (void)src, (void)bytes;
  return require_device();
#endif
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    data_ = o.data_, bytes_ = o.bytes_, device_ = o.device_;
    o.data_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
#if ATTN_HAVE_CUDA
  if (data_ != nullptr) (void)cudaFree(data_);
#endif
  data_ = nullptr;
}

}  // namespace attn::cuda
