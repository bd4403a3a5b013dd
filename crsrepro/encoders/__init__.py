"""Encoders: the registry and its one filling (DESIGN.md section 4).

The registry is filled here and only here: the paper's 15 specs (:data:`paper.PAPER_ENCODERS`) and
the demo panel's ``demo.DEMO_ENCODERS``, both lists of ``(EncoderSpec, builder)`` pairs. See
:mod:`crsrepro.encoders.registry` for the :class:`Encoder` contract and :mod:`crsrepro.encoders.weights`
for where the weights are found and what they hash to.
"""

from crsrepro.encoders.demo import DEMO_ENCODERS
from crsrepro.encoders.paper import PAPER_ENCODERS
from crsrepro.encoders.registry import Encoder, EncoderSpec, create_encoder, get_encoder_spec, list_encoders, register
from crsrepro.encoders.weights import resolve_weights, weights_hash

for _spec, _builder in PAPER_ENCODERS + DEMO_ENCODERS:
    register(_spec, _builder)

__all__ = ["Encoder", "EncoderSpec", "create_encoder", "get_encoder_spec", "list_encoders", "register",
           "resolve_weights", "weights_hash"]
