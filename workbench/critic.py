"""The PPO critic: a copy of the policy's transformer body with a scalar value head.

As in OpenRLHF, the critic is a separate model initialised from the policy (so it starts with
useful features) whose value for response token t is read from the hidden state *before* that
token — the state in which the action was taken. Its forward builds position ids exactly like
``workbench.scoring.forward``, so the S1 switch reaches the value baseline too.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from workbench.batching import pack_sequences, position_ids_from_mask


class ValueModel(nn.Module):
    def __init__(self, body: nn.Module, hidden_size: int, seed: int = 0):
        super().__init__()
        self.body = body
        self.value_head = nn.Linear(hidden_size, 1)
        # Seeded explicitly: the critic must not depend on whatever used the global RNG before.
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            nn.init.normal_(self.value_head.weight, std=1.0 / (hidden_size + 1), generator=generator)
            nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy, seed: int = 0) -> "ValueModel":
        body = copy.deepcopy(policy.base_model)
        hidden = policy.config.hidden_size if hasattr(policy.config, "hidden_size") else policy.config.n_embd
        critic = cls(body, hidden, seed).to(next(policy.parameters()).dtype)
        critic.value_head.float()
        return critic

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, position_ids: str = "mask", packed: bool = False
    ) -> torch.Tensor:
        """A value (B, T) for every position (0 at padding when ``packed``)."""
        if packed:
            mask = attention_mask.bool()
            batch = pack_sequences([row[m] for row, m in zip(input_ids, mask)])
            hidden = self.body(**batch.model_inputs()).last_hidden_state[0]
            values = self.value_head(hidden.float()).squeeze(-1)
            return torch.zeros(input_ids.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        if position_ids == "mask":
            inputs["position_ids"] = position_ids_from_mask(attention_mask)
        hidden = self.body(**inputs).last_hidden_state
        return self.value_head(hidden.float()).squeeze(-1)

    def response_values(
        self, prompt_ids, prompt_mask, response_ids, response_mask, *, position_ids: str = "mask", packed: bool = False
    ) -> torch.Tensor:
        """V(s_t) for each response token t: read at the position just before it, shape (B, R)."""
        values = self.forward(
            torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1),
            position_ids=position_ids, packed=packed,
        )
        return values[:, prompt_ids.shape[1] - 1 : -1]
