# Tests of reports/: golden report documents (tests/reports/golden/*.json) and reporters.
gradfuzz_add_test(reports_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/json_reporter_test.cc
  LIBS gradfuzz::reports)
