# The C++ runtime every qrecipe library and program links: the shared libstdc++, always.
#
# Why: libqrecipe, the plugins and the Python extension are loaded into processes that already
# hold the shared libstdc++ (torch's). A library that carries its own static copy of the
# runtime runs two copies of it in one process (two sets of iostream and locale state, two
# exception ABIs) and crashed the first GEMM of a pip install (issue 23). Some compilers (a
# GCC unpacked into /opt/gcc, say) have libstdc++.a but no libstdc++.so in their library
# directories, so g++ links the runtime statically without being asked to.
#
# What this does, at configure time, with this configuration's compiler and linker flags:
#   1. builds a probe shared library and module and reads their NEEDED entries (readelf -d);
#   2. when the probe carries the runtime statically: puts a directory holding only a
#      `libstdc++.so` link to a shared runtime (QRECIPE_LIBSTDCXX, else the compiler's
#      libstdc++.so.6, else the system's) first on every link's library path, so -lstdc++
#      finds the shared library before the static archive, and probes again;
#   3. stops with what to do when the runtime would still be static (-static-libstdc++ in the
#      flags, or no shared runtime found).
# The result is cached per compiler, flags and runtime, so a re-configure costs nothing.
# Independently, every library hides what is not its API (version scripts, and
# QRECIPE_HIDE_ARCHIVES = -Wl,--exclude-libs,ALL for static archives), so even a static copy
# of a library stays private; tests/check_library_exports.sh checks both.
#
# QRECIPE_LIBSTDCXX  path of the shared libstdc++ (libstdc++.so.6) to link when the compiler
#                    would link libstdc++.a (default: found automatically).
set(QRECIPE_LIBSTDCXX "" CACHE FILEPATH
  "Shared libstdc++ (libstdc++.so.6) to link when the C++ compiler would link libstdc++.a")

# Static archives linked into a qrecipe library (the CUDA runtime, a static yaml-cpp, a static
# C++ runtime) export nothing from it.
set(QRECIPE_HIDE_ARCHIVES "LINKER:--exclude-libs,ALL")

find_program(QRECIPE_READELF NAMES ${CMAKE_READELF} readelf)
if(NOT QRECIPE_READELF)
  message(FATAL_ERROR "qrecipe checks with readelf that its libraries link the shared C++ "
    "runtime, and readelf was not found: install binutils")
endif()

