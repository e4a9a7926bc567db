// tessera's GPU kernels, compiled at run time with NVRTC (float32, one thread per output
// element or per row). Indices are 64-bit: a tensor may hold more than 2^31 elements.
//
// The op codes below are the discriminants the host side passes (src/kernels/cuda/ops.rs);
// the two lists change together. Only CUDA built-ins that NVRTC provides without headers are
// used (no <math.h> macros: NaN and infinity are made from their bits), and the same file is
// compiled for the host by tests/gpu_emulated.rs, which runs every kernel on the CPU.

__device__ float nan_f32() { return __int_as_float(0x7fffffff); }
__device__ float inf_f32() { return __int_as_float(0x7f800000); }

// Maximum and minimum that propagate NaN, as the CPU kernels do (fmaxf would drop it).
__device__ float max_f32(float x, float y) { return (x != x || y != y) ? nan_f32() : fmaxf(x, y); }
__device__ float min_f32(float x, float y) { return (x != x || y != y) ? nan_f32() : fminf(x, y); }

// The offset of element `i` of the row-major index space `dims` (rank `rank`) in a tensor
// laid out with `strides` (0 along a broadcast dimension).
__device__ long long offset_of(long long i, int rank, const long long* dims,
                               const long long* strides) {
    long long offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
        long long coordinate = i % dims[d];
        i /= dims[d];
        offset += coordinate * strides[d];
    }
    return offset;
}

// Two-input element-wise ops with numpy broadcasting. `layout` holds the output's dims, then
// a's strides, then b's strides, `rank` each.
// op: 0 add, 1 sub, 2 mul, 3 div, 4 maximum, 5 minimum, 6 pow,
//     7 ReluGrad(gradients, features), 8 SigmoidGrad(y, dy), 9 TanhGrad(y, dy).
extern "C" __global__ void binary_f32(int op, const float* a, const float* b, float* out,
                                      long long n, int rank, const long long* layout) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[offset_of(i, rank, layout, layout + rank)];
    float y = b[offset_of(i, rank, layout, layout + 2 * rank)];
    float r;
    switch (op) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        case 3: r = x / y; break;
        case 4: r = max_f32(x, y); break;
        case 5: r = min_f32(x, y); break;
        case 6: r = powf(x, y); break;
        case 7: r = y > 0.0f ? x : 0.0f; break;
        case 8: r = y * x * (1.0f - x); break;
        default: r = y * (1.0f - x * x); break;
    }
    out[i] = r;
}

// One-input element-wise ops.
// op: 0 neg, 1 square, 2 abs, 3 sign, 4 sqrt, 5 rsqrt, 6 exp, 7 log, 8 reciprocal,
//     9 sigmoid, 10 tanh, 11 relu.
extern "C" __global__ void unary_f32(int op, const float* x, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float r;
    switch (op) {
        case 0: r = -v; break;
        case 1: r = v * v; break;
        case 2: r = fabsf(v); break;
        case 3: r = v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v); break;  // 0, -0 and NaN stay
        case 4: r = sqrtf(v); break;
        case 5: r = 1.0f / sqrtf(v); break;
        case 6: r = expf(v); break;
        case 7: r = logf(v); break;
        case 8: r = 1.0f / v; break;
        case 9: r = 1.0f / (1.0f + expf(-v)); break;
        case 10: r = tanhf(v); break;
        default: r = v > 0.0f ? v : 0.0f; break;
    }
    out[i] = r;
}

// Reductions over any set of axes, one thread per output element, summing in the CPU
// kernel's order. `layout` holds the kept dims, their strides in x, the reduced dims and
// their strides (`kept` and `reduced` entries each); `r` is the product of the reduced dims.
// op: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 half the sum of squares (L2Loss).
extern "C" __global__ void reduce_f32(int op, const float* x, float* out, long long outputs,
                                      long long r, int kept, int reduced,
                                      const long long* layout) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outputs) return;
    const long long* reduced_dims = layout + 2 * kept;
    const long long* reduced_strides = reduced_dims + reduced;
    const float* base = x + offset_of(i, kept, layout, layout + kept);
    float acc = op == 2 ? -inf_f32() : (op == 3 ? inf_f32() : (op == 4 ? 1.0f : 0.0f));
    for (long long j = 0; j < r; ++j) {
        float v = base[offset_of(j, reduced, reduced_dims, reduced_strides)];
        switch (op) {
            case 2: acc = max_f32(acc, v); break;
            case 3: acc = min_f32(acc, v); break;
            case 4: acc *= v; break;
            case 5: acc += v * v; break;
            default: acc += v; break;
        }
    }
    if (op == 1) acc /= (float)r;  // 0 / 0 is NaN for an empty mean, as on the CPU
    if (op == 5) acc /= 2.0f;
    out[i] = acc;
}

