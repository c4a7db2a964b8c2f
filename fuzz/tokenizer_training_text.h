// The text the tokenizer fuzz targets (bpe, spm) learn their vocabularies
// from: English, code, markup, French, German, Greek, Chinese, emoji (so
// multi-byte characters and merges inside them), tabs, runs of spaces, CRLF.
#pragma once

namespace kvcache::fuzz {

inline constexpr const char* kTokenizerTrainingText =
    "Once upon a time, there was a little girl named Lily. She liked to play outside in the "
    "sunshine with her friends. One day, they found a big red ball under the tree and they "
    "played with it all afternoon. The quick brown fox jumps over the lazy dog; the dog did "
    "not mind. It's what they're doing, and we'll see what I'd done: don't stop, won't stop.\n"
    "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) printf(\"%s\\n\", "
    "argv[i]);\n  return 0;\n}\n"
    "def encode(text: str) -> list[int]:\n    return [ord(c) for c in text if c != ' ']\n"
    "<html><body><p class=\"note\">1 + 2 = 3, 10 * 20 = 200, 3.14159 2026-12-01</p></body>\n"
    "Le caf\xC3\xA9 est tr\xC3\xA8s bon, l'\xC3\xA9t\xC3\xA9 \xC3\xA0 Paris. "
    "Gr\xC3\xBC\xC3\x9F"
    "e aus M\xC3\xBCnchen, sch\xC3\xB6n und gro\xC3\x9F. "
    "\xCE\x9A\xCE\xB1\xCE\xBB\xCE\xB7\xCE\xBC\xCE\xAD\xCF\x81\xCE\xB1 \xCE\xBA\xCF\x8C\xCF\x83"
    "\xCE\xBC\xCE\xB5. "
    "\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE6\x9C\xAC\xE4\xB8\xAD\xE6\x96\x87 "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80\xF0\x9F\x98\x80 "
    "\xF0\x9F\x91\x8D\xF0\x9F\x98\x80\n\n\t\ttabs\t and   spaces   \r\n";

}  // namespace kvcache::fuzz
