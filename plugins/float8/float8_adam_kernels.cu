// CUDA kernels of the float8 plugin's fused Adam + requantize extra (float8_adam_kernels.hpp),
// bit-exact with the CPU path: adam::update of every element (adam.hpp), then float8_ref.cpp
// on the new FP32 master.
//
// Map of this file:
//   1. the tensor table (kernel parameter): operands, hyper, outputs and scaling per tensor
//   2. device helpers: encode four codes, store a 4 x 4 block's rowwise and columnwise codes
//   3. kernels: cast from the new master (current scaling, after adam_cuda.cuh's update +
//      amax pass); update + cast (delayed scaling)
//   4. the entry: checks, tables, launches
//
// Every tensor of a launch is found by a binary search of its block over the table's prefix
// sums of blocks (sdk::cuda::find_group), so one launch serves any mix of shapes. A block
// takes a 64 x 64 tile of one tensor, each thread a 4 x 4 block of it in registers (the scale
// is the tensor's, so no value is staged or exchanged): the thread encodes each of its 4 rows
// once, stores the words rowwise, and stores their byte transpose columnwise ([cols, rows]),
// so the columnwise bytes are the transpose of the rowwise bytes by construction.
//
// Exactness: amax = max |x| over the new master (NaN ignored, an exact max in any order);
// current: scale = scale_from_amax(amax, fmax, pow2, eps) (scaling.hpp); delayed: the state's
// scale; scale_inv = 1 / scale (IEEE); q = sat_rne(x * scale) through num::fast (proven equal
// to conversions.hpp). Compiled with -fmad=false --ftz=false like every plugin kernel.
#include "float8_adam_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "qrecipe/adam_cuda.cuh"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"
#include "qrecipe/fast_conversions.cuh"
#include "qrecipe/plugin_sdk_tensor.hpp"  // sdk::device_str
#include "qrecipe/scaling.hpp"

