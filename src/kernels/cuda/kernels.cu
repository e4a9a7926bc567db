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

// 2-D convolutions and pooling, one thread per element of what the kernel writes. `p` is the
// geometry as `Window::params` (src/kernels/cuda/layout.rs) lays it out, in NHWC terms
// whatever the data format:
//   p[0] batch, p[1] in_h, p[2] in_w, p[3] in_c, p[4] out_h, p[5] out_w, p[6] out_c,
//   p[7] window_h, p[8] window_w, p[9] stride_h, p[10] stride_w, p[11] dilation_h,
//   p[12] dilation_w, p[13] pad_top, p[14] pad_left, p[15] nchw (1: NCHW, 0: NHWC),
//   p[16] the filter's depth (input channels per group of a convolution; 1 for pooling).
// Tap k of window o along a dimension reads input o·stride + k·dilation − pad, which is
// padding outside [0, size). Filters are HWIO; a convolution's input channels form
// in_c / depth groups of `depth`, group g feeding output channels g·(out_c / groups) on.
// The host checks every operand's shape first and launches only with no operand empty.
struct Window {
    long long batch, in_h, in_w, in_c, out_h, out_w, out_c;
    long long window_h, window_w, stride_h, stride_w, dilation_h, dilation_w;
    long long pad_top, pad_left, nchw, depth;
};

__device__ Window window_of(const long long* p) {
    Window g;
    g.batch = p[0];
    g.in_h = p[1];
    g.in_w = p[2];
    g.in_c = p[3];
    g.out_h = p[4];
    g.out_w = p[5];
    g.out_c = p[6];
    g.window_h = p[7];
    g.window_w = p[8];
    g.stride_h = p[9];
    g.stride_w = p[10];
    g.dilation_h = p[11];
    g.dilation_w = p[12];
    g.pad_top = p[13];
    g.pad_left = p[14];
    g.nchw = p[15];
    g.depth = p[16];
    return g;
}

// Output channels per group of a convolution.
__device__ long long group_out(const Window& g) { return g.out_c / (g.in_c / g.depth); }

// An element's place in a [batch, h, w, c] value, whatever its layout.
struct Pixel {
    long long n, y, x, c;
};

// The pixel of element `i` of a value of (h, w, c) per image laid out NCHW or NHWC.
__device__ Pixel pixel_of(long long i, long long h, long long w, long long c, long long nchw) {
    Pixel at;
    if (nchw) {
        at.x = i % w;
        i /= w;
        at.y = i % h;
        i /= h;
        at.c = i % c;
        at.n = i / c;
    } else {
        at.c = i % c;
        i /= c;
        at.x = i % w;
        i /= w;
        at.y = i % h;
        at.n = i / h;
    }
    return at;
}

// The offset of pixel (n, y, x, c) in a value of (h, w, c_len) per image laid out NCHW or NHWC.
__device__ long long offset_at(long long n, long long y, long long x, long long c, long long h,
                               long long w, long long c_len, long long nchw) {
    return nchw ? ((n * c_len + c) * h + y) * w + x : ((n * h + y) * w + x) * c_len + c;
}

// The input position of tap k of window o, or −1 where it falls in the padding.
__device__ long long tap_at(long long o, long long k, long long stride, long long dilation,
                            long long pad, long long size) {
    long long at = o * stride + k * dilation - pad;
    return at < size ? at : -1;  // a negative position is in the padding already
}

// The window whose tap k reads input position `at`, or −1 when none of the `windows` does.
__device__ long long window_at(long long at, long long k, long long stride, long long dilation,
                               long long pad, long long windows) {
    long long t = at + pad - k * dilation;
    if (t < 0 || t % stride != 0) return -1;
    return t / stride < windows ? t / stride : -1;
}

// Conv2D: out[n, y, x, oc] = Σ over taps (ky, kx) inside the input and the group's input
// channels ci of x[n, tap, group·depth + ci] · filter[ky, kx, ci, oc].
extern "C" __global__ void conv2d_f32(const float* x, const float* filter, float* out,
                                      long long n, const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    Pixel o = pixel_of(i, g.out_h, g.out_w, g.out_c, g.nchw);
    long long c0 = o.c / group_out(g) * g.depth;
    float acc = 0.0f;
    for (long long ky = 0; ky < g.window_h; ++ky) {
        long long iy = tap_at(o.y, ky, g.stride_h, g.dilation_h, g.pad_top, g.in_h);
        if (iy < 0) continue;
        for (long long kx = 0; kx < g.window_w; ++kx) {
            long long ix = tap_at(o.x, kx, g.stride_w, g.dilation_w, g.pad_left, g.in_w);
            if (ix < 0) continue;
            const float* taps = filter + (ky * g.window_w + kx) * g.depth * g.out_c + o.c;
            for (long long ci = 0; ci < g.depth; ++ci) {
                float v = x[offset_at(o.n, iy, ix, c0 + ci, g.in_h, g.in_w, g.in_c, g.nchw)];
                acc += v * taps[ci * g.out_c];
            }
        }
    }
    out[i] = acc;
}

