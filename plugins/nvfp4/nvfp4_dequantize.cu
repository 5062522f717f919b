// Dequantize of nvfp4: the kernel (one logical output element per thread; not a hot path)
// and the dequantize entry of nvfp4_kernels.hpp.
//
// Exactness: as nvfp4_kernels.cu says (every scalar rule is nvfp4_rules.hpp, compiled with
// -fmad=false --ftz=false --prec-div=true; amaxes are exact maxima).
#include <cuda_runtime.h>

#include <cstdint>

#include "nvfp4_device.cuh"
#include "nvfp4_kernels.hpp"
#include "nvfp4_rules.hpp"
#include "qrecipe/conversions.hpp"
#include "qrecipe/cuda_sdk.cuh"
#include "qrecipe/error.hpp"

namespace qrecipe::nvfp4::cuda {
namespace {


// Dequantize: one logical output element per thread (grid-stride), so the writes are
// coalesced; the columnwise data is read transposed (a gather). Not a hot path.
constexpr int kDequantizeThreads = 256;
constexpr int kDequantizeMaxBlocks = 8192;

struct DequantizeParams {
  const std::uint8_t* data;
  const std::uint8_t* scales;
  const float* amax;
  std::int64_t rows, cols;  // logical
  bool transposed;
  std::int64_t pitch, spitch;  // of the data matrix ([cols, rows] when transposed)
  void* dst;
  qr_dtype dst_dtype;
};

__global__ void __launch_bounds__(kDequantizeThreads)
    dequantize_kernel(const DequantizeParams p) {
  const float s_dec = rules::decode_scale(*p.amax);
  const std::int64_t numel = p.rows * p.cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < numel; e += stride) {
    const std::int64_t r = e / p.cols, c = e % p.cols;
    const std::int64_t i = p.transposed ? c : r;  // data row
    const std::int64_t j = p.transposed ? r : c;  // element within it
    const std::uint8_t q = static_cast<std::uint8_t>((p.data[i * p.pitch + j / 2] >> ((j & 1) * 4)) & 0xFu);
    const float v = rules::decode_element(q, p.scales[i * p.spitch + j / kBlock], s_dec);
    if (p.dst_dtype == QR_DTYPE_F32) static_cast<float*>(p.dst)[e] = v;
    else if (p.dst_dtype == QR_DTYPE_BF16) static_cast<std::uint16_t*>(p.dst)[e] = num::f32_to_bf16(v);
    else static_cast<std::uint16_t*>(p.dst)[e] = num::f32_to_f16(v);
  }
}

}  // namespace

void dequantize(const std::uint8_t* data, const std::uint8_t* scales, const float* amax,
                std::int64_t rows, std::int64_t cols, bool transposed, void* dst,
                qr_dtype dst_dtype, int device_index, void* stream) {
  QR_CHECK_CODE(dst_dtype == QR_DTYPE_F32 || dst_dtype == QR_DTYPE_BF16 ||
                    dst_dtype == QR_DTYPE_F16,
                QR_STATUS_UNSUPPORTED, "nvfp4 CUDA dequantize: output dtype code ",
                static_cast<int>(dst_dtype), " is not f32, bf16 or f16");
  QR_CHECK(rows >= 0 && cols >= 0, "nvfp4 CUDA dequantize: negative shape ", rows, " x ", cols);
  const std::int64_t numel = rows * cols;
  if (numel == 0) return;
  QR_CHECK(data && scales && amax && dst, "nvfp4 CUDA dequantize: a null data, scale, amax or "
           "destination pointer");
  DeviceGuard guard(device_index, kFormat);
  DequantizeParams p{};
  p.data = data;
  p.scales = scales;
  p.amax = amax;
  p.rows = rows;
  p.cols = cols;
  p.transposed = transposed;
  const std::int64_t data_cols = transposed ? rows : cols;
  p.pitch = packed_pitch(data_cols);
  p.spitch = scale_pitch(data_cols);
  p.dst = dst;
  p.dst_dtype = dst_dtype;
  std::int64_t blocks = ceil_div(numel, kDequantizeThreads);
  blocks = blocks > kDequantizeMaxBlocks ? kDequantizeMaxBlocks : blocks;
  dequantize_kernel<<<static_cast<unsigned>(blocks), kDequantizeThreads, 0, as_stream(stream)>>>(p);
  QR_CUDA_CHECK_LAUNCH("dequantize_kernel");
}


}  // namespace qrecipe::nvfp4::cuda
