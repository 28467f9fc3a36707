"""The PyTorch cross-check: runs tests/torch/dump_models (tapegrad, double), then recomputes every
case it wrote with PyTorch's own modules in float64 (torch.nn.MultiheadAttention, nn.LayerNorm,
nn.Linear, nn.Embedding, F.gelu, F.cross_entropy, torch.optim.Adam and AdamW, the lr_scheduler
classes, clip_grad_norm_), never with a transcription of tapegrad's formulas, and asserts that
forward values, gradients, training losses and trained parameters agree to 1e-9 relative.
Cases: multi-head attention (composed and fused kernels, causal with a query offset, padding,
self- and cross-attention), the retrieval model (both kernels; 20 Adam steps), one transformer
block (both kernels, GELU tanh and erf), the whole transformer's logits and gradients (both
kernels), 20 steps of the char-LM's training (AdamW, warm-up + cosine, clipping), and six AdamW
steps of the LLaMA-style decoder against a PyTorch model written from the formulas (RMSNorm, RoPE
in both pairings, grouped-query attention, SwiGLU) at 1e-12 relative, whose trained weights are
then written here as a safetensors file under Hugging Face's names and read by tapegrad to the
same logits; and the other way, the safetensors files tapegrad's writer made of its own final
decoder weights in F64, F32, BF16 and F16 against the files written here from the same values:
the same names, dtypes and shapes, and byte-identical data (each value rounded once to nearest
even on both sides, so exactly one right answer).

usage: cross_check.py DUMP_MODELS_BINARY [--fault NAME] [--keep DIR] [--verbose]
       cross_check.py DUMP_MODELS_BINARY --charlm-default STEPS   (the example's default run, minutes)

Without --fault: exit 0 when every case agrees, 1 when any disagrees (each disagreement named).
With --fault NAME (the negative control): the driver perturbs some cases (it marks them
"fault_applied" in their meta.json); exit 0 only when exactly those cases are rejected and every
other case still agrees, so the control proves the comparison can fail and fails where it should.
Exit 77 (CTest's skip code here) when torch or numpy cannot be imported.

Mapping onto torch.nn.MultiheadAttention (tapegrad's conventions are models/multihead.hpp's):
tapegrad projects rows, Q = X·W_Q with W_Q [D × D]; torch computes X·Wᵀ, so in_proj_weight is
[W_Qᵀ; W_Kᵀ; W_Vᵀ] and out_proj.weight is W_Oᵀ, with no biases (bias=False: zero biases).
Head h takes columns h·dh..(h+1)·dh on both sides; torch scales the queries by 1/√head_dim, the
same 1/√dh. Causality with a query offset is a boolean attn_mask [Tq, Tk] (True = hidden: key j
after absolute position offset + i); padding is key_padding_mask [B, Tk] (True = padded key).
Padded query rows differ by convention: tapegrad hides them entirely (output exactly 0, no
gradient, models/masks.hpp) while torch still attends from them, so torch's upstream gradient is
zeroed on those rows, outputs are compared on real rows only, and tapegrad's padded rows are
asserted to be exactly 0.
"""
import argparse
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as error:  # CTest maps 77 to "skipped"
    print(f"SKIPPED: torch or numpy cannot be imported ({error}); install Debian's python3-torch")
    sys.exit(77)

# Agreement threshold, fixed before running: max |tapegrad − torch| / max |torch| over each tensor
# (relative to the tensor's largest entry, because an entry that is a sum of cancelling terms is
# only accurate relative to the size of those terms). Both sides evaluate the same functions in
# IEEE double and differ only in the order of summation and in library kernels: each reduction
# of n terms (n ≤ a few hundred here) contributes a relative error of order n·2⁻⁵³ ≈ 1e-14, and
# softmax and log-sum-exp are well conditioned at these scales. Twenty Adam steps compound this
# at most a few hundredfold. 1e-9 leaves four to five orders of margin over rounding, while any
# modelling difference (a mask, a scale, a transposed weight) moves values by 1e-2 or more, and
# the negative controls show that a learning rate off by 1e-6 relative is already caught.
TOLERANCE = 1e-9

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)  # one thread, as the C++ side: the machine is shared, and results do not depend on it
# SequentialLR switches schedulers by calling step(0) on the next one, which torch 1.13 itself
# reports as deprecated; the warning is about torch's internals, not about this script.
warnings.filterwarnings("ignore", message="The epoch parameter in `scheduler.step\\(\\)`")


class Disagreement(Exception):
    pass


class Case:
    """One directory written by dump_models: meta.json and its .npy files."""

    def __init__(self, directory):
        self.directory = directory
        self.name = directory.name
        self.meta = json.loads((directory / "meta.json").read_text())
        self.worst = 0.0
        self.notes = []
        self.compared = []  # (label, relative difference), for --verbose

    def array(self, name):
        return np.load(self.directory / f"{name}.npy")

    def tensor(self, name, requires_grad=False):
        return torch.tensor(self.array(name), dtype=torch.float64, requires_grad=requires_grad)

    def indices(self, name):
        values = self.array(name)
        assert np.all(values == np.round(values)), f"{name} holds non-integers"
        return torch.tensor(values.astype(np.int64))

    def compare(self, label, ours, theirs, tolerance=None):
        """Asserts max |ours − theirs| / max |theirs| <= tolerance (TOLERANCE unless given)."""
        tolerance = TOLERANCE if tolerance is None else tolerance
        theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
        ours = np.asarray(ours)
        if ours.shape != theirs.shape:
            raise Disagreement(f"{label}: shape {ours.shape} (tapegrad) vs {theirs.shape} (torch)")
        scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
        difference = float(np.max(np.abs(ours - theirs))) if theirs.size else 0.0
        relative = difference / scale if scale > 0 else difference
        self.worst = max(self.worst, relative)
        self.compared.append((label, relative))
        if not relative <= tolerance:
            where = np.unravel_index(int(np.argmax(np.abs(ours - theirs))), theirs.shape)
            raise Disagreement(f"{label}: max |tapegrad − torch| / max |torch| = {relative:.3e} > {tolerance:g} "
                               f"(worst at {tuple(int(i) for i in where)}: tapegrad {ours[where]!r}, "
                               f"torch {theirs[where]!r})")


