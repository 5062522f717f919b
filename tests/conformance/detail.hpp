// Internals of the conformance suite, shared by its .cpp files (not a public API).
//
// Map
//   inputs.cpp     deterministic test data and source tensors (f32 / bf16)
//   inspect.cpp    reading quantized tensors through their layout: block grid, codes, scale
//                  entries, byte comparison; the guard-byte allocator; error-bound checking
//   fixture.cpp    Fixture (an Engine + one Quantizer for a Case), CaseContext, reporting
//   check_*.cpp    the check groups, one SUBCASE each (see conformance.hpp for the list)
//   conformance.cpp  run(): the SUBCASE tree over cases and check groups
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "conformance.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/quantized_tensor.hpp"
#include "qrecipe/quantizer.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe::conformance::detail {

// ------------------------------------------------------------------ inputs.cpp

enum class DataKind { normal, uniform, heavy_tailed, outliers, tiny, huge };
inline constexpr DataKind kDataKinds[] = {DataKind::normal,   DataKind::uniform,
                                          DataKind::heavy_tailed, DataKind::outliers,
                                          DataKind::tiny,     DataKind::huge};
const char* kind_name(DataKind kind);

// rows * cols values (row-major) of one kind; the same arguments give the same values.
//   normal        N(0, 1)
//   uniform       U(-3, 3)
//   heavy_tailed  Cauchy, clipped to +-1e4
//   outliers      N(0, 1) with one element in 200 (at least one) multiplied by 1000
//   tiny / huge   N(0, 1) times 2^-100 / 2^100 (scales far from 1, still FP32 normals)
std::vector<float> generate(DataKind kind, std::int64_t rows, std::int64_t cols,
                            std::uint64_t salt = 0);
// Values spread over the FP32 subnormals (both signs, including +-2^-149 and the largest).
std::vector<float> subnormals(std::int64_t rows, std::int64_t cols);

inline constexpr DType kSourceDTypes[] = {DType::f32, DType::bf16};

// A source tensor and the exact FP32 values the quantizer sees (bf16 sources are rounded
// to nearest even with num::f32_to_bf16, so `values` holds the rounded values).
struct Source {
  Tensor tensor;
  std::vector<float> values;  // row-major [rows, cols]
  std::int64_t rows = 0, cols = 0;
  DType dtype = DType::f32;
  TensorView view() const { return tensor.view(); }
  std::string str() const;  // "bf16[17, 33]"
};
Source make_source(const std::vector<float>& values, std::int64_t rows, std::int64_t cols,
                   DType dtype);
// The same values in another shape (the 3-D view check) or as a transposed, strided view.
Source reshape(const Source& src, const std::vector<std::int64_t>& shape);
struct StridedSource {
  Tensor storage;   // [cols, rows] contiguous, holding the transpose
  TensorView view;  // [rows, cols] with strides {1, rows}
};
StridedSource transposed_storage(const Source& src);

// ------------------------------------------------------------------ inspect.cpp

// Allocator that puts guard bytes before and after every buffer, so writes outside the
// sizes layout() gave are caught (the buffers are still zero-filled and 256-byte aligned).
class GuardedAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device device) override;
  void deallocate(void* ptr, std::size_t bytes, Device device) noexcept override;
  void zero(void* ptr, std::size_t bytes, Device device) override;
  // Buffers whose guards were overwritten since allocation ("" when none).
  std::string overruns() const;

 private:
  struct Block {
    unsigned char* base;
    std::size_t bytes;
  };
  mutable std::mutex mutex_;
  std::vector<Block> live_;
  std::vector<std::string> freed_with_overrun_;
};

// The block grid of one direction of a [rows, cols] tensor in logical coordinates. Per-tensor
// (and unscaled) directions are one block covering the whole tensor.
struct Blocks {
  std::int64_t rows = 0, cols = 0;
  std::int64_t block_rows = 1, block_cols = 1;
  std::int64_t grid_rows = 0, grid_cols = 0;
  bool per_tensor = false;
  std::int64_t row_of(std::int64_t i) const { return i / block_rows; }
  std::int64_t col_of(std::int64_t j) const { return j / block_cols; }
  bool same_block(std::int64_t i0, std::int64_t j0, std::int64_t i1, std::int64_t j1) const {
    return row_of(i0) == row_of(i1) && col_of(j0) == col_of(j1);
  }
  bool partial() const {  // some block extends past the tensor
    return !per_tensor && rows > 0 && cols > 0 &&
           (rows % block_rows != 0 || cols % block_cols != 0);
  }
};
Blocks blocks_of(const qr_direction_layout& layout, std::int64_t rows, std::int64_t cols);
bool is_block_mode(const qr_direction_layout& layout);

// Element (i, j) of the logical tensor as stored in one direction: its code (the raw bits of
// the data dtype: a nibble for E2M1, a byte for FP8, 16/32 bits for wider types).
std::uint32_t code_at(const QuantizedTensor& t, qr_direction d, std::int64_t i, std::int64_t j);
// The bytes of the scale entry of block (bi, bj) (empty when the direction has no scale).
std::vector<unsigned char> scale_entry(const QuantizedTensor& t, qr_direction d,
                                       std::int64_t bi, std::int64_t bj);
// Problems with the scale array's extent or padding ("" when the array covers every block
// and every entry outside the valid blocks is zero).
std::string scale_array_problem(const QuantizedTensor& t, qr_direction d);
// First difference between two quantized tensors over the directions in usage: data, scale
// and amax bytes ("" when identical).
std::string compare_bytes(const QuantizedTensor& a, const QuantizedTensor& b,
                          std::uint32_t usage);
