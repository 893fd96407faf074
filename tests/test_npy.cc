// Tests for tools/npy: round trips, hand-written headers, every rejection path, file I/O and a
// deterministic mutation fuzz test.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "files.h"
#include "npy.h"

namespace attn::npy {
namespace {


// Assembles a .npy file from a literal header (used as-is: no padding added), a version and data.
std::string raw_npy(std::string_view header, std::string_view data = {}, int major = 1,
                    int minor = 0) {
  std::string s = "\x93NUMPY";
  s.push_back(static_cast<char>(major));
  s.push_back(static_cast<char>(minor));
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  for (std::size_t i = 0; i < len_bytes; ++i) {
    s.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  s.append(header);
  s.append(data);
  return s;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

Status parse_string(const std::string& file, Array* out, const std::string& what = "--q") {
  return parse(file.data(), file.size(), what, out);
}

// Deterministic bytes for `n` elements of `dtype`.
std::vector<unsigned char> sample_data(DType dtype, std::int64_t n) {
  std::vector<unsigned char> data(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 37 + 11);
  if (dtype == DType::boolean) {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = (i % 3) != 0;
  }
  return data;
}

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Round trips and the written format.

TEST(NpyRoundTrip, EveryDtypeAndShape) {
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {1}, {2, 3}, {2, 3, 4, 5}};
  for (DType dtype : {DType::f32, DType::f16, DType::boolean, DType::i32, DType::i64, DType::i8}) {
    for (const auto& shape : shapes) {
      SCOPED_TRACE(std::string(descr_of(dtype)) + " rank " + std::to_string(shape.size()));
      const auto data = sample_data(dtype, numel_of(shape));
      const std::string file = serialize(dtype, shape, data.data());
      ASSERT_FALSE(file.empty());
      Array a;
      const Status s = parse_string(file, &a);
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_EQ(a.dtype, dtype);
      EXPECT_EQ(a.shape, shape);
      EXPECT_EQ(a.numel(), numel_of(shape));
      EXPECT_EQ(a.data, data);
    }
  }
}

TEST(NpyRoundTrip, TypedAccess) {
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 1e30f, -1e-30f};
  Array a;
  ASSERT_TRUE(parse_string(serialize(DType::f32, {2, 3}, f.data()), &a).ok());
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_EQ(a.as<float>()[i], f[i]);

  const std::vector<std::int64_t> l = {-1, INT64_MAX, INT64_MIN};
  ASSERT_TRUE(parse_string(serialize(DType::i64, {3}, l.data()), &a).ok());
  for (std::size_t i = 0; i < l.size(); ++i) EXPECT_EQ(a.as<std::int64_t>()[i], l[i]);
}

TEST(NpySerialize, HeaderMatchesNumpyLayout) {
  const std::vector<float> f(6, 1.0f);
  const std::string file = serialize(DType::f32, {2, 3}, f.data());
  ASSERT_GE(file.size(), 10u);
  EXPECT_EQ(file.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header_len =
      static_cast<unsigned char>(file[8]) | (static_cast<unsigned char>(file[9]) << 8);
  const std::size_t data_offset = 10 + header_len;
  EXPECT_EQ(data_offset % 64, 0u);
  EXPECT_EQ(file.size(), data_offset + 24);
  EXPECT_EQ(file[data_offset - 1], '\n');
  const std::string header = file.substr(10, header_len);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u)
      << header;
  // 1-d shapes need the trailing comma to be a tuple.
  EXPECT_NE(serialize(DType::i32, {4}, sample_data(DType::i32, 4).data()).find("(4,)"),
            std::string::npos);
  EXPECT_NE(serialize(DType::i32, {}, sample_data(DType::i32, 1).data()).find("'shape': ()"),
            std::string::npos);
}

TEST(NpySerialize, NormalizesBoolsAndAllowsNullForEmpty) {
  const unsigned char b[3] = {0, 7, 255};
  Array a;
  ASSERT_TRUE(parse_string(serialize(DType::boolean, {3}, b), &a).ok());
  EXPECT_EQ(a.data, (std::vector<unsigned char>{0, 1, 1}));
  EXPECT_FALSE(serialize(DType::f32, {0, 4}, nullptr).empty());
}

TEST(NpySerialize, InvalidArgumentsGiveEmptyString) {
  const std::vector<unsigned char> d(64);
  EXPECT_TRUE(serialize(DType::bf16, {2}, d.data()).empty());
  EXPECT_TRUE(serialize(DType::f32, {-1}, d.data()).empty());
  EXPECT_TRUE(serialize(DType::f32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, d.data()).empty());
  EXPECT_TRUE(serialize(DType::f32, {2}, nullptr).empty());
  EXPECT_TRUE(serialize(DType::i64, {1 << 30, 1 << 30, 1 << 30}, d.data()).empty());
  EXPECT_EQ(std::string(descr_of(DType::bf16)), "");
}

// ---------------------------------------------------------------------------------------------
// Hand-written headers.

TEST(NpyParse, Version2And3Headers) {
  const std::vector<std::int32_t> v = {1, 2, 3, 4, 5, 6};
  const std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }\n";
  for (int major : {2, 3}) {
    Array a;
    const Status s = parse_string(raw_npy(header, bytes_of(v), major), &a);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(a.dtype, DType::i32);
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3, 2}));
    EXPECT_EQ(std::vector<std::int32_t>(a.as<std::int32_t>(), a.as<std::int32_t>() + 6), v);
  }
}

