# Install rules: libtwblas (shared + static), libtwblas_fortran and its module, headers, the CMake
# package (twblas::twblas) and twblas.pc for pkg-config; and the Debian packages (CPack).
include(CMakePackageConfigHelpers)

# Two layouts of the same files, one set of install rules each:
# - a prefix install, `cmake --install build [--prefix DIR]`: components `runtime` (the shared
#   libraries) and `dev` (the rest), libraries under CMAKE_INSTALL_LIBDIR (lib; lib/<triplet> when
#   configured for the prefix /usr on Debian, as GNUInstallDirs decides);
# - the Debian packages, `cpack -G DEB` (scripts/package.sh): components `deb_runtime` and
#   `deb_dev`, left out of a plain install (EXCLUDE_FROM_ALL), always for /usr with Debian's
#   multiarch library folder lib/<triplet> (CMAKE_LIBRARY_ARCHITECTURE, e.g. x86_64-linux-gnu),
#   plus the copyright file and changelog every Debian package carries.
# In both, the CMake package is <libdir>/cmake/twblas, twblas.pc is <libdir>/pkgconfig and the
# Fortran module twblas.mod is <libdir>/fortran/<compiler module version>/ (Debian's place for
# compiled modules: /usr/lib/x86_64-linux-gnu/fortran/gfortran-mod-15 with gfortran 8 to 14;
# .mod files are compiler-specific, not headers for /usr/include). Fortran users get that folder
# from `pkg-config --variable=fmoddir twblas` (-I or -J it), or from the imported target
# twblas::twblas_fortran, whose include directories hold it.
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(TWBLAS_DEB_LIBDIR "lib/${CMAKE_LIBRARY_ARCHITECTURE}")
else()
  set(TWBLAS_DEB_LIBDIR "lib")
endif()
set(TWBLAS_DEB_PACKAGE_RELEASE 1)
set(TWBLAS_DEB_VERSION "${PROJECT_VERSION}-${TWBLAS_DEB_PACKAGE_RELEASE}")
set(TWBLAS_DEB_RUNTIME_PACKAGE libtwblas${PROJECT_VERSION_MAJOR})
set(TWBLAS_DEB_DEV_PACKAGE libtwblas-dev)

# pkg-config: static linking needs the C++ runtime, OpenMP and, with CUDA, its libraries.
set(TWBLAS_PC_PRIVATE_LIBS "-lstdc++ -lm -lpthread")
if(OpenMP_CXX_FOUND)
  string(APPEND TWBLAS_PC_PRIVATE_LIBS " -lgomp")
endif()
# The CUDA toolkit's library folder is a variable of its own: it is where the build found the
# toolkit (e.g. /usr/local/cuda/lib64), which a user's machine may have elsewhere
# (pkg-config --static --define-variable=cudalibdir=DIR).
set(TWBLAS_PC_CUDA_VAR "")
if(TWBLAS_WITH_CUDA)
  set(TWBLAS_PC_CUDA_VAR "# the CUDA toolkit's libraries (static linking), where this build found them\ncudalibdir=${CUDAToolkit_LIBRARY_DIR}\n")
  string(APPEND TWBLAS_PC_PRIVATE_LIBS " -L\${cudalibdir} -lcusparse -lcublasLt -lcublas -lcudart")
endif()