namespace qrecipe::float8::cuda {
namespace {

constexpr const char* kFormat = "float8";  // for QR_CUDA_CHECK (cuda_sdk.cuh)
namespace acuda = qrecipe::adam::cuda;
using sdk::cuda::amax_of;
using sdk::cuda::atomic_max_nonnegative;
using sdk::cuda::block_max;

// ---------------------------------------------------------------- 1. the tensor table

constexpr int kMaxTensorsPerLaunch = 64;

struct Entry {
  acuda::Operands ops;  // master [rows, cols] and its gradient and moments
  acuda::DeviceHyper hyper;
  std::uint8_t* rowwise;           // [rows, cols], or nullptr: not held
  std::uint8_t* columnwise;        // [cols, rows], or nullptr: not held
  float* rowwise_scale_inv;        // [1] or nullptr
  float* columnwise_scale_inv;     // [1] or nullptr
  float* amax_main;                // [1]: the tensor amax (rowwise's buffer when held)
  float* amax_other;               // the other direction's amax buffer (both held), or nullptr
  const float* delayed_scale;      // nullptr: current scaling
  float* history_row0;             // delayed scaling: the state's history row 0
  float fmax;
  float amax_epsilon;
  int pow2_scales;
  int e4m3;                        // 1: E4M3 codes, 0: E5M2
  std::int64_t tiles_per_row;
  std::int64_t first_block;        // prefix sum of blocks (find_group)
};
using Table = sdk::cuda::GroupTable<Entry, kMaxTensorsPerLaunch>;

// One block per 64 x 64 tile, each thread a 4 x 4 block of it in registers (adam_cuda.cuh,
// "4 x 4 blocks in registers"): one scale serves the whole tensor, so nothing is staged.
constexpr int kTile = acuda::kQuadTile;
constexpr int kThreads = acuda::kQuadThreads;
// update_cast_kernel: 16 values live across the block amax; at most 64 registers (4 blocks,
// 50% occupancy) without spills (ptxas -v; 48 spill).
constexpr int kUpdateMinBlocks = 4;

// ---------------------------------------------------------------- 2. device helpers

__device__ __forceinline__ std::uint32_t encode4(bool e4m3, const float (&x)[4], float scale) {
  const float a = x[0] * scale, b = x[1] * scale, c = x[2] * scale, d = x[3] * scale;
  return e4m3 ? num::fast::f32x4_to_e4m3x4(a, b, c, d) : num::fast::f32x4_to_e5m2x4(a, b, c, d);
}

// The codes of a thread's 4 x 4 block at (row, col) of the tensor (new master values x, +0
// outside the tensor) with `scale`: row i's codes rowwise, their transpose columnwise
// (columnwise[col][row]).
__device__ __forceinline__ void store_codes(const Entry& e, std::int64_t row, std::int64_t col,
                                            const float (&x)[4][4], float scale) {
  const bool e4m3 = e.e4m3 != 0;
  std::uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) words[i] = encode4(e4m3, x[i], scale);
  acuda::store_quad(e.rowwise, e.columnwise, row, col, e.ops.rows, e.ops.cols, words);
}

// Block 0 of a tensor writes 1 / scale into every direction it holds.
__device__ __forceinline__ void write_scale_inv(const Entry& e, float scale) {
  const float scale_inv = 1.0f / scale;
  if (e.rowwise_scale_inv != nullptr) *e.rowwise_scale_inv = scale_inv;
  if (e.columnwise_scale_inv != nullptr) *e.columnwise_scale_inv = scale_inv;
}

// ---------------------------------------------------------------- 3. kernels

// Current scaling, pass 2: one tile of a new master, cast with the scale of the tensor amax.
__global__ void __launch_bounds__(kThreads) cast_kernel(const __grid_constant__ Table table) {
  const auto tb = acuda::tile_block<kTile, kTile>(table);
  const Entry& e = tb.e;
  const float amax = *e.amax_main;
  const float scale = scale_from_amax(amax, e.fmax, e.pow2_scales != 0, e.amax_epsilon);
  if (tb.local == 0 && threadIdx.x == 0) {
    write_scale_inv(e, scale);
    if (e.amax_other != nullptr) *e.amax_other = amax;  // both directions store it
  }
  const acuda::Quad q = acuda::quad_of_thread();
  const std::int64_t row = tb.row0 + q.r, col = tb.col0 + q.c;
  std::int64_t offset[4];
  int valid[4];
  acuda::quad_runs(row, col, e.ops.rows, e.ops.cols, offset, valid);
  float x[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)  // +0 where valid[i] is 0
    acuda::load4(e.ops.param, QR_DTYPE_F32, offset[i], valid[i], e.ops.vec4 && valid[i] == 4,
                 x[i]);
  store_codes(e, row, col, x, scale);
}

// Delayed scaling, one pass: the update of one tile, cast with the state's scale; the tile's
// amax joins the tensor's amax buffers and the state's history row 0.
__global__ void __launch_bounds__(kThreads, kUpdateMinBlocks)
    update_cast_kernel(const __grid_constant__ Table table) {
  const auto tb = acuda::tile_block<kTile, kTile>(table);
  const Entry& e = tb.e;
  const adam::Scalars s = acuda::block_scalars(e.hyper);
  const float scale = *e.delayed_scale;
  if (tb.local == 0 && threadIdx.x == 0) write_scale_inv(e, scale);
  const acuda::Quad q = acuda::quad_of_thread();
  const std::int64_t row = tb.row0 + q.r, col = tb.col0 + q.c;
  std::int64_t offset[4];
  int valid[4];
  acuda::quad_runs(row, col, e.ops.rows, e.ops.cols, offset, valid);
  float x[4][4];  // +0 outside the tensor
#pragma unroll
  for (int h = 0; h < 4; h += 2) {  // two runs at a time: 4 would spill
    const std::int64_t pair_offset[2] = {offset[h], offset[h + 1]};
    const int pair_valid[2] = {valid[h], valid[h + 1]};
    float p[2][4];
    acuda::update_runs<2>(e.ops, s, pair_offset, pair_valid, p);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[h][k] = p[0][k];
      x[h + 1][k] = p[1][k];
    }
  }
  float running = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) running = amax_of(running, x[i][k]);
  const float block = block_max<kThreads>(running);
  if (threadIdx.x == 0 && block > 0.0f) {
    atomic_max_nonnegative(e.amax_main, block);
    if (e.amax_other != nullptr) atomic_max_nonnegative(e.amax_other, block);
    atomic_max_nonnegative(e.history_row0, block);
  }
  store_codes(e, row, col, x, scale);
}

