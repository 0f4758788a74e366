"""What the HTTP side of one emulated launch needs (address, keys, served names, parsers), read from vLLM's
parsed arguments; the levers the performance model reads are :class:`tuner.perfmodel.EmulatedConfig`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.perfmodel.serve_config import EmulatedConfig

__all__ = ["Frontend"]


@dataclass(frozen=True)
class Frontend:
    """What the HTTP side of one launch needs."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    served_model_names: tuple[str, ...] = ()
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    tokenizer_mode: str = "auto"
    access_log: bool = True

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, env_api_key: str | None) -> Frontend:
        model = getattr(ns, "model_tag", None) or getattr(ns, "model", None) or EmulatedConfig.model
        names = tuple(_as_list(getattr(ns, "served_model_name", None))) or (str(model),)
        keys = tuple(_as_list(getattr(ns, "api_key", None))) or ((env_api_key,) if env_api_key else ())
        return cls(host=ns.host or "127.0.0.1", port=int(ns.port), api_keys=keys, served_model_names=names,
                   reasoning_parser=getattr(ns, "reasoning_parser", None) or None,
                   tool_call_parser=getattr(ns, "tool_call_parser", None) or None,
                   enable_auto_tool_choice=bool(getattr(ns, "enable_auto_tool_choice", False)),
                   tokenizer_mode=str(getattr(ns, "tokenizer_mode", "auto") or "auto"),
                   access_log=not bool(getattr(ns, "disable_uvicorn_access_log", False)))


def _as_list(value: Any) -> Sequence[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]
