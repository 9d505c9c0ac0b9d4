"""The replay's log-probs and entropies without [B, T, V] logits: a custom autograd Function over chunks of positions.

    logp, entropy = token_logprobs(hidden, weight, labels, temperature=tau)   # [...] each; both differentiable

computes log softmax(h W^T / tau)[label] and the entropy of softmax(h W^T / tau) at every position, as autograd
would through F.linear -> log_softmax -> gather, but `chunk_tokens` positions at a time: the backward recomputes one
chunk's logits at a time instead of storing any of them, so memory is O(chunk_tokens x V), never O(B x T x V).
Labels [..., K] (K tokens per position, as Multiplex Thinking samples) give log p of each: logp [..., K].

The gradient of the logits z of a chunk is sum_k g_k (onehot(y_k) - p) from the log-probs (g (onehot(y) - p) for
one label), plus, when a loss uses the entropy H = -sum p log p, g_H (-p (log p + H)) (dH/dz_j = -p_j (log p_j +
H)). A loss that does not use the entropy pays nothing for it: autograd then hands the backward no entropy
gradient, and the term is not computed.

On a GPU the softmax statistics and the logits' gradient are one compiled kernel each (logprob_stats, logits_grad),
and the forward keeps each row's log-sum-exp for the backward; on a CPU they are log_softmax as written.
"""

import warnings

import torch
import torch.nn.functional as F

from engine.kernels import compiled


def _chunk_logprobs(hidden, weight, labels, temperature):
    """(log p(labels) [c, K], entropy [c]) of one chunk (labels [c, K]), and its log-softmax [c, V] (fp32)."""
    if temperature != 1.0:  # (h / tau) W^T = (h W^T) / tau, with d divisions per position instead of V
        hidden = hidden / temperature
    log_probs = F.linear(hidden, weight).float().log_softmax(-1)  # [c, V]: the only vocabulary-sized tensor
    logp = log_probs.gather(-1, labels)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy, log_probs


def logprob_stats(logits: torch.Tensor, labels: torch.Tensor):
    """(log p(labels) [c, K], entropy [c], log-sum-exp [c]), fp32, from logits [c, V] in any float dtype and labels
    [c, K]: what _chunk_logprobs computes, in the form one fused pass over the logits can (H = lse - sum p z)."""
    z = logits.float()
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, labels) - lse[:, None]
    entropy = lse - (torch.exp(z - lse[:, None]) * z).sum(-1)
    return logp, entropy, lse


def _label_grad(logits: torch.Tensor, labels: torch.Tensor, grad_logp: torch.Tensor) -> torch.Tensor:
    """sum_k g_k onehot(y_k) [c, V] fp32 for labels and d loss / d log p(labels), [c, K] each (a label drawn twice
    counts twice)."""
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    return ((vocab[None, None] == labels[..., None]).float() * grad_logp[..., None]).sum(1)


def logits_grad(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, grad_logp: torch.Tensor):
    """d loss / d logits [c, V] (in the logits' dtype) given d loss / d log p(labels) [c, K]: sum_k g_k (onehot_k -
    p)."""
    p = torch.exp(logits.float() - lse[:, None])
    return (_label_grad(logits, labels, grad_logp) - grad_logp.sum(-1, keepdim=True) * p).to(logits.dtype)


def logits_grad_with_entropy(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, grad_logp: torch.Tensor,
                             grad_entropy: torch.Tensor, entropy: torch.Tensor):
    """logits_grad plus the entropy's part, g_H (-p (log p + H)), given d loss / d entropy [c] and the entropy."""
    log_p = logits.float() - lse[:, None]
    p = torch.exp(log_p)
    grad = _label_grad(logits, labels, grad_logp) - grad_logp.sum(-1, keepdim=True) * p \
        - grad_entropy[:, None] * p * (log_p + entropy[:, None])
    return grad.to(logits.dtype)


_FUSED: dict[str, tuple | None] = {}


def fused_logprob_ops() -> tuple | None:
    """(logprob_stats, logits_grad, logits_grad_with_entropy) under torch.compile, each one fused kernel over a
    chunk's logits (a GPU reads the bf16 logits once or twice instead of writing and rereading fp32 copies); None
    where compiling failed."""
    if "ops" not in _FUSED:
        _FUSED["ops"] = tuple(compiled(fn, "inductor") for fn in (logprob_stats, logits_grad, logits_grad_with_entropy))
    return _FUSED["ops"]


def _fused_or_none(device: torch.device):
    """The fused functions on a GPU (None on a CPU, whose log_softmax path is the reference)."""
    return fused_logprob_ops() if device.type == "cuda" and _FUSED.get("ops", True) is not None else None


