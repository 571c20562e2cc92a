"""OpenVINO reports its use over the network and writes a client id under the user's home; pt2b's
calls into it (its import, each conversion of a hand-off) do neither, and the user's own calls go on
as the user's setting says. Each run is a fresh process: OpenVINO reports its first import once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("openvino")
pytest.importorskip("openvino_telemetry")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# what OpenVINO would send is recorded, not sent (the test reaches no network)
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from openvino_telemetry.utils import sender

    sent = []
    sender.TelemetrySender.send = lambda self, backend, message: sent.append(message)
    home = os.path.join(os.environ["HOME"], "intel")
    seen = {}

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2

    ep = torch.export.export(Tiny(), (torch.randn(3),))
    from exporter.backends import to_backend

    for step in ("pt2b", "pt2b again"):
        compiled = to_backend("openvino", ep)
        assert compiled.validation.status == "passed"
        seen[step] = {"sent": len(sent), "wrote": os.path.exists(home)}
    import openvino
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    openvino.convert_model(TorchFXPythonDecoder(ep.module(), dynamic_shapes=True))  # the user's own
    seen["user"] = {"sent": len(sent), "wrote": os.path.exists(home)}
    print(json.dumps(seen))
""")


def test_pt2bs_hand_off_sends_no_usage_events_and_the_users_own_conversion_still_does(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}  # (OpenVINO's "CI" checks)
    env.update(HOME=str(tmp_path), PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pt2b"] == seen["pt2b again"] == {"sent": 0, "wrote": False}
    # the setting is the user's again: their conversion reports, as OpenVINO does by default
    assert seen["user"]["sent"] > 0 and seen["user"]["wrote"]
