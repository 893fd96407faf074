// Tests for the `attn` command line: attn::tools::main runs in-process on files in a fresh temporary
// directory per test; results are checked against attn::attention with the reference backend.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "cli_support.h"
#include "commands.h"
#include "core/convert.h"
#include "npy.h"

namespace attn {
namespace {

namespace fs = std::filesystem;

using test::Outcome;

struct Dims {
  std::int64_t B = 2, Hq = 4, Hkv = 2, Sq = 5, Skv = 7, Dk = 8, Dv = 6;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = u(rng);
  return x;
}

std::vector<std::string> with_args(std::vector<std::string> args, const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

class CliTest : public test::ScratchDirTest {
 protected:
  static Outcome cli(std::vector<std::string> args) { return test::cli(std::move(args)); }

  template <class T>
  void save(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape, const std::vector<T>& data) {
    ASSERT_TRUE(npy::write(path(name), dtype, shape, data.data()).ok()) << name;
  }

  // Writes random q.npy, k.npy, v.npy (float32) of the given dimensions.
  void write_qkv(const Dims& d) {
    dims_ = d;
    q_ = random_floats(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dk), 1);
    k_ = random_floats(static_cast<std::size_t>(d.B * d.Hkv * d.Skv * d.Dk), 2);
    v_ = random_floats(static_cast<std::size_t>(d.B * d.Hkv * d.Skv * d.Dv), 3);
    save("q.npy", DType::f32, {d.B, d.Hq, d.Sq, d.Dk}, q_);
    save("k.npy", DType::f32, {d.B, d.Hkv, d.Skv, d.Dk}, k_);
    save("v.npy", DType::f32, {d.B, d.Hkv, d.Skv, d.Dv}, v_);
  }

  // "run --q q.npy --k k.npy --v v.npy --out o.npy" followed by `extra`.
  std::vector<std::string> run_args(const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {"run", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy"),
                                     "--out", path("o.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // What attn::attention with the reference backend gives for q_, k_, v_ and `params`.
  void expected(Params params, std::vector<float>* o, std::vector<float>* lse) const {
    const Dims& d = dims_;
    o->assign(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dv), 0.0f);
    lse->assign(static_cast<std::size_t>(d.B * d.Hq * d.Sq), 0.0f);
    params.backend = Backend::reference;
    const Status s = attention(TensorView::contiguous(q_.data(), DType::f32, {d.B, d.Hq, d.Sq, d.Dk}),
                               TensorView::contiguous(k_.data(), DType::f32, {d.B, d.Hkv, d.Skv, d.Dk}),
                               TensorView::contiguous(v_.data(), DType::f32, {d.B, d.Hkv, d.Skv, d.Dv}),
                               TensorView::contiguous(o->data(), DType::f32, {d.B, d.Hq, d.Sq, d.Dv}), params,
                               TensorView::contiguous(lse->data(), DType::f32, {d.B, d.Hq, d.Sq}));
    ASSERT_TRUE(s.ok()) << s.message();
  }

  static void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                           const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::isinf(want[i])) {
        EXPECT_EQ(got[i], want[i]) << what << "[" << i << "]";
        continue;
      }
      EXPECT_NEAR(got[i], want[i], rel * std::max(1.0f, std::fabs(want[i]))) << what << "[" << i << "]";
    }
  }

  std::vector<float> read_f32(const std::string& name, const std::vector<std::int64_t>& shape) const {
    npy::Array a;
    const Status s = npy::read(path(name), name, &a);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(a.dtype, DType::f32) << name;
    EXPECT_EQ(a.shape, shape) << name;
    if (!s.ok() || a.dtype != DType::f32) return {};
    return std::vector<float>(a.as<float>(), a.as<float>() + a.numel());
  }

  // Runs the CLI with `extra` options (and --lse) and compares O and LSE with the reference for `params`.
  void expect_matches(const std::vector<std::string>& extra, const Params& params) {
    std::vector<std::string> args = extra;
    args.insert(args.end(), {"--lse", path("lse.npy")});
    const Outcome r = cli(run_args(args));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    std::vector<float> o, lse;
    expected(params, &o, &lse);
    const Dims& d = dims_;
    expect_close(read_f32("o.npy", {d.B, d.Hq, d.Sq, d.Dv}), o, 1e-5, "O");
    expect_close(read_f32("lse.npy", {d.B, d.Hq, d.Sq}), lse, 1e-5, "LSE");
  }