def _fused_failed(error: Exception) -> None:
    _FUSED["ops"] = None
    warnings.warn(f"the fused log-prob kernels failed to compile ({type(error).__name__}: {str(error)[:200]}); "
                  "using log_softmax", stacklevel=3)


def _forward_chunk(fused, hidden, weight, labels, temperature):
    """(log p, entropy, lse or None, fused or None) of one chunk: the fused kernel where it runs, else log_softmax."""
    if fused is not None:
        h = hidden / temperature if temperature != 1.0 else hidden
        try:
            logp, entropy, lse = fused[0](F.linear(h, weight), labels)
            return logp, entropy, lse, fused
        except Exception as error:  # noqa: BLE001 - any compile failure: the plain path instead
            _fused_failed(error)
    logp, entropy, _ = _chunk_logprobs(hidden, weight, labels, temperature)
    return logp, entropy, None, None


class ChunkedLogprobs(torch.autograd.Function):
    """log p(labels) [N, K] (labels [N, K]) and the entropy [N] of softmax(h W^T / tau), `chunk_tokens` rows at a
    time, with a backward that recomputes one chunk's logits at a time instead of storing any of them (the module
    docstring).

    It is what autograd computes through F.linear -> log_softmax -> gather (and the entropy), without autograd's
    bookkeeping: the weight is cast to the autocast dtype once per pass, not once per chunk."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, hidden, weight, labels, temperature: float, chunk_tokens: int):
        fused = _fused_or_none(hidden.device)
        logps, entropies, lses = [], [], []
        with torch.no_grad():
            for start in range(0, labels.shape[0], chunk_tokens):
                end = start + chunk_tokens
                logp, entropy, lse, fused = _forward_chunk(fused, hidden[start:end], weight, labels[start:end],
                                                           temperature)
                logps.append(logp)
                entropies.append(entropy)
                lses.append(lse)
        lse = torch.cat(lses) if fused is not None else hidden.new_empty(0)
        entropy = torch.cat(entropies)
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.temperature, ctx.chunk_tokens = temperature, chunk_tokens
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None: its term is skipped
        return torch.cat(logps), entropy

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:
            return None, None, None, None, None
        if grad_logp is None:
            grad_logp = torch.zeros_like(labels, dtype=entropy.dtype)
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
            g = grad_logp[start:end]  # [c, K]
            g_entropy = None if grad_entropy is None else grad_entropy[start:end]
            logits = F.linear(h, weight_cast)  # [c, V]
            if fused is not None and g_entropy is None:
                grad_logits = fused[1](logits, lse[start:end], labels[start:end], g)
            elif fused is not None:
                grad_logits = fused[2](logits, lse[start:end], labels[start:end], g, g_entropy, entropy[start:end])
            else:
                grad_logits = _logits_grad(logits, labels[start:end], g, g_entropy, entropy[start:end], dtype)
            if grad_hidden is not None:
                grad_h = grad_logits.mm(weight_cast)
                grad_hidden[start:end] = grad_h / tau if tau != 1.0 else grad_h
            if grad_weight is not None:
                grad_weight += grad_logits.t().mm(h)
        return grad_hidden, grad_weight, None, None, None


def _logits_grad(logits, labels, g, g_entropy, entropy, dtype):
    """The logits' gradient of one chunk by log_softmax (the CPU path; labels and g [c, K]): sum_k g_k (onehot_k -
    p), + g_H (-p (log p + H))."""
    log_probs = logits.float().log_softmax(-1)
    g_sum = g.sum(-1, keepdim=True)  # [c, 1]; for one label g itself, bit for bit
    if g_entropy is None:  # in place: the chunk's logits and this one [c, V] buffer at the backward's peak
        return log_probs.exp_().mul_(-g_sum).scatter_add_(-1, labels, g).to(dtype)
    probs = log_probs.exp()
    grad = (-(probs * g_sum)).scatter_add_(-1, labels, g)
    return (grad - g_entropy[:, None] * probs * (log_probs + entropy[:, None])).to(dtype)


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                   chunk_tokens: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(label) and the full-vocabulary entropy at each position, from hidden states [..., d] and the output
    matrix [V, d], at the sampling temperature: [...] each, both differentiable (ChunkedLogprobs). Labels [..., K]
    (one more axis than the positions'): log p of each of the K labels, [..., K]; the entropy stays [...]."""
    positions = hidden.shape[:-1]
    per_position = 1 if labels.shape == positions else labels.shape[-1]
    logp, entropy = ChunkedLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight,
                                          labels.reshape(-1, per_position), temperature, chunk_tokens)
    return logp.view(labels.shape), entropy.view(positions)