TEST(NpyParse, TolerantHeaderSyntax) {
  const std::vector<float> v = {1, 2, 3, 4, 5};
  const std::string data = bytes_of(v);
  const char* headers[] = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }",
      "{\"shape\":(5,),\"descr\":\"<f4\",\"fortran_order\":False}",  // double quotes, order
      "  {\t'fortran_order' : False ,\n 'shape' : ( 5 , ) , 'descr' : '=f4' }  \n",  // whitespace
      "{'descr': '<f4', 'fortran_order': False, 'shape': (5)}",      // (5) taken as (5,)
      "{'descr': '<f4', 'fortran_order': False, 'shape': (5L,), }",  // Python 2 long
  };
  for (const char* h : headers) {
    SCOPED_TRACE(h);
    Array a;
    const Status s = parse_string(raw_npy(h, data), &a);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{5}));
    EXPECT_EQ(a.data, std::vector<unsigned char>(data.begin(), data.end()));
  }
  // Scalars and empty arrays.
  Array a;
  ASSERT_TRUE(parse_string(raw_npy("{'descr':'<i8','fortran_order':False,'shape':()}",
                                   bytes_of(std::vector<std::int64_t>{-7})),
                           &a)
                  .ok());
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.numel(), 1);
  EXPECT_EQ(a.as<std::int64_t>()[0], -7);
  ASSERT_TRUE(
      parse_string(raw_npy("{'descr':'<f4','fortran_order':False,'shape':(3,0,2)}"), &a).ok());
  EXPECT_EQ(a.numel(), 0);
  EXPECT_TRUE(a.data.empty());
}

TEST(NpyParse, BoolAnyNonzeroIsTrue) {
  for (const char* descr : {"|b1", "<b1", ">b1", "=b1"}) {
    SCOPED_TRACE(descr);
    Array a;
    const std::string h =
        std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (4,), }\n";
    ASSERT_TRUE(parse_string(raw_npy(h, std::string("\x00\x01\x02\xff", 4)), &a).ok());
    EXPECT_EQ(a.dtype, DType::boolean);
    EXPECT_EQ(a.data, (std::vector<unsigned char>{0, 1, 1, 1}));
  }
}

TEST(NpyParse, Int8AnyByteOrder) {
  for (const char* descr : {"|i1", "<i1", ">i1", "=i1"}) {
    SCOPED_TRACE(descr);
    Array a;
    const std::string h =
        std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (3,), }\n";
    ASSERT_TRUE(parse_string(raw_npy(h, std::string("\x00\x7f\x80", 3)), &a).ok());
    EXPECT_EQ(a.dtype, DType::i8);
    EXPECT_EQ(a.as<std::int8_t>()[2], -128);
  }
}

