// Tests of the header-only value types: dtype.hpp, tensor.hpp (TensorView, Buffer, Tensor,
// CpuAllocator) and quantized_tensor.hpp (QuantizedTensor built from hand-made layouts).
//
// Allocation is observed through RecordingAllocator, which fills fresh memory with 0xAB (so a
// missing zero-fill shows), records every size, and checks each block is returned exactly once
// with the size it was allocated with.
#include <doctest/doctest.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qrecipe/conversions.hpp"
#include "qrecipe/dtype.hpp"
#include "qrecipe/quantized_tensor.hpp"
#include "qrecipe/tensor.hpp"

namespace {

using namespace qrecipe;
using Shape = std::vector<std::int64_t>;

// ------------------------------------------------------------------ helpers

class RecordingAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device) override {
    QR_CHECK(device.is_cpu(), "RecordingAllocator is host-only");
    void* p = ::operator new(bytes == 0 ? 1 : bytes);
    std::memset(p, 0xAB, bytes);
    live_[p] = bytes;
    sizes.push_back(bytes);
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes, Device) noexcept override {
    auto it = live_.find(ptr);
    if (it == live_.end() || it->second != bytes) ++bad_frees;
    if (it != live_.end()) live_.erase(it);
    ++frees;
    ::operator delete(ptr);
  }
  void zero(void* ptr, std::size_t bytes, Device) override {
    ++zero_calls;
    if (bytes) std::memset(ptr, 0, bytes);
  }
  std::size_t live() const { return live_.size(); }

  std::vector<std::size_t> sizes;  // every allocation, in order
  int frees = 0, bad_frees = 0, zero_calls = 0;

 private:
  std::map<void*, std::size_t> live_;
};

bool all_zero(const void* p, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i)
    if (b[i] != 0) return false;
  return true;
}

// The message of the qrecipe::Error thrown by f (fails the test if none is thrown).
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == QR_STATUS_INVALID_ARGUMENT);
    return e.message();
  }
  FAIL("expected a qrecipe::Error");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ------------------------------------------------------------------ dtype.hpp

TEST_CASE("dtype names round-trip and match the C enum") {
  const std::pair<DType, const char*> all[] = {
      {DType::f32, "f32"},   {DType::bf16, "bf16"}, {DType::f16, "f16"},
      {DType::e4m3, "e4m3"}, {DType::e5m2, "e5m2"}, {DType::e2m1, "e2m1"},
      {DType::e8m0, "e8m0"}, {DType::u8, "u8"},     {DType::f64, "f64"},
  };
  for (const auto& [t, name] : all) {
    CHECK(dtype_name(t) == name);
    CHECK(dtype_from_name(name) == t);
    CHECK(dtype_from_name(dtype_name(t)) == t);
  }
  CHECK(static_cast<int>(DType::e2m1) == QR_DTYPE_E2M1);
  CHECK(static_cast<int>(DType::f64) == QR_DTYPE_F64);
}

TEST_CASE("dtype_from_name rejects unknown names and lists the known ones") {
  const std::string msg = error_message([] { dtype_from_name("fp8"); });
  CHECK(msg == "unknown dtype 'fp8'; expected one of: f32, bf16, f16, e4m3, e5m2, e2m1, e8m0, u8, f64");
  CHECK(contains(error_message([] { dtype_from_name("E4M3"); }), "'E4M3'"));  // case matters
  CHECK(contains(error_message([] { dtype_from_name(""); }), "unknown dtype ''"));
  CHECK(error_message([] { dtype_name(static_cast<DType>(42)); }) ==
        "unknown dtype code 42; expected one of 0..8");
}

TEST_CASE("dtype bits and max agree with the conversions") {
  CHECK(dtype_bits(DType::f32) == 32);
  CHECK(dtype_bits(DType::bf16) == 16);
  CHECK(dtype_bits(DType::f16) == 16);
  CHECK(dtype_bits(DType::e4m3) == 8);
  CHECK(dtype_bits(DType::e5m2) == 8);
  CHECK(dtype_bits(DType::e2m1) == 4);
  CHECK(dtype_bits(DType::e8m0) == 8);
  CHECK(dtype_bits(DType::u8) == 8);
  CHECK(dtype_bits(DType::f64) == 64);
  // The largest finite value of each format, decoded from its largest finite code.
  CHECK(dtype_max(DType::f32) == static_cast<double>(FLT_MAX));
  CHECK(dtype_max(DType::bf16) == static_cast<double>(num::bf16_to_f32(0x7F7F)));
  CHECK(dtype_max(DType::f16) == static_cast<double>(num::f16_to_f32(0x7BFF)));
  CHECK(dtype_max(DType::e4m3) == static_cast<double>(num::e4m3_to_f32(0x7E)));
  CHECK(dtype_max(DType::e5m2) == static_cast<double>(num::e5m2_to_f32(0x7B)));
  CHECK(dtype_max(DType::e2m1) == static_cast<double>(num::e2m1_to_f32(0x7)));
  CHECK(dtype_max(DType::e8m0) == static_cast<double>(num::e8m0_to_f32(0xFE)));
  CHECK(dtype_max(DType::u8) == 0.0);
  CHECK(dtype_max(DType::f64) == DBL_MAX);
}

