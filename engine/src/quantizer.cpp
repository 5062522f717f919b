// Quantizer: argument checks on the engine side, then the plugin's C functions.
#include "qrecipe/quantizer.hpp"

#include <cstring>
#include <sstream>

#include "qrecipe/checked.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/engine.hpp"
#include "qrecipe/registry.hpp"

namespace qrecipe {

Quantizer::Quantizer(std::shared_ptr<const FormatPlugin> plugin, QuantizerSpec spec,
                     QuantizerRole role, qr_host_context* ctx)
    : plugin_(std::move(plugin)), spec_(std::move(spec)), role_(std::move(role)), ctx_(ctx) {
  QR_CHECK(plugin_ != nullptr, "Quantizer needs a plugin");
  const CSpec cspec(spec_);
  const qr_role crole = role_.to_c();
  const qr_create_args args{sizeof(qr_create_args), ctx, &crole, cspec.get()};
  if (qr_status status = plugin_->c().create_quantizer(&args, &handle_))
    throw_if_error(status, "creating a '" + plugin_->name() + "' quantizer (" + spec_.str() + ") for role " +
                     role_.str());
  QR_CHECK_CODE(handle_ != nullptr, QR_STATUS_INTERNAL, "plugin ", plugin_->path(),
                " returned success but no quantizer");
}

Quantizer::~Quantizer() {
  if (handle_) plugin_->c().destroy_quantizer(handle_);
}

std::string Quantizer::context(const char* op, const TensorView* src) const {
  std::ostringstream os;
  os << "format '" << format() << "' " << op << " for role " << role_.str();
  if (src) os << " of " << src->str();
  return os.str();
}

const FormatPlugin& Quantizer::direction_plugin(const qr_direction_layout& layout) const {
  if (layout.format == nullptr || format() == layout.format) return *plugin_;
  QR_CHECK_CODE(ctx_ != nullptr, QR_STATUS_INTERNAL, context("direction_plugin"),
                ": a direction of format '", layout.format, "' but this quantizer was made "
                "without an engine to look that format up in");
  auto owner = Engine::from_host_context(ctx_)->registry().find(layout.format);
  QR_CHECK(owner != nullptr, context("direction_plugin"), ": a direction of format '",
           layout.format, "', which the engine's registry has not loaded (loaded: ",
           Engine::from_host_context(ctx_)->registry().loaded_names(), ")");
  return *owner;
}

qr_direction_layout Quantizer::layout(std::int64_t rows, std::int64_t cols,
                                      qr_direction direction) const {
  QR_CHECK(rows >= 0 && cols >= 0, "negative shape ", rows, "x", cols);
  // The logical tensor must be countable before any plugin pads it.
  checked_mul(rows, cols, context("layout") + ": rows x cols");
  qr_direction_layout out{};
  out.struct_size = sizeof(qr_direction_layout);
  if (qr_status status = plugin_->c().layout(handle_, rows, cols, direction, &out))
    throw_if_error(status, context("layout") + " (" + std::to_string(rows) + "x" + std::to_string(cols) +
                     ", " + direction_name(direction) + ")");
  QR_CHECK_CODE(out.struct_size >= sizeof(qr_direction_layout), QR_STATUS_INTERNAL, "plugin ",
                plugin_->path(), " returned a layout with struct_size ", out.struct_size);
  // Every size the host will allocate from must be exact: non-negative and countable.
  const std::string where = context("layout") + " (" + std::to_string(rows) + "x" +
                            std::to_string(cols) + ", " + direction_name(direction) + ")";
  QR_CHECK_CODE(out.data_ndim >= 1 && out.data_ndim <= 2 && out.scale_ndim >= 0 &&
                    out.scale_ndim <= 2, QR_STATUS_INTERNAL, where, ": plugin ", plugin_->path(),
                " returned data_ndim ", out.data_ndim, " and scale_ndim ", out.scale_ndim,
                "; expected 1..2 and 0..2");
  for (int i = 0; i < out.data_ndim; ++i)
    QR_CHECK_CODE(out.data_shape[i] >= 0, QR_STATUS_INTERNAL, where, ": plugin ", plugin_->path(),
                  " returned a negative data dimension ", out.data_shape[i]);
  for (int i = 0; i < out.scale_ndim; ++i)
    QR_CHECK_CODE(out.scale_shape[i] >= 0, QR_STATUS_INTERNAL, where, ": plugin ",
                  plugin_->path(), " returned a negative scale dimension ", out.scale_shape[i]);
  const auto bytes = [&](std::int32_t dtype, int ndim, const std::int64_t* shape) {
    storage_bytes(static_cast<DType>(dtype), ndim == 2 ? shape[0] : 1, shape[ndim - 1]);
  };
  try {
    bytes(out.data_dtype, out.data_ndim, out.data_shape);
    if (out.scale_ndim > 0) bytes(out.scale_dtype, out.scale_ndim, out.scale_shape);
  } catch (const Error& e) {
    QR_THROW(where, ": ", e.message());
  }
  return out;
}

void Quantizer::check_source(const TensorView& src, std::int64_t rows, std::int64_t cols) const {
  const DType t = src.dtype();
  QR_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, context("quantize", &src),
           ": source dtype must be f32, bf16 or f16, got ", dtype_name(t));
  QR_CHECK(src.rows() == rows && src.cols() == cols, context("quantize", &src),
           ": source is ", src.rows(), "x", src.cols(), " (as 2-D) but the destination is ", rows,
           "x", cols);
  QR_CHECK_CODE(plugin_->supports(src.device()), QR_STATUS_UNSUPPORTED, context("quantize", &src),
                ": plugin ", plugin_->path(), " supports ", plugin_->devices_str(),
                " only: this build of the plugin has no kernels for ", src.device().str(),
                " (`qrecipe plugins` lists each format's devices); move the tensor to a supported"
                " device or pick a format that has them. Nothing falls back silently");
  QR_CHECK(src.data() != nullptr || src.numel() == 0, context("quantize", &src),
           ": source has no data pointer");
}

