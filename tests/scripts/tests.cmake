# Tests of scripts/: the nightly Slurm recipe end to end on a one-node Slurm cluster the test
# starts itself (needs root and Debian's slurm-wlm and munge: scripts/ci-deps.sh). It fails,
# never skips, when they are missing.
add_test(NAME scripts.nightly_slurm
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/nightly_slurm_test.sh
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(scripts.nightly_slurm PROPERTIES
  ENVIRONMENT "GRADFUZZ_EXECUTABLE=${PROJECT_BINARY_DIR}/tools/gradfuzz;GRADFUZZ_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
  TIMEOUT 900
  # Two shards and the merge job take both cores of a CI machine.
  PROCESSORS 2
  LABELS "slurm")

# scripts/case_cost.py (the cost ledgers' A/B comparison docs/BENCHMARKS.md quotes).
add_test(NAME scripts.case_cost
         COMMAND ${GRADFUZZ_PYTHON_EXE} -m pytest -q -p no:cacheprovider tests/scripts/case_cost_test.py
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
