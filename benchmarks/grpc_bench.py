"""The Open Inference Protocol over gRPC against the same over HTTP, and the native route, on one
server: closed loop at each workload (clients x short texts per request), alternating rounds.

    python -m benchmarks.grpc_bench --models-dir .cache/bundles --model sst2-minilm --workloads 1x1,16x1,4x32

Each client is as lean as the other (pre-encoded requests: rawhttp's HTTP/1.1 keep-alive, and
grpc.aio with pre-serialized messages, raw tensors as Triton's client sends them, one channel), so
the client takes little of the cores it shares with the server. Per cell: requests/s, p50/p99, the
server's CPU per request and its mean batch size (from /metrics). Writes
benchmarks/results/<name>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import rawhttp
from benchmarks.bench_common import (
    RESULTS,
    command,
    free_port,
    machine_info,
    machine_line,
    now,
    pyplot,
    save_figure,
    serve_ours,
    write_results,
)
from benchmarks.loadgen import percentiles
from benchmarks.service_bench import METRICS, counters

TEXT = "A wonderful, moving film with a brilliant cast."
TRANSPORTS = ("native", "v2-http", "v2-grpc")
BATCH_METRICS = ("bert_batch_size_sum", "bert_batch_size_count")


def grpc_request(model: str, texts: int = 1) -> bytes:
    from app.api import v2_binary
    from app.api.grpc_v2.messages import CLASSES

    message = CLASSES["ModelInferRequest"](model_name=model)
    message.inputs.add(name="text", datatype="BYTES", shape=[texts])
    message.raw_input_contents.append(v2_binary.to_bytes("BYTES", [TEXT] * texts))
    return message.SerializeToString()


async def closed_loop(send, concurrency: int, seconds: float) -> list[float]:
    """Latencies of `concurrency` workers calling `send()` back to back for `seconds`."""
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < end:
            began = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def measure(
    url: str, grpc_target: str, pid: int, model: str, transport: str, workload: tuple[int, int], args
) -> dict:
    import grpc

    concurrency, texts = workload
    channel = grpc.aio.insecure_channel(grpc_target)
    pool = rawhttp.ConnectionPool(*rawhttp.host_port(url))
    if transport == "v2-grpc":
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        body = grpc_request(model, texts)

        async def send() -> None:
            await infer(body)
    else:
        path, payload = (
            ("/classify", {"inputs": [{"text": TEXT}] * texts, "model": model})
            if transport == "native"
            else (
                f"/v2/models/{model}/infer",
                {"inputs": [{"name": "text", "shape": [texts], "datatype": "BYTES", "data": [TEXT] * texts}]},
            )
        )
        raw = rawhttp.post_json(path, payload)

        async def send() -> None:
            response = await pool.request(raw)
            assert response.status == 200, response.body[:300]

    await closed_loop(send, concurrency, args.warmup)
    before = counters(url, pid)  # the server's CPU seconds, ..., then the sums of service_bench.METRICS
    latencies = await closed_loop(send, concurrency, args.duration)
    delta = [after - was for after, was in zip(counters(url, pid), before, strict=True)]
    batch_sum, batch_count = (delta[3 + METRICS.index(name)] for name in BATCH_METRICS)
    await pool.close()
    await channel.close()
    n, latency_ms = len(latencies), percentiles(latencies)
    return {
        "transport": transport,
        "workload": f"{concurrency}x{texts}",
        "requests": n,
        "req_s": n / args.duration,
        "p50_ms": latency_ms["p50"],
        "p99_ms": latency_ms["p99"],
        "server_cpu_ms": 1000 * delta[0] / n,
        "mean_batch": batch_sum / batch_count if batch_count else None,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# V2 over gRPC against V2 over HTTP and the native route",
        "",
        f"`{report['command']}`, {report['started']}",
        "",
        machine_line(report["machine"]),
        "",
        f"Model `{report['model']}`; a workload is clients x short texts per request (the native route's "
        f"batch form); medians of {report['rounds']} alternating rounds of {report['duration_s']} s.",
        "",
        "| clients x texts | transport | req/s (rounds) | p50 ms | p99 ms | server CPU ms/req | mean batch "
        "| req/s vs V2 over HTTP |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for workload, cells in report["medians"].items():
        http = cells["v2-http"]["req_s"]
        for transport, cell in cells.items():
            rounds = ", ".join(f"{r:.0f}" for r in cell["rounds"])
            lines.append(
                f"| {workload} | {transport} | **{cell['req_s']:.0f}** ({rounds}) | "
                f"{cell['p50_ms']:.2f} | {cell['p99_ms']:.2f} | {cell['server_cpu_ms']:.2f} | "
                f"{cell['mean_batch']:.2f} | {cell['req_s'] / http:.2f}x |"
            )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    levels = list(report["medians"])
    width = 0.8 / len(TRANSPORTS)
    for i, transport in enumerate(TRANSPORTS):
        rates = [report["medians"][c][transport]["req_s"] for c in levels]
        ax.bar([x + i * width for x in range(len(levels))], rates, width, label=transport)
    ax.set_xticks([x + width for x in range(len(levels))], levels)
    ax.set_xlabel("clients x texts per request")
    ax.set_ylabel("requests/s")
    ax.set_title(report["model"])
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=Path(".cache/bundles"))
    parser.add_argument("--model", default="sst2-minilm", help="a classify model under --models-dir")
    parser.add_argument("--workloads", default="1x1,16x1,4x32", help="clients x texts per request, ...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--name", default="grpc_bench")
    args = parser.parse_args(argv)
    started, machine = now(), machine_info()
    levels = [tuple(int(n) for n in w.split("x")) for w in args.workloads.split(",")]
    models = Path(tempfile.mkdtemp(prefix="grpc-bench-"))
    (models / args.model).symlink_to((args.models_dir / args.model).resolve(), target_is_directory=True)
    grpc_port = free_port()
    url, running = serve_ours(models, Path(tempfile.mkdtemp()) / "server.log", GRPC_PORT=str(grpc_port))
    cells: dict[tuple[tuple[int, int], str], list[dict]] = {}
    with running as pid:
        for round_index in range(args.rounds):
            order = TRANSPORTS if round_index % 2 == 0 else TRANSPORTS[::-1]
            for workload in levels:
                for transport in order:
                    cell = asyncio.run(
                        measure(url, f"127.0.0.1:{grpc_port}", pid, args.model, transport, workload, args)
                    )
                    cells.setdefault((workload, transport), []).append(cell)
                    print(
                        f"round {round_index} {transport} {cell['workload']}: {cell['req_s']:.0f} req/s",
                        flush=True,
                    )
    medians = {
        "{}x{}".format(*c): {
            t: {
                **{
                    k: statistics.median(cell[k] for cell in cells[c, t])
                    for k in ("req_s", "p50_ms", "p99_ms", "server_cpu_ms", "mean_batch")
                },
                "rounds": [cell["req_s"] for cell in cells[c, t]],
            }
            for t in TRANSPORTS
        }
        for c in levels
    }
    report = {
        "command": command("grpc_bench", argv),
        "started": started,
        "machine": machine,
        "model": args.model,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "cells": [cell for runs in cells.values() for cell in runs],
        "medians": medians,
    }
    write_results(RESULTS, args.name, report, markdown(report), lambda path: plot(report, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
