# Tests of tools/: the campaign loop in-process and the command line's exit statuses.
gradfuzz_add_test(tools_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/campaign_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/cli_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/files_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/report_tool_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sanitizer_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/torch_backend_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_pool_test.cc
  LIBS gradfuzz::cli)
