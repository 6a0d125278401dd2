"""The watch inside a TRL environment: the release's own trainer, one batch, under ``workbench.watch`` — no adapter.

``trl_eos`` counts decoding steps by wrapping ``generate`` itself; this adapter builds the same trainers and
batch (``trl_eos.ppo_v2_trainer`` / ``trl_eos.grpo_trainer``: the shipped tiny Qwen2, four arithmetic prompts,
``response_length`` 32) and only runs ``trainer.train()`` inside ``with watch(policy, tokenizer=tokenizer)``.
What comes back is the watch report (``Report.to_dict()``), so the S3 verdict is the watch's own:

* TRL 0.11 ``PPOv2Trainer`` generates with ``eos_token_id=None`` and decodes to ``response_length``; the watch
  sees that in ``generate``'s arguments and counts the decoding forwards run after every row had emitted EOS.
  ``stop_token="eos"`` only truncates the responses afterwards, so the same forwards still run.
* TRL >= 0.14 ``GRPOTrainer`` (TRL 1.16 on the host) stops generating when every row has emitted EOS.

Imports: the peer, torch, ``workbench.watch`` (torch + standard library) and the protocol.
"""

from __future__ import annotations

from workbench.peers import protocol
from workbench.peers.adapters import trl_eos
from workbench.watch import watch


def import_peer():
    import trl  # noqa: F401


def watched(trainer, policy, tokenizer, **measured) -> dict:
    """``trainer.train()`` under the watch; the report as JSON plus the S3 numbers the lab's table reads."""
    with watch(policy, tokenizer=tokenizer) as w:
        trainer.train()
    report = w.report().to_dict()
    for finding in report["findings"]:  # the call site inside the release, without this machine's paths
        finding["where"] = finding["where"].rsplit("site-packages/", 1)[-1]
    s3 = [f for f in report["findings"] if f["pitfall"] == "S3"]
    wasted = sum(int(f["evidence"].get("wasted_decode_forwards", 0)) for f in s3)
    return {"report": report, "s3_findings": len(s3), "s3_severities": sorted({f["severity"] for f in s3}),
            "wasted_decode_forwards": wasted, "decode_forwards": report["observed"]["decode_forwards"],
            "generate_calls": report["observed"]["generate_calls"], "max_new_tokens": trl_eos.RESPONSE_LENGTH, **measured}


def probes(args) -> list[dict]:
    import trl  # trl: peer environments only

    rows = []
    if hasattr(trl, "PPOv2Trainer"):
        for probe, stop_token in (("s3_watch", None), ("s3_watch_stop_token", "eos")):
            trainer, policy, tokenizer, _ = trl_eos.ppo_v2_trainer(stop_token)
            rows.append(protocol.audit_row(probe, None, trainer="PPOv2Trainer",
                                           **watched(trainer, policy, tokenizer, stop_token=stop_token)))
        return rows
    trainer, tokenizer = trl_eos.grpo_trainer()
    return [protocol.audit_row("s3_watch", None, trainer="GRPOTrainer", **watched(trainer, trainer.model, tokenizer))]


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["trl", "transformers", "accelerate", "datasets"])