// Conv2DBackpropInput, one thread per input element (no atomics): dx[n, y, x, c] = Σ over the
// windows (oy, ox) whose tap (ky, kx) reads (y, x) and the output channels oc of c's group of
// dy[n, oy, ox, oc] · filter[ky, kx, c mod depth, oc].
extern "C" __global__ void conv2d_input_grad_f32(const float* filter, const float* dy, float* dx,
                                                 long long n, const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    Pixel v = pixel_of(i, g.in_h, g.in_w, g.in_c, g.nchw);
    long long per_group = group_out(g);
    long long oc0 = v.c / g.depth * per_group;
    long long ci = v.c % g.depth;
    float acc = 0.0f;
    for (long long ky = 0; ky < g.window_h; ++ky) {
        long long oy = window_at(v.y, ky, g.stride_h, g.dilation_h, g.pad_top, g.out_h);
        if (oy < 0) continue;
        for (long long kx = 0; kx < g.window_w; ++kx) {
            long long ox = window_at(v.x, kx, g.stride_w, g.dilation_w, g.pad_left, g.out_w);
            if (ox < 0) continue;
            const float* taps = filter + ((ky * g.window_w + kx) * g.depth + ci) * g.out_c;
            for (long long oc = oc0; oc < oc0 + per_group; ++oc) {
                float d = dy[offset_at(v.n, oy, ox, oc, g.out_h, g.out_w, g.out_c, g.nchw)];
                acc += d * taps[oc];
            }
        }
    }
    dx[i] = acc;
}

// Conv2DBackpropFilter, one thread per filter element: df[ky, kx, ci, oc] = Σ over the batch and
// the windows whose tap (ky, kx) is inside the input of x[n, tap, group·depth + ci] ·
// dy[n, oy, ox, oc], the group being oc's.
extern "C" __global__ void conv2d_filter_grad_f32(const float* x, const float* dy, float* df,
                                                  long long n, const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    long long oc = i % g.out_c;
    long long rest = i / g.out_c;
    long long ci = rest % g.depth;
    rest /= g.depth;
    long long kx = rest % g.window_w;
    long long ky = rest / g.window_w;
    long long c = oc / group_out(g) * g.depth + ci;
    float acc = 0.0f;
    for (long long b = 0; b < g.batch; ++b) {
        for (long long oy = 0; oy < g.out_h; ++oy) {
            long long iy = tap_at(oy, ky, g.stride_h, g.dilation_h, g.pad_top, g.in_h);
            if (iy < 0) continue;
            for (long long ox = 0; ox < g.out_w; ++ox) {
                long long ix = tap_at(ox, kx, g.stride_w, g.dilation_w, g.pad_left, g.in_w);
                if (ix < 0) continue;
                float v = x[offset_at(b, iy, ix, c, g.in_h, g.in_w, g.in_c, g.nchw)];
                float d = dy[offset_at(b, oy, ox, oc, g.out_h, g.out_w, g.out_c, g.nchw)];
                acc += v * d;
            }
        }
    }
    df[i] = acc;
}

// The offset in x of the maximum of window (oy, ox) of image b, channel c: its first tap
// inside the input in row-major window order, replaced by each later tap that is greater (the
// CPU kernel's rule: the first of equal maxima wins, and a NaN only where it comes first);
// −1 for a window wholly in the padding.
__device__ long long window_max(const float* x, const Window& g, long long b, long long oy,
                                long long ox, long long c) {
    long long best = -1;
    for (long long ky = 0; ky < g.window_h; ++ky) {
        long long iy = tap_at(oy, ky, g.stride_h, 1, g.pad_top, g.in_h);
        if (iy < 0) continue;
        for (long long kx = 0; kx < g.window_w; ++kx) {
            long long ix = tap_at(ox, kx, g.stride_w, 1, g.pad_left, g.in_w);
            if (ix < 0) continue;
            long long at = offset_at(b, iy, ix, c, g.in_h, g.in_w, g.in_c, g.nchw);
            if (best < 0 || x[best] < x[at]) best = at;
        }
    }
    return best;
}

