// attn tools: NumPy .npy reader/writer. See npy.h for the contract.
//
// File layout (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
//   "\x93NUMPY" | major | minor | header length (uint16 LE for 1.0, uint32 LE for 2.0/3.0)
//   | header text: a Python dict literal such as
//     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }   padded with spaces + '\n'
//   | raw element data.
#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

#include "files.h"

namespace attn::npy {

static_assert(std::endian::native == std::endian::little,
              "npy.cc stores data in native order and assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
// No single dimension may reach this; keeps every intermediate product comfortably in range.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 62;

Status fail(const std::string& what, const std::string& problem, const std::string& expected) {
  return Status::Invalid(what, problem + "; expected " + expected);
}

// a * b for non-negative operands; false if the result would exceed `limit`.
bool mul_within(std::uint64_t a, std::uint64_t b, std::uint64_t limit, std::uint64_t* result) {
  if (b != 0 && a > limit / b) return false;
  *result = a * b;
  return true;
}

// Total data bytes for `shape`, or false if it overflows int64 / size_t. Zero dimensions do not
// hide overflow in the others: the product of the nonzero dimensions must fit too.
bool data_bytes(const std::vector<std::int64_t>& shape, std::size_t itemsize, std::uint64_t* out) {
  constexpr std::uint64_t limit = std::min<std::uint64_t>(std::numeric_limits<std::int64_t>::max(),
                                                          std::numeric_limits<std::size_t>::max());
  std::uint64_t nonzero = itemsize;
  bool empty = false;
  for (std::int64_t d : shape) {
    if (d == 0) {
      empty = true;
    } else if (!mul_within(nonzero, static_cast<std::uint64_t>(d), limit, &nonzero)) {
      return false;
    }
  }
  *out = empty ? 0 : nonzero;
  return true;
}

// A shape as the header's Python tuple literal: "(2, 3)", "(5,)", "()". (Messages write shapes as shape_text does.)
std::string header_tuple(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// Quotes header text for an error message. The header has already been checked to be
// printable ASCII plus whitespace; whitespace is shown as a space and long text is cut.
std::string quoted(std::string_view text) {
  constexpr std::size_t kMax = 24;
  std::string s = "'";
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    s += (text[i] < 0x20) ? ' ' : text[i];
  }
  if (text.size() > kMax) s += "...";
  return s + "'";
}

// Maps a descr string to a dtype (kDTypes) and whether its bytes must be swapped into native order.
bool decode_descr(std::string_view descr, DType* dtype, bool* swap) {
  if (descr.size() != 3) return false;
  const char order = descr[0];
  const std::string_view code = descr.substr(1);
  for (const DTypeSpelling& t : kDTypes) {
    if (*t.descr == '\0' || code != std::string_view(t.descr).substr(1)) continue;
    *dtype = t.dtype;
    if (dtype_size(t.dtype) == 1) {  // one byte: every byte-order character is unambiguous
      *swap = false;
      return order == '<' || order == '>' || order == '=' || order == '|';
    }
    if (order == '<' || order == '=') {  // '=' is native, and we are little-endian
      *swap = false;
    } else if (order == '>') {
      *swap = true;
    } else {
      return false;  // '|' (not applicable) is meaningless for multi-byte types
    }
    return true;
  }
  return false;
}

// "float32 ('<f4') or float16 ('<f2')": the accepted dtypes, in the table's order.
std::string accepted_text(DTypeSet accepted) {
  std::vector<std::string> names;
  for (const DTypeSpelling& t : kDTypes) {
    if (*t.descr != '\0' && accepted.contains(t.dtype)) names.push_back(std::string(t.name) + " ('" + t.descr + "')");
  }
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) s += i + 1 == names.size() ? " or " : ", ";
    s += names[i];
  }
  return s;
}

