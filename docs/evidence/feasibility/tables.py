"""The feasibility model against the reference texts (docs/feasibility.md), rebuilt from ``calibration.json``.

``measure.py`` here writes the file from the model itself (``tuner.search.feasibility``) and the catalog;
``tests/unit/test_feasibility.py`` checks that the file is what the model says now.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _data(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "calibration.json").read_text(encoding="utf-8")))


def _case(folder: Path, name: str) -> dict[str, Any]:
    return next(c for c in _data(folder)["cases"] if c["case"] == name)


def _model_says(c: dict[str, Any]) -> str:
    if not c["fits"]:
        return f"**does not fit**: {c['weights_gib']} GiB of weights per rank vs {c['usable_gib']} GiB usable"
    draft = f" (incl. {c['draft_gib']} GiB draft)" if c["draft_gib"] else ""
    replicated = " (one replica: the same cache on its TP ranks)" if c["dp"] == 1 and c["tp"] > 1 else ""
    capped = (" (the max-num-seqs cap)" if c["max_num_seqs"] and c["max_concurrency"] == c["dp"] * c["max_num_seqs"]
              else "")
    return (f"fits: {c['weights_gib']} GiB weights{draft}, {c['kv_gib_per_rank']} GiB KV per rank, "
            f"{c['kv_tokens_per_rank'] / 1e6:.2f} M tokens per rank{replicated} → "
            f"**{c['max_concurrency']:,}** sequences of 1024+1024{capped}")


def calibration(folder: Path) -> str:
    rows = ["| case | source | reference says | model says |", "|---|---|---|---|"]
    for c in _data(folder)["cases"]:
        rows.append(f"| {c['case']} (`{c['profile']}`, `{c['checkpoint']}`, baseline `{c['baseline']}`"
                    + (", " + ", ".join(f"{k} {'off' if v is None else v}" for k, v in c["changed"].items())
                       if c["changed"] else "")
                    + f") | {c['source']} | {c['reference_says']} | {_model_says(c)} |")
    return "\n".join(rows)


def checkpoints(folder: Path) -> str:
    rows = ["| checkpoint | size (GB) | routed experts (GB) | draft (GB) | rest (GB) |", "|---|---:|---:|---:|---:|"]
    for name, c in _data(folder)["checkpoints"].items():
        rows.append(f"| `{name}` | {c['size_gb']} | {c['routed_experts_gb']} | {c['draft_gb']} | "
                    f"{c['non_expert_gb']} |")
    return "\n".join(rows)


def constants(folder: Path) -> str:
    k = _data(folder)["constants"]
    return (f"non-torch "
            f"{k['non_torch_gib']:g} GiB; activations {k['activation_kib_per_batched_token']:g} KiB per batched token; "
            f"fp32 logits over {k['logit_vocab']:,} ids; CUDA graphs {k['cudagraph_base_gib']:g} GiB + "
            f"{k['cudagraph_mib_per_captured_token']:g} MiB per captured token")


def kv_bytes(folder: Path) -> str:
    return f"{_data(folder)['constants']['kv_bytes_per_token_fp8']:,}"


def dp_over_tp(folder: Path) -> str:
    dp = _case(folder, "4×96 GB, DP4 + EP, utilization 0.95, 1024 sequences per rank")["max_concurrency"]
    tp = _case(folder, "4×96 GB, TP4 + EP, utilization 0.92, max-num-seqs 2048")["max_concurrency"]
    return f"{dp:,} vs {tp:,} = {dp / tp:.1f}×"


TABLES: dict[str, Callable[[Path], str]] = {"calibration": calibration, "checkpoints": checkpoints,
                                           "constants": constants, "kv_bytes": kv_bytes, "dp_over_tp": dp_over_tp}
