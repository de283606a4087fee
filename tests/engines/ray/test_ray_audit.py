"""The Ray engine on a real two-node cluster (one machine) gives the local engine's answers, row for row."""

from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
import pytest

import lengthscan
from lengthscan import audit_ray
from lengthscan.engines.ray.session import EngineError

# lengthscan.engines.ray imports Ray only when a run starts (test_core_package_never_imports_ray), so the
# imports above work without it; the cluster, parquet_glob and disk_dict fixtures are in conftest.py.
pytest.importorskip("ray", reason='the Ray engine tests need Ray: pip install "lengthscan[ray]"')
pytestmark = pytest.mark.ray

#: Report fields that differ between any two runs (clock, command, output folder).
VOLATILE = {"created", "seconds", "command"}


def _stable(result) -> dict:
    d = result.to_dict()
    for k in VOLATILE:
        d.pop(k, None)
    return json.loads(json.dumps(d))


def _compare(tmp_path, source, **kw):
    kw.setdefault("cache", False)  # both engines measure (the length cache serves both: test_length_cache_...)
    local = lengthscan.audit(source, out=tmp_path / "local", **kw)
    distributed = audit_ray(source, out=tmp_path / "ray", num_blocks=7, **kw)
    a = pq.read_table(tmp_path / "local" / "lengths.parquet")
    b = pq.read_table(tmp_path / "ray" / "lengths.parquet")
    assert a.schema == b.schema
    assert a.num_rows == b.num_rows == local.rows_measured
    assert a.to_pylist() == b.to_pylist()
    want, got = _stable(local), _stable(distributed)
    for ls, rs in zip(want["splits"], got["splits"]):
        assert rs["fields"] == ls["fields"]
        assert rs["pair"] == ls["pair"]
        assert rs["limits"] == ls["limits"]
    want.pop("splits"), got.pop("splits")
    assert got == want
    report = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert report["splits"] == distributed.to_dict()["splits"]
    assert (tmp_path / "ray" / "report.html").stat().st_size > 0
    return local, distributed


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 300, "seed": 7}], ids=["full", "sample"])
def test_jsonl_same_answers(cluster, tmp_path, corpus_jsonl, bpe_dir, how):
    _, result = _compare(tmp_path, str(corpus_jsonl), tokenizer=str(bpe_dir), input="text", target="summary",
                         **how)
    assert result.splits[0].sample.rows_measured == (300 if "sample" in how else result.splits[0].sample.rows_total)


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 300, "seed": 7}], ids=["full", "sample"])
def test_parquet_shards_same_answers(cluster, tmp_path, parquet_glob, marian_dir, how):
    _compare(tmp_path, parquet_glob, tokenizer=str(marian_dir), input="text", target="summary", **how)


@pytest.mark.parametrize("how", [{"full": True}, {"sample": 300, "seed": 7}], ids=["full", "sample"])
def test_save_to_disk_dict_same_answers(cluster, tmp_path, disk_dict, bpe_dir, how):
    _, result = _compare(tmp_path, disk_dict, tokenizer=str(bpe_dir), input="text", target="summary", **how)
    assert [s.split for s in result.splits] == ["train", "validation"]


def test_limits_and_decisions_match(cluster, tmp_path, parquet_glob, bpe_dir):
    local, distributed = _compare(tmp_path, parquet_glob, tokenizer=str(bpe_dir), input="text", target="summary",
                                  full=True, limits=["input_tokens<=p99", "target_tokens<=40"])
    assert distributed.decisions == local.decisions


def test_hub_id_is_opened_as_the_local_engine_opens_it(cluster, bpe_dir):
    """Offline here (tests/conftest.py): the local engine's own one-line error, not a refusal of hub ids
    (``tests/engines/ray/test_ray_remote.py`` reads hub ids and http(s) files from local servers)."""
    from lengthscan.sources.source import SourceError

    with pytest.raises(SourceError) as local:
        lengthscan.audit("someone/some-dataset", tokenizer=str(bpe_dir), input="text")
    with pytest.raises(SourceError) as ray:
        audit_ray("someone/some-dataset", tokenizer=str(bpe_dir), input="text")
    assert str(ray.value) == str(local.value) and not isinstance(ray.value, EngineError)


def test_missing_ray_gives_the_install_command(monkeypatch, corpus_jsonl, bpe_dir):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(EngineError, match=r'pip install "lengthscan\[ray\]"'):
        audit_ray(str(corpus_jsonl), tokenizer=str(bpe_dir), input="text")
    from lengthscan import clean_ray

    with pytest.raises(EngineError, match=r'pip install "lengthscan\[ray\]"'):
        clean_ray(str(corpus_jsonl), out="never-written", tokenizer=str(bpe_dir), input="text")