// Softmax (or, with `log`, LogSoftmax) over each row of a [rows, cols] matrix, max-shifted
// for range.
extern "C" __global__ void softmax_f32(const float* x, float* out, long long rows,
                                       long long cols, int take_log) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + row * cols;
    float* o = out + row * cols;
    float m = -inf_f32();
    for (long long j = 0; j < cols; ++j) m = fmaxf(m, in[j]);
    float sum = 0.0f;
    for (long long j = 0; j < cols; ++j) sum += expf(in[j] - m);
    float log_sum = logf(sum);
    for (long long j = 0; j < cols; ++j) {
        o[j] = take_log ? in[j] - m - log_sum : expf(in[j] - m) / sum;
    }
}

// Writes the log-softmax of the row `x` (`cols` long) into `b`.
__device__ void log_softmax_row(const float* x, float* b, long long cols) {
    float m = -inf_f32();
    for (long long j = 0; j < cols; ++j) m = fmaxf(m, x[j]);
    float sum = 0.0f;
    for (long long j = 0; j < cols; ++j) sum += expf(x[j] - m);
    float log_sum = logf(sum);
    for (long long j = 0; j < cols; ++j) b[j] = x[j] - m - log_sum;
}

// SoftmaxCrossEntropyWithLogits per row: loss = -sum labels * log softmax(logits),
// backprop = softmax(logits) - labels.
extern "C" __global__ void softmax_xent_f32(const float* logits, const float* labels,
                                            float* loss, float* backprop, long long rows,
                                            long long cols) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* y = labels + row * cols;
    float* b = backprop + row * cols;
    log_softmax_row(logits + row * cols, b, cols);
    float l = 0.0f;
    for (long long j = 0; j < cols; ++j) {
        l -= y[j] * b[j];
        b[j] = expf(b[j]) - y[j];
    }
    loss[row] = l;
}

// SparseSoftmaxCrossEntropyWithLogits per row, with the class index of each row (checked to
// be in [0, cols) on the host): loss = -log softmax(logits)[label],
// backprop = softmax(logits) - onehot(label).
extern "C" __global__ void sparse_xent_f32(const float* logits, const long long* labels,
                                           float* loss, float* backprop, long long rows,
                                           long long cols) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    float* b = backprop + row * cols;
    long long label = labels[row];
    log_softmax_row(logits + row * cols, b, cols);
    loss[row] = -b[label];
    for (long long j = 0; j < cols; ++j) b[j] = expf(b[j]) - (j == label ? 1.0f : 0.0f);
}

// The optimizer updates, in place on the variable `var` and its slots `s0..s2` (the ones the
// rule has; the others are not touched), with the scalar hyper-parameters p0..p5 in the
// order of the op's inputs. TensorFlow's update rules, as the CPU kernels apply them.
// rule: 0 GradientDescent (alpha), 1 Adagrad (lr), 2 AdagradV2 (lr, epsilon),
//       3 Momentum (lr, momentum), 4 Adam (beta1_power, beta2_power, lr, beta1, beta2,
//       epsilon), 5 RMSProp (lr, rho, momentum, epsilon), 6 CenteredRMSProp (the same).
// flags: 1 use_nesterov, 2 update_slots.
extern "C" __global__ void apply_f32(int rule, int flags, float* var, float* s0, float* s1,
                                     float* s2, const float* grad, float p0, float p1,
                                     float p2, float p3, float p4, float p5, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grad[i];
    bool nesterov = (flags & 1) != 0;
    switch (rule) {
        case 0:
            var[i] -= p0 * g;
            break;
        case 1:
        case 2: {
            float epsilon = rule == 2 ? p1 : 0.0f;
            if (flags & 2) s0[i] += g * g;
            var[i] -= p0 * g / (sqrtf(s0[i]) + epsilon);
            break;
        }
        case 3: {
            float accum = s0[i] * p1 + g;
            s0[i] = accum;
            var[i] -= nesterov ? g * p0 + accum * p1 * p0 : accum * p0;
            break;
        }
        case 4: {
            float alpha = p2 * sqrtf(1.0f - p1) / (1.0f - p0);
            float m = s0[i] + (g - s0[i]) * (1.0f - p3);
            float v = s1[i] + (g * g - s1[i]) * (1.0f - p4);
            s0[i] = m;
            s1[i] = v;
            float num = nesterov ? m * p3 + (1.0f - p3) * g : m;
            var[i] -= num * alpha / (sqrtf(v) + p5);
            break;
        }
        case 5: {
            float ms = s0[i] + (g * g - s0[i]) * (1.0f - p1);
            float mom = s1[i] * p2 + p0 * g / sqrtf(ms + p3);
            s0[i] = ms;
            s1[i] = mom;
            var[i] -= mom;
            break;
        }
        default: {
            float ms = s1[i] + (g * g - s1[i]) * (1.0f - p1);
            float mg = s0[i] + (g - s0[i]) * (1.0f - p1);
            float mom = s2[i] * p2 + p0 * g / sqrtf(ms - mg * mg + p3);
            s0[i] = mg;
            s1[i] = ms;
            s2[i] = mom;
            var[i] -= mom;
            break;
        }
    }
}
