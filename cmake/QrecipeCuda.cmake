# Decide whether CUDA kernels are built (QRECIPE_CUDA = AUTO | ON | OFF) and find the cuBLASLt
# headers. cuBLASLt itself is loaded lazily at run time (dlopen on the first GPU GEMM), so only
# its header is needed here; the CUDA runtime is linked statically. Nothing a CPU-only machine
# imports needs a GPU library at load time.
set(QRECIPE_WITH_CUDA OFF)
if(NOT QRECIPE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  # cuBLASLt headers: the CUDA toolkit's, or the nvidia-cublas wheel's (site-packages/nvidia/cu13).
  execute_process(
    COMMAND python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'include'))"
    OUTPUT_VARIABLE _qr_wheel_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  find_path(QRECIPE_CUBLASLT_INCLUDE_DIR cublasLt.h
    HINTS ${CUDAToolkit_ROOT}/include /usr/local/cuda/include ${_qr_wheel_include})
  if(CMAKE_CUDA_COMPILER AND QRECIPE_CUBLASLT_INCLUDE_DIR)
    set(QRECIPE_WITH_CUDA ON)
  elseif(QRECIPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "QRECIPE_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or cublasLt.h "
      "(${QRECIPE_CUBLASLT_INCLUDE_DIR}) was not found. Install the CUDA toolkit, or run "
      "tools/setup.sh (nvidia-cublas wheel), or configure with -DQRECIPE_CUDA=OFF.")
  endif()
endif()

if(QRECIPE_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90a)
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "qrecipe: CUDA kernels ON (archs ${CMAKE_CUDA_ARCHITECTURES}, cuBLASLt headers in ${QRECIPE_CUBLASLT_INCLUDE_DIR})")
else()
  message(STATUS "qrecipe: CUDA kernels OFF")
endif()