# ---- Multi-head attention ---------------------------------------------------------------------

def torch_multihead(weights, heads):
    """torch.nn.MultiheadAttention holding tapegrad's W_Q, W_K, W_V, W_O (see the module comment)."""
    D = weights["W_Q"].shape[0]
    module = torch.nn.MultiheadAttention(D, heads, bias=False, batch_first=True)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([weights["W_Q"].T, weights["W_K"].T, weights["W_V"].T]))
        module.out_proj.weight.copy_(weights["W_O"].T)
    return module


def multihead_gradients(module):
    """d W_Q, d W_K, d W_V, d W_O in tapegrad's layout, from the module's parameter gradients."""
    dQ, dK, dV = module.in_proj_weight.grad.chunk(3)
    return {"dW_Q": dQ.T, "dW_K": dK.T, "dW_V": dV.T, "dW_O": module.out_proj.weight.grad.T}


def causal_attn_mask(query_count, key_count, query_offset):
    """True where query i (at absolute position query_offset + i) may not see key j."""
    positions = torch.arange(query_count).unsqueeze(1) + query_offset
    return torch.arange(key_count).unsqueeze(0) > positions


def check_multihead(case):
    meta = case.meta
    self_attention = meta["self_attention"]
    if self_attention:
        X = case.tensor("X", requires_grad=True)
        X_q = X_kv = X
    else:
        X_q = case.tensor("X_q", requires_grad=True)
        X_kv = case.tensor("X_kv", requires_grad=True)
    B, Tq, Tk = X_q.shape[0], X_q.shape[1], X_kv.shape[1]
    offset = meta["query_offset"]
    module = torch_multihead({k: case.tensor(k) for k in ("W_Q", "W_K", "W_V", "W_O")}, meta["heads"])
    attn_mask = causal_attn_mask(Tq, Tk, offset) if meta["causal"] else None
    lengths = meta["lengths"]
    key_padding_mask = None
    real_rows = torch.ones(B, Tq, dtype=torch.bool)
    if lengths:
        key_padding_mask = torch.arange(Tk).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
        real_rows = (torch.arange(Tq).unsqueeze(0) + offset) < torch.tensor(lengths).unsqueeze(1)
    Y, A = module(X_q, X_kv, X_kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=True,
                  average_attn_weights=False)
    G = case.tensor("G") * real_rows.unsqueeze(-1)  # padded query rows carry no loss (module comment)
    (Y * G).sum().backward()

    ours_Y = case.array("Y")
    real = real_rows.numpy()
    case.compare("Y (real rows)", ours_Y[real], Y[real_rows])
    if np.any(ours_Y[~real] != 0.0):
        raise Disagreement("Y: tapegrad's padded query rows are not exactly zero")
    if meta["kernel"] == "composed":
        case.compare("A (real rows)", case.array("A").transpose(0, 2, 1, 3)[real],
                     A.transpose(1, 2)[real_rows])
    if self_attention:
        case.compare("dX", case.array("dX"), X.grad)
    else:
        case.compare("dX_q", case.array("dX_q"), X_q.grad)
        case.compare("dX_kv", case.array("dX_kv"), X_kv.grad)
    for name, gradient in multihead_gradients(module).items():
        case.compare(name, case.array(name), gradient)


# ---- The retrieval model (models/retrieval.hpp), from torch building blocks -------------------

class TorchRetrieval(torch.nn.Module):
    """X = E[key] + E[value] + P[position]; causal multi-head attention; the last position's
    output times W_U gives the logits over values."""

    def __init__(self, parameters, heads):
        super().__init__()
        self.tokens = torch.nn.Embedding.from_pretrained(parameters["E"], freeze=False)
        self.positions = torch.nn.Embedding.from_pretrained(parameters["P"], freeze=False)
        self.attention = torch_multihead(parameters, heads)
        self.readout = torch.nn.Linear(*parameters["W_U"].shape, bias=False)
        with torch.no_grad():
            self.readout.weight.copy_(parameters["W_U"].T)

    def forward(self, key_tokens, value_tokens):
        T = key_tokens.shape[1]
        X = self.tokens(key_tokens) + self.tokens(value_tokens) + self.positions(torch.arange(T))
        Y, _ = self.attention(X, X, X, attn_mask=causal_attn_mask(T, T, 0), need_weights=False)
        return self.readout(Y[:, -1, :])

    def ordered_parameters(self):
        """The parameters in tapegrad's order (E, P, in_proj = [W_Q; W_K; W_V], W_O, W_U)."""
        return [self.tokens.weight, self.positions.weight, self.attention.in_proj_weight,
                self.attention.out_proj.weight, self.readout.weight]

    def tapegrad_layout(self, tensors):
        """Tensors shaped like ordered_parameters() -> dict in tapegrad's names and layouts."""
        E, P, in_proj, W_O_t, W_U_t = tensors
        W_Q_t, W_K_t, W_V_t = in_proj.chunk(3)
        return {"E": E, "P": P, "W_Q": W_Q_t.T, "W_K": W_K_t.T, "W_V": W_V_t.T, "W_O": W_O_t.T, "W_U": W_U_t.T}


RETRIEVAL_NAMES = ("E", "P", "W_Q", "W_K", "W_V", "W_O", "W_U")


