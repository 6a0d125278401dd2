"""Small helpers several test files share."""


def reward_gain(history: list[dict], window: int) -> tuple[float, float]:
    """Mean reward of the first and of the last ``window`` steps of a training history."""
    first = sum(h["reward"] for h in history[:window]) / window
    last = sum(h["reward"] for h in history[-window:]) / window
    return first, last