// The one table of dtype names (npy.h: kDTypes) and the one shape formatter the program's messages use.
TEST(NpyNames, EveryDtypeAndShape) {
  EXPECT_STREQ(numpy_name(DType::f32), "float32");
  EXPECT_STREQ(numpy_name(DType::bf16), "bfloat16");
  EXPECT_STREQ(numpy_name(DType::i8), "int8");
  EXPECT_STREQ(descr_of(DType::i8), "|i1");
  EXPECT_STREQ(numpy_name(static_cast<DType>(200)), "unknown");
  for (const DTypeSpelling& t : kDTypes) EXPECT_STRNE(numpy_name(t.dtype), "unknown");
  EXPECT_EQ(shape_text({2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(shape_text({5}), "[5]");
  EXPECT_EQ(shape_text({}), "[]");
  const std::vector<unsigned char> d(8);
  EXPECT_NE(write("unused.npy", DType::f32, {2, -1}, d.data()).message().find("shape [2, -1] has an invalid"),
            std::string::npos);
}

TEST(NpyParse, FortranOrderRank2) {
  // C-order [[0, 1, 2], [3, 4, 5]] stored column by column.
  const std::vector<float> fortran = {0, 3, 1, 4, 2, 5};
  Array a;
  const Status s = parse_string(
      raw_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", bytes_of(fortran)),
      &a);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.as<float>()[i], static_cast<float>(i));
}

TEST(NpyParse, FortranOrderHigherRanks) {
  const std::vector<std::vector<std::int64_t>> shapes = {
      {4}, {2, 3, 4}, {3, 1, 2, 5}, {2, 2, 2, 2, 2, 2, 2, 2}, {2, 0, 3}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(shape.size());
    const std::int64_t n = numel_of(shape);
    // Fortran-order file whose element at multi-index idx holds its C-order linear index.
    std::vector<std::int64_t> fortran(static_cast<std::size_t>(n));
    for (std::int64_t c = 0; c < n; ++c) {
      std::int64_t rem = c, f = 0, fstride = 1;
      std::vector<std::int64_t> idx(shape.size());
      for (std::size_t k = shape.size(); k-- > 0;) {
        idx[k] = rem % shape[k];
        rem /= shape[k];
      }
      for (std::size_t k = 0; k < shape.size(); ++k) {
        f += idx[k] * fstride;
        fstride *= shape[k];
      }
      fortran[static_cast<std::size_t>(f)] = c;
    }
    std::string dims;
    for (std::int64_t d : shape) dims += std::to_string(d) + ",";
    Array a;
    const Status s =
        parse_string(raw_npy("{'descr': '<i8', 'fortran_order': True, 'shape': (" + dims + "), }\n",
                             bytes_of(fortran)),
                     &a);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(a.shape, shape);
    for (std::int64_t c = 0; c < n; ++c) EXPECT_EQ(a.as<std::int64_t>()[c], c);
  }
}

TEST(NpyParse, BigEndian) {
  Array a;
  // float32 1.0 = 0x3f800000, -2.5 = 0xc0200000
  ASSERT_TRUE(parse_string(raw_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n",
                                   std::string("\x3f\x80\x00\x00\xc0\x20\x00\x00", 8)),
                           &a)
                  .ok());
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.as<float>()[0], 1.0f);
  EXPECT_EQ(a.as<float>()[1], -2.5f);

  // float16 1.0 = 0x3c00
  ASSERT_TRUE(parse_string(raw_npy("{'descr': '>f2', 'fortran_order': False, 'shape': (1,), }\n",
                                   std::string("\x3c\x00", 2)),
                           &a)
                  .ok());
  EXPECT_EQ(a.dtype, DType::f16);
  EXPECT_EQ(a.as<std::uint16_t>()[0], 0x3c00);

  ASSERT_TRUE(parse_string(raw_npy("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }\n",
                                   std::string("\x00\x00\x01\x02\xff\xff\xff\xfe", 8)),
                           &a)
                  .ok());
  EXPECT_EQ(a.dtype, DType::i32);
  EXPECT_EQ(a.as<std::int32_t>()[0], 0x102);
  EXPECT_EQ(a.as<std::int32_t>()[1], -2);

  ASSERT_TRUE(parse_string(raw_npy("{'descr': '>i8', 'fortran_order': False, 'shape': (), }\n",
                                   std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8)),
                           &a)
                  .ok());
  EXPECT_EQ(a.dtype, DType::i64);
  EXPECT_EQ(a.as<std::int64_t>()[0], 0x0102030405060708);

  // Big-endian and Fortran order together: [[1, 2], [3, 4]] stored as 1, 3, 2, 4.
  ASSERT_TRUE(parse_string(raw_npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 2)}",
                                   std::string("\0\0\0\1\0\0\0\3\0\0\0\2\0\0\0\4", 16)),
                           &a)
                  .ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.as<std::int32_t>()[i], i + 1);
}

