"""The torch backend on CUDA: the GPU survey's random cases (te_gpu's generator) judged
against the reference, to check the backend's device handling. Prints verdict counts.

    PYTHONPATH=adapter python3 adapter/tests/survey_torch_cuda.py [CASES]
"""

import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from helpers import judge, run  # noqa: E402
from survey_te_gpu import random_spec  # noqa: E402

from gradfuzz_adapter.backends import configure_torch  # noqa: E402
from gradfuzz_adapter.torch_backend.backend import TorchBackend  # noqa: E402


def main(count):
    configure_torch()
    backend = TorchBackend()
    rng = random.Random(3)
    tally = {}
    for k in range(count):
        case_spec = random_spec(rng, k)
        if not case_spec["ops"]:
            continue
        case_spec["device"] = "cuda"
        case, results = run(backend, case_spec)
        r = results[0]
        if r["status"] == "ok":
            problems = judge(case, r)
            verdict = "mismatch" if problems else "pass"
            if problems and case_spec["dtype"] == "float32":
                print(json.dumps(case_spec), problems[:2])
        else:
            verdict = f"{r['status']}:{(r.get('error') or {}).get('kind')}"
            print(json.dumps(case_spec), r.get("error") or r.get("reason"))
        key = f"{case_spec['dtype']}:{verdict}"
        tally[key] = tally.get(key, 0) + 1
    print(json.dumps(tally, sort_keys=True))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
