// Engine::quantize_grouped: quantizes the row groups of one tensor (MoE experts kept in one
// parameter) as tensors of their own, through the plugin's optional quantize_grouped extra
// (one call for all groups) or, without it, one `quantize` per group (plugin_abi.h states the
// contract both paths meet: byte-identical to quantizing each group alone, in order). Splits
// that only the device knows go through the plugin's device extras into one device-split
// tensor (QR_EXTRA_QUANTIZE_GROUPED_DEVICE).
#include <array>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "qrecipe/engine.hpp"

namespace qrecipe {
namespace {

std::string who(const Quantizer& q) {
  return "quantize_grouped with format '" + q.format() + "' for role " + q.role().str();
}

// `src` as the 2-D [rows, cols] view the extra takes: a 2-D view as it is (any strides), a
// contiguous view of another rank reshaped to [prod(leading dims), last dim].
TensorView as_2d(const Quantizer& q, const TensorView& src) {
  if (src.ndim() == 2) return src;
  QR_CHECK(src.is_contiguous(), who(q), ": the source ", src.str(), " is neither 2-D nor "
           "contiguous, so its rows cannot be split into groups; make it contiguous first");
  TensorView v(src.data(), src.dtype(), {src.rows(), src.cols()}, src.device());
  return v;
}

void check_groups(const Quantizer& q, const TensorView& src2d,
                  std::span<const std::int64_t> group_rows) {
  QR_CHECK(!group_rows.empty(), who(q), ": no groups given (group_rows is empty); pass one row "
           "count per group, at least one");
  QR_CHECK(group_rows.size() <= std::numeric_limits<std::uint32_t>::max(), who(q), ": ",
           group_rows.size(), " groups; at most 2^32 - 1 are supported");
  std::int64_t total = 0;
  for (std::size_t g = 0; g < group_rows.size(); ++g) {
    QR_CHECK(group_rows[g] >= 0, who(q), ": group ", g, " has ", group_rows[g],
             " rows; row counts must be >= 0");
    total += group_rows[g];
  }
  QR_CHECK(total == src2d.rows(), who(q), ": the ", group_rows.size(), " group row counts sum "
           "to ", total, " but the source ", src2d.str(), " has ", src2d.rows(), " rows; the "
           "groups must cover every row of the source exactly, in order");
}

// What Quantizer::quantize_into checks of a source, for the extra's path (the loop gets them
// from quantize_into itself).
void check_source(const Quantizer& q, const TensorView& src) {
  const DType t = src.dtype();
  QR_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, who(q), ": source dtype "
           "must be f32, bf16 or f16, got ", dtype_name(t));
  QR_CHECK_CODE(q.plugin().supports(src.device()), QR_STATUS_UNSUPPORTED, who(q), ": plugin ",
                q.plugin().path(), " supports ", q.plugin().devices_str(), " only, the source "
                "is on ", src.device().str(), "; move it or pick a format that has kernels "
                "there. Nothing falls back silently");
  QR_CHECK(src.data() != nullptr || src.numel() == 0, who(q), ": source has no data pointer");
}

}  // namespace

std::vector<QuantizedTensor> Engine::quantize_grouped(const Quantizer& q, const TensorView& src,
                                                      std::span<const std::int64_t> group_rows,
                                                      std::uint32_t usage,
                                                      const QuantizeOptions& options,
                                                      std::shared_ptr<Allocator> allocator) {
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0, who(q),
           ": usage must be rowwise (1), columnwise (2) or both (3), got ", usage);
  const TensorView src2d = as_2d(q, src);
  check_groups(q, src2d, group_rows);
  if (!allocator) allocator = allocator_;
  // Every group's buffers of a direction in one allocation (QuantizedTensor::allocate_groups):
  // two allocations and zero-fills for any number of experts, not two per expert.
  std::vector<std::array<qr_direction_layout, 2>> layouts(group_rows.size());
  for (std::size_t g = 0; g < group_rows.size(); ++g)
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
      if (usage & usage_bit(d)) layouts[g][d] = q.layout(group_rows[g], src2d.cols(), d);
  std::vector<QuantizedTensor> out = QuantizedTensor::allocate_groups(
      q.format(), group_rows, src2d.cols(), usage, layouts, src2d.device(), allocator);
  std::vector<QuantizedTensor*> dst;
  dst.reserve(out.size());
  for (auto& t : out) dst.push_back(&t);
  quantize_grouped_into(q, src2d, group_rows, dst, options);
  return out;
}

