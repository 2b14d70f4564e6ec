# Install rules: libtwblas (shared + static), headers, the CMake package (twblas::twblas) and
# twblas.pc for pkg-config.
include(CMakePackageConfigHelpers)

# Components (the Debian packages below): runtime = the shared library as its SONAME needs it;
# dev = headers, the unversioned .so link, the static library, the CMake package, twblas.pc and
# the Fortran module.
install(TARGETS twblas twblas_static EXPORT twblasTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/twblas DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
install(FILES ${PROJECT_BINARY_DIR}/include/twblas/twblas_version.h
              ${PROJECT_BINARY_DIR}/include/twblas/twblas_export.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/twblas COMPONENT dev)

set(TWBLAS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/twblas)
install(EXPORT twblasTargets NAMESPACE twblas:: DESTINATION ${TWBLAS_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/twblasConfig.cmake.in
  ${PROJECT_BINARY_DIR}/twblasConfig.cmake INSTALL_DESTINATION ${TWBLAS_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/twblasConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/twblasConfig.cmake ${PROJECT_BINARY_DIR}/twblasConfigVersion.cmake
        DESTINATION ${TWBLAS_CMAKE_DIR} COMPONENT dev)

# pkg-config: static linking needs the C++ runtime, OpenMP and, with CUDA, its libraries.
set(TWBLAS_PC_PRIVATE_LIBS "-lstdc++ -lm -lpthread")
if(OpenMP_CXX_FOUND)
  string(APPEND TWBLAS_PC_PRIVATE_LIBS " -lgomp")
endif()
if(TWBLAS_WITH_CUDA)
  string(APPEND TWBLAS_PC_PRIVATE_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcusparse -lcublasLt -lcublas -lcudart")
endif()
# relocatable: the prefix is found from the .pc file's own location, so `cmake --install
# --prefix DIR` works whatever CMAKE_INSTALL_PREFIX was at configure time
file(RELATIVE_PATH _twblas_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
set(TWBLAS_PC_PREFIX "\${pcfiledir}/${_twblas_pc_up}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/twblas.pc.in ${PROJECT_BINARY_DIR}/twblas.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/twblas.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# ---- Debian packages (cpack -G DEB in the build folder; scripts/package.sh) -----------------
# libtwblas<SONAME major> (runtime) and libtwblas-dev, versioned with the library. The runtime
# package names the Debian libraries it links; a CUDA build also needs the CUDA runtime, cuBLAS
# and cuSPARSE of the toolkit it was built with (not Debian packages: stated in the description).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME twblas)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "twblas")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "sparse feed-forward layers (TwELL and hybrid formats)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "twblas developers")
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libtwblas${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libtwblas-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(_twblas_deb_depends "libc6, libstdc++6, libgcc-s1")
if(OpenMP_CXX_FOUND)
  string(APPEND _twblas_deb_depends ", libgomp1")
endif()
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "${_twblas_deb_depends}")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libtwblas${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION})")
if(TWBLAS_WITH_CUDA)
  set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
      "twblas shared library with the CPU and CUDA (sm_80 and newer; sm_90a kernels for Hopper) backends.\n Needs the CUDA ${CUDAToolkit_VERSION_MAJOR} runtime, cuBLAS and cuSPARSE libraries of the toolkit.")
else()
  set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "twblas shared library (CPU backend)")
endif()
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "twblas headers, static library, CMake package, pkg-config file and Fortran module")
include(CPack)