TEST_CASE("storage_bytes") {
  CHECK(storage_bytes(DType::f32, 3, 5) == 60);
  CHECK(storage_bytes(DType::f64, 3, 5) == 120);
  CHECK(storage_bytes(DType::bf16, 3, 5) == 30);
  CHECK(storage_bytes(DType::f16, 3, 5) == 30);
  CHECK(storage_bytes(DType::e4m3, 3, 5) == 15);
  CHECK(storage_bytes(DType::e5m2, 3, 5) == 15);
  CHECK(storage_bytes(DType::e8m0, 3, 5) == 15);
  CHECK(storage_bytes(DType::u8, 3, 5) == 15);
  // E2M1: two per byte, each row padded to a whole byte: 5 cols -> 3 bytes per row.
  CHECK(storage_bytes(DType::e2m1, 3, 5) == 9);
  CHECK(storage_bytes(DType::e2m1, 3, 4) == 6);
  CHECK(storage_bytes(DType::e2m1, 1, 1) == 1);
  CHECK(storage_bytes(DType::e2m1, 7, 1) == 7);
  CHECK(storage_bytes(DType::e2m1, 0, 5) == 0);
  CHECK(storage_bytes(DType::e2m1, 5, 0) == 0);
  CHECK(storage_bytes(DType::f32, 0, 5) == 0);
}

// ------------------------------------------------------------------ TensorView

TEST_CASE("TensorView: contiguous shapes, strides, rows, cols, numel, nbytes") {
  float dummy = 0;
  SUBCASE("3-D") {
    TensorView v(&dummy, DType::bf16, {2, 3, 4});
    CHECK(v.ndim() == 3);
    CHECK(v.shape() == Shape{2, 3, 4});
    CHECK(v.stride(0) == 12);
    CHECK(v.stride(1) == 4);
    CHECK(v.stride(2) == 1);
    CHECK(v.stride(-1) == 1);
    CHECK(v.size(-1) == 4);
    CHECK(v.size(-3) == 2);
    CHECK(v.numel() == 24);
    CHECK(v.rows() == 6);
    CHECK(v.cols() == 4);
    CHECK(v.nbytes() == 48);
    CHECK(v.is_contiguous());
    CHECK_FALSE(v.empty());
    CHECK(v.data() == &dummy);
    CHECK(v.data_as<float>() == &dummy);
    CHECK(v.dtype() == DType::bf16);
    CHECK(v.device() == Device::cpu());
    CHECK(v.str() == "bf16[2, 3, 4] on cpu");
    CHECK(v.c().struct_size == sizeof(qr_tensor_view));
    CHECK(v.c().dtype == QR_DTYPE_BF16);
  }
  SUBCASE("0-D is a single element, [1, 1]") {
    TensorView v(&dummy, DType::f32, Shape{});
    CHECK(v.ndim() == 0);
    CHECK(v.shape().empty());
    CHECK(v.numel() == 1);
    CHECK(v.rows() == 1);
    CHECK(v.cols() == 1);
    CHECK(v.nbytes() == 4);
    CHECK(v.is_contiguous());
    CHECK(v.str() == "f32[] on cpu");
  }
  SUBCASE("1-D [n] is [1, n]") {
    TensorView v(&dummy, DType::f16, {7});
    CHECK(v.numel() == 7);
    CHECK(v.rows() == 1);
    CHECK(v.cols() == 7);
    CHECK(v.stride(0) == 1);
    CHECK(v.nbytes() == 14);
  }
  SUBCASE("empty") {
    TensorView v(nullptr, DType::f32, {4, 0, 3});
    CHECK(v.numel() == 0);
    CHECK(v.empty());
    CHECK(v.rows() == 0);
    CHECK(v.nbytes() == 0);
    CHECK(v.stride(0) == 0);  // 0 * 3
    CHECK(v.stride(1) == 3);
  }
  SUBCASE("e2m1 packs two per byte, odd rows padded") {
    TensorView odd(nullptr, DType::e2m1, {3, 5});
    CHECK(odd.nbytes() == 9);  // 3 rows x ceil(5 / 2)
    CHECK(odd.numel() == 15);
    CHECK(odd.stride(0) == 5);  // strides count elements (nibbles), not bytes
    TensorView even(nullptr, DType::e2m1, {2, 3, 8});
    CHECK(even.nbytes() == 24);  // 6 rows x 4 bytes
    TensorView one(nullptr, DType::e2m1, {1});
    CHECK(one.nbytes() == 1);
    TensorView scalar(nullptr, DType::e2m1, Shape{});
    CHECK(scalar.nbytes() == 1);
  }
  SUBCASE("device") {
    TensorView v(nullptr, DType::e4m3, {2, 2}, Device::cuda(1));
    CHECK(v.device().is_cuda());
    CHECK(v.device().index == 1);
    CHECK(v.str() == "e4m3[2, 2] on cuda:1");
    CHECK(Device::from_c(v.c().device) == Device::cuda(1));
  }
}

