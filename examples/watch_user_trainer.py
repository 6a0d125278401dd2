"""A trainer written the way a user writes one (a dict batch of strings, its own names, ``step()`` returning
scalars) with four planted bugs, each switchable, to show ``workbench.watch`` finding them from one ``with``
line — no adapters. Run: ``python examples/watch_user_trainer.py [--fixed]`` (a plain script), under
``python -m workbench watch -- python examples/watch_user_trainer.py``, or with ``--with-watch`` (in-process).

Planted bugs (``PLANTED``): S1 the loss forward passes no position_ids on a left-padded batch of a GPT-2
(learned absolute positions); S3 ``generate`` without an EOS id; P7 sampling with the model in train mode and
dropout 0.1; P6 sampling at temperature 0.4 and scoring raw logits.
"""

from __future__ import annotations

import torch

PLANTED = ("S1", "S3", "P7", "P6")


class LittleGRPO:
    """REINFORCE with group-mean baselines on strings; ``buggy=False`` is the same trainer fixed."""

    def __init__(self, model, tokenizer, buggy: bool = True, temperature: float = 0.4, lr: float = 1e-3):
        self.net, self.tok, self.buggy, self.temp = model, tokenizer, buggy, temperature
        self.tok.padding_side = "left"
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def _rollouts(self, texts: list[str], n: int):
        enc = self.tok([t for t in texts for _ in range(n)], return_tensors="pt", padding=True)
        if self.buggy:
            self.net.train()  # P7: dropout stays on while sampling
        else:
            self.net.eval()
        out = self.net.generate(**enc, do_sample=True, temperature=self.temp, top_k=0, max_new_tokens=8,
                                eos_token_id=None if self.buggy else self.tok.eos_token_id,  # S3
                                pad_token_id=self.tok.pad_token_id)
        return enc, out[:, enc["input_ids"].shape[1]:]

    def step(self, batch: dict) -> dict:
        enc, completions = self._rollouts(batch["prompts"], batch.get("n", 4))
        ids = torch.cat([enc["input_ids"], completions], 1)
        mask = torch.cat([enc["attention_mask"], torch.ones_like(completions)], 1)
        self.net.train()
        if self.buggy:
            logits = self.net(input_ids=ids, attention_mask=mask).logits  # S1: no position_ids
        else:
            self.net.eval()
            logits = self.net(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        scale = 1.0 if self.buggy else self.temp  # P6: raw logits scored
        start = enc["input_ids"].shape[1]
        logp = (logits[:, start - 1:-1].float() / scale).log_softmax(-1).gather(-1, completions[..., None])[..., 0]
        reward = torch.tensor([float(len(set(c.tolist()))) for c in completions])
        advantage = reward - reward.view(-1, batch.get("n", 4)).mean(-1).repeat_interleave(batch.get("n", 4))
        loss = -(advantage[:, None] * logp).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"loss": float(loss.detach()), "reward": float(reward.mean())}


def tiny_gpt2_with_dropout():
    """A small GPT-2 (dropout 0.1 as GPT-2 ships) and its tokenizer, from the workbench's tiny models."""
    from workbench.modeling.tiny import tiny_model  # the workbench builds the model; the trainer above is plain HF

    return tiny_model("gpt2", seed=1, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)


def main(argv=None) -> dict:
    """A plain training script: ``python examples/watch_user_trainer.py [--fixed] [--steps N] [--with-watch]``.
    Without ``--with-watch`` nothing here knows about the workbench's watch: run it under
    ``python -m workbench watch -- python examples/watch_user_trainer.py`` to watch it from outside."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="the same trainer with its four bugs fixed")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--with-watch", action="store_true", help="watch in-process with one `with` line and print the report")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, tok = tiny_gpt2_with_dropout()
    trainer = LittleGRPO(model, tok, buggy=not args.fixed)
    batch = {"prompts": ["1+2=", "12+34="], "n": 4}
    if args.with_watch:
        from workbench import watch

        with watch(model, tokenizer=tok, deep=True) as w:
            logs = [trainer.step(batch) for _ in range(args.steps)]
        print(w.report())
    else:
        logs = [trainer.step(batch) for _ in range(args.steps)]
    print("fixed" if args.fixed else "buggy", logs[-1])
    return logs[-1]


if __name__ == "__main__":
    main()
