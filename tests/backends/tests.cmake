# Tests of backends/: the torch backend through the adapter, end to end (workers, export).
gradfuzz_add_test(backends_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/torch_backend_test.cc
  LIBS gradfuzz::cli)