def test_a_ray_that_cannot_start_is_one_line_and_exit_2(tmp_path, corpus_jsonl, bpe_dir):
    """Ray's own processes that do not come up (here: its session folder cannot be made; also a
    ``ulimit -v`` its raylet does not fit in) were an internal error, exit 3 with a traceback."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "RAY_TMPDIR": str(corpus_jsonl), "RAY_ADDRESS": "local"}  # a file: no folder under it
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(corpus_jsonl), "--tokenizer", str(bpe_dir),
                           "--input", "text", "--full", "--engine", "ray", "--out", str(tmp_path / "o"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("lengthscan: error: --engine ray: could not start a local Ray (NotADirectoryError")
    assert "or run with --engine local" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_core_package_never_imports_ray():
    import subprocess
    import sys

    code = ("import sys, lengthscan, lengthscan.engines.api, lengthscan.engines.ray.engine, "
            "lengthscan.engines.ray.sources, lengthscan.engines.ray.write, lengthscan.write.parquet, "
            "lengthscan.cli.main; "
            "print('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


@pytest.mark.slow  # the cluster, and two engines on a template that loops
def test_a_chat_template_that_loops_or_explodes_reads_as_on_the_local_engine(cluster, tmp_path, chat_tok_dir,
                                                                            capsys, monkeypatch):
    """A template that loops stopped the Ray run with a raw actor traceback in terminal colours:
    now exit 2 and the local engine's one line; a rendering past --max-chars is the same per-row
    too_long on both engines (the actors get the time budget and the cap with the chat counter)."""
    from lengthscan.cli.main import main
    from lengthscan.measure.chat import template

    monkeypatch.setattr(template, "RENDER_SECONDS", 0.3)
    monkeypatch.chdir(tmp_path)  # the runs without --out stage ./lengthscan-report before they stop
    turn = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    loops = tmp_path / "loops.jinja"
    loops.write_text(turn + "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    explodes = tmp_path / "explodes.jinja"
    explodes.write_text(turn + "{% if 'boom' in messages[0].content %}{{ 'x' * 1000000000000 }}{% endif %}")
    rows = [{"messages": [{"role": "user", "content": f"{'boom' if i % 3 == 0 else 'fine'} {i}"},
                          {"role": "assistant", "content": f"reply {i}"}]} for i in range(24)]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["audit", str(src), "--tokenizer", str(chat_tok_dir), "--messages", "messages", "--full", "--quiet",
              "--no-cache"]
    for engine in ("local", "ray"):
        assert main([*common, "--chat-template", str(loops), "--engine", engine]) == 2, engine
        time.sleep(3)  # Ray's driver prints the errors the cluster publishes from a thread of its own
        out, err = capsys.readouterr()
        assert err == ("lengthscan: error: the chat template ran past 0.3 s on 3 rows (a template that loops?): "
                       "fix the template\n"), (engine, err)
        # nothing on stdout (--quiet; a --json run's is the JSON alone): not the "(raylet) Task Measurer.measure
        # failed. There are infinite retries remaining" Ray printed there for each call left on a killed actor
        assert out == "", (engine, out)
        assert main([*common, "--chat-template", str(explodes), "--engine", engine,
                     "--out", str(tmp_path / engine)]) == 0, capsys.readouterr().err
    from lengthscan.engines.errors import is_remote
    from lengthscan.measure.chat.template import ChatTemplateError

    with pytest.raises(ChatTemplateError) as raised:  # the library's callers get it as raised in the actor
        audit_ray(str(src), tokenizer=str(chat_tok_dir), messages="messages", chat_template=str(loops), full=True)
    assert not is_remote(raised.value) and str(raised.value).startswith("the chat template ran past 0.3 s on 3 rows")
    local, ray = (pq.read_table(tmp_path / e / "lengths.parquet").to_pylist() for e in ("local", "ray"))
    assert local == ray
    assert [r["chat_flag"] for r in ray] == ["too_long" if i % 3 == 0 else None for i in range(24)]
    assert "the rendering is longer than --max-chars 10,000,000 characters" in ray[0]["chat_error"]


def test_packing_and_block_sampling_through_audit_ray(cluster, tmp_path, parquet_glob, bpe_dir):
    """Keywords ``audit_ray`` lacked before it took ``audit``'s: block sampling and packing give the local answers."""
    local, distributed = _compare(tmp_path / "blocks", parquet_glob, tokenizer=str(bpe_dir), input="text",
                                  sample=300, seed=7, sample_unit="block")
    assert distributed.splits[0].sample.unit == local.splits[0].sample.unit == "block"
    local, distributed = _compare(tmp_path / "packed", parquet_glob, tokenizer=str(bpe_dir), input="text", full=True,
                                  packing="bfd", max_length=128)
    assert distributed.to_dict()["packing"] == local.to_dict()["packing"] and local.to_dict()["packing"]
