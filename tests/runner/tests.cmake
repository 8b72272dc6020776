# Tests of runner/: one case through the model backend's paths and the oracle.
gradfuzz_add_test(runner_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/case_cost_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/quantization_points_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/run_case_test.cc
  LIBS gradfuzz::runner)
