// Shape and size arithmetic is checked (issue 19): a shape whose element count, byte count or
// padded layout does not fit in 64 bits is a clear error naming the shape, never a wrapped size
// that allocates a tiny buffer; and an empty tensor costs nothing however many rows it has.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>
#include <string>

#include "qrecipe/engine.hpp"
#include "qrecipe/plugin_sdk.hpp"

using namespace qrecipe;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a qrecipe::Error, nothing was thrown");
  return "";
}

#define CHECK_OVERFLOW(expr)                                              \
  do {                                                                    \
    const std::string message_ = error_of([&] { (void)(expr); });         \
    CHECK_MESSAGE(contains(message_, "overflow"), message_);              \
  } while (0)

std::shared_ptr<Registry> registry() {
  static auto instance = std::make_shared<Registry>();
  return instance;
}

}  // namespace

TEST_CASE("views and byte counts: products that do not fit in 64 bits are errors") {
  CHECK_OVERFLOW(TensorView(nullptr, DType::f32, {std::int64_t{1} << 32, std::int64_t{1} << 32}));
  CHECK_OVERFLOW(TensorView(nullptr, DType::f32, {kMax, 2}));
  CHECK_OVERFLOW(storage_bytes(DType::f32, std::int64_t{1} << 62, 1));  // 2^62 * 4 bytes
  CHECK_OVERFLOW(storage_bytes(DType::u8, kMax, 2));
  CHECK_OVERFLOW(storage_bytes(DType::e2m1, 2, kMax));  // (cols + 1) / 2 must not wrap
  // In range: exact.
  CHECK(storage_bytes(DType::e2m1, 3, 5) == 9);
  CHECK(storage_bytes(DType::f32, std::int64_t{1} << 40, 2) == (std::int64_t{1} << 43));
  CHECK(TensorView(nullptr, DType::f32, {std::int64_t{1} << 40, 0}).numel() == 0);
}

TEST_CASE("the plugin SDK's ceil_div and round_up refuse to wrap") {
  CHECK(sdk::ceil_div(10, 4) == 3);
  CHECK(sdk::round_up(10, 4) == 12);
  CHECK(sdk::ceil_div(0, 128) == 0);
  CHECK(sdk::ceil_div(kMax, 128) == kMax / 128 + 1);  // (a + b - 1) / b would wrap here
  CHECK_OVERFLOW(sdk::round_up(kMax - 3, 128));
  CHECK(contains(error_of([] { sdk::ceil_div(5, 0); }), "divisor"));
}

TEST_CASE("every format's layout of a huge shape is an error, not a wrapped size") {
  Engine engine(Recipe::uniform(QuantizerSpec{}), registry());
  for (const char* format : {"float8", "mxfp8", "nvfp4", "blockwise"}) {
    if (!registry()->find(format)) continue;
    const std::string name = format;
    CAPTURE(name);
    QuantizerSpec spec;
    spec.format = format;
    const auto q = engine.make_quantizer(spec, {"linear", "input", "x"});
    for (const auto dir : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
      CAPTURE(dir);
      // rows x cols itself overflows: the engine refuses before the plugin computes anything.
      CHECK_OVERFLOW(q->layout(std::int64_t{1} << 32, std::int64_t{1} << 32, dir));
      // rows x cols fits, the padded scale grid of a block format may not: then an overflow
      // error; otherwise every reported buffer size is exact (non-negative, its bytes count).
      for (const auto& shape : {std::pair<std::int64_t, std::int64_t>{kMax, 1},
                                std::pair<std::int64_t, std::int64_t>{1, kMax},
                                std::pair<std::int64_t, std::int64_t>{kMax / 130, 129}}) {
        const std::int64_t rows = shape.first, cols = shape.second;
        CAPTURE(rows);
        CAPTURE(cols);
        try {
          const qr_direction_layout l = q->layout(rows, cols, dir);
          for (int i = 0; i < l.data_ndim; ++i) CHECK(l.data_shape[i] >= 0);
          for (int i = 0; i < l.scale_ndim; ++i) CHECK(l.scale_shape[i] >= 0);
          const auto data_dtype = static_cast<DType>(l.data_dtype);
          const std::int64_t data_rows = l.data_ndim == 2 ? l.data_shape[0] : 1;
          CHECK(storage_bytes(data_dtype, data_rows, l.data_shape[l.data_ndim - 1]) >=
                (dtype_bits(data_dtype) == 4 ? 0 : rows));
        } catch (const Error& e) {
          CHECK_MESSAGE(contains(e.what(), "overflow"), e.what());
        }
      }
    }
  }
}

TEST_CASE("plan_linear with 2^63-1 tokens is an error naming the shape") {
  if (!registry()->find("mxfp8")) return;
  QuantizerSpec spec;
  spec.format = "mxfp8";
  Engine engine(Recipe::uniform(spec), registry());
  const std::string message = error_of(
      [&] { engine.plan_linear("linear", "fc", 4096, 4096, kMax, GemmTarget::sm90); });
  CHECK_MESSAGE(contains(message, "overflow"), message);
  CHECK_MESSAGE(contains(message, "9223372036854775807"), message);
}

TEST_CASE("an empty tensor with 2^40 rows quantizes and decodes at once, in every format") {
  for (const char* format : {"float8", "mxfp8", "nvfp4", "blockwise"}) {
    if (!registry()->find(format)) continue;
    const std::string name = format;
    CAPTURE(name);
    QuantizerSpec spec;
    spec.format = format;
    Engine engine(Recipe::uniform(spec), registry());
    const auto q = engine.make_quantizer(spec, {"linear", "input", "x"});
    // No data: work must not grow with the row count (the old loops ran 2^40 empty rows).
    float dummy = 0;
    for (const std::vector<std::int64_t>& shape :
         {std::vector<std::int64_t>{std::int64_t{1} << 40, 0},
          std::vector<std::int64_t>{1 << 20, 1 << 20, 0}, std::vector<std::int64_t>{0, 1 << 30}}) {
      const TensorView x(&dummy, DType::f32, shape);
      const QuantizedTensor t = q->quantize(x, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE);
      CHECK(t.rows() == x.rows());
      CHECK(t.cols() == x.cols());
      const auto amax = q->compute_amax(x);
      CHECK(amax[0] == 0.0f);
      float out = 0;
      q->dequantize(t, QR_DIRECTION_ROWWISE, TensorView(&out, DType::f32, {x.rows(), x.cols()}));
    }
  }
}
