// Errors inside the engine and inside plugins are exceptions carrying file:line and function;
// at the plugin boundary they become qr_status values (plugin_sdk.hpp, plugin_handle.cpp).
//
// QR_CHECK(cond, parts...) throws qrecipe::Error when cond is false. Messages should say what
// went wrong, where, what was expected and what was got, and what to do next.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "qrecipe/plugin_abi.h"

namespace qrecipe {

class Error : public std::runtime_error {
 public:
  Error(qr_status_code code, std::string where, const std::string& message)
      : std::runtime_error(where.empty() ? message : where + ": " + message),
        code_(code), where_(std::move(where)), message_(message) {}
  qr_status_code code() const noexcept { return code_; }
  const std::string& where() const noexcept { return where_; }
  const std::string& message() const noexcept { return message_; }

 private:
  qr_status_code code_;
  std::string where_;
  std::string message_;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}
inline std::string where(const char* file, int line, const char* function) {
  std::string f(file);
  const auto slash = f.find_last_of('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(line) + " (" + function + ")";
}
}  // namespace detail

}  // namespace qrecipe

#define QR_WHERE() ::qrecipe::detail::where(__FILE__, __LINE__, __func__)

#define QR_THROW_CODE(code, ...) \
  throw ::qrecipe::Error((code), QR_WHERE(), ::qrecipe::detail::concat(__VA_ARGS__))

#define QR_THROW(...) QR_THROW_CODE(QR_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

#define QR_CHECK(cond, ...)                                                      \
  do {                                                                           \
    if (!(cond)) QR_THROW_CODE(QR_STATUS_INVALID_ARGUMENT, __VA_ARGS__);         \
  } while (0)

#define QR_CHECK_CODE(cond, code, ...)                                           \
  do {                                                                           \
    if (!(cond)) QR_THROW_CODE((code), __VA_ARGS__);                             \
  } while (0)
