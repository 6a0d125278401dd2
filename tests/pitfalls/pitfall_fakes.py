"""Small stand-ins for what the pitfall notebooks measure, so that ``metrics()``, figures and explorers
are tested without training: ``fake_runs`` has the shape of ``comparison.train_variants``'s result."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

WRITE_METRICS_KEYS = {"notebook", "reproduced", "fixed", "metrics", "headline"}  # and, optionally, "not_shown"


def fake_runs(labels, keys, *, seeds: int = 2, steps: int = 4, heldout=("heldout_accuracy",)) -> dict:
    """``{label: [history per seed]}``: every step records each of ``keys`` (a value that differs by label,
    seed and step) and its step number; the last step carries each held-out key and ``{key}_start``. The gap between
    two labels varies with the seed (the ``0.002 * i * seed`` term), so an effect has a spread over seeds to be
    tested against: with a constant gap its s.e. is 0 ("not testable", ``statistics``)."""
    runs = {}
    for i, label in enumerate(labels):
        histories = []
        for seed in range(seeds):
            history = [{"step": t, **{k: 0.1 * i + 0.01 * seed + 0.002 * i * seed + 0.05 * t for k in keys}} for t in range(steps)]
            history[-1].update({k: 0.5 + 0.1 * i + 0.01 * seed + 0.002 * i * seed for k in heldout})
            history[-1].update({f"{k}_start": 0.4 + 0.01 * seed for k in heldout})
            histories.append(history)
        runs[label] = histories
    return runs


def check_metrics(kwargs: dict, notebook: str) -> None:
    """``kwargs`` are ``notebook_api.write_metrics``'s keyword arguments for ``notebook``."""
    assert WRITE_METRICS_KEYS <= set(kwargs) <= WRITE_METRICS_KEYS | {"not_shown"}
    assert kwargs["notebook"] == notebook
    assert isinstance(kwargs["reproduced"], bool) and isinstance(kwargs["fixed"], bool)
    assert set(kwargs["headline"]) == {"what", "unit", "bug", "fix"}


def drew(fig) -> bool:
    """Every axis of ``fig`` that is not a colour bar holds lines, patches, images or collections. The figure is left
    open: ``tests/pitfalls/conftest.py`` measures it at notebook width after the test, then it is closed."""
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    return bool(axes) and all(ax.lines or ax.patches or ax.images or ax.collections or ax.texts for ax in axes)


TEST_LAYOUT = "test layout"  # the label of a figure a test laid out itself: not a notebook's, not measured


def axes(n: int = 1):
    fig, ax = plt.subplots(1, n)
    fig.set_label(TEST_LAYOUT)
    return fig, ax


def check_explorer_fix(make_explorer, checkpoint: str, control: str) -> None:
    """``make_explorer(model, tokenizer, prompts)`` on the ``checkpoint`` shows |ρ − 1| > 1e-2 at its defaults
    and < 1e-4 once the ``control`` checkbox (the fix) is ticked."""
    from workbench.experiments.checkpoints import load  # transformers: only the explorer tests load a checkpoint

    model, tokenizer = load(checkpoint)
    explorer = make_explorer(model, tokenizer, ["1+2=", "12+34=", "5*5=", "99-3="])
    assert explorer.last["max_ratio_deviation"] > 1e-2
    explorer.controls[control].value = True
    assert explorer.last["max_ratio_deviation"] < 1e-4
