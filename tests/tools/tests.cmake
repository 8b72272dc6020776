# Tests of tools/: the command line's exit statuses and the report tools.
gradfuzz_add_test(tools_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/cli_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/report_tool_test.cc
  LIBS gradfuzz::cli)
