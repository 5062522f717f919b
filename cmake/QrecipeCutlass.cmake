# CUTLASS headers for the grouped GEMMs of CUDA builds (engine/src/gemm/cuda/cutlass/, docs/gemm.md
# "Grouped GEMMs"). Only headers are used; they come from the nvidia-cutlass wheel that
# tools/setup.sh pins (site-packages/cutlass_library/source/include), or from
# -DQRECIPE_CUTLASS_INCLUDE_DIR=<dir holding cutlass/cutlass.h>.
#
#   QRECIPE_CUTLASS  AUTO | ON | OFF   AUTO: use CUTLASS when the headers are found
#
# Sets QRECIPE_WITH_CUTLASS. A CUDA build without CUTLASS still builds and works: its grouped
# GEMMs run as one cuBLASLt GEMM per group (the plan says so and why), and GEMMs whose groups
# live on the device are refused with a clear error (the PyTorch adapter then reads the splits
# on the host first).
set(QRECIPE_CUTLASS AUTO CACHE STRING "Grouped GEMMs on CUTLASS (CUDA builds): AUTO, ON or OFF")
set_property(CACHE QRECIPE_CUTLASS PROPERTY STRINGS AUTO ON OFF)
# The version tools/setup.sh installs; another one is used with a warning.
set(QRECIPE_CUTLASS_PINNED_VERSION "4.2.0")

set(QRECIPE_WITH_CUTLASS OFF)
if(QRECIPE_WITH_CUDA AND NOT QRECIPE_CUTLASS STREQUAL "OFF")
  execute_process(
    COMMAND python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
    OUTPUT_VARIABLE _qr_cutlass_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  find_path(QRECIPE_CUTLASS_INCLUDE_DIR cutlass/cutlass.h HINTS ${_qr_cutlass_wheel}
    DOC "Folder holding cutlass/cutlass.h and cute/ (the nvidia-cutlass wheel's source/include)")
  if(QRECIPE_CUTLASS_INCLUDE_DIR)
    file(STRINGS ${QRECIPE_CUTLASS_INCLUDE_DIR}/cutlass/version.h _qr_cutlass_ver
      REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*CUTLASS_MAJOR ([0-9]+).*CUTLASS_MINOR ([0-9]+).*CUTLASS_PATCH ([0-9]+).*"
      "\\1.\\2.\\3" QRECIPE_CUTLASS_VERSION "${_qr_cutlass_ver}")
    if(QRECIPE_CUTLASS_VERSION VERSION_LESS 3.9)
      message(FATAL_ERROR "qrecipe: CUTLASS ${QRECIPE_CUTLASS_VERSION} in ${QRECIPE_CUTLASS_INCLUDE_DIR} "
        "is too old for the grouped GEMMs (blockwise-scaled ptr-array kernels need >= 3.9); run "
        "tools/setup.sh (nvidia-cutlass==${QRECIPE_CUTLASS_PINNED_VERSION}.0), point "
        "QRECIPE_CUTLASS_INCLUDE_DIR at a newer CUTLASS, or configure with -DQRECIPE_CUTLASS=OFF")
    endif()
    if(NOT QRECIPE_CUTLASS_VERSION VERSION_EQUAL QRECIPE_CUTLASS_PINNED_VERSION)
      message(WARNING "qrecipe: CUTLASS ${QRECIPE_CUTLASS_VERSION} found, the project pins "
        "${QRECIPE_CUTLASS_PINNED_VERSION} (tools/setup.sh); the grouped GEMMs are tested with that one")
    endif()
    set(QRECIPE_WITH_CUTLASS ON)
    message(STATUS "qrecipe: grouped GEMMs on CUTLASS ${QRECIPE_CUTLASS_VERSION} (${QRECIPE_CUTLASS_INCLUDE_DIR})")
  elseif(QRECIPE_CUTLASS STREQUAL "ON")
    message(FATAL_ERROR "QRECIPE_CUTLASS=ON but no CUTLASS headers were found (cutlass/cutlass.h). "
      "Run tools/setup.sh (pip install --no-deps nvidia-cutlass==${QRECIPE_CUTLASS_PINNED_VERSION}.0), "
      "or pass -DQRECIPE_CUTLASS_INCLUDE_DIR=<site-packages>/cutlass_library/source/include, or "
      "configure with -DQRECIPE_CUTLASS=OFF (grouped GEMMs then run one cuBLASLt GEMM per group)")
  else()
    message(STATUS "qrecipe: CUTLASS headers not found: grouped GEMMs run one cuBLASLt GEMM per "
      "group and device-side splits are refused. Run tools/setup.sh (nvidia-cutlass wheel) or set "
      "QRECIPE_CUTLASS_INCLUDE_DIR to get one-launch grouped GEMMs")
  endif()
endif()
