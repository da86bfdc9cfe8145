"""Which batching and session settings serve most: a preset of service_bench.py, our server alone
with one setting changed at a time (benchmarks/README.md; the CPU defaults come from its table).

    .venv/bin/python -m benchmarks.batching_sweep                 # /classify, c=1 and 32, every setting
    .venv/bin/python -m benchmarks.batching_sweep --endpoint qa --settings "pf1.1=MAX_PADDING_FACTOR=1.1"

Other service_bench options pass through (--rounds, --classify-bundle, --out, ...).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import service_bench

DEFAULT_SETTINGS = {
    "padding-1.05": "MAX_PADDING_FACTOR=1.05",
    "padding-1.2": "MAX_PADDING_FACTOR=1.2",
    "padding-1.5": "MAX_PADDING_FACTOR=1.5",
    "padding-2": "MAX_PADDING_FACTOR=2",
    "padding-off": "MAX_PADDING_FACTOR=0",
    "1-instance-all-threads": "MODEL_INSTANCES=1",
    "2-instances-2-threads": "MODEL_INSTANCES=2 INTRA_OP_THREADS=2",
    "wait-2ms": "MAX_WAIT_MS=2",
    "tokens-8192": "MAX_BATCH_TOKENS=8192",
    "no-inline": "INLINE_BATCH_TOKENS=0",
    "shrink-every-run": "ORT_SHRINK_ABOVE_TOKENS=0",
}


def service_bench_args(argv: list[str] | None = None) -> list[str]:
    """This sweep as service_bench's command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default="classify", choices=service_bench.ENDPOINTS)
    p.add_argument("--settings", help="'name=ENV=V ENV2=V;name2=ENV=V' (default: the built-in sweep)")
    p.add_argument("--concurrency", default="1,32", help="comma list")
    p.add_argument("--duration", default="10", help="seconds per level")
    p.add_argument("--warmup", default="3", help="seconds per server")
    p.add_argument("--model-seconds", default="2", help="seconds per bare-model reference")
    args, rest = p.parse_known_args(argv)
    pairs = (
        DEFAULT_SETTINGS
        if args.settings is None
        else dict(part.split("=", 1) for part in args.settings.split(";") if part.strip())
    )
    ablations = [f"{name.strip()}:{','.join(env.split())}" for name, env in pairs.items() if env.strip()]
    stem = "batching_sweep" + ("" if args.endpoint == "classify" else f"_{args.endpoint}")
    options = {"--endpoints": args.endpoint, "--servers": "ours", "--name": stem}
    options |= {f"--{k.replace('_', '-')}": getattr(args, k) for k in ("concurrency", "duration", "warmup")}
    options["--model-seconds"] = args.model_seconds
    return [
        *(x for item in options.items() for x in item),
        *(x for a in ablations for x in ("--ablation", a)),
        *rest,
    ]


def main(argv: list[str] | None = None) -> int:
    return service_bench.main(service_bench_args(argv))


if __name__ == "__main__":
    sys.exit(main())
