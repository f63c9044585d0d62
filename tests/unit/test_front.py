"""The accuracy/latency plot of compress: its Pareto front, and a plot drawn from a committed run's report."""

from __future__ import annotations

from pathlib import Path

from pipeline.reporting.compression import front_points, pareto_front, plot_front
from tests.unit import typed_reports as c


def test_the_pareto_front_keeps_what_nothing_faster_beats() -> None:
    points = [("full", 20.0, 0.83), ("int8", 14.0, 0.83), ("pruned", 16.0, 0.829), ("distilled", 10.0, 0.81)]
    points += [("slow_and_bad", 30.0, 0.70), ("tie", 14.0, 0.80)]
    # int8 is as accurate as full and faster: full is off the front; pruned is slower and worse than int8
    assert [name for name, _, _ in pareto_front(points)] == ["distilled", "int8"]
    assert pareto_front([]) == []


def test_the_front_plot_draws_every_model(tmp_path: Path) -> None:
    import matplotlib.image

    report = c.report(
        c.full(0.83, speed=c.speed(fp32=c.timing(20.0))),
        int8=c.variant(0.82, speed=c.speed(fp32=c.timing(12.0))),
        pruned=c.variant(0.5, speed=c.speed(fp32=c.timing(9.0)), servable=False),
    )
    assert front_points(report) == [("full (fp32)", 20.0, 0.83), ("int8", 12.0, 0.82), ("pruned", 9.0, 0.5)]
    plot_front(report, tmp_path / "front.png")
    pixels = matplotlib.image.imread(tmp_path / "front.png")
    height, width = pixels.shape[:2]
    assert pixels[..., :3].std() > 0.05
    # the legend beside the axes, not over a point: the image is wide and its right quarter is not blank
    assert width > 2 * height and (pixels[:, int(0.8 * width) :, :3] < 0.5).any()
