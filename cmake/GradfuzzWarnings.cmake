# gradfuzz_configure_target(<target>): warnings, sanitizers and the shared precompiled
# LibTorch header for one of the project's C++ targets.
function(gradfuzz_configure_target target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual>)
  if(GRADFUZZ_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(GRADFUZZ_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer)
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  endif()
  if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # ccache caches nothing built with GCC's precompiled header unless the preprocessor
    # output names it (with sloppiness pch_defines,time_macros, which setup.sh passes).
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fpch-preprocess>)
  endif()
  if(target STREQUAL "gradfuzz_ops")
    # LibTorch headers dominate compile time on a 2-core machine: precompile them once.
    target_precompile_headers(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:<ATen/ATen.h$<ANGLE-R>>
      $<$<COMPILE_LANGUAGE:CXX>:<torch/csrc/autograd/custom_function.h$<ANGLE-R>>)
  else()
    target_precompile_headers(${target} REUSE_FROM gradfuzz_ops)
  endif()
endfunction()
