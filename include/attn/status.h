// attn: error reporting. Every entry point returns a Status; nothing throws across the API.
#pragma once

#include <string>
#include <utility>

namespace attn {

enum class StatusCode { ok, invalid_argument, unsupported };

class Status {
 public:
  Status() = default;
  static Status Ok() { return {}; }
  // `param` names the offending argument; `message` says what was found and what was expected.
  static Status Invalid(const std::string& param, const std::string& message) {
    return Status(StatusCode::invalid_argument, param + ": " + message);
  }
  static Status Unsupported(const std::string& param, const std::string& message) {
    return Status(StatusCode::unsupported, param + ": " + message);
  }

  bool ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

}  // namespace attn
