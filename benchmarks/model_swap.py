"""Live version swaps under load: a model's version is replaced three times (and a corrupted version
is offered once) while 32 clients keep sending requests to it.

    .venv/bin/python -m benchmarks.model_swap                  # sst2-minilm, 32 clients, 60 s
    .venv/bin/python -m benchmarks.model_swap --quick          # the tests' tiny bundle, 8 clients, 8 s

Builds MODELS_DIR with `sst2/1` from --bundle, starts `uvicorn app.main:app` with an
ADMIN_API_KEY, and runs --clients closed-loop clients against `/classify` with `"model": "sst2"`.
At a fifth, two fifths and three fifths of the run, version n+1 is written to `sst2/<n+1>` and
loaded through `POST /admin/models/sst2/load`; at four fifths a version whose int8 graph has one
byte flipped is offered the same way and must be refused while the previous one keeps serving.

Every version carries its own labels (`negative@v2`, ...; the weights are the same files), so an
answer shows which version computed it as well as which one its `X-Model-Version` header names.
Passes (exit 0) when no request failed, every answer came from a version the server verified
and put in service (the header is one of them and the labels agree with it), the corrupted
version was refused and never answered, and each good version answered after its swap.
Writes benchmarks/results/model_swap.{json,md,png} (`--quick`: model_swap_quick.*).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from app.backend.runtime import choose_variant
from benchmarks.bench_common import (
    RESULTS,
    WORK,
    build_tiny_models,
    default_bundle,
    machine_info,
    machine_line,
    now,
    pyplot,
    require_bundle,
    serve_ours,
    tree_rss_mb,
    write_results,
)
from benchmarks.rawhttp import ConnectionPool, HTTPError, encode_request, post_json

ROOT = Path(__file__).resolve().parents[1]

MODEL = "sst2"
TEXTS = [
    "a wonderful , moving film with a brilliant cast .",
    "dull , lifeless and far too long .",
    "the plot is thin but the acting carries it .",
    "one of the worst movies i have seen this year .",
    "an intelligent , funny and touching story .",
    "i wanted to like it , but it never comes alive .",
]


def write_version(models_dir: Path, source: Path, version: int, corrupted: bool = False) -> Path:
    """`sst2/<version>`: the source bundle's files, labels suffixed `@v<version>`; hard links where
    the bytes are unchanged, so a version costs no disk. A corrupted version gets a real copy of
    the graph the service loads on a CPU, with one byte flipped."""
    from export.bundle import MANIFEST_NAME, load_bundle_manifest, write_manifest

    staging = models_dir / MODEL / f".{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and path.name != MANIFEST_NAME:
            try:
                os.link(path, staging / path.name)
            except OSError:  # another filesystem
                shutil.copyfile(path, staging / path.name)
    manifest = load_bundle_manifest(source)
    manifest.labels = [f"{label}@v{version}" for label in manifest.labels or []]
    if corrupted:
        graph = manifest.variant_path(staging, choose_variant("cpu", manifest.variants))  # what is served
        data = bytearray(graph.read_bytes())
        data[len(data) // 2] ^= 0xFF
        graph.unlink()  # not the shared hard link
        graph.write_bytes(bytes(data))
    write_manifest(staging, manifest)
    target = models_dir / MODEL / str(version)
    staging.rename(target)  # the repository sees the version whole or not at all
    return target


async def client(
    pool: ConnectionPool, index: int, started: float, stop: asyncio.Event, samples: list[dict[str, Any]]
) -> None:
    n = index
    while not stop.is_set():
        body = {"text": TEXTS[n % len(TEXTS)], "model": MODEL}
        n += 1
        t0 = time.perf_counter()
        sample = {"t": round(t0 - started, 4), "ms": None, "status": 0, "version": None, "label": None}
        try:
            response = await pool.request(post_json("/classify", body), timeout_s=30)
        except (HTTPError, TimeoutError, OSError) as e:
            samples.append({**sample, "error": repr(e)})
            continue
        ok = response.status == 200
        samples.append({
            **sample,
            "ms": round((time.perf_counter() - t0) * 1000, 2),
            "status": response.status,
            "version": response.headers.get("x-model-version"),
            "label": response.json().get("label") if ok else None,
            "error": None if ok else response.body[:200].decode(errors="replace"),
        })  # fmt: skip


async def admin(pool: ConnectionPool, key: str, path: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.perf_counter()
    response = await pool.request(encode_request("POST", path, b"", {"Authorization": f"Bearer {key}"}), 300)
    return response.status, response.json(), time.perf_counter() - t0


async def drive(
    args: argparse.Namespace, url_port: int, key: str, models_dir: Path, pid: int
) -> dict[str, Any]:
    pool = ConnectionPool("127.0.0.1", url_port)
    control = ConnectionPool("127.0.0.1", url_port)
    listing = (await control.request(encode_request("GET", "/models"))).json()
    initial = next(m for m in listing["models"] if m["name"] == MODEL)
    served = [initial["version"]]
    samples: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    stop = asyncio.Event()
    started = time.perf_counter()
    clients = [asyncio.create_task(client(pool, i, started, stop, samples)) for i in range(args.clients)]
    plan = [(2, False), (3, False), (4, False), (5, True)]
    for step, (version, corrupted) in enumerate(plan, 1):
        await asyncio.sleep(max(0.0, started + args.duration * step / 5 - time.perf_counter()))
        write_version(models_dir, args.bundle, version, corrupted)
        t_offer = time.perf_counter() - started
        rss_before = tree_rss_mb(pid)
        status, body, seconds = await admin(control, key, f"/admin/models/{MODEL}/load")
        event = {
            "version": str(version),
            "corrupted": corrupted,
            "offered_at_s": round(t_offer, 3),
            "admin_status": status,
            "admin_seconds": round(seconds, 3),
            "swapped_at_s": round(time.perf_counter() - started, 3) if status == 200 else None,
            "rss_mb_before": rss_before,
            "rss_mb_after": tree_rss_mb(pid),
        }
        if status == 200:
            served.append(body["model"]["version"])
            event["memory_mb"] = body["model"]["memory_mb"]
        else:
            event["error"] = body.get("error")
            event["message"] = body.get("message")  # write_results makes its paths repo-relative
        events.append(event)
        label = f"{version} (corrupted)" if corrupted else str(version)
        print(f"  t={t_offer:5.1f}s version {label}: {status} in {seconds:.2f}s", flush=True)
    await asyncio.sleep(max(0.0, started + args.duration - time.perf_counter()))
    stop.set()
    await asyncio.gather(*clients)
    listing = (await control.request(encode_request("GET", "/models"))).json()
    final = next(m for m in listing["models"] if m["name"] == MODEL)
    return {"samples": samples, "events": events, "served_versions": served, "final_model": final}


def judge(samples: list[dict[str, Any]], served: list[str], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict: no failed request, and every answer from a verified version (header and labels)."""
    ok = [s for s in samples if s["status"] == 200]
    failed = [s for s in samples if s["status"] != 200]
    unverified = [s for s in ok if s["version"] not in served]
    mismatched = [s for s in ok if not (s["label"] or "").endswith(f"@v{s['version']}")]
    corrupted = {e["version"] for e in events if e["corrupted"]}
    by_version = Counter(s["version"] for s in ok)
    checks = {
        "zero_failed_requests": not failed,
        "every_answer_from_a_verified_version": not unverified,
        "labels_match_the_version_header": not mismatched,
        "corrupted_version_refused": all(e["admin_status"] == 422 for e in events if e["corrupted"]),
        "corrupted_version_never_answered": not any(by_version.get(v) for v in corrupted),
        "three_swaps_each_served": len(served) == 4 and all(by_version.get(v, 0) > 0 for v in served),
    }
    return {
        "requests": len(samples),
        "ok": len(ok),
        "failed": len(failed),
        "failed_examples": failed[:5],
        "answers_by_version": dict(sorted(by_version.items())),
        "unverified_answers": len(unverified),
        "label_mismatches": len(mismatched),
        "checks": checks,
        "passed": all(checks.values()),
    }


