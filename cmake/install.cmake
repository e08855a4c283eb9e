# libtessera.so: the C API (include/tessera/tessera.h) over the engine, exporting only the tessera_*
# functions (cmake/tessera.map); installed with its header, a CMake package (find_package(tessera):
# tessera::tessera) and a pkg-config file (pkg-config tessera), beside the tessera command.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(libtessera SHARED ${CMAKE_SOURCE_DIR}/cmake/libtessera.cpp)
target_link_libraries(libtessera PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,tessera_lib>")
target_include_directories(libtessera PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_options(libtessera PRIVATE -Wl,--version-script=${CMAKE_SOURCE_DIR}/cmake/tessera.map)
set_target_properties(libtessera PROPERTIES OUTPUT_NAME tessera EXPORT_NAME tessera VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR} LINK_DEPENDS ${CMAKE_SOURCE_DIR}/cmake/tessera.map)

install(TARGETS tessera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS libtessera EXPORT tesseraTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/tessera/tessera.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tessera)
install(EXPORT tesseraTargets NAMESPACE tessera:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/tesseraConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/tesseraConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
# 0.x: the minor version is the compatibility line (the SONAME is the major, 0).
write_basic_package_version_file(${CMAKE_BINARY_DIR}/tesseraConfigVersion.cmake VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/tesseraConfig.cmake ${CMAKE_BINARY_DIR}/tesseraConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tessera)
# Relocatable: the prefix is found from the .pc file's own place (cmake --install --prefix anywhere).
file(RELATIVE_PATH TESSERA_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(${CMAKE_SOURCE_DIR}/cmake/tessera.pc.in ${CMAKE_BINARY_DIR}/tessera.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/tessera.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# What the tessera command finds beside itself once installed (PREFIX/bin/tessera): the bundled models
# (PREFIX/share/tessera/models: the default model), the web page's files (also compiled into the binary)
# and the bash completion, written by the built binary from its own definition of the commands.
install(DIRECTORY ${CMAKE_SOURCE_DIR}/models/ DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/models)
if(EXISTS ${CMAKE_SOURCE_DIR}/apps/tessera/web)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/apps/tessera/web/ DESTINATION ${CMAKE_INSTALL_DATADIR}/tessera/web)
endif()
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/completion/tessera
                   COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/completion
                   COMMAND tessera completion bash > ${CMAKE_BINARY_DIR}/completion/tessera
                   DEPENDS tessera)
add_custom_target(tessera_completion ALL DEPENDS ${CMAKE_BINARY_DIR}/completion/tessera)
install(FILES ${CMAKE_BINARY_DIR}/completion/tessera DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)
