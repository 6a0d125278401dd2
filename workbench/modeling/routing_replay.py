"""Record the top-k expert choices of a mixture-of-experts model, and replay recorded choices in another forward.

A sparse MoE layer scores every token with a linear router, keeps the top-k experts and weights their outputs. A rollout
engine and a trainer that run the same weights in different precisions (bf16 vs fp32), kernels or batch layouts can pick
different experts for the same token wherever two router probabilities nearly tie (pitfall P30). Rollout routing replay
(R3; Megatron-LM ``moe_enable_routing_replay``, PR #4256; slime PR #387; NeMo-RL PR #2590) records the engine's expert
*indices* and forces them in the training forward. Only the discrete choice is replayed: the weights of the chosen experts
are recomputed from the trainer's own router logits (its softmax taken at the replayed experts, renormalised over them when
the model renormalises its top-k), so the router still gets a gradient and the current weights still count.

This module does that with forward hooks on the router modules, not with a copy of any model's code. It supports the
router contract of transformers 5's sparse-MoE models (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE, ...): a module with integer
``top_k`` and ``num_experts`` and a ``(num_experts, hidden)`` ``weight``, whose ``forward(hidden)`` over the (tokens,
hidden) flattened batch returns ``(router_logits, top_k_weights, top_k_index)``, the weights being the softmax of the
logits at the top-k experts, renormalised or not. Anything else (sigmoid scores, grouped routing, a router that returns
other things) is a ``ValueError`` naming the model type, raised before a wrong number is produced.

The recorded routes of a forward are ``{router name: (tokens, top_k) expert indices}`` in the order the router saw the
tokens (the padded batch flattened row by row): a replay must run over the same batch layout, or it is refused.
"""

from __future__ import annotations

import torch

ROUTE_MODES = ("record", "replay")
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
SUPPORTED = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")  # routers of this contract in transformers 5.23 (tested: mixtral, qwen2_moe)


def _describe(model) -> str:
    config = getattr(model, "config", None)
    return f"{type(model).__name__} (model_type {getattr(config, 'model_type', '?')!r})"


def declared_experts(model) -> int:
    """The expert count the model's config declares (0 for a dense model)."""
    config = getattr(model, "config", None)
    return max([int(getattr(config, f, 0) or 0) for f in EXPERT_COUNT_FIELDS] + [0])


def is_topk_router(module) -> bool:
    """True for a module with the router contract's attributes: integer ``top_k`` and ``num_experts`` and a weight
    of shape (num_experts, hidden)."""
    top_k, experts, weight = getattr(module, "top_k", None), getattr(module, "num_experts", None), getattr(module, "weight", None)
    return (isinstance(top_k, int) and isinstance(experts, int) and isinstance(weight, torch.nn.Parameter)
            and weight.dim() == 2 and weight.shape[0] == experts and 0 < top_k <= experts)


def moe_routers(model) -> dict[str, torch.nn.Module]:
    """``{name: router module}`` of every sparse-MoE layer, in forward order; a clear error for a dense model or an MoE
    whose routers this module cannot hook."""
    routers = {name: module for name, module in model.named_modules() if is_topk_router(module)}
    if routers:
        return routers
    experts = declared_experts(model)
    if experts:
        raise ValueError(f"{_describe(model)} declares {experts} experts, but none of its modules is a top-k router this replay "
                         "can hook (integer top_k and num_experts, a (num_experts, hidden) weight, forward → (router_logits, "
                         f"top_k_weights, top_k_index)); supported model types: {', '.join(SUPPORTED)}")
    raise ValueError(f"{_describe(model)} is a dense model: it has no mixture-of-experts router to record or replay; "
                     f"load an MoE checkpoint (e.g. the built-in tiny-qwen2moe, or a local {'/'.join(SUPPORTED)} folder)")


def _check_output(model, name: str, module, output) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ok = isinstance(output, tuple) and len(output) == 3 and all(isinstance(t, torch.Tensor) for t in output)
    if ok:
        logits, weights, index = output
        ok = (index.dtype == torch.long and index.dim() == 2 and index.shape[1] == module.top_k
              and logits.shape == (index.shape[0], module.num_experts) and weights.shape == index.shape)
    if not ok:
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in
                  (output if isinstance(output, tuple) else (output,))]
        raise ValueError(f"router {name} ({type(module).__name__}) of {_describe(model)} returned {shapes}, not (router_logits "
                         f"(tokens, {module.num_experts}), top_k_weights (tokens, {module.top_k}), top_k_index (tokens, "
                         f"{module.top_k})): its routing cannot be replayed here; supported model types: {', '.join(SUPPORTED)}")
    return output


