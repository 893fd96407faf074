// The CUDA runtime as attn sees it: whether this build has the CUDA backend, and which devices this process
// can use. Safe to call on any machine: with the toolkit's runtime linked statically (cudart_static), a machine
// without an NVIDIA driver or GPU loads the library and gets a device count of 0 and a Status saying
// "no CUDA device", never an abort. Builds without CUDA (ATTN_CUDA=OFF, or no nvcc) answer the same way.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "attn/status.h"

namespace attn::cuda {

// Whether this build compiled the CUDA backend (ATTN_HAVE_CUDA).
bool built_with_cuda();

// What the runtime reported the first time it was asked (once per process, thread-safe).
struct RuntimeProbe {
  int device_count = 0;   // 0 when there is no usable device, driver or CUDA build
  std::string error;      // why there is no device: the runtime's error name and text (empty when devices exist)
  int driver_version = 0;   // cudaDriverGetVersion (e.g. 13000), 0 without a driver
  int runtime_version = 0;  // cudaRuntimeGetVersion of the linked runtime, 0 without CUDA
};
const RuntimeProbe& probe();

int device_count();

// Ok when a CUDA device is present; otherwise Unsupported naming "device": "no CUDA device (<why>)".
Status require_device();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;  // compute capability
  int multiprocessors = 0;
  std::size_t global_memory = 0;   // bytes
  std::size_t shared_memory_per_block_optin = 0;  // bytes a block may opt in to
};
// The properties of device `index` (nothing when it does not exist).
std::optional<DeviceInfo> device_info(int index);

// Copies `bytes` bytes of device `device`'s memory at src to host memory at dst, ordered after the work queued on
// `stream` (a cudaStream_t, null for the default stream), and waits for it: how validation reads the values of
// small device tensors (key lengths, page tables, per-head parameters). "no CUDA device" where there is none.
Status copy_to_host(void* dst, const void* src, std::size_t bytes, int device, void* stream);

// Device memory for the tests and tools that put host data on a GPU (the library's entry points never allocate
// the caller's tensors): a buffer of `bytes` on `device` with `src` copied in (src may be null: uninitialised),
// freed by the destructor. Without a device, create() answers "no CUDA device".
class DeviceBuffer {
 public:
  static Status create(int device, const void* src, std::size_t bytes, DeviceBuffer* out);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), device_(o.device_) { o.data_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // The buffer's contents to host memory (bytes() of them), after the device's work so far.
  Status read(void* dst) const { return copy_to_host(dst, data_, bytes_, device_, nullptr); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

// The kernels are compiled for sm_80 and sm_90a (tensor-core mma.sync needs sm_80 or later).
inline bool kernels_support(const DeviceInfo& d) { return d.sm_major >= 8; }

}  // namespace attn::cuda