std::array<float, 2> Quantizer::compute_amax(const TensorView& src, void* stream) const {
  check_source(src, src.rows(), src.cols());
  std::array<float, 2> out{0.0f, 0.0f};
  if (qr_status status = plugin_->c().compute_amax(handle_, &src.c(), stream, out.data()))
    throw_if_error(status, context("compute_amax", &src));
  return out;
}

void Quantizer::compute_amax_into(const TensorView& src, float* out, void* stream) const {
  check_source(src, src.rows(), src.cols());
  QR_CHECK(out != nullptr, context("compute_amax_into", &src), ": the output pointer is null");
  if (const auto fn = plugin_->compute_amax_device_extra()) {
    if (qr_status status = fn(handle_, &src.c(), stream, out))
      throw_if_error(status, context("compute_amax_into", &src));
    return;
  }
  // Fallback (plugin_abi.h, QR_EXTRA_COMPUTE_AMAX_DEVICE): the host values, copied.
  const std::array<float, 2> host = compute_amax(src, stream);
  if (src.device().is_cpu())
    std::memcpy(out, host.data(), sizeof host);
  else
    copy_to_device(out, host.data(), sizeof host, stream);
}

bool Quantizer::has_device_amax() const {
  return plugin_->compute_amax_device_extra() != nullptr &&
         plugin_->quantize_device_amax_extra() != nullptr;
}

QuantizedTensor Quantizer::empty_output(const char* op, const TensorView& src, std::uint32_t usage,
                                        std::shared_ptr<Allocator>& allocator) const {
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0,
           context(op, &src), ": usage must be rowwise, columnwise or both, got ", usage);
  check_source(src, src.rows(), src.cols());
  if (!allocator) {
    QR_CHECK(src.device().is_cpu(), context(op, &src), ": pass an allocator for device tensors");
    allocator = cpu_allocator();
  }
  std::array<qr_direction_layout, 2> layouts{};
  for (int d = 0; d < 2; ++d) {
    const auto dir = static_cast<qr_direction>(d);
    if (usage & usage_bit(dir)) layouts[d] = layout(src.rows(), src.cols(), dir);
  }
  return QuantizedTensor(format(), src.rows(), src.cols(), usage, layouts, src.device(), allocator);
}

