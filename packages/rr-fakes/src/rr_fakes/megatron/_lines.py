"""The megatron-core release lines the CPU harness is tested on, with how each installs on
Python 3.11 next to the CPU build of torch.

Plain data with no imports: the noxfile reads this file by path (one session per line), so the
matrix is written down once.
"""

#: line -> pinned release, extra pip flags for it, extra packages to install with it.
MEGATRON_LINES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # 0.12.3 pulls ~76 packages (modelopt, wandb, ...); numpy and packaging are all it imports.
    "0.12": ("0.12.3", ("--no-deps",), ("numpy", "packaging")),
    # 0.13.1 imports packaging without declaring it.
    "0.13": ("0.13.1", (), ("packaging",)),
    "0.14": ("0.14.0", (), ()),
    "0.15": ("0.15.3", (), ()),
    "0.16": ("0.16.1", (), ()),
    # 0.17+ declare Requires-Python >=3.12 but publish working cp311 wheels; without
    # --only-binary pip tries to build a numpy sdist.
    "0.17": ("0.17.1", ("--ignore-requires-python", "--only-binary=:all:"), ()),
    "0.18": ("0.18.2", ("--ignore-requires-python", "--only-binary=:all:"), ()),
    "0.19": ("0.19.2", ("--ignore-requires-python", "--only-binary=:all:"), ()),
}

#: The range the harness supports, for ``rr doctor``.
MEGATRON_RANGE = ">=0.12,<0.20"