def check_retrieval(case):
    model = TorchRetrieval({k: case.tensor(k) for k in RETRIEVAL_NAMES}, case.meta["heads"])
    logits = model(case.indices("key_tokens"), case.indices("value_tokens"))
    loss = F.cross_entropy(logits, case.indices("targets"))
    loss.backward()
    case.compare("logits", case.array("logits"), logits)
    case.compare("loss", case.array("loss"), loss)
    gradients = model.tapegrad_layout([p.grad for p in model.ordered_parameters()])
    for name in RETRIEVAL_NAMES:
        case.compare(f"d{name}", case.array(f"d{name}"), gradients[name])


def check_retrieval_training(case):
    meta = case.meta
    model = TorchRetrieval({k: case.tensor(f"initial_{k}") for k in RETRIEVAL_NAMES}, meta["heads"])
    adam = meta["adam"]
    # torch.optim.Adam is models/optimizer.hpp's Adam: m, v moving averages, step
    # lr·(m/(1−β1^t)) / (√(v/(1−β2^t)) + ε); elementwise, so torch's transposed and stacked
    # parameter layout does not matter.
    optimizer = torch.optim.Adam(model.ordered_parameters(), lr=adam["learning_rate"],
                                 betas=(adam["beta1"], adam["beta2"]), eps=adam["epsilon"])
    losses = []
    for step in range(meta["steps"]):
        optimizer.zero_grad()
        logits = model(case.indices(f"key_tokens_{step}"), case.indices(f"value_tokens_{step}"))
        loss = F.cross_entropy(logits, case.indices(f"targets_{step}"))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    case.compare("losses of the 20 steps", case.array("losses"), np.array(losses))
    final = model.tapegrad_layout([p.detach() for p in model.ordered_parameters()])
    for name in RETRIEVAL_NAMES:
        case.compare(f"final {name}", case.array(f"final_{name}"), final[name])


# ---- The transformer (models/transformer.hpp) and the char-LM (models/charlm.hpp) ------------
# Built from torch.nn.LayerNorm, torch.nn.MultiheadAttention, torch.nn.Linear, F.gelu (1.13 has
# approximate='tanh', GPT-2's form, and the exact erf form as 'none'), nn.Embedding, F.linear with
# the embedding's own weight for the tied output, F.cross_entropy.

BLOCK_PARTS = ("ln1.gain", "ln1.bias", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "ln2.gain", "ln2.bias",
               "mlp.W_1", "mlp.b_1", "mlp.W_2", "mlp.b_2")


def layer_norm(gain, bias, epsilon):
    module = torch.nn.LayerNorm(gain.shape[0], eps=epsilon)
    with torch.no_grad():
        module.weight.copy_(gain)
        module.bias.copy_(bias)
    return module


def linear(W, b):
    """nn.Linear computing X·W + b for tapegrad's W [in × out] (torch's weight is Wᵀ)."""
    module = torch.nn.Linear(*W.shape)
    with torch.no_grad():
        module.weight.copy_(W.T)
        module.bias.copy_(b)
    return module


class TorchBlock(torch.nn.Module):
    """Pre-norm decoder block: X + attn(ln1(X)), then X + W_2ᵀ·gelu(W_1ᵀ·ln2(X) + b_1) + b_2."""

    def __init__(self, p, meta):
        super().__init__()
        epsilon = meta["layer_norm_epsilon"]
        self.ln1 = layer_norm(p["ln1.gain"], p["ln1.bias"], epsilon)
        self.attn = torch_multihead({k: p[f"attn.{k}"] for k in ("W_Q", "W_K", "W_V", "W_O")}, meta["heads"])
        self.ln2 = layer_norm(p["ln2.gain"], p["ln2.bias"], epsilon)
        self.fc = linear(p["mlp.W_1"], p["mlp.b_1"])
        self.proj = linear(p["mlp.W_2"], p["mlp.b_2"])
        self.approximate = {"tanh": "tanh", "erf": "none"}[meta["gelu"]]

    def forward(self, X):
        T = X.shape[1]
        a = self.ln1(X)
        X = X + self.attn(a, a, a, attn_mask=causal_attn_mask(T, T, 0), need_weights=False)[0]
        return X + self.proj(F.gelu(self.fc(self.ln2(X)), approximate=self.approximate))

    def tapegrad_layout(self, get):
        """{part: get(torch tensor) in tapegrad's layout} (get: e.g. lambda t: t.grad)."""
        dQ, dK, dV = get(self.attn.in_proj_weight).chunk(3)
        return {"ln1.gain": get(self.ln1.weight), "ln1.bias": get(self.ln1.bias), "attn.W_Q": dQ.T,
                "attn.W_K": dK.T, "attn.W_V": dV.T, "attn.W_O": get(self.attn.out_proj.weight).T,
                "ln2.gain": get(self.ln2.weight), "ln2.bias": get(self.ln2.bias), "mlp.W_1": get(self.fc.weight).T,
                "mlp.b_1": get(self.fc.bias), "mlp.W_2": get(self.proj.weight).T, "mlp.b_2": get(self.proj.bias)}


class TorchCharLm(torch.nn.Module):
    """Token + learned position embeddings, L blocks, final LayerNorm, logits = ln_f(X)·Eᵀ (tied)."""

    def __init__(self, p, meta):
        super().__init__()
        self.tokens = torch.nn.Embedding.from_pretrained(p["E"], freeze=False)
        self.positions = torch.nn.Embedding.from_pretrained(p["P"], freeze=False)
        self.blocks = torch.nn.ModuleList(
            TorchBlock({part: p[f"block{l}.{part}"] for part in BLOCK_PARTS}, meta) for l in range(meta["layers"]))
        self.ln_f = layer_norm(p["ln_f.gain"], p["ln_f.bias"], meta["layer_norm_epsilon"])

    def forward(self, tokens):
        X = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            X = block(X)
        return F.linear(self.ln_f(X), self.tokens.weight)

    def tapegrad_layout(self, get):
        out = {"E": get(self.tokens.weight), "P": get(self.positions.weight),
               "ln_f.gain": get(self.ln_f.weight), "ln_f.bias": get(self.ln_f.bias)}
        for l, block in enumerate(self.blocks):
            out.update({f"block{l}.{k}": v for k, v in block.tapegrad_layout(get).items()})
        return out