QuantizedTensor Quantizer::quantize(const TensorView& src, std::uint32_t usage,
                                    const QuantizeOptions& options,
                                    std::shared_ptr<Allocator> allocator) const {
  QuantizedTensor out = empty_output("quantize", src, usage, allocator);
  quantize_into(src, out, options);
  return out;
}

namespace {

// The plugin's arguments of one quantize call into `usage` (the host amax, if any; a device
// amax is the caller's business).
qr_quantize_args quantize_args(std::uint32_t usage, const QuantizeOptions& options) {
  qr_quantize_args args{};
  args.struct_size = sizeof(qr_quantize_args);
  args.usage = usage;
  args.amax = options.amax ? options.amax->data() : nullptr;
  args.has_rng_offset = options.rng_offset.has_value() ? 1 : 0;
  args.rng_offset = options.rng_offset.value_or(0);
  args.stream = options.stream;
  return args;
}

}  // namespace

void Quantizer::quantize_into(const TensorView& src, QuantizedTensor& dst,
                              const QuantizeOptions& options) const {
  check_source(src, dst.rows(), dst.cols());
  QR_CHECK(dst.usage() != 0, context("quantize_into", &src), ": destination holds no direction");
  // New bytes: a decoded copy kept for emulated GEMMs would be stale.
  dst.invalidate_decoded();
  qr_quantize_args args = quantize_args(dst.usage(), options);
  // Built only on the error paths (the hot path makes no string).
  const auto where = [&] {
    return context("quantize", &src) + " (" + usage_str(dst.usage()) + ")";
  };
  std::array<float, 2> copied{};
  if (options.device_amax != nullptr) {
    QR_CHECK(!options.amax, where(), ": pass the amax either on the host (amax) or on the device "
             "(device_amax), not both");
    if (const auto fn = plugin_->quantize_device_amax_extra()) {
      try {
        qr_status status = fn(handle_, &src.c(), &args, options.device_amax, &dst.c());
        if (status == nullptr) return;
        throw_if_error(status, where());
      } catch (const Error& e) {
        // UNSUPPORTED: this quantizer takes no device amax and has written nothing.
        if (e.code() != QR_STATUS_UNSUPPORTED) throw;
      }
    }
    // Fallback (plugin_abi.h, QR_EXTRA_QUANTIZE_DEVICE_AMAX): the two values through the host.
    if (src.device().is_cpu())
      std::memcpy(copied.data(), options.device_amax, sizeof copied);
    else
      copy_to_host(copied.data(), options.device_amax, sizeof copied, options.stream);
    args.amax = copied.data();
  }
  if (qr_status status = plugin_->c().quantize(handle_, &src.c(), &args, &dst.c()))
    throw_if_error(status, where());
}

bool Quantizer::has_quantize_decoded() const { return plugin_->quantize_decoded_extra() != nullptr; }

bool Quantizer::quantize_decoded_into(const TensorView& src, QuantizedTensor& dst,
                                      const QuantizeOptions& options,
                                      const qr_decoded_output& decoded) const {
  const auto fn = plugin_->quantize_decoded_extra();
  if (fn == nullptr || options.device_amax != nullptr) return false;
  check_source(src, dst.rows(), dst.cols());
  QR_CHECK(dst.usage() != 0, context("quantize_decoded", &src), ": destination holds no direction");
  dst.invalidate_decoded();
  qr_quantize_args args = quantize_args(dst.usage(), options);
  try {
    throw_if_error(fn(handle_, &src.c(), &args, &dst.c(), &decoded),
                   context("quantize_decoded", &src) + " (" + usage_str(dst.usage()) + ")");
  } catch (const Error& e) {
    // UNSUPPORTED: this call cannot be served in one pass and nothing was written.
    if (e.code() != QR_STATUS_UNSUPPORTED) throw;
    return false;
  }
  return true;
}

