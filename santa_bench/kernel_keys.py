"""The keys that group kernel cases (a leaf: imports nothing of santa_bench).

``SHAPE_KEYS`` make a decode step's attention shape; ``GROUP_KEYS`` the cases whose
speed is compared: a method's speedup and byte floor are taken against the fastest
dense baseline of its group (and of its inputs) in the same run.
"""

SHAPE_KEYS = ("batch", "ctx", "heads", "kv_heads", "head_dim")
GROUP_KEYS = (*SHAPE_KEYS, "dtype", "layout", "page_size", "device", "timing", "l2")
