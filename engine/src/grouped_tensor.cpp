// GroupSplits and GroupedQuantizedTensor (qrecipe/grouped_tensor.hpp).
#include "qrecipe/grouped_tensor.hpp"

#include <sstream>

#include "qrecipe/checked.hpp"

namespace qrecipe {

// ---------------------------------------------------------------- GroupSplits

GroupSplits GroupSplits::of_rows(std::span<const std::int64_t> rows) {
  QR_CHECK(!rows.empty(), "group splits: no groups given; pass one size per group, at least one");
  GroupSplits s;
  s.groups = static_cast<std::int64_t>(rows.size());
  for (std::size_t g = 0; g < rows.size(); ++g) {
    QR_CHECK(rows[g] >= 0, "group splits: group ", g, " has ", rows[g], " rows; sizes must be >= 0");
    s.total += rows[g];
  }
  s.rows.assign(rows.begin(), rows.end());
  return s;
}

GroupSplits GroupSplits::of_offsets(const std::int64_t* offsets, std::int64_t groups,
                                    std::int64_t total, Device device) {
  QR_CHECK(groups >= 1, "group splits: ", groups, " groups; pass at least one");
  QR_CHECK(total >= 0, "group splits: total of ", total, " rows; it must be >= 0");
  QR_CHECK(offsets != nullptr, "group splits: the offsets pointer is null");
  GroupSplits s;
  s.groups = groups;
  s.total = total;
  s.offsets = offsets;
  s.device = device;
  if (device.is_cpu()) (void)s.host_rows();  // checks them now
  return s;
}

std::vector<std::int64_t> GroupSplits::host_rows() const {
  if (!rows.empty()) return rows;
  QR_CHECK_CODE(device.is_cpu(), QR_STATUS_UNSUPPORTED, "group splits: the group offsets live on ",
                device.str(), "; the host cannot read them without waiting for the device (the "
                "grouped GEMM path that needed them must work from the device table instead)");
  QR_CHECK(offsets[0] == 0, "group splits: offsets[0] is ", offsets[0], "; it must be 0 (the "
           "offsets are the running sum of the group sizes)");
  std::vector<std::int64_t> out(static_cast<std::size_t>(groups));
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t r = offsets[g + 1] - offsets[g];
    QR_CHECK(r >= 0, "group splits: offsets decrease at group ", g, " (", offsets[g], " then ",
             offsets[g + 1], "); group sizes must be >= 0");
    out[static_cast<std::size_t>(g)] = r;
  }
  QR_CHECK(offsets[groups] == total, "group splits: the offsets end at ", offsets[groups],
           " but the split tensor has ", total, " rows; the groups must cover every row");
  return out;
}

std::string GroupSplits::str() const {
  std::ostringstream os;
  os << groups << " group" << (groups == 1 ? "" : "s") << " of " << total << " rows ("
     << (!rows.empty() ? std::string("sizes on the host") : "offsets on " + device.str()) << ")";
  return os.str();
}

// ---------------------------------------------------------------- GroupedQuantizedTensor

namespace {
constexpr std::size_t kAlign = 256;
// Checked: the plugin's sizes come through the ABI and could be anything.
std::size_t aligned(std::size_t bytes) {
  return checked_add(bytes, kAlign - 1, "device-split grouped buffer bytes") / kAlign * kAlign;
}
}  // namespace

GroupedQuantizedTensor::GroupedQuantizedTensor(std::vector<QuantizedTensor> groups,
                                               std::int64_t cols)
    : groups_(std::move(groups)) {
  QR_CHECK(!groups_.empty(), "grouped quantized tensor: no groups");
  c_.struct_size = sizeof(qr_grouped_quantized);
  format_ = groups_.front().format();
  c_.format = format_.c_str();
  c_.cols = cols;
  c_.num_groups = static_cast<std::uint32_t>(groups_.size());
  c_.usage = groups_.front().usage();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    QR_CHECK(groups_[g].cols() == cols && groups_[g].usage() == c_.usage,
             "grouped quantized tensor: group ", g, " is ", groups_[g].rows(), "x",
             groups_[g].cols(), " holding ", usage_str(groups_[g].usage()), ", expected ", cols,
             " columns and ", usage_str(c_.usage), " like group 0");
    c_.rows += groups_[g].rows();
    for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
      if (groups_[g].has(d) && groups_[g].data(d).numel() > 0)
        device_ = Device::from_c(groups_[g].direction(d).data.device);
  }
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (has(d)) direction_data(d).layout = groups_.front().layout(d);
}

