// Quantizer: the engine's owning handle on a quantizer a plugin made for one role and spec.
//
// Lifetime: holds the FormatPlugin by shared_ptr (the library is never unloaded) and destroys
// the plugin-side object in its destructor. A Quantizer made by an Engine may reference the
// engine's scaling state, so it must not outlive that Engine.
//
// Every call checks its arguments before the plugin sees them (shape, dtype, device, usage)
// and turns a plugin's error status into qrecipe::Error with the format, role and shapes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "qrecipe/format_plugin.hpp"
#include "qrecipe/plugin_abi.h"
#include "qrecipe/quantized_tensor.hpp"
#include "qrecipe/role.hpp"
#include "qrecipe/spec.hpp"
#include "qrecipe/tensor.hpp"

namespace qrecipe {

struct QuantizeOptions {
  // Amaxes already reduced by the caller ([rowwise, columnwise]); nullopt: the plugin computes.
  std::optional<std::array<float, 2>> amax;
  // Or the same two F32 values in the memory of the source's device (host memory for a CPU
  // source), e.g. reduced across ranks there: read by the kernels in stream order, with no
  // host copy when the plugin has QR_EXTRA_QUANTIZE_DEVICE_AMAX; otherwise (and for what the
  // plugin's extra refuses, such as delayed scaling) copied to the host first (a device
  // synchronization: the documented fallback, same bytes). Not together with `amax`.
  const float* device_amax = nullptr;
  // Stochastic-rounding call offset to reuse (recompute, resume); nullopt: the next one.
  std::optional<std::uint64_t> rng_offset;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};

class Quantizer {
 public:
  Quantizer(std::shared_ptr<const FormatPlugin> plugin, QuantizerSpec spec, QuantizerRole role,
            qr_host_context* ctx);
  ~Quantizer();
  Quantizer(const Quantizer&) = delete;
  Quantizer& operator=(const Quantizer&) = delete;

  const std::string& format() const { return plugin_->name(); }
  const FormatPlugin& plugin() const { return *plugin_; }
  const QuantizerSpec& spec() const { return spec_; }
  const QuantizerRole& role() const { return role_; }
  qr_quantizer* handle() const { return handle_; }

  qr_direction_layout layout(std::int64_t rows, std::int64_t cols, qr_direction direction) const;
  std::array<float, 2> compute_amax(const TensorView& src, void* stream = nullptr) const;
  // The same two values written to `out` ([rowwise, columnwise] F32 in the memory of src's
  // device, stream-ordered on `stream`): no host synchronization when the plugin has
  // QR_EXTRA_COMPUTE_AMAX_DEVICE; otherwise compute_amax and a copy to `out` (synchronizes).
  void compute_amax_into(const TensorView& src, float* out, void* stream = nullptr) const;
  // Whether this quantizer's plugin provides both device-amax extras, so compute_amax_into and
  // QuantizeOptions::device_amax avoid the host (a quantizer may still refuse at a call, e.g.
  // delayed scaling, and the call then takes the host-copy fallback).
  bool has_device_amax() const;
  // Allocates the directions in `usage` from `allocator` (CPU allocator when null) and quantizes.
  QuantizedTensor quantize(const TensorView& src, std::uint32_t usage,
                           const QuantizeOptions& options = {},
                           std::shared_ptr<Allocator> allocator = nullptr) const;
  // Requantizes into existing buffers (same shape, the directions dst already holds).
  void quantize_into(const TensorView& src, QuantizedTensor& dst,
                     const QuantizeOptions& options = {}) const;
  // Quantize and decode in one pass (plugin_abi.h, QR_EXTRA_QUANTIZE_DECODED): quantize_into
  // plus the BF16 values an emulated GEMM reads, written into `decoded` by the plugin. Returns
  // false, having written nothing, when the plugin has no such extra, refuses this call
  // (QR_STATUS_UNSUPPORTED) or the amax comes on the device: quantize_into and a decode then
  // give the same values in two passes. dst's kept decoded copies are dropped either way.
  bool quantize_decoded_into(const TensorView& src, QuantizedTensor& dst,
                             const QuantizeOptions& options,
                             const qr_decoded_output& decoded) const;
  bool has_quantize_decoded() const;
  // quantize() for operands of emulated GEMMs (docs/gemm.md, "Decoded operands"): the result
  // keeps decoded copies (QuantizedTensor::set_keep_decoded), and for the directions in
  // `decoded_usage` (a subset of usage) of a CUDA source the plugin's quantize kernel writes
  // them (the BF16 operand and its miss word, what the GEMM's own decoder would write) where
  // it has the extra; otherwise the first GEMM that reads a direction decodes and keeps it.
  // Memory: 2 bytes per element and decoded direction, freed with the tensor.
  QuantizedTensor quantize_decoded(const TensorView& src, std::uint32_t usage,
                                   std::uint32_t decoded_usage, const QuantizeOptions& options,
                                   std::shared_ptr<Allocator> allocator) const;
  // Decodes one direction into dst (F32 or BF16, logical [rows, cols], contiguous).
  void dequantize(const QuantizedTensor& src, qr_direction direction, const TensorView& dst,
                  void* stream = nullptr) const;
  // Convenience: decode into a new F32 CPU tensor of shape [rows, cols].
  Tensor dequantize(const QuantizedTensor& src, qr_direction direction) const;
  // The quantizer's resolved options, e.g. "myformat{dtype=e4m3, scaling=current, ...}".
  std::string describe() const;
  // The plugin of the format that owns a direction this quantizer lays out (`layout` is that
  // direction's layout): this quantizer's own plugin, or, for a format built from other
  // formats, the one the layout's `format` names, from the registry of the engine that made
  // this quantizer. Throws when that format is not loaded there.
  const FormatPlugin& direction_plugin(const qr_direction_layout& layout) const;

 private:
  std::string context(const char* op, const TensorView* src = nullptr) const;
  void check_source(const TensorView& src, std::int64_t rows, std::int64_t cols) const;
  // The checked, allocated (not yet written) output of quantize / quantize_decoded (`op`
  // names the call in errors); a missing allocator becomes the CPU one, for CPU sources only.
  QuantizedTensor empty_output(const char* op, const TensorView& src, std::uint32_t usage,
                               std::shared_ptr<Allocator>& allocator) const;
  std::shared_ptr<const FormatPlugin> plugin_;
  QuantizerSpec spec_;
  QuantizerRole role_;
  qr_quantizer* handle_ = nullptr;
  qr_host_context* ctx_ = nullptr;  // the engine that made it (finds other formats' plugins)
};

}  // namespace qrecipe
