"""Pretraining from scratch that learns: vocabulary -> MLM + NSP -> fine-tune, English and Chinese.

    python -m benchmarks.pretrain --lang en                    # corpus, vocabulary, pretraining, curves
    python -m benchmarks.pretrain --lang zh
    python -m benchmarks.pretrain --lang en --stage finetune   # pretrained vs random initialisation
    python -m benchmarks.pretrain --lang zh --stage finetune
    python -m benchmarks.pretrain --stage report               # results from the runs already there

Pretraining (`python -m train --task pretrain`) runs a 4-layer, hidden-256 BERT
(`benchmarks/configs/bert-4l-256.json`) from random weights on the corpus of `train.corpus`,
with a vocabulary built from it by `train.vocab`, under a wall-clock budget (`--max-minutes`).
MLM and NSP accuracy are measured on held-out documents. The fine-tunes train the same
classifier from the pretrained encoder and from a random one (same config, data, steps, seed):
English on a subset of SST-2 (whole held-out sentences, the slice MiniLM's default is scored on),
Chinese on the Toutiao headlines (the fixed 80/10/10 split of `train.corpus`; test accuracy of
the checkpoint that was best on the validation part).

Work files (corpora, vocabularies, checkpoints, logs) go to `.cache/pretrain/<lang>/`; results
to `benchmarks/results/pretrain_<lang>.{json,md,png}` and `pretrain_finetune.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from .bench_common import RESULTS, ROOT, machine_info, machine_line, now, pyplot, write_results

WORK = Path(".cache/pretrain")
CONFIG = Path("benchmarks/configs/bert-4l-256.json")
LANGUAGES = ("en", "zh")
BOOK_TOUTIAO = 0.8851  # the book's test accuracy with bert-base-chinese
MINILM_SST2 = "finetune.json"  # MiniLM's SST-2 result on the same held-out sentences
SMALL = 2000  # training examples of the scarce-label fine-tunes (`--stage finetune --limit-train 2000`)
PRETRAIN = {
    # Steps sized by a one-minute smoke run each (1.1-2.5 s/step in English, 0.3 s in Chinese, whose
    # headlines are short) to end within the budget on the shared machine.
    "en": {"valid_documents": 250, "vocab_size": 8000, "max_steps": 1200, "eval_every": 200},
    "zh": {"valid_documents": 1000, "vocab_size": 8000, "max_steps": 4500, "eval_every": 500},
}


def pretrain_commands(lang: str, data: Path, minutes: float) -> list[list[str]]:
    work, recipe = WORK / lang, PRETRAIN[lang]
    train = [
        *("-m", "train", "--task", "pretrain", "--base", f"{work}/vocab", "--scratch-config", str(CONFIG)),
        *("--train", f"{work}/train.txt", "--validation", f"{work}/valid.txt", "--max-seq-len", "128"),
        *("--batch-size", "32", "--lr", "5e-4", "--warmup-steps", "100"),
        *("--max-steps", str(recipe["max_steps"]), "--max-minutes", f"{minutes:g}"),
        *("--eval-every", str(recipe["eval_every"])),
        *("--log-every", "10", "--no-progress", "--num-threads", "2", "--precision", "bf16", "--seed", "42"),
        *("--out", f"{work}/run"),
    ]
    return [
        ["-m", "train.corpus", lang, "--data", str(data), "--out", str(work)]
        + ["--valid-documents", str(recipe["valid_documents"])],
        ["-m", "train.vocab", "--corpus", f"{work}/train.txt", "--out", f"{work}/vocab"]
        + ["--vocab-size", str(recipe["vocab_size"])],
        train,
    ]


def finetune_data(lang: str, data: Path, limit: int | None = None) -> list[str]:
    """The fine-tuning data; `limit` trains on a random subset of that many examples (the same
    held-out examples are scored)."""
    if lang == "en":
        # Whole held-out sentences with every phrase of them out of training (as for MiniLM's default).
        return [
            *("--task", "classify", "--train", f"{data}/sst2/train.tsv", "--validation-fraction", "0.12"),
            *("--holdout", "whole-texts", "--limit-train", str(limit or 16000), "--max-seq-len", "64"),
        ]
    work = WORK / "zh"
    return [
        *("--task", "classify", "--train", f"{work}/toutiao/train.txt"),
        *("--validation", f"{work}/toutiao/valid.txt", "--max-seq-len", "64"),
        *(("--limit-train", str(limit)) if limit else ()),
    ]


def run_name(init: str, limit: int | None) -> str:
    return f"finetune-{init}" + (f"-{limit}" if limit else "")


def finetune_command(lang: str, init: str, data: Path, limit: int | None = None) -> list[str]:
    work = WORK / lang
    base = (
        ["--base", f"{work}/run"]
        if init == "pretrained"
        else ["--base", f"{work}/vocab", "--scratch-config", str(CONFIG)]
    )
    return [
        *("-m", "train", *finetune_data(lang, data, limit), *base),
        *("--batch-size", "32", "--epochs", "3", "--lr", "1e-4", "--warmup-ratio", "0.1", "--seed", "42"),
        *("--precision", "bf16", "--num-threads", "2", "--no-progress", "--log-every", "50"),
        *("--out", f"{work}/{run_name(init, limit)}"),
    ]


def test_command(lang: str, init: str, limit: int | None = None) -> list[str] | None:
    """Toutiao's test part, scored on the checkpoint that was best on its validation part."""
    if lang != "zh":
        return None
    work = WORK / lang
    return [
        *("-m", "train.evaluate", f"{work}/{run_name(init, limit)}/best", "--task", "classify"),
        *("--data", f"{work}/toutiao/test.txt", "--no-progress"),
    ]


