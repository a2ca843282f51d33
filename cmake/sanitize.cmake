# Sanitizer and fuzzing builds (scripts/test.sh runs them; see README.md "Test stages").
#
# EXPANSE_SANITIZE: a list for -fsanitize=, e.g. "address,undefined" or "thread". Every C and C++
# target of the project (library, reference, CLI, tests) is compiled and linked with it, with
# -fno-sanitize-recover=all (the first report fails the test) and -fno-omit-frame-pointer (useful
# stacks). Not for CUDA or the Python module.
#
# EXPANSE_ENABLE_FUZZ (clang only): also instruments everything for libFuzzer's coverage
# (-fsanitize=fuzzer-no-link) and links the harnesses of tests/fuzz with libFuzzer. Without it the
# harnesses are still built, with a replay driver, and replay their corpus as ordinary tests.
set(EXPANSE_SANITIZE "" CACHE STRING "Sanitizers for -fsanitize= (e.g. address,undefined or thread); empty: none")
option(EXPANSE_ENABLE_FUZZ "Build the libFuzzer harnesses of tests/fuzz (needs clang)" OFF)

set(EXPANSE_SANITIZE_FLAGS "")
if(EXPANSE_SANITIZE)
  set(EXPANSE_SANITIZE_FLAGS -fsanitize=${EXPANSE_SANITIZE} -fno-omit-frame-pointer)
  if(NOT EXPANSE_SANITIZE MATCHES "thread")
    list(APPEND EXPANSE_SANITIZE_FLAGS -fno-sanitize-recover=all)
  endif()
  if(EXPANSE_ENABLE_CUDA OR EXPANSE_ENABLE_HIP OR EXPANSE_ENABLE_PYTHON)
    message(WARNING "EXPANSE_SANITIZE applies to the C and C++ targets only, not to GPU code or the Python module")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${EXPANSE_SANITIZE_FLAGS}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:${EXPANSE_SANITIZE_FLAGS}>")
endif()

if(EXPANSE_ENABLE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "EXPANSE_ENABLE_FUZZ needs clang (libFuzzer); configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "-DCMAKE_C_COMPILER=clang")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()