// ---------------------------------------------------------------------------------------------
// Rejections. Each message must name the input (`what`), say what was wrong and what was expected.

struct BadCase {
  const char* name;
  std::string file;
  const char* needle;  // a substring the message must contain
};

std::string hdr(const std::string& descr, const std::string& fortran, const std::string& shape) {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }\n";
}

TEST(NpyReject, MalformedFiles) {
  const std::string f4x2 = bytes_of(std::vector<float>{1, 2});
  const std::string good = hdr("'<f4'", "False", "(2,)");
  std::string long_len = raw_npy(good, f4x2);
  long_len[8] = '\xff';  // header length 0x..ff: past the end of the file
  long_len[9] = '\x7f';
  std::string long_len_v2 = raw_npy(good, f4x2, 2);
  long_len_v2[11] = '\xff';  // header length ~4 GiB in a 2.0 file
  std::string non_ascii = good;
  non_ascii[3] = '\xe9';
  std::string nul = good;
  nul[good.size() - 3] = '\0';

  const std::vector<BadCase> cases = {
      {"empty", "", "empty"},
      {"bad magic", "\x93NUMPZ\x01\x00\x10\x00" + good + f4x2, "magic"},
      {"tiny", "\x93NUM", "magic"},
      {"version 4.0", raw_npy(good, f4x2, 4), "version 4.0"},
      {"version 1.1", raw_npy(good, f4x2, 1, 1), "version 1.1"},
      {"version 0.0", raw_npy(good, f4x2, 0), "version 0.0"},
      {"no length field", std::string("\x93NUMPY\x02\x00\x05", 9), "length"},
      {"header past end", long_len, "past the end"},
      {"header past end v2", long_len_v2, "past the end"},
      {"missing descr", raw_npy("{'fortran_order': False, 'shape': (2,), }", f4x2), "'descr'"},
      {"missing fortran_order", raw_npy("{'descr': '<f4', 'shape': (2,), }", f4x2),
       "'fortran_order'"},
      {"missing shape", raw_npy("{'descr': '<f4', 'fortran_order': False}", f4x2), "'shape'"},
      {"duplicate key",
       raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'descr': '<f4'}", f4x2),
       "more than once"},
      {"unknown key",
       raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", f4x2),
       "unknown key"},
      {"negative dim", raw_npy(hdr("'<f4'", "False", "(-2,)"), f4x2), "negative"},
      {"absurd dim", raw_npy(hdr("'<f4'", "False", "(99999999999999999999,)"), f4x2), "absurd"},
      {"2^62 dim", raw_npy(hdr("'<f4'", "False", "(4611686018427387904,)"), f4x2), "absurd"},
      {"rank 9", raw_npy(hdr("'<f4'", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 2)"), f4x2),
       "more than 8"},
      {"size overflow", raw_npy(hdr("'<f4'", "False", "(2147483648, 2147483648, 4)"), f4x2),
       "too large"},
      {"size overflow hidden by zero",
       raw_npy(hdr("'<i8'", "False", "(0, 4611686018427387903, 4611686018427387903)"), ""),
       "too large"},
      {"truncated data", raw_npy(good, f4x2.substr(0, 7)), "truncated"},
      {"no data", raw_npy(good), "truncated"},
      {"trailing data", raw_npy(good, f4x2 + "x"), "trailing"},
      {"non-ASCII header", raw_npy(non_ascii, f4x2), "0xe9"},
      {"NUL in header", raw_npy(nul, f4x2), "0x00"},
      {"float64", raw_npy(hdr("'<f8'", "False", "(2,)"), f4x2 + f4x2), "'<f8'"},
      {"complex64", raw_npy(hdr("'<c8'", "False", "(1,)"), f4x2), "'<c8'"},
      {"object", raw_npy(hdr("'|O'", "False", "(2,)"), f4x2), "'|O'"},
      {"ambiguous order", raw_npy(hdr("'|f4'", "False", "(2,)"), f4x2), "'|f4'"},
      {"uint8", raw_npy(hdr("'|u1'", "False", "(8,)"), f4x2), "'|u1'"},
      {"structured", raw_npy(hdr("[('a', '<f4')]", "False", "(2,)"), f4x2), "structured"},
      {"descr not string", raw_npy(hdr("4", "False", "(2,)"), f4x2), "quoted string"},
      {"fortran not bool", raw_npy(hdr("'<f4'", "'no'", "(2,)"), f4x2), "True or False"},
      {"fortran prefix", raw_npy(hdr("'<f4'", "Truex", "(2,)"), f4x2), "True or False"},
      {"shape list", raw_npy(hdr("'<f4'", "False", "[2]"), f4x2), "tuple"},
      {"shape garbage", raw_npy(hdr("'<f4'", "False", "(2 3)"), f4x2), "after a dimension"},
      {"shape float", raw_npy(hdr("'<f4'", "False", "(2.0,)"), f4x2), "after a dimension"},
      {"shape unclosed", raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,", f4x2),
       "end of header"},
      {"unterminated string", raw_npy("{'descr': '<f4", f4x2), "not terminated"},
      {"not a dict", raw_npy("['descr', '<f4']\n", f4x2), "'{'"},
      {"unquoted key", raw_npy("{descr: '<f4'}\n", f4x2), "quoted key"},
      {"missing colon", raw_npy("{'descr' '<f4'}\n", f4x2), "':'"},
      {"missing comma", raw_npy("{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", f4x2),
       "',' or '}'"},
      {"trailing garbage", raw_npy(good + "x", f4x2), "trailing text"},
      {"empty header", raw_npy("", f4x2), "'{'"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    Array a;
    a.shape = {42};
    const Status s = parse_string(c.file, &a, "--q");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.message().rfind("--q: ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("; expected "), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
    EXPECT_EQ(a.shape, std::vector<std::int64_t>{42}) << "output modified on error";
  }
}

TEST(NpyReject, UnsupportedDtypeMessageListsSupported) {
  Array a;
  const Status s =
      parse_string(raw_npy(hdr("'<c8'", "False", "(1,)"), std::string(8, '\0')), &a, "--q");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "--q: unsupported dtype '<c8' (complex64); expected float32 ('<f4'), float16 ('<f2'), "
            "bool ('|b1'), int32 ('<i4'), int64 ('<i8') or int8 ('|i1')");
}

TEST(NpyReject, NullArguments) {
  Array a;
  EXPECT_FALSE(parse(nullptr, 10, "--q", &a).ok());
  const std::string file = serialize(DType::f32, {}, sample_data(DType::f32, 1).data());
  EXPECT_FALSE(parse(file.data(), file.size(), "--q", nullptr).ok());
}

// ---------------------------------------------------------------------------------------------
// Files.

class NpyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = std::filesystem::temp_directory_path() /
           ("attn_npy_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::filesystem::path dir_;
};

TEST_F(NpyFile, WriteThenRead) {
  const std::string path = (dir_ / "x.npy").string();
  const std::vector<std::int32_t> v = {1, -2, 3, -4, 5, -6};
  ASSERT_TRUE(write(path, DType::i32, {3, 2}, v.data()).ok());
  EXPECT_EQ(entries(), std::vector<std::string>{"x.npy"});  // no temporary left behind
  Array a;
  const Status s = read(path, "--q", &a);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(a.dtype, DType::i32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(std::vector<std::int32_t>(a.as<std::int32_t>(), a.as<std::int32_t>() + 6), v);

  // Overwriting replaces the whole file.
  const std::vector<float> f = {0.5f};
  ASSERT_TRUE(write(path, DType::f32, {}, f.data()).ok());
  ASSERT_TRUE(read(path, "--q", &a).ok());
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.as<float>()[0], 0.5f);
  EXPECT_EQ(entries(), std::vector<std::string>{"x.npy"});
}

TEST_F(NpyFile, ReadMissingFile) {
  const std::string path = (dir_ / "missing.npy").string();
  Array a;
  const Status s = read(path, "--k", &a);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("--k: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("; expected "), std::string::npos) << s.message();
}

TEST_F(NpyFile, ReadDirectoryAndCorruptFile) {
  Array a;
  const Status dir_status = read(dir_.string(), "--k", &a);
  ASSERT_FALSE(dir_status.ok());
  EXPECT_EQ(dir_status.message().rfind("--k: ", 0), 0u) << dir_status.message();

  const std::string path = (dir_ / "bad.npy").string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("not numpy at all", f);
  std::fclose(f);
  const Status s = read(path, "--v", &a);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--v: not a .npy file"), std::string::npos) << s.message();
}

TEST_F(NpyFile, FailedWriteLeavesNothingBehind) {
  const std::vector<float> f(4, 1.0f);
  // Directory does not exist.
  const std::string missing = (dir_ / "no_such_dir" / "x.npy").string();
  Status s = write(missing, DType::f32, {4}, f.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind(missing + ": ", 0), 0u) << s.message();
  // Destination is a directory: the rename fails and the temporary must be removed.
  std::filesystem::create_directory(dir_ / "sub");
  s = write((dir_ / "sub").string(), DType::f32, {4}, f.data());
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "sub"));
  EXPECT_EQ(entries(), std::vector<std::string>{"sub"});
}

