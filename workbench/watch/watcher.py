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
  differentiates (P6, P14); and a rollout drawn by another model than the policy (another dtype, older weights, an
  engine) re-scored by the training model (P12's evidence, with verl's ``rollout_corr/`` diagnostics and health
  thresholds: ``watch.mismatch``; light mode flags P12 from what the sampler announces).

One method per check, named ``_check_…`` (``_check_left_padding`` for S1, …; S2 and S3 have several checks, P23 two):
each decides one finding from the measurements it is given. The entry points (``_pre``, ``_post``, ``_generate``,
``_on_event``, the optimiser hooks, ``_hidden_grad``) and the dispatchers they call (``_on_rows``, ``_on_distribution``)
keep the counters and per-call state, take the measurements, and call the checks that apply.
Findings are keyed by (pitfall, call site): the first file:line of the call stack outside torch,
transformers and this package. The module imports torch and the standard library only.
"""

from __future__ import annotations

import functools
import types
import weakref
from dataclasses import dataclass

import torch

from workbench.core import observers
from workbench.core.attention_backward import unverified_backward_reason
from workbench.watch import observe
from workbench.watch.callsite import call_site
from workbench.watch.cost import Stopwatch, timed
from workbench.watch.observe import first_set, token_ids
from workbench.watch.report import P29_UNOBSERVED, SEVERITY_RANK, Finding, Report
from workbench.watch.rollout_checks import RolloutChecks

OBSERVED_COUNTERS = ("forwards", "training_forwards", "no_grad_forwards", "decode_forwards", "generate_calls", "sampler_calls",
                     "optimizer_steps", "wasted_decode_forwards")
COUNTED_EVIDENCE = ("_seen", "forwards", "rows", "calls", "generations")  # evidence names summed over a finding's occurrences
LOW_PRECISION = (torch.bfloat16, torch.float16)
# the best temperature's fit to the gradient (median |cos|) below which the distribution is left undecided (P6, P14)
DECISIVE_FIT = 0.98


@dataclass
class GenerationSession:
    """A model's cached generation: its rows' stop state, and the right-padded prompts it continues (S2)."""

    right_padded: int = 0
    where: str | None = None  # the call site of the forward that received the right-padded prompts
    finished: torch.Tensor | None = None  # (rows,) bool: the row has emitted a stop id


@dataclass
class CacheFill:
    """What filled a KV cache (P29): the optimiser steps done then and the weights' version counters."""

    steps: int
    versions: tuple[int, ...]


