// Tests for `attn info`, `attn bench` and the CPU feature detection behind them. They check that the
// commands run and report what they should; they never assert anything about time or speed.
// (bench/run_bench.py --self-test, run by ctest too, parses the JSON with a real JSON parser.)
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attn/info.h"
#include "cli_support.h"
#include "commands.h"
#include "cpu/cpu_features.h"
#include "cpu/kernels.h"

namespace attn {
namespace {

using test::cli;
using test::Outcome;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) result.push_back(line);
  return result;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

void expect_error(const std::vector<std::string>& args, const std::string& needle) {
  const Outcome r = cli(args);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.err.rfind("attn: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(has(r.err, needle)) << "expected '" << needle << "' in: " << r.err;
}

// ---- CPU features ----------------------------------------------------------------------------------------

// cpu_features() reads cpuid and XCR0 itself; libgcc's __builtin_cpu_supports is an independent reading of the
// same (it too asks XGETBV whether the OS saves the AVX / AVX-512 state). Every vector level is offered exactly
// when that reading has all of the level's target features (src/cpu/isa_list.h); AMX, which also needs Linux's
// grant, has its own test below.
TEST(CpuFeatures, AgreeWithTheCompilersOwnDetection) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx512bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  EXPECT_TRUE(cpu::isa_supported(cpu::Isa::sse2));
  EXPECT_EQ(cpu::isa_supported(cpu::Isa::avx2), avx2);
  EXPECT_EQ(cpu::isa_supported(cpu::Isa::avx512), avx512);
  EXPECT_EQ(cpu::isa_supported(cpu::Isa::avx512bf16), avx512bf16);
  const cpu::CpuFeatures& f = cpu::cpu_features();
  EXPECT_EQ(f.avx2_usable(), avx2);
  EXPECT_EQ(f.avx512_usable(), avx512);
  EXPECT_EQ(f.avx512_bf16 && f.avx512_usable(), avx512bf16);
  EXPECT_TRUE(f.sse2);
  EXPECT_FALSE(f.vendor.empty());
#else
  GTEST_SKIP() << "x86-64 with GCC or clang only";
#endif
}

// What cpu_features() reports holds together: the OS state bits nest, a usable level has its CPU and OS bits,
// and the cache sizes are sizes.
TEST(CpuFeatures, AreConsistent) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  if (f.os_avx512) EXPECT_TRUE(f.os_avx);
  if (f.avx512_usable()) EXPECT_TRUE(f.avx512f && f.os_avx512);
  if (f.avx2_usable()) EXPECT_TRUE(f.avx2 && f.os_avx);
  EXPECT_GE(f.l1d_bytes, 0);
  EXPECT_GE(f.last_level_cache_bytes(), f.l1d_bytes > 0 ? f.l1d_bytes : 0);
}

// CPUID's signature as Linux reads it: /proc/cpuinfo's "cpu family", "model" and "stepping" (the kernel's own
// decoding of leaf 1, the same display rule) agree with cpu_features()'s.
TEST(CpuFeatures, SignatureAgreesWithLinux) {
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  std::map<std::string, std::string> field;
  for (std::string line; std::getline(in, line) && !line.empty();) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    field[key] = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  if (!field.count("cpu family") || !field.count("model")) GTEST_SKIP() << "/proc/cpuinfo has no x86 signature";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  EXPECT_EQ(f.family, std::stoi(field["cpu family"]));
  EXPECT_EQ(f.model, std::stoi(field["model"]));
  if (field.count("stepping") && field["stepping"] != "unknown") EXPECT_EQ(f.stepping, std::stoi(field["stepping"]));
}

