// attn_gpu_selftest: the layout self-tests on a real GPU (`make test-gpu`).
//
// Runs the per-warp code of cuda/selftest_tiles.h on the device (the real mma.sync, ldmatrix and shuffles) and
// judges the results with the checks the host tests apply to the host model (cuda/selftest_host.h): every
// one-hot case of the MMA fragment layouts, every ldmatrix form, one-hot and random attention tiles, and the
// host model's prediction of the device's tiles. Writes <out>/selftest.json and prints a short table last.
//
// usage: attn_gpu_selftest [--out DIR]      (default DIR: gpu-results)
// exit:  0 every check passed, 1 a check failed, 2 bad usage or an unwritable DIR,
//        77 no usable CUDA device (no driver, no GPU, or one older than sm_80): one line says which.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/runtime.h"
#include "cuda/selftest.h"
#include "cuda/selftest_host.h"

namespace {

using namespace attn::cuda;
using selftest::Check;

constexpr int kNoDevice = 77;

std::string json_string(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      r += buf;
    } else {
      r += c;
    }
  }
  return r + "\"";
}

bool write_json(const std::filesystem::path& dir, const std::string& status, const std::string& device,
                const std::vector<Check>& checks) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream f(dir / "selftest.json");
  if (!f) return false;
  const RuntimeProbe& p = probe();
  f << "{\n  \"program\": \"attn_gpu_selftest\",\n  \"status\": " << json_string(status)
    << ",\n  \"device\": " << json_string(device) << ",\n  \"driver_version\": " << p.driver_version
    << ",\n  \"runtime_version\": " << p.runtime_version << ",\n  \"checks\": [";
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    f << (i ? ",\n" : "\n") << "    {\"name\": " << json_string(c.name) << ", \"cases\": " << c.cases
      << ", \"failures\": " << c.failures << ", \"ok\": " << (c.ok() ? "true" : "false")
      << ", \"first_failure\": " << json_string(c.first) << "}";
  }
  f << "\n  ]\n}\n";
  return static_cast<bool>(f);
}

// A check whose GPU run failed (a runtime error) counts as one failure that says so.
Check run_failed(const std::string& name, const attn::Status& st) {
  Check c{name};
  c.cases = 1;
  c.fail(st.message());
  return c;
}

template <MmaType T>
void tile_checks(std::vector<Check>& out) {
  const std::string tn = mma_type_name(T);
  selftest::TileResults r;
  attn::Status st = selftest::gpu_attention_tile_onehot(T, &r);
  out.push_back(st.ok() ? selftest::check_tile_onehot(T, r) : run_failed("attention tile one-hot " + tn, st));
  const auto in = selftest::make_tile_inputs<T>(256, 29);
  for (bool softmax : {true, false}) {
    st = selftest::gpu_attention_tile(T, softmax, in.cases, in.q, in.k, in.v, &r);
    const std::string name = "attention tile values " + tn + (softmax ? " softmax" : " P=S");
    if (!st.ok()) {
      out.push_back(run_failed(name, st));
      continue;
    }
    out.push_back(selftest::check_tile_values<T>(in, r, softmax));
    const auto model = softmax ? selftest::host_attention_tile<T, true>(in.cases, in.q, in.k, in.v)
                               : selftest::host_attention_tile<T, false>(in.cases, in.q, in.k, in.v);
    out.push_back(selftest::check_tiles_agree("host model predicts " + name, r, model));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path out_dir = "gpu-results";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: attn_gpu_selftest [--out DIR]\n");
      return 2;
    }
  }

  const RuntimeProbe& p = probe();
  std::string device;
  std::string why;
  if (p.device_count == 0) {
    why = "no CUDA device (" + p.error + ")";
  } else if (const auto d = device_info(0)) {
    device = d->name + " (sm_" + std::to_string(d->sm_major) + std::to_string(d->sm_minor) + ", " +
             std::to_string(d->multiprocessors) + " SMs)";
    if (!kernels_support(*d)) why = "no usable CUDA device: " + device + " is older than sm_80";
  } else {
    why = "no CUDA device (device 0 gave no properties)";
  }
  if (!why.empty()) {
    write_json(out_dir, why, device, {});
    std::fprintf(stderr, "attn_gpu_selftest: %s\n", why.c_str());
    return kNoDevice;
  }

  std::vector<Check> checks;
  for (MmaType t : {MmaType::bf16, MmaType::f16}) {
    std::vector<float> out;
    const attn::Status st = selftest::gpu_onehot_mma(t, &out);
    checks.push_back(st.ok() ? selftest::check_onehot_mma(t, out)
                             : run_failed(std::string("mma.m16n8k16 one-hot ") + mma_type_name(t), st));
  }
  for (int num : {1, 2, 4})
    for (bool trans : {false, true}) {
      std::vector<std::uint32_t> out;
      const attn::Status st = selftest::gpu_ldmatrix_probe(num, trans, &out);
      checks.push_back(st.ok() ? selftest::check_ldmatrix_probe(num, trans, out)
                               : run_failed("ldmatrix.m8n8.x" + std::to_string(num) + (trans ? ".trans" : ""), st));
    }
  tile_checks<MmaType::bf16>(checks);
  tile_checks<MmaType::f16>(checks);

  int passed = 0, failed = 0;
  for (const Check& c : checks) (c.ok() ? passed : failed)++;
  const std::string status = failed ? "fail" : "pass";
  const bool wrote = write_json(out_dir, status, device, checks);

  std::printf("attn_gpu_selftest on %s, driver %d, runtime %d\n", device.c_str(), p.driver_version,
              p.runtime_version);
  for (const Check& c : checks)
    if (!c.ok()) std::printf("  FAIL %s: %s (%ld of %ld)\n", c.name.c_str(), c.first.c_str(), c.failures, c.cases);
  std::printf("\n%-52s %8s %9s  %s\n", "check", "cases", "failures", "result");
  for (const Check& c : checks)
    std::printf("%-52s %8ld %9ld  %s\n", c.name.c_str(), c.cases, c.failures, c.ok() ? "pass" : "FAIL");
  std::printf("results: %s\n", wrote ? (out_dir / "selftest.json").c_str() : "(could not write the JSON file)");
  std::printf("%d passed, %d failed\n", passed, failed);
  if (!wrote) return 2;
  return failed ? 1 : 0;
}
