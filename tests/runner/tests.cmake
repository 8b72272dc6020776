# Tests of runner/: one case through the model backend's paths and the oracle (run_case_test),
# and each owner beside it on hand-written cases, without a backend (a scripted stand-in for
# the paths).
gradfuzz_add_test(runner_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/case_cost_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/case_paths_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/evidence_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/features_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/judge_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/quantization_points_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/recipe_off_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/reference_set_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/run_case_test.cc
  LIBS gradfuzz::runner)