def renormalises(model, name: str, module, logits: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the router's own top-k weights are its softmax at the chosen experts renormalised over them (True) or
    the plain softmax there (False), read off its own output; anything else is an error (another gating rule)."""
    chosen = torch.softmax(logits.float(), -1).gather(-1, index)
    tolerance = 1e-2 if weights.dtype in (torch.bfloat16, torch.float16) else 1e-4
    for renormalised, expected in ((True, chosen / chosen.sum(-1, keepdim=True)), (False, chosen)):
        if torch.allclose(weights.float(), expected, atol=tolerance, rtol=tolerance):
            return renormalised
    raise ValueError(f"router {name} ({type(module).__name__}) of {_describe(model)} weights its experts by neither the softmax "
                     "of its logits at the top-k nor that softmax renormalised: a gating rule (e.g. sigmoid scores, grouped "
                     f"routing) this replay does not reproduce; supported model types: {', '.join(SUPPORTED)}")


class RoutingHooks:
    """Context manager over one or more forwards of ``model``: ``mode="record"`` keeps each router's top-k indices
    (``routes``), logits (``logits``) and whether it renormalises; ``mode="replay"`` forces ``routes`` (a recording of
    the same batch layout, e.g. from the rollout engine) and recomputes the chosen experts' weights from the model's own
    router logits, keeping what the router chose by itself in ``own_routes`` and what it passed on in ``routes``.

    A router called more than once inside the block (several forwards) keeps its last call; use one block per forward.
    """

    def __init__(self, model, mode: str = "record", routes: dict[str, torch.Tensor] | None = None):
        if mode not in ROUTE_MODES:
            raise ValueError(f"mode={mode!r}; use one of {ROUTE_MODES} ('replay' is rollout routing replay, R3)")
        if mode == "replay" and routes is None:
            raise ValueError("mode='replay' needs routes: the {router name: (tokens, top_k) indices} a recording block kept")
        self.model, self.mode = model, mode
        self.routers = moe_routers(model)
        if mode == "replay":
            missing = sorted(set(self.routers) - set(routes))
            if missing:
                raise ValueError(f"the recorded routes have no entry for router(s) {missing} of {_describe(model)}: record them "
                                 "with the same architecture (every MoE layer)")
        self.replayed = routes
        self.routes: dict[str, torch.Tensor] = {}
        self.own_routes: dict[str, torch.Tensor] = {}
        self.logits: dict[str, torch.Tensor] = {}
        self.renormalised: dict[str, bool] = {}
        self._handles: list = []

    def __enter__(self) -> RoutingHooks:
        for name, module in self.routers.items():
            self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, name: str):
        def hook(module, args, output):
            logits, weights, index = _check_output(self.model, name, module, output)
            self.logits[name] = logits.detach().float()
            self.renormalised[name] = renormalises(self.model, name, module, logits.detach(), weights.detach(), index)
            self.own_routes[name] = index.detach().clone()
            if self.mode == "record":
                self.routes[name] = index.detach().clone()
                return None
            forced = self.replayed[name].to(index.device)
            if forced.shape != index.shape:
                raise ValueError(f"router {name}: the recorded routes hold {tuple(forced.shape)} (tokens, top_k) but this forward "
                                 f"routes {tuple(index.shape)}: replay over the same batch layout as the recording (same rows, "
                                 "padding and length)")
            chosen = torch.softmax(logits.float(), -1).gather(-1, forced)  # the trainer's own probabilities, differentiable
            if self.renormalised[name]:
                chosen = chosen / chosen.sum(-1, keepdim=True)
            self.routes[name] = forced.clone()
            return logits, chosen.to(weights.dtype), forced

        return hook


def route_disagreement(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor],
                       token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(tokens, layers) boolean: True where the two recordings chose a different *set* of top-k experts for a token
    (the order of the k is ignored), over the tokens ``token_mask`` (flattened like the router's input) keeps."""
    names = list(first)
    if set(names) != set(second):
        raise ValueError(f"the two recordings route different layers: {sorted(set(names) ^ set(second))}")
    differ = torch.stack([(first[n].sort(-1).values != second[n].sort(-1).values).any(-1) for n in names], -1)
    return differ if token_mask is None else differ[token_mask.reshape(-1).bool().to(differ.device)]


def topk_margin(logits: dict[str, torch.Tensor], top_k: dict[str, int]) -> torch.Tensor:
    """(tokens, layers): the router probability of the k-th expert minus that of the (k+1)-th, per layer — how close
    the choice is to a tie, and so how little rounding it takes to flip it."""
    margins = []
    for name, value in logits.items():
        probs = torch.softmax(value.float(), -1).topk(top_k[name] + 1, -1).values
        margins.append(probs[:, -2] - probs[:, -1])
    return torch.stack(margins, -1)