// The microarchitecture table against the vendors' published signatures (a name for reports, never for dispatch).
TEST(CpuFeatures, MicroarchitectureNames) {
  const std::string amd = "AuthenticAMD", intel = "GenuineIntel";
  EXPECT_EQ(cpu::microarchitecture(amd, 0x17, 0x01, 2), "Zen");      // Naples
  EXPECT_EQ(cpu::microarchitecture(amd, 0x17, 0x31, 0), "Zen 2");    // Rome
  EXPECT_EQ(cpu::microarchitecture(amd, 0x19, 0x01, 1), "Zen 3");    // Milan
  EXPECT_EQ(cpu::microarchitecture(amd, 0x19, 0x21, 0), "Zen 3");    // Vermeer
  EXPECT_EQ(cpu::microarchitecture(amd, 0x19, 0x11, 1), "Zen 4");    // Genoa
  EXPECT_EQ(cpu::microarchitecture(amd, 0x19, 0x61, 2), "Zen 4");    // Raphael
  EXPECT_EQ(cpu::microarchitecture(amd, 0x19, 0xA0, 2), "Zen 4");    // Bergamo
  EXPECT_EQ(cpu::microarchitecture(amd, 0x1A, 0x02, 1), "Zen 5");    // Turin
  EXPECT_EQ(cpu::microarchitecture(amd, 0x1A, 0x44, 0), "Zen 5");    // Granite Ridge
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0x55, 4), "Skylake-SP");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0x55, 7), "Cascade Lake");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0x55, 11), "Cooper Lake");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0x6A, 6), "Ice Lake-SP");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0x8F, 8), "Sapphire Rapids");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0xCF, 2), "Emerald Rapids");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0xAD, 1), "Granite Rapids");
  EXPECT_EQ(cpu::microarchitecture(intel, 6, 0x01, 0), "");  // not in the table: no guess
  EXPECT_EQ(cpu::microarchitecture(amd, 0x15, 0x01, 0), "");
  EXPECT_EQ(cpu::microarchitecture("SomeVendor", 6, 0x8F, 0), "");
  CpuInfo c;
  c.vendor = amd, c.brand = "AMD EPYC", c.family = 0x19, c.model = 0x11, c.stepping = 1, c.microarchitecture = "Zen 4";
  EXPECT_EQ(describe_cpu(c), "AMD EPYC (Zen 4; AuthenticAMD family 0x19 model 0x11 stepping 1)");
  c.brand = "", c.microarchitecture = "";
  EXPECT_EQ(describe_cpu(c), "AuthenticAMD (AuthenticAMD family 0x19 model 0x11 stepping 1)");
  EXPECT_EQ(describe_cpu(CpuInfo{}), "unknown CPU");
}

TEST(CpuFeatures, AmxRequestAgreesWithTheKernelAndTheDispatcher) {
  // request_amx() caches one ARCH_REQ_XCOMP_PERM answer; the kernel's own record (ARCH_GET_XCOMP_PERM) must agree
  // with it, a refusal must carry its errno, and the dispatcher must offer the amx level exactly when the CPU,
  // the OS (XCR0) and this permission all allow tile data.
  const cpu::AmxRequest request = cpu::request_amx();
  const cpu::AmxPermission permission = cpu::amx_permission();
  EXPECT_EQ(request.ok, permission.permitted);
  if (request.ok) EXPECT_TRUE(permission.kernel_supports);
  else EXPECT_NE(request.error, 0);
  const bool amx_usable = cpu::cpu_features().amx_bf16_usable() && request.ok;
  EXPECT_EQ(attn::isa_supported("amx"), amx_usable);
  EXPECT_EQ(attn::best_isa() == "amx", amx_usable);
}

// ---- attn info -------------------------------------------------------------------------------------------

