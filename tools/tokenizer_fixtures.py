#!/usr/bin/env python3
"""Writes the tokenizer.json fixtures of difftx::tokenizer under tests/data/tokenizer/, with Hugging
Face tokenizers as the reference.

    python3 -m venv DIR && DIR/bin/pip install tokenizers==0.23.3 sentencepiece
    DIR/bin/python tools/tokenizer_fixtures.py          (run from anywhere; it refuses another tokenizers)

Deterministic: the training texts are below, training runs on one thread, JSON is written with sorted
keys where the order is ours; running it twice gives the same bytes (it checks that it trains the same
tokenizer twice). Files, each a folder with one tokenizer.json as tokenizers saves it (compact):

  llama3/           byte-level BPE as Llama-3 ships it: Split with Llama-3's pattern (Isolated) then
                    ByteLevel(use_regex=False), ignore_merges, merges as ["a", "b"] pairs, Llama-3's
                    special tokens after the vocabulary (<|begin_of_text|> ... reserved ones),
                    post-processor Sequence[ByteLevel, TemplateProcessing(<|begin_of_text|> $A)],
                    ByteLevel decoder
  gpt2/             GPT-2 style: ByteLevel(add_prefix_space=True, use_regex=True) pre-tokenizer, merges in
                    the "a b" spelling, ByteLevel post-processor and decoder, and added tokens with each
                    of lstrip, rstrip, single_word and normalized (special and not)
  llama2/           SentencePiece-style BPE as transformers converts Llama-2/Mistral now: Metaspace
                    (prepend_scheme first, split false), byte_fallback with the 256 <0xNN> tokens, unk
                    <unk>, fuse_unk, decoder Sequence[Replace(▁, " "), ByteFallback, Fuse, Strip(" ", 1, 0)],
                    TemplateProcessing(<s> $A)
  llama2_legacy/    the same model as older Llama-2 files: normalizer Sequence[Prepend(▁), Replace(" ", ▁)],
                    pre_tokenizer null
  metaspace_split/  the same vocabulary, no byte fallback: Metaspace(prepend_scheme always, split true),
                    Metaspace decoder, unk not fused, no post-processor
  sp_converted/     tests/data/hf/tokenizer/tokenizer.model (SentencePiece BPE, V = 128) converted as
                    llama2/ (merges from the pieces as transformers' generate_merges orders them); the
                    script checks that it encodes the hf fixture's texts as SentencePiece does, so
                    `generate --text` gives the same prompt from either file

and expected.json: {"texts": {name: text}, "cases": {folder: {text name: {"ids": encode(text),
"ids_plain": encode(text, add_special_tokens=False), "decoded": decode(ids, skip_special_tokens=False),
"decoded_skip": decode(ids, skip_special_tokens=True)}}}}. The texts include "stress" (many scripts,
emoji sequences, digit runs, whitespace runs, CRLF, special tokens inside the text, combining marks,
contractions in both cases).
"""
import json
import pathlib
import struct
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tokenizer"
HF_TOKENIZER = ROOT / "tests" / "data" / "hf" / "tokenizer"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]

# Training text (written for this file): English prose, a little of other languages and of code.
CORPUS = """\
The lighthouse keeper climbed the hundred and twelve steps every evening at dusk. He wiped the great
lens, trimmed the wick, and wrote the weather in his log: wind from the north-west, sea moderate,
visibility good. Ships passed far out on the horizon, and he counted them as they went by.
On stormy nights he didn't sleep at all. He'd sit by the window with a cup of tea, watching the beam
sweep across the water, and he'll tell you that the sound of the waves was the best company he'd ever had.
"We're never alone out here," he used to say. "There's always the sea, and the sea talks all night."
In 1897 the keeper's daughter painted the door blue; in 1923 her son painted it green; in 2004 it was red.
The log books fill three shelves: 12 volumes, 4,380 pages, about 1,200,000 words in small, careful hands.
Visitors ask the same questions: How tall is it? How far does the light reach? Who lives here now?
The answers are 34 metres, 22 nautical miles, and nobody: the light has run by itself since 1991.

Le gardien du phare montait l'escalier chaque soir. Il nettoyait la lentille et notait le temps qu'il faisait.
Der Leuchtturmwärter stieg jeden Abend die Treppe hinauf. Über dem Meer war der Himmel klar und weit.
El farero subía la escalera cada tarde; a menudo pensaba en su familia, que vivía lejos de la costa.
Смотритель маяка каждый вечер поднимался по лестнице. Море было спокойным, и ветер дул с севера.
Ο φαροφύλακας ανέβαινε τη σκάλα κάθε βράδυ. Η θάλασσα ήταν ήρεμη και ο ουρανός καθαρός.
灯塔看守人每天晚上都爬上楼梯。海面很平静，天空很晴朗。灯塔的光照得很远。
灯台守は毎晩階段を上った。海は穏やかで、空は晴れていた。
등대지기는 매일 저녁 계단을 올라갔다. 바다는 잔잔했고 하늘은 맑았다.

def keeper_log(day, wind, sea):
    if wind > 30 and sea != "calm":
        return f"{day}: storm warning ({wind} knots)"
    return f"{day}: all quiet"

for i in range(10):
    print(keeper_log(i, 12 * i, "moderate"))
"""

