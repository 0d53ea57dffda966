# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""A request's encode, compiled: :func:`leap.features.pair_rows.pair_matrix` and
:func:`~leap.features.pair_rows.shape_matrix` (the pair model's rows), and
:func:`~leap.features.pair_rows.row_median` of the few estimates a request's rows read;
:func:`leap.features.transfer._core` (the transfer features' arithmetic and the types the pair
estimate reads), :func:`~leap.features.transfer._same_shape` and
:func:`~leap.features.transfer._nearest_shapes` (the shape-table lookups).

The NumPy code in :mod:`leap.features.pair_rows`, :mod:`leap.features.physics` and
:mod:`leap.features.transfer` is the definition: these loops compute the same values,
operation for operation, in one pass over a request's few dozen rows, where NumPy spends a
few microseconds of call overhead per array operation. Nothing here decides anything: the
Python side reads the layouts declared below and uses these kernels only where they agree with
its own and with NumPy on probes (:func:`leap.features.pair_rows.native_kernels`,
:func:`leap.features.transfer.transfer_kernels`), and the tests hold both ways equal on random
inputs.

Inputs of the pair and shape rows: ``job``, a (jobs, 11) matrix of :data:`JOB_COLUMNS` (NaN
where missing); ``kind``, each job's peak FLOP/s kind
(:data:`leap.features.physics.PEAK_KIND`); ``precision`` and ``category``, its vocabulary
codes (NaN outside); ``specs``, a (types, :data:`SPEC_COLUMNS`) matrix; ``vendor``, each
type's vocabulary code. The transfer kernels take what their NumPy twins take, as arrays.
"""

from libc.math cimport INFINITY, NAN, fabs, fmax, isfinite, isnan, log, log1p, sqrt
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

#: Job columns of the ``job`` matrix, in order.
JOB_COLUMNS = ("trainer_count", "devices_per_trainer", "batch_size", "flops_per_sample",
               "num_params", "tensor_parallel", "pipeline_parallel", "embedding_params",
               "hidden_dim", "seq_len", "num_layers")
#: The catalog's spec columns the ``specs`` matrix holds, in order (the catalog's own).
SPEC_COLUMNS = ("year", "devices_per_host", "peak_bf16_tflops", "peak_fp32_tflops",
                "memory_gb", "mem_bw_gb_per_s", "intra_node_bw_gb_per_s",
                "inter_node_bw_gbit_per_s", "cost_per_device_hour", "bf16_native")
#: The features :func:`transfer_rows` writes, one row each, in order
#: (:data:`leap.features.transfer.CORE_FEATURES`).
CORE_FEATURES = ("xfer_g_r", "xfer_gamma", "xfer_d_r", "xfer_r", "xfer_n_types", "xfer_pair_n",
                 "xfer_sd", "xfer_dist")
#: The transfer levels whose slots ``slot`` holds, in order
#: (:data:`leap.features.transfer.TRANSFER_LEVELS`).
TRANSFER_LEVELS = ("all", "cat", "mt")
#: The columns :func:`pair_rows` writes, in order.
PAIR_FEATURES = (
    "d_log_phys_sps", "d_log_compute_sps", "d_log_weight_stream_sps", "a_comm_to_compute",
    "b_comm_to_compute", "a_mem_fit", "b_mem_fit", "a_log_compute_sps", "b_log_compute_sps",
    "a_log_weight_stream_sps", "b_log_weight_stream_sps", "d_peak", "a_peak",
    "d_mem_bw_gb_per_s", "a_mem_bw_gb_per_s", "d_intra_node_bw_gb_per_s",
    "a_intra_node_bw_gb_per_s", "d_inter_node_bw_gbit_per_s", "a_inter_node_bw_gbit_per_s",
    "d_memory_gb", "a_memory_gb", "d_devices_per_host", "a_devices_per_host",
    "log_trainer_count", "log_batch_size", "log_num_params", "log_flops_per_sample",
    "log_embedding_params", "log_hidden_dim", "log_seq_len", "devices_per_trainer",
    "tensor_parallel", "pipeline_parallel", "num_layers", "log_batch_per_device", "vendor_a",
    "vendor_b", "precision", "model_category", "a_step", "b_step", "d_step", "a_ridge",
    "b_ridge", "a_mem_step", "b_mem_step")
#: The columns :func:`shape_rows` writes, in order.
SHAPE_FEATURES = (
    "a_log_trainers", "b_log_trainers", "a_log_devices_per_trainer",
    "b_log_devices_per_trainer", "a_log_batch", "b_log_batch", "a_log_batch_per_device",
    "b_log_batch_per_device", "a_log_phys_sps", "b_log_phys_sps", "a_log_compute_sps",
    "b_log_compute_sps", "a_log_weight_stream_sps", "b_log_weight_stream_sps",
    "a_comm_to_compute", "b_comm_to_compute", "a_mem_fit", "b_mem_fit", "d_log_trainers",
    "d_log_devices_per_trainer", "d_log_batch", "d_log_batch_per_device", "d_log_phys_sps",
    "d_log_compute_sps", "d_log_weight_stream_sps", "peak", "hw_mem_bw_gb_per_s",
    "hw_intra_node_bw_gb_per_s", "hw_inter_node_bw_gbit_per_s", "hw_memory_gb",
    "hw_devices_per_host", "log_num_params", "log_flops_per_sample", "log_embedding_params",
    "log_hidden_dim", "log_seq_len", "tensor_parallel", "pipeline_parallel", "num_layers",
    "vendor", "precision", "model_category", "a_step", "b_step", "a_mem_step", "b_mem_step",
    "ridge")

# Positions in JOB_COLUMNS and SPEC_COLUMNS.
cdef enum:
    TC, DPT, BS, FLOPS, PARAMS, TP, PP, EMB, HID, SEQ, LAYERS
cdef enum:
    S_HOST = 1
    S_BF16 = 2
    S_FP32 = 3
    S_MEM = 4
    S_BW = 5
    S_INTRA = 6
    S_INTER = 7
    S_NATIVE = 9

cdef double train_bytes = 16.0
cdef double allreduce_bytes = 4.0
cdef double activation_bytes = 34.0


def set_constants(double train_bytes_per_param, double allreduce_bytes_per_param,
                  double activation_bytes_per_unit):
    """The physics constants of :mod:`leap.features.physics` (set once, at import there)."""
    global train_bytes, allreduce_bytes, activation_bytes
    train_bytes = train_bytes_per_param
    allreduce_bytes = allreduce_bytes_per_param
    activation_bytes = activation_bytes_per_unit


cdef struct Phys:
    double log_phys      # finite, or 0 (as history's residuals read it)
    double log_compute   # finite, or NaN (so are the rest)
    double log_stream
    double comm_ratio
    double mem_fit
    double log_peak      # log peak FLOP/s, as np.log gives it (may be -inf or NaN)
    double step
    double mem_step
    double ridge


cdef inline double finite(double x) noexcept nogil:
    return x if isfinite(x) else NAN


cdef inline double np_maximum(double a, double b) noexcept nogil:
    """``np.maximum``: NaN if either is NaN."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


cdef inline double peak_flops(int kind, const double* s) noexcept nogil:
    cdef double bf16 = s[S_BF16] * 1e12
    cdef double fp32 = s[S_FP32] * 1e12
    cdef bint old = s[S_NATIVE] == 0.0
    if kind == 0:
        return fp32
    if kind == 1:
        return fp32 if old else np_maximum(bf16 / 2.0, fp32)
    if kind == 2:
        return fp32 if old else bf16
    return bf16


cdef inline Phys physics(double tc, double dpt, double bs, const double* j, int kind,
                         const double* s) noexcept nogil:
    """:func:`leap.features.physics.estimates_on_specs` and
    :func:`leap.features.pair_rows._step_terms` of one row at shape (tc, dpt, bs)."""
    cdef Phys p
    cdef double mem_bw = s[S_BW] * 1e9
    cdef double intra_bw = s[S_INTRA] * 1e9
    cdef double inter_bw = s[S_INTER] * 1e9 / 8.0
    cdef double trainers = fmax(tc, 1.0)
    cdef double devices = trainers * fmax(dpt, 1.0)
    cdef double batch = fmax(bs, 1.0)
    cdef double flops = j[FLOPS]
    cdef double params = j[PARAMS]
    cdef double shard = fmax(j[TP], 1.0) * fmax(j[PP], 1.0)
    cdef double peak = peak_flops(kind, s)
    cdef double compute_step_s = batch * flops / peak
    cdef double weight_step_s = 2.0 * params / shard / mem_bw
    cdef double link_bw = inter_bw if trainers > 1 else intra_bw
    cdef double multi = 1.0 if devices > 1 else 0.0
    cdef double comm_s = multi * allreduce_bytes * params / shard / link_bw
    cdef double slow = fmax(compute_step_s, weight_step_s)
    cdef double step_s = slow + 0.5 * comm_s
    cdef double log_compute = log(devices * batch / compute_step_s)
    cdef double log_phys = log(devices * batch / step_s)
    if not isfinite(log_compute):
        log_phys = log(devices) + 0.5 * log(peak / 1e12) + 0.5 * log(mem_bw / 1e9)
    log_phys = finite(log_phys)
    p.log_phys = 0.0 if log_phys != log_phys else log_phys
    p.log_compute = finite(log_compute)
    p.log_stream = finite(log(devices * batch / weight_step_s))
    p.comm_ratio = finite(comm_s / slow)
    p.mem_fit = finite(params * train_bytes / shard / (s[S_MEM] * 1e9))
    p.log_peak = log(peak)
    cdef double per_device = fmax(bs, 1.0) / fmax(dpt, 1.0)
    cdef double act = activation_bytes * fmax(j[SEQ], 1.0) * j[HID] * j[LAYERS]
    cdef double log_bw = log(s[S_BW] * 1e9)
    p.step = log(per_device * flops) - p.log_peak
    p.mem_step = log(per_device * act) - log_bw
    p.ridge = log(flops / act) - (p.log_peak - log_bw)
    return p


cdef inline void job_logs(double* o, const double* j) noexcept nogil:
    """The log of the job's size columns both matrices read, in their (shared) order."""
    o[0] = log(j[PARAMS])
    o[1] = log(j[FLOPS])
    o[2] = log(j[EMB])
    o[3] = log(j[HID])
    o[4] = log(j[SEQ])


cdef inline void finish(double[:, ::1] out, Py_ssize_t i) noexcept nogil:
    """Every non-finite value of row ``i`` is NaN (what the matrices hold for missing)."""
    cdef Py_ssize_t k
    for k in range(out.shape[1]):
        if not isfinite(out[i, k]):
            out[i, k] = NAN


def pair_rows(const double[:, ::1] job, const Py_ssize_t[::1] kind,
              const double[::1] precision, const double[::1] category,
              const double[:, ::1] specs, const double[::1] vendor,
              const Py_ssize_t[::1] row_job, const Py_ssize_t[::1] type_a,
              const Py_ssize_t[::1] type_b, double[:, ::1] out):
    """Row ``i`` of :data:`PAIR_FEATURES`: job ``row_job[i]`` moving from type ``type_a[i]`` to
    ``type_b[i]`` (rows of ``specs``), written into ``out`` (rows, 46)."""
    cdef Py_ssize_t i, q
    cdef const double* j
    cdef const double* sa
    cdef const double* sb
    cdef Phys a, b
    cdef double* o
    with nogil:
        for i in range(out.shape[0]):
            q = row_job[i]
            j = &job[q, 0]
            sa = &specs[type_a[i], 0]
            sb = &specs[type_b[i], 0]
            a = physics(j[TC], j[DPT], j[BS], j, <int>kind[q], sa)
            b = physics(j[TC], j[DPT], j[BS], j, <int>kind[q], sb)
            o = &out[i, 0]
            o[0] = b.log_phys - a.log_phys
            o[1] = b.log_compute - a.log_compute
            o[2] = b.log_stream - a.log_stream
            o[3] = a.comm_ratio
            o[4] = b.comm_ratio
            o[5] = a.mem_fit
            o[6] = b.mem_fit
            o[7] = a.log_compute
            o[8] = b.log_compute
            o[9] = a.log_stream
            o[10] = b.log_stream
            o[11] = b.log_peak - a.log_peak
            o[12] = a.log_peak
            o[13] = log(sb[S_BW]) - log(sa[S_BW])
            o[14] = log(sa[S_BW])
            o[15] = log(sb[S_INTRA]) - log(sa[S_INTRA])
            o[16] = log(sa[S_INTRA])
            o[17] = log(sb[S_INTER]) - log(sa[S_INTER])
            o[18] = log(sa[S_INTER])
            o[19] = log(sb[S_MEM]) - log(sa[S_MEM])
            o[20] = log(sa[S_MEM])
            o[21] = log(sb[S_HOST]) - log(sa[S_HOST])
            o[22] = log(sa[S_HOST])
            o[23] = log(j[TC])
            o[24] = log(j[BS])
            job_logs(&o[25], j)
            o[30] = j[DPT]
            o[31] = j[TP]
            o[32] = j[PP]
            o[33] = j[LAYERS]
            o[34] = log(j[BS]) - log(fmax(j[DPT], 1.0))
            o[35] = vendor[type_a[i]]
            o[36] = vendor[type_b[i]]
            o[37] = precision[q]
            o[38] = category[q]
            o[39] = a.step
            o[40] = b.step
            o[41] = b.step - a.step
            o[42] = a.ridge
            o[43] = b.ridge
            o[44] = a.mem_step
            o[45] = b.mem_step
            finish(out, i)


cdef inline double log_part(double x) noexcept nogil:
    """:func:`leap.features.pair_rows.log_shape` of one part: a missing one (NaN, -1) is 1."""
    return log(fmax(x, 1.0))


def shape_rows(const double[:, ::1] job, const Py_ssize_t[::1] kind,
               const double[::1] precision, const double[::1] category,
               const double[:, ::1] specs, const double[::1] vendor,
               const Py_ssize_t[::1] job_type, const Py_ssize_t[::1] row_job,
               const double[:, ::1] a_shape, double[:, ::1] out):
    """Row ``i`` of :data:`SHAPE_FEATURES`: job ``row_job[i]`` on its type (``job_type``, a row
    of ``specs``) moving from shape ``a_shape[i]`` (trainers, devices per trainer, batch; a
    part not above 0 is missing) to its own, written into ``out`` (rows, 47)."""
    cdef Py_ssize_t i, q
    cdef const double* j
    cdef const double* s
    cdef Phys a, b
    cdef double* o
    cdef double tc, dpt, bs
    cdef double la[4]
    cdef double lb[4]
    with nogil:
        for i in range(out.shape[0]):
            q = row_job[i]
            j = &job[q, 0]
            s = &specs[job_type[q], 0]
            tc = a_shape[i, 0] if a_shape[i, 0] > 0 else NAN
            dpt = a_shape[i, 1] if a_shape[i, 1] > 0 else NAN
            bs = a_shape[i, 2] if a_shape[i, 2] > 0 else NAN
            a = physics(tc, dpt, bs, j, <int>kind[q], s)
            b = physics(j[TC], j[DPT], j[BS], j, <int>kind[q], s)
            la[0], la[1], la[2] = log_part(tc), log_part(dpt), log_part(bs)
            la[3] = la[2] - la[1]
            lb[0], lb[1], lb[2] = log_part(j[TC]), log_part(j[DPT]), log_part(j[BS])
            lb[3] = lb[2] - lb[1]
            o = &out[i, 0]
            o[0], o[1], o[2], o[3] = la[0], lb[0], la[1], lb[1]
            o[4], o[5], o[6], o[7] = la[2], lb[2], la[3], lb[3]
            o[8], o[9] = a.log_phys, b.log_phys
            o[10], o[11] = a.log_compute, b.log_compute
            o[12], o[13] = a.log_stream, b.log_stream
            o[14], o[15] = a.comm_ratio, b.comm_ratio
            o[16], o[17] = a.mem_fit, b.mem_fit
            o[18], o[19], o[20], o[21] = lb[0] - la[0], lb[1] - la[1], lb[2] - la[2], \
                lb[3] - la[3]
            o[22] = b.log_phys - a.log_phys
            o[23] = b.log_compute - a.log_compute
            o[24] = b.log_stream - a.log_stream
            o[25] = b.log_peak
            o[26] = log(s[S_BW])
            o[27] = log(s[S_INTRA])
            o[28] = log(s[S_INTER])
            o[29] = log(s[S_MEM])
            o[30] = log(s[S_HOST])
            job_logs(&o[31], j)
            o[36] = j[TP]
            o[37] = j[PP]
            o[38] = j[LAYERS]
            o[39] = vendor[job_type[q]]
            o[40] = precision[q]
            o[41] = category[q]
            o[42], o[43] = a.step, b.step
            o[44], o[45] = a.mem_step, b.mem_step
            o[46] = b.ridge
            finish(out, i)



def row_median(const Py_ssize_t[::1] r, const double[::1] est, Py_ssize_t[::1] n,
               double[::1] med, double[::1] sd):
    """:func:`leap.features.pair_rows.row_median`: of each row (``n``, ``med`` and ``sd`` have
    one entry per row; ``n`` zeroed), how many finite estimates it has, their median and
    their spread. Sums run in the estimates' order, as ``np.bincount``'s do; each row's
    values are sorted stably, as ``np.lexsort`` sorts them."""
    cdef Py_ssize_t m = r.shape[0], rows = n.shape[0], i, g, k, c, s
    cdef double d, v
    cdef double* total = <double*>malloc((3 * rows + 1) * sizeof(double))
    cdef Py_ssize_t* fill = <Py_ssize_t*>malloc((rows + 1) * sizeof(Py_ssize_t))
    cdef double* buf = <double*>malloc((m + 1) * sizeof(double))
    cdef double* square = total + rows
    cdef double* mean = total + 2 * rows
    if total == NULL or fill == NULL or buf == NULL:
        free(total)
        free(fill)
        free(buf)
        raise MemoryError()
    with nogil:
        for g in range(rows):
            total[g] = 0.0
            square[g] = 0.0
        for i in range(m):
            if isfinite(est[i]):
                n[r[i]] += 1
                total[r[i]] += est[i]
        s = 0
        for g in range(rows):
            mean[g] = total[g] / (n[g] if n[g] > 1 else 1)
            fill[g] = s  # where the row's values start in buf
            s += n[g]
        # Each row's values in the estimates' order, and their squared deviations.
        for i in range(m):
            if isfinite(est[i]):
                g = r[i]
                d = est[i] - mean[g]
                square[g] += d * d
                buf[fill[g]] = est[i]
                fill[g] += 1
        s = 0
        for g in range(rows):
            c = n[g]
            if c == 0:
                med[g] = NAN
                sd[g] = NAN
                continue
            for i in range(s + 1, s + c):  # insertion sort: stable, a few values a row
                v = buf[i]
                k = i - 1
                while k >= s and buf[k] > v:
                    buf[k + 1] = buf[k]
                    k -= 1
                buf[k + 1] = v
            med[g] = 0.5 * (buf[s + (c - 1) // 2] + buf[s + c // 2])
            sd[g] = sqrt(square[g] / c)
            s += c
    free(total)
    free(fill)
    free(buf)


cdef double pairwise(const double* a, Py_ssize_t n) noexcept nogil:
    """NumPy's pairwise summation of ``n`` contiguous values (its ``add.reduce`` of a row):
    eight running sums in blocks of up to 128 values, halves beyond."""
    cdef Py_ssize_t i, half
    cdef double res
    cdef double r[8]
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    if n <= 128:
        for i in range(8):
            r[i] = a[i]
        i = 8
        while i < n - n % 8:
            r[0] += a[i]
            r[1] += a[i + 1]
            r[2] += a[i + 2]
            r[3] += a[i + 3]
            r[4] += a[i + 4]
            r[5] += a[i + 5]
            r[6] += a[i + 6]
            r[7] += a[i + 7]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            res += a[i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return pairwise(a, half) + pairwise(a + half, n - half)


cdef inline double row_sum(const double* a, Py_ssize_t n) noexcept nogil:
    """``a[:n].sum()`` as NumPy sums a row: from its identity, 0.0."""
    return 0.0 + pairwise(a, n)


cdef inline double nan_as(double x, double fill) noexcept nogil:
    return fill if isnan(x) else x


def transfer_rows(const double[:, ::1] level, const double[:, ::1] level_y,
                  const Py_ssize_t[::1] target, const double[:, :, ::1] diff,
                  const double[:, :, ::1] counts, const double[::1] slope,
                  const double[::1] sxx, const Py_ssize_t[:, ::1] slot,
                  const unsigned char[:, ::1] found, const double[:, ::1] own,
                  const double[:, ::1] specs, const double[:, ::1] t,
                  const double[::1] phys_b, const unsigned char[::1] virt,
                  const double[:, ::1] phys_a, double share, const Py_ssize_t[::1] vendors,
                  const Py_ssize_t[::1] t_vendor, double radius, bint pick, tuple shrink,
                  tuple choose, double[:, ::1] features, double[:, ::1] level_s,
                  unsigned char[:, ::1] use, unsigned char[:, ::1] pair_use,
                  unsigned char[::1] local, double[:, ::1] spec_move):
    """:func:`leap.features.transfer._core`: the same inputs (``found``, ``virt`` and the
    outputs ``use``, ``pair_use`` and ``local`` as bytes; ``phys_a`` and ``spec_move`` with
    no rows without a spec rule; ``shrink``: SHRINK_GAIN, SHRINK_FAMILIES, BLEND_FAMILIES;
    ``choose``: PAIR_NEAREST, LOCAL_MIN_TYPES), the same values. Row sums add as NumPy's
    pairwise ``sum`` does; the nearest types are chosen as its stable ``argsort`` orders them.
    """
    cdef Py_ssize_t m = level.shape[0], h = level.shape[1], n_levels = slot.shape[0]
    cdef Py_ssize_t virtual = h - 1, i, a, j, q, kk, b, best, n_seen, n_same
    cdef double shrink_gain = shrink[0], shrink_families = shrink[1], blend = shrink[2]
    cdef Py_ssize_t nearest = choose[0], local_min = choose[1]
    cdef bint spec = phys_a.shape[0] > 0, row_spec, any_same, any_twin
    cdef double gamma, okf, g_sxx, dd, nn, wsum, mean, var, g_r, pair_n, lam, dmin, v
    cdef double* buf = <double*>malloc((9 * h + 1) * sizeof(double))
    cdef unsigned char* flags = <unsigned char*>malloc((5 * h + 1) * sizeof(unsigned char))
    if buf == NULL or flags == NULL:
        free(buf)
        free(flags)
        raise MemoryError()
    cdef double* d_prev = buf
    cdef double* n_mt = buf + h
    cdef double* n_all = buf + 2 * h
    cdef double* w = buf + 3 * h
    cdef double* est = buf + 4 * h
    cdef double* est0 = buf + 5 * h
    cdef double* term = buf + 6 * h
    cdef double* dist = buf + 7 * h
    cdef double* value = buf + 8 * h
    cdef unsigned char* seen = flags
    cdef unsigned char* same = flags + h
    cdef unsigned char* prefer = flags + 2 * h
    cdef unsigned char* chosen = flags + 3 * h
    cdef unsigned char* twin = flags + 4 * h
    with nogil:
        for i in range(m):
            b = target[i]
            gamma = 1.0
            for a in range(h):
                seen[a] = isfinite(level[i, a])
                d_prev[a] = 0.0
                n_mt[a] = 0.0
                n_all[a] = 0.0
            for j in range(n_levels):
                kk = slot[j, i]
                okf = 1.0 if found[j, i] else 0.0
                g_sxx = sxx[kk] if found[j, i] else 0.0
                gamma = (g_sxx * slope[kk] + shrink_gain * gamma) / (g_sxx + shrink_gain)
                for a in range(h):
                    dd = diff[kk, a, b] * okf
                    nn = counts[kk, a, b] * okf
                    d_prev[a] = (nn * dd + shrink_families * d_prev[a]) / (nn + shrink_families)
                    if j == 0:
                        n_all[a] = nn
                    elif j == 2:
                        n_mt[a] = nn
            if b == virtual:
                gamma = 1.0
            row_spec = spec and virt[i]
            n_seen = 0
            for a in range(h):
                level_s[i, a] = own[i, a] if isfinite(own[i, a]) else level[i, a]
                est[a] = level_s[i, a] + d_prev[a]
                if row_spec:
                    spec_move[i, a] = (1.0 - share) * ((t[i, 1] - specs[a, 1])
                                                       - (phys_b[i] - phys_a[i, a]))
                    est[a] = level_s[i, a] + spec_move[i, a]
                w[a] = log1p(n_mt[a]) + 0.25 * log1p(n_all[a]) + 0.1 if seen[a] else 0.0
                est0[a] = est[a] if seen[a] else 0.0
                dist[a] = fabs(specs[a, 0] - t[i, 0]) + fabs(specs[a, 1] - t[i, 1])
                n_seen += seen[a]
            wsum = row_sum(w, h)
            for a in range(h):
                term[a] = w[a] * est0[a]
            mean = row_sum(term, h) / wsum if wsum > 0 else NAN
            for a in range(h):
                v = est0[a] - nan_as(mean, 0.0)
                term[a] = w[a] * (v * v)
            var = row_sum(term, h) / wsum if wsum > 0 else NAN
            for a in range(h):
                if not seen[a]:
                    term[a] = 0.0
                elif row_spec:
                    term[a] = w[a] * ((level_s[i, a] + spec_move[i, a]) + phys_b[i])
                else:
                    term[a] = w[a] * (level_y[i, a] + gamma * (phys_b[i] - (
                        level_y[i, a] - level[i, a])))
            g_r = (row_sum(term, h) / wsum if wsum > 0 else NAN) - phys_b[i]
            for a in range(h):
                term[a] = n_mt[a] if seen[a] else 0.0
            pair_n = row_sum(term, h)
            lam = pair_n / (pair_n + blend)
            dmin = INFINITY
            for a in range(h):
                v = dist[a] if seen[a] else INFINITY
                if isnan(v) or isnan(dmin):
                    dmin = NAN
                elif v < dmin:
                    dmin = v
            features[0, i] = g_r
            features[1, i] = gamma
            features[2, i] = mean
            features[3, i] = lam * mean + (1.0 - lam) * g_r
            features[4, i] = n_seen
            features[5, i] = pair_n
            features[6, i] = sqrt(var)
            features[7, i] = dmin if wsum > 0 else NAN
            if not pick:
                continue
            # Same vendor first; then the `nearest` types by (distance, column).
            any_same = False
            n_same = 0
            for a in range(h):
                same[a] = seen[a] and vendors[a] == t_vendor[i]
                any_same = any_same or same[a]
                n_same += same[a]
            for a in range(h):
                prefer[a] = same[a] if any_same else seen[a]
                value[a] = nan_as(dist[a], 1e9) if prefer[a] else INFINITY
                chosen[a] = False
            for q in range(nearest):
                best = -1
                for a in range(h):
                    if not chosen[a] and (best < 0 or value[a] < value[best]):
                        best = a
                if best < 0:
                    break
                chosen[best] = True
            for a in range(h):
                use[i, a] = prefer[a] and chosen[a]
            if virt[i] and not isnan(radius):
                any_twin = False
                for a in range(h):
                    twin[a] = prefer[a] and nan_as(dist[a], INFINITY) <= radius
                    any_twin = any_twin or twin[a]
                if any_twin:
                    for a in range(h):
                        use[i, a] = twin[a]
            local[i] = virt[i] and n_same >= local_min
            for a in range(h):
                pair_use[i, a] = use[i, a]
            if local[i]:
                dmin = INFINITY
                for a in range(h):
                    value[a] = nan_as(dist[a], INFINITY) if same[a] else INFINITY
                    if value[a] < dmin:
                        dmin = value[a]
                for a in range(h):
                    use[i, a] = same[a] and value[a] == dmin
    free(buf)
    free(flags)


cdef inline Py_ssize_t first_at(const int64_t[::1] key, int64_t v) noexcept nogil:
    """The first position of the sorted ``key`` at or after ``v`` (``np.searchsorted``)."""
    cdef Py_ssize_t lo = 0, hi = key.shape[0], mid
    while lo < hi:
        mid = (lo + hi) // 2
        if key[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


def same_shape(const int64_t[::1] key, const Py_ssize_t[::1] code, const double[::1] r,
               const double[:, ::1] table_scale, const int64_t[::1] group,
               const unsigned char[:, ::1] seen, const Py_ssize_t[::1] shape_code,
               const double[:, ::1] scale, double[:, ::1] out):
    """:func:`leap.features.transfer._same_shape` (``out`` filled with NaN; ``scale`` with no
    rows: exact shapes only): each seen cell's entry of the row's own shape code, else the
    mean of the entries of its devices and global batch, summed in entry order as
    ``np.bincount`` sums."""
    cdef Py_ssize_t m = seen.shape[0], h = seen.shape[1], i, a, e, lo, hi, count
    cdef bint with_scale = scale.shape[0] > 0
    cdef int64_t g
    cdef double total
    with nogil:
        for i in range(m):
            for a in range(h):
                if not seen[i, a]:
                    continue
                g = group[i] + a
                lo = first_at(key, g)
                hi = first_at(key, g + 1)
                for e in range(lo, hi):
                    if code[e] == shape_code[i]:
                        out[i, a] = r[e]
                if not with_scale or not isnan(out[i, a]):
                    continue
                total = 0.0
                count = 0
                for e in range(lo, hi):
                    if code[e] != shape_code[i] and table_scale[e, 0] == scale[i, 0] \
                            and table_scale[e, 1] == scale[i, 1]:
                        total += r[e]
                        count += 1
                if count:
                    out[i, a] = total / count


def nearest_shapes(const int64_t[::1] key, const Py_ssize_t[::1] code,
                   const double[:, ::1] shape, const int64_t[::1] group,
                   const Py_ssize_t[::1] shape_code, const double[:, ::1] own,
                   const double[::1] reach, Py_ssize_t limit, Py_ssize_t[::1] out_i,
                   Py_ssize_t[::1] out_entry):
    """:func:`leap.features.transfer._nearest_shapes` (``reach`` empty: no limit): per cell,
    up to ``limit`` entries of its group nearest to its own shape, never that shape, ordered
    as ``np.lexsort`` orders (distance, entry); written to ``out_i`` and ``out_entry``,
    their count returned."""
    cdef Py_ssize_t c = group.shape[0], i, e, lo, hi, k, p, n = 0
    cdef bint with_reach = reach.shape[0] > 0, far
    cdef double la[3]
    cdef double lb[3]
    cdef double d
    cdef double* best_d = <double*>malloc((limit + 1) * sizeof(double))
    cdef Py_ssize_t* best_e = <Py_ssize_t*>malloc((limit + 1) * sizeof(Py_ssize_t))
    if best_d == NULL or best_e == NULL:
        free(best_d)
        free(best_e)
        raise MemoryError()
    with nogil:
        for i in range(c):
            lo = first_at(key, group[i])
            hi = first_at(key, group[i] + 1)
            for p in range(3):
                lb[p] = log_part(own[i, p])
            k = 0
            for e in range(lo, hi):
                if code[e] == shape_code[i]:
                    continue
                for p in range(3):
                    la[p] = log_part(shape[e, p])
                if with_reach:
                    # shape_parts: log trainers, log devices per trainer, log batch a device.
                    far = not (fabs(lb[0] - la[0]) <= reach[0] + 1e-9) \
                        or not (fabs(lb[1] - la[1]) <= reach[1] + 1e-9) \
                        or not (fabs((lb[2] - lb[1]) - (la[2] - la[1])) <= reach[2] + 1e-9)
                    if far:
                        continue
                d = 0.0
                for p in range(3):
                    d += fabs(la[p] - lb[p])
                if k == limit and not d < best_d[k - 1]:
                    continue
                p = k if k < limit else limit - 1
                while p > 0 and best_d[p - 1] > d:  # after equal distances: earlier entries
                    best_d[p] = best_d[p - 1]
                    best_e[p] = best_e[p - 1]
                    p -= 1
                best_d[p] = d
                best_e[p] = e
                if k < limit:
                    k += 1
            for p in range(k):
                out_i[n] = i
                out_entry[n] = best_e[p]
                n += 1
    free(best_d)
    free(best_e)
    return n