# A shared libstdc++ to link instead of the static one: QRECIPE_LIBSTDCXX, the compiler's own
# libstdc++.so.6, or the system's; "" when there is none.
function(_qrecipe_find_shared_libstdcxx out)
  if(QRECIPE_LIBSTDCXX)
    if(NOT EXISTS "${QRECIPE_LIBSTDCXX}")
      message(FATAL_ERROR "QRECIPE_LIBSTDCXX=${QRECIPE_LIBSTDCXX} does not exist; point it at "
        "a shared libstdc++ (libstdc++.so.6) or unset it")
    endif()
    set(${out} "${QRECIPE_LIBSTDCXX}" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
    OUTPUT_VARIABLE candidate OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${candidate}" AND EXISTS "${candidate}")
    set(${out} "${candidate}" PARENT_SCOPE)
    return()
  endif()
  set(dirs)
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND dirs /lib/${CMAKE_LIBRARY_ARCHITECTURE} /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  endif()
  list(APPEND dirs /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib/aarch64-linux-gnu
    /usr/lib/aarch64-linux-gnu /lib64 /usr/lib64 /lib /usr/lib)
  foreach(dir IN LISTS dirs)
    if(EXISTS "${dir}/libstdc++.so.6")
      set(${out} "${dir}/libstdc++.so.6" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# Builds the probe with `link_dir` (may be "") first on the library path. Sets `out` to TRUE
# when both probe libraries NEED libstdc++.so, and `detail` to what readelf showed otherwise.
function(_qrecipe_probe_runtime link_dir out detail)
  set(src "${CMAKE_BINARY_DIR}/qrecipe-runtime-probe/src")
  set(bin "${CMAKE_BINARY_DIR}/qrecipe-runtime-probe/build")
  file(REMOVE_RECURSE "${bin}")
  file(WRITE "${src}/probe.cpp" [=[
#include <sstream>
#include <stdexcept>
#include <string>
std::string qrecipe_runtime_probe(int n) {
  std::ostringstream os;
  os << n;
  if (n < 0) throw std::runtime_error(os.str());
  return os.str();
}
]=])
  file(WRITE "${src}/CMakeLists.txt" [=[
cmake_minimum_required(VERSION 3.24)
project(qrecipe_runtime_probe CXX)
if(QR_PROBE_LINK_DIR)
  add_link_options("-L${QR_PROBE_LINK_DIR}")
endif()
add_library(probe_shared SHARED probe.cpp)
add_library(probe_module MODULE probe.cpp)
]=])
  try_compile(built "${bin}" "${src}" qrecipe_runtime_probe
    CMAKE_FLAGS
      "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
      "-DCMAKE_CXX_FLAGS=${CMAKE_CXX_FLAGS}"
      "-DCMAKE_SHARED_LINKER_FLAGS=${CMAKE_SHARED_LINKER_FLAGS}"
      "-DCMAKE_MODULE_LINKER_FLAGS=${CMAKE_MODULE_LINKER_FLAGS}"
      "-DQR_PROBE_LINK_DIR=${link_dir}"
    OUTPUT_VARIABLE log)
  if(NOT built)
    message(FATAL_ERROR "qrecipe could not build its C++ runtime probe (a one-function shared "
      "library) with ${CMAKE_CXX_COMPILER}:\n${log}")
  endif()
  file(GLOB_RECURSE libs "${bin}/*probe_shared*.so" "${bin}/*probe_module*.so")
  if(NOT libs)
    message(FATAL_ERROR "qrecipe's C++ runtime probe built but left no library in ${bin}")
  endif()
  set(ok TRUE)
  set(text "")
  foreach(lib IN LISTS libs)
    execute_process(COMMAND ${QRECIPE_READELF} -d "${lib}" OUTPUT_VARIABLE dynamic
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT dynamic MATCHES "NEEDED[^\n]*\\[libstdc\\+\\+\\.so")
      set(ok FALSE)
      string(REGEX MATCHALL "Shared library: \\[[^\n]*\\]" needed "${dynamic}")
      string(REPLACE "Shared library: [" "" needed "${needed}")
      string(REPLACE "]" "" needed "${needed}")
      string(REPLACE ";" ", " needed "${needed}")
      get_filename_component(name "${lib}" NAME)
      string(APPEND text " ${name} NEEDs only ${needed}.")
    endif()
  endforeach()
  set(${out} ${ok} PARENT_SCOPE)
  set(${detail} "${text}" PARENT_SCOPE)
endfunction()

string(SHA1 _qr_probe_key "${CMAKE_CXX_COMPILER};${CMAKE_CXX_FLAGS};${CMAKE_SHARED_LINKER_FLAGS};\
${CMAKE_MODULE_LINKER_FLAGS};${QRECIPE_LIBSTDCXX}")
if(NOT QRECIPE_RUNTIME_PROBE_KEY STREQUAL _qr_probe_key)
  unset(QRECIPE_RUNTIME_LINK_DIR CACHE)
  _qrecipe_probe_runtime("" _qr_dynamic _qr_detail)
  set(_qr_note "the compiler's default")
  if(NOT _qr_dynamic)
    _qrecipe_find_shared_libstdcxx(_qr_shared)
    if(_qr_shared)
      set(_qr_link_dir "${CMAKE_BINARY_DIR}/qrecipe-libstdcxx")
      file(MAKE_DIRECTORY "${_qr_link_dir}")
      file(CREATE_LINK "${_qr_shared}" "${_qr_link_dir}/libstdc++.so" SYMBOLIC)
      _qrecipe_probe_runtime("${_qr_link_dir}" _qr_dynamic _qr_detail_fixed)
      set(_qr_note "${_qr_shared}, through ${_qr_link_dir}/libstdc++.so (the compiler alone "
        "linked libstdc++.a:${_qr_detail})")
      string(CONCAT _qr_note ${_qr_note})
      set(_qr_detail "${_qr_detail_fixed}")
    else()
      set(_qr_note "none found beside the compiler or in the system library directories")
    endif()
    if(NOT _qr_dynamic)
      message(FATAL_ERROR "qrecipe: the C++ runtime would be linked statically. A probe library "
        "built with this configuration (${CMAKE_CXX_COMPILER}; shared linker flags "
        "'${CMAKE_SHARED_LINKER_FLAGS}', module linker flags '${CMAKE_MODULE_LINKER_FLAGS}') has "
        "no NEEDED entry for libstdc++.so:${_qr_detail}\n"
        "qrecipe's libraries are loaded into processes that already hold the shared libstdc++ "
        "(torch's); a second, static copy of the runtime in them crashes (issue 23).\n"
        "Shared libstdc++ tried: ${_qr_note}.\n"
        "Fix one of: remove -static-libstdc++ (or -static) from the linker flags; install the "
        "compiler's shared runtime (libstdc++.so, e.g. the libstdc++-<version>-dev package); or "
        "configure with -DQRECIPE_LIBSTDCXX=/path/to/libstdc++.so.6 (a shared libstdc++ at "
        "least as new as the compiler).")
    endif()
    set(QRECIPE_RUNTIME_LINK_DIR "${_qr_link_dir}" CACHE INTERNAL
      "directory whose libstdc++.so every link finds first (empty: the compiler's default)")
  endif()
  set(QRECIPE_RUNTIME_NOTE "${_qr_note}" CACHE INTERNAL "the shared libstdc++ qrecipe links")
  set(QRECIPE_RUNTIME_PROBE_KEY "${_qr_probe_key}" CACHE INTERNAL
    "configuration whose C++ runtime probe linked libstdc++ dynamically")
endif()
if(QRECIPE_RUNTIME_LINK_DIR)
  add_link_options("-L${QRECIPE_RUNTIME_LINK_DIR}")
endif()
message(STATUS "qrecipe: C++ runtime linked dynamically (libstdc++: ${QRECIPE_RUNTIME_NOTE})")
