"""Every hyperparameter of a run in one dataclass, the rules its values keep, and the named presets.

Defaults are those of the paper's released code for DeepSeek-R1-Distill-Qwen-1.5B (preset
`paper-1.5b`); docs/algorithm.md says what each one does. Each setting is declared once, with its
help and its allowed values beside it (`option`); the exploration knobs are declared by the
methods that read them (strategies/, each method's KNOBS) and come in through `Knobs`. A preset is
a plain dict of overrides; explicit flags override the preset. Each field is a command-line flag
(runtime/cli.py): the field name with dashes (`mix_rate` -> `--mix-rate`), its help the field's.

    cfg = replace(preset("grpo-1.5b"), lr=2e-6)   # runtime.cli.parse_config(["--preset", ...])
    cfg.save_json("runs/x/config.json"); Config.load_json("runs/x/config.json") == cfg
"""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from data import MATH_INSTRUCTION
from estimators import ADVANTAGES, KL_ESTIMATORS
from model import PROJECTIONS, projection_shapes, unknown_targets
from strategies import KNOBS, STRATEGIES, Knobs
from strategies.base import AT_LEAST_0, AT_LEAST_1, FRACTION, POSITIVE, ConfigError, listing, option, problems, zero_is

NONEMPTY = (lambda v: v.strip() != "", "must not be empty")
# AdamW moves each weight by about lr a step; past 1 the weights (~0.02) are gone at once (1e6 for
# 1e-6, a typo).
STEP_SIZE = (lambda v: 0 < v <= 1, "must be in (0, 1]: AdamW moves every weight by about this much a step")
UNIT = (lambda v: 0 < v <= 1, "must be in (0, 1]")
BELOW_1 = (lambda v: 0 <= v < 1, "must be in [0, 1)")
REPORTERS = ("", "none", "tensorboard", "wandb")


