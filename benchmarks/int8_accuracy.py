"""What INT8 costs on task data: each default bundle's variants scored on its validation split.

    python benchmarks/int8_accuracy.py [--bundles .cache/bundles] [--variants fused,int8]

The validation data, features and metrics are exactly those of `benchmarks/finetune.py`
(model.train's data preparation and model.features' metrics); only the forward pass is
ONNX Runtime on the bundle's variant instead of PyTorch. Results go to
benchmarks/results/int8_accuracy.{json,md}; `python -m export.defaults` copies each bundle's
line into its manifest (quantization.task_data).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from finetune import recipes  # noqa: E402

from export.bundle import load_bundle_manifest  # noqa: E402
from export.verify import make_session  # noqa: E402
from model.bert import HeadOutput  # noqa: E402
from model.train import build_parser, make_task, prepare_data  # noqa: E402
from model.trainer import TrainConfig, Trainer  # noqa: E402
from processing.tokenizer import TextTokenizer  # noqa: E402


class OrtHead(torch.nn.Module):
    """Looks like one of our heads to the evaluation loop; runs an ONNX Runtime session."""

    def __init__(self, onnx_path: Path, config, threads: int, disabled_optimizers: list[str]):
        super().__init__()
        self.session = make_session(onnx_path, threads, disabled_optimizers)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.config = config
        self.placeholder = torch.nn.Parameter(torch.zeros(1))  # the trainer builds an optimizer

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **_labels) -> HeadOutput:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        feeds = {name: given[name].numpy().astype(np.int64) for name in self.inputs}
        result = dict(zip(self.outputs, self.session.run(None, feeds), strict=True))
        return HeadOutput(
            **{name: torch.from_numpy(np.asarray(v, dtype=np.float32)) for name, v in result.items()}
        )


def evaluate_variant(bundle: Path, variant: str, recipe: dict, threads: int) -> dict:
    from model.config import BertConfig

    manifest = load_bundle_manifest(bundle)
    args = build_parser().parse_args([*recipe["data"], "--base", str(bundle), "--out", "unused"])
    # the data files' own label codes, where the bundle shows readable names
    codes = {name: code for code, name in recipe.get("label_names", {}).items()}
    labels = [codes.get(label, label) for label in manifest.labels] if manifest.labels else None
    tokenizer = TextTokenizer.from_dir(bundle)
    task = make_task(args, tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        # prepare_data reads labels from a config.json; give it the bundle's.
        config = BertConfig(task=manifest.task)
        if labels:
            config.id2label = dict(enumerate(labels))
        config.save_pretrained(tmp)
        train, valid = prepare_data(args, task, Path(tmp), labels)
        info = manifest.variants[variant]
        head = OrtHead(bundle / info.file, config, threads, info.disabled_optimizers)
        trainer = Trainer(head, task, train, valid, TrainConfig(eval_batch_size=32, progress=False), tmp)
        started = time.perf_counter()
        metrics = trainer.evaluate()
    metrics.pop("loss", None)
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bundles", type=Path, default=REPO / ".cache" / "bundles")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--variants", default="fused,int8")
    parser.add_argument("--tasks", default="sst2,conll03,codah,squad")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "int8_accuracy.json")
    args = parser.parse_args()
    if not args.data.exists():
        print(f"{args.data} is absent: no task data to measure on; skipping")
        return
    all_recipes = recipes(args.data)
    results = {}
    for name in args.tasks.split(","):
        recipe = all_recipes[name]
        bundle = args.bundles / recipe["bundle"]
        scores = {v: evaluate_variant(bundle, v, recipe, args.threads) for v in args.variants.split(",")}
        metric = recipe["metric"]
        results[recipe["bundle"]] = {
            "metric": metric,
            "validation": " ".join(recipe["data"]),
            "variants": scores,
            "int8_cost": scores["fused"][metric] - scores["int8"][metric]
            if {"fused", "int8"} <= set(scores)
            else None,
        }
        print(recipe["bundle"], json.dumps(results[recipe["bundle"]]["variants"]), flush=True)
    print(write_results(results, args.out))


def write_results(results: dict, path: Path) -> str:
    """Merge into earlier results (a `--tasks` subset keeps the other bundles' lines); returns the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {**(json.loads(path.read_text()) if path.exists() else {}), **results}
    path.write_text(json.dumps(merged, indent=2) + "\n")
    lines = ["| bundle | metric | fused (fp32) | int8 | int8 cost |", "|---|---|---|---|---|"]
    for bundle, r in merged.items():
        m, v = r["metric"], r["variants"]
        lines.append(f"| {bundle} | {m} | {v['fused'][m]:.4f} | {v['int8'][m]:.4f} | {r['int8_cost']:+.4f} |")
    table = "\n".join(lines)
    path.with_suffix(".md").write_text(table + "\n")
    return table


if __name__ == "__main__":
    main()
