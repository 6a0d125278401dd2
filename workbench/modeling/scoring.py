"""The training-time forward pass and token log-probabilities.

``forward`` is the one place where a training or scoring forward builds its inputs (the
lm-human-preference-details pattern): the policy, the reference and the critic's body all go
through it, so a switch reaches all three. Its ``position_ids`` switch is pitfall S1:

* ``"mask"`` (fix): positions derived from the attention mask, exactly what ``generate`` does;
* ``"model"`` (bug): only ``input_ids`` and ``attention_mask`` are passed, so the model numbers
  positions 0..T-1 and a left-padded row's positions are shifted by its pad count.

``packed=True`` runs the same rows padding-free (``workbench.core.batching.pack_rows``: sequences
first-fit-decreasing packed into rows of about the longest sequence's length, position ids
restarting per sequence, no mask, no cache; one row under flash-attention) and puts the outputs
back in the padded layout, so callers cannot tell the difference except in speed.

Prompt sharing (``share_prompts``, on by default in the trainers): rows that start with the same
prompt (GRPO's groups, DPO's chosen/rejected pair) are scored in one forward over *prefix-tree*
rows (``prefix_tree``): the prompt once, then every response after it, each response's position
ids continuing from the prompt and a boolean 4-D attention mask letting a response token see the
prompt and its own response only. Every token sees what it sees in its own padded row, at the
same position, so the numbers are the padded forward's up to float noise (~1e-6 on a per-token
log-prob in fp32: other matmul shapes), with fewer tokens through the model: the prompt once, and
each response of ``response_logprobs`` only up to its last real token (the pads after EOS are not
run; its values there are 0). On GRPO's 2 × 8 rollouts of 7-token prompts and ~4-token responses,
~75 tokens instead of ~171; on notebook 05's sums groups (8 responses of up to 48 tokens at τ = 1.6)
rows of 298–335 tokens instead of 412–414. Needs a plain LM-head
model under sdpa attention (``tree_capable``); otherwise the padded forward runs.

Log-probabilities are taken in fp32: logits are upcast *before* they are divided by the sampling
temperature (dividing bf16 logits first rounds them: 0.045 nats at τ = 0.7 on a bf16 model), the
order the sampler uses. Recomputing at τ = 1 what was sampled at τ is pitfall P6.

Memory: ``token_logprobs``/``response_logprobs`` never hold the fp32 (B, T, V) logits. For
architectures whose logits are exactly ``lm_head(hidden)`` (GPT-2, Llama, Qwen2, ...) they run the
transformer body and apply the LM head chunk by chunk (``workbench.core.chunked``), so not even the
model-dtype logits are whole; for the others they take the full forward and upcast chunk by chunk.
``chunk_size`` (rows per chunk) defaults to about 2^24 logits.

Names: ``token_logprobs`` scores every next token of a row (B, T−1); ``response_logprobs`` scores
the response part of prompt+response rows (B, R); ``logprobs_from_logits`` and
``entropy_from_logits`` are the pure maths on logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.core.batching import pack_rows, padding_side_of, position_ids_from_mask, repeated_rows
from workbench.core.chunked import entropy_chunked, head_logprobs_and_entropy, lm_head_of, logprobs_and_entropy
from workbench.core.devices import model_device
from workbench.modeling import inline_body
from workbench.modeling.attention import runs_flash

POSITION_IDS_MODES = ("mask", "model")


def contiguous_rows(attention_mask: torch.Tensor) -> bool:
    """True when every row's real tokens form one block (left, right or both-sides padding)."""
    mask = attention_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    first = torch.where(mask, positions, mask.shape[1]).min(-1).values
    last = torch.where(mask, positions, -1).max(-1).values
    count = mask.sum(-1)
    return bool(((count == 0) | (last - first + 1 == count)).all())


def _last_layer(output) -> torch.Tensor:
    """Logits of a causal LM, or the last hidden state of a bare transformer body (the critic)."""
    logits = getattr(output, "logits", None)
    return logits if logits is not None else output.last_hidden_state


def _pack_capacity(model, lengths: list[int]) -> int:
    """Row length of a packed batch: the longest sequence, or everything in one row under
    flash-attention (its variable-length path needs batch size 1)."""
    return sum(lengths) if runs_flash(model) else max(lengths)


def forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    position_ids: str = "mask",
    packed: bool = False,
) -> torch.Tensor:
    """Run ``model`` on a padded batch without a cache: logits (B, T, V) of a causal LM, or the
    last hidden state (B, T, H) of a transformer body. With ``packed``, values at padded
    positions are 0."""
    if position_ids not in POSITION_IDS_MODES:
        raise ValueError(f"position_ids={position_ids!r}; use 'mask' (fix) or 'model' (the S1 bug)")
    home, device = input_ids.device, model_device(model)  # see workbench.core.devices
    if home != device:  # inputs built on the CPU for a model on a GPU: computed there, handed back here
        return forward(model, input_ids.to(device), attention_mask.to(device), position_ids=position_ids, packed=packed).to(home)
    if packed:
        if not contiguous_rows(attention_mask):
            raise ValueError("packed scoring needs each row's real tokens in one contiguous block")
        mask = attention_mask.bool()
        sequences = [row[m] for row, m in zip(input_ids, mask, strict=False)]
        batch = pack_rows(sequences, _pack_capacity(model, [len(q) for q in sequences]))
        inputs = batch.model_inputs()
        if runs_flash(model):  # the sequence boundaries given, not derived (flash-attn 4 needs int lengths: docs/GPU.md)
            inputs.update(batch.flash_varlen_kwargs())
        values = batch.unpack(_last_layer(model(**inputs)))
        padded = values.new_zeros((*input_ids.shape, values.shape[-1]))
        padded[mask] = values
        return padded
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    if position_ids == "mask":
        inputs["position_ids"] = position_ids_from_mask(attention_mask)
    return _last_layer(model(**inputs))


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                         chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits / temperature)[label] in fp32 (upcast first), without materialising the
    full log-softmax or the fp32 logits (``chunk_size`` rows at a time). Negative labels (e.g.
    -100) are read as token 0: mask them afterwards."""
    return logprobs_and_entropy(logits, labels.to(logits.device), temperature, chunk_size=chunk_size)[0]


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, *, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy (nats) of softmax(logits / temperature) at every position, in fp32 (chunked when
    no gradient is needed)."""
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return entropy_chunked(logits, temperature, chunk_size)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = F.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def _scored(model, input_ids, attention_mask, first: int, *, position_ids, temperature, packed, with_entropy, chunk_size):
    """Log-probs (and entropy) of the targets ``first + 1 .. T−1`` of every row, shape (B, T−1−first)."""
    device = model_device(model)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    labels = input_ids[:, first + 1 :]
    parts = lm_head_of(model)
    if parts is not None:  # the LM head applied chunk by chunk from the last hidden state
        body, head = parts
        hidden = forward(body, input_ids, attention_mask, position_ids=position_ids, packed=packed)[:, first:-1]
        return head_logprobs_and_entropy(hidden, head, labels, temperature, with_entropy=with_entropy, chunk_size=chunk_size)
    logits = forward(model, input_ids, attention_mask, position_ids=position_ids, packed=packed)[:, first:-1]
    return logprobs_and_entropy(logits, labels, temperature, with_entropy=with_entropy, chunk_size=chunk_size)


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    position_ids: str = "mask",
    temperature: float = 1.0,
    packed: bool = False,
    with_entropy: bool = False,
    chunk_size: int | None = None,
):
    """log p(token t | tokens < t) for t = 1..T−1 of every row: shape (B, T−1) (and the entropy,
    which carries no gradient).

    Values at padded targets are meaningless: consumers always select with a mask.
    """
    logprobs, entropy = _scored(model, input_ids, attention_mask, 0, position_ids=position_ids, temperature=temperature,
                                packed=packed, with_entropy=with_entropy, chunk_size=chunk_size)
    home = input_ids.device  # results go back where the inputs were (see workbench.core.devices)
    return (logprobs.to(home), entropy.to(home)) if with_entropy else logprobs.to(home)


# response_logprobs shares token_logprobs' keyword options on purpose (a justified repetition):
# two public entry points, one for whole rows and one for prompt+response.
def response_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    position_ids: str = "mask",
    temperature: float = 1.0,
    with_entropy: bool = False,
    packed: bool = False,
    chunk_size: int | None = None,
    share_prompts: bool = False,
):
    """Per-token log-probs (B, R) of ``response_ids`` given left-padded ``prompt_ids``.

    Returns ``logprobs`` or ``(logprobs, entropy)``. Values at masked response positions are
    meaningless: every consumer selects with ``response_mask``. ``share_prompts``: rows with the
    same prompt (GRPO's groups, a prompt PPO drew twice) run the prompt once, in one prefix-tree forward (see
    ``_scored_shared_prompts``); used only with mask-derived position ids, padded layout, a model in
    eval mode (no dropout) that ``tree_capable`` accepts (LM head, sdpa), response masks without holes, and when a
    prompt repeats.
    """
    home, device = prompt_ids.device, model_device(model)  # see workbench.core.devices
    prompt_ids, prompt_mask, response_ids, response_mask = (t.to(device) for t in (prompt_ids, prompt_mask, response_ids, response_mask))
    shared = None
    if share_prompts and not packed and position_ids == "mask" and not getattr(model, "training", True):
        shared = _scored_shared_prompts(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                                        with_entropy=with_entropy, chunk_size=chunk_size)
    if shared is not None:
        logprobs, entropy = shared
    else:
        logprobs, entropy = _scored(
            model, torch.cat([prompt_ids, response_ids], dim=1), torch.cat([prompt_mask, response_mask], dim=1),
            prompt_ids.shape[1] - 1, position_ids=position_ids, temperature=temperature, packed=packed,
            with_entropy=with_entropy, chunk_size=chunk_size,
        )
    return (logprobs.to(home), entropy.to(home)) if with_entropy else logprobs.to(home)


