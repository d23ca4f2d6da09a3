"""An LSTM whose cell state is clipped and whose output is projected down and clipped (Sak et al. 2014),
the recurrent layer of the ELMo biLM (Peters et al. 2018; bilm-tf's LSTMCell with num_proj, cell_clip, proj_clip).

At each step, with x_t the input and h_{t-1} the previous (projected) output:

    i, f, g, o = split(W x_t + U h_{t-1} + b)            (gate order i, f, g, o as torch.nn.LSTM)
    c_t = clip(sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g), cell_clip)
    h_t = clip(P (sigmoid(o) * tanh(c_t)), proj_clip)    (P: cell_dim -> projection_dim, no bias)

The layer is never stateful: every sequence starts from h = c = 0, so a sentence's output does not depend on
the other sentences of its batch or on earlier batches.
"""

from __future__ import annotations

import torch
from torch import nn


class ProjectedLSTM(nn.Module):
    """One direction of one layer. `forward(x, mask)` runs left to right, or right to left if go_forward=False.

    `mask` marks real positions and must be a prefix of each row (right padding); padded positions output
    zeros and do not change the state, so the backward direction starts at each sentence's own last word.
    """

    def __init__(
        self,
        input_size: int,
        cell_size: int,
        projection_size: int,
        go_forward: bool = True,
        cell_clip: float | None = None,
        proj_clip: float | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.cell_size = cell_size
        self.projection_size = projection_size
        self.go_forward = go_forward
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.input_gates = nn.Linear(input_size, 4 * cell_size, bias=False)  # W
        self.state_gates = nn.Linear(projection_size, 4 * cell_size, bias=True)  # U, b
        self.projection = nn.Linear(cell_size, projection_size, bias=False)  # P
        with torch.no_grad():
            # Forget-gate bias 1 (Jozefowicz et al. 2015), the value TensorFlow's LSTMCell adds by default.
            self.state_gates.bias.zero_()
            self.state_gates.bias[cell_size : 2 * cell_size] = 1.0

    def step(self, x_gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from precomputed input gates W x_t (batch, 4*cell): returns (h_t, c_t)."""
        gates = x_gates + self.state_gates(h)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if self.cell_clip is not None:
            c = c.clamp(-self.cell_clip, self.cell_clip)
        h = self.projection(torch.sigmoid(o) * torch.tanh(c))
        if self.proj_clip is not None:
            h = h.clamp(-self.proj_clip, self.proj_clip)
        return h, c

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, input_size), mask: (batch, seq) bool -> (batch, seq, projection_size)."""
        batch, seq, _ = x.shape
        x_gates = self.input_gates(x)  # (batch, seq, 4*cell): the input half of every step at once
        h = x.new_zeros(batch, self.projection_size)
        c = x.new_zeros(batch, self.cell_size)
        outputs = []
        # unbind once: indexing x_gates[:, t] per step would add a full-size zero tensor per step in backward
        steps = x_gates.unbind(1)  # seq x (batch, 4*cell)
        for t in range(seq) if self.go_forward else reversed(range(seq)):
            h_new, c_new = self.step(steps[t], h, c)
            m = mask[:, t, None]  # (batch, 1)
            h = torch.where(m, h_new, h)
            c = torch.where(m, c_new, c)
            outputs.append(torch.where(m, h_new, torch.zeros_like(h_new)))
        if not self.go_forward:
            outputs.reverse()  # back to left-to-right order
        return torch.stack(outputs, dim=1)  # (batch, seq, projection_size)
