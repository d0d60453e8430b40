# msa_cuda_default(<var>): ON when this machine can both build and run the CUDA
# backend: a GPU is listed by `nvidia-smi -L` and CMake finds a CUDA compiler.
# With nvcc alone (a build or CI machine without a GPU) it is OFF, so that the
# CPU engine and the command build in minutes; -DMSA_CUDA=ON overrides it.
# Once MSA_CUDA is in the cache (given or from an earlier run) nothing is probed.
function(msa_cuda_default out)
  set(${out} OFF PARENT_SCOPE)
  if(DEFINED CACHE{MSA_CUDA})
    return()
  endif()
  find_program(MSA_NVIDIA_SMI nvidia-smi)
  if(NOT MSA_NVIDIA_SMI)
    message(STATUS "msa: no nvidia-smi: CUDA backend OFF by default (-DMSA_CUDA=ON builds it)")
    return()
  endif()
  execute_process(COMMAND ${MSA_NVIDIA_SMI} -L RESULT_VARIABLE rc OUTPUT_VARIABLE gpus
                  ERROR_QUIET TIMEOUT 30)
  if(NOT rc EQUAL 0 OR NOT gpus MATCHES "GPU [0-9]+:")
    message(STATUS "msa: no GPU listed by nvidia-smi -L: CUDA backend OFF by default (-DMSA_CUDA=ON builds it)")
    return()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    message(STATUS "msa: GPU and nvcc found: CUDA backend ON by default (-DMSA_CUDA=OFF leaves it out)")
    set(${out} ON PARENT_SCOPE)
  else()
    message(STATUS "msa: GPU found but no CUDA compiler: CUDA backend OFF")
  endif()
endfunction()
