// Errors inside the engine and inside plugins are exceptions carrying file:line and function;
// at the plugin boundary they become qr_status values (plugin_sdk.hpp, plugin_handle.cpp).
//
// QR_CHECK(cond, parts...) throws qrecipe::Error when cond is false. Messages should say what
// went wrong, where, what was expected and what was got, and what to do next.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
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

// User text (a recipe value, a file name, a plugin's string) made safe to put in a message:
// control bytes and bytes that are not UTF-8 are escaped (NUL as \0, newline as \n, others as
// \xNN), so a message never stops at a NUL (what() is a C string), never breaks a line and is
// always valid UTF-8 (Python decodes it). Text longer than `max_bytes` is cut at a character
// boundary and ends with "... (N bytes)". No quotes are added.
inline std::string printable(std::string_view text, std::size_t max_bytes = 200) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    if (out.size() >= max_bytes) {
      out += "... (" + std::to_string(text.size()) + " bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence of 2 to 4 bytes (no overlongs, no surrogates) is kept.
    std::size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                    : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (n > 0 && i + n <= text.size()) {
      bool ok = true;
      for (std::size_t k = 1; k < n; ++k)
        ok = ok && (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
      const auto c1 = static_cast<unsigned char>(text[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) ||
          (c == 0xf4 && c1 > 0x8f))
        ok = false;
      if (ok) {
        out.append(text.substr(i, n));
        i += n;
        continue;
      }
    }
    switch (c) {
      case 0: out += "\\0"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 15];
    }
    ++i;
  }
  return out;
}

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
