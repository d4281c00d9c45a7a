"""The decode layer: the decode-attention backend interface and the dense (exact)
backends, below both the method registry and the decode loops.

A method family owns its decode backend (a :class:`~santa_bench.decode.base.DecodeAttention`
subclass in its module under ``santa_bench/methods/``, returned by its ``e2e_backend``);
the end-to-end runner and the accuracy engine look it up through the registry. Nothing
here imports the registry or ``santa_bench.e2e``'s runner, so neither depends on the other.
"""
