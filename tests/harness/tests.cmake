# Tests of harness/ (case specs, results, limits, the builder); one source per header.
gradfuzz_add_test(harness_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/builder_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/capabilities_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/case_result_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/case_spec_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/limits_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sharding_test.cc
  LIBS gradfuzz::harness rapidcheck_gtest)
