// The CUDA back end of qrecipe::gemm_grouped (gemm_grouped.hpp; docs/gemm.md "Grouped GEMMs").
//
// Map of this file
//   1. per-stream scratch (tables, decoded operands, saved outputs, the exactness flag)
//   2. operands: each side's OperandInfo (what the groups share) and its source (per-group
//      tensors known on the host, a plugin's device table, a dense split tensor), with the
//      bounds the host can give for any split (decoded elements, tiles, block scales)
//   3. the grouped run: describe (device tables), decode (emulated / dense), save (accumulate
//      with a device check), the CUTLASS grouped GEMM, K = 0 epilogue, exact recompute
//   4. gemm_grouped_cuda(): plan (gemm/grouped_pairing.cpp), per-group fallback, checks
//
// Nothing here reads a group size on the host when the splits live on the device: every size
// goes from the offsets to the tables to the kernels on the device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_device_guard.hpp"
#include "gemm/cuda/grouped_cuda_kernels.hpp"
#include "gemm/grouped_internal.hpp"
#include "gemm/grouped_kernels.hpp"
#include "qrecipe/cuda.hpp"
#include "qrecipe/error.hpp"

#if defined(QRECIPE_WITH_CUTLASS)
#include "gemm/cuda/cutlass/grouped_cutlass.hpp"
#endif

namespace qrecipe::detail {
namespace {

using grouped::GroupOperand;
using grouped::GroupOutput;
using grouped::OperandInfo;
using grouped::OperandSource;
using grouped::Source;

void check_cuda(cudaError_t status, const char* call, const std::string& what) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "CUDA call ", call, " failed with ", cudaGetErrorName(status),
                " (", cudaGetErrorString(status), ") during the grouped GEMM ", what,
                "; check the device with nvidia-smi");
}

// ---------------------------------------------------------------- 1. scratch

// Grow-only device buffers per (thread, device, stream) and slot: calls on one stream reuse
// them in stream order (a later call's kernels run after an earlier call's), calls that may
// run concurrently (other streams, threads) never share one. Growing frees the old buffer
// (cudaFree waits for the work that used it) and is rare after the first steps.
enum Slot : int {
  kSlotCutlass = 0,  // grouped_cutlass.hpp kCutlassScratchSlot
  kSlotTables = 1,
  kSlotDecodedA = 2,
  kSlotDecodedB = 3,
  kSlotSaved = 4,
  kSlotFlag = 5,
  kSlots = 6
};

struct ScratchSet {
  Buffer buffers[kSlots];
  std::uint32_t epoch = 0;
};

ScratchSet& scratch_set(int device, void* stream) {
  thread_local std::map<std::pair<int, void*>, ScratchSet> sets;
  return sets[{device, stream}];
}

struct ScratchContext {
  int device;
  void* stream;
};

void* scratch(void* ctx, std::size_t bytes, int slot) {
  const auto* c = static_cast<const ScratchContext*>(ctx);
  Buffer& buffer = scratch_set(c->device, c->stream).buffers[slot];
  if (buffer.bytes() < bytes || buffer.data() == nullptr)
    buffer = Buffer(cuda_allocator(), std::max<std::size_t>(bytes, 256), Device::cuda(c->device));
  return buffer.data();
}

// The exactness flag of this (device, stream) and the next epoch (gemm_cuda_kernels.hpp).
gemm_kernels::ExactnessFlag next_flag(const ScratchContext& c, const std::string& what) {
  ScratchSet& set = scratch_set(c.device, c.stream);
  Buffer& buffer = set.buffers[kSlotFlag];
  const auto s = static_cast<cudaStream_t>(c.stream);
  if (buffer.data() == nullptr) {
    buffer = Buffer(cuda_allocator(), 256, Device::cuda(c.device));
    check_cuda(cudaMemsetAsync(buffer.data(), 0, 256, s), "cudaMemsetAsync (exactness flag)", what);
  }
  auto* word = static_cast<std::uint32_t*>(buffer.data());
  if (++set.epoch == 0) {  // wrapped: no old epoch may meet a new one
    check_cuda(cudaMemsetAsync(word, 0, sizeof(std::uint32_t), s), "cudaMemsetAsync (exactness flag)", what);
    set.epoch = 1;
  }
  return {word, set.epoch};
}

// ---------------------------------------------------------------- 2. operands

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }

int log2_exact(std::int64_t v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int k = 0;
  while ((std::int64_t{1} << k) < v) ++k;
  return k;
}

// The shared description of a quantized direction's groups from its layout (stored frame); `q`
// made them (the owning format's tensor_scale_numerator for an amax-derived factor).
OperandInfo info_of_layout(const qr_direction_layout& l, const OperandTraits& t, const Quantizer& q) {
  OperandInfo info;
  info.k_major = t.inner_contiguous;
  switch (l.data_dtype) {
    case QR_DTYPE_E4M3: info.code = grouped::Code::e4m3; break;
    case QR_DTYPE_E5M2: info.code = grouped::Code::e5m2; break;
    case QR_DTYPE_E2M1: info.code = grouped::Code::e2m1; break;
    default: info.code = grouped::Code::bf16; break;
  }
  const bool transposed = l.data_transposed != 0;
  switch (l.scale_mode) {
    case QR_SCALE_TENSOR: info.factor = grouped::Factor::value; break;
    case QR_SCALE_BLOCK:
      info.scale = l.scale_dtype == QR_DTYPE_E8M0 ? grouped::BlockScale::e8m0 : grouped::BlockScale::f32;
      info.check = true;  // exact in BF16 depending on the data (gemm_cuda_kernels.hpp)
      break;
    case QR_SCALE_BLOCK_TENSOR:
      info.scale = grouped::BlockScale::e4m3;
      info.factor = grouped::Factor::from_amax;
      info.numerator = q.direction_plugin(l).tensor_scale_numerator();
      // 0: the format gives no per-tensor decode factor (plugin_abi.h), so only its plugin
      // can decode these groups.
      QR_CHECK_CODE(info.numerator > 0.0f, QR_STATUS_UNSUPPORTED, "grouped GEMM: a direction "
                    "with block and tensor scales whose format declares no "
                    "tensor_scale_numerator cannot be decoded by the engine; use per-group "
                    "GEMMs");
      break;
    default: break;
  }
  if (info.scale != grouped::BlockScale::none) {
    info.block_rows_log2 = log2_exact(transposed ? l.block_cols : l.block_rows);
    info.block_cols_log2 = log2_exact(transposed ? l.block_rows : l.block_cols);
    info.scale_transposed = (l.scale_transposed != 0) != transposed;
  }
  return info;
}

// One group of a quantized per-group operand as the kernels read it.
GroupOperand group_of(const GemmOperand& g, const OperandInfo& info) {
  GroupOperand o;
  if (!g.tensor) {
    const TensorView& t = g.high_precision;
    o.data = t.data();
    o.rows = t.rows();
    o.cols = t.cols();
    o.ld = t.cols();
    return o;
  }
  const qr_direction_data& dd = g.tensor->direction(g.direction);
  const qr_direction_layout& l = dd.layout;
  QR_CHECK_CODE(l.data_ndim == 2, QR_STATUS_UNSUPPORTED, "grouped GEMM operand ", g.str(),
                ": its data is not a 2-D array");
  o.data = dd.data.data;
  o.rows = l.data_shape[0];
  o.cols = l.data_shape[1];
  o.ld = info.code == grouped::Code::e2m1 ? round_up(o.cols, 2) : o.cols;
  if (info.factor == grouped::Factor::value) o.factor = static_cast<const float*>(dd.scale_inv.data);
  if (info.factor == grouped::Factor::from_amax) o.factor = static_cast<const float*>(dd.amax.data);
  if (info.scale != grouped::BlockScale::none) {
    o.scales = dd.scale_inv.data;
    o.scale_ld = l.scale_ndim == 2 ? l.scale_shape[1] : 0;
  }
  return o;
}

// One side of the grouped GEMM as the device tables will hold it.
struct Side {
  OperandInfo info;
  OperandSource source;
  std::vector<GemmOperand> operands;  // Source::host: the groups as GEMM operands
  // Split sides (plugin_table, dense_split): the extent that varies per group sums to the
  // splits' total over the groups; `fixed` is the other one (logical outer / inner frame).
  bool outer_varies = false;
  std::int64_t fixed = 0;
};

