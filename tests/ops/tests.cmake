# Tests of ops/ (the op runtime); one source per header, shared helpers in test_util.
gradfuzz_add_test(ops_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/test_util.cc
    ${CMAKE_CURRENT_LIST_DIR}/basic_op_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/catalog_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/extra_outputs_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/faults_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/fused_ops_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/fuser_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/fusion_registry_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/quantization_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/reference_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequential_test.cc
  LIBS gradfuzz::ops)
