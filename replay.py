"""The replay: what training computes from a rollout's record before any loss.

    logp_t = log_softmax(h_t W^T / tau)[y_t],   H_t = entropy(softmax(h_t W^T / tau)),   h = model(fed inputs)

(Multiplex Thinking and SofT-GRPO also score each candidate c_{t,k} a step recorded: log_softmax(h_t
W^T / tau)[c_{t,k}].)

Every response position is fed what the sampler fed: the strategy's `feed` rebuilds it from the
step's record (strategies.Strategy; by default the recorded mixture sum_k w_k E[id_k],
strategies.mixed_embeddings, the one formula both sides use). So the policy, the old policy and the
reference are scored on the inputs the sampler actually fed (the paper's released code replays the
recorded mixtures the same way), and gradients reach E through the mixtures. Sequences are laid out
[prompt | response] and right-padded, so plain causal attention is exact for every real token.

    logp, entropy = sequence_logprobs(model, rollout, temperature=1.0)   # [B, T] each, both differentiable

The log-probs and entropies come from hidden states a chunk of positions at a time
(engine/logprobs.py): the [B, T, V] logits of a long response never exist at once, in the forward or
the backward.
"""

import torch

from engine.logprobs import token_logprobs
from engine.packing import packed_hidden
from rollout import Rollout
from strategies import STRATEGIES


def replay_inputs(embed_weight: torch.Tensor, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """The training forward's inputs for rollout rows: [prompt | fed response inputs], right-padded.

    Returns inputs_embeds [B, L, d] and pred_pos [B, T]: the position whose output predicts response
    token t (prompt length - 1 + t). The input after the last response token is never needed."""
    device = embed_weight.device
    B, T = rollout.response_ids.shape
    prompt_lens = torch.tensor([len(p) for p in rollout.prompts], device=device)
    L = int((prompt_lens + rollout.lengths.to(device) - 1).max())
    positions = torch.arange(L, device=device)
    # Position j of row b holds prompt token j while j < P_b, then the input fed at response step j - P_b.
    step = (positions[None] - prompt_lens[:, None]).clamp(0, T - 1)  # [B, L]
    in_prompt = positions[None] < prompt_lens[:, None]
    prompt_ids = torch.zeros(B, L, dtype=torch.long, device=device)
    for row, prompt in enumerate(rollout.prompts):
        prompt_ids[row, : len(prompt)] = torch.tensor(prompt, device=device)
    steps = {}
    for f in rollout.fields:  # each recorded field at every position [B, L, ...]; a prompt token is fed as itself
        value = rollout.steps[f.name].to(device)
        index = step if value.dim() == 2 else step[..., None].expand(-1, -1, value.shape[-1])
        at_prompt = torch.full_like(value[:1, :1], rollout.pad_id if f.pad is None else f.pad)
        if f.name in ("response_ids", "cand_ids"):
            at_prompt = prompt_ids if value.dim() == 2 else prompt_ids[..., None]
        elif f.name == "cand_weights":  # its own row, weight 1
            at_prompt = torch.zeros_like(value[:1, :1])
            at_prompt[..., 0] = 1.0
        where = in_prompt if value.dim() == 2 else in_prompt[..., None]
        steps[f.name] = torch.where(where, at_prompt, value.gather(1, index))
    pred_pos = (prompt_lens[:, None] - 1 + torch.arange(T, device=device)[None]).clamp(max=L - 1)  # [B, T]
    return STRATEGIES[rollout.strategy].feed(embed_weight, steps), pred_pos


def sequence_logprobs(model, rollout: Rollout, *, temperature: float = 1.0, chunk_tokens: int = 1024,
                      packed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Replays rollout rows through `model` and returns (log p of each response token, entropy), [B, T] each, both
    with their gradients; positions past a row's length hold values that the response mask ignores. A strategy
    whose loss scores its candidates (Strategy.loss_logp: Multiplex Thinking, SofT-GRPO) gets [B, T, 1 + K]: log p(y),
    then log p of each candidate. packed: the rows end to end, no padded position computed (engine/packing.py)."""
    inputs, pred_pos = replay_inputs(model.embed_tokens.weight, rollout)
    if packed:  # [B, T, d] read from the packed sequence
        lengths = [len(p) + n - 1 for p, n in zip(rollout.prompts, rollout.lengths.tolist())]
        hidden = packed_hidden(model, inputs, lengths, pred_pos)
    else:
        hidden = model.forward_hidden(inputs_embeds=inputs)  # [B, L, d], causal: right padding is harmless
        hidden = hidden.gather(1, pred_pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, T, d]
    labels = STRATEGIES[rollout.strategy].labels(rollout.steps)  # y [B, T], or [y, c_1..c_K] [B, T, 1 + K]
    return token_logprobs(hidden, model.output_weight, labels.to(hidden.device), temperature=temperature,
                          chunk_tokens=chunk_tokens)
