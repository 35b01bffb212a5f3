"""Reference digests of the Claude vocabulary Anthropic published, for
tests/unit/test_claude_tokenizer.py.

Anthropic's Python SDK shipped the vocabulary as `anthropic/tokenizer.json` (a Hugging
Face `tokenizers` file) up to release 0.38. This script takes that file from the
`anthropic==0.38.0` wheel and runs it with Hugging Face `tokenizers` — neither is used by
ctxcc — over the test's corpus, and prints the digests the test pins:

    python -m venv /tmp/ref && /tmp/ref/bin/pip install tokenizers
    /tmp/ref/bin/pip download --no-deps -d /tmp/ref/whl anthropic==0.38.0
    /tmp/ref/bin/python scripts/claude_vocab_reference.py /tmp/ref/whl/anthropic-0.38.0-*.whl

It needs the repository on `sys.path` (run it from the checkout) for the corpus only.
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.claude_vocab import corpus, ids_digest, vocab_digest


def main(wheel: str) -> None:
    from tokenizers import Tokenizer  # only here: a reference, not a dependency

    raw = zipfile.ZipFile(wheel).read("anthropic/tokenizer.json")
    print("tokenizer.json sha256", hashlib.sha256(raw).hexdigest())
    tok = Tokenizer.from_str(raw.decode())
    print("vocab size", tok.get_vocab_size())
    print("vocab digest", vocab_digest(tok.get_vocab_size(), lambda i: tok.decode([i])))
    texts = corpus()
    print("corpus", len(texts), "texts", sum(map(len, texts)), "chars")
    print("ids digest", ids_digest(texts, lambda t: tok.encode(t).ids))
    print("hello world ids", tok.encode("hello world").ids)


if __name__ == "__main__":
    main(sys.argv[1])