TEST_CASE("TensorView: non-contiguous strides") {
  TensorView v(nullptr, DType::f32, {3, 4});
  // Transposed view of a [4, 3] tensor.
  v.c().strides[0] = 1;
  v.c().strides[1] = 3;
  CHECK_FALSE(v.is_contiguous());
  // A row slice with a padded row pitch.
  TensorView padded(nullptr, DType::f32, {3, 4});
  padded.c().strides[0] = 8;
  CHECK_FALSE(padded.is_contiguous());
  // Dimensions of size 1 may carry any stride.
  TensorView ones(nullptr, DType::f32, {1, 4, 1});
  ones.c().strides[0] = 999;
  ones.c().strides[2] = 5;
  CHECK(ones.is_contiguous());
}

TEST_CASE("TensorView: rejects too many dimensions and bad C views") {
  const std::string msg =
      error_message([] { TensorView v(nullptr, DType::f32, Shape(9, 1)); });
  CHECK(contains(msg, "tensor of 9 dimensions; at most 8 are supported"));
  TensorView eight(nullptr, DType::f32, Shape(8, 2));  // QR_MAX_DIMS itself is fine
  CHECK(eight.numel() == 256);
  CHECK(eight.stride(0) == 128);
  CHECK(contains(error_message([] { TensorView v(nullptr, DType::f32, {2, -1}); }),
                 "negative dimension -1 at index 1"));

  qr_tensor_view c{};
  c.struct_size = sizeof(qr_tensor_view) - 8;
  CHECK(contains(error_message([&] { TensorView v(c); }), "struct_size"));
  c.struct_size = sizeof(qr_tensor_view);
  c.ndim = QR_MAX_DIMS + 1;
  CHECK(contains(error_message([&] { TensorView v(c); }), "ndim 9"));
  c.ndim = -1;
  CHECK(contains(error_message([&] { TensorView v(c); }), "ndim -1"));
  c.ndim = 2;
  c.shape[0] = 2;
  c.shape[1] = 5;
  c.strides[0] = 5;
  c.strides[1] = 1;
  c.dtype = QR_DTYPE_E4M3;
  const TensorView from_c(c);
  CHECK(from_c.numel() == 10);
  CHECK(from_c.dtype() == DType::e4m3);
  CHECK(from_c.is_contiguous());
}

// ------------------------------------------------------------------ allocators, Buffer, Tensor

TEST_CASE("CpuAllocator: aligned, zeroing, host only") {
  auto cpu = cpu_allocator();
  CHECK(cpu.get() == cpu_allocator().get());  // one shared instance
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{257}, std::size_t{4096}}) {
    void* p = cpu->allocate(bytes, Device::cpu());
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % CpuAllocator::kAlignment == 0);
    std::memset(p, 0x5A, bytes);
    cpu->zero(p, bytes, Device::cpu());
    CHECK(all_zero(p, bytes));
    cpu->deallocate(p, bytes, Device::cpu());
  }
  const std::string msg = error_message([&] { cpu->allocate(16, Device::cuda(0)); });
  CHECK(contains(msg, "CpuAllocator cannot allocate on cuda:0"));
  CHECK(contains(msg, "QRECIPE_CUDA=ON"));
}

TEST_CASE("Buffer: zero-filled, move-only, returns its bytes once") {
  auto alloc = std::make_shared<RecordingAllocator>();
  {
    Buffer a(alloc, 100, Device::cpu());
    REQUIRE(a.data() != nullptr);
    CHECK(a.bytes() == 100);
    CHECK(alloc->zero_calls == 1);
    CHECK(all_zero(a.data(), 100));  // the allocator handed out 0xAB bytes
    void* const pa = a.data();

    Buffer b(std::move(a));
    CHECK(b.data() == pa);
    CHECK(b.bytes() == 100);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
    CHECK(a.bytes() == 0);
    CHECK(alloc->frees == 0);

    Buffer c(alloc, 8, Device::cpu());
    c = std::move(b);  // c's 8 bytes go back, c takes b's 100
    CHECK(alloc->frees == 1);
    CHECK(c.data() == pa);
    CHECK(c.bytes() == 100);
    CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)

    Buffer& self = c;
    c = std::move(self);  // self-move keeps the bytes
    CHECK(c.data() == pa);
    CHECK(alloc->frees == 1);

    Buffer empty;
    CHECK(empty.data() == nullptr);
    CHECK(empty.bytes() == 0);
  }
  CHECK(alloc->sizes == std::vector<std::size_t>{100, 8});
  CHECK(alloc->frees == 2);
  CHECK(alloc->bad_frees == 0);
  CHECK(alloc->live() == 0);
  CHECK(contains(error_message([] { Buffer b(nullptr, 4, Device::cpu()); }), "needs an allocator"));
}

