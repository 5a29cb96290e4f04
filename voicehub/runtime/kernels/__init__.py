"""Named ops with tensor signatures and their implementations per backend (see registry.py).

Importing this package imports no Triton: kernel modules load when `registry.get` asks for them.
"""