struct Header {
  std::string_view descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// A small recursive-descent parser for the header dict. Grammar (whitespace allowed anywhere
// between tokens; both quote styles; trailing commas optional):
//   dict  := '{' [ entry { ',' entry } [ ',' ] ] '}'
//   entry := string ':' value        keys: 'descr' (string), 'fortran_order' (True/False),
//                                          'shape' (tuple of non-negative integers)
//   tuple := '(' [ int { ',' int } [ ',' ] ] ')'     int := digits [ 'L' ]  (Python 2 longs)
// Every step advances `pos_` or stops with an error, so parsing is linear in the header size.
class HeaderParser {
 public:
  // `dtypes` lists the dtypes the caller accepts, for the messages about 'descr'.
  HeaderParser(std::string_view text, const std::string& what, const std::string& dtypes)
      : text_(text), what_(what), dtypes_(dtypes) {}

  Status parse(Header* out) {
    constexpr char kKeys[] = "a dict with keys 'descr', 'fortran_order' and 'shape'";
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_ws();
    if (!eat('{')) return error("header does not start with '{'", kKeys);
    while (true) {
      skip_ws();
      if (eat('}')) break;
      std::string_view key;
      if (peek() != '\'' && peek() != '"') {
        return error("header has " + near() + " where a quoted key should be", kKeys);
      }
      if (Status s = parse_string(&key); !s.ok()) return s;
      skip_ws();
      if (!eat(':')) {
        return error("header key '" + std::string(key) + "' is not followed by ':'",
                     "a Python dict literal");
      }
      skip_ws();
      if (key == "descr") {
        if (seen_descr) return duplicate(key);
        seen_descr = true;
        if (peek() == '[' || peek() == '{') {
          return error("structured/record dtypes are not supported", dtypes_);
        }
        if (peek() != '\'' && peek() != '"') {
          return error("'descr' value " + near() + " is not a quoted string", dtypes_);
        }
        if (Status s = parse_string(&out->descr); !s.ok()) return s;
      } else if (key == "fortran_order") {
        if (seen_fortran) return duplicate(key);
        seen_fortran = true;
        if (Status s = parse_bool(&out->fortran_order); !s.ok()) return s;
      } else if (key == "shape") {
        if (seen_shape) return duplicate(key);
        seen_shape = true;
        if (Status s = parse_shape(&out->shape); !s.ok()) return s;
      } else {
        return error("header has unknown key " + quoted(key), kKeys);
      }
      skip_ws();
      if (eat(',')) continue;
      if (eat('}')) break;
      return error("header has " + near() + " after the value of '" + std::string(key) + "'",
                   "',' or '}'");
    }
    skip_ws();
    if (pos_ != text_.size()) {
      return error("header has trailing text " + near() + " after the dict", "only padding");
    }
    if (!seen_descr) return missing("descr");
    if (!seen_fortran) return missing("fortran_order");
    if (!seen_shape) return missing("shape");
    return Status::Ok();
  }

 private:
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void skip_ws() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  // The text at the current position, for error messages.
  std::string near() const {
    return pos_ < text_.size() ? quoted(text_.substr(pos_)) : "end of header";
  }

  Status error(const std::string& problem, const std::string& expected) const {
    return fail(what_, problem, expected);
  }
  Status duplicate(std::string_view key) const {
    return error("header has key '" + std::string(key) + "' more than once",
                 "each of 'descr', 'fortran_order' and 'shape' exactly once");
  }
  Status missing(const char* key) const {
    return error(std::string("header is missing key '") + key + "'",
                 "a dict with keys 'descr', 'fortran_order' and 'shape'");
  }

