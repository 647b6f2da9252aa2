"""The reading of the docs' shell blocks that tests/test_docs_run.py runs: markers, commands and the
answers their comments show (in process, no server)."""

from __future__ import annotations

from tests.docs_blocks import blocks, commands, console_steps, mismatches, shows


def test_markers_before_a_fence(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: needs a GPU, tests/test_image.py::test_x -->\n```bash\nnvidia-smi\n```\n\n"
        "<!-- before:\ncurl -s localhost:8000/subjects -d '{}'\n-->\n```sh\ncurl -s localhost:8000/healthz\n```\n\n"
        "<!-- not run: only for the next fence -->\n\n```text\nnot a command\n```\n```sh\necho run\n```\n"
    )
    gpu, setup, plain = blocks(page)
    assert gpu.not_run == "needs a GPU, tests/test_image.py::test_x" and not gpu.uses_server
    assert setup.not_run is None and setup.before == "curl -s localhost:8000/subjects -d '{}'" and setup.uses_server
    assert (plain.not_run, plain.before, plain.text) == (None, "", "echo run")


def test_what_a_command_s_comments_expect():
    block = """curl -s localhost:8000/subjects -H 'X: #1' \\
  -d '{"id": "a"}'   # 201; id optional
curl -s localhost:8000/faces/1/chip -o f.png   # 404 face_chip_not_stored unless kept
curl -s localhost:8000/verify -F image1=@README.md
# {"error": {"code": "invalid_image", "message": "…"}}
curl -s localhost:8000/models    # {"embedder": {…}, "default_far": "1e-3", "n": 0.5}: the rest is prose
# A remark, not a sample
x=$(curl -s localhost:8000/healthz | python3 -c 'print(1)')"""
    created, chip, bad, models, nested = commands(block)
    assert created.text.endswith("""-d '{"id": "a"}'""") and "'X: #1'" in created.text and created.expected.status == 201
    assert (chip.expected.status, chip.expected.error) == (404, "face_chip_not_stored")
    assert (bad.expected.status, bad.expected.error) == (None, "invalid_image")
    assert models.expected.sample == {"embedder": {}, "default_far": "1e-3", "n": 0.5}
    assert nested.expected.status is None and nested.expected.sample is None


def test_a_sample_holds_keys_strings_and_numbers_not_lists():
    sample = {"far": "1e-3", "similarity": 0.95, "faces": [], "model": {}, "deep": {"a": True}}
    answer = {"far": "1e-3", "similarity": 0.951, "faces": [1, 2], "model": {"x": 1}, "deep": {"a": True}}
    assert mismatches(sample, answer) == []
    assert mismatches(sample, {**answer, "far": "1e-2"}) == ["far is '1e-2', the docs show '1e-3'"]
    assert mismatches(sample, {**answer, "similarity": 0.9}) and mismatches(sample, {**answer, "extra": 1})
    assert mismatches(sample, {**answer, "deep": {"a": False}}) == ["deep.a is False, the docs show True"]


def test_console_blocks_split_commands_from_their_output():
    steps = console_steps("$ facegate models list \\\n    --x\ndlib-resnet-v1 … ok\n$ echo hi\nhi\n")
    assert steps == [("facegate models list \\\n    --x", "dlib-resnet-v1 … ok"), ("echo hi", "hi")]
    assert shows("dlib-resnet-v1 … ok", "dlib-resnet-v1  present  ok\n") and not shows("hi", "ho")
