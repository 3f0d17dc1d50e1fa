"""The kernels of the three steps: compiled by Numba when the work pays for loading it, else their NumPy forms
or their Python source (jit.py). Importing the package gives the kernels their NumPy forms (numpy_forms.py)."""

from flash_pipeline.compactor.kernels import numpy_forms  # noqa: F401 - registers the forms on the kernels