def check_transformer_block(case):
    meta = case.meta
    block = TorchBlock({part: case.tensor(f"block0.{part}") for part in BLOCK_PARTS}, meta)
    X = case.tensor("X", requires_grad=True)
    Y = block(X)
    (Y * case.tensor("G")).sum().backward()
    case.compare("Y", case.array("Y"), Y)
    case.compare("dX", case.array("dX"), X.grad)
    for part, gradient in block.tapegrad_layout(lambda t: t.grad).items():
        case.compare(f"d block0.{part}", case.array(f"dblock0.{part}"), gradient)


def check_transformer_logits(case):
    meta = case.meta
    model = TorchCharLm({name: case.tensor(name) for name in meta["parameter_names"]}, meta)
    logits = model(case.indices("tokens"))
    (logits * case.tensor("G")).sum().backward()
    case.compare("logits", case.array("logits"), logits)
    for name, gradient in model.tapegrad_layout(lambda t: t.grad).items():
        case.compare(f"d {name}", case.array(f"d{name}"), gradient)


def warmup_cosine(optimizer, o):
    """nanoGPT's schedule from torch's own schedulers: LinearLR from peak/W to peak over the warm-up
    (factor (s + 1)/W at step s), CosineAnnealingLR from the peak to the floor over S − W steps,
    then ConstantLR holding the floor."""
    W, S, floor_ratio = o["warmup"], o["schedule_steps"], o["floor_ratio"]
    scheduler = torch.optim.lr_scheduler
    return scheduler.SequentialLR(optimizer, [
        scheduler.LinearLR(optimizer, start_factor=1 / W, end_factor=1.0, total_iters=W - 1),
        scheduler.CosineAnnealingLR(optimizer, T_max=S - W, eta_min=o["peak_rate"] * floor_ratio),
        scheduler.ConstantLR(optimizer, factor=floor_ratio, total_iters=10**9),
    ], milestones=[W, S])


def train_charlm(case, steps):
    """The torch model trained from the case's initial parameters on its batches; returns the model
    and, per step, the loss, the learning rate and the gradient norm before clipping."""
    meta, o = case.meta, case.meta["optimizer"]
    model = TorchCharLm({name: case.tensor(f"initial.{name}") for name in meta["parameter_names"]}, meta)
    parameters = list(model.parameters())
    # torch.optim.AdamW is models/optimizer.hpp's AdamW (decoupled decay θ·(1 − lr·λ) first, then
    # Adam's bias-corrected step); decay on matrices and embeddings only, as DecayScope::matrices.
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": o["weight_decay"]},
         {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}],
        lr=o["peak_rate"], betas=(o["beta1"], o["beta2"]), eps=o["epsilon"])
    schedule = warmup_cosine(optimizer, o)
    tokens, targets = case.indices("tokens"), case.indices("targets")
    losses, rates, norms = [], [], []
    for step in range(steps):
        optimizer.zero_grad()
        logits = model(tokens[step])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[step].reshape(-1))
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(parameters, o["clip_norm"]).item())
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return model, np.array(losses), np.array(rates), np.array(norms)


def check_charlm_training(case):
    meta, o = case.meta, case.meta["optimizer"]
    model, losses, rates, norms = train_charlm(case, meta["steps"])
    clipped = int(np.sum(norms > o["clip_norm"]))
    if not 0 < clipped < len(norms):  # both branches of clipping must be compared
        raise Disagreement(f"clipping acted in {clipped} of {len(norms)} steps; the case needs both kinds")
    # The losses and the final parameters first: they are the verdict (and what the negative
    # controls must trip); the rates and norms then locate a difference.
    case.compare(f"losses of the {meta['steps']} steps", case.array("losses"), losses)
    for name, value in model.tapegrad_layout(lambda t: t.detach()).items():
        case.compare(f"final {name}", case.array(f"final.{name}"), value)
    case.compare("learning rates", case.array("learning_rates"), rates)
    case.compare("gradient norms before clipping", case.array("gradient_norms"), norms)
    case.notes.append(f"clipped in {clipped} of {len(norms)} steps")


# The target for the default run: torch's validation bits per character within 3% of
# tapegrad's after the same number of steps from the same start on the same batches.
VALIDATION_TARGET = 0.03


def check_charlm_default(case):
    """The example's default run (--charlm-default STEPS): the first 20 steps to TOLERANCE as in
    charlm_training, then the validation bits per character after all steps within 3%; how far the
    two trajectories drift apart over the whole run is reported, not judged (rounding differences
    grow through thousands of steps)."""
    meta = case.meta
    model, losses, rates, norms = train_charlm(case, meta["steps"])
    first = min(20, meta["steps"])
    case.compare(f"losses of the first {first} steps", case.array("losses")[:first], losses[:first])
    case.compare("learning rates", case.array("learning_rates"), rates)
    with torch.no_grad():
        tokens, targets = case.indices("validation_tokens"), case.indices("validation_targets")
        total = 0.0
        for chunk in range(0, tokens.shape[0], 256):
            logits = model(tokens[chunk:chunk + 256])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[chunk:chunk + 256].reshape(-1),
                                     reduction="sum").item()
    torch_bits = total / targets.numel() / math.log(2)
    ours_bits = float(case.array("validation_loss")) / math.log(2)
    drift = np.max(np.abs(case.array("losses") - losses) / np.abs(losses))
    final = model.tapegrad_layout(lambda t: t.detach())
    parameter_drift = max(float(np.max(np.abs(case.array(f"final.{n}") - final[n].numpy())) / np.max(np.abs(final[n].numpy())))
                          for n in final)
    case.notes.append(f"validation {ours_bits:.4f} bits/char (tapegrad) vs {torch_bits:.4f} (torch) after "
                      f"{meta['steps']} steps; losses drift at most {drift:.2e}, final parameters {parameter_drift:.2e}")
    relative = abs(ours_bits - torch_bits) / torch_bits
    if not relative <= VALIDATION_TARGET:
        raise Disagreement(f"validation bits/char {ours_bits:.4f} (tapegrad) vs {torch_bits:.4f} (torch): "
                           f"{relative:.2%} apart, above {VALIDATION_TARGET:.0%}")


