"""Generate the trained fixture (also the shipped demo model, ``tuner/demo/``) once; check it; show it is robust.

    python scripts/make_fixture.py build             # render the probes, train, write tuner/demo/ + manifest.json
    python scripts/make_fixture.py check             # the committed files match their manifest, and the manifest
                                                     # matches today's probes and answers
    python scripts/make_fixture.py render OUT.json   # only the training set (needs vLLM's DSV4 encoder)
    python scripts/make_fixture.py train BASE EXAMPLES.json OUT [--threads N] [--seed S] [--report R.json]
                                                     # only the training (torch + transformers: any machine)
    python scripts/make_fixture.py sweep NAME:THREADS[:ENV=VALUE,...] ...
                                                     # train under other kernels / thread counts; each run's
                                                     # margins go to docs/evidence/fixture/margins.json
    python scripts/make_fixture.py record NAME REPORT.json   # add a run made elsewhere (another CPU) to it

What the fixture is trained on: every turn of the shipped probes of ``guards/tool_call.yaml``,
``guards/reasoning.yaml`` and ``guards/needle.yaml`` (the needle sized for the CPU profile's 2048-token
context), rendered to token ids by vLLM's DeepSeek V4 encoder exactly as the server renders them, with
the fixture's answers from ``tests/fixtures/answers.py``. The tokenizer and architecture come from the
committed model (the first build took them from ``tuner.demo_model.build_demo_model``; ``--fresh-tokenizer``
does so again); the weights start from a fresh random draw (``--seed``). The recipe is
``tests/fixtures/train_fixture.py``: it stops only when every answer token leads its runner-up by 3
logits in fp32 and in the shipped bf16 copy, so a rerun on another CPU gives a fixture that passes the
probes, not necessarily the same bits.

``manifest.json`` records each file's sha256, the training set's sha256 and token counts, the sha256 of
the guard files and answers it was trained on, and the training report (steps, margins, CPU, torch,
threads). ``tests/unit/test_guard_fixture.py`` checks it against the files and today's probes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures import train_fixture  # noqa: E402

MARGINS = REPO / "docs" / "evidence" / "fixture" / "margins.json"
BASE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja")
"""What the model takes from its base: the architecture and the tokenizer (the weights are drawn afresh)."""
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _base(tmp: Path, fresh_tokenizer: bool) -> tuple[Path, str]:
    """A folder with the base's config and tokenizer; and where they came from."""
    from tuner.demo_model import MANIFEST_NAME, SHIPPED_DIR, build_demo_model

    base = tmp / "base"
    base.mkdir()
    if fresh_tokenizer or not (SHIPPED_DIR / MANIFEST_NAME).is_file():
        source, origin = build_demo_model(tmp / "random-base"), "tuner.demo_model.build_demo_model (fresh tokenizer)"
    else:
        source, origin = SHIPPED_DIR, "the committed demo model (tuner/demo/)"
    for name in BASE_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, base / name)
    return base, origin


def _render(base: Path) -> tuple[list[Any], dict[str, Any]]:
    from transformers import AutoTokenizer

    from tests.fixtures.trained_model import FIXTURE_GUARDS, NEEDLE_CONTEXT_TOKENS, examples_sha256, training_examples
    from tuner.catalog import resolve
    from tuner.demo_model import file_sha256

    examples = training_examples(AutoTokenizer.from_pretrained(base))
    trained_on = {
        "guards": {g: file_sha256(resolve("guards", g)) for g in FIXTURE_GUARDS},
        "answers": file_sha256(REPO / "tests" / "fixtures" / "answers.py"),
        "needle_context_tokens": NEEDLE_CONTEXT_TOKENS,
        "examples_sha256": examples_sha256(examples),
        "examples": [{"name": e.name, "prompt_tokens": len(e.prompt_ids), "completion_tokens": len(e.completion_ids)}
                     for e in examples],
    }
    return examples, trained_on