class Watch(RolloutChecks):
    """The context manager ``watch(...)`` returns; ``report()`` at any time (also after the block)."""

    def __init__(self, model, tokenizer=None, reference=None, optimizer=None, deep: bool = False):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"watch(model=...) needs a torch.nn.Module (a Hugging Face model); got {type(model).__name__}")
        self.model, self.tokenizer, self.reference, self.optimizer, self.deep = model, tokenizer, reference, optimizer, deep
        self.observed: dict[str, int] = dict.fromkeys(OBSERVED_COUNTERS, 0)
        self.stopwatch = Stopwatch()  # the watch's own cost (Report.cost): its @timed entry points and the block

        # what the tokenizer and the model's configs say about special tokens and the architecture
        self.stop_ids, self.bos_id, self.pad_id_if_eos = observe.special_tokens(model, tokenizer)
        self.position_encoding = observe.position_encoding(model)
        self.attention_implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
        models = [watched for watched in (model, reference) if watched is not None]
        self._parameters = {id(watched): list(watched.parameters()) for watched in models}
        self._dropout_sites = {id(watched): observe.dropout_sites(watched) for watched in models}

        # what is attached while the block is open
        self._handles: list = []
        self._covered: list = []  # the forward hooks, declared to core.observers as served by forward events
        self._generate_patched: list = []

        # the forward being observed
        self._depth = 0  # nested forwards (the body inside the model) are observed once, at depth 1
        self._quiet = False  # the watch's own re-scoring forward is not observed
        self._call_cache = None  # the anchor of the cache the current outermost call received (checked in _pre)
        self._deep_forward_inputs: tuple | None = None  # (ids, mask) of the policy's training forward, for its body's hook

        # what calls leave for later calls
        self._findings: dict[tuple[str, str], Finding] = {}
        self._sessions: dict[int, GenerationSession] = {}  # model id → its cached generation
        self._stop_tensor: tuple | None = None  # (stop ids, device, their tensor) for the decode steps' stop test
        self._sampling: dict | None = None  # the last sampler's or generate's temperature and filters
        self._sampler_mismatch: tuple[dict, str, str] | None = None  # (P12 evidence, call site, severity) until trained on
        self._steps_done = 0  # optimiser steps completed (post-hook)
        self._first_step_snapshot: list | None = None  # (parameter, its copy) before the first low-precision step (P23)
        self._caches: dict[tuple[int, int], CacheFill] = {}  # (model, cache anchor) ids → what filled the cache (P29)
        self._entry_versions: tuple[int, ...] | None = None

    # ---- attach / detach ------------------------------------------------------------------------------
    def __enter__(self) -> Watch:
        self.stopwatch.start()
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
        self.stopwatch.stop()
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
        """One finding per (pitfall, call site): counting evidence (``COUNTED_EVIDENCE``) is summed over its
        occurrences, other evidence keeps the latest value, and the most severe occurrence's message is kept."""
        where = where or call_site()
        key = (pitfall, where)
        finding = self._findings.get(key)
        if finding is None:
            finding = self._findings[key] = Finding(pitfall, severity, message, {}, where)
        for name, value in evidence.items():
            finding.evidence[name] = finding.evidence.get(name, 0) + value if name.endswith(COUNTED_EVIDENCE) else value
        if SEVERITY_RANK[severity] < SEVERITY_RANK[finding.severity]:
            finding.severity, finding.message = severity, message
        return finding

    def _count(self, counter: str) -> None:
        """A counter that appears in ``observed`` only once its check has run."""
        self.observed[counter] = self.observed.get(counter, 0) + 1

    def report(self) -> Report:
        findings = [Finding(finding.pitfall, finding.severity, finding.message, dict(finding.evidence), finding.where)
                    for finding in self._findings.values()]
        device = next((parameter.device.type for parameter in self._parameters[id(self.model)]), "cpu")
        report = Report(findings=findings, observed=dict(self.observed),
                        cost={"mode": "deep" if self.deep else "light", "watch_seconds": self.stopwatch.own_seconds,
                              "watched_seconds": self.stopwatch.watched_seconds(), "device": device})
        if self.optimizer is None and observe.parameter_versions(self._parameters[id(self.model)]) == self._entry_versions:
            report.not_observable.append({"pitfall": "P29", "check": None, "why": P29_UNOBSERVED})
        return report

    # ---- forward hooks --------------------------------------------------------------------------------------
    @timed
    def _pre(self, role, model, module, args, kwargs):
        """Before an outermost forward: count it, and run the checks its inputs and grad mode call for."""
        self._depth += 1
        if self._depth > 1 or self._quiet:
            return None
        ids = kwargs.get("input_ids", args[0] if args and isinstance(args[0], torch.Tensor) else None)
        mask = kwargs.get("attention_mask")
        past = kwargs.get("past_key_values")
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        trains_policy = grad and role == "policy"
        self.observed["forwards"] += 1
        self.observed["training_forwards" if grad else "no_grad_forwards"] += 1
        self._check_stale_cache(model, past)
        self._call_cache = observe.cache_anchor(past)  # checked: _post skips it if returned
        if not grad and model.training:
            self._check_dropout(role, model)
        if trains_policy:
            self._check_attention_backward(role, model, ids, mask, kwargs)
        if ids is not None and observe.cache_length(past) > 0:
            self._decode_step(model, ids)
            return None
        if ids is not None and ids.dim() == 2 and (mask is None or isinstance(mask, torch.Tensor) and mask.dim() == 2):
            self._on_rows(role, model, ids, mask, kwargs, grad)
        if self.deep and trains_policy and ids is not None and isinstance(mask, torch.Tensor) and mask.dim() in (2, 4):
            self._deep_forward_inputs = (ids, mask)  # a 4-D mask: the workbench's prefix-tree rows (S4 is not decided there)
        if trains_policy and self._sampler_mismatch is not None:
            self._check_sampler_precision()
        return None

    @timed
    def _post(self, role, model, target, module, args, kwargs, output):
        """After a forward: remember the cache it filled (P29); in deep mode, hook the body's last hidden state."""
        self._depth -= 1
        if self._depth == 0 and not self._quiet:
            returned = getattr(output, "past_key_values", None)  # a cache this call filled: remembered
            if returned is not None and observe.cache_anchor(returned) is not self._call_cache:  # (the one it got: checked)
                self._check_stale_cache(model, returned)
            self._call_cache = None
        if (self.deep and role == "policy" and target is not model and not self._quiet and torch.is_grad_enabled()
                and self._deep_forward_inputs is not None):
            hidden = getattr(output, "last_hidden_state", None)
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                ids, mask = self._deep_forward_inputs
                hidden.register_hook(functools.partial(self._hidden_grad, model, ids, mask, hidden.detach(), call_site()))
            self._deep_forward_inputs = None
        return None

    def _check_dropout(self, role, model):
        """P7: a no-grad (scoring or sampling) forward in training mode; an error when dropout is on."""
        active, probability = observe.dropout_in_effect(self._dropout_sites[id(model)])
        if active:
            self._flag("P7", "error", f"a no-grad (scoring or sampling) forward of the {role} ran in training mode with dropout on: "
                       "two forwards of the same weights disagree, so ρ ≠ 1 and KL ≠ 0 at step 0. Call model.eval() "
                       "for scoring/sampling, or set dropout to 0.", forwards=1, dropout_sites=active, dropout_max=probability)
        else:
            self._flag("P7", "warning", f"a no-grad forward of the {role} ran in training mode; dropout is 0, so it is harmless "
                       "here — a bug on a checkpoint with dropout. Call model.eval() for scoring/sampling.", forwards=1, dropout_max=0.0)

    def _check_attention_backward(self, role, model, ids, mask, kwargs):
        """S2: a training forward under an attention back-end whose gradients were measured wrong or not verified at
        this model's head dim, release and GPU (core.attention_backward) — dense, padded or packed alike (flash-attn 4's
        dq is wrong at head dim 16 in both its kernels) — with the rows' layout as evidence."""
        reason = unverified_backward_reason(model)
        if reason is None:
            return
        rows, padded, packed = observe.row_layout(ids, mask, kwargs)
        counts = ((padded, "padded"), (packed, "packed"), (max(rows - padded - packed, 0), "unpadded"))
        what = " and ".join(f"{count} {kind} row(s)" for count, kind in counts if count) or "its rows"
        self._flag("S2", "error", f"a training forward of the {role} ({what}) ran {reason}. Train with "
                   "attn_implementation='sdpa'; scoring and sampling under it are unaffected.",
                   forwards=1, padded_rows=padded, packed_rows=packed, rows=rows)

    # ---- a 2-D batch's rows ---------------------------------------------------------------------------------
    def _on_rows(self, role, model, ids, mask, kwargs, grad):
        """The checks of a batch's row layout (S1, S2, P21, P8), from one read of its padding, and the cached
        generation the forward opens."""
        stats = observe.row_stats(ids, mask, self.bos_id, self.pad_id_if_eos if grad else None)
        left, right = stats["left_padded"], stats["right_padded"]
        self._check_left_padding(role, left, ids.shape[0], kwargs)
        self._open_session(role, model, right, kwargs)
        self._check_right_padding_under_flash(model, right)
        self._check_duplicate_bos(sum(stats["double_bos"]))
        self._check_pad_equals_eos(sum(stats["hidden_eos"]))

    def _check_left_padding(self, role, left, rows, kwargs):
        """S1: left-padded rows and no position_ids, so every padded row is scored at shifted positions."""
        if not left or kwargs.get("position_ids") is not None:
            return
        evidence = dict(left_padded_rows=len(left), forwards=1, max_pad=max(left), rows_in_batch=rows)
        if self.position_encoding == "absolute":
            self._flag("S1", "error", f"a forward of the {role} got left-padded rows and no position_ids: this model has learned "
                       "absolute positions, so every padded row is scored at shifted positions (log-probs differ from "
                       "generate's). Pass position_ids = attention_mask.cumsum(-1) − 1 (pads: 1).", **evidence)
        else:
            what = ("rotary positions (relative): fp32 hides the shift (~1e-7), bf16 shows ~1e-3" if self.position_encoding == "rotary"
                    else "an unrecognised position encoding")
            self._flag("S1", "warning", f"a forward of the {role} got left-padded rows and no position_ids; this model uses {what}. "
                       "Harmless here, a bug on an absolute-position model: pass position_ids from the mask.", **evidence)

    def _open_session(self, role, model, right, kwargs):
        """A forward that fills a cache starts the generation its decode steps continue; the policy's right-padded
        prompts are remembered with their call site (S2 is flagged when a decode step continues them)."""
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = kwargs.get("past_key_values") is not None
        if right and role == "policy":
            self._sessions[id(model)] = GenerationSession(right_padded=len(right), where=call_site())
        elif use_cache:
            self._sessions[id(model)] = GenerationSession()

    def _check_right_padding_under_flash(self, model, right):
        """S2: right-padded rows through flash_attention_2 on a GPU."""
        if right and self.attention_implementation.startswith("flash") and next(model.parameters()).is_cuda:
            self._flag("S2", "error", "a padded batch went to flash_attention_2 with right padding: the variable-length path needs "
                       "left padding for generation (or a padding-free batch).", rows=len(right), forwards=1)

    def _check_duplicate_bos(self, rows):
        """P21: rows that start with two BOS tokens."""
        if rows:
            self._flag("P21", "error", f"{rows} row(s) start with two BOS tokens (a template that writes BOS plus a tokenizer that "
                       "adds one): the model sees a context it was never trained on. Tokenise with add_special_tokens=False.",
                       rows=rows, bos_id=self.bos_id)

    def _check_pad_equals_eos(self, rows):
        """P8: pad id = EOS id, and a training mask that hides the EOS right after a row's last real token."""
        if rows:
            self._flag("P8", "warning", f"pad id = EOS id ({self.pad_id_if_eos}) and the training mask hides the EOS after {rows} "
                       "row(s)' last real token: a mask built from ids != pad masks the generated EOS too, so the model never "
                       "learns to stop. Use a distinct pad token, or build the mask from the first EOS.", rows=rows,
                       pad_id=self.pad_id_if_eos)

    # ---- decode steps ---------------------------------------------------------------------------------------
    def _decode_step(self, model, ids):
        """A forward on a filled cache: one step of the model's generation session."""
        self.observed["decode_forwards"] += 1
        session = self._sessions.setdefault(id(model), GenerationSession())
        self._check_right_padded_generation(session)
        session.finished = self._finished_rows(session.finished, ids[:, -1])
        self._check_decoding_past_stop(session.finished)

    def _check_right_padded_generation(self, session):
        """S2: cached generation continuing right-padded prompts (flagged once per generation)."""
        if session.right_padded:
            self._flag("S2", "error", "cached generation continued right-padded prompts: a short row's new tokens come after its pads, "
                       "so its continuation differs from generating it alone. Pad prompts on the left.",
                       where=session.where, rows=session.right_padded, generations=1)
            session.right_padded = 0

    def _finished_rows(self, finished, token):
        """The rows that have emitted a stop id, ``token`` (this step's input) included."""
        if finished is None or finished.shape[0] != token.shape[0]:
            finished = torch.zeros(token.shape[0], dtype=torch.bool, device=token.device)
        if self.stop_ids:
            stops = tuple(sorted(self.stop_ids))
            if self._stop_tensor is None or self._stop_tensor[:2] != (stops, token.device):
                self._stop_tensor = (stops, token.device, torch.tensor(stops, device=token.device))
            finished = finished | torch.isin(token, self._stop_tensor[2])
        return finished

    def _check_decoding_past_stop(self, finished):
        """S3: a decode step after every row has emitted a stop id."""
        if self.stop_ids and bool(finished.all()):
            self.observed["wasted_decode_forwards"] += 1
            self._flag("S3", "error", "decoding forwards ran after every row had emitted a stop id: generation does not stop at EOS "
                       "(eos_token_id unset, or a loop without a stop test). Set eos_token_id / stop when every row finished.",
                       wasted_decode_forwards=1, stop_ids=sorted(self.stop_ids))

    # ---- KV cache reused across a weight update (P29) ----------------------------------------------------------
    def _check_stale_cache(self, model, past, where: str | None = None) -> None:
        """P29: remember a cache the first time a call carries it (the weights' version counters and the optimiser
        steps then); when a later call carries it again and the counters moved, the cache's keys and values come
        from weights that have changed since. Incremental decoding passes the same cache with unchanged weights:
        silent."""
        anchor = observe.cache_anchor(past)
        if anchor is None:
            return
        key = (id(model), id(anchor))
        versions = observe.parameter_versions(self._parameters.get(id(model)) or list(model.parameters()))
        fill = self._caches.get(key)
        if fill is None:
            self._remember_cache(key, anchor, versions)
            return
        if versions == fill.versions:
            return
        moved = sum(now != then for now, then in zip(versions, fill.versions, strict=False))
        fill.versions = versions  # one finding per reuse: the decoding that continues this cache is not counted again
        evidence = {"calls": 1, "parameters_updated": moved}
        if self.optimizer is not None:
            evidence["optimizer_steps_since_fill"] = self._steps_done - fill.steps
        self._flag("P29", "error", "a KV cache filled before a weight update was passed to a call after it: its keys and values "
                   "were computed by the old weights, so the log-probs on top of it belong to neither policy. Drop every "
                   "cache (prefix cache: reset_prefix_cache()) whenever the weights change.", where=where, **evidence)

    def _remember_cache(self, key, anchor, versions) -> None:
        """The weights and steps that filled a cache seen for the first time, kept as long as the cache lives."""
        try:
            weakref.finalize(anchor, self._caches.pop, key, None)  # the id is freed with the cache: forget it then
        except TypeError:
            return  # cannot be weakly referenced: its id could be reused by another cache, so it is not tracked
        self._caches[key] = CacheFill(self._steps_done, versions)

    # ---- generate -----------------------------------------------------------------------------------------
    def _generate(self, original, *args, **kwargs):
        """``model.generate`` under the watch: the watch's own work on the call is timed (``_on_generate``), the
        generation is not (its forwards' hooks are timed on their own)."""
        self._on_generate(kwargs)
        return original(*args, **kwargs)

    @timed
    def _on_generate(self, kwargs):
        """A ``generate`` call's settings: its stop ids and sampling, checked (S3) and kept for the forwards it runs."""
        self.observed["generate_calls"] += 1
        config = kwargs.get("generation_config")
        default = getattr(self.model, "generation_config", None)

        def setting(name):
            return first_set(kwargs.get(name), getattr(config, name, None), getattr(default, name, None))

        eos = kwargs.get("eos_token_id", first_set(getattr(config, "eos_token_id", None), getattr(default, "eos_token_id", None)))
        where = call_site()
        self._check_stale_cache(self.model, kwargs.get("past_key_values"), where)
        if eos is not None:
            self.stop_ids |= set(token_ids(eos))
        self._check_generate_stops(eos, setting("min_new_tokens"), setting("max_new_tokens"), where)
        do_sample = bool(setting("do_sample"))
        self._set_sampling(temperature=float(setting("temperature") or 1.0) if do_sample else 1.0,
                           top_k=int(setting("top_k") or 0) if do_sample else 0,
                           top_p=float(setting("top_p") or 1.0) if do_sample else 1.0, source="generate")

    def _check_generate_stops(self, eos, min_new_tokens, max_new_tokens, where):
        """S3: generate() without an EOS id (an error), or with min_new_tokens ≥ max_new_tokens (a warning)."""
        if eos is None:
            self._flag("S3", "error", "generate() was called with eos_token_id=None: every row decodes to max_new_tokens and the "
                       "text after EOS is thrown away afterwards. Set generation_config.eos_token_id.", where=where, calls=1,
                       max_new_tokens=max_new_tokens)
        elif min_new_tokens and max_new_tokens and min_new_tokens >= max_new_tokens:
            self._flag("S3", "warning", f"generate() with min_new_tokens = max_new_tokens = {max_new_tokens}: EOS is suppressed until "
                       "the end, so no row can stop early.", where=where, calls=1, min_new_tokens=min_new_tokens,
                       max_new_tokens=max_new_tokens)

    def _set_sampling(self, temperature: float, top_k: int, top_p: float, source: str) -> None:
        """The distribution the next rollout is sampled from; a sampler mismatch noted for the previous one is dropped."""
        self._sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "source": source}
        self._sampler_mismatch = None

    # ---- the workbench's fast paths and sampler, reported through core.observers ----------------------------
    @timed
    def _on_event(self, event: str, data: dict) -> None:
        if event in ("forward", "forward_done"):
            self._fast_forward(event, data)
        elif event == "sample":
            self._on_sample(data)

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

    # ---- optimiser (P23) --------------------------------------------------------------------------------------
    @timed
    def _optimizer_pre(self, optimizer, args, kwargs):
        """Before a step: count it; the low-precision parameters it steps are copied on the first step (their
        change is measured after it) and flagged on the later ones."""
        self.observed["optimizer_steps"] += 1
        stepped = [parameter for group in optimizer.param_groups for parameter in group["params"] if parameter.grad is not None]
        low_precision = [parameter for parameter in stepped if parameter.dtype in LOW_PRECISION]
        self._first_step_snapshot = None
        if low_precision and self._steps_done == 0:  # checked after the step, with the share it left unchanged
            self._first_step_snapshot = [(parameter, parameter.detach().clone()) for parameter in low_precision]
        else:
            self._check_master_weights(len(low_precision))
        return None

    @timed
    def _optimizer_post(self, optimizer, args, kwargs):
        self._steps_done += 1
        snapshot, self._first_step_snapshot = self._first_step_snapshot, None
        if snapshot:
            self._check_first_step_rounding(snapshot)

    def _check_first_step_rounding(self, snapshot):
        """P23 on the first step, with the share of the low-precision weights the update left unchanged."""
        self._check_master_weights(len(snapshot), first_step_unchanged_fraction=observe.unchanged_fraction(snapshot))

    def _check_master_weights(self, low_precision_tensors: int, **evidence):
        """P23: the optimiser steps bf16/fp16 parameters (``low_precision_tensors`` of them) with no fp32 master copy."""
        if not low_precision_tensors:
            return
        self._flag("P23", "error", "the optimiser steps bf16/fp16 parameters without fp32 master weights: an update smaller than "
                   "~2⁻⁹ of a weight rounds away. Keep fp32 weights (bf16 autocast) or fp32 master copies.",
                   bf16_tensors=low_precision_tensors, steps_seen=1, **evidence)

    # ---- deep: gradient of the body's last hidden state -------------------------------------------------------
    @timed
    def _hidden_grad(self, model, ids, mask, hidden, where, grad):
        """The gradient hook on the body's last hidden state: which positions the loss reaches (S4), and which
        distribution it differentiates (P6, P14)."""
        moved = grad.detach().float().abs().sum(-1) > 0  # (B, T): positions whose logits are in the loss
        if mask.dim() == 2:
            self._check_paired_prompt_mask(ids, mask, moved, where)
            follows = mask[:, 1:].bool()  # position t's label is token t + 1 of the same row
        else:  # prefix-tree rows: t + 1 continues t's sequence when it may attend to t
            follows = torch.diagonal(mask[:, 0].bool(), offset=-1, dim1=-2, dim2=-1)
        if self._sampling is not None:
            self._on_distribution(model, ids, hidden, grad, moved[:, :-1] & follows, where)
        return None

    def _check_paired_prompt_mask(self, ids, mask, moved, where):
        """S4: rows i and i + B/2 that share a prefix (chosen/rejected) — prompt positions with gradient in one, not the other."""
        gaps = observe.paired_prompt_gaps(ids, mask, moved)
        if gaps is None:
            return
        self._count("paired_forwards")
        pairs, prompt_positions = gaps
        if pairs:
            self._flag("S4", "error", "in a forward of paired rows (chosen on rejected, same prompt), prompt positions receive "
                       "gradient in one row of a pair and not in the other: the loss mask covers the prompts of one half only. "
                       "Mask the prompt in every row (prompt lengths repeated for both halves).", where=where,
                       pairs=pairs, prompt_positions=prompt_positions, forwards=1)

    def _on_distribution(self, model, ids, hidden, grad, moved, where):
        """The distribution the loss differentiates, fitted from the gradient; checked against the sampler's filters
        (P14) when it truncated, against its temperature (P6) otherwise."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is None or getattr(head, "weight", None) is None or ids.shape[1] < 2:
            return
        chosen = moved.nonzero()[:32]
        if chosen.numel() == 0:
            return
        rows, cols = chosen[:, 0], chosen[:, 1]
        fit = observe.differentiated_distribution(hidden[rows, cols], grad[rows, cols], head.weight.detach(), ids[rows, cols + 1],
                                                  self._sampling)
        if fit is None or fit["fit"] < DECISIVE_FIT:
            self._count("distribution_undecided")
            return
        self._count("distribution_checks")
        if "fit_filtered" in fit:
            self._check_sampling_filters(fit, where)
        else:
            self._check_sampling_temperature(fit, where)

    def _check_sampling_filters(self, fit, where):
        """P14: the sampler truncated (top-k/top-p) and the gradient fits the full softmax far better than the filtered one."""
        if misfit(fit["fit_filtered"]) > 10 * misfit(fit["fit_at_sampling_temperature"]) + 1e-4:
            self._flag("P14", "error", f"sampling truncated the distribution (top_k={self._sampling['top_k']}, "
                       f"top_p={self._sampling['top_p']}) but the loss differentiates the full softmax: the ratio's numerator and "
                       "the sampler disagree by the kept mass. Apply the same filters in the training forward (or sample without).",
                       where=where, **fit)

    def _check_sampling_temperature(self, fit, where):
        """P6: the gradient fits softmax(z / τ') for a τ' far from the sampling temperature τ, far better than at τ."""
        temperature = self._sampling["temperature"]
        if (abs(fit["temperature_fit"] / temperature - 1) > 0.1
                and misfit(fit["fit_at_sampling_temperature"]) > 10 * misfit(fit["fit"]) + 1e-4):
            self._flag("P6", "error", f"sampled at temperature {temperature:g} but the loss differentiates softmax(z / "
                       f"{fit['temperature_fit']:.2f}): the training forward does not divide the logits by the sampling "
                       "temperature. Score logits / τ.", where=where, sampling_temperature=temperature, **fit)


def misfit(cosine: float) -> float:
    """1 − |cos|: how far an observed gradient is from a predicted direction (0: exactly along it)."""
    return max(0.0, 1.0 - cosine)


def watch(model, tokenizer=None, reference=None, optimizer=None, deep: bool = False) -> Watch:
    """Watch ``model`` (and optionally ``reference``, ``optimizer``) inside a ``with`` block; see the module doc."""
    return Watch(model, tokenizer=tokenizer, reference=reference, optimizer=optimizer, deep=deep)
