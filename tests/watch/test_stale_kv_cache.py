"""P29 in ``workbench.watch``: a KV cache filled before an optimiser step and passed to a call after it is flagged with
the steps since it was filled and the call site; the same cache reused within one decoding, and a fresh cache after
the step, are not; without an optimiser and without any weight change the report lists P29 as not observable."""

import torch

from workbench import watch
from workbench.modeling.tiny import tiny_model
from workbench.watch import observe

PROMPT = torch.tensor([[5, 6, 7, 8, 9]])


def setup():
    torch.manual_seed(0)
    model, tokenizer = tiny_model("gpt2", seed=1)
    return model, tokenizer, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer):
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def p29(report):
    return [finding for finding in report.findings if finding.pitfall == "P29"]


def test_cache_reused_after_optimizer_steps_is_flagged_with_the_steps():
    model, tokenizer, optimizer = setup()
    with watch(model, tokenizer=tokenizer, optimizer=optimizer) as watcher:
        with torch.no_grad():
            cache = model(input_ids=PROMPT[:, :-1], use_cache=True).past_key_values  # filled by the old weights
        train_step(model, optimizer)
        train_step(model, optimizer)
        with torch.no_grad():
            stale = model(input_ids=PROMPT[:, -1:], past_key_values=cache, use_cache=True).logits  # reused: the bug
            model(input_ids=stale[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)  # the same decoding goes on
    found = p29(watcher.report())
    assert len(found) == 1 and found[0].severity == "error", str(watcher.report())
    evidence = found[0].evidence
    assert evidence["optimizer_steps_since_fill"] == 2 and evidence["calls"] == 1 and evidence["parameters_updated"] > 0, evidence
    assert found[0].where.startswith(__file__), found[0].where


def test_generate_on_a_stale_cache_is_flagged_at_the_generate_call():
    model, tokenizer, optimizer = setup()
    with watch(model, tokenizer=tokenizer, optimizer=optimizer) as watcher:
        with torch.no_grad():
            cache = model(input_ids=PROMPT[:, :-1], use_cache=True).past_key_values
        train_step(model, optimizer)
        model.generate(PROMPT, past_key_values=cache, max_new_tokens=3, do_sample=False)
    found = p29(watcher.report())
    assert len(found) == 1 and found[0].evidence["optimizer_steps_since_fill"] == 1, str(watcher.report())
    assert found[0].evidence["calls"] == 1
    assert found[0].where.startswith(__file__)


def test_incremental_decoding_and_a_fresh_cache_after_the_step_are_not_flagged():
    model, tokenizer, optimizer = setup()
    with watch(model, tokenizer=tokenizer, optimizer=optimizer) as watcher:
        with torch.no_grad():
            cache = model(input_ids=PROMPT[:, :-1], use_cache=True).past_key_values
            token = PROMPT[:, -1:]
            for _ in range(4):  # one decoding: the same cache object, the same weights
                token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        model.generate(PROMPT, max_new_tokens=4, do_sample=False)
        train_step(model, optimizer)
        model.generate(PROMPT, max_new_tokens=4, do_sample=False)  # a fresh cache, filled by the new weights
        with torch.no_grad():
            fresh = model(input_ids=PROMPT[:, :-1], use_cache=True).past_key_values
            model(input_ids=PROMPT[:, -1:], past_key_values=fresh, use_cache=True)
    report = watcher.report()
    assert not p29(report) and report.observed["decode_forwards"] >= 10 and report.observed["optimizer_steps"] == 1, str(report)
    assert "P29" not in [entry["pitfall"] for entry in report.not_observable]


def test_without_an_optimizer_an_in_place_update_is_still_seen():
    model, tokenizer, _ = setup()
    with watch(model, tokenizer=tokenizer) as watcher:
        with torch.no_grad():
            cache = model(input_ids=PROMPT[:, :-1], use_cache=True).past_key_values
            next(model.parameters()).add_(0.01)  # a weight sync written in place (load_state_dict does the same)
            model(input_ids=PROMPT[:, -1:], past_key_values=cache, use_cache=True)
    found = p29(watcher.report())
    assert len(found) == 1 and found[0].evidence["parameters_updated"] == 1, str(watcher.report())
    assert "optimizer_steps_since_fill" not in found[0].evidence


def test_no_optimizer_and_no_update_is_reported_not_observable():
    model, tokenizer, _ = setup()
    with watch(model, tokenizer=tokenizer) as watcher:
        model.generate(PROMPT, max_new_tokens=3, do_sample=False)
    report = watcher.report()
    missing = {entry["pitfall"]: entry for entry in report.not_observable}
    assert not p29(report) and missing["P29"]["check"] is None and "optimizer=" in missing["P29"]["why"]
    assert "P29" in str(report) and "P29" in report.html()
    assert report.to_dict()["not_observable"][-1] == {"pitfall": "P29", "check": None, "why": missing["P29"]["why"]}


def test_cache_anchor_of_a_legacy_tuple_is_its_first_key():
    key, value = torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4)
    assert observe.cache_anchor(((key, value),)) is key
    assert observe.cache_anchor(()) is None and observe.cache_anchor(None) is None
