// The CUTLASS grouped GEMM template shared by the instantiation units (fp8_fast.cu,
// fp8_split.cu, block_scaled.cu, bf16.cu): kernel types, the argument set-up kernels and the
// launcher. Internal; include only from those units (it pulls in CUTLASS, which is slow to
// compile). grouped_cutlass.hpp says what the kernels compute.
//
// Map (docs/architecture.md, "Conventions", rule 11): 1. kernel types (PlainGemm, BlockScaledGemm); 2. the device argument
// arrays and the prepare kernel (one block: problem sizes, pointers, strides, alphas, and for
// block-scaled ones the scale prefix sums by a chunked scan); 3. the block-scale repack kernel; 4.
// the launcher (scratch, CUTLASS Arguments, can_implement, initialize, run).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass_names/cutlass_block_scaled.hpp"  // third_party/: CUTLASS's names for these
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "gemm/cuda/cutlass/grouped_cutlass.hpp"
#include "gemm/cuda/decode_values.cuh"
#include "qrecipe/error.hpp"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "the grouped GEMMs need CUTLASS's SM90 ptr-array kernels: compile for sm_90a with CUDA >= 12.3"
#endif

namespace qrecipe::detail::grouped::cutlass_impl {

using namespace cute;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;

// ---------------------------------------------------------------- 1. kernel types

// 16-byte (TMA) alignment in elements.
template <class Element>
inline constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;

template <class ElementD, class TileShape, class ClusterShape>
using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    ElementD, cutlass::layout::RowMajor*, kAlignment<ElementD>,
    ElementD, cutlass::layout::RowMajor*, kAlignment<ElementD>,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;

// A K-major x K-major grouped GEMM (A row-major [M, K], B "column-major" [N, K]).
template <class ElementA, class ElementB, class ElementD, class TileShape, class ClusterShape,
          class KernelSchedule>
struct PlainGemm {
  using CollectiveEpilogue = Epilogue<ElementD, TileShape, ClusterShape>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, cutlass::layout::RowMajor*, kAlignment<ElementA>,
      ElementB, cutlass::layout::ColumnMajor*, kAlignment<ElementB>, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr bool kBlockScaled = false;
  static constexpr int kScaleGranularityN = 0;
  struct LayoutSFA {};
  struct LayoutSFB {};
};

// FP8 with FP32 block scales: A in 1x128 blocks (one scale per row and 128 of K, stored
// M-major), B in 128x128 tiles (K-major scales) or 1x128 blocks (N-major scales).
template <class ElementD, int kScaleN, class TileShape, class ClusterShape>
struct BlockScaledGemm {
  using ScaleConfig = qrecipe_cutlass_names::Sm90BlockScaleConfig<
      1, kScaleN, 128, cute::GMMA::Major::MN,
      kScaleN == 1 ? cute::GMMA::Major::MN : cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using CollectiveEpilogue = Epilogue<ElementD, TileShape, ClusterShape>;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cutlass::float_e4m3_t, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
      kAlignment<cutlass::float_e4m3_t>,
      cutlass::float_e4m3_t, cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>,
      kAlignment<cutlass::float_e4m3_t>, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      qrecipe_cutlass_names::KernelPtrArrayCooperativeFP8BlockScaled>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr bool kBlockScaled = true;
  static constexpr int kScaleGranularityN = kScaleN;
};

// ---------------------------------------------------------------- 2. arguments, prepare

template <class Cfg>
struct Types {
  using Gemm = typename Cfg::Gemm;
  using ElementA = typename Gemm::ElementA;
  using ElementB = typename Gemm::ElementB;
  using ElementD = typename Gemm::ElementD;
  using StrideA = typename Gemm::GemmKernel::InternalStrideA;
  using StrideB = typename Gemm::GemmKernel::InternalStrideB;
  using StrideC = typename Gemm::GemmKernel::InternalStrideC;
  using StrideD = typename Gemm::GemmKernel::InternalStrideD;
  using Problem = typename ProblemShape::UnderlyingProblemShape;
};

// The device arrays CUTLASS reads (in one scratch allocation).
template <class Cfg>
struct Arrays {
  using T = Types<Cfg>;
  typename T::Problem* problems;
  const typename T::ElementA** ptr_a;
  typename T::StrideA* stride_a;
  const typename T::ElementB** ptr_b;
  typename T::StrideB* stride_b;
  const typename T::ElementD** ptr_c;
  typename T::StrideC* stride_c;
  typename T::ElementD** ptr_d;
  typename T::StrideD* stride_d;
  float* alpha;
  const float** alpha_ptr;
  // block-scaled only
  const float** ptr_sfa;
  typename Cfg::LayoutSFA* layout_sfa;
  const float** ptr_sfb;
  typename Cfg::LayoutSFB* layout_sfb;
  float* sfa;
  float* sfb;
  std::int64_t* prefix;  // [0, G]: A's repacked scale prefix; [G + 1, 2G + 1]: B's
};

// Every stride here is (leading dimension, 1, 0): the K-major operands and the row-major output.
template <class Stride>
__device__ __forceinline__ Stride leading(std::int64_t ld) {
  static_assert(cute::is_static_v<decltype(cute::get<1>(Stride{}))>, "expected a unit inner stride");
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

constexpr int kPrepareThreads = 1024;

// __host__ too: run() sizes the repack launch with it. A host call of a __device__-only function
// compiles without a word in a template and runs nvcc's host stub, which calls exit(1): the
// block-scaled kernels stopped the process that way (tests/check_device_stub_calls.py).
__host__ __device__ __forceinline__ std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Group g's repacked scale counts: A one per row and 128 of K; B per (N block, 128 of K).
template <class Cfg>
__device__ __forceinline__ void scale_counts(std::int64_t m, std::int64_t n, std::int64_t k,
                                             std::int64_t& na, std::int64_t& nb) {
  na = m * cdiv(k, 128);
  nb = cdiv(n, Cfg::kScaleGranularityN) * cdiv(k, 128);
}

template <class Cfg>
__global__ void __launch_bounds__(kPrepareThreads) prepare_kernel(const CutlassArgs args, const Arrays<Cfg> arr) {
  using T = Types<Cfg>;
  __shared__ std::int64_t scan[2][kPrepareThreads];
  __shared__ std::int64_t carry[2];
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  for (int base = 0; base < args.groups; base += kPrepareThreads) {
    const int g = base + static_cast<int>(threadIdx.x);
    std::int64_t na = 0, nb = 0, m = 0, n = 0, k = 0;
    if (g < args.groups) {
      const GroupOperand a = args.a[g], b = args.b[g];
      const GroupOutput d = args.out[g];
      m = d.rows;
      n = d.cols;
      k = a.cols;  // K-major: stored [outer, inner]
      const bool empty = m == 0 || n == 0 || k == 0;  // K = 0: the caller's epilogue
      arr.problems[g] = empty ? typename T::Problem(0, 0, 0)
                              : typename T::Problem(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
      arr.ptr_a[g] = static_cast<const typename T::ElementA*>(a.data);
      arr.stride_a[g] = leading<typename T::StrideA>(a.ld);
      arr.ptr_b[g] = static_cast<const typename T::ElementB*>(b.data);
      arr.stride_b[g] = leading<typename T::StrideB>(b.ld);
      arr.ptr_d[g] = static_cast<typename T::ElementD*>(d.data);
      arr.stride_d[g] = leading<typename T::StrideD>(d.ld);
      arr.ptr_c[g] = static_cast<const typename T::ElementD*>(d.data);
      arr.stride_c[g] = leading<typename T::StrideC>(d.ld);
      // alpha * (factor_a * factor_b): the dense emulation's order (gemm_cuda_kernels.cu).
      arr.alpha[g] = args.alpha *
                     (gemm_kernels::factor_value({args.info_a.factor, a.factor, args.info_a.numerator}) *
                      gemm_kernels::factor_value({args.info_b.factor, b.factor, args.info_b.numerator}));
      arr.alpha_ptr[g] = arr.alpha + g;
      if constexpr (Cfg::kBlockScaled) {
        if (!empty) scale_counts<Cfg>(m, n, k, na, nb);
      }
    }
    if constexpr (Cfg::kBlockScaled) {
      __syncthreads();
      scan[0][threadIdx.x] = na;
      scan[1][threadIdx.x] = nb;
      __syncthreads();
      for (int step = 1; step < kPrepareThreads; step *= 2) {
        const std::int64_t pa = threadIdx.x >= step ? scan[0][threadIdx.x - step] : 0;
        const std::int64_t pb = threadIdx.x >= step ? scan[1][threadIdx.x - step] : 0;
        __syncthreads();
        scan[0][threadIdx.x] += pa;
        scan[1][threadIdx.x] += pb;
        __syncthreads();
      }
      if (g < args.groups) {
        const std::int64_t fa = carry[0] + scan[0][threadIdx.x] - na;
        const std::int64_t fb = carry[1] + scan[1][threadIdx.x] - nb;
        arr.prefix[g] = fa;
        arr.prefix[args.groups + 1 + g] = fb;
        arr.ptr_sfa[g] = arr.sfa + fa;
        arr.ptr_sfb[g] = arr.sfb + fb;
        const auto shape = cute::make_shape(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1);
        arr.layout_sfa[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFA(shape);
        arr.layout_sfb[g] = Cfg::ScaleConfig::tile_atom_to_shape_SFB(shape);
      }
      __syncthreads();
      if (threadIdx.x == kPrepareThreads - 1) {
        carry[0] += scan[0][kPrepareThreads - 1];
        carry[1] += scan[1][kPrepareThreads - 1];
      }
      __syncthreads();
    }
  }
  if constexpr (Cfg::kBlockScaled) {
    if (threadIdx.x == 0) {
      arr.prefix[args.groups] = carry[0];
      arr.prefix[2 * args.groups + 1] = carry[1];
    }
  }
}

// ---------------------------------------------------------------- 3. block-scale repack

constexpr int kRepackThreads = 256;
constexpr int kRepackPerThread = 4;
constexpr std::int64_t kRepackPerBlock = std::int64_t{kRepackThreads} * kRepackPerThread;

__device__ __forceinline__ int find_group(const std::int64_t* prefix, int groups, std::int64_t e) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (prefix[mid] <= e) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float scale_of(const OperandInfo& info, const GroupOperand& op, std::int64_t o,
                                          std::int64_t kb) {
  // The block of stored element (o, 128 kb) of a K-major operand.
  const std::int64_t bp = o >> info.block_rows_log2, bq = (kb * 128) >> info.block_cols_log2;
  const std::int64_t i = info.scale_transposed ? bq * op.scale_ld + bp : bp * op.scale_ld + bq;
  return static_cast<const float*>(op.scales)[i];
}

// Blocks [0, blocks_a) repack A's scales, the rest B's, into the layouts CUTLASS derives from
// each group's problem shape (the scale config's tile_atom_to_shape_SF*): A M-major
// [ceil(K/128)][M]; B K-major [ceil(N/128)][ceil(K/128)] (128x128) or N-major [ceil(K/128)][N].
template <class Cfg>
__global__ void __launch_bounds__(kRepackThreads)
    repack_kernel(const CutlassArgs args, const Arrays<Cfg> arr, std::int64_t blocks_a) {
  const bool is_a = static_cast<std::int64_t>(blockIdx.x) < blocks_a;
  const std::int64_t* prefix = arr.prefix + (is_a ? 0 : args.groups + 1);
  const std::int64_t total = prefix[args.groups];
  const std::int64_t first = (is_a ? blockIdx.x : blockIdx.x - blocks_a) * kRepackPerBlock;
  for (int i = 0; i < kRepackPerThread; ++i) {
    const std::int64_t e = first + threadIdx.x + std::int64_t{kRepackThreads} * i;
    if (e >= total) return;
    const int g = find_group(prefix, args.groups, e);
    const std::int64_t local = e - prefix[g];
    const GroupOutput d = args.out[g];
    if (is_a) {
      const std::int64_t m = d.rows;
      arr.sfa[e] = scale_of(args.info_a, args.a[g], local % m, local / m);
    } else if constexpr (Cfg::kScaleGranularityN == 1) {
      const std::int64_t n = d.cols;
      arr.sfb[e] = scale_of(args.info_b, args.b[g], local % n, local / n);
    } else {
      const std::int64_t kbs = cdiv(args.a[g].cols, 128);
      arr.sfb[e] = scale_of(args.info_b, args.b[g], (local / kbs) * Cfg::kScaleGranularityN, local % kbs);
    }
  }
}

// ---------------------------------------------------------------- 4. launcher

inline void check_cuda(cudaError_t status, const char* call, const CutlassArgs& args) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "CUDA call ", call, " failed with ", cudaGetErrorName(status),
                " (", cudaGetErrorString(status), ") during the grouped GEMM ", args.what,
                "; an earlier asynchronous error may also surface here: rerun with "
                "CUDA_LAUNCH_BLOCKING=1 to find it");
}

inline void check_cutlass(cutlass::Status status, const char* step, const CutlassArgs& args) {
  if (status == cutlass::Status::kSuccess) return;
  QR_THROW_CODE(QR_STATUS_DEVICE_ERROR, "CUTLASS ", step, " of the grouped GEMM ", args.what, " (",
                grouped_kernel_name(args.kernel), ") failed: ", cutlass::cutlassGetStatusString(status),
                " (", static_cast<int>(status), ")");
}

inline std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Carves `Arrays` out of `base` (nullptr: only computes the size, returned).
template <class Cfg>
std::size_t carve(Arrays<Cfg>& arr, char* base, const CutlassArgs& args) {
  using T = Types<Cfg>;
  const auto g = static_cast<std::size_t>(args.groups);
  std::size_t at = 0;
  const auto take = [&](auto*& ptr, std::size_t count) {
    using P = std::remove_reference_t<decltype(ptr)>;
    ptr = base ? reinterpret_cast<P>(base + at) : nullptr;
    at += align256(count * sizeof(*ptr));
  };
  take(arr.problems, g);
  take(arr.ptr_a, g);
  take(arr.stride_a, g);
  take(arr.ptr_b, g);
  take(arr.stride_b, g);
  take(arr.ptr_c, g);
  take(arr.stride_c, g);
  take(arr.ptr_d, g);
  take(arr.stride_d, g);
  take(arr.alpha, g);
  take(arr.alpha_ptr, g);
  if constexpr (Cfg::kBlockScaled) {
    take(arr.ptr_sfa, g);
    take(arr.layout_sfa, g);
    take(arr.ptr_sfb, g);
    take(arr.layout_sfb, g);
    take(arr.sfa, static_cast<std::size_t>(args.max_scales_a));
    take(arr.sfb, static_cast<std::size_t>(args.max_scales_b));
    take(arr.prefix, 2 * g + 2);
  } else {
    arr.ptr_sfa = arr.ptr_sfb = nullptr;
    arr.layout_sfa = nullptr;
    arr.layout_sfb = nullptr;
    arr.sfa = arr.sfb = nullptr;
    arr.prefix = nullptr;
  }
  (void)sizeof(typename T::Problem);
  return at;
}

template <class Cfg>
typename Cfg::Gemm::Arguments arguments_of(const Arrays<Cfg>& arr, const CutlassArgs& args) {
  using Gemm = typename Cfg::Gemm;
  typename Gemm::Arguments x;
  x.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  // No host problem shapes: the sizes live on the device only.
  x.problem_shape = {args.groups, arr.problems, nullptr};
  if constexpr (Cfg::kBlockScaled) {
    x.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b,
                  arr.ptr_sfa, arr.layout_sfa, arr.ptr_sfb, arr.layout_sfb};
  } else {
    x.mainloop = {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b};
  }
  auto& fusion = x.epilogue.thread;
  fusion.alpha = 0.0f;
  fusion.alpha_ptr = nullptr;
  fusion.alpha_ptr_array = arr.alpha_ptr;
  fusion.dAlpha = {cute::_0{}, cute::_0{}, 1};
  fusion.beta = args.accumulate ? 1.0f : 0.0f;  // beta = 0: C is never read
  fusion.beta_ptr = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
  x.epilogue.ptr_C = args.accumulate ? arr.ptr_c : nullptr;
  x.epilogue.dC = arr.stride_c;
  x.epilogue.ptr_D = arr.ptr_d;
  x.epilogue.dD = arr.stride_d;
  x.hw_info.device_id = args.device;
  x.hw_info.sm_count = args.sm_count;
  return x;
}

// A unit asked for a kernel it does not instantiate: the plan and the units disagree.
[[noreturn]] inline void no_kernel(const CutlassArgs& args, const char* unit) {
  QR_THROW_CODE(QR_STATUS_INTERNAL, "grouped GEMM ", args.what, ": ", unit, " has no ",
                grouped_kernel_name(args.kernel), " kernel with a ", args.out_f32 ? "f32" : "bf16",
                " output (gemm/grouped_pairing.cpp and the instantiations disagree)");
}

template <class Cfg>
void run(const CutlassArgs& args) {
  using Gemm = typename Cfg::Gemm;
  const auto stream = static_cast<cudaStream_t>(args.stream);
  Arrays<Cfg> arr{};
  const std::size_t arrays = carve(arr, nullptr, args);
  const std::size_t workspace = align256(Gemm::get_workspace_size(arguments_of(arr, args)));
  char* base = static_cast<char*>(args.scratch(args.scratch_ctx, arrays + workspace, kCutlassScratchSlot));
  carve(arr, base, args);
  prepare_kernel<Cfg><<<1, kPrepareThreads, 0, stream>>>(args, arr);
  check_cuda(cudaGetLastError(), "prepare_kernel<<<>>>", args);
  if constexpr (Cfg::kBlockScaled) {
    const std::int64_t blocks_a = std::max<std::int64_t>(1, cdiv(args.max_scales_a, kRepackPerBlock));
    const std::int64_t blocks_b = std::max<std::int64_t>(1, cdiv(args.max_scales_b, kRepackPerBlock));
    QR_CHECK_CODE(blocks_a + blocks_b <= 0x7FFFFFFF, QR_STATUS_INTERNAL, "grouped GEMM ", args.what,
                  ": ", blocks_a + blocks_b, " scale repack blocks");
    repack_kernel<Cfg><<<static_cast<unsigned>(blocks_a + blocks_b), kRepackThreads, 0, stream>>>(args, arr,
                                                                                                 blocks_a);
    check_cuda(cudaGetLastError(), "repack_kernel<<<>>>", args);
  }
  const typename Gemm::Arguments x = arguments_of(arr, args);
  Gemm gemm;
  check_cutlass(gemm.can_implement(x), "can_implement", args);
  check_cutlass(gemm.initialize(x, base + arrays, stream), "initialize", args);
  check_cutlass(gemm.run(stream), "run", args);
  check_cuda(cudaGetLastError(), "the grouped GEMM launch", args);
}

}  // namespace qrecipe::detail::grouped::cutlass_impl