TEST_F(NpyFile, WriteRejectsInvalidArguments) {
  const std::string path = (dir_ / "x.npy").string();
  const std::vector<unsigned char> d(16);
  EXPECT_NE(write(path, DType::bf16, {2}, d.data()).message().find("bf16"), std::string::npos);
  EXPECT_NE(write(path, DType::f32, {2, -1}, d.data()).message().find("invalid dimension"),
            std::string::npos);
  EXPECT_NE(write(path, DType::f32, {2}, nullptr).message().find("null"), std::string::npos);
  EXPECT_FALSE(write(path, DType::f32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, d.data()).ok());
  EXPECT_TRUE(entries().empty());
}

TEST_F(NpyFile, ReadRefusesSpecialFiles) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);  // no writer: opening it for reading would block
  const struct {
    std::string path, message;
  } cases[] = {
      {"/dev/zero", "--q: '/dev/zero' is a character device; expected a regular .npy file"},
      {"/dev/null", "--q: '/dev/null' is a character device; expected a regular .npy file"},
      {fifo, "--q: '" + fifo + "' is a FIFO; expected a regular .npy file"},
      {dir_.string(), "--q: '" + dir_.string() + "' is a directory; expected a regular .npy file"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path);
    Array a;
    a.shape = {42};
    const Status s = read(c.path, "--q", &a);
    EXPECT_EQ(s.message(), c.message);
    EXPECT_EQ(a.shape, std::vector<std::int64_t>{42});
  }
}