def latency_summary(
    samples: list[dict[str, Any]], around: list[float], window_s: float = 2.0
) -> dict[str, Any]:
    """p50/p99 of all answers, and of those sent within `window_s` after a swap was offered."""

    def summary(values: list[float]) -> dict[str, float | None]:
        values = sorted(values)
        pct = [
            round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else None
            for q in (0.5, 0.99)
        ]
        return {"p50": pct[0], "p99": pct[1], "max": max(values, default=None)}

    timed = [s for s in samples if s["ms"] is not None]
    near = [s["ms"] for s in timed if any(0 <= s["t"] - t < window_s for t in around)]
    return {"all": summary([s["ms"] for s in timed]), f"within_{window_s:g}s_of_an_offer": summary(near)}


def markdown(report: dict[str, Any]) -> str:
    verdict, latency = report["verdict"], report["latency_ms"]
    near = latency["within_2s_of_an_offer"]
    lines = [
        f"# Version swaps under load: {'PASS' if verdict['passed'] else 'FAIL'}",
        "",
        f"Generated {report['generated']} by `{report['command']}`.",
        "",
        f"Machine: {machine_line(report['machine'])}.",
        "",
        f"- Model `{MODEL}` from `{report['bundle']}` ({report['variant']} on CPU), {report['clients']} "
        f"closed-loop clients on `/classify` for {report['duration_s']} s, server and clients on the "
        "same cores.",
        f"- Requests: **{verdict['requests']}**, answered 200: {verdict['ok']}, "
        f"**failed: {verdict['failed']}**.",
        f"- Versions verified and put in service: {', '.join(report['served_versions'])}; answers by "
        f"version (`X-Model-Version`): {verdict['answers_by_version']}.",
        f"- Answers whose version is not one the server verified: {verdict['unverified_answers']}; answers "
        f"whose labels disagree with their `X-Model-Version`: {verdict['label_mismatches']}.",
        f"- Latency (ms), all answers: p50 {latency['all']['p50']}, p99 {latency['all']['p99']}, max "
        f"{latency['all']['max']}; sent within 2 s after a version was offered: p50 {near['p50']}, "
        f"p99 {near['p99']}, max {near['max']}.",
        "",
        "| version | offered at (s) | admin answer | load + verify (s) | memory of the version (MB) "
        "| server RSS before → after (MB) |",
        "|---|---:|---|---:|---:|---|",
    ]
    for e in report["events"]:
        answer = f"{e['admin_status']}" + (
            f" `{e.get('error')}`" if e["admin_status"] != 200 else " swapped in"
        )
        name = e["version"] + (" (one byte flipped)" if e["corrupted"] else "")
        lines.append(
            f"| {name} | {e['offered_at_s']} | {answer} | {e['admin_seconds']} | {e.get('memory_mb', '—')} | "
            f"{e['rss_mb_before']} → {e['rss_mb_after']} |"
        )
    refused = [e for e in report["events"] if e["corrupted"]]
    if refused:
        lines += ["", f"The corrupted version's refusal: “{refused[0].get('message')}”"]
    lines += [
        "",
        "Checks: " + ", ".join(f"{k} {'✓' if v else '✗'}" for k, v in verdict["checks"].items()) + ".",
    ]
    return "\n".join(lines)


