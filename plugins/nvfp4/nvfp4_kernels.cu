// CUDA kernels of the nvfp4 format, bit-exact with nvfp4_ref.cpp: the map of the passes and
// the quantize entry of nvfp4_kernels.hpp (its checks, the order of its passes, and which
// kernel each case runs). The passes live in files of their own:
//   nvfp4_amax.cu            pass 1 (plain and Hadamard amax) and the compute_amax_to_host entry
//   nvfp4_quantize_16bit.cu  pass 2, bf16 / f16 sources, either rounding (the hot path)
//   nvfp4_quantize_tile.cu   pass 2, f32 sources (1-D warp tiles, nvfp4_tile1d.cuh), and
//                            2d / Hadamard (64x64 tiles, nvfp4_tile64.cuh)
//   nvfp4_dequantize.cu      the dequantize kernel and entry
//   nvfp4_grouped_kernels.cu every group of a grouped call (the 1-D tile of nvfp4_tile1d.cuh)
// with the code they share in nvfp4_device.cuh (block scale code, pitches, QuantizeParams) and
// the launchers they export in nvfp4_passes.cuh.
//
// Passes of one quantize call (M x K source, docs/numerics.md, "nvfp4"):
//   pass 1, the tensor amax (skipped when the caller passes a reduced amax; both amax buffers
//   are zeroed by one launch first):
//     - plain: grid-stride 16-byte loads, max |x| into every requested direction's amax
//       (rowwise and columnwise amax are equal without Hadamard, and under 2d);
//     - Hadamard with columnwise requested: one block per 64x64 tile computes max |x| and
//       the max over the transformed BF16 columns from the same read of the tile.
//   pass 2, 1-D blocks (no 2d, no Hadamard: the common case):
//     - bf16 / f16 source (the hot path; stochastic rounding too, one Philox call per 4
//       elements and direction, philox.hpp): quantize_16bit_kernel, a
//       persistent grid over 64 x 128 tiles, counted in instructions per element (see above
//       it): packed 16-bit amax, table-driven encode factors, the byte-packing E2M1 encoder
//       num::fast::e2m1_magnitude_byte_below7, staged columnwise stores;
//     - f32 sources: quantize_1d_kernel, 32 x 32 warp tiles straight
//       from registers (see above it).
//     The E2M1 encoders and the block scale's hardware E4M3 conversion are proven equal to
//     the references over all 2^32 inputs (test_gpu_conversions).
//   pass 2 under 2d or Hadamard, quantize_kernel (the same fast conversions; instantiated per
//     source dtype and per rounding, so round-to-nearest carries no stochastic-rounding code):
//     one block of 256 threads per 64x64 tile. The tile is loaded once into shared memory as
//     FP32 (16-byte loads); then each thread quantizes one 1x16 rowwise block (64 rows x 4
//     blocks = 256) and one 16x1 columnwise block (64 columns x 4 blocks = 256) of that
//     tile, so the source is read once for both directions. Under Hadamard the
//     16x1 block is exactly one transform run (M % 16 == 0): the thread transforms it in
//     registers. Under 2d the rowwise threads also publish their block amax; each 16x16 tile's
//     scale is the max of its 16 row blocks, the codes are computed once (rowwise order, as
//     the reference) and parked in shared memory, and the columnwise threads store their
//     transpose.
//   Bytes moved for a bf16 source with both directions: pass 1 reads 2MK, pass 2 reads 2MK
//   and writes MK/2 + MK/2 data and 2 * MK/16 scales: 5.125 MK bytes (3.125 MK with a
//   caller-reduced amax); f32: 9.125 MK (5.125 MK).
//
// Exactness: every scalar rule is nvfp4_rules.hpp, the transform hadamard.hpp and the random
// words philox.hpp, all __host__ __device__ code the reference runs too; the plugin is
// compiled with -fmad=false --ftz=false --prec-div=true, so the device performs the same IEEE
// operations in the same order. Amaxes are exact maxima, so reduction order does not matter.
// NaN bit patterns never reach a stored byte through arithmetic (rules::decode_element).
#include "nvfp4_kernels.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "nvfp4_device.cuh"
#include "nvfp4_passes.cuh"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"