TEST_F(NpyFile, ReadFollowsSymbolicLinksToRegularFiles) {
  const std::vector<float> v = {1.5f, -2.0f};
  const std::string path = (dir_ / "x.npy").string(), link = (dir_ / "link.npy").string();
  ASSERT_TRUE(write(path, DType::f32, {2}, v.data()).ok());
  std::filesystem::create_symlink(path, link);
  Array a;
  ASSERT_TRUE(read(link, "--q", &a).ok());
  EXPECT_EQ(std::vector<float>(a.as<float>(), a.as<float>() + 2), v);
}

// read() must say exactly what parse() says about the same bytes: truncations at every length of a few
// files (each byte of the preamble, the header and the data), a header declaring far more data than the
// file holds, and trailing bytes.
TEST_F(NpyFile, ReadAgreesWithParse) {
  const std::string path = (dir_ / "x.npy").string();
  std::vector<std::string> files = {
      serialize(DType::f32, {2, 3}, sample_data(DType::f32, 6).data()),
      serialize(DType::boolean, {}, sample_data(DType::boolean, 1).data()),
      raw_npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 2), }\n", std::string(48, 'Z'), 2),
      raw_npy("{'descr':'<i8','fortran_order':False,'shape':(3,)}", std::string(24, 'a'), 3),
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }\n", "abcd"),
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n", "abcdefgh"),
      raw_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }\n", "a"),
  };
  int compared = 0;
  for (const std::string& full : files) {
    for (std::size_t n = 1; n <= full.size(); ++n) {
      const std::string file = full.substr(0, n);
      SCOPED_TRACE(std::to_string(n) + " bytes of a " + std::to_string(full.size()) + "-byte file");
      std::FILE* f = std::fopen(path.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(std::fwrite(file.data(), 1, file.size(), f), file.size());
      std::fclose(f);
      Array from_file, from_memory;
      const Status r = read(path, "--q", &from_file), p = parse_string(file, &from_memory);
      ASSERT_EQ(r.ok(), p.ok()) << r.message() << " | " << p.message();
      EXPECT_EQ(r.message(), p.message());
      EXPECT_EQ(from_file.shape, from_memory.shape);
      EXPECT_EQ(from_file.data, from_memory.data);
      ++compared;
    }
  }
  EXPECT_GT(compared, 700);
}