TEST_CASE("Tensor: owns zero-filled memory of nbytes, moves keep the data") {
  auto alloc = std::make_shared<RecordingAllocator>();
  {
    Tensor t(DType::bf16, {4, 5}, Device::cpu(), alloc);
    CHECK(t.numel() == 20);
    CHECK(t.shape() == Shape{4, 5});
    CHECK(t.view().is_contiguous());
    CHECK(t.view().dtype() == DType::bf16);
    REQUIRE(t.data_as<std::uint16_t>() != nullptr);
    CHECK(all_zero(t.view().data(), 40));
    Tensor packed(DType::e2m1, {3, 5}, Device::cpu(), alloc);
    CHECK(packed.view().nbytes() == 9);
    Tensor scalar(DType::f64, Shape{}, Device::cpu(), alloc);
    CHECK(scalar.numel() == 1);
    CHECK(alloc->sizes == std::vector<std::size_t>{40, 9, 8});

    void* const data = t.view().data();
    t.data_as<std::uint16_t>()[7] = 0x3F80;
    Tensor u(std::move(t));
    CHECK(u.view().data() == data);
    CHECK(u.data_as<std::uint16_t>()[7] == 0x3F80);
    CHECK(alloc->frees == 0);
    u = std::move(packed);  // u's 40 bytes are returned
    CHECK(alloc->frees == 1);
    CHECK(u.view().nbytes() == 9);
    CHECK(u.shape() == Shape{3, 5});
  }
  CHECK(alloc->frees == 3);
  CHECK(alloc->bad_frees == 0);
  CHECK(alloc->live() == 0);
  // The default allocator is the CPU one.
  Tensor d(DType::f32, {2, 2});
  CHECK(all_zero(d.view().data(), 16));
  CHECK(reinterpret_cast<std::uintptr_t>(d.view().data()) % CpuAllocator::kAlignment == 0);
}

// ------------------------------------------------------------------ QuantizedTensor

qr_direction_layout make_layout(const char* format, DType data, Shape data_shape, bool transposed,
                                qr_scale_mode mode, DType scale, Shape scale_shape, bool amax) {
  qr_direction_layout l{};
  l.struct_size = sizeof(qr_direction_layout);
  l.format = format;
  l.data_dtype = static_cast<std::int32_t>(data);
  l.data_ndim = static_cast<std::int32_t>(data_shape.size());
  for (std::size_t i = 0; i < data_shape.size(); ++i) l.data_shape[i] = data_shape[i];
  l.data_transposed = transposed;
  l.scale_mode = mode;
  l.scale_dtype = static_cast<std::int32_t>(scale);
  l.scale_ndim = static_cast<std::int32_t>(scale_shape.size());
  for (std::size_t i = 0; i < scale_shape.size(); ++i) l.scale_shape[i] = scale_shape[i];
  l.has_amax = amax;
  return l;
}

// An NVFP4-like tensor of logical [3, 70] with both directions:
//   rowwise:    data e2m1 [3, 70]  -> 3 * 35 = 105 bytes
//               scales e4m3 [roundup(3,128), roundup(ceil(70/16),4)] = [128, 8] -> 1024 bytes
//               amax f32 -> 4 bytes
//   columnwise: data e2m1 [70, 3] (transposed) -> 70 * 2 = 140 bytes
//               scales e4m3 [roundup(70,128), roundup(ceil(3/16),4)] = [128, 4] -> 512 bytes
//               amax -> 4 bytes
std::array<qr_direction_layout, 2> nvfp4_like_layouts() {
  return {make_layout(nullptr, DType::e2m1, {3, 70}, false, QR_SCALE_BLOCK_TENSOR, DType::e4m3, {128, 8}, true),
          make_layout(nullptr, DType::e2m1, {70, 3}, true, QR_SCALE_BLOCK_TENSOR, DType::e4m3, {128, 4}, true)};
}

