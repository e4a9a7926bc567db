// tessera's GPU kernels, compiled at run time with NVRTC (float32, one thread per output
// element or per row). Indices are 64-bit: a tensor may hold more than 2^31 elements.

extern "C" __global__ void binary_f32(int op, const float* a, long long na, const float* b,
                                      long long nb, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    // Broadcasting by suffix: an operand whose shape is a suffix of the output's repeats.
    float x = a[i % na];
    float y = b[i % nb];
    float r;
    switch (op) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        case 3: r = x / y; break;
        case 4: r = fmaxf(x, y); break;
        default: r = fminf(x, y); break;
    }
    out[i] = r;
}

extern "C" __global__ void relu_f32(const float* x, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// ReluGrad(gradients, features): the gradient where the feature was positive, else 0.
extern "C" __global__ void relu_grad_f32(const float* g, const float* x, float* out,
                                         long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.0f ? g[i] : 0.0f;
}

// x viewed as [outer, r, inner]; out[o, k] = scale * sum_j x[o, j, k].
extern "C" __global__ void reduce_sum_f32(const float* x, float* out, long long outer,
                                          long long r, long long inner, float scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outer * inner) return;
    long long o = i / inner;
    long long k = i % inner;
    const float* p = x + o * r * inner + k;
    float sum = 0.0f;
    for (long long j = 0; j < r; ++j) sum += p[j * inner];
    out[i] = sum * scale;
}

// Softmax over each row of a [rows, cols] matrix, max-shifted for range.
extern "C" __global__ void softmax_f32(const float* x, float* out, long long rows,
                                       long long cols) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + row * cols;
    float* o = out + row * cols;
    float m = __int_as_float(0xff800000);  // -inf
    for (long long j = 0; j < cols; ++j) m = fmaxf(m, in[j]);
    float sum = 0.0f;
    for (long long j = 0; j < cols; ++j) {
        o[j] = expf(in[j] - m);
        sum += o[j];
    }
    for (long long j = 0; j < cols; ++j) o[j] /= sum;
}

// SoftmaxCrossEntropyWithLogits per row: loss = -sum labels * log softmax(logits),
// backprop = softmax(logits) - labels.
extern "C" __global__ void softmax_xent_f32(const float* logits, const float* labels,
                                            float* loss, float* backprop, long long rows,
                                            long long cols) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = logits + row * cols;
    const float* y = labels + row * cols;
    float* b = backprop + row * cols;
    float m = __int_as_float(0xff800000);  // -inf
    for (long long j = 0; j < cols; ++j) m = fmaxf(m, x[j]);
    float sum = 0.0f;
    for (long long j = 0; j < cols; ++j) sum += expf(x[j] - m);
    float log_sum = logf(sum);
    float l = 0.0f;
    for (long long j = 0; j < cols; ++j) {
        float log_p = x[j] - m - log_sum;
        l -= y[j] * log_p;
        b[j] = expf(log_p) - y[j];
    }
    loss[row] = l;
}

// ResourceApplyGradientDescent: var -= alpha * delta, in place.
extern "C" __global__ void apply_gd_f32(float* var, float alpha, const float* delta,
                                        long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) var[i] -= alpha * delta[i];
}