  // A string in single or double quotes; no escape sequences (none occur in valid headers).
  Status parse_string(std::string_view* out) {
    const char quote = text_[pos_++];  // caller checked it is a quote
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' || text_[pos_] == '\n') {
        return error(
            "header string " + quoted(text_.substr(start - 1)) + " contains a backslash or newline",
            "a plain quoted string");
      }
      ++pos_;
    }
    if (pos_ == text_.size()) {
      return error("header string " + quoted(text_.substr(start - 1)) + " is not terminated",
                   std::string("a closing ") + quote);
    }
    *out = text_.substr(start, pos_ - start);
    ++pos_;  // closing quote
    return Status::Ok();
  }

  Status parse_bool(bool* out) {
    const std::string_view rest = text_.substr(pos_);
    // A word ends at a delimiter, so "Trueish" is not taken for True.
    auto word = [&](std::string_view w) {
      return rest.substr(0, w.size()) == w &&
             (rest.size() == w.size() || is_space(rest[w.size()]) || rest[w.size()] == ',' ||
              rest[w.size()] == '}');
    };
    if (word("True")) {
      *out = true;
      pos_ += 4;
    } else if (word("False")) {
      *out = false;
      pos_ += 5;
    } else {
      return error("'fortran_order' value " + near() + " is not a boolean", "True or False");
    }
    return Status::Ok();
  }

  Status parse_shape(std::vector<std::int64_t>* shape) {
    constexpr char kShape[] = "a tuple of non-negative integers such as (2, 3), (5,) or ()";
    if (!eat('(')) return error("'shape' value " + near() + " is not a tuple", kShape);
    skip_ws();
    if (eat(')')) return Status::Ok();  // () : a 0-d scalar
    while (true) {
      skip_ws();
      if (peek() == '-') return error("'shape' has a negative dimension " + near(), kShape);
      if (!is_digit(peek())) {
        return error("'shape' has " + near() + " where a dimension should be", kShape);
      }
      const std::size_t start = pos_;
      std::int64_t dim = 0;
      while (is_digit(peek())) {
        const int digit = text_[pos_] - '0';
        if (dim > (kMaxDim - 1 - digit) / 10) {  // i.e. dim * 10 + digit >= kMaxDim
          return error("'shape' has an absurdly large dimension " + quoted(text_.substr(start)),
                       "each dimension below 2^62");
        }
        dim = dim * 10 + digit;
        ++pos_;
      }
      eat('L');  // Python 2 wrote long integers as 3L
      if (shape->size() == static_cast<std::size_t>(kMaxRank)) {
        return error("'shape' has more than " + std::to_string(kMaxRank) + " dimensions",
                     "rank at most " + std::to_string(kMaxRank));
      }
      shape->push_back(dim);
      skip_ws();
      if (eat(',')) {
        skip_ws();
        if (eat(')')) return Status::Ok();
        continue;
      }
      // "(5)" is an int in Python, not a tuple; accept it as (5,) since the meaning is clear.
      if (eat(')')) return Status::Ok();
      return error("'shape' has " + near() + " after a dimension", "',' or ')'");
    }
  }

  std::string_view text_;
  const std::string& what_;
  const std::string& dtypes_;
  std::size_t pos_ = 0;
};

void swap_bytes(unsigned char* data, std::size_t count, std::size_t itemsize) {
  for (std::size_t i = 0; i < count; ++i) {
    unsigned char* p = data + i * itemsize;
    for (std::size_t a = 0, b = itemsize - 1; a < b; ++a, --b) std::swap(p[a], p[b]);
  }
}

// Copies `src`, laid out in Fortran order (first index fastest), into `dst` in C order (last index
// fastest) by walking the C-order index like an odometer while tracking the Fortran offset.
void fortran_to_c(const unsigned char* src, unsigned char* dst,
                  const std::vector<std::int64_t>& shape, std::size_t itemsize) {
  const std::size_t rank = shape.size();
  std::array<std::int64_t, kMaxRank> fstride{}, index{};
  std::int64_t numel = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    fstride[k] = numel;
    numel *= shape[k];  // fits: the caller validated numel * itemsize
  }
  std::int64_t offset = 0;  // Fortran-order element offset of `index`
  for (std::int64_t n = 0; n < numel; ++n) {
    std::memcpy(dst + static_cast<std::size_t>(n) * itemsize,
                src + static_cast<std::size_t>(offset) * itemsize, itemsize);
    for (std::size_t k = rank; k-- > 0;) {
      if (++index[k] < shape[k]) {
        offset += fstride[k];
        break;
      }
      offset -= (shape[k] - 1) * fstride[k];
      index[k] = 0;
    }
  }
}

