// Fuzz target: the `attn` command line (attn::tools::main, the function tools/main.cc calls) on arbitrary
// argument vectors.
//
// The input is split into tokens at '\n' and '\0'; the tokens become argv[1..]. To keep one run fast and
// confined to a private temporary directory, the harness
//   - runs only cheap subcommands whose argument handling is interesting: run, explain, flops, kv-size,
//     params, info (or --help); a first token naming anything else is replaced by one of these, and a later
//     token naming another subcommand is replaced by "x";
//   - replaces '/' in every token by '_' and runs with the temporary directory as the working directory, so
//     every path the program can see is a file there: small .npy inputs of every kind the options take
//     (and malformed ones), a FIFO, a directory, symbolic and hard links;
//   - caps --threads at 2 and the token count and length.
// Then it checks the program's contract: exit status 0 or 2; on 2 exactly one line "attn: error: ..." on
// stderr and the directory unchanged (no file created, changed or removed); on 0 no input file changed.
// Whatever a successful run wrote is removed and the fixture restored before the next input.
// With ATTN_FUZZ_VERBOSE set, each run's argv, exit status and error line go to stderr.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "npy.h"

namespace {

using attn::DType;
namespace npy = attn::npy;

[[noreturn]] void fail(const std::string& what, const std::vector<std::string>& args) {
  std::string line;
  for (const std::string& a : args) line += " '" + a + "'";
  std::fprintf(stderr, "fuzz_cli_args: %s\n  argv:%s\n", what.c_str(), line.c_str());
  std::abort();
}

const char* const kAllowed[] = {"run", "explain", "flops", "kv-size", "params", "info", "--help"};
// Subcommands that run for seconds or minutes, or write files under fixed names.
const char* const kRefused[] = {"demo", "generate", "heatmap", "bench", "scaling-experiment"};

std::string npy_bytes(DType dtype, const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
  std::vector<unsigned char> data;
  for (float v : values) {
    unsigned char b[8] = {};
    std::size_t n = attn::dtype_size(dtype);
    if (dtype == DType::f32) std::memcpy(b, &v, 4);
    else if (dtype == DType::f16) {  // only values exact in float16 are used: 0, +-0.5, +-1, 2
      const std::uint16_t h = v == 0 ? 0 : static_cast<std::uint16_t>((v < 0 ? 0x8000 : 0) |
                                                                       (std::fabs(v) == 0.5f ? 0x3800 : std::fabs(v) == 1 ? 0x3C00 : 0x4000));
      std::memcpy(b, &h, 2);
    } else if (dtype == DType::boolean) b[0] = v != 0;
    else if (dtype == DType::i32) {
      const auto i = static_cast<std::int32_t>(v);
      std::memcpy(b, &i, 4);
    } else if (dtype == DType::i64) {
      const auto i = static_cast<std::int64_t>(v);
      std::memcpy(b, &i, 8);
    }
    data.insert(data.end(), b, b + n);
  }
  return npy::serialize(dtype, shape, data.data());
}

std::vector<float> cycle(std::size_t n, std::initializer_list<float> values) {
  std::vector<float> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(*(values.begin() + i % values.size()));
  return out;
}

// The private directory and what it holds between runs: name -> contents (regular files).
struct Fixture {
  std::string dir;
  std::map<std::string, std::string> files;
  int home = -1;  // the working directory to return to

