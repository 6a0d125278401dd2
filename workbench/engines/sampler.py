"""The host side: ``EngineSampler``, a sampler with the workbench sampler's interface backed by vLLM.

It starts ``workbench.engines.server`` in the engine environment's interpreter (``envs.locate``) as a child process and
speaks JSON lines with it; weights go over as safetensors files in a private folder (no pickle). The rollout trainer
uses it like the workbench's own sampler: ``sample(prompt_ids, prompt_mask, ...) -> Rollout`` (left-padded prompts in;
token ids, the engine's log-probs of the sampled tokens and finish reasons out).

What it sets explicitly, each a pitfall of the engine's defaults (notebook 94):

* the engine's dtype, from ``precision`` (``fp32`` → ``float32``, ``bf16`` → ``bfloat16``), checked against what the
  engine reports it loaded; vLLM's ``dtype="auto"`` loads an fp32 checkpoint as bf16, silently (``precision="auto"``
  shows it: the check then raises unless ``check_dtype=False``);
* ``logprobs_mode="processed_logprobs"``: the log-probs of the distribution it sampled from (after temperature);
  vLLM's default ``raw_logprobs`` returns them before temperature;
* weights pushed after every update through the engine's reload path (``collective_rpc("reload_weights")``; the CPU
  build repacks linear weights, so ``model.load_weights``, TRL's colocate path, fails), then
  ``reset_prefix_cache()``: without it the prefix cache serves KV computed with the old weights
  (``reset_prefix_cache=False`` keeps that bug).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.core import observers
from workbench.core.errors import EngineError, EngineUnavailable
from workbench.core.paths import REPO_ROOT, private_folder, remove_private_folder
from workbench.engines import envs
from workbench.engines.checks import ENGINE_DTYPES, LOGPROBS_MODES, check_choice, check_head_dim
from workbench.modeling.rollout import Rollout, truncate_after_eos

START_TIMEOUT = 600.0  # seconds: importing vLLM and building the engine (~30 s measured on 2 cores, more under load)
CALL_TIMEOUT = 900.0
WEIGHT_SYNCS = ("reload_weights", "load_weights")


@dataclass
class EngineOptions:
    """How the engine is started and fed. The defaults are the fixes."""

    precision: str = "fp32"
    """The engine's dtype: ``fp32``, ``bf16``, ``fp16``, or ``auto`` (vLLM's default: bf16 for an fp32 checkpoint)."""
    logprobs_mode: str = "processed_logprobs"
    """``processed_logprobs``: log-probs after temperature (the sampling distribution); ``raw_logprobs``: before."""
    reset_prefix_cache: bool = True
    """Reset the prefix cache after every weight push (fix); False serves the old weights' cached KV (bug)."""
    prefix_caching: bool = True
    """vLLM's automatic prefix caching (on by default in vLLM)."""
    weight_sync: str = "reload_weights"
    """``reload_weights`` (the engine's reload path) or ``load_weights`` (``model.load_weights``: TRL's colocate)."""
    check_dtype: bool = True
    """Raise when the engine's dtype differs from the one ``precision`` asks for."""
    max_model_len: int = 256
    max_num_seqs: int = 64
    seed: int = 0
    extra_env: dict = field(default_factory=dict)

    def validate(self) -> None:
        check_choice(self.precision, tuple(ENGINE_DTYPES), "precision")
        check_choice(self.logprobs_mode, LOGPROBS_MODES, "logprobs_mode")
        check_choice(self.weight_sync, WEIGHT_SYNCS, "weight_sync")


def engine_status() -> envs.EngineEnvStatus:
    """Whether the engine environment is there (``ready``) and, when not, why (``reason``, naming ``make engines``)."""
    return envs.locate()


def engine_weights(model) -> dict[str, torch.Tensor]:
    """The model's weights by Hugging Face name, fp32, each its own tensor — a tied output head included as
    ``lm_head.weight``: the engine gets an untied copy of the model (``engine_config``), because vLLM's in-place
    ``reload_weights`` does not reload a tied ``ParallelLMHead`` (it logs "Failed to load weights" and keeps the old
    head: 0.74 nats off after an update, measured)."""
    state = model.state_dict()
    if "lm_head.weight" not in state and hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        state["lm_head.weight"] = model.get_output_embeddings().weight
    return {name: value.detach().to("cpu", torch.float32).clone().contiguous() for name, value in state.items()}