// Validates write()/serialize() arguments; sets *nbytes to the data size.
Status check_writable(const std::string& what, DType dtype, const std::vector<std::int64_t>& shape,
                      const void* data, std::uint64_t* nbytes) {
  if (*descr_of(dtype) == '\0') {
    return fail(what,
                dtype == DType::bf16 ? "cannot write dtype bf16 (.npy has no bfloat16)"
                                     : "cannot write an unknown dtype",
                accepted_text(DTypeSet{}));
  }
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
    return fail(what, "shape has " + std::to_string(shape.size()) + " dimensions",
                "rank at most " + std::to_string(kMaxRank));
  }
  for (std::int64_t d : shape) {
    if (d < 0 || d >= kMaxDim) {
      return fail(what, "shape " + shape_text(shape) + " has an invalid dimension",
                  "non-negative dimensions below 2^62");
    }
  }
  if (!data_bytes(shape, dtype_size(dtype), nbytes)) {
    return fail(what, "shape " + shape_text(shape) + " is too large to address",
                "a total size that fits in 64 bits");
  }
  if (*nbytes != 0 && data == nullptr) {
    return fail(what, "data is null for a non-empty shape " + shape_text(shape),
                "a pointer to the array's elements");
  }
  return Status::Ok();
}

// NumPy's name for a descr we do not read ('<f8' -> "float64", '|u1' -> "uint8"), or "" if it is
// not a plain number type.
std::string numpy_name_of(std::string_view descr) {
  if (descr.size() < 3 || std::string_view("<>=|").find(descr[0]) == std::string_view::npos) return "";
  const std::string_view size = descr.substr(2);
  if (!std::all_of(size.begin(), size.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      size.size() > 2) {
    return "";
  }
  const int bytes = std::stoi(std::string(size));
  switch (descr[1]) {
    case 'f': return "float" + std::to_string(8 * bytes);
    case 'i': return "int" + std::to_string(8 * bytes);
    case 'u': return "uint" + std::to_string(8 * bytes);
    case 'c': return "complex" + std::to_string(8 * bytes);
    case 'b': return bytes == 1 ? "bool" : "";
    default: return "";
  }
}

// The fixed-size start of a file: magic, version, header length.
struct Preamble {
  std::size_t prefix = 0;  // bytes before the header text: 10 (version 1.0) or 12 (2.0, 3.0)
  std::uint64_t header_len = 0;
};

// Checks the preamble in p[0 .. have), where `have` is min(size, 12) or more, of a file of `size`
// bytes; the header length must fit in the file.
Status parse_preamble(const unsigned char* p, std::size_t have, std::uint64_t size,
                      const std::string& what, Preamble* out) {
  if (have < kMagicSize + 2 || std::memcmp(p, kMagic, kMagicSize) != 0) {
    return fail(what, "not a .npy file (bad magic string)",
                "a file starting with \\x93NUMPY followed by a version");
  }
  const int major = p[6], minor = p[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return fail(
        what, "unknown .npy format version " + std::to_string(major) + "." + std::to_string(minor),
        "version 1.0, 2.0 or 3.0");
  }
  // Header length: 2 bytes in 1.0, 4 bytes in 2.0/3.0, little-endian.
  const std::size_t len_size = major == 1 ? 2 : 4;
  const std::size_t prefix = kMagicSize + 2 + len_size;
  if (have < prefix) {
    return fail(what,
                "file ends inside the header length field (" + std::to_string(size) + " bytes)",
                "at least " + std::to_string(prefix) + " bytes");
  }
  std::uint64_t header_len = 0;
  for (std::size_t i = 0; i < len_size; ++i) {
    header_len |= static_cast<std::uint64_t>(p[8 + i]) << (8 * i);
  }
  if (header_len > size - prefix) {
    return fail(what,
                "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                    std::to_string(size - prefix) + " bytes after the length field)",
                "a header that fits in the file");
  }
  out->prefix = prefix;
  out->header_len = header_len;
  return Status::Ok();
}

