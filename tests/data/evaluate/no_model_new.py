"""Not a candidate: it defines no ModelNew."""
import torch.nn as nn


class Model(nn.Module):
    pass
