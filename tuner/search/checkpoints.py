"""The checkpoint catalog: which DeepSeek-V4-Flash artifact a study serves, and what it weighs.

``search_spaces/_checkpoints.yaml`` names each checkpoint (``--checkpoint 0731``) with its repository,
revision, size, the precision split of its weights, and the speculative draft it carries. The
feasibility model reads the sizes; :func:`tuner.search.profile.bind_checkpoint` reads the draft
method, so a study on the 0731 release drafts with DSpark and one on the preview with MTP, by
construction.

Sources: the optimization dossier (0731 ~167 GB, FP4 experts + FP8 remainder, DSpark not MTP, vLLM
0.25.0+), the W4A16-FP8-MTP model card (159 GB incl. a 3 GB BF16 MTP block; MTP k=1 cap on Hopper).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner import catalog
from tuner.errors import CatalogError, UnknownNameError

CATALOG_FILE = "_checkpoints.yaml"

Precision = Literal["fp4", "mxfp4", "nvfp4", "int4", "fp8", "bf16", "fp32", "mixed"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightSplit(_Strict):
    """Precision of each weight group (what the bytes are made of)."""

    routed_experts: Precision
    attention: Precision
    draft: Precision | None = None


class Checkpoint(_Strict):
    """One serving identity: repository + revision, size, weight split, draft."""

    name: str = ""
    repo: str
    revision: str | None = None
    """A commit to pin; ``None`` means the branch head (record the resolved commit with results)."""
    label: str = ""
    size_gb: float = Field(gt=0)
    """On-Hub size in decimal GB (10^9 bytes), draft included."""
    routed_experts_gb: float = Field(gt=0)
    """Bytes of the 43 × 256 routed experts: sharded over EP, TP-sliced otherwise."""
    draft_gb: float = Field(default=0.0, ge=0)
    """Bytes of the speculative draft module (MTP head or DSpark drafter); loaded only when drafting."""
    size_is_estimate: bool = False
    weights: WeightSplit
    draft_method: str | None = None
    """The speculative method the checkpoint carries (``dspark``, ``mtp``), or ``None``."""
    default_draft_tokens: int = Field(default=0, ge=0)
    draft_kv_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Extra KV per token the draft layers add, as a fraction of the target's."""
    kv_bytes_per_token: int | None = Field(default=None, gt=0)
    """Override of the DSV4 KV model's bytes per token at FP8 (for other models, e.g. the CPU demo)."""
    min_vllm: str | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _split_adds_up(self) -> Checkpoint:
        if self.routed_experts_gb + self.draft_gb > self.size_gb:
            raise ValueError(f"routed_experts_gb ({self.routed_experts_gb}) + draft_gb ({self.draft_gb}) "
                             f"exceed size_gb ({self.size_gb})")
        if (self.draft_method is None) != (self.draft_gb == 0):
            raise ValueError("draft_method and draft_gb go together: both set, or neither")
        return self

    @property
    def non_expert_gb(self) -> float:
        """Attention, shared experts, embeddings, norms: replicated on every DP rank."""
        return self.size_gb - self.routed_experts_gb - self.draft_gb


class CheckpointCatalog(_Strict):
    default: str
    checkpoints: dict[str, Checkpoint]

    @model_validator(mode="after")
    def _default_known(self) -> CheckpointCatalog:
        if self.default not in self.checkpoints:
            raise ValueError(f"default {self.default!r} is not one of {sorted(self.checkpoints)}")
        return self


def catalog_path() -> Path:
    return catalog.catalog_dir("search_spaces") / CATALOG_FILE


def load_catalog(path: Path | None = None) -> CheckpointCatalog:
    """Read the checkpoint catalog; every problem is a CatalogError naming file and key."""
    path = path or catalog_path()
    data = catalog.read_yaml(path)
    if not isinstance(data, dict):
        raise CatalogError(path, "(top level)", "expected a mapping with 'default' and 'checkpoints'",
                           "see the shipped search_spaces/_checkpoints.yaml")
    try:
        loaded = CheckpointCatalog.model_validate(data)
    except ValidationError as exc:
        raise catalog.format_validation_error(path, exc, CheckpointCatalog) from exc
    named = {key: ckpt.model_copy(update={"name": key}) for key, ckpt in loaded.checkpoints.items()}
    return loaded.model_copy(update={"checkpoints": named})


def load_checkpoint(name: str | None = None, path: Path | None = None) -> Checkpoint:
    """One checkpoint by catalog name (``None`` = the catalog's default)."""
    cat = load_catalog(path)
    key = name or cat.default
    if key not in cat.checkpoints:
        raise UnknownNameError("checkpoint", key, sorted(cat.checkpoints))
    return cat.checkpoints[key]
