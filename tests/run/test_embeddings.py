"""`/v1/embeddings` lines of an OpenAI batch file on vLLM's pooling runner, on the real CPU
engine with a tiny random-weight embedding model built here (tests/conftest.py): the round trip
(outputs.jsonl and errors.jsonl joined back by custom_id, nothing missing, nothing twice), the
embeddings API's response shape, base64, the vectors vLLM's own `LLM.embed` gives for the same
text, refusals (several inputs in a line, `dimensions` on a model without Matryoshka sizes, a
chat line in an embeddings run) and the simulated device refusing embeddings before anything
loads."""

from __future__ import annotations

import base64
import json
from array import array
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.inputs.json_requests import record_from_batch_request  # noqa: E402
from neuron_batch.inputs.prompt_records import FieldError, PromptRecord  # noqa: E402
from neuron_batch.job.request_spec import one_kind  # noqa: E402

SKY = "the sky is blue"


def embed_line(custom_id: str, value, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": value, **body}}


def chat_line(custom_id: str) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


#: What the run sends, and how each line must end: "ok" a response, else its error code.
LINES = [
    (embed_line("text", SKY), "ok"),
    (embed_line("one-in-a-list", [SKY], encoding_format="base64"), "ok"),
    (embed_line("tokens", [5, 6, 7]), "ok"),
    (embed_line("red", "red green"), "ok"),
    (embed_line("dimensions", "hi", dimensions=8), "engine_refused"),
    (embed_line("two-inputs", ["hi", "world"]), "invalid_request"),
    (embed_line("bad-format", "hi", encoding_format="int8"), "invalid_request"),
    (chat_line("chat"), "invalid_request"),
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, tiny_embedding_model):
    tmp_path = tmp_path_factory.mktemp("embeddings")
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row, _ in LINES))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", str(path), "--model", tiny_embedding_model, "--device", "cpu",
        "--max-model-len", "128", "--served-model-name", "tiny-embed", "--on-error", "skip",
        "-q", "-o", str(out)], catch_exceptions=False)
    return {"result": result, "out": out, "path": str(path), "model": tiny_embedding_model}


def test_every_line_ends_in_one_record_joined_by_custom_id(embedded):
    out = embedded["out"]
    assert embedded["result"].exit_code == 3, embedded["result"].output   # partial
    outputs, errors = read_jsonl(out / "outputs.jsonl"), read_jsonl(out / "errors.jsonl")
    ids = Counter([row["custom_id"] for row in outputs] + [row["custom_id"] for row in errors])
    assert ids == Counter(row["custom_id"] for row, _ in LINES)
    ended = {row["custom_id"]: "ok" for row in outputs}
    ended |= {row["custom_id"]: row["error"]["code"] for row in errors}
    assert ended == {row["custom_id"]: how for row, how in LINES}
    errors_by = {row["custom_id"]: row["error"] for row in errors}
    assert "one line per input" in errors_by["two-inputs"]["message"]
    assert errors_by["two-inputs"]["param"] == "body.input"
    assert "Matryoshka" in errors_by["dimensions"]["message"]
    assert "run the generation lines as a batch of their own" in errors_by["chat"]["message"]
    batch = json.loads((out / "batch.json").read_text())
    assert batch["endpoint"] == "/v1/embeddings"
    assert batch["request_counts"] == {"total": len(LINES), "completed": 4, "failed": 4}
    assert batch["usage"]["output_tokens"] == 0


def test_the_responses_are_openais_embeddings_shape(embedded):
    from openai.types import CreateEmbeddingResponse
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingResponse

    bodies = {row["custom_id"]: row["response"]["body"]
              for row in read_jsonl(embedded["out"] / "outputs.jsonl")}
    for body in bodies.values():
        EmbeddingResponse.model_validate(body)          # vLLM's (base64 as a string)
        if isinstance(body["data"][0]["embedding"], list):
            CreateEmbeddingResponse.model_validate(body)    # the openai client's (floats)
        assert body["model"] == "tiny-embed"
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0
    assert bodies["tokens"]["usage"]["prompt_tokens"] == 3
    vector = bodies["text"]["data"][0]["embedding"]
    assert len(vector) == 128 and abs(sum(x * x for x in vector) - 1) < 1e-4   # normalised
    # base64: the same text's vector, as float32 little-endian bytes
    packed = array("f")
    packed.frombytes(base64.b64decode(bodies["one-in-a-list"]["data"][0]["embedding"]))
    assert packed.tolist() == pytest.approx(vector, abs=1e-6)
    assert bodies["red"]["data"][0]["embedding"] != pytest.approx(vector, abs=1e-3)


def test_the_vectors_are_what_vllms_own_embed_gives(embedded):
    """vLLM's LLM.embed on the same model (its dummy weights are seeded) and text: the run's
    tokenization, pooling parameters and output agree with vLLM's own offline API."""
    from vllm import LLM

    llm = LLM(model=embedded["model"], runner="pooling", enforce_eager=True, dtype="float32",
              load_format="dummy", max_model_len=128, kv_cache_memory_bytes=1 << 28)
    expected = [out.outputs.embedding for out in llm.embed([SKY, "red green"],
                                                           use_tqdm=False)]
    bodies = {row["custom_id"]: row["response"]["body"]
              for row in read_jsonl(embedded["out"] / "outputs.jsonl")}
    assert bodies["text"]["data"][0]["embedding"] == pytest.approx(expected[0], abs=1e-5)
    assert bodies["red"]["data"][0]["embedding"] == pytest.approx(expected[1], abs=1e-5)


def test_the_simulated_device_refuses_embeddings_before_anything_loads(tmp_path,
                                                                        tiny_embedding_model):
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps(embed_line("e", SKY)) + "\n")
    result = CliRunner().invoke(main, [
        "run", str(path), "--model", tiny_embedding_model, "--device", "sim",
        "--architecture", "tinyllama-1.1b", "--instance", "inf2.8xlarge",
        "--max-model-len", "128", "-o", str(tmp_path / "run")], catch_exceptions=False)
    assert result.exit_code == 2
    assert (f"{path}:1: field 'url': embeddings (vLLM's pooling runner) cannot run on the "
            "simulated device") in result.output
    assert "--ignore-field" not in result.output     # (no embedding runs without pooling)
    assert not (tmp_path / "run" / "outputs.jsonl").exists()


@pytest.mark.parametrize(("value", "field", "words"), [
    ([], "body.input", "expected a non-empty"),
    ("", "body.input", "empty prompt"),
    ([[1, 2], [3]], "body.input", "2 inputs in one line"),
    (3, "body.input", "expected"),
])
def test_bad_inputs_are_refused_by_field(value, field, words):
    with pytest.raises(FieldError) as caught:
        record_from_batch_request(embed_line("x", value), "f:1")
    assert caught.value.field == field and words in caught.value.message


def test_a_mixed_batch_runs_the_kind_with_more_lines():
    def record(i: int, embed: bool) -> PromptRecord:
        row = embed_line(f"e{i}", "hi") if embed else chat_line(f"c{i}")
        made, _ = record_from_batch_request(row, f"f:{i}")
        made.read_order = i
        return made

    records = [record(0, True), record(1, False), record(2, True)]
    kept, problems = one_kind(records)
    assert [r.id for r in kept] == ["e0", "e2"]
    assert [(p.custom_id, p.field) for p in problems] == [("c1", "url")]
    tie = [record(0, True), record(1, False)]
    kept, problems = one_kind(tie)       # generation on a tie
    assert [r.id for r in kept] == ["c1"] and problems[0].custom_id == "e0"
    assert one_kind(records[:1]) == (records[:1], [])