def cmd_render(args: argparse.Namespace) -> int:
    from tests.fixtures.trained_model import examples_doc

    with tempfile.TemporaryDirectory() as tmp:
        base, _ = _base(Path(tmp), args.fresh_tokenizer)
        examples, trained_on = _render(base)
        if args.base_out:
            shutil.copytree(base, args.base_out, dirs_exist_ok=True)
    args.out.write_text(json.dumps(examples_doc(examples)) + "\n", encoding="utf-8")
    print(f"{len(examples)} examples ({trained_on['examples_sha256'][:12]}) → {args.out}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from tuner.demo_model import MANIFEST_NAME, file_sha256, swap_in, verify_model_dir

    out: Path = args.out.resolve()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        base, origin = _base(tmp, args.fresh_tokenizer)
        examples, trained_on = _render(base)
        built = tmp / "model"
        recipe = train_fixture.Recipe(seed=args.seed, threads=args.threads)
        report = train_fixture.train(base, [train_fixture.Example(e.name, e.prompt_ids, e.completion_ids)
                                            for e in examples], built, recipe)
        for name in BASE_FILES:
            if (base / name).is_file() and name != "config.json" and name != "generation_config.json":
                shutil.copyfile(base / name, built / name)
        files = {name: {"sha256": file_sha256(built / name), "bytes": (built / name).stat().st_size}
                 for name in SHIPPED_FILES if (built / name).is_file()}
        manifest = {
            "what": "dsv4-tune's demo model and the test suite's trained fixture: a 2-layer Llama with the DeepSeek-V4 "
                    "tokens, trained on the shipped guard probes (tool_call, reasoning, needle)",
            "made_by": "python scripts/make_fixture.py build",
            "files": files,
            "base": {"tokenizer_and_config": origin, "weights": f"fresh random draw, seed {args.seed}"},
            "trained_on": trained_on,
            "training": report.to_json(),
        }
        (built / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        for path in built.iterdir():
            path.chmod(0o644)
        built.chmod(0o755)
        verify_model_dir(built)
        swap_in(built, out, lambda: False)
    print(f"trained fixture → {out}: {report.steps} steps, min margin {report.fp32_min_margin} (fp32) / "
          f"{report.bf16_min_margin} (bf16), {report.train_s} s on {report.environment['cpu']}")
    if args.record:
        _record("build", report.to_json())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tuner.demo_model import verify_model_dir

    manifest = verify_model_dir(args.dir)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        for name in BASE_FILES:
            if (args.dir / name).is_file():
                shutil.copyfile(args.dir / name, base / name)
        _, trained_on = _render(base)
    stale = [k for k in ("guards", "answers", "needle_context_tokens", "examples_sha256")
             if trained_on[k] != manifest["trained_on"][k]]
    if stale:
        print(f"the fixture in {args.dir} was trained on other probes or answers ({', '.join(stale)} changed). "
              "Fix: python scripts/make_fixture.py build, then commit tuner/demo/")
        return 1
    print(f"{args.dir}: every file matches manifest.json, and it was trained on today's probes and answers")
    return 0


def _record(name: str, report: dict[str, Any], cpu: str | None = None) -> None:
    doc = json.loads(MARGINS.read_text(encoding="utf-8")) if MARGINS.is_file() else {"runs": []}
    env = {**report.get("environment", {}), **({"cpu": cpu} if cpu else {})}
    row = {"setting": name, "cpu": env.get("cpu"), "torch": env.get("torch"), "transformers": env.get("transformers"),
           "cpu_capability": env.get("cpu_capability"), "threads": env.get("threads"), "env": env.get("env", {}),
           "seed": (env.get("recipe") or {}).get("seed"), "learned": "error" not in report,
           "steps": report.get("steps"), "fp32_min_margin": report.get("fp32_min_margin"),
           "bf16_min_margin": report.get("bf16_min_margin"), "weakest_example": report.get("weakest_example"),
           "train_s": report.get("train_s"), "margins_by_step": report.get("margins"), "error": report.get("error")}
    doc["runs"] = [r for r in doc["runs"] if not (r["setting"] == name and r["cpu"] == row["cpu"])] + [row]
    MARGINS.parent.mkdir(parents=True, exist_ok=True)
    MARGINS.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"recorded {name} ({row['cpu']}) in {MARGINS.relative_to(REPO)}")


def cmd_record(args: argparse.Namespace) -> int:
    report = json.loads(args.report.read_text(encoding="utf-8"))
    if "training" in report:  # a manifest: its training report
        report = report["training"]
    _record(args.name, report, args.cpu)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Train once per setting, each in its own process with its own environment, and record the margins."""
    from tests.fixtures.trained_model import examples_doc

    failed = 0
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base, _ = _base(tmp, False)
        examples, _ = _render(base)
        (tmp / "examples.json").write_text(json.dumps(examples_doc(examples)), encoding="utf-8")
        for setting in args.settings:
            name, _, rest = setting.partition(":")
            threads, _, envs = rest.partition(":")
            env = {**os.environ, **dict(kv.split("=", 1) for kv in envs.split(",") if kv)}
            report = tmp / f"{name}.json"
            argv = [sys.executable, str(REPO / "tests" / "fixtures" / "train_fixture.py"), str(base),
                    str(tmp / "examples.json"), str(tmp / name), "--threads", threads or "2",
                    "--seed", env.get("FIXTURE_SEED", "0"), "--report", str(report)]
            print(f"training under {name} …", flush=True)
            code = subprocess.run(argv, env=env, check=False).returncode
            failed += code != 0
            _record(name, json.loads(report.read_text(encoding="utf-8")))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    import logging

    from tuner.demo_model import SHIPPED_DIR

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="render, train and write the fixture with its manifest")
    build.add_argument("--out", type=Path, default=SHIPPED_DIR)
    build.add_argument("--threads", type=int, default=2)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--fresh-tokenizer", action="store_true", help="build a new base tokenizer first")
    build.add_argument("--record", action="store_true", help="also record the run in docs/evidence/fixture")
    build.set_defaults(func=cmd_build)
    check = sub.add_parser("check", help="the files match the manifest, the manifest matches today's probes")
    check.add_argument("dir", type=Path, nargs="?", default=SHIPPED_DIR)
    check.set_defaults(func=cmd_check)
    render = sub.add_parser("render", help="write the training set (JSON)")
    render.add_argument("out", type=Path)
    render.add_argument("--base-out", type=Path, help="also copy the base config and tokenizer here")
    render.add_argument("--fresh-tokenizer", action="store_true")
    render.set_defaults(func=cmd_render)
    train = sub.add_parser("train", help="train only (tests/fixtures/train_fixture.py)", add_help=False)
    train.set_defaults(func=None)
    sweep = sub.add_parser("sweep", help="train under other kernels or thread counts; record the margins")
    sweep.add_argument("settings", nargs="+", help="NAME:THREADS[:ENV=VALUE,...], e.g. avx2:2:ATEN_CPU_CAPABILITY=avx2")
    sweep.set_defaults(func=cmd_sweep)
    record = sub.add_parser("record", help="record a training report made elsewhere")
    record.add_argument("name")
    record.add_argument("report", type=Path, help="a training report, or a manifest.json (its training report)")
    record.add_argument("--cpu", help="the CPU's name, where the report's lacks its model number")
    record.set_defaults(func=cmd_record)
    args, rest = parser.parse_known_args(argv)
    if args.command == "train":
        return train_fixture.main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