void Engine::quantize_grouped_into(const Quantizer& q, const TensorView& src,
                                   std::span<const std::int64_t> group_rows,
                                   std::span<QuantizedTensor* const> dst,
                                   const QuantizeOptions& options) {
  const TensorView src2d = as_2d(q, src);
  check_groups(q, src2d, group_rows);
  QR_CHECK(dst.size() == group_rows.size(), who(q), ": ", dst.size(), " destination tensors "
           "for ", group_rows.size(), " groups; pass exactly one destination per group");
  std::uint32_t usage = 0;
  for (std::size_t g = 0; g < dst.size(); ++g) {
    QR_CHECK(dst[g] != nullptr, who(q), ": destination ", g, " is null");
    QR_CHECK(dst[g]->rows() == group_rows[g] && dst[g]->cols() == src2d.cols(), who(q),
             ": destination ", g, " is ", dst[g]->rows(), "x", dst[g]->cols(), " but group ", g,
             " of ", src2d.str(), " is ", group_rows[g], "x", src2d.cols(),
             "; allocate each destination with its group's shape");
    QR_CHECK(dst[g]->usage() != 0, who(q), ": destination ", g, " holds no direction");
    if (g == 0) usage = dst[g]->usage();
    QR_CHECK(dst[g]->usage() == usage, who(q), ": destination ", g, " holds ",
             usage_str(dst[g]->usage()), " but destination 0 holds ", usage_str(usage),
             "; every group must hold the same directions (one call quantizes them alike)");
  }

  const auto grouped = q.plugin().quantize_grouped_extra();
  if (grouped != nullptr && !options.amax) {
    check_source(q, src2d);
    qr_quantize_args args{};
    args.struct_size = sizeof(qr_quantize_args);
    args.usage = usage;
    args.amax = nullptr;
    args.has_rng_offset = options.rng_offset.has_value() ? 1 : 0;
    args.rng_offset = options.rng_offset.value_or(0);
    args.stream = options.stream;
    std::vector<qr_quantized_tensor*> c_dst;
    c_dst.reserve(dst.size());
    for (QuantizedTensor* t : dst) c_dst.push_back(&t->c());
    if (qr_status status = grouped(q.handle(), &src2d.c(), static_cast<std::uint32_t>(dst.size()),
                                   group_rows.data(), &args, c_dst.data())) {
      std::ostringstream os;
      os << who(q) << " of " << src2d.str() << " in " << dst.size() << " groups ("
         << usage_str(usage) << ")";
      throw_if_error(status, os.str());
    }
    return;
  }

  // The fallback: one quantize per group, in order, which is the contract by definition.
  std::int64_t row = 0;
  for (std::size_t g = 0; g < dst.size(); ++g) {
    qr_tensor_view slice = src2d.c();
    slice.shape[0] = group_rows[g];
    if (slice.data != nullptr && group_rows[g] > 0)
      slice.data = static_cast<char*>(slice.data) +
                   row * slice.strides[0] * dtype_bits(src2d.dtype()) / 8;
    QuantizeOptions per_group = options;
    if (options.rng_offset) per_group.rng_offset = *options.rng_offset + g;
    try {
      q.quantize_into(TensorView(slice), *dst[g], per_group);
    } catch (const Error& e) {
      throw Error(e.code(), e.where(), who(q) + ", group " + std::to_string(g) + " of " +
                                           std::to_string(dst.size()) + " (rows " +
                                           std::to_string(row) + ".." +
                                           std::to_string(row + group_rows[g]) + "): " +
                                           e.message());
    }
    row += group_rows[g];
  }
}

