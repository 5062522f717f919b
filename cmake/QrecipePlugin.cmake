# qrecipe_add_plugin(NAME <fmt> SOURCES <cpp...> [CUDA_SOURCES <cu...>])
#   Builds libqrecipe_<fmt>.so as a MODULE that includes only the public engine headers and
#   exports exactly two symbols (qrecipe_plugin_abi, qrecipe_plugin_entry): hidden visibility
#   plus a version script, and --exclude-libs,ALL for the static archives it links. CUDA sources are added when the build has CUDA; the plugin then
#   defines QRECIPE_PLUGIN_HAS_CUDA and records its CUDA version and archs in its descriptor.
#
# qrecipe_add_plugin_test(NAME <fmt> SOURCES <cpp...>)
#   Builds the doctest binary test_<fmt> (engine + shared conformance suite) and registers it
#   with ctest. The test finds the plugin through the registry (QRECIPE_PLUGIN_PATH is set to
#   the build's lib directory by ctest).
set(QRECIPE_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/plugin.version)

function(qrecipe_add_plugin)
  cmake_parse_arguments(P "" "NAME" "SOURCES;CUDA_SOURCES" ${ARGN})
  set(target qrecipe_${P_NAME})
  set(sources ${P_SOURCES})
  if(QRECIPE_WITH_CUDA AND P_CUDA_SOURCES)
    list(APPEND sources ${P_CUDA_SOURCES})
  endif()
  add_library(${target} MODULE ${sources})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME qrecipe_${P_NAME}
    PREFIX lib
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${QRECIPE_LIB_OUTPUT_DIR})
  target_link_libraries(${target} PRIVATE qrecipe_headers qrecipe_flags)
  # --exclude-libs: nothing of a static archive linked in (the CUDA runtime) is exported either.
  target_link_options(${target} PRIVATE "LINKER:--version-script=${QRECIPE_PLUGIN_VERSION_SCRIPT}"
    "LINKER:--exclude-libs,ALL")
  # --no-undefined, except where clang's sanitizers and coverage are on: clang links their
  # runtimes into the executable only, which exports them to the modules it loads.
  if(NOT (CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND (QRECIPE_SANITIZE OR QRECIPE_FUZZ OR QRECIPE_TSAN)))
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()
  if(QRECIPE_WITH_CUDA AND P_CUDA_SOURCES)
    string(REPLACE ";" "," _archs "${CMAKE_CUDA_ARCHITECTURES}")
    string(REPLACE "." "" _cuda_ver "${CMAKE_CUDA_COMPILER_VERSION}")
    string(REGEX MATCH "^[0-9]+\\.[0-9]+" _mm "${CMAKE_CUDA_COMPILER_VERSION}")
    string(REPLACE "." ";" _mm_list "${_mm}")
    list(GET _mm_list 0 _major)
    list(GET _mm_list 1 _minor)
    math(EXPR _cuda_num "${_major} * 1000 + ${_minor} * 10")
    target_compile_definitions(${target} PRIVATE QRECIPE_PLUGIN_HAS_CUDA=1
      QRECIPE_PLUGIN_CUDA_VERSION=${_cuda_num} QRECIPE_PLUGIN_CUDA_ARCHS="${_archs}")
    target_link_libraries(${target} PRIVATE CUDA::cudart_static)
    set_target_properties(${target} PROPERTIES CUDA_RUNTIME_LIBRARY Static)
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/qrecipe/plugins)
  set_property(GLOBAL APPEND PROPERTY QRECIPE_PLUGIN_TARGETS ${target})
endfunction()

function(qrecipe_add_plugin_test)
  cmake_parse_arguments(P "" "NAME" "SOURCES" ${ARGN})
  if(NOT QRECIPE_TESTS)
    return()
  endif()
  set(target test_${P_NAME})
  add_executable(${target} ${P_SOURCES})
  target_link_libraries(${target} PRIVATE qrecipe qrecipe_conformance qrecipe_test_main qrecipe_flags)
  add_dependencies(${target} qrecipe_${P_NAME})
  add_test(NAME ${target} COMMAND ${target})
  set_tests_properties(${target} PROPERTIES ENVIRONMENT "QRECIPE_PLUGIN_PATH=${QRECIPE_LIB_OUTPUT_DIR}")
endfunction()
