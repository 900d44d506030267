"""``forkserver.run`` gives what ``subprocess.run`` of a new interpreter gives: the same
``sys.argv``, ``sys.path``, ``__name__``, working directory and environment, the same output
and exit status (an exception, ``sys.exit``, a signal), a timeout that kills the process; and
the call is really a fork of the server (the point: no torch import of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import forkserver

TESTS = Path(__file__).resolve().parent

SHOW = (
    "import json, os, sys; print(json.dumps({'argv': sys.argv, 'path': sys.path, 'name': __name__, 'cwd': os.getcwd(), "
    "'env': os.environ.get('ORT_LAZY_X'), 'torch': 'torch' in sys.modules}))"
)


def _both(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    before = dict(forkserver.counts)
    forked = forkserver.run(argv, env=env, cwd=cwd, timeout=120)
    assert forkserver.counts["forked"] == before["forked"] + 1, forkserver._failed
    new = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return forked, new


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(tmp_path / "elsewhere")]), "ORT_LAZY_X": "1"}


def test_a_fork_sees_what_a_new_interpreter_sees(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW + "\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "show.py").write_text(SHOW + "\n")
    for argv in ([sys.executable, "-c", SHOW, "a", "b"], [sys.executable, str(script), "x"], [sys.executable, "-m", "pkg.show", "y"]):
        forked, new = _both(argv, tmp_path, env)
        assert forked.returncode == new.returncode == 0, (forked.stderr[-2000:], new.stderr[-2000:])
        got, want = json.loads(forked.stdout), json.loads(new.stdout)
        assert got.pop("torch") and not want.pop("torch")  # the one difference: torch is imported already
        assert got == want


@pytest.mark.parametrize(
    "code",
    ["import sys; sys.exit(3)", "raise ValueError('boom')", "import sys; sys.exit('bye')",
     "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "import sys; print('out'); print('err', file=sys.stderr)"],
    ids=["exit-3", "exception", "exit-message", "segfault", "output"],
)
def test_a_fork_ends_as_a_new_interpreter_ends(code: str, tmp_path: Path, env: dict[str, str]) -> None:
    forked, new = _both([sys.executable, "-c", code], tmp_path, env)
    assert forked.returncode == new.returncode
    assert forked.stdout == new.stdout
    assert forked.stderr.strip().splitlines()[-1:] == new.stderr.strip().splitlines()[-1:]


def test_a_fork_that_runs_too_long_is_killed(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([sys.executable, "-c", "import time; time.sleep(600)"], env=env, cwd=tmp_path, timeout=2)
    assert forkserver.run([sys.executable, "-c", "print(7)"], env=env, cwd=tmp_path, timeout=60).stdout == "7\n"


def test_another_environment_gets_a_new_interpreter(tmp_path: Path, env: dict[str, str]) -> None:
    """A variable the server's imports could have read (anything but ort-lazy's, PYTHONPATH and
    pytest's test name) differs: a new interpreter."""
    forkserver.run([sys.executable, "-c", "pass"], env=env, cwd=tmp_path)  # the server is up
    before = dict(forkserver.counts)
    out = forkserver.run([sys.executable, "-c", "import os; print(os.environ['OTHER'])"], env={**env, "OTHER": "1"}, cwd=tmp_path)
    assert out.stdout == "1\n"
    assert forkserver.counts == {"forked": before["forked"], "new": before["new"] + 1}
