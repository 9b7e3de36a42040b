import numpy as np

import dyngrad as dg
from dyngrad.utils.checkpoint import checkpoint

# A residual block, run plainly and checkpointed: the same gradients, bit for bit (dropout's masks are replayed).
data = dg.randn(8, 16)


def weight_gradient(use_checkpoint):
    dg.manual_seed(0)  # the same weights and dropout seed for both runs
    block = dg.nn.Sequential(dg.nn.Linear(16, 64), dg.nn.GELU(), dg.nn.Dropout(0.1), dg.nn.Linear(64, 16))
    x = data.clone().requires_grad_()
    y = x + (checkpoint(block, x, use_reentrant=False) if use_checkpoint else block(x))
    (y * y).mean().backward()
    return block[0].weight.grad.numpy()


np.testing.assert_array_equal(weight_gradient(False), weight_gradient(True))

# The gradient penalty of WGAN-GP: (|grad_x D(x)| - 1)^2, differentiated into the critic's weights.
critic = dg.nn.Sequential(dg.nn.Linear(16, 32), dg.nn.Tanh(), dg.nn.Linear(32, 1))
optimizer = dg.optim.Adam(critic.parameters(), lr=1e-2)
penalties = []
for step in range(100):
    x = dg.randn(32, 16).requires_grad_()
    (g,) = dg.autograd.grad(critic(x).sum(), x, create_graph=True)
    norm = ((g * g).sum(1) + 1e-12).sqrt()
    penalty = ((norm - 1) ** 2).mean()
    optimizer.zero_grad()
    penalty.backward()
    optimizer.step()
    penalties.append(penalty.item())
assert penalties[-1] < 0.1 * penalties[0], penalties
print(f"checkpointed gradients equal; penalty {penalties[0]:.4f} -> {penalties[-1]:.4f}")
