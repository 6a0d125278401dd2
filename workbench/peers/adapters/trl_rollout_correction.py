"""TRL 1.16's GRPO importance-sampling correction against ``workbench.core.rollout_correction.correct_trl``.

TRL computes the ratio inline, in ``GRPOTrainer._generate_and_score_completions``; the probe runs that method
itself on the shipped tiny model with generation and scoring replaced: ``_generate`` returns the case's
completions and sampling log-probs (a NaN one as ``None``, as vLLM hands it over) and
``_get_per_token_logps_and_entropies`` returns the case's training log-probs. ``use_vllm`` and
``vllm_importance_sampling_correction`` are switched on the built trainer, so no vLLM is needed. Its
``importance_sampling_ratio`` and its ``sampling/*`` metrics are compared with ``correct_trl`` for the four
modes × three (clip_min, clip_max) settings; ``GRPOTrainer.get_off_policy_mask`` (a static method) with
``off_policy_mask`` for three thresholds. Cases: ``heavy_tailed``, ``empty_rows``, ``one_token_rows``, ``inf``,
``nan`` of ``rollout_correction_cases`` (fp32: TRL's log-probs are).
"""

from __future__ import annotations

import math
import warnings

import torch

from workbench.core import rollout_correction as rc
from workbench.core.paths import scratch_folder
from workbench.peers import protocol
from workbench.peers.adapters.rollout_correction_cases import cases, compare_metrics, tensor_relative

DEFAULT_SEED = 20260554
CASES = ("heavy_tailed", "empty_rows", "one_token_rows", "inf", "nan")
CLIPS = ((None, 3.0), (0.5, 2.0), (0.8, None))
OFF_POLICY_THRESHOLDS = (0.0, 0.05, 0.2)
GROUP = 4


def import_peer():
    from trl import GRPOTrainer  # noqa: F401


def make_trainer(rows: int):
    from datasets import Dataset  # datasets: peer environments only (TRL's)
    from trl import GRPOConfig, GRPOTrainer  # trl: peer environments only

    tokenizer = protocol.load_tokenizer()
    folder = protocol.save_model_folder(protocol.load_model(), tokenizer, scratch_folder("peer-model-"))
    config = GRPOConfig(output_dir=scratch_folder("peer-grpo-"), use_cpu=True, bf16=False, report_to="none", max_steps=1,
                        per_device_train_batch_size=rows, num_generations=GROUP, max_completion_length=16, beta=0.0)
    trainer = GRPOTrainer(model=folder, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_list([{"prompt": "1+2="}] * rows), processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    trainer.model.train()
    return trainer


def trl_ratio(trainer, old, rollout, mask, mode, clip_min, clip_max):
    """TRL's own ``_generate_and_score_completions`` on the case: (ratio (B, T) or (B, 1), metrics)."""
    lengths = [int(n) for n in mask.sum(1).tolist()]
    width = max(lengths)

    def generate(prompts):
        completions = [[5] * n for n in lengths]
        logps = [[None if math.isnan(v) else v for v in rollout[i, :n].tolist()] for i, n in enumerate(lengths)]
        return [[4, 5, 6] for _ in prompts], completions, None, ["1" * n for n in lengths], logps, {}, None, None

    def scores(model, input_ids, *args, **kwargs):
        return old[:, :width].clone(), None, None

    trainer._generate, trainer._get_per_token_logps_and_entropies = generate, scores
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = clip_min, clip_max
    output = trainer._generate_and_score_completions([{"prompt": "1+2="}] * old.shape[0])
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("sampling/")}
    return output["importance_sampling_ratio"], output["completion_mask"], metrics, width


def case_row(trainer, name, old, rollout, mask) -> dict:
    from trl import GRPOTrainer  # trl: peer environments only

    worst = {"value": 0.0, "metric": "", "setting": ""}
    examples: list = []
    counts = dict(settings=0, ratio_rel=0.0, padding_ratio_differs=0, key_mismatches=0, mask_mismatches=0,
                  off_policy_settings=0, off_policy_differs=0)
    for mode in rc.TRL_MODES:
        for clip_min, clip_max in CLIPS:
            counts["settings"] += 1
            ratio, completion_mask, metrics, width = trl_ratio(trainer, old, rollout, mask, mode, clip_min, clip_max)
            ours = rc.correct_trl(old, rollout, mask, rc.trl_mode(mode, clip_min=clip_min, clip_max=clip_max))
            keep = mask.bool()[:, :width]
            theirs = ratio.expand(-1, width).float()
            counts["mask_mismatches"] += int(not torch.equal(completion_mask.bool(), keep))
            counts["ratio_rel"] = max(counts["ratio_rel"], tensor_relative(theirs, ours.weights[:, :width], keep))
            counts["padding_ratio_differs"] += int(tensor_relative(theirs, ours.weights[:, :width], ~keep) > 0)
            counts["key_mismatches"] += compare_metrics(metrics, ours.metrics, f"{mode}, clip [{clip_min}, {clip_max}]",
                                                        worst, examples)
    advantages = torch.randn(old.shape[0], 1, generator=torch.Generator().manual_seed(1))
    for threshold in OFF_POLICY_THRESHOLDS:
        counts["off_policy_settings"] += 1
        theirs = GRPOTrainer.get_off_policy_mask(advantages, old, rollout, mask, threshold)
        ours = rc.off_policy_mask(advantages, old, rollout, mask, threshold)
        counts["off_policy_differs"] += int(not torch.equal(theirs.float(), ours.float()))
    return protocol.audit_row("trl_rollout_correction", None, case=name, rows=int(mask.shape[0]),
                              response_tokens=int(mask.sum()), **counts, metric_rel=worst["value"],
                              worst_metric=worst["metric"], worst_setting=worst["setting"], examples=examples)


def probes(args) -> list[dict]:
    warnings.filterwarnings("ignore")
    drawn = cases(int(args.get("seed", DEFAULT_SEED)))
    trainer = make_trainer(next(iter(drawn.values()))[0].shape[0])
    return [case_row(trainer, name, *drawn[name]) for name in args.get("cases", CASES)]


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["trl", "transformers", "torch"])
