// qrecipe::gemm_grouped (gemm_grouped.hpp): checks what the groups share (count, devices,
// splits), then runs the CPU reference group by group or hands the call to the CUDA back end
// (gemm/cuda/grouped_cuda.cpp).
#include <sstream>

#include "gemm/grouped_internal.hpp"
#include "qrecipe/gemm_grouped.hpp"

namespace qrecipe {

// ---------------------------------------------------------------- GroupedOperand

bool GroupedOperand::is_quantized() const {
  if (tensor) return true;
  return !groups.empty() && groups.front().is_quantized();
}

std::int64_t GroupedOperand::split_cols() const {
  return tensor ? tensor->cols() : dense.cols();
}

std::string GroupedOperand::str() const {
  std::ostringstream os;
  if (!is_split()) {
    os << groups.size() << " groups: " << groups.front().str();
    return os.str();
  }
  if (tensor) {
    const auto& l = tensor->layout(direction);
    os << "split " << (l.format ? l.format : tensor->format().c_str()) << " "
       << dtype_name(static_cast<DType>(l.data_dtype)) << " [" << tensor->rows() << "x"
       << tensor->cols() << "] " << direction_name(direction);
  } else {
    os << "split " << dtype_name(dense.dtype()) << " [" << dense.rows() << "x" << dense.cols()
       << "] " << direction_name(direction);
  }
  return os.str();
}

namespace detail {

namespace {

// Rows [row, row + rows) of a contiguous 2-D [total, cols] tensor.
TensorView rows_of(const TensorView& t, std::int64_t row, std::int64_t rows) {
  qr_tensor_view v = t.c();
  v.shape[0] = rows;
  if (v.data != nullptr && rows > 0)
    v.data = static_cast<char*>(v.data) + row * t.cols() * dtype_bits(t.dtype()) / 8;
  return TensorView(v);
}

}  // namespace

std::vector<GemmOperand> host_operands(const GroupedOperand& op, const GroupedGemmOptions& options,
                                       std::int64_t groups, const char* which) {
  if (!op.is_split()) return {op.groups.begin(), op.groups.end()};
  std::vector<GemmOperand> out;
  out.reserve(static_cast<std::size_t>(groups));
  if (op.tensor) {
    QR_CHECK(op.quantizer != nullptr, "grouped GEMM operand ", which, " (", op.str(),
             ") needs the quantizer that made it");
    for (const QuantizedTensor& t : op.tensor->groups())
      out.push_back(GemmOperand::quantized(t, *op.quantizer, op.direction));
    return out;
  }
  const std::vector<std::int64_t> rows = options.splits->host_rows();
  std::int64_t row = 0;
  for (const std::int64_t r : rows) {
    out.push_back(GemmOperand::dense(rows_of(op.dense, row, r), op.direction));
    row += r;
  }
  return out;
}

std::vector<TensorView> host_outputs(const GroupedOutput& out, const GroupedGemmOptions& options) {
  if (!out.is_split()) return {out.groups.begin(), out.groups.end()};
  std::vector<TensorView> views;
  const std::vector<std::int64_t> rows = options.splits->host_rows();
  std::int64_t row = 0;
  for (const std::int64_t r : rows) {
    views.push_back(rows_of(out.split, row, r));
    row += r;
  }
  return views;
}

HostGroups host_groups(const GroupedOperand& a, const GroupedOperand& b, const GroupedOutput& out,
                       const GroupedGemmOptions& options, std::int64_t groups) {
  return {host_operands(a, options, groups, "A"), host_operands(b, options, groups, "B"),
          host_outputs(out, options)};
}

GroupedGemmPlan gemm_per_group(const HostGroups& groups, const GroupedGemmOptions& options,
                               GroupedGemmPlan plan) {
  for (std::size_t g = 0; g < groups.a.size(); ++g) {
    GemmOptions o;
    o.alpha = options.alpha;
    o.accumulate = options.accumulate;
    o.bias = options.bias.empty() ? nullptr : options.bias[g];
    o.bias_dtype = options.bias_dtype;
    o.stream = options.stream;
    o.kind = options.kind;
    try {
      const GemmPlan ran = gemm(groups.a[g], groups.b[g], groups.out[g], o);
      if (g == 0) plan.gemm = ran;
    } catch (const Error& e) {
      QR_THROW_CODE(e.code(), "grouped ", gemm_kind_name(options.kind), " GEMM, group ", g, " of ",
                    groups.a.size(), ": ", e.what());
    }
  }
  return plan;
}

OperandTraits grouped_traits(const GroupedOperand& op) {
  if (!op.is_split()) {
    const GemmOperand& g = op.groups.front();
    if (g.tensor) return OperandTraits::of(g.tensor->layout(g.direction), g.direction);
    return OperandTraits::high_precision(g.high_precision.dtype());
  }
  if (op.tensor) return OperandTraits::of(op.tensor->layout(op.direction), op.direction);
  // A dense split tensor: K-major when used rowwise.
  OperandTraits t = OperandTraits::high_precision(op.dense.dtype());
  t.inner_contiguous = op.direction == QR_DIRECTION_ROWWISE;
  return t;
}

}  // namespace detail

namespace {

Device operand_device(const GroupedOperand& op) {
  if (!op.is_split()) return op.groups.front().device();
  if (op.tensor) return op.tensor->device();
  return op.dense.device();
}

void check_split(const GroupedOperand& op, const GroupedGemmOptions& o, const char* which) {
  if (!op.is_split()) return;
  QR_CHECK(o.splits != nullptr, "grouped GEMM: operand ", which, " (", op.str(), ") is split "
           "but no GroupSplits were given (options.splits)");
  const std::int64_t rows = op.tensor ? op.tensor->rows() : op.dense.rows();
  QR_CHECK(rows == o.splits->total, "grouped GEMM: operand ", which, " (", op.str(), ") has ",
           rows, " rows but the splits (", o.splits->str(), ") cover ", o.splits->total);
  if (op.tensor) {
    QR_CHECK(op.tensor->num_groups() == o.splits->groups, "grouped GEMM: operand ", which, " (",
             op.str(), ") holds ", op.tensor->num_groups(), " groups but the splits have ",
             o.splits->groups);
    if (op.tensor->device_split()) {
      QR_CHECK(op.tensor->c().offsets == o.splits->offsets, "grouped GEMM: operand ", which, " (",
               op.str(), ") was split by other offsets than the call's splits; quantize with the "
               "same GroupSplits");
    } else if (o.splits->host_readable()) {
      const std::vector<std::int64_t> rows = o.splits->host_rows();
      for (std::size_t g = 0; g < rows.size(); ++g)
        QR_CHECK(op.tensor->groups()[g].rows() == rows[g], "grouped GEMM: operand ", which, " (",
                 op.str(), "): group ", g, " has ", op.tensor->groups()[g].rows(), " rows but "
                 "the splits give it ", rows[g], "; quantize with the same GroupSplits");
    }
    (void)op.tensor->layout(op.direction);  // throws when the direction is missing
  } else {
    QR_CHECK(op.dense.ndim() == 2 && op.dense.is_contiguous() &&
                 (op.dense.dtype() == DType::f32 || op.dense.dtype() == DType::bf16),
             "grouped GEMM: dense split operand ", which, " must be a contiguous 2-D f32 or "
             "bf16 tensor, got ", op.dense.str());
  }
}

}  // namespace

GroupedGemmPlan gemm_grouped(const GroupedOperand& a, const GroupedOperand& b,
                             const GroupedOutput& out, const GroupedGemmOptions& options) {
  const char* kind = gemm_kind_name(options.kind);
  const auto count = [&](const GroupedOperand& op) -> std::int64_t {
    if (!op.is_split()) return static_cast<std::int64_t>(op.groups.size());
    return options.splits ? options.splits->groups : -1;
  };
  check_split(a, options, "A");
  check_split(b, options, "B");
  const std::int64_t groups = count(a);
  QR_CHECK(groups >= 1, "grouped ", kind, " GEMM: no groups (operand A has none)");
  QR_CHECK(count(b) == groups, "grouped ", kind, " GEMM: operand A has ", groups,
           " groups but operand B has ", count(b), "; pass one operand per group for both");
  if (out.is_split()) {
    QR_CHECK(options.splits != nullptr, "grouped ", kind, " GEMM: the output is split but no "
             "GroupSplits were given (options.splits)");
    QR_CHECK(out.split.ndim() == 2 && out.split.rows() == options.splits->total,
             "grouped ", kind, " GEMM: the split output ", out.split.str(), " must be 2-D with ",
             options.splits->total, " rows (the splits' total)");
    QR_CHECK(options.splits->groups == groups, "grouped ", kind, " GEMM: the splits have ",
             options.splits->groups, " groups, the operands ", groups);
  } else {
    QR_CHECK(static_cast<std::int64_t>(out.groups.size()) == groups, "grouped ", kind,
             " GEMM: ", out.groups.size(), " outputs for ", groups, " groups; pass one per group");
  }
  QR_CHECK(options.bias.empty() || static_cast<std::int64_t>(options.bias.size()) == groups,
           "grouped ", kind, " GEMM: ", options.bias.size(), " biases for ", groups,
           " groups; pass one per group (nullptr for none) or none at all");
  QR_CHECK(options.bias_dtype == DType::f32 || options.bias_dtype == DType::bf16, "grouped ",
           kind, " GEMM: the bias must be f32 or bf16, got ", dtype_name(options.bias_dtype));

  const Device da = operand_device(a), db = operand_device(b);
  const Device dout = out.is_split() ? out.split.device() : out.groups.front().device();
  const bool on_cpu = da.is_cpu() && db.is_cpu() && dout.is_cpu();
  if (!on_cpu) {
    QR_CHECK_CODE(da == db && db == dout, QR_STATUS_UNSUPPORTED, "grouped ", kind, " GEMM with A (",
                  a.str(), ") on ", da.str(), ", B (", b.str(), ") on ", db.str(),
                  " and the output on ", dout.str(), ": operands and output must live on one "
                  "device; a CUDA operand never falls back to the CPU");
    QR_CHECK_CODE(options.splits == nullptr || options.splits->host_readable() ||
                      options.splits->device == dout,
                  QR_STATUS_UNSUPPORTED, "grouped ", kind, " GEMM on ", dout.str(), ": the "
                  "splits' offsets live on ", options.splits->device.str(), "; keep them on "
                  "the GEMM's device (or pass host sizes)");
#if defined(QRECIPE_WITH_CUDA)
    return detail::gemm_grouped_cuda(a, b, out, options, groups);
#else
    QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "grouped ", kind, " GEMM on ", dout.str(), ": this build "
                  "of qrecipe has no CUDA (QRECIPE_CUDA=OFF); rebuild with -DQRECIPE_CUDA=ON or "
                  "keep the tensors on the CPU. A CUDA operand never falls back to the CPU");
#endif
  }
  QR_CHECK(options.splits == nullptr || options.splits->host_readable(), "grouped ", kind,
           " GEMM on the CPU: the splits' offsets live on ", options.splits->device.str(),
           "; CPU GEMMs need them in host memory");
  // The CPU reference, group by group: bit for bit what per-group qrecipe::gemm gives.
  GroupedGemmPlan plan;
  plan.reason = "CPU: every group is the reference GEMM";
  return detail::gemm_per_group(detail::host_groups(a, b, out, options, groups), options, plan);
}

}  // namespace qrecipe
