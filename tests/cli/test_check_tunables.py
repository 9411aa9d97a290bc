"""``kerngen check`` on a spec whose source redefines a tunable: one line, exit 1, before the GPU;
and with ``--compile-all`` no configuration is admissible (each would be the same kernel)."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_check_cli import GELU, GELU_SHAPE, SOURCE, check, gelu_spec, write
from tests.cli_output import stderr_of


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))


def test_a_redefined_tunable_fails_in_one_line(tmp_path):
    spec = write(tmp_path, gelu_spec(source="// defaults\n#define BLOCK 256 /* threads */\n" + SOURCE))
    res = check(str(spec), GELU, "--shape", GELU_SHAPE)
    err = stderr_of(res).strip()
    assert res.exit_code == 1 and len(err.splitlines()) == 1, res.output + err
    assert err == ("error: compile: tunable BLOCK is redefined in the source at line 2 (#define BLOCK 256): each "
                   "configuration's -DBLOCK=value would be ignored; guard it with #ifndef BLOCK")
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--compile-all", "--json")
    data = json.loads(res.output)
    assert res.exit_code == 1 and data["stage"] == "compile" and data["configs"]["admissible"] == 0


def test_the_guarded_default_passes(tmp_path):
    spec = write(tmp_path, gelu_spec(source="#ifndef BLOCK\n#define BLOCK 256\n#endif\n" + SOURCE))
    res = check(str(spec), GELU, "--shape", GELU_SHAPE, "--compile-all", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["configs"]["admissible"] == 3
