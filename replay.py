"""The replay: what training computes from a rollout's record before any loss. Every response position is fed
what the sampler fed, sum_k w_k E[id_k] (strategies.mixed_embeddings, the one formula both sides use; plus the
noise a strategy recorded, redrawn from its key), so the policy, the old policy and the reference are scored on
the inputs the sampler actually fed (the paper's released code replays the recorded mixtures the same way);
gradients reach E through the mixtures. Sequences are laid out [prompt | response] and right-padded, so plain
causal attention is exact for every real token.

    logp, entropy = sequence_logprobs(model, rollout.prompts, rollout.cand_ids, rollout.cand_weights,
                                      rollout.lengths, rollout.response_ids, temperature=1.0)   # [B, T] each

Log-probs come from hidden states `chunk_tokens` positions at a time (token_logprobs): the [B, T, V] logits of a
long response never exist at once, in the forward or the backward.
"""

import torch
import torch.nn.functional as F

from strategies import mixed_embeddings, normal_from_keys


def _chunk_logprobs(hidden, weight, labels, temperature):
    """(log p(label), entropy) of one chunk [c], and its log-softmax [c, V] (fp32)."""
    if temperature != 1.0:  # (h / tau) W^T = (h W^T) / tau, with d divisions per position instead of V
        hidden = hidden / temperature
    log_probs = F.linear(hidden, weight).float().log_softmax(-1)  # [c, V]: the only vocabulary-sized tensor
    logp = log_probs.gather(-1, labels[:, None])[:, 0]
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy, log_probs


def logprob_stats(logits: torch.Tensor, labels: torch.Tensor):
    """(log p(label), entropy, log-sum-exp) [c] each, fp32, from logits [c, V] in any float dtype: what
    _chunk_logprobs computes, in the form one fused pass over the logits can (the entropy as lse - sum p z)."""
    z = logits.float()
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, labels[:, None])[:, 0] - lse
    entropy = lse - (torch.exp(z - lse[:, None]) * z).sum(-1)
    return logp, entropy, lse


def logits_grad(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, grad_logp: torch.Tensor):
    """d loss / d logits [c, V] (in the logits' dtype) given d loss / d log p(label) [c]: g (onehot - p)."""
    onehot = torch.arange(logits.shape[-1], device=logits.device)[None] == labels[:, None]
    return (grad_logp[:, None] * (onehot.float() - torch.exp(logits.float() - lse[:, None]))).to(logits.dtype)


_FUSED: dict[str, object] = {}


def fused_logprob_ops():
    """(logprob_stats, logits_grad) under torch.compile, each one fused kernel over a chunk's logits (a GPU reads
    the bf16 logits once or twice instead of writing and rereading fp32 copies); None where compiling failed."""
    if "ops" not in _FUSED:
        from model import compiled

        _FUSED["ops"] = (compiled(logprob_stats, "inductor"), compiled(logits_grad, "inductor"))
    return _FUSED["ops"]


def _fused_or_none(device: torch.device):
    """The fused functions on a GPU (None on a CPU, whose log_softmax path is the reference)."""
    return fused_logprob_ops() if device.type == "cuda" and _FUSED.get("ops", True) is not None else None


def _fused_failed(error: Exception) -> None:
    import warnings

    _FUSED["ops"] = None
    warnings.warn(f"the fused log-prob kernels failed to compile ({type(error).__name__}: {str(error)[:200]}); "
                  "using log_softmax", stacklevel=3)


class ChunkedLogprobs(torch.autograd.Function):
    """log p(label) and the entropy of softmax(h W^T / tau), `chunk_tokens` rows at a time, with a backward
    that recomputes one chunk's logits at a time instead of storing any of them.

    It is what autograd computes through F.linear -> log_softmax -> gather (the gradient of the logits is
    g (onehot - p)), without autograd's bookkeeping: the entropy (no gradient) is not recomputed in the
    backward, and the weight is cast to the autocast dtype once per pass, not once per chunk. On a GPU the
    softmax statistics and the logits' gradient are one compiled kernel each (logprob_stats, logits_grad), and the
    forward keeps each row's log-sum-exp for the backward; on a CPU they are log_softmax as written."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, hidden, weight, labels, temperature: float, chunk_tokens: int):
        fused = _fused_or_none(hidden.device)
        logps, entropies, lses = [], [], []
        with torch.no_grad():
            for start in range(0, labels.shape[0], chunk_tokens):
                end = start + chunk_tokens
                if fused is not None:
                    h = hidden[start:end] / temperature if temperature != 1.0 else hidden[start:end]
                    try:
                        logp, entropy, lse = fused[0](F.linear(h, weight), labels[start:end])
                    except Exception as error:  # noqa: BLE001 - any compile failure: the plain path instead
                        _fused_failed(error)
                        fused = None
                if fused is None:
                    logp, entropy, lse = _chunk_logprobs(hidden[start:end], weight, labels[start:end], temperature)
                    lse = None
                logps.append(logp)
                entropies.append(entropy)
                lses.append(lse)
        lse = torch.cat(lses) if fused is not None else hidden.new_empty(0)
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        entropy = torch.cat(entropies)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logps), entropy

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, labels, lse = ctx.saved_tensors
        tau = ctx.temperature
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else weight.dtype
        weight_cast = weight.to(dtype)  # what F.linear under autocast multiplies by, cast once
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        fused = _fused_or_none(hidden.device) if lse.numel() else None
        for start in range(0, labels.shape[0], ctx.chunk_tokens):
            end = start + ctx.chunk_tokens
            h = hidden[start:end] / tau if tau != 1.0 else hidden[start:end]
            h = h.to(dtype)
            g = grad_logp[start:end]  # [c]
            logits = F.linear(h, weight_cast)  # [c, V]
            if fused is not None:
                grad_logits = fused[1](logits, lse[start:end], labels[start:end], g)
            else:
                log_probs = logits.float().log_softmax(-1)
                grad_logits = (-(log_probs.exp_() * g[:, None])).scatter_add_(
                    -1, labels[start:end, None], g[:, None]).to(dtype)
            if grad_hidden is not None:
                grad_h = grad_logits.mm(weight_cast)
                grad_hidden[start:end] = grad_h / tau if tau != 1.0 else grad_h
            if grad_weight is not None:
                grad_weight += grad_logits.t().mm(h)
        return grad_hidden, grad_weight, None, None, None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                   chunk_tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and the full-vocabulary entropy at each position, from hidden states [..., d] and the
    output matrix [V, d], at the sampling temperature. [...] each; the entropy carries no gradient.

    Logits exist for `chunk_tokens` positions at a time, and under autograd each chunk is recomputed in
    the backward pass instead of stored (ChunkedLogprobs), so memory is O(chunk_tokens x V), never
    O(B x T x V)."""
    shape = labels.shape
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    logp, entropy = ChunkedLogprobs.apply(hidden, weight, labels, temperature, chunk_tokens)
    return logp.view(shape), entropy.view(shape)


