// Fuzz target: the .npy reader (tools/npy.h) on arbitrary bytes.
//
// The input is the file itself. npy::parse() reads it from memory; npy::read() reads the same bytes from a
// memfd through /proc/self/fd (a regular file, no disk), and both must give the same result: the same error
// message, or the same array. An accepted array must be self-consistent and survive a serialize/parse
// round trip; a refusal must be one line "--fuzz: <problem>; expected <what>".
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "npy.h"

namespace {

using attn::DType;
using attn::Status;
namespace npy = attn::npy;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_npy: %s\n", what.c_str());
  std::abort();
}

void check_status(const Status& s, const char* call) {
  if (s.ok()) return;
  const std::string& m = s.message();
  if (m.rfind("--fuzz: ", 0) != 0 || m.find("; expected ") == std::string::npos ||
      m.find('\n') != std::string::npos)
    fail(std::string(call) + " gave a message not of the form '--fuzz: <problem>; expected <what>': " + m);
}

void check_array(const npy::Array& a, std::size_t file_size) {
  if (a.shape.size() > static_cast<std::size_t>(npy::kMaxRank)) fail("rank above kMaxRank accepted");
  std::uint64_t n = 1;
  for (std::int64_t d : a.shape) {
    if (d < 0) fail("negative dimension accepted");
    n *= static_cast<std::uint64_t>(d);  // bounded: data.size() is checked against the file size below
  }
  if (a.data.size() > file_size) fail("more data than the file holds");
  if (n * attn::dtype_size(a.dtype) != a.data.size()) fail("data size does not match the shape");
  if (a.dtype == DType::boolean)
    for (unsigned char b : a.data)
      if (b > 1) fail("bool element not normalised to 0/1");
  // Round trip.
  const std::string again = npy::serialize(a.dtype, a.shape, a.data.data());
  if (again.empty()) fail("serialize refused an array parse accepted");
  npy::Array b;
  const Status s = npy::parse(again.data(), again.size(), "--fuzz", &b);
  if (!s.ok()) fail("parse refused serialize's output: " + s.message());
  if (b.dtype != a.dtype || b.shape != a.shape || b.data != a.data) fail("round trip changed the array");
}

// A memfd holding the current input, and its /proc path.
struct MemFile {
  int fd = -1;
  std::string path;
  MemFile() {
    fd = memfd_create("fuzz_npy", MFD_CLOEXEC);
    if (fd >= 0) path = "/proc/self/fd/" + std::to_string(fd);
  }
  bool set(const std::uint8_t* data, std::size_t size) {
    if (fd < 0 || ftruncate(fd, 0) != 0) return false;
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  npy::Array parsed;
  const Status p = npy::parse(data, size, "--fuzz", &parsed);
  check_status(p, "parse");
  if (p.ok()) check_array(parsed, size);

  // The dtype filter: with only key-length dtypes accepted, a float file is refused, an integer one not.
  npy::Array ints;
  const Status pi = npy::parse(data, size, "--fuzz", &ints, {DType::i32, DType::i64});
  check_status(pi, "parse (int32/int64 only)");
  if (pi.ok() != (p.ok() && (parsed.dtype == DType::i32 || parsed.dtype == DType::i64)))
    fail("the accepted-dtype filter disagrees with the dtype parse found: " + pi.message());

  static MemFile file;
  if (file.set(data, size)) {
    npy::Array read;
    const Status r = npy::read(file.path, "--fuzz", &read);
    check_status(r, "read");
    if (r.ok() != p.ok() || r.message() != p.message())
      fail("read and parse disagree: read '" + r.message() + "', parse '" + p.message() + "'");
    if (r.ok() && (read.dtype != parsed.dtype || read.shape != parsed.shape || read.data != parsed.data))
      fail("read and parse returned different arrays");
  }
  return 0;
}
