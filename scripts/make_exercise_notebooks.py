# ruff: noqa: E501  (the exercise texts are long string literals)
"""Write the exercise notebooks ``notebooks/exercises/NN_<exercise>.ipynb`` from the exercises' definitions.

Each notebook: the pitfall in a paragraph with a link to its lesson, the tagged ``parameters`` cell, the stub
(``raise NotImplementedError``; nbgrader solution cell), the grading cell (nbgrader autograder cell whose last
expression is the score in points: nbgrader reads it as partial credit) and a "going further" question.
Run it after changing an exercise's text: ``python scripts/make_exercise_notebooks.py``.

``--nbgrader-source DIR``: the teacher's nbgrader source notebooks instead (``nbgrader_source``): the same notebooks
with the reference solution inside nbgrader's solution delimiters, from which ``nbgrader generate_assignment``
writes the stubs handed out.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import nbformat

from workbench.exercises import EXERCISES, solution_source

OUT = Path(__file__).resolve().parents[1] / "notebooks" / "exercises"
POINTS = 1

TEXT = {
    "s1_position_ids": (
        "A left-padded row's first real token sits at column = its pad count. A model with learned absolute positions "
        "(GPT-2) that gets the default positions 0..T−1 sees every token of that row shifted, so the same text scores "
        "differently padded and alone: the trainer's log-probs disagree with the sampler's.",
        "def position_ids(attention_mask):\n    \"\"\"attention_mask: Tensor[B, T] (1 = real token, 0 = padding, on either side).\n\n"
        "    Return a LongTensor[B, T]: the position of each real token among the real tokens of its row (the first one\n"
        "    at 0); padding positions may hold any valid embedding index (≥ 0).\n    \"\"\"\n",
        "Rotary models (Llama, Qwen2) are insensitive to a constant position shift. Which shift would still change "
        "their logits, and when does a trainer produce one?"),
    "s2_left_pad": (
        "Batched generation appends the next token in the last column. With right padding, a short row's last real "
        "token is not there: the model continues after pad tokens, and flash-attention paths that assume left padding "
        "compute the wrong thing.",
        "def left_pad(input_ids, attention_mask, pad_id):\n    \"\"\"input_ids, attention_mask: Tensor[B, T], right-padded. pad_id: int.\n\n"
        "    Return (input_ids, attention_mask) left-padded: each row's real tokens, in order, end in the last column;\n"
        "    padding slots hold pad_id with mask 0.\n    \"\"\"\n",
        "Training forwards often prefer right padding (packing, flash-attention varlen). Where in an RLHF step must the "
        "batch switch sides, and what must move with it besides the ids and the mask?"),
    "s3_mask_after_eos": (
        "The loss mask of sampled responses keeps every token up to and including the first stop token. Masking the "
        "stop token itself means the policy is never trained on the action that ends a response; a response without a "
        "stop token (truncated) keeps all its tokens.",
        "def mask_after_eos(response_ids, stop_ids):\n    \"\"\"response_ids: LongTensor[B, R]. stop_ids: list[int] (e.g. [eos_id, im_end_id]).\n\n"
        "    Return a Tensor[B, R] of 0/1: 1 up to and including the first stop id of each row, 0 after it.\n    \"\"\"\n",
        "A pad id equal to the EOS id (pitfall P8) breaks `ids != pad` masks. Does it break yours? Which input would show it?"),
    "s3_generate": (
        "A decoding loop without stopping runs every batch to max_new_tokens; one that stops when the first row "
        "finishes cuts the others; one that lets finished rows keep sampling produces tokens after the stop that a "
        "loss mask must then remove.",
        "def generate(model, input_ids, attention_mask, max_new_tokens, stop_ids):\n    \"\"\"model: a Hugging Face causal LM. input_ids, attention_mask: Tensor[B, T], left-padded.\n"
        "    max_new_tokens: int. stop_ids: list[int].\n\n    Greedy decoding (argmax of the last position's logits, one model forward per step). Return\n"
        "    LongTensor[B, T + R]: the prompt followed by the response. Stop once every row has produced a stop id;\n"
        "    after its stop, a row continues with model.config.pad_token_id.\n    \"\"\"\n",
        "With a KV cache the loop's cost per step is constant. What does your loop cost per step without one, and "
        "what must a cached loop pass to the model besides the new token?"),
    "s4_dpo_logps": (
        "DPO batches concatenate [chosen; rejected]: 2B rows for B prompts. A zip of the 2B mask rows with the B "
        "prompt lengths masks the prompts of the chosen half only (the OpenRLHF bug): the rejected rows' log-probs "
        "include their prompt, and the margin is off by the prompt's log-prob.",
        "def dpo_logps(token_logps, attention_mask, prompt_lengths):\n    \"\"\"token_logps: Tensor[2B, T-1], token_logps[r, t] = log p of token t+1 of row r.\n"
        "    attention_mask: Tensor[2B, T], right-padded; rows 0..B-1 prompt+chosen, rows B..2B-1 prompt+rejected.\n"
        "    prompt_lengths: list[int] of length B (tokens of each pair's prompt).\n\n"
        "    Return Tensor[2B]: each row's sum of log-probs over its response tokens.\n    \"\"\"\n",
        "Both halves share their prompts, so the prompt's log-prob cancels in the reward margin — when? Which change of "
        "the policy between the chosen and rejected forward breaks the cancellation?"),
    "s5_grpo_loss": (
        "The GRPO paper averages each response's per-token loss over its own length, then over responses: every "
        "response weighs 1/B. A token-mean over the batch gives a response of length L weight L/ΣL, so long responses "
        "dominate the gradient.",
        "def grpo_loss(per_token_loss, mask):\n    \"\"\"per_token_loss: Tensor[B, T]. mask: Tensor[B, T] (1 = response token, 0 = padding).\n\n"
        "    Return the scalar loss of the GRPO paper: mean over each row's real tokens, then mean over rows.\n"
        "    A row without real tokens must not turn the loss into NaN.\n    \"\"\"\n",
        "Dr. GRPO argues that the per-sequence mean biases the policy towards long wrong answers. Write the weight "
        "each token gets under both, and say which responses each favours."),
    "p6_logprobs": (
        "Tokens sampled at temperature τ come from softmax(logits / τ). A trainer that recomputes log-probs from "
        "softmax(logits) scores another distribution: the importance ratio is not 1 even before the first update. In "
        "bf16 the division by τ itself rounds, unless the logits are upcast first.",
        "def logprobs(logits, ids, temperature):\n    \"\"\"logits: Tensor[B, T, V] (any float dtype). ids: LongTensor[B, T]; logits[:, t] scores ids[:, t].\n"
        "    temperature: float.\n\n    Return Tensor[B, T] (float32): log softmax(logits / temperature) at ids.\n    \"\"\"\n",
        "Top-p and top-k sampling also change the sampling distribution. Should the trainer's log-probs include them? "
        "What breaks either way?"),
    "p9_k3": (
        "The KL penalty of GRPO uses k3 = exp(r) − r − 1 with r = log π_ref − log π per token: unbiased for "
        "KL(π‖π_ref), never negative. A sign error estimates the other direction; a naive float32 formula rounds below 0 "
        "for tiny gaps and overflows for huge ones.",
        "def k3(logp, ref_logp):\n    \"\"\"logp, ref_logp: Tensor[B, T], log-probs of the sampled tokens under the policy and the reference.\n\n"
        "    Return Tensor[B, T]: the k3 estimate exp(r) - r - 1 with r = ref_logp - logp; >= 0, exactly 0 where they are\n"
        "    equal, finite for any gap.\n    \"\"\"\n",
        "k3 is unbiased for the value of the KL, but what is the gradient of the mean k3 with respect to the policy? "
        "Is it the gradient of the KL?"),
    "p13_whiten": (
        "PPO whitens advantages over the real tokens of the batch. Statistics taken over a padded tensor include the "
        "padding's values: the real tokens' advantages shift with how much padding the batch happens to have.",
        "def whiten(values, mask):\n    \"\"\"values: Tensor[B, T]. mask: Tensor[B, T] (1 = real token, 0 = padding; padding may hold anything).\n\n"
        "    Return Tensor[B, T]: (values - mean) / sqrt(var + eps) with mean and variance over the real tokens of the\n"
        "    whole batch; finite everywhere.\n    \"\"\"\n",
        "Rewards are often whitened too, but without subtracting the mean. Why keep the mean there, and what would "
        "centring do to a batch whose rewards are all positive?"),
}


def notebook(name: str) -> nbformat.NotebookNode:
    ex = EXERCISES[name]
    why, stub, further = TEXT[name]
    lesson = f"../{ex.lesson}.ipynb"
    intro = (f"# Exercise {name.split('_')[0].upper()} · `{ex.function}`: {ex.summary}\n\n{why}\n\n"
             f"The lesson: [{ex.lesson}]({lesson}). Write `{ex.signature}` in the cell below, run it, then run the grading "
             "cell: it runs your function on crafted inputs in a separate process and names the mistake when your code "
             "implements a known wrong convention.")
    nbgrader = {"schema_version": 3, "locked": False, "solution": True, "grade": False, "task": False,
                "grade_id": f"{name}_solution"}
    grade_meta = {"schema_version": 3, "locked": True, "solution": False, "grade": True, "task": False,
                  "grade_id": f"{name}_grade", "points": POINTS}
    grading = (f"from workbench.exercises import grade\n\nresult = grade({name!r}, {ex.function}, time_limit_s=time_limit_s)\n"
               "print(result.feedback)\nif show_figure:\n    result.plot()\n"
               f"result.score * {POINTS}  # nbgrader reads this number as partial credit")
    cells = [
        nbformat.v4.new_markdown_cell(intro),
        nbformat.v4.new_code_cell("time_limit_s = 10.0\nshow_figure = True", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("import torch  # noqa: F401 (your function will use it)\n\n\n" + stub + "    # YOUR CODE HERE\n    raise NotImplementedError",
                                  metadata={"tags": ["solution"], "nbgrader": nbgrader}),
        nbformat.v4.new_markdown_cell("## Grade it\n\nEvery case is worth the same; the score is the fraction of cases passed."),
        nbformat.v4.new_code_cell(grading, metadata={"tags": ["grade"], "nbgrader": grade_meta}),
        nbformat.v4.new_markdown_cell(f"## Going further\n\n{further}"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["workbench"] = {"exercise": name, "lesson": ex.lesson, "function": ex.function, "points": POINTS}
    return nb


STUB_CELL = 2  # the index of the stub (nbgrader solution) cell


def nbgrader_source(name: str) -> nbformat.NotebookNode:
    """The exercise's nbgrader *source* notebook (the teacher's copy, never handed out): the stub cell holds the
    reference solution's body between nbgrader's ``### BEGIN SOLUTION`` / ``### END SOLUTION`` delimiters, so that
    ``nbgrader generate_assignment`` writes the stub handed out (the ``def`` and its docstring, then ``# YOUR CODE
    HERE`` / ``raise NotImplementedError()``). Without delimiters nbgrader would replace the whole cell, ``def`` included."""
    nb = notebook(name)
    ex = EXERCISES[name]
    solution = solution_source(name)
    tree = ast.parse(solution)
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == ex.function)
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    lines = solution.splitlines()
    stub = nb.cells[STUB_CELL].source
    head = stub[: stub.index("    # YOUR CODE HERE")]
    nb.cells[STUB_CELL].source = (head + "    ### BEGIN SOLUTION\n" + "\n".join(lines[body[0].lineno - 1: fn.end_lineno])
                                  + "\n    ### END SOLUTION")
    return nb


def path_of(name: str, folder: Path = OUT) -> Path:
    return folder / f"{EXERCISES[name].lesson[:2]}_{name}.ipynb"


def write(nb: nbformat.NotebookNode, name: str, path: Path) -> None:
    for i, cell in enumerate(nb.cells):
        cell.id = f"{name.replace('_', '-')}-{i}"
    nbformat.write(nb, path)
    print(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nbgrader-source", metavar="DIR", type=Path,
                        help="write the nbgrader source notebooks (with the solutions) into DIR, e.g. "
                             "course/source/rlhf_exercises, instead of the stubs into notebooks/exercises/")
    args = parser.parse_args(argv)
    folder = args.nbgrader_source or OUT
    if folder.resolve() == OUT.resolve() and args.nbgrader_source:
        parser.error(f"--nbgrader-source {folder}: that is the folder handed out; name the nbgrader course's source folder")
    folder.mkdir(parents=True, exist_ok=True)
    for name in EXERCISES:
        write(nbgrader_source(name) if args.nbgrader_source else notebook(name), name, path_of(name, folder))


if __name__ == "__main__":
    main()