Side side_of(const GroupedOperand& op, const GroupedGemmOptions& options, std::int64_t groups,
             const OperandTraits& traits, const char* which) {
  Side s;
  const bool device_split = op.is_split() && options.splits && !options.splits->host_readable();
  if (device_split && op.tensor) {
    QR_CHECK_CODE(op.tensor->device_split(), QR_STATUS_INTERNAL, "grouped GEMM operand ", which,
                  ": device splits but per-group tensors");
    const qr_grouped_direction& gd = op.tensor->direction(op.direction);
    QR_CHECK_CODE(op.quantizer != nullptr, QR_STATUS_INTERNAL, "grouped GEMM operand ", which,
                  ": a split tensor without the quantizer that made it");
    s.info = info_of_layout(gd.layout, traits, *op.quantizer);
    s.source.source = Source::plugin_table;
    s.source.entries = gd.groups;
    s.source.transposed = gd.layout.data_transposed != 0;
    s.source.factor = s.info.factor;
    s.source.cols = op.tensor->cols();
    s.outer_varies = op.direction == QR_DIRECTION_ROWWISE;
    s.fixed = op.tensor->cols();
    return s;
  }
  if (device_split) {  // a dense split tensor cut by device offsets
    s.info.code = grouped::Code::bf16;  // the plan admits BF16 dense operands only
    s.info.k_major = op.direction == QR_DIRECTION_ROWWISE;
    s.source.source = Source::dense_split;
    s.source.base = op.dense.data();
    s.source.element_bytes = dtype_bits(op.dense.dtype()) / 8;
    s.source.cols = op.dense.cols();
    s.outer_varies = op.direction == QR_DIRECTION_ROWWISE;
    s.fixed = op.dense.cols();
    return s;
  }
  // Groups the host knows: per-group tensors, given or cut from a split tensor by host splits.
  s.operands = host_operands(op, options, groups, which);
  const GemmOperand& first = s.operands.front();
  if (first.tensor) {
    QR_CHECK_CODE(first.quantizer != nullptr, QR_STATUS_INTERNAL, "grouped GEMM operand ", which,
                  ": a quantized group without its quantizer");
    s.info = info_of_layout(first.tensor->direction(first.direction).layout, traits,
                            *first.quantizer);
  } else {
    s.info.code = grouped::Code::bf16;
    s.info.k_major = first.direction == QR_DIRECTION_ROWWISE;
  }
  return s;
}

// Sums over the groups of one side, exact for host groups and bounds for split ones (`total`
// rows over `groups` groups; the varying extent of group g is at most its share).
struct SideSizes {
  std::int64_t decoded = 0;  // BF16 elements once decoded K-major, rows padded to 8
  std::int64_t tiles = 0;    // 64 x 64 tiles of the stored arrays
  std::int64_t scales = 0;   // repacked block scales (block_outer x 128 blocks)
};