// One allocation per direction, [scale | amax | data] with each part on a 256-byte boundary:
//   rowwise    scale at 0 (1024 bytes), amax at 1024, data at 1280: 1280 + 105 = 1385 bytes
//   columnwise scale at 0 (512 bytes),  amax at 512,  data at 768:  768 + 140 = 908 bytes
// Scales, amax and padded data start zeroed, with one zero-fill per direction; the rowwise
// data [3, 70] holds exactly 3 x 70 codes in whole bytes, so quantize writes all of it and it
// is not filled first (one pass less on the GPU); the columnwise data [70, 3] has a padding
// nibble per row: zeroed.
TEST_CASE("QuantizedTensor: both directions allocated per layout, padding and scales zeroed") {
  auto alloc = std::make_shared<RecordingAllocator>();
  {
    QuantizedTensor q("nvfp4", 3, 70, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, nvfp4_like_layouts(),
                      Device::cpu(), alloc);
    CHECK(alloc->sizes == std::vector<std::size_t>{1385, 908});
    CHECK(alloc->zero_calls == 2);
    CHECK(q.format() == "nvfp4");
    CHECK(q.rows() == 3);
    CHECK(q.cols() == 70);
    CHECK(q.usage() == (QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE));
    CHECK(q.has(QR_DIRECTION_ROWWISE));
    CHECK(q.has(QR_DIRECTION_COLUMNWISE));
    CHECK(std::string(q.c().format) == "nvfp4");
    CHECK(q.c().struct_size == sizeof(qr_quantized_tensor));

    const TensorView rd = q.data(QR_DIRECTION_ROWWISE);
    CHECK(rd.dtype() == DType::e2m1);
    CHECK(rd.shape() == Shape{3, 70});
    CHECK(rd.nbytes() == 105);
    CHECK(rd.is_contiguous());
    CHECK(static_cast<const std::uint8_t*>(rd.data())[0] == 0xAB);  // not filled: quantize writes it
    // Every part starts on a 256-byte boundary of its direction's allocation.
    const auto* row_base = static_cast<const std::uint8_t*>(q.c().rowwise.scale_inv.data);
    CHECK(static_cast<const std::uint8_t*>(q.c().rowwise.amax.data) - row_base == 1024);
    CHECK(static_cast<const std::uint8_t*>(rd.data()) - row_base == 1280);
    const auto* col_base = static_cast<const std::uint8_t*>(q.c().columnwise.scale_inv.data);
    CHECK(static_cast<const std::uint8_t*>(q.c().columnwise.amax.data) - col_base == 512);
    CHECK(static_cast<const std::uint8_t*>(q.c().columnwise.data.data) - col_base == 768);
    const TensorView rs = q.scale_inv(QR_DIRECTION_ROWWISE);
    CHECK(rs.dtype() == DType::e4m3);
    CHECK(rs.shape() == Shape{128, 8});
    CHECK(all_zero(rs.data(), 1024));
    const TensorView cd = q.data(QR_DIRECTION_COLUMNWISE);
    CHECK(cd.shape() == Shape{70, 3});
    CHECK(cd.nbytes() == 140);
    CHECK(all_zero(cd.data(), 140));
    CHECK(q.scale_inv(QR_DIRECTION_COLUMNWISE).shape() == Shape{128, 4});
    CHECK(q.has_amax(QR_DIRECTION_ROWWISE));
    CHECK(q.has_amax(QR_DIRECTION_COLUMNWISE));
    CHECK(q.amax(QR_DIRECTION_ROWWISE) == 0.0f);
    *static_cast<float*>(q.c().columnwise.amax.data) = 2.5f;
    CHECK(q.amax(QR_DIRECTION_COLUMNWISE) == 2.5f);
    CHECK(q.amax(QR_DIRECTION_ROWWISE) == 0.0f);  // separate allocations
    // A layout without its own format name reports the tensor's.
    CHECK(std::string(q.layout(QR_DIRECTION_ROWWISE).format) == "nvfp4");
    CHECK(q.layout(QR_DIRECTION_COLUMNWISE).data_transposed == 1);
    CHECK(q.layout(QR_DIRECTION_COLUMNWISE).scale_mode == QR_SCALE_BLOCK_TENSOR);
    CHECK(q.direction(QR_DIRECTION_ROWWISE).struct_size == sizeof(qr_direction_data));
  }
  CHECK(alloc->frees == 2);
  CHECK(alloc->bad_frees == 0);
  CHECK(alloc->live() == 0);
}

