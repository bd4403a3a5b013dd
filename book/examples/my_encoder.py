"""A stand-in for "your encoder": the worked example of the book's chapter "Score your own encoder".

A tiny convolutional network, randomly initialised from a fixed seed (so every build scores the same
weights), CPU-cheap like the demo panel's small CNNs. Its ``build()`` follows the entry-point protocol of
:mod:`crsrepro.encoders.user`: it returns the ``torch.nn.Module`` (mapping ``[B, 3, S, S]`` floats to
``[B, D]``) together with its :class:`~crsrepro.encoders.user.Preprocessing`. Score it with::

    crsrepro score --profile demo --encoder book/examples/my_encoder.py:build --report my_report

Replace the network and the preprocessing with your own (load your checkpoint in ``build()``); a
``build()`` that returns the module alone gets the documented defaults (224 px, ImageNet mean and std,
bicubic, centre crop), and the command says so.
"""

import torch
from torch import nn

from crsrepro.encoders.user import Preprocessing

SEED = 0
WIDTHS = (16, 32, 64)  # three 3x3 stride-2 convolutions: 96 px -> 48, 24, 12 px maps, a 64-d embedding


def build():
    """The network (random weights from :data:`SEED`, eval mode) and the preprocessing it expects."""
    with torch.random.fork_rng(devices=[]):  # a fixed init that leaves the caller's random state alone
        torch.manual_seed(SEED)
        layers = []
        for c_in, c_out in zip((3,) + WIDTHS[:-1], WIDTHS):
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.ReLU()]
        net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
    preprocessing = Preprocessing(input_size=96, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
                                  interpolation="bilinear", resize_mode="crop")
    return net.eval(), preprocessing
