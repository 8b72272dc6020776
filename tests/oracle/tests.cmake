# Tests of oracle/ (comparisons, tolerances, finite differences); they need no backend.
gradfuzz_add_test(oracle_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/divergence_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/finite_difference_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/oracle_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/rounding_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/signature_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/tolerances_test.cc
  LIBS gradfuzz::oracle gradfuzz::runner)
