"""The static decoder's step with fixed shapes, captured once per batch as a CUDA graph.

Why: on a GPU, a decode step of a small or mid-sized model is bound by kernel launches, not by
its matmuls: dozens of kernel launches per layer (norms, projections, rotary, cache writes,
attention, MLP), each microseconds of CPU time, for one token per row, and Qwen2.5-0.5B has 24
layers. A CUDA graph records the step's kernels once and replays them with one launch. ``StaticDecoder``'s step cannot be captured as it
is: it attends over a slice of the cache that grows by one column per token, so every step has
other shapes.

``GraphedDecoder`` changes that and nothing else:

* the step's column (where the token's key and value go) is a 0-dim tensor on the device, and
  the graph advances it itself;
* the rotary cos/sin of the step are picked with ``index_select`` on that tensor, and the key and
  value written with ``index_copy_`` — the same values ``StaticDecoder`` slices;
* attention covers the **whole** preallocated buffer (prompt + every future position) under a
  boolean mask that keeps the prompt's real tokens and the columns written so far. The other
  columns hold zeros (never uninitialised memory: a NaN there would poison a masked softmax).

So the step computes the same attention as ``StaticDecoder``'s, over more columns whose weights
are exactly zero: a masked reduction over a longer row, which a kernel may sum in another order
or with another algorithm (an unpadded batch goes from sdpa without a mask to sdpa with one).
Its logits therefore agree with the plain path's within float noise, not bitwise — a different
computation, behind its own switch (``sample(cuda_graph=True)``, ``RolloutConfig.cuda_graph``,
off by default). Tolerance tested on the CPU (the captured code runs there eagerly:
``capture=False``) and, where a GPU is present, the replayed graph against the eager step
(``tests/modeling/test_graphed_decode.py``; current figures in ``docs/GPU.md``, runs in ``docs/journal/``).

Capture happens once per ``sample`` call (the buffers belong to the batch): two warm-up steps on
a side stream, then the recording, both undone (the column reset; the warm-up's keys and values
sit in masked columns until the real steps overwrite them). Entering ``torch.cuda.graph``
synchronises the device and empties the caching allocator's free blocks, once per call. Sampling,
the stop check and the ``NonFiniteError`` check stay outside the graph, as in every other path.
Under CUDA autocast (``precision="bf16-mixed"``) the static decoder runs instead (``capturable``).
"""

from __future__ import annotations

import torch

from workbench.modeling.decode import StaticDecoder, cache_columns_mask

WARMUP_STEPS = 2  # eager steps on a side stream before recording (PyTorch's advice: kernels chosen, workspaces allocated)


def capturable(model) -> bool:
    """True when ``GraphedDecoder`` can record its step as a CUDA graph for ``model``: on a CUDA device, and outside
    CUDA autocast (``precision="bf16-mixed"``). Under autocast the recorded step would read autocast's cached bf16
    copies of the weights, valid only while that cache lives; PyTorch's ``make_graphed_callables`` refuses that
    cache (``cache_enabled=False`` required), and no graph under autocast has been run on a GPU here — so that case takes the
    static decoder. fp32 and pure bf16 (``precision="bf16"``) were measured (docs/journal/2026-11-27.md, fourth lease)."""
    return model.lm_head.weight.device.type == "cuda" and not torch.is_autocast_enabled("cuda")


class GraphedDecoder(StaticDecoder):
    """``StaticDecoder`` whose step has fixed shapes (see module doc); ``capture`` (default: on CUDA) records it
    as a CUDA graph and replays it per token, otherwise the same fixed-shape step runs eagerly."""

    def __init__(self, model, prompt_ids, prompt_mask, position_ids, max_new_tokens: int, share_prefill: bool = False,
                 capture: bool | None = None):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: a graphed decoder needs at least one decode step "
                             "(sample() uses the static decoder when only one token is sampled)")
        super().__init__(model, prompt_ids, prompt_mask, position_ids, max_new_tokens, share_prefill=share_prefill)
        device = self.embedding.device
        for *_, keys, values in self.layers:  # the future columns: zeros, not whatever new_empty left there
            keys[:, :, self.prompt_len :].zero_()
            values[:, :, self.prompt_len :].zero_()
        self._allowed = cache_columns_mask(prompt_mask, max_new_tokens)  # cut at the step's column by _fixed_step
        self._columns = torch.arange(self.prompt_len + max_new_tokens, device=device)
        self._column = torch.full((), self.prompt_len, dtype=torch.long, device=device)
        self._token = torch.zeros(prompt_mask.shape[0], dtype=torch.long, device=device)
        self._graph, self._logits = None, None
        if capture is None:
            capture = device.type == "cuda"
        if capture:
            self._capture()

    def _capture(self) -> None:
        with torch.cuda.device(self.embedding.device):  # streams and graph on the model's GPU, not the current one
            self._record()

    def _record(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self._column.fill_(self.prompt_len)  # always the first column: in range whatever max_new_tokens is
                self._fixed_step()
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits = self._fixed_step()
        self._column.fill_(self.prompt_len)  # the warm-up steps advanced it

    def _step(self, token: torch.Tensor) -> torch.Tensor:
        self.step_index += 1
        self._token.copy_(token)
        if self._graph is None:
            return self._fixed_step()
        self._graph.replay()
        return self._logits.clone()  # the graph's output buffer is overwritten by the next replay

    def _fixed_step(self) -> torch.Tensor:
        """One decode step on fixed shapes: the token in ``self._token``, its column in ``self._column`` (then advanced)."""
        column = self._column.view(1)
        offset = column - self.prompt_len
        cos, sin = self.cos.index_select(1, offset)[:, None], self.sin.index_select(1, offset)[:, None]
        logits = self._layers(self._token, cos, sin, self._allowed & (self._columns <= column), column)
        self._column.add_(1)
        return logits

    @staticmethod
    def _store(buffer: torch.Tensor, new: torch.Tensor, column: torch.Tensor) -> None:
        """Write at the column a (1,) device tensor names: no host value, so the graph replays it at every step."""
        buffer.index_copy_(2, column, new)

    @staticmethod
    def _visible(buffer: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        """The whole buffer, whatever the column: fixed shapes; the mask hides the columns not yet written."""
        return buffer
