// attn tools: a minimal writer for one-line JSON objects (what `attn info --json` and `attn bench --json`
// print). Keys keep the order they were added in; non-finite numbers become null.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace attn::tools {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value) { return raw(key, quote(value)); }
  JsonObject& add(const std::string& key, const char* value) { return raw(key, quote(value)); }
  JsonObject& add(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonObject& add(const std::string& key, int value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, std::int64_t value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, double value) { return raw(key, number(value)); }
  JsonObject& add_null(const std::string& key) { return raw(key, "null"); }
  JsonObject& add(const std::string& key, const std::vector<double>& values) {
    std::string s = "[";
    for (std::size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + number(values[i]);
    return raw(key, s + "]");
  }
  JsonObject& add(const std::string& key, const std::vector<std::int64_t>& values) {
    std::string s = "[";
    for (std::size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + std::to_string(values[i]);
    return raw(key, s + "]");
  }
  JsonObject& add(const std::string& key, const JsonObject& object) { return raw(key, object.str()); }
  // `json` must already be valid JSON text.
  JsonObject& raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + quote(key) + ":" + json;
    return *this;
  }

  std::string str() const { return "{" + body_ + "}"; }

  static std::string number(double x) {
    if (!std::isfinite(x)) return "null";
    char buf[40];
    // Whole numbers below 2^53 (counts: flops, bytes, tokens) exactly; others to 9 significant digits.
    if (std::fabs(x) < 0x1p53 && x == std::floor(x)) std::snprintf(buf, sizeof buf, "%.0f", x);
    else std::snprintf(buf, sizeof buf, "%.9g", x);
    return buf;
  }

  static std::string quote(const std::string& text) {
    std::string s = "\"";
    for (const char c : text) {
      switch (c) {
        case '"': s += "\\\""; break;
        case '\\': s += "\\\\"; break;
        case '\n': s += "\\n"; break;
        case '\t': s += "\\t"; break;
        case '\r': s += "\\r"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
            s += buf;
          } else {
            s += c;
          }
      }
    }
    return s + "\"";
  }

 private:
  std::string body_;
};

}  // namespace attn::tools
