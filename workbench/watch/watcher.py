"""``watch(model, ...)``: observe a real training run's own calls and report the pitfalls they show.

Attached for the duration of a ``with`` block, nothing else changes in the run:

* forward pre-hooks *with keyword arguments* on the model and on its transformer body (the workbench's
  scorer calls the body directly) — padding, position ids, the KV cache, grad mode, train/eval mode;
  the hooks are *covered* (``workbench.core.observers.cover``): the workbench's fast paths, which compute
  the model's forward without calling it (the sampler's static-cache decoder, the inline training body),
  keep running under the watch and report each call as a ``forward``/``forward_done`` event with the
  inputs and outputs the hooks would have seen; both go through the same ``_pre``/``_post``, so every
  observation is the same whichever path ran (the call site is the line that called the fast path);
* a wrapper of ``model.generate`` — the generation config (EOS, min/max new tokens, temperature, filters);
* the workbench's own sampler announces its settings through ``workbench.core.observers``;
* ``optimizer`` — a step pre-hook (dtypes of what it steps, and on the first step how much of the update
  survived bf16 rounding) and a post-hook counting steps;
* the KV caches calls receive and return, by object identity: one filled before a weight update (an optimiser
  step, or any in-place write the parameters' version counters show) and passed again after it is P29;
* ``deep=True`` — a gradient hook on the body's last hidden state (whose gradient is W^T ∂L/∂logits,
  position by position): which positions receive gradient (S4) and which sampling distribution the loss
  differentiates (P6, P14); and the sampler's log-probs re-scored by the training model (P12).

Findings are keyed by (pitfall, call site): the first file:line of the call stack outside torch,
transformers and this package. The module imports torch and the standard library only.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import types
import weakref

import torch

from workbench.core import observers
from workbench.core.attention_backward import unverified_backward_reason
from workbench.watch import observe
from workbench.watch.report import Finding, Report

# the watch's entry points whose wall time is its cost (Report.cost); _generate is left out: it wraps the whole generation
TIMED_ENTRY_POINTS = ("_pre", "_post", "_on_event", "_optimizer_pre", "_optimizer_post", "_hidden_grad")
_OWN_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep, observers.__file__)
_OWN_NAMES = (os.sep + "transformers" + os.sep, os.sep + "torch" + os.sep, os.sep + "accelerate" + os.sep, "<frozen ", "contextlib.py",
              "functools.py")


def call_site() -> str:
    """file:line of the nearest caller outside torch, transformers, accelerate and this package."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if (not name.startswith(_OWN_DIRS) and not any(part in name for part in _OWN_NAMES)
                and name not in observers.FORWARD_IMPLEMENTATIONS):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _first(*values):
    return next((v for v in values if v is not None), None)


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]


