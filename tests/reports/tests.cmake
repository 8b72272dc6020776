# Tests of reports/: golden report documents (tests/reports/golden/*.json) and reporters,
# reading, merging and comparing reports, and the JUnit and HTML writers (the HTML page is
# rendered in headless Chromium: Debian's chromium package, installed by scripts/ci-deps.sh).
gradfuzz_add_test(reports_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/html_report_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/json_reporter_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/junit_report_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/report_diff_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/report_document_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/report_merge_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/report_test_util.cc
    ${CMAKE_CURRENT_LIST_DIR}/upstream_report_test.cc
  LIBS gradfuzz::reports)
