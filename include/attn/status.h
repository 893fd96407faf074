// attn: error reporting. Every entry point returns a Status; nothing throws across the API.
#pragma once

#include <string>
#include <utility>

namespace attn {

enum class StatusCode { ok, invalid_argument, unsupported, out_of_memory };

class Status {
 public:
  Status() = default;
  static Status Ok() { return {}; }
  // `param` names the offending argument; `message` says what was found and what was expected.
  static Status Invalid(const std::string& param, const std::string& message) {
    return Status(StatusCode::invalid_argument, param, param + ": " + message);
  }
  static Status Unsupported(const std::string& param, const std::string& message) {
    return Status(StatusCode::unsupported, param, param + ": " + message);
  }
  // A call that is valid but needs more memory than could be allocated (nothing was written).
  static Status OutOfMemory(const std::string& param, const std::string& message) {
    return Status(StatusCode::out_of_memory, param, param + ": " + message);
  }

  bool ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  // The whole message, "<param>: <what was found>; expected <what>".
  const std::string& message() const { return message_; }
  // The name of the offending parameter alone (empty when ok).
  const std::string& param() const { return param_; }

 private:
  Status(StatusCode code, std::string param, std::string message)
      : code_(code), param_(std::move(param)), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::ok;
  std::string param_;
  std::string message_;
};

}  // namespace attn
