"""Why a run has not learned an aggregation probe: its accuracy by answer position.

For a finished (or checkpointed) probe run, scores 500 prompts at its training length with
posbench's own verdicts (teacher-forced greedy answers, as `posbench probe` scores them) and prints
the accuracy of the 1st, 2nd, ... answer of a prompt, and how often the model's guess at an
answer is one of the prompt's answers in another place (it found the word, not its order).

    python results/probes/aggregation/answers.py RUN_DIR [PROMPTS]

Its output for the rope runs of README.md is answers.txt (the last block: cwe revision 2).
"""
import sys
from pathlib import Path

import torch

from posbench.probing import probe_of, verdicts
from posbench.runs import CHECKPOINT, FINAL, build_model, load_spec
from posbench.runs import _read_safetensors

run_dir = Path(sys.argv[1])
trials = int(sys.argv[2]) if len(sys.argv) > 2 else 500
spec, raw = load_spec(run_dir)
model = build_model(spec, raw["vocab_size"])
weights = run_dir / FINAL if (run_dir / FINAL).exists() else run_dir / CHECKPOINT
tensors, _ = _read_safetensors(weights)
wanted = model.state_dict().keys()
found = {k.removeprefix("model."): v for k, v in tensors.items()}
model.load_state_dict({k: found[k] for k in wanted})  # a key missing from the file fails here
model.eval()
probe = probe_of(spec)
n = spec.original_len
prompts = probe.prompts(n, probe.variants()[0], trials, 12345)
per_prompt = verdicts(model, prompts, torch.device("cpu"))
# single-token answers (the probe's words): the guess at each answer, set against the prompt's answers
elsewhere = [[] for _ in range(max(len(p.answers) for p in prompts))]
with torch.inference_mode():
    for i in range(0, trials, 50):
        chunk = prompts[i: i + 50]
        guess = model(torch.tensor([p.tokens for p in chunk])).argmax(-1)
        for b, p in enumerate(chunk):
            truth = [p.tokens[a[0]] for a in p.answers]
            for k, a in enumerate(p.answers):
                g = int(guess[b, a[0] - 1])
                if g != truth[k]:
                    elsewhere[k].append(g in truth)
width = max(len(v) for v in per_prompt)
print(f"{spec.run_id} {probe.name} at {n} tokens, {trials} prompts, weights {weights.name}")
for i in range(width):
    at = [v[i] for v in per_prompt if len(v) > i]
    wrong = elsewhere[i]
    print(f"answer {i + 1}: {100 * sum(at) / len(at):.1f}% of {len(at)} right; of the {len(wrong)} wrong, "
          f"{100 * sum(wrong) / max(len(wrong), 1):.1f}% another answer of the prompt")
print(f"all answers: {100 * sum(map(sum, per_prompt)) / sum(map(len, per_prompt)):.1f}%, "
      f"every answer of a prompt: {100 * sum(all(v) for v in per_prompt) / len(per_prompt):.1f}%")
