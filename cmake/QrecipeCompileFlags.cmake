# Warnings and numerics flags shared by every target.
#
# Quantization code must perform exactly the IEEE operations written in the source, so that
# the CPU reference and the CUDA kernels agree bit for bit: no contraction into FMA, no fast
# math, no flush-to-zero.
add_library(qrecipe_flags INTERFACE)
target_compile_options(qrecipe_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers -ffp-contract=off -fno-fast-math>
  $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false --ftz=false --prec-div=true --prec-sqrt=true -Xcompiler=-ffp-contract=off>)

if(QRECIPE_SANITIZE AND QRECIPE_TSAN)
  message(FATAL_ERROR "QRECIPE_SANITIZE (ASan) and QRECIPE_TSAN cannot be combined; use two build directories")
endif()
if(QRECIPE_SANITIZE)
  set(QRECIPE_SANITIZER_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_compile_options(qrecipe_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${QRECIPE_SANITIZER_FLAGS}>)
  target_link_options(qrecipe_flags INTERFACE -fsanitize=address,undefined)
endif()
if(QRECIPE_TSAN)
  target_compile_options(qrecipe_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_link_options(qrecipe_flags INTERFACE -fsanitize=thread)
endif()
# Fuzzing: coverage instrumentation on every target (engine, plugins), so libFuzzer is guided by
# the code a recipe reaches; the fuzz executables add the libFuzzer driver (tests/fuzz).
if(QRECIPE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "QRECIPE_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
  endif()
  target_compile_options(qrecipe_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
