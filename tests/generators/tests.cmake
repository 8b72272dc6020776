# Tests of generators/ (case generator, invalid-case generator, validator, coverage, shrinker);
# one source per header. RapidCheck properties run through rapidcheck's GoogleTest glue.
gradfuzz_add_test(generators_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/case_gen_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/coverage_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/invalid_gen_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/parallel_gen_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/shrink_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/validate_test.cc
  LIBS gradfuzz::generators gradfuzz::runner rapidcheck_gtest)
