"""agent/llm/answers.py: reading a model's answer (bare JSON, fenced JSON, JSONC, JSON5, YAML, code block +
plan), the kind of every error, and the lenient spec and expression forms models write."""

from __future__ import annotations

import json
import time

import pytest

from kerngen import expr
from kerngen.agent.llm.answers import AnswerError, AnswerProblem, IdeaList, parse_answer
from kerngen.errors import ExprError
from kerngen.expr import TensorFacts
from kerngen.harness.spec.spec import KernelSpec
from tests.fakes.llm_server import SOFTMAX_CUDA, softmax_spec_dict

IDEAS = {"ideas": [{"text": "fuse passes", "category": "compute"}, {"text": "float4", "category": "memory_access"}]}


def test_bare_json():
    ideas = parse_answer(json.dumps(IDEAS), IdeaList)
    assert [i.category.value for i in ideas.ideas] == ["compute", "memory_access"]


def test_fenced_json_in_free_text_and_think_block():
    text = "<think>{\"ideas\": 3}</think>Sure! Here they are:\n```json\n" + json.dumps(IDEAS, indent=2) + "\n```\nHope it helps."
    assert len(parse_answer(text, IdeaList).ideas) == 2


def test_unlabelled_fence_and_embedded_object():
    assert parse_answer("```\n" + json.dumps(IDEAS) + "\n```", IdeaList).ideas
    assert parse_answer("The answer is " + json.dumps(IDEAS) + " as asked.", IdeaList).ideas


def test_list_is_wrapped_for_a_single_list_model():
    assert len(parse_answer(json.dumps(IDEAS["ideas"]), IdeaList).ideas) == 2


def test_spec_with_raw_newlines_in_source():
    raw = json.dumps(softmax_spec_dict()).replace("\\n", "\n")  # models often forget to escape
    spec = parse_answer(raw, KernelSpec)
    assert "softmax_rows" in spec.source


def test_cuda_block_plus_launch_plan():
    plan = softmax_spec_dict()
    plan["source"] = "see the cuda block above"
    text = f"Kernel:\n```cuda\n{SOFTMAX_CUDA}```\nPlan:\n```json\n{json.dumps(plan)}\n```"
    spec = parse_answer(text, KernelSpec)
    assert spec.source.strip() == SOFTMAX_CUDA.strip()
    assert spec.steps[0].kernel == "softmax_rows"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "empty answer"),
        ("I cannot do that.", "no JSON found"),
        ("```json\n{\"ideas\": [\n```", "invalid JSON in the answer: the JSON ends at line 2 with 2 brackets"),
        ("```json\n{\"ideas\": [}\n```", "invalid JSON in the answer"),
        ('{"ideas": [{"text": "x", "category": "magic"}]}', "not a valid IdeaList: ideas.0.category"),
    ],
)
def test_errors_are_one_clear_line(text, needle):
    with pytest.raises(AnswerError) as info:
        parse_answer(text, IdeaList)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert info.value.text == text


def test_invalid_spec_names_the_field():
    data = softmax_spec_dict()
    del data["steps"]
    with pytest.raises(AnswerError, match=r"not a valid KernelSpec: steps: Field required"):
        parse_answer(json.dumps(data), KernelSpec)
    data = softmax_spec_dict()
    data["steps"][0]["grid"] = ["x.shape[0] +"]
    with pytest.raises(AnswerError, match="not a valid KernelSpec"):
        parse_answer(json.dumps(data), KernelSpec)


# ----- what models really write ----------------------------------------------------------------
def _kind(text: str, model=KernelSpec) -> AnswerProblem:
    with pytest.raises(AnswerError) as info:
        parse_answer(text, model)
    assert "\n" not in str(info.value)
    return info.value.kind


def _spec_json(**over) -> str:
    return json.dumps({**softmax_spec_dict(), **over}, indent=2)


def test_json_with_comments_and_trailing_commas():
    text = _spec_json().replace('"tunables"', '// sizes to try\n  "tunables"', 1)
    text = text.replace('"steps": [', '/* one launch,\n a block per row */ "steps": [', 1)
    text = text.replace("1024\n    ]", "1024,\n    ],").replace('"x.shape[1]"\n        }', '"x.shape[1]"\n        },')
    for answer in (text, f"Here:\n```json\n{text}\n```\n", f"The spec is {text} as asked."):
        spec = parse_answer(answer, KernelSpec)
        assert spec.tunables == {"BLOCK": [128, 256, 512, 1024]} and spec.steps[0].kernel == "softmax_rows"
    # a comment's quote or bracket does not upset the scan, and // inside a string is kept
    odd = _spec_json(description="a // b /* c */").replace('"tunables"', '// "}]\n  "tunables"', 1)
    assert parse_answer(odd, KernelSpec).description == "a // b /* c */"