@dataclass(frozen=True)
class Config(Knobs):
    # --- model and data
    model: str = option("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "policy checkpoint: a local "
                        "Hugging Face directory, a hub id, or 'tiny' (random, offline)",
                        check=NONEMPTY)
    tokenizer: str = option("", "tokenizer directory or hub id; empty = the one stored with "
                            "--model")
    data: str = option("agentica-org/DeepScaleR-Preview-Dataset", "training problems: a "
                       ".jsonl/.json/.parquet file, a hub dataset id, or the built-in 'arith' "
                       "(options as arith:difficulty=2,n=2000)", check=NONEMPTY)
    data_split: str = option("train", "split to read from a hub dataset")
    max_prompt_tokens: int = option(4096, "prompts longer than this are dropped (and counted) "
                                    "when the data is loaded", check=AT_LEAST_1)
    instruction: str = option(MATH_INSTRUCTION, "appended to each math problem in its user turn: "
                              "train.py's training, held-out and validation prompts, eval.py's "
                              "math benchmarks (the paper's R1 prompt; '' = the problem alone)")
    max_new_tokens: int = option(8192, "maximum response length in tokens; longer responses are "
                                 "truncated", check=AT_LEAST_1)

    # --- rollouts
    prompts_per_step: int = option(64, "prompts drawn per training step", check=AT_LEAST_1)
    group_size: int = option(4, "responses sampled per prompt (G); advantages are normalised "
                             "within each group",
                             check=(lambda v: v >= 2, "must be at least 2: advantages compare the "
                                    "responses of a group, so a group of one carries no learning "
                                    "signal"))
    temperature: float = option(1.0, "sampling temperature of training rollouts",
                                check=zero_is("greedy, for evaluation only"))
    top_p: float = option(1.0, "nucleus sampling threshold of training rollouts (1 = off)",
                          check=UNIT)
    top_k: int = option(0, "sample only from the k most likely tokens (0 = off)",
                        check=zero_is("off"))
    min_p: float = option(0.0, "drop tokens with p < min_p x top p, after top-k / top-p (Soft "
                          "Thinking's; 0 = off)",
                          check=(lambda v: 0 <= v < 1, "must be in [0, 1) (0 = off)"))
    after_thinking_top_k: int = option(-1, "Soft Thinking's after-thinking filters (its "
                                       "after_thinking_top_k, _top_p, _min_p): a row that has "
                                       "sampled --stop-mixing-token samples with these in place "
                                       "of --top-k / --top-p / --min-p (-1 = unchanged)",
                                       check=(lambda v: v >= -1, "must be >= 0 (0 = off), or -1 (= "
                                              "--top-k)"))
    after_thinking_top_p: float = option(-1.0, "see --after-thinking-top-k (-1 = --top-p)",
                                         check=(lambda v: 0 < v <= 1 or v == -1,
                                                "must be in (0, 1], or -1 (= --top-p)"))
    after_thinking_min_p: float = option(-1.0, "see --after-thinking-top-k (-1 = --min-p)",
                                         check=(lambda v: 0 <= v < 1 or v == -1,
                                                "must be in [0, 1) (0 = off), or -1 (= --min-p)"))
    rollout_batch_size: int = option(0, "rows (prompts x G) decoded together per generate call; 0 "
                                     "= all of a step's rows at once. The KV cache grows with "
                                     "rows x (prompt + max_new_tokens) (--plan shows it); more "
                                     "rows decode more tokens per second, and the run names a "
                                     "larger size when one fits the GPU",
                                     check=zero_is("all rows at once"))

    # --- exploration (docs/algorithm.md): --explore picks a method of strategies/; its knobs are its own
    explore: str = option("neighbor", "exploration during rollouts: " + "; ".join(
        f"{name} = {strategy.about}" for name, strategy in STRATEGIES.items()), choices=tuple(STRATEGIES))
    stop_mixing_token: str = option("</think>", "mixing stops for good after a sequence samples "
                                    "this token (empty = never stops)")
    freeze_embeddings: bool = option(False, "do not train the input embeddings (as the released "
                                     "code's FSDP setup does in N-GRPO runs)")

    # --- reward (docs/reward.md)
    grader: str = option("ours", "answer checker: ours = exact, sympy-based (grading/grader.py); "
                         "math-verify = the released code's (pip install math-verify)",
                         choices=("ours", "math-verify"))
    reward: str = option("", "your own reward f(response, reference) -> float, as module:function "
                         "or path/to/file.py:function; it runs in the checker's time-bounded "
                         "workers, for the warm start's dev checks too (empty = the grader)")
    require_boxed: bool = option(False, "only \\boxed answers count (a format-strict reward); by "
                                 "default a final answer stated without a box counts too")
    rel_tol: float = option(0.0, "our grader's relative tolerance on numbers: |answer - "
                            "reference| <= rel_tol x |reference| counts as equal (0 = exact; an "
                            "integer reference stays exact). eval.py: each benchmark's published "
                            "rule unless given (TheoremQA 0.04; docs/reward.md)", check=BELOW_1)
    reward_timeout_s: float = option(5.0, "seconds one answer's check may take (the grader's or "
                                     "--reward's): past it the check's worker is killed and the "
                                     "answer scores 0, counted in reward_timeouts", check=POSITIVE)
    reward_fail_steps: int = option(3, "stop the run once no answer of a step could be scored "
                                    "(each check raised, timed out or returned no finite number) "
                                    "for this many steps in a row (0 = never stop)",
                                    check=zero_is("never stop"))
    judge: str = option("", "a second opinion after the rules (a model grader): f(response, reference) -> 1 / 0 as "
                        "module:function or path/to/file.py:function, asked where the rules said 0, in time-bounded "
                        "workers of its own (a judge that calls a model server; each worker may use 2 GB); its calls "
                        "and flips are logged (docs/reward.md). Empty = none")
    judge_timeout_s: float = option(30.0, "seconds one --judge call may take (past it the rules' verdict stands)",
                                    check=POSITIVE)
    judge_max_calls: int = option(0, "--judge calls per scored batch at most, the rest left to the rules (0 = no "
                                  "cap)", check=zero_is("no cap"))
    judge_both_orders: bool = option(False, "also ask f(reference, response): equal only when both orders say so "
                                     "(NeMo Gym's math_with_judge)")
    judge_positives: bool = option(False, "also ask --judge where the rules said 1 (it may then turn them to 0)")

    # --- the GRPO / PPO update
    loss: str = option("grpo", "grpo = token-level PPO ratio; gspo = sequence-level ratio "
                       "exp(mean(logp - old_logp))", choices=("grpo", "gspo"))
    scale_rewards: str = option("group", "divide group-centred rewards by the group's std "
                                "(group), by the std of the whole batch's rewards (batch), or not "
                                "at all (none, Dr. GRPO)", choices=("group", "batch", "none"))
    adv_eps: float = option(1e-6, "added to the std before dividing",
                            check=(lambda v: v > 0, "must be > 0: it keeps a group whose rewards "
                                   "are all equal from dividing by zero (a negative one flips the "
                                   "advantages' sign)"))
    clip_low: float = option(0.2, "PPO clip: ratio floor is 1 - clip_low",
                             check=(lambda v: 0 <= v < 1, "must be in [0, 1): the ratio's floor 1 "
                                    "- clip_low must stay above 0"))
    clip_high: float = option(0.2, "PPO clip: ratio ceiling is 1 + clip_high (raise it for "
                              "clip-higher)", check=AT_LEAST_0)
    dual_clip: float = option(3.0, "dual clip for negative advantages: the loss is at most -c * A "
                              "(0 = off)",
                              check=(lambda v: v == 0 or v > 1, "must be 0 (off) or > 1"))
    kl_coef: float = option(0.01, "coefficient of the KL to the reference model (0 = no reference "
                            "model)", check=zero_is("no reference model"))
    kl_estimator: str = option("low-var", "the per-token KL estimate (Schulman 2020; "
                               "docs/estimators.md): k1 = logp - ref; k2 = (logp - ref)^2 / 2; k3 "
                               "= exp(d) - d - 1, d = ref - logp (TRL's); low-var = k3 clamped, "
                               "the released code's and verl's low_var_kl",
                               choices=tuple(KL_ESTIMATORS))
    kl_in_reward: bool = option(False, "put the KL in the reward instead of the loss: each "
                                "response's reward less kl_coef x the sum of its tokens' KL "
                                "estimates, before the advantages (verl's use_kl_in_reward, "
                                "OpenRLHF's and NeMo RL's reward KL)")
    entropy_coef: float = option(0.0, "entropy bonus: the loss minus this x the mean entropy of "
                                 "the policy at each response token (its gradient through the "
                                 "chunked log-prob pass), as verl's entropy_coeff and TRL's; 0 = "
                                 "off, as in the released runs. With --entropy-target: the "
                                 "adaptive coefficient's ceiling", check=AT_LEAST_0)
    entropy_target: float = option(0.0, "> 0: adaptive entropy control (Skywork-OR1, arXiv "
                                   "2505.22312): the bonus is on while the rollouts' entropy is "
                                   "at most this, its coefficient moving by --entropy-coef-delta "
                                   "a step toward holding it; 0 = the fixed --entropy-coef",
                                   check=AT_LEAST_0)
    entropy_coef_delta: float = option(0.0005, "adaptive entropy control: the coefficient's "
                                       "change per step (Skywork-OR1's Delta, arXiv 2505.22312)",
                                       check=AT_LEAST_0)
    top_entropy_quantile: float = option(1.0, "the policy gradient only on this fraction of the "
                                         "batch's response tokens, those of highest entropy under "
                                         "the policy that drew them (Wang et al., arXiv "
                                         "2506.01939: 0.2; TRL's top_entropy_quantile, the "
                                         "release's entropy_top_ratio); the KL and the bonus "
                                         "still see every token; 1 = all", check=UNIT,
                                         aliases=("--entropy-top-ratio",))
    old_logp: str = option("replay", "old-policy log-probs: replay = a no-grad forward over the "
                           "recorded inputs; rollout = the sampler's own",
                           choices=("replay", "rollout"))
    rollout_is: str = option("none", "correct the sampler-vs-policy mismatch (docs/algorithm.md, 'The "
                             "sampler is not the policy') with w = pi_train(y) / pi_sampler(y), the replayed "
                             "old policy's probability of each sampled token over the sampler's: "
                             "token-truncate = each token's loss times min(w, C); token-mask = times w, or 0 "
                             "where w is outside [lower, C]; sequence-truncate / sequence-mask = the same "
                             "with one w per sequence, the geometric mean of its tokens'. none = the released "
                             "behaviour; the mismatch is logged in every mode",
                             choices=("none", "token-truncate", "token-mask", "sequence-truncate",
                                      "sequence-mask"))
    rollout_is_cap: float = option(2.0, "--rollout-is: C, the truncation cap and the mask modes' "
                                   "upper bound",
                                   check=(lambda v: v > 1, "must be > 1: the weights are ratios "
                                          "around 1"))
    rollout_is_lower: float = option(0.0, "--rollout-is token-mask / sequence-mask: weights below "
                                     "this are masked (0 = 1 / C)",
                                     check=(lambda v: 0 <= v < 1, "must be in [0, 1) (0 = 1 / "
                                            "--rollout-is-cap)"))
    loss_agg: str = option("token-mean", "how token losses become the loss: token-mean = over all response "
                           "tokens of the mini-batch; seq-mean-token-mean = mean per sequence, then over "
                           "sequences; seq-mean-token-sum-norm = each sequence's sum / max_new_tokens, then "
                           "mean over sequences (Dr. GRPO); token-mean-per-rows = the token mean of each run "
                           "of --loss-agg-rows consecutive sequences, then the mean over those runs (what the "
                           "released verl runs computed with 2 sequences per GPU micro-batch). --loss gspo "
                           "without --loss-agg: seq-mean-token-mean",
                           choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                                    "token-mean-per-rows"))
    loss_agg_rows: int = option(2, "token-mean-per-rows: sequences per run (a loss definition: "
                                "independent of --micro-batch-size)", check=AT_LEAST_1)
    ppo_epochs: int = option(1, "passes over each rollout batch", check=AT_LEAST_1)
    mini_batch_prompts: int = option(16, "prompts per optimizer step (their G responses each)",
                                     check=AT_LEAST_1)
    micro_batch_size: int = option(4, "sequences per forward/backward pass (gradient "
                                   "accumulation; does not change the gradient)", check=AT_LEAST_1)
    micro_batch_tokens: int = option(0, "> 0: form micro-batches by this token budget instead of "
                                     "--micro-batch-size: rows sorted by length, grouped so that "
                                     "rows x padded length (prompt + response) <= N; same "
                                     "gradient, less padding (docs/micro-batches.md). 0 = fixed "
                                     "rows", check=zero_is("--micro-batch-size rows"))
    pack: bool = option(False, "lay each micro-batch's rows end to end as one sequence (RoPE "
                        "restarting per row, attention within each row): no padded position is "
                        "computed; the same gradient")

    # --- the GRPO family (docs/algorithm.md): NGRPO's calibrated advantages, DAPO's sampling and shaping
    adv_estimator: str = option("grpo", "each response's advantage from its group's rewards "
                                "(docs/estimators.md): " + "; ".join(
                                    f"{name} = {e.about}" for name, e in ADVANTAGES.items()),
                                choices=tuple(ADVANTAGES), aliases=("--advantage",))
    pass_k: int = option(2, "the k of the pass@k the advantage is an unbiased gradient of (Walder "
                         "and Karkhanis, arXiv 2505.15201; 1 = rloo; at most --group-size)",
                         check=AT_LEAST_1)
    virtual_max_reward: float = option(1.0, "the reward of each virtual sample")
    virtual_max_count: int = option(1, "virtual samples added to each group (m)", check=AT_LEAST_1)
    filter_groups: str = option("none", "drop groups with no learning signal before the update: "
                                "all = every group whose rewards are all equal, all_correct = all "
                                "1, all_incorrect = all 0 (DAPO's dynamic sampling)",
                                choices=("none", "all", "all_correct", "all_incorrect"))
    refill: bool = option(False, "with --filter-groups: draw and roll out more prompts until "
                          "prompts_per_step groups are kept (or --max-refill-draws is reached)")
    max_refill_draws: int = option(4, "with --refill: extra prompt batches drawn per step at most",
                                   check=AT_LEAST_0)
    mask_truncated: bool = option(False, "responses cut at max_new_tokens get no loss (DAPO's "
                                  "overlong filtering)")
    overlong_buffer: int = option(0, "DAPO's soft overlong penalty over the last L tokens before "
                                  "max_new_tokens: a response of length n > max - L gets (max - L "
                                  "- n) / L * factor added to its reward (0 = off)",
                                  check=AT_LEAST_0)
    overlong_penalty_factor: float = option(1.0, "the overlong penalty at n = max_new_tokens is "
                                            "-factor", check=AT_LEAST_0)
    length_shaping: str = option("none", "success-gated length shaping within each group (prime-rl's): brevity = a "
                                 "correct response's reward times L_min / L, L_min the group's shortest correct "
                                 "length; gr3 = times 1 / (1 + alpha L / the group's mean length); a wrong response "
                                 "keeps its reward, never raised for being short (none = off)",
                                 choices=("none", "brevity", "gr3"))
    length_shaping_alpha: float = option(0.33, "--length-shaping gr3: alpha", check=POSITIVE)

    # --- optimizer
    lr: float = option(5e-7, "AdamW learning rate (the peak one with --lr-schedule cosine)",
                       check=STEP_SIZE)
    lr_schedule: str = option("constant", "learning rate over the steps: constant (the released "
                              "runs), or cosine: linear warm-up over --warmup-steps, then a "
                              "cosine decay to --min-lr-ratio x lr at the last step",
                              choices=("constant", "cosine"))
    warmup_steps: int = option(0, "with --lr-schedule cosine: steps of linear warm-up from lr / "
                               "warmup_steps", check=AT_LEAST_0)
    min_lr_ratio: float = option(0.0, "with --lr-schedule cosine: the learning rate at the last "
                                 "step, over lr", check=FRACTION)
    weight_decay: float = option(0.01, "AdamW weight decay", check=AT_LEAST_0)
    grad_clip: float = option(1.0, "clip the global gradient norm to this value (0 = off)",
                              check=zero_is("off"))
    grad_checkpointing: bool = option(True, "recompute each block's activations in the backward "
                                      "pass: what makes 8k-token sequences fit "
                                      "(--no-grad-checkpointing to store them)")
    logprob_chunk_tokens: int = option(1024, "positions whose vocabulary logits exist at once "
                                       "when computing log-probs (memory O(chunk x V), never O(B "
                                       "x T x V))", check=AT_LEAST_1)

    # --- low-rank adapters (LoRA: Hu et al., arXiv 2106.09685; runtime/lora.py, docs/lora.md)
    lora_rank: int = option(0, "rank r of low-rank adapters (LoRA, Hu et al., arXiv 2106.09685): "
                            "the model's weights stay frozen and AdamW trains only A [r, in] and "
                            "B [out, r] of each --lora-targets projection, W + (alpha / r) B A; "
                            "the sampler decodes with the merged weights, the KL reference is the "
                            "model with its adapters off, checkpoints hold the adapters in PEFT's "
                            "format. 0 = off: full fine-tuning, as in the paper",
                            check=zero_is("off: full fine-tuning"))
    lora_alpha: float = option(16.0, "LoRA's alpha: the adapters' update is scaled by alpha / "
                               "--lora-rank", check=POSITIVE)
    lora_dropout: float = option(0.0, "dropout on each adapter's input in the update (PEFT's "
                                 "lora_dropout; 0 = none)", check=BELOW_1)
    lora_targets: str = option(",".join(PROJECTIONS), "the projections of every block that get "
                               "adapters, comma-separated, named as in Hugging Face checkpoints "
                               "and PEFT's target_modules")

    # --- supervised warm start (the demo: teach a random model the answer format before RL)
    sft_steps: int = option(0, "teacher-forced steps on the data's worked solutions before RL, at "
                            "most (0 = none; with --sft-target-accuracy the warm start may stop "
                            "sooner)", check=zero_is("none"))
    sft_lr: float = option(1e-3, "AdamW learning rate of the warm start", check=STEP_SIZE)
    sft_batch_size: int = option(32, "problems per warm-start step", check=AT_LEAST_1)
    sft_target_accuracy: float = option(0.0, "stop the warm start once greedy accuracy on "
                                        "--sft-dev-problems training problems kept out of it "
                                        "reaches this, so that RL starts from the same skill on "
                                        "any CPU (0 = always run --sft-steps)",
                                        check=(lambda v: 0 <= v <= 1, "must be in [0, 1] (0 = "
                                               "off)"))
    sft_dev_problems: int = option(100, "with --sft-target-accuracy: the last N training "
                                   "problems, held out of the warm start and scored greedily "
                                   "every --sft-eval-every steps", check=AT_LEAST_1)
    sft_eval_every: int = option(25, "with --sft-target-accuracy: warm-start steps between two "
                                 "dev checks", check=AT_LEAST_1)

    # --- the run
    preset: str = option("", "the --preset the run started from (set by --preset, recorded in "
                         "config.json; not a flag of its own)")
    seed: int = option(0, "seed of data order, rollouts and initialisation",  # torch.manual_seed, 64-bit hashes
                       check=(lambda v: 0 <= v < 2**63, "must be in [0, 2^63)"))
    max_steps: int = option(0, "training steps to run (0 = one pass over the data)",
                            check=zero_is("one pass over the data"))
    out_dir: str = option("runs/ngrpo", "directory for config.json, metrics.jsonl, checkpoints and "
                          "summary.json", check=NONEMPTY)
    save_every: int = option(50, "write a checkpoint every N steps (0 = only at the end)",
                             check=zero_is("only at the end"))
    keep_last: int = option(2, "checkpoints kept on disk, older ones deleted (0 = keep every one)",
                            check=zero_is("keep all"))
    resume: bool = option(False, "continue exactly from the latest complete checkpoint in "
                          "--out-dir")
    overwrite: bool = option(False, "start a new run in an --out-dir that holds an earlier run, "
                             "deleting all of it (checkpoints, metrics, completions, warm start, "
                             "...; without it such a run stops at once, except that the tiny and "
                             "demo presets replace their own earlier output; ignored with "
                             "--resume)")
    allow_config_change: bool = option(False, "with --resume: continue even though settings other "
                                       "than how the run is driven (steps, saving, logging, "
                                       "device) differ from the checkpoint's")
    log_completions_every: int = option(10, "print two sample completions every N steps and "
                                        "append them to OUT/completions.jsonl (0 = never)",
                                        check=zero_is("never"))
    report_to: str = option("", "also send metrics, the config and logged completions to: "
                            "tensorboard, wandb (comma-separated; optional packages; "
                            "metrics.jsonl stays the record); empty = none",
                            check=(lambda v: all(n.strip() in REPORTERS for n in v.split(",")), "takes "
                                   "tensorboard, wandb or both (comma-separated)"))
    eval_data: str = option("", "held-out problems for accuracy before / after training (a file or "
                            "arith:...); empty = the test split of a built-in --data, else none")
    eval_problems: int = option(0, "held-out problems scored (greedy) before and after training "
                                "(0 = no held-out eval)", check=zero_is("no held-out eval"))
    eval_every: int = option(0, "also score the held-out problems every N steps (0 = only before "
                             "and after)", check=zero_is("only before and after"))
    device: str = option("", "cuda or cpu (empty = cuda when available; under torchrun each rank "
                         "uses cuda:LOCAL_RANK)",
                         check=(lambda v: v in ("", "cpu", "cuda") or v.startswith("cuda:"), "must "
                                "be cpu, cuda or cuda:N"))
    dist_timeout_s: float = option(1800.0, "under torchrun: a rank that waits this long for the "
                                   "others (one hung or died) stops the job with an error instead "
                                   "of waiting for ever", check=POSITIVE)

    # --- validation during training: eval.py's protocol on benchmarks, as the released runs did
    val_data: str = option("", "benchmarks sampled and scored during training, as eval.py's "
                           "--benchmarks (aime24, ..., or .jsonl files); empty = no validation",
                           check=(lambda v: v == "" or all(n.strip() for n in v.split(",")), "names "
                                  "benchmarks separated by commas, none of them empty"))
    val_n: int = option(32, "samples per validation problem (Mean@n, Pass@k as eval.py reports "
                        "them)", check=AT_LEAST_1)
    val_limit: int = option(0, "only the first N problems of each validation set (0 = all)",
                            check=zero_is("all"))
    val_temperature: float = option(0.6, "sampling temperature of validation (0 = greedy)",
                                    check=zero_is("greedy"))
    val_top_p: float = option(0.95, "nucleus threshold of validation sampling", check=UNIT)
    val_every: int = option(0, "validate every N steps (0 = only after the last step)",
                            check=zero_is("only after the last step"))
    val_before_train: bool = option(False, "also validate the starting model (summary.json: "
                                    "val_before)")
    keep_best: str = option("", "keep the weights of the step with the highest value of this "
                            "validation metric (e.g. val/aime24/mean@32) in OUT/best, beside the "
                            "latest checkpoints")

    def __post_init__(self):
        found = problems(self) + [(name, message) for name, ok, message in combination_rules(self) if not ok]
        if found:
            raise ConfigError([(name, getattr(self, name), message) for name, message in found])

    @property
    def filters_tokens(self) -> bool:
        """Whether top-k, top-p or min-p removes tokens from the sampling distribution, thinking or
        after."""
        thinking = (self.top_p, self.top_k, self.min_p)
        after = (self.after_thinking_top_p, self.after_thinking_top_k, self.after_thinking_min_p)
        resolved = tuple(t if a == -1 else a for t, a in zip(thinking, after))
        return any(t != (1.0, 0, 0.0) for t in (thinking, resolved))

    def check_model(self, mc, model: str) -> None:
        """The rules that need the model's shape (mc: its model.ModelConfig): a count of tokens a knob of the
        chosen method declares within the vocabulary, and a LoRA rank within the projections it adapts. A
        ConfigError naming the flag."""
        reads, limit = knobs_read(self.explore), f"the vocabulary size of --model {model} ({mc.vocab_size})"
        found = [(f.name, f"must be {f.metadata['vocab']} {limit}") for f in fields(Knobs)
                 if f.name in reads and f.metadata["vocab"]
                 and not (getattr(self, f.name) < mc.vocab_size if f.metadata["vocab"] == "below"
                          else getattr(self, f.name) <= mc.vocab_size)]
        shapes = {name: shape for name, shape in projection_shapes(mc).items() if name not in unknown_targets(
            self.lora_targets) and name in {t.strip() for t in self.lora_targets.split(",")}}
        smallest = min(shapes.items(), key=lambda item: min(item[1]), default=None)
        if self.lora_rank and smallest and self.lora_rank > min(smallest[1]):
            found.append(("lora_rank", f"must be at most {min(smallest[1])}, the smaller side of {smallest[0]} "
                                       f"({smallest[1][0]} -> {smallest[1][1]}) of --model {model}: a higher rank "
                                       "adds nothing a full update would not"))
        if found:
            raise ConfigError([(name, getattr(self, name), message) for name, message in found])

    def check_trainable(self) -> None:
        """The rules that only training adds: a ValueError naming what to change."""
        if self.temperature == 0:
            raise ValueError("--temperature 0: greedy decoding: every response of a group would be the same "
                             "and GRPO would have no signal; train with --temperature > 0")

    def to_dict(self) -> dict:
        """The settings as a reader meets them (reading_order), as config.json holds them."""
        values = asdict(self)
        return {f.name: values[f.name] for f in reading_order()}

    def save_json(self, path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load_json(cls, path) -> "Config":
        """A saved config.json; a file that is not one gives a ValueError that names it."""
        try:
            values = json.loads(Path(path).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not a JSON config ({error})") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a config is a JSON object of field: value, not {type(values).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - known.keys())
        if unknown:
            raise ValueError(f"{path}: unknown config keys {unknown} (a method's knobs from outside the repo "
                             "come with its module in NGRPO_STRATEGIES)")
        for name, value in values.items():
            kind = known[name].type
            # JSON writes 1e-6 and 0.0 faithfully but an integer-valued float may come back as an
            # int.
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                values[name] = float(value)
            elif not isinstance(values[name], kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{path}: {name} must be {kind.__name__}, not {type(value).__name__} {value!r}")
        return cls(**values)


def reading_order() -> list:
    """Config's fields as a reader meets them: its own in order, the methods' knobs right after
    --explore."""
    knobs = fields(Knobs)
    own = [f for f in fields(Config) if f.name not in KNOBS]
    at = next(i for i, f in enumerate(own) if f.name == "explore") + 1
    return own[:at] + list(knobs) + own[at:]


# ----------------------------------------------------------------------------- which flag needs which


def combination_rules(c: Config) -> list[tuple[str, bool, str]]:
    """(the field a message names, whether its setting agrees with the others, message): the rules
    that relate two fields; each field's own range is beside it."""
    bad_targets = ", ".join(map(repr, unknown_targets(c.lora_targets)))
    return [
        ("early_stopping_entropy_threshold", c.early_stopping_entropy_threshold == 0 or bool(c.stop_mixing_token)
         or "early_stopping_entropy_threshold" not in knobs_read(c.explore),
         "Cold Stop forces --stop-mixing-token, which is empty"),
        ("mix_feed", c.mix_feed == "sampler" or c.explore != "none", "replay-only needs an exploration strategy "
         "that records mixtures (--explore none records none)"),
        ("mini_batch_prompts", c.mini_batch_prompts < 1 or c.prompts_per_step % c.mini_batch_prompts == 0,
         f"must divide --prompts-per-step ({c.prompts_per_step})"),
        ("old_logp", c.old_logp == "replay" or not c.filters_tokens, "rollout needs --top-p 1, --top-k 0 and "
         "--min-p 0 (and so after thinking): with filtering the sampler's log-probs are of the filtered "
         "distribution and the replayed ones are not"),
        *[("explore", ok, f"{c.explore} (its loss scores each step's candidates) needs {needs}")
          for ok, needs in strategy_needs(c)],
        ("rollout_is", c.rollout_is == "none" or c.old_logp == "replay", "needs --old-logp replay: with "
         "rollout the old policy's log-probs are the sampler's own, so every weight would be 1"),
        ("rollout_is", c.rollout_is == "none" or c.temperature > 0, "needs --temperature > 0: a greedy "
         "sampler's log-probs (at temperature 1) are not those of the distribution its tokens were drawn from"),
        ("keep_best", not c.keep_best or (c.val_data and c.keep_best.startswith("val/")), "names a validation "
         "metric (val/<benchmark>/mean@<n> or pass@<k>) and needs --val-data"),
        ("refill", not c.refill or c.filter_groups != "none", "needs --filter-groups: with nothing filtered "
         "there is nothing to refill"),
        ("lora_targets", not bad_targets, f"names {bad_targets}, not a projection adapters can wrap; choose "
         f"among {', '.join(PROJECTIONS)}"),
        ("pass_k", c.pass_k <= c.group_size, f"must be at most --group-size ({c.group_size}): pass@k of a "
         "group of G responses"),
        ("entropy_target", c.entropy_target == 0 or c.entropy_coef > 0, "needs --entropy-coef > 0, the "
         "adaptive coefficient's ceiling"),
        ("overlong_buffer", c.overlong_buffer <= c.max_new_tokens, f"must be at most --max-new-tokens "
         f"({c.max_new_tokens})"),
    ]


def strategy_needs(c: Config) -> list[tuple[bool, str]]:
    """(whether it holds, what it is) for each setting the chosen strategy's loss cannot do without:
    what it declares (Strategy.requires), and, where its loss scores more than the sampled token,
    the replayed old log-probs and the KL in the loss."""
    strategy = STRATEGIES[c.explore]
    needs = [(getattr(c, name) == value, f"--{name.replace('_', '-')} {value}: {why}")
             for name, value, why in strategy.requires]
    if strategy.loss_logp is not None:
        needs += [(c.old_logp == "replay", "--old-logp replay: the sampler records log p(y)"),
                  (not c.kl_in_reward, "the KL in the loss, not --kl-in-reward")]
    return needs


# The flags of thinking's end: read by every strategy that mixes (Strategy.mixes), with its own
# knobs.
THINKING = ("stop_mixing_token", "after_thinking_top_k", "after_thinking_top_p", "after_thinking_min_p")


def knobs_read(explore: str) -> tuple[str, ...]:
    """The flags --explore `explore` reads: its strategy's knobs, and THINKING's if it mixes."""
    strategy = STRATEGIES[explore]
    return strategy.reads + THINKING * strategy.mixes


def method_knobs() -> dict[str, dict[str, tuple[str, ...]]]:
    """For each flag that picks a method from a registry (--explore, --adv-estimator): method -> the
    flags it reads. A flag some method of the registry reads does something only when the chosen
    method reads it."""
    return {"explore": {name: knobs_read(name) for name in STRATEGIES},
            "adv_estimator": {name: estimator.knobs for name, estimator in ADVANTAGES.items()}}


JUDGE = ("judge", "judge_timeout_s", "judge_max_calls", "judge_both_orders", "judge_positives")  # --judge's flags

# Flags that do something only with another setting (beyond the methods' knobs, method_knobs): given
# on the command line (with a value other than the default) without it, they are refused rather than
# silently ignored.
IDLE_WITHOUT = {
    **dict.fromkeys(("warmup_steps", "min_lr_ratio"), (lambda c: c.lr_schedule == "cosine",
                                                       "--lr-schedule cosine")),
    "loss_agg_rows": (lambda c: c.loss_agg == "token-mean-per-rows", "--loss-agg token-mean-per-rows"),
    "entropy_coef_delta": (lambda c: c.entropy_target > 0, "--entropy-target"),
    **dict.fromkeys(("kl_estimator", "kl_in_reward"), (lambda c: c.kl_coef > 0, "--kl-coef > 0")),
    "max_refill_draws": (lambda c: c.refill, "--refill"),
    "rollout_is_cap": (lambda c: c.rollout_is != "none", "--rollout-is (a mode other than none)"),
    "rollout_is_lower": (lambda c: c.rollout_is.endswith("mask"), "--rollout-is token-mask or sequence-mask"),
    "overlong_penalty_factor": (lambda c: c.overlong_buffer > 0, "--overlong-buffer N"),
    "length_shaping_alpha": (lambda c: c.length_shaping == "gr3", "--length-shaping gr3"),
    **dict.fromkeys(("sft_lr", "sft_batch_size", "sft_dev_problems", "sft_eval_every"),
                    (lambda c: c.sft_steps > 0, "--sft-steps N")),
    **dict.fromkeys(("val_n", "val_limit", "val_temperature", "val_top_p", "val_every", "val_before_train"),
                    (lambda c: bool(c.val_data), "--val-data")),
    **dict.fromkeys(THINKING[1:], (lambda c: bool(c.stop_mixing_token), "a --stop-mixing-token (it ends "
                                                                           "thinking)")),
    "eval_data": (lambda c: c.eval_problems > 0, "--eval-problems N (how many of its problems to score)"),
    "eval_every": (lambda c: c.eval_problems > 0, "--eval-problems N"),
    "sft_target_accuracy": (lambda c: c.sft_steps > 0, "--sft-steps N (the warm start it may stop early)"),
    **dict.fromkeys(JUDGE[1:], (lambda c: bool(c.judge), "--judge")),
    **dict.fromkeys(("lora_alpha", "lora_dropout", "lora_targets"), (lambda c: c.lora_rank > 0,
                                                                     "--lora-rank N")),
}


def idle_flags(cfg: Config, given) -> None:
    """Refuses flags in `given` (names of fields set on the command line, to a value other than the
    default) that cfg's other settings ignore: a method's knob under another method, or a flag of
    IDLE_WITHOUT without what it needs."""
    defaults = Config()
    changed = [name for name in given if getattr(cfg, name) != getattr(defaults, name)]
    found = []
    for chooser, methods in method_knobs().items():
        chosen, flag = getattr(cfg, chooser), "--" + chooser.replace("_", "-")
        for name in changed:
            readers = [method for method, knobs in methods.items() if name in knobs]
            if readers and chosen not in readers:
                only = f"{flag} {listing(readers)}" if len(readers) < len(methods) - 1 else \
                    f"an {flag} other than {chosen}"
                found.append((name, f"has no effect with {flag} {chosen} (only with {only})"))
    found += [(name, f"has no effect without {needed}") for name in changed if name in IDLE_WITHOUT
              for active, needed in [IDLE_WITHOUT[name]] if not active(cfg)]
    if found:
        raise ConfigError([(name, getattr(cfg, name), message) for name, message in found])


# Fields that say how a run is driven rather than what it computes: they may change on --resume.
RUN_CONTROL_FIELDS = ("preset", "max_steps", "out_dir", "save_every", "keep_last", "resume", "overwrite",
                      "allow_config_change", "log_completions_every", "eval_every", "device", "val_every",
                      "val_before_train", "report_to", "dist_timeout_s", "reward_timeout_s",
                      "reward_fail_steps")


_1P5B = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
_7B = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
# What every released config (verl ppo_trainer + configs/*.yaml) ran beyond our defaults: verl's
# token mean per micro-batch of 2 sequences per GPU averaged over micro-batches; validation on
# AIME24 before training and after every step (val n 32, temperature 0.6, top-p 0.95) keeping the
# best checkpoint by its mean@32; a checkpoint every 10 steps, one kept.
_RELEASED = dict(loss_agg="token-mean-per-rows", loss_agg_rows=2, val_data="aime24", val_n=32, val_every=1,
                 val_before_train=True, keep_best="val/aime24/mean@32", save_every=10, keep_last=1)
# Rows decoded per call so that the whole run fits one 80 GB GPU (1.5B) or each of 8 (7B): `train.py
# --plan` shows the memory; responses do not depend on it (docs/distributed.md).
_ROWS_1P5B, _ROWS_7B = dict(rollout_batch_size=64), dict(rollout_batch_size=32)
# In the released N-GRPO runs the mixed embedding lookup runs where FSDP gathers the weights without
# writing gradients back: the input embeddings never change.
_MIXING_RUN = dict(freeze_embeddings=True)
_SMALL = dict(model="tiny", tokenizer="tiny", data="arith", max_prompt_tokens=256, max_new_tokens=24,
              prompts_per_step=16, mini_batch_prompts=8, micro_batch_size=64, lr=2e-4, kl_coef=0.0,
              save_every=0, log_completions_every=0, grad_checkpointing=False)

_DEMO = dict(_SMALL, instruction="", sft_steps=600, sft_lr=3e-3, sft_target_accuracy=0.6, sft_eval_every=2,
             group_size=4, prompts_per_step=32, mini_batch_prompts=32, micro_batch_size=128, max_steps=120,
             eval_problems=200, eval_every=20, log_completions_every=20)

PRESETS: dict[str, dict] = {
    # The released code's recipes (configs/*.yaml of github.com/ZJUSCL/N-GRPO;
    # docs/paper-vs-release.md): the dataclass defaults plus what the released runs did beyond them.
    "paper-1.5b": dict(_RELEASED, **_MIXING_RUN, **_ROWS_1P5B, model=_1P5B),  # n-grpo_1_5b.yaml
    "paper-7b": dict(_RELEASED, **_MIXING_RUN, **_ROWS_7B, model=_7B, mix_rate=0.15,  # n-grpo_7b.yaml
                     num_neighbors=2, lr=1e-6, kl_coef=0.001),
    "grpo-1.5b": dict(_RELEASED, **_ROWS_1P5B, model=_1P5B, explore="none", lr=1e-6, kl_coef=0.001),  # grpo_1_5b.yaml
    "grpo-7b": dict(_RELEASED, **_ROWS_7B, model=_7B, explore="none", lr=1e-6, kl_coef=0.001),  # grpo_7b.yaml
    # N-GSPO: the 1.5B recipe with GSPO's sequence-level ratio and its per-sequence mean.
    "n-gspo-1.5b": dict(_RELEASED, **_MIXING_RUN, **_ROWS_1P5B, model=_1P5B, loss="gspo",
                        loss_agg="seq-mean-token-mean"),
    # NGRPO, Negative-enhanced GRPO (Nan et al. 2025)'s recipe: calibrated advantages, clip 0.16 /
    # 0.24, all-correct groups dropped, no KL. It keeps the default N-GRPO mixing (--explore
    # neighbor) since the two compose; add --explore none for NGRPO alone.
    "negative-grpo": dict(_ROWS_1P5B, model=_1P5B, adv_estimator="negative", clip_low=0.16, clip_high=0.24,
                          filter_groups="all_correct", kl_coef=0.0),
    # SofT-GRPO's recipes (github.com/zz1358m/SofT-GRPO-master, SofT-GRPO-deepscaler-8k.sh for the
    # 1.5B and SofT-GRPO-deepscaler-8k-qwen7.sh for the 7B, which differ in the model alone here):
    # 64 prompts x 8 (l. 6, 46), mini-batches of 32 (l. 14), lr 1e-6 (l. 12), low-var KL 0.001 in
    # the loss (l. 16-19), no entropy bonus (l. 20), temperature 1, top-p 0.95, top-k 5 (l. 29-31;
    # the soft top-k is the rollout's top_k, sglang_rollout.py l. 394) and the same top-p / top-k
    # after thinking (l. 33-34), Gumbel-softmax temperature 0.1 (l. 35), noise factor 1 (l. 40),
    # prompts up to 1,024 and responses up to 8,192 tokens (l. 8-9), one epoch (l. 62). Their actor
    # feeds the replayed inputs detached (verl workers/actor/dp_actor.py l. 210): the embeddings never
    # train. Their loss is a token mean per micro-batch of ppo_micro_batch_size_per_gpu rows (l. 15:
    # 2 for the 1.5B, 1 for the 7B), the micro-batches averaged (dp_actor.py l. 451, 535; verl's
    # token-mean, dynamic batch size off): token-mean-per-rows of 2 rows, and of 1, a per-sequence mean.
    **{name: dict(model=model, explore="soft-grpo", soft_top_k=5, top_k=5, top_p=0.95, temperature=1.0,
                  after_thinking_top_p=0.95, after_thinking_top_k=5, noise_factor=1.0,
                  gumbel_temperature=0.1, prompts_per_step=64, group_size=8, mini_batch_prompts=32, lr=1e-6,
                  kl_coef=0.001, kl_estimator="low-var", entropy_coef=0.0, max_prompt_tokens=1024,
                  max_new_tokens=8192, freeze_embeddings=True, **agg, **rows)
       for name, model, agg, rows in (
           ("soft-grpo-1.5b", _1P5B, dict(loss_agg="token-mean-per-rows", loss_agg_rows=2), _ROWS_1P5B),
           ("soft-grpo-7b", _7B, dict(loss_agg="seq-mean-token-mean"), _ROWS_7B))},
    # Multiplex Thinking's 7B recipe (github.com/MaxLEAF3824/Multiplex-Thinking): the README's
    # training command for DeepSeek-R1-Distill-Qwen-7B (README.md l. 83-96: --enable_unweighting
    # True, 300 steps, --train_batch_size 128, --multiplex_width 3, --max_response_length 4096,
    # --val_rollout_n 4 --val_dataset math), the rest as scripts/train.sh sets it: lr 1e-6 (l. 364),
    # one optimizer step per batch (ppo_mini_batch_size = the batch, l. 367), no KL (l. 371-372),
    # temperature 1.0 and top-p 1.0 (l. 195, 191), replacement (l. 239), no entropy bonus (l. 416),
    # n = 8 (l. 418), prompts up to 1,024 tokens (l. 358). Their loss weighs each dynamic micro-batch's
    # token mean by its share of the mini-batch's rows (use_dynamic_bsz, l. 368-369, 32,768 tokens a
    # GPU: verl dp_actor.py l. 645-646): no mode here forms their token-budget partition, so this one
    # keeps the token mean over the mini-batch (the two agree where every micro-batch's rows have the
    # same mean length; elsewhere a token's weight differs by that ratio).
    "multiplex-7b": dict(**_ROWS_7B, model=_7B, explore="multiplex", multiplex_width=3, multiplex_weights="uniform",
                         multiplex_replacement=True, max_steps=300, prompts_per_step=128, mini_batch_prompts=128,
                         group_size=8, max_new_tokens=4096, max_prompt_tokens=1024, lr=1e-6, kl_coef=0.0,
                         temperature=1.0, top_p=1.0, entropy_coef=0.0, val_data="math500", val_n=4),
    # The random tiny model on built-in arithmetic: every code path, offline, in seconds on a CPU.
    "tiny": dict(_SMALL, out_dir="runs/tiny", max_steps=4),
    # The offline demo: the random tiny model is taught the answer format on worked solutions until
    # it answers 60% of 100 dev problems greedily at two checks in a row (a competence target, not a
    # step count: the same starting skill on any CPU), then 120 N-GRPO steps raise its greedy
    # accuracy on 200 held-out problems. Counts up to 5 keep the distinct sums and differences few
    # (40), so RL meets each many times; prompts without the R1 instruction halve a step's cost;
    # rollouts at temperature 0.7, where the tiny model's samples at 1.0 carry stray tokens whose
    # noise drowns the signal of its greedy errors (BENCHMARKS.md, "The demo").
    "demo": dict(_DEMO, out_dir="runs/demo", data="arith:max_count=5", temperature=0.7),
    # The thinking testbed (docs/experiments.md): two-step problems whose worked solutions think, close the block
    # and answer, R1's shape (`5-3=2. 2*3=6.\n</think>\n\n\\boxed{6}`; </think> one token of the tiny
    # tokenizer), so that mixing stops at </think> and Cold Stop can end thinking as at full scale. Warm start to
    # 40% (more room for RL than the demo's 60%), 200 steps at temperature 1 (the soft-token authors' own).
    "demo-think": dict(_DEMO, out_dir="runs/demo-think", data="arith:difficulty=2,max_count=5,think=1",
                       max_new_tokens=48, sft_target_accuracy=0.4, max_steps=200, eval_every=40),
}


def preset(name: str) -> Config:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return Config(**PRESETS[name], preset=name)


# Presets whose runs are quick to make again: a new run of one replaces that same preset's earlier
# output in its --out-dir without --overwrite. Any other run there (another preset's, or one from
# before presets were recorded) is kept unless the command line says --overwrite.
REPLACES_ITS_OWN_OUTPUT = ("tiny", "demo", "demo-think")
