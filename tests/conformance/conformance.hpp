// The shared plugin conformance suite (docs/plugins.md, "The conformance suite";
// docs/architecture.md, "Conventions", rule 8).
//
// Every format plugin's doctest binary runs this suite against its own quantizers, and the
// installed `qrecipe-conformance` runner runs it against any plugin the registry finds. The
// suite reaches the plugin only through the registry and the engine API (Engine,
// Quantizer, QuantizedTensor), never through plugin internals, so it tests exactly what a
// user of the plugin gets.
//
// What it checks, per Case (one option set for one role), on f32 and bf16 sources of shapes
// 1x1, 0xN, Nx0, 1x(block+1), (block+1)x1, 17x33, 128x128, 256x96, 130x260:
//   round trip   |x - dequantize(quantize(x))| within the Case's ErrorBound, both directions,
//                on normal, uniform, heavy-tailed, outlier-heavy, tiny and huge data (fixed
//                seeds); a bf16 decode equals the f32 decode rounded to bf16
//   edge values  +-0 decode to +-0; denormal inputs decode within the bound; NaN and +-inf
//                stay in their own element / block (rules below); all-equal tensors and
//                blocks of the Properties' exact_values decode exactly
//   shapes       single-element and empty tensors; partial blocks either quantize (scale
//                padding beyond the valid blocks is zero) or, if the Properties say the
//                format has none, throw a qrecipe::Error naming the shape
//   layout       data shape is [rows, cols] ([cols, rows] when transposed), scale arrays
//                cover every block, quantize writes inside the buffers layout() sized
//                (guard bytes), a 3-D source equals its 2-D view, a strided source equals
//                its contiguous copy (or is refused with an error), quantize_into == quantize,
//                and quantize_into a destination whose layout or buffers disagree with
//                layout() (dtype, shape, block geometry, a null buffer) throws
//   directions   a one-direction quantize equals that direction of a two-direction one;
//                columnwise_is_transpose formats decode both directions to the same values
//   determinism  same input, same bytes (stochastic formats: same rng_offset, same bytes;
//                another offset, other bytes); a caller-given amax equal to compute_amax
//                gives the same bytes; a stored amax equals compute_amax
//   options      the schema is well formed; validate_spec rejects an unknown key and a bad
//                value of every option (enum "not-a-choice", int "abc", bool "maybe", ...)
//                with a message naming the key; every enum choice is accepted
// A check that does not apply (partial blocks for a format without them, CUDA in a CPU-only
// plugin, a columnwise check for a rowwise-only format) is reported with doctest MESSAGE
// ("not supported: ...") and never counts as a failure.
//
// NaN and inf rules, per scale mode of a direction (amax ignores NaN everywhere, so the suite
// compares against the same tensor with the special value replaced by 0):
//   NaN, TENSOR/NONE     the NaN element decodes to NaN; every other element has the same
//                        code and decoded value, and scale_inv and amax are byte-identical
//   NaN, BLOCK(_TENSOR)  as above for every element outside the NaN's block and for the
//                        scales of the other blocks; elements of the NaN's own block decode
//                        to NaN or to their NaN-free value (NVFP4 marks the block NaN)
//   +-inf, BLOCK         outside the inf's block: identical, as for NaN; inside: not NaN
//   +-inf, TENSOR/BLOCK_TENSOR  the amax is inf, so every scale may change: every other
//                        element decodes to a finite value
//   the inf element itself decodes to a non-NaN value of its sign (inf or saturated).
//
// How to add a plugin (plugins/<fmt>/test_<fmt>.cpp, built by qrecipe_add_plugin_test):
//
//   #include "conformance.hpp"
//   namespace conf = qrecipe::conformance;
//   TEST_CASE("myfmt conformance") {
//     // E4M3 round to nearest: half an ulp is 2^-4 of |x| (+2^-20 for the FP32 products);
//     // below E4M3's normals the step is 2^-9, so the error is 2^-10 in scaled units, i.e.
//     // 2^-10/448 of the block amax when the amax is scaled to 448; scales capped at FLT_MAX
//     // (a subnormal amax) leave an absolute floor of 2^-10 * 2^-127.
//     const conf::ErrorBound e4m3{.rel_element = 0x1p-4 + 0x1p-20, .rel_block = 0x1p-10 / 448,
//                                 .abs = 0x1p-137};
//     conf::run({.format = "myfmt",
//                .cases = {{.spec = conf::spec("myfmt"), .bound = e4m3},
//                          {.spec = conf::spec("myfmt", {{"mode", "fast"}}), .bound = e4m3,
//                           .properties = {.supports_partial_blocks = false}}}});
//   }
//
// State every bound with its arithmetic in a comment; the suite adds no slack of its own.
// Out-of-tree plugins can run the same suite without a test binary: the installed
// `qrecipe-conformance --format myfmt --plugin-path DIR` (runner.cpp; --help lists its flags).
// What the suite derives from the quantizer itself: block geometry, scale mode and dtype,
// data dtype and transposition (layout()), and whether the quantizer is stateful (it asked
// the engine for delayed-scaling state: the suite then primes the state with the input and
// calls Engine::update_scaling() before measuring). What a Case must state: the error bound
// (or leave it empty to use derive_bound(), a loose bound for "scale the block amax to the
// data type's max" formats) and the Properties below.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qrecipe/plugin_abi.h"
#include "qrecipe/registry.hpp"
#include "qrecipe/role.hpp"
#include "qrecipe/spec.hpp"