# Texts every case encodes.
TEXTS = {
    "stress": (
        "Café naïve façade Ångström Straße — ÉCOLE Œuvre déjà vu.\n"
        "Привет, мир! Καλημέρα κόσμε. مرحبا بالعالم שלום עולם नमस्ते दुनिया\n"
        "你好，世界。東京タワーは高い。สวัสดีชาวโลก 안녕하세요 세계\n"
        "Family 👨\u200d👩\u200d👧\u200d👦, coder 👩🏽\u200d💻, thumbs 👍🏻👍🏿, flags 🇫🇷🇯🇵🇧🇷, rainbow 🏳️\u200d🌈.\n"
        "Digits: 7 42 123 1234 12345 1234567890123 3.14159 2024-05-01 ٣٤٥ ४२\n"
        "Spaces:  two   three    four\ttab\t\ttabs \n\n\nthree newlines\r\nCRLF\r\n\r\nend  \n"
        "Special <|begin_of_text|>inside<|eot_id|> text <s>and</s> more <unk>x<|endoftext|>y <mask> z\n"
        "Combining: e\u0301 n\u0303 a\u0308\u0304 \u1100\u1161\u11a8 and decomposed Cafe\u0301.\n"
        "Contractions: I'm YOU'RE she'S they'VE we'll it'd DON'T can't O'Neil's ʼs\n"
        "Odd spaces:\u00a0nbsp\u3000ideographic\u2009thin\u200bzero-width\ufeffbom \u200fRTL\u200e.\n"
        "Code: if (x != y) { return x->z[0] <= 3; } // ok!!! ???... --->\n"
        "Unseen: ☃ ꙮ 𓀀 ∑∫√ ÿ\x7f\x01 end"
    ),
    "corpus": CORPUS[:600],
    "specials": "<|begin_of_text|>Hello<|end_of_text|> <|eot_id|>\n<s> Hi</s><unk> <|endoftext|>",
    "added": "a<mask> b <mask>c [rs]   tail hello world xhello worldx hello worldy [rs]",
    "whitespace": "   leading\n\n\n\t\t trailing   \r\n\r\n  ",
    "empty": "",
    "one": "a",
    "unseen": "☃ꙮ𓀀 ∑ √x",
}


def die(msg):
    sys.exit(f"tokenizer_fixtures: {msg}")


def check(cond, msg):
    if not cond:
        die("check failed: " + msg)


def compact(tok):
    """The tokenizer's JSON as tokenizers writes it, without indentation."""
    return tok.to_str(pretty=False)


def from_json(text):
    return Tokenizer.from_str(text)


def edited(tok, edit):
    """A tokenizer rebuilt from its JSON after edit(dict)."""
    j = json.loads(compact(tok))
    edit(j)
    return from_json(json.dumps(j, ensure_ascii=False))


def train(tok, trainer):
    lines = [line for line in CORPUS.splitlines()]
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, trainers.BpeTrainer(vocab_size=1000, min_frequency=1, show_progress=False,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIALS])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    train(tok, trainers.BpeTrainer(vocab_size=700, min_frequency=1, show_progress=False,
                                   special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("[rs]", rstrip=True, normalized=False),
                    AddedToken("hello world", single_word=True, normalized=True)])

    def legacy_merges(j):  # "a b" strings instead of pairs
        j["model"]["merges"] = [f"{a} {b}" for a, b in j["model"]["merges"]]
    return edited(tok, legacy_merges)


