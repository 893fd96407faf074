// attn tools: reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// The reader treats every file as untrusted input: a malformed, truncated or hostile file yields
// an error Status, never a crash, hang, out-of-bounds read or an allocation larger than the file.
//
// Supported element types (descr in the header):
//   '<f4' float32 -> DType::f32        '<i4' int32 -> DType::i32
//   '<f2' float16 -> DType::f16        '<i8' int64 -> DType::i64
//   '|b1' bool    -> DType::boolean (one byte; any nonzero byte reads as true, stored as 1)
// Big-endian ('>') forms are byte-swapped on read, '=' means native (little-endian), and '|' is
// accepted only where byte order does not matter (bool). fortran_order=True files are reordered
// into C order on read. Files are always written as little-endian, C-order, version 1.0, with the
// data starting at a multiple of 64 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/status.h"
#include "attn/tensor.h"

namespace attn::npy {

inline constexpr int kMaxRank = 8;  // higher ranks are rejected on read and on write

struct Array {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  // empty = 0-d scalar
  std::vector<unsigned char> data;  // C-order, native little-endian, numel * dtype_size bytes
  std::int64_t numel() const;
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
};

// The descr a file written with `dtype` carries ("<f4", "<f2", "|b1", "<i4", "<i8"), or "" for a
// dtype that .npy cannot represent (bf16).
const char* descr_of(DType dtype);

// Parses a complete in-memory .npy file. `what` names the input in error messages, which read
// "<what>: <problem>; expected <expectation>". On error *out is left unchanged.
Status parse(const void* bytes, std::size_t size, const std::string& what, Array* out);

// Reads the whole file at `path`, then parse()s it.
Status read(const std::string& path, const std::string& what, Array* out);

// Returns the bytes of a .npy file holding `data` (C-order, native layout, numel * dtype size
// bytes; may be null when numel is 0). Returns an empty string if the arguments are invalid
// (bf16, a negative dimension, rank > kMaxRank, size overflow, or null data); write() reports
// the same conditions as an error Status.
std::string serialize(DType dtype, const std::vector<std::int64_t>& shape, const void* data);

// Writes serialize()'s bytes to a temporary file in the same directory as `path`, then renames
// it over `path`, so a failure never leaves a partial file behind.
Status write(const std::string& path, DType dtype, const std::vector<std::int64_t>& shape,
             const void* data);

}  // namespace attn::npy