def test_cuda_block_with_a_commented_json_plan():
    plan = softmax_spec_dict()
    del plan["source"]
    body = json.dumps(plan, indent=2).replace('"steps"', '// the launch plan\n  "steps"').replace("]\n}", "],\n}")
    spec = parse_answer(f"```cuda\n{SOFTMAX_CUDA}```\n\n```json\n{body}\n```", KernelSpec)
    assert spec.source.strip() == SOFTMAX_CUDA.strip()


def test_json5_unquoted_keys_and_single_quotes():
    text = ("{name: 'k', source: 'extern \"C\" __global__ void k(float* out) {}', "
            "steps: [{kernel: 'k', grid: [1], block: [32], args: [{name: 'out'}]}]}")
    assert parse_answer(text, KernelSpec).steps[0].kernel == "k"


def test_yaml_block_bare_yaml_and_cuda_block_with_yaml_plan():
    yaml_spec = ("name: y\nsource: |\n  extern \"C\" __global__ void k(float* out) { }\n"
                 "tunables:\n  BLOCK: [128, 256]\nsteps:\n  - kernel: k\n    grid: x.shape[0]\n"
                 "    block: [BLOCK]\n    shared_mem: BLOCK * sizeof(float)\n    args: [{name: out}]\n")
    for answer in (f"Here it is in YAML:\n```yaml\n{yaml_spec}```\n", yaml_spec, f"---\n# spec\n{yaml_spec}"):
        spec = parse_answer(answer, KernelSpec)
        assert spec.steps[0].grid == ["x.shape[0]"] and spec.tunables == {"BLOCK": [128, 256]}
    plan = ("```cuda\n" + SOFTMAX_CUDA + "```\n"
            "```yml\nsteps:\n  - {kernel: softmax_rows, grid: [rows], block: [256]}\n```")
    assert parse_answer(plan, KernelSpec).source.strip() == SOFTMAX_CUDA.strip()


def test_prose_is_not_taken_for_yaml():
    assert _kind("Note: use one block per row.\nAlso: subtract the max first.") is AnswerProblem.no_json


@pytest.mark.parametrize(
    "text,needle",
    [
        ("name: &a x\nsource: *a\nsteps: []\n", "aliases (*name) are not accepted"),
        ("```yaml\nsteps: [\n```", "invalid YAML in the answer"),
        ("steps: " + "[" * 5000 + "]" * 5000, "invalid YAML"),
        ("steps:\n  - value: " + "9" * 5000 + "\n", "invalid YAML in the answer: Exceeds the limit (4300 digits)"),
        ("source: |\n" + "  x\n" * 40_000, "at most 64,000 are read"),
    ],
    ids=["alias", "unclosed", "deep", "digits", "large"],
)
def test_hostile_yaml_is_an_answer_error(text, needle):
    t0 = time.perf_counter()
    with pytest.raises(AnswerError) as info:
        parse_answer(text, KernelSpec)
    assert time.perf_counter() - t0 < 2.0
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_many_yaml_blocks_are_bounded():
    text = "```yaml\nsource: x\n```\n" * 5000
    t0 = time.perf_counter()
    with pytest.raises(AnswerError):
        parse_answer(text, KernelSpec)
    assert time.perf_counter() - t0 < 2.0


def test_unescaped_code_in_the_source_string():
    broken = _spec_json().replace('\\"C\\"', '"C"')
    with pytest.raises(AnswerError) as info:
        parse_answer(broken, KernelSpec)
    msg = str(info.value)
    assert info.value.kind is AnswerProblem.invalid_json
    assert ("the JSON string `source` is broken at line 4 col" in msg and "unescaped" in msg
            and "put the code in a ```cuda block and leave `source` out of the JSON" in msg)
    # with the code in a cuda block as well, the broken member is dropped and the block used
    spec = parse_answer(f"```cuda\n{SOFTMAX_CUDA}```\n```json\n{broken}\n```", KernelSpec)
    assert spec.source.strip() == SOFTMAX_CUDA.strip() and spec.tunables["BLOCK"] == [128, 256, 512, 1024]


