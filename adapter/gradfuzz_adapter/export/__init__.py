"""`export`: a case as a pytest file (docs/BACKENDS.md; docs/TE.md "Exported scripts").

One pipeline, several forms, one dialect per backend:

- request.py decodes the request once (ExportRequest: form, backend, paths, expectations);
- the form writes the script: compact.py (the default: only what the case uses, every
  oracle check), full.py (`"full": true`: self-contained), distributed.py (a case with
  expect.sharding: a torchrun script), upstream.py (`"form": "upstream"`: the test a TE
  maintainer pastes into TE's test_fusible_ops.py, one assertion for one finding; verify.py
  runs it);
- the form asks the backend's dialect (te_dialect.py, torch_dialect.py; the questions in
  dialect.py) wherever the backends differ;
- values.py spells the case's tensors, picker.py picks the definitions a script embeds,
  reference.py writes the float64 reference, support.py and templates.py are the helpers
  scripts embed.

Writing a script never imports TE.
"""

import re

from .compact import compact_script
from .distributed import distributed_export
from .full import full_script
from .request import ExportRequest
from .te_dialect import TEDialect
from .text import EMBEDDED_MARK
from .torch_dialect import TorchDialect
from .upstream import upstream_export
from .values import ScriptValues

DIALECTS = {d.name: d for d in (TEDialect(), TorchDialect())}

__all__ = ["DIALECTS", "EMBEDDED_MARK", "ExportRequest", "dialect", "export_reply"]


def dialect(backend):
    """The script dialect of `backend` (ValueError for one that writes no scripts)."""
    found = DIALECTS.get(backend)
    if found is None:
        raise ValueError(f"export writes te or torch scripts, got '{backend}'")
    return found


def usage_steps(case):
    """The usage script's elements `case` uses (harness/case_spec.h: usage_elements)."""
    calls = case.spec.get("repeat_calls") or []
    steps = [
        s
        for s in ("update", "inference_mode", "checkpoint", "recompute", "second_sequential")
        if any(c.get(s) for c in calls)
    ]
    if any(c.get("recipe_off") or c.get("amax_history_len") for c in calls):
        steps.append("recipe_change")
    case_wide = [
        s
        for s in (
            "read_after_backward",
            "deferred_init",
            "several_sequentials",
            "quantized_params",
            "held_quantized_tensor",
        )
        if getattr(case, s)
    ]
    return steps + case_wide


def _quantized_tensor_check(finding):
    """The finding's tensor where it is a quantized tensor's own check (an fp8_state finding
    of quantizer quantized_tensor or held_weight), else None."""
    tensor = (finding or {}).get("tensor") or ""
    return (
        tensor if re.match(r"fp8_state\[\d+\]\.(quantized_tensor|held_weight)\[", tensor) else None
    )


def export_reply(case, request, default_backend, tensors=()):
    """The reply to an `export` request (docs/BACKENDS.md): {"ok", "script", "notes"} and
    "data_file" where values went to the request's `data_file` (values.py), which it writes."""
    decoded = ExportRequest.decode(request, tensors, default_backend)
    steps = usage_steps(case)
    if steps:
        # Not written yet: a script without them would pass where the case fails.
        return {
            "ok": False,
            "refused": True,
            "error": f"the case's usage script ({', '.join(steps)}) is not written into exported "
            'tests yet; `gradfuzz replay` runs it (docs/BACKENDS.md "Steps")',
        }
    own_check = _quantized_tensor_check(decoded.finding)
    if own_check:
        # A tensor's representation, not a value: a script asserting on values would pass.
        return {
            "ok": False,
            "refused": True,
            "error": f"the finding is a quantized tensor's own check ({own_check}: its FP8 "
            "codes, column-wise copy or dequantize, or a quantized weight the caller reads), "
            "which is not written into exported tests yet; `gradfuzz replay` runs it",
        }
    chosen = dialect(decoded.backend)
    if decoded.form == "distributed":
        return distributed_export(case, decoded, chosen)
    if decoded.form == "upstream":
        return upstream_export(case, decoded, chosen)
    values = ScriptValues(case, data_file=decoded.data_file, extra=decoded.value_extras())
    write = full_script if decoded.form == "full" else compact_script
    script = write(case, decoded, chosen, values)
    values.save()
    reply = {"ok": True, "script": script, "notes": values.notes}
    if values.data:
        reply["data_file"] = decoded.data_file
    return reply
