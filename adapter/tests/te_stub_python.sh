#!/usr/bin/env bash
# A "python" for `gradfuzz --backend te --python-exe adapter/tests/te_stub_python.sh` on a
# machine without TE or a GPU: the adapter runs TE 2.20.2's own Python (te.ops' fuser,
# Sequential and the plain-torch ops: MakeExtraOutput, AddExtraInput, ConstantScale, Bias,
# Identity, Reshape) over the stubbed extension of te_stub.py, on the CPU. Ops that need TE's
# kernels (BasicLinear, activations, norms, GroupedLinear) fail there. For replaying TE
# findings of those ops on a CPU (docs/TE.md), and for measuring the te worker's own cost
# (`gradfuzz fuzz --backend te --device cpu`, docs/BENCHMARKS.md): its findings are not TE's.
#   called as: te_stub_python.sh -m gradfuzz_adapter --backend te
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${GRADFUZZ_STUB_PYTHON:-$here/../../.venv/bin/python}"
[ "$1" = "-m" ] && [ "$2" = "gradfuzz_adapter" ] && shift 2
# The rank processes of distributed cases (gradfuzz_adapter/ranks.py) make theirs alike.
export GRADFUZZ_RANK_BACKEND=te_stub:rank_backend
exec "$python" -c "
import sys
sys.path.insert(0, '$here')
import te_stub
reason = te_stub.available()
if reason:
    sys.exit('te_stub_python.sh: ' + reason)
te_stub.install()
from gradfuzz_adapter import __main__ as adapter
from gradfuzz_adapter.te.backend import TEBackend
class StubTEBackend(TEBackend):
    def hello(self):
        # It runs on the CPU: a campaign with --device cpu may use it (cuda stays listed,
        # so case files of the GPU replay here too).
        out = super().hello()
        out['capabilities']['devices'] = ['cpu', 'cuda']
        return out
adapter.make_backend = lambda name: StubTEBackend(device='cpu')
sys.exit(adapter.main(sys.argv[1:]))
" "$@"