  Fixture() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/attn_fuzz_cli.XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("fuzz_cli_args: mkdtemp");
      std::abort();
    }
    dir = pattern;
    files["q.npy"] = npy_bytes(DType::f32, {1, 2, 3, 4}, cycle(24, {0.5f, -1, 2, 0}));
    files["k.npy"] = npy_bytes(DType::f32, {1, 1, 5, 4}, cycle(20, {1, 0.5f, 0, -0.5f}));
    files["v.npy"] = npy_bytes(DType::f32, {1, 1, 5, 3}, cycle(15, {2, -1, 0.5f}));
    files["do.npy"] = npy_bytes(DType::f32, {1, 2, 3, 3}, cycle(18, {1, -0.5f}));
    files["qh.npy"] = npy_bytes(DType::f16, {1, 2, 3, 4}, cycle(24, {0.5f, -1, 2, 0}));
    files["kh.npy"] = npy_bytes(DType::f16, {1, 1, 5, 4}, cycle(20, {1, 0.5f, 0}));
    files["vh.npy"] = npy_bytes(DType::f16, {1, 1, 5, 3}, cycle(15, {2, -1}));
    files["q2.npy"] = npy_bytes(DType::f32, {2, 2}, {1, 0, 0, 1});
    files["k3.npy"] = npy_bytes(DType::f32, {3, 2}, {1, 0, 0, 1, 1, 1});
    files["mask.npy"] = npy_bytes(DType::boolean, {3, 5}, cycle(15, {1, 1, 0}));
    files["maskf.npy"] = npy_bytes(DType::f32, {1, 1, 3, 5}, cycle(15, {0, -1, -INFINITY, 0.5f}));
    files["mask1.npy"] = npy_bytes(DType::f32, {5}, cycle(5, {0, -2}));
    files["nanmask.npy"] = npy_bytes(DType::f32, {3, 5}, cycle(15, {0, NAN}));
    files["lens.npy"] = npy_bytes(DType::i32, {1}, {3});
    files["lens64.npy"] = npy_bytes(DType::i64, {1}, {5});
    files["lensbad.npy"] = npy_bytes(DType::i32, {1}, {9});
    files["lens2.npy"] = npy_bytes(DType::i64, {2}, {1, 2});
    files["empty0.npy"] = npy_bytes(DType::f32, {0, 2, 3, 4}, {});
    files["scalar.npy"] = npy_bytes(DType::f32, {}, {1});
    files["rank5.npy"] = npy_bytes(DType::f32, {1, 1, 1, 1, 2}, {1, 2});
    std::string trunc = files["q.npy"];
    trunc.resize(trunc.size() - 5);
    files["trunc.npy"] = trunc;
    files["trailing.npy"] = files["k.npy"] + "xyz";
    files["bad.npy"] = "not a numpy file\n";
    files["empty.npy"] = "";
    files["f8.npy"] = std::string("\x93NUMPY\x01\x00\x46\x00", 10) +
                      "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }" + std::string(13, ' ') + "\n" +
                      std::string(8, '\0');
    home = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    create();
  }

  // name -> "type:inode:size:mtime" of every entry (lstat): any write, rename or replacement changes it.
  std::map<std::string, std::string> state() const {
    std::map<std::string, std::string> out;
    DIR* d = opendir(dir.c_str());
    if (!d) return out;
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      if (lstat((dir + "/" + name).c_str(), &st) != 0) continue;
      out[name] = std::to_string(st.st_mode) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) +
                  ":" + std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
    }
    closedir(d);
    return out;
  }

  // Brings the directory back to the fixture: removes what a run added, recreates what it replaced.
  void restore() {
    const auto now = state();
    if (now == pristine) return;
    for (const auto& [name, s] : now) {
      const auto it = pristine.find(name);
      if (it != pristine.end() && it->second == s) continue;
      const std::string path = dir + "/" + name;
      if (unlink(path.c_str()) != 0) rmdir(path.c_str());
    }
    create();
  }

  // Creates every missing entry of the fixture.
  void create() {
    for (const auto& [name, contents] : files) {
      const std::string path = dir + "/" + name;
      struct stat st;
      if (lstat(path.c_str(), &st) != 0) std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
    }
    mkfifo((dir + "/fifo").c_str(), 0600);
    mkdir((dir + "/sub").c_str(), 0700);
    symlink("q.npy", (dir + "/link.npy").c_str());
    symlink("missing.npy", (dir + "/dangling.npy").c_str());
    struct stat k, h;
    if (stat((dir + "/hard.npy").c_str(), &h) != 0 || stat((dir + "/k.npy").c_str(), &k) != 0 || h.st_ino != k.st_ino) {
      unlink((dir + "/hard.npy").c_str());
      link((dir + "/k.npy").c_str(), (dir + "/hard.npy").c_str());  // another name of k.npy
    }
    pristine = state();
  }

  std::map<std::string, std::string> pristine;
};

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Input option names of the whitelisted subcommands, whose files must never change.
bool is_input_option(const std::string& name) {
  return name == "--q" || name == "--k" || name == "--v" || name == "--mask" || name == "--kv-lens" ||
         name == "--grad-out";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture fixture;
  constexpr std::size_t kMaxTokens = 32, kMaxToken = 128;

  std::vector<std::string> args;
  std::string token;
  for (std::size_t i = 0; i <= size && args.size() < kMaxTokens; ++i) {
    const char c = i < size ? static_cast<char>(data[i]) : '\n';
    if (c == '\n' || c == '\0') {
      args.push_back(token);
      token.clear();
    } else if (token.size() < kMaxToken) {
      token.push_back(c == '/' ? '_' : c);
    }
  }
  if (args.empty()) args.push_back("");
  if (std::find(std::begin(kAllowed), std::end(kAllowed), args[0]) == std::end(kAllowed))
    args[0] = kAllowed[(size ? data[0] : 0) % std::size(kAllowed)];
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    for (const char* refused : kRefused)
      if (a == refused) a = "x";
    const bool threads_value = i > 0 && args[i - 1] == "--threads";
    if (threads_value && all_digits(a) && (a.size() > 1 || a[0] > '2')) a = "2";
    if (a.rfind("--threads=", 0) == 0 && all_digits(a.substr(10)) && a.size() > 10 &&
        (a.size() > 11 || a[10] > '2'))
      a = "--threads=2";
  }

  // The input files named on the command line (both "--q x" and "--q=x").
  std::set<std::string> inputs;
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string name;
    if (is_input_option(args[i - 1])) name = args[i];
    const std::size_t eq = args[i].find('=');
    if (eq != std::string::npos && is_input_option(args[i].substr(0, eq))) name = args[i].substr(eq + 1);
    if (name == "link.npy") name = "q.npy";  // the links of the fixture, by what they name
    if (name == "hard.npy") name = "k.npy";
    if (!name.empty() && fixture.files.count(name)) inputs.insert(name);
  }

  std::vector<std::string> argv_storage = {"attn"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const auto before = fixture.state();
  if (chdir(fixture.dir.c_str()) != 0) fail("cannot enter the fixture directory", args);
  std::ostringstream out, err;
  const int code = attn::tools::main(static_cast<int>(argv.size() - 1), argv.data(), out, err);
  if (fchdir(fixture.home) != 0) fail("cannot return to the working directory", args);

  const std::string e = err.str();
  static const bool verbose = std::getenv("ATTN_FUZZ_VERBOSE") != nullptr;  // shows what each input did
  if (verbose) {
    std::string line;
    for (const std::string& a : args) line += " " + a;
    std::fprintf(stderr, "attn%s -> %d %s", line.c_str(), code, e.empty() ? "\n" : e.c_str());
  }
  if (code != 0 && code != 2) fail("exit status " + std::to_string(code), args);
  if (code == 2) {
    if (e.rfind("attn: error: ", 0) != 0 || std::count(e.begin(), e.end(), '\n') != 1 || e.back() != '\n')
      fail("exit status 2 without exactly one 'attn: error: ' line: " + e, args);
    if (fixture.state() != before) fail("a failed run changed the directory: " + e, args);
  } else {
    if (!e.empty()) fail("exit status 0 with an error output: " + e, args);
    const auto after = fixture.state();
    for (const auto& name : inputs)
      if (after.count(name) == 0 || after.at(name) != before.at(name)) fail("a successful run changed input " + name, args);
  }
  fixture.restore();
  return 0;
}
