"""Bad input, caught before anything runs: every defect of a ``--data`` file is ``error: FILE:LINE: problem. fix``
with exit code 2 and nothing written to ``--output-dir``, for prompts, preference pairs and SFT data alike."""

import json

import pytest

from workbench.cli.main import main
from workbench.core.errors import InputError
from workbench.tasks import load_preferences, load_problems, read_jsonl

# trainer → (a good row, the keys its rows need)
KINDS = {
    "grpo": ({"prompt": "12+7=", "answer": "19"}, ("prompt", "answer")),
    "sft": ({"prompt": "12+7=", "answer": "19"}, ("prompt", "answer")),
    "dpo": ({"prompt": "12+7=", "chosen": "19", "rejected": "18"}, ("prompt", "chosen", "rejected")),
}


def _lines(good: dict, bad_line: str) -> bytes:
    """A good row, a blank line, then the bad line: the bad one is line 3 of the file."""
    return (json.dumps(good) + "\n\n" + bad_line + "\n" + json.dumps(good) + "\n").encode()


def _without(good: dict, key: str) -> str:
    return json.dumps({k: v for k, v in good.items() if k != key})


CASES = {
    # case → (file bytes from the good row, line named, words the message must hold)
    "malformed": (lambda good: _lines(good, '{"prompt": "1+1=" "answer": "2"}'), 3, ("not valid JSON", "one JSON object")),
    "not an object": (lambda good: _lines(good, '["12+7=", "19"]'), 3, ("not an object",)),
    "missing key": (lambda good: _lines(good, _without(good, list(good)[-1])), 3, ("lacks", "keys found: 'prompt'")),
    "wrong type": (lambda good: _lines(good, json.dumps({**good, "prompt": 12})), 3, ("'prompt' must be a string, not the int 12",)),
    "not utf-8": (lambda good: _lines(good, '{"prompt": "\xff"}').replace("\xff".encode(), b"\xff"), 3, ("not UTF-8", "0xff")),
    "empty": (lambda good: b"\n\n", None, ("empty",)),
}


@pytest.mark.parametrize("trainer", sorted(KINDS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_file_exits_2_naming_file_line_and_fix(trainer, case, tmp_path, capsys):
    good, keys = KINDS[trainer]
    make, line, words = CASES[case]
    data = tmp_path / "data.jsonl"
    data.write_bytes(make(good))
    out = tmp_path / "out"
    assert main(["train", trainer, "--data", str(data), "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert f"{data}:{line}:" in err if line else f"{data}:" in err
    for word in words:
        assert word in err
    if case in ("missing key", "wrong type", "empty", "malformed"):
        assert ", ".join(keys) in err  # the fix names the keys a row of this kind needs
    assert not out.exists()  # the data is read before the output folder is made


def test_missing_data_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main(["train", "sft", "--data", str(missing), "--output-dir", str(tmp_path / "out"), "--quiet"]) == 2
    assert f"{missing}: the data file is missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_readers_count_blank_lines_and_accept_good_files(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('\n{"prompt": "1+1=", "answer": "2"}\r\n\n{"prompt": "2+2=", "answer": "4", "extra": 1}\n')
    assert [p.answer for p in load_problems(path)] == ["2", "4"]
    assert len(read_jsonl(path)) == 2
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n\n\n{"prompt": "2+2="}\n')
    with pytest.raises(InputError, match=r"p\.jsonl:5: the row lacks 'answer'"):
        load_problems(path)
    pairs = tmp_path / "d.jsonl"
    pairs.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n')
    assert load_preferences(pairs)[0]["rejected"] == "3"
    with pytest.raises(InputError, match=r"d\.jsonl:1: the row lacks 'answer'"):
        load_problems(pairs)  # a preference file given where prompts are expected