def run(args: list[str], log: Path, stdout: Path | None = None) -> float:
    """Runs `python ARGS` from the repository root, its output in `log` (stdout alone in `stdout`
    when given); returns seconds. OMP_WAIT_POLICY=PASSIVE: idle threads sleep on a shared machine."""
    print("$ python " + shlex.join(args), flush=True)
    started = time.perf_counter()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with open(log, "w") as err, open(stdout or log, "a") as out:
        subprocess.run([sys.executable, *args], check=True, cwd=ROOT, env=env, stdout=out, stderr=err)
    return time.perf_counter() - started


def command_line(args: list[str]) -> str:
    return "python " + shlex.join(args)


# ----------------------------------------------------------------------------- pretraining report


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def unigram_baseline(lang: str) -> dict:
    """Accuracy of always predicting the most frequent token among the held-out masked positions
    (the masks evaluation uses): what MLM accuracy must clearly beat."""
    from processing.tokenizer import TextTokenizer
    from train.pretrain_data import IGNORE_INDEX, PretrainDataset

    work = WORK / lang
    tokenizer = TextTokenizer.from_dir(ROOT / work / "vocab")
    dataset = PretrainDataset(tokenizer, ROOT / work / "valid.txt", max_seq_len=128, seed=42)
    dataset.set_epoch(0)
    counts: Counter[int] = Counter()
    nsp = Counter()
    for i in range(len(dataset)):
        item = dataset[i]
        counts.update(item["labels"][item["labels"] != IGNORE_INDEX].tolist())
        nsp[int(item["next_sentence_label"])] += 1
    token, count = counts.most_common(1)[0]
    vocab = {i: t for t, i in tokenizer.tokenizer.get_vocab().items()}
    return {
        "token": vocab[token],
        "accuracy": count / sum(counts.values()),
        "masked_positions": sum(counts.values()),
        "pairs": len(dataset),
        "nsp_majority": max(nsp.values()) / len(dataset),
    }


def finished_at(path: Path) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")


