"""Results of a pretraining run and of fine-tuning it against random weights, for docs/pretraining.md.

    python -m train.pretrain_report pretrain .cache/pretrain/zh --out benchmarks/results/pretrain_zh
    python -m train.pretrain_report finetune .cache/pretrain/zh --test .cache/pretrain/zh/toutiao/test.txt
        --runs ft-pretrained,ft-random,ft-pretrained-2000,ft-random-2000
        --out benchmarks/results/pretrain_finetune

`pretrain` reads a run's TensorBoard scalars (`WORK/run/runs`, every resumed part of the run) and
writes the MLM and NSP curves (.png), the held-out numbers beside the unigram baseline (.md, .json).
`finetune` reads each fine-tuning run's metrics.json (the command, validation at the best step) and
scores its `best/` checkpoint on the test file once (.md, .json).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def relative(text: str) -> str:
    return text.replace(f"{REPO}/", "")


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] over every event file; a resumed run's later value of a step wins."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves: dict[str, dict[int, float]] = {}
    for events in sorted(log_dir.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            curves.setdefault(tag, {}).update({e.step: e.value for e in accumulator.Scalars(tag)})
    return {tag: sorted(points.items()) for tag, points in curves.items()}


def unigram_baseline(work: Path, run: Path, max_seq_len: int, seed: int = 42) -> dict:
    """Always predicting the most frequent token of the held-out masked positions (the masks
    evaluation draws): what MLM accuracy must clearly beat."""
    from processing.tokenizer import TextTokenizer

    from .pretrain_data import IGNORE_INDEX, PretrainDataset

    tokenizer = TextTokenizer.from_dir(run)  # the run's own vocabulary, saved with it
    dataset = PretrainDataset(tokenizer, work / "valid.txt", max_seq_len=max_seq_len, seed=seed)
    dataset.set_epoch(0)
    counts: Counter[int] = Counter()
    for i in range(len(dataset)):
        labels = dataset[i]["labels"]
        counts.update(labels[labels != IGNORE_INDEX].tolist())
    token, count = counts.most_common(1)[0]
    vocab = {i: t for t, i in tokenizer.tokenizer.get_vocab().items()}
    total = sum(counts.values())
    return {
        "token": vocab[token],
        "accuracy": count / total,
        "masked_positions": total,
        "pairs": len(dataset),
    }


def pretrain(work: Path, out: Path, run_name: str = "run") -> dict:
    run = work / run_name
    curves = scalars(run / "runs")
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    report = {
        "corpus": json.loads((work / "corpus.json").read_text(encoding="utf-8")),
        "model": {
            k: config[k]
            for k in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
            )
        },  # fmt: skip
        "steps": metrics["steps"],
        "stopped_by": metrics.get("stopped_by"),
        "wall_time_s_last_part": metrics["wall_time_s"],
        "final": metrics["validation"],
        "unigram_baseline": unigram_baseline(work, run, config.get("max_seq_len", 128)),
        "last_command": relative(metrics["command"]),
        "curves": curves,
    }
    plot(report, out.with_suffix(".png"))
    mlm, nsp = (dict(curves[f"eval/{m}"]) for m in ("mlm_accuracy", "nsp_accuracy"))
    base = report["unigram_baseline"]
    lines = [
        "# Pretraining from scratch: Chinese (CMRC 2018 contexts + Toutiao training headlines)",
        "",
        f"BERT {report['model']['num_hidden_layers']} layers, hidden {report['model']['hidden_size']}, "
        f"vocabulary {report['model']['vocab_size']:,}; MLM (15%) + NSP. Corpus: "
        + ", ".join(f"{k} {v:,}" for k, v in report["corpus"].items())
        + ".",
        "",
        "| held-out documents | value |",
        "|---|---:|",
        f"| MLM accuracy (masked positions) | **{report['final']['mlm_accuracy']:.4f}** |",
        f"| unigram baseline (always `{base['token']}`) | {base['accuracy']:.4f} |",
        f"| NSP accuracy (chance 0.5) | **{report['final']['nsp_accuracy']:.4f}** |",
        f"| held-out pairs / masked positions | {base['pairs']:,} / {base['masked_positions']:,} |",
        "",
        f"Steps: {report['steps']:,} (ended by: {report['stopped_by']}).",
        "",
        f"![curves]({out.with_suffix('.png').name})",
        "",
        "| step | held-out MLM accuracy | held-out NSP accuracy |",
        "|---:|---:|---:|",
        *(f"| {step} | {mlm[step]:.4f} | {nsp[step]:.4f} |" for step in sorted(mlm)),
        "",
        f"Last command of the run (from metrics.json): `{report['last_command']}`. A run stopped and "
        "resumed (`--resume`, a new `--max-steps` to fit its schedule to its time) records only its last "
        "part's command; the curves join every part.",
    ]
    write(out, report, lines)
    return report


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, baseline = report["curves"], report["unigram_baseline"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [("loss (MLM + NSP)", "loss", None),
              ("MLM accuracy (masked positions)", "mlm_accuracy", (baseline["accuracy"], "unigram baseline")),
              ("NSP accuracy", "nsp_accuracy", (0.5, "chance"))]  # fmt: skip
    for ax, (title, tag, line) in zip(axes.flat, panels, strict=False):
        for source, style, label in (
            ("train", "-", "train (one batch)"),
            ("eval", "o-", "held-out documents"),
        ):
            if f"{source}/{tag}" in curves:
                steps, values = zip(*curves[f"{source}/{tag}"], strict=True)
                ax.plot(steps, values, style, lw=0.8 if source == "train" else 2, label=label)
        if line is not None:
            ax.axhline(line[0], color="grey", ls="--", label=f"{line[1]} {line[0]:.3f}")
        ax.set(title=title, xlabel="step")
        ax.legend(fontsize=8)
    axes[1, 1].plot(*zip(*curves["train/lr"], strict=True))
    axes[1, 1].set(title="learning rate", xlabel="step")
    fig.suptitle(f"Pretraining from scratch, Chinese: {report['steps']} steps on 2 shared CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def finetune(work: Path, out: Path, runs: list[str], test: Path) -> dict:
    import torch

    from .evaluate import evaluate_checkpoint, select_examples

    torch.set_num_threads(1)
    _, examples = select_examples(task="classify", data=test)
    results = {}
    for name in runs:
        metrics = json.loads((work / name / "metrics.json").read_text(encoding="utf-8"))
        scores = evaluate_checkpoint(work / name / "best", "classify", examples)
        results[name] = {
            "command": relative(metrics["command"]),
            "steps": metrics["steps"],
            "wall_time_s": metrics["wall_time_s"],
            "valid_best": {**metrics["best"]["metrics"], "step": metrics["best"]["step"]},
            "test": scores,
        }
        print(name, results[name]["valid_best"], scores, flush=True)
    lines = [
        "# Fine-tuning the encoder pretrained here vs the same model from random weights: Toutiao",
        "",
        "Same config, vocabulary, data and recipe; only the initial encoder weights differ. Validation "
        "(3,478 headlines) picks the checkpoint; the test part (3,478) is scored once, at the end.",
        "",
        "| run | steps | valid accuracy (best; its step) | test accuracy | wall time (last part) |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {n} | {r['steps']:,} | {r['valid_best']['accuracy']:.4f} ({r['valid_best']['step']}) | "
            f"{r['test']['accuracy']:.4f} | {r['wall_time_s'] / 60:.1f} min |"
            for n, r in results.items()
        ),  # fmt: skip
        "",
        "Commands (the last part of each run, from its metrics.json), from the repository root:",
        "",
        *(f"- {n}: `{r['command']}`" for n, r in results.items()),
    ]
    report = {"test_file": relative(str(test)), "runs": results}
    write(out, report, lines)
    return report


def write(out: Path, report: dict, lines: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(relative(json.dumps(report, indent=2, ensure_ascii=False)) + "\n",
                                        encoding="utf-8")  # fmt: skip
    out.with_suffix(".md").write_text(relative("\n".join(lines)) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m train.pretrain_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("what", choices=["pretrain", "finetune"])
    p.add_argument("work", type=Path, help="the corpus folder of python -m train.corpus (runs inside it)")
    p.add_argument("--out", type=Path, required=True, help="results path without suffix")
    p.add_argument("--run", default="run", help="pretrain: the run folder inside WORK")
    p.add_argument("--runs", default="", help="finetune: comma list of run folders inside WORK")
    p.add_argument("--test", type=Path, help="finetune: the test file, scored once per run")
    args = p.parse_args(argv)
    if args.what == "pretrain":
        pretrain(args.work, args.out, args.run)
    else:
        finetune(args.work, args.out, args.runs.split(","), args.test)


if __name__ == "__main__":
    main()
