# Warnings for twblas's own targets (never for third-party code): -Wall -Wextra, and -Werror
# when TWBLAS_WERROR is on (CI). Sanitizers when TWBLAS_SANITIZE (ASan + UBSan),
# TWBLAS_SANITIZE_THREAD (TSan) or TWBLAS_BUILD_FUZZERS (libFuzzer coverage + ASan + UBSan) is on.
# -Wshadow=local is GCC's; Clang (the fuzzer builds) has no such option.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(_twblas_shadow_warning -Wshadow=local)
else()
  set(_twblas_shadow_warning "")
endif()
function(twblas_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra ${_twblas_shadow_warning} -Wno-unknown-pragmas>
    $<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<BOOL:${TWBLAS_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${TWBLAS_WERROR}>>:-Werror=all-warnings>)
endfunction()

if(TWBLAS_SANITIZE)
  # -fno-sanitize=enum: C callers may pass any int as an enum argument, and the API must answer
  # TW_STATUS_INVALID_VALUE for it (the tests do exactly that), which C++ calls an invalid load.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize=enum>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()

if(TWBLAS_SANITIZE_THREAD)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=thread>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=thread)
endif()

if(TWBLAS_BUILD_FUZZERS)
  # Every object gets libFuzzer's coverage instrumentation (fuzzer-no-link) and ASan + UBSan; the
  # fuzzer programs add libFuzzer's main at link time (tests/fuzz). -fno-sanitize=enum as above.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link,address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize=enum>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()