TEST(CliInfo, PrintsFeaturesOsSupportAndChoice) {
  const Outcome r = cli({"info"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(has(r.out, "CPUID has:"));
  EXPECT_TRUE(has(r.out, "signature: family 0x"));
  EXPECT_TRUE(has(r.out, "XCR0"));
  EXPECT_TRUE(has(r.out, "AMX"));
  EXPECT_TRUE(has(r.out, std::string("best level for this CPU and OS: ") + cpu::isa_name(cpu::best_isa())));
  EXPECT_TRUE(has(r.out, std::string("level in use:                   ") + cpu::isa_name(cpu::active_isa())));
  EXPECT_TRUE(has(r.out, "threads per call:               " + std::to_string(cpu::resolve_threads(0))));
  EXPECT_TRUE(has(r.out, "ATTN_ISA"));
}

TEST(CliInfo, JsonIsOneObject) {
  const Outcome r = cli({"info", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto l = lines(r.out);
  ASSERT_EQ(l.size(), 1u) << r.out;
  EXPECT_EQ(l[0].front(), '{');
  EXPECT_EQ(l[0].back(), '}');
  for (const char* key : {"vendor", "cpuid", "xcr0", "os_avx512", "os_amx", "amx_request_ok", "best_isa", "active_isa",
                          "threads", "l3_bytes", "family", "model", "stepping", "microarchitecture", "cpu"})
    EXPECT_TRUE(has(l[0], std::string("\"") + key + "\":")) << key;
  EXPECT_TRUE(has(l[0], std::string("\"best_isa\":\"") + cpu::isa_name(cpu::best_isa()) + "\""));
  EXPECT_TRUE(has(l[0], "\"avx512_bf16\":"));
  EXPECT_TRUE(has(l[0], "\"amx_bf16\":"));
}

// ---- attn bench ------------------------------------------------------------------------------------------

// clang-format off
const char* const kBenchKeys[] = {
    "tool", "label", "shape", "backend", "isa", "B", "Hq", "Hkv", "Sq", "Skv", "Dk", "Dv", "causal", "dtype",
    "kv_dtype", "page_size", "kv_len_min", "kv_tokens", "threads", "warmup", "reps", "kv_sets", "kv_set_bytes",
    "huge_pages", "time_median_s", "time_min_s", "time_max_s", "times_s", "flops", "flops_nominal", "gflops",
    "bytes", "gbps", "ceilings", "frac_fma", "frac_amx", "frac_bf16_dot", "frac_read_bw", "paged_read",
    "frac_paged_read", "bound", "frac_bound", "rss_before_inputs_bytes", "rss_with_inputs_bytes", "peak_rss_bytes",
    "extra_rss_bytes", "peak_rss_scope", "maxrss_bytes", "inputs_huge_page_fraction", "output_finite", "latent", "cpu"};
// clang-format on

void expect_bench_json(const std::string& line) {
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.front(), '{');
  EXPECT_EQ(line.back(), '}');
  for (const char* key : kBenchKeys) EXPECT_TRUE(has(line, std::string("\"") + key + "\":")) << key << " in " << line;
  EXPECT_TRUE(has(line, "\"output_finite\":true")) << line;
}

TEST(CliBench, TinyShapeJson) {
  const Outcome r = cli({"bench",  "--batch",       "2",         "--heads",    "4",  "--kv-heads", "2",      "--q-len",
                         "20",     "--kv-len",      "33",        "--head-dim", "16", "--causal",   "--reps", "1",
                         "--json", "--no-ceilings", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto l = lines(r.out);
  ASSERT_EQ(l.size(), 1u) << r.out;
  expect_bench_json(l[0]);
  EXPECT_TRUE(has(l[0], "\"reps\":1,"));
  EXPECT_TRUE(has(l[0], "\"ceilings\":null"));
  EXPECT_TRUE(has(l[0], "\"paged_read\":null"));
  EXPECT_TRUE(has(l[0], "\"shape\":\"custom\""));
  EXPECT_TRUE(has(l[0], "\"threads\":2,"));
  EXPECT_TRUE(has(l[0], "\"kv_sets\":1,"));  // a prefill shape is not rotated
}

TEST(CliBench, ExactCausalFlopCount) {
  // Sq = Skv = 4, causal: 1 + 2 + 3 + 4 = 10 allowed pairs; flops = 2·(Dk + Dv)·Hq·pairs = 2·16·1·10.
  const Outcome r = cli({"bench", "--heads", "1", "--q-len", "4", "--head-dim", "8", "--causal", "--reps", "1",
                         "--json", "--no-ceilings"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\"flops\":320,")) << r.out;
  EXPECT_TRUE(has(r.out, "\"flops_nominal\":256,")) << r.out;  // DESIGN.md's rule: 4·4·4·8 / 2
  // Bytes: Q and O 4·8 floats each, K and V 4·8 floats each, all read or written once.
  EXPECT_TRUE(has(r.out, "\"bytes\":512,")) << r.out;
}

TEST(CliBench, PagedRaggedMixedDtypesWithQuickCeilings) {
  // Lengths 5, 23, 40 (evenly spaced from --kv-len-min to --kv-len): 68 keys.
  const Outcome r = cli({"bench",
                         "--batch",
                         "3",
                         "--heads",
                         "4",
                         "--kv-heads",
                         "1",
                         "--q-len",
                         "1",
                         "--kv-len",
                         "40",
                         "--kv-len-min",
                         "5",
                         "--paged",
                         "4",
                         "--head-dim",
                         "8",
                         "--kv-dtype",
                         "bf16",
                         "--reps",
                         "2",
                         "--kv-sets",
                         "2",
                         "--json",
                         "--quick-ceilings",
                         "--threads",
                         "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto l = lines(r.out);
  ASSERT_EQ(l.size(), 1u) << r.out;
  expect_bench_json(l[0]);
  EXPECT_TRUE(has(l[0], "\"kv_tokens\":68,"));
  EXPECT_TRUE(has(l[0], "\"page_size\":4,"));
  EXPECT_TRUE(has(l[0], "\"kv_sets\":2,"));
  EXPECT_TRUE(has(l[0], "\"dtype\":\"f32\",\"kv_dtype\":\"bf16\""));
  // Which ceiling binds depends on the ceilings measured in this run (a sanitizer build or a busy machine
  // lowers the FMA rate and moves the ridge point), so only the field's form is checked, never its value.
  EXPECT_TRUE(has(l[0], "\"bound\":\"memory (scattered pages)\"") || has(l[0], "\"bound\":\"compute (fp32 FMA)\""))
      << l[0];
  // Paged: also judged against reading its pages (4 keys of 8 bf16 values: 64 bytes, read in chunks of 256) in a
  // shuffled order.
  EXPECT_TRUE(has(l[0], "\"paged_read\":{\"chunk_bytes\":256,\"gbps\":")) << l[0];
  EXPECT_FALSE(has(l[0], "\"frac_paged_read\":null")) << l[0];
  EXPECT_TRUE(has(l[0], "\"ceilings\":{\"threads\":2,\"fma_gflops\":"));
  EXPECT_FALSE(has(l[0], "\"fma_gflops\":null"));
  EXPECT_FALSE(has(l[0], "\"read_gbps\":null"));
}

// The ceilings alone (what run_bench.py measures once per run), with every trial and their spread; then a run
// judged against given values.
TEST(CliBench, CeilingsOnceAndGiven) {
  const Outcome c = cli({"bench", "--ceilings-only", "--json", "--quick-ceilings", "--threads", "1"});
  ASSERT_EQ(c.code, 0) << c.err;
  ASSERT_EQ(lines(c.out).size(), 1u) << c.out;
  EXPECT_TRUE(has(c.out, "\"ceilings\":{\"threads\":1,\"fma_gflops\":")) << c.out;
  EXPECT_TRUE(has(c.out, "\"read_trials\":[")) << c.out;
  EXPECT_TRUE(has(c.out, "\"read_spread\":")) << c.out;
  EXPECT_TRUE(has(c.out, "\"given\":false")) << c.out;
  // The bf16 dot-product peak where the CPU has AVX512-BF16 (else null, with the reason).
  if (cpu::cpu_features().avx512_bf16 && cpu::cpu_features().avx512_usable())
    EXPECT_TRUE(has(c.out, "\"bf16_dot_gflops\":") && !has(c.out, "\"bf16_dot_gflops\":null")) << c.out;
  else
    EXPECT_TRUE(has(c.out, "\"bf16_dot_gflops\":null")) << c.out;
  const Outcome g = cli({"bench", "--heads", "2", "--q-len", "4", "--kv-len", "64", "--head-dim", "8", "--reps", "1",
                         "--json", "--ceiling-values", "100,0,10"});
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_TRUE(has(g.out, "\"fma_gflops\":100,")) << g.out;
  EXPECT_TRUE(has(g.out, "\"read_gbps\":10,")) << g.out;
  EXPECT_TRUE(has(g.out, "\"given\":true")) << g.out;
  EXPECT_TRUE(has(g.out, "\"amx_bf16_gflops\":null")) << g.out;
  EXPECT_TRUE(has(g.out, "\"bf16_dot_gflops\":null")) << g.out;
  EXPECT_TRUE(has(g.out, "\"frac_bf16_dot\":null")) << g.out;  // (an f32 row)
  const Outcome d = cli({"bench", "--heads", "2", "--q-len", "4", "--kv-len", "64", "--head-dim", "8", "--reps", "1",
                         "--dtype", "bf16", "--json", "--ceiling-values", "100,0,10,400"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_TRUE(has(d.out, "\"bf16_dot_gflops\":400,")) << d.out;
  EXPECT_FALSE(has(d.out, "\"frac_bf16_dot\":null")) << d.out;
  const std::vector<std::string> shape = {"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8"};
  for (const std::string& bad : {"1,2", "0,0,10", "100,0,-1", "a,b,c", "1,0,1,-1", "1,0,1,1,1"}) {
    std::vector<std::string> args = shape;
    args.insert(args.end(), {"--ceiling-values", bad});
    expect_error(args, "--ceiling-values");
  }
  std::vector<std::string> both = shape;
  both.insert(both.end(), {"--ceiling-values", "1,0,1", "--no-ceilings"});
  expect_error(both, "--ceiling-values");
}

// The scattered-read ceilings of paged runs, measured up front with the ceilings (what run_bench.py does once per
// run) and then given to a paged run, which is judged by the given value (rounded up to the 256-byte chunk the
// measurement reads) instead of measuring it.
TEST(CliBench, PagedReadCeilingsOnceAndGiven) {
  const Outcome c = cli({"bench", "--ceilings-only", "--json", "--quick-ceilings", "--threads", "1",
                         "--paged-read-chunks", "1000,4096"});
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_TRUE(has(c.out, "\"paged_read\":[{\"chunk_bytes\":1024,\"gbps\":")) << c.out;
  EXPECT_TRUE(has(c.out, "},{\"chunk_bytes\":4096,\"gbps\":")) << c.out;
  EXPECT_TRUE(has(c.out, "\"given\":false")) << c.out;
  // 4 keys of 8 f32 values: 128 bytes a page, judged by the value given for 256
  const std::vector<std::string> paged = {"bench", "--heads", "2", "--kv-heads", "1", "--q-len", "1", "--kv-len",
                                          "64", "--head-dim", "8", "--paged", "4", "--reps", "1", "--threads", "1"};
  std::vector<std::string> given = paged;
  given.insert(given.end(), {"--json", "--ceiling-values", "10,0,5", "--paged-read-values", "200:7.5,4096:9"});
  const Outcome g = cli(given);
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_TRUE(has(g.out, "\"paged_read\":{\"chunk_bytes\":256,\"gbps\":7.5,\"trials\":[],")) << g.out;
  EXPECT_TRUE(has(g.out, "\"given\":true")) << g.out;
  for (const std::string& bad : {"256", "0:3", "256:0", "256:x", "x:3", "256:3:1", "2000000000:3"}) {
    std::vector<std::string> args = paged;
    args.insert(args.end(), {"--quick-ceilings", "--paged-read-values", bad});
    expect_error(args, "--paged-read-values");
  }
  std::vector<std::string> unjudged = paged;
  unjudged.insert(unjudged.end(), {"--no-ceilings", "--paged-read-values", "256:3"});
  expect_error(unjudged, "--paged-read-values");
  expect_error({"bench", "--ceilings-only", "--quick-ceilings", "--paged-read-chunks", "0"}, "--paged-read-chunks");
}

TEST(CliBench, RaggedWithoutPagesUsesKeyLengths) {
  const Outcome r = cli({"bench", "--batch", "2", "--heads", "2", "--q-len", "3", "--kv-len", "9", "--kv-len-min", "2",
                         "--head-dim", "8", "--dtype", "bf16", "--reps", "1", "--json", "--no-ceilings"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\"kv_tokens\":11,")) << r.out;
  expect_bench_json(lines(r.out).at(0));
}

TEST(CliBench, ReferenceBackendAndText) {
  const Outcome r = cli({"bench", "--heads", "2", "--q-len", "5", "--kv-len", "9", "--head-dim", "8", "--dtype", "f16",
                         "--backend", "reference", "--reps", "1", "--no-ceilings", "--label", "tiny"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "tiny: B=1 Hq=2 Hkv=2 Sq=5 Skv=9 D=8")) << r.out;
  EXPECT_TRUE(has(r.out, "reference")) << r.out;
  EXPECT_TRUE(has(r.out, "median")) << r.out;
  EXPECT_TRUE(has(r.out, "GFLOP/s")) << r.out;
  EXPECT_TRUE(has(r.out, "working memory")) << r.out;
  EXPECT_FALSE(has(r.out, "WARNING")) << r.out;
}

TEST(CliBench, BackwardPassJsonAndText) {
  // Sq = Skv = 4, causal, Dk = Dv = 8: the forward's 320 flops, x 2.5 for the backward.
  const Outcome r = cli({"bench", "--heads", "2", "--kv-heads", "1", "--q-len", "4", "--head-dim", "8", "--causal",
                         "--backward", "--reps", "1", "--json", "--no-ceilings", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_bench_json(lines(r.out).at(0));  // output_finite: dQ, dK and dV (poisoned first) all written
  EXPECT_TRUE(has(r.out, "\"pass\":\"backward\"")) << r.out;
  EXPECT_TRUE(has(r.out, "\"flops\":1600,")) << r.out;
  const Outcome t = cli({"bench", "--batch", "2", "--heads", "3", "--q-len", "7", "--kv-len", "70", "--kv-len-min", "5",
                         "--head-dim", "12", "--dtype", "bf16", "--backward", "--reps", "1", "--no-ceilings"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, ", backward, ")) << t.out;
  EXPECT_TRUE(has(t.out, "2.5x the forward's")) << t.out;
  EXPECT_FALSE(has(t.out, "WARNING")) << t.out;
}

TEST(CliBench, LatentShapeReadsKsRowsOnce) {
  // MLA-like: 4 query heads on one latent head, Dk = 24, V the first 16 columns of K's rows.
  // flops = 2·(24 + 16)·4·40 = 12800; bytes = Q 4·24 + O 4·16 + the 40 latent rows of 24, all f32 (no V rows of its own).
  const Outcome r = cli({"bench", "--heads", "4", "--kv-heads", "1", "--q-len", "1", "--kv-len", "40", "--head-dim",
                         "24", "--value-dim", "16", "--latent", "--reps", "1", "--json", "--no-ceilings"});
  ASSERT_EQ(r.code, 0) << r.err;
  expect_bench_json(lines(r.out).at(0));
  EXPECT_TRUE(has(r.out, "\"Dk\":24,\"Dv\":16,")) << r.out;
  EXPECT_TRUE(has(r.out, "\"latent\":true")) << r.out;
  EXPECT_TRUE(has(r.out, "\"flops\":12800,")) << r.out;
  EXPECT_TRUE(has(r.out, "\"bytes\":4480,")) << r.out;
  // Without --latent V has rows of its own (40·16 more floats); paged, quantised rows with their scales (int4: V's
  // scales a view of the first blocks of K's, int8: K's row scales) and the text form.
  const Outcome v = cli({"bench", "--heads", "4", "--kv-heads", "1", "--q-len", "1", "--kv-len", "40", "--head-dim",
                         "24", "--value-dim", "16", "--reps", "1", "--json", "--no-ceilings"});
  ASSERT_EQ(v.code, 0) << v.err;
  EXPECT_TRUE(has(v.out, "\"bytes\":7040,")) << v.out;
  for (const char* kv : {"int4", "int8", "bf16"}) {
    const Outcome p = cli({"bench", "--batch", "2", "--heads", "8", "--kv-heads", "1", "--q-len", "2", "--kv-len", "37",
                           "--head-dim", "72", "--value-dim", "40", "--latent", "--paged", "8", "--dtype", "bf16",
                           "--kv-dtype", kv, "--reps", "1", "--no-ceilings"});
    ASSERT_EQ(p.code, 0) << kv << ": " << p.err;
    EXPECT_TRUE(has(p.out, "Dk=72 Dv=40 latent (V in K's rows) paged(8)")) << p.out;
    EXPECT_FALSE(has(p.out, "WARNING")) << kv << ": " << p.out;
  }
  // The canonical MLA shapes are listed with their value dim.
  const Outcome l = cli({"bench", "--list-shapes"});
  ASSERT_EQ(l.code, 0) << l.err;
  EXPECT_TRUE(has(l.out, "{\"id\":\"M2\",\"what\":\"MLA decode, 32k latent cache\",\"full\":{\"B\":1,"
                         "\"Hq\":128,\"Hkv\":1,\"Sq\":1,\"Skv\":32768,\"D\":576,\"Dv\":512,\"latent\":true,"))
      << l.out;
}

TEST(CliBench, Errors) {
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--value-dim", "16", "--latent"},
               "--value-dim");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--value-dim", "0"}, "--value-dim");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8", "--latent", "--backward"}, "--latent");
  expect_error({"bench", "--shape", "M1", "--latent"}, "--shape");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--kv-len", "64", "--head-dim", "8", "--paged", "16",
                "--backward"},
               "--paged");
  expect_error({"bench"}, "--heads");
  expect_error({"bench", "--heads", "6", "--kv-heads", "4", "--q-len", "2", "--head-dim", "8"}, "--kv-heads");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8", "--dtype", "f64"}, "--dtype");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8", "--kv-dtype", "int2"}, "--kv-dtype");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8", "--dtype", "int8"}, "--dtype");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8", "--kv-dtype", "int8", "--backward"},
               "--kv-dtype");
  expect_error({"bench", "--heads", "2", "--q-len", "0", "--head-dim", "8"}, "--q-len");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--kv-len", "4", "--kv-len-min", "5", "--head-dim", "8"},
               "--kv-len-min");
  expect_error({"bench", "--shape", "Q9"}, "--shape");
  expect_error({"bench", "--shape", "P1", "--heads", "2"}, "--shape");
  expect_error({"bench", "--shape", "P1", "--threads", "-1"}, "--threads");
  expect_error({"bench", "--heads", "2", "--q-len", "2", "--head-dim", "8", "--backend", "cuda"}, "--backend");
  expect_error({"bench", "--heads", "two"}, "--heads");
  // a 0 or -1 given is refused, not taken for "not given" (the option's default)
  expect_error({"bench", "--heads", "0", "--q-len", "1", "--head-dim", "8"}, "--heads: 0; expected");
  expect_error({"bench", "--heads", "-1", "--q-len", "1", "--head-dim", "8"}, "--heads: -1; expected");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--batch", "0"}, "--batch: 0; expected");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--kv-heads", "0"}, "--kv-heads: 0;");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--kv-len", "0"}, "--kv-len: 0;");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--value-dim", "-1"}, "--value-dim: -1;");
  expect_error({"bench", "--heads", "2", "--q-len", "1", "--head-dim", "8", "--kv-dtype", ""}, "--kv-dtype: ''");
}

// attn cascade-bench on a tiny batch: one JSON object, the two outputs agreeing; bad sizes name their option.
TEST(CliCascadeBench, TinyBatchAgreesAndBadSizesAreNamed) {
  const Outcome r = cli({"cascade-bench", "--batch", "3", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
                         "--prefix", "32", "--own", "5", "--page", "8", "--reps", "1", "--json", "--quick-ceilings"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto l = lines(r.out);
  ASSERT_EQ(l.size(), 1u) << r.out;
  EXPECT_TRUE(has(l[0], "\"outputs_agree\":true")) << l[0];
  EXPECT_TRUE(has(l[0], "\"prefix\":32,")) << l[0];
  expect_error({"cascade-bench", "--prefix", "10"}, "--prefix: 10; expected a positive multiple of --page (16)");
  expect_error({"cascade-bench", "--heads", "6", "--kv-heads", "4"}, "--heads: 6; expected a multiple of --kv-heads");
  expect_error({"cascade-bench", "--dtype", "i8"}, "--dtype: 'i8'; expected bf16, f16 or f32");
}

}  // namespace
}  // namespace attn
