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
# The fixed-seed comparison (issue 27): small campaigns of fixed seeds on the model and torch
# backends whose outcome must stay that of tests/campaign/data/fixed_seed/ (a refactor keeps
# the same seeds' findings and clusters; GRADFUZZ_UPDATE_GOLDEN=1 rewrites them).
gradfuzz_add_test(fixed_seed_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/fixed_seed_test.cc
  LIBS gradfuzz::cli)
