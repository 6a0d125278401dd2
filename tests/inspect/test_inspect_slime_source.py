"""slime's own code writes the debug rollout data the inspector reads: ``Sample`` and ``save_debug_rollout_data``
imported from a snapshot of slime's repository (THUDM/slime, the files they need taken with ``git show``), run here
(they need only torch, numpy and httpx). Skipped with the reason when no snapshot is at ``SLIME_MIRROR``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.inspect import inspect

pytestmark = pytest.mark.slow

SLIME_MIRROR = Path(os.environ.get("SLIME_MIRROR", "/work/.mirror/THUDM+slime/repo"))
FILES = ("slime/__init__.py", "slime/utils/__init__.py", "slime/utils/misc.py", "slime/utils/types.py",
         "slime/utils/http_utils.py", "slime/observability/__init__.py", "slime/observability/rollout_data_utils.py")


@pytest.fixture(scope="module")
def slime(tmp_path_factory):
    if not SLIME_MIRROR.exists():
        pytest.skip(f"no slime snapshot at {SLIME_MIRROR} (set SLIME_MIRROR to a clone of THUDM/slime)")
    root = tmp_path_factory.mktemp("slime-source")
    for name in FILES:
        shown = subprocess.run(["git", "--git-dir", str(SLIME_MIRROR), "show", f"HEAD:{name}"], capture_output=True)
        if shown.returncode:
            pytest.skip(f"slime snapshot without {name}: {shown.stderr.decode()[:200]}")
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(shown.stdout)
    sys.path.insert(0, str(root))
    try:
        from slime.observability.rollout_data_utils import save_debug_rollout_data
        from slime.utils.types import Sample
    except ImportError as exc:
        pytest.skip(f"slime's modules do not import here: {exc}")
    finally:
        sys.path.remove(str(root))
    return Sample, save_debug_rollout_data


def test_slime_writes_what_the_inspector_reads(slime, tmp_path):
    Sample, save = slime
    samples = []
    for index in range(8):
        response = [10 + index, 11, 2]
        sample = Sample(group_index=index // 4, index=index, prompt="2+2=", tokens=[1, 5, 6, 7] + response,
                        response="4", response_length=3, reward=float(index % 2), loss_mask=[1, 1, 0],
                        rollout_log_probs=[-0.5, -0.25, -0.125])
        sample.status = Sample.Status.TRUNCATED if index == 7 else Sample.Status.COMPLETED
        samples.append(sample)
    template = str(tmp_path / "debug" / "rollout_{rollout_id}.pt")
    save(template, samples, rollout_id=5, evaluation=False)
    report = inspect(tmp_path / "debug", show_progress=False)
    assert report.observed["responses"] == 8 and report.observed["steps"] == 1 and report.observed["response_tokens"] == 24
    found = {item.pitfall: item for item in report.findings}
    assert found["P8"].evidence["eos_masked_share"] == 1.0  # every EOS (id 2) masked out of the loss
    assert report.metrics["inspect/finish_length_share"] == 1 / 8