def pretrain_report(lang: str, data: Path) -> dict:
    work = ROOT / WORK / lang
    metrics = json.loads((work / "run" / "metrics.json").read_text(encoding="utf-8"))
    curves = scalars(work / "run" / "runs")
    corpus = json.loads((work / "corpus.json").read_text(encoding="utf-8"))
    recorded = json.loads((work / "commands.json").read_text()) if (work / "commands.json").exists() else {}
    # The corpus and vocabulary commands, and the pretraining command exactly as the run recorded it.
    commands = [command_line(c) for c in pretrain_commands(lang, data, 0)[:2]] + [metrics["command"]]
    return {
        "language": lang,
        # A run started by hand (not by this script) is dated by when it finished.
        "date": recorded.get("date") or finished_at(work / "run" / "metrics.json"),
        "machine": recorded.get("machine") or {**machine_info(2), "described": "when the report was written"},
        "config": json.loads((ROOT / CONFIG).read_text(encoding="utf-8")),
        "corpus": corpus,
        "vocab_size": len((work / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()),
        "commands": commands,
        "steps": metrics["steps"],
        "max_steps": metrics["total_steps"],
        "stopped_by": metrics.get("stopped_by"),
        "wall_time_s": metrics["wall_time_s"],
        "pairs_seen": metrics["steps"] * 32,
        "train_pairs": metrics["train_features"],
        "final": metrics["validation"],
        "unigram_baseline": unigram_baseline(lang),
        "curves": curves,
    }


def plot_pretraining(report: dict, path: Path) -> None:
    plt = pyplot()
    curves, baseline = report["curves"], report["unigram_baseline"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [
        ("loss (MLM + NSP)", "loss", None),
        ("MLM accuracy (masked positions)", "mlm_accuracy", (baseline["accuracy"], "unigram baseline")),
        ("NSP accuracy", "nsp_accuracy", (0.5, "chance")),
    ]
    for ax, (title, tag, line) in zip(axes.flat, panels, strict=False):
        if f"train/{tag}" in curves:
            steps, values = zip(*curves[f"train/{tag}"], strict=True)
            ax.plot(steps, values, lw=0.8, alpha=0.6, label="train (one batch)")
        if f"eval/{tag}" in curves:
            steps, values = zip(*curves[f"eval/{tag}"], strict=True)
            ax.plot(steps, values, "o-", lw=2, label="held-out documents")
        if line is not None:
            ax.axhline(line[0], color="grey", ls="--", label=f"{line[1]} {line[0]:.3f}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    steps, values = zip(*curves["train/lr"], strict=True)
    axes[1, 1].plot(steps, values)
    axes[1, 1].set_title("learning rate")
    axes[1, 1].set_xlabel("step")
    name = {"en": "English (RACE passages)", "zh": "Chinese (CMRC 2018 + Toutiao train headlines)"}
    fig.suptitle(
        f"Pretraining from scratch, {name[report['language']]}: {report['steps']} steps, "
        f"{report['wall_time_s'] / 60:.1f} min on 2 shared CPU cores"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pretrain_markdown(report: dict) -> str:
    final, base, c = report["final"], report["unigram_baseline"], report["config"]
    corpus = ", ".join(f"{k} {v:,}" for k, v in report["corpus"].items())
    lines = [
        f"# Pretraining from scratch: {report['language']}",
        "",
        f"{report['date']}; {machine_line(report['machine'])}"
        + (
            f" (machine described {report['machine']['described']})."
            if "described" in report["machine"]
            else "."
        ),
        "",
        f"BERT {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
        f"intermediate {c['intermediate_size']}, vocabulary {report['vocab_size']:,} (built from the "
        "corpus), "
        f"sequences of 128 tokens, batch 32, MLM (15%, 80/10/10, masks redrawn every epoch) + NSP.",
        "",
        f"Corpus: {corpus}.",
        "",
        "| held-out documents | value |",
        "|---|---|",
        f"| MLM accuracy (masked positions) | **{final['mlm_accuracy']:.4f}** |",
        f"| unigram baseline (always `{base['token']}`, the most frequent masked token) "
        f"| {base['accuracy']:.4f} |",
        f"| NSP accuracy | **{final['nsp_accuracy']:.4f}** |",
        f"| NSP majority class | {base['nsp_majority']:.4f} |",
        f"| loss (MLM + NSP) | {final['loss']:.4f} |",
        f"| held-out pairs / masked positions | {base['pairs']:,} / {base['masked_positions']:,} |",
        "",
        f"Steps: {report['steps']:,} of {report['max_steps']:,} (ended by: {report['stopped_by']}), "
        f"{report['pairs_seen']:,} sequence pairs seen of {report['train_pairs']:,} built from the corpus; "
        f"wall time {report['wall_time_s'] / 60:.1f} min (the machine's two cores are shared with "
        "other jobs, so steps per minute vary).",
        "",
        f"![curves](pretrain_{report['language']}.png)",
        "",
        "Commands, from the repository root:",
        "",
        *[f"- `{command}`" for command in report["commands"]],
        "",
        "The vocabulary is not bit-for-bit reproducible: the `tokenizers` WordPiece trainer breaks "
        "count ties in hash-map order, so a rerun of `train.vocab` on the same corpus gives a few "
        "different pieces and ids (huggingface/tokenizers issue 1794), and a rerun of this benchmark "
        "lands near, not exactly on, these numbers.",
    ]
    evals = report["curves"].get("eval/mlm_accuracy", [])
    if evals:
        nsp = dict(report["curves"].get("eval/nsp_accuracy", []))
        lines += ["", "| step | held-out MLM accuracy | held-out NSP accuracy |", "|---|---|---|"]
        lines += [f"| {step} | {value:.4f} | {nsp.get(step, float('nan')):.4f} |" for step, value in evals]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- fine-tune report


def finetune_results(lang: str, limit: int | None = None) -> dict:
    work = ROOT / WORK / lang
    out = {}
    for init in ("pretrained", "random"):
        run_dir = work / run_name(init, limit)
        if not (run_dir / "metrics.json").exists():
            continue
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        row = {
            "validation_accuracy": metrics["validation"]["accuracy"],
            "best_validation_accuracy": metrics["best"]["value"],
            "steps": metrics["steps"],
            "wall_time_s": metrics["wall_time_s"],
            "command": metrics["command"],
        }
        test_file = run_dir / "test.json"
        if test_file.exists():
            row["test_accuracy"] = json.loads(test_file.read_text())["accuracy"]
            row["test_command"] = command_line(test_command(lang, init, limit) or [])
        out[init] = row
    return out


def minilm_sst2() -> float | None:
    path = RESULTS / MINILM_SST2
    if not path.exists():
        return None
    for row in json.loads(path.read_text(encoding="utf-8")).get("tasks", {}).values():
        if isinstance(row, dict) and row.get("bundle") == "sst2-minilm":
            return row.get("full_finetune", {}).get("accuracy")
    return None


def finetune_markdown(results: dict) -> str:
    en, zh = results.get("en", {}), results.get("zh", {})

    def cell(rows: dict, init: str, key: str) -> str:
        value = rows.get(init, {}).get(key)
        return f"{value:.4f}" if value is not None else "—"

    minilm = results.get("minilm_sst2")
    lines = [
        "# Fine-tuning a model pretrained here vs the same model from random weights",
        "",
        "Same config (4 layers, hidden 256, the corpus's own vocabulary), data, steps, learning rate "
        "and seed; only the initial encoder weights differ.",
        "",
        "| task | metric | pretrained here | random init | reference |",
        "|---|---|---|---|---|",
        f"| SST-2 subset (16k training phrases; 826 whole held-out sentences) | accuracy, held-out | "
        f"{cell(en, 'pretrained', 'validation_accuracy')} | {cell(en, 'random', 'validation_accuracy')} | "
        + (f"MiniLM-L6 (all training phrases) {minilm:.4f} |" if minilm else "— |"),
        f"| Toutiao, 15 classes (80/10/10 split, seed 42) | accuracy, test | "
        f"{cell(zh, 'pretrained', 'test_accuracy')} | {cell(zh, 'random', 'test_accuracy')} | "
        f"book, bert-base-chinese {BOOK_TOUTIAO} (its own split) |",
        "| Toutiao | accuracy, validation (picks the checkpoint) | "
        f"{cell(zh, 'pretrained', 'best_validation_accuracy')} | "
        f"{cell(zh, 'random', 'best_validation_accuracy')} | |",
        "",
        "English is scored at the end of training on sentences held out whole (no checkpoint is picked "
        "on them); Chinese on the test part with the checkpoint best on the validation part. MiniLM does "
        "not apply to Toutiao: its vocabulary holds 244 CJK characters.",
    ]
    small = results.get("small", {})
    s_en, s_zh = small.get("en", {}), small.get("zh", {})
    if s_en or s_zh:
        lines += [
            "",
            f"With {SMALL:,} training examples only (the same held-out data; added after the table "
            "above was measured, to see whether the pretrained encoder helps where labels are scarce):",
            "",
            "| task | metric | pretrained here | random init |",
            "|---|---|---|---|",
            f"| SST-2, {SMALL:,} training phrases | accuracy, held-out | "
            f"{cell(s_en, 'pretrained', 'validation_accuracy')} | "
            f"{cell(s_en, 'random', 'validation_accuracy')} |",
            f"| Toutiao, {SMALL:,} training headlines | accuracy, test | "
            f"{cell(s_zh, 'pretrained', 'test_accuracy')} | {cell(s_zh, 'random', 'test_accuracy')} |",
        ]
    lines += ["", "Commands, from the repository root:", ""]
    for lang, rows in (("en", en), ("zh", zh), ("en", s_en), ("zh", s_zh)):
        for init, row in rows.items():
            lines.append(
                f"- {lang}, {init} ({row['steps']} steps, {row['wall_time_s'] / 60:.1f} min): "
                f"`{row['command']}`"
            )
            if "test_command" in row:
                lines.append(f"  then `{row['test_command']}`")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pretrain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lang", choices=LANGUAGES, action="append", help="repeatable; default both")
    parser.add_argument("--stage", choices=["pretrain", "finetune", "report"], default="pretrain")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the datasets folder")
    parser.add_argument("--minutes", type=float, default=36.0, help="pretraining wall-clock budget")
    parser.add_argument(
        "--limit-train", type=int, help=f"finetune: train on this many examples (default: all; en {16000})"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    languages = args.lang or list(LANGUAGES)
    if args.stage != "report" and not (ROOT / args.data).exists():
        print(f"{args.data} is absent: nothing to pretrain on; skipping")
        return
    for lang in languages:
        work = ROOT / WORK / lang
        work.mkdir(parents=True, exist_ok=True)
        if args.stage == "pretrain":
            commands = pretrain_commands(lang, args.data, args.minutes)
            record = {
                "date": now(),
                "machine": machine_info(2),
                "commands": [command_line(c) for c in commands],
            }
            for step, command in zip(("corpus", "vocab", "pretrain"), commands, strict=True):
                run(command, work / f"{step}.log")
            (work / "commands.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        elif args.stage == "finetune":
            for init in ("pretrained", "random"):
                name = run_name(init, args.limit_train)
                run(finetune_command(lang, init, args.data, args.limit_train), work / f"{name}.log")
                if (command := test_command(lang, init, args.limit_train)) is not None:
                    run(command, work / f"{name}-test.log", stdout=work / name / "test.json")
        if (work / "run" / "metrics.json").exists():
            report = pretrain_report(lang, args.data)
            write_results(
                args.out,
                f"pretrain_{lang}",
                report,
                pretrain_markdown(report),
                lambda p, r=report: plot_pretraining(r, p),
            )
    results: dict = {lang: finetune_results(lang) for lang in LANGUAGES}
    results["small"] = {lang: finetune_results(lang, SMALL) for lang in LANGUAGES}
    if any(results[lang] for lang in LANGUAGES):
        results["minilm_sst2"] = minilm_sst2()
        write_results(args.out, "pretrain_finetune", results, finetune_markdown(results), None)


if __name__ == "__main__":
    main()