TEST_CASE("QuantizedTensor: rowwise only, columnwise only, layouts without scale or amax") {
  auto alloc = std::make_shared<RecordingAllocator>();
  // MXFP8-like [3, 70]: rowwise scales [roundup(3,128), roundup(ceil(70/32),4)] = [128, 4];
  // columnwise scales [roundup(ceil(3/32),4), roundup(70,128)] = [4, 128]; no amax.
  const std::array<qr_direction_layout, 2> mx = {
      make_layout("mxfp8", DType::e4m3, {3, 70}, false, QR_SCALE_BLOCK, DType::e8m0, {128, 4}, false),
      make_layout("mxfp8", DType::e4m3, {3, 70}, false, QR_SCALE_BLOCK, DType::e8m0, {4, 128}, false)};
  SUBCASE("rowwise only") {
    QuantizedTensor q("mxfp8", 3, 70, QR_USAGE_ROWWISE, mx, Device::cpu(), alloc);
    CHECK(alloc->sizes == std::vector<std::size_t>{512 + 210});  // scales, then data
    CHECK(q.has(QR_DIRECTION_ROWWISE));
    CHECK_FALSE(q.has(QR_DIRECTION_COLUMNWISE));
    CHECK_FALSE(q.has_amax(QR_DIRECTION_ROWWISE));
    CHECK(q.scale_inv(QR_DIRECTION_ROWWISE).dtype() == DType::e8m0);
    // The missing direction's C struct is empty but well-formed.
    CHECK(q.c().columnwise.data.data == nullptr);
    CHECK(q.c().columnwise.struct_size == sizeof(qr_direction_data));
    CHECK(q.c().columnwise.data.struct_size == sizeof(qr_tensor_view));
    const std::string msg = error_message([&] { q.data(QR_DIRECTION_COLUMNWISE); });
    CHECK(msg == "quantized tensor (format 'mxfp8', 3x70) has no columnwise data; quantize with that usage");
    CHECK(contains(error_message([&] { q.scale_inv(QR_DIRECTION_COLUMNWISE); }), "no columnwise data"));
    CHECK(contains(error_message([&] { q.layout(QR_DIRECTION_COLUMNWISE); }), "no columnwise data"));
    CHECK(contains(error_message([&] { q.has_amax(QR_DIRECTION_COLUMNWISE); }), "no columnwise data"));
    CHECK(contains(error_message([&] { q.amax(QR_DIRECTION_COLUMNWISE); }), "no columnwise data"));
    CHECK(error_message([&] { q.amax(QR_DIRECTION_ROWWISE); }) ==
          "direction rowwise of format 'mxfp8' stores no amax");
  }
  SUBCASE("columnwise only") {
    QuantizedTensor q("mxfp8", 3, 70, QR_USAGE_COLUMNWISE, mx, Device::cpu(), alloc);
    CHECK(alloc->sizes == std::vector<std::size_t>{512 + 210});
    CHECK(q.scale_inv(QR_DIRECTION_COLUMNWISE).shape() == Shape{4, 128});
    CHECK(q.c().rowwise.data.data == nullptr);
    const std::string msg = error_message([&] { q.data(QR_DIRECTION_ROWWISE); });
    CHECK(contains(msg, "has no rowwise data"));
    CHECK(contains(msg, "'mxfp8'"));
  }
  SUBCASE("no scale buffer: a high-precision direction") {
    const std::array<qr_direction_layout, 2> hp = {
        make_layout("bf16_half", DType::bf16, {3, 70}, false, QR_SCALE_NONE, DType::f32, {}, false),
        qr_direction_layout{}};  // never read: columnwise is not asked for
    QuantizedTensor q("hybrid", 3, 70, QR_USAGE_ROWWISE, hp, Device::cpu(), alloc);
    CHECK(alloc->sizes == std::vector<std::size_t>{420});
    const TensorView s = q.scale_inv(QR_DIRECTION_ROWWISE);
    CHECK(s.data() == nullptr);
    CHECK(s.ndim() == 0);
    // A hybrid reports the format of each half.
    CHECK(std::string(q.layout(QR_DIRECTION_ROWWISE).format) == "bf16_half");
    CHECK(q.format() == "hybrid");
  }
  SUBCASE("per-tensor float8 with a 1-D scale and an amax") {
    const std::array<qr_direction_layout, 2> f8 = {
        make_layout(nullptr, DType::e4m3, {3, 70}, false, QR_SCALE_TENSOR, DType::f32, {1}, true),
        make_layout(nullptr, DType::e4m3, {70, 3}, true, QR_SCALE_TENSOR, DType::f32, {1}, true)};
    QuantizedTensor q("float8", 3, 70, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, f8, Device::cpu(), alloc);
    // Per direction: the scale (4 bytes), the amax at 256, the data at 512.
    CHECK(alloc->sizes == std::vector<std::size_t>{512 + 210, 512 + 210});
    CHECK(q.scale_inv(QR_DIRECTION_ROWWISE).numel() == 1);
  }
  CHECK(alloc->bad_frees == 0);
  CHECK(alloc->live() == 0);
}

