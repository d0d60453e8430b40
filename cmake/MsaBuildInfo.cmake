# msa_build_info(<target>): gives <target> the header "msa_build_info.hpp" with
# what `msa --version` prints: the project version, the git commit the build
# was configured from ("unknown" outside a git checkout) and the backends.
# CMake re-runs when HEAD moves (a commit, a checkout), so the commit follows
# the sources without a manual reconfigure.
function(msa_build_info target)
  set(commit "unknown")
  find_package(Git QUIET)
  if(GIT_FOUND)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(rc EQUAL 0)
      set(commit "${out}")
      # HEAD names the branch; the branch's ref file (or packed-refs) moves on a commit.
      execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --git-path HEAD --git-path packed-refs
                      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE paths ERROR_QUIET)
      execute_process(COMMAND ${GIT_EXECUTABLE} symbolic-ref -q HEAD
                      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE ref
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(ref)
        execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --git-path ${ref}
                        WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE ref_path ERROR_QUIET)
        string(APPEND paths "${ref_path}")
      endif()
      string(STRIP "${paths}" paths)
      string(REPLACE "\n" ";" paths "${paths}")
      foreach(p ${paths})
        if(NOT IS_ABSOLUTE "${p}")
          set(p "${PROJECT_SOURCE_DIR}/${p}")
        endif()
        if(EXISTS "${p}")
          set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${p}")
        endif()
      endforeach()
    endif()
  endif()
  if(MSA_CUDA)
    set(backends "CPU engine, CUDA sm_90a")
  else()
    set(backends "CPU engine (built without CUDA)")
  endif()
  set(MSA_BUILD_COMMIT "${commit}")
  set(MSA_BUILD_BACKENDS "${backends}")
  set(dir ${PROJECT_BINARY_DIR}/generated)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/msa_build_info.hpp.in ${dir}/msa_build_info.hpp @ONLY)
  target_include_directories(${target} PRIVATE ${dir})
endfunction()