# ---- The LLaMA-style decoder (models/llama.hpp) ------------------------------------------------
# PyTorch 1.13 has no nn.RMSNorm, no rotary embedding and no grouped-query attention: each is written
# here from its formula (the papers' and Hugging Face's LLaMA code), not from tapegrad's code:
# RMSNorm x·rsqrt(mean(x²) + ε)·g; RoPE on complex pairs (Meta's interleaved pairing, torch.polar) or
# with rotate_half (Hugging Face's halves pairing); GQA by repeat_interleave of the key/value heads;
# softmax attention with a causal mask; SwiGLU F.silu(h·W_gate)·(h·W_up); torch.optim.AdamW. ALiBi
# (instead of RoPE) from the paper: head h's slope 2^(−8(h+1)/H) for H a power of two, bias
# −m_h·(i − j) on the causal scores; a sliding window of w keys hides j <= i − w.
# The decoder's own tolerance, fixed before running: 1e-12 relative (issue 40's target), 1000 times
# below the other cases' 1e-9. The two sides run the same functions in double in another summation
# order: sums of at most a few hundred terms (n·2⁻⁵³ ≈ 3e-14 each), through two blocks and six
# AdamW steps whose update m/(√v + ε) is of order the learning rate whatever the gradient's size.
LLAMA_TOLERANCE = 1e-12
DRIVER = None  # the dump_models binary (main), which also computes logits from a weights file


def rms_norm(x, gain, epsilon):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * gain


def rotary(x, first_position, base, pairing):
    """x [B, H, T, d] rotated at positions first_position..: θ = p·base^(−2i/d)."""
    d, T = x.shape[-1], x.shape[-2]
    frequencies = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(first_position, first_position + T, dtype=torch.float64), frequencies)
    if pairing == "interleaved":  # Meta's apply_rotary_emb: consecutive pairs as complex numbers
        turned = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2)) * torch.polar(torch.ones_like(angles), angles)
        return torch.view_as_real(turned).reshape(x.shape)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # Hugging Face's
    rotated_half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rotated_half * sin


class TorchLlama(torch.nn.Module):
    def __init__(self, p, meta):
        super().__init__()
        self.meta = meta
        self.params = torch.nn.ParameterDict({name.replace(".", "/"): torch.nn.Parameter(p[name].clone())
                                              for name in meta["parameter_names"]})

    def get(self, name):
        return self.params[name.replace(".", "/")]

    def attention(self, h, l):
        m, (B, T, D) = self.meta, h.shape
        H, H_kv = m["heads"], m["kv_heads"]
        dh = D // H

        def heads(W, n):
            return (h @ self.get(f"block{l}.attn.{W}")).reshape(B, T, n, dh).transpose(1, 2)

        Q, K, V = heads("W_Q", H), heads("W_K", H_kv), heads("W_V", H_kv)
        if not m["alibi"]:
            Q = rotary(Q, 0, m["rope_base"], m["rope_pairing"])
            K = rotary(K, 0, m["rope_base"], m["rope_pairing"])
        K, V = K.repeat_interleave(H // H_kv, dim=1), V.repeat_interleave(H // H_kv, dim=1)
        S = Q @ K.transpose(-1, -2) / math.sqrt(dh)
        position = torch.arange(T, dtype=torch.float64)
        if m["alibi"]:
            assert H & (H - 1) == 0, "the reference's slopes are the paper's for H a power of two"
            slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
            S = S - slopes.view(H, 1, 1) * (position.view(T, 1) - position.view(1, T))
        hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
        if m["window"]:
            hidden = hidden | torch.ones(T, T, dtype=torch.bool).tril(-m["window"])
        S = S.masked_fill(hidden, float("-inf"))
        O = torch.softmax(S, -1) @ V
        return O.transpose(1, 2).reshape(B, T, H * dh) @ self.get(f"block{l}.attn.W_O")

    def forward(self, tokens):
        m = self.meta
        X = self.get("E")[tokens]
        for l in range(m["layers"]):
            X = X + self.attention(rms_norm(X, self.get(f"block{l}.attn_norm.gain"), m["rms_epsilon"]), l)
            h = rms_norm(X, self.get(f"block{l}.mlp_norm.gain"), m["rms_epsilon"])
            X = X + (F.silu(h @ self.get(f"block{l}.mlp.W_gate")) * (h @ self.get(f"block{l}.mlp.W_up"))) @ \
                self.get(f"block{l}.mlp.W_down")
        out = self.get("E").T if m["tied"] else self.get("W_out")
        return rms_norm(X, self.get("norm_f.gain"), m["rms_epsilon"]) @ out


# A safetensors dtype's bytes per element.
SAFETENSORS_ITEM_SIZE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}


