"""Small helpers several test files share."""


def reward_gain(history: list[dict], window: int) -> tuple[float, float]:
    """Mean reward of the first and of the last ``window`` steps of a training history."""
    first = sum(h["reward"] for h in history[:window]) / window
    last = sum(h["reward"] for h in history[-window:]) / window
    return first, last


def assert_reward_rises(trainer, window: int, margin: float) -> None:
    """Train and check that the mean reward of the last ``window`` steps beats the first's by ``margin``."""
    first, last = reward_gain(trainer.train(), window)
    assert last > first + margin, (first, last)
