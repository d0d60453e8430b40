# Install rules and the packages a consumer finds msa with:
#   CMake:      find_package(msa) -> msa::msa (the CPU engine and every host API)
#               and, in a CUDA build, msa::cuda (the CUDA backend; also as
#               find_package(msa COMPONENTS cuda))
#   pkg-config: msa.pc (the library msa::msa; the CUDA backend is CMake-only)
# Layout under the prefix: include/msa/*.hpp, lib/libmsa.{a,so}, the CUDA op
# libraries lib/libmsa_cuda_<op>.a, bin/msa, lib/cmake/msa/, lib/pkgconfig/msa.pc.
include(CMakePackageConfigHelpers)

set(MSA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/msa)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/msa DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")

set(_msa_export_targets msa)
if(MSA_CUDA)
  # msa::cuda is the INTERFACE target msa_cuda over the static op libraries
  # msa_cuda_<op>, exported as msa::cuda_<op> (set in src/cuda/CMakeLists.txt).
  list(APPEND _msa_export_targets msa_cuda ${MSA_CUDA_OP_LIBS})
endif()
install(TARGETS ${_msa_export_targets} EXPORT msaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET msa_cli)
  install(TARGETS msa_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT msaTargets NAMESPACE msa:: DESTINATION ${MSA_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/msaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/msaConfig.cmake
                              INSTALL_DESTINATION ${MSA_INSTALL_CMAKEDIR})
# Before 1.0 a minor version may change the API: only the same major.minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/msaConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/msaConfig.cmake ${PROJECT_BINARY_DIR}/msaConfigVersion.cmake
        DESTINATION ${MSA_INSTALL_CMAKEDIR})

# msa.pc names its prefix relative to its own folder (${pcfiledir}), so that it
# stays right under `cmake --install --prefix` and when the tree is moved.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(MSA_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _msa_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")  # "../.."
  string(REGEX REPLACE "/$" "" _msa_pc_up "${_msa_pc_up}")
  set(MSA_PC_PREFIX "\${pcfiledir}/${_msa_pc_up}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/msa.pc.in ${PROJECT_BINARY_DIR}/msa.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/msa.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
