"""The kernel tests, one file per kernel family (tinygrad_like/kernels/<family>/): test_<family>.py
holds the family's cases, run on every device by check.py, and the tests of what a case cannot
say. A package: tests/test_quant.py and tests/kernels/test_quant.py share a base name.
"""
