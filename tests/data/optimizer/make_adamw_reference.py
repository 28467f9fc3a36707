#!/usr/bin/python3
# Writes adamw_reference.txt beside this script: torch.optim.AdamW's trajectories over several steps
# and settings, the reference tests/test_optimizer_torch.cpp holds models/optimizer.hpp's
# BasicAdam<T> and clip_by_global_norm to (the test reads the file; it needs no Python).
#
# Each case: dtype float64 or float32; weight decay 0 (plain Adam) or 0.1 (AdamW, decoupled, on the
# matrix W only: b is in a group without decay, as DecayScope::matrices); clipping by the global
# norm off, active (max_norm 1 below the gradients' norms of about 2-6) or inactive (max_norm 100);
# six steps with fresh gradients each step. Parameters: W [2x3] and b [3]. Every number is written
# with float.hex(), exact (a float32 value is exact as a Python float).
#
# Run with a python3 that has torch and numpy (Debian's python3-torch):
#     /usr/bin/python3 tests/data/optimizer/make_adamw_reference.py
import os

import numpy as np
import torch

STEPS = 6


def hexes(t):
    return " ".join(float(x).hex() for x in t.detach().reshape(-1).tolist())


def case(out, name, dtype, lr, betas, eps, weight_decay, max_norm, seed):
    rng = np.random.RandomState(seed)
    W = torch.tensor(rng.uniform(-1, 1, (2, 3)), dtype=dtype, requires_grad=True)
    b = torch.tensor(rng.uniform(-1, 1, (3,)), dtype=dtype, requires_grad=True)
    optimizer = torch.optim.AdamW([{"params": [W], "weight_decay": weight_decay},
                                   {"params": [b], "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps)
    out.write(f"case {name} {'float32' if dtype == torch.float32 else 'float64'} lr {lr.hex()} beta1 {betas[0].hex()} "
              f"beta2 {betas[1].hex()} eps {eps.hex()} weight_decay {weight_decay.hex()} max_norm {max_norm.hex()} "
              f"steps {STEPS}\n")
    out.write(f"W0 {hexes(W)}\nb0 {hexes(b)}\n")
    for step in range(STEPS):
        # Gradients of a few units, so that max_norm 1 clips every step and 100 none.
        W.grad = torch.tensor(rng.uniform(-2, 2, (2, 3)), dtype=dtype)
        b.grad = torch.tensor(rng.uniform(-2, 2, (3,)), dtype=dtype)
        out.write(f"gW {hexes(W.grad)}\ngb {hexes(b.grad)}\n")
        norm = torch.nn.utils.clip_grad_norm_([W, b], max_norm) if max_norm > 0 else torch.tensor(0.0)
        optimizer.step()
        out.write(f"norm {float(norm).hex()}\nW {hexes(W)}\nb {hexes(b)}\n")
        state = optimizer.state[W]
        out.write(f"mW {hexes(state['exp_avg'])}\nvW {hexes(state['exp_avg_sq'])}\n")


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adamw_reference.txt")
    with open(path, "w") as out:
        out.write(f"# torch.optim.AdamW trajectories from make_adamw_reference.py, torch {torch.__version__}, "
                  f"numpy {np.__version__}\n")
        seed = 1
        for dtype in (torch.float64, torch.float32):
            for weight_decay in (0.0, 0.1):
                for clip, max_norm in (("noclip", 0.0), ("clipped", 1.0), ("unclipped", 100.0)):
                    betas = (0.8, 0.99) if clip == "noclip" else (0.9, 0.999)
                    lr = 0.05 if weight_decay > 0 else 0.01
                    name = f"{'f32' if dtype == torch.float32 else 'f64'}_wd{weight_decay}_{clip}"
                    case(out, name, dtype, lr, betas, 1e-8, weight_decay, max_norm, seed)
                    seed += 1


if __name__ == "__main__":
    main()
