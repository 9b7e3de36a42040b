import dyngrad as dg
import dyngrad.nn as nn
import dyngrad.nn.functional as F

dg.manual_seed(3)
x = dg.rand(64, 8) * 2 - 1
y = x @ (dg.rand(8, 1) * 2 - 1)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = dg.optim.Adam(model.parameters(), lr=1e-2)
scaler = dg.amp.GradScaler("cpu")  # float16 needs loss scaling; bfloat16 does not

losses = []
for step in range(100):
    with dg.autocast("cpu", dtype=dg.float16):
        prediction = model(x)              # Linear in float16
        loss = F.mse_loss(prediction, y)   # the loss in float32
    optimizer.zero_grad()
    scaler.scale(loss).backward()          # loss · scale: small float16 gradients stay representable
    scaler.unscale_(optimizer)             # the true gradients, for clipping
    dg.optim.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)                 # skipped when a gradient is inf/NaN
    scaler.update()
    losses.append(loss.item())
print(f"float16 autocast: loss {losses[0]:.4f} -> {losses[-1]:.4f}, scale {scaler.get_scale()}")
assert prediction.dtype == dg.float16 and loss.dtype == dg.float32
assert losses[-1] < 0.2 * losses[0], losses

with dg.autocast("cpu"):                   # device_type "cpu": bfloat16 by default
    assert model(x).dtype == dg.bfloat16

model.bfloat16()                           # the parameters themselves in bfloat16 (no float32 master copy)
assert model[0].weight.dtype == dg.bfloat16 and model(x.bfloat16()).dtype == dg.bfloat16
model.float()