SideSizes sizes_of(const Side& s, int block_outer, std::int64_t total, std::int64_t groups) {
  SideSizes z;
  const auto add = [&](std::int64_t outer, std::int64_t inner) {
    z.decoded += outer * round_up(inner, 8);
    const std::int64_t rows = s.info.k_major ? outer : inner, cols = s.info.k_major ? inner : outer;
    z.tiles += ceil_div(rows, 64) * ceil_div(cols, 64);
    z.scales += ceil_div(outer, block_outer) * ceil_div(inner, 128);
  };
  if (s.source.source == Source::host) {
    for (const GemmOperand& g : s.operands) add(g.outer(), g.inner());
    return z;
  }
  // Split: sum_g ceil(v_g / d) <= total / d + groups for any split of `total` into `groups`.
  const std::int64_t f = s.fixed;
  const auto varying_blocks = [&](std::int64_t d) { return total / d + groups; };
  if (s.outer_varies) {
    z.decoded = total * round_up(f, 8);
    z.scales = varying_blocks(block_outer) * ceil_div(f, 128);
  } else {
    z.decoded = f * (total + 7 * groups);
    z.scales = ceil_div(f, block_outer) * varying_blocks(128);
  }
  z.tiles = varying_blocks(64) * ceil_div(f, 64);  // one stored extent varies, the other is f
  return z;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether a host side can be read by TMA as it is (16-byte aligned rows and pointers).
bool host_side_aligned(const Side& s, std::string& why) {
  const int bits = s.info.code == grouped::Code::bf16 ? 16 : s.info.code == grouped::Code::e2m1 ? 4 : 8;
  for (std::size_t g = 0; g < s.operands.size(); ++g) {
    const GroupOperand o = group_of(s.operands[g], s.info);
    if (o.rows * o.cols == 0) continue;
    if (o.ld * bits % 128 != 0 || !aligned16(o.data)) {
      why = "group " + std::to_string(g) + " (" + s.operands[g].str() + ") has rows of " +
            std::to_string(o.ld) + " elements or an address that is not 16-byte aligned";
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------- 3. the grouped run

struct Run {
  GemmKind kind;
  const GroupedGemmOptions& options;
  std::int64_t groups;
  int device;
  std::string what;
  Side a, b;
  bool out_split = false;
  std::vector<TensorView> outs;  // host outputs
  TensorView out_split_view;
  DType out_dtype = DType::bf16;
};

// Writes the tables of every group: describe launches of kHostGroupsPerLaunch groups.
void describe_all(const Run& r, GroupOperand* ta, GroupOperand* tb, GroupOutput* tout,
                  GroupOutput* told, void* saved) {
  const std::int32_t out_bytes = dtype_bits(r.out_dtype) / 8;
  grouped::DescribeArgs d;
  d.a = r.a.source;
  d.b = r.b.source;
  d.out.source = r.out_split ? Source::dense_split : Source::host;
  d.out.base = r.out_split ? r.out_split_view.data() : nullptr;
  d.out.element_bytes = out_bytes;
  d.out.cols = r.out_split ? r.out_split_view.cols() : 0;
  d.old_base = saved;
  d.offsets = r.options.splits ? r.options.splits->offsets : nullptr;
  d.table_a = ta;
  d.table_b = tb;
  d.table_out = tout;
  d.table_old = told;
  std::int64_t saved_at = 0;  // host outputs: saved copies packed one after the other
  for (std::int64_t first = 0; first < r.groups; first += grouped::kHostGroupsPerLaunch) {
    grouped::HostTable host{};
    d.first = static_cast<int>(first);
    d.count = static_cast<int>(std::min<std::int64_t>(grouped::kHostGroupsPerLaunch, r.groups - first));
    for (int t = 0; t < d.count; ++t) {
      const auto g = static_cast<std::size_t>(first + t);
      if (r.a.source.source == Source::host) host.a[t] = group_of(r.a.operands[g], r.a.info);
      if (r.b.source.source == Source::host) host.b[t] = group_of(r.b.operands[g], r.b.info);
      if (!r.out_split) {
        const TensorView& o = r.outs[g];
        host.out[t] = {o.data(), o.rows(), o.cols(), o.cols()};
        if (told) {
          host.old[t] = {static_cast<char*>(saved) + saved_at * out_bytes, o.rows(), o.cols(), o.cols()};
          saved_at += o.rows() * o.cols();
        }
      }
    }
    grouped::describe(d, host, r.options.stream);
  }
}

// What a decoded side looks like to the GEMM: K-major BF16, no block scales, the per-tensor
// factor still per group (it goes into alpha).
OperandInfo decoded_info(const OperandInfo& stored) {
  OperandInfo info;
  info.code = grouped::Code::bf16;
  info.k_major = true;
  info.factor = stored.factor;
  info.numerator = stored.numerator;
  return info;
}

GemmPlan run_grouped(const Run& r, GroupedGemmPlan& plan, GroupedKernel kernel) {
  const ScratchContext ctx{r.device, r.options.stream};
  void* stream = r.options.stream;
  const std::int64_t total = r.options.splits ? r.options.splits->total : 0;
  const int block_b = kernel == GroupedKernel::block_1x128_128x128 ? 128 : 1;
  const SideSizes za = sizes_of(r.a, 1, total, r.groups), zb = sizes_of(r.b, block_b, total, r.groups);
  const bool native = plan.gemm.path == GemmPlan::Path::native;

  // Which sides are decoded (emulated and dense pairs): all but K-major BF16 that TMA can read.
  std::string unaligned;
  const auto needs_decode = [&](const Side& s) {
    if (native) return false;
    if (s.info.code != grouped::Code::bf16 || !s.info.k_major) return true;
    if (s.source.source == Source::host) return !host_side_aligned(s, unaligned);
    // A K-major dense split: rows of cols (a multiple of 16, the plan checked) from its base.
    return !aligned16(s.source.base);
  };
  const bool decode_a = needs_decode(r.a), decode_b = needs_decode(r.b);
  const bool check = (decode_a && r.a.info.check) || (decode_b && r.b.info.check);
  const bool save = check && r.options.accumulate;
  const std::int32_t out_bytes = dtype_bits(r.out_dtype) / 8;
  std::int64_t out_elements = 0, max_out = 0;  // all outputs, the largest one
  if (r.out_split) {
    out_elements = max_out = r.out_split_view.numel();
  } else {
    for (const TensorView& o : r.outs) {
      out_elements += o.numel();
      max_out = std::max(max_out, o.numel());
    }
  }

  // The tables: A, B, decoded A, decoded B, outputs, saved outputs, decode layouts.
  const auto g = static_cast<std::size_t>(r.groups);
  const auto align = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t op_bytes = align(g * sizeof(GroupOperand)), out_table = align(g * sizeof(GroupOutput));
  const std::size_t layout_bytes = align((2 * g + 2) * sizeof(std::int64_t));
  auto* tables = static_cast<char*>(scratch(const_cast<ScratchContext*>(&ctx),
                                            4 * op_bytes + 2 * out_table + 2 * layout_bytes, kSlotTables));
  auto* ta = reinterpret_cast<GroupOperand*>(tables);
  auto* tb = reinterpret_cast<GroupOperand*>(tables + op_bytes);
  auto* da = reinterpret_cast<GroupOperand*>(tables + 2 * op_bytes);
  auto* db = reinterpret_cast<GroupOperand*>(tables + 3 * op_bytes);
  auto* tout = reinterpret_cast<GroupOutput*>(tables + 4 * op_bytes);
  auto* told = reinterpret_cast<GroupOutput*>(tables + 4 * op_bytes + out_table);
  auto* layout_a = reinterpret_cast<std::int64_t*>(tables + 4 * op_bytes + 2 * out_table);
  auto* layout_b = reinterpret_cast<std::int64_t*>(tables + 4 * op_bytes + 2 * out_table + layout_bytes);
  void* saved = save ? scratch(const_cast<ScratchContext*>(&ctx),
                               static_cast<std::size_t>(out_elements) * out_bytes, kSlotSaved)
                     : nullptr;
  describe_all(r, ta, tb, tout, save ? told : nullptr, saved);

  gemm_kernels::ExactnessFlag flag;
  if (check) flag = next_flag(ctx, r.what);
  const auto decode = [&](const Side& s, const SideSizes& z, const GroupOperand* in, GroupOperand* out,
                          std::int64_t* layout, int slot) {
    grouped::DecodeArgs x;
    x.info = s.info;
    x.in = in;
    x.out = out;
    x.groups = static_cast<int>(r.groups);
    x.dst_elements = z.decoded;
    x.dst = static_cast<std::uint16_t*>(scratch(const_cast<ScratchContext*>(&ctx),
                                                static_cast<std::size_t>(z.decoded) * 2, slot));
    x.layout = layout;
    x.max_tiles = z.tiles;
    x.flag = flag;
    grouped::decode_to_bf16(x, stream);
  };
  if (decode_a) decode(r.a, za, ta, da, layout_a, kSlotDecodedA);
  if (decode_b) decode(r.b, zb, tb, db, layout_b, kSlotDecodedB);
  if (save)
    grouped::save_outputs_if_flagged(tout, told, static_cast<int>(r.groups), r.out_dtype == DType::bf16,
                                     max_out, flag, stream);

#if defined(QRECIPE_WITH_CUTLASS)
  grouped::CutlassArgs c;
  c.kernel = kernel;
  c.out_f32 = r.out_dtype == DType::f32;
  c.groups = static_cast<int>(r.groups);
  c.a = decode_a ? da : ta;
  c.b = decode_b ? db : tb;
  c.out = tout;
  c.info_a = decode_a ? decoded_info(r.a.info) : r.a.info;
  c.info_b = decode_b ? decoded_info(r.b.info) : r.b.info;
  c.alpha = r.options.alpha;
  c.accumulate = r.options.accumulate;
  c.max_scales_a = za.scales;
  c.max_scales_b = zb.scales;
  c.device = r.device;
  c.sm_count = gemm_kernels::multiprocessor_count(r.device);
  c.stream = stream;
  c.scratch = &scratch;
  c.scratch_ctx = const_cast<ScratchContext*>(&ctx);
  c.what = r.what.c_str();
  grouped::run_cutlass(c);
#else
  (void)kernel;
  QR_THROW_CODE(QR_STATUS_INTERNAL, "grouped GEMM ", r.what, ": planned on grouped kernels this "
                "build does not have");
#endif

  // K = 0 groups: the empty sum's epilogue (the grouped kernel was given no problem for them).
  const bool k_varies = r.a.source.source != Source::host && (!r.a.outer_varies || r.a.fixed == 0);
  bool any_empty_k = false;
  for (const GemmOperand& op : r.a.operands) any_empty_k |= op.inner() == 0;
  if (k_varies || any_empty_k) {
    grouped::EmptySumArgs e;
    e.a = ta;
    e.a_k_major = r.a.info.k_major;
    e.out = tout;
    e.groups = static_cast<int>(r.groups);
    e.alpha = r.options.alpha;
    e.accumulate = r.options.accumulate;
    e.out_bf16 = r.out_dtype == DType::bf16;
    e.max_elements = max_out;
    grouped::finish_empty_sums(e, stream);
  }
  if (check) {
    grouped::ExactGroupedArgs x;
    x.info_a = r.a.info;
    x.info_b = r.b.info;
    x.a = ta;
    x.b = tb;
    x.out = tout;
    x.old = save ? told : nullptr;
    x.groups = static_cast<int>(r.groups);
    x.alpha = r.options.alpha;
    x.accumulate = r.options.accumulate;
    x.out_bf16 = r.out_dtype == DType::bf16;
    x.flag = flag;
    x.device = r.device;
    grouped::exact_grouped_if_flagged(x, stream);
    plan.gemm.reason += "; a value BF16 cannot hold (a tiny or non-power-of-two block scale) makes "
                        "the device recompute the outputs from FP32-decoded operands";
  }
  if (!unaligned.empty()) plan.gemm.reason += "; copied K-major first: " + unaligned;
  return plan.gemm;
}

// "fprop 64 groups: A=..., B=... -> bf16".
std::string describe_call(GemmKind kind, const GroupedOperand& a, const GroupedOperand& b,
                          DType out, std::int64_t groups) {
  std::ostringstream os;
  os << gemm_kind_name(kind) << " of " << groups << " groups: A=" << a.str() << ", B=" << b.str()
     << " -> " << dtype_name(out);
  return os.str();
}

// Per-group shape checks of host sides (what qrecipe::gemm checks, group by group).
void check_host_shapes(const Run& r) {
  if (r.a.source.source != Source::host || r.b.source.source != Source::host) return;
  for (std::size_t g = 0; g < r.a.operands.size(); ++g) {
    const GemmOperand& a = r.a.operands[g];
    const GemmOperand& b = r.b.operands[g];
    QR_CHECK(a.inner() == b.inner(), "grouped GEMM ", r.what, ", group ", g, ": A is ", a.str(),
             " (contracts over ", a.inner(), ") but B is ", b.str(), " (", b.inner(), ")");
    if (!r.out_split) {
      const TensorView& o = r.outs[g];
      QR_CHECK(o.rows() == a.outer() && o.cols() == b.outer(), "grouped GEMM ", r.what, ", group ",
               g, ": the output is ", o.rows(), "x", o.cols(), " but A and B give ", a.outer(),
               "x", b.outer());
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- 4. entry

GroupedGemmPlan gemm_grouped_cuda(const GroupedOperand& a, const GroupedOperand& b,
                                  const GroupedOutput& out, const GroupedGemmOptions& options,
                                  std::int64_t groups) {
  const GemmKind kind = options.kind;
  const bool device_split = options.splits && !options.splits->host_readable();
  const OperandTraits ta = grouped_traits(a), tb = grouped_traits(b);
  const DType out_dtype = out.is_split() ? out.split.dtype() : out.groups.front().dtype();
  const std::string what = describe_call(kind, a, b, out_dtype, groups);
  bool bias = false;
  for (const void* p : options.bias) bias |= p != nullptr;

  // The fixed extents: B's outer (N), and A's inner (K) when A's groups vary in rows or its
  // outer (M) when they vary in the contraction (wgrad).
  QR_CHECK_CODE(!b.is_split() || b.direction == QR_DIRECTION_COLUMNWISE, QR_STATUS_UNSUPPORTED,
                "grouped GEMM ", what, ": operand B is split rowwise (its groups would give the "
                "output columns); a linear layer's grouped GEMMs split B only along the contraction");
  const std::int64_t n = b.is_split() ? b.split_cols() : b.groups.front().outer();
  const bool a_rows_vary = a.is_split() ? a.direction == QR_DIRECTION_ROWWISE : kind != GemmKind::wgrad;
  const std::int64_t k_or_m = a.is_split() ? a.split_cols()
                              : a_rows_vary ? a.groups.front().inner() : a.groups.front().outer();
  GroupedGemmPlan plan =
      plan_gemm_grouped(kind, ta, tb, out_dtype, options.accumulate, bias, n, k_or_m,
                        GemmTarget::sm90, device_split);
  if (plan.mode == GroupedGemmPlan::Mode::refused)
    QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "grouped GEMM ", what, " with the splits on ",
                  options.splits->device.str(), ": ", plan.reason);
  if (plan.mode == GroupedGemmPlan::Mode::per_group)
    return gemm_per_group(host_groups(a, b, out, options, groups), options, plan);

  DeviceGuard guard(out.is_split() ? out.split.device().index : out.groups.front().device().index,
                    "a grouped GEMM");
  Run r{kind, options, groups, out.is_split() ? out.split.device().index : out.groups.front().device().index,
        what, side_of(a, options, groups, ta, "A"), side_of(b, options, groups, tb, "B")};
  r.out_dtype = out_dtype;
  if (out.is_split() && device_split) {
    r.out_split = true;
    r.out_split_view = out.split;
    QR_CHECK(out.split.is_contiguous() && out.split.cols() == n, "grouped GEMM ", what,
             ": the split output ", out.split.str(), " must be contiguous with ", n, " columns");
  } else {
    r.outs = host_outputs(out, options);
    for (std::size_t g = 0; g < r.outs.size(); ++g)
      QR_CHECK(r.outs[g].dtype() == out_dtype && r.outs[g].is_contiguous() && r.outs[g].ndim() == 2,
               "grouped GEMM ", what, ": output ", g, " (", r.outs[g].str(), ") must be a contiguous "
               "2-D ", dtype_name(out_dtype), " tensor like output 0");
  }
  check_host_shapes(r);
  // Host sides of a native pair must be readable by TMA as they are; when one is not and the
  // host knows every group, the per-group loop runs instead.
  if (plan.gemm.path == GemmPlan::Path::native) {
    std::string why;
    for (const Side* s : {&r.a, &r.b})
      if (s->source.source == Source::host && !host_side_aligned(*s, why)) {
        if (device_split)
          QR_THROW_CODE(QR_STATUS_UNSUPPORTED, "grouped GEMM ", what, ": ", why, "; the grouped "
                        "kernel reads 16-byte aligned rows (pass the splits as host sizes)");
        plan.mode = GroupedGemmPlan::Mode::per_group;
        plan.reason = why + ", so one GEMM per group";
        return gemm_per_group(host_groups(a, b, out, options, groups), options, plan);
      }
  }
  if (!r.out_split) {
    for (std::size_t g = 0; g < r.outs.size(); ++g)
      if (r.outs[g].numel() > 0 && (!aligned16(r.outs[g].data()) || r.outs[g].cols() * dtype_bits(out_dtype) % 128 != 0)) {
        QR_CHECK_CODE(!device_split, QR_STATUS_UNSUPPORTED, "grouped GEMM ", what, ": output ", g,
                      " is not 16-byte aligned; the grouped kernel writes aligned rows");
        plan.mode = GroupedGemmPlan::Mode::per_group;
        plan.reason = "output " + std::to_string(g) + " is not 16-byte aligned, so one GEMM per group";
        return gemm_per_group(host_groups(a, b, out, options, groups), options, plan);
      }
  } else {
    QR_CHECK_CODE(aligned16(out.split.data()), QR_STATUS_UNSUPPORTED, "grouped GEMM ", what,
                  ": the split output does not start on a 16-byte boundary");
  }
  const GroupedKernel kernel = plan.gemm.path == GemmPlan::Path::native
                                   ? native_grouped_kernel(kind, ta, tb)
                                   : GroupedKernel::bf16;
  run_grouped(r, plan, kernel);
  return plan;
}

}  // namespace qrecipe::detail
