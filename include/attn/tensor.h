// attn: strided tensor views over caller memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace attn {

// Element types. Q, K, V and O may be f32, bf16 or f16 (accumulation is always fp32 or better); K and V may also be
// i8, an 8-bit quantised KV cache whose rows carry an f32 scale each, or i4, a 4-bit one with an f32 scale per
// block of 32 values of a row (Params::k_scale / v_scale); masks are f32 (additive) or boolean (1 byte, nonzero =
// keep); key lengths are i32 or i64.
//
// i4 packs two values per byte: element d of a row is the low nibble of byte d/2 when d is even, the high one when
// d is odd, stored as q + 8 (q in [-8, 7]). A view's strides still count elements (nibbles): an i4 view needs unit
// stride in its last dimension and even strides in the others, so that every row starts on a byte.
enum class DType : std::uint8_t { f32, bf16, f16, boolean, i32, i64, i8, i4 };

const char* dtype_name(DType dtype);   // "f32", "bf16", ...
std::size_t dtype_size(DType dtype);   // bytes per element (i4: 1, the byte that holds two)
int dtype_bits(DType dtype);           // bits per element (i4: 4)
// Bytes that `elements` consecutive elements occupy (i4: rounded up to whole bytes).
std::int64_t dtype_bytes(DType dtype, std::int64_t elements);
// i4: values per scale (Params::k_scale / v_scale hold ceil(dim / kI4Block) scales per row).
inline constexpr std::int64_t kI4Block = 32;

// Where a view's memory lives: the host (the default), or CUDA device `index`. Every tensor of one call lives on
// one device; a call on CUDA tensors runs on that device, queued on Params::stream.
struct Device {
  enum class Kind : std::uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;  // the CUDA device ordinal (0 for the host)
  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cuda() const { return kind == Kind::cuda; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};
// "cpu" or "cuda:<index>".
std::string device_name(Device device);

// A view of up to 4 dimensions over memory the caller owns. Strides are counted in elements,
// not bytes; any sign is allowed and 0 broadcasts a dimension (inputs only). Attention tensors
// use the logical order [batch, heads, seq, dim]; both BHSD (PyTorch) and BSHD (FlashAttention)
// memory layouts are just different strides.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device;  // where data points (host memory by default)
  int rank = 0;
  std::array<std::int64_t, 4> shape{};
  std::array<std::int64_t, 4> strides{};

  // Row-major contiguous view, rank = shape.size() (1..4).
  static TensorView contiguous(const void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  // The same for a shape known at run time (rank 1..4).
  static TensorView contiguous(const void* data, DType dtype, const std::int64_t* shape, int rank);
  // Logical [B, H, S, D] view over memory laid out as [B, S, H, D].
  static TensorView bshd(const void* data, DType dtype, std::int64_t batch, std::int64_t seq,
                         std::int64_t heads, std::int64_t dim);

  std::int64_t numel() const;
  // The same view on another device (its data pointer must point into that device's memory).
  TensorView on(Device d) const {
    TensorView t = *this;
    t.device = d;
    return t;
  }
};

}  // namespace attn