class Watch:
    """The context manager ``watch(...)`` returns; ``report()`` at any time (also after the block)."""

    def __init__(self, model, tokenizer=None, reference=None, optimizer=None, deep: bool = False):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"watch(model=...) needs a torch.nn.Module (a Hugging Face model); got {type(model).__name__}")
        self.model, self.tokenizer, self.reference, self.optimizer, self.deep = model, tokenizer, reference, optimizer, deep
        self.observed: dict[str, int] = {k: 0 for k in ("forwards", "training_forwards", "no_grad_forwards", "decode_forwards",
                                                        "generate_calls", "sampler_calls", "optimizer_steps", "wasted_decode_forwards")}
        self._findings: dict[tuple[str, str], Finding] = {}
        self._handles: list = []
        self._covered: list = []  # the forward hooks, declared to core.observers as served by forward events
        self._generate_patched: list = []
        self._depth = 0
        self._quiet = False
        self._sessions: dict[int, dict] = {}
        self._call_cache = None  # the anchor of the cache the current outermost call received (P29, checked in _pre)
        self._stop_tensor: tuple | None = None  # (stop ids, device, their tensor) for the decode steps' stop test
        self._sampling: dict | None = None
        self._first_step_done = False
        self._steps_done = 0  # optimiser steps completed (post-hook)
        self._caches: dict[tuple[int, int], dict] = {}  # (model, cache anchor) ids → the weights that filled it (P29)
        self._parameters = {id(m): list(m.parameters()) for m in self._models()}
        self._entry_versions: tuple[int, ...] | None = None
        config = getattr(model, "config", None)
        generation = getattr(model, "generation_config", None)
        tok = lambda name: getattr(tokenizer, name, None) if tokenizer is not None else None  # noqa: E731
        self.stop_ids = set(_ids(tok("eos_token_id")) + _ids(getattr(generation, "eos_token_id", None))
                            + _ids(getattr(config, "eos_token_id", None)))
        self.bos = _first(tok("bos_token_id"), getattr(config, "bos_token_id", None))
        pad = _first(tok("pad_token_id"), getattr(generation, "pad_token_id", None), getattr(config, "pad_token_id", None))
        eos = _ids(_first(tok("eos_token_id"), getattr(config, "eos_token_id", None)))
        self.pad_is_eos = pad if pad is not None and pad in eos else None
        self.encoding = observe.position_encoding(model)
        self.attn = str(getattr(config, "_attn_implementation", "") or "")
        self._dropout = {id(m): observe.dropout_sites(m) for m in self._models()}
        # the watch's own cost: wall time inside its entry points (outermost calls only) and of the with block
        self._own_seconds, self._entered_at, self._watched_seconds = 0.0, None, 0.0
        self._own = threading.local()  # per thread: inside a timed entry point already (nested calls count once)
        self._own_lock = threading.Lock()

    def _models(self):
        return [m for m in (self.model, self.reference) if m is not None]

    # ---- attach / detach ------------------------------------------------------------------------------
    def __enter__(self) -> Watch:
        self._entered_at = time.perf_counter()
        self._entry_versions = observe.parameter_versions(self._parameters[id(self.model)])
        for role, model in (("policy", self.model), ("reference", self.reference)):
            if model is None:
                continue
            for target in self._targets(model):
                pre, post = functools.partial(self._pre, role, model), functools.partial(self._post, role, model, target)
                self._handles.append(target.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(target.register_forward_hook(post, with_kwargs=True, always_call=True))
                self._covered += [pre, post]  # the fast paths report their calls instead of skipping these hooks
            if role == "policy" and callable(getattr(model, "generate", None)):
                original = model.generate
                model.generate = functools.wraps(original)(functools.partial(self._generate, original))
                self._generate_patched.append(model)
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._optimizer_pre))
            self._handles.append(self.optimizer.register_step_post_hook(self._optimizer_post))
        observers.subscribe(self._on_event)
        for hook in self._covered:
            observers.cover(hook)
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def close(self) -> None:
        if self._entered_at is not None:
            self._watched_seconds += time.perf_counter() - self._entered_at
            self._entered_at = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for model in self._generate_patched:
            model.__dict__.pop("generate", None)
        self._generate_patched.clear()
        observers.unsubscribe(self._on_event)
        for hook in self._covered:
            observers.uncover(hook)
        self._covered.clear()

    @staticmethod
    def _targets(model) -> list:
        body = getattr(model, "base_model", None)
        return [model] + ([body] if isinstance(body, torch.nn.Module) and body is not model else [])

    # ---- findings -----------------------------------------------------------------------------------------
    def _flag(self, pitfall: str, severity: str, message: str, where: str | None = None, **evidence) -> Finding:
        where = where or call_site()
        key = (pitfall, where)
        finding = self._findings.get(key)
        if finding is None:
            finding = self._findings[key] = Finding(pitfall, severity, message, {}, where)
        counted = {k: v for k, v in evidence.items() if k.endswith(("_seen", "forwards", "rows", "calls"))}
        for k, v in evidence.items():
            finding.evidence[k] = finding.evidence.get(k, 0) + v if k in counted else v
        if observe_severity(severity) < observe_severity(finding.severity):
            finding.severity, finding.message = severity, message
        return finding

    def report(self) -> Report:
        findings = [Finding(f.pitfall, f.severity, f.message, dict(f.evidence), f.where) for f in self._findings.values()]
        watched = self._watched_seconds + (time.perf_counter() - self._entered_at if self._entered_at is not None else 0.0)
        device = next((p.device.type for p in self._parameters[id(self.model)]), "cpu")
        report = Report(findings=findings, observed=dict(self.observed),
                        cost={"mode": "deep" if self.deep else "light", "watch_seconds": self._own_seconds,
                              "watched_seconds": watched, "device": device})
        if self.optimizer is None and observe.parameter_versions(self._parameters[id(self.model)]) == self._entry_versions:
            report.not_observable.append({"pitfall": "P29", "check": None, "why": P29_UNOBSERVED})
        return report

    # ---- forward hooks --------------------------------------------------------------------------------------
    def _pre(self, role, model, module, args, kwargs):
        self._depth += 1
        if self._depth > 1 or self._quiet:
            return None
        ids = kwargs.get("input_ids", args[0] if args and isinstance(args[0], torch.Tensor) else None)
        mask = kwargs.get("attention_mask")
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        self.observed["forwards"] += 1
        self.observed["training_forwards" if grad else "no_grad_forwards"] += 1
        cached = observe.cache_length(kwargs.get("past_key_values"))
        self._check_cache(model, kwargs.get("past_key_values"))
        self._call_cache = observe.cache_anchor(kwargs.get("past_key_values"))  # checked: _post skips it if returned
        if not grad and model.training:
            self._check_dropout(role, model)
        if grad and role == "policy":
            self._check_backward(role, model, ids, mask, kwargs)
        if cached > 0 and ids is not None:
            self._decode(role, model, ids)
            return None
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and ids is not None and ids.dim() == 2:
            self._check_rows(role, model, ids, mask, kwargs, grad)
        elif ids is not None and ids.dim() == 2 and mask is None:
            self._check_rows(role, model, ids, None, kwargs, grad)
        if self.deep and grad and role == "policy" and isinstance(mask, torch.Tensor) and mask.dim() in (2, 4) and ids is not None:
            self._pending_deep = (ids, mask)  # a 4-D mask: the workbench's prefix-tree rows (S4 is not decided there)
        if role == "policy" and self._sampling is not None and self._sampling.get("p12") and grad:
            self._resolve_p12()
        return None

    def _post(self, role, model, target, module, args, kwargs, output):
        self._depth -= 1
        if self._depth == 0 and not self._quiet:
            returned = getattr(output, "past_key_values", None)  # a cache this call filled: remembered
            if returned is not None and observe.cache_anchor(returned) is not self._call_cache:  # (the one it got: checked)
                self._check_cache(model, returned)
            self._call_cache = None
        if (self.deep and role == "policy" and target is not model and not self._quiet and torch.is_grad_enabled()
                and getattr(self, "_pending_deep", None) is not None):
            hidden = getattr(output, "last_hidden_state", None)
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                ids, mask = self._pending_deep
                hidden.register_hook(functools.partial(self._hidden_grad, model, ids, mask, hidden.detach(), call_site()))
            self._pending_deep = None
        return None

    def _check_dropout(self, role, model):
        active, p = observe.dropout_in_effect(self._dropout[id(model)])
        if active:
            self._flag("P7", "error", f"a no-grad (scoring or sampling) forward of the {role} ran in training mode with dropout on: "
                       "two forwards of the same weights disagree, so ρ ≠ 1 and KL ≠ 0 at step 0. Call model.eval() "
                       "for scoring/sampling, or set dropout to 0.", forwards=1, dropout_sites=active, dropout_max=p)
        else:
            self._flag("P7", "warning", f"a no-grad forward of the {role} ran in training mode; dropout is 0, so it is harmless "
                       "here — a bug on a checkpoint with dropout. Call model.eval() for scoring/sampling.", forwards=1, dropout_max=0.0)

    def _check_backward(self, role, model, ids, mask, kwargs):
        """A training forward under an attention back-end whose gradients were measured wrong or not verified at this
        model's head dim, release and GPU (core.attention_backward) — dense, padded or packed alike (flash-attn 4's dq
        is wrong at head dim 16 in both its kernels) — with the rows' layout as evidence."""
        reason = unverified_backward_reason(model)
        if reason is None:
            return
        rows = int(ids.shape[0]) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else 0
        padded = int((mask == 0).any(-1).sum()) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else 0
        positions = kwargs.get("position_ids")
        packed = 0  # rows holding more than one sequence: position ids that restart, or boundaries passed as given
        if isinstance(positions, torch.Tensor) and positions.dim() == 2 and positions.shape[-1] > 1:
            packed = int((positions[:, 1:] < positions[:, :-1]).any(-1).sum())
        if not packed and kwargs.get("cu_seq_lens_q") is not None:
            packed = 1  # flash's packed path takes one row
        counts = ((padded, "padded"), (packed, "packed"), (max(rows - padded - packed, 0), "unpadded"))
        what = " and ".join(f"{count} {kind} row(s)" for count, kind in counts if count) or "its rows"
        self._flag("S2", "error", f"a training forward of the {role} ({what}) ran {reason}. Train with "
                   "attn_implementation='sdpa'; scoring and sampling under it are unaffected.",
                   forwards=1, padded_rows=padded, packed_rows=packed, rows=rows)

    def _check_rows(self, role, model, ids, mask, kwargs, grad):
        stats = observe.row_stats(ids, mask, self.bos, self.pad_is_eos if grad else None)
        if not stats:
            return
        width = stats["width"]
        left = [a for a, r in zip(stats["lead"], stats["real"], strict=True) if 0 < a < width and r > 0]
        right = [b for b, r in zip(stats["trail"], stats["real"], strict=True) if 0 < b < width and r > 0]
        if left and kwargs.get("position_ids") is None:
            evidence = dict(left_padded_rows=len(left), forwards=1, max_pad=max(left), rows_in_batch=len(stats["lead"]))
            if self.encoding == "absolute":
                self._flag("S1", "error", f"a forward of the {role} got left-padded rows and no position_ids: this model has learned "
                           "absolute positions, so every padded row is scored at shifted positions (log-probs differ from "
                           "generate's). Pass position_ids = attention_mask.cumsum(-1) − 1 (pads: 1).", **evidence)
            else:
                what = "rotary positions (relative): fp32 hides the shift (~1e-7), bf16 shows ~1e-3" if self.encoding == "rotary" \
                    else "an unrecognised position encoding"
                self._flag("S1", "warning", f"a forward of the {role} got left-padded rows and no position_ids; this model uses {what}. "
                           "Harmless here, a bug on an absolute-position model: pass position_ids from the mask.", **evidence)
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = kwargs.get("past_key_values") is not None
        if right and role == "policy":
            self._sessions[id(model)] = {"finished": None, "right_padded": len(right), "where": call_site()}
        elif use_cache:
            self._sessions[id(model)] = {"finished": None, "right_padded": 0}
        if right and self.attn.startswith("flash") and next(model.parameters()).is_cuda:
            self._flag("S2", "error", "a padded batch went to flash_attention_2 with right padding: the variable-length path needs "
                       "left padding for generation (or a padding-free batch).", rows=len(right), forwards=1)
        double = sum(stats["double_bos"])
        if double:
            self._flag("P21", "error", f"{double} row(s) start with two BOS tokens (a template that writes BOS plus a tokenizer that "
                       "adds one): the model sees a context it was never trained on. Tokenise with add_special_tokens=False.",
                       rows=double, bos_id=self.bos)
        hidden = sum(stats["hidden_eos"])
        if hidden:
            self._flag("P8", "warning", f"pad id = EOS id ({self.pad_is_eos}) and the training mask hides the EOS after {hidden} "
                       "row(s)' last real token: a mask built from ids != pad masks the generated EOS too, so the model never "
                       "learns to stop. Use a distinct pad token, or build the mask from the first EOS.", rows=hidden,
                       pad_id=self.pad_is_eos)

    def _decode(self, role, model, ids):
        self.observed["decode_forwards"] += 1
        session = self._sessions.setdefault(id(model), {"finished": None, "right_padded": 0})
        if session.get("right_padded"):
            self._flag("S2", "error", "cached generation continued right-padded prompts: a short row's new tokens come after its pads, "
                       "so its continuation differs from generating it alone. Pad prompts on the left.",
                       where=session.get("where"), rows=session["right_padded"], generations=1)
            session["right_padded"] = 0
        token = ids[:, -1]
        finished = session["finished"]
        if finished is None or finished.shape[0] != token.shape[0]:
            finished = torch.zeros(token.shape[0], dtype=torch.bool, device=token.device)
        if self.stop_ids:
            stops = tuple(sorted(self.stop_ids))
            if self._stop_tensor is None or self._stop_tensor[:2] != (stops, token.device):
                self._stop_tensor = (stops, token.device, torch.tensor(stops, device=token.device))
            finished = finished | torch.isin(token, self._stop_tensor[2])
        session["finished"] = finished
        if self.stop_ids and bool(finished.all()):
            self.observed["wasted_decode_forwards"] += 1
            self._flag("S3", "error", "decoding forwards ran after every row had emitted a stop id: generation does not stop at EOS "
                       "(eos_token_id unset, or a loop without a stop test). Set eos_token_id / stop when every row finished.",
                       wasted_decode_forwards=1, stop_ids=sorted(self.stop_ids))

    # ---- KV cache reused across a weight update (P29) ----------------------------------------------------------
    def _check_cache(self, model, past, where: str | None = None) -> None:
        """Remember a cache the first time a call carries it (the weights' version counters and the optimiser steps
        then); when a later call carries it again and the counters moved, the cache's keys and values come from
        weights that no longer exist. Incremental decoding passes the same cache with unchanged weights: silent."""
        anchor = observe.cache_anchor(past)
        if anchor is None:
            return
        key = (id(model), id(anchor))
        versions = observe.parameter_versions(self._parameters.get(id(model)) or list(model.parameters()))
        record = self._caches.get(key)
        if record is None:
            try:
                weakref.finalize(anchor, self._caches.pop, key, None)  # the id is freed with the cache: forget it then
            except TypeError:
                return  # cannot be weakly referenced: its id could be reused by another cache, so it is not tracked
            self._caches[key] = {"steps": self._steps_done, "versions": versions}
            return
        if versions == record["versions"]:
            return
        moved = sum(a != b for a, b in zip(versions, record["versions"], strict=False))
        record["versions"] = versions  # one finding per reuse: the decoding that continues this cache is not counted again
        evidence = {"calls": 1, "parameters_updated": moved}
        if self.optimizer is not None:
            evidence["optimizer_steps_since_fill"] = self._steps_done - record["steps"]
        self._flag("P29", "error", "a KV cache filled before a weight update was passed to a call after it: its keys and values "
                   "were computed by the old weights, so the log-probs on top of it belong to neither policy. Drop every "
                   "cache (prefix cache: reset_prefix_cache()) whenever the weights change.", where=where, **evidence)

    # ---- generate -----------------------------------------------------------------------------------------
    def _generate(self, original, *args, **kwargs):
        self.observed["generate_calls"] += 1
        config = kwargs.get("generation_config")
        default = getattr(self.model, "generation_config", None)
        get = lambda name: _first(kwargs.get(name), getattr(config, name, None), getattr(default, name, None))  # noqa: E731
        eos = kwargs.get("eos_token_id", _first(getattr(config, "eos_token_id", None), getattr(default, "eos_token_id", None)))
        where = call_site()
        self._check_cache(self.model, kwargs.get("past_key_values"), where)
        if eos is None:
            self._flag("S3", "error", "generate() was called with eos_token_id=None: every row decodes to max_new_tokens and the "
                       "text after EOS is thrown away afterwards. Set generation_config.eos_token_id.", where=where, calls=1,
                       max_new_tokens=get("max_new_tokens"))
        else:
            self.stop_ids |= set(_ids(eos))
            low, high = get("min_new_tokens"), get("max_new_tokens")
            if low and high and low >= high:
                self._flag("S3", "warning", f"generate() with min_new_tokens = max_new_tokens = {high}: EOS is suppressed until the end, "
                           "so no row can stop early.", where=where, calls=1, min_new_tokens=low, max_new_tokens=high)
        do_sample = bool(get("do_sample"))
        self._sampling = {"temperature": float(get("temperature") or 1.0) if do_sample else 1.0,
                          "top_k": int(get("top_k") or 0) if do_sample else 0,
                          "top_p": float(get("top_p") or 1.0) if do_sample else 1.0, "source": "generate"}
        return original(*args, **kwargs)

    # ---- the workbench's fast paths: a forward without model(...), reported through core.observers ----------
    def _fast_forward(self, event: str, data: dict) -> None:
        """A ``forward``/``forward_done`` event: the hooks' own ``_pre``/``_post`` on the inputs/outputs the call
        it replaces would have carried (part ``"body"``: the transformer body's hooks)."""
        model = data["model"]
        role = "policy" if model is self.model else "reference" if model is self.reference else None
        if role is None:
            return  # a model this watch does not watch (a rollout copy, another watch's model)
        target = self._targets(model)[-1] if data["part"] == "body" else model
        if event == "forward":
            self._pre(role, model, target, (), data["inputs"])
        else:
            self._post(role, model, target, target, (), {}, types.SimpleNamespace(**data["outputs"]))

    # ---- the workbench's sampler ------------------------------------------------------------------------------
    def _on_event(self, event: str, data: dict) -> None:
        if event in ("forward", "forward_done"):
            self._fast_forward(event, data)
        if event != "sample":
            return
        self.observed["sampler_calls"] += 1
        self.stop_ids |= set(data.get("stop_ids", []))
        sampler, rollout = data.get("model"), data.get("rollout")
        self._sampling = {"temperature": float(data.get("temperature", 1.0)), "top_k": int(data.get("top_k", 0)),
                          "top_p": float(data.get("top_p", 1.0)), "source": "sampler"}
        if sampler is None or sampler is self.model:
            return
        sampler_dtype, policy_dtype = _dtype(sampler), _dtype(self.model)
        if sampler_dtype == policy_dtype:
            return
        evidence = {"sampler_dtype": str(sampler_dtype).replace("torch.", ""), "policy_dtype": str(policy_dtype).replace("torch.", "")}
        if self.deep and rollout is not None:
            evidence.update(self._rescore(rollout, self._sampling["temperature"]))
        self._sampling["p12"] = (evidence, call_site())

    def _rescore(self, rollout, temperature: float) -> dict:
        """The sampler's log-probs against the policy's own forward on the same tokens (deep mode)."""
        ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
        mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
        device = next(self.model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        self._quiet = True
        try:
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0),
                                    use_cache=False).logits
        finally:
            self._quiet = False
        prompt = rollout.prompt_ids.shape[1]
        logp = (logits[:, prompt - 1 : -1].float() / temperature).log_softmax(-1).gather(-1, ids[:, prompt:, None])[..., 0]
        keep = rollout.response_mask.to(device).bool()
        delta = (logp - rollout.rollout_logprobs.to(device).float()).abs()[keep]
        return {"mean_abs_delta_logp": float(delta.mean()) if delta.numel() else 0.0,
                "max_abs_delta_logp": float(delta.max()) if delta.numel() else 0.0, "tokens": int(delta.numel())}

    def _resolve_p12(self):
        evidence, where = self._sampling.pop("p12")
        self._flag("P12", "warning", f"the rollout was sampled by a {evidence['sampler_dtype']} copy while the policy trains in "
                   f"{evidence['policy_dtype']}: its log-probs are not the trainer's, so a ratio against them is not 1 at the first "
                   "step. Recompute π_old with the training forward (and correct with truncated importance sampling).",
                   where=where, **evidence)

    # ---- optimiser (P23) --------------------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer, args, kwargs):
        self.observed["optimizer_steps"] += 1
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        low = [p for p in params if p.dtype in (torch.bfloat16, torch.float16)]
        self._step_snapshot = None
        if low and not self._first_step_done:
            self._step_snapshot = [(p, p.detach().clone()) for p in low]
        elif low:
            self._flag("P23", "error", "the optimiser steps bf16/fp16 parameters without fp32 master weights: an update smaller than "
                       "~2⁻⁹ of a weight rounds away. Keep fp32 weights (bf16 autocast) or fp32 master copies.",
                       bf16_tensors=len(low), steps_seen=1)
        return None

    def _optimizer_post(self, optimizer, args, kwargs):
        self._steps_done += 1
        snapshot, self._step_snapshot = getattr(self, "_step_snapshot", None), None
        self._first_step_done = True
        if not snapshot:
            return
        changed = total = 0
        for p, before in snapshot:
            moved = p.detach() != before
            changed += int(moved.sum())
            total += moved.numel()
        self._flag("P23", "error", "the optimiser steps bf16/fp16 parameters without fp32 master weights: an update smaller than "
                   "~2⁻⁹ of a weight rounds away. Keep fp32 weights (bf16 autocast) or fp32 master copies.",
                   bf16_tensors=len(snapshot), steps_seen=1, first_step_unchanged_fraction=1.0 - changed / max(total, 1))

    # ---- deep: gradient of the body's last hidden state -------------------------------------------------------
    def _hidden_grad(self, model, ids, mask, hidden, where, grad):
        moved = grad.detach().float().abs().sum(-1) > 0  # (B, T): positions whose logits are in the loss
        if mask.dim() == 2:
            self._check_pairs(ids, mask, moved, where)
            follows = mask[:, 1:].bool()  # position t's label is token t + 1 of the same row
        else:  # prefix-tree rows: t + 1 continues t's sequence when it may attend to t
            follows = torch.diagonal(mask[:, 0].bool(), offset=-1, dim1=-2, dim2=-1)
        if self._sampling is not None:
            self._check_distribution(model, ids, hidden, grad, moved[:, :-1] & follows, where)
        return None

    def _check_pairs(self, ids, mask, moved, where):
        """S4: rows i and i + B/2 that share a prefix (chosen/rejected) — prompt positions with gradient in one, not the other."""
        rows = ids.shape[0]
        if rows < 2 or rows % 2:
            return
        half = rows // 2
        a, b = ids[:half], ids[half:]
        same = (a == b) & mask[:half].bool() & mask[half:].bool()
        prefix = (same.long().cumprod(-1)).sum(-1)  # shared leading tokens of each pair
        if int(prefix.min()) < 2:
            return
        positions = torch.arange(ids.shape[1], device=ids.device)[None]
        in_prompt = positions < (prefix[:, None] - 1)  # logits at t predict token t + 1: still a prompt token
        differ = (moved[:half] != moved[half:]) & in_prompt
        self.observed["paired_forwards"] = self.observed.get("paired_forwards", 0) + 1
        count = int(differ.any(-1).sum())
        if count:
            self._flag("S4", "error", "in a forward of paired rows (chosen on rejected, same prompt), prompt positions receive "
                       "gradient in one row of a pair and not in the other: the loss mask covers the prompts of one half only. "
                       "Mask the prompt in every row (prompt lengths repeated for both halves).", where=where,
                       pairs=count, prompt_positions=int(differ.sum()), forwards=1)

    def _check_distribution(self, model, ids, hidden, grad, moved, where):
        """P6 / P14: the distribution the loss differentiates vs the sampler's temperature and filters."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is None or getattr(head, "weight", None) is None or ids.shape[1] < 2:
            return
        chosen = moved.nonzero()[:32]
        if chosen.numel() == 0:
            return
        rows, cols = chosen[:, 0], chosen[:, 1]
        fit = observe.differentiated_distribution(hidden[rows, cols], grad[rows, cols], head.weight.detach(), ids[rows, cols + 1],
                                                  self._sampling)
        if fit is None or fit["fit"] < 0.98:
            self.observed["distribution_undecided"] = self.observed.get("distribution_undecided", 0) + 1
            return
        self.observed["distribution_checks"] = self.observed.get("distribution_checks", 0) + 1
        tau = self._sampling["temperature"]
        filtered = "fit_filtered" in fit
        if filtered and misfit(fit["fit_filtered"]) > 10 * misfit(fit["fit_at_sampling_temperature"]) + 1e-4:
            self._flag("P14", "error", f"sampling truncated the distribution (top_k={self._sampling['top_k']}, "
                       f"top_p={self._sampling['top_p']}) but the loss differentiates the full softmax: the ratio's numerator and "
                       "the sampler disagree by the kept mass. Apply the same filters in the training forward (or sample without).",
                       where=where, **fit)
        elif (not filtered and abs(fit["temperature_fit"] / tau - 1) > 0.1
              and misfit(fit["fit_at_sampling_temperature"]) > 10 * misfit(fit["fit"]) + 1e-4):
            fitted = fit["temperature_fit"]
            self._flag("P6", "error", f"sampled at temperature {tau:g} but the loss differentiates softmax(z / {fitted:.2f}): "
                       "the training forward does not divide the logits by the sampling temperature. Score logits / τ.",
                       where=where, sampling_temperature=tau, **fit)


P29_UNOBSERVED = ("no optimiser was given and the watched model's weights did not change inside the block, so no weight "
                  "update was seen to reuse a KV cache across; pass optimizer= (a rollout engine's prefix cache, e.g. "
                  "vLLM's, is outside the watch: call reset_prefix_cache() after every weight sync)")


def misfit(cosine: float) -> float:
    """1 − |cos|: how far an observed gradient is from a predicted direction (0: exactly along it)."""
    return max(0.0, 1.0 - cosine)


def observe_severity(severity: str) -> int:
    return ("error", "warning", "info").index(severity)


def _dtype(model):
    parameter = next(model.parameters(), None)
    return parameter.dtype if parameter is not None else None


def watch(model, tokenizer=None, reference=None, optimizer=None, deep: bool = False) -> Watch:
    """Watch ``model`` (and optionally ``reference``, ``optimizer``) inside a ``with`` block; see the module doc."""
    return Watch(model, tokenizer=tokenizer, reference=reference, optimizer=optimizer, deep=deep)


def _timed(entry_point):
    """The wall time of an outermost call of ``entry_point`` inside the ``with`` block counts as the watch's cost
    (``Report.cost``); calls nested in another timed call, and calls after the block (a tensor hook that outlives
    it), do not."""
    @functools.wraps(entry_point)
    def timed(self, *args, **kwargs):
        if getattr(self._own, "inside", False) or self._entered_at is None:
            return entry_point(self, *args, **kwargs)
        self._own.inside, start = True, time.perf_counter()
        try:
            return entry_point(self, *args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            self._own.inside = False
            with self._own_lock:
                self._own_seconds += elapsed
    return timed


for _name in TIMED_ENTRY_POINTS:
    setattr(Watch, _name, _timed(getattr(Watch, _name)))
