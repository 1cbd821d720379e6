#!/usr/bin/env python3
"""Sampling fixtures: what transformers' logits processors keep, and where its generate stops.

"cases": for each, a row of logits and a history (the prompt's ids and the ids
generated since) go through the steps of transformers' generate in its order,
in float64, each only where it applies:
  - RepetitionPenaltyLogitsProcessor (repetition_penalty != 1), over the prompt
    and the generated ids, as generate passes them (input_ids);
  - OpenAI's presence and frequency penalties (presence_penalty or
    frequency_penalty != 0), by the formula of OpenAI's API reference,
    mu[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty, with c[j]
    the count of j among the generated ids (transformers has no such processor);
  - then, with temperature 0, greedy: "greedy" is the argmax (the first of
    equal ones); else TemperatureLogitsWarper (temperature != 1),
    TopKLogitsWarper (top_k > 0), TopPLogitsWarper (top_p < 1) and
    MinPLogitsWarper (min_p > 0). The tokens left with a finite score are
    "kept", and softmax over them gives "probabilities".
difftx's token_sampler (after start(prompt) and accept(each generated id))
must give exactly that token, or that set and those probabilities
(tests/generation_test.cpp).

"stops": prompts for the DiffLlama fixture folder tests/data/hf/llama3 (written
by tools/hf_fixtures.py) whose greedy continuation, by transformers'
model.generate with the folder's own generation config (eos_token_id 2) in
float64, reaches the end-of-sequence id and stops there ("tokens": the new
tokens, the EOS last). Each step's top two logits differ by more than 1e-3 of
the largest |logit| (metadata "min_margin"), so the float64 and float32 runs
pick the same tokens. tests/generation_test.cpp and tests/cli_generate_test.cpp
hold difftx's generate and `difftx generate` to them.

    VENV/bin/python tools/sampling_fixtures.py      # writes tests/data/sampling.json

VENV: torch 2.15.0 and transformers 5.23.0 from PyPI (see tools/make_fixtures.py).
Deterministic: fixed seeds, one thread, and the file is written with sorted keys.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

torch.set_num_threads(1)

import transformers  # noqa: E402
from transformers import DiffLlamaForCausalLM  # noqa: E402
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,  # noqa: E402
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "data", "sampling.json")
STOP_FOLDER = "hf/llama3"
WANT_TORCH, WANT_TRANSFORMERS = "2.15.0", "5.23.0"

# (vocabulary, how the logits are drawn, options); options not named are neutral.
CASES = [
    (8, "normal", dict(temperature=1.0)),
    (8, "normal", dict(temperature=0.7)),
    (50, "normal", dict(temperature=1.3, top_k=5)),
    (50, "normal", dict(temperature=1.0, top_p=0.9)),
    (50, "normal", dict(temperature=0.8, top_k=10, top_p=0.7)),
    (64, "ties", dict(temperature=1.0, top_k=3)),          # equal logits at the k-th place: all of them stay
    (64, "peaked", dict(temperature=0.5, top_p=0.5)),      # one dominant token: top-p keeps it alone
    (300, "normal", dict(temperature=1.0, top_k=40, top_p=0.95)),
    (300, "flat", dict(temperature=2.0, top_p=0.3)),
    (5, "normal", dict(temperature=1.0, top_k=7)),         # k above the vocabulary: no limit
    # min-p, alone and after the others
    (64, "normal", dict(temperature=1.0, min_p=0.1)),
    (300, "normal", dict(temperature=0.7, min_p=0.05)),
    (300, "normal", dict(temperature=1.2, top_k=50, top_p=0.9, min_p=0.02)),
    (64, "peaked", dict(temperature=1.0, min_p=0.5)),
    # penalties: the history's tokens are pushed down (or, negative, up)
    (40, "normal", dict(temperature=1.0, repetition_penalty=1.3)),
    (40, "normal", dict(temperature=0.9, repetition_penalty=0.7, top_k=12)),
    (40, "normal", dict(temperature=1.0, presence_penalty=0.6)),
    (40, "normal", dict(temperature=1.0, frequency_penalty=0.4)),
    (40, "normal", dict(temperature=1.0, presence_penalty=-0.5, frequency_penalty=0.25, top_p=0.8)),
    (300, "normal", dict(temperature=0.8, repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2,
                         top_k=40, top_p=0.9, min_p=0.01)),
    # greedy after the penalties (transformers applies its processors to greedy too)
    (40, "greedy_repeat", dict(temperature=0.0, repetition_penalty=1.5)),
    (40, "greedy_repeat", dict(temperature=0.0, frequency_penalty=1.0, presence_penalty=0.5)),
    # top-p over thousands of tokens: the kept set spans many bands of probability
    (1500, "normal", dict(temperature=1.0, top_p=0.9)),
    (1500, "flat", dict(temperature=1.0, top_p=0.5)),
    (1500, "normal", dict(temperature=0.6, top_p=0.999)),
]
NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
               frequency_penalty=0.0)
PROMPT_LEN, GENERATED_LEN = 6, 9

STOP_PROMPT_LEN, STOP_MAX_NEW, STOP_CASES, MIN_REL_MARGIN = 5, 16, 2, 1e-3


def die(msg):
    sys.exit(f"sampling_fixtures: {msg}")


def logits_of(profile, V, gen):
    if profile == "ties":
        return torch.randint(0, 6, (V,), generator=gen).to(torch.float64)
    if profile == "peaked":
        x = torch.randn(V, generator=gen, dtype=torch.float64)
        x[V // 3] = 12.0
        return x
    if profile == "flat":
        return 0.1 * torch.randn(V, generator=gen, dtype=torch.float64)
    x = 2.0 * torch.randn(V, generator=gen, dtype=torch.float64)
    if profile == "greedy_repeat":  # the largest logit is a token of the history, by a margin the penalty undoes
        x[3] = x.max() + 0.5
    return x


def history_of(V, gen):
    """Prompt and generated ids with repeats, token 3 among them (and some ids twice or more)."""
    prompt = torch.randint(0, V, (PROMPT_LEN,), generator=gen)
    prompt[0] = 3
    generated = torch.randint(0, V, (GENERATED_LEN,), generator=gen)
    generated[1] = generated[4] = generated[7] = 3
    generated[2] = generated[5]
    return prompt, generated


def chain_case(V, kind, options, gen):
    o = dict(NEUTRAL, **options)
    x = logits_of(kind, V, gen)
    prompt, generated = history_of(V, gen)
    scores = x[None, :].clone()
    ids = torch.cat([prompt, generated])[None, :]
    if o["repetition_penalty"] != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(o["repetition_penalty"])(ids, scores)
    if o["presence_penalty"] != 0.0 or o["frequency_penalty"] != 0.0:
        counts = torch.bincount(generated, minlength=V)
        for j in range(V):
            c = int(counts[j])
            if c > 0:
                scores[0, j] = scores[0, j] - c * o["frequency_penalty"] - o["presence_penalty"]
    case = {"logits": x.tolist(), "kind": kind, "prompt": prompt.tolist(), "generated": generated.tolist(), **o}
    if o["temperature"] == 0.0:
        case["greedy"] = int(torch.argmax(scores[0]))
        if kind == "greedy_repeat" and case["greedy"] == int(torch.argmax(x)):
            die(f"penalties {options} leave the greedy token unchanged: the case tests nothing")
        return case
    if o["temperature"] != 1.0:
        scores = TemperatureLogitsWarper(o["temperature"])(ids, scores)
    if o["top_k"] > 0:
        scores = TopKLogitsWarper(o["top_k"])(ids, scores)
    if o["top_p"] < 1.0:
        scores = TopPLogitsWarper(o["top_p"])(ids, scores)
    if o["min_p"] > 0.0:
        scores = MinPLogitsWarper(o["min_p"])(ids, scores)
    kept = torch.isfinite(scores[0]).nonzero()[:, 0]
    case["kept"] = kept.tolist()
    case["probabilities"] = torch.softmax(scores[0, kept], dim=-1).tolist()
    return case


@torch.no_grad()
def stop_cases():
    """Prompts whose greedy continuation in the llama3 folder ends at its EOS, with clear margins."""
    folder = os.path.join(ROOT, "tests", "data", STOP_FOLDER)
    model = DiffLlamaForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    V = model.config.vocab_size
    found, worst = [], float("inf")
    for attempt in range(2000):
        g = torch.Generator().manual_seed(20261128 + attempt)
        prompt = torch.randint(3, V, (STOP_PROMPT_LEN,), generator=g)
        out = model.generate(prompt[None, :], attention_mask=torch.ones_like(prompt)[None, :],
                             max_new_tokens=STOP_MAX_NEW, do_sample=False, pad_token_id=0)
        new = out[0, STOP_PROMPT_LEN:]
        if int(new[-1]) not in eos or len(new) < 3 or any(int(t) in eos for t in new[:-1]):
            continue
        rows = model(torch.cat([prompt, new])[None, :-1]).logits[0, STOP_PROMPT_LEN - 1:]
        if not torch.equal(rows.argmax(-1), new):
            die("generate disagrees with full forwards")
        top = torch.topk(rows, 2, dim=-1).values
        margin = float(((top[:, 0] - top[:, 1]) / rows.abs().max(-1).values).min())
        if margin <= MIN_REL_MARGIN:
            continue
        found.append({"folder": STOP_FOLDER, "prompt": prompt.tolist(), "tokens": new.tolist(),
                      "max_new_tokens": STOP_MAX_NEW, "eos_token_ids": sorted(eos)})
        worst = min(worst, margin)
        if len(found) == STOP_CASES:
            return found, worst
    die(f"no {STOP_CASES} prompts of {STOP_FOLDER} whose greedy continuation reaches EOS within {STOP_MAX_NEW}")


def main():
    if (torch.__version__.split("+")[0], transformers.__version__) != (WANT_TORCH, WANT_TRANSFORMERS):
        die(f"needs torch {WANT_TORCH} and transformers {WANT_TRANSFORMERS} (have {torch.__version__}, "
            f"{transformers.__version__})")
    gen = torch.Generator().manual_seed(20261126)
    cases = [chain_case(V, kind, options, gen) for V, kind, options in CASES]
    stops, margin = stop_cases()
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/sampling_fixtures.py", "transformers": transformers.__version__,
                   "torch": torch.__version__,
                   "transformers_processors": "RepetitionPenalty, then OpenAI presence/frequency (formula), then "
                                              "Temperature, TopK, TopP, MinP (generate's order), float64",
                   "cases": cases, "stops": stops, "min_margin": margin}, f, sort_keys=True)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases, kept sizes {[len(c.get('kept', [0])) for c in cases]}; "
          f"{len(stops)} stops {[len(s['tokens']) for s in stops]} (min margin {margin:.2e})")


if __name__ == "__main__":
    main()
