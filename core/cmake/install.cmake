# `cmake --install BUILD [--prefix P]`: what a consumer links and includes, and nothing else.
#   lib/libdcr.so.<major>.<minor>.<patch>   every product library in one shared object; its SONAME
#                                           is libdcr.so.<major>.<minor> (the C++ API has no ABI
#                                           promise across releases; core/docs/installing.md
#                                           states the C ABI's)
#   include/dcr/*.h                         the public headers (C and C++)
#   lib/pkgconfig/dcr.pc                    pkg-config --cflags --libs dcr
#   lib/cmake/dcr/                          find_package(dcr): imported target dcr::dcr, version
#                                           file (same major.minor is compatible)
# The static product libraries are not installed: their link order and their third-party
# dependencies (zstd, xxhash, libcurl, OpenSSL, yaml-cpp) are the build's business, and libdcr.so
# carries every entry point. Never installed: dcr::testing, the CLI's libraries, benchmarks.
# Every installed file locates the rest relative to itself: no path of the build or source tree.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

file(STRINGS ${CMAKE_CURRENT_LIST_DIR}/../include/dcr/dcr_c.h DCR_C_ABI_LINE
     REGEX "^#define DCR_C_ABI_VERSION [0-9]+")
string(REGEX REPLACE "^#define DCR_C_ABI_VERSION ([0-9]+).*" "\\1" DCR_C_ABI_VERSION
       "${DCR_C_ABI_LINE}")

install(TARGETS dcr_shared EXPORT dcrTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The whole folder at install time, so that every public header is installed, whichever.
install(DIRECTORY ${CMAKE_CURRENT_LIST_DIR}/../include/dcr DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")

set(DCR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dcr)
install(EXPORT dcrTargets NAMESPACE dcr:: DESTINATION ${DCR_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dcrConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/install/dcrConfig.cmake
                              INSTALL_DESTINATION ${DCR_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/install/dcrConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/install/dcrConfig.cmake
              ${CMAKE_BINARY_DIR}/install/dcrConfigVersion.cmake
        DESTINATION ${DCR_CMAKE_DIR})

# dcr.pc finds the prefix from its own folder (${pcfiledir}), so the tree may be installed under
# any --prefix and moved.
set(DCR_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH DCR_PC_TO_PREFIX /prefix/${DCR_PC_DIR} /prefix)
string(REGEX REPLACE "/$" "" DCR_PC_TO_PREFIX "${DCR_PC_TO_PREFIX}")
set(DCR_PC_PREFIX "\${pcfiledir}/${DCR_PC_TO_PREFIX}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")  # an absolute directory stays where it is
    set(DCR_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
    set(DCR_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(DCR_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/dcr.pc.in ${CMAKE_BINARY_DIR}/install/dcr.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/install/dcr.pc DESTINATION ${DCR_PC_DIR})
