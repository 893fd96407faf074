// attn info: what the CPU has, what the OS allows, which kernel level attn chose and how many threads
// it will use.
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "attn/info.h"
#include "json_writer.h"
#include "subcommand.h"

namespace attn::tools {
namespace {

std::string size_text(std::int64_t bytes) {
  if (bytes <= 0) return "unknown";
  char buf[32];
  if (bytes >= (std::int64_t{1} << 20) && bytes % (std::int64_t{1} << 20) == 0)
    std::snprintf(buf, sizeof buf, "%lld MiB", static_cast<long long>(bytes >> 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof buf, "%.0f KiB", static_cast<double>(bytes) / 1024);
  else std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  return buf;
}

std::string hex(std::uint64_t x) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(x));
  return buf;
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

struct InfoArgs {
  bool json = false;
};

Status info(const InfoArgs& a, std::ostream& out) {
  const CpuInfo f = cpu_info();  // (asks Linux for AMX tile data when the CPU and OS have AMX)
  const std::string best = best_isa(), active = active_isa();
  const char* isa_env = std::getenv("ATTN_ISA");
  const int threads = resolve_threads(0);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  std::string levels;
  for (const std::string& l : isa_levels()) levels += (levels.empty() ? "" : " < ") + l;

  if (a.json) {
    JsonObject cpu_flags;
    for (const auto& [name, has] : f.cpuid) cpu_flags.add(name, has);
    JsonObject o;
    o.add("vendor", f.vendor).add("brand", f.brand);
    o.add("family", f.family).add("model", f.model).add("stepping", f.stepping);
    o.add("microarchitecture", f.microarchitecture).add("cpu", describe_cpu(f)).add("cpuid", cpu_flags);
    o.add("osxsave", f.osxsave).add("xcr0", hex(f.xcr0));
    o.add("os_avx", f.os_avx).add("os_avx512", f.os_avx512).add("os_amx", f.os_amx);
    o.add("amx_kernel_supports", f.amx_offered).add("amx_permitted_before_request", f.amx_permitted_before);
    if (f.amx_granted) o.add("amx_request_ok", *f.amx_granted);
    else o.add_null("amx_request_ok");
    o.add("l1d_bytes", f.l1d_bytes).add("l2_bytes", f.l2_bytes).add("l3_bytes", f.l3_bytes);
    o.add("best_isa", best).add("active_isa", active);
    if (isa_env) o.add("ATTN_ISA", isa_env);
    else o.add_null("ATTN_ISA");
    o.add("threads", threads)
        .add("omp_max_threads", omp_get_max_threads())
        .add("online_cpus", static_cast<int>(online));
    out << o.str() << "\n";
    return Status::Ok();
  }

  out << "CPU: " << (f.brand.empty() ? "(no brand string)" : f.brand) << " [" << f.vendor << "]\n";
  out << "  signature: family " << hex(f.family) << " model " << hex(f.model) << " stepping " << f.stepping << ": "
      << (f.microarchitecture.empty() ? "a microarchitecture attn's table does not name" : f.microarchitecture)
      << "\n";
  out << "  caches: L1d " << size_text(f.l1d_bytes) << ", L2 " << size_text(f.l2_bytes) << ", L3 "
      << size_text(f.l3_bytes) << "\n";
  std::string has, lacks;
  for (const auto& [name, present] : f.cpuid) (present ? has : lacks) += " " + name;
  out << "  CPUID has:  " << (has.empty() ? " (none)" : has) << "\n";
  out << "  CPUID lacks:" << (lacks.empty() ? " (none)" : lacks) << "\n";

  out << "\nOS support (XCR0 = " << (f.osxsave ? hex(f.xcr0) : std::string("unreadable: OSXSAVE off")) << "):\n";
  out << "  AVX state (XMM, YMM; bits 1-2):              " << (f.os_avx ? "enabled" : "not enabled") << "\n";
  out << "  AVX-512 state (opmask, ZMM; bits 5-7):       " << (f.os_avx512 ? "enabled" : "not enabled") << "\n";
  out << "  AMX state (XTILECFG, XTILEDATA; bits 17-18): " << (f.os_amx ? "enabled" : "not enabled") << "\n";
  out << "  AMX tile data for this process (Linux arch_prctl): ";
  if (!f.amx_offered) {
    out << "the kernel does not offer it (ARCH_GET_XCOMP_SUPP)\n";
  } else {
    out << (f.amx_permitted_before ? "already permitted" : "not permitted until requested");
    if (f.amx_granted)
      out << "; ARCH_REQ_XCOMP_PERM(XTILEDATA = 18) "
          << (*f.amx_granted ? "granted" : std::string("refused: ") + std::strerror(f.amx_error));
    out << "\n";
  }

  out << "\nattn kernels:\n";
  out << "  best level for this CPU and OS: " << best << "   (levels: " << levels << ")\n";
  out << "  level in use:                   " << active;
  if (isa_env) out << "   (ATTN_ISA=" << isa_env << "; it can only lower the level; an unknown value is reported and ignored)\n";
  else out << "   (set ATTN_ISA=<level> to force a lower level; scalar = sse2)\n";
  out << "  threads per call:               " << threads
      << "   (ATTN_NUM_THREADS=" << env_or("ATTN_NUM_THREADS", "unset") << ", OpenMP default " << omp_get_max_threads()
      << ", " << online << " CPUs online; Params::threads or "
      << "--threads overrides)\n";
  return Status::Ok();
}

}  // namespace

void add_info_command(CLI::App& app, std::ostream& out) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* sub =
      app.add_subcommand("info",
                         "What the CPU has (CPUID), what the OS allows (XCR0, AMX permission), the kernel level attn "
                         "chose and its thread count");
  sub->add_flag("--json", args->json, "Print one JSON object instead of text");
  on_run(sub, [args, &out] { return info(*args, out); });
}

}  // namespace attn::tools