GroupedQuantizedTensor Engine::quantize_grouped(const Quantizer& q, const TensorView& src,
                                                const GroupSplits& splits, std::uint32_t usage,
                                                const QuantizeOptions& options,
                                                std::shared_ptr<Allocator> allocator) {
  const TensorView src2d = as_2d(q, src);
  QR_CHECK(splits.total == src2d.rows(), who(q), ": the splits cover ", splits.total,
           " rows but the source ", src2d.str(), " has ", src2d.rows(), "; split the rows of "
           "the tensor being quantized");
  if (splits.host_readable()) {
    const std::vector<std::int64_t> rows = splits.host_rows();
    return GroupedQuantizedTensor(quantize_grouped(q, src2d, rows, usage, options, allocator),
                                  src2d.cols());
  }
  QR_CHECK(usage != 0 && (usage & ~(QR_USAGE_ROWWISE | QR_USAGE_COLUMNWISE)) == 0, who(q),
           ": usage must be rowwise (1), columnwise (2) or both (3), got ", usage);
  QR_CHECK(splits.groups <= std::numeric_limits<std::uint32_t>::max(), who(q), ": ",
           splits.groups, " groups; at most 2^32 - 1 are supported");
  QR_CHECK_CODE(splits.device == src2d.device(), QR_STATUS_UNSUPPORTED, who(q), ": the group "
                "offsets live on ", splits.device.str(), " but the source on ",
                src2d.device().str(), "; keep them on one device");
  const auto sizes_of = q.plugin().grouped_device_sizes_extra();
  const auto quantize = q.plugin().quantize_grouped_device_extra();
  QR_CHECK_CODE(sizes_of != nullptr && quantize != nullptr, QR_STATUS_UNSUPPORTED, who(q),
                ": the group sizes live on ", splits.device.str(), " and plugin ",
                q.plugin().path(), " has no device-split grouped quantization (plugin_abi.h ",
                QR_EXTRA_QUANTIZE_GROUPED_DEVICE, "); pass the splits as host sizes instead "
                "(the PyTorch adapter then reads them on the host, a synchronization), or pick "
                "a format whose plugin provides it");
  QR_CHECK(!options.amax, who(q), ": caller-reduced amaxes cannot be given to device-split "
           "groups (each group has its own); quantize with host splits instead");
  check_source(q, src2d);
  QR_CHECK(src2d.is_contiguous(), who(q), ": a device-split source must be contiguous, got ",
           src2d.str());
  if (!allocator) allocator = allocator_;
  const auto groups = static_cast<std::uint32_t>(splits.groups);
  std::array<qr_direction_layout, 2> layouts{};
  std::array<std::array<std::size_t, 2>, 2> sizes{};
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    if (!(usage & usage_bit(d))) continue;
    layouts[d] = q.layout(src2d.rows(), src2d.cols(), d);
    if (qr_status status = sizes_of(q.handle(), src2d.rows(), src2d.cols(), groups, d,
                                    &sizes[d][0], &sizes[d][1])) {
      std::ostringstream os;
      os << who(q) << ": buffer sizes of " << groups << " device-split groups of " << src2d.str()
         << " (" << direction_name(d) << ")";
      throw_if_error(status, os.str());
    }
  }
  GroupedQuantizedTensor out(q.format(), src2d.rows(), src2d.cols(), groups, splits.offsets,
                             usage, layouts, sizes, src2d.device(), allocator);
  qr_quantize_args args{};
  args.struct_size = sizeof(qr_quantize_args);
  args.usage = usage;
  args.has_rng_offset = options.rng_offset.has_value() ? 1 : 0;
  args.rng_offset = options.rng_offset.value_or(0);
  args.stream = options.stream;
  if (qr_status status = quantize(q.handle(), &src2d.c(), &args, &out.c())) {
    std::ostringstream os;
    os << who(q) << " of " << src2d.str() << " in " << groups << " device-split groups ("
       << usage_str(usage) << ")";
    throw_if_error(status, os.str());
  }
  return out;
}

}  // namespace qrecipe