def replay_inputs(embed_weight: torch.Tensor, prompts: list[list[int]], cand_ids: torch.Tensor,
                  cand_weights: torch.Tensor, lengths: torch.Tensor, noise_keys: torch.Tensor | None = None,
                  noise_scales: torch.Tensor | None = None):
    """The training forward's inputs for rollout rows: [prompt | fed response inputs], right-padded; a step
    with recorded noise (noise_scales [B, T] > 0, `orthogonal_noise`) gets it back from its key.

    Returns inputs_embeds [B, L, d] and pred_pos [B, T]: the position whose output predicts response
    token t (prompt length - 1 + t). The input after the last response token is never needed."""
    device = embed_weight.device
    B, T = cand_ids.shape[:2]
    prompt_lens = torch.tensor([len(p) for p in prompts], device=device)
    L = int((prompt_lens + lengths.to(device) - 1).max())
    positions = torch.arange(L, device=device)
    # Position j of row b holds prompt token j while j < P_b, then the input fed at response step j - P_b.
    step = (positions[None] - prompt_lens[:, None]).clamp(0, T - 1)  # [B, L]
    in_prompt = positions[None] < prompt_lens[:, None]
    prompt_ids = torch.zeros(B, L, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, : len(prompt)] = torch.tensor(prompt, device=device)
    ids = torch.where(in_prompt[..., None], prompt_ids[..., None], cand_ids.to(device).gather(
        1, step[..., None].expand(-1, -1, cand_ids.shape[-1])))  # [B, L, K]
    weights = cand_weights.to(device).gather(1, step[..., None].expand(-1, -1, cand_weights.shape[-1]))
    own_row = torch.zeros_like(weights)
    own_row[..., 0] = 1.0
    weights = torch.where(in_prompt[..., None], own_row, weights)  # a prompt token: its own row, weight 1
    pred_pos = (prompt_lens[:, None] - 1 + torch.arange(T, device=device)[None]).clamp(max=L - 1)  # [B, T]
    inputs = mixed_embeddings(embed_weight, ids, weights)  # [B, L, d]
    if noise_scales is not None and bool((noise_scales > 0).any()):
        scales = torch.where(in_prompt, 0.0, noise_scales.to(device).gather(1, step))  # [B, L]
        noisy = scales > 0
        keys = noise_keys.to(device).gather(1, step)[noisy]  # [M]
        noise = torch.zeros(*inputs.shape, device=device)
        noise[noisy] = scales[noisy, None] * normal_from_keys(keys, inputs.shape[-1])  # as the sampler drew it
        inputs = (inputs.float() + noise).to(inputs.dtype)
    return inputs, pred_pos


def sequence_logprobs(model, prompts, cand_ids, cand_weights, lengths, response_ids, *, temperature: float = 1.0,
                      chunk_tokens: int = 1024, noise_keys: torch.Tensor | None = None,
                      noise_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Replays rollout rows through `model` and returns (log p of each response token, entropy), [B, T]
    each; positions past a row's length hold values that the response mask ignores."""
    inputs, pred_pos = replay_inputs(model.embed_tokens.weight, prompts, cand_ids, cand_weights, lengths,
                                     noise_keys, noise_scales)
    hidden = model.forward_hidden(inputs_embeds=inputs)  # [B, L, d], causal: right padding is harmless
    hidden = hidden.gather(1, pred_pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, T, d]
    return token_logprobs(hidden, model.output_weight, response_ids.to(hidden.device), temperature=temperature,
                          chunk_tokens=chunk_tokens)