def bfloat16_bits(values):
    """The bfloat16 patterns (uint16) of float64 `values`, each rounded once from the double, to
    nearest with ties to even, on its integer significand M·2^E (see stored_bytes for why not
    torch's conversion): subnormals kept, ±inf past the largest finite's half spacing, NaN the
    quiet NaN of its sign."""
    fraction_bits, smallest = 7, -133  # bfloat16's stored fraction bits; its smallest spacing 2^-133
    infinity = 0x7f80
    patterns = []
    for bits in np.ascontiguousarray(values, dtype="<f8").reshape(-1).view("<u8").tolist():
        sign, biased, fraction = (bits >> 63) << 15, (bits >> 52) & 0x7ff, bits & ((1 << 52) - 1)
        if biased == 0x7ff:
            patterns.append(sign | (infinity if fraction == 0 else 0x7fc0))
            continue
        M, E = (fraction | 1 << 52, biased - 1075) if biased else (fraction, -1074)
        if M == 0:
            patterns.append(sign)
            continue
        q = max(M.bit_length() - 1 + E - fraction_bits, smallest)  # the spacing at |x|: 2^q
        shift = q - E  # ≥ 45: a double has 52 fraction bits, bfloat16 7
        n, rest, half = M >> shift, M & ((1 << shift) - 1), 1 << (shift - 1)
        if rest > half or (rest == half and n % 2 == 1):  # to nearest, ties to even
            n += 1
        # n·2^q: pattern (q − smallest)·2^7 + n, for subnormals (q = smallest, n < 2^7) and normals
        # alike; n = 2^8 carries into the next binade, and past the largest finite into inf.
        patterns.append(sign | min(((q - smallest) << fraction_bits) + n, infinity))
    return np.array(patterns, dtype="<u2").reshape(np.shape(values))


def stored_bytes(array, dtype):
    """`array` (float64) as `dtype`'s little-endian bytes, row-major, each element rounded once from
    the double to nearest with ties to even. numpy's astype to '<f4' and '<f2' convert from the
    double itself (npy_double_to_half works on the double's bits); torch's .to(torch.bfloat16) from
    float64 does not: it goes through float32 (c10::BFloat16 is built from a float), which rounds
    twice, so a double just above a bfloat16 midpoint can land on the midpoint in float32 and then
    go to even, below it (1 + 2^-8 + 2^-30 becomes 1, not 1 + 2^-7). Checked against exact rational
    rounding on 65,007 doubles (random ones over 2^-140..2^20, each format's midpoints and
    midpoints ± 2^-30 and ± 2^-45 of its spacing, subnormals, overflow): numpy's two conversions
    and bfloat16_bits rounded every one correctly, torch's bfloat16 rounded 6,108 of them twice.
    Hence BF16 by bfloat16_bits."""
    array = np.ascontiguousarray(array, dtype="<f8")
    if dtype == "F64":
        return array.tobytes()
    if dtype == "F32":
        return array.astype("<f4").tobytes()
    if dtype == "F16":
        return array.astype("<f2").tobytes()
    if dtype == "BF16":
        return bfloat16_bits(array).tobytes()
    raise ValueError(f"no such safetensors dtype {dtype!r}")


def save_safetensors(path, tensors, dtype="F64"):
    """The safetensors format written with numpy and json (no safetensors package here): 8 bytes of
    header length (little-endian), the JSON header padded with spaces to 8 bytes, the data of every
    tensor in `dtype` (stored_bytes)."""
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = stored_bytes(array, dtype)
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    pathlib.Path(path).write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def hugging_face_state(model):
    """The decoder's parameters as Hugging Face's LlamaForCausalLM names them, torch.nn.Linear
    weights [out, in] (the transposes of x·W's W)."""
    m = model.meta
    state = {"model.embed_tokens.weight": model.get("E")}
    for l in range(m["layers"]):
        layer, block = f"model.layers.{l}.", f"block{l}."
        state.update({layer + "input_layernorm.weight": model.get(block + "attn_norm.gain"),
                      layer + "post_attention_layernorm.weight": model.get(block + "mlp_norm.gain")})
        for ours, theirs in (("attn.W_Q", "self_attn.q_proj"), ("attn.W_K", "self_attn.k_proj"),
                             ("attn.W_V", "self_attn.v_proj"), ("attn.W_O", "self_attn.o_proj"),
                             ("mlp.W_gate", "mlp.gate_proj"), ("mlp.W_up", "mlp.up_proj"),
                             ("mlp.W_down", "mlp.down_proj")):
            state[layer + theirs + ".weight"] = model.get(block + ours).T
    state["model.norm.weight"] = model.get("norm_f.gain")
    if not m["tied"]:
        state["lm_head.weight"] = model.get("W_out").T
    return {name: value.detach().numpy() for name, value in state.items()}


def unique_keys(pairs):
    """json's object_pairs_hook: the object as a dict, refused when a key appears twice."""
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"key {twice[0]!r} given twice")
    return dict(pairs)