// Decode one direction through the quantizer into F32 (or BF16 read back as F32 values).
std::vector<float> decode(const Quantizer& q, const QuantizedTensor& t, qr_direction d,
                          DType out = DType::f32);

// amax over finite |x| per block of the grid, and over the tensor.
struct Amaxes {
  std::vector<double> block;  // grid_rows * grid_cols
  double tensor = 0.0;
  double of(const Blocks& b, std::int64_t i, std::int64_t j) const {
    return block[static_cast<std::size_t>(b.row_of(i) * b.grid_cols + b.col_of(j))];
  }
};
Amaxes amaxes(const std::vector<float>& x, const Blocks& b);

// Elements of a decode outside the bound: the count and the worst one, described.
struct BoundReport {
  std::int64_t violations = 0;
  std::string worst;
};
BoundReport check_bound(const std::vector<float>& x, const std::vector<float>& decoded,
                        const Blocks& b, const ErrorBound& bound);

std::string shape_str(std::int64_t rows, std::int64_t cols);  // "17x33"
std::string float_str(double v);                               // 9 significant digits

// ------------------------------------------------------------------ fixture.cpp

// Block geometry of the case, probed once from layout() of a large shape. 0 = the block spans
// the whole dimension (per-tensor scaling, or per-row/column blocks).
struct Geometry {
  std::int64_t block_rows[2] = {0, 0};
  std::int64_t block_cols[2] = {0, 0};
  bool block_mode[2] = {false, false};
  // Dimensions that are whole multiples of every direction's block (at least 16), used for
  // the multi-block edge-case tensors; `tile_*` is the lcm of the block dimensions.
  std::int64_t tile_rows = 1, tile_cols = 1;
  std::int64_t multi_rows = 16, multi_cols = 16;
};

// What every check of one case needs.
struct CaseContext {
  const Suite* suite = nullptr;
  const Case* kase = nullptr;
  std::shared_ptr<Registry> registry;
  std::string name;
  Geometry geometry;
  std::vector<qr_direction> directions;  // those in the case's usage
  std::uint32_t usage = 0;
  // The bound of one direction for a tensor whose layout is `layout`.
  ErrorBound bound_for(const qr_direction_layout& layout) const;
  // Explicit rng_offset for stochastic cases (so two runs can be compared), none otherwise.
  QuantizeOptions repeatable() const;
  // Shapes of the round trip and shape checks.
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes() const;
  // True if a non-empty rows x cols tensor leaves a partial block in some direction.
  bool partial(std::int64_t rows, std::int64_t cols) const;
  // True (after reporting "not supported") when the shape has partial blocks and the
  // Properties say the format has none: the caller skips the shape.
  bool skip_partial(std::int64_t rows, std::int64_t cols, const std::string& check) const;
};

// A fresh Engine (uniform recipe of the case's spec) and one Quantizer for the case's role.
// A stateful quantizer (it asked the engine for delayed-scaling state) is primed with the
// input first, so its scale fits the tensor as current scaling's would.
class Fixture {
 public:
  explicit Fixture(const CaseContext& c);
  const Quantizer& quantizer() const { return *quantizer_; }
  Engine& engine() { return *engine_; }
  bool stateful() const { return !engine_->scaling_states().empty(); }
  // Stateful: quantize x once and run Engine::update_scaling(); otherwise nothing.
  void prime(const TensorView& x);
  // Quantize with the guarded allocator; a guard overrun is a failed CHECK.
  QuantizedTensor quantize(const TensorView& x, std::uint32_t usage,
                           const QuantizeOptions& options = {});
  void quantize_into(const TensorView& x, QuantizedTensor& dst,
                     const QuantizeOptions& options = {});
  void check_guards(const std::string& what) const;

 private:
  const CaseContext& context_;
  std::shared_ptr<GuardedAllocator> allocator_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Quantizer> quantizer_;
};

// Report a check that does not apply, once per distinct text per process. The text is
// prefixed with the current case (set by run()) when there is one.
void not_supported(const std::string& what);
void set_current_case(const std::string& name);

// Runs fn; a qrecipe::Error with code QR_STATUS_UNSUPPORTED (the plugin says it cannot serve
// this valid request) is reported as "not supported", any other exception is a failed check
// saying what was attempted. False if it threw.
template <class Fn>
bool attempt(const std::string& what, Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const Error& e) {
    if (e.code() == QR_STATUS_UNSUPPORTED)
      not_supported(what + " (the plugin answered UNSUPPORTED: " + e.what() + ")");
    else
      FAIL_CHECK(what << " threw: " << std::string(e.what()));
  } catch (const std::exception& e) {
    FAIL_CHECK(what << " threw: " << std::string(e.what()));
  }
  return false;
}

// ------------------------------------------------------------------ check groups

void check_quantizer(const CaseContext& c);      // creation, describe, layouts are pure
void check_round_trip(const CaseContext& c);     // bound on every shape, dtype, data kind
void check_zeros_and_denormals(const CaseContext& c);
void check_nan_and_inf(const CaseContext& c);
void check_exact_values(const CaseContext& c);
void check_shapes(const CaseContext& c);         // single element, empty, partial blocks
void check_layout(const CaseContext& c);         // buffers, guards, 3-D, strided, quantize_into,
                                                 // mismatched destinations
void check_directions(const CaseContext& c);
void check_determinism(const CaseContext& c);    // repeatability, rng_offset, amax paths
void check_quantize_decoded(const CaseContext& c);  // QR_EXTRA_QUANTIZE_DECODED == quantize
                                                    // + the reference decode
void check_options(const Suite& suite, const Registry& registry);  // once per suite
void check_devices(const Suite& suite, const Registry& registry);  // once per suite

}  // namespace qrecipe::conformance::detail