def engine_config(model):
    """The model's config for the engine: the output head untied (see ``engine_weights``), the dtype the weights are
    written in (fp32)."""
    import copy

    config = copy.deepcopy(model.config)
    config.tie_word_embeddings = False
    config.dtype = "float32"
    return config


class EngineSampler:
    """vLLM behind the workbench's sampler interface (see the module doc). Start with ``start(model)``, push weights
    with ``push_weights(model)`` after each update, sample with ``sample(...)``, and ``close()`` (also at exit of a
    ``with`` block)."""

    def __init__(self, options: EngineOptions | None = None, *, name: str = "the model"):
        self.options = options or EngineOptions()
        self.options.validate()
        self.name = name
        self.process: subprocess.Popen | None = None
        self.folder: str | None = None
        self.info: dict = {}
        self.pushes = 0
        self.last_generate: dict = {}
        self.seconds = {"start": 0.0, "push": 0.0, "generate": 0.0}

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, model) -> EngineSampler:
        """Check the model, write it for the engine, start the engine process and check the dtype it loaded."""
        check_head_dim(model.config, self.name)
        status = envs.locate()
        if not status.ready:
            raise EngineUnavailable(f"the vLLM engine is not available: {status.reason}")
        begin = time.perf_counter()
        self.folder = private_folder("engine")
        model_dir = Path(self.folder) / "model"
        model_dir.mkdir(parents=True)
        engine_config(model).save_pretrained(str(model_dir))
        from safetensors.torch import save_file  # safetensors: only when weights are written

        save_file(engine_weights(model), str(model_dir / "model.safetensors"), metadata={"format": "pt"})
        self.log_path = Path(self.folder) / "engine.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(envs.engine_env(), PYTHONPATH=str(REPO_ROOT), **self.options.extra_env)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([status.python, "-m", "workbench.engines.server"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, env=env, cwd=str(REPO_ROOT), text=True,
                                            bufsize=1)
        o = self.options
        self.info = self.call("start", timeout=START_TIMEOUT, model=str(model_dir), dtype=ENGINE_DTYPES[o.precision],
                              logprobs_mode=o.logprobs_mode, prefix_caching=o.prefix_caching, seed=o.seed,
                              max_model_len=o.max_model_len, max_num_seqs=o.max_num_seqs)
        self.info["requested_dtype"] = ENGINE_DTYPES[o.precision]
        self.info["checkpoint_dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
        self.seconds["start"] = time.perf_counter() - begin
        expected = self.info["checkpoint_dtype"] if o.precision == "auto" else ENGINE_DTYPES[o.precision]
        if o.check_dtype and self.info["dtype"] != expected:
            loaded = self.info["dtype"]
            self.close()
            raise EngineError(f"the engine loaded {self.name} as {loaded}, not {expected} (dtype={ENGINE_DTYPES[o.precision]!r}); "
                              "set the engine's dtype explicitly: precision='fp32' or 'bf16'")
        return self

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.process.kill()
                self.process.wait()
        self.process = None
        if self.folder is not None:
            remove_private_folder(self.folder)
            self.folder = None

    def __enter__(self) -> EngineSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a sampler dropped without close() still ends its engine process
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
            pass

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ---- the exchange ---------------------------------------------------------------------------------------------

    def call(self, cmd: str, timeout: float = CALL_TIMEOUT, **request) -> dict:
        """One request, one answer; an engine failure raises ``EngineError`` with its message, a dead engine
        ``EngineUnavailable`` with the tail of its log."""
        if not self.running:
            raise EngineUnavailable(f"the engine process is not running{self._log_tail()}; start it with start(model)")
        try:
            self.process.stdin.write(json.dumps({"cmd": cmd, **request}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError as exc:
            raise EngineUnavailable(f"the engine process stopped answering ({exc}){self._log_tail()}") from None
        if not line:
            self.process.wait(timeout=30)
            raise EngineUnavailable(f"the engine process ended (exit {self.process.returncode}){self._log_tail()}")
        payload = json.loads(line)
        if not payload.pop("ok", False):
            raise EngineError(f"the engine's {cmd} failed: {payload.get('error')}")
        return payload

    def _log_tail(self) -> str:
        try:
            tail = Path(self.log_path).read_text(errors="replace").strip().splitlines()[-8:]
        except (OSError, AttributeError):
            return ""
        return ": " + " | ".join(tail)[-1500:] if tail else ""

    # ---- weights ----------------------------------------------------------------------------------------------------

    def push_weights(self, model, *, reset_prefix_cache: bool | None = None, via: str | None = None) -> dict:
        """Send the model's current weights through the engine's reload path (``weight_sync``), then reset the
        prefix cache (``reset_prefix_cache``)."""
        begin = time.perf_counter()
        path = Path(self.folder) / f"weights-{self.pushes}.safetensors"
        from safetensors.torch import save_file  # safetensors: only when weights are written

        save_file(engine_weights(model), str(path))
        reset = self.options.reset_prefix_cache if reset_prefix_cache is None else reset_prefix_cache
        try:
            result = self.call("update", path=str(path), via=via or self.options.weight_sync, reset_prefix_cache=reset)
        finally:
            path.unlink(missing_ok=True)
        self.pushes += 1
        self.seconds["push"] += time.perf_counter() - begin
        return result

    def reset_prefix_cache(self) -> bool:
        return bool(self.call("reset_prefix_cache")["reset"])

    # ---- sampling ---------------------------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 stop_token_ids=(), ignore_eos: bool = False, seeds: list[int] | None = None) -> dict:
        """Raw engine call: token-id prompts → ``tokens``, ``logprobs``, ``finish``, ``cached``, ``seconds``."""
        begin = time.perf_counter()
        out = self.call("generate", prompts=[list(map(int, p)) for p in prompts], temperature=float(temperature),
                        max_tokens=int(max_new_tokens), stop_token_ids=[int(t) for t in stop_token_ids],
                        ignore_eos=ignore_eos, seeds=seeds)
        self.seconds["generate"] += time.perf_counter() - begin
        self.last_generate = out
        return out

    def sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, max_new_tokens: int,
               eos_token_id, pad_token_id: int, temperature: float = 1.0, stop_at_eos: bool = True,
               seed: int = 0) -> Rollout:
        """The workbench sampler's contract on the engine: left-padded prompts → a ``Rollout`` (responses cut after
        the first stop id, the engine's log-probs of the sampled tokens, ``finished`` = ended by a stop id).
        Row ``i`` draws with seed ``seed * 100003 + i``."""
        stops = [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids.cpu(), prompt_mask.cpu(), strict=True)]
        seeds = [(seed * 100003 + i) % 2**31 for i in range(len(prompts))]
        begin = time.perf_counter()
        out = self.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                            stop_token_ids=stops if stop_at_eos else (), ignore_eos=not stop_at_eos, seeds=seeds)
        width = max(1, max(len(t) for t in out["tokens"]))
        ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
        logp = torch.zeros((len(prompts), width), dtype=torch.float32)
        for row, (tokens, values) in enumerate(zip(out["tokens"], out["logprobs"], strict=True)):
            ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            logp[row, :len(values)] = torch.tensor(values, dtype=torch.float32)
        lengths = torch.tensor([len(t) for t in out["tokens"]])
        ids, mask = truncate_after_eos(ids, stops, pad_token_id)
        mask = mask * (torch.arange(width)[None, :] < lengths[:, None]).long()
        ids = ids.masked_fill(mask == 0, pad_token_id)
        finished = torch.isin(ids, torch.tensor(stops)).any(-1)
        device = prompt_ids.device
        rollout = Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=ids.to(device),
                       response_mask=mask.to(device), rollout_logprobs=(logp * mask).to(device), finished=finished.to(device),
                       decode_steps=width, tokens_generated=int(lengths.sum()), seconds=time.perf_counter() - begin)
        if observers.listening():  # a workbench.watch sees the engine's rollout and settings like the sampler's
            observers.emit("sample", model=None, temperature=temperature, top_k=0, top_p=1.0, stop_ids=stops,
                           stop_at_eos=stop_at_eos, rollout=rollout, engine=self.describe())
        return rollout

    def describe(self) -> dict:
        """What the engine is and how it was started: name, version, dtype loaded, log-prob mode, prefix-cache reset."""
        return {"name": "vllm", "version": self.info.get("vllm"), "dtype": self.info.get("dtype"),
                "logprobs_mode": self.options.logprobs_mode, "reset_prefix_cache": self.options.reset_prefix_cache}
