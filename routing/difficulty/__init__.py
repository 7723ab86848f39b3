"""How hard a prompt is: the classifier behind small-model routing.

`features` turns a prompt's text into the cheap features (length, digits and operators,
code-likeness, question type, and the whole-word cue families of `cues`) and the hashed word
features; `model` scores a prompt with logistic-regression weights over those and, when the
gateway has it, the prompt's sentence embedding; `weights` loads the weights kvgate ships
(`data/*.json`, written by `scripts/train_router.py` from `tests/data/routing_prompts.jsonl`);
`calibrate` turns a share of hard prompts an alias may send small into a score threshold
(conservatively, as a 95% bound); `train` fits the weights (numpy).

Everything here is pure except loading the shipped file: the embedding is computed in `gateway/`
and passed in as a sequence of floats.
"""
