# Tests of backends/: the torch backend through the adapter, end to end (workers, export);
# shared runs against separate ones on te (TE's Python over the stub) and the model (first:
# run_case reads GRADFUZZ_CASE_COST once per process, and the later suites run cases in
# process too); distributed cases (ranks on gloo, TE's tensor parallelism over the stub).
gradfuzz_add_test(backends_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/shared_runs_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/distributed_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/torch_backend_test.cc
  LIBS gradfuzz::cli)