def _scored_shared_prompts(model, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature, with_entropy, chunk_size):
    """Log-probs of the responses with each distinct prompt run once (GRPO's groups, a prompt PPO drew twice), in ONE
    forward over prefix-tree rows (``prefix_tree``: one row per distinct prompt, the prompt then
    every response sharing it, each cut after its last real token — ``response_extent``: the pads after
    EOS are not run; a quarter of notebook 05's rows). Same maths as the padded forward at every
    real token; float noise differs (other matmul shapes); log-prob and entropy 0 past a row's last real
    token. None when no prompt repeats, ``tree_capable(model)`` is False (e.g. a DDP wrapper) or a response mask has a
    hole (a masked token before the row's last real one): the padded forward leaves such a token out of attention and
    positions, the tree would run it as a real token (the sampler's masks have none)."""
    if not tree_capable(model):
        return None
    kept = response_extent(response_mask)  # each response up to its last real token: what follows EOS is not run
    if response_mask.bool().sum(-1).tolist() != kept:
        return None
    repeated = repeated_rows(torch.cat([prompt_ids, prompt_mask], dim=1))
    if repeated is None:
        return None
    groups = repeated[1]
    prompts = [prompt_ids[g[0]][prompt_mask[g[0]].bool()].tolist() for g in groups]
    responses = response_ids.tolist()
    width = response_ids.shape[1]
    sequences, prompt_lengths = [None] * len(responses), [0] * len(responses)
    for g, prompt in zip(groups, prompts, strict=True):
        for row in g:
            sequences[row], prompt_lengths[row] = prompt + responses[row][: kept[row]], len(prompt)
    tree = prefix_tree(sequences, groups, [len(prompt) for prompt in prompts], prompt_ids.device)
    # the hidden state before response token t sits at sequence position (prompt length − 1 + t); a position past
    # the row's last real token reads the last prompt token's state (any would do) and its values are set to 0
    index = [where[n - 1 : n - 1 + k] + [where[n - 1]] * (width - k) for where, n, k in zip(tree[3], prompt_lengths, kept, strict=True)]
    logprobs, entropy = _tree_scored(model, tree, index, response_ids, temperature, with_entropy, chunk_size)
    if min(kept) == width:
        return logprobs, entropy
    past = torch.arange(width, device=response_ids.device) >= torch.tensor(kept, device=response_ids.device)[:, None]
    return logprobs.masked_fill(past, 0.0), (None if entropy is None else entropy.masked_fill(past, 0.0))


def response_extent(response_mask: torch.Tensor) -> list[int]:
    """Per row, how many response positions reach its last real token (masked-in; a masked hole before it counts
    too): 0 for a row without one. Equal to the row's real tokens exactly when its mask has no hole."""
    if response_mask.shape[-1] == 0:
        return [0] * response_mask.shape[0]
    mask = response_mask.bool()
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return torch.where(mask, positions, 0).max(-1).values.tolist()


def shared_prefix_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, groups: list[list[int]],
                                 prefix_lengths: list[int], *, temperature: float = 1.0, with_entropy: bool = False,
                                 chunk_size: int | None = None):
    """``token_logprobs`` (B, T−1) of right-padded rows of which those in ``groups[g]`` start with
    the same ``prefix_lengths[g]`` tokens (DPO: a pair's chosen and rejected rows share the prompt),
    each shared prefix run once (``prefix_tree``). Same maths as the padded forward, float noise
    apart. None when ``tree_capable(model)`` is False or the rows are not right-padded."""
    if not tree_capable(model) or padding_side_of(attention_mask) not in ("right", "none"):
        return None
    key = (input_ids, input_ids._version, attention_mask, attention_mask._version, repr(groups), repr(prefix_lengths))
    if _last_shared_prefix_tree[0] is not None and _same_key(_last_shared_prefix_tree[0], key):
        tree, index = _last_shared_prefix_tree[1]  # the reference's tree reused by the policy (DPO): the same tensors
    else:
        lengths = attention_mask.sum(-1).tolist()
        sequences = [row[:n] for row, n in zip(input_ids.tolist(), lengths, strict=True)]
        tree = prefix_tree(sequences, groups, prefix_lengths, input_ids.device)
        targets = input_ids.shape[1] - 1  # the hidden state of token t predicts token t + 1 (pad targets: any position)
        index = [where[:targets] + [where[-1]] * (targets - len(where)) for where in tree[3]]
        _last_shared_prefix_tree[:] = [key, (tree, index)]
    logprobs, entropy = _tree_scored(model, tree, index, input_ids[:, 1:], temperature, with_entropy, chunk_size)
    return (logprobs, entropy) if with_entropy else logprobs


