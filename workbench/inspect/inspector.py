"""``inspect(path_or_records, model=None) -> InspectReport``: read a rollout dump once, streaming, run every check of
``workbench.inspect.findings`` on each response, and report the findings with their numbers.

``path_or_records``: a file, a folder or a list of them (``readers.read``: generic JSONL/Parquet, slime, verl), or an
iterable of generic records (dicts) or ``Rollout``s. ``model``: a checkpoint path or a ``(model, tokenizer)`` pair; with
it, text-only responses are tokenised and scored, and the rollout's log-probs are re-scored at a grid of temperatures
(P6: log-probs taken before temperature), on a bounded sample of responses (``workbench.inspect.rescore``).
"""

from __future__ import annotations

import os
import time

from workbench.inspect.findings import Groups, Mismatch, Staleness, Tokens, Truncation
from workbench.inspect.readers import read
from workbench.inspect.records import Rollout, validate
from workbench.inspect.report import InspectReport


def _records(source, format: str, show_progress: bool):
    if isinstance(source, (str, os.PathLike)) or (isinstance(source, (list, tuple)) and source
                                                    and all(isinstance(item, (str, os.PathLike)) for item in source)):
        yield from read(source, format=format, show_progress=show_progress)
        return
    for index, record in enumerate(source):
        yield record if isinstance(record, Rollout) else validate(record, f"record {index}")


def inspect(path_or_records, model=None, *, format: str = "auto", eos_token_id: int | None = None,
            show_progress: bool = True, rescore_responses: int = 64) -> InspectReport:
    """The findings of a dump (see the module's docstring); raises ``DumpError`` (file and line) on bad input."""
    started = time.perf_counter()
    rescorer = None
    if model is not None:
        from workbench.inspect.rescore import Rescorer  # transformers: only with a model

        rescorer = Rescorer(model, sample=rescore_responses)
    truncation = Truncation(eos_token_id, fallback_eos=None if rescorer is None else rescorer.tokenizer.eos_token_id)
    mismatch, tokens, groups, staleness = Mismatch(), Tokens(), Groups(), Staleness()
    checks = (mismatch, truncation, tokens, groups, staleness)
    counts = {"responses": 0, "response_tokens": 0, "steps": set(), "text_only": 0, "with_logprobs": 0, "with_finish": 0,
              "with_policy_version": 0}
    for rollout in _records(path_or_records, format, show_progress):
        counts["text_only"] += rollout.response_ids is None
        if rescorer is not None:
            rollout = rescorer.prepare(rollout)
        counts["responses"] += 1
        counts["response_tokens"] += rollout.response_length
        counts["steps"].add(rollout.step)
        counts["with_logprobs"] += rollout.rollout_logprobs is not None and rollout.trainer_logprobs is not None
        counts["with_finish"] += rollout.finish is not None
        counts["with_policy_version"] += rollout.policy_version is not None
        for check in checks:
            check.add(rollout)
    counts["steps"] = len(counts["steps"])
    findings = [item for check in checks for item in check.findings()]
    if rescorer is not None:
        findings += rescorer.findings()
        for item in findings:  # the tokens with the largest gaps, as the tokenizer spells them (special tokens stand out)
            for token in item.evidence.get("top_tokens", []):
                token["text"] = str(rescorer.tokenizer.convert_ids_to_tokens(int(token["token_id"])))
    metrics = {}
    for check in (mismatch, truncation, groups, staleness):
        metrics |= check.scalars()
    unobserved = _unobserved(counts, model is not None)
    if counts["response_tokens"] and truncation.eos() is None:
        unobserved.append({"pitfall": "S3", "check": None, "why": "no EOS seen (no token ends most \"stop\" responses): "
                           "responses trained past their EOS cannot be counted; pass --eos-token-id or --model"})
    report = InspectReport(findings=findings, observed=counts, not_observable=unobserved,
                           metrics=metrics, per_step=mismatch.per_step())
    report.cost = {"inspect_seconds": time.perf_counter() - started}
    return report


def _unobserved(counts: dict, has_model: bool) -> list[dict]:
    """What the dump gave nothing to decide, each with what to add."""
    missing = []
    if counts["text_only"] and not has_model:
        missing.append({"pitfall": "P12", "check": None, "why": f"{counts['text_only']} text-only responses (no token ids): "
                        "pass --model to tokenise and score them"})
    elif not counts["with_logprobs"]:
        missing.append({"pitfall": "P12", "check": None, "why": "no response carries both rollout_logprobs and trainer_logprobs: "
                        "dump both to see the training–inference gap (rollout_corr/)"})
    if not has_model:
        missing.append({"pitfall": "P6", "check": None, "why": "log-probs taken before temperature need the model: pass --model"})
    if not counts["with_finish"]:
        missing.append({"pitfall": "P11", "check": None, "why": "no \"finish\" field: truncated responses cannot be told apart"})
    if not counts["with_policy_version"]:
        missing.append({"pitfall": "P28", "check": None, "why": "no \"policy_version\": staleness cannot be measured"})
    return missing
