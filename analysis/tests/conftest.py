import os
import sys

import pytest

# Make `import analysis` work from any working directory.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from analysis.tests import synth  # noqa: E402


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Synthetic schema-1 files: name -> path."""
    d = tmp_path_factory.mktemp("runs")
    spec = {
        "healthy": dict(policy="none"),
        "dpdrop": dict(policy="dp-drop", kill_step=4, revive_step=8),
        "ntp": dict(policy="ntp", tp=4, dp=2, kill_step=4, kill_rank=5, revive_step=9, overrun_steps=(2, 3)),
        "ntppw": dict(policy="ntp-pw", tp=4, dp=2, kill_step=4, kill_rank=5, revive_step=9),
        "restart": dict(policy="restart", kill_step=6, checkpoint_every=4),
        "cut": dict(policy="ntp", kill_step=3, steps=7, summary=False),
        "corrupt": dict(policy="ntp", kill_step=4, revive_step=8, corrupt="goodput_tokens_per_s"),
    }
    out = {}
    for name, kw in spec.items():
        p = str(d / f"{name}.h5")
        synth.write_run(p, **kw)
        out[name] = p
    return out