def test_an_invalid_escape_in_the_source_is_named_not_rewritten():
    """JSON5 would read C's '\\0' as a NUL byte: the string is reported broken instead."""
    text = _spec_json(source="X").replace('"X"', '"extern \\"C\\" __global__ void k(char* s) { s[0] = \'\\0\'; }"')
    with pytest.raises(AnswerError, match="the JSON string `source` is broken at line 4"):
        parse_answer(text, KernelSpec)


def test_line_numbers_count_the_answer_lines():
    broken = _spec_json().replace('\\"C\\"', '"C"')
    with pytest.raises(AnswerError, match="broken at line 8 col"):  # prose on line 3, the fence on 4
        parse_answer(f"\n\nSome prose.\n```json\n{broken}\n```", KernelSpec)


@pytest.mark.parametrize(
    "text,needle",
    [
        (_spec_json()[:600], "it ends at line 4 inside a string"),
        (_spec_json()[:_spec_json().index('"args"')], "it ends at line 24 with 3 brackets still open"),
        ("Here you go:\n```json\n" + _spec_json()[:-40], "cut off mid-JSON"),
        ("Here you go: " + _spec_json()[:-40], "cut off mid-JSON"),  # not a fragment inside it
        ("```cuda\n" + SOFTMAX_CUDA[:300], "cut off inside its ```cuda block"),
        ('{"name": "x", /* a comment', "inside a /* comment"),
    ],
    ids=["in a string", "in the steps", "fenced", "embedded", "code block", "comment"],
)
def test_a_cut_off_answer_says_so(text, needle):
    with pytest.raises(AnswerError) as info:
        parse_answer(text, KernelSpec)
    assert needle in str(info.value) and "Field required" not in str(info.value)
    assert info.value.kind is AnswerProblem.truncated


@pytest.mark.parametrize(
    "text,kind",
    [
        ("", AnswerProblem.empty),
        ("  \n ", AnswerProblem.empty),
        ("<think>only this</think>", AnswerProblem.empty),
        ("Use one block per row.", AnswerProblem.no_json),
        ('{"name": "x" "source": "y"}', AnswerProblem.invalid_json),
        (_spec_json()[:-40], AnswerProblem.truncated),
        ("```json\n" + _spec_json()[:-40] + "\n```\nThat's it.", AnswerProblem.invalid_json),  # closed: not cut off
        ('{"name": "x"}', AnswerProblem.not_valid),
        ("I'm sorry, but I can't help with that.", AnswerProblem.refused),
        ("I can\u2019t assist with that request.", AnswerProblem.refused),
    ],
)
def test_every_error_has_a_kind(text, kind):
    assert _kind(text) is kind


def test_answer_error_signature_kind_and_pickling():
    import pickle

    plain = AnswerError("why\nsecond line", "the text")  # how the client builds one
    assert plain.kind is AnswerProblem.not_valid and plain.text == "the text" and str(plain) == "why second line"
    cut = AnswerError("cut", "t", kind="truncated")
    assert cut.kind is AnswerProblem.truncated and cut.kind == "truncated"
    again = pickle.loads(pickle.dumps(cut))
    assert (str(again), again.text, again.kind) == ("cut", "t", AnswerProblem.truncated)


def test_wrong_field_names_are_named_with_the_fields_there_are():
    data = softmax_spec_dict()
    data["launch"] = data.pop("steps")
    with pytest.raises(AnswerError) as info:
        parse_answer(json.dumps(data), KernelSpec)
    msg = str(info.value)
    assert "steps: Field required" in msg and "launch: unknown field (KernelSpec has: name," in msg


def test_lenient_spec_forms():
    data = softmax_spec_dict()
    data["tunables"] = {"BLOCK": ["128", "2*128", 512.0]}
    data["defaults"] = {"BLOCK": "256"}
    data["steps"][0]["grid"] = "x.shape[0]"
    data["steps"][0]["block"] = "BLOCK"
    data["steps"][0]["shared_mem"] = "BLOCK * sizeof(float)"
    spec = parse_answer(json.dumps(data), KernelSpec)
    assert spec.tunables == {"BLOCK": [128, 256, 512]} and spec.defaults == {"BLOCK": 256}
    assert spec.steps[0].grid == ["x.shape[0]"] and spec.steps[0].block == ["BLOCK"]
    data["tunables"] = {"BLOCK": 256}
    data["defaults"] = {}
    assert parse_answer(json.dumps(data), KernelSpec).tunables == {"BLOCK": [256]}
    data["tunables"] = {"BLOCK": {"values": [128, 256], "default": 256}}
    spec = parse_answer(json.dumps(data), KernelSpec)
    assert spec.tunables == {"BLOCK": [128, 256]} and spec.defaults == {"BLOCK": 256}


