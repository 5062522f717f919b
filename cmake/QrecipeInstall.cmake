# `cmake --install`: headers, the engine, plugins, the CLI, the conformance runner, and a
# qrecipeConfig.cmake so an out-of-tree plugin can `find_package(qrecipe)` and call
# qrecipe_add_plugin() exactly like the in-tree ones.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/engine/include/qrecipe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS qrecipe_headers qrecipe_flags EXPORT qrecipeTargets)
install(TARGETS qrecipe EXPORT qrecipeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT qrecipeTargets NAMESPACE qrecipe:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qrecipe)
install(FILES ${CMAKE_SOURCE_DIR}/cmake/QrecipePlugin.cmake ${CMAKE_SOURCE_DIR}/cmake/plugin.version
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qrecipe)

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/qrecipeConfig.cmake.in
  ${CMAKE_BINARY_DIR}/qrecipeConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qrecipe
  PATH_VARS CMAKE_INSTALL_BINDIR)  # defines @PACKAGE_CMAKE_INSTALL_BINDIR@ (the runner's dir)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/qrecipeConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/qrecipeConfig.cmake ${CMAKE_BINARY_DIR}/qrecipeConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qrecipe)
