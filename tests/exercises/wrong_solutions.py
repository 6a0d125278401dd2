"""Plausible wrong solutions of every exercise, each with a fragment its feedback must contain (naming the mistake)."""

WRONG = {
    "s1_position_ids": {
        "model default": ("def position_ids(attention_mask):\n    B, T = attention_mask.shape\n"
                          "    return torch.arange(T).expand(B, T)\n", "model's default"),
        "off by one": ("def position_ids(attention_mask):\n    return attention_mask.long().cumsum(-1)\n", "off by one"),
        "negative on padding": ("def position_ids(attention_mask):\n    return attention_mask.long().cumsum(-1) - 1\n",
                                "padding positions are −1"),
        "batch dim": ("def position_ids(attention_mask):\n    return (attention_mask.long().cumsum(0) - 1).clamp_min(0)\n",
                      "batch dimension"),
        "float positions": ("def position_ids(attention_mask):\n    return (attention_mask.float().cumsum(-1) - 1).clamp_min(0)\n",
                            "LongTensor"),
    },
    "s2_left_pad": {
        "unchanged": ("def left_pad(input_ids, attention_mask, pad_id):\n    return input_ids, attention_mask\n", "unchanged"),
        "flip": ("def left_pad(input_ids, attention_mask, pad_id):\n    return input_ids.flip(-1), attention_mask.flip(-1)\n",
                 "reversed each row"),
        "mask left behind": (
            "def left_pad(input_ids, attention_mask, pad_id):\n    ids = input_ids.clone()\n"
            "    for r in range(ids.shape[0]):\n        n = int(attention_mask[r].sum())\n"
            "        ids[r] = torch.roll(input_ids[r], ids.shape[1] - n)\n    return ids, attention_mask\n",
            "mask was not moved"),
        "zero padding": (
            "def left_pad(input_ids, attention_mask, pad_id):\n    ids = torch.zeros_like(input_ids)\n"
            "    mask = torch.zeros_like(attention_mask)\n    for r in range(ids.shape[0]):\n"
            "        real = input_ids[r][attention_mask[r].bool()]\n        ids[r, ids.shape[1] - len(real):] = real\n"
            "        mask[r, ids.shape[1] - len(real):] = 1\n    return ids, mask\n", "holds 0, not pad_id"),
    },
    "s3_mask_after_eos": {
        "before eos": ("def mask_after_eos(response_ids, stop_ids):\n    is_stop = torch.isin(response_ids, torch.tensor(stop_ids))\n"
                       "    return (is_stop.long().cumsum(-1) == 0).long()\n", "masking before instead of after EOS"),
        "first id only": ("def mask_after_eos(response_ids, stop_ids):\n    is_stop = response_ids == stop_ids[0]\n"
                          "    return ((is_stop.long().cumsum(-1) - is_stop.long()) == 0).long()\n", "only the first stop id"),
        "argmax": ("def mask_after_eos(response_ids, stop_ids):\n    is_stop = torch.isin(response_ids, torch.tensor(stop_ids))\n"
                   "    first = is_stop.long().argmax(-1)\n"
                   "    return (torch.arange(response_ids.shape[1])[None] <= first[:, None]).long()\n", "argmax of an all-False row"),
    },
    "s3_generate": {
        "no stopping": (
            "def generate(model, input_ids, attention_mask, max_new_tokens, stop_ids):\n    ids, mask = input_ids, attention_mask\n"
            "    for _ in range(max_new_tokens):\n        token = model(input_ids=ids, attention_mask=mask).logits[:, -1].argmax(-1)\n"
            "        ids = torch.cat([ids, token[:, None]], 1)\n        mask = torch.cat([mask, torch.ones_like(token)[:, None]], 1)\n"
            "    return ids\n", "no EOS stopping"),
        "stop on any row": (
            "def generate(model, input_ids, attention_mask, max_new_tokens, stop_ids):\n    ids, mask = input_ids, attention_mask\n"
            "    for _ in range(max_new_tokens):\n        token = model(input_ids=ids, attention_mask=mask).logits[:, -1].argmax(-1)\n"
            "        ids = torch.cat([ids, token[:, None]], 1)\n        mask = torch.cat([mask, torch.ones_like(token)[:, None]], 1)\n"
            "        if torch.isin(token, torch.tensor(stop_ids)).any():\n            break\n    return ids\n",
            "first row finishes"),
        "no padding after stop": (
            "def generate(model, input_ids, attention_mask, max_new_tokens, stop_ids):\n    ids, mask = input_ids, attention_mask\n"
            "    done = torch.zeros(ids.shape[0], dtype=torch.bool)\n    for _ in range(max_new_tokens):\n"
            "        token = model(input_ids=ids, attention_mask=mask).logits[:, -1].argmax(-1)\n"
            "        ids = torch.cat([ids, token[:, None]], 1)\n        mask = torch.cat([mask, torch.ones_like(token)[:, None]], 1)\n"
            "        done |= torch.isin(token, torch.tensor(stop_ids))\n        if done.all():\n            break\n    return ids\n",
            "keep generating"),
        "first stop id only": (
            "def generate(model, input_ids, attention_mask, max_new_tokens, stop_ids):\n    ids, mask = input_ids, attention_mask\n"
            "    done = torch.zeros(ids.shape[0], dtype=torch.bool)\n    for _ in range(max_new_tokens):\n"
            "        token = model(input_ids=ids, attention_mask=mask).logits[:, -1].argmax(-1)\n"
            "        token = torch.where(done, torch.zeros_like(token), token)\n"
            "        ids = torch.cat([ids, token[:, None]], 1)\n        mask = torch.cat([mask, (~done).long()[:, None]], 1)\n"
            "        done |= token == stop_ids[0]\n        if done.all():\n            break\n    return ids\n",
            "only the first stop id"),
    },
    "s4_dpo_logps": {
        "zip over B": (
            "def dpo_logps(token_logps, attention_mask, prompt_lengths):\n    mask = attention_mask[:, 1:].clone().float()\n"
            "    for m, p in zip(mask, prompt_lengths):\n        m[: p - 1] = 0\n    return (token_logps * mask).sum(-1)\n",
            "rejected rows are counted"),
        "no prompt mask": ("def dpo_logps(token_logps, attention_mask, prompt_lengths):\n"
                           "    return (token_logps * attention_mask[:, 1:]).sum(-1)\n", "no prompt masking"),
        "off by one": (
            "def dpo_logps(token_logps, attention_mask, prompt_lengths):\n    mask = attention_mask[:, 1:].clone().float()\n"
            "    for r in range(mask.shape[0]):\n        mask[r, : prompt_lengths[r % len(prompt_lengths)]] = 0\n"
            "    return (token_logps * mask).sum(-1)\n", "off by one"),
        "mean": (
            "def dpo_logps(token_logps, attention_mask, prompt_lengths):\n    mask = attention_mask[:, 1:].clone().float()\n"
            "    for r in range(mask.shape[0]):\n        mask[r, : prompt_lengths[r % len(prompt_lengths)] - 1] = 0\n"
            "    return (token_logps * mask).sum(-1) / mask.sum(-1)\n", "you average over the response tokens"),
    },
    "s5_grpo_loss": {
        "token mean": ("def grpo_loss(per_token_loss, mask):\n    return (per_token_loss * mask).sum() / mask.sum()\n",
                       "token-mean"),
        "over padding": ("def grpo_loss(per_token_loss, mask):\n    return per_token_loss.mean()\n", "normalising over padding"),
        "divide by T": ("def grpo_loss(per_token_loss, mask):\n    return ((per_token_loss * mask).sum(-1) / mask.shape[1]).mean()\n",
                        "divides by a constant"),
        "nan on empty row": ("def grpo_loss(per_token_loss, mask):\n"
                             "    return ((per_token_loss * mask).sum(-1) / mask.sum(-1)).mean()\n", "0/0 on the empty row"),
    },
    "p6_logprobs": {
        "no temperature": ("def logprobs(logits, ids, temperature):\n"
                           "    return torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).squeeze(-1)\n", "no temperature"),
        "no upcast": ("def logprobs(logits, ids, temperature):\n"
                      "    return torch.log_softmax(logits / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)\n", "no upcast"),
        "multiply": ("def logprobs(logits, ids, temperature):\n"
                     "    return torch.log_softmax(logits.float() * temperature, -1).gather(-1, ids[..., None]).squeeze(-1)\n",
                     "multiply the logits by τ"),
        "probabilities": ("def logprobs(logits, ids, temperature):\n"
                          "    return torch.softmax(logits.float() / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)\n",
                          "probabilities"),
    },
    "p9_k3": {
        "sign error": ("def k3(logp, ref_logp):\n    r = logp - ref_logp\n    return torch.exp(r) - r - 1\n", "sign error"),
        "k1": ("def k3(logp, ref_logp):\n    return logp - ref_logp\n", "this is k1"),
        "no clamp": ("def k3(logp, ref_logp):\n    r = ref_logp - logp\n    return (torch.expm1(r) - r).clamp_min(0)\n",
                     "not finite for a large gap"),
        "naive rounding": ("def k3(logp, ref_logp):\n    r = (ref_logp - logp).clamp(-20, 20)\n    return torch.exp(r) - r - 1\n",
                           "rounding"),
    },
    "p13_whiten": {
        "over padding": ("def whiten(values, mask):\n    return (values - values.mean()) / (values.std() + 1e-8)\n",
                         "whitening over padding"),
        "per row": ("def whiten(values, mask):\n    n = mask.sum(-1, keepdim=True)\n"
                    "    mean = (values * mask).sum(-1, keepdim=True) / n\n"
                    "    var = (((values - mean) * mask) ** 2).sum(-1, keepdim=True) / n\n"
                    "    return (values - mean) / (var + 1e-8).sqrt()\n",
                    "per-row statistics"),
        "B·T denominator": ("def whiten(values, mask):\n    mean = (values * mask).sum() / mask.numel()\n"
                            "    var = (((values - mean) * mask) ** 2).sum() / mask.numel()\n"
                            "    return (values - mean) / (var + 1e-8).sqrt() * mask\n", "B·T positions"),
        "no eps": ("def whiten(values, mask):\n    m = mask.bool()\n    mean = values[m].mean()\n    std = values[m].std()\n"
                   "    return torch.where(m, (values - mean) / std, torch.zeros_like(values))\n", "add eps inside the square root"),
    },
}
