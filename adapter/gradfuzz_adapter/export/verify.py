"""Runs an upstream test as its reader will (pytest in a subprocess) and says whether it
fails, and why: the assertion (which line, so which tensor) or the exception (type and
message), or a crash of the process.

verify_upstream() judges a written test against its finding: a mismatch, a missing
gradient or a modified input must fail on the test's one assertion; an error must raise the
finding's exception type; a crash must take the process down. For the torch dialect the
test runs twice, with the finding's planted fault switched on (GRADFUZZ_FAULT, as replay
plants it) and without: it reproduces when it fails for the finding's reason with the fault
and passes without.
"""

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-rA"]


@dataclass
class Outcome:
    """One pytest run of a test file."""

    status: str  # "passed", "failed" (an exception), "crashed" (the process died), "error"
    exception: str = ""  # the exception's type, as pytest names it
    message: str = ""  # its first line
    line: int = 0  # the test file's line that raised (its last frame in the file)
    output: str = ""

    def words(self):
        if self.status == "passed":
            return "passes"
        if self.status == "crashed":
            return "crashes the process"
        where = f" at line {self.line}" if self.line else ""
        return f"fails{where} with {self.exception}: {self.message}".rstrip(": ")


def run_test(path, *, env=None, command=None, timeout=600):
    """Runs pytest on test file `path` (in its folder); returns its Outcome. `env`: variables
    added to this process's environment; `command`: the pytest command line (PYTEST)."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        result = subprocess.run(
            [*(command or PYTEST), name],
            cwd=folder,
            env=dict(os.environ, COLUMNS="1000", **(env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        return Outcome("crashed", "Timeout", f"no result in {timeout} s", output=str(e))
    output = result.stdout + result.stderr
    return parse(output, name, result.returncode)


def parse(output, name, returncode):
    """The Outcome of pytest's `output` (with --tb=short -rA) for test file `name`."""
    if returncode == 0 and re.search(r"^PASSED ", output, re.M):
        return Outcome("passed", output=output)
    summary = re.search(rf"^(FAILED|ERROR) {re.escape(name)}\S* - (.*)$", output, re.M)
    if summary is None:
        if returncode < 0 or returncode > 5:
            return Outcome("crashed", "", f"pytest exited with {returncode}", output=output)
        return Outcome("error", "", f"pytest exited with {returncode}", output=output)
    exception, _, message = summary.group(2).partition(": ")
    frames = re.findall(rf"^{re.escape(name)}:(\d+): in ", output, re.M)
    status = "failed" if summary.group(1) == "FAILED" else "error"
    return Outcome(status, exception.strip(), message.strip(), int(frames[-1]) if frames else 0,
                   output)  # fmt: skip


@dataclass
class Verdict:
    """Whether an upstream test shows its finding: `with_fault` is the run with the
    finding's fault (or the only run), `without_fault` the run without (torch dialect with
    a fault), `reason` says what the finding needs."""

    reason: str
    with_fault: Outcome
    without_fault: Outcome | None = None
    matches: bool = False

    @property
    def reproduces(self):
        clean = self.without_fault is None or self.without_fault.status == "passed"
        return self.matches and clean

    def summary(self):
        text = f"the test {self.with_fault.words()}"
        if self.without_fault is not None:
            text = f"with the fault {text.removeprefix('the test ')}; without it it " + (
                self.without_fault.words()
            )
        verdict = "reproduces" if self.reproduces else "does NOT reproduce"
        return f"{text} ({verdict} the finding: {self.reason})"


def expected_reason(writer):
    """What the finding's failure looks like, in words, and a predicate on an Outcome."""
    finding = writer.finding
    if finding.kind == "crash":
        return "the process crashes", lambda o: o.status == "crashed"
    if finding.kind == "unexpected_error":
        wanted = (finding.error_type or "").rsplit(".", 1)[-1]

        def raised(o):
            got = o.exception.rsplit(".", 1)[-1]
            return o.status == "failed" and (not wanted or got == wanted)

        return f"raises {wanted or 'an exception'}", raised
    line = writer.assert_line

    def asserted(o):
        return o.status == "failed" and o.exception == "AssertionError" and o.line == line

    return f"the assertion on {finding.tensor or 'the caller tensor'} (line {line}) fails", asserted


def verify_upstream(script, writer, *, fault=None, data=None, command=None, timeout=600):
    """Runs `script` (written by `writer`, an UpstreamWriter) and judges it against the
    writer's finding. `data`: (file name, {key: tensor}) written beside the test."""
    reason, matches = expected_reason(writer)
    with tempfile.TemporaryDirectory(prefix="gradfuzz-upstream-") as folder:
        path = os.path.join(folder, f"{writer.test_name()}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        if data is not None:
            torch.save(data[1], os.path.join(folder, data[0]))
        env = writer.dialect.upstream_environment(fault)
        with_fault = run_test(path, env=env, command=command, timeout=timeout)
        without = None
        if fault:
            clean = writer.dialect.upstream_environment(None)
            without = run_test(path, env=clean, command=command, timeout=timeout)
    return Verdict(reason, with_fault, without, matches(with_fault))


def runnable_here(dialect):
    """None where `dialect`'s tests can run in this process's environment, else why not."""
    return dialect.upstream_runnable_reason()
