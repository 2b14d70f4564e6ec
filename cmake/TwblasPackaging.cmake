# Install rules: libtwblas (shared + static), headers, the CMake package (twblas::twblas) and
# twblas.pc for pkg-config.
include(CMakePackageConfigHelpers)

install(TARGETS twblas twblas_static EXPORT twblasTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/twblas DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/twblas/twblas_version.h
              ${PROJECT_BINARY_DIR}/include/twblas/twblas_export.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/twblas)

set(TWBLAS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/twblas)
install(EXPORT twblasTargets NAMESPACE twblas:: DESTINATION ${TWBLAS_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/twblasConfig.cmake.in
  ${PROJECT_BINARY_DIR}/twblasConfig.cmake INSTALL_DESTINATION ${TWBLAS_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/twblasConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/twblasConfig.cmake ${PROJECT_BINARY_DIR}/twblasConfigVersion.cmake
        DESTINATION ${TWBLAS_CMAKE_DIR})

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
install(FILES ${PROJECT_BINARY_DIR}/twblas.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