// What the header says about the data.
struct Layout {
  std::size_t data_offset = 0;
  std::string descr;
  DType dtype = DType::f32;
  bool swap = false, fortran_order = false;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;
};

// Checks and parses the header text; the dtype must be in `accepted`.
Status parse_layout(std::string_view text, const Preamble& pre, const std::string& what,
                    DTypeSet accepted, Layout* out) {
  // Header text: printable ASCII and whitespace only (3.0 allows UTF-8, but no valid header for
  // a supported dtype needs it). Checking up front lets error messages quote the header safely.
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      return fail(what,
                  std::string("header contains byte ") + hex + " at offset " +
                      std::to_string(pre.prefix + i),
                  "a printable ASCII Python dict literal");
    }
  }
  Header header;
  if (Status s = HeaderParser(text, what, accepted_text(accepted)).parse(&header); !s.ok()) return s;

  Layout layout;
  layout.data_offset = pre.prefix + text.size();
  layout.descr = std::string(header.descr);
  if (!decode_descr(header.descr, &layout.dtype, &layout.swap)) {
    const std::string name = numpy_name_of(header.descr);
    return fail(what,
                "unsupported dtype " + quoted(header.descr) + (name.empty() ? "" : " (" + name + ")"),
                accepted_text(accepted));
  }
  if (!accepted.contains(layout.dtype)) {
    return fail(what, std::string("dtype ") + numpy_name(layout.dtype) + " (" + quoted(header.descr) + ")",
                accepted_text(accepted));
  }
  // Data size: computed without overflow.
  if (!data_bytes(header.shape, dtype_size(layout.dtype), &layout.nbytes)) {
    return fail(what, "shape " + shape_text(header.shape) + " is too large to address",
                "a total size that fits in 64 bits");
  }
  layout.fortran_order = header.fortran_order;
  layout.shape = std::move(header.shape);
  *out = std::move(layout);
  return Status::Ok();
}

// The data must be exactly as large as the header declares.
Status check_data_size(const Layout& layout, std::uint64_t available, const std::string& what) {
  if (available == layout.nbytes) return Status::Ok();
  return fail(what,
              "data section is " + std::to_string(available) + " bytes (" +
                  (available < layout.nbytes ? "truncated" : "trailing bytes") + ")",
              "exactly " + std::to_string(layout.nbytes) + " bytes for shape " +
                  shape_text(layout.shape) + " of " + layout.descr);
}

// A buffer of exactly `nbytes` (already checked against the input's size).
Status allocate(std::uint64_t nbytes, const std::string& what, std::vector<unsigned char>* out) {
  try {
    out->resize(static_cast<std::size_t>(nbytes));
  } catch (const std::exception&) {
    return fail(what, "data of " + std::to_string(nbytes) + " bytes does not fit in memory",
                "an array that fits in memory");
  }
  return Status::Ok();
}

// Turns the raw data section into the Array: C order, native byte order, bools as 0/1.
Status finish(Layout layout, std::vector<unsigned char> raw, const std::string& what, Array* out) {
  const std::size_t itemsize = dtype_size(layout.dtype);
  Array result;
  result.dtype = layout.dtype;
  result.shape = std::move(layout.shape);
  if (layout.fortran_order && result.shape.size() > 1 && !raw.empty()) {
    if (Status s = allocate(raw.size(), what, &result.data); !s.ok()) return s;
    fortran_to_c(raw.data(), result.data.data(), result.shape, itemsize);
  } else {
    result.data = std::move(raw);
  }
  if (layout.swap) swap_bytes(result.data.data(), result.data.size() / itemsize, itemsize);
  if (result.dtype == DType::boolean) {
    for (unsigned char& b : result.data) b = b != 0;  // any nonzero byte is true
  }
  *out = std::move(result);
  return Status::Ok();
}

// Closes a descriptor on scope exit.
struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

