"""The PPO critic: a copy of the policy's transformer body with a scalar value head.

As in OpenRLHF, the critic is a separate model initialised from the policy (so it starts with
useful features) whose value for response token t is read from the hidden state *before* that
token — the state in which the action was taken. Its body runs through ``workbench.modeling.scoring.forward``,
the same forward as the policy's, so the S1 switch and packing reach the value baseline too.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from workbench.core.devices import model_device
from workbench.modeling.scoring import forward


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
    def from_policy(cls, policy, seed: int = 0) -> ValueModel:
        body = copy.deepcopy(policy.base_model)
        hidden = policy.config.hidden_size if hasattr(policy.config, "hidden_size") else policy.config.n_embd
        parameter = next(policy.parameters())
        critic = cls(body, hidden, seed).to(device=parameter.device, dtype=parameter.dtype)
        critic.value_head.float()
        return critic

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, position_ids: str = "mask", packed: bool = False
    ) -> torch.Tensor:
        """A value (B, T) for every position (meaningless at padded positions: select with the mask)."""
        home, device = input_ids.device, model_device(self)  # computed on the critic's device, handed back (workbench.core.devices)
        if home != device:
            return self.forward(input_ids.to(device), attention_mask.to(device), position_ids=position_ids, packed=packed).to(home)
        hidden = forward(self.body, input_ids, attention_mask, position_ids=position_ids, packed=packed)
        # the head's own dtype: fp32 as built, bf16 once precision="bf16" has converted the whole critic
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def response_values(
        self, prompt_ids, prompt_mask, response_ids, response_mask, *, position_ids: str = "mask", packed: bool = False
    ) -> torch.Tensor:
        """V(s_t) for each response token t: read at the position just before it, shape (B, R)."""
        values = self.forward(
            torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1),
            position_ids=position_ids, packed=packed,
        )
        return values[:, prompt_ids.shape[1] - 1 : -1]