def read_safetensors(path):
    """A safetensors file held strictly to the format (the safetensors README): 8 bytes of header
    length N (little-endian), N bytes of a JSON object that begins with '{', has no key twice in any
    object and is followed only by spaces; each entry an object with a known dtype, a shape of
    counts and data_offsets [begin, end] inside the data whose length is the shape's; the tensors
    covering the data exactly, without overlap. Returns ({name: (dtype, shape, bytes)},
    __metadata__ or None); a Disagreement naming the file and the fault otherwise."""
    raw = pathlib.Path(path).read_bytes()

    def refuse(fault):
        return Disagreement(f"{pathlib.Path(path).name} is not a valid safetensors file: {fault}")

    if len(raw) < 8:
        raise refuse(f"{len(raw)} bytes, fewer than the header length's 8")
    length = int.from_bytes(raw[:8], "little")
    if length > len(raw) - 8:
        raise refuse(f"header of {length} bytes past the end of the file ({len(raw)} bytes)")
    header, data = raw[8:8 + length], raw[8 + length:]
    if not header.startswith(b"{"):
        raise refuse(f"header begins with {header[:1]!r}, not '{{'")
    try:
        text = header.decode("utf-8")
        entries, end = json.JSONDecoder(object_pairs_hook=unique_keys).raw_decode(text)
    except ValueError as error:  # not UTF-8, not JSON, or a key twice
        raise refuse(f"header: {error}") from None
    if set(text[end:]) - {" "}:
        raise refuse(f"header padded with {text[end:]!r}, not spaces only")
    metadata = entries.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise refuse("__metadata__ is not an object of strings")
    tensors, spans = {}, []
    for name, entry in entries.items():
        if not (isinstance(entry, dict) and {"dtype", "shape", "data_offsets"} <= entry.keys()):
            raise refuse(f"entry {name!r} is not an object with dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SAFETENSORS_ITEM_SIZE:
            raise refuse(f"{name!r}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise refuse(f"{name!r}: shape {shape!r} is not a list of counts")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= len(data)):
            raise refuse(f"{name!r}: data_offsets {offsets!r} not [begin, end] within the {len(data)} data bytes")
        if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_ITEM_SIZE[dtype]:
            raise refuse(f"{name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} of {dtype}")
        tensors[name] = (dtype, tuple(shape), data[offsets[0]:offsets[1]])
        spans.append((offsets[0], offsets[1], name))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            raise refuse(f"{name!r} begins at data byte {begin}, the tensors before it end at {covered}")
        covered = end
    if covered != len(data):
        raise refuse(f"data bytes {covered}..{len(data)} belong to no tensor")
    return tensors, metadata


def stored_values(dtype, data):
    """The elements of `dtype`'s bytes as their bit patterns and as float64 values (exactly)."""
    size = SAFETENSORS_ITEM_SIZE[dtype]
    patterns = np.frombuffer(data, dtype=f"<u{size}")
    if dtype == "BF16":  # a bfloat16 is a float32's upper half
        return patterns, (patterns.astype("<u4") << 16).view("<f4").astype(np.float64)
    return patterns, np.frombuffer(data, dtype={"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype]).astype(np.float64)


def weights_file_difference(ours, theirs, sources):
    """None when tapegrad's file `ours` and Python's `theirs` (read_safetensors) hold the same
    tensors; otherwise the first difference, in Python's order (Hugging Face's): names, metadata,
    then per tensor its dtype, shape and data (the first differing element's index, both patterns
    and values, and the double of `sources[name]` that Python rounded there)."""
    (ours, our_metadata), (theirs, their_metadata) = ours, theirs
    if ours.keys() != theirs.keys():
        return (f"names differ: only tapegrad's {sorted(ours.keys() - theirs.keys())}, "
                f"only Python's {sorted(theirs.keys() - ours.keys())}")
    if our_metadata != their_metadata:
        return f"__metadata__ {our_metadata!r} (tapegrad) vs {their_metadata!r} (Python)"
    for name, (dtype, shape, data) in theirs.items():
        our_dtype, our_shape, our_data = ours[name]
        if our_dtype != dtype:
            return f"{name}: dtype {our_dtype} (tapegrad) vs {dtype} (Python)"
        if our_shape != shape:
            return f"{name} ({dtype}): shape {list(our_shape)} (tapegrad) vs {list(shape)} (Python)"
        if our_data != data:
            (a, x), (b, y) = stored_values(dtype, our_data), stored_values(dtype, data)
            differing = np.flatnonzero(a != b)
            k, digits = int(differing[0]), 2 * SAFETENSORS_ITEM_SIZE[dtype]
            index = tuple(int(i) for i in np.unravel_index(k, shape))
            source = float(np.asarray(sources[name]).reshape(-1)[k])
            return (f"{name} ({dtype}, shape {list(shape)}) first differs at {index}: "
                    f"tapegrad 0x{int(a[k]):0{digits}x} = {x[k]!r}, Python 0x{int(b[k]):0{digits}x} = {y[k]!r}, "
                    f"from the double {source!r} ({len(differing)} of {a.size} elements differ)")
    return None


# The library's writer against Python's (io/safetensors.hpp, models/llama_weights.hpp's
# llama_safetensors). Exact, not a tolerance: both sides start from the same doubles (tapegrad's
# own final values, read back exactly from .npy) and round each once, to nearest with ties to even
# (what the library states and stored_bytes does), so each element has one right pattern and any
# byte that differs is a fault of one writer. The configs (D = 16, H = 4, dh = 4, F = 24, V = 11)
# make these non-square: k_proj and v_proj [H_kv·dh, D] when H_kv < H ([8, 16] in the llama_gqa_
# cases, [4, 16] in llama_mqa_halves_tied), gate_proj and up_proj [24, 16], down_proj [16, 24],
# lm_head [11, 16] in the untied cases (all but llama_mqa_halves_tied), embed_tokens [11, 16]
# (stored as is); q_proj, o_proj (and k_proj, v_proj in llama_mha_halves) are [16, 16]. A missing
# transpose shows as a wrong shape on the non-square ones, and as wrong bytes when the shape label
# is right (the weights_file_untransposed control) on all of them.
WEIGHTS_FILE_DTYPES = ("F64", "F32", "BF16", "F16")


def check_llama_weights_written(case):
    """final.<DTYPE>.safetensors written by tapegrad (dump_models) against the same final values
    put in Hugging Face's layout by hugging_face_state and written here, in every dtype."""
    names = case.meta["parameter_names"]
    state = hugging_face_state(TorchLlama({name: case.tensor(f"final.{name}") for name in names}, case.meta))
    differences = []
    with tempfile.TemporaryDirectory() as scratch:
        for dtype in WEIGHTS_FILE_DTYPES:
            ours = case.directory / f"final.{dtype}.safetensors"
            if not ours.exists():
                differences.append(f"{dtype}: dump_models wrote no {ours.name}")
                continue
            theirs = pathlib.Path(scratch) / f"python.{dtype}.safetensors"
            save_safetensors(theirs, state, dtype)
            difference = weights_file_difference(read_safetensors(ours), read_safetensors(theirs), state)
            if difference is not None:
                differences.append(f"{dtype}: {difference}")
    if differences:
        raise Disagreement("tapegrad's safetensors files differ from Python's for the same values: " +
                           "; ".join(differences))
    case.notes.append(f"weights files byte-identical to Python's in {', '.join(WEIGHTS_FILE_DTYPES)} "
                      f"({len(state)} tensors each)")


def check_llama_weights_file(case, model, tokens):
    """The trained torch model's weights written by Python as a safetensors file under Hugging
    Face's names, loaded by tapegrad (dump_models --llama-logits): the same logits."""
    m = case.meta
    with tempfile.TemporaryDirectory() as scratch:
        weights, token_file, logits_file = (pathlib.Path(scratch) / n for n in ("w.safetensors", "t.npy", "l.npy"))
        save_safetensors(weights, hugging_face_state(model))
        np.save(token_file, tokens.numpy().astype(np.float64))
        subprocess.run([DRIVER, str(logits_file), "--llama-logits", str(weights), str(token_file),
                        *(str(m[k]) for k in ("vocabulary", "width", "heads", "kv_heads", "layers", "hidden")),
                        "tied" if m["tied"] else "untied", m["rope_pairing"], "1" if m["alibi"] else "0",
                        str(m["window"])], check=True)
        ours = np.load(logits_file)
    with torch.no_grad():
        case.compare("logits from the safetensors file", ours, model(tokens), LLAMA_TOLERANCE)


def check_llama_training(case):
    """The loss and every gradient at the start, then every step's loss and the parameters after
    the AdamW steps, each to LLAMA_TOLERANCE."""
    meta, o = case.meta, case.meta["optimizer"]
    names = meta["parameter_names"]
    model = TorchLlama({name: case.tensor(f"initial.{name}") for name in names}, meta)
    parameters = [model.get(name) for name in names]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": o["weight_decay"]},
         {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}],
        lr=o["learning_rate"], betas=(o["beta1"], o["beta2"]), eps=o["epsilon"])
    tokens, targets = case.indices("tokens"), case.indices("targets")
    losses = []
    for step in range(meta["steps"]):
        optimizer.zero_grad()
        logits = model(tokens[step])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[step].reshape(-1))
        loss.backward()
        if step == 0:
            for name, p in zip(names, parameters):
                case.compare(f"d {name} at the start", case.array(f"d.{name}"), p.grad, LLAMA_TOLERANCE)
        optimizer.step()
        losses.append(loss.item())
    case.compare(f"losses of the {meta['steps']} steps", case.array("losses"), np.array(losses),
                   LLAMA_TOLERANCE)
    for name, p in zip(names, parameters):
        case.compare(f"final {name}", case.array(f"final.{name}"), p, LLAMA_TOLERANCE)
    check_llama_weights_file(case, model, tokens[0])
    check_llama_weights_written(case)


CHECKS = {
    "multihead": check_multihead,
    "retrieval": check_retrieval,
    "retrieval_training": check_retrieval_training,
    "transformer_block": check_transformer_block,
    "transformer_logits": check_transformer_logits,
    "charlm_training": check_charlm_training,
    "charlm_default": check_charlm_default,
    "llama_training": check_llama_training,
}


def run_checks(dump):
    """{case name: (case, None or the disagreement)} for every case directory."""
    results = {}
    for directory in sorted(p for p in dump.iterdir() if p.is_dir()):
        case = Case(directory)
        try:
            CHECKS[case.meta["model"]](case)
            results[case.name] = (case, None)
        except Disagreement as disagreement:
            results[case.name] = (case, disagreement)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("driver", help="the dump_models binary")
    parser.add_argument("--fault", default="none", help="negative control: the fault the driver injects")
    parser.add_argument("--keep", help="write the dump here and keep it (default: a temporary directory)")
    parser.add_argument("--verbose", action="store_true", help="print every comparison's relative difference")
    parser.add_argument("--charlm-default", type=int, metavar="STEPS",
                        help="only the example's default char-LM, trained STEPS steps on each side (minutes)")
    args = parser.parse_args()
    global DRIVER
    DRIVER = args.driver
    print(f"torch {torch.__version__}, float64, tolerance {TOLERANCE:g} relative")
    with tempfile.TemporaryDirectory() as scratch:
        dump = pathlib.Path(args.keep) if args.keep else pathlib.Path(scratch) / "dump"
        option = (["--charlm-default", str(args.charlm_default)] if args.charlm_default
                  else ["--fault", args.fault] if args.fault != "none" else [])
        subprocess.run([args.driver, str(dump)] + option, check=True)
        results = run_checks(dump)
    for name, (case, disagreement) in results.items():
        mark = "fault " if case.meta["fault_applied"] else ""
        if disagreement is None:
            notes = "".join(f"; {note}" for note in case.notes)
            print(f"agree     {mark}{name}: worst relative difference {case.worst:.2e}{notes}")
            for label, relative in case.compared if args.verbose else []:
                print(f"            {label}: {relative:.2e}")
        else:
            print(f"DISAGREE  {mark}{name}: {disagreement}")
    if args.fault == "none":
        failed = [name for name, (_, d) in results.items() if d is not None]
        print(f"{len(results) - len(failed)} of {len(results)} cases agree with PyTorch")
        return 1 if failed else 0
    perturbed = {name for name, (case, _) in results.items() if case.meta["fault_applied"]}
    rejected = {name for name, (_, d) in results.items() if d is not None}
    if perturbed and rejected == perturbed:
        print(f"negative control '{args.fault}': exactly the {len(perturbed)} perturbed cases are rejected")
        return 0
    print(f"negative control '{args.fault}' FAILED: perturbed {sorted(perturbed)}, rejected {sorted(rejected)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