  // The CLI must fail with exit status 2, one error line naming `needle`, and no output files.
  void expect_error(const std::vector<std::string>& args, const std::string& needle) {
    const Outcome r = cli(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.err.rfind("attn: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
    EXPECT_FALSE(fs::exists(path("o.npy"))) << r.err;
    EXPECT_FALSE(fs::exists(path("lse.npy"))) << r.err;
  }

  Dims dims_;
  std::vector<float> q_, k_, v_;
};

// ---- attn run: results ---------------------------------------------------------------------------------

TEST_F(CliTest, CliRunMatchesReferenceOnRandomInputs) {
  write_qkv({});
  expect_matches({}, Params{});
}

TEST_F(CliTest, CliRunWithoutLseWritesOnlyOut) {
  write_qkv({});
  const Outcome r = cli(run_args({}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("o.npy")));
  EXPECT_FALSE(fs::exists(path("lse.npy")));
  EXPECT_NE(r.out.find("o.npy"), std::string::npos);
}

TEST_F(CliTest, CliRunCausalTopLeft) {
  write_qkv({});
  Params p;
  p.causal = Causal::top_left;
  expect_matches({"--causal", "top-left"}, p);
}

TEST_F(CliTest, CliRunCausalBottomRight) {
  write_qkv({});
  Params p;
  p.causal = Causal::bottom_right;
  expect_matches({"--causal", "bottom-right"}, p);
  // With Sq != Skv the two alignments differ.
  std::vector<float> top, bottom, lse;
  p.causal = Causal::top_left;
  expected(p, &top, &lse);
  p.causal = Causal::bottom_right;
  expected(p, &bottom, &lse);
  EXPECT_NE(top, bottom);
}

TEST_F(CliTest, CliRunScale) {
  write_qkv({});
  Params p;
  p.scale = 0.3;
  expect_matches({"--scale", "0.3"}, p);
}

TEST_F(CliTest, CliRunMaskFloat32BroadcastRank2) {
  const Dims d;
  write_qkv(d);
  auto mask = random_floats(static_cast<std::size_t>(d.Sq * d.Skv), 7);
  mask[3] = -std::numeric_limits<float>::infinity();
  save("mask.npy", DType::f32, {d.Sq, d.Skv}, mask);
  Params p;
  p.mask = TensorView::contiguous(mask.data(), DType::f32, {d.Sq, d.Skv});
  expect_matches({"--mask", path("mask.npy")}, p);
}

TEST_F(CliTest, CliRunMaskBoolBroadcastRank2) {
  const Dims d;
  write_qkv(d);
  std::vector<unsigned char> keep(static_cast<std::size_t>(d.Sq * d.Skv));
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = (i % 3) != 1;
  for (std::int64_t j = 0; j < d.Skv; ++j) keep[static_cast<std::size_t>(2 * d.Skv + j)] = 0;  // row 2: none kept
  save("mask.npy", DType::boolean, {d.Sq, d.Skv}, keep);
  Params p;
  p.mask = TensorView::contiguous(keep.data(), DType::boolean, {d.Sq, d.Skv});
  expect_matches({"--mask", path("mask.npy")}, p);
  const auto lse = read_f32("lse.npy", {d.B, d.Hq, d.Sq});
  ASSERT_FALSE(lse.empty());
  EXPECT_EQ(lse[2], -std::numeric_limits<float>::infinity());  // a fully blocked row
}

TEST_F(CliTest, CliRunKvLensInt32) {
  write_qkv({});
  const std::vector<std::int32_t> lens = {3, 7};
  save("lens.npy", DType::i32, {2}, lens);
  Params p;
  p.kv_lens = TensorView::contiguous(lens.data(), DType::i32, {2});
  expect_matches({"--kv-lens", path("lens.npy")}, p);
}

TEST_F(CliTest, CliRunKvLensInt64) {
  write_qkv({});
  const std::vector<std::int64_t> lens = {0, 5};
  save("lens.npy", DType::i64, {2}, lens);
  Params p;
  p.kv_lens = TensorView::contiguous(lens.data(), DType::i64, {2});
  expect_matches({"--kv-lens", path("lens.npy")}, p);
}

TEST_F(CliTest, CliRunWindowBottomRightDefault) {
  write_qkv({});
  Params p;
  p.window = Window{2, 1, Align::bottom_right};
  expect_matches({"--window", "2,1"}, p);
}

TEST_F(CliTest, CliRunWindowTopLeftUnboundedLeft) {
  write_qkv({});
  Params p;
  p.window = Window{-1, 0, Align::top_left};
  expect_matches({"--window=-1,0", "--window-align", "top-left"}, p);
}

TEST_F(CliTest, CliRunBackendReference) {
  write_qkv({});
  Params p;
  p.causal = Causal::top_left;
  expect_matches({"--backend", "reference", "--causal", "top-left"}, p);
}

TEST_F(CliTest, CliRunBackendFlashWithThreads) {
  write_qkv({});
  expect_matches({"--backend", "flash", "--threads", "1"}, Params{});
}

TEST_F(CliTest, CliRunFloat16WritesFloat16) {
  const Dims d;
  std::vector<core::f16> q, k, v;
  for (float x : random_floats(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dk), 1)) q.push_back(core::from_float<core::f16>(x));
  for (float x : random_floats(static_cast<std::size_t>(d.B * d.Hkv * d.Skv * d.Dk), 2)) k.push_back(core::from_float<core::f16>(x));
  for (float x : random_floats(static_cast<std::size_t>(d.B * d.Hkv * d.Skv * d.Dv), 3)) v.push_back(core::from_float<core::f16>(x));
  save("q.npy", DType::f16, {d.B, d.Hq, d.Sq, d.Dk}, q);
  save("k.npy", DType::f16, {d.B, d.Hkv, d.Skv, d.Dk}, k);
  save("v.npy", DType::f16, {d.B, d.Hkv, d.Skv, d.Dv}, v);
  const Outcome r = cli(run_args({}));
  ASSERT_EQ(r.code, 0) << r.err;
  npy::Array o;
  ASSERT_TRUE(npy::read(path("o.npy"), "o", &o).ok());
  EXPECT_EQ(o.dtype, DType::f16);
  EXPECT_EQ(o.shape, (std::vector<std::int64_t>{d.B, d.Hq, d.Sq, d.Dv}));

  std::vector<core::f16> want(static_cast<std::size_t>(o.numel()));
  Params p;
  p.backend = Backend::reference;
  ASSERT_TRUE(attention(TensorView::contiguous(q.data(), DType::f16, {d.B, d.Hq, d.Sq, d.Dk}),
                        TensorView::contiguous(k.data(), DType::f16, {d.B, d.Hkv, d.Skv, d.Dk}),
                        TensorView::contiguous(v.data(), DType::f16, {d.B, d.Hkv, d.Skv, d.Dv}),
                        TensorView::contiguous(want.data(), DType::f16, {d.B, d.Hq, d.Sq, d.Dv}), p)
                  .ok());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(core::to_float(o.as<core::f16>()[i]), core::to_float(want[i]), 2e-3) << i;
}

// ---- attn run: bad input -------------------------------------------------------------------------------

TEST_F(CliTest, CliErrorUnknownOption) {
  write_qkv({});
  expect_error(run_args({"--bogus"}), "--bogus");
}

TEST_F(CliTest, CliErrorMissingQ) {
  write_qkv({});
  expect_error({"run", "--k", path("k.npy"), "--v", path("v.npy"), "--out", path("o.npy")}, "--q");
}

TEST_F(CliTest, CliErrorNonexistentFile) {
  write_qkv({});
  expect_error({"run", "--q", path("q.npy"), "--k", path("nope.npy"), "--v", path("v.npy"), "--out", path("o.npy")},
               "--k");
}

TEST_F(CliTest, CliErrorMalformedNpy) {
  write_qkv({});
  std::ofstream(path("v.npy"), std::ios::binary | std::ios::trunc) << "this is not a numpy file at all\x01\x02";
  expect_error(run_args({}), "--v");
}

TEST_F(CliTest, CliErrorWrongRank) {
  write_qkv({});
  save("q.npy", DType::f32, {4, 5, 8}, random_floats(160, 9));
  expect_error(run_args({}), "--q");
  expect_error(run_args({}), "rank 4");
}

TEST_F(CliTest, CliErrorWrongDtype) {
  write_qkv({});
  save("q.npy", DType::i32, {2, 4, 5, 8}, std::vector<std::int32_t>(320, 1));
  expect_error(run_args({}), "--q");
}

TEST_F(CliTest, CliErrorMixedFloat16AndFloat32) {
  const Dims d;
  write_qkv(d);
  save("k.npy", DType::f16, {d.B, d.Hkv, d.Skv, d.Dk},
       std::vector<core::f16>(static_cast<std::size_t>(d.B * d.Hkv * d.Skv * d.Dk), core::from_float<core::f16>(0.5f)));
  expect_error(run_args({}), "--k");
}

TEST_F(CliTest, CliErrorDkMismatch) {
  write_qkv({});
  save("k.npy", DType::f32, {2, 2, 7, 3}, random_floats(84, 4));
  expect_error(run_args({}), "--k");
}

TEST_F(CliTest, CliErrorHeadsNotDivisible) {
  Dims d;
  d.Hkv = 3;
  write_qkv(d);
  expect_error(run_args({}), "--k");
}

TEST_F(CliTest, CliErrorBadCausal) {
  write_qkv({});
  expect_error(run_args({"--causal", "diagonal"}), "--causal");
}

TEST_F(CliTest, CliErrorBadWindow) {
  write_qkv({});
  for (const char* w : {"3", "a,b", "1,2,3", "-2,0", "1,", ",1", "1,-5", ""}) {
    SCOPED_TRACE(w);
    expect_error(run_args({std::string("--window=") + w}), "--window");
  }
}

TEST_F(CliTest, CliErrorBadWindowAlign) {
  write_qkv({});
  expect_error(run_args({"--window", "1,1", "--window-align", "middle"}), "--window-align");
}

TEST_F(CliTest, CliErrorNegativeScale) {
  write_qkv({});
  expect_error(run_args({"--scale", "-1"}), "--scale");
  expect_error(run_args({"--scale", "0"}), "--scale");
  expect_error(run_args({"--scale", "abc"}), "--scale");
}

TEST_F(CliTest, CliErrorKvLensOutOfRange) {
  write_qkv({});
  save("lens.npy", DType::i32, {2}, std::vector<std::int32_t>{3, 8});  // Skv = 7
  expect_error(run_args({"--kv-lens", path("lens.npy")}), "--kv-lens");
  save("lens.npy", DType::i64, {3}, std::vector<std::int64_t>{1, 2, 3});  // B = 2
  expect_error(run_args({"--kv-lens", path("lens.npy")}), "--kv-lens");
  save("lens.npy", DType::f32, {2}, std::vector<float>{1, 2});
  expect_error(run_args({"--kv-lens", path("lens.npy")}), "--kv-lens");
}

TEST_F(CliTest, CliErrorMaskDoesNotBroadcast) {
  write_qkv({});
  save("mask.npy", DType::f32, {5, 6}, std::vector<float>(30, 0.0f));  // Skv = 7
  expect_error(run_args({"--mask", path("mask.npy")}), "--mask");
  save("mask.npy", DType::i32, {5, 7}, std::vector<std::int32_t>(35, 1));
  expect_error(run_args({"--mask", path("mask.npy")}), "--mask");
}

TEST_F(CliTest, CliErrorBadBackendAndThreads) {
  write_qkv({});
  expect_error(run_args({"--backend", "gpu"}), "--backend");
  expect_error(run_args({"--threads", "-3"}), "--threads");
  expect_error(run_args({"--threads", "x"}), "--threads");
}

TEST_F(CliTest, CliErrorLseSameAsOut) {
  write_qkv({});
  expect_error(run_args({"--lse", path("o.npy")}), "--lse");
}

// ---- attn run: which files it writes and reads ----------------------------------------------------------
//
// Every refusal: exit status 2, one error line starting with the option, and the scratch directory exactly
// as before (no file created, changed or removed: names, kinds, sizes, contents).

// What a directory holds: per entry its kind and, for a regular file, its contents.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> entries;
  for (const auto& e : fs::directory_iterator(dir)) {
    struct stat st;
    EXPECT_EQ(::lstat(e.path().c_str(), &st), 0) << e.path();
    std::string state = std::to_string(st.st_mode) + ":" + std::to_string(st.st_ino) + ":";
    if (S_ISREG(st.st_mode)) {
      std::ifstream f(e.path(), std::ios::binary);
      state += std::string(std::istreambuf_iterator<char>(f), {});
    }
    entries[e.path().filename().string()] = state;
  }
  return entries;
}

class CliFilesTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    write_qkv({});
  }

  // Runs `args`; expects the refusal described above, its message starting with "<option>: " and
  // containing `needle`.
  void expect_refused(const std::vector<std::string>& args, const std::string& option, const std::string& needle) {
    const auto before = snapshot(dir_);
    const Outcome r = cli(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(r.err.rfind("attn: error: " + option + ": ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(snapshot(dir_) == before) << "the directory changed: " << r.err;
  }

  // run with q, k, v and a backward pass's grad-out; `extra` added.
  std::vector<std::string> backward_args(const std::vector<std::string>& extra) {
    const Dims& d = dims_;
    save("do.npy", DType::f32, {d.B, d.Hq, d.Sq, d.Dv}, random_floats(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dv), 6));
    std::vector<std::string> args = {"run", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy"),
                                     "--grad-out", path("do.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST_F(CliFilesTest, CliOutputFifoIsRefused) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  std::vector<std::string> args = run_args({});
  args[8] = path("fifo");  // --out
  expect_refused(args, "--out", "'" + path("fifo") + "' is a FIFO; expected a new or regular file");
  expect_refused(run_args({"--lse", path("fifo")}), "--lse", "is a FIFO");
  struct stat st;
  ASSERT_EQ(::lstat(path("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(CliFilesTest, CliOutputDeviceIsRefused) {
  struct stat before, after;
  ASSERT_EQ(::lstat("/dev/null", &before), 0);
  std::vector<std::string> args = run_args({});
  args[8] = "/dev/null";
  expect_refused(args, "--out", "'/dev/null' is a character device; expected a new or regular file");
  expect_refused(run_args({"--lse", "/dev/null"}), "--lse", "is a character device");
  expect_refused(backward_args({"--out", path("o.npy"), "--dq", path("dq.npy"), "--dk", "/dev/zero", "--dv", path("dv.npy")}),
                 "--dk", "'/dev/zero' is a character device");
  ASSERT_EQ(::lstat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_rdev, after.st_rdev);
}

TEST_F(CliFilesTest, CliOutputDirectoryIsRefused) {
  fs::create_directory(path("sub"));
  std::vector<std::string> args = run_args({});
  args[8] = path("sub");
  expect_refused(args, "--out", "'" + path("sub") + "' is a directory; expected a new or regular file");
  expect_refused(backward_args({"--out", path("o.npy"), "--dq", path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("sub")}),
                 "--dv", "is a directory");
  EXPECT_TRUE(fs::is_directory(path("sub")));
}

TEST_F(CliFilesTest, CliOutputSymbolicLinkIsRefused) {
  save("target.npy", DType::f32, {1}, std::vector<float>{42});
  fs::create_symlink(path("target.npy"), path("link.npy"));
  fs::create_symlink(path("nowhere.npy"), path("dangling.npy"));
  std::vector<std::string> args = run_args({});
  args[8] = path("link.npy");
  expect_refused(args, "--out", "'" + path("link.npy") + "' is a symbolic link; expected a new or regular file");
  expect_refused(run_args({"--lse", path("dangling.npy")}), "--lse", "is a symbolic link");
  EXPECT_FALSE(fs::exists(path("nowhere.npy")));
}

TEST_F(CliFilesTest, CliOutputSameAsInputIsRefused) {
  std::vector<std::string> args = run_args({});
  args[8] = path("q.npy");
  expect_refused(args, "--out",
                 "'" + path("q.npy") + "' is the same file as --q; expected an output path that is not an input");
  // The same file under another spelling of its path.
  fs::create_directory(path("sub"));
  args[8] = path("sub/../k.npy");
  expect_refused(args, "--out", "is the same file as --k");
  args[8] = path("./v.npy");
  expect_refused(args, "--out", "is the same file as --v");
  // Every output option against every input option.
  save("mask.npy", DType::f32, {5, 7}, std::vector<float>(35, 0.0f));
  save("lens.npy", DType::i32, {2}, std::vector<std::int32_t>{3, 7});
  for (const char* input : {"mask.npy", "lens.npy"}) {
    SCOPED_TRACE(input);
    expect_refused(run_args({"--mask", path("mask.npy"), "--kv-lens", path("lens.npy"), "--lse", path(input)}), "--lse",
                   std::string("is the same file as ") + (input[0] == 'm' ? "--mask" : "--kv-lens"));
  }
  expect_refused(backward_args({"--out", path("o.npy"), "--dq", path("do.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy")}),
                 "--dq", "is the same file as --grad-out");
  expect_refused(backward_args({"--out", path("o.npy"), "--dq", path("dq.npy"), "--dk", path("k.npy"), "--dv", path("dv.npy")}),
                 "--dk", "is the same file as --k");
}

TEST_F(CliFilesTest, CliOutputHardLinkOrSymlinkedInputIsRefused) {
  // o.npy is another name of q.npy's inode.
  ASSERT_EQ(::link(path("q.npy").c_str(), path("o.npy").c_str()), 0);
  expect_refused(run_args({}), "--out", "'" + path("o.npy") + "' is the same file as --q");
  // An input named through a symbolic link is still that file.
  fs::remove(path("o.npy"));
  fs::create_symlink(path("k.npy"), path("k_link.npy"));
  std::vector<std::string> args = run_args({});
  args[4] = path("k_link.npy");  // --k
  args[8] = path("k.npy");       // --out
  expect_refused(args, "--out", "is the same file as --k");
}

TEST_F(CliFilesTest, CliOutputsMustDiffer) {
  expect_refused(run_args({"--lse", path("o.npy")}), "--lse", "is the same file as --out; expected a different path");
  expect_refused(backward_args({"--out", path("o.npy"), "--dq", path("g.npy"), "--dk", path("dk.npy"), "--dv", path("g.npy")}),
                 "--dv", "is the same file as --dq");
}

TEST_F(CliFilesTest, CliOutputEmptyOrInMissingDirectoryIsRefused) {
  std::vector<std::string> args = run_args({});
  args[8] = "";
  expect_refused(args, "--out", "empty path; expected a file name");
  expect_refused(run_args({"--lse", path("missing_dir/lse.npy")}), "--lse",
                 "directory '" + path("missing_dir") + "' of '" + path("missing_dir/lse.npy") + "' does not exist");
  expect_refused(run_args({"--lse", path("q.npy/lse.npy")}), "--lse", "not a directory");
}

TEST_F(CliFilesTest, CliOutputRegularFileIsReplacedWhole) {
  std::ofstream(path("o.npy"), std::ios::binary) << std::string(5000, 'x');  // an old, longer file
  const Outcome r = cli(run_args({}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto o = read_f32("o.npy", {dims_.B, dims_.Hq, dims_.Sq, dims_.Dv});
  EXPECT_FALSE(o.empty());
  for (const auto& e : fs::directory_iterator(dir_))  // no temporary left behind
    EXPECT_EQ(e.path().filename().string().find(".attn-tmp"), std::string::npos) << e.path();
}

TEST_F(CliFilesTest, CliInputDeviceIsRefused) {
  std::vector<std::string> args = run_args({});
  args[2] = "/dev/zero";  // --q
  expect_refused(args, "--q", "'/dev/zero' is a character device; expected a regular .npy file");
  args = run_args({"--mask", "/dev/null"});
  expect_refused(args, "--mask", "'/dev/null' is a character device; expected a regular .npy file");
  args = run_args({"--grad-out", "/dev/zero", "--dq", path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy")});
  expect_refused(args, "--grad-out", "'/dev/zero' is a character device");
  args = run_args({"--kv-lens", "/dev/stdin"});  // a terminal, pipe or /dev/null: never a regular file under ctest
  const Outcome r = cli(args);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("attn: error: --kv-lens: ", 0), 0u) << r.err;
}

TEST_F(CliFilesTest, CliInputFifoDirectoryAndSocketAreRefused) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);  // no writer: opening it for reading would block
  fs::create_directory(path("sub"));
  std::vector<std::string> args = run_args({});
  args[4] = path("fifo");  // --k
  expect_refused(args, "--k", "'" + path("fifo") + "' is a FIFO; expected a regular .npy file");
  args = run_args({});
  args[6] = path("sub");  // --v
  expect_refused(args, "--v", "'" + path("sub") + "' is a directory; expected a regular .npy file");
  expect_refused(run_args({"--kv-lens", path("fifo")}), "--kv-lens", "is a FIFO");
  // A Unix socket, as input and as output.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock = path("sock");
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  expect_refused(run_args({"--mask", sock}), "--mask", "'" + sock + "' is a socket; expected a regular .npy file");
  expect_refused(run_args({"--lse", sock}), "--lse", "'" + sock + "' is a socket; expected a new or regular file");
  ::close(fd);
}

// A .npy file whose header declares more or fewer data bytes than the file holds.
TEST_F(CliFilesTest, CliInputDeclaredSizeMustMatchFileSize) {
  const std::string good = npy::serialize(DType::f32, {dims_.B, dims_.Hq, dims_.Sq, dims_.Dk}, q_.data());
  std::ofstream(path("q.npy"), std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 3);
  expect_refused(run_args({}), "--q", "truncated");
  std::ofstream(path("q.npy"), std::ios::binary | std::ios::trunc) << good << "extra";
  expect_refused(run_args({}), "--q", "trailing bytes");
  // A header declaring 2^40 elements in a small file: refused without allocating them.
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 1024, 1024, 1024), }\n";
  std::string huge = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header + "0123";
  std::ofstream(path("q.npy"), std::ios::binary | std::ios::trunc) << huge;
  expect_refused(run_args({}), "--q", "data section is 4 bytes (truncated); expected exactly 4398046511104 bytes");
  // A header length running past the end of the file.
  huge[8] = '\xff';
  huge[9] = '\x7f';
  std::ofstream(path("q.npy"), std::ios::binary | std::ios::trunc) << huge;
  expect_refused(run_args({}), "--q", "runs past the end of the file");
}

// Each input option's dtype message lists what that option accepts.
TEST_F(CliFilesTest, CliDtypeMessagesListWhatEachOptionAccepts) {
  const Dims& d = dims_;
  // int16 is no dtype attn reads at all; the message still lists what --kv-lens takes.
  std::string header = "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }\n";
  std::ofstream(path("lens.npy"), std::ios::binary)
      << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size()) << '\0' << header << std::string(4, '\1');
  expect_refused(run_args({"--kv-lens", path("lens.npy")}), "--kv-lens",
                 "unsupported dtype '<i2' (int16); expected int32 ('<i4') or int64 ('<i8')");
  save("lens.npy", DType::f32, {2}, std::vector<float>{1, 2});
  expect_refused(run_args({"--kv-lens", path("lens.npy")}), "--kv-lens",
                 "dtype float32 ('<f4'); expected int32 ('<i4') or int64 ('<i8')");
  save("mask.npy", DType::i64, {d.Sq, d.Skv}, std::vector<std::int64_t>(static_cast<std::size_t>(d.Sq * d.Skv), 1));
  expect_refused(run_args({"--mask", path("mask.npy")}), "--mask",
                 "dtype int64 ('<i8'); expected float32 ('<f4') or bool ('|b1')");
  save("mask.npy", DType::f32, {}, std::vector<float>{0});
  expect_refused(run_args({"--mask", path("mask.npy")}), "--mask", "rank 1 to 4");
  save("q.npy", DType::boolean, {d.B, d.Hq, d.Sq, d.Dk}, std::vector<unsigned char>(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dk), 1));
  expect_refused(run_args({}), "--q", "dtype bool ('|b1'); expected float32 ('<f4') or float16 ('<f2')");
  write_qkv(d);
  save("v.npy", DType::i32, {d.B, d.Hkv, d.Skv, d.Dv}, std::vector<std::int32_t>(static_cast<std::size_t>(d.B * d.Hkv * d.Skv * d.Dv), 1));
  expect_refused(run_args({}), "--v", "expected float32 ('<f4') or float16 ('<f2')");
  write_qkv(d);
  header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n";
  std::ofstream(path("do.npy"), std::ios::binary | std::ios::trunc)
      << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size()) << '\0' << header << std::string(8, '\0');
  std::vector<std::string> args = {"run", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy"), "--out",
                                   path("o.npy"), "--grad-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                                   path("dk.npy"), "--dv", path("dv.npy")};
  expect_refused(args, "--grad-out", "unsupported dtype '<f8' (float64); expected float32 ('<f4') or float16 ('<f2')");
}

// The other commands that write files follow the same rules.
TEST_F(CliFilesTest, CliOtherCommandsCheckTheirOutputs) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  fs::create_directory(path("sub"));
  save("hq.npy", DType::f32, {3, 4}, random_floats(12, 1));
  save("hk.npy", DType::f32, {3, 4}, random_floats(12, 2));
  const std::vector<std::string> heat = {"heatmap", "--q", path("hq.npy"), "--k", path("hk.npy")};
  expect_refused(with(heat, {"--png", path("hq.npy")}), "--png", "is the same file as --q");
  expect_refused(with(heat, {"--png", path("fifo")}), "--png", "is a FIFO");
  expect_refused(with(heat, {"--png", ""}), "--png", "empty path");
  expect_refused({"heatmap", "--png", "/dev/null"}, "--png", "is a character device");
  expect_refused({"heatmap", "--q", "/dev/zero", "--k", path("hk.npy"), "--png", path("h.png")}, "--q",
                 "is a character device; expected a regular .npy file");
  std::vector<float> with_nan = random_floats(12, 3);
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();  // (its rows' weights would be NaN: no picture)
  save("hnan.npy", DType::f32, {3, 4}, with_nan);
  expect_refused({"heatmap", "--q", path("hnan.npy"), "--k", path("hk.npy"), "--png", path("h.png")}, "--q",
                 "element 5 is nan; expected finite values");
  // generate and scaling-experiment refuse before their minutes of work.
  expect_refused({"generate", "--png", path("sub")}, "--png", "is a directory");
  expect_refused({"scaling-experiment", "--png", "/dev/null"}, "--png", "is a character device");
  expect_refused({"explain", "--q", path("fifo"), "--k", path("hk.npy"), "--v", path("hk.npy")}, "--q", "is a FIFO");
}

// ---- attn run: the backward pass ------------------------------------------------------------------------

TEST_F(CliTest, CliRunBackwardWritesGradientsMatchingTheLibrary) {
  write_qkv({});
  const Dims& d = dims_;
  const std::vector<float> g = random_floats(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dv), 4);
  save("do.npy", DType::f32, {d.B, d.Hq, d.Sq, d.Dv}, g);
  const Outcome r = cli(run_args({"--causal", "bottom-right", "--grad-out", path("do.npy"), "--dq", path("dq.npy"),
                                  "--dk", path("dk.npy"), "--dv", path("dv.npy")}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("dq.npy"), std::string::npos);
  // The fp64 reference backward through the library.
  Params params;
  params.causal = Causal::bottom_right;
  params.backend = Backend::reference;
  std::vector<float> o, lse;
  expected(params, &o, &lse);
  std::vector<float> dq(q_.size()), dk(k_.size()), dv(v_.size());
  const auto f32 = DType::f32;
  ASSERT_TRUE(attention_backward(TensorView::contiguous(q_.data(), f32, {d.B, d.Hq, d.Sq, d.Dk}),
                                 TensorView::contiguous(k_.data(), f32, {d.B, d.Hkv, d.Skv, d.Dk}),
                                 TensorView::contiguous(v_.data(), f32, {d.B, d.Hkv, d.Skv, d.Dv}),
                                 TensorView::contiguous(o.data(), f32, {d.B, d.Hq, d.Sq, d.Dv}),
                                 TensorView::contiguous(lse.data(), f32, {d.B, d.Hq, d.Sq}),
                                 TensorView::contiguous(g.data(), f32, {d.B, d.Hq, d.Sq, d.Dv}),
                                 TensorView::contiguous(dq.data(), f32, {d.B, d.Hq, d.Sq, d.Dk}),
                                 TensorView::contiguous(dk.data(), f32, {d.B, d.Hkv, d.Skv, d.Dk}),
                                 TensorView::contiguous(dv.data(), f32, {d.B, d.Hkv, d.Skv, d.Dv}), params)
                  .ok());
  expect_close(read_f32("dq.npy", {d.B, d.Hq, d.Sq, d.Dk}), dq, 1e-5, "dQ");
  expect_close(read_f32("dk.npy", {d.B, d.Hkv, d.Skv, d.Dk}), dk, 1e-5, "dK");
  expect_close(read_f32("dv.npy", {d.B, d.Hkv, d.Skv, d.Dv}), dv, 1e-5, "dV");
}

// Score variants and dropout from the command line: the reference backend's result for the same Params.
// attn ring-plan's numbers against the cost model written out here independently (docs/ring.md): block c = S / P
// tokens per host; a step sends one K/V block, c·Hkv·(D + Dv)·2 bytes, over the link (+ latency) while computing
// one block pair, 4·c²·Hq·D FLOPs, halved under causal zigzag; the forward is P steps when the transfer hides,
// the backward 2.5 forwards; transfer hides while 2·c²·Hq·D / R >= c·Hkv·(D + Dv)·2·8 / BW + latency.
TEST_F(CliTest, RingPlanNumbersFollowTheCostModel) {
  const Outcome r = cli({"ring-plan", "--seq", "1000000", "--hosts", "8,64", "--bandwidth", "400"});
  ASSERT_EQ(r.code, 0) << r.err;
  const double S = 1e6, Hq = 32, Hkv = 8, D = 128, R = 1e12, bw = 400e9, lat = 5e-6;
  // "<number><suffix>" with k/M suffixes, or a number followed by a unit word (s, ms, us, GB, MB).
  const auto value = [](const std::string& num, const std::string& unit) {
    double x = std::strtod(num.c_str(), nullptr);
    const char last = num.back();
    if (last == 'k') x *= 1e3;
    if (last == 'M') x *= 1e6;
    const std::map<std::string, double> units = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"GB", 1e9}, {"MB", 1e6}, {"", 1}};
    return x * units.at(unit);
  };
  const auto near = [](double got, double want, double rel) { return std::fabs(got - want) <= rel * std::fabs(want); };
  int rows = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::vector<std::string> w{std::istream_iterator<std::string>(f), std::istream_iterator<std::string>()};
    if (w.size() < 19 || w[0] != "1M" || w[1] == "tokens") continue;  // (not the ring-or-Ulysses lines)
    ++rows;
    const double P = std::stod(w[1]), c = S / P;
    const double compute = 4 * c * c * Hq * D / 2 / R, transfer = c * Hkv * (D + D) * 2 * 8 / bw + lat;
    const double memory = c * (Hq * D * 2 + Hkv * 2 * D * 2 * 3 + Hq * D * 2 + Hq * D * 4 + Hq * 4);
    EXPECT_TRUE(near(value(w[2], ""), c, 0.005)) << line;
    EXPECT_TRUE(near(value(w[3], w[4]), compute, 0.005)) << line;
    EXPECT_TRUE(near(value(w[5], w[6]), transfer, 0.005)) << line;
    EXPECT_TRUE(near(value(w[7], w[8]), P * compute, 0.005)) << line;
    EXPECT_TRUE(near(value(w[9], w[10]), 2.5 * P * compute, 0.005)) << line;
    EXPECT_EQ(w[11], "100.0%") << line;
    EXPECT_TRUE(near(std::stod(w[12]), P, 0.01)) << line;
    EXPECT_TRUE(near(value(w[13], w[14]), memory, 0.01)) << line;
    // Ulysses (attn/ring_plan.h): two all-to-alls of P - 1 pieces each around P times one step's compute (8 KV
    // heads split over 8 hosts); 64 hosts cannot split 32 query heads
    if (P > Hq) {
      EXPECT_EQ(w[15] + " " + w[16], "n/a (heads)") << line;
      continue;
    }
    const double kvh = Hkv / P;
    const double a2a = (P - 1) * (2 * lat + c * (Hq / P * D + kvh * 2 * D + Hq / P * D) * 2 * 8 / bw);
    EXPECT_TRUE(near(value(w[15], w[16]), a2a + P * compute, 0.005)) << line;
    EXPECT_TRUE(near(value(w[17], w[18]), a2a + 2.5 * P * compute, 0.005)) << line;
    EXPECT_EQ(w[19], "ring") << line;  // its transfer is hidden at this size
  }
  EXPECT_EQ(rows, 2) << r.out;
  // c*: the positive root of (2·Hq·D / R)·c² − (Hkv·2D·2·8 / BW)·c − latency = 0, and S / c* hosts
  const double a = 2 * Hq * D / R, b = Hkv * 2 * D * 2 * 8 / bw;
  const double c_star = (b + std::sqrt(b * b + 4 * a * lat)) / (2 * a);
  const std::size_t at = r.out.find("transfer hidden while tokens/host >= ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::istringstream tail(r.out.substr(at + 37));
  std::string first, skip, hosts;
  tail >> first >> skip >> skip >> skip >> hosts;  // "30.2, i.e. up to 33.1k hosts"
  EXPECT_TRUE(near(std::stod(first), c_star, 0.005)) << r.out;
  EXPECT_TRUE(near(value(hosts, ""), S / c_star, 0.005)) << r.out;
}

// Bad ring-plan input: one error line naming the option, nothing on stdout (every pair checked before the table).
TEST_F(CliTest, RingPlanRefusesBadInputBeforePrinting) {
  for (const auto& [args, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--rate", "0"}, "--rate: 0;"},
           {{"--rate", "-5"}, "--rate: -5;"},
           {{"--rate", "nan"}, "--rate: nan;"},
           {{"--rate", "5", "--measure-rate"}, "--rate: given with --measure-rate"},
           {{"--seq", "10", "--hosts", "4,20"}, "--hosts: 20 for 10 tokens"},
           {{"--seq", "99999999999999999"}, "--seq: 99999999999999999; expected at most 2^53"},
           {{"--bandwidth", "0"}, "--bandwidth: "},
           {{"--kv-heads", "3"}, "--kv-heads: 3"}}) {
    std::vector<std::string> all{"ring-plan"};
    all.insert(all.end(), args.begin(), args.end());
    expect_error(all, needle);
    EXPECT_EQ(cli(all).out, "") << needle;
  }
  // The default host counts skip those above a sequence's tokens (given ones are refused, above)
  const Outcome r = cli({"ring-plan", "--seq", "2048"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* row : {"    2.05k      2 ", "    2.05k      8 ", "    2.05k     64 ", "    2.05k    512 "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << " in:\n" << r.out;
  EXPECT_EQ(r.out.find("   4096 "), std::string::npos) << r.out;
  expect_error({"ring-plan", "--seq", "1"}, "--seq: 1 tokens; expected at least 2 for the default --hosts");
  // Ranges the table prints sensibly, int8 (whose scales the model has no bytes for), and 10^9 hosts planned at
  // once (the hybrid's group sizes are the divisors of gcd(hosts, heads): a walk over every size did not end).
  expect_error({"ring-plan", "--rate", "1e300"}, "--rate: 1e+300; expected GFLOP/s from 0.001 to 1e+09");
  expect_error({"ring-plan", "--bandwidth", "1e-300"}, "--bandwidth: 1e-300;");
  expect_error({"ring-plan", "--dtype", "int8"}, "--dtype: 'int8'; expected bf16, f16, f32 or fp8");
  const Outcome big = cli({"ring-plan", "--seq", "1000000000", "--hosts", "1000000000", "--bandwidth", "0.4"});
  ASSERT_EQ(big.code, 0) << big.err;
  EXPECT_NE(big.out.find("links 0.4 Gbit/s"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("1G tokens on 1000000000 hosts: hybrid"), std::string::npos) << big.out;
}

// Sizes past what the machine or an int64 holds: errors naming the option, never a crash or a wrong count.
TEST_F(CliTest, HugeSizesAreErrorsNamingTheirOption) {
  expect_error({"bench", "--heads", "4", "--q-len", "1", "--head-dim", "4611686018427387904", "--no-ceilings"},
               "--head-dim: 4611686018427387904; expected at most 16384");
  expect_error({"bench", "--heads", "4", "--q-len", "1", "--kv-len", "2000000000", "--head-dim", "16", "--kv-sets", "1",
                "--no-ceilings"},
               "--kv-len: the inputs need");
  expect_error({"params", "--d-model", "9223372036854775807", "--heads", "1"}, "--d-model: with these heads");
  expect_error({"params", "--d-model", "1", "--heads", "9223372036854775807", "--head-dim", "9223372036854775807"},
               "--d-model: with these heads");
  const Outcome kv = cli({"kv-size", "--layers", "1", "--kv-heads", "8", "--head-dim", "9223372036854775807", "--seq",
                          "1", "--dtype", "int4"});
  ASSERT_EQ(kv.code, 0) << kv.err;
  EXPECT_NE(kv.out.find(" x 288230376151711744 fp32 scales"), std::string::npos) << kv.out;
  const Outcome exact = cli({"kv-size", "--layers", "1000000000000", "--kv-heads", "1000000000000", "--head-dim",
                             "1000000000000", "--seq", "2", "--batch", "7", "--dtype", "bf16"});
  EXPECT_NE(exact.out.find("= 5.600000000000000e+37 bytes"), std::string::npos) << exact.out;
}

// "--option=" with nothing after '=' is refused: CLI11 took the next argument as its value (a PNG named --json).
TEST_F(CliTest, AnEmptyValueAfterEqualsIsRefused) {
  expect_error({"ring-plan", "--seq", "100", "--hosts", "2", "--dtype=", "--no-causal"},
               "--dtype: empty value after '='");
  expect_error({"kv-size", "--dtype=", "--layers", "2", "--kv-heads", "1", "--head-dim", "1", "--seq", "1"},
               "--dtype: empty value after '='");
  const Outcome ok = cli({"kv-size", "--dtype=bf16", "--layers", "2", "--kv-heads", "1", "--head-dim", "1", "--seq", "1"});
  EXPECT_EQ(ok.code, 0) << ok.err;  // (a value after '=' as ever)
  EXPECT_NE(ok.out.find("(bf16)"), std::string::npos) << ok.out;
}

TEST_F(CliTest, CliRunScoreVariantsAndDropout) {
  write_qkv({});
  const Dims& d = dims_;
  std::vector<float> slopes(static_cast<std::size_t>(d.Hq)), sinks(static_cast<std::size_t>(d.Hq));
  for (std::int64_t h = 0; h < d.Hq; ++h)
    slopes[static_cast<std::size_t>(h)] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(d.Hq)),
    sinks[static_cast<std::size_t>(h)] = 0.5f * static_cast<float>(h) - 1.0f;
  save("slopes.npy", DType::f32, {d.Hq}, slopes);
  save("sinks.npy", DType::f32, {d.Hq}, sinks);
  const auto slopes_view = TensorView::contiguous(slopes.data(), DType::f32, {d.Hq});
  const auto sinks_view = TensorView::contiguous(sinks.data(), DType::f32, {d.Hq});
  Params params;
  params.softcap = 2.5;
  expect_matches({"--softcap", "2.5"}, params);
  params.alibi_slopes = slopes_view;
  params.sinks = sinks_view;
  expect_matches({"--softcap", "2.5", "--alibi-slopes", path("slopes.npy"), "--sinks", path("sinks.npy")}, params);
  Params drop;
  drop.dropout_p = 0.25;
  drop.dropout_seed = 12345678901234ull;
  drop.causal = Causal::bottom_right;
  expect_matches({"--dropout", "0.25", "--seed", "12345678901234", "--causal", "bottom-right"}, drop);
  drop.dropout_seed = 0;  // the default seed
  expect_matches({"--dropout", "0.25", "--causal", "bottom-right"}, drop);
}

TEST_F(CliTest, CliErrorBadDropoutAndSeed) {
  write_qkv({});
  expect_error(run_args({"--dropout", "1"}), "--dropout");
  expect_error(run_args({"--dropout", "-0.1"}), "[0, 1)");
  expect_error(run_args({"--dropout", "0.1x"}), "--dropout");
  expect_error(run_args({"--dropout", "0.1", "--seed", "-3"}), "--seed");
  expect_error(run_args({"--dropout", "0.1", "--seed", "18446744073709551616"}), "--seed");
  expect_error(run_args({"--seed", "3"}), "without --dropout");
  expect_error(run_args({"--softcap", "-1"}), "--softcap");
}

TEST_F(CliTest, CliErrorBackwardNeedsAllFour) {
  write_qkv({});
  expect_error(run_args({"--dq", path("dq.npy"), "--dk", path("dk.npy"), "--dv", path("dv.npy")}), "--grad-out");
  EXPECT_FALSE(fs::exists(path("dq.npy")));
}

TEST_F(CliTest, CliErrorBackwardGradOutShapeWritesNothing) {
  write_qkv({});
  const Dims& d = dims_;
  save("do.npy", DType::f32, {d.B, d.Hq, d.Sq, d.Dv + 1},
       random_floats(static_cast<std::size_t>(d.B * d.Hq * d.Sq * (d.Dv + 1)), 5));
  expect_error(run_args({"--lse", path("lse.npy"), "--grad-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("dk.npy"), "--dv", path("dv.npy")}),
               "--grad-out");
  for (const char* f : {"dq.npy", "dk.npy", "dv.npy"}) EXPECT_FALSE(fs::exists(path(f))) << f;
}

TEST_F(CliTest, CliErrorBackwardUnwritableRemovesEverything) {
  write_qkv({});
  const Dims& d = dims_;
  save("do.npy", DType::f32, {d.B, d.Hq, d.Sq, d.Dv}, random_floats(static_cast<std::size_t>(d.B * d.Hq * d.Sq * d.Dv), 6));
  expect_error(run_args({"--lse", path("lse.npy"), "--grad-out", path("do.npy"), "--dq", path("dq.npy"), "--dk",
                         path("dk.npy"), "--dv", path("missing_dir/dv.npy")}),
               "--dv");
  for (const char* f : {"dq.npy", "dk.npy"}) EXPECT_FALSE(fs::exists(path(f))) << f;
}

TEST_F(CliTest, CliErrorLseUnwritableRemovesOut) {
  write_qkv({});
  expect_error(run_args({"--lse", path("missing_dir/lse.npy")}), "--lse");
  EXPECT_FALSE(fs::exists(path("missing_dir")));
}

TEST_F(CliTest, CliErrorNoSubcommandPrintsHelp) {
  const Outcome r = cli({});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("run"), std::string::npos);
  EXPECT_NE(r.out.find("explain"), std::string::npos);
  EXPECT_EQ(r.err.rfind("attn: error: ", 0), 0u);
}

TEST_F(CliTest, CliErrorUnknownSubcommand) { expect_error({"frobnicate"}, "frobnicate"); }

// CLI11's own errors come out in the program's form too: "<option>: <found>; expected <what>".
TEST_F(CliTest, CliParseErrorsNameTheOption) {
  write_qkv({});
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"run", "--k", path("k.npy"), "--v", path("v.npy"), "--out", path("o.npy")},
       "--q: missing; expected it (a required option)"},
      {{"run", "--q"}, "--q: no value; expected Q.npy"},
      {with_args(run_args({}), {"--q", path("q.npy")}), "--q: given 2 times; expected it once"},
      {with_args(run_args({}), {"--bogus"}), "--bogus: unknown option; expected a command and its options"},
      {{"frobnicate"}, "frobnicate: unexpected argument; expected a command and its options"},
      {{"flops", "--seq", "abc", "--d-model", "4", "--heads", "1"}, "--seq: 'abc'; expected a decimal integer"},
      {{"flops", "--causal=maybe", "--seq", "1", "--d-model", "4", "--heads", "1"},
       "--causal: 'maybe' is not valid; expected no value, or true or false (it is a flag)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    const Outcome r = cli(c.args);
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err.rfind("attn: error: " + c.message, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(path("o.npy")));
  }
}

// CLI11 alone would read "010" as octal, saturate 10^23 to 2^63 - 1 and wrap -1 to 2^64 - 1 for an unsigned
// option: every number option takes plain decimal numbers that fit, or says why not.
TEST_F(CliTest, CliNumberOptionsAreStrictDecimal) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"kv-size", "--layers", "010", "--kv-heads", "1", "--head-dim", "1", "--seq", "1"},
       "--layers: '010' has a leading zero; expected a decimal integer without one"},
      {{"kv-size", "--layers", "0x10", "--kv-heads", "1", "--head-dim", "1", "--seq", "1"},
       "--layers: '0x10'; expected a decimal integer"},
      {{"flops", "--seq", "99999999999999999999999", "--d-model", "4", "--heads", "1"},
       "--seq: '99999999999999999999999' is out of range; expected a decimal integer that fits in 64 bits"},
      {{"generate", "--seed", "-1"}, "--seed: '-1'; expected a non-negative decimal integer"},
      {{"scaling-experiment", "--lr", "nan"}, "--lr: 'nan'; expected a finite decimal number"},
      {{"scaling-experiment", "--lr", "1e999"}, "--lr: '1e999'; expected a finite decimal number"},
      {{"scaling-experiment", "--seeds", "99999999999"}, "--seeds: '99999999999' is not valid; expected an integer"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    const Outcome r = cli(c.args);
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "attn: error: " + c.message + "\n");
  }
  const Outcome ok = cli({"kv-size", "--layers", "80", "--kv-heads", "-0", "--head-dim", "128", "--seq", "0"});
  EXPECT_EQ(ok.code, 2);  // -0 and 0 are numbers; the cost model refuses them with its own message
  EXPECT_EQ(ok.err.rfind("attn: error: --kv-heads: ", 0), 0u) << ok.err;
}

