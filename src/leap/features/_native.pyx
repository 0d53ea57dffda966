# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""The pair model's rows of a few jobs, compiled: :func:`leap.features.pair_rows.pair_matrix`
and :func:`~leap.features.pair_rows.shape_matrix` for the rows of one launch-time request, and
:func:`~leap.features.pair_rows.row_median` of the few estimates a request's rows read.

The NumPy code in :mod:`leap.features.pair_rows` and :mod:`leap.features.physics` is the
definition: these loops compute the same values, operation for operation, in one pass over a
request's few dozen rows, where NumPy spends a few microseconds of call overhead per array
operation (on a request's rows, the two matrices took about a quarter of the encode). Nothing
here decides anything: :mod:`leap.features.pair_rows` reads :data:`SPEC_COLUMNS`,
:data:`PAIR_FEATURES` and :data:`SHAPE_FEATURES` and uses these kernels only where the three
agree with its own, and the tests hold both ways equal on random rows.

Inputs: ``job``, a (jobs, 11) matrix of :data:`JOB_COLUMNS` (NaN where missing); ``kind``,
each job's peak FLOP/s kind (:data:`leap.features.physics.PEAK_KIND`); ``precision`` and
``category``, its vocabulary codes (NaN outside); ``specs``, a (types, :data:`SPEC_COLUMNS`)
matrix; ``vendor``, each type's vocabulary code.
"""

from libc.math cimport NAN, fmax, isfinite, log, sqrt
from libc.stdlib cimport free, malloc

#: Job columns of the ``job`` matrix, in order.
JOB_COLUMNS = ("trainer_count", "devices_per_trainer", "batch_size", "flops_per_sample",
               "num_params", "tensor_parallel", "pipeline_parallel", "embedding_params",
               "hidden_dim", "seq_len", "num_layers")
#: The catalog's spec columns the ``specs`` matrix holds, in order (the catalog's own).
SPEC_COLUMNS = ("year", "devices_per_host", "peak_bf16_tflops", "peak_fp32_tflops",
                "memory_gb", "mem_bw_gb_per_s", "intra_node_bw_gb_per_s",
                "inter_node_bw_gbit_per_s", "cost_per_device_hour", "bf16_native")
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
