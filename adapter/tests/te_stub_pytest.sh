#!/usr/bin/env bash
# pytest with TransformerEngine's Python over the stubbed extension (te_stub.py), for
# running an exported te script on a CPU machine, also one rank per process:
#   torchrun --nproc-per-node 2 --no-python adapter/tests/te_stub_pytest.sh -q test_x.py
# GRADFUZZ_TE_STUB_GEMM=1 lets BasicLinear's unquantized GEMMs run (torch's matmul).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${GRADFUZZ_STUB_PYTHON:-$here/../../.venv/bin/python}"
exec "$python" -c "
import sys
sys.path.insert(0, '$here')
import te_stub
reason = te_stub.available()
if reason:
    sys.exit('te_stub_pytest.sh: ' + reason)
te_stub.install()
import pytest
sys.exit(pytest.main(sys.argv[1:]))
" "$@"