TEST_CASE("QuantizedTensor: drop frees one direction's allocation and keeps the other's") {
  auto alloc = std::make_shared<RecordingAllocator>();
  QuantizedTensor q("nvfp4", 3, 70, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, nvfp4_like_layouts(),
                    Device::cpu(), alloc);
  void* const col_data = q.c().columnwise.data.data;
  q.drop(QR_DIRECTION_ROWWISE);
  CHECK(alloc->frees == 1);
  CHECK(alloc->live() == 1);
  CHECK(q.usage() == QR_USAGE_COLUMNWISE);
  CHECK(q.c().rowwise.data.data == nullptr);
  CHECK(q.c().rowwise.scale_inv.data == nullptr);
  CHECK(q.c().rowwise.amax.data == nullptr);
  CHECK(q.c().columnwise.data.data == col_data);
  CHECK(all_zero(col_data, 140));
  CHECK(contains(error_message([&] { q.drop(QR_DIRECTION_ROWWISE); }), "cannot drop the rowwise"));
  CHECK(alloc->bad_frees == 0);
}

TEST_CASE("QuantizedTensor::allocate_groups: one allocation per direction for every group") {
  auto alloc = std::make_shared<RecordingAllocator>();
  // float8-like groups of [3, 70], [0, 70] and [5, 70], both directions: per direction
  // every group's scale (4 bytes) and amax on 256-byte boundaries, then every group's data.
  const std::int64_t rows[3] = {3, 0, 5};
  std::vector<std::array<qr_direction_layout, 2>> layouts;
  for (const std::int64_t r : rows)
    layouts.push_back({make_layout(nullptr, DType::e4m3, {r, 70}, false, QR_SCALE_TENSOR, DType::f32, {1}, true),
                       make_layout(nullptr, DType::e4m3, {70, r}, true, QR_SCALE_TENSOR, DType::f32, {1}, true)});
  {
    std::vector<QuantizedTensor> groups = QuantizedTensor::allocate_groups(
        "float8", rows, 70, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, layouts, Device::cpu(), alloc);
    REQUIRE(groups.size() == 3);
    // 3 x (256 + 256) of scales and amaxes, then data 210 (padded to 256), 0, 350.
    CHECK(alloc->sizes == std::vector<std::size_t>{1536 + 256 + 350, 1536 + 256 + 350});
    CHECK(alloc->zero_calls == 2);  // the scales and amaxes of each direction, at once
    for (std::size_t g = 0; g < 3; ++g) {
      CAPTURE(g);
      const QuantizedTensor& t = groups[g];
      CHECK(t.rows() == rows[g]);
      CHECK(t.cols() == 70);
      CHECK(t.data(QR_DIRECTION_ROWWISE).shape() == Shape{rows[g], 70});
      CHECK(t.data(QR_DIRECTION_COLUMNWISE).shape() == Shape{70, rows[g]});
      CHECK(all_zero(t.c().rowwise.scale_inv.data, 4));
      CHECK(all_zero(t.c().columnwise.amax.data, 4));
      CHECK(reinterpret_cast<std::uintptr_t>(t.c().rowwise.data.data) % 256 ==
            reinterpret_cast<std::uintptr_t>(groups[0].c().rowwise.scale_inv.data) % 256);
    }
    const auto* base = static_cast<const std::uint8_t*>(groups[0].c().rowwise.scale_inv.data);
    CHECK(static_cast<const std::uint8_t*>(groups[2].c().rowwise.amax.data) - base == 1280);
    CHECK(static_cast<const std::uint8_t*>(groups[0].c().rowwise.data.data) - base == 1536);
    CHECK(static_cast<const std::uint8_t*>(groups[2].c().rowwise.data.data) - base == 1792);
    CHECK(static_cast<const std::uint8_t*>(groups[0].c().rowwise.data.data)[0] == 0xAB);  // not filled
    // A direction's allocation lives until every group has dropped it.
    groups[0].drop(QR_DIRECTION_ROWWISE);
    groups[2].drop(QR_DIRECTION_ROWWISE);
    CHECK(alloc->frees == 0);
    groups[1].drop(QR_DIRECTION_ROWWISE);
    CHECK(alloc->frees == 1);
    CHECK(alloc->live() == 1);
    QuantizedTensor moved = std::move(groups[2]);
    CHECK(moved.has(QR_DIRECTION_COLUMNWISE));
  }
  CHECK(alloc->frees == 2);
  CHECK(alloc->bad_frees == 0);
  CHECK(alloc->live() == 0);
  CHECK(contains(error_message([&] {
                   QuantizedTensor::allocate_groups("float8", rows, 70, QR_USAGE_ROWWISE,
                                                    std::span(layouts).first(2), Device::cpu(), alloc);
                 }),
                 "2 layouts for 3 groups"));
}