// Reads up to n bytes, retrying short reads; *got < n only at end of file. Returns 0 or an errno.
int read_fully(int fd, void* buffer, std::size_t n, std::size_t* got) {
  auto* p = static_cast<unsigned char*>(buffer);
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::read(fd, p + *got, n - *got);
    if (r > 0) {
      *got += static_cast<std::size_t>(r);
    } else if (r == 0) {
      break;
    } else if (errno != EINTR) {
      return errno;
    }
  }
  return 0;
}

}  // namespace

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

const char* numpy_name(DType dtype) {
  for (const DTypeSpelling& t : kDTypes)
    if (t.dtype == dtype) return t.name;
  return "unknown";
}

const char* descr_of(DType dtype) {
  for (const DTypeSpelling& t : kDTypes)
    if (t.dtype == dtype) return t.descr;
  return "";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status parse(const void* bytes, std::size_t size, const std::string& what, Array* out,
             DTypeSet accepted) {
  if (out == nullptr) return fail(what, "output array is null", "a destination Array");
  if (size == 0) return fail(what, "file is empty", "a .npy file");
  if (bytes == nullptr) return fail(what, "data pointer is null", "the file's bytes");
  const auto* p = static_cast<const unsigned char*>(bytes);

  Preamble pre;
  if (Status s = parse_preamble(p, size, size, what, &pre); !s.ok()) return s;
  const std::string_view text(reinterpret_cast<const char*>(p + pre.prefix),
                              static_cast<std::size_t>(pre.header_len));
  Layout layout;
  if (Status s = parse_layout(text, pre, what, accepted, &layout); !s.ok()) return s;
  if (Status s = check_data_size(layout, size - layout.data_offset, what); !s.ok()) return s;

  // Only now, with the size bounded by the real input, allocate and convert.
  std::vector<unsigned char> raw;
  if (Status s = allocate(layout.nbytes, what, &raw); !s.ok()) return s;
  if (layout.nbytes != 0) std::memcpy(raw.data(), p + layout.data_offset, raw.size());
  return finish(std::move(layout), std::move(raw), what, out);
}

Status read(const std::string& path, const std::string& what, Array* out, DTypeSet accepted) {
  if (out == nullptr) return fail(what, "output array is null", "a destination Array");
  auto cannot_open = [&](int err) {
    return fail(what, "cannot open '" + path + "' (" + std::generic_category().message(err) + ")",
                "an existing, readable .npy file");
  };
  auto not_regular = [&](mode_t mode) {
    return fail(what, "'" + path + "' is " + tools::special_file_kind(mode), "a regular .npy file");
  };
  // Not even opened unless it is a regular file: opening a FIFO blocks, and a device may react.
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return cannot_open(errno);
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return cannot_open(errno);
  const Fd closer{fd};
  // The open descriptor is what gets read: confirm it is (still) a regular file and take its size.
  if (::fstat(fd, &st) != 0) return cannot_open(errno);
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  if (st.st_size <= 0) return fail(what, "file is empty", "a .npy file");
  const auto size = static_cast<std::uint64_t>(st.st_size);

  auto read_error = [&](int err) {
    return fail(what, "cannot read '" + path + "' (" + std::generic_category().message(err) + ")",
                "a readable .npy file");
  };
  auto changed = [&](std::uint64_t at) {
    return fail(what,
                "'" + path + "' changed size while being read (" + std::to_string(at) +
                    " bytes read of the " + std::to_string(size) + " it had)",
                "a file that is not being written");
  };

  // 1. Magic, version and header length: at most 12 bytes.
  unsigned char head[12];
  const std::size_t head_size = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof head, size));
  std::size_t got = 0;
  if (int err = read_fully(fd, head, head_size, &got); err != 0) return read_error(err);
  if (got != head_size) return changed(got);
  Preamble pre;
  if (Status s = parse_preamble(head, head_size, size, what, &pre); !s.ok()) return s;

  // 2. The header: parse_preamble checked that it fits in the file, so this allocation is bounded.
  std::string text;
  try {
    text.resize(static_cast<std::size_t>(pre.header_len));
  } catch (const std::exception&) {
    return fail(what, "header of " + std::to_string(pre.header_len) + " bytes does not fit in memory",
                "a header of a few hundred bytes");
  }
  const std::size_t already = head_size - pre.prefix;  // header bytes among the 12 read
  const std::size_t from_head = std::min(already, text.size());
  std::memcpy(text.data(), head + pre.prefix, from_head);
  if (from_head < text.size()) {
    if (int err = read_fully(fd, text.data() + from_head, text.size() - from_head, &got); err != 0)
      return read_error(err);
    if (got != text.size() - from_head) return changed(head_size + got);
  }
  Layout layout;
  if (Status s = parse_layout(text, pre, what, accepted, &layout); !s.ok()) return s;

  // 3. The declared data size against the file's real size, before allocating anything for it.
  if (Status s = check_data_size(layout, size - layout.data_offset, what); !s.ok()) return s;

  // 4. Exactly that many bytes (some of them possibly among the 12 read first, in a tiny file).
  std::vector<unsigned char> raw;
  if (Status s = allocate(layout.nbytes, what, &raw); !s.ok()) return s;
  std::size_t have = 0;
  if (already > text.size()) {
    have = std::min(already - text.size(), raw.size());
    std::memcpy(raw.data(), head + pre.prefix + text.size(), have);
  }
  if (have < raw.size()) {
    if (int err = read_fully(fd, raw.data() + have, raw.size() - have, &got); err != 0)
      return read_error(err);
    if (got != raw.size() - have) return changed(layout.data_offset + have + got);
  }
  unsigned char extra;
  if (int err = read_fully(fd, &extra, 1, &got); err != 0) return read_error(err);
  if (got != 0) return changed(size + 1);
  return finish(std::move(layout), std::move(raw), what, out);
}