TEST_F(NpyFile, ReadAndParseCheckTheAcceptedDtypes) {
  const std::string path = (dir_ / "x.npy").string();
  const std::vector<float> v = {1, 2};
  ASSERT_TRUE(write(path, DType::f32, {2}, v.data()).ok());
  Array a;
  EXPECT_TRUE(read(path, "--q", &a, {DType::f32, DType::f16}).ok());
  EXPECT_EQ(read(path, "--kv-lens", &a, {DType::i32, DType::i64}).message(),
            "--kv-lens: dtype float32 ('<f4'); expected int32 ('<i4') or int64 ('<i8')");
  const std::string i2 = raw_npy(hdr("'<i2'", "False", "(2,)"), "abcd");
  EXPECT_EQ(parse(i2.data(), i2.size(), "--kv-lens", &a, {DType::i32, DType::i64}).message(),
            "--kv-lens: unsupported dtype '<i2' (int16); expected int32 ('<i4') or int64 ('<i8')");
  const std::string rec = raw_npy(hdr("[('a', '<f4')]", "False", "(2,)"), "abcdefgh");
  EXPECT_EQ(parse(rec.data(), rec.size(), "--mask", &a, {DType::f32, DType::boolean}).message(),
            "--mask: structured/record dtypes are not supported; expected float32 ('<f4') or bool ('|b1')");
}

TEST_F(NpyFile, WriteNeverReplacesSpecialFiles) {
  const std::vector<float> v = {1};
  const std::string fifo = (dir_ / "fifo").string(), link = (dir_ / "link.npy").string(),
                    target = (dir_ / "target.npy").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_TRUE(write(target, DType::f32, {1}, v.data()).ok());
  std::filesystem::create_symlink(target, link);
  EXPECT_EQ(write(fifo, DType::f32, {1}, v.data()).message(),
            fifo + ": '" + fifo + "' is a FIFO; expected a new or regular file");
  EXPECT_EQ(write(link, DType::f32, {1}, v.data()).message(),
            link + ": '" + link + "' is a symbolic link; expected a new or regular file");
  EXPECT_EQ(write("/dev/null", DType::f32, {1}, v.data()).message(),
            "/dev/null: '/dev/null' is a character device; expected a new or regular file");
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(entries(), (std::vector<std::string>{"fifo", "link.npy", "target.npy"}));
}

