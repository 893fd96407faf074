// CPU feature detection with cpuid and xgetbv (see cpu_features.h).
#include "cpu/cpu_features.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

std::uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));  // the xgetbv intrinsic would need -mxsave
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}
#endif

bool bit(unsigned word, int n) { return (word >> n) & 1u; }

// "48K", "2048K", "480M" as sysfs writes them.
std::int64_t sysfs_cache_bytes(int index) {
  std::ifstream level_file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
  std::string text;
  if (!(level_file >> text) || text.empty()) return 0;
  std::int64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) value = value * 10 + (text[i] - '0');
  if (i < text.size()) {
    if (text[i] == 'K') value <<= 10;
    else if (text[i] == 'M') value <<= 20;
    else if (text[i] == 'G') value <<= 30;
  }
  return value;
}

std::string sysfs_cache_field(int index, const char* field) {
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/" + field);
  std::string text;
  f >> text;
  return text;
}

void detect_caches(CpuFeatures* f) {
#if defined(_SC_LEVEL1_DCACHE_SIZE)
  f->l1d_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  f->l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  f->l3_bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  if (f->l1d_bytes <= 0 || f->l2_bytes <= 0 || f->l3_bytes <= 0) {
    // glibc's sysconf knows only some CPUs; sysfs describes every cache the kernel found.
    for (int index = 0; index < 8; ++index) {
      const std::string level = sysfs_cache_field(index, "level"), type = sysfs_cache_field(index, "type");
      if (level.empty()) break;
      const std::int64_t bytes = sysfs_cache_bytes(index);
      if (level == "1" && type == "Data" && f->l1d_bytes <= 0) f->l1d_bytes = bytes;
      if (level == "2" && f->l2_bytes <= 0) f->l2_bytes = bytes;
      if (level == "3" && f->l3_bytes <= 0) f->l3_bytes = bytes;
    }
  }
  if (f->l1d_bytes < 0) f->l1d_bytes = 0;
  if (f->l2_bytes < 0) f->l2_bytes = 0;
  if (f->l3_bytes < 0) f->l3_bytes = 0;
}

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  const Regs leaf0 = cpuid(0);
  const unsigned max_leaf = leaf0.a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &leaf0.b, 4);
  std::memcpy(vendor + 4, &leaf0.d, 4);
  std::memcpy(vendor + 8, &leaf0.c, 4);
  f.vendor = vendor;

  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    std::string b = brand;
    const auto first = b.find_first_not_of(' ');
    const auto last = b.find_last_not_of(' ');
    f.brand = first == std::string::npos ? "" : b.substr(first, last - first + 1);
  }

  if (max_leaf >= 1) {
    const Regs r = cpuid(1);
    // Display family = base + extended when base is 0xF; display model = extended << 4 | base when the base
    // family is 0x6 or 0xF (the rule both vendors' manuals give).
    const int base_family = (r.a >> 8) & 0xF, base_model = (r.a >> 4) & 0xF;
    f.family = base_family == 0xF ? base_family + static_cast<int>((r.a >> 20) & 0xFF) : base_family;
    f.model = base_family == 0x6 || base_family == 0xF ? static_cast<int>((r.a >> 16) & 0xF) << 4 | base_model
                                                       : base_model;
    f.stepping = static_cast<int>(r.a & 0xF);
    f.sse2 = bit(r.d, 26);
    f.fma = bit(r.c, 12);
    f.osxsave = bit(r.c, 27);
    f.avx = bit(r.c, 28);
    f.f16c = bit(r.c, 29);
  }
  if (max_leaf >= 7) {
    const Regs r = cpuid(7, 0);
    f.avx2 = bit(r.b, 5);
    f.avx512f = bit(r.b, 16);
    f.avx512dq = bit(r.b, 17);
    f.avx512bw = bit(r.b, 30);
    f.avx512vl = bit(r.b, 31);
    f.amx_bf16 = bit(r.d, 22);
    f.avx512_fp16 = bit(r.d, 23);
    f.amx_tile = bit(r.d, 24);
    f.amx_int8 = bit(r.d, 25);
    if (r.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5);
  }
  if (f.osxsave) {
    f.xcr0 = xgetbv0();
    f.os_avx = (f.xcr0 & 0x6) == 0x6;
    f.os_avx512 = f.os_avx && (f.xcr0 & 0xe0) == 0xe0;
    f.os_amx = (f.xcr0 & 0x60000) == 0x60000;
  }
#endif
  detect_caches(&f);
  return f;
}

#if defined(__linux__) && defined(__x86_64__)
constexpr int kArchGetXcompSupp = 0x1021;
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;
#endif

}  // namespace

std::string microarchitecture(const std::string& vendor, int family, int model, int stepping) {
  const auto in = [model](int lo, int hi) { return model >= lo && model <= hi; };
  if (vendor == "AuthenticAMD") {
    if (family == 0x17) {
      if (in(0x30, 0x4F) || in(0x60, 0x7F) || in(0x90, 0xAF)) return "Zen 2";
      return model == 0x08 || model == 0x18 ? "Zen+" : "Zen";
    }
    if (family == 0x19) return in(0x10, 0x1F) || in(0x60, 0x7F) || in(0xA0, 0xAF) ? "Zen 4" : "Zen 3";
    if (family == 0x1A && (in(0x00, 0x4F) || in(0x60, 0x7F))) return "Zen 5";
    return "";
  }
  if (vendor != "GenuineIntel" || family != 6) return "";
  switch (model) {
    case 0x55:  // one model number, three generations told apart by the stepping
      return stepping >= 10 ? "Cooper Lake" : stepping >= 5 ? "Cascade Lake" : "Skylake-SP";
    case 0x6A: case 0x6C: return "Ice Lake-SP";
    case 0x7D: case 0x7E: return "Ice Lake";
    case 0x8C: case 0x8D: return "Tiger Lake";
    case 0x8F: return "Sapphire Rapids";
    case 0xCF: return "Emerald Rapids";
    case 0xAD: case 0xAE: return "Granite Rapids";
    case 0xAF: return "Sierra Forest";
    case 0x97: case 0x9A: return "Alder Lake";
    case 0xB7: case 0xBA: case 0xBF: return "Raptor Lake";
    case 0xAA: case 0xAC: return "Meteor Lake";
    case 0xC5: case 0xC6: return "Arrow Lake";
    case 0xBD: return "Lunar Lake";
    case 0x4E: case 0x5E: case 0x8E: case 0x9E: case 0xA5: case 0xA6: return "Skylake-derived (client)";
    case 0x3F: return "Haswell-EP";
    case 0x4F: return "Broadwell-EP";
    default: return "";
  }
}

std::int64_t CpuFeatures::last_level_cache_bytes() const {
  return l3_bytes > 0 ? l3_bytes : l2_bytes > 0 ? l2_bytes : l1d_bytes;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

AmxPermission amx_permission() {
  AmxPermission p;
#if defined(__linux__) && defined(__x86_64__)
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompSupp, &mask) == 0) p.kernel_supports = (mask >> kXfeatureXtiledata) & 1;
  mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) == 0) p.permitted = (mask >> kXfeatureXtiledata) & 1;
#endif
  return p;
}

AmxRequest request_amx() {
  static const AmxRequest answer = [] {
    AmxRequest r;
#if defined(__linux__) && defined(__x86_64__)
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) r.ok = true;
    else r.error = errno;
#else
    r.error = ENOSYS;
#endif
    return r;
  }();
  return answer;
}

}  // namespace attn::cpu
