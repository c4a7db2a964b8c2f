#!/usr/bin/env python3
"""Records SmolLM2's tokenizer behaviour, from independent implementations,
as the fixture tests/model/smollm2_tokenizer_fixtures.json that the C++ BPE
tokenizer tests compare against. Run once; the tests never need Python.

Command that made the committed fixture:
    python3 -m pip install gguf==0.19.0 tokenizers==0.23.3 transformers==5.24.0 jinja2==3.1.6
    python3 scripts/make_tokenizer_fixtures.py \
        ~/.cache/kvcache/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        > tests/model/smollm2_tokenizer_fixtures.json

References:
  * token ids and decoded text: Hugging Face `tokenizers` (Rust), built from
    the GGUF's vocabulary and merges (read with the `gguf` package) and
    configured as SmolLM2's published tokenizer.json is: BPE without unknown
    token or byte fallback; pre-tokenizer Sequence[Digits(individual_digits=
    True), ByteLevel(add_prefix_space=False, use_regex=True)]; ByteLevel
    decoder; tokens of GGUF type 3 (control) as special added tokens.
    `ids` is the default mode (special token texts are matched),
    `ids_plain` the same with encode_special_tokens=True (they are not).
  * chat text: transformers' apply_chat_template (its Jinja renderer) with
    the GGUF's tokenizer.chat_template, and with plain ChatML.
Texts are given inline or as a prefix of a file every Debian machine has
(GPL-3), so the license text itself is not copied into the repository.
"""
import hashlib
import json
import sys

import gguf
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
import transformers

GPL3 = "/usr/share/common-licenses/GPL-3"

TEXTS = [
    ("prose", "The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; "
              "they'd been told it'll rain, so we've gone home and I'm done."),
    ("contractions_upper", "DON'T SHOUT, he'S here. ''quoted'' and 'single' 's 't 're 've 'm 'll 'd"),
    ("code_python", "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"
                    "    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n"),
    ("code_cpp", "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n"
                 "\tfor (auto& x : v) x *= 2;  // double\n\treturn v[0] != 2;\n}\n"),
    ("numbers", "pi = 3.14159265358979323846, 2^64 = 18446744073709551616, 1,000,000.00 "
                "on 2026-12-01 at 09:30; 0x1F 1e-9 -42 +7 10%"),
    ("numbers_unicode", "x² + y³ = ½, Ⅻ o'clock, fullwidth １２３, Arabic-Indic ٠١٢٣, Devanagari ४२"),
    ("accents", "Café naïve résumé Zürich Ångström façade São Paulo Łódź Ελληνικά русский язык"),
    ("cjk", "東京は日本の首都です。中文测试：你好，世界！한국어 텍스트입니다."),
    ("emoji", "I ❤️ this 👍🏽 🎉🎉 family: 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 done ✅"),
    ("scripts_marks", "हिन्दी भाषा, العربية لغة, עברית, ไทย ภาษา, e\u0301 combining"),
    ("whitespace_runs", "a    b  c\t\td \t e\n\n\nf   \n   g  "),
    ("leading_trailing", "   leading spaces and trailing   "),
    ("newlines_only", "\n"),
    ("crlf_tabs", "line one\r\nline two\r\n\tindented\r\n\r\n"),
    ("unicode_spaces", "nbsp\u00a0here, ideographic\u3000space, thin\u2009space, "
                       "em\u2003space, line\u2028sep, nel\u0085x, fs\x1c.gs\x1f.us a\x1c b\x0b\x0c."),
    # Each character between other characters and runs of itself, so that
    # its class (\s, \p{L}, \p{N} or none) changes the chunks: every
    # White_Space character, and look-alikes that are not \s.
    ("space_classes", "".join(f"a {c}! {c}{c}b{c} c|" for c in
                              "\t\n\x0b\x0c\r\x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029"
                              "\u202f\u205f\u3000\x1c\x1e\x1f\u200b\u180e\ufeff\u2060")),
    ("category_classes", "".join(f"x {c}! {c}{c}y{c} 1{c}|" for c in
                                 "ʰǅªº_Ⅻↂ½²³٣߀𝟘‿⁀◌́ःँ¨°€±∑©😀《ー々〆〇")),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!!!! ============ ------------ zzzzz"),
    ("punctuation", "Hello, World!!! (yes) [no] {maybe} <tag/> \"quotes\" — dash – en … ellipsis"),
    ("url_email", "See https://example.com/path/to/page?q=1&lang=en#top or mail a.b+c@example.org."),
    ("mixed", "Hello 你好 123abc def456 ümlaut42 x1y2z3 ... $5.99 #hashtag @user"),
    ("special_chat", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
                     "Hi there<|im_end|>\n<|im_start|>assistant\n"),
    ("special_adjacent", "text<|im_end|>more<|endoftext|><|endoftext|> <|im_start|><|im_end|>"),
    ("special_partial", "<|im_ start <|im_start <|im_end| <|endoftext|x <repo_name> <filename>"),
    ("single_char", "a"),
    ("single_space", " "),
    ("empty", ""),
]