// tools::FileWriter: nothing moves unless every file was staged, and a destination that turned into a
// directory between the checks and the commit is refused.
TEST_F(NpyFile, FileWriterIsAllOrNothing) {
  const std::string a = (dir_ / "a.npy").string(), b = (dir_ / "b.npy").string();
  {
    tools::FileWriter writer;
    ASSERT_TRUE(writer.stage("--out", a, "new a").ok());
    const Status s = writer.stage("--lse", (dir_ / "missing" / "b.npy").string(), "new b");
    EXPECT_EQ(s.message().rfind("--lse: cannot create ", 0), 0u) << s.message();
  }  // destroyed without commit
  EXPECT_TRUE(entries().empty());

  ASSERT_TRUE(tools::write_file("--out", a, "old a").ok());
  tools::FileWriter writer;
  ASSERT_TRUE(writer.stage("--out", a, "new a").ok());
  ASSERT_TRUE(writer.stage("--lse", b, "new b").ok());
  std::filesystem::create_directory(b);
  EXPECT_EQ(writer.commit().message(), "--lse: '" + b + "' is a directory; expected a new or regular file");
  EXPECT_EQ(entries(), (std::vector<std::string>{"a.npy", "b.npy"}));  // temporaries removed
  std::FILE* f = std::fopen(a.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  char buf[16] = {};
  EXPECT_EQ(std::fread(buf, 1, sizeof buf, f), 5u);
  std::fclose(f);
  EXPECT_EQ(std::string(buf), "old a");
}

// ---------------------------------------------------------------------------------------------
// Fuzz: mutated valid files must never crash; any accepted file must be self-consistent.

void check_parse_survives(const std::string& file, int* accepted) {
  Array a;
  const Status s = parse(file.data(), file.size(), "--fuzz", &a);
  if (s.ok()) {
    ++*accepted;
    ASSERT_LE(a.shape.size(), static_cast<std::size_t>(kMaxRank));
    for (std::int64_t d : a.shape) ASSERT_GE(d, 0);
    ASSERT_EQ(static_cast<std::uint64_t>(a.numel()) * dtype_size(a.dtype), a.data.size());
    ASSERT_LE(a.data.size(), file.size());
  } else {
    ASSERT_EQ(s.message().rfind("--fuzz: ", 0), 0u) << s.message();
  }
}

TEST(NpyFuzz, MutatedFilesNeverCrash) {
  std::vector<std::string> seeds = {
      serialize(DType::f32, {2, 3}, sample_data(DType::f32, 6).data()),
      serialize(DType::boolean, {5}, sample_data(DType::boolean, 5).data()),
      serialize(DType::i64, {}, sample_data(DType::i64, 1).data()),
      serialize(DType::f16, {2, 1, 3, 2}, sample_data(DType::f16, 12).data()),
      serialize(DType::i32, {0, 3}, nullptr),
      raw_npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 2), }\n",
              std::string(48, '\x5a'), 2),
      raw_npy("{\"shape\": (3,), \"fortran_order\": False, \"descr\": \">f2\"}", "abcdef", 3),
  };
  int accepted = 0;

  // Truncation at every length.
  for (const std::string& seed : seeds) {
    for (std::size_t n = 0; n <= seed.size(); ++n)
      check_parse_survives(seed.substr(0, n), &accepted);
  }

  std::mt19937 rng(12345);
  auto below = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  auto byte = [&] { return static_cast<char>(below(256)); };
  // Header-ish fragments, so random headers often get deep into the parser.
  const char* tokens[] = {"{",
                          "}",
                          "(",
                          ")",
                          "[",
                          "]",
                          ":",
                          ",",
                          " ",
                          "\n",
                          "'",
                          "\"",
                          "-",
                          "L",
                          "0",
                          "1",
                          "7",
                          "99999999999999999999",
                          "4611686018427387903",
                          "True",
                          "False",
                          "'descr'",
                          "'shape'",
                          "'fortran_order'",
                          "'<f4'",
                          "'>i8'",
                          "'|b1'",
                          "'<c8'",
                          "(2, 3)",
                          "(0,)",
                          "()",
                          "\x93",
                          "\\"};
  int mutated = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string f = seeds[below(seeds.size())];
    const int rounds = 1 + static_cast<int>(below(3));
    for (int r = 0; r < rounds; ++r) {
      switch (below(8)) {
        case 0:  // flip bits in a few bytes
          for (std::size_t k = 1 + below(4); k-- > 0 && !f.empty();) {
            f[below(f.size())] ^= static_cast<char>(1u << below(8));
          }
          break;
        case 1:  // overwrite a byte
          if (!f.empty()) f[below(f.size())] = byte();
          break;
        case 2:  // insert random bytes
          f.insert(below(f.size() + 1), std::string(1 + below(8), byte()));
          break;
        case 3:  // delete a range
          if (!f.empty()) {
            const std::size_t at = below(f.size());
            f.erase(at, 1 + below(f.size() - at));
          }
          break;
        case 4:  // corrupt the header-length field (and sometimes the version)
          if (f.size() >= 12) {
            f[8 + below(4)] = byte();
            if (below(4) == 0) f[6] = static_cast<char>(below(5));
          }
          break;
        case 5: {  // replace the header with random tokens, keeping the length field consistent
          std::string h;
          for (std::size_t k = below(40); k-- > 0;) h += tokens[below(std::size(tokens))];
          const int major = 1 + static_cast<int>(below(3));
          const std::size_t data_len = below(64);
          f = raw_npy(h, std::string(data_len, 'x'), major);
          break;
        }
        case 6: {  // splice a token into the existing header
          if (f.size() > 12) {
            const std::size_t at = 10 + below(f.size() - 10);
            f.insert(at, tokens[below(std::size(tokens))]);
          }
          break;
        }
        case 7:  // append or drop data bytes
          if (below(2) && !f.empty())
            f.pop_back();
          else
            f.push_back(byte());
          break;
      }
    }
    check_parse_survives(f, &accepted);
    if (::testing::Test::HasFatalFailure()) return;
    ++mutated;
  }
  EXPECT_EQ(mutated, 20000);
  EXPECT_GT(accepted, 0);  // the seeds themselves (full-length truncations) are accepted
}

}  // namespace
}  // namespace attn::npy
