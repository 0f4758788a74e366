"""A tiny model trained to answer the guard probes, so the gates can pass (and fail) on a real server.

A random-weight model emits no tool calls, so the tests train the demo model (:mod:`tuner.demo_model`)
on the exact token ids the DeepSeek V4 encoder renders for each probe turn, and on the answer the
probe expects (a DSML tool call, a ``reasoning</think>answer`` pair, a pass code). Rendering happens
in-process with vLLM's own ``vllm/tokenizers/deepseek_v4_encoding.py`` and the same kwargs handling as
vLLM's DSV4 tokenizer; the integration tests check that the server renders the same ids.

The trained model is cached under ``cache_root/trained-<hash>``, where the hash covers the base model
files, the training sequences and the recipe, so a test session trains once and later ones not at all.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tuner.catalog import resolve
from tuner.demo_model import swap_in
from tuner.errors import UsageError
from tuner.guard_chat import assistant_echo, tool_result_message
from tuner.guard_needle import fit_sentences, needle_messages
from tuner.guard_specs import (
    ChatProbe,
    ExpectedCall,
    NeedleSpec,
    ReasoningSpec,
    ToolCallSpec,
    load_spec,
)

__all__ = ["FIXTURE_GUARDS", "TrainingExample", "default_cache_root", "render_prompt", "train_fixture",
           "training_examples"]

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
MARKER_NAME = "dsv4-tune-trained.json"
FIXTURE_GUARDS: tuple[str, ...] = ("tool_call", "reasoning", "needle")
_LR = 5e-3
_MAX_STEPS = 300
_CHECK_EVERY_STEPS = 10
_MIN_MARGIN = 2.0
"""Smallest logit gap (target over runner-up) on every completion token before training stops."""
_BASE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja")

Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class TrainingExample:
    name: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


def default_cache_root() -> Path:
    return Path(os.environ.get("DSV4_TUNE_CACHE", Path.home() / ".cache" / "dsv4-tune"))


# ---------------------------------------------------------------- rendering, as vLLM's DSV4 tokenizer does


def _encoding_module() -> ModuleType:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("rendering DSV4 prompts needs vLLM installed (vllm/tokenizers/deepseek_v4_encoding.py). "
                         "Fix: run scripts/setup.sh")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizers" / "deepseek_v4_encoding.py"
    module_spec = importlib.util.spec_from_file_location("_dsv4_encoding", path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"cannot load {path}. Fix: reinstall vLLM")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _conversation(messages: Sequence[dict[str, Any]]) -> Messages:
    """The messages as vLLM's chat parser hands them to the renderer (reasoning_content → reasoning)."""
    out: Messages = []
    for message in messages:
        msg = dict(message)
        if "reasoning_content" in msg:
            reasoning = msg.pop("reasoning_content")
            msg.setdefault("reasoning", reasoning)
        if msg.get("content") is None:
            msg["content"] = ""
        out.append(msg)
    return out


