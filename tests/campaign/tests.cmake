# Tests of campaign/: the campaign loop in process and on workers, files, sanitizer logs, the
# MPS daemon of --mps.
gradfuzz_add_test(campaign_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/campaign_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/confirmation_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/files_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/known_issues_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/mps_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sanitizer_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/selftest_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_pool_test.cc
  LIBS gradfuzz::cli)