GroupedQuantizedTensor::GroupedQuantizedTensor(
    const std::string& format, std::int64_t rows, std::int64_t cols, std::uint32_t num_groups,
    const std::int64_t* offsets, std::uint32_t usage,
    const std::array<qr_direction_layout, 2>& layouts,
    const std::array<std::array<std::size_t, 2>, 2>& sizes, Device device,
    const std::shared_ptr<Allocator>& allocator)
    : device_split_(true), format_(format), device_(device) {
  QR_CHECK(num_groups >= 1, "grouped quantized tensor: no groups");
  c_.struct_size = sizeof(qr_grouped_quantized);
  c_.format = format_.c_str();
  c_.rows = rows;
  c_.cols = cols;
  c_.num_groups = num_groups;
  c_.offsets = offsets;
  c_.usage = usage;
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE}) {
    qr_grouped_direction& gd = direction_data(d);
    gd.struct_size = sizeof(qr_grouped_direction);
    if (!has(d)) continue;
    gd.layout = layouts[d];
    formats_[d] = layouts[d].format ? layouts[d].format : format;
    gd.layout.format = formats_[d].c_str();
    // One allocation: [table | amax | scales | data], parts on 256-byte boundaries; everything
    // before the data zero-filled (the contract: scales and amaxes start at zero).
    const std::size_t table = aligned(sizeof(qr_group_entry) * num_groups);
    const std::size_t amax = gd.layout.has_amax ? aligned(sizeof(float) * num_groups) : 0;
    const std::size_t scales = aligned(sizes[d][1]);
    const std::size_t data = sizes[d][0];
    const std::size_t head = checked_add(checked_add(table, amax), scales);
    const std::size_t total = checked_add(head, data, "device-split grouped buffer bytes");
    auto buffer = std::make_shared<Buffer>(allocator, total, device, Buffer::Fill::none);
    auto* base = static_cast<std::uint8_t*>(buffer->data());
    allocator->zero(base, head, device);
    gd.groups = reinterpret_cast<qr_group_entry*>(base);
    gd.amax = amax ? reinterpret_cast<float*>(base + table) : nullptr;
    gd.scale_inv = sizes[d][1] ? base + table + amax : nullptr;
    gd.scale_bytes = sizes[d][1];
    gd.data = base + table + amax + scales;
    gd.data_bytes = data;
    storage_[d] = std::move(buffer);
  }
}

GroupedQuantizedTensor& GroupedQuantizedTensor::operator=(GroupedQuantizedTensor&& o) noexcept {
  if (this == &o) return *this;
  device_split_ = o.device_split_;
  format_ = std::move(o.format_);
  formats_ = std::move(o.formats_);
  groups_ = std::move(o.groups_);
  storage_ = std::move(o.storage_);
  device_ = o.device_;
  c_ = o.c_;
  c_.format = format_.c_str();
  for (const qr_direction d : {QR_DIRECTION_ROWWISE, QR_DIRECTION_COLUMNWISE})
    if (device_split_ && has(d)) direction_data(d).layout.format = formats_[d].c_str();
  o.c_ = {};
  o.c_.struct_size = sizeof(qr_grouped_quantized);
  o.device_split_ = false;
  return *this;
}

const qr_direction_layout& GroupedQuantizedTensor::layout(qr_direction d) const {
  QR_CHECK(has(d), "grouped quantized tensor (format '", format_, "', ", c_.num_groups,
           " groups) has no ", direction_name(d), " data; quantize with that usage");
  return (d == QR_DIRECTION_ROWWISE ? c_.rowwise : c_.columnwise).layout;
}

const std::vector<QuantizedTensor>& GroupedQuantizedTensor::groups() const {
  QR_CHECK(!device_split_, "grouped quantized tensor (format '", format_, "'): its groups were "
           "split on the device, so there are no per-group tensors on the host; read it through "
           "c() (the device table)");
  return groups_;
}

std::vector<QuantizedTensor>& GroupedQuantizedTensor::groups() {
  return const_cast<std::vector<QuantizedTensor>&>(std::as_const(*this).groups());
}

const qr_grouped_quantized& GroupedQuantizedTensor::c() const {
  QR_CHECK(device_split_, "grouped quantized tensor (format '", format_, "'): its groups are "
           "tensors of their own (host-known splits); read them through groups()");
  return c_;
}

qr_grouped_quantized& GroupedQuantizedTensor::c() {
  return const_cast<qr_grouped_quantized&>(std::as_const(*this).c());
}

const qr_grouped_direction& GroupedQuantizedTensor::direction(qr_direction d) const {
  (void)layout(d);  // checks that d is held
  const qr_grouped_quantized& s = c();
  return d == QR_DIRECTION_ROWWISE ? s.rowwise : s.columnwise;
}

void GroupedQuantizedTensor::drop(qr_direction d) {
  QR_CHECK(has(d), "cannot drop the ", direction_name(d), " direction of a grouped quantized "
           "tensor (format '", format_, "') that holds ", usage_str(c_.usage));
  if (device_split_) {
    qr_grouped_direction& gd = direction_data(d);
    gd = qr_grouped_direction{};
    gd.struct_size = sizeof(qr_grouped_direction);
    storage_[d].reset();
    formats_[d].clear();
  } else {
    for (QuantizedTensor& t : groups_) t.drop(d);
    direction_data(d) = qr_grouped_direction{};
    direction_data(d).struct_size = sizeof(qr_grouped_direction);
  }
  c_.usage &= ~usage_bit(d);
}

}  // namespace qrecipe
