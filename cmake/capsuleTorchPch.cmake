# One precompiled header for every translation unit that includes LibTorch.
#
# A LibTorch translation unit spends most of its compile time parsing the same ~300,000 lines of
# ATen and autograd headers. They are parsed once here, into the precompiled header of the tiny
# target capsule_torch_pch, and every target that calls capsule_use_torch_pch(TARGET) reuses it
# (CMake's REUSE_FROM): GCC loads the header instead of parsing it again. Build-time only: nothing is
# installed, the sources still include what they use, and -DCAPSULE_PRECOMPILE_HEADERS=OFF builds
# without it. Measured in the README ("Building").
#
# A reusing target must be compiled with the options the header was: the same LibTorch definitions
# (both link torch), -fPIC, and no -fopenmp (a file compiled with
# OpenMP, whose at::parallel_for differs, sets SKIP_PRECOMPILE_HEADERS). GCC refuses a header made
# with other options, and -Winvalid-pch (which CMake adds) makes that a warning, an error under
# CAPSULE_WERROR.
option(CAPSULE_PRECOMPILE_HEADERS "Precompile the LibTorch headers once for every torch target" ON)

if(CAPSULE_PRECOMPILE_HEADERS)
  add_library(capsule_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cc)
  target_link_libraries(capsule_torch_pch PRIVATE ${TORCH_LIBRARIES})
  target_precompile_headers(capsule_torch_pch PRIVATE
    <ATen/ATen.h>
    <ATen/Parallel.h>
    <c10/util/Exception.h>
    <torch/csrc/autograd/autograd.h>
    <algorithm>
    <functional>
    <map>
    <memory>
    <optional>
    <string>
    <vector>)
endif()

function(capsule_use_torch_pch target)
  if(CAPSULE_PRECOMPILE_HEADERS)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      # The header is made with -fPIC; an executable would compile with -fPIE, which GCC refuses
      # to mix. Its objects take -fPIC instead (and still link into a position-independent
      # executable, the compiler's default here).
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
    target_precompile_headers(${target} REUSE_FROM capsule_torch_pch)
  endif()
endfunction()