def _tool_dicts(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools as vLLM's request model dumps them (``description`` always present, unset extras dropped)."""
    out = []
    for tool in tools:
        function = tool.get("function") or {}
        dumped: dict[str, Any] = {"name": function.get("name"), "description": function.get("description"),
                                  "parameters": function.get("parameters")}
        for extra in ("strict", "defer_loading"):
            if function.get(extra) is not None:
                dumped[extra] = function[extra]
        out.append({"type": "function", "function": dumped})
    return out


def render_prompt(encoding: ModuleType, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                  *, thinking: bool) -> str:
    """The prompt text vLLM 0.32's ``DeepseekV4Tokenizer.apply_chat_template`` renders (effort unset)."""
    conversation = _conversation(messages)
    if tools:
        idx = next((i for i, m in enumerate(conversation) if m.get("role") == "system"), None)
        if idx is None:
            conversation.insert(0, {"role": "system"})
            idx = 0
        conversation[idx] = {**conversation[idx], "tools": _tool_dicts(tools)}
    text: str = encoding.encode_messages(conversation, thinking_mode="thinking" if thinking else "chat",
                                         drop_thinking=True, reasoning_effort="high" if thinking else None)
    return text


# ---------------------------------------------------------------- the training set


def _parsed_call(expected: ExpectedCall) -> dict[str, Any]:
    """The message the tool parser returns for a trained call (what a client then sends back)."""
    if expected.arguments is None:
        raise UsageError(f"the trained fixture needs expect_call.arguments for {expected.name}")
    return {"content": None, "tool_calls": [{"id": "call_fixture", "type": "function",
                                             "function": {"name": expected.name,
                                                          "arguments": json.dumps(expected.arguments)}}]}


class _Renderer:
    def __init__(self, tokenizer: Any) -> None:
        self.encoding = _encoding_module()
        self.tokenizer = tokenizer

    def ids(self, text: str) -> tuple[int, ...]:
        return tuple(int(t) for t in self.tokenizer.encode(text, add_special_tokens=False))

    def example(self, name: str, probe: ChatProbe, messages: Messages, answer: dict[str, Any]) -> TrainingExample:
        prompt = render_prompt(self.encoding, messages, probe.tools, thinking=probe.thinking)
        full = render_prompt(self.encoding, [*messages, {"role": "assistant", **answer}], probe.tools,
                             thinking=probe.thinking)
        if not full.startswith(prompt):
            raise UsageError(f"probe {name}: the rendered answer does not extend the rendered prompt")
        prompt_ids = self.ids(prompt)
        full_ids = self.ids(full)
        if full_ids[: len(prompt_ids)] != prompt_ids:
            raise UsageError(f"probe {name}: tokens of prompt and prompt+answer disagree at the boundary")
        return TrainingExample(name, prompt_ids, full_ids[len(prompt_ids):])


def training_examples(tokenizer: Any, guard_names: Sequence[str] = FIXTURE_GUARDS) -> list[TrainingExample]:
    """Every probe turn of the named guards, rendered to ids, with the answer each probe expects."""
    renderer = _Renderer(tokenizer)
    examples: list[TrainingExample] = []
    for guard in guard_names:
        spec = load_spec(resolve("guards", guard))
        if isinstance(spec, ToolCallSpec):
            for tp in spec.probes:
                call = _parsed_call(tp.expect_call)
                examples.append(renderer.example(f"{guard}/{tp.name}", tp, list(tp.messages),
                                                 {"content": "", "tool_calls": call["tool_calls"]}))
                if tp.round_trip is not None:
                    echo = assistant_echo(call, reasoning=None)
                    follow = [*tp.messages, echo, tool_result_message(echo, tp.round_trip.tool_result)]
                    examples.append(renderer.example(f"{guard}/{tp.name}/round_trip", tp, follow,
                                                     {"content": tp.round_trip.expect_content_contains}))
        elif isinstance(spec, ReasoningSpec):
            for sp in spec.split_probes:
                examples.append(renderer.example(f"{guard}/{sp.name}", sp, list(sp.messages),
                                                 {"reasoning": sp.expect_reasoning_contains,
                                                  "content": sp.expect_content_contains}))
            for cp in spec.carry_probes:
                call = _parsed_call(cp.expect_call)
                examples.append(renderer.example(f"{guard}/{cp.name}", cp, list(cp.messages),
                                                 {"reasoning": cp.expect_reasoning_contains, "content": "",
                                                  "tool_calls": call["tool_calls"]}))
                echo = assistant_echo(call, reasoning=cp.expect_reasoning_contains, carry_field=cp.carry_field)
                follow = [*cp.messages, echo, tool_result_message(echo, cp.round_trip.tool_result)]
                examples.append(renderer.example(f"{guard}/{cp.name}/round_trip", cp, follow,
                                                 {"reasoning": "", "content": cp.round_trip.expect_content_contains}))
        elif isinstance(spec, NeedleSpec):
            if spec.context_tokens is None:
                raise UsageError(f"the trained fixture needs a fixed context_tokens in guard {guard}")
            probe = ChatProbe(name=guard, messages=[{"role": "user", "content": "-"}], thinking=False)

            def count(messages: Messages) -> int:
                return len(renderer.ids(render_prompt(renderer.encoding, messages, [], thinking=False)))

            for needle in spec.needles:
                n_sentences, _ = fit_sentences(spec, needle, spec.context_tokens, count)
                examples.append(renderer.example(f"{guard}/{needle.depth:g}", probe,
                                                 needle_messages(spec, needle, n_sentences), {"content": needle.code}))
        else:
            raise UsageError(f"guard {guard} ({spec.kind}) has no probes the fixture can train on")
    return examples


# ---------------------------------------------------------------- training and the cache


def train_fixture(base_model: Path, *, cache_root: Path | None = None,
                  guard_names: Sequence[str] = FIXTURE_GUARDS, seed: int = 0) -> Path:
    """Train ``base_model`` (the demo model) on the probes of ``guard_names``; return the cached folder."""
    libs = _import_deps()
    torch, tf = libs["torch"], libs["transformers"]
    tokenizer = tf.AutoTokenizer.from_pretrained(base_model)
    examples = training_examples(tokenizer, guard_names)
    digest = _content_hash(base_model, examples, seed)
    root = cache_root if cache_root is not None else default_cache_root()
    out_dir = root / f"trained-{digest[:16]}"
    if _marker_ok(out_dir, digest):
        log.debug("trained fixture cached at %s", out_dir)
        return out_dir

    started_s = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".building", dir=root))
    try:
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
        report = _train(torch, model, examples)
        model = model.to(torch.bfloat16)
        bf16_margin = _min_margin(torch, model, examples)
        if bf16_margin <= 0:
            raise UsageError(f"the trained fixture does not reproduce its probes in bf16 (margin {bf16_margin:.2f})")
        model.save_pretrained(tmp_dir)
        for name in _BASE_FILES:
            if (base_model / name).is_file():
                shutil.copy2(base_model / name, tmp_dir / name)
        marker = {"recipe_version": RECIPE_VERSION, "hash": digest, "guards": list(guard_names),
                  "examples": [{"name": e.name, "prompt_tokens": len(e.prompt_ids),
                                "completion_tokens": len(e.completion_ids)} for e in examples],
                  **report, "bf16_min_margin": round(bf16_margin, 3),
                  "train_s": round(time.monotonic() - started_s, 1)}
        for path in tmp_dir.iterdir():
            path.chmod(0o644)
        tmp_dir.chmod(0o755)
        (tmp_dir / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        swap_in(tmp_dir, out_dir, lambda: _marker_ok(out_dir, digest))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    log.info("trained fixture at %s in %.1f s (%d steps, min margin %.2f)", out_dir,
             time.monotonic() - started_s, report["steps"], bf16_margin)
    return out_dir


def _import_deps() -> dict[str, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise UsageError(f"training the fixture needs torch and transformers ({exc}). "
                         "Fix: pip install 'dsv4-tune[demo]'") from exc
    return {"torch": torch, "transformers": transformers}


def _content_hash(base_model: Path, examples: Sequence[TrainingExample], seed: int) -> str:
    digest = hashlib.sha256(f"recipe={RECIPE_VERSION};seed={seed};lr={_LR};margin={_MIN_MARGIN}".encode())
    for name in (*_BASE_FILES, "model.safetensors"):
        path = base_model / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    for ex in examples:
        digest.update(json.dumps([ex.name, ex.prompt_ids, ex.completion_ids]).encode())
    return digest.hexdigest()


def _batch(torch: Any, examples: Sequence[TrainingExample]) -> tuple[Any, Any, Any]:
    longest = max(len(e.prompt_ids) + len(e.completion_ids) for e in examples)
    ids = torch.zeros((len(examples), longest), dtype=torch.long)
    mask = torch.zeros((len(examples), longest), dtype=torch.long)
    labels = torch.full((len(examples), longest), -100, dtype=torch.long)
    for row, ex in enumerate(examples):
        seq = [*ex.prompt_ids, *ex.completion_ids]
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        labels[row, len(ex.prompt_ids): len(seq)] = torch.tensor(ex.completion_ids)
    return ids, mask, labels


def _completion_logits(torch: Any, model: Any, batch: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    """Logits at the positions that predict a completion token only (the LM head skips the prompt)."""
    ids, mask, labels = batch
    keep = labels[:, 1:] != -100
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1][keep]
    return model.lm_head(hidden).float(), labels[:, 1:][keep]


def _buckets(torch: Any, examples: Sequence[TrainingExample]) -> list[tuple[Any, Any, Any]]:
    """Batches of similar length (long tool prompts apart from short ones), to pad less."""
    ordered = sorted(examples, key=lambda e: len(e.prompt_ids) + len(e.completion_ids))
    groups: list[list[TrainingExample]] = [[]]
    for ex in ordered:
        group = groups[-1]
        if group and len(ex.prompt_ids) + len(ex.completion_ids) > 1.5 * (len(group[0].prompt_ids)
                                                                         + len(group[0].completion_ids)):
            groups.append([ex])
        else:
            group.append(ex)
    return [_batch(torch, g) for g in groups]


def _all_logits(torch: Any, model: Any, batches: Sequence[tuple[Any, Any, Any]]) -> tuple[Any, Any]:
    parts = [_completion_logits(torch, model, b) for b in batches]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _min_margin(torch: Any, model: Any, examples: Sequence[TrainingExample]) -> float:
    """Smallest gap, over every completion token, between the target's logit and the best other one."""
    model.eval()
    with torch.no_grad():
        logits, target = _all_logits(torch, model, _buckets(torch, examples))
    target_logit = logits.gather(1, target[:, None]).squeeze(1)
    others = logits.scatter(1, target[:, None], float("-inf"))
    return float((target_logit - others.max(dim=1).values).min())


def _train(torch: Any, model: Any, examples: Sequence[TrainingExample]) -> dict[str, Any]:
    batches = _buckets(torch, examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=_LR)
    margin = float("-inf")
    loss_value = float("nan")
    step = 0
    for step in range(1, _MAX_STEPS + 1):
        model.train()
        logits, target = _all_logits(torch, model, batches)
        loss = torch.nn.functional.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
        if step % _CHECK_EVERY_STEPS == 0:
            margin = _min_margin(torch, model, examples)
            log.debug("fixture step %d: loss %.4f, min margin %.2f", step, loss_value, margin)
            if margin >= _MIN_MARGIN:
                break
    if margin < _MIN_MARGIN:
        raise UsageError(f"the fixture did not learn its probes in {_MAX_STEPS} steps "
                         f"(min margin {margin:.2f} < {_MIN_MARGIN}). Fix: shorten the probes or raise the budget")
    return {"steps": step, "final_loss": round(loss_value, 5), "min_margin": round(margin, 3)}


def _marker_ok(out_dir: Path, digest: str) -> bool:
    try:
        marker = json.loads((out_dir / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("hash") == digest
