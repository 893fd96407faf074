// attn tools: reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// The reader treats every file as untrusted input: a malformed, truncated or hostile file yields
// an error Status, never a crash, hang, out-of-bounds read or an allocation larger than the file.
// Only regular files are read: a directory, FIFO, socket or device node (/dev/zero, /dev/stdin
// as a terminal or pipe) is refused before anything is read from it.
//
// Supported element types (descr in the header; the table kDTypes below):
//   '<f4' float32 -> DType::f32        '<i4' int32 -> DType::i32
//   '<f2' float16 -> DType::f16        '<i8' int64 -> DType::i64
//   '|i1' int8    -> DType::i8         '|b1' bool  -> DType::boolean (any nonzero byte reads as true, stored as 1)
// Big-endian ('>') forms are byte-swapped on read, '=' means native (little-endian), and '|' is
// accepted only where byte order does not matter (the one-byte types). fortran_order=True files are reordered
// into C order on read. Files are always written as little-endian, C-order, version 1.0, with the
// data starting at a multiple of 64 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
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

// The dtypes an input may have, e.g. DTypeSet{DType::i32, DType::i64} for key lengths. The empty set
// (the default) accepts every dtype listed above.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> dtypes) {
    for (DType d : dtypes) bits_ |= 1u << static_cast<unsigned>(d);
  }
  constexpr bool any() const { return bits_ == 0; }
  constexpr bool contains(DType d) const { return any() || ((bits_ >> static_cast<unsigned>(d)) & 1u) != 0; }

 private:
  unsigned bits_ = 0;
};

// The one table of the element types and their NumPy spellings, for every message and every file of the
// program: NumPy's name of the dtype and the descr a .npy file of it carries as attn writes it ("" where .npy
// has no such type: bfloat16). In the order error messages list them.
struct DTypeSpelling {
  DType dtype;
  const char* name;   // numpy.dtype(...).name
  const char* descr;  // little-endian, or '|' for one byte
};
inline constexpr DTypeSpelling kDTypes[] = {
    {DType::f32, "float32", "<f4"}, {DType::f16, "float16", "<f2"}, {DType::boolean, "bool", "|b1"},
    {DType::i32, "int32", "<i4"},   {DType::i64, "int64", "<i8"},   {DType::i8, "int8", "|i1"},
    {DType::bf16, "bfloat16", ""},
};

// NumPy's name of `dtype` ("float32", "bfloat16", "int8", ...; "unknown" for a value outside the enum).
const char* numpy_name(DType dtype);

// The descr a file written with `dtype` carries ("<f4", "<f2", "|b1", "<i4", "<i8", "|i1"), or "" for a
// dtype that .npy cannot represent (bf16).
const char* descr_of(DType dtype);

// A shape as every message of the program (and of the library) writes it: "[2, 3, 4]", "[5]", "[]".
std::string shape_text(const std::vector<std::int64_t>& shape);

// Parses a complete in-memory .npy file (what the fuzzer and the tests feed it). `what` names the
// input in error messages, which read "<what>: <problem>; expected <expectation>"; a dtype outside
// `accepted` is an error listing the accepted ones. On error *out is left unchanged.
Status parse(const void* bytes, std::size_t size, const std::string& what, Array* out,
             DTypeSet accepted = {});

// Reads the .npy file at `path` with the same checks as parse(), in an order that never reads or
// allocates more than the file holds:
//   1. stat() the path and refuse anything that is not a regular file (a directory, FIFO, socket or
//      device: "--q: '/dev/zero' is a character device; expected a regular .npy file") without
//      opening it, then open it (non-blocking, so a FIFO swapped in meanwhile cannot hang the open)
//      and fstat() the open descriptor to confirm it is still a regular file;
//   2. read and check the magic string, the version and the header length (which must fit in the
//      file's size), then read and parse the header (dtype checked against `accepted`);
//   3. compute the data size the header declares (overflow-checked) and require it to be exactly
//      the file's size minus the header: a truncated file or trailing bytes are an error before
//      any data is allocated or read;
//   4. allocate exactly that and read it (a file that shrinks or grows meanwhile is an error).
Status read(const std::string& path, const std::string& what, Array* out, DTypeSet accepted = {});

// Returns the bytes of a .npy file holding `data` (C-order, native layout, numel * dtype size
// bytes; may be null when numel is 0). Returns an empty string if the arguments are invalid
// (bf16, a negative dimension, rank > kMaxRank, size overflow, or null data); write() reports
// the same conditions as an error Status.
std::string serialize(DType dtype, const std::vector<std::int64_t>& shape, const void* data);

// Writes serialize()'s bytes to a new temporary file in the same directory as `path`, then renames
// it over `path` (tools/files.h: write_file), so a failure never leaves a partial file behind. An
// existing `path` that is not a regular file (a FIFO, device, directory, socket or symbolic link)
// is refused, never replaced. Errors are prefixed with `path`.
Status write(const std::string& path, DType dtype, const std::vector<std::int64_t>& shape,
             const void* data);

}  // namespace attn::npy