# One entry: the last (inputs → prefix tree) of shared_prefix_token_logprobs. DPO scores one batch with the
# reference and then the policy; the tree is a pure function of the token ids, mask, groups and prefix
# lengths, so the second call reuses it. The key holds the input tensors themselves (compared by identity,
# with their in-place version counters), so a freed tensor's id can never be mistaken for a new one.
_last_shared_prefix_tree: list = [None, None]


def _same_key(cached: tuple, key: tuple) -> bool:
    return (cached[0] is key[0] and cached[1] == key[1] and cached[2] is key[2] and cached[3] == key[3]
            and cached[4:] == key[4:])


def tree_capable(model) -> bool:
    """A plain LM-head model (``lm_head_of``) under sdpa attention, which takes a boolean 4-D mask."""
    return lm_head_of(model) is not None and getattr(model.config, "_attn_implementation", None) == "sdpa"


def _tree_scored(model, tree, index, labels, temperature, with_entropy, chunk_size):
    body, head = lm_head_of(model)
    ids, positions, visible, _ = tree
    if inline_body.usable(model):  # the same ops without transformers' per-call Python: bitwise equal
        hidden = inline_body.body_hidden_states(model, ids, visible, positions)
    else:
        hidden = body(input_ids=ids, attention_mask=visible, position_ids=positions, use_cache=False).last_hidden_state
    flat_index = torch.tensor(index, dtype=torch.long, device=ids.device)
    hidden = hidden.reshape(-1, hidden.shape[-1])[flat_index]
    return head_logprobs_and_entropy(hidden, head, labels, temperature, with_entropy=with_entropy, chunk_size=chunk_size)


def prefix_tree(sequences: list[list[int]], groups: list[list[int]], prefix_lengths: list[int], device=None):
    """Sequences that share a prefix laid out as one row per group: ``prefix · suffix₁ · suffix₂ · …``.

    ``groups[g]`` lists the sequences whose first ``prefix_lengths[g]`` tokens are the same (not
    checked). Returns ``(ids, positions, visible, where)``: ``ids``/``positions`` (G, T), the
    prefix at positions 0..L−1 and every suffix continuing from L; ``visible`` (G, 1, T, T) bool,
    query q sees key k ≤ q when k is a prefix token or in q's own suffix (and itself, so the filler
    after the last suffix never has an empty attention row); ``where[i]`` the flat positions in
    (G·T) of sequence i's tokens. Every token of a sequence sees exactly the tokens it sees in a
    padded row of its own, at the same positions."""
    rows = []
    where: list[list[int]] = [[] for _ in sequences]
    for g, (members, n) in enumerate(zip(groups, prefix_lengths, strict=True)):
        ids, positions, segment = list(sequences[members[0]][:n]), list(range(n)), [0] * n
        for j, i in enumerate(members):
            suffix = sequences[i][n:]
            where[i] = list(range(n)) + list(range(len(ids), len(ids) + len(suffix)))
            ids += suffix
            positions += range(n, n + len(suffix))
            segment += [j + 1] * len(suffix)
        rows.append((g, ids, positions, segment))
    length = max(len(r[1]) for r in rows)
    filler = rows[0][1][0]
    for g, ids, positions, segment in rows:
        where_offset = g * length
        for i in groups[g]:
            where[i] = [where_offset + w for w in where[i]]
        tail = length - len(ids)
        ids += [filler] * tail
        positions += [0] * tail
        segment += [-1] * tail
    ids = torch.tensor([r[1] for r in rows], dtype=torch.long, device=device)
    positions = torch.tensor([r[2] for r in rows], dtype=torch.long, device=device)
    segment = torch.tensor([r[3] for r in rows], dtype=torch.long, device=device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    same = (segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])
    visible = (causal & same) | torch.eye(length, dtype=torch.bool, device=device)
    return ids, positions, visible[:, None], where
