"""Live version swaps under load: a model's version is replaced three times (and a corrupted version
is offered once) while 32 clients keep sending requests to it (benchmarks/README.md).

    .venv/bin/python -m benchmarks.model_swap                  # sst2-minilm, 32 clients, 60 s
    .venv/bin/python -m benchmarks.model_swap --quick          # the tests' tiny bundle, 8 clients, 8 s

Passes (exit 0) when no request failed, every answer came from a version the server verified, the
corrupted one was refused and never answered, and each good version answered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from app.engine.runtime import choose_variant
from benchmarks import bench_common as common
from benchmarks import reliability as rel
from benchmarks.rawhttp import ConnectionPool, HTTPError, encode_request, post_json

MODEL = "sst2"
TEXTS = [
    "a wonderful , moving film with a brilliant cast .", "dull , lifeless and far too long .",
    "the plot is thin but the acting carries it .", "one of the worst movies i have seen this year .",
    "an intelligent , funny and touching story .", "i wanted to like it , but it never comes alive .",
]  # fmt: skip


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


async def client(pool: ConnectionPool, n: int, run: rel.Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        sample = {"t": round(t0 - run.started, 4), "ms": None, "status": 0, "version": None, "label": None}
        try:
            response = await pool.request(post_json("/classify", {"text": TEXTS[n % 6], "model": MODEL}), 30)
        except (HTTPError, TimeoutError, OSError) as e:
            run.samples.append({**sample, "error": repr(e)})
            continue
        finally:
            n += 1
        ok = response.status == 200
        run.samples.append({
            **sample,
            "ms": round((time.perf_counter() - t0) * 1000, 2),
            "status": response.status,
            "version": response.headers.get("x-model-version"),
            "label": response.json().get("label") if ok else None,
            "error": None if ok else response.body[:200].decode(errors="replace"),
        })  # fmt: skip


async def drive(args: argparse.Namespace, port: int, key: str, models_dir: Path, pid: int) -> dict[str, Any]:
    pool, control = ConnectionPool("127.0.0.1", port), ConnectionPool("127.0.0.1", port)

    async def listed() -> dict[str, Any]:
        models = (await control.request(encode_request("GET", "/models"))).json()["models"]
        return next(m for m in models if m["name"] == MODEL)

    served, run = [(await listed())["version"]], rel.Run(MODEL)
    auth = {"Authorization": f"Bearer {key}"}

    async def swaps(run: rel.Run) -> None:
        for step, (version, corrupted) in enumerate([(2, False), (3, False), (4, False), (5, True)], 1):
            await asyncio.sleep(max(0.0, run.started + args.duration * step / 5 - time.perf_counter()))
            write_version(models_dir, args.bundle, version, corrupted)
            offered, rss_before = run.t(), common.tree_rss_mb(pid)
            response = await control.request(encode_request("POST", f"/admin/models/{MODEL}/load", b"", auth))
            body = response.json()
            e = run.event(f"version {version}{' (corrupted)' if corrupted else ''}: {response.status}",
                          version=str(version), corrupted=corrupted, offered_at_s=offered,
                          admin_status=response.status, admin_seconds=round(run.t() - offered, 3),
                          rss_mb_before=rss_before, rss_mb_after=common.tree_rss_mb(pid))  # fmt: skip
            if response.status == 200:
                served.append(body["model"]["version"])
                e["memory_mb"] = body["model"]["memory_mb"]
            else:  # write_results makes the message's paths repo-relative
                e["error"], e["message"] = body.get("error"), body.get("message")
        await asyncio.sleep(max(0.0, run.started + args.duration - time.perf_counter()))

    def load(stop: asyncio.Event) -> Any:
        return asyncio.gather(*(client(pool, i, run, stop) for i in range(args.clients)))

    await rel.under_load(run, load, swaps)
    run.rows = [(s["t"], s["ms"] and s["ms"] / 1e3, s["status"] == 200, s["version"]) for s in run.samples]
    return {"run": run, "served_versions": served, "final_model": await listed()}


def judge(samples: list[dict[str, Any]], served: list[str], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict: no failed request, and every answer from a verified version (header and labels)."""
    ok, failed = [s for s in samples if s["status"] == 200], [s for s in samples if s["status"] != 200]
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
    return {"requests": len(samples), "ok": len(ok), "failed": len(failed), "failed_examples": failed[:5],
            "answers_by_version": dict(sorted(by_version.items())), "label_mismatches": len(mismatched),
            "unverified_answers": len(unverified), "checks": checks,
            "passed": all(checks.values())}  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    verdict, latency = report["verdict"], report["latency_ms"]
    near = latency["within_2s_of_an_offer"]
    refused = [e for e in report["events"] if e["corrupted"]]
    body = [
        f"- Model `{MODEL}` from `{report['bundle']}` ({report['variant']} on CPU), {report['clients']} "
        f"closed-loop clients on `/classify` for {report['duration_s']} s, server and clients on the same "
        f"cores.\n- Requests: **{verdict['requests']}**, answered 200: {verdict['ok']}, "
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
        *(f"| {e['version']}{' (one byte flipped)' if e['corrupted'] else ''} | {e['offered_at_s']} "
          f"| {e['admin_status']} {e.get('error') and '`' + e['error'] + '`' or 'swapped in'} "
          f"| {e['admin_seconds']} | {e.get('memory_mb', '—')} | {e['rss_mb_before']} → {e['rss_mb_after']} |"
          for e in report["events"]),
        *[f"\nThe corrupted version's refusal: “{e.get('message')}”" for e in refused][:1],
    ]  # fmt: skip
    return rel.markdown("Version swaps under load", report, body)