# twblas_install_layout(<libdir> <runtime component> <dev component> <export set> <pc prefix>
#                       [EXCLUDE_FROM_ALL])
# <pc prefix>: the prefix twblas.pc states; empty: the prefix of the install itself, written when
# it runs (cmake --install --prefix DIR sets it), so the flags are plain absolute paths
# (-I/opt/twblas/include) whatever prefix the build was configured with.
function(twblas_install_layout libdir rt dev exportset pc_prefix)
  set(excl ${ARGN})
  set(tag ${exportset})
  install(TARGETS twblas twblas_static EXPORT ${exportset}
          LIBRARY DESTINATION ${libdir} COMPONENT ${rt} NAMELINK_COMPONENT ${dev} ${excl}
          ARCHIVE DESTINATION ${libdir} COMPONENT ${dev} ${excl}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${rt} ${excl})
  set(pc_fmoddir "")
  if(TARGET twblas_fortran)
    set(fmoddir ${libdir}/fortran/${TWBLAS_FORTRAN_MODULE_SUBDIR})
    get_target_property(modbuilddir twblas_fortran Fortran_MODULE_DIRECTORY)
    install(TARGETS twblas_fortran EXPORT ${exportset}
            LIBRARY DESTINATION ${libdir} COMPONENT ${rt} NAMELINK_COMPONENT ${dev} ${excl}
            ARCHIVE DESTINATION ${libdir} COMPONENT ${dev} ${excl}
            RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${rt} ${excl}
            INCLUDES DESTINATION ${fmoddir})
    install(FILES ${modbuilddir}/twblas.mod DESTINATION ${fmoddir} COMPONENT ${dev} ${excl})
    set(pc_fmoddir "# Fortran: the folder of twblas.mod (gfortran -I\$(pkg-config --variable=fmoddir twblas))\nfmoddir=\${libdir}/fortran/${TWBLAS_FORTRAN_MODULE_SUBDIR}\n")
  endif()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/twblas DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          COMPONENT ${dev} ${excl})
  install(FILES ${PROJECT_BINARY_DIR}/include/twblas/twblas_version.h
                ${PROJECT_BINARY_DIR}/include/twblas/twblas_export.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/twblas COMPONENT ${dev} ${excl})

  set(cmakedir ${libdir}/cmake/twblas)
  install(EXPORT ${exportset} NAMESPACE twblas:: FILE twblasTargets.cmake DESTINATION ${cmakedir}
          COMPONENT ${dev} ${excl})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/twblasConfig.cmake.in
    ${PROJECT_BINARY_DIR}/${tag}/twblasConfig.cmake INSTALL_DESTINATION ${cmakedir})
  install(FILES ${PROJECT_BINARY_DIR}/${tag}/twblasConfig.cmake ${PROJECT_BINARY_DIR}/twblasConfigVersion.cmake
          DESTINATION ${cmakedir} COMPONENT ${dev} ${excl})

  # twblas.pc: configured now but for its prefix, which an empty pc_prefix leaves to install time
  set(TWBLAS_PC_LIBDIR ${libdir})
  set(TWBLAS_PC_FMODDIR "${pc_fmoddir}")
  if(pc_prefix)
    set(TWBLAS_PC_PREFIX ${pc_prefix})
  else()
    set(TWBLAS_PC_PREFIX "@TWBLAS_PC_INSTALL_PREFIX@")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/twblas.pc.in ${PROJECT_BINARY_DIR}/${tag}/twblas.pc.in @ONLY)
  if(pc_prefix)
    configure_file(${PROJECT_BINARY_DIR}/${tag}/twblas.pc.in ${PROJECT_BINARY_DIR}/${tag}/twblas.pc COPYONLY)
    install(FILES ${PROJECT_BINARY_DIR}/${tag}/twblas.pc DESTINATION ${libdir}/pkgconfig COMPONENT ${dev} ${excl})
  else()
    install(CODE "
      get_filename_component(_twblas_pc_prefix \"\${CMAKE_INSTALL_PREFIX}\" ABSOLUTE)
      string(REGEX REPLACE \"(.)/+$\" \"\\\\1\" _twblas_pc_prefix \"\${_twblas_pc_prefix}\")
      file(READ \"${PROJECT_BINARY_DIR}/${tag}/twblas.pc.in\" _twblas_pc)
      string(REPLACE \"@TWBLAS_PC_INSTALL_PREFIX@\" \"\${_twblas_pc_prefix}\" _twblas_pc \"\${_twblas_pc}\")
      file(WRITE \"${PROJECT_BINARY_DIR}/${tag}/pc/twblas.pc\" \"\${_twblas_pc}\")
      file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${libdir}/pkgconfig\" TYPE FILE
           FILES \"${PROJECT_BINARY_DIR}/${tag}/pc/twblas.pc\")" COMPONENT ${dev} ${excl})
  endif()
endfunction()

# the compiler's module folder name: Debian's gfortran-mod-<N>, N the version the compiler writes
# in the (gzipped) .mod files; other compilers: <id>-<major version>
if(TARGET twblas_fortran AND NOT TWBLAS_FORTRAN_MODULE_SUBDIR)
  string(TOLOWER "${CMAKE_Fortran_COMPILER_ID}-${CMAKE_Fortran_COMPILER_VERSION}" _twblas_fmod)
  string(REGEX REPLACE "^([a-z]+-[0-9]+).*" "\\1" _twblas_fmod "${_twblas_fmod}")
  if(CMAKE_Fortran_COMPILER_ID STREQUAL "GNU")
    set(_d ${PROJECT_BINARY_DIR}/CMakeFiles/twblas_fmodver)
    file(MAKE_DIRECTORY ${_d})
    file(WRITE ${_d}/m.f90 "module twblas_fmodver\nend module twblas_fmodver\n")
    execute_process(COMMAND ${CMAKE_Fortran_COMPILER} -c m.f90 WORKING_DIRECTORY ${_d}
                    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
    if(_rc EQUAL 0)
      execute_process(COMMAND gzip -dc twblas_fmodver.mod WORKING_DIRECTORY ${_d}
                      OUTPUT_VARIABLE _head RESULT_VARIABLE _rc ERROR_QUIET)
      if(_head MATCHES "GFORTRAN module version '([0-9]+)'")
        set(_twblas_fmod "gfortran-mod-${CMAKE_MATCH_1}")
      endif()
    endif()
  endif()
  set(TWBLAS_FORTRAN_MODULE_SUBDIR "${_twblas_fmod}" CACHE STRING
      "Folder of twblas.mod below <libdir>/fortran (Debian: gfortran-mod-<module version>)")
endif()

write_basic_package_version_file(${PROJECT_BINARY_DIR}/twblasConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
twblas_install_layout(${CMAKE_INSTALL_LIBDIR} runtime dev twblasTargets "")
twblas_install_layout(${TWBLAS_DEB_LIBDIR} deb_runtime deb_dev twblasDebTargets /usr EXCLUDE_FROM_ALL)

# Debian packages: /usr/share/doc/<package>/copyright (DEP-5; the licence is Debian's own copy of
# Apache-2.0) and changelog.Debian.gz in each.
set(_twblas_docs ${PROJECT_BINARY_DIR}/debian-docs)
file(MAKE_DIRECTORY ${_twblas_docs})
file(WRITE ${_twblas_docs}/copyright
"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: twblas
Comment: The source is the twblas repository (LICENSE holds the full licence text).

Files: *
Copyright: 2026 twblas developers
License: Apache-2.0

License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the \"License\"); you may not use
 this file except in compliance with the License. You may obtain a copy of the
 License at http://www.apache.org/licenses/LICENSE-2.0
 .
 Unless required by applicable law or agreed to in writing, software distributed
 under the License is distributed on an \"AS IS\" BASIS, WITHOUT WARRANTIES OR
 CONDITIONS OF ANY KIND, either express or implied. See the License for the
 specific language governing permissions and limitations under the License.
 .
 On Debian systems, the complete text of the Apache License, Version 2.0 can be
 found in \"/usr/share/common-licenses/Apache-2.0\".
")
set(TWBLAS_DEB_MAINTAINER "twblas developers <twblas-developers@users.noreply.github.com>" CACHE STRING
    "Maintainer field of the Debian packages (name <address>)")
foreach(_pkg ${TWBLAS_DEB_RUNTIME_PACKAGE} ${TWBLAS_DEB_DEV_PACKAGE})
  if(_pkg STREQUAL TWBLAS_DEB_DEV_PACKAGE)
    set(_comp deb_dev)
  else()
    set(_comp deb_runtime)
  endif()
  # a fixed date (the project's version does not change with the build), so the file is reproducible
  file(WRITE ${_twblas_docs}/${_pkg}/changelog.Debian
"${_pkg} (${TWBLAS_DEB_VERSION}) unstable; urgency=medium

  * Package of twblas ${PROJECT_VERSION}, made with CPack (scripts/package.sh).

 -- ${TWBLAS_DEB_MAINTAINER}  Thu, 01 Jan 2026 00:00:00 +0000
")
  execute_process(COMMAND gzip -9nf changelog.Debian WORKING_DIRECTORY ${_twblas_docs}/${_pkg})
  install(FILES ${_twblas_docs}/copyright ${_twblas_docs}/${_pkg}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${_pkg}
          PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ COMPONENT ${_comp} EXCLUDE_FROM_ALL)
endforeach()

# ---- Debian packages (cpack -G DEB in the build folder; scripts/package.sh) -----------------
# libtwblas<SONAME major> (runtime) and libtwblas-dev, versioned with the library. Depends come
# from what the packages hold: dpkg-shlibdeps (dpkg-dev) reads the shared libraries' NEEDED
# entries (libstdc++6, libgomp1, libgfortran5 for libtwblas_fortran, ...). A CUDA build's
# library also needs the CUDA runtime, cuBLAS and cuSPARSE of the toolkit it was built with:
# not Debian packages, so dpkg-shlibdeps finds no package for them (CPack passes
# --ignore-missing-info: a warning, no Depends entry; the toolkit's library folder is a private
# search folder so that it is found where ld.so.conf does not name it) and the description says
# so instead. scripts/package.sh checks every NEEDED library against the Depends.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME twblas)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "twblas")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "sparse feed-forward layers (TwELL and hybrid formats)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL deb_runtime deb_dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${TWBLAS_DEB_PACKAGE_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${TWBLAS_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(TWBLAS_WITH_CUDA)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CUDAToolkit_LIBRARY_DIR})
endif()
set(CPACK_DEBIAN_DEB_RUNTIME_PACKAGE_NAME ${TWBLAS_DEB_RUNTIME_PACKAGE})
# the shlibs file (other packages' dpkg-shlibdeps map libtwblas.so.0 to this package) and the
# ldconfig trigger Debian wants of a package that ships shared libraries
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
file(WRITE ${_twblas_docs}/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_DEB_RUNTIME_PACKAGE_CONTROL_EXTRA ${_twblas_docs}/triggers)
set(CPACK_DEBIAN_DEB_DEV_PACKAGE_NAME ${TWBLAS_DEB_DEV_PACKAGE})
set(CPACK_DEBIAN_DEB_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEB_DEV_PACKAGE_DEPENDS "${TWBLAS_DEB_RUNTIME_PACKAGE} (= ${TWBLAS_DEB_VERSION})")
if(TWBLAS_WITH_CUDA)
  set(CPACK_COMPONENT_DEB_RUNTIME_DESCRIPTION
      "twblas shared library with the CPU and CUDA backends (sm_80 and newer;\nsm_90a kernels for Hopper). Needs the CUDA ${CUDAToolkit_VERSION_MAJOR} runtime, cuBLAS and\ncuSPARSE libraries of the toolkit it was built with (not Debian packages).")
else()
  set(CPACK_COMPONENT_DEB_RUNTIME_DESCRIPTION "twblas shared library (CPU backend)")
endif()
set(CPACK_COMPONENT_DEB_DEV_DESCRIPTION
    "twblas headers, static library, CMake package, pkg-config file, Fortran module")
include(CPack)
