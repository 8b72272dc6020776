# The formatters run with every test run, so every change is formatted the same way.
add_test(NAME format.clang_format COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_format.sh clang-format
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME format.ruff COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/check_format.sh ruff
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