def timeline(samples: list[dict[str, Any]], duration_s: float, width_s: float = 0.5) -> list[dict[str, Any]]:
    """Answers per second by version, and latency percentiles, in bins of `width_s`."""
    bins: list[dict[str, Any]] = []
    for i in range(int(duration_s / width_s) + 1):
        inside = [s for s in samples if i * width_s <= s["t"] < (i + 1) * width_s]
        ms = sorted(s["ms"] for s in inside if s["ms"] is not None)
        counts = Counter(s["version"] for s in inside if s["status"] == 200)
        bins.append(
            {
                "t_s": round(i * width_s, 2),
                "answers_per_s": {v: round(n / width_s, 1) for v, n in sorted(counts.items())},
                "failed": sum(s["status"] != 200 for s in inside),
                "p50_ms": ms[len(ms) // 2] if ms else None,
                "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else None,
            }
        )
    return bins


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    bins = report["timeline"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ts = [b["t_s"] for b in bins]
    base = [0.0] * len(bins)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:gray"]
    for n, version in enumerate(report["served_versions"]):
        rates = [b["answers_per_s"].get(version, 0.0) for b in bins]
        color = colors[n % len(colors)]
        top.bar(ts, rates, width=0.5, bottom=base, align="edge", label=f"version {version}", color=color)
        base = [a + b for a, b in zip(base, rates, strict=True)]
    for e in report["events"]:
        for ax in (top, bottom):
            ax.axvline(
                e["offered_at_s"], color="red" if e["corrupted"] else "black", linestyle="--", linewidth=0.8
            )
    top.set_ylabel("answers/s by X-Model-Version")
    top.legend(loc="lower right", fontsize=8)
    top.set_title(
        f"{report['clients']} clients on /classify; dashed: version offered (red: corrupted, refused)"
    )
    for key in ("p50_ms", "p99_ms"):
        bottom.plot(ts, [b[key] for b in bins], label=key.replace("_ms", ""))
    bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("time (s)")
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bundle", type=Path, default=None, help="classify bundle (default .cache/bundles/sst2-minilm)"
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--quick", action="store_true", help="the tests' tiny bundle, 8 clients, 8 s")
    parser.add_argument("--work", type=Path, default=WORK / "model_swap", help="where MODELS_DIR is built")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default=None, help="results file stem (default model_swap[_quick])")
    args = parser.parse_args(argv)
    if args.quick:
        args.bundle = args.bundle or build_tiny_models() / "classify"
        args.clients, args.duration = min(args.clients, 8), min(args.duration, 8.0)
    args.bundle = require_bundle(args.bundle or default_bundle("classify"), "classify")
    args.name = args.name or ("model_swap_quick" if args.quick else "model_swap")
    return args


def relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models_dir = args.work / "models"
    shutil.rmtree(models_dir, ignore_errors=True)
    models_dir.mkdir(parents=True)
    write_version(models_dir, args.bundle, 1)
    key = secrets.token_hex(16)
    url, running = serve_ours(models_dir, args.work / "server.log", 120, ADMIN_API_KEY=key)
    machine = machine_info()
    print(
        f"model_swap: {args.clients} clients for {args.duration:.0f} s on {relative(args.bundle)}", flush=True
    )
    with running as pid:
        run = asyncio.run(drive(args, int(url.rsplit(":", 1)[1]), key, models_dir, pid))
    verdict = judge(run["samples"], run["served_versions"], run["events"])
    command_line = " ".join(
        ["python -m benchmarks.model_swap", *(argv if argv is not None else sys.argv[1:])]
    )
    report = {
        "generated": now(),
        "command": command_line.strip(),
        "machine": machine,
        "bundle": relative(args.bundle),
        "variant": run["final_model"].get("variant"),
        "clients": args.clients,
        "duration_s": args.duration,
        "served_versions": run["served_versions"],
        "events": run["events"],
        "final_model": {k: run["final_model"].get(k) for k in ("version", "status", "memory_mb", "versions")},
        "latency_ms": latency_summary(run["samples"], [e["offered_at_s"] for e in run["events"]]),
        "verdict": verdict,
        "timeline": timeline(run["samples"], args.duration),
    }
    write_results(args.out, args.name, report, markdown(report), lambda path: plot(report, path))
    outcome = "PASS" if verdict["passed"] else "FAIL"
    print(f"{outcome}: {verdict['requests']} requests, {verdict['failed']} failed", flush=True)
    print(f"answers by version {verdict['answers_by_version']}", flush=True)
    print(json.dumps(verdict["checks"]), flush=True)
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
