"""The engine side: vLLM running in the engine environment's interpreter, driven by JSON lines.

Run as ``<engine env>/bin/python -m workbench.engines.server`` with this repository on ``PYTHONPATH`` (by
``workbench.engines.sampler.EngineSampler``). It reads one JSON request per line on stdin and writes one JSON answer
per line on the file descriptor that was stdout; everything vLLM and its libraries print goes to stderr (fd 1 is
pointed at fd 2 first). Weights travel as safetensors files in a private folder the host made, never pickles.
Imports only the standard library, torch, safetensors and vLLM (the engine environment's own).

Requests (``{"cmd": ...}``), each answered ``{"ok": true, ...}`` or ``{"ok": false, "error": "<type>: <message>"}``:

* ``start``: ``model`` (a Hugging Face folder), ``dtype`` (``float32``/``bfloat16``/``auto``), ``logprobs_mode``,
  ``prefix_caching``, ``seed``, ``max_model_len``, ``max_num_seqs`` → the dtype the engine loaded, its version, seconds;
* ``generate``: ``prompts`` (token-id lists), ``temperature``, ``max_tokens``, ``stop_token_ids``, ``ignore_eos``,
  ``seeds`` (one per prompt) → ``tokens``, ``logprobs`` (of each sampled token, as the engine returns them),
  ``finish`` (``stop``/``length``), ``cached`` (prompt tokens served from the prefix cache), seconds;
* ``update``: ``path`` (a safetensors file of Hugging Face names), ``via`` (``reload_weights``: the engine's reload
  path; ``load_weights``: ``model.load_weights``, the path TRL's colocate mode syncs through; ``trl_sync``: TRL 1.16's
  own ``VLLMGeneration.sync_weights``), ``reset_prefix_cache``
  → seconds, whether the cache was reset;
* ``reset_prefix_cache`` → whether it was; ``stop`` → ends the process.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

ANSWERS = None  # the file the answers go to (the original stdout)
STATE: dict = {}


def answer(payload: dict) -> None:
    ANSWERS.write(json.dumps(payload) + "\n")
    ANSWERS.flush()


def start(request: dict) -> dict:
    from vllm import LLM  # vllm: the engine environment only
    from vllm import __version__ as vllm_version

    begin = time.perf_counter()
    llm = LLM(model=request["model"], dtype=request.get("dtype", "float32"), seed=int(request.get("seed", 0)),
              enable_prefix_caching=bool(request.get("prefix_caching", True)),
              logprobs_mode=request.get("logprobs_mode", "processed_logprobs"), skip_tokenizer_init=True,
              max_model_len=int(request.get("max_model_len", 256)), max_num_seqs=int(request.get("max_num_seqs", 64)),
              generation_config="vllm", enforce_eager=True)
    STATE["llm"] = llm
    config = llm.llm_engine.model_config
    return {"dtype": str(config.dtype).replace("torch.", ""), "vllm": vllm_version,
            "logprobs_mode": str(getattr(config, "logprobs_mode", request.get("logprobs_mode"))),
            "prefix_caching": bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching),
            "seconds": time.perf_counter() - begin}


def generate(request: dict) -> dict:
    from vllm import SamplingParams  # vllm: the engine environment only
    from vllm.inputs import TokensPrompt

    llm = STATE["llm"]
    prompts = [TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in request["prompts"]]
    seeds = request.get("seeds") or [None] * len(prompts)
    params = [SamplingParams(temperature=float(request["temperature"]), max_tokens=int(request["max_tokens"]),
                             logprobs=0, stop_token_ids=list(request.get("stop_token_ids", [])),
                             ignore_eos=bool(request.get("ignore_eos", False)), seed=seed, detokenize=False,
                             top_p=float(request.get("top_p", 1.0)), top_k=int(request.get("top_k", -1)))
              for seed in seeds]
    begin = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - begin
    tokens, logprobs, finish, cached = [], [], [], []
    for out in outputs:
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        tokens.append(ids)
        logprobs.append([float(step[token].logprob) for token, step in zip(ids, completion.logprobs or [], strict=True)])
        finish.append(str(completion.finish_reason))
        cached.append(int(out.num_cached_tokens or 0))
    return {"tokens": tokens, "logprobs": logprobs, "finish": finish, "cached": cached, "seconds": seconds}


def update(request: dict) -> dict:
    from safetensors.torch import load_file  # safetensors: the weight files the host writes

    llm = STATE["llm"]
    begin = time.perf_counter()
    weights = load_file(request["path"])
    via = request.get("via", "reload_weights")
    if via == "reload_weights":
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})
    elif via == "load_weights":  # the model's own loader, what TRL's colocate mode calls
        model_runner().model.load_weights(weights.items())
    elif via == "trl_sync":  # TRL 1.16's own colocate sync, VLLMGeneration.sync_weights, on this engine
        trl_sync_weights(llm, weights)
    else:
        raise ValueError(f"update via {via!r}: use 'reload_weights', 'load_weights' or 'trl_sync'")
    reset = bool(request.get("reset_prefix_cache", True))
    if reset:
        llm.reset_prefix_cache()
    return {"seconds": time.perf_counter() - begin, "reset": reset}


def model_runner():
    """The in-process worker's model runner (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine lives in this process)."""
    worker = STATE["llm"].llm_engine.model_executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


def trl_sync_weights(llm, weights: dict) -> None:
    """TRL 1.16's ``VLLMGeneration.sync_weights`` in colocate mode, its own code, on this engine: the instance it runs
    on carries only what that method reads (mode, sleep mode off, the engine, the named parameters of a plain model)."""
    from types import SimpleNamespace

    from trl.generation.vllm_generation import VLLMGeneration  # trl: the engine environment's TRL 1.16

    owner = SimpleNamespace(mode="colocate", enable_sleep_mode=False, accelerator=None, llm=llm,
                            _iter_named_params=lambda: iter(weights.items()))
    VLLMGeneration.sync_weights(owner)


def reset_prefix_cache(request: dict) -> dict:
    return {"reset": bool(STATE["llm"].reset_prefix_cache())}


COMMANDS = {"start": start, "generate": generate, "update": update, "reset_prefix_cache": reset_prefix_cache}


def main() -> int:
    global ANSWERS
    ANSWERS = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's and its libraries' prints go to stderr, never into the answers
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("cmd") == "stop":
            answer({"ok": True})
            break
        try:
            answer({"ok": True, **COMMANDS[request["cmd"]](request)})
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the host, which raises it there
            answer({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