TEST_CASE("QuantizedTensor: moves keep views valid and free nothing") {
  auto alloc = std::make_shared<RecordingAllocator>();
  {
    QuantizedTensor a("nvfp4", 3, 70, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, nvfp4_like_layouts(),
                      Device::cpu(), alloc);
    void* const row_data = a.c().rowwise.data.data;
    void* const col_scale = a.c().columnwise.scale_inv.data;
    static_cast<std::uint8_t*>(row_data)[0] = 0x21;

    QuantizedTensor b(std::move(a));
    CHECK(alloc->frees == 0);
    CHECK(b.c().rowwise.data.data == row_data);
    CHECK(b.c().columnwise.scale_inv.data == col_scale);
    CHECK(b.data(QR_DIRECTION_ROWWISE).data_as<std::uint8_t>()[0] == 0x21);
    // The C struct's strings point into b, not into the moved-from object.
    CHECK(b.c().format == b.format().c_str());
    CHECK(std::string(b.c().format) == "nvfp4");
    CHECK(std::string(b.c().rowwise.layout.format) == "nvfp4");
    CHECK(std::string(b.c().columnwise.layout.format) == "nvfp4");
    // The moved-from tensor is empty.
    CHECK(a.usage() == 0);  // NOLINT(bugprone-use-after-move): moved-from state is specified
    CHECK_FALSE(a.has(QR_DIRECTION_ROWWISE));
    CHECK(a.c().struct_size == sizeof(qr_quantized_tensor));
    CHECK(contains(error_message([&] { a.data(QR_DIRECTION_ROWWISE); }), "no rowwise data"));

    // Move assignment over a tensor that holds buffers returns those buffers.
    const std::array<qr_direction_layout, 2> small = {
        make_layout("float8", DType::e4m3, {2, 2}, false, QR_SCALE_TENSOR, DType::f32, {1}, false),
        qr_direction_layout{}};
    QuantizedTensor c("float8", 2, 2, QR_USAGE_ROWWISE, small, Device::cpu(), alloc);
    CHECK(alloc->live() == 3);
    c = std::move(b);
    CHECK(alloc->frees == 1);  // c's one allocation (its scale and data)
    CHECK(alloc->live() == 2);
    CHECK(c.format() == "nvfp4");
    CHECK(c.c().format == c.format().c_str());
    CHECK(c.c().rowwise.data.data == row_data);
    CHECK(c.data(QR_DIRECTION_ROWWISE).data_as<std::uint8_t>()[0] == 0x21);
    CHECK(c.scale_inv(QR_DIRECTION_COLUMNWISE).data() == col_scale);
    // Back into the emptied `a`.
    a = std::move(c);
    CHECK(a.c().rowwise.data.data == row_data);
    CHECK(alloc->live() == 2);
  }
  CHECK(alloc->frees == 3);
  CHECK(alloc->bad_frees == 0);
  CHECK(alloc->live() == 0);
}

TEST_CASE("QuantizedTensor: rejects malformed layouts, naming the direction") {
  auto alloc = std::make_shared<RecordingAllocator>();
  auto layouts = nvfp4_like_layouts();
  layouts[1].struct_size = 4;
  const std::string msg = error_message([&] {
    QuantizedTensor q("nvfp4", 3, 70, QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE, layouts, Device::cpu(), alloc);
  });
  CHECK(contains(msg, "layout of columnwise for format 'nvfp4' has struct_size 4"));
  CHECK(alloc->live() == 0);  // the rowwise buffers allocated before the throw are returned
  {
    // Only the directions asked for are validated.
    QuantizedTensor ok("nvfp4", 3, 70, QR_USAGE_ROWWISE, layouts, Device::cpu(), alloc);
    CHECK(ok.has(QR_DIRECTION_ROWWISE));
  }

  auto bad_ndim = nvfp4_like_layouts();
  bad_ndim[0].data_ndim = 3;
  CHECK(contains(error_message([&] {
                   QuantizedTensor q("nvfp4", 3, 70, QR_USAGE_ROWWISE, bad_ndim, Device::cpu(), alloc);
                 }),
                 "layout buffer with 3 dimensions; expected 1 or 2"));
  CHECK(alloc->live() == 0);
  CHECK(alloc->bad_frees == 0);
}

TEST_CASE("direction helpers") {
  CHECK(std::string(direction_name(QR_DIRECTION_ROWWISE)) == "rowwise");
  CHECK(std::string(direction_name(QR_DIRECTION_COLUMNWISE)) == "columnwise");
  CHECK(usage_bit(QR_DIRECTION_ROWWISE) == QR_USAGE_ROWWISE);
  CHECK(usage_bit(QR_DIRECTION_COLUMNWISE) == QR_USAGE_COLUMNWISE);
  CHECK(usage_str(QR_USAGE_ROWWISE) == "rowwise");
  CHECK(usage_str(QR_USAGE_COLUMNWISE) == "columnwise");
  CHECK(usage_str(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE) == "rowwise+columnwise");
  CHECK(usage_str(0) == "none");
}

}  // namespace
