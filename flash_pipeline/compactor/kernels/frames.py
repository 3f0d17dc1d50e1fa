"""The key framing's constant shared by its compiled kernel (sha1.frame_rows) and the code sizing its buffers
(digest.py), which calls it without importing Numba when the kernel was compiled ahead of time (kernels/aot.py)."""

# a value of at most this many bytes is copied as this many, whatever its length: a copy of fixed length has no
# branch to mispredict (s1's keys: 7-12 byte strings), and what it writes past the value the next frames overwrite
FRAME_COPY_BYTES = 16
