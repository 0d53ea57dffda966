"""Types of the compiled kernels in ``_native.pyx`` (see its docstring)."""

import numpy as np

JOB_COLUMNS: tuple[str, ...]
SPEC_COLUMNS: tuple[str, ...]
PAIR_FEATURES: tuple[str, ...]
SHAPE_FEATURES: tuple[str, ...]

def set_constants(train_bytes_per_param: float, allreduce_bytes_per_param: float,
                  activation_bytes_per_unit: float) -> None: ...
def pair_rows(job: np.ndarray, kind: np.ndarray, precision: np.ndarray, category: np.ndarray,
              specs: np.ndarray, vendor: np.ndarray, row_job: np.ndarray, type_a: np.ndarray,
              type_b: np.ndarray, out: np.ndarray) -> None: ...
def shape_rows(job: np.ndarray, kind: np.ndarray, precision: np.ndarray, category: np.ndarray,
               specs: np.ndarray, vendor: np.ndarray, job_type: np.ndarray, row_job: np.ndarray,
               a_shape: np.ndarray, out: np.ndarray) -> None: ...
def row_median(r: np.ndarray, est: np.ndarray, n: np.ndarray, med: np.ndarray,
               sd: np.ndarray) -> None: ...