QuantizedTensor Quantizer::quantize_decoded(const TensorView& src, std::uint32_t usage,
                                            std::uint32_t decoded_usage,
                                            const QuantizeOptions& options,
                                            std::shared_ptr<Allocator> allocator) const {
  QR_CHECK((decoded_usage & ~usage) == 0, context("quantize_decoded", &src), ": decoded usage ",
           usage_str(decoded_usage), " is not part of the quantized usage ", usage_str(usage));
  QuantizedTensor out = empty_output("quantize_decoded", src, usage, allocator);
  out.set_keep_decoded(true);
  // On the CPU the GEMM keeps FP32 reference decodes itself (gemm_cpu.cpp): nothing to write.
  if (decoded_usage == 0 || src.device().is_cpu() || !has_quantize_decoded()) {
    quantize_into(src, out, options);
    return out;
  }
  // Only block-scaled directions have the extra's values (plugin_abi.h).
  qr_decoded_output decoded{};
  decoded.struct_size = sizeof(qr_decoded_output);
  std::array<DecodedCopy, 2> copies;
  for (int d = 0; d < 2; ++d) {
    const auto dir = static_cast<qr_direction>(d);
    if (!(decoded_usage & usage_bit(dir))) continue;
    const qr_direction_layout& l = out.layout(dir);
    if (l.data_ndim != 2 || (l.scale_mode != QR_SCALE_BLOCK && l.scale_mode != QR_SCALE_BLOCK_TENSOR))
      continue;
    const auto bytes = static_cast<std::size_t>(
        checked_mul(checked_mul(l.data_shape[0], l.data_shape[1], "decoded elements"), 2, "decoded bytes"));
    copies[d].values = std::make_shared<Buffer>(allocator, bytes, src.device(), Buffer::Fill::none);
    copies[d].dtype = DType::bf16;
    // Its own miss word: a miss in one direction must not make the other's GEMM recompute.
    copies[d].miss = std::make_shared<Buffer>(allocator, sizeof(std::uint32_t), src.device(), Buffer::Fill::zero);
    copies[d].stream = options.stream;
    decoded.values[d] = static_cast<std::uint16_t*>(copies[d].values->data());
    decoded.miss[d] = static_cast<std::uint32_t*>(copies[d].miss->data());
  }
  if (decoded.values[0] == nullptr && decoded.values[1] == nullptr) {
    quantize_into(src, out, options);
    return out;
  }
  if (!quantize_decoded_into(src, out, options, decoded)) {
    quantize_into(src, out, options);  // two passes: the GEMM decodes (and keeps) later
    return out;
  }
  for (int d = 0; d < 2; ++d)
    if (copies[d].values) out.keep_decoded(static_cast<qr_direction>(d), std::move(copies[d]));
  return out;
}

void Quantizer::dequantize(const QuantizedTensor& src, qr_direction direction,
                           const TensorView& dst, void* stream) const {
  QR_CHECK(src.has(direction), context("dequantize"), ": the tensor has no ",
           direction_name(direction), " data");
  QR_CHECK(dst.dtype() == DType::f32 || dst.dtype() == DType::bf16, context("dequantize"),
           ": destination dtype must be f32 or bf16, got ", dtype_name(dst.dtype()));
  QR_CHECK(dst.rows() == src.rows() && dst.cols() == src.cols(), context("dequantize"),
           ": destination is ", dst.rows(), "x", dst.cols(), " but the tensor is ", src.rows(),
           "x", src.cols());
  QR_CHECK(dst.is_contiguous(), context("dequantize"), ": destination must be contiguous");
  if (qr_status status = plugin_->c().dequantize(handle_, &src.c(), direction, &dst.c(), stream))
    throw_if_error(status, context("dequantize") + " (" + direction_name(direction) + ")");
}

Tensor Quantizer::dequantize(const QuantizedTensor& src, qr_direction direction) const {
  Tensor out(DType::f32, {src.rows(), src.cols()});
  dequantize(src, direction, out.view());
  return out;
}

std::string Quantizer::describe() const {
  char buffer[1024] = {0};
  if (qr_status status = plugin_->c().describe(handle_, buffer, sizeof buffer))
    throw_if_error(status, context("describe"));
  return buffer;
}

}  // namespace qrecipe
