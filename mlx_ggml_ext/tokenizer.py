"""Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata, giving llama.cpp's token ids.

`load_tokenizer(gguf_file)` returns an `mlx_lm.tokenizer_utils.TokenizerWrapper` around a
`transformers.PreTrainedTokenizerFast`, so `mlx_lm.generate`, `stream_generate` and
`apply_chat_template` (with the file's `tokenizer.chat_template`) work on it. The tokenizer itself
is a Hugging Face `tokenizers.Tokenizer` assembled here from the metadata so that its ids equal
those of llama.cpp's `llama_tokenize(vocab, text, add_special=True, parse_special=True)`:

- `tokenizer.ggml.model = "llama"` (llama.cpp's SPM vocabulary: Llama 2, TinyLlama, Mistral,
  Gemma 1-3). llama.cpp merges the adjacent pair of pieces whose concatenation is the vocabulary
  entry with the highest score, leftmost first, and writes pieces left over as `<0xXX>` byte
  tokens. That is a BPE whose merges are every split of every vocabulary entry into two entries,
  ranked by the entry's score, with byte fallback; a space becomes U+2581 and, where
  `add_space_prefix` is set (llama.cpp's default for this model), every run of text between
  special tokens gets one U+2581 in front, as llama.cpp does.
- `tokenizer.ggml.model = "gpt2"` (byte-level BPE with the file's merges) with the pre-tokenizer
  `tokenizer.ggml.pre` names: the Llama 3 family ("llama-bpe", "llama3", ...; whole words that
  are in the vocabulary skip the merges, as llama.cpp's `ignore_merges`), the Qwen2 family
  ("qwen2", ...: one token per digit), GPT-2 ("gpt-2", "mpt", "olmo", ...), SmolLM / StarCoder
  ("smollm", "starcoder", ...: GPT-2's split after one split per digit), GPT-4o ("gpt-4o", "llama4", ...:
  gpt-oss's and Llama 4's) and "default" (what llama.cpp uses for a missing or "default" name). Other names raise NotImplementedError.

Special tokens: every token the file types CONTROL, USER_DEFINED or UNKNOWN is matched whole in
the text before anything else, as llama.cpp does with `parse_special=True` (its `llama-tokenize`
tool's default and what its server uses for prompts). CONTROL and UNKNOWN ones are "special" for
`decode(..., skip_special_tokens=True)`; USER_DEFINED ones (e.g. Gemma's runs of newlines) are
plain added tokens, which llama.cpp also matches with `parse_special=False`. To tokenize text
without matching control tokens, use `tokenizer.encode(text, split_special_tokens=True)`
(transformers' option, not checked against llama.cpp).

BOS/EOS: added by `encode(text)` (add_special_tokens=True) following `tokenizer.ggml.add_bos_token`
and `add_eos_token`, with llama.cpp's defaults where the file says nothing (BOS for "llama" and the
Llama 3 family, none for other "gpt2" files). `decode` gives the text back exactly (no
"clean up tokenization spaces"; llama.cpp's detokenizer does that for some "gpt2" vocabularies,
we do not). The end-of-generation ids (`TokenizerWrapper.eos_token_ids`) are the EOS id plus the
end-of-turn tokens that the file names (`eot_token_id`, `eom_token_id`) or that the vocabulary has
under their usual names, the way llama.cpp collects them.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["load_tokenizer", "SUPPORTED_MODELS", "SUPPORTED_PRE_TOKENIZERS"]

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

SPM_SPACE = "\u2581"  # what SentencePiece vocabularies write for a space

# ---- pre-tokenizer regexes of the "gpt2" model, by llama.cpp's pre-tokenizer name -------------
# Each entry splits the text in turn (every piece of the previous split is split again, the text
# between matches staying a piece of its own). The contractions are spelled with explicit case
# pairs rather than (?i:...), whose Unicode case folding would also take e.g. U+017F for "s".
_CONTRACTIONS = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
_LLAMA3_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o's (o200k) splitting as llama.cpp runs it: a word is a run of letters that are not a-z, then letters
# that are not A-Z (or the reverse), so "CamelCase" splits before each capital, with an optional contraction;
# digits in threes; punctuation may take a following "/" or line break.
_GPT4O_WORD_TAIL = r"(?:" + _CONTRACTIONS + r")?"
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+" + _GPT4O_WORD_TAIL +
    r"|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*" + _GPT4O_WORD_TAIL +
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_GPT2_SPLIT_NO_TAIL = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


@dataclass(frozen=True)
class _PreTokenizer:
    splits: tuple  # regexes applied in turn
    ignore_merges: bool = False  # a whole piece that is a vocabulary entry is taken as is
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token


_LLAMA3 = _PreTokenizer((_LLAMA3_SPLIT,), ignore_merges=True, add_bos=True)
_LLAMA3_REGEX_ONLY = _PreTokenizer((_LLAMA3_SPLIT,))
_QWEN2 = _PreTokenizer((_QWEN2_SPLIT,))
_GPT2 = _PreTokenizer((_GPT2_SPLIT,))
_GPT4O = _PreTokenizer((_GPT4O_SPLIT,))
_SMOLLM = _PreTokenizer((r"\p{N}", _GPT2_SPLIT))
_DEFAULT = _PreTokenizer((r"[\p{P}$+<=>^~|]+", _GPT2_SPLIT_NO_TAIL, r"\p{N}+", "[0-9][0-9][0-9]"))

# Names llama.cpp maps to the same splitting and flags (llama-vocab.cpp, llama_vocab::impl::load).
_PRE_TOKENIZERS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                     "lfm2"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _LLAMA3_REGEX_ONLY),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), _QWEN2),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), _GPT2),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie"), _GPT4O),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    _SMOLLM),
    "default": _DEFAULT,
}

SUPPORTED_MODELS = ("llama", "gpt2")
SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_PRE_TOKENIZERS))

# Token texts that end a turn in common chat formats; llama.cpp stops generation on them too.
_END_OF_TURN_TEXTS = frozenset((
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "<end_of_utterance>",
))

# Gemma's turn format (its model card), for Gemma files converted without a chat template (the
# Gemma 3 270M GGUF has none). A system message goes in front of the first user turn.
_GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\\n\\n' %}"
    "{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
    " + (ns.system if m['role'] == 'user' else '') + (m['content'] | trim) + '<end_of_turn>\\n' }}"
    "{% if m['role'] == 'user' %}{% set ns.system = '' %}{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
_FALLBACK_TEMPLATES = {"gemma": _GEMMA_TEMPLATE, "gemma2": _GEMMA_TEMPLATE, "gemma3": _GEMMA_TEMPLATE}


# ---- reading the metadata -----------------------------------------------------------------------

@dataclass
class _Vocab:
    model: str
    pre: "str | None"
    tokens: list
    scores: "Sequence[float] | None"
    types: list
    merges: "list | None"
    bos_id: "int | None"
    eos_id: "int | None"
    unk_id: "int | None"
    pad_id: "int | None"
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: "str | None"
    extra_eog_ids: tuple


def _metadata_of(gguf_file) -> Mapping[str, Any]:
    meta = getattr(gguf_file, "metadata", None)
    if not isinstance(meta, Mapping):
        raise TypeError(
            f"load_tokenizer expects a GGUFFile from mlx_ggml_ext.gguf.load (or a path), got {type(gguf_file).__name__}")
    return meta


def _array(meta, key, n_tokens, what):
    value = meta.get(key)
    if value is None:
        return None
    if len(value) < n_tokens:
        raise ValueError(f"{key} has {len(value)} {what} for {n_tokens} tokens")
    return value


def _token_id(meta, key, n_tokens, default):
    """An id key, llama.cpp's way: missing -> the model's default; out of range -> the default."""
    value = meta.get(key)
    if value is None:
        return default if default is not None and default < n_tokens else None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{key} must be an integer token id, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value < n_tokens:
        return default if default is not None and default < n_tokens else None
    return value


def _flag(meta, key, default: bool) -> bool:
    value = meta.get(key)
    if value is None:
        return default
    if not isinstance(value, (bool, int)):
        raise ValueError(f"{key} must be a bool, got {type(value).__name__}")
    return bool(value)


def _read_vocab(meta: Mapping[str, Any]) -> "tuple[_Vocab, _PreTokenizer | None]":
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise ValueError("the GGUF file has no tokenizer (no tokenizer.ggml.model key)")
    if model not in SUPPORTED_MODELS:
        raise NotImplementedError(
            f"tokenizer.ggml.model {model!r} is not supported (supported: {', '.join(SUPPORTED_MODELS)})")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError("tokenizer.ggml.tokens must be a non-empty array of strings")
    n = len(tokens)
    # llama.cpp renames empty entries so that every id has a distinct text.
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    if len(set(tokens)) != n:
        seen = {}
        for i, t in enumerate(tokens):
            if seen.setdefault(t, i) != i:
                raise ValueError(f"duplicate token in tokenizer.ggml.tokens: {t!r} has ids {seen[t]} and {i}")

    scores = _array(meta, "tokenizer.ggml.scores", n, "scores")
    types = _array(meta, "tokenizer.ggml.token_type", n, "token types")
    types = [int(t) for t in types[:n]] if types is not None else [TOKEN_NORMAL] * n

    pre_name = meta.get("tokenizer.ggml.pre")
    pre = None
    if model == "llama":
        defaults = dict(bos=1, eos=2, unk=0, add_bos=True, add_space_prefix=True)
    else:
        name = pre_name or "default"
        if name not in _PRE_TOKENIZERS:
            raise NotImplementedError(
                f"tokenizer.ggml.pre {name!r} (model 'gpt2') is not supported; supported: "
                f"{', '.join(SUPPORTED_PRE_TOKENIZERS)}")
        pre = _PRE_TOKENIZERS[name]
        defaults = dict(bos=11, eos=11, unk=None, add_bos=pre.add_bos, add_space_prefix=False)

    merges = meta.get("tokenizer.ggml.merges")
    if model == "gpt2" and not merges:
        raise ValueError("tokenizer.ggml.model 'gpt2' needs tokenizer.ggml.merges, which the file lacks")

    template = meta.get("tokenizer.chat_template")
    if not isinstance(template, str):
        template = _FALLBACK_TEMPLATES.get(meta.get("general.architecture"))
    eog = [_token_id(meta, f"tokenizer.ggml.{k}_token_id", n, None) for k in ("eot", "eom")]
    vocab = _Vocab(
        model=model, pre=pre_name, tokens=tokens, scores=scores, types=types, merges=merges,
        bos_id=_token_id(meta, "tokenizer.ggml.bos_token_id", n, defaults["bos"]),
        eos_id=_token_id(meta, "tokenizer.ggml.eos_token_id", n, defaults["eos"]),
        unk_id=_token_id(meta, "tokenizer.ggml.unknown_token_id", n, defaults["unk"]),
        pad_id=_token_id(meta, "tokenizer.ggml.padding_token_id", n, None),
        add_bos=_flag(meta, "tokenizer.ggml.add_bos_token", defaults["add_bos"]),
        add_eos=_flag(meta, "tokenizer.ggml.add_eos_token", False),
        add_space_prefix=_flag(meta, "tokenizer.ggml.add_space_prefix", defaults["add_space_prefix"]),
        chat_template=template,
        extra_eog_ids=tuple(i for i in eog if i is not None),
    )
    for flag, tid, key in ((vocab.add_bos, vocab.bos_id, "bos"), (vocab.add_eos, vocab.eos_id, "eos")):
        if flag and tid is None:
            raise ValueError(f"tokenizer.ggml.add_{key}_token is true but the file has no valid {key}_token_id")
    return vocab, pre


# ---- building the `tokenizers` pipeline -------------------------------------------------------------

def _spm_merges(tokens: list, scores) -> list:
    """Every split of every entry into two entries, best score first (llama.cpp's merge order).

    Equal scores keep id order; llama.cpp takes the leftmost of equal-score pairs instead, which
    differs only where two overlapping candidate pairs have the same score (Gemma's and Llama's
    normal tokens all have distinct scores). This loop is the slow part of loading a 262k
    vocabulary (about a second), so it keeps to set lookups and appends.
    """
    import numpy as np

    known = set(tokens)
    owner, pairs = [], []
    add_owner, add_pair = owner.append, pairs.append
    for i, text in enumerate(tokens):
        for cut in range(1, len(text)):
            left = text[:cut]
            if left in known:
                right = text[cut:]
                if right in known:
                    add_owner(i)
                    add_pair((left, right))
    if scores is None or not pairs:
        return pairs
    key = -np.asarray(scores, dtype=np.float64)[np.asarray(owner, dtype=np.int64)]
    return [pairs[j] for j in np.argsort(key, kind="stable")]


def _bpe_merges(merges: Sequence[str], ids: Mapping[str, int]) -> list:
    """The file's "left right" merges; llama.cpp splits at the first space after the first char.

    A merge of or into a text that is not a vocabulary entry can never give a token (llama.cpp
    would merge and then write the pieces as bytes); tokenizers' BPE cannot hold one (it panics),
    so such merges are dropped.
    """
    try:
        split = [(m[0] + head, tail) for m in merges for head, sep, tail in (m[1:].partition(" "),) if sep]
    except (TypeError, IndexError):
        raise ValueError("tokenizer.ggml.merges must be an array of non-empty strings") from None
    return [(a, b) for a, b in split if a in ids and b in ids and a + b in ids]


def _added_tokens(vocab: _Vocab):
    """Tokens llama.cpp matches whole in the text before splitting it (CONTROL/USER_DEFINED/UNKNOWN)."""
    from tokenizers import AddedToken

    special, plain = [], []
    for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.types)):
        if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            special.append(AddedToken(text, special=True, normalized=False))
        elif kind == TOKEN_USER_DEFINED:
            plain.append(AddedToken(text, special=False, normalized=False))
    return special, plain


def _build_spm(vocab: _Vocab):
    from tokenizers import Tokenizer, decoders, models, normalizers

    ids = {t: i for i, t in enumerate(vocab.tokens)}
    unk = vocab.tokens[vocab.unk_id] if vocab.unk_id is not None else None
    tk = Tokenizer(models.BPE(vocab=ids, merges=_spm_merges(vocab.tokens, vocab.scores),
                              unk_token=unk, byte_fallback=True, fuse_unk=False))
    steps = [normalizers.Replace(" ", SPM_SPACE)]
    if vocab.add_space_prefix:
        # A normalizer runs on each piece of text between special tokens, like llama.cpp's
        # prefix (Metaspace's prepend would skip text that already starts with a space).
        steps.insert(0, normalizers.Prepend(SPM_SPACE))
    tk.normalizer = normalizers.Sequence(steps)
    tk.pre_tokenizer = None
    dec = [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tk.decoder = decoders.Sequence(dec)
    return tk


def _build_bpe(vocab: _Vocab, pre: _PreTokenizer):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    ids = {t: i for i, t in enumerate(vocab.tokens)}
    tk = Tokenizer(models.BPE(vocab=ids, merges=_bpe_merges(vocab.merges, ids),
                              ignore_merges=pre.ignore_merges, byte_fallback=False))
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk


def _post_processor(vocab: _Vocab):
    from tokenizers import processors

    specials = []
    if vocab.add_bos:
        specials.append((vocab.tokens[vocab.bos_id], vocab.bos_id))
    if vocab.add_eos:
        specials.append((vocab.tokens[vocab.eos_id], vocab.eos_id))
    bos = [vocab.tokens[vocab.bos_id]] if vocab.add_bos else []
    eos = [vocab.tokens[vocab.eos_id]] if vocab.add_eos else []
    single = " ".join(bos + ["$A"] + eos)
    pair = " ".join(bos + ["$A"] + eos + bos + ["$B:1"] + eos)
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(dict.fromkeys(specials)))


def _eog_ids(vocab: _Vocab) -> set:
    eog = set(vocab.extra_eog_ids)
    if vocab.eos_id is not None:
        eog.add(vocab.eos_id)
    for i, text in enumerate(vocab.tokens):
        if text in _END_OF_TURN_TEXTS:
            eog.add(i)
    return eog


def build_backend(gguf_file):
    """The `tokenizers.Tokenizer` (with its added tokens and BOS/EOS template) and the vocabulary read."""
    vocab, pre = _read_vocab(_metadata_of(gguf_file))
    tk = _build_spm(vocab) if vocab.model == "llama" else _build_bpe(vocab, pre)
    special, plain = _added_tokens(vocab)
    if special:
        tk.add_special_tokens(special)
    if plain:
        tk.add_tokens(plain)
    tk.post_processor = _post_processor(vocab)
    return tk, vocab


def _fast_tokenizer(backend, **kwargs):
    """transformers' PreTrainedTokenizerFast over `backend` itself.

    Given `tokenizer_object=`, transformers deep-copies the tokenizer (a JSON round trip: seconds for
    a 262k vocabulary); a backend already set when `__init__` runs is used as it is (transformers 5,
    which mlx-lm requires). Older versions refuse that, and get the copy.
    """
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    hf._tokenizer = backend
    try:
        PreTrainedTokenizerFast.__init__(hf, **kwargs)
    except ValueError:
        hf = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    return hf


def load_tokenizer(gguf_file):
    """An mlx-lm `TokenizerWrapper` for the tokenizer a GGUF file describes (see the module doc).

    `gguf_file` is a `mlx_ggml_ext.gguf.GGUFFile` (or a path, which is loaded). Raises
    NotImplementedError for a tokenizer model or pre-tokenizer this module does not build, and
    ValueError for metadata that llama.cpp would refuse too.
    """
    if isinstance(gguf_file, (str, os.PathLike)):
        from . import gguf

        gguf_file = gguf.load(gguf_file)
    from functools import partial

    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, TokenizerWrapper

    tk, vocab = build_backend(gguf_file)

    def name(i):
        return vocab.tokens[i] if i is not None else None

    hf = _fast_tokenizer(
        tk,
        bos_token=name(vocab.bos_id), eos_token=name(vocab.eos_id),
        unk_token=name(vocab.unk_id), pad_token=name(vocab.pad_id),
        clean_up_tokenization_spaces=False,
        chat_template=vocab.chat_template,
    )
    # transformers may rebuild the BOS/EOS template from these attributes; keep them in line.
    for attr, value in (("add_bos_token", vocab.add_bos), ("add_eos_token", vocab.add_eos)):
        if hasattr(hf, attr):
            try:
                setattr(hf, attr, value)
            except (AttributeError, ValueError):
                pass
    hf.backend_tokenizer.post_processor = _post_processor(vocab)
    if vocab.model == "llama":
        detok = partial(SPMStreamingDetokenizer, trim_space=vocab.add_space_prefix)
    else:
        detok = BPEStreamingDetokenizer
    return TokenizerWrapper(hf, detok, eos_token_ids=sorted(_eog_ids(vocab)))

