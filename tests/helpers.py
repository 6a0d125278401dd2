"""Small helpers several test files share."""

from workbench.core.paths import REPO_ROOT

# The pages a reader meets as reference (not the dated journal): read by the doc-name and docs-shape tests.
REFERENCE_PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md", REPO_ROOT / "benchmarks" / "RESULTS.md",
                   *sorted((REPO_ROOT / "docs").glob("*.md"))]


def reward_gain(history: list[dict], window: int) -> tuple[float, float]:
    """Mean reward of the first and of the last ``window`` steps of a training history."""
    first = sum(h["reward"] for h in history[:window]) / window
    last = sum(h["reward"] for h in history[-window:]) / window
    return first, last


def assert_reward_rises(trainer, window: int, margin: float) -> None:
    """Train and check that the mean reward of the last ``window`` steps beats the first's by ``margin``."""
    first, last = reward_gain(trainer.train(), window)
    assert last > first + margin, (first, last)


WRITE_METRICS_KEYS = {"notebook", "reproduced", "fixed", "metrics", "headline", "not_shown"}


def written_metrics(kwargs: dict, out_dir) -> dict:
    """Check that a pitfall's ``metrics(...)`` returns ``notebook_api.write_metrics``'s keyword arguments
    (no other keys), write them and return ``metrics.json`` as read back."""
    import json

    from workbench.catalogue import notebook_api

    assert set(kwargs) <= WRITE_METRICS_KEYS and {"notebook", "reproduced", "fixed", "metrics"} <= set(kwargs), sorted(kwargs)
    notebook_api.write_metrics(out_dir, **kwargs)
    return json.loads((out_dir / "metrics.json").read_text())
