"""agent/llm/answers.py: reading a model's answer (bare JSON, fenced JSON, code block + plan)."""

from __future__ import annotations

import json

import pytest

from kerngen.agent.llm.answers import AnswerError, IdeaList, parse_answer
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
        ("```json\n{\"ideas\": [\n```", "invalid JSON in the answer"),
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