// The number of taps of window o inside an input of `size` (a window of `len` taps).
__device__ long long taps_inside(long long o, long long len, long long stride, long long pad,
                                 long long size) {
    long long start = o * stride - pad;
    long long end = start + len < size ? start + len : size;
    long long inside = end - (start > 0 ? start : 0);
    return inside > 0 ? inside : 0;
}

// The first and last of `windows` windows of `len` taps that cover input position `at`; first
// > last when none does.
__device__ void covering(long long at, long long len, long long stride, long long pad,
                         long long windows, long long* first, long long* last) {
    long long start = at + pad - len + 1;  // the windows o with start ≤ o·stride ≤ at + pad
    *first = start <= 0 ? 0 : (start + stride - 1) / stride;
    long long end = (at + pad) / stride;
    *last = end < windows - 1 ? end : windows - 1;
}

// MaxPool: each output the maximum of its window (window_max), −inf where the window is wholly
// in the padding.
extern "C" __global__ void max_pool_f32(const float* x, float* out, long long n,
                                        const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    Pixel o = pixel_of(i, g.out_h, g.out_w, g.out_c, g.nchw);
    long long best = window_max(x, g, o.n, o.y, o.x, o.c);
    out[i] = best < 0 ? -inf_f32() : x[best];
}

// MaxPoolGrad, one thread per input element (no atomics): the sum, over the windows that
// cover it in row-major order, of dy at the windows whose maximum (window_max) it is.
extern "C" __global__ void max_pool_grad_f32(const float* x, const float* dy, float* dx,
                                             long long n, const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    Pixel v = pixel_of(i, g.in_h, g.in_w, g.in_c, g.nchw);
    long long y0, y1, x0, x1;
    covering(v.y, g.window_h, g.stride_h, g.pad_top, g.out_h, &y0, &y1);
    covering(v.x, g.window_w, g.stride_w, g.pad_left, g.out_w, &x0, &x1);
    float acc = 0.0f;
    for (long long oy = y0; oy <= y1; ++oy) {
        for (long long ox = x0; ox <= x1; ++ox) {
            if (window_max(x, g, v.n, oy, ox, v.c) == i) {
                acc += dy[offset_at(v.n, oy, ox, v.c, g.out_h, g.out_w, g.out_c, g.nchw)];
            }
        }
    }
    dx[i] = acc;
}

// AvgPool: the sum of each window's taps inside the input, in row-major window order, over
// their number (padding is not counted; 0 for a window wholly in it).
extern "C" __global__ void avg_pool_f32(const float* x, float* out, long long n,
                                        const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    Pixel o = pixel_of(i, g.out_h, g.out_w, g.out_c, g.nchw);
    float sum = 0.0f;
    long long count = 0;
    for (long long ky = 0; ky < g.window_h; ++ky) {
        long long iy = tap_at(o.y, ky, g.stride_h, 1, g.pad_top, g.in_h);
        if (iy < 0) continue;
        for (long long kx = 0; kx < g.window_w; ++kx) {
            long long ix = tap_at(o.x, kx, g.stride_w, 1, g.pad_left, g.in_w);
            if (ix < 0) continue;
            sum += x[offset_at(o.n, iy, ix, o.c, g.in_h, g.in_w, g.in_c, g.nchw)];
            ++count;
        }
    }
    out[i] = sum / (float)(count > 0 ? count : 1);
}

// AvgPoolGrad, one thread per input element (no atomics): the sum, over the windows that cover
// it in row-major order, of each window's dy over its number of taps inside the input.
extern "C" __global__ void avg_pool_grad_f32(const float* dy, float* dx, long long n,
                                             const long long* p) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Window g = window_of(p);
    Pixel v = pixel_of(i, g.in_h, g.in_w, g.in_c, g.nchw);
    long long y0, y1, x0, x1;
    covering(v.y, g.window_h, g.stride_h, g.pad_top, g.out_h, &y0, &y1);
    covering(v.x, g.window_w, g.stride_w, g.pad_left, g.out_w, &x0, &x1);
    float acc = 0.0f;
    for (long long oy = y0; oy <= y1; ++oy) {
        long long rows = taps_inside(oy, g.window_h, g.stride_h, g.pad_top, g.in_h);
        for (long long ox = x0; ox <= x1; ++ox) {
            long long cols = taps_inside(ox, g.window_w, g.stride_w, g.pad_left, g.in_w);
            float d = dy[offset_at(v.n, oy, ox, v.c, g.out_h, g.out_w, g.out_c, g.nchw)];
            acc += d / (float)(rows * cols);
        }
    }
    dx[i] = acc;
}