def read_gguf(path):
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    def string(key):
        f = r.fields[key]
        return bytes(f.parts[f.data[0]]).decode("utf-8")

    assert string("tokenizer.ggml.model") == "gpt2"
    assert string("tokenizer.ggml.pre") == "smollm"
    return strings("tokenizer.ggml.tokens"), ints("tokenizer.ggml.token_type"), \
        strings("tokenizer.ggml.merges"), string("tokenizer.chat_template")


def build_tokenizer(tokens, types, merges):
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                     unk_token=None, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [tokenizers.AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    for s in specials:
        assert tok.token_to_id(s.content) == vocab[s.content]
    return tok


def main():
    path = sys.argv[1]
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    tokens, types, merges, chat_template = read_gguf(path)
    tok = build_tokenizer(tokens, types, merges)

    def encode(text, plain):
        tok.encode_special_tokens = plain
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        return ids

    encode_cases = []
    for name, text in TEXTS:
        encode_cases.append({"name": name, "text": text, "ids": encode(text, False),
                             "ids_plain": encode(text, True)})
    with open(GPL3, "rb") as f:
        gpl = f.read()
    for name, nbytes in (("gpl3_2000", 2000), ("gpl3_full", len(gpl))):
        text = gpl[:nbytes].decode("utf-8")
        ids = encode(text, False)
        assert ids == encode(text, True)
        encode_cases.append({"name": name, "text_file": GPL3, "text_bytes": nbytes, "ids": ids})

    # Decoding: every id once on its own is checked in C++ against the
    # byte alphabet; here HF's lossy decode of chosen sequences.
    decode_cases = []
    emoji_ids = next(c["ids"] for c in encode_cases if c["name"] == "emoji")
    cjk_ids = next(c["ids"] for c in encode_cases if c["name"] == "cjk")
    seqs = [emoji_ids, cjk_ids, emoji_ids[1:], emoji_ids[:-1], cjk_ids[::2], [1, 2, 0],
            list(range(0, 40)), list(range(49100, 49152)), []]
    seqs += [[i] for i in range(17, 17 + 256)]  # the single-byte tokens
    seqs += [[i] for i in range(0, len(tokens), 97)]
    for ids in seqs:
        decode_cases.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})

    chatml_plain = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
                    "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "You answer in one word."},
         {"role": "user", "content": "Capital of Italy?"},
         {"role": "assistant", "content": "Rome."},
         {"role": "user", "content": "And of Spain?"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke about 42 cats.\nMake it short."}],
    ]
    chat_cases = []
    for which, template in (("gguf", chat_template), ("chatml_plain", chatml_plain)):
        for messages in conversations:
            for gen in (True, False):
                text = fast.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                add_generation_prompt=gen)
                chat_cases.append({"template": which, "messages": messages,
                                   "add_generation_prompt": gen, "text": text,
                                   "ids": encode(text, False)})

    json.dump({
        "model_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "model_sha256": sha,
        "reference": f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, "
                     f"gguf package; see scripts/make_tokenizer_fixtures.py",
        "chatml_plain_template": chatml_plain,
        "encode": encode_cases,
        "decode": decode_cases,
        "chat": chat_cases,
    }, sys.stdout, ensure_ascii=True, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