def plot(report: dict[str, Any], path: Path) -> None:
    fig, ax = common.pyplot().subplots(figsize=(10, 3.6))
    title = f"{report['clients']} clients on /classify: latency per half second"
    rel.plot_timeline(ax, report["timeline"], report["events"], title)
    common.save_figure(fig, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", type=Path, help="classify bundle (default .cache/bundles/sst2-minilm)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--quick", action="store_true", help="the tests' tiny bundle, 8 clients, 8 s")
    p.add_argument("--work", type=Path, default=common.WORK / "model_swap", help="where MODELS_DIR is built")
    p.add_argument("--out", type=Path, default=common.RESULTS)
    p.add_argument("--name", default=None, help="results file stem (default model_swap[_quick])")
    args = p.parse_args(argv)
    if args.quick:
        args.bundle = args.bundle or common.build_tiny_models() / "classify"
        args.clients, args.duration = min(args.clients, 8), min(args.duration, 8.0)
    args.bundle = common.require_bundle(args.bundle or common.default_bundle("classify"), "classify")
    args.name = args.name or ("model_swap_quick" if args.quick else "model_swap")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models_dir = args.work / "models"
    shutil.rmtree(models_dir, ignore_errors=True)
    models_dir.mkdir(parents=True)
    write_version(models_dir, args.bundle, 1)
    key = secrets.token_hex(16)
    url, running = common.serve_ours(models_dir, args.work / "server.log", 120, ADMIN_API_KEY=key)
    machine = common.machine_info()
    print(f"model_swap: {args.clients} clients for {args.duration:.0f} s on {args.bundle}")
    with running as pid:
        result = asyncio.run(drive(args, int(url.rsplit(":", 1)[1]), key, models_dir, pid))
    run, final = result["run"], result["final_model"]
    verdict = judge(run.samples, result["served_versions"], run.events)
    report = {
        "command": common.command("model_swap", argv),
        "date": common.now(),
        "machine": machine,
        "bundle": str(args.bundle),  # repo-relative in the results (write_results)
        "variant": final.get("variant"),
        "clients": args.clients,
        "duration_s": args.duration,
        "served_versions": result["served_versions"],
        "events": run.events,
        "final_model": {k: final.get(k) for k in ("version", "status", "memory_mb", "versions")},
        "latency_ms": {
            "all": run.latency_within([(0, float("inf"))]),
            "within_2s_of_an_offer": run.latency_within(
                [(e["offered_at_s"], e["offered_at_s"] + 2) for e in run.events]
            ),
        },
        "verdict": verdict,
        "checks": verdict["checks"],
        "timeline": run.timeline(0.5),
    }
    print(f"{verdict['requests']} requests, {verdict['failed']} failed; {verdict['answers_by_version']}")
    return rel.finish(args.out, args.name, report, markdown(report), lambda path: plot(report, path))


if __name__ == "__main__":
    sys.exit(main())
