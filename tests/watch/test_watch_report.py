"""``Report.merge``: findings concatenated and counters summed; the watched wall time summed over processes (ranks)
and the longest block's within one process (its watches overlap); the not-observable notes of every report, a watch's
own note only when every report carries it."""

from workbench.watch.report import NOT_OBSERVABLE, P29_UNOBSERVED, Finding, Report

P29_NOTE = {"pitfall": "P29", "check": None, "why": P29_UNOBSERVED}


def block(watched: float, own: float, note: bool = False) -> Report:
    notes = [dict(entry) for entry in NOT_OBSERVABLE] + ([dict(P29_NOTE)] if note else [])
    return Report(findings=[Finding("S1", "error", "left padding", {"forwards": 1}, "trainer.py:1")], observed={"forwards": 2},
                  not_observable=notes, cost={"mode": "light", "watch_seconds": own, "watched_seconds": watched, "device": "cpu"})


def test_ranks_sum_their_watched_seconds():
    merged = Report.merge([block(10.0, 1.0), block(8.0, 0.5)])
    assert merged.cost == {"mode": "light", "watch_seconds": 1.5, "watched_seconds": 18.0, "device": "cpu"}
    assert len(merged.findings) == 2 and merged.observed == {"forwards": 4}


def test_watches_of_one_process_take_the_longest_block():
    merged = Report.merge([block(10.0, 1.0), block(8.0, 0.5)], one_process=True)
    assert merged.cost["watched_seconds"] == 10.0 and merged.cost["watch_seconds"] == 1.5  # the hooks' times still add
    assert merged.cost_line().endswith("(15.0 %)")


def test_not_observable_notes_are_merged():
    pitfalls = lambda report: [entry["pitfall"] for entry in report.not_observable]  # noqa: E731
    assert pitfalls(Report.merge([block(1.0, 0.1, note=True), block(1.0, 0.1, note=True)])) == ["S5", "P10", "P29"]
    assert pitfalls(Report.merge([block(1.0, 0.1, note=True), block(1.0, 0.1)])) == ["S5", "P10"]  # the other saw an update
    parts = [Report.from_dict(block(1.0, 0.1, note=True).to_dict()) for _ in range(2)]
    assert Report.merge(parts).not_observable[-1] == P29_NOTE
    assert pitfalls(Report.merge([])) == ["S5", "P10"]
