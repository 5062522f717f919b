// Engine internals never leave libqrecipe. Its version script (cmake/libqrecipe.version)
// exports qrecipe::*, and in a version script a global wildcard wins over a local one, so the
// internal declarations inside qrecipe:: (every header under engine/src) are hidden at compile
// time instead: each internal header wraps its declarations in
//   QR_INTERNAL_BEGIN ... QR_INTERNAL_END
// A class first declared in a public header (a forward declaration) keeps that declaration's
// visibility; its definition here then says QR_INTERNAL explicitly.
// tests/check_library_exports.sh fails if an internal symbol is exported.
#pragma once

#define QR_INTERNAL_BEGIN _Pragma("GCC visibility push(hidden)")
#define QR_INTERNAL_END _Pragma("GCC visibility pop")
#define QR_INTERNAL __attribute__((visibility("hidden")))