// ---- help --------------------------------------------------------------------------------------------------

TEST_F(CliTest, CliHelpForEachSubcommand) {
  const struct {
    std::vector<std::string> args;
    std::vector<std::string> mentions;
  } cases[] = {
      {{"--help"}, {"run", "explain", "demo"}},
      {{"run", "--help"},
       {"--q", "--k", "--v", "--out", "--lse", "--causal", "--scale", "--mask", "--kv-lens", "--window",
        "--window-align", "--backend", "--threads"}},
      {{"explain", "--help"}, {"--q", "--k", "--v", "--causal", "--scale"}},
      {{"demo", "-h"}, {"--threads"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args.front() + " " + c.args.back());
    const Outcome r = cli(c.args);
    EXPECT_EQ(r.code, 0);
    EXPECT_EQ(r.err, "");
    for (const auto& m : c.mentions) EXPECT_NE(r.out.find(m), std::string::npos) << m << " in:\n" << r.out;
  }
}

// ---- attn explain ------------------------------------------------------------------------------------------

TEST_F(CliTest, CliExplainDefaultIsTheWorkedExample) {
  const Outcome r = cli({"explain"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"1.604", "0.797", "1.401", "1.203", "0.7071", "2.028", "5.056", "Q Kᵀ"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in:\n" << r.out;
  EXPECT_NE(r.out.find("0.401·(1, 0) + 0.198·(0, 2) + 0.401·(3, 1) = (1.604, 0.797)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0.198·(1, 0) + 0.401·(0, 2) + 0.401·(3, 1) = (1.401, 1.203)"), std::string::npos) << r.out;
}

TEST_F(CliTest, CliExplainUserExample3x2) {
  // Q = 0: every key scores 0, so each row weights the three value rows equally.
  save("q.npy", DType::f32, {3, 2}, std::vector<float>{0, 0, 0, 0, 0, 0});
  save("k.npy", DType::f32, {3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  save("v.npy", DType::f32, {3, 2}, std::vector<float>{3, 0, 0, 3, 6, 6});
  const Outcome r = cli({"explain", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("0.333·(3, 0) + 0.333·(0, 3) + 0.333·(6, 6) = (3, 3)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 queries, 3 keys"), std::string::npos) << r.out;
}

TEST_F(CliTest, CliExplainAccepts4dAndCausal) {
  save("q.npy", DType::f32, {1, 1, 2, 2}, std::vector<float>{1, 0, 0, 1});
  save("k.npy", DType::f32, {1, 1, 3, 2}, std::vector<float>{1, 0, 0, 1, 1, 1});
  save("v.npy", DType::f32, {1, 1, 3, 2}, std::vector<float>{1, 0, 0, 2, 3, 1});
  const Outcome r = cli({"explain", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy"), "--causal",
                         "top-left", "--scale", "0.5"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("-inf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1·(1, 0) = (1, 0)"), std::string::npos) << r.out;  // row 0 sees only key 0
  EXPECT_NE(r.out.find("0.5"), std::string::npos) << r.out;
}

TEST_F(CliTest, CliExplainRefusesLargeInputs) {
  save("q.npy", DType::f32, {17, 2}, std::vector<float>(34, 0.5f));
  save("k.npy", DType::f32, {3, 2}, std::vector<float>(6, 0.5f));
  save("v.npy", DType::f32, {3, 2}, std::vector<float>(6, 0.5f));
  expect_error({"explain", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy")}, "small examples");
}

TEST_F(CliTest, CliExplainErrors) {
  save("q.npy", DType::f32, {2, 2}, std::vector<float>(4, 0.5f));
  save("k.npy", DType::f32, {3, 3}, std::vector<float>(9, 0.5f));
  save("v.npy", DType::f32, {3, 2}, std::vector<float>(6, 0.5f));
  expect_error({"explain", "--q", path("q.npy")}, "--k");
  expect_error({"explain", "--q", path("q.npy"), "--k", path("k.npy"), "--v", path("v.npy")}, "--k");
  expect_error({"explain", "--causal", "sideways"}, "--causal");
  expect_error({"explain", "--scale", "-2"}, "--scale");
}

// ---- attn demo ---------------------------------------------------------------------------------------------

TEST_F(CliTest, CliDemoSmall) {
  const Outcome r = cli({"demo", "--small", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* s : {"1.604", "they agree", "reference", "flash", "per thread", "median"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in:\n" << r.out;
}

TEST_F(CliTest, CliDemoBadThreads) { expect_error({"demo", "--threads", "many"}, "--threads"); }

// ---- the real binary ---------------------------------------------------------------------------------------

#ifdef ATTN_CLI_PATH
int exit_status(const std::string& command) {
  const int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST_F(CliTest, CliBinaryExitStatus) {
  const std::string bin = ATTN_CLI_PATH;
  if (!fs::exists(bin)) GTEST_SKIP() << "no attn binary at " << bin;
  const std::string quiet = " > '" + path("stdout.txt") + "' 2> '" + path("stderr.txt") + "'";
  EXPECT_EQ(exit_status("'" + bin + "' explain" + quiet), 0);
  EXPECT_EQ(exit_status("'" + bin + "' run --help" + quiet), 0);
  EXPECT_EQ(exit_status("'" + bin + "' run --bogus" + quiet), 2);
  std::ifstream err(path("stderr.txt"));
  std::string line;
  ASSERT_TRUE(std::getline(err, line));
  EXPECT_EQ(line.rfind("attn: error: ", 0), 0u) << line;
  EXPECT_FALSE(std::getline(err, line)) << "a second error line: " << line;
}
#endif

}  // namespace
}  // namespace attn
