"""Types of the compiled kernels in ``_native.pyx`` (see its docstring)."""

import numpy as np

JOB_COLUMNS: tuple[str, ...]
SPEC_COLUMNS: tuple[str, ...]
PAIR_FEATURES: tuple[str, ...]
SHAPE_FEATURES: tuple[str, ...]
CORE_FEATURES: tuple[str, ...]
TRANSFER_LEVELS: tuple[str, ...]

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
def transfer_rows(level: np.ndarray, level_y: np.ndarray, target: np.ndarray, diff: np.ndarray,
                  counts: np.ndarray, slope: np.ndarray, sxx: np.ndarray, slot: np.ndarray,
                  found: np.ndarray, own: np.ndarray, specs: np.ndarray, t: np.ndarray,
                  phys_b: np.ndarray, virt: np.ndarray, phys_a: np.ndarray, share: float,
                  vendors: np.ndarray, t_vendor: np.ndarray, radius: float, pick: bool,
                  shrink: tuple[float, float, float], choose: tuple[int, int],
                  features: np.ndarray, level_s: np.ndarray, use: np.ndarray,
                  pair_use: np.ndarray, local: np.ndarray, spec_move: np.ndarray) -> None: ...
def same_shape(key: np.ndarray, code: np.ndarray, r: np.ndarray, table_scale: np.ndarray,
               group: np.ndarray, seen: np.ndarray, shape_code: np.ndarray, scale: np.ndarray,
               out: np.ndarray) -> None: ...
def nearest_shapes(key: np.ndarray, code: np.ndarray, shape: np.ndarray, group: np.ndarray,
                   shape_code: np.ndarray, own: np.ndarray, reach: np.ndarray, limit: int,
                   out_i: np.ndarray, out_entry: np.ndarray) -> int: ...