@pytest.mark.parametrize(
    "tunables,defaults,grid,needle",
    [
        ({"BLOCK": ["256 threads"]}, {}, ["rows"], "tunables.BLOCK: values must be integers"),
        ({"BLOCK": ["BLOCK * 2"]}, {}, ["rows"], "got 'BLOCK * 2'"),
        ({"BLOCK": [True]}, {}, ["rows"], "tunables.BLOCK: values must be integers, got True"),
        ({"BLOCK": [1.5]}, {}, ["rows"], "got 1.5"),
        ({"BLOCK": [{"v": 1}]}, {}, ["rows"], "got a dict"),
        ({"BLOCK": [256]}, {"BLOCK": "big"}, ["rows"], "defaults.BLOCK: a default must be an integer"),
        ({"BLOCK": [256]}, {}, ["ceildiv(rows, 1)"], "steps.0.grid.0: unknown function 'ceildiv'"),
        ({"BLOCK": [256]}, {}, "(rows, 1)", "steps.0.grid.0: Tuple is not allowed"),
    ],
)
def test_spec_rejections_name_the_field_and_the_cause(tunables, defaults, grid, needle):
    data = softmax_spec_dict()
    data["tunables"], data["defaults"] = tunables, defaults
    data["steps"][0]["grid"] = grid
    with pytest.raises(AnswerError) as info:
        parse_answer(json.dumps(data), KernelSpec)
    assert needle in str(info.value) and info.value.kind is AnswerProblem.not_valid


# ----- expressions models write: ceil, floor, sizeof -------------------------------------------
def test_ceil_floor_and_sizeof_in_expressions():
    env = {"N": 4097, "BLOCK": 256, "x": TensorFacts((3, 2**60 + 1))}
    assert expr.evaluate_int("ceil(N / 256)", env) == 17
    assert expr.evaluate_int("floor(N / 256)", env) == 16
    assert expr.evaluate_int("ceil(-7 / 2)", {}) == -3 and expr.evaluate_int("floor(-7 / 2)", {}) == -4
    assert expr.evaluate_int("ceil(x.shape[1] / 2)", env) == 2**59 + 1  # exact, not through a float
    assert expr.evaluate_int("ceil(2.5)", {}) == 3 and expr.evaluate_int("floor(2.5)", {}) == 2
    assert expr.evaluate_int("BLOCK * sizeof(float)", env) == 1024
    sizes = {"double": 8, "half": 2, "__half": 2, "bfloat16": 2, "__nv_bfloat16": 2, "int": 4, "unsigned": 4,
             "unsigned int": 4, "int64_t": 8, "long long": 8, "unsigned long long": 8, "float2": 8,
             "float4": 16, "int4": 16, "char": 1, "short": 2, "const float": 4, "float *": 8, "__half2": 4}
    for name, size in sizes.items():
        assert expr.evaluate_int(f"sizeof( {name} )", {}) == size, name
    assert expr.names_in("BLOCK * sizeof(__nv_bfloat16)") == {"BLOCK"}


@pytest.mark.parametrize(
    "text,needle",
    [
        ("ceil(1e300 * 1e10)", "not a finite number"),
        ("ceil(1e100)", "out of range"),
        ("floor(2**255 * 4 / 1)", "out of range"),
        ("ceil(N / 0)", "by zero"),
        ("sizeof(T) * 4", "unknown type 'T' in sizeof"),
        ("sizeof(float", "cannot parse"),
        ("sizeof(" + "int " * 300 + ")", "unknown type"),
        ("sizeof(" * 250, "cannot parse"),
        ("ceildiv(N, 2)", "unknown function 'ceildiv' in 'ceildiv(N, 2)' (allowed: cdiv, ceil_div"),
        ("math.ceil(N)", "unknown function 'math.ceil'"),
        ("nobody + 1", "unknown name 'nobody' in expression 'nobody + 1' (known names: N)"),
    ],
)
def test_expression_errors_name_what_is_allowed(text, needle):
    t0 = time.perf_counter()
    with pytest.raises(ExprError) as info:
        expr.evaluate(text, {"N": 8})
    assert time.perf_counter() - t0 < 1.0
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_unknown_name_lists_a_bounded_number_of_names():
    env = {f"n{i:03d}": i for i in range(500)}
    with pytest.raises(ExprError) as info:
        expr.evaluate("nobody", env)
    msg = str(info.value)
    assert "n000" in msg and "(500 in all)" in msg and len(msg) < 400
    with pytest.raises(ExprError, match="no names are bound here"):
        expr.evaluate("rows", {})
