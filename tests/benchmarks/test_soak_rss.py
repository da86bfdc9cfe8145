"""The soak's RSS verdict ignores transient spikes but catches steady growth."""

from __future__ import annotations

from benchmarks.soak import rss_growth


def samples(values: list[float]) -> list[dict[str, float]]:
    return [{"t_s": 10.0 * i, "rss_mb": v} for i, v in enumerate(values)]


def test_a_spike_on_the_last_sample_is_not_growth():
    flat = [200.0] * 50 + [450.0]
    result = rss_growth(samples(flat), warmup_s=0)
    assert result["growth_pct"] < 1 and result["single_sample_growth_pct"] > 100


def test_steady_growth_is_caught():
    growing = [200.0 + i for i in range(60)]
    result = rss_growth(samples(growing), warmup_s=0)
    assert result["growth_pct"] > 20 and result["slope_mb_per_hour"] > 0