namespace qrecipe::nvfp4::cuda {
namespace {

// Which kernel runs stochastic rounding of 16-bit sources: the persistent 64 x 128 kernel of
// the hot path (default, QRECIPE_NVFP4_SR_KERNEL unset or "persistent"), or the 32 x 32 warp
// tiles ("tile1d", the kernel SR ran on before; kept so one GPU run can time both). Both write
// the same bytes.
bool sr_on_warp_tiles() {
  static const bool tile1d = [] {
    const char* v = std::getenv("QRECIPE_NVFP4_SR_KERNEL");
    const std::string s = v ? v : "";
    QR_CHECK(s.empty() || s == "persistent" || s == "tile1d", "QRECIPE_NVFP4_SR_KERNEL='", s,
             "' is not persistent or tile1d (unset it for the default, persistent)");
    return s == "tile1d";
  }();
  return tile1d;
}

}  // namespace

bool quantize_with_cast_supported(qr_dtype src_dtype, bool rowwise, bool columnwise, bool two_d,
                                  bool hadamard, bool stochastic, qr_dtype cast_dtype) {
  return (src_dtype == QR_DTYPE_BF16 || src_dtype == QR_DTYPE_F16) && !rowwise && columnwise &&
         !two_d && !hadamard && !stochastic &&
         (cast_dtype == QR_DTYPE_E4M3 || cast_dtype == QR_DTYPE_E5M2);
}

void quantize(const QuantizeArgs& a) {
  sdk::cuda::check_source_dtype(a.src_dtype, kFormat, "quantize");
  QR_CHECK(a.rows >= 0 && a.cols >= 0, "nvfp4 CUDA quantize: negative shape ", a.rows, " x ",
           a.cols);
  QR_CHECK(a.rowwise || a.columnwise, "nvfp4 CUDA quantize: no direction requested");
  const std::int64_t numel = a.rows * a.cols;
  QR_CHECK(numel == 0 || a.src != nullptr, "nvfp4 CUDA quantize: the source has a null data "
           "pointer");
  for (const DirectionBuffers* d : {a.rowwise, a.columnwise})
    QR_CHECK(!d || (d->amax != nullptr && (numel == 0 || (d->data && d->scales))),
             "nvfp4 CUDA quantize: a requested direction lacks its data, scale or amax buffer");
  QR_CHECK(!(a.hadamard && a.two_d), "nvfp4 CUDA quantize: hadamard and 2d cannot be combined");
  QR_CHECK(a.cast.data == nullptr ||
               (quantize_with_cast_supported(a.src_dtype, a.rowwise != nullptr,
                                             a.columnwise != nullptr, a.two_d, a.hadamard,
                                             a.stochastic_rounding,
                                             static_cast<qr_dtype>(a.cast.dtype)) &&
                (a.cast.scale != nullptr || a.cast.amax != nullptr)),
           "nvfp4 CUDA quantize: a per-tensor cast needs the columnwise direction alone, 1-D "
           "blocks, round to nearest, a bf16 / f16 source, an e4m3 / e5m2 cast and its scale or "
           "amax");
  QR_CHECK(a.device_amax == nullptr || (a.given_amax == nullptr && !a.hadamard),
           "nvfp4 CUDA quantize: a device amax replaces the amax pass; it cannot come with a "
           "caller's amax or with Hadamard (whose columnwise amax is another quantity)");
  QR_CHECK_CODE(!a.hadamard || !a.columnwise ||
                    (a.src_dtype == QR_DTYPE_BF16 && a.rows % kBlock == 0),
                QR_STATUS_UNSUPPORTED, "nvfp4 CUDA quantize: hadamard needs a bf16 source with "
                "rows % 16 == 0 (checked by the plugin before this call)");

  DeviceGuard guard(a.device_index, kFormat);
  const cudaStream_t s = as_stream(a.stream);
  float* row_amax = a.rowwise ? a.rowwise->amax : nullptr;
  float* col_amax = a.columnwise ? a.columnwise->amax : nullptr;

  // Pass 1: the tensor amax of each requested direction, in its amax buffer.
  if (a.given_amax) {
    // 2d stores one tensor amax, the rowwise entry (equal to the columnwise one by value;
    // copying it keeps -0 / +0 as the reference stores them).
    const float col_value = a.two_d ? a.given_amax[0] : a.given_amax[1];
    fill_amax(row_amax, a.given_amax[0], col_amax, col_value, s);
  } else if (a.device_amax) {
    // max |x| of this source, already on the device (the fused cast's prepare computed it):
    // the amax pass's result without the pass. Both directions' amaxes are max |x| here.
    for (float* dst : {row_amax, col_amax})
      if (dst)
        QR_CUDA_CHECK(cudaMemcpyAsync(dst, a.device_amax, sizeof(float),
                                      cudaMemcpyDeviceToDevice, s));
  } else {
    // Both amax buffers zeroed by one launch (the atomic maxima start from +0).
    fill_amax(row_amax, 0.0f, col_amax, 0.0f, s);
    if (numel > 0) {
      if (a.hadamard && col_amax)
        hadamard_amax(a.src, a.src_dtype, a.rows, a.cols, row_amax, col_amax, s);
      else
        plain_amax(a.src, a.src_dtype, numel, row_amax, col_amax, s);
    }
  }
  if (numel == 0) return;

  // Pass 2: both directions per tile.
  const QuantizeParams p = quantize_params(a);
  if (a.two_d || a.hadamard)
    quantize_tile(p, a.src_dtype, a.stochastic_rounding, s);
  else if (a.src_dtype == QR_DTYPE_F32 || (a.stochastic_rounding && sr_on_warp_tiles()))
    quantize_1d(p, a.src_dtype, a.stochastic_rounding, s);
  else
    quantize_16bit(p, a.src_dtype, a.stochastic_rounding, a.cast, s);
}

}  // namespace qrecipe::nvfp4::cuda
