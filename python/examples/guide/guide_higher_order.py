import numpy as np

import dyngrad as dg

# u(x) = x·sin(x) pointwise: u' and u'' from autograd.grad with create_graph=True, as torch.autograd.grad.
points = np.array([0.3, 1.1, 2.0])
x = dg.tensor(points, requires_grad=True)
u = x * x.sin()
(du,) = dg.autograd.grad(u.sum(), x, create_graph=True)
(d2u,) = dg.autograd.grad(du.sum(), x, create_graph=True)
np.testing.assert_allclose(d2u.numpy(), 2 * np.cos(points) - points * np.sin(points), rtol=1e-12)

# A Hessian-vector product of f(w) = Σ tanh(w)³ (dg.autograd.functional.hvp does the same in one call).
w = dg.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
v = dg.tensor(np.array([1.0, 0.5, -0.25]))
(g,) = dg.autograd.grad((w.tanh() ** 3).sum(), w, create_graph=True)
(hv,) = dg.autograd.grad((g * v).sum(), w)
t = np.tanh(w.numpy())
second = 6 * t * (1 - t**2) ** 2 - 6 * t**3 * (1 - t**2)  # d²/dw² tanh(w)³, the Hessian's diagonal
np.testing.assert_allclose(hv.numpy(), second * v.numpy(), rtol=1e-10)
print("u'' and the Hessian-vector product match their closed forms")
