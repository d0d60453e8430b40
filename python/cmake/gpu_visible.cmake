# msa_gpu_visible(VAR): sets VAR to ON when this machine shows an NVIDIA GPU
# (nvidia-smi lists one, or a /dev/nvidia<N> device node exists), else OFF.
function(msa_gpu_visible var)
  set(_visible OFF)
  find_program(_msa_nvidia_smi nvidia-smi)
  if(_msa_nvidia_smi)
    execute_process(COMMAND ${_msa_nvidia_smi} -L RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_QUIET
                    TIMEOUT 20)
    if(_rc EQUAL 0 AND _out MATCHES "GPU [0-9]")
      set(_visible ON)
    endif()
  endif()
  file(GLOB _nodes /dev/nvidia[0-9]*)
  if(_nodes)
    set(_visible ON)
  endif()
  set(${var} ${_visible} PARENT_SCOPE)
endfunction()
