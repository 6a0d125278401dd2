"""The watch's own cost (``workbench.watch.cost``): a ``@timed`` method's outermost calls inside an open block add
their wall time to the stopwatch, nested calls count once, calls outside a block count nothing; every entry point of
``Watch`` that hooks call is timed, and ``model.generate``'s wrapper times the watch's work on the call but not the
generation."""

import pytest

from workbench.modeling.tiny import tiny_model
from workbench.watch.cost import Stopwatch, timed
from workbench.watch.watcher import Watch


class Clock:
    """A clock that advances by one second at every read."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class Hooked:
    def __init__(self):
        self.stopwatch = Stopwatch(clock=Clock())
        self.calls = 0

    @timed
    def entry_point(self, value, nested: bool = False):
        self.calls += 1
        if nested:
            self.entry_point(value)
        return value


def test_an_outermost_call_in_the_block_is_timed_and_returns_its_value():
    hooked = Hooked()
    hooked.stopwatch.start()  # clock: 1
    assert hooked.entry_point("x") == "x"  # reads 2 and 3
    assert hooked.stopwatch.own_seconds == 1.0 and hooked.calls == 1
    hooked.stopwatch.stop()  # reads 4
    assert hooked.stopwatch.watched_seconds() == 3.0


def test_a_nested_call_counts_once():
    hooked = Hooked()
    hooked.stopwatch.start()
    hooked.entry_point("x", nested=True)  # the outer call reads 2 and 3; the nested one reads nothing
    assert hooked.calls == 2 and hooked.stopwatch.own_seconds == 1.0


def test_calls_outside_a_block_are_not_timed():
    hooked = Hooked()
    hooked.entry_point("before the block")
    hooked.stopwatch.start()
    hooked.stopwatch.stop()
    hooked.entry_point("after the block")
    assert hooked.calls == 2 and hooked.stopwatch.own_seconds == 0.0


def test_an_exception_is_timed_and_leaves_the_next_call_outermost():
    hooked = Hooked()
    hooked.stopwatch.start()
    with pytest.raises(TypeError):
        hooked.entry_point()  # a missing argument: raised inside the timed call
    hooked.entry_point("x")
    assert hooked.stopwatch.own_seconds == 2.0


def test_watched_seconds_adds_the_closed_blocks_and_the_open_one():
    stopwatch = Stopwatch(clock=Clock())
    stopwatch.start()  # 1
    stopwatch.stop()  # 2: one second
    stopwatch.start()  # 3
    assert stopwatch.watched_seconds() == 1.0 + (4.0 - 3.0)


@pytest.mark.parametrize("name", ["_pre", "_post", "_on_generate", "_on_event", "_optimizer_pre", "_optimizer_post",
                                  "_hidden_grad"])
def test_the_watch_entry_points_are_timed(name):
    assert getattr(Watch, name).__wrapped__.__name__ == name


def test_the_generate_wrapper_is_not_timed():
    assert not hasattr(Watch._generate, "__wrapped__")


def test_generate_counts_the_watchs_work_on_the_call_but_not_the_generation():
    model, tokenizer = tiny_model("gpt2", seed=1)
    watcher = Watch(model, tokenizer=tokenizer)
    clock = Clock()
    watcher.stopwatch = Stopwatch(clock=clock)
    watcher.stopwatch.start()

    def generation(*args, **kwargs):  # five clock reads that are the generation's, not the watch's
        for _ in range(5):
            clock()
        return "generated"

    assert watcher._generate(generation, max_new_tokens=2) == "generated"
    assert watcher.observed["generate_calls"] == 1
    assert watcher.stopwatch.own_seconds == 1.0  # the settings' one timed call; 0 untimed, 6 with the generation
