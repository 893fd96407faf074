// attn fuzzing: reading structured choices from the fuzzer's bytes (a small stand-in for libFuzzer's
// FuzzedDataProvider, so the harnesses also build with g++ for the regression driver). Every read is
// deterministic and past the end of the input returns zeros, so any byte string is a valid input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace attn::fuzz {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return byte() & 1; }
  // True with probability about 1/n (n >= 1).
  bool one_in(unsigned n) { return byte() % n == 0; }
  // A value in [lo, hi] (hi - lo < 2^16).
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    const std::uint64_t v = span <= 256 ? byte() : (static_cast<std::uint64_t>(byte()) << 8) | byte();
    return lo + static_cast<std::int64_t>(v % span);
  }
  template <class T>
  T raw() {
    T v{};
    unsigned char bytes[sizeof(T)] = {};
    for (std::size_t i = 0; i < sizeof(T); ++i) bytes[i] = byte();
    std::memcpy(&v, bytes, sizeof(T));
    return v;
  }
  template <class T, std::size_t N>
  T pick(const T (&values)[N]) {
    return values[byte() % N];
  }
  std::size_t remaining() const { return size_ - pos_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace attn::fuzz