// ---------------------------------------------------------------- 4. the entry

Entry make_entry(const qr_adam_tensor& t, const AdamPlan& plan) {
  Entry e{};
  e.ops = acuda::operands(t);
  e.hyper = acuda::device_hyper(*t.hyper);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_ROWWISE, e.rowwise, e.rowwise_scale_inv);
  acuda::direction_buffers(*t.dst, QR_DIRECTION_COLUMNWISE, e.columnwise,
                           e.columnwise_scale_inv);
  acuda::amax_targets(*t.dst, e.amax_main, e.amax_other);
  e.delayed_scale = plan.delayed_scale;
  e.history_row0 = plan.history_row0;
  e.fmax = plan.fmax;
  e.amax_epsilon = plan.amax_epsilon;
  e.pow2_scales = plan.pow2_scales ? 1 : 0;
  e.e4m3 = plan.data_dtype == QR_DTYPE_E4M3 ? 1 : 0;
  const std::int64_t cols = e.ops.cols;
  e.tiles_per_row = cols == 0 ? 1 : (cols + kTile - 1) / kTile;
  return e;
}

// The passes of one table of tensors sharing one kind of scaling.
void run_table(Table& table, bool delayed, cudaStream_t stream) {
  if (delayed) {
    acuda::zero_amax_kernel<Table><<<1, kMaxTensorsPerLaunch, 0, stream>>>(table);
    QR_CUDA_CHECK_LAUNCH("zero_amax_kernel");
  } else {
    acuda::launch_update_amax(table, stream, kFormat);  // zero, then update + amax
  }
  // At least one block per tensor, even an empty one: it writes the scale_inv.
  const std::int64_t blocks = acuda::assign_blocks(table, [](const Entry& e) {
    return acuda::tiles_of(e.ops.rows, e.ops.cols, kTile, kTile);
  }, kFormat);
  if (delayed) {
    update_cast_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table);
    QR_CUDA_CHECK_LAUNCH("update_cast_kernel");
  } else {
    cast_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table);
    QR_CUDA_CHECK_LAUNCH("cast_kernel");
  }
}

}  // namespace

void adam_requantize(std::span<const qr_adam_tensor> tensors, std::span<const AdamPlan> plans,
                     void* stream) {
  QR_CHECK(tensors.size() == plans.size(), "float8 adam_requantize: ", plans.size(),
           " plans for ", tensors.size(), " tensors");
  if (tensors.empty()) return;
  const qr_device device = tensors[0].master.device;
  QR_CHECK(device.type == QR_DEVICE_CUDA, "float8 adam_requantize: the CUDA path got tensors on ",
           sdk::device_str(device));
  std::vector<Entry> current, delayed;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const AdamPlan& plan = plans[i];
    QR_CHECK(plan.data_dtype == QR_DTYPE_E4M3 || plan.data_dtype == QR_DTYPE_E5M2,
             "float8 adam_requantize: tensor ", i, " has data dtype code ",
             static_cast<int>(plan.data_dtype), ", not e4m3 or e5m2");
    QR_CHECK((plan.delayed_scale == nullptr) == (plan.history_row0 == nullptr),
             "float8 adam_requantize: tensor ", i, " has half a delayed-scaling state");
    (plan.delayed_scale != nullptr ? delayed : current).push_back(make_entry(tensors[i], plan));
  }
  sdk::cuda::DeviceGuard guard(device.index, kFormat);
  const cudaStream_t s = sdk::cuda::as_stream(stream);
  for (const bool is_delayed : {false, true}) {
    const std::vector<Entry>& entries = is_delayed ? delayed : current;
    acuda::for_each_table<Table>(entries.size(), [&](std::size_t i) { return entries[i]; },
                                 [&](Table& table) { run_table(table, is_delayed, s); });
  }
}

}  // namespace qrecipe::float8::cuda
