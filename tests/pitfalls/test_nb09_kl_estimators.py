"""nb09_kl_estimators: metrics(), figures and the estimator-gradient explorer."""

from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb09_kl_estimators as kl

SCALES = [0.1, 0.2]
VALUES = {s: {"exact_kl": s / 10, **{k: {"bias": 0.0 if k != "k2" else 0.01 * s, "std": 0.1, "mean": s / 10} for k in kl.ESTIMATORS}}
          for s in SCALES}
GRADIENTS = {s: {n: {"cosine": 1.0 if n != "k1 in loss" else 0.0, "norm_ratio": 1.0 if n != "k1 in loss" else 1e-5}
                 for n in kl.GRADIENT_VARIANTS} for s in SCALES}


def test_metrics_returns_write_metrics_arguments():
    kwargs = kl.metrics(values=VALUES, gradients=GRADIENTS, noise_scales=SCALES)
    check_metrics(kwargs, "09_kl_estimators")
    assert kwargs["reproduced"] and kwargs["fixed"]
    assert kwargs["metrics"]["k1_in_loss_gradient_norm_ratio"] == 1e-5 and kwargs["headline"]["fix"] == 1.0
    assert set(kwargs["metrics"]["bias"]) == set(kl.ESTIMATORS)


def test_figures_draw():
    assert drew(kl.figure_values(VALUES))
    assert drew(kl.figure_gradients(VALUES, GRADIENTS))
    assert "k2 bias +2.0e-03" in kl.values_line(VALUES, 0.2)
    assert "k1 in loss: cosine +0.0000" in kl.gradient_lines(GRADIENTS, 0.2)


def test_kl_estimator_gradient_explorer_follows_the_distance():
    gradients = {0.1: {n: {"cosine": 1.0, "norm_ratio": 1.0} for n in kl.GRADIENT_VARIANTS},
                 0.2: {n: {"cosine": 0.5, "norm_ratio": 1.0} for n in kl.GRADIENT_VARIANTS}}
    explorer = kl.kl_estimator_gradient_explorer(SCALES, {0.1: {"exact_kl": 0.01}, 0.2: {"exact_kl": 0.1}}, gradients)
    assert explorer.last["k2 in loss"]["cosine"] == 0.5
    explorer.controls["scale_index"].value = 0
    assert explorer.last["k2 in loss"]["cosine"] == 1.0