std::string serialize(DType dtype, const std::vector<std::int64_t>& shape, const void* data) {
  std::uint64_t nbytes = 0;
  if (!check_writable("serialize", dtype, shape, data, &nbytes).ok()) return {};

  std::string dict = std::string("{'descr': '") + descr_of(dtype) +
                     "', 'fortran_order': False, 'shape': " + header_tuple(shape) + ", }";
  // Pad with spaces and end with '\n' so that the data starts at a multiple of 64 bytes. With
  // rank <= kMaxRank the header is a few hundred bytes, so version 1.0's 2-byte length suffices.
  constexpr std::size_t prefix = kMagicSize + 2 + 2;
  const std::size_t unpadded = prefix + dict.size() + 1;  // + '\n'
  const std::size_t header_len = dict.size() + 1 + (64 - unpadded % 64) % 64;
  static_assert(kMaxRank * 24 + 128 < 0xffff, "header must fit a version 1.0 length field");

  std::string out;
  out.reserve(prefix + header_len + static_cast<std::size_t>(nbytes));
  out.append(kMagic, kMagicSize);
  out.push_back(1);  // version 1.0
  out.push_back(0);
  out.push_back(static_cast<char>(header_len & 0xff));  // little-endian uint16 header length
  out.push_back(static_cast<char>(header_len >> 8));
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out.push_back('\n');
  if (nbytes != 0) {
    const std::size_t start = out.size();
    out.append(static_cast<const char*>(data), static_cast<std::size_t>(nbytes));
    if (dtype == DType::boolean) {  // normalize so numpy sees canonical 0/1 bools
      for (std::size_t i = start; i < out.size(); ++i) out[i] = out[i] != 0;
    }
  }
  return out;
}

Status write(const std::string& path, DType dtype, const std::vector<std::int64_t>& shape,
             const void* data) {
  std::uint64_t nbytes = 0;
  if (Status s = check_writable(path, dtype, shape, data, &nbytes); !s.ok()) return s;
  return tools::write_file(path, path, serialize(dtype, shape, data));
}

}  // namespace attn::npy