def sentencepiece_style_vocab():
    """vocab, merges of a SentencePiece-style BPE trained here: <unk> <s> </s>, the 256 byte tokens, then
    the trained pieces (as Llama-2 lays them out)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    train(tok, trainers.BpeTrainer(vocab_size=800, min_frequency=1, show_progress=False,
                                   special_tokens=["<unk>", "<s>", "</s>"]))
    trained = json.loads(compact(tok))["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return vocab, [tuple(m) for m in trained["merges"]]


SP_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                decoders.Strip(content=" ", left=1, right=0)])


def sentencepiece_style(vocab, merges, byte_fallback=True):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=byte_fallback))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")])
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = SP_DECODER
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 1)])
    return tok


def llama2_legacy(vocab, merges):
    tok = sentencepiece_style(vocab, merges)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    return tok


def metaspace_split(vocab, merges):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=False, byte_fallback=False))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return tok


def safetensors_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


def sp_converted():
    """tests/data/hf/tokenizer/tokenizer.model as a tokenizer.json; returns it and the texts it was checked on."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(HF_TOKENIZER / "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    # transformers' generate_merges: every split of every piece into two pieces, ordered by the
    # merged piece's id (SentencePiece orders BPE pieces by score), then by the parts' ids
    merges = []
    for piece, piece_id in sorted(vocab.items(), key=lambda kv: kv[1]):
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(a, b, piece_id) for a, b in sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))]
    merges = [(a, b) for a, b, _ in sorted(merges, key=lambda m: (m[2], len(m[0]), len(m[1])))]
    tok = sentencepiece_style(vocab, merges, byte_fallback=False)
    meta = safetensors_metadata(HF_TOKENIZER / "expected.safetensors")
    texts = [meta["prompt.text"], meta["text"]] + [line for line in CORPUS.splitlines()[:4] if line]
    for text in texts:
        check(tok.encode(text, add_special_tokens=False).ids == sp.encode(text),
              f"sp_converted encodes {text!r} unlike SentencePiece")
    check(tok.encode(meta["prompt.text"]).ids[0] == sp.bos_id(), "sp_converted's BOS")
    return tok


def cases():
    vocab, merges = sentencepiece_style_vocab()
    return {
        "llama3": llama3(),
        "gpt2": gpt2(),
        "llama2": sentencepiece_style(vocab, merges),
        "llama2_legacy": llama2_legacy(vocab, merges),
        "metaspace_split": metaspace_split(vocab, merges),
        "sp_converted": sp_converted(),
    }


def expected(tok):
    out = {}
    for name, text in TEXTS.items():
        ids = tok.encode(text).ids
        out[name] = {"ids": ids, "ids_plain": tok.encode(text, add_special_tokens=False).ids,
                     "decoded": tok.decode(ids, skip_special_tokens=False),
                     "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
    return out


def main():
    check(tokenizers.__version__ == "0.23.3", f"tokenizers 0.23.3 wanted, this is {tokenizers.__version__}")
    made = cases()
    again = cases()
    for name, tok in made.items():
        check(compact(tok) == compact(again[name]), f"{name}: training is not deterministic")
    files = {}
    for name, tok in made.items():
        text = compact(tok)
        check(compact(from_json(text)) == text, f"{name}: does not read back")
        files[OUT / name / "tokenizer.json"] = text.encode()
    result = {"texts": TEXTS, "cases": {name: expected(tok) for name, tok in made.items()}}
    lines = ['{"texts": ' + json.dumps(TEXTS, ensure_ascii=False, sort_keys=True) + ',', ' "cases": {']
    for i, (name, per_text) in enumerate(sorted(result["cases"].items())):
        lines.append(f'  "{name}": {{')
        for j, (text_name, e) in enumerate(sorted(per_text.items())):
            end = "," if j + 1 < len(per_text) else ""
            lines.append(f'   "{text_name}": ' + json.dumps(e, ensure_ascii=False, sort_keys=True) + end)
        lines.append("  }" + ("," if i + 1 < len(result["cases"]) else ""))
    lines.append(" }}")
    text = "\n".join(lines) + "\n"
    check(json.loads(text) == json.loads(json.dumps(result)), "expected.json does not read back")
    files[OUT / "expected.json"] = text.encode()
    total = 0
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        total += len(data)
        print(f"{path.relative_to(ROOT)}: {len(data)} bytes")
    check(total < 320_000, f"fixtures take {total} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