namespace qrecipe::conformance {

// Allowed error of one decoded element x' of a finite source element x:
//   |x - x'| <= rel_element * |x| + rel_block * amax(x's block) + rel_tensor * amax(tensor) + abs
// "x's block" is the scaling block of the direction being decoded (the layout's block_rows x
// block_cols; the whole tensor for per-tensor scaling); amaxes are over finite values.
struct ErrorBound {
  double rel_element = 0.0;  // rounding of the element: half an ulp of the data type, relative
  double rel_block = 0.0;    // the data type's subnormal floor after scaling the block amax
  double rel_tensor = 0.0;   // block scales that are themselves quantized against the tensor
  double abs = 0.0;          // absolute floor: scales capped at FLT_MAX, FP32 subnormal decodes

  double limit(double x, double block_amax, double tensor_amax) const;
  std::string str() const;  // "0.0625*|x| + 4.4e-06*block_amax + 0*tensor_amax + 5.7e-42"
};

// A loose bound for formats that scale each block's amax to between half and all of the data
// type's max (per-tensor, MX, blockwise, NVFP4-like): half an ulp of the data type per element
// (+2^-20 for the FP32 products), its smallest subnormal over its max for the block, the
// scale type's smallest subnormal over its max for the tensor when block scales are a narrow
// float (E4M3), and for scales capped at FLT_MAX the data subnormal times 2^-127 as the floor.
// Throws for data types it cannot reason about (u8 codes): state those bounds explicitly.
ErrorBound derive_bound(const qr_direction_layout& layout);

// Facts about a format that its layout cannot tell.
struct Properties {
  // false: a shape that leaves a partial block must throw a qrecipe::Error naming the shape.
  bool supports_partial_blocks = true;
  // true: the columnwise direction holds the rowwise codes transposed (float8, 2-D-block
  // formats), so both directions decode to bit-identical values.
  bool columnwise_is_transpose = false;
  // true: stochastic rounding; determinism is checked under an explicit rng_offset, and two
  // different offsets must give different bytes.
  bool stochastic = false;
  // Directions the format produces (QR_USAGE_* bits).
  std::uint32_t usage = QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE;
  // Values v for which a tensor of all v, and (block scaling) a tensor made of blocks that
  // are each constant, decode exactly. Empty: "not supported".
  std::vector<float> exact_values{1.0f, 2.0f, -0.5f};
};

// One option set of the plugin for one role.
struct Case {
  QuantizerSpec spec;  // format + options, as a recipe would give them (see spec() below)
  QuantizerRole role{"linear", "input", "conformance"};
  std::optional<ErrorBound> bound;  // nullopt: derive_bound() of each direction's layout
  Properties properties{};
  std::string name;  // for reports; empty: spec.str() + " for " + role.tensor_type
};

struct Suite {
  std::string format;       // the plugin's format name, as the registry knows it
  std::vector<Case> cases;  // empty: one Case with the default options and derived bounds
  std::shared_ptr<Registry> registry{};  // null: Registry::shared()
};

// Runs every check of every case inside the current doctest TEST_CASE, one SUBCASE per case
// and group of checks, so failures name the case. Call it once per TEST_CASE.
void run(const Suite& suite);

// A spec from option text, exactly as a recipe's YAML would spell the values
// (spec("float8", {{"scaling", "delayed"}, {"margin", "0"}})); validated by the engine.
QuantizerSpec spec(const std::string& format,
                   const std::vector<std::pair<std::string, std::string>>& options = {});

// Every "not supported: ..." message reported so far in this process (deduplicated), for a
// summary at the end of a run.
std::vector<std::string> not_supported_log();

}  // namespace qrecipe::conformance
