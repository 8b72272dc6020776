# Tests of corpus/ (case files) and the replay of corpus/regression.
gradfuzz_add_test(corpus_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/case_file_test.cc
  LIBS gradfuzz::corpus)
# One ctest test per regression case file, listed when ctest runs.
gradfuzz_add_test(regression_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/regression_test.cc
  LIBS gradfuzz::corpus gradfuzz::runner
  DISCOVERY_MODE PRE_TEST)
